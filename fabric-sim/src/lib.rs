//! A deterministic, in-process simulator of `nuvec-distributed`'s [`Fabric`].
//!
//! All ranks of a job run in one process, each on its own thread, but **only one runs at a
//! time**: when the running rank blocks in the fabric (or finishes), a scheduler driven by one
//! seeded generator ([`ChaCha8Rng`]) chooses which rank runs next, or, when none can, advances
//! **virtual time** to the next event. Ordinary blocking algorithm code therefore runs
//! deterministically: the same seed gives the same interleaving, the same fragment sizes, the
//! same latencies and faults, and the same [trace hash](Report::trace_hash). A 30 s timeout
//! takes microseconds.
//!
//! The network model, per directed channel (one direction of one connection of a
//! [`Wiring`]):
//!
//! - **stream semantics**: the sender's bytes are cut into fragments of random sizes and
//!   delivered in order; a receive completes with exactly the bytes it asked for;
//! - **flow control**: at most [`Sim::window`] bytes are in flight or unread per direction, as a
//!   socket buffer, so a rank that sends without receiving blocks as it would on TCP;
//! - **latency, jitter and bandwidth** per fragment; channels are independent, so bytes of
//!   different channels arrive in an order the seed chooses;
//! - **faults** ([`Fault`]): a rank crashes (its connections close), stalls for a while (it is
//!   not scheduled; its peers see silence), or a link is cut (both directions close).
//!
//! [`Sim::run`] runs a closure per rank, hands each its [`SimFabric`], and returns every rank's
//! [`Outcome`] with the trace hash and, on request, every byte each channel carried (to compare
//! the wire against an independent model of MLX's protocol). When a property fails, print
//! [`Report::replay`]: the seed replays the same run.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

pub mod campaign;

use nuvec_core::distributed::Group;
use nuvec_distributed::RingCommunicator;
use nuvec_distributed::fabric::{
    Channel, ChannelKind, Direction, Fabric, FabricError, FailureKind, Transfer, Wiring, most_stuck,
};
use nuvec_distributed::jaccl::{FrameRule, JacclCommunicator};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The environment variable that overrides the seed of every [`Sim`] (to replay a failure).
pub const SEED_VAR: &str = "NUVEC_SIM_SEED";

/// A fault injected into a simulated run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `rank` crashes when it makes its `call`-th fabric call (counting from 0): that call
    /// and every later one fail, and all its connections close.
    Crash {
        /// The rank that crashes.
        rank: usize,
        /// The index of the fabric call at which it crashes.
        call: u64,
    },
    /// `rank` crashes at virtual time `at`.
    CrashAt {
        /// The rank that crashes.
        rank: usize,
        /// When.
        at: Duration,
    },
    /// `rank` is not scheduled from `at` for `duration` (its connections stay open).
    Stall {
        /// The rank that stalls.
        rank: usize,
        /// When it stops.
        at: Duration,
        /// For how long.
        duration: Duration,
    },
    /// Message channels: the `message`-th message (counting from 0) that `rank` sends on
    /// `channel` is lost without a trace, as UC loses a packet.
    Lose {
        /// The sender.
        rank: usize,
        /// The sender's channel.
        channel: Channel,
        /// Which of its messages.
        message: u64,
    },
    /// Message channels: the send of the `message`-th message `rank` sends on `channel`
    /// completes with an error status (and the message is not delivered).
    ErrorStatus {
        /// The sender.
        rank: usize,
        /// The sender's channel.
        channel: Channel,
        /// Which of its messages.
        message: u64,
    },
    /// The connection at `rank`'s channel `channel` is cut at `at`: both directions close
    /// and bytes in flight are lost (message channels: silently, as a cable pulled under UC).
    Cut {
        /// One end of the connection.
        rank: usize,
        /// That end's channel.
        channel: Channel,
        /// When.
        at: Duration,
    },
}

/// A simulated job: its size, wiring, network model, faults and seed.
#[derive(Clone, Debug)]
pub struct Sim {
    wiring: Wiring,
    seed: u64,
    latency: Duration,
    jitter: Duration,
    bytes_per_sec: u64,
    max_fragment: usize,
    window: usize,
    faults: Vec<Fault>,
    record_wire: bool,
    /// Connections per neighbour, for a ring made by [`Sim::ring`].
    ring_links: Option<usize>,
    /// Message channels with RDMA UC semantics instead of streams.
    uc: Option<Uc>,
}

/// What becomes of a message that arrives when its queue pair has no receive posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unexpected {
    /// It is dropped, as InfiniBand's UC specifies.
    Drop,
    /// It waits until a receive is posted, as Apple's Thunderbolt provider appears to do
    /// (MLX's JACCL relies on it).
    Hold,
}

/// The model of RDMA Unreliable Connected queue pairs for [`Sim::uc`]: every send is one
/// message; every receive takes exactly one. The fabric keeps `posted` receives posted per
/// queue pair, re-posting one as each is consumed; a message that finds none is dropped or
/// held ([`Unexpected`]), and a message may be lost on the way (`loss`, and
/// [`Fault::Lose`]). A sender's completion is local: it says nothing about delivery. Messages
/// carry their sequence number as RDMA immediate data would, so a receiver that finds one
/// missing fails at once instead of taking the next message for it. A peer that crashes or
/// finishes, or a cut link, closes nothing: the other side only hears silence.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Uc {
    /// Receives kept posted per queue pair (at least 1).
    pub posted: usize,
    /// What happens to a message that finds no receive posted.
    pub unexpected: Unexpected,
    /// The probability that any message is lost.
    pub loss: f64,
}

impl Default for Uc {
    /// Two receives posted (MLX's depth), messages held as on Apple's provider, no loss.
    fn default() -> Self {
        Self {
            posted: 2,
            unexpected: Unexpected::Hold,
            loss: 0.0,
        }
    }
}

impl Sim {
    /// A job of `ranks` ranks in MLX's ring with one connection per neighbour, seed 0 (or
    /// [`SEED_VAR`]), 5 µs ± 5 µs latency, 10 GB/s, fragments up to 64 KiB, 256 KiB windows.
    pub fn ring(ranks: usize, links: usize) -> Self {
        let mut sim = Self::new(Wiring::ring(ranks, links));
        sim.ring_links = Some(links);
        sim
    }

    /// A job over any wiring.
    pub fn new(wiring: Wiring) -> Self {
        Self {
            wiring,
            seed: 0,
            latency: Duration::from_micros(5),
            jitter: Duration::from_micros(5),
            bytes_per_sec: 10_000_000_000,
            max_fragment: 64 * 1024,
            window: 256 * 1024,
            faults: Vec::new(),
            record_wire: false,
            ring_links: None,
            uc: None,
        }
    }

    /// A JACCL mesh of `ranks` ranks: one UC queue pair between every pair, [`Uc::default`].
    pub fn mesh(ranks: usize) -> Self {
        Self::new(Wiring::mesh(ranks, 1)).uc(Uc::default())
    }

    /// A JACCL ring of `ranks` ranks with `wires` UC queue pairs to each neighbour, numbered as
    /// [`Sim::ring`]'s connections, [`Uc::default`].
    pub fn jaccl_ring(ranks: usize, wires: usize) -> Self {
        Self::ring(ranks, wires).uc(Uc::default())
    }

    /// Makes every channel a message channel with RDMA UC semantics ([`Uc`]).
    pub fn uc(mut self, uc: Uc) -> Self {
        self.uc = Some(Uc {
            posted: uc.posted.max(1),
            ..uc
        });
        self
    }

    /// The seed that fixes every choice (overridden by [`SEED_VAR`] when it is set).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The seed in effect: [`SEED_VAR`] if set and valid, else the configured one.
    pub fn effective_seed(&self) -> u64 {
        std::env::var(SEED_VAR)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(self.seed)
    }

    /// Base one-way latency and uniform jitter added to it per fragment.
    pub fn latency(mut self, latency: Duration, jitter: Duration) -> Self {
        self.latency = latency;
        self.jitter = jitter;
        self
    }

    /// Bandwidth of each direction of each connection, in bytes per second.
    pub fn bandwidth(mut self, bytes_per_sec: u64) -> Self {
        self.bytes_per_sec = bytes_per_sec.max(1);
        self
    }

    /// The largest fragment (sizes are drawn uniformly from `1..=max`).
    pub fn max_fragment(mut self, max: usize) -> Self {
        self.max_fragment = max.max(1);
        self
    }

    /// Bytes in flight or unread allowed per direction (the socket buffer; at least 16, so
    /// that a whole element of any dtype fits).
    pub fn window(mut self, bytes: usize) -> Self {
        self.window = bytes.max(16);
        self
    }

    /// Adds a fault.
    pub fn fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// Records every byte each channel direction carried into [`Report::wire`] (and, on
    /// message channels, every message's length into [`Report::messages`]).
    pub fn record_wire(mut self, on: bool) -> Self {
        self.record_wire = on;
        self
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.wiring.size()
    }

    /// Runs `body` on every rank with its `nuvec_core` group: MLX's ring over this simulated
    /// fabric, every operation bounded by `timeout` of virtual time. This is how to test your
    /// own distributed nuvec code in one process, deterministically:
    ///
    /// ```
    /// use std::time::Duration;
    /// use nuvec_core::{array, distributed};
    /// use nuvec_fabric_sim::Sim;
    ///
    /// let report = Sim::ring(3, 1).seed(42).run_ring(Duration::from_secs(30), |group| {
    ///     let x = array![1.0, 2.0];
    ///     distributed::all_sum(&x, Some(&group)).to_vec::<f32>()
    /// });
    /// for outcome in report.outcomes {
    ///     assert_eq!(outcome.returned().unwrap().unwrap(), [3.0, 6.0]);
    /// }
    /// ```
    ///
    /// # Panics
    /// If the simulation was not made by [`Sim::ring`].
    pub fn run_ring<T, F>(&self, timeout: Duration, body: F) -> Report<T>
    where
        T: Send,
        F: Fn(Group) -> T + Sync,
    {
        let links = self
            .ring_links
            .expect("run_ring needs a simulation made by Sim::ring");
        self.run(|fabric| {
            let comm = RingCommunicator::new(fabric, links, timeout);
            body(Group::new(Arc::new(comm)))
        })
    }

    /// Runs `body` on every rank with its `nuvec_core` group over JACCL: the mesh for a
    /// simulation made by [`Sim::mesh`], the ring for one made by [`Sim::jaccl_ring`], every
    /// rank with the frame rule `rule` and every operation bounded by `timeout` of virtual time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use nuvec_core::{array, distributed};
    /// use nuvec_distributed::jaccl::FrameRule;
    /// use nuvec_fabric_sim::Sim;
    ///
    /// let report = Sim::mesh(4).seed(7).run_jaccl(Duration::from_secs(30), FrameRule::Small, |group| {
    ///     let x = array![1.0, 2.0];
    ///     distributed::all_sum(&x, Some(&group)).to_vec::<f32>()
    /// });
    /// for outcome in report.outcomes {
    ///     assert_eq!(outcome.returned().unwrap().unwrap(), [4.0, 8.0]);
    /// }
    /// ```
    pub fn run_jaccl<T, F>(&self, timeout: Duration, rule: FrameRule, body: F) -> Report<T>
    where
        T: Send,
        F: Fn(Group) -> T + Sync,
    {
        let ring = self.ring_links;
        self.run(|fabric| {
            let comm = match ring {
                Some(wires) => JacclCommunicator::ring(fabric, wires, rule, timeout),
                None => JacclCommunicator::mesh(fabric, rule, timeout),
            };
            body(Group::new(Arc::new(comm)))
        })
    }

    /// Runs `body` on every rank at once, each with its fabric, and reports every outcome.
    pub fn run<T, F>(&self, body: F) -> Report<T>
    where
        T: Send,
        F: Fn(SimFabric) -> T + Sync,
    {
        let seed = self.effective_seed();
        let size = self.size();
        let shared = Arc::new(Shared {
            world: Mutex::new(World::new(self, seed)),
            turns: (0..size).map(|_| Condvar::new()).collect(),
            holder: AtomicUsize::new(NOBODY),
        });
        let outcomes: Vec<Outcome<T>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..size)
                .map(|rank| {
                    let shared = Arc::clone(&shared);
                    let body = &body;
                    scope.spawn(move || {
                        shared.wait_turn(rank);
                        let fabric = SimFabric {
                            shared: Arc::clone(&shared),
                            kind: if self.uc.is_some() {
                                ChannelKind::Message
                            } else {
                                ChannelKind::Stream
                            },
                            rank,
                            size,
                            links: (0..size)
                                .map(|p| shared.lock().wiring.links(rank, p))
                                .collect(),
                        };
                        let result = catch_unwind(AssertUnwindSafe(|| body(fabric)));
                        let crashed = shared.finish(rank);
                        match result {
                            Ok(_) if crashed => Outcome::Crashed,
                            Ok(value) => Outcome::Returned(value),
                            Err(panic) => Outcome::Panicked(panic_text(&panic)),
                        }
                    })
                })
                .collect();
            shared.start();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|p| Outcome::Panicked(panic_text(&p)))
                })
                .collect()
        });
        let world = shared.lock();
        Report {
            outcomes,
            seed,
            trace_hash: world.trace,
            end: world.now,
            wire: world
                .channels
                .iter()
                .filter(|(_, w)| !w.record.is_empty())
                .map(|(&key, w)| (key, w.record.clone()))
                .collect(),
            messages: world
                .channels
                .iter()
                .filter(|(_, w)| !w.sizes.is_empty())
                .map(|(&key, w)| (key, w.sizes.clone()))
                .collect(),
            payload: world.payload,
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "a panic".into())
}

/// How one rank's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The closure returned this.
    Returned(T),
    /// The rank crashed (an injected fault); what its closure returned is dropped.
    Crashed,
    /// The closure panicked with this message.
    Panicked(String),
}

impl<T> Outcome<T> {
    /// The returned value, if any.
    pub fn returned(self) -> Option<T> {
        match self {
            Outcome::Returned(v) => Some(v),
            _ => None,
        }
    }
}

/// What a simulated run produced.
#[derive(Debug)]
pub struct Report<T> {
    /// Every rank's outcome, in rank order.
    pub outcomes: Vec<Outcome<T>>,
    /// The seed that was used.
    pub seed: u64,
    /// A hash of every scheduling decision and transfer: equal seeds give equal hashes.
    pub trace_hash: u64,
    /// Virtual time at the end.
    pub end: Duration,
    /// With [`Sim::record_wire`]: every byte sent, per `(sender, sender's channel)`.
    pub wire: BTreeMap<(usize, Channel), Vec<u8>>,
    /// Message channels: the length of every message sent, per `(sender, sender's channel)`
    /// (lost ones included).
    pub messages: BTreeMap<(usize, Channel), Vec<usize>>,
    /// Bytes of payload the ranks put on the wire (stream fragments and messages, lost ones
    /// included): divided by the wall-clock time of the run, the simulator's own speed.
    pub payload: u64,
}

impl<T> Report<T> {
    /// The command-line fragment that replays this run: set the seed variable.
    pub fn replay(&self) -> String {
        format!("{SEED_VAR}={}", self.seed)
    }
}

/// One rank's fabric in a simulated job.
pub struct SimFabric {
    shared: Arc<Shared>,
    kind: ChannelKind,
    rank: usize,
    size: usize,
    links: Vec<usize>,
}

impl SimFabric {
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
        self.shared.run(self.rank, step, deadline)
    }

    fn last_heard(&self, peer: usize) -> Option<Duration> {
        self.shared.lock().heard[self.rank]
            .get(peer)
            .copied()
            .flatten()
    }
}

struct Shared {
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

    fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks the calling rank thread until the scheduler gives it the turn.
    fn wait_turn(&self, rank: usize) {
        drop(self.await_turn(self.lock(), rank));
    }

    /// Gives the first turn.
    fn start(&self) {
        let mut world = self.lock();
        world.schedule();
        self.pass(&world);
    }

    /// Marks `rank` finished and passes the turn on; says whether it had crashed.
    fn finish(&self, rank: usize) -> bool {
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
    fn yield_turn<'a>(
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

    fn run(
        &self,
        rank: usize,
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
        let mut progress: Vec<Progress> = Vec::with_capacity(step.len());
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
            progress.push(Progress { done: 0, mark: 0 });
        }
        if world.uc.is_some() {
            return self.run_messages(world, rank, step, deadline, started);
        }
        // Queue the sends: the simulator copies them into the channel's outbox.
        for (t, p) in step.iter().zip(progress.iter_mut()) {
            if let Transfer::Send { channel, data } = t {
                let chan = world.channel_mut(rank, *channel);
                chan.outbox.extend(data.iter().copied());
                chan.queued += data.len() as u64;
                p.mark = chan.queued;
                let h = fnv(data);
                world.hash(&[
                    1,
                    rank as u64,
                    channel.peer as u64,
                    channel.link as u64,
                    data.len() as u64,
                    h,
                ]);
            }
        }
        world.pump_all();
        loop {
            if world.ranks[rank].state == RankState::Crashed {
                return Err(crash_error(rank, step));
            }
            // Take what has arrived for the receives, in order per channel.
            let mut blocked_recv: Vec<Channel> = Vec::new();
            let mut all_done = true;
            for (t, p) in step.iter_mut().zip(progress.iter_mut()) {
                match t {
                    Transfer::Send { channel, data } => {
                        let chan = world.channel(rank, *channel);
                        if chan.sent < p.mark {
                            all_done = false;
                            if chan.closed {
                                let done = data.len() - (p.mark - chan.sent) as usize;
                                return Err(fail(t, done, FailureKind::Closed));
                            }
                        }
                        p.done = data.len()
                            - (p.mark.saturating_sub(chan.sent) as usize).min(data.len());
                    }
                    Transfer::Recv { channel, landing } => {
                        if blocked_recv.contains(channel) {
                            all_done &= p.done == landing.len();
                            continue;
                        }
                        let grain = landing.grain();
                        let want = landing.len() - p.done;
                        let incoming = world.incoming_mut(rank, *channel);
                        let avail = incoming.arrived.len();
                        let take = if avail >= want {
                            want
                        } else {
                            avail - avail % grain
                        };
                        if take > 0 {
                            landing.deliver(p.done, &incoming.arrived.make_contiguous()[..take]);
                            incoming.arrived.drain(..take);
                            p.done += take;
                            world.heard[rank][channel.peer] = Some(world.now);
                            let (peer, link) = world
                                .wiring
                                .far_end(rank, *channel)
                                .expect("validated channel");
                            world.hash(&[2, rank as u64, channel.peer as u64, take as u64]);
                            world.pump((peer, Channel::new(rank, link)));
                        }
                        if p.done < landing.len() {
                            all_done = false;
                            blocked_recv.push(*channel);
                            let incoming = world.incoming_mut(rank, *channel);
                            if incoming.closed && incoming.in_flight.is_empty() {
                                let done = p.done;
                                return Err(fail(t, done, FailureKind::Closed));
                            }
                        }
                    }
                }
            }
            if all_done {
                let now = world.now.as_nanos() as u64;
                world.hash(&[3, rank as u64, now]);
                world.ranks[rank].state = RankState::Ready;
                let _world = self.yield_turn(world, rank);
                return Ok(());
            }
            if world.now >= deadline {
                let waited = world.now.saturating_sub(started);
                let i = most_stuck(step, |i| progress[i].done).unwrap_or(0);
                let p = progress[i].done;
                world.hash(&[4, rank as u64]);
                return Err(fail(&step[i], p, FailureKind::TimedOut { waited }));
            }
            world.ranks[rank].state = RankState::Waiting { deadline };
            world = self.yield_turn(world, rank);
        }
    }
}

impl Shared {
    /// [`Shared::run`] over message channels (UC semantics; see [`Uc`]).
    fn run_messages<'a>(
        &'a self,
        mut world: MutexGuard<'a, World>,
        rank: usize,
        step: &mut [Transfer<'_>],
        deadline: Duration,
        started: Duration,
    ) -> Result<(), FabricError> {
        // A rank that crashed at this call sends nothing.
        let crashed = world.ranks[rank].state == RankState::Crashed;
        // Post every send at once; each completes when its message has left.
        let mut departures: Vec<Option<Duration>> = Vec::with_capacity(step.len());
        for t in step.iter() {
            if crashed {
                break;
            }
            if let Transfer::Send { channel, data } = t {
                match world.send_message(rank, *channel, data) {
                    Ok(departure) => departures.push(Some(departure)),
                    Err(kind) => return Err(fail(t, 0, kind)),
                }
            } else {
                departures.push(None);
            }
        }
        // A step can hold thousands of messages (one per frame), and the rank looks at it
        // again after every turn, so each look must not walk the whole step: the receives are
        // queued per channel, and the sends sorted by when their message leaves.
        let mut done = vec![false; step.len()];
        let mut remaining = step.len();
        let mut queues: Vec<(Channel, VecDeque<usize>)> = Vec::new();
        for (i, t) in step.iter().enumerate() {
            if let Transfer::Recv { channel, .. } = t {
                match queues.iter_mut().find(|(c, _)| c == channel) {
                    Some((_, queue)) => queue.push_back(i),
                    None => queues.push((*channel, VecDeque::from([i]))),
                }
            }
        }
        let mut sends: Vec<(Duration, usize)> = departures
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.map(|d| (d, i)))
            .collect();
        sends.sort_unstable();
        let mut departed = 0;
        let mut heads: BinaryHeap<Reverse<(usize, usize)>> = BinaryHeap::new();
        loop {
            if world.ranks[rank].state == RankState::Crashed {
                return Err(crash_error(rank, step));
            }
            while departed < sends.len() && sends[departed].0 <= world.now {
                done[sends[departed].1] = true;
                remaining -= 1;
                departed += 1;
            }
            // Deliver in the order of the step, as a walk over it would: a channel's next
            // receive is looked at once its earlier ones are done, and a channel with nothing
            // in its inbox waits for the next look.
            heads.clear();
            heads.extend(
                queues
                    .iter()
                    .enumerate()
                    .filter_map(|(q, (_, queue))| queue.front().map(|&i| Reverse((i, q)))),
            );
            while let Some(Reverse((i, q))) = heads.pop() {
                let channel = queues[q].0;
                let incoming = world.incoming_mut(rank, channel);
                let Some((seq, bytes)) = incoming.inbox.pop_front() else {
                    continue;
                };
                let expected = incoming.expect;
                incoming.expect = seq + 1;
                let t = &mut step[i];
                let Transfer::Recv { landing, .. } = t else {
                    unreachable!("only receives are queued");
                };
                let want = landing.len();
                if seq != expected {
                    let kind = FailureKind::Lost { expected, got: seq };
                    return Err(fail(t, 0, kind));
                }
                if bytes.len() != want {
                    let kind = FailureKind::MessageSize {
                        want,
                        got: bytes.len(),
                    };
                    return Err(fail(t, 0, kind));
                }
                landing.deliver(0, &bytes);
                done[i] = true;
                remaining -= 1;
                world.heard[rank][channel.peer] = Some(world.now);
                world.hash(&[2, rank as u64, channel.peer as u64, seq]);
                queues[q].1.pop_front();
                if let Some(&next) = queues[q].1.front() {
                    heads.push(Reverse((next, q)));
                }
            }
            if remaining == 0 {
                let now = world.now.as_nanos() as u64;
                world.hash(&[3, rank as u64, now]);
                world.ranks[rank].state = RankState::Ready;
                let _world = self.yield_turn(world, rank);
                return Ok(());
            }
            if world.now >= deadline {
                let waited = world.now.saturating_sub(started);
                let i =
                    most_stuck(step, |i| if done[i] { step_len(&step[i]) } else { 0 }).unwrap_or(0);
                world.hash(&[4, rank as u64]);
                return Err(fail(&step[i], 0, FailureKind::TimedOut { waited }));
            }
            world.ranks[rank].state = RankState::Waiting { deadline };
            world = self.yield_turn(world, rank);
        }
    }
}

/// The length of a transfer (for progress by fraction).
fn step_len(t: &Transfer<'_>) -> usize {
    t.len()
}

/// The error of a step whose rank has crashed: it names the step's first transfer (or, for an
/// empty step, the rank itself).
fn crash_error(rank: usize, step: &[Transfer<'_>]) -> FabricError {
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

fn fail(t: &Transfer<'_>, done: usize, kind: FailureKind) -> FabricError {
    FabricError {
        channel: t.channel(),
        direction: t.direction(),
        done,
        total: t.len(),
        kind,
    }
}

struct Progress {
    done: usize,
    /// For sends: the channel's `queued` count once this send's last byte is queued.
    mark: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RankState {
    /// Not started yet, or returned from a fabric call: may run.
    Ready,
    /// Blocked in a fabric call until something arrives or the deadline.
    Waiting { deadline: Duration },
    /// Its closure returned.
    Done,
    /// Crashed by a fault.
    Crashed,
}

struct Rank {
    state: RankState,
    calls: u64,
    stalled_until: Duration,
    /// Something happened that a waiting rank should look at.
    dirty: bool,
    /// Its closure has returned (its thread waits for nothing any more).
    finished: bool,
}

/// One direction of one connection: bytes from `from` on its link toward the far end.
struct Wire {
    to: (usize, usize),
    /// Bytes queued by the sender, not yet on the wire.
    outbox: VecDeque<u8>,
    /// Total bytes ever queued and ever put on the wire.
    queued: u64,
    sent: u64,
    /// Fragments on the wire: (arrival time, bytes), in order.
    in_flight: VecDeque<(Duration, Vec<u8>)>,
    in_flight_bytes: usize,
    /// Arrived at the receiver, not yet read.
    arrived: VecDeque<u8>,
    /// When the wire is free to start the next fragment.
    busy_until: Duration,
    last_arrival: Duration,
    closed: bool,
    record: Vec<u8>,
    /// Message channels: messages on the wire, `(arrival, sequence number, bytes)`.
    messages: VecDeque<(Duration, u64, Vec<u8>)>,
    /// Message channels: messages in posted receives (or held), not yet taken.
    inbox: VecDeque<(u64, Vec<u8>)>,
    /// Message channels: messages sent so far (the next sequence number).
    next_seq: u64,
    /// Message channels: the sequence number the receiver expects next.
    expect: u64,
    /// Message channels: a cut link, which drops everything silently.
    cut: bool,
    /// Message channels: the length of every message sent.
    sizes: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A fragment sent by `rank` on its channel `(peer, link)` reaches the far end.
    Arrive {
        rank: usize,
        peer: usize,
        link: usize,
    },
    Crash {
        rank: usize,
    },
    StallEnd {
        rank: usize,
    },
    /// A message of `rank`'s has left: its send is complete.
    Wake {
        rank: usize,
    },
    Stall {
        rank: usize,
        until_nanos: u64,
    },
    Cut {
        rank: usize,
        peer: usize,
        link: usize,
    },
}

struct World {
    wiring: Wiring,
    rng: ChaCha8Rng,
    now: Duration,
    ranks: Vec<Rank>,
    /// Every direction of every connection, keyed by its sender and the sender's channel.
    channels: BTreeMap<(usize, Channel), Wire>,
    events: BinaryHeap<Reverse<(Duration, u64, Event)>>,
    event_seq: u64,
    crash_calls: Vec<(usize, u64)>,
    turn: Option<usize>,
    trace: u64,
    latency: Duration,
    jitter: Duration,
    bytes_per_sec: u64,
    max_fragment: usize,
    window: usize,
    record_wire: bool,
    uc: Option<Uc>,
    /// Messages to lose: `(sender, channel, sequence number)`.
    lose: Vec<(usize, Channel, u64)>,
    /// Sends that complete with an error status: `(sender, channel, sequence number)`.
    error_status: Vec<(usize, Channel, u64)>,
    /// `heard[rank][peer]`: when `rank` last took bytes from `peer`.
    heard: Vec<Vec<Option<Duration>>>,
    /// Bytes put on the wire so far ([`Report::payload`]).
    payload: u64,
}

fn fnv(bytes: &[u8]) -> u64 {
    // FNV-1a's step over little-endian 8-byte words, then the tail bytes: a trace hash needs
    // determinism and spread, not FNV's exact values, and words are 8 times fewer steps.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        h ^= u64::from_le_bytes(word.try_into().expect("8 bytes"));
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    for &b in words.remainder() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl World {
    fn new(sim: &Sim, seed: u64) -> Self {
        let size = sim.wiring.size();
        let mut channels = BTreeMap::new();
        // Every connection gives two wires, one per direction.
        for c in sim.wiring.connections() {
            for (from, from_link, to, to_link) in [
                (c.opener, c.opener_link, c.acceptor, c.acceptor_link),
                (c.acceptor, c.acceptor_link, c.opener, c.opener_link),
            ] {
                channels.insert(
                    (from, Channel::new(to, from_link)),
                    Wire {
                        to: (to, to_link),
                        outbox: VecDeque::new(),
                        queued: 0,
                        sent: 0,
                        in_flight: VecDeque::new(),
                        in_flight_bytes: 0,
                        arrived: VecDeque::new(),
                        busy_until: Duration::ZERO,
                        last_arrival: Duration::ZERO,
                        closed: false,
                        record: Vec::new(),
                        messages: VecDeque::new(),
                        inbox: VecDeque::new(),
                        next_seq: 0,
                        expect: 0,
                        cut: false,
                        sizes: Vec::new(),
                    },
                );
            }
        }
        let mut world = Self {
            wiring: sim.wiring.clone(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: Duration::ZERO,
            ranks: (0..size)
                .map(|_| Rank {
                    state: RankState::Ready,
                    calls: 0,
                    stalled_until: Duration::ZERO,
                    dirty: false,
                    finished: false,
                })
                .collect(),
            channels,
            events: BinaryHeap::new(),
            event_seq: 0,
            crash_calls: Vec::new(),
            turn: None,
            trace: 0xcbf2_9ce4_8422_2325 ^ seed,
            latency: sim.latency,
            jitter: sim.jitter,
            bytes_per_sec: sim.bytes_per_sec,
            max_fragment: sim.max_fragment,
            window: sim.window,
            record_wire: sim.record_wire,
            uc: sim.uc,
            lose: Vec::new(),
            error_status: Vec::new(),
            heard: vec![vec![None; size]; size],
            payload: 0,
        };
        for f in &sim.faults {
            match *f {
                Fault::Crash { rank, call } => world.crash_calls.push((rank, call)),
                Fault::CrashAt { rank, at } => world.at(at, Event::Crash { rank }),
                Fault::Stall { rank, at, duration } => world.at(
                    at,
                    Event::Stall {
                        rank,
                        until_nanos: (at + duration).as_nanos() as u64,
                    },
                ),
                Fault::Lose {
                    rank,
                    channel,
                    message,
                } => world.lose.push((rank, channel, message)),
                Fault::ErrorStatus {
                    rank,
                    channel,
                    message,
                } => world.error_status.push((rank, channel, message)),
                Fault::Cut { rank, channel, at } => world.at(
                    at,
                    Event::Cut {
                        rank,
                        peer: channel.peer,
                        link: channel.link,
                    },
                ),
            }
        }
        world
    }

    fn size(&self) -> usize {
        self.ranks.len()
    }

    fn hash(&mut self, words: &[u64]) {
        for &w in words {
            self.trace ^= w;
            self.trace = self
                .trace
                .wrapping_mul(0x0000_0100_0000_01b3)
                .rotate_left(17);
        }
    }

    fn at(&mut self, when: Duration, event: Event) {
        self.event_seq += 1;
        self.events.push(Reverse((when, self.event_seq, event)));
    }

    fn channel(&self, rank: usize, channel: Channel) -> &Wire {
        &self.channels[&(rank, channel)]
    }

    fn channel_mut(&mut self, rank: usize, channel: Channel) -> &mut Wire {
        self.channels
            .get_mut(&(rank, channel))
            .expect("validated channel")
    }

    /// The wire that carries bytes *to* `rank` on its `channel`.
    fn incoming_mut(&mut self, rank: usize, channel: Channel) -> &mut Wire {
        let (peer, link) = self
            .wiring
            .far_end(rank, channel)
            .expect("validated channel");
        self.channel_mut(peer, Channel::new(rank, link))
    }

    fn pump_all(&mut self) {
        let keys: Vec<(usize, Channel)> = self.channels.keys().copied().collect();
        for key in keys {
            self.pump(key);
        }
    }

    /// Puts as many queued bytes on the wire `key` as its window allows.
    fn pump(&mut self, key: (usize, Channel)) {
        loop {
            let (latency, jitter, bps, max_frag, window, now) = (
                self.latency,
                self.jitter,
                self.bytes_per_sec,
                self.max_fragment,
                self.window,
                self.now,
            );
            let wire = &self.channels[&key];
            if wire.closed || wire.outbox.is_empty() {
                return;
            }
            let used = wire.in_flight_bytes + wire.arrived.len();
            if used >= window {
                return;
            }
            let room = (window - used).min(wire.outbox.len());
            let size = self.rng.random_range(1..=max_frag.min(room).max(1));
            let jitter_ns = if jitter.is_zero() {
                0
            } else {
                self.rng.random_range(0..=jitter.as_nanos() as u64)
            };
            let wire = self.channels.get_mut(&key).expect("wire exists");
            let bytes = wire.outbox.make_contiguous()[..size].to_vec();
            wire.outbox.drain(..size);
            let emptied = wire.outbox.is_empty();
            let start = wire.busy_until.max(now);
            let on_wire = Duration::from_nanos((size as u128 * 1_000_000_000 / bps as u128) as u64);
            wire.busy_until = start + on_wire;
            let arrival = (wire.busy_until + latency + Duration::from_nanos(jitter_ns))
                .max(wire.last_arrival);
            wire.last_arrival = arrival;
            wire.sent += size as u64;
            wire.in_flight_bytes += size;
            self.payload += size as u64;
            if self.record_wire {
                wire.record.extend_from_slice(&bytes);
            }
            wire.in_flight.push_back((arrival, bytes));
            // The sender's sends complete when the last queued byte is on the wire; a look at
            // every fragment before that would find nothing to do.
            if emptied {
                self.ranks[key.0].dirty = true;
            }
            self.at(
                arrival,
                Event::Arrive {
                    rank: key.0,
                    peer: key.1.peer,
                    link: key.1.link,
                },
            );
        }
    }

    /// Closes every wire to and from `rank`.
    fn close_rank(&mut self, rank: usize) {
        if self.uc.is_some() {
            // Queue pairs close nothing on the far side: it only hears silence.
            return;
        }
        let keys: Vec<(usize, Channel)> = self
            .channels
            .iter()
            .filter(|(k, w)| k.0 == rank || w.to.0 == rank)
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            let wire = self.channels.get_mut(&k).expect("wire exists");
            wire.closed = true;
            let (a, b) = (k.0, wire.to.0);
            self.ranks[a].dirty = true;
            self.ranks[b].dirty = true;
        }
    }

    fn crash(&mut self, rank: usize) {
        if matches!(self.ranks[rank].state, RankState::Done | RankState::Crashed) {
            return;
        }
        self.ranks[rank].state = RankState::Crashed;
        self.hash(&[5, rank as u64]);
        // Bytes already on the wire still arrive; nothing more leaves; then the peers see the
        // connection close.
        let keys: Vec<(usize, Channel)> = self
            .channels
            .keys()
            .filter(|k| k.0 == rank)
            .copied()
            .collect();
        for k in keys {
            self.channels.get_mut(&k).expect("wire").outbox.clear();
        }
        self.close_rank(rank);
    }

    /// Queues one message from `rank` on `channel` (message channels): assigns its sequence
    /// number, decides whether it is lost, and puts it on the wire. Returns when its send
    /// completes (it has left), or the error status of its completion.
    fn send_message(
        &mut self,
        rank: usize,
        channel: Channel,
        data: &[u8],
    ) -> Result<Duration, FailureKind> {
        let (latency, jitter, bps, now, record) = (
            self.latency,
            self.jitter,
            self.bytes_per_sec,
            self.now,
            self.record_wire,
        );
        let loss = self.uc.map_or(0.0, |uc| uc.loss);
        let wire = self.channel_mut(rank, channel);
        let seq = wire.next_seq;
        wire.next_seq += 1;
        if record {
            wire.sizes.push(data.len());
            wire.record.extend_from_slice(data);
        }
        if self.error_status.contains(&(rank, channel, seq)) {
            self.hash(&[10, rank as u64, seq]);
            return Err(FailureKind::Completion(format!(
                "error status on message {seq} (simulated)"
            )));
        }
        let lost = self.lose.contains(&(rank, channel, seq))
            || (loss > 0.0 && self.rng.random_bool(loss.min(1.0)));
        let jitter_ns = if jitter.is_zero() {
            0
        } else {
            self.rng.random_range(0..=jitter.as_nanos() as u64)
        };
        self.payload += data.len() as u64;
        let wire = self.channel_mut(rank, channel);
        let start = wire.busy_until.max(now);
        let on_wire =
            Duration::from_nanos((data.len() as u128 * 1_000_000_000 / bps as u128) as u64);
        wire.busy_until = start + on_wire;
        let departure = wire.busy_until;
        let arrival =
            (departure + latency + Duration::from_nanos(jitter_ns)).max(wire.last_arrival);
        if !lost && !wire.cut {
            wire.last_arrival = arrival;
            wire.messages.push_back((arrival, seq, data.to_vec()));
            self.at(
                arrival,
                Event::Arrive {
                    rank,
                    peer: channel.peer,
                    link: channel.link,
                },
            );
        }
        self.hash(&[11, rank as u64, seq, u64::from(lost), fnv(data)]);
        self.at(departure, Event::Wake { rank });
        Ok(departure)
    }

    /// The next message on `rank`'s `channel` reaches the far end: it takes a posted receive,
    /// or is held, or is dropped.
    fn arrive_message(&mut self, rank: usize, channel: Channel) {
        let Some(uc) = self.uc else { return };
        let wire = self.channel_mut(rank, channel);
        let Some((_, seq, bytes)) = wire.messages.pop_front() else {
            return;
        };
        let to = wire.to.0;
        let gone = matches!(self.ranks[to].state, RankState::Done | RankState::Crashed);
        let wire = self.channel_mut(rank, channel);
        let full = wire.inbox.len() >= uc.posted && uc.unexpected == Unexpected::Drop;
        let dropped = gone || wire.cut || full;
        if !dropped {
            wire.inbox.push_back((seq, bytes));
            self.ranks[to].dirty = true;
        }
        self.hash(&[12, rank as u64, seq, u64::from(dropped)]);
    }

    fn apply(&mut self, event: Event) {
        match event {
            Event::Arrive { rank, peer, link } if self.uc.is_some() => {
                self.arrive_message(rank, Channel::new(peer, link));
            }
            Event::Arrive { rank, peer, link } => {
                let wire = self.channel_mut(rank, Channel::new(peer, link));
                if let Some((_, bytes)) = wire.in_flight.pop_front() {
                    wire.in_flight_bytes -= bytes.len();
                    wire.arrived.extend(bytes);
                    let to = wire.to.0;
                    self.ranks[to].dirty = true;
                }
            }
            Event::Crash { rank } => self.crash(rank),
            Event::Stall { rank, until_nanos } => {
                let until = Duration::from_nanos(until_nanos);
                self.ranks[rank].stalled_until = until;
                self.hash(&[6, rank as u64]);
                self.at(until, Event::StallEnd { rank });
            }
            Event::StallEnd { rank } | Event::Wake { rank } => self.ranks[rank].dirty = true,
            Event::Cut { rank, peer, link } => {
                let channel = Channel::new(peer, link);
                let Some((far, far_link)) = self.wiring.far_end(rank, channel) else {
                    return;
                };
                self.hash(&[7, rank as u64, peer as u64, link as u64]);
                let silent = self.uc.is_some();
                for key in [(rank, channel), (far, Channel::new(rank, far_link))] {
                    let wire = self.channel_mut(key.0, key.1);
                    wire.closed = !silent;
                    wire.cut = true;
                    wire.messages.clear();
                    wire.in_flight.clear();
                    wire.in_flight_bytes = 0;
                    wire.outbox.clear();
                }
                self.ranks[rank].dirty = true;
                self.ranks[far].dirty = true;
            }
        }
    }

    /// Chooses the rank that runs next, advancing virtual time when none can run.
    fn schedule(&mut self) {
        loop {
            let now = self.now;
            let runnable: Vec<usize> = (0..self.size())
                .filter(|&r| {
                    let rank = &self.ranks[r];
                    rank.stalled_until <= now
                        && match rank.state {
                            RankState::Ready => true,
                            RankState::Waiting { deadline } => rank.dirty || deadline <= now,
                            RankState::Done => false,
                            // A crashed rank's thread may still wait for a turn (in a fabric
                            // call, or before it started): it runs once more to learn of the
                            // crash, and then finishes.
                            RankState::Crashed => !rank.finished,
                        }
                })
                .collect();
            if !runnable.is_empty() {
                let pick = runnable[self.rng.random_range(0..runnable.len())];
                self.ranks[pick].dirty = false;
                self.turn = Some(pick);
                self.hash(&[8, pick as u64, now.as_nanos() as u64]);
                return;
            }
            // Nobody can run: advance to the next event or deadline.
            let next_event = self.events.peek().map(|Reverse((t, _, _))| *t);
            let next_deadline = self
                .ranks
                .iter()
                .filter_map(|r| match r.state {
                    RankState::Waiting { deadline } => Some(deadline.max(r.stalled_until)),
                    _ => None,
                })
                .min();
            let next = match (next_event, next_deadline) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => {
                    // Every rank is done or crashed.
                    self.turn = None;
                    return;
                }
            };
            self.now = self.now.max(next);
            while let Some(Reverse((t, _, _))) = self.events.peek() {
                if *t > self.now {
                    break;
                }
                let Some(Reverse((_, _, event))) = self.events.pop() else {
                    break;
                };
                self.apply(event);
            }
            self.pump_all();
        }
    }
}
