//! How a step that cannot progress waits: looking again (the bytes are seen the moment they
//! arrive, but the core stays busy) or parking (the core is free, but waking costs time), and
//! when to switch. A sans-IO state machine fed the fabric's clock: [`Waiter::idle`] says what
//! to do after a pass that moved nothing, and [`Waiter::moved`] tells it that bytes moved. The
//! TCP fabric parks in the poll (epoll, kqueue); the RDMA fabric, which has no completion
//! channel, parks by yielding the core between polls of its completion queues.
//!
//! # Why it adapts
//!
//! Neither fixed choice is right on the machines users run. On an idle machine a parked
//! thread takes tens of microseconds to wake (an idle core of a virtual machine must be woken
//! first), more than a small collective's whole step, while a thread that keeps looking sees
//! the bytes at once; and with more ranks than cores, a rank that yields between looks hands
//! the core to a peer that has work, which gives it back within microseconds. But on a busy
//! machine (data loading, the GPU driver, a launcher that keeps a core busy) a thread that
//! yields to a thread that does not give the core back loses it for a scheduler tick
//! (milliseconds), whereas a parked thread is woken ahead of the busy one when its bytes
//! arrive. So [`Spin::Adaptive`] (the default) looks only while the core is not contended:
//!
//! - A wait looks (yielding between looks) for at most the cap,
//!   [`DEFAULT_SPIN`](crate::DEFAULT_SPIN), then parks.
//! - A look that comes late, [`LATE`] after the one before (its yield went to a busy thread,
//!   or the thread was preempted), shows a contended core: the wait parks at once, and so
//!   does every wait of a hold that follows ([`MIN_HOLD`] at first, doubling each time
//!   contention is seen again within [`CALM`], up to [`MAX_HOLD`]; halving each time a look
//!   pays after a calm of twice the hold). On a machine that stays busy a wait risks a look
//!   about once a second, and each look that loses the core costs one tick.
//!
//! [`Spin::Fixed`] looks for the same time every wait and never holds (zero parks at once):
//! what `NUVEC_DISTRIBUTED_SPIN_US` and [`Options::spin`](crate::Options::spin) set, and how
//! the candidates are compared (`benches/compare.sh`, `benches/waits.sh`; the README's
//! performance section has the tables). Waits that are long on an idle machine are not
//! shortened: a wait of more than the cap burns at most the cap.

use std::time::Duration;

use crate::config::options::Spin;

/// Two looks further apart than this had a thread that does not give the core back run
/// between them: the core is contended. A pass that finds nothing takes a few microseconds (a
/// `recv` per socket that says "would block", or a poll of each completion queue), and a
/// yield returns in about one when nothing else wants the core, and within tens when a peer
/// rank sharing it runs its own short step; but a yield to a busy thread (measured here: a
/// Python busy loop on the same core) loses the core for a scheduler tick: 4 ms here, 1 ms
/// on kernels that tick at 1000 Hz.
pub(crate) const LATE: Duration = Duration::from_micros(500);

/// How long waits park at once after contention is first seen.
pub(crate) const MIN_HOLD: Duration = Duration::from_millis(1);

/// The longest waits park at once after contention is seen: a look that loses the core costs
/// a tick, so on a machine that stays busy one is risked about once a second.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(1);

/// Contention seen again within this long of the last time doubles the hold.
pub(crate) const CALM: Duration = Duration::from_secs(2);

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
        Self {
            spin,
            since: None,
            last: Duration::ZERO,
            parked: false,
            contended_at: None,
            hold_until: Duration::ZERO,
            hold: MIN_HOLD,
        }
    }

    /// How long a wait that starts at `now` looks before it parks.
    pub(crate) fn budget(&self, now: Duration) -> Duration {
        match self.spin {
            Spin::Fixed(spin) => spin,
            Spin::Adaptive(_) if now < self.hold_until => Duration::ZERO,
            Spin::Adaptive(cap) => cap,
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
            // A busy thread ran between the last look and this one.
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
    }

    /// The step moved bytes in a pass that began at `looked` (and ended at `now`), ending the
    /// wait under way, if any.
    pub(crate) fn moved(&mut self, looked: Duration, now: Duration) {
        if self.since.take().is_none() {
            return;
        }
        let parked = std::mem::take(&mut self.parked);
        if parked || !matches!(self.spin, Spin::Adaptive(_)) {
            return;
        }
        if looked.saturating_sub(self.last) > LATE {
            // The bytes were found by a look that came late: they may have waited for it.
            self.contended(looked);
        } else if self
            .contended_at
            .is_none_or(|at| now.saturating_sub(at) > self.hold * 2)
        {
            // Looking paid, after a calm: the hold halves.
            self.hold = (self.hold / 2).max(MIN_HOLD);
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
    /// Whether it looked.
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
    fn on_an_idle_machine_every_wait_looks_for_at_most_the_cap() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        for i in 0..100 {
            assert!(wait(&mut w, i * 1000, i * 1000 + 10, 1), "wait {i}");
        }
        // A long wait looks for the cap, then parks; the next ones look again.
        assert_eq!(w.idle(us(200_000)), Next::Look);
        assert_eq!(w.idle(us(200_099)), Next::Look);
        assert_eq!(w.idle(us(200_100)), Next::Park);
        w.moved(us(205_000), us(205_000));
        assert_eq!(w.budget(us(300_000)), CAP);
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
    fn bytes_found_by_a_late_look_count_as_contention() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        assert_eq!(w.idle(us(0)), Next::Look);
        // The yield lost the core; the next pass found the bytes.
        w.moved(us(4000), us(4001));
        assert_eq!(w.budget(us(4002)), Duration::ZERO);
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
    fn a_fixed_spin_never_adapts() {
        let mut w = Waiter::new(Spin::Fixed(CAP));
        assert_eq!(w.idle(us(0)), Next::Look);
        assert_eq!(w.idle(us(50)), Next::Look);
        assert_eq!(w.idle(us(5000)), Next::Park, "past the spin");
        w.moved(us(10_000), us(10_000));
        assert_eq!(w.idle(us(20_000)), Next::Look);
        assert_eq!(
            w.idle(us(24_000)),
            Next::Park,
            "past the spin, not for lateness"
        );
        w.moved(us(24_000), us(24_000));
        assert_eq!(
            w.budget(us(24_001)),
            CAP,
            "a late look does not hold a fixed spin"
        );
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
