//! The `Fabric`: one rank's view of the network, the only thing the collective algorithms
//! talk to.
//!
//! The algorithms of this crate (MLX's ring all-reduce, all-gather and neighbour send/recv)
//! are written once, as plain blocking code over this trait, and run unchanged over three
//! implementations:
//!
//! - the deterministic simulator of the `nuvec-fabric-sim` crate (virtual time, injected
//!   latency, reordering, fragmentation and faults);
//! - real TCP sockets ([`crate::transport::tcp::TcpFabric`]);
//! - real RDMA queue pairs (the `jaccl` feature).
//!
//! Algorithms never spawn threads, sleep or read a clock: all concurrency and all time belong
//! to the fabric. That is what makes one algorithm testable deterministically in simulation and
//! fast on real wires.
//!
//! # The model
//!
//! A fabric connects this rank to its peers by **channels**, each addressed by a [`Channel`]:
//! a peer rank and the index of one *link* to it. Channels are FIFO in each direction and
//! independent of each other. An algorithm hands the fabric a **step**: a set of
//! [`Transfer`]s (sends and receives over buffers it borrows) that must all progress at the same
//! time, and waits until all have completed, one has failed, or a deadline from the fabric's
//! own clock ([`Fabric::now`]) passes. A step borrows the caller's buffers for its duration
//! only; nothing is copied that the wire does not need.
//!
//! A receive either lands its bytes in a buffer ([`Landing::Into`]), or hands them to the
//! algorithm while the rest is still in flight ([`Landing::Sink`]): that is how the ring
//! reduces each piece as it arrives, the way MLX's ring pipelines its packets.
//!
//! A receive into a buffer ([`Landing::Into`]) or reduced into one ([`Landing::Fold`]) can be
//! sent on by a [`Transfer::Forward`] of the same step while it is still arriving, on a fabric
//! that [forwards](Fabric::forwards): then a ring needs no step boundary between receiving a
//! segment and sending it on, and does not wait a link's latency for each segment's last byte
//! (the TCP fabric over TCP links and the simulator's streams forward; local links and RDMA
//! do not, and their algorithms keep a step per segment).
//!
//! There are two kinds of channel ([`ChannelKind`]):
//!
//! - **Stream.** A receive of `n` bytes completes with exactly `n` bytes, however the sender
//!   split them; the bytes of one step simply follow those of the previous one.
//! - **Message.** Every send is one message; every receive is one posted buffer that takes
//!   exactly one message. A message that arrives when no receive is posted is dropped (or held,
//!   as the fabric is configured); completions carry a status.
//!
//! # How real transports map onto it
//!
//! - **TCP** (stream channels): each channel is one TCP connection, the link index being the
//!   position of the address in MLX's hostfile entry. The fabric writes straight from the
//!   borrowed send buffers and reads straight into [`Landing::Into`] buffers; it keeps one
//!   bounded scratch buffer per channel for [`Landing::Sink`] receives. All transfers of a step
//!   move at once over non-blocking sockets, both directions of every socket together (full
//!   duplex), so a step never deadlocks on kernel buffer sizes. The deadline bounds the whole
//!   step, not each system call.
//! - **RDMA UC queue pairs** (message channels): each channel is one unreliable-connected queue
//!   pair; a send is one `IBV_WR_SEND` work request of the whole buffer, a receive one posted
//!   receive work request; completion of a transfer is its work completion, and a completion
//!   with an error status fails the transfer. Registered memory belongs to the fabric: it
//!   stages sends into its frames and delivers received frames to the landing.
//!
//! The link indices of a ring are fixed by [`Wiring`]: who opened which connection to whom.

use std::fmt;
use std::time::Duration;

mod watch;

pub use watch::{CHECK_EVERY, Gone, Liveness, Patience, QUIET, Stall, Stop, Watch, blame};

/// The address of a channel as one rank sees it: a peer and one link to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Channel {
    /// The rank at the other end.
    pub peer: usize,
    /// Which of the links to `peer` (see [`Wiring`] for how they are numbered).
    pub link: usize,
}

impl Channel {
    /// The channel to `peer` over its link `link`.
    pub const fn new(peer: usize, link: usize) -> Self {
        Self { peer, link }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} link {}", self.peer, self.link)
    }
}

/// What a channel guarantees about the boundaries of what is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelKind {
    /// A byte stream (TCP): boundaries are not kept, bytes arrive in order.
    Stream,
    /// Messages (RDMA UC): one send lands in one posted receive, or is lost.
    Message,
}

/// Where the bytes of a receive go.
pub enum Landing<'a> {
    /// Straight into this buffer, which sets the length of the receive.
    Into(&'a mut [u8]),
    /// Handed to `sink` as they arrive, in order, as `sink(offset, bytes)` where `offset` counts
    /// from the start of this receive. Every piece is a whole multiple of `grain` bytes (the
    /// element size, so a reduction never sees half an element); `len` must be a multiple of
    /// `grain`.
    Sink {
        /// The length of the receive in bytes.
        len: usize,
        /// The granule of every delivered piece (at least 1).
        grain: usize,
        /// Called on the caller's thread with each piece.
        sink: &'a mut dyn FnMut(usize, &[u8]),
    },
    /// Reduced into this buffer as the bytes arrive: the fabric hands `fold(mine, theirs)`
    /// each arriving piece `theirs` (whole `grain`s, as [`Landing::Sink`]) and the bytes of
    /// `buf` it lands on. Unlike a sink's, the buffer is the fabric's to see, so that a
    /// [`Transfer::Forward`] of the same step can send each piece once it is reduced.
    Fold {
        /// My bytes, which the arriving ones are reduced into; sets the length of the receive.
        buf: &'a mut [u8],
        /// The granule of every piece (at least 1); `buf.len()` must be a multiple of it.
        grain: usize,
        /// Reduces `theirs` into `mine` (of equal length).
        fold: &'a mut dyn FnMut(&mut [u8], &[u8]),
    },
    /// Into this buffer, as [`Landing::Into`], then judged by `check` the moment the last
    /// byte lands: a refusal fails the step at once with [`FailureKind::Mismatch`] and its
    /// text, whatever else the step waits for. The nuvec wire's headers land this way, so that
    /// a rank whose peer called another operation never waits for bytes that peer will not send.
    /// The TCP fabric and the simulator judge it; the RDMA fabric, which the nuvec wire never
    /// runs over, delivers it as [`Landing::Into`].
    Checked {
        /// Where the bytes go; sets the length of the receive.
        buf: &'a mut [u8],
        /// The judge of the whole buffer.
        check: &'a dyn Check,
    },
}

/// The judge of a [`Landing::Checked`] receive: `Err` with the reason refuses the bytes.
pub trait Check {
    /// Judges the received `bytes`.
    fn check(&self, bytes: &[u8]) -> Result<(), String>;
}

impl<F: Fn(&[u8]) -> Result<(), String>> Check for F {
    fn check(&self, bytes: &[u8]) -> Result<(), String> {
        self(bytes)
    }
}

impl Landing<'_> {
    /// The number of bytes this receive takes.
    pub fn len(&self) -> usize {
        match self {
            Landing::Into(buf) | Landing::Checked { buf, .. } | Landing::Fold { buf, .. } => {
                buf.len()
            }
            Landing::Sink { len, .. } => *len,
        }
    }

    /// Whether this receive takes no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The granule of delivered pieces.
    pub fn grain(&self) -> usize {
        match self {
            Landing::Into(_) | Landing::Checked { .. } => 1,
            Landing::Sink { grain, .. } | Landing::Fold { grain, .. } => (*grain).max(1),
        }
    }

    /// Hands `bytes`, which start `offset` bytes into this receive, to the landing.
    pub fn deliver(&mut self, offset: usize, bytes: &[u8]) {
        match self {
            Landing::Into(buf) | Landing::Checked { buf, .. } => {
                buf[offset..offset + bytes.len()].copy_from_slice(bytes)
            }
            Landing::Sink { sink, .. } => sink(offset, bytes),
            Landing::Fold { buf, fold, .. } => fold(&mut buf[offset..offset + bytes.len()], bytes),
        }
    }

    /// The bytes this receive has landed so far, given how many: what a
    /// [`Transfer::Forward`] of it may send. `None` for a landing whose bytes the fabric does
    /// not see ([`Landing::Sink`]) or that is judged ([`Landing::Checked`]).
    pub fn landed(&self, done: usize) -> Option<&[u8]> {
        match self {
            Landing::Into(buf) | Landing::Fold { buf, .. } => Some(&buf[..done.min(buf.len())]),
            Landing::Sink { .. } | Landing::Checked { .. } => None,
        }
    }

    /// The judgement of a whole [`Landing::Checked`] receive (every other landing passes).
    pub fn verdict(&self) -> Result<(), String> {
        match self {
            Landing::Checked { buf, check } => check.check(buf),
            _ => Ok(()),
        }
    }
}

impl fmt::Debug for Landing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Landing::Into(buf) => write!(f, "Into({} bytes)", buf.len()),
            Landing::Sink { len, grain, .. } => write!(f, "Sink({len} bytes, grain {grain})"),
            Landing::Checked { buf, .. } => write!(f, "Checked({} bytes)", buf.len()),
            Landing::Fold { buf, grain, .. } => {
                write!(f, "Fold({} bytes, grain {grain})", buf.len())
            }
        }
    }
}

/// One transfer of a step.
#[derive(Debug)]
pub enum Transfer<'a> {
    /// Send these bytes on the channel.
    Send {
        /// Where to.
        channel: Channel,
        /// What (borrowed for the step).
        data: &'a [u8],
    },
    /// Receive on the channel.
    Recv {
        /// Where from.
        channel: Channel,
        /// Where the bytes go.
        landing: Landing<'a>,
    },
    /// Send on the channel the bytes of receive `of` (an earlier transfer of the same step,
    /// into [`Landing::Into`] or [`Landing::Fold`], of `len` bytes) as they land, each once
    /// the receive has it (reduced, for a fold): how a ring forwards a segment while the rest
    /// of it is still arriving, where a step per segment would first wait for all of it. Only
    /// over a fabric whose [`Fabric::forwards`] says so; the bytes on the wire are those of a
    /// [`Transfer::Send`] of the whole buffer once the receive is done.
    Forward {
        /// Where to.
        channel: Channel,
        /// The index in the step of the receive whose bytes are sent.
        of: usize,
        /// The length of that receive.
        len: usize,
    },
}

impl Transfer<'_> {
    /// The channel of this transfer.
    pub fn channel(&self) -> Channel {
        match self {
            Transfer::Send { channel, .. }
            | Transfer::Recv { channel, .. }
            | Transfer::Forward { channel, .. } => *channel,
        }
    }

    /// The channel of this transfer, to readdress it (a sub-group's step on the job's
    /// channels).
    pub fn channel_mut(&mut self) -> &mut Channel {
        match self {
            Transfer::Send { channel, .. }
            | Transfer::Recv { channel, .. }
            | Transfer::Forward { channel, .. } => channel,
        }
    }

    /// Whether this transfer sends or receives.
    pub fn direction(&self) -> Direction {
        match self {
            Transfer::Send { .. } | Transfer::Forward { .. } => Direction::Send,
            Transfer::Recv { .. } => Direction::Recv,
        }
    }

    /// The number of bytes this transfer moves.
    pub fn len(&self) -> usize {
        match self {
            Transfer::Send { data, .. } => data.len(),
            Transfer::Recv { landing, .. } => landing.len(),
            Transfer::Forward { len, .. } => *len,
        }
    }

    /// Whether this transfer moves no bytes (it completes at once).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks what every fabric requires of a transfer on its own, whatever its channel: a
    /// receive into a [`Landing::Sink`] or a [`Landing::Fold`] must be a whole number of
    /// grains (else its last piece could never be delivered). Every fabric calls this, through
    /// [`check_in`](Self::check_in), on each transfer of a step before a byte moves, and fails
    /// the step with [`FailureKind::Invalid`] and this text otherwise: the caller's mistake,
    /// not the peer's.
    pub fn check_landing(&self) -> Result<(), String> {
        if let Transfer::Recv {
            channel,
            landing: landing @ (Landing::Sink { .. } | Landing::Fold { .. }),
        } = self
        {
            let (len, grain) = (landing.len(), landing.grain());
            if !len.is_multiple_of(grain) {
                return Err(format!(
                    "a receive of {len} bytes on {channel} into a sink of {grain}-byte grains: \
                     the length must be a whole number of grains"
                ));
            }
        }
        Ok(())
    }

    /// Checks what every fabric requires of transfer `i` of `step` in its step, as
    /// [`check_landing`](Self::check_landing) does of it alone: a [`Transfer::Forward`] needs
    /// a fabric that [`forwards`](Fabric::forwards), and names an earlier receive into
    /// [`Landing::Into`] or [`Landing::Fold`] of its length. Fabrics fail the step with
    /// [`FailureKind::Invalid`] and this text otherwise, before a byte moves.
    pub fn check_in(step: &[Transfer<'_>], i: usize, forwards: bool) -> Result<(), String> {
        step[i].check_landing()?;
        let Transfer::Forward { channel, of, len } = step[i] else {
            return Ok(());
        };
        if !forwards {
            return Err(format!(
                "a forward on {channel}: this fabric does not forward received bytes"
            ));
        }
        match step.get(of) {
            Some(Transfer::Recv { landing, .. })
                if of < i && landing.landed(0).is_some() && landing.len() == len =>
            {
                Ok(())
            }
            _ => Err(format!(
                "a forward on {channel} of transfer {of} ({len} bytes): it must be an earlier \
                 receive of the step, into a buffer or a fold, of that length"
            )),
        }
    }

    /// Once a receive is complete: its landing's [`verdict`](Landing::verdict), as the
    /// [`FailureKind::Mismatch`] failure of this transfer.
    pub fn verdict(&self) -> Result<(), FabricError> {
        let Transfer::Recv { channel, landing } = self else {
            return Ok(());
        };
        landing.verdict().map_err(|what| FabricError {
            channel: *channel,
            direction: Direction::Recv,
            done: landing.len(),
            total: landing.len(),
            kind: FailureKind::Mismatch(what),
        })
    }

    /// The [`FailureKind::Invalid`] failure of this transfer, before any byte of it moved.
    pub fn invalid(&self, what: String) -> FabricError {
        FabricError {
            channel: self.channel(),
            direction: self.direction(),
            done: 0,
            total: self.len(),
            kind: FailureKind::Invalid(what),
        }
    }
}

/// Whether a transfer sends or receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Bytes leave this rank.
    Send,
    /// Bytes come to this rank.
    Recv,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Send => "sending to",
            Direction::Recv => "receiving from",
        })
    }
}

/// Why a transfer failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FailureKind {
    /// The peer closed the connection (or the link was cut).
    #[error("the connection was closed by the peer")]
    Closed,
    /// The peer closed the connection during an operation that MLX refuses and this crate
    /// runs: a Python MLX peer throws there and leaves. The text names MLX's rule.
    #[error("the connection was closed by the peer, {0}")]
    ClosedBeyondMlx(String),
    /// The transport reported an error.
    #[error("{0}")]
    Transport(String),
    /// The deadline passed first.
    #[error("timed out after {waited:?}")]
    TimedOut {
        /// How long the step had waited when it gave up.
        waited: Duration,
    },
    /// A message did not fit the posted receive (message channels).
    #[error("a message of {got} bytes arrived for a receive of {want} bytes")]
    MessageSize {
        /// The size of the posted receive.
        want: usize,
        /// The size of the message.
        got: usize,
    },
    /// A message never arrived (message channels that number their messages, as RDMA
    /// immediate data can): the next one came in its place.
    #[error("message {expected} was lost (message {got} arrived in its place)")]
    Lost {
        /// The sequence number expected.
        expected: u64,
        /// The sequence number that arrived.
        got: u64,
    },
    /// A completion came back with an error status (message channels).
    #[error("completion status {0}")]
    Completion(String),
    /// This rank itself was stopped (a simulated crash).
    #[error("this rank crashed")]
    Crashed,
    /// The step was malformed (a channel that does not exist, a bad grain).
    #[error("invalid transfer: {0}")]
    Invalid(String),
    /// A [`Liveness`] watcher found a peer gone while the step waited (JACCL's side
    /// channel); the text names the rank.
    #[error("{0}")]
    Gone(String),
    /// On the nuvec wire: the peer called another operation than this rank (or the same with
    /// another size); the text names both calls.
    #[error("{0}")]
    Mismatch(String),
    /// On the nuvec wire: rank `rank`'s group failed, and it said so before it closed its
    /// links ([`Fabric::tell_failed`]) while this rank's step waited, with nothing moving, on
    /// the transfer the error names (or a transfer of the step met the link's close, or its
    /// reset, after the peer had said it). The telling rank's own error says why.
    /// ([`Fabric::probe`] reports such a peer as well.)
    #[error(
        "rank {rank} failed and left the group (it said so before it closed its links; its own \
         error says why)"
    )]
    PeerFailed {
        /// The rank that said it failed.
        rank: usize,
    },
    /// Rank `rank` closed its `link` to this rank, on which this operation still sends in a
    /// later step, while this rank's step waited on the transfer the error names (whose
    /// channel is another): the closing rank failed, or its program ended early, so the
    /// operation cannot complete. Named apart from [`FailureKind::Closed`] so that the error
    /// says both what the step waited for (often the rank that held every rank up) and which
    /// rank left.
    #[error(
        "the connection was closed by rank {rank} on link {link}, which this operation still \
         sends on (it failed or its program ended; its own error, if it has one, says why)"
    )]
    ClosedBy {
        /// The rank that closed its link.
        rank: usize,
        /// The link it closed (the index of the channel to it).
        link: usize,
    },
    /// The link went silent: the peer's kernel acknowledged nothing (no sent byte, no
    /// keepalive probe) for the link timeout, as a cut cable or a dead host does; a peer
    /// that is only slow or stopped still acknowledges.
    #[error(
        "the link went silent: the peer acknowledged nothing for the link timeout of {limit:?} \
         (a cut cable, a dead host or network)"
    )]
    Silent {
        /// The link timeout.
        limit: Duration,
    },
    /// The step made no progress for longer than its progress timeout.
    #[error("no progress for {waited:.3?}, past the progress timeout of {limit:?}")]
    NoProgress {
        /// How long the step had made none.
        waited: Duration,
        /// The progress timeout.
        limit: Duration,
    },
}

/// A failed step: which channel, which way, how far it got and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{direction} {channel} ({done} of {total} bytes): {kind}")]
pub struct FabricError {
    /// The channel of the transfer that failed.
    pub channel: Channel,
    /// Whether it was sending or receiving.
    pub direction: Direction,
    /// Bytes of that transfer done before the failure.
    pub done: usize,
    /// Bytes that transfer had to move.
    pub total: usize,
    /// What went wrong.
    pub kind: FailureKind,
}

impl FabricError {
    /// The peer that the failure concerns.
    pub fn peer(&self) -> usize {
        self.channel.peer
    }

    /// Whether the failure is the deadline passing.
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, FailureKind::TimedOut { .. })
    }
}

/// The transfer of a step to blame when the step's deadline passes: the unfinished one that
/// made the least progress (by fraction), receives before sends, so that the error names the
/// peer that went silent rather than a live neighbour that is waiting like us.
///
/// `done(i)` is how many bytes transfer `i` moved. Returns `None` when every transfer is done.
pub fn most_stuck(step: &[Transfer<'_>], done: impl Fn(usize) -> usize) -> Option<usize> {
    step.iter()
        .enumerate()
        .filter(|(i, t)| done(*i) < t.len())
        .min_by(|(i, a), (j, b)| {
            let fa = done(*i) as f64 / a.len() as f64;
            let fb = done(*j) as f64 / b.len() as f64;
            let recv_a = a.direction() == Direction::Recv;
            let recv_b = b.direction() == Direction::Recv;
            recv_b
                .cmp(&recv_a)
                .then(fa.partial_cmp(&fb).unwrap_or(std::cmp::Ordering::Equal))
        })
        .map(|(i, _)| i)
}

/// Which transfers of a step go ahead of the next one, and how long they are held back: see
/// [`Fabric::run_ahead`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ahead {
    /// The index of the first transfer that goes ahead; every later one goes ahead too.
    pub from: usize,
    /// How long the step must have waited before the transfers that go ahead start.
    pub hold: Duration,
}

impl Ahead {
    /// None of a step of `len` transfers goes ahead: [`Fabric::run_ahead`] is then
    /// [`Fabric::run`].
    pub fn none(len: usize) -> Ahead {
        Ahead {
            from: len,
            hold: Duration::ZERO,
        }
    }

    /// Says in `moved` that every transfer of `step` that goes ahead moved whole: what a
    /// fabric that runs them to their end with the step reports.
    pub fn all_moved(&self, step: &[Transfer<'_>], moved: &mut [usize]) {
        let ahead = step.get(self.from..).unwrap_or_default();
        for (m, t) in moved.iter_mut().zip(ahead) {
            *m = t.len();
        }
    }

    /// Whether `step` and `moved` fit this: `from` within the step, one entry of `moved` per
    /// transfer that goes ahead, and none of those a [`Transfer::Forward`]. A step that does
    /// not fit fails with [`FailureKind::Invalid`] before anything moves, naming its first
    /// transfer (an empty step, which has none, names channel 0 of rank 0). Every
    /// [`Fabric::run_ahead`] checks its step with it before it moves anything.
    pub fn check(&self, step: &[Transfer<'_>], moved: &[usize]) -> Result<(), FabricError> {
        if self.from > step.len() || moved.len() != step.len() - self.from {
            let what = format!(
                "transfers from index {} of a step of {} go ahead, with {} counts for them",
                self.from,
                step.len(),
                moved.len()
            );
            return Err(match step.first() {
                Some(first) => first.invalid(what),
                None => FabricError {
                    channel: Channel::new(0, 0),
                    direction: Direction::Send,
                    done: 0,
                    total: 0,
                    kind: FailureKind::Invalid(what),
                },
            });
        }
        match step[self.from..]
            .iter()
            .find(|t| matches!(t, Transfer::Forward { .. }))
        {
            Some(t) => Err(t.invalid("a forward cannot go ahead of its step".to_string())),
            None => Ok(()),
        }
    }
}

/// One rank's connections to its peers: see the [module documentation](self).
pub trait Fabric {
    /// This rank.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn size(&self) -> usize;

    /// What the channels guarantee about message boundaries.
    fn kind(&self) -> ChannelKind;

    /// The number of links to `peer` (0 when not connected).
    fn links(&self, peer: usize) -> usize;

    /// The fabric's clock: time since the fabric started (virtual in simulation).
    fn now(&self) -> Duration;

    /// Runs every transfer of `step` at once and returns when all have completed, or with the
    /// first failure, or when `deadline` (on [`Fabric::now`]'s clock) passes. Transfers on the
    /// same channel and direction run in the order given. After an error the state of the
    /// channels is unspecified: the caller must treat the group as failed.
    fn run(&mut self, step: &mut [Transfer<'_>], deadline: Duration) -> Result<(), FabricError>;

    /// Runs `step` as [`run`](Fabric::run) does, except for its transfers from index
    /// `ahead.from` on, which belong to the next step and go ahead of it only if this step is
    /// held up: they are held back until the step has waited `ahead.hold`, and then move as
    /// any transfer (a [`Landing::Checked`] receive is judged the moment it is whole), so that
    /// a step that ends sooner leaves them to the next step, which sends each send among them
    /// together with that step's own bytes on the channel (one message where there would be
    /// two) and reads each receive with its own. The step returns once the transfers before
    /// `ahead.from` are done; `moved` (one entry per transfer from `ahead.from` on) then says
    /// how many bytes of each moved, and the caller runs the rest at the start of the next
    /// step on the same channel. Only sends and receives go ahead (no [`Transfer::Forward`]).
    /// An implementation checks `step`, `ahead` and `moved` with [`Ahead::check`] before it
    /// moves anything.
    ///
    /// Why: the nuvec wire puts an operation's header on every link soon after the operation
    /// begins, whatever it waits for, so that a peer whose program called something else reads
    /// it; but a header alone is a message of its own, with its system calls, packet and
    /// wake-up on both ends, where the next step's message could carry it. Held back, it still
    /// goes out once a step is held up (a peer's mismatch is then found about `hold` later),
    /// and costs nothing when the step ends in time.
    ///
    /// The default (the RDMA fabric, fabrics of tests) runs every transfer to its end as
    /// [`run`](Fabric::run), sending the held ones at once: the same bytes in the same order
    /// on every channel, only sooner.
    fn run_ahead(
        &mut self,
        step: &mut [Transfer<'_>],
        ahead: Ahead,
        deadline: Duration,
        moved: &mut [usize],
    ) -> Result<(), FabricError> {
        ahead.check(step, moved)?;
        self.run(step, deadline)?;
        ahead.all_moved(step, moved);
        Ok(())
    }

    /// Whether this fabric runs [`Transfer::Forward`]s. The default does not: an algorithm
    /// then waits for a whole segment before it sends it on, in a step of its own.
    fn forwards(&self) -> bool {
        false
    }

    /// Checks, without sending anything, whether the connections to each peer are still
    /// open: one `(peer, what)` per peer found unreachable. The default knows nothing and
    /// reports no problem.
    fn probe(&mut self) -> Vec<(usize, String)> {
        Vec::new()
    }

    /// When bytes last arrived from `peer`, on [`Fabric::now`]'s clock (`None`: never, or the
    /// fabric does not keep track). The failure diagnosis says, per peer, in which operation it
    /// was last heard from.
    fn last_heard(&self, peer: usize) -> Option<Duration> {
        let _ = peer;
        None
    }

    /// Tells `patience` whenever a step waits past the time it gives, what it waits for (see
    /// [`Patience`]). The default never tells: a fabric that does not wait on a clock of its
    /// own (the simulator) ignores it.
    fn set_patience(&mut self, patience: Box<dyn Patience>) {
        let _ = patience;
    }

    /// An operation of the group over this fabric begins: the communicator's core says so
    /// before the operation's first step. The default ignores it; the simulator counts
    /// operations to aim a fault at the k-th one.
    fn begin_operation(&mut self) {}

    /// The operation under way sends bytes on `channels` in a step after the next one run:
    /// their peers cannot have finished it without those bytes, so one that closes such a
    /// channel has failed, and the step under way fails at its next look at the links' health
    /// (over TCP, within half a second; [`FailureKind::ClosedBy`] on the transfer it waits on),
    /// whatever links it waits on, rather than wait for its
    /// deadline (a neighbour whose `send` returned keeps its links open and writes nothing
    /// more, so only the close of a rank further round can end the wait). An algorithm says it
    /// before each step of an operation, with no channel before its last;
    /// [`begin_operation`](Fabric::begin_operation) forgets it. A peer that left after its
    /// last operation closes only channels no later step needs. The default ignores it.
    fn sends_later(&mut self, channels: &[Channel]) {
        let _ = channels;
    }

    /// This rank's group has failed and is about to close its links: tell the peers so at
    /// once, on the links where the notice cannot be taken for the operation's bytes, so that
    /// a peer waiting for other bytes (from a rank that will never send them) fails with
    /// [`FailureKind::PeerFailed`] when it looks at its links' health, instead of at its
    /// deadline. Best effort: a link that cannot take the notice now only closes. Only the
    /// nuvec wire calls it (MLX's wire never carries a byte MLX would not send); a fabric that
    /// has no such notice ignores it (the default, the simulator, RDMA).
    fn tell_failed(&mut self) {}

    /// The Unix time, in µs, of [`Fabric::now`]'s zero, when the fabric fixes it. The flight
    /// recorder turns the fabric's clock into Unix time with it; `None` (the default): from one
    /// reading of the wall clock at a group's first operation. The simulator fixes one for all
    /// its ranks, so that their records share one clock however the threads ran.
    fn epoch_us(&self) -> Option<u64> {
        None
    }

    /// A recent reading of [`Fabric::now`]'s clock, for a caller that can take a time a little
    /// old rather than read the clock again: the flight recorder's end of an operation, where
    /// one more clock read was most of the recorder's cost. A fabric that reads its clock in
    /// every pass of a step returns its latest reading (no older than the start of its last
    /// step's last pass); the default reads the clock.
    fn recent(&self) -> Duration {
        self.now()
    }
}

/// A [`Fabric`] for each pointer to one (`&mut F`, `Box<F>`): every method forwarded, the
/// provided ones included, so that a fabric behind a pointer keeps what it overrides. One
/// list for both, so that a method added to the trait is forwarded by both or by neither.
macro_rules! forward_fabric {
    ($($pointer:ty),+) => {$(
        impl<F: Fabric + ?Sized> Fabric for $pointer {
            fn rank(&self) -> usize {
                (**self).rank()
            }
            fn size(&self) -> usize {
                (**self).size()
            }
            fn kind(&self) -> ChannelKind {
                (**self).kind()
            }
            fn links(&self, peer: usize) -> usize {
                (**self).links(peer)
            }
            fn now(&self) -> Duration {
                (**self).now()
            }
            fn run(&mut self, step: &mut [Transfer<'_>], deadline: Duration) -> Result<(), FabricError> {
                (**self).run(step, deadline)
            }
            fn run_ahead(
                &mut self,
                step: &mut [Transfer<'_>],
                ahead: Ahead,
                deadline: Duration,
                moved: &mut [usize],
            ) -> Result<(), FabricError> {
                (**self).run_ahead(step, ahead, deadline, moved)
            }
            fn forwards(&self) -> bool {
                (**self).forwards()
            }
            fn probe(&mut self) -> Vec<(usize, String)> {
                (**self).probe()
            }
            fn last_heard(&self, peer: usize) -> Option<Duration> {
                (**self).last_heard(peer)
            }
            fn set_patience(&mut self, patience: Box<dyn Patience>) {
                (**self).set_patience(patience)
            }
            fn begin_operation(&mut self) {
                (**self).begin_operation()
            }
            fn sends_later(&mut self, channels: &[Channel]) {
                (**self).sends_later(channels)
            }
            fn tell_failed(&mut self) {
                (**self).tell_failed()
            }
            fn epoch_us(&self) -> Option<u64> {
                (**self).epoch_us()
            }
            fn recent(&self) -> Duration {
                (**self).recent()
            }
        }
    )+};
}
forward_fabric!(&mut F, Box<F>);

/// One connection between two ranks: `opener` connected to `acceptor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Connection {
    /// The rank that connected.
    pub opener: usize,
    /// The rank that accepted.
    pub acceptor: usize,
    /// The opener's link index for this connection (its channel is `(acceptor, opener_link)`).
    pub opener_link: usize,
    /// The acceptor's link index for this connection (its channel is `(opener, acceptor_link)`).
    pub acceptor_link: usize,
}

/// Which ranks are connected, by how many links, and how each end numbers them.
///
/// The rule: at each rank, the links to a peer are numbered first the connections this rank
/// opened to it (in order), then those it accepted from it (in order). In MLX's ring every rank
/// opens C connections to its right neighbour and accepts C from its left one, so for R > 2 the
/// right and left links are both `0..C`; with R = 2 the single peer is both neighbours, and the
/// links this rank opened are `0..C`, those it accepted `C..2C`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wiring {
    size: usize,
    connections: Vec<Connection>,
}

impl Wiring {
    /// A wiring from `(opener, acceptor)` pairs, in the order the connections are made.
    ///
    /// # Panics
    /// If a rank is out of range or connects to itself.
    pub fn from_pairs(size: usize, pairs: impl IntoIterator<Item = (usize, usize)>) -> Self {
        let pairs: Vec<(usize, usize)> = pairs.into_iter().collect();
        for &(a, b) in &pairs {
            assert!(
                a < size && b < size && a != b,
                "wiring: bad pair ({a}, {b}) of {size}"
            );
        }
        let opened = |from: usize, to: usize| pairs.iter().filter(|&&p| p == (from, to)).count();
        let mut next_open = std::collections::HashMap::new();
        let mut next_accept = std::collections::HashMap::new();
        let connections = pairs
            .iter()
            .map(|&(a, b)| {
                let o = next_open.entry((a, b)).or_insert(0usize);
                let opener_link = *o;
                *o += 1;
                let acc = next_accept.entry((a, b)).or_insert(0usize);
                let acceptor_link = opened(b, a) + *acc;
                *acc += 1;
                Connection {
                    opener: a,
                    acceptor: b,
                    opener_link,
                    acceptor_link,
                }
            })
            .collect();
        Self { size, connections }
    }

    /// MLX's ring: every rank opens `links` connections to its right neighbour.
    pub fn ring(size: usize, links: usize) -> Self {
        if size < 2 {
            return Self {
                size,
                connections: Vec::new(),
            };
        }
        Self::from_pairs(
            size,
            (0..size).flat_map(|r| std::iter::repeat_n((r, (r + 1) % size), links)),
        )
    }

    /// A full mesh: every pair `i < j` with `links` connections opened by `i`.
    pub fn mesh(size: usize, links: usize) -> Self {
        Self::from_pairs(
            size,
            (0..size)
                .flat_map(|i| (i + 1..size).flat_map(move |j| std::iter::repeat_n((i, j), links))),
        )
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Adds a connection that `opener` makes to `acceptor` after all the others, numbered at
    /// each end past the links the pair had (so existing channels keep their numbers: how a
    /// sub-group's new connections join a simulated job), and returns it.
    ///
    /// # Panics
    /// If a rank is out of range or connects to itself.
    pub fn join(&mut self, opener: usize, acceptor: usize) -> Connection {
        assert!(
            opener < self.size && acceptor < self.size && opener != acceptor,
            "wiring: bad pair ({opener}, {acceptor}) of {}",
            self.size
        );
        let link = self.links(opener, acceptor);
        let connection = Connection {
            opener,
            acceptor,
            opener_link: link,
            acceptor_link: link,
        };
        self.connections.push(connection);
        connection
    }

    /// Every connection, in the order they were made.
    pub fn connections(&self) -> &[Connection] {
        &self.connections
    }

    /// The number of links `rank` has to `peer`.
    pub fn links(&self, rank: usize, peer: usize) -> usize {
        self.connections
            .iter()
            .filter(|c| {
                (c.opener, c.acceptor) == (rank, peer) || (c.opener, c.acceptor) == (peer, rank)
            })
            .count()
    }

    /// The far end of `rank`'s channel: `(peer, peer's link index)` for the same connection.
    pub fn far_end(&self, rank: usize, channel: Channel) -> Option<(usize, usize)> {
        self.connections.iter().find_map(|c| {
            if c.opener == rank && c.acceptor == channel.peer && c.opener_link == channel.link {
                Some((c.acceptor, c.acceptor_link))
            } else if c.acceptor == rank
                && c.opener == channel.peer
                && c.acceptor_link == channel.link
            {
                Some((c.opener, c.opener_link))
            } else {
                None
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_that_go_ahead_must_lie_within_the_step_with_a_count_each_and_no_forward() {
        let (data, mut buf) = ([1u8; 4], [0u8; 4]);
        let channel = Channel::new(1, 0);
        let mut step = [
            Transfer::Recv {
                channel,
                landing: Landing::Into(&mut buf),
            },
            Transfer::Send {
                channel,
                data: &data,
            },
        ];
        let hold = Duration::from_millis(1);
        let invalid = |r: Result<(), FabricError>| matches!(r, Err(e) if matches!(e.kind, FailureKind::Invalid(_)) && e.done == 0);
        assert!(Ahead { from: 1, hold }.check(&step, &[0]).is_ok());
        assert!(Ahead::none(2).check(&step, &[]).is_ok());
        assert!(invalid(Ahead { from: 1, hold }.check(&step, &[])));
        assert!(invalid(Ahead { from: 3, hold }.check(&step, &[])));
        assert!(invalid(Ahead { from: 1, hold }.check(&[], &[0])));
        assert!(Ahead::none(0).check(&[], &[]).is_ok());
        step[1] = Transfer::Forward {
            channel,
            of: 0,
            len: 4,
        };
        assert!(invalid(Ahead { from: 1, hold }.check(&step, &[0])));
        let mut moved = [0usize; 1];
        Ahead { from: 1, hold }.all_moved(&step, &mut moved);
        assert_eq!(moved, [4]);
    }

    #[test]
    fn a_ring_of_three_numbers_both_neighbours_from_zero() {
        let w = Wiring::ring(3, 2);
        assert_eq!(w.links(0, 1), 2);
        assert_eq!(w.links(0, 2), 2);
        // Rank 0's link 1 to rank 1 (opened) is rank 1's link 1 to rank 0 (accepted).
        assert_eq!(w.far_end(0, Channel::new(1, 1)), Some((1, 1)));
        assert_eq!(w.far_end(1, Channel::new(0, 1)), Some((0, 1)));
    }

    #[test]
    fn a_ring_of_two_numbers_accepted_links_after_opened_ones() {
        let w = Wiring::ring(2, 2);
        assert_eq!(w.links(0, 1), 4);
        // Rank 0 opened links 0, 1 to rank 1; rank 1 accepted them as its links 2, 3.
        assert_eq!(w.far_end(0, Channel::new(1, 0)), Some((1, 2)));
        assert_eq!(w.far_end(0, Channel::new(1, 1)), Some((1, 3)));
        assert_eq!(w.far_end(1, Channel::new(0, 0)), Some((0, 2)));
        assert_eq!(w.far_end(1, Channel::new(0, 3)), Some((0, 1)));
    }

    #[test]
    fn a_mesh_connects_every_pair() {
        let w = Wiring::mesh(4, 1);
        for a in 0..4 {
            for b in 0..4 {
                assert_eq!(w.links(a, b), usize::from(a != b));
            }
        }
    }
}
