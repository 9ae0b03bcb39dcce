//! The turn hand-off: only the rank holding the turn runs; when it blocks in the fabric or
//! finishes, the scheduler ([`World::schedule`]) picks the next holder under the world's lock
//! and this module wakes exactly that rank.
//!
//! Every rank has a [`Parker`] (its thread, then its [`SimFabric`](crate::SimFabric), owns
//! it) and [`Shared`] holds the matching [`Unparker`]s. Passing the turn publishes the new
//! holder in `holder` and unparks it. A waiting rank watches `holder` for up to [`WATCH`],
//! then parks, and whenever it wakes it checks `turn` under the lock, parking again until the
//! turn is its own. A parker is a token: an unpark that comes before the park is kept, so a
//! rank that checked `turn`, released the lock and has not parked yet cannot miss its
//! wake-up, and a rank already running (it saw `holder` in its watch) costs the unpark one
//! atomic swap (a condition variable's notify makes a system call on every hand-off, sleeper
//! or not). The token a watching rank leaves behind makes its next park return at once: it
//! looks at `turn`, finds it is not its own, and parks again.
//!
//! The watch stays: a hand-off to a parked thread still waits for the kernel to wake it, tens
//! of microseconds on a virtual machine, and a simulated job hands the turn on at every
//! fragment.
//!
//! Uses: the [`World`] (its `turn`, chosen by the scheduler). Invariants: `turn` changes only
//! under the lock, and the chosen rank is unparked in the same critical section; a waiting
//! rank runs only once it has seen `turn` name it under the lock, so the previous holder's
//! writes happen before its reads; the lock-free watch of `holder` and a wake-up only decide
//! when to look, never who runs. Only the order of turns is simulated, and it is fixed by the
//! scheduler: how a rank waits changes no result and no trace hash. `tests/loom.rs` holds a
//! replica of this protocol (`turns`): keep it in step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_utils::sync::{Parker, Unparker};

use crate::world::{RankState, World};

/// What every rank thread shares: the world behind its one lock, and the turn.
pub(crate) struct Shared {
    world: Mutex<World>,
    /// One per rank, for the [`Parker`] the rank waits on: passing the turn wakes only the
    /// rank that gets it.
    unparkers: Vec<Unparker>,
    /// The rank holding the turn ([`NOBODY`] when none), mirrored outside the lock so that a
    /// waiting rank can watch for its turn without taking the lock or sleeping.
    holder: AtomicUsize,
}

/// [`Shared::holder`] when no rank holds the turn.
const NOBODY: usize = usize::MAX;

/// How long a rank waiting for its turn watches [`Shared::holder`] (yielding the core between
/// looks) before it parks. A hand-off to a sleeping thread waits
/// for the kernel to wake it, tens of microseconds on a virtual machine whose other core is
/// idle, and a simulated job hands the turn on at every fragment; a watching rank takes its
/// turn at once. Only the order of turns is simulated, so this changes no result or trace.
const WATCH: Duration = Duration::from_micros(50);

impl Shared {
    /// The shared state of a job about to start (nobody holds the turn yet), and every rank's
    /// parker, in rank order.
    pub(crate) fn new(world: World) -> (Self, Vec<Parker>) {
        let parkers: Vec<Parker> = (0..world.size()).map(|_| Parker::new()).collect();
        let shared = Self {
            world: Mutex::new(world),
            unparkers: parkers.iter().map(|p| p.unparker().clone()).collect(),
            holder: AtomicUsize::new(NOBODY),
        };
        (shared, parkers)
    }

    /// Publishes the rank the scheduler gave the turn to and unparks it (`world` is still
    /// locked: the turn and its wake-up are one step).
    fn pass(&self, world: &World) {
        self.holder
            .store(world.turn.unwrap_or(NOBODY), Ordering::Release);
        if let Some(next) = world.turn {
            self.unparkers[next].unpark();
        }
    }

    /// Returns with `world` locked once `rank` holds the turn: first watching
    /// [`Shared::holder`] without the lock for up to [`WATCH`], then parking on `parker` (the
    /// rank's own), always re-checking `turn` under the lock.
    fn await_turn<'a>(
        &'a self,
        world: MutexGuard<'a, World>,
        rank: usize,
        parker: &Parker,
    ) -> MutexGuard<'a, World> {
        if world.turn == Some(rank) {
            return world;
        }
        drop(world);
        let since = Instant::now();
        while self.holder.load(Ordering::Acquire) != rank && since.elapsed() < WATCH {
            std::thread::yield_now();
        }
        loop {
            let world = self.lock();
            if world.turn == Some(rank) {
                return world;
            }
            drop(world);
            parker.park();
        }
    }

    /// Locks the world. Poisoning is ignored: rank closures run outside the lock, so a panic
    /// in one (reported as that rank's outcome) leaves the world as it was.
    pub(crate) fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks the calling rank thread until the scheduler gives it the turn.
    pub(crate) fn wait_turn(&self, rank: usize, parker: &Parker) {
        drop(self.await_turn(self.lock(), rank, parker));
    }

    /// Gives the first turn.
    pub(crate) fn start(&self) {
        let mut world = self.lock();
        world.schedule();
        self.pass(&world);
    }

    /// Marks `rank` finished and passes the turn on; says whether it had crashed.
    pub(crate) fn finish(&self, rank: usize) -> bool {
        let mut world = self.lock();
        let crashed = world.ranks[rank].state == RankState::Crashed;
        world.ranks[rank].finished = true;
        if !crashed {
            world.ranks[rank].state = RankState::Done;
            world.close_rank(rank);
        }
        world.hash(&[9, rank as u64]);
        world.schedule();
        self.pass(&world);
        crashed
    }

    /// Hands the turn to the scheduler and waits (on `parker`, the rank's own) to get it
    /// back.
    pub(crate) fn yield_turn<'a>(
        &'a self,
        mut world: MutexGuard<'a, World>,
        rank: usize,
        parker: &Parker,
    ) -> MutexGuard<'a, World> {
        world.schedule();
        if world.turn != Some(rank) {
            self.pass(&world);
        }
        self.await_turn(world, rank, parker)
    }
}
