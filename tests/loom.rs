//! Loom models of the crate's shared-memory concurrency: the communicator's sticky failure
//! state and the simulator's turn hand-off.
//!
//! Run (CI does, in a few minutes; a separate target directory keeps the `--cfg loom` build
//! apart from the normal one):
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --ignore-rust-version --release --test loom
//! ```
//!
//! Without `--cfg loom` this file compiles to nothing. Every model runs with a **preemption
//! bound of 3** (loom's documentation: 2–3 finds most bugs; `LOOM_MAX_PREEMPTIONS` overrides
//! it), so each explores every interleaving in which no thread is preempted more than three
//! times, and loom's C11 memory model on top. Loom also fails a model on a deadlock (every
//! thread blocked: a lost wake-up) and on unsynchronised access to a `loom::cell::UnsafeCell`.
//!
//! One file of about 750 lines with a module per model (`communicator`, `turns`, `broken`):
//! the models share the harness at the top (the preemption bound and `check`, which runs one),
//! and the file must be one binary of its own, since only it is built with `--cfg loom`.
//!
//! The local link's parking protocol (`src/transport/tcp/local/queue.rs`) is private to the
//! crate, so its model is a unit test there, run by CI with `--lib -- local::queue::loom`.
//!
//! What is modelled where:
//!
//! - **The communicator** (`src/collective/core.rs`, under `RingCommunicator`: one `Mutex<State>` holding the
//!   fabric, the sequence number and the first failure). Modelled as the *real code*: the
//!   crate takes its `Mutex` from `src/sync.rs`, which is loom's under `cfg(loom)`, and the
//!   models drive a real `RingCommunicator` over a scripted fabric.
//!   [`communicator_uses_loom_s_mutex`] checks that this is so (if `collective/core.rs` took std's Mutex,
//!   loom would see no lock at all and the models would prove nothing).
//! - **The simulator's turn hand-off** (`fabric-sim/src/turn.rs`, `Shared`: a `Mutex<World>`,
//!   one `crossbeam_utils::sync::Parker` per rank and the matching `Unparker`s). Modelled as
//!   a faithful *replica*, [`turns`], because the real one cannot run under loom: `Sim::run`
//!   spawns its rank threads with `std::thread::scope` (they borrow the caller's closure), and
//!   loom has no scoped threads (tokio-rs/loom#308, #396), so it would need a `'static` API;
//!   and `nuvec-fabric-sim` is a separate crate that cannot reach this crate's private `sync`
//!   shim (nor does crossbeam's `Parker` use loom's primitives outside crossbeam's own
//!   `crossbeam_loom` builds). The replica keeps the same state machine (ranks
//!   Ready/Waiting/Done, a dirty flag, a seeded scheduler choosing among runnable ranks, time
//!   advancing when none is) and the same protocol: `schedule()` and the unpark of the rank it
//!   chose (`Shared::pass`, which also publishes it in the atomic `holder`) happen in one
//!   critical section, and a waiting rank checks `turn` under the lock and parks between
//!   checks until the turn is its own. The parker is replicated by its contract
//!   ([`turns::Parker`]: a token that `unpark` sets and `park` waits for and clears, so an
//!   unpark before the park is kept), on loom's `Mutex` and `Condvar`. The real waiter first
//!   watches `holder` for up to 50 µs; loom has no clock, so the replica's watch is one look,
//!   after which both check `turn` under the lock. Keep it in step with
//!   `Shared::{wait_turn, start, finish, yield_turn, pass}` (`turn.rs`), the waits of
//!   `Shared::{run_stream, run_messages}` (`stream.rs`, `uc.rs`) and `World::schedule`.
//!
//! The replica can also be built with one deliberate bug of each class it should catch
//! (`turns::Bug`); the `*_is_caught` tests run those models in a child process and check that
//! loom fails each for the expected reason, so the model is known to have teeth. (The
//! communicator's models were shown to catch a check-then-act split and a failure stored in
//! a second critical section by breaking a scratch copy of `src/collective/core.rs` by hand.)
//!
//! Cost on the 2-core machine (each model prints its count with `--nocapture`): the
//! communicator models about 2,400 and 100 executions, the two-rank hand-off 23,000–34,000
//! per seed, the three-rank one about 600,000 (some 40 s); the whole file under a minute once
//! built.
#![cfg(loom)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use loom::model::Builder;
use loom::sync::Arc;
use loom::thread;

/// The preemption bound of every model (`LOOM_MAX_PREEMPTIONS` overrides it).
const PREEMPTION_BOUND: usize = 3;

/// Checks `model` under every interleaving within the bound (this file's, unless
/// `LOOM_MAX_PREEMPTIONS` sets one) and prints how many executions that took.
fn check(name: &str, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(PREEMPTION_BOUND);
    }
    let bound = builder.preemption_bound;
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&runs);
    let start = std::time::Instant::now();
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        model();
    });
    println!(
        "{name}: {} executions, preemption bound {bound:?}, {:.2?}",
        runs.load(std::sync::atomic::Ordering::Relaxed),
        start.elapsed()
    );
}

/// Models of the real `RingCommunicator` (`src/ring/communicator.rs`, over `src/collective/core.rs`).
mod communicator {
    use super::*;
    use nuvec_distributed::Error;
    use nuvec_distributed::RingCommunicator;
    use nuvec_distributed::fabric::{ChannelKind, Fabric, FabricError, FailureKind, Transfer};

    /// Rank 0 of a ring of two with one connection per neighbour, whose `fail_at`-th step
    /// (counting from 0) fails as if the peer had closed the connection; every other step
    /// succeeds at once. It is only touched under the communicator's lock.
    pub(super) struct Scripted {
        pub(super) steps: u64,
        pub(super) fail_at: u64,
    }

    impl Fabric for Scripted {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            2
        }
        fn kind(&self) -> ChannelKind {
            ChannelKind::Stream
        }
        fn links(&self, peer: usize) -> usize {
            if peer == 1 { 2 } else { 0 }
        }
        fn now(&self) -> Duration {
            Duration::ZERO
        }
        fn run(&mut self, step: &mut [Transfer<'_>], _: Duration) -> Result<(), FabricError> {
            let n = self.steps;
            self.steps += 1;
            if n != self.fail_at {
                return Ok(());
            }
            let t = &step[0];
            Err(FabricError {
                channel: t.channel(),
                direction: t.direction(),
                done: 0,
                total: t.len(),
                kind: FailureKind::Closed,
            })
        }
    }

    pub(super) fn comm(fail_at: u64) -> RingCommunicator<Scripted> {
        RingCommunicator::new(Scripted { steps: 0, fail_at }, 1, Duration::from_secs(30))
    }

    /// Three threads send at once while the main thread watches `failure()`; the fabric's
    /// second step fails.
    ///
    /// Catches: a caller that checks `failed` before another stores it and then runs on the
    /// failed group (a check-then-act race, e.g. if the lock were dropped between the check
    /// and the transfer, or between the transfer and storing the failure); two callers that
    /// both report a transport failure; a sequence number taken twice; a failure seen half
    /// stored (`failure()` differing from what the failing caller returned).
    ///
    /// Property: exactly one call succeeds (sequence 0), exactly one fails on the wire with
    /// sequence 1, and the third returns `Failed` carrying that very error; `failure()` is
    /// `None` or that error at any moment, and that error at the end.
    #[test]
    fn concurrent_calls_see_the_first_failure() {
        check("concurrent_calls_see_the_first_failure", || {
            let comm = Arc::new(comm(1));
            let callers: Vec<_> = (0..3)
                .map(|i| {
                    let comm = Arc::clone(&comm);
                    thread::spawn(move || comm.try_send(1, &[i; 4]))
                })
                .collect();
            let seen = comm.failure();
            let results: Vec<Result<(), Error>> =
                callers.into_iter().map(|h| h.join().unwrap()).collect();
            let transport: Vec<&Error> = results
                .iter()
                .filter_map(|r| match r {
                    Err(e @ Error::Transport { .. }) => Some(e),
                    _ => None,
                })
                .collect();
            assert_eq!(transport.len(), 1, "{results:?}");
            let first = transport[0];
            assert!(
                matches!(first, Error::Transport { seq: 1, .. }),
                "the failing step is the second one: {first:?}"
            );
            assert_eq!(
                results.iter().filter(|r| r.is_ok()).count(),
                1,
                "{results:?}"
            );
            for r in &results {
                if let Err(Error::Failed { first: f, .. }) = r {
                    assert_eq!(**f, *first, "a later call reports another first failure");
                }
            }
            assert!(
                results.iter().all(|r| matches!(
                    r,
                    Ok(()) | Err(Error::Transport { .. } | Error::Failed { .. })
                )),
                "{results:?}"
            );
            if let Some(seen) = seen {
                assert_eq!(seen, *first, "failure() saw another error");
            }
            assert_eq!(comm.failure().as_ref(), Some(first));
        });
    }

    /// Two threads close the group while a third sends.
    ///
    /// Catches: the fabric handed out twice (two closers both getting it), an operation
    /// running on a fabric that was taken, a sequence number consumed by a refused call
    /// observable as a wrong result.
    ///
    /// Property: exactly one `close()` returns the fabric; the send either ran before (Ok,
    /// and the returned fabric counted its step) or was refused with `Closed`.
    #[test]
    fn close_hands_the_fabric_out_once() {
        check("close_hands_the_fabric_out_once", || {
            let comm = Arc::new(comm(u64::MAX));
            let closers: Vec<_> = (0..2)
                .map(|_| {
                    let comm = Arc::clone(&comm);
                    thread::spawn(move || comm.close())
                })
                .collect();
            let sent = comm.try_send(1, &[7; 4]);
            let fabrics: Vec<Scripted> = closers
                .into_iter()
                .filter_map(|h| h.join().unwrap())
                .collect();
            assert_eq!(
                fabrics.len(),
                1,
                "the fabric was handed out more or less than once"
            );
            match sent {
                Ok(()) => assert_eq!(fabrics[0].steps, 1),
                Err(Error::Closed { .. }) => assert_eq!(fabrics[0].steps, 0),
                other => panic!("send during close: {other:?}"),
            }
            assert!(comm.close().is_none());
        });
    }
}

/// Not a model: checks that the models above see the communicator's lock. Under `cfg(loom)`
/// a loom `Mutex` can only be made inside `loom::model`, so making a communicator outside one
/// must panic; if it does not, `src/collective/core.rs` is not taking its `Mutex` from `src/sync.rs`.
#[test]
fn communicator_uses_loom_s_mutex() {
    let made = catch_unwind(AssertUnwindSafe(|| drop(communicator::comm(0))));
    assert!(
        made.is_err(),
        "RingCommunicator was built outside loom::model: src/collective/core.rs does not use the \
         crate::sync shim, so the communicator models explore nothing"
    );
}

/// A replica of the simulator's turn hand-off (`fabric-sim/src/turn.rs`: `Shared`;
/// `fabric-sim/src/world.rs`: `World`), with one optional deliberate bug.
mod turns {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::sync::{Condvar, Mutex, MutexGuard};

    /// `crossbeam_utils::sync::Parker` by its contract: one token; `unpark` makes it
    /// available and `park` blocks until it is, then takes it. An unpark before the park is
    /// kept (not lost), and several unparks before one park make one token.
    pub(super) struct Parker {
        token: Mutex<bool>,
        wake: Condvar,
    }

    impl Parker {
        fn new() -> Self {
            Self {
                token: Mutex::new(false),
                wake: Condvar::new(),
            }
        }

        fn park(&self) {
            let mut token = self.token.lock().unwrap();
            while !*token {
                token = self.wake.wait(token).unwrap();
            }
            *token = false;
        }

        fn unpark(&self) {
            *self.token.lock().unwrap() = true;
            self.wake.notify_one();
        }
    }

    /// A deliberate bug for the `*_is_caught` tests; `None` is the real protocol.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub(super) enum Bug {
        None,
        /// `finish` unparks the rank holding the turn, releases the lock, and only then picks
        /// the next rank (without unparking anyone again): the rank given the turn may already have looked
        /// and gone back to sleep → lost wake-up (deadlock).
        NotifyBeforeTurn,
        /// `await_turn` parks once and takes the turn when it wakes, without checking `turn`
        /// again: the token a rank left behind when it saw its turn without parking makes a
        /// later park return at once, turn or not → two rank bodies run at once. (Checking
        /// `turn` in one critical section and parking after it, which was a lost wake-up with
        /// condition variables, is the design with a parker: its token keeps the unpark.)
        TrustsAWakeUp,
        /// `pass` unparks the rank that gave the turn away instead of the one that got it: the
        /// new turn holder stays parked → lost wake-up (deadlock).
        WakesTheGiver,
        /// `wait_turn` takes the turn as soon as a relaxed load of `holder` names it, without
        /// the lock: nothing orders the previous holder's writes before this rank's reads →
        /// two rank bodies race on their memory.
        TrustsARelaxedWatch,
    }

    /// `holder` when no rank holds the turn.
    const NOBODY: usize = usize::MAX;

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum RankState {
        /// Not started, or returned from a fabric call: may run.
        Ready,
        /// Blocked in a fabric call until something arrives or its deadline.
        Waiting,
        /// Its closure returned.
        Done,
    }

    /// One fabric call of a rank's scripted body.
    #[derive(Clone, Copy, Debug)]
    pub(super) enum Call {
        /// Queue one message for this rank (completes at once).
        Send(usize),
        /// Wait for one message; times out if none can ever come.
        Recv,
    }

    struct World {
        turn: Option<usize>,
        state: Vec<RankState>,
        /// Something happened that a waiting rank should look at (`Rank::dirty`).
        dirty: Vec<bool>,
        /// Messages arrived and not yet taken, per rank.
        inbox: Vec<usize>,
        /// Ranks whose deadline passed while waiting (virtual time advanced).
        timed_out: Vec<bool>,
        /// The scheduler's generator (the real one is a seeded ChaCha8Rng).
        rng: u64,
        bug: Bug,
    }

    impl World {
        /// `World::schedule`: pick a runnable rank, or advance time (here: every waiting
        /// rank's deadline passes), or, with every rank done, nobody.
        fn schedule(&mut self) {
            loop {
                let runnable: Vec<usize> = (0..self.state.len())
                    .filter(|&r| match self.state[r] {
                        RankState::Ready => true,
                        RankState::Waiting => self.dirty[r] || self.timed_out[r],
                        RankState::Done => false,
                    })
                    .collect();
                if !runnable.is_empty() {
                    self.rng = self
                        .rng
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let pick = runnable[(self.rng >> 33) as usize % runnable.len()];
                    self.dirty[pick] = false;
                    self.turn = Some(pick);
                    return;
                }
                let waiting: Vec<usize> = (0..self.state.len())
                    .filter(|&r| self.state[r] == RankState::Waiting)
                    .collect();
                if waiting.is_empty() {
                    self.turn = None;
                    return;
                }
                for r in waiting {
                    self.timed_out[r] = true;
                }
            }
        }
    }

    /// `Shared`, plus what the model checks: the rank bodies' shared memory (which only the
    /// turn protects, as in the real simulator, where bodies run outside the lock) and a
    /// count of running bodies.
    pub(super) struct Shared {
        world: Mutex<World>,
        /// One per rank (the real `Shared` holds the `Unparker`s; each rank owns its
        /// `Parker`).
        parkers: Vec<Parker>,
        /// `Shared::holder`: the turn's holder mirrored outside the lock (`NOBODY`: none).
        holder: AtomicUsize,
        body_memory: UnsafeCell<Vec<usize>>,
        running: AtomicUsize,
    }

    impl Shared {
        pub(super) fn new(ranks: usize, seed: u64, bug: Bug) -> Self {
            Self {
                world: Mutex::new(World {
                    turn: None,
                    state: vec![RankState::Ready; ranks],
                    dirty: vec![false; ranks],
                    inbox: vec![0; ranks],
                    timed_out: vec![false; ranks],
                    rng: seed,
                    bug,
                }),
                parkers: (0..ranks).map(|_| Parker::new()).collect(),
                holder: AtomicUsize::new(NOBODY),
                body_memory: UnsafeCell::new(Vec::new()),
                running: AtomicUsize::new(0),
            }
        }

        fn lock(&self) -> MutexGuard<'_, World> {
            self.world.lock().unwrap()
        }

        /// `Shared::wait_turn`.
        fn wait_turn(&self, rank: usize) {
            let world = self.lock();
            if world.bug == Bug::TrustsARelaxedWatch && world.turn != Some(rank) {
                drop(world);
                // Broken: takes the turn on a relaxed look alone, without the lock.
                while self.holder.load(Ordering::Relaxed) != rank {
                    loom::thread::yield_now();
                }
                return;
            }
            drop(self.await_turn(world, rank));
        }

        /// `Shared::await_turn`, its watch cut to one look at `holder` (loom has no clock):
        /// whatever the look sees, `turn` is checked again under the lock, and the rank parks
        /// between checks.
        fn await_turn<'a>(
            &'a self,
            world: MutexGuard<'a, World>,
            rank: usize,
        ) -> MutexGuard<'a, World> {
            if world.turn == Some(rank) {
                return world;
            }
            let bug = world.bug;
            drop(world);
            let _mine = self.holder.load(Ordering::Acquire) == rank;
            loop {
                let world = self.lock();
                if world.turn == Some(rank) {
                    return world;
                }
                drop(world);
                self.parkers[rank].park();
                if bug == Bug::TrustsAWakeUp {
                    // Broken: woken, so it must be our turn.
                    return self.lock();
                }
            }
        }

        /// `Shared::pass`: publishes and unparks the rank holding the turn. `giver` is the rank
        /// that just scheduled (for the `WakesTheGiver` bug).
        fn pass(&self, world: &World, giver: Option<usize>) {
            self.holder
                .store(world.turn.unwrap_or(NOBODY), Ordering::Release);
            let woken = if world.bug == Bug::WakesTheGiver {
                giver.or(world.turn)
            } else {
                world.turn
            };
            if let Some(next) = woken {
                self.parkers[next].unpark();
            }
        }

        /// `Shared::start`.
        pub(super) fn start(&self) {
            let mut world = self.lock();
            world.schedule();
            self.pass(&world, None);
        }

        /// `Shared::finish`.
        fn finish(&self, rank: usize) {
            let mut world = self.lock();
            world.state[rank] = RankState::Done;
            if world.bug == Bug::NotifyBeforeTurn {
                // Wakes whoever held the turn before `schedule` (this very rank).
                self.pass(&world, None);
                drop(world);
                self.lock().schedule();
                return;
            }
            world.schedule();
            self.pass(&world, Some(rank));
        }

        /// `Shared::yield_turn`.
        fn yield_turn<'a>(
            &'a self,
            mut world: MutexGuard<'a, World>,
            rank: usize,
        ) -> MutexGuard<'a, World> {
            world.schedule();
            if world.turn != Some(rank) {
                self.pass(&world, Some(rank));
            }
            self.await_turn(world, rank)
        }

        /// `Shared::step` (one fabric call): do the call's effect, then yield until it
        /// completes or times out. Returns whether it completed.
        fn call(&self, rank: usize, call: Call) -> bool {
            let mut world = self.lock();
            // A new call has a new deadline.
            world.timed_out[rank] = false;
            if let Call::Send(to) = call {
                world.inbox[to] += 1;
                world.dirty[to] = true;
            }
            loop {
                let done = match call {
                    Call::Send(_) => true,
                    Call::Recv if world.inbox[rank] > 0 => {
                        world.inbox[rank] -= 1;
                        true
                    }
                    Call::Recv => false,
                };
                if done {
                    world.state[rank] = RankState::Ready;
                    let _world = self.yield_turn(world, rank);
                    return true;
                }
                if world.timed_out[rank] {
                    // As the real code: fail the call and keep the turn (the state stays
                    // Waiting with a passed deadline, which counts as runnable).
                    return false;
                }
                world.state[rank] = RankState::Waiting;
                world = self.yield_turn(world, rank);
            }
        }

        /// Rank code between fabric calls: runs outside the lock, so only the turn keeps
        /// two ranks out of it at once.
        fn body_step(&self, rank: usize) {
            let before = self.running.fetch_add(1, Ordering::Relaxed);
            assert_eq!(before, 0, "rank {rank} runs while another rank runs");
            // SAFETY: no other reference to the log exists while this one does, if the turn
            // protocol is right; loom checks exactly that (a concurrent access fails the model).
            self.body_memory
                .with_mut(|log| unsafe { (*log).push(rank) });
            self.running.fetch_sub(1, Ordering::Relaxed);
        }

        /// A rank thread as `Sim::run` spawns it: wait for the first turn, run the body
        /// (code, then each call, then code), finish and pass the turn. Returns which calls
        /// completed.
        pub(super) fn rank_thread(&self, rank: usize, script: &[Call]) -> Vec<bool> {
            self.wait_turn(rank);
            let mut completed = Vec::new();
            self.body_step(rank);
            for &call in script {
                completed.push(self.call(rank, call));
                self.body_step(rank);
            }
            self.finish(rank);
            completed
        }

        /// After every rank thread joined: nobody holds the turn, everyone is done, every
        /// message was taken, and bodies ran `expected` steps in all.
        pub(super) fn check_end(&self, expected: usize) {
            let world = self.lock();
            assert_eq!(world.turn, None);
            assert!(world.state.iter().all(|&s| s == RankState::Done));
            assert!(world.inbox.iter().all(|&n| n == 0), "{:?}", world.inbox);
            drop(world);
            // SAFETY: every rank thread has been joined, so nothing else touches the log.
            let len = self.body_memory.with(|log| unsafe { (*log).len() });
            assert_eq!(len, expected);
        }
    }

    /// Runs ranks with `scripts` under the hand-off, checks the end state, and returns each
    /// rank's completed calls.
    pub(super) fn run(scripts: &[&'static [Call]], seed: u64, bug: Bug) -> Vec<Vec<bool>> {
        let shared = Arc::new(Shared::new(scripts.len(), seed, bug));
        let handles: Vec<_> = scripts
            .iter()
            .enumerate()
            .map(|(rank, &script)| {
                let shared = Arc::clone(&shared);
                thread::spawn(move || shared.rank_thread(rank, script))
            })
            .collect();
        shared.start();
        let done: Vec<Vec<bool>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let steps: usize = scripts.iter().map(|s| s.len() + 1).sum();
        shared.check_end(steps);
        done
    }

    /// Rank 0 sends to rank 1 and waits for the reply; rank 1 waits, then replies.
    pub(super) const PING: &[Call] = &[Call::Send(1), Call::Recv];
    pub(super) const PONG: &[Call] = &[Call::Recv, Call::Send(0)];
    /// Rank 0 sends one message to rank 1 and finishes.
    pub(super) const SEND_ONE: &[Call] = &[Call::Send(1)];
    /// A rank that waits for one message (rank 2's never comes: its deadline passes).
    pub(super) const STUCK: &[Call] = &[Call::Recv];

    /// The two models' bodies.
    pub(super) fn ping_pong(seed: u64, bug: Bug) {
        let done = run(&[PING, PONG], seed, bug);
        assert_eq!(done, [vec![true, true], vec![true, true]]);
    }

    pub(super) fn with_a_stuck_rank(seed: u64, bug: Bug) {
        let done = run(&[SEND_ONE, STUCK, STUCK], seed, bug);
        assert_eq!(done, [vec![true], vec![true], vec![false]]);
    }
}

/// Two ranks exchange a message under the simulator's turn hand-off, for two scheduler seeds.
///
/// Catches: a lost wake-up (a rank given the turn while it was between looking at `turn` and
/// waiting, or woken before `turn` was set; loom reports the deadlock); two rank bodies
/// running at once (a rank leaving `wait` without the turn: the body counter and loom's
/// `UnsafeCell` race check fail); a finished rank that does not pass the turn; a message or
/// wake-up of a waiting rank lost between `dirty` and the scheduler.
///
/// Property: every rank's calls complete, every rank finishes, nobody holds the turn at the
/// end, and at most one rank body runs at any moment.
#[test]
fn sim_turns_hand_off_one_rank_at_a_time() {
    for seed in [0, 1] {
        check(&format!("ping_pong, seed {seed}"), move || {
            turns::ping_pong(seed, turns::Bug::None)
        });
    }
}

/// Three ranks, one of which waits for a message that never comes, so the scheduler finds
/// nobody runnable and advances time (its deadline passes) while the others finish.
///
/// Catches, besides the above: a scheduler that leaves `turn` on a finished rank, or never
/// wakes a rank whose deadline passed (deadlock).
#[test]
fn sim_turns_survive_a_rank_that_times_out() {
    check("with_a_stuck_rank", || {
        turns::with_a_stuck_rank(2, turns::Bug::None)
    });
}

/// The deliberately broken replicas, each a model loom must fail. They are `#[ignore]`d:
/// a failing loom model can abort the whole test process (unwinding a deadlocked model drops
/// loom objects outside their execution, a panic in a destructor), so the `*_is_caught` tests
/// run each one in a child process of this test binary and check how it failed.
mod broken {
    use super::*;

    #[test]
    #[ignore = "fails by design; run by notify_before_turn_is_caught"]
    fn notify_before_turn() {
        check("notify_before_turn", || {
            turns::ping_pong(0, turns::Bug::NotifyBeforeTurn)
        });
    }

    #[test]
    #[ignore = "fails by design; run by trusting_a_wake_up_is_caught"]
    fn trusts_a_wake_up() {
        check("trusts_a_wake_up", || {
            turns::ping_pong(0, turns::Bug::TrustsAWakeUp)
        });
    }

    #[test]
    #[ignore = "fails by design; run by trusting_a_relaxed_watch_is_caught"]
    fn trusts_a_relaxed_watch() {
        check("trusts_a_relaxed_watch", || {
            turns::ping_pong(0, turns::Bug::TrustsARelaxedWatch)
        });
    }

    #[test]
    #[ignore = "fails by design; run by waking_the_giver_is_caught"]
    fn wakes_the_giver() {
        check("wakes_the_giver", || {
            turns::ping_pong(0, turns::Bug::WakesTheGiver)
        });
    }
}

/// Runs the ignored test `broken::<name>` in a child process and checks that it failed with
/// output containing `expect`.
fn assert_caught(name: &str, expect: &str) {
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--ignored", "--exact", "--nocapture", "--test-threads=1"])
        .arg(format!("broken::{name}"))
        .output()
        .expect("running the test binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("running 1 test"),
        "broken::{name} did not run:\n{text}"
    );
    assert!(
        !out.status.success(),
        "loom passed the broken model broken::{name}:\n{text}"
    );
    assert!(
        text.contains(expect),
        "broken::{name} failed, but not with {expect:?}:\n{text}"
    );
}

/// A lost wake-up: loom reports every thread blocked.
#[test]
fn notify_before_turn_is_caught() {
    assert_caught("notify_before_turn", "deadlock");
}

/// A rank that takes a wake-up for its turn runs beside the rank whose turn it is.
#[test]
fn trusting_a_wake_up_is_caught() {
    assert_caught("trusts_a_wake_up", "UnsafeCell");
}

/// Two rank bodies at once: loom sees them access the bodies' memory without a
/// happens-before edge between them.
#[test]
fn trusting_a_relaxed_watch_is_caught() {
    assert_caught("trusts_a_relaxed_watch", "UnsafeCell");
}

/// The rank given the turn is never woken: loom reports every thread blocked.
#[test]
fn waking_the_giver_is_caught() {
    assert_caught("wakes_the_giver", "deadlock");
}
