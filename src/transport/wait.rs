//! How a step that cannot progress waits: looking again (the bytes are seen the moment they
//! arrive, but the core stays busy) or parking (the core is free, but waking costs time), and
//! when to switch. A sans-IO state machine fed the fabric's clock: [`Waiter::idle`] says what
//! to do after a pass that moved nothing, and [`Waiter::moved`] tells it that bytes moved. The
//! TCP fabric parks in the poll (epoll, kqueue); the RDMA fabric, which has no completion
//! channel, yields the core between polls of its completion queues, and uses a waiter only
//! for a fixed spin.
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
//!   or the thread was preempted), shows a contended core: the wait parks at once, and so do
//!   the waits of a hold that follows. The hold is as many waits as parking them costs what
//!   the late look lost (the gap over [`PARK_COST`], what a parked wait costs more than a
//!   looking one: a ski-rental rule, spending on parking what looking just lost), times a
//!   scale that doubles when looks come late again soon after a hold (fewer looking waits
//!   than a quarter of that count: the core stays contended, so parking wins) and halves
//!   when they come late only after at least that many looking waits (contention is rare,
//!   so looking wins), up to [`MAX_HOLD`] waits.
//!
//! - A wait that outlasts the cap burnt the cap for nothing: it parks in the end all the same.
//!   After [`OUTLASTED`] such waits in a row, waits park at once, until one ends within the
//!   cap (a parked wait measures that as well as a looking one). That is a link-bound
//!   transfer, each wait for the link's next bytes, or a hop longer than the cap (Thunderbolt
//!   IP's round trips take 0.4–0.95 ms): the looks only took cycles from the kernel's network
//!   processing on the same cores. It costs no time where the prediction holds (the wait would
//!   have parked anyway), and one wake ([`PARK_COST`]) where it fails. On 4 hosts at 1 Gbit/s
//!   it took the CPU of a 1 MiB all_sum from 2.8–3.0× a parked wait's to 1.1–1.2×, at the
//!   same busbw (the README's "Looking or parking on a slow link").
//!
//! [`Spin::Fixed`] looks for the same time every wait and never holds (zero parks at once):
//! what `NUVEC_DISTRIBUTED_SPIN_US` and [`Options::spin`](crate::Options::spin) set, and how
//! the candidates are compared (`benches/compare.sh`, `benches/waits.sh`; the README's
//! performance section has the tables). Waits that are long on an idle machine are not
//! shortened: a wait of more than the cap burns at most the cap.
//!
//! # Measured
//!
//! The candidates side by side, float32 all_sum through nuvec arrays on a 2-core virtual
//! machine (`benches/upstream`; the columns interleaved, best p50 of 2 runs, µs): jobs
//! started by `nuvec-launch` on an idle machine, by `mlx.launch` (whose own loop keeps 1.3
//! cores busy), and by `nuvec-launch` with two busy loops running (`HOGS=2` in
//! `benches/compare.sh`). The fixed 100 µs look (the former default) is the fastest on an
//! idle machine and collapses on a busy one; parking at once never collapses but is slow when
//! idle; the adaptive wait is within noise of the better of the two in every row:
//!
//! | ranks | size | started by | adaptive | look 100 µs | park at once | 0.5.0 |
//! |---|---|---|---|---|---|---|
//! | 2 | 4 KiB | nuvec-launch | 7.9 | 7.8 | 16.6 | 13.2 |
//! | 2 | 4 KiB | mlx.launch | 14.0 | 156.9 | 16.7 | 30.0 |
//! | 2 | 4 KiB | two busy loops | 17.3 | 14.7 | 17.7 | 13.4 |
//! | 2 | 1 MiB | nuvec-launch | 345 | 255 | 281 | 542 |
//! | 2 | 1 MiB | mlx.launch | 432 | 429 | 451 | 844 |
//! | 2 | 1 MiB | two busy loops | 281 | 459 | 460 | 792 |
//! | 4 | 4 KiB | nuvec-launch | 47.8 | 43.0 | 140.6 | 139.1 |
//! | 4 | 4 KiB | mlx.launch | 75.0 | 70.7 | 83.7 | 63.5 |
//! | 4 | 4 KiB | two busy loops | 80.7 | 5987 | 76.7 | 53.0 |
//! | 4 | 1 MiB | mlx.launch, two busy loops | 2577 | 6365 | 2910 | 8837 |
//!
//! On a busy machine 0.5.0 stays ahead at 4 KiB, and parking at once does not reach it. Not
//! for the wire protocol: below 2R × 256 KiB MLX's ring runs one sub-reduce in one direction,
//! so a small step is one send and one receive, as 0.5.0's. Keeping the core for a few
//! microseconds after a wake instead of parking again (tried) made it worse. Other rules tried
//! were within the noise of this one; the candidates of a column side by side in one run, 3
//! rounds each, the range of the p50 (µs), 4 ranks (the rows where the rule matters most):
//!
//! | candidate | 1 MiB, nuvec-launch | 1 MiB, mlx.launch | 4 KiB, mlx.launch |
//! |---|---|---|---|
//! | this rule | 1480–1567 | 2237–2522 | 64–77 |
//! | late only past 1.5 ms | 1275–1416 | 2280–2505 | — |
//! | costs compared (below), late past 0.5 ms | 1404–1622 | 2063–2479 | 89–96 |
//! | costs compared, late past 1.5 ms | 1071–1361 | 2317–2514 | — |
//! | look 100 µs | 1230–1398 | 1820–2351 | — |
//! | 0.5.0 | 1911–2182 | 4230–4865 | 65–69 |
//!
//! "Costs compared" keeps moving averages of how long looking waits and the waits of a hold
//! take, ends a hold once its waits cost more than looking ones did, and starts one when
//! looking costs more. Parking in a blocking receive instead of epoll, as 0.5.0 waits (a call
//! fewer per wait), took 136–145 µs for 4 KiB on 4 ranks under `nuvec-launch` where parking in
//! epoll took 142–147 (both parking at once; 0.5.0: 102–147); under `mlx.launch`, in a later
//! run of 4 rounds, 124–133 against 135–146, where 0.5.0 took 99–101 and this rule 117–136:
//! how a wait parks is not what 0.5.0 has ahead there. (Parked waits are faster under
//! `mlx.launch` than under `nuvec-launch`, 0.5.0's 99–101 against 176–201 in that run: a core
//! the launcher keeps busy never halts, so a wake costs no exit from an idle virtual core.)
//!
//! Where the late looks fall, and why no threshold tells a peer from a busy thread (a count
//! of every look-to-look gap over 500 µs, the fixed 100 µs look, 4 ranks at 1 MiB, one run):
//! under `nuvec-launch` 92 % of them are under 1 ms, a peer rank's pass over its segment,
//! which this rule takes for contention; with two busy loops running, 73 % are over 1.5 ms
//! and half are 3–6 ms (the scheduler's slice, rounded up to its tick); under `mlx.launch`,
//! whose own thread is the busy one, 72 % are under 1 ms and nearly all under 2 ms. So
//! counting only gaps past 1.5 ms spares the first row and misses most of the third, and a
//! second run of it was mixed again (range of 3 rounds' p50, µs): 1670–1755 against this
//! rule's 1854–1886 at 1 MiB on 4 ranks under `nuvec-launch` (0.5.0: 2286–2588), but
//! 3317–3737 against 2636–3407 with two busy loops, and one round of 79 against 17–30 for
//! 4 KiB on 2 ranks under `mlx.launch`.
//!
//! Two more rules, tried since (the same layout: 3 rounds, range of the p50, µs). Looking
//! without yielding for 10, 25 or 50 µs at the start of a held wait, instead of parking at
//! once (a rank woken for a small step would keep its core for a reply due within
//! microseconds), was worse in every contended row: 4 KiB on 4 ranks under `mlx.launch`
//! 115–257, 114–478 and 131–768 against this rule's 113–156 (0.5.0: 98–101); 4 KiB on 2
//! ranks with two busy loops 22–49, 20–82 and 28–134 against 19–28 (0.5.0: 18–20): a rank
//! that keeps the core keeps it from the peer it waits for. Counting a look as late only past
//! [`LATE`] plus two or four times this rank's own longest recent pass (a peer's pass over the
//! same step takes about as long as this rank's, a busy thread's slice does not) was within
//! the noise of this rule at 1 MiB on 4 ranks: 1995–2165 and 2058–2137 against 1862–2212
//! under `nuvec-launch`, 3251–3607 and 3232–3584 against 3448–3671 under `mlx.launch`,
//! 3675–4585 and 3998–4859 against 3920–4347 with two busy loops (0.5.0: 2553–2666,
//! 5559–6368, 13322–13911).
//!
//! The RDMA fabric, which cannot park, yields between polls from the first (its docs have the
//! numbers: over the software provider that beat both this look and MLX's polling without
//! end).

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

/// What a wait that parks costs more than one that keeps looking, on an idle core: the wake
/// of a parked thread (measured on a 2-core VM: a 4 KiB all_sum of 2 ranks, two waits, takes
/// 14–17 µs parked and 8–9 µs looking).
pub(crate) const PARK_COST: Duration = Duration::from_micros(4);

/// The most waits a hold parks.
pub(crate) const MAX_HOLD: u32 = 1 << 16;

/// The largest scale of a hold.
const MAX_SCALE: u32 = 1024;

/// After this many waits in a row that outlasted the cap, waits park at once (see the
/// [module documentation](self)).
pub(crate) const OUTLASTED: u32 = 4;

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
    /// Whether the current wait is one of a hold.
    held: bool,
    /// How many more waits park at once.
    hold_left: u32,
    /// The length of the last hold.
    hold: u32,
    /// What the next hold's length is multiplied by.
    scale: u32,
    /// The waits that looked without coming late since the last hold began.
    streak: u32,
    /// The waits in a row, to the last, that outlasted the cap.
    outlasted: u32,
}

impl Waiter {
    /// A waiter that spins as `spin` says.
    pub(crate) fn new(spin: Spin) -> Self {
        Self {
            spin,
            since: None,
            last: Duration::ZERO,
            parked: false,
            held: false,
            hold_left: 0,
            hold: 0,
            scale: 1,
            // No late look yet: as if looking had always paid.
            streak: u32::MAX,
            outlasted: 0,
        }
    }

    /// How long the next wait looks before it parks.
    pub(crate) fn budget(&self) -> Duration {
        match self.spin {
            Spin::Fixed(spin) => spin,
            Spin::Adaptive(_) if self.hold_left > 0 || self.outlasted >= OUTLASTED => {
                Duration::ZERO
            }
            Spin::Adaptive(cap) => cap,
        }
    }

    /// Forgets a wait left unfinished (a step that failed while waiting): call when a step
    /// starts.
    pub(crate) fn reset(&mut self) {
        self.since = None;
        self.parked = false;
        self.held = false;
    }

    /// A pass of the step moved nothing at `now`: look again or park.
    pub(crate) fn idle(&mut self, now: Duration) -> Next {
        let gap = now.saturating_sub(std::mem::replace(&mut self.last, now));
        let Some(since) = self.since else {
            // A new wait.
            self.since = Some(now);
            if self.budget().is_zero() {
                self.hold_left = self.hold_left.saturating_sub(1);
                self.parked = true;
                self.held = matches!(self.spin, Spin::Adaptive(_));
                return Next::Park;
            }
            return Next::Look;
        };
        if self.parked {
            return Next::Park;
        }
        if gap > LATE && matches!(self.spin, Spin::Adaptive(_)) {
            // A busy thread ran between the last look and this one.
            self.parked = true;
            self.contended(gap);
            return Next::Park;
        }
        if now.saturating_sub(since) < self.budget() {
            Next::Look
        } else {
            self.parked = true;
            Next::Park
        }
    }

    /// A look came `gap` after the one before: the waits of a hold park at once (see the
    /// [module documentation](self)).
    fn contended(&mut self, gap: Duration) {
        // Parking `lost` waits costs what this look lost: looking paid if at least that many
        // waits looked since the last late look.
        let lost = (gap.as_nanos() / PARK_COST.as_nanos()).max(1);
        let streak = u128::from(self.streak);
        if streak < lost / 4 {
            self.scale = (self.scale * 2).min(MAX_SCALE);
        } else if streak >= lost {
            self.scale = (self.scale / 2).max(1);
        }
        let hold = lost
            .saturating_mul(u128::from(self.scale))
            .min(u128::from(MAX_HOLD));
        self.hold = u32::try_from(hold).unwrap_or(MAX_HOLD);
        self.hold_left = self.hold;
        self.streak = 0;
    }

    /// The step moved bytes in a pass that began at `looked`, ending the wait under way, if
    /// any.
    pub(crate) fn moved(&mut self, looked: Duration) {
        let Some(since) = self.since.take() else {
            return;
        };
        let parked = std::mem::take(&mut self.parked);
        let held = std::mem::take(&mut self.held);
        let Spin::Adaptive(cap) = self.spin else {
            return;
        };
        // Whether a look for the whole cap would have found the bytes, however it waited.
        if looked.saturating_sub(since) > cap {
            self.outlasted = self.outlasted.saturating_add(1);
        } else {
            self.outlasted = 0;
        }
        if held {
            return;
        }
        let gap = looked.saturating_sub(self.last);
        if !parked && gap > LATE {
            // The bytes were found by a look that came late: they may have waited for it.
            self.contended(gap);
        } else {
            self.streak = self.streak.saturating_add(1);
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
        w.moved(us(now));
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
        w.moved(us(205_000));
        assert_eq!(w.budget(), CAP);
        assert!(wait(&mut w, 300_000, 300_010, 1));
    }

    #[test]
    fn looks_a_peer_sharing_the_core_delays_by_tens_of_microseconds_keep_looking() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        for i in 0..100 {
            assert!(wait(&mut w, i * 1000, i * 1000 + 90, 30), "wait {i}");
        }
        assert_eq!(w.budget(), CAP);
    }

    #[test]
    fn a_late_look_parks_as_many_waits_as_cost_what_it_lost() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        assert_eq!(w.idle(us(0)), Next::Look);
        assert_eq!(w.idle(us(4000)), Next::Park, "the wait under way parks");
        w.moved(us(4010));
        let held = (4000 / PARK_COST.as_micros()) as usize;
        let looked: Vec<bool> = (0..held + 1)
            .map(|i| {
                wait(
                    &mut w,
                    10_000 + i as u64 * 100,
                    10_000 + i as u64 * 100 + 10,
                    1,
                )
            })
            .collect();
        assert!(
            looked[..held].iter().all(|l| !l),
            "the hold's waits park at once"
        );
        assert!(looked[held], "the wait after the hold looks again");
    }

    #[test]
    fn a_core_that_stays_contended_is_looked_at_rarely() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        // Every look loses the core for a tick.
        let mut looked = 0;
        for i in 0..200_000 {
            if wait(&mut w, i * 100, i * 100 + 10, 4000) {
                looked += 1;
            }
        }
        assert!(
            looked <= 12,
            "{looked} of 200000 waits looked on a contended core"
        );
        assert_eq!(w.hold, MAX_HOLD);
    }

    #[test]
    fn bytes_found_by_a_late_look_count_as_contention() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        assert_eq!(w.idle(us(0)), Next::Look);
        // The yield lost the core; the next pass found the bytes.
        w.moved(us(4000));
        assert_eq!(w.budget(), Duration::ZERO);
    }

    #[test]
    fn rare_late_looks_shrink_the_hold_and_looking_resumes_after_contention() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        for i in 0..200_000 {
            wait(&mut w, i * 100, i * 100 + 10, 4000);
        }
        // Once the core is free, waits look again within one hold (at most MAX_HOLD waits).
        let start = 200_000u64;
        let looked: Vec<bool> = (start..start + u64::from(MAX_HOLD) + 1000)
            .map(|i| wait(&mut w, i * 100, i * 100 + 10, 1))
            .collect();
        assert!(looked[looked.len() - 1000..].iter().all(|&l| l));
        // Then a late look only once every 10000 waits: the hold shrinks, a halving a hold,
        // to what one late look costs.
        let mut t = (start + u64::from(MAX_HOLD) + 1000) * 100;
        for _ in 0..80 {
            for _ in 0..10_000 {
                wait(&mut w, t, t + 10, 1);
                t += 100;
            }
            wait(&mut w, t, t + 10, 4000);
            t += 10_000;
        }
        assert_eq!(w.scale, 1);
        assert_eq!(w.hold, 1000, "a 4 ms loss holds 1000 waits of 4 µs");
    }

    #[test]
    fn waits_that_outlast_the_cap_four_times_running_park_at_once_until_one_ends_within_it() {
        let mut w = Waiter::new(Spin::Adaptive(CAP));
        // The first long waits (the link's) each look for the cap, then park.
        for i in 0..u64::from(OUTLASTED) {
            assert!(wait(&mut w, i * 10_000, i * 10_000 + 500, 1), "wait {i}");
        }
        // After that many in a row, long waits park at once.
        for i in u64::from(OUTLASTED)..100 {
            assert!(!wait(&mut w, i * 10_000, i * 10_000 + 500, 1), "wait {i}");
        }
        // A parked wait that ended within the cap: the next one looks again.
        assert!(!wait(&mut w, 1_000_000, 1_000_020, 1));
        assert_eq!(w.budget(), CAP);
        assert!(wait(&mut w, 1_010_000, 1_010_020, 1));
        // Short waits between long ones keep every wait looking.
        for i in 0..100u64 {
            let t = 2_000_000 + i * 10_000;
            let arrives = if i % 4 == 3 { t + 20 } else { t + 500 };
            assert!(wait(&mut w, t, arrives, 1), "wait {i}");
        }
    }

    #[test]
    fn a_fixed_spin_never_adapts() {
        let mut w = Waiter::new(Spin::Fixed(CAP));
        assert_eq!(w.idle(us(0)), Next::Look);
        assert_eq!(w.idle(us(50)), Next::Look);
        assert_eq!(w.idle(us(5000)), Next::Park, "past the spin");
        w.moved(us(10_000));
        assert_eq!(w.idle(us(20_000)), Next::Look);
        assert_eq!(
            w.idle(us(24_000)),
            Next::Park,
            "past the spin, not for lateness"
        );
        w.moved(us(24_000));
        assert_eq!(w.budget(), CAP, "a late look does not hold a fixed spin");
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
