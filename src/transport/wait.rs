//! How a step that cannot progress waits: looking again (the bytes are seen the moment they
//! arrive, but the core stays busy) or parking (the core is free, but waking costs time), and
//! when to switch. A sans-IO state machine, fed the fabric's clock: [`Waiter::idle`] says what
//! to do after a pass that moved nothing, and [`Waiter::moved`] tells it that bytes moved. The TCP fabric parks in the poll (epoll, kqueue); the RDMA fabric, which has
//! no completion channel, parks by yielding the core between polls of its completion queues.
//!
//! # Why it adapts
//!
//! Neither fixed choice is right on the machines users run: on an idle machine a parked
//! thread takes tens of microseconds to wake (an idle core of a virtual machine must be woken
//! first), more than a small collective's whole step, while a thread that keeps looking sees
//! the bytes at once; on a busy machine (data loading, the GPU driver, a launcher that keeps a
//! core busy, other ranks) a thread that yields the core between looks loses it for a time
//! slice, whereas a parked thread is woken ahead of the others when its bytes arrive. So
//! [`Spin::Adaptive`] (the default) looks only while looking pays:
//!
//! - A wait starts looking, for at most its budget (at first the whole cap,
//!   [`DEFAULT_SPIN`](crate::DEFAULT_SPIN)), and parks when the budget is spent.
//! - A look that comes late ([`LATE`] after the one before: the thread's yield gave the core
//!   to a busy thread, or it was preempted) ends the looking at once and sets the budget to
//!   zero: the core is contended, and a parked thread is woken sooner than a yielding one
//!   gets the core back. Waits then park at once for a hold ([`MIN_HOLD`], doubling each time
//!   contention is seen again within 2 s, up to [`MAX_HOLD`], and halving once looking pays
//!   after a calm of twice the hold), so that a machine that stays busy is probed about once
//!   a second: each probe that loses the core costs a tick.
//! - A wait whose bytes came while looking doubles the budget (up to the cap); a parked wait
//!   that ended within the cap sets it to twice that wait (looking would have paid, had it
//!   lasted so long); a parked wait longer than the cap halves it (waits are long: looking
//!   burns the core for nothing).
//!
//! [`Spin::Fixed`] looks for the same time every wait (zero parks at once): what
//! `NUVEC_DISTRIBUTED_SPIN_US` and [`Options::spin`](crate::Options::spin) set, and how the
//! candidates are compared.
//!
//! # Measured
//!
//! The candidates side by side in one run (`benches/compare.sh`'s `WAITS`), float32 all_sum
//! through nuvec arrays, 2 local ranks on a 2-core virtual machine, p50 µs (best of 3 rounds)
//! under each launcher: see the README's performance section for the tables, which this
//! module's defaults were chosen from.

use std::time::Duration;

use crate::config::options::Spin;

/// Two looks further apart than this had a thread that does not give the core back run
/// between them: the core is contended. A pass that finds nothing takes a few microseconds (a
/// `recv` per socket that says "would block", or a poll of each completion queue), and a
/// yield returns in about one when nothing else wants the core, and within tens when a peer
/// rank sharing it runs its own short step (which is why yielding pays with more ranks than
/// cores); but a yield to a busy thread (measured here: a Python busy loop on the same core)
/// loses the core for a scheduler tick, 4 ms.
pub(crate) const LATE: Duration = Duration::from_micros(200);

/// How long waits park at once after contention is first seen.
pub(crate) const MIN_HOLD: Duration = Duration::from_millis(1);

/// The longest waits park at once after contention is seen: a look that loses the core costs
/// a tick (4 ms), so on a machine that stays busy one is risked a second at most.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(1);

/// Contention seen again within this long of the last time doubles the hold.
const CALM: Duration = Duration::from_secs(2);

/// What to do after a pass that moved nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Look again (the TCP fabric yields the core first, the RDMA fabric polls at once).
    Look,
    /// Park until something is ready (or, with no way to park, yield between looks).
    Park,
}

/// The waiting state of one fabric: see the [module documentation](self).
#[derive(Clone, Debug)]
pub(crate) struct Waiter {
    spin: Spin,
    /// How long the next wait looks before it parks.
    budget: Duration,
    /// When the current wait began (the first pass that moved nothing), if one is under way.
    since: Option<Duration>,
    /// When the current wait last looked.
    last: Duration,
    /// Whether the current wait has stopped looking.
    parked: bool,
    /// When contention was last seen, if ever.
    contended_at: Option<Duration>,
    /// Until when waits park at once.
    hold_until: Duration,
    /// How long they will the next time contention is seen.
    hold: Duration,
}

impl Waiter {
    /// A waiter that spins as `spin` says.
    pub(crate) fn new(spin: Spin) -> Self {
        let budget = match spin {
            Spin::Adaptive(cap) | Spin::Fixed(cap) => cap,
        };
        Self {
            spin,
            budget,
            since: None,
            last: Duration::ZERO,
            parked: false,
            contended_at: None,
            hold_until: Duration::ZERO,
            hold: MIN_HOLD,
        }
    }

    /// How long a wait that starts at `now` looks before parking.
    pub(crate) fn budget(&self, now: Duration) -> Duration {
        if now < self.hold_until {
            Duration::ZERO
        } else {
            self.budget
        }
    }

    /// Forgets a wait left unfinished (a step that failed while waiting): call when a step
    /// starts.
    pub(crate) fn reset(&mut self) {
        self.since = None;
        self.parked = false;
    }

    /// A pass of the step moved nothing at `now`: look again or park.
    pub(crate) fn idle(&mut self, now: Duration) -> Next {
        let since = *self.since.get_or_insert(now);
        let gap = now.saturating_sub(std::mem::replace(&mut self.last, now));
        if self.parked {
            return Next::Park;
        }
        if now > since && gap > LATE && matches!(self.spin, Spin::Adaptive(_)) {
            // A busy thread ran between the last look and this one: park, and park at once
            // for a while.
            self.parked = true;
            self.contended(now);
            return Next::Park;
        }
        if now.saturating_sub(since) < self.budget(since) {
            Next::Look
        } else {
            self.parked = true;
            Next::Park
        }
    }

    /// The core was found contended at `now`: waits park at once for the hold, which doubles
    /// each time contention is seen again within [`CALM`] of the last time.
    fn contended(&mut self, now: Duration) {
        if let Some(at) = self.contended_at
            && now.saturating_sub(at) <= CALM
        {
            self.hold = (self.hold * 2).min(MAX_HOLD);
        }
        self.contended_at = Some(now);
        self.hold_until = now + self.hold;
        self.budget = Duration::ZERO;
    }

    /// The step moved bytes in a pass that began at `looked` (and ended at `now`), ending the
    /// wait under way, if any.
    pub(crate) fn moved(&mut self, looked: Duration, now: Duration) {
        let Some(since) = self.since.take() else {
            return;
        };
        let parked = std::mem::take(&mut self.parked);
        let Spin::Adaptive(cap) = self.spin else {
            return;
        };
        let wait = now.saturating_sub(since);
        if !parked && looked.saturating_sub(self.last) > LATE {
            // The bytes were found by a look that came late: they may have waited for it.
            self.contended(looked);
        } else if since < self.hold_until {
            // A wait of the hold parks at once: it says nothing of looking.
        } else if !parked {
            // The bytes came while looking: looking paid. After a calm of twice the hold,
            // the hold halves.
            self.budget = (self.budget * 2).max(wait * 2).min(cap);
            if self
                .contended_at
                .is_none_or(|at| now.saturating_sub(at) > self.hold * 2)
            {
                self.hold = (self.hold / 2).max(MIN_HOLD);
            }
        } else if wait <= cap {
            // Looking would have paid, had it lasted so long.
            self.budget = self.budget.max(wait * 2).min(cap);
        } else {
            self.budget /= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_micros(100);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// One wait from `start` whose looks come `gap_us` apart until `arrives`, or that parks.
    fn wait(w: &mut Waiter, start: u64, arrives: u64, gap_us: u64) -> bool {
        let mut now = start;
        let mut looked = false;
        while now < arrives {
            match w.idle(us(now)) {
                Next::Look => {
                    looked = true;
                    now += gap_us.max(1);
                }
                Next::Park => {
                    now = arrives;
                    break;
                }
            }
        }
        w.moved(us(now), us(now));
        looked
    }

    #[test]
    fn on_an_idle_machine_short_waits_keep_looking() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        for i in 0..100 {
            assert!(wait(&mut w, i * 1000, i * 1000 + 10, 1), "wait {i}");
        }
        assert_eq!(w.budget(us(100_000)), CAP);
    }

    #[test]
    fn looks_a_peer_sharing_the_core_delays_by_tens_of_microseconds_keep_looking() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        for i in 0..100 {
            assert!(wait(&mut w, i * 1000, i * 1000 + 90, 30), "wait {i}");
        }
        assert_eq!(w.budget(us(100_000)), CAP);
    }

    #[test]
    fn a_late_look_parks_at_once_and_later_waits_park_without_looking() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        assert_eq!(w.idle(us(0)), Next::Look);
        assert_eq!(w.idle(us(4000)), Next::Park, "the wait under way parks");
        w.moved(us(4010), us(4010));
        assert_eq!(w.budget(us(4500)), Duration::ZERO, "within the hold");
        // The hold doubles each time looking finds the core contended again, up to a second:
        // over 20 s of waits a millisecond apart on a busy machine, few look.
        let mut looked = 0;
        for i in 10..20_010 {
            if wait(&mut w, i * 1000, i * 1000 + 10, 4000) {
                looked += 1;
            }
        }
        assert!(
            looked <= 40,
            "{looked} of 20000 waits looked on a contended core"
        );
        assert_eq!(w.hold, MAX_HOLD);
    }

    #[test]
    fn looking_resumes_when_the_machine_becomes_idle() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        for i in 0..20_000 {
            wait(&mut w, i * 1000, i * 1000 + 10, 4000);
        }
        // Within a hold (at most a second) waits look again, and after a calm the hold
        // shrinks back.
        let mut looked = 0;
        for i in 20_000..25_000 {
            if wait(&mut w, i * 1000, i * 1000 + 10, 1) {
                looked += 1;
            }
        }
        assert!(
            looked > 3900,
            "only {looked} of 5000 waits looked once the core was free"
        );
        assert_eq!(w.budget(us(25_000_000)), CAP);
        assert_eq!(w.hold, MIN_HOLD);
    }

    #[test]
    fn long_waits_shrink_the_budget_and_short_ones_grow_it_back() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        for i in 0..10 {
            wait(&mut w, i * 100_000, i * 100_000 + 5000, 1);
        }
        assert!(w.budget(us(1_000_000)) < us(1));
        for i in 10..20 {
            wait(&mut w, i * 100_000, i * 100_000 + 30, 1);
        }
        assert_eq!(w.budget(us(2_000_000)), CAP);
    }

    #[test]
    fn a_fixed_spin_never_adapts() {
        let mut w = Waiter::new(Spin::Fixed(CAP));
        assert_eq!(w.idle(us(0)), Next::Look);
        assert_eq!(
            w.idle(us(50)),
            Next::Look,
            "a late look does not stop a fixed spin"
        );
        assert_eq!(w.idle(us(100)), Next::Park);
        w.moved(us(10_000), us(10_000));
        assert_eq!(w.budget(us(10_000)), CAP);
        let mut park = Waiter::new(Spin::Fixed(Duration::ZERO));
        assert_eq!(park.idle(us(0)), Next::Park);
    }

    #[test]
    fn a_wait_left_by_a_failed_step_is_forgotten_by_the_next() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        for t in 0..10 {
            assert_eq!(w.idle(us(t * 10)), Next::Look);
        }
        assert_eq!(w.idle(us(105)), Next::Park);
        w.reset();
        assert_eq!(w.idle(us(10_000)), Next::Look);
    }
}
