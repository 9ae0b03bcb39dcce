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
//!   to another thread, or it was preempted) ends the looking at once and sets the budget to zero: the core is contended, and a parked thread is woken
//!   sooner than a yielding one gets the core back. The next waits then park at once, as many
//!   as the backoff says (doubling each time contention is seen again, up to [`MAX_BACKOFF`],
//!   halving each time looking pays), so that a busy machine is probed rarely.
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

/// Two looks further apart than this had another thread run between them: the core is
/// contended. A pass that finds nothing takes a few microseconds (a `recv` per socket that
/// says "would block", or a poll of each completion queue), and a yield with nothing else to
/// run returns in about one.
pub(crate) const LATE: Duration = Duration::from_micros(20);

/// The most waits that park at once after contention is seen.
pub(crate) const MAX_BACKOFF: u32 = 1024;

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
    /// How many more waits park at once.
    quiet: u32,
    /// How many waits park at once the next time contention is seen.
    backoff: u32,
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
            quiet: 0,
            backoff: 1,
        }
    }

    /// How long a wait that starts now would look before parking.
    pub(crate) fn budget(&self) -> Duration {
        if self.quiet > 0 {
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
            // Another thread ran between the last look and this one: park, and park at once
            // for a while.
            self.parked = true;
            self.contended();
            return Next::Park;
        }
        if now.saturating_sub(since) < self.budget() {
            Next::Look
        } else {
            self.parked = true;
            Next::Park
        }
    }

    /// The core was found contended: the next waits park at once.
    fn contended(&mut self) {
        self.budget = Duration::ZERO;
        self.quiet = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
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
            self.contended();
        } else if self.quiet > 0 {
            self.quiet -= 1;
        } else if !parked {
            // The bytes came while looking: looking paid.
            self.budget = (self.budget * 2).max(wait * 2).min(cap);
            self.backoff = (self.backoff / 2).max(1);
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
        assert_eq!(w.budget(), CAP);
    }

    #[test]
    fn a_late_look_parks_at_once_and_later_waits_park_without_looking() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        assert_eq!(w.idle(us(0)), Next::Look);
        assert_eq!(w.idle(us(3000)), Next::Park, "the wait under way parks");
        w.moved(us(3010), us(3010));
        assert_eq!(w.budget(), Duration::ZERO);
        // The backoff doubles each time looking finds the core contended again: over many
        // waits on a busy machine, only a few look.
        let mut looked = 0;
        for i in 1..=2000 {
            if wait(&mut w, i * 10_000, i * 10_000 + 10, 3000) {
                looked += 1;
            }
        }
        assert!(
            looked <= 12,
            "{looked} of 2000 waits looked on a contended core"
        );
    }

    #[test]
    fn looking_resumes_when_the_machine_becomes_idle() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        for i in 0..200 {
            wait(&mut w, i * 10_000, i * 10_000 + 10, 3000);
        }
        // At most the backoff's worth of waits park before one looks again.
        let mut looked = 0;
        for i in 200..2200 {
            if wait(&mut w, i * 10_000, i * 10_000 + 10, 1) {
                looked += 1;
            }
        }
        assert!(
            looked > 1700,
            "only {looked} of 2000 waits looked once the core was free"
        );
        assert!(w.budget() >= us(20));
    }

    #[test]
    fn long_waits_shrink_the_budget_and_short_ones_grow_it_back() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        for i in 0..10 {
            wait(&mut w, i * 100_000, i * 100_000 + 5000, 1);
        }
        assert!(w.budget() < us(1), "{:?}", w.budget());
        for i in 10..20 {
            wait(&mut w, i * 100_000, i * 100_000 + 30, 1);
        }
        assert_eq!(w.budget(), CAP);
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
        assert_eq!(w.budget(), CAP);
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
