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
    Ahead, Channel, ChannelKind, Direction, Fabric, FabricError, FailureKind, Transfer,
};

use crate::turn::Shared;

/// The Unix time, in µs, that virtual time zero reads as in the flight recorder's records
/// (2026-01-01 00:00:00 UTC): one clock for every rank, and the same records for the same
/// seed.
pub const EPOCH_US: u64 = 1_767_225_600_000_000;

/// One rank's fabric in a simulated job.
pub struct SimFabric {
    shared: Arc<Shared>,
    /// The rank's parker for the turn hand-off, shared with the fabrics of its sub-groups (the
    /// rank's one thread drives them all, one call at a time). In a `Mutex` only so that the
    /// fabric stays `Sync` (a `Parker` is not): it is never contended.
    parker: Arc<Mutex<Parker>>,
    kind: ChannelKind,
    /// This rank in the fabric's group (its job rank for the job's own fabric).
    rank: usize,
    size: usize,
    links: Vec<usize>,
    /// A sub-group's fabric: its members' job ranks and its channels' job links.
    view: Option<View>,
}

/// A rank's world, parker and channel kind: what the fabrics of its sub-groups share.
pub(crate) struct Handles {
    pub(crate) shared: Arc<Shared>,
    parker: Arc<Mutex<Parker>>,
    kind: ChannelKind,
}

/// How a sub-group's fabric names the job's ranks and channels.
#[derive(Clone, Debug)]
pub(crate) struct View {
    /// The job rank of each rank of the group.
    pub(crate) members: Vec<usize>,
    /// `links[peer][link]`: the job link of this rank's link `link` to group rank `peer`.
    pub(crate) links: Vec<Vec<usize>>,
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
            parker: Arc::new(Mutex::new(parker)),
            kind,
            rank,
            size,
            links,
            view: None,
        }
    }

    /// What a fabric of this rank's sub-groups shares with this one.
    pub(crate) fn handles(&self) -> Handles {
        Handles {
            shared: Arc::clone(&self.shared),
            parker: Arc::clone(&self.parker),
            kind: self.kind,
        }
    }

    /// The fabric of group rank `rank` of a sub-group seen through `view`, on the thread and
    /// parker of `handles`' rank.
    pub(crate) fn sub(handles: &Handles, rank: usize, view: View) -> Self {
        Self {
            shared: Arc::clone(&handles.shared),
            parker: Arc::clone(&handles.parker),
            kind: handles.kind,
            rank,
            size: view.members.len(),
            links: view.links.iter().map(Vec::len).collect(),
            view: Some(view),
        }
    }

    /// This rank's job rank.
    pub(crate) fn job_rank(&self) -> usize {
        self.view
            .as_ref()
            .map_or(self.rank, |v| v.members[self.rank])
    }

    /// The job rank of each rank of this fabric's group.
    pub(crate) fn job_members(&self) -> Vec<usize> {
        self.view
            .as_ref()
            .map_or_else(|| (0..self.size).collect(), |v| v.members.clone())
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

    /// Over stream channels: a forward is queued as its receive lands.
    fn forwards(&self) -> bool {
        self.kind == ChannelKind::Stream
    }

    fn begin_operation(&mut self) {
        let rank = self.job_rank();
        let mut world = self.shared.lock();
        let operation = world.ranks[rank].operations;
        world.ranks[rank].operations += 1;
        if world
            .crash_operations
            .iter()
            .any(|&(r, o)| r == rank && o == operation)
        {
            world.crash(rank);
        }
    }

    fn now(&self) -> Duration {
        self.shared.lock().now
    }

    fn epoch_us(&self) -> Option<u64> {
        Some(EPOCH_US)
    }

    fn run(&mut self, step: &mut [Transfer<'_>], deadline: Duration) -> Result<(), FabricError> {
        self.run_ahead(step, Ahead::none(step.len()), deadline, &mut [])
    }

    fn run_ahead(
        &mut self,
        step: &mut [Transfer<'_>],
        ahead: Ahead,
        deadline: Duration,
        moved: &mut [usize],
    ) -> Result<(), FabricError> {
        ahead.check(step, moved)?;
        let job_rank = self.job_rank();
        let parker = self.parker.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(view) = &self.view else {
            return self
                .shared
                .step(job_rank, &parker, step, ahead, deadline, moved);
        };
        // A sub-group's step runs on the job's channels, and its error names the group's.
        for t in step.iter() {
            let channel = t.channel();
            if view.job_link(channel).is_none() {
                return Err(t.invalid(format!(
                    "rank {} of the sub-group has no channel {channel}",
                    self.rank
                )));
            }
        }
        for t in step.iter_mut() {
            let channel = t.channel();
            let link = view.job_link(channel).unwrap_or(channel.link);
            *t.channel_mut() = Channel::new(view.members[channel.peer], link);
        }
        let result = self
            .shared
            .step(job_rank, &parker, step, ahead, deadline, moved);
        for t in step.iter_mut() {
            *t.channel_mut() = view.group_channel(t.channel());
        }
        result.map_err(|mut e| {
            e.channel = view.group_channel(e.channel);
            e
        })
    }

    fn last_heard(&self, peer: usize) -> Option<Duration> {
        let peer = match &self.view {
            Some(view) => *view.members.get(peer)?,
            None => peer,
        };
        self.shared.lock().heard[self.job_rank()]
            .get(peer)
            .copied()
            .flatten()
    }
}

impl View {
    /// The job link of the group's `channel`, if the group has that channel.
    fn job_link(&self, channel: Channel) -> Option<usize> {
        self.links.get(channel.peer)?.get(channel.link).copied()
    }

    /// The group's name of job channel `job` (unchanged if it is none of the group's).
    fn group_channel(&self, job: Channel) -> Channel {
        let Some(peer) = self.members.iter().position(|&m| m == job.peer) else {
            return job;
        };
        match self.links[peer].iter().position(|&l| l == job.link) {
            Some(link) => Channel::new(peer, link),
            None => job,
        }
    }
}

impl Shared {
    /// One fabric call of `rank`: counts it (a [`crate::Fault::Crash`] strikes here), checks
    /// every transfer names a channel of the wiring and a landing that fits, and hands the
    /// step to the engine of the channels' kind. The stream engine runs the transfers that go
    /// `ahead` as [`Fabric::run_ahead`] says; the message engine (RDMA's channels, which the
    /// nuvec wire never runs over) runs them to their end, as a fabric that does not take
    /// them ahead.
    fn step(
        &self,
        rank: usize,
        parker: &Parker,
        step: &mut [Transfer<'_>],
        ahead: Ahead,
        deadline: Duration,
        moved: &mut [usize],
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
        for (i, t) in step.iter().enumerate() {
            let channel = t.channel();
            let valid = channel.peer < world.size()
                && channel.link < world.wiring.links(rank, channel.peer);
            if !valid {
                return Err(t.invalid(format!("rank {rank} has no channel {channel}")));
            }
            Transfer::check_in(step, i, world.uc.is_none()).map_err(|what| t.invalid(what))?;
        }
        if world.uc.is_some() {
            self.run_messages(world, rank, parker, step, deadline, started)?;
            ahead.all_moved(step, moved);
            Ok(())
        } else {
            self.run_stream(world, rank, parker, step, ahead, deadline, started, moved)
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
