//! One rank's fabric ([`SimFabric`]) and the job's virtual clock ([`SimClock`]): the
//! [`Fabric`] implementation that the communicators drive. A fabric call counts itself,
//! validates its step, and hands it to the step engine of the channels' kind
//! ([`crate::stream`] or [`crate::uc`]), under the one lock of [`Shared`].
//!
//! Uses: [`Shared`] (the lock and the turn), the world's wiring, the two engines. Invariants:
//! an invalid step fails before anything of it is queued; every error names the transfer it
//! stopped at ([`fail`]), or, for an empty step of a crashed rank, the rank itself
//! ([`crash_error`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crossbeam_utils::sync::Parker;
use nuvec_distributed::fabric::{
    Channel, ChannelKind, Direction, Fabric, FabricError, FailureKind, Transfer,
};

use crate::turn::Shared;

/// One rank's fabric in a simulated job.
pub struct SimFabric {
    shared: Arc<Shared>,
    /// The rank's parker for the turn hand-off. In a `Mutex` only so that the fabric stays
    /// `Sync` (a `Parker` is not): it is reached through `get_mut` from `run(&mut self)`,
    /// never locked.
    parker: Mutex<Parker>,
    kind: ChannelKind,
    rank: usize,
    size: usize,
    links: Vec<usize>,
}

impl SimFabric {
    /// `rank`'s fabric, with the channels of the world's wiring.
    pub(crate) fn new(shared: Arc<Shared>, kind: ChannelKind, rank: usize, parker: Parker) -> Self {
        let world = shared.lock();
        let size = world.size();
        let links = (0..size).map(|p| world.wiring.links(rank, p)).collect();
        drop(world);
        Self {
            shared,
            parker: Mutex::new(parker),
            kind,
            rank,
            size,
            links,
        }
    }

    /// A handle on the job's virtual clock, usable while the fabric itself is lent out (to a
    /// communicator, say).
    pub fn clock(&self) -> SimClock {
        SimClock {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The virtual clock of a simulated job.
#[derive(Clone)]
pub struct SimClock {
    shared: Arc<Shared>,
}

impl SimClock {
    /// Virtual time since the job started.
    pub fn now(&self) -> Duration {
        self.shared.lock().now
    }
}

impl std::fmt::Debug for SimClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimClock({:?})", self.now())
    }
}

impl std::fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimFabric(rank {} of {})", self.rank, self.size)
    }
}

impl Fabric for SimFabric {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn kind(&self) -> ChannelKind {
        self.kind
    }

    fn links(&self, peer: usize) -> usize {
        self.links.get(peer).copied().unwrap_or(0)
    }

    fn now(&self) -> Duration {
        self.shared.lock().now
    }

    fn run(&mut self, step: &mut [Transfer<'_>], deadline: Duration) -> Result<(), FabricError> {
        let parker = self
            .parker
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        self.shared.step(self.rank, parker, step, deadline)
    }

    fn last_heard(&self, peer: usize) -> Option<Duration> {
        self.shared.lock().heard[self.rank]
            .get(peer)
            .copied()
            .flatten()
    }
}

impl Shared {
    /// One fabric call of `rank`: counts it (a [`crate::Fault::Crash`] strikes here), checks
    /// every transfer names a channel of the wiring and a landing that fits, and hands the
    /// step to the engine of the channels' kind.
    fn step(
        &self,
        rank: usize,
        parker: &Parker,
        step: &mut [Transfer<'_>],
        deadline: Duration,
    ) -> Result<(), FabricError> {
        let mut world = self.lock();
        let call = world.ranks[rank].calls;
        world.ranks[rank].calls += 1;
        if world
            .crash_calls
            .iter()
            .any(|&(r, c)| r == rank && c == call)
        {
            world.crash(rank);
        }
        let started = world.now;
        for t in step.iter() {
            let channel = t.channel();
            let valid = channel.peer < world.size()
                && channel.link < world.wiring.links(rank, channel.peer);
            if !valid {
                return Err(FabricError {
                    channel,
                    direction: t.direction(),
                    done: 0,
                    total: t.len(),
                    kind: FailureKind::Invalid(format!("rank {rank} has no channel {channel}")),
                });
            }
            t.check_landing().map_err(|what| t.invalid(what))?;
        }
        if world.uc.is_some() {
            self.run_messages(world, rank, parker, step, deadline, started)
        } else {
            self.run_stream(world, rank, parker, step, deadline, started)
        }
    }
}

/// The error of a step whose rank has crashed: it names the step's first transfer (or, for an
/// empty step, the rank itself).
pub(crate) fn crash_error(rank: usize, step: &[Transfer<'_>]) -> FabricError {
    match step.first() {
        Some(t) => fail(t, 0, FailureKind::Crashed),
        None => FabricError {
            channel: Channel::new(rank, 0),
            direction: Direction::Send,
            done: 0,
            total: 0,
            kind: FailureKind::Crashed,
        },
    }
}

/// The error of transfer `t` after `done` of its bytes.
pub(crate) fn fail(t: &Transfer<'_>, done: usize, kind: FailureKind) -> FabricError {
    FabricError {
        channel: t.channel(),
        direction: t.direction(),
        done,
        total: t.len(),
        kind,
    }
}
