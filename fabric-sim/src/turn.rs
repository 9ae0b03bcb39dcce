//! The turn hand-off: only the rank holding the turn runs; when it blocks in the fabric or
//! finishes, the scheduler ([`World::schedule`]) picks the next holder under the world's lock
//! and this module wakes exactly that rank.
//!
//! Uses: the [`World`] (its `turn`, chosen by the scheduler). Invariants: `turn` changes only
//! under the lock, and the chosen rank is woken in the same critical section (so it cannot
//! miss its wake-up between its check of `turn` and its wait); a waiting rank runs only once
//! it has seen `turn` name it under the lock, so the previous holder's writes happen before
//! its reads; the lock-free watch of `holder` only decides when to look, never who runs. Only
//! the order of turns is simulated, and it is fixed by the scheduler: how a rank waits changes
//! no result and no trace hash. `tests/loom.rs` holds a replica of this protocol: keep it in
//! step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::world::{RankState, World};

/// What every rank thread shares: the world behind its one lock, and the turn.
pub(crate) struct Shared {
    world: Mutex<World>,
    /// One per rank: the rank waits on its own, so passing the turn wakes only the rank that
    /// gets it (with one shared condition variable every hand-off woke every rank).
    turns: Vec<Condvar>,
    /// The rank holding the turn ([`NOBODY`] when none), mirrored outside the lock so that a
    /// waiting rank can watch for its turn without taking the lock or sleeping.
    holder: AtomicUsize,
}

/// [`Shared::holder`] when no rank holds the turn.
const NOBODY: usize = usize::MAX;

/// How long a rank waiting for its turn watches [`Shared::holder`] (yielding the core between
/// looks) before it sleeps on its condition variable. A hand-off to a sleeping thread waits
/// for the kernel to wake it, tens of microseconds on a virtual machine whose other core is
/// idle, and a simulated job hands the turn on at every fragment; a watching rank takes its
/// turn at once. Only the order of turns is simulated, so this changes no result or trace.
const WATCH: Duration = Duration::from_micros(50);

impl Shared {
    /// The shared state of a job about to start: nobody holds the turn yet.
    pub(crate) fn new(world: World) -> Self {
        let size = world.size();
        Self {
            world: Mutex::new(world),
            turns: (0..size).map(|_| Condvar::new()).collect(),
            holder: AtomicUsize::new(NOBODY),
        }
    }

    /// Publishes the rank the scheduler gave the turn to and wakes it if it sleeps (`world` is
    /// still locked, so it cannot miss the wake-up between its check of the turn and its
    /// wait).
    fn pass(&self, world: &World) {
        self.holder
            .store(world.turn.unwrap_or(NOBODY), Ordering::Release);
        if let Some(next) = world.turn {
            self.turns[next].notify_one();
        }
    }

    /// Returns with `world` locked once `rank` holds the turn: first watching
    /// [`Shared::holder`] without the lock for up to [`WATCH`], then sleeping on the rank's
    /// condition variable, always re-checking `turn` under the lock.
    fn await_turn<'a>(
        &'a self,
        mut world: MutexGuard<'a, World>,
        rank: usize,
    ) -> MutexGuard<'a, World> {
        if world.turn == Some(rank) {
            return world;
        }
        drop(world);
        let since = Instant::now();
        while self.holder.load(Ordering::Acquire) != rank && since.elapsed() < WATCH {
            std::thread::yield_now();
        }
        world = self.lock();
        while world.turn != Some(rank) {
            world = self.turns[rank]
                .wait(world)
                .unwrap_or_else(PoisonError::into_inner);
        }
        world
    }

    /// Locks the world. Poisoning is ignored: rank closures run outside the lock, so a panic
    /// in one (reported as that rank's outcome) leaves the world as it was.
    pub(crate) fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks the calling rank thread until the scheduler gives it the turn.
    pub(crate) fn wait_turn(&self, rank: usize) {
        drop(self.await_turn(self.lock(), rank));
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

    /// Hands the turn to the scheduler and waits to get it back.
    pub(crate) fn yield_turn<'a>(
        &'a self,
        mut world: MutexGuard<'a, World>,
        rank: usize,
    ) -> MutexGuard<'a, World> {
        world.schedule();
        if world.turn != Some(rank) {
            self.pass(&world);
        }
        self.await_turn(world, rank)
    }
}
