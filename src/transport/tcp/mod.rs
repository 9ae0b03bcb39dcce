//! The TCP fabric: MLX's ring connections as [`Fabric`] stream channels.
//!
//! There are no I/O threads. [`TcpFabric::run`] drives every transfer of a step itself over
//! non-blocking sockets: in each pass it writes what each send socket accepts and reads what
//! each receive socket has, and only when no transfer can progress does it wait for readiness
//! (epoll or kqueue, through `mio`) until the step's deadline. So both directions of every
//! connection move at once (full duplex, no deadlock however large the segments), the user's
//! buffers go to and come from the sockets without copies (but for destinations the kernel
//! copies into slowly on AMD's cores, which are read through the link's scratch; the private
//! `scratch` module says why), the reduction of received bytes runs on the calling thread as
//! they arrive, and there is no hand-off between threads to get wrong or to pay for. A receive
//! reads at most 64 KiB a call, so that the kernel's copy never holds the socket long while
//! the peer's packets wait behind it.
//!
//! Before it parks, a step that cannot progress may keep looking for bytes, calling
//! `sched_yield` between looks: a parked thread is woken by the kernel when its peer's bytes
//! arrive, and on a virtual machine waking an idle core costs tens of microseconds, more than
//! a small collective's whole step; a thread that is still looking sees the bytes at once.
//! But a thread that yields to a busy thread (a launcher that keeps a core busy, data
//! loading) loses the core for a scheduler tick, where a parked one is woken ahead of it. So
//! it looks only while the core is not contended (the `wait` module: for at most
//! [`DEFAULT_SPIN`], 100 µs, and not at all for a while once a look comes late);
//! `NUVEC_DISTRIBUTED_SPIN_US` and [`Options::spin`](crate::Options::spin) fix it instead, 0
//! parking at once. Measured on a 2-core VM over loopback, float32 all_sum through arrays on
//! 2 ranks, p50: looking takes 4 KiB from 17–60 µs parked to 8–14 µs on an idle machine; with
//! two busy loops running, a fixed 100 µs look takes 2 ms where the adaptive wait, which then
//! parks, takes 16 µs (the `wait` module has the table).
//!
//! Between two ranks of this crate on one machine (Linux), a connection's bytes go through
//! shared memory instead (a local link, the private `local` module): the same bytes in the
//! same order, so the step loop and the algorithms are unchanged, but a send is one copy into
//! a queue and a look is a load of its counter, where loopback TCP costs two copies in the
//! kernel, the protocol's work and a system call per look. The TCP connection stays open, to
//! wake a parked peer (one byte) and to tell when the peer is gone. Measured on the same VM
//! (all_sum of float32 through arrays, p50, side by side): 16 MiB on 2 ranks 8.0 ms against
//! 13.7 ms over loopback TCP, 1 MiB 160 µs against 318 µs. Links to Python MLX ranks, to other
//! versions and to other machines stay TCP, byte for byte MLX's;
//! [`Options::local_links`](crate::Options::local_links) turns local links off.
//!
//! Setup also finds out which connections are *native*, both ends being ranks of this crate
//! that may speak the nuvec wire ([`probe`]: a datagram to the UDP port beside the acceptor's
//! TCP port before each connect; with a key, the handshake's wire bytes), so that the ring's
//! ranks can agree on a wire (`ring::agree`) without a byte on the TCP connections that MLX
//! would not send. Local links are orthogonal: they change where a connection's bytes go, not
//! which wire they are.
//!
//! Every connection (and a local link's TCP doorbell) is watched by the kernel for liveness:
//! keepalive probes while idle, a capped retransmission backoff while sending, both set from
//! the link timeout ([`Options::link_timeout`](crate::Options::link_timeout), 15 s), and a
//! waiting step looks at every link's error and, on Linux, at whether its sent bytes have gone
//! unacknowledged for the link timeout (the private `liveness` module says why not
//! `TCP_USER_TIMEOUT`). A link that went silent fails the step at once as
//! [`FailureKind::Silent`], naming its peer, whether or not the step waits on it; a peer that
//! is only busy keeps acknowledging and is waited for, the step handing the communicator's
//! [`Patience`] what it waits for every warning interval. None of it puts a byte on the wire.
//!
//! Receives never read past their own end, so the bytes of the next operation stay in the
//! socket for it: the stream stays aligned with MLX's. No read or write asks for more than
//! 1 GiB at a time (macOS fails socket calls above `INT_MAX` bytes; see the private `limits`
//! module), so a segment of any size moves.

pub mod auth;
mod connect;
mod liveness;
mod local;
mod notice;
pub mod probe;
mod scratch;
pub mod setup;
pub(crate) mod split;
pub mod stream;

use std::io;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};

use crate::config::log::Log;
use crate::config::options::{DEFAULT_LINK_TIMEOUT, DEFAULT_SPIN, Spin, WireChoice};
use crate::error::Error;
use crate::fabric::{
    Ahead, Channel, ChannelKind, Direction, Fabric, FabricError, FailureKind, Landing, Patience,
    Stall, Transfer, Watch, blame, most_stuck,
};
use crate::limits;
use crate::transport::tcp::auth::Key;
use crate::transport::tcp::stream::Reassembly;
use crate::transport::wait::{Next, Waiter};
pub(crate) use connect::tune as tune_link;
use local::LocalLink;
pub use probe::NotNative;
use scratch::Scratch;

/// The scratch buffer of a receive that hands its bytes to the algorithm, per channel.
const SCRATCH: usize = 256 * 1024;

/// One connection.
struct Link {
    stream: mio::net::TcpStream,
    /// Where bytes of [`Landing::Sink`] receives are read before they are delivered; a tail
    /// shorter than the grain waits here for the rest of its element. Also where receives
    /// into a destination the kernel copies slowly into are bounced, on the CPUs where it
    /// does: see [`scratch`].
    scratch: Scratch,
    /// Where the link's bytes go when both ends are ranks of this crate on one machine; the
    /// stream then carries only doorbells (see [`local`]).
    local: Option<LocalLink>,
    /// A local link's stream reached its end: the peer closed it (its bytes already queued
    /// are still read), or a doorbell could not be written to it.
    gone: bool,
    /// A local link's doorbells were not all read: see [`Bells::Left`].
    bells_left: bool,
    /// The peer said it failed (see [`notice`]): a local link's doorbell [`notice::FAILED`],
    /// or a TCP link's urgent byte, found by a step's look at its links, by a transfer that
    /// met the link's close, or by [`Fabric::probe`].
    told: bool,
}

impl Link {
    /// Whether the peer said it failed (see [`notice`]), reading a TCP link's urgent byte if
    /// it has come. Kept once found: the byte is read once, and [`Fabric::probe`] reports it
    /// after the step. (A local link's notice is found by [`drain`]s of its doorbells.)
    fn heard_notice(&mut self) -> bool {
        self.told |= self.local.is_none() && notice::told(&self.stream);
        self.told
    }

    /// Takes what a [`drain`] of this local link's doorbells found.
    fn ring(&mut self, (bells, told): (Bells, bool)) {
        self.bells_left = bells == Bells::Left;
        self.gone |= bells == Bells::Gone;
        self.told |= told;
    }
}

/// This rank's connections of a ring, as a [`Fabric`].
pub struct TcpFabric {
    rank: usize,
    size: usize,
    /// `links[peer][link]`.
    links: Vec<Vec<Link>>,
    /// The `(peer, link)` of each poll token.
    tokens: Vec<(usize, usize)>,
    poll: Poll,
    events: Events,
    epoch: Instant,
    /// The latest reading of the clock ([`Fabric::recent`]): every step reads it at its start
    /// and at each pass.
    seen: std::cell::Cell<Duration>,
    /// When bytes last arrived from each peer.
    heard: Vec<Option<Duration>>,
    /// When a step that cannot progress looks again and when it parks in the poll.
    waiter: Waiter,
    /// What a step that cannot progress consults (JACCL's side channel, a progress timeout,
    /// the communicator's reports of a long wait).
    watch: Watch,
    /// `native[peer][link]`: whether the connection is native (both ends are ranks of this
    /// crate that may speak the nuvec wire), as setup found out (the `probe` module), else
    /// why not.
    native: Vec<Vec<Result<(), NotNative>>>,
    /// How long a link may go silent (see [`liveness`]).
    link_timeout: Duration,
    /// When a waiting step last looked at the health of every link.
    links_checked: Duration,
    /// Whether the poll reported something (an error, a link's end, a peer's notice) that the
    /// next look at the links' health should not wait for [`liveness::CHECK_EVERY`] to see.
    look_now: bool,
    /// The channels the operation under way sends on in a later step ([`Fabric::sends_later`]):
    /// a peer that closes one of them has failed.
    later: smallvec::SmallVec<[Channel; 4]>,
    /// The channels whose sends the last failed step left unfinished: with `later`, the links
    /// on which a peer still waits for bytes of this rank's operation, where a failed rank's
    /// notice is not written (see [`Fabric::tell_failed`]).
    torn: smallvec::SmallVec<[Channel; 4]>,
}

impl std::fmt::Debug for TcpFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpFabric(rank {} of {})", self.rank, self.size)
    }
}

impl TcpFabric {
    /// Connects rank `rank` of MLX's ring over `nodes` (every rank's addresses, all with the
    /// same count C) within `timeout`, in MLX's order, and numbers the connections as
    /// [`Wiring::ring`](crate::fabric::Wiring::ring). With `local`, a connection between two
    /// ranks of this crate on one machine carries its bytes through shared memory (see
    /// [`local`]). Unless `wire` is MLX's, it finds out which connections are native (see
    /// [`native`](Self::native)).
    #[allow(
        clippy::too_many_arguments,
        reason = "the setup's inputs, each from a different source"
    )]
    pub(crate) fn connect_ring(
        nodes: &[Vec<String>],
        rank: usize,
        timeout: Duration,
        key: Option<&Key>,
        local: bool,
        wire: WireChoice,
        log: &Log,
    ) -> Result<Self, Error> {
        let sockets = connect::connect_ring(nodes, rank, timeout, key, local, wire, log)?;
        Self::from_ring_sockets(rank, nodes.len(), sockets)
    }

    /// Why the connection of `channel` is not native (`None`: it is: both its ends are ranks
    /// of this crate that may speak the nuvec wire, as found out during setup, by a datagram
    /// beside the TCP port without a key, by the handshake with one; the same at both ends of
    /// a connection).
    pub(crate) fn not_native(&self, channel: Channel) -> Option<NotNative> {
        match self
            .native
            .get(channel.peer)
            .and_then(|row| row.get(channel.link))
        {
            Some(Ok(())) => None,
            Some(Err(why)) => Some(*why),
            None => Some(NotNative::Unprobed),
        }
    }

    /// The fabric of rank `rank` of a ring of `size` over its connected `sockets`, numbered as
    /// [`Wiring::ring`](crate::fabric::Wiring::ring).
    fn from_ring_sockets(
        rank: usize,
        size: usize,
        sockets: connect::RingSockets,
    ) -> Result<Self, Error> {
        let right = (rank + 1) % size;
        let left = (rank + size - 1) % size;
        let mut by_peer: Vec<Vec<(TcpStream, Option<LocalLink>)>> =
            (0..size).map(|_| Vec::new()).collect();
        let mut native: Vec<Vec<Result<(), NotNative>>> = (0..size).map(|_| Vec::new()).collect();
        // Opened connections first, then accepted ones (the `Wiring` rule).
        by_peer[right].extend(sockets.right);
        native[right].extend(sockets.right_native);
        by_peer[left].extend(sockets.left);
        native[left].extend(sockets.left_native);
        let mut fabric = Self::from_links(rank, by_peer).map_err(|e| Error::Connect {
            rank,
            what: format!("cannot set up the ring's sockets: {e}"),
        })?;
        fabric.native = native;
        Ok(fabric)
    }

    /// A fabric over connected streams: `streams[peer][link]`, each given the fabric's socket
    /// options (no Nagle delay, keepalive).
    pub(crate) fn from_streams(rank: usize, streams: Vec<Vec<TcpStream>>) -> io::Result<Self> {
        let links = streams
            .into_iter()
            .map(|row| row.into_iter().map(|s| (s, None)).collect())
            .collect();
        Self::from_links(rank, links)
    }

    /// [`from_streams`](Self::from_streams), where a stream may come with the local link
    /// that carries its bytes (the stream then carries only doorbells).
    fn from_links(
        rank: usize,
        streams: Vec<Vec<(TcpStream, Option<LocalLink>)>>,
    ) -> io::Result<Self> {
        let poll = Poll::new()?;
        let mut links = Vec::with_capacity(streams.len());
        let mut tokens = Vec::new();
        let mut token = 0;
        for (p, peer) in streams.into_iter().enumerate() {
            let mut row = Vec::with_capacity(peer.len());
            for (stream, local) in peer {
                connect::tune(&stream, DEFAULT_LINK_TIMEOUT)?;
                stream.set_nonblocking(true)?;
                let mut stream = mio::net::TcpStream::from_std(stream);
                poll.registry()
                    .register(&mut stream, Token(token), LINK_INTEREST)?;
                token += 1;
                tokens.push((p, row.len()));
                row.push(Link {
                    stream,
                    scratch: Scratch::default(),
                    local,
                    gone: false,
                    bells_left: false,
                    told: false,
                });
            }
            links.push(row);
        }
        Ok(Self {
            rank,
            size: links.len(),
            heard: vec![None; links.len()],
            links,
            tokens,
            poll,
            events: Events::with_capacity(64),
            epoch: Instant::now(),
            seen: std::cell::Cell::new(Duration::ZERO),
            waiter: Waiter::new(Spin::Adaptive(DEFAULT_SPIN)),
            watch: Watch::default(),
            native: Vec::new(),
            link_timeout: DEFAULT_LINK_TIMEOUT,
            links_checked: Duration::ZERO,
            look_now: false,
            later: smallvec::SmallVec::new(),
            torn: smallvec::SmallVec::new(),
        })
    }

    /// Makes every link fail an operation once it has been silent for `limit` (see
    /// [`liveness`]; the default is
    /// [`DEFAULT_LINK_TIMEOUT`](crate::config::options::DEFAULT_LINK_TIMEOUT)).
    pub(crate) fn with_link_timeout(mut self, limit: Duration) -> io::Result<Self> {
        for link in self.links.iter().flatten() {
            connect::tune(&link.stream, limit)?;
        }
        self.link_timeout = limit;
        Ok(self)
    }

    /// Gives every link the TCP congestion control `name` (the host's where `None`; see
    /// [`Options::tcp_congestion`](crate::Options::tcp_congestion)). Linux only: elsewhere a
    /// name is ignored and `log` warns. A name the kernel refuses fails, naming the link and
    /// what the host offers.
    pub(crate) fn with_congestion(self, name: Option<&str>, log: &Log) -> Result<Self, Error> {
        let Some(name) = name else {
            return Ok(self);
        };
        #[cfg(target_os = "linux")]
        {
            let _ = log;
            for (peer, row) in self.links.iter().enumerate() {
                for (link, l) in row.iter().enumerate() {
                    connect::set_congestion(&l.stream, name).map_err(|e| {
                        let offered = connect::congestion_offered();
                        Error::Connect {
                            rank: self.rank,
                            what: format!(
                                "cannot give the ring's connection to rank {peer}, link {link}, \
                                 the TCP congestion control {name:?} \
                                 (NUVEC_DISTRIBUTED_TCP_CONGESTION, Options::tcp_congestion): \
                                 {e}{}{offered}",
                                if offered.is_empty() { "" } else { "; " }
                            ),
                        }
                    })?;
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        log.warn(format_args!(
            "the TCP congestion control {name:?} (NUVEC_DISTRIBUTED_TCP_CONGESTION, \
             Options::tcp_congestion) is ignored: only Linux chooses one per connection"
        ));
        Ok(self)
    }

    /// Each link's link timeout and TCP congestion control, by peer and link (what a test
    /// checks a fabric was given).
    #[cfg(all(test, target_os = "linux"))]
    pub(crate) fn link_settings(&self) -> (Duration, Vec<Vec<String>>) {
        let names = self
            .links
            .iter()
            .map(|row| {
                row.iter()
                    .map(|l| {
                        let name = socket2::SockRef::from(&l.stream)
                            .tcp_congestion()
                            .expect("TCP_CONGESTION");
                        String::from_utf8_lossy(&name)
                            .trim_end_matches('\0')
                            .to_owned()
                    })
                    .collect()
            })
            .collect();
        (self.link_timeout, names)
    }

    /// Makes every step that cannot progress consult `watch` (see
    /// [`Watch`](crate::fabric::Watch)): a peer found gone or a wait past the progress timeout
    /// fails the step.
    pub(crate) fn with_watch(mut self, watch: Watch) -> Self {
        self.watch = watch;
        self
    }

    /// Makes every step that cannot progress keep looking (yielding the core between looks)
    /// for exactly `spin` before it parks until a socket is ready; zero parks at once. Without
    /// it the wait adapts (see the [module documentation](self)).
    pub fn with_spin(self, spin: Duration) -> Self {
        self.with_wait(Spin::Fixed(spin))
    }

    /// Makes every step that cannot progress wait as `spin` says.
    pub(crate) fn with_wait(mut self, spin: Spin) -> Self {
        self.waiter = Waiter::new(spin);
        self
    }
}

/// How far one transfer of a step has got.
#[derive(Clone, Copy)]
struct Progress {
    done: usize,
    /// Whether this transfer moves together with the ones after it on its channel and
    /// direction, in one vectored system call ([`together`]).
    together: bool,
    /// For receives handed to a sink: the reassembly of whole elements.
    stream: Reassembly,
    /// Whether this receive, complete, was judged ([`Transfer::verdict`]).
    judged: bool,
}

/// The failure of transfer `t`, `done` bytes in, on socket error `e`, on a fabric whose link
/// timeout is `limit`.
fn failure(t: &Transfer<'_>, done: usize, e: &io::Error, limit: Duration) -> FabricError {
    FabricError {
        channel: t.channel(),
        direction: t.direction(),
        done,
        total: t.len(),
        kind: kind_of(e, limit),
    }
}

/// What socket error `e` means: the peer closed; the link went silent (the kernel gave up on
/// it: `ETIMEDOUT`, or the "no route" its last retransmission met, as on the far side of a
/// pulled cable; see [`liveness`]); another error.
fn kind_of(e: &io::Error, limit: Duration) -> FailureKind {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => FailureKind::Closed,
        io::ErrorKind::TimedOut
        | io::ErrorKind::HostUnreachable
        | io::ErrorKind::NetworkUnreachable => FailureKind::Silent { limit },
        _ => FailureKind::Transport(e.to_string()),
    }
}

/// Reads into `into` through `scratch`: at most [`scratch::BOUNCE`] bytes (and what the
/// scratch holds), then copied into place.
fn read_through(
    stream: &mut mio::net::TcpStream,
    scratch: &mut [u8],
    into: &mut [u8],
) -> io::Result<usize> {
    let n = into.len().min(scratch.len()).min(scratch::BOUNCE);
    let read = limits::read(stream, &mut scratch[..n])?;
    into[..read].copy_from_slice(&scratch[..read]);
    Ok(read)
}

/// Whether transfer `i` of `step` moves together with the next ones on its channel and
/// direction, in one vectored system call: a send followed by other sends with bytes on its
/// channel (a header and its payload), or a receive into a buffer followed by another receive
/// into a buffer on its channel (a header and its payload, or on the nuvec wire's 4-rank relay
/// a vector, then the header and vector of the call it forwards: [`bufferable`]), or a
/// header's receive followed by a receive into a sink (the first step of MLX's schedule on
/// the nuvec wire: [`advance_header_and_sink`]). The nuvec
/// wire sends every small message as a header and a payload; moved apart, each would be a
/// system call, and a packet, of its own at both ends. The bytes and their order are the same
/// either way.
fn together(step: &[Transfer<'_>], i: usize) -> bool {
    let Some(t) = step.get(i) else {
        return false;
    };
    let next = same_way(step, i).nth(1).map(|j| &step[j]);
    match (t, next) {
        (Transfer::Send { .. }, Some(Transfer::Send { data, .. })) => !data.is_empty(),
        (Transfer::Recv { .. }, Some(n)) => {
            bufferable(t) && (bufferable(n) || (is_checked(t) && is_sink(n)))
        }
        _ => false,
    }
}

/// Transfer `i` of `step` and the later ones on its channel and direction, in order.
fn same_way<'s>(step: &'s [Transfer<'_>], i: usize) -> impl Iterator<Item = usize> + 's {
    let key = (step[i].channel(), step[i].direction());
    (i..step.len()).filter(move |&j| (step[j].channel(), step[j].direction()) == key)
}

/// Whether `t` is a receive whose bytes go through the scratch in whole grains: handed to a
/// sink ([`Landing::Sink`]) or reduced into a buffer ([`Landing::Fold`]).
fn is_sink(t: &Transfer<'_>) -> bool {
    matches!(
        t,
        Transfer::Recv {
            landing: Landing::Sink { .. } | Landing::Fold { .. },
            ..
        }
    )
}

/// Whether `t` is a receive that can share a vectored read: one into a buffer of its own
/// ([`Landing::Into`] or [`Landing::Checked`]), not empty, and not one the kernel is slow to
/// copy into (read through the scratch instead). A receive handed to a sink cannot: its bytes
/// go through the scratch to be reassembled into whole elements.
fn bufferable(t: &Transfer<'_>) -> bool {
    match t {
        Transfer::Recv {
            landing: Landing::Into(buf) | Landing::Checked { buf, .. },
            ..
        } => !buf.is_empty() && !scratch::aliases(buf.as_ptr()),
        _ => false,
    }
}

/// Whether `t` is a receive judged as it lands ([`Landing::Checked`]).
fn is_checked(t: &Transfer<'_>) -> bool {
    matches!(
        t,
        Transfer::Recv {
            landing: Landing::Checked { .. },
            ..
        }
    )
}

/// Moves transfer `i` of `step` and those that go [`together`] with it as far as the socket
/// takes now, in vectored system calls: the sends on its channel after it, or the payload
/// after a header's receive. Returns whether it progressed. A header's receive is judged by
/// the caller, as any other.
fn advance_together(
    link: &mut Link,
    step: &mut [Transfer<'_>],
    progress: &mut [Progress],
    i: usize,
) -> io::Result<bool> {
    let next = same_way(step, i).nth(1);
    if let Some(j) = next
        && is_checked(&step[i])
        && is_sink(&step[j])
    {
        return advance_header_and_sink(link, step, progress, i, j);
    }
    // The transfers that move together: `i`, then the rest of its channel and direction (for
    // receives, while each can share the read).
    let send = matches!(step[i], Transfer::Send { .. });
    let members: smallvec::SmallVec<[usize; 4]> = same_way(step, i)
        .enumerate()
        .take_while(|&(k, j)| {
            if send {
                matches!(step[j], Transfer::Send { .. })
            } else {
                k == 0 || bufferable(&step[j])
            }
        })
        .map(|(_, j)| j)
        .take(4)
        .collect();
    let mut moved = false;
    loop {
        let result = if matches!(step[i], Transfer::Send { .. }) {
            let mut budget = limits::MAX_IO;
            let slices: smallvec::SmallVec<[io::IoSlice<'_>; 4]> = members
                .iter()
                .filter_map(|&j| match &step[j] {
                    Transfer::Send { data, .. } => {
                        let rest = &data[progress[j].done.min(data.len())..];
                        let rest = &rest[..rest.len().min(budget)];
                        budget -= rest.len();
                        (!rest.is_empty()).then(|| io::IoSlice::new(rest))
                    }
                    Transfer::Recv { .. } | Transfer::Forward { .. } => None,
                })
                .collect();
            if slices.is_empty() {
                return Ok(moved);
            }
            io::Write::write_vectored(&mut link.stream, &slices)
        } else {
            // Every member's rest, in order, as one read of at most a piece (members before
            // the first unfinished one give nothing).
            let mut budget = scratch::PIECE;
            let mut slices: smallvec::SmallVec<[io::IoSliceMut<'_>; 4]> = smallvec::SmallVec::new();
            for (j, t) in step.iter_mut().enumerate() {
                if !members.contains(&j) {
                    continue;
                }
                if let Transfer::Recv {
                    landing: Landing::Into(buf) | Landing::Checked { buf, .. },
                    ..
                } = t
                {
                    let len = buf.len();
                    let left = &mut buf[progress[j].done.min(len)..];
                    let take = left.len().min(budget);
                    budget -= take;
                    if take > 0 {
                        slices.push(io::IoSliceMut::new(&mut left[..take]));
                    }
                }
            }
            if slices.is_empty() {
                return Ok(moved);
            }
            io::Read::read_vectored(&mut link.stream, &mut slices)
        };
        match result {
            Ok(0) if matches!(step[i], Transfer::Send { .. }) => {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(mut n) => {
                moved = true;
                let mut judge = false;
                for &j in &members {
                    let left = step[j].len() - progress[j].done;
                    let took = left.min(n);
                    progress[j].done += took;
                    n -= took;
                    judge |= took > 0 && took == left && is_checked(&step[j]);
                }
                // A header is judged the moment it is whole: the bytes after it wait for the
                // verdict (the caller gives it).
                if judge {
                    return Ok(moved);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Moves as many bytes of one transfer as its socket takes now. Returns whether it progressed.
fn advance(link: &mut Link, t: &mut Transfer<'_>, p: &mut Progress) -> io::Result<bool> {
    if link.local.is_some() {
        return advance_local(link, t, p);
    }
    let mut moved = false;
    match t {
        Transfer::Send { data, .. } => {
            while p.done < data.len() {
                match limits::write(&mut link.stream, &data[p.done..]) {
                    Ok(0) => return Err(io::ErrorKind::BrokenPipe.into()),
                    Ok(n) => {
                        p.done += n;
                        moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Transfer::Recv {
            landing: Landing::Into(buf) | Landing::Checked { buf, .. },
            ..
        } => {
            // A destination where the kernel's copy is slow is read through the scratch.
            let bounce = scratch::aliases(buf.as_ptr());
            if bounce {
                link.scratch.reserve(scratch::BOUNCE.min(buf.len()));
            }
            while p.done < buf.len() {
                let into = &mut buf[p.done..];
                let read = if bounce {
                    read_through(&mut link.stream, link.scratch.bytes(), into)
                } else {
                    let piece = into.len().min(scratch::PIECE);
                    limits::read(&mut link.stream, &mut into[..piece])
                };
                match read {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => {
                        p.done += n;
                        moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Transfer::Recv {
            landing: landing @ (Landing::Sink { .. } | Landing::Fold { .. }),
            ..
        } => {
            let (len, grain) = (landing.len(), landing.grain());
            link.scratch.reserve(SCRATCH.min(len).max(grain));
            let scratch = link.scratch.bytes();
            while !p.stream.is_complete() {
                let at = p.stream.next_read(scratch.len());
                let read = match limits::read(&mut link.stream, &mut scratch[at]) {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                moved = true;
                p.stream.absorb(scratch, read, |offset, bytes| {
                    landing.deliver(offset, bytes)
                });
            }
            p.done = p.stream.done();
        }
        // Sent by `advance_forward`, which sees the receive it forwards.
        Transfer::Forward { .. } => {}
    }
    Ok(moved)
}

/// The fewest landed bytes a forward sends before its receive is done: each send is a system
/// call, and 64 KiB keeps their number near the receive's while holding a piece back for
/// about 10 µs at 50 Gbit/s.
const FORWARD_MIN: usize = 64 * 1024;

/// Sends what transfer `i` of `step` (a [`Transfer::Forward`]) may: the bytes its receive has
/// landed and it has not sent, once they are [`FORWARD_MIN`] or the receive's last. Returns
/// whether it progressed.
fn advance_forward(
    link: &mut Link,
    step: &[Transfer<'_>],
    progress: &mut [Progress],
    i: usize,
) -> io::Result<bool> {
    let Transfer::Forward { of, len, .. } = step[i] else {
        return Ok(false);
    };
    let Some(landed) = (match &step[of] {
        Transfer::Recv { landing, .. } => landing.landed(progress[of].done),
        _ => None,
    }) else {
        return Ok(false);
    };
    if landed.len() - progress[i].done < FORWARD_MIN && landed.len() < len {
        return Ok(false);
    }
    let mut moved = false;
    while progress[i].done < landed.len() {
        match limits::write(&mut link.stream, &landed[progress[i].done..]) {
            Ok(0) => return Err(io::ErrorKind::BrokenPipe.into()),
            Ok(n) => {
                progress[i].done += n;
                moved = true;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(moved)
}

/// Moves a header's receive (`i`, a [`Landing::Checked`]) and the receive into a sink after it
/// on its channel (`j`) in shared reads while the header is not whole: each read takes the
/// header's rest and the sink's next bytes into the link's scratch, and the sink is handed the
/// whole elements among them at once (as [`advance`] does), so the header costs no read of
/// its own. Returns as soon as the header is whole, for the caller to judge it; the sink goes
/// on by [`advance`]. Bytes of a call the header refuses may reach the sink before the
/// verdict: they are the failing operation's, whose output is never returned.
fn advance_header_and_sink(
    link: &mut Link,
    step: &mut [Transfer<'_>],
    progress: &mut [Progress],
    i: usize,
    j: usize,
) -> io::Result<bool> {
    let (head, tail) = step.split_at_mut(j);
    let (
        Transfer::Recv {
            landing: Landing::Checked { buf: header, .. },
            ..
        },
        Transfer::Recv {
            landing: landing @ (Landing::Sink { .. } | Landing::Fold { .. }),
            ..
        },
    ) = (&mut head[i], &mut tail[0])
    else {
        return Ok(false);
    };
    let (len, grain) = (landing.len(), landing.grain());
    link.scratch.reserve(SCRATCH.min(len).max(grain));
    let mut moved = false;
    while progress[i].done < header.len() {
        let (h, p) = (progress[i].done, &mut progress[j]);
        let scratch = link.scratch.bytes();
        let at = p.stream.next_read(scratch.len());
        let (start, room) = (at.start, at.len().min(limits::MAX_IO - (header.len() - h)));
        let result = {
            let mut slices = [
                io::IoSliceMut::new(&mut header[h..]),
                io::IoSliceMut::new(&mut scratch[start..start + room]),
            ];
            io::Read::read_vectored(&mut link.stream, &mut slices)
        };
        match result {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                moved = true;
                let took = n.min(header.len() - h);
                progress[i].done += took;
                let rest = n - took;
                if rest > 0 {
                    let p = &mut progress[j];
                    p.stream.absorb(scratch, rest, |offset, bytes| {
                        landing.deliver(offset, bytes)
                    });
                    p.done = p.stream.done();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(moved)
}

/// [`advance`] over a local link: the same moves, through its queues. A copy that frees
/// room or fills bytes the peer parked for rings it at once, not after the whole pass.
///
/// A doorbell that cannot be written (the peer reset the connection: it left with a doorbell
/// of ours unread) marks the link gone rather than failing the transfer: the bytes it would
/// have announced are copied already. Only a transfer that then misses bytes fails.
fn advance_local(link: &mut Link, t: &mut Transfer<'_>, p: &mut Progress) -> io::Result<bool> {
    let Link {
        stream,
        scratch,
        local: Some(local),
        gone,
        ..
    } = link
    else {
        return Ok(false);
    };
    let unrung = std::cell::Cell::new(false);
    let ring = |r: bool| {
        if r && !unrung.get() && doorbell(stream).is_err() {
            unrung.set(true);
        }
    };
    let corrupt = |e: local::Corrupt| io::Error::new(io::ErrorKind::InvalidData, e.to_string());
    let moved = match t {
        Transfer::Send { data, .. } => {
            if *gone {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            pump(&mut p.done, data.len(), ring, |at| {
                local.write(&data[at..]).map_err(corrupt)
            })
        }
        Transfer::Recv {
            landing: Landing::Into(buf) | Landing::Checked { buf, .. },
            ..
        } => {
            let len = buf.len();
            pump(&mut p.done, len, ring, |at| {
                local.read(&mut buf[at..]).map_err(corrupt)
            })
        }
        Transfer::Recv {
            landing: landing @ (Landing::Sink { .. } | Landing::Fold { .. }),
            ..
        } => {
            // Copied into the scratch before they are reduced, never reduced in place: the
            // peer can still write the queue's memory, and a reduction must read bytes that
            // hold still. In pieces of `BOUNCE` bytes, which the reduction finds in L2: with
            // 256 KiB pieces the copy cost 1 MiB all_sums on 2 ranks about 15 %, with these
            // it is within the noise (2-core VM, best of 3).
            let (len, grain) = (landing.len(), landing.grain());
            scratch.reserve(scratch::BOUNCE.min(len).max(grain));
            let scratch = scratch.bytes();
            let mut moved = Ok(false);
            while !p.stream.is_complete() {
                let at = p.stream.next_read(scratch.len());
                let (n, r) = match local.read(&mut scratch[at]) {
                    Ok(read) => read,
                    Err(e) => {
                        moved = Err(corrupt(e));
                        break;
                    }
                };
                ring(r);
                if n == 0 {
                    break;
                }
                moved = Ok(true);
                p.stream
                    .absorb(scratch, n, |offset, bytes| landing.deliver(offset, bytes));
            }
            p.done = p.stream.done();
            moved
        }
        // Refused before the step starts: a fabric with local links does not forward.
        Transfer::Forward { .. } => Ok(false),
    };
    if unrung.get() {
        *gone = true;
    }
    let moved = moved?;
    if !moved && *gone && p.done < t.len() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(moved)
}

/// Runs `copy` (one copy into or out of a local link's queue from offset `done` of a transfer
/// of `len` bytes, returning how many bytes it moved and whether the peer must be rung, which
/// `ring` does) until the transfer is done or a copy moves nothing; whether any moved.
fn pump(
    done: &mut usize,
    len: usize,
    ring: impl Fn(bool),
    mut copy: impl FnMut(usize) -> io::Result<(usize, bool)>,
) -> io::Result<bool> {
    let mut moved = false;
    while *done < len {
        let (n, r) = copy(*done)?;
        ring(r);
        if n == 0 {
            break;
        }
        *done += n;
        moved = true;
    }
    Ok(moved)
}

/// What the poll reports of each link: its bytes both ways and, where the poll can say it,
/// urgent data (a failed peer's notice, see `notice`), so that a waiting step looks at the
/// links at once rather than at its next periodic look.
#[cfg(any(target_os = "linux", target_os = "android"))]
const LINK_INTEREST: Interest = Interest::READABLE
    .add(Interest::WRITABLE)
    .add(Interest::PRIORITY);
/// What the poll reports of each link: its bytes both ways (kqueue does not report urgent
/// data, so a failed peer's notice waits for the periodic look).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const LINK_INTEREST: Interest = Interest::READABLE.add(Interest::WRITABLE);

/// Whether `event` reports urgent data: a peer's notice that it failed (see `notice`).
fn told(event: &mio::event::Event) -> bool {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let urgent = event.is_priority();
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let urgent = {
        let _ = event;
        false
    };
    urgent
}

/// Wakes the peer of a local link, parked on its end of `stream`: one byte. A full socket
/// buffer means bytes the peer has not read yet, which wake it as well. An error means the
/// peer cannot be woken any more (it reset the connection).
fn doorbell(stream: &mio::net::TcpStream) -> io::Result<()> {
    ring_with(stream, 1)
}

/// [`doorbell`] with the byte `bell` (a failed rank's notice rings with its own, see
/// [`notice`]).
fn ring_with(stream: &mio::net::TcpStream, bell: u8) -> io::Result<()> {
    loop {
        return match io::Write::write(&mut &*stream, &[bell]) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(e),
        };
    }
}

/// The most doorbell bytes one [`drain`] reads: a peer that rings without end must not keep
/// a step from its deadline.
const DRAIN: usize = 1024;

/// The least time a TCP link must have gone unacknowledged, its bytes retransmitted, before
/// a timeout counts it as losing bytes ([`TcpFabric::on_a_losing_link`]). Half the step's wait
/// is the rule, but a step that began just before the operation's deadline has waited only
/// moments, and a live link can sit that long on one retransmission timer (Linux's least is
/// 200 ms, doubling per retry): a second outlasts the first two (at 0.2 and 0.6 s).
///
/// The silence is counted from the link's last acknowledgement, not from its first
/// unacknowledged byte, so a link idle for over a second before the step that then drops one
/// packet still counts; within an operation the earlier steps keep a live link's
/// acknowledgements recent. With an operation timeout under about 2 s a cut link has seldom
/// been silent that long, and the least progress names the transfer, as before.
const LOSING_AFTER: Duration = Duration::from_secs(1);

/// How long a link must have gone unacknowledged for a timeout after `waited` to count it
/// as losing bytes: half of `waited`, and never less than [`LOSING_AFTER`].
fn losing_after(waited: Duration) -> Duration {
    (waited / 2).max(LOSING_AFTER)
}

/// What [`drain`] left of a local link's doorbells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bells {
    /// None: the socket is empty (the next doorbell makes the poll report it again).
    Read,
    /// Some, unread: [`DRAIN`] bytes were read and more may wait. The poll, edge-triggered,
    /// will not report them again, so the step must look for them itself before it parks.
    Left,
    /// The stream ended: the peer closed it, or it failed.
    Gone,
}

/// Reads a local link's doorbells, at most [`DRAIN`] bytes of them; and whether one of them
/// was the peer's notice that it failed ([`notice::FAILED`]).
fn drain(stream: &mio::net::TcpStream) -> (Bells, bool) {
    let mut bells = [0u8; 256];
    let mut read = 0;
    let mut told = false;
    while read < DRAIN {
        match io::Read::read(&mut &*stream, &mut bells) {
            Ok(0) => return (Bells::Gone, told),
            Ok(n) => {
                read += n;
                told |= bells[..n].contains(&notice::FAILED);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (Bells::Read, told),
            Err(_) => return (Bells::Gone, told),
        }
    }
    (Bells::Left, told)
}

/// The failure of `step` when rank `peer` said it failed: that of the transfer the step is most
/// stuck on, naming the rank that told (the peer this rank waits for may not be the one that
/// failed), or of the link to `peer` when nothing is left to wait for.
fn peer_failed(step: &[Transfer<'_>], progress: &[Progress], peer: usize) -> FabricError {
    let kind = FailureKind::PeerFailed { rank: peer };
    match most_stuck(step, |i| progress[i].done) {
        Some(i) => FabricError {
            channel: step[i].channel(),
            direction: step[i].direction(),
            done: progress[i].done,
            total: step[i].len(),
            kind,
        },
        None => FabricError {
            channel: Channel::new(peer, 0),
            direction: Direction::Recv,
            done: 0,
            total: 0,
            kind,
        },
    }
}

impl Fabric for TcpFabric {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn kind(&self) -> ChannelKind {
        ChannelKind::Stream
    }

    fn links(&self, peer: usize) -> usize {
        self.links.get(peer).map_or(0, Vec::len)
    }

    /// Over TCP only: a local link's copies are its own pieces, and its latency is too short
    /// for a forward to gain anything.
    fn forwards(&self) -> bool {
        self.links.iter().flatten().all(|l| l.local.is_none())
    }

    fn now(&self) -> Duration {
        let now = self.epoch.elapsed();
        self.seen.set(now);
        now
    }

    fn recent(&self) -> Duration {
        self.seen.get()
    }

    fn last_heard(&self, peer: usize) -> Option<Duration> {
        self.heard.get(peer).copied().flatten()
    }

    fn set_patience(&mut self, patience: Box<dyn Patience>) {
        self.watch.set_patience(patience);
    }

    fn begin_operation(&mut self) {
        self.later.clear();
    }

    fn sends_later(&mut self, channels: &[Channel]) {
        self.later.clear();
        self.later.extend_from_slice(channels);
    }

    /// One byte on every link: urgent data on a TCP link, a doorbell of its own on a local
    /// link (`transport/tcp/notice.rs`).
    ///
    /// Not on a TCP link on which the operation still owes bytes (a send the failure left
    /// unfinished, or one of a later step): its peer, waiting for them, reads the link and
    /// meets its end; and should a middlebox clear the urgent flag and put the byte in the
    /// stream, it can only land where the peer expects the next operation's header, which its
    /// checksum refuses, never among the data it returns.
    fn tell_failed(&mut self) {
        for (peer, row) in self.links.iter().enumerate() {
            for (link, l) in row.iter().enumerate() {
                let channel = Channel::new(peer, link);
                let owed = self.later.contains(&channel) || self.torn.contains(&channel);
                if l.local.is_some() || !owed {
                    notice::tell(&l.stream, l.local.is_some());
                }
            }
        }
    }

    fn probe(&mut self) -> Vec<(usize, String)> {
        let mut down = Vec::new();
        for (peer, row) in self.links.iter_mut().enumerate() {
            for (link, l) in row.iter_mut().enumerate() {
                let state = if l.local.is_some() {
                    // A local link's stream carries only doorbells, and one rung after the
                    // last step stays unread until a step parks: peeked at, it would hide the
                    // stream's end behind it. Read them, as a parked step does.
                    if !l.gone {
                        l.ring(drain(&l.stream));
                    }
                    l.gone
                        .then(|| "the connection was closed by the peer".to_string())
                } else {
                    let mut byte = [0u8; 1];
                    match l.stream.peek(&mut byte) {
                        Ok(0) => Some("the connection was closed by the peer".to_string()),
                        Ok(_) => None,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
                        Err(e) => Some(e.to_string()),
                    }
                };
                let state = state.or_else(|| match l.stream.take_error() {
                    Ok(Some(e)) => Some(e.to_string()),
                    _ => None,
                });
                let state = if l.heard_notice() {
                    Some("it said it failed and left the group".to_string())
                } else {
                    state
                };
                if let Some(what) = state {
                    down.push((peer, format!("link {link}: {what}")));
                    break;
                }
            }
        }
        down
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
        let result = self.step(step, ahead, deadline, moved);
        if result.is_err() {
            self.watch.failed();
        }
        result
    }
}

impl TcpFabric {
    /// [`Fabric::run_ahead`] but for telling the watch that the group failed.
    fn step(
        &mut self,
        step: &mut [Transfer<'_>],
        ahead: Ahead,
        deadline: Duration,
        moved: &mut [usize],
    ) -> Result<(), FabricError> {
        self.torn.clear();
        let started = self.now();
        let forwards = self.forwards();
        let invalid = ahead.check(step, moved).err().or_else(|| {
            step.iter().enumerate().find_map(|(i, t)| {
                let c = t.channel();
                let what = if c.link >= self.links(c.peer) {
                    Some(format!("rank {} has no channel {c}", self.rank))
                } else {
                    Transfer::check_in(step, i, forwards).err()
                };
                what.map(|what| t.invalid(what))
            })
        });
        if let Some(e) = invalid {
            // Nothing moved: every send of the step is owed.
            self.torn.extend(
                step.iter()
                    .filter(|t| t.direction() == Direction::Send)
                    .map(Transfer::channel),
            );
            return Err(e);
        }
        // Room for the largest step of the ring with two connections per neighbour (eight
        // transfers, and four headers on the nuvec wire) without allocating.
        let mut progress: smallvec::SmallVec<[Progress; 12]> = step
            .iter()
            .enumerate()
            .map(|(i, t)| Progress {
                done: 0,
                // Those that go ahead move apart from the step's own, and with each other.
                together: if i < ahead.from {
                    together(&step[..ahead.from], i)
                } else {
                    together(&step[ahead.from..], i - ahead.from)
                },
                stream: match t {
                    Transfer::Recv { landing, .. } => {
                        Reassembly::new(landing.len(), landing.grain())
                    }
                    Transfer::Send { .. } | Transfer::Forward { .. } => Reassembly::new(0, 1),
                },
                judged: false,
            })
            .collect();
        let need = ahead.from;
        let result = match self.drive(step, &mut progress, ahead, deadline, started) {
            Err(e) => Err(self.announced(e, &step[..need], &progress[..need])),
            ok => ok,
        };
        for (m, p) in moved.iter_mut().zip(&progress[need..]) {
            *m = p.done;
        }
        if result.is_err() {
            // The sends the failure left unfinished: their peers wait for bytes of them.
            self.torn.extend(
                step.iter()
                    .zip(&progress)
                    .filter(|(t, p)| t.direction() == Direction::Send && p.done < t.len())
                    .map(|(t, _)| t.channel()),
            );
        }
        result
    }

    /// Moves the transfers of `step` until those before `ahead.from` are done, one fails, or
    /// `deadline` passes ([`Fabric::run_ahead`]); `progress` says how far each came.
    fn drive(
        &mut self,
        step: &mut [Transfer<'_>],
        progress: &mut [Progress],
        ahead: Ahead,
        deadline: Duration,
        started: Duration,
    ) -> Result<(), FabricError> {
        self.waiter.reset();
        // The transfers the step waits for; those after them go ahead of the next step once
        // the step has waited until `due` (a look at a receive costs a system call a pass).
        let need = ahead.from;
        let due = started.saturating_add(ahead.hold);
        let held = |i: usize, now: Duration| i >= need && now < due;
        // When the step last moved a byte (or started), for its watch.
        let mut quiet_since = started;
        loop {
            let pass = self.now();
            let mut moved = false;
            let mut finished = true;
            // (channel, direction) pairs whose earlier transfer in this step is not done: later
            // ones on the same pair must wait for it.
            let mut busy: smallvec::SmallVec<[(Channel, Direction); 8]> = smallvec::SmallVec::new();
            // Whether a transfer that goes ahead waits for its hold.
            let mut holding = false;
            for i in 0..step.len() {
                if progress[i].done == step[i].len() {
                    continue;
                }
                finished &= i >= need;
                let key = (step[i].channel(), step[i].direction());
                if busy.contains(&key) {
                    continue;
                }
                if held(i, pass) {
                    busy.push(key);
                    holding = true;
                    continue;
                }
                let c = step[i].channel();
                let link = &mut self.links[c.peer][c.link];
                let advanced = if matches!(step[i], Transfer::Forward { .. }) {
                    advance_forward(link, step, progress, i)
                } else if progress[i].together && link.local.is_none() {
                    // Those that go ahead move apart from the step's own.
                    if i < need {
                        advance_together(link, &mut step[..need], &mut progress[..need], i)
                    } else {
                        advance_together(link, &mut step[need..], &mut progress[need..], i - need)
                    }
                } else {
                    advance(link, &mut step[i], &mut progress[i])
                };
                match advanced {
                    Ok(m) => {
                        moved |= m;
                        if m && step[i].direction() == Direction::Recv {
                            // When this pass began (one clock read a pass; the watch that
                            // reads it waits for silences of 100 ms).
                            self.heard[c.peer] = Some(pass);
                            // This receive and those completed together with it, each judged
                            // once, in order.
                            for j in same_way(step, i) {
                                if progress[j].done < step[j].len() {
                                    break;
                                }
                                if !progress[j].judged {
                                    progress[j].judged = true;
                                    step[j].verdict()?;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        return Err(failure(&step[i], progress[i].done, &e, self.link_timeout));
                    }
                }
                if progress[i].done < step[i].len() {
                    busy.push(key);
                }
            }
            if finished {
                return Ok(());
            }
            if moved {
                quiet_since = pass;
                self.waiter.moved(pass);
                continue;
            }
            let now = self.now();
            if now < deadline {
                match self.waiter.idle(now) {
                    // Let any other runnable thread have the core, then look again, without
                    // parking (a yield that returns late shows the waiter a contended core).
                    Next::Look => {
                        std::thread::yield_now();
                        continue;
                    }
                    Next::Park => {}
                }
            }
            if now >= deadline {
                let waited = now.saturating_sub(started);
                let i = self
                    .on_a_losing_link(&step[..need], &progress[..need], waited)
                    .or_else(|| most_stuck(&step[..need], |i| progress[i].done))
                    .unwrap_or(0);
                return Err(FabricError {
                    channel: step[i].channel(),
                    direction: step[i].direction(),
                    done: progress[i].done,
                    total: step[i].len(),
                    kind: FailureKind::TimedOut { waited },
                });
            }
            // Every link's health, not only those of this step: a dead host shows on whichever
            // link the kernel gave up on first.
            if self.look_now || now.saturating_sub(self.links_checked) >= liveness::CHECK_EVERY {
                self.look_now = false;
                self.links_checked = now;
                let quiet = now.saturating_sub(quiet_since);
                if let Some(e) = self.check_links(step, progress, need, quiet) {
                    return Err(e);
                }
            }
            if self.watch.report_due(now)
                && let Some(stall) = self.stall(&step[..need], &progress[..need], now)
            {
                self.watch.report(now, &stall);
            }
            if !self.watch.is_idle()
                && let Err(stop) = self.watch.waiting(now, quiet_since)
            {
                let heard = &self.heard;
                let i = blame(
                    &step[..need],
                    |i| progress[i].done == step[i].len(),
                    |p| heard.get(p).copied().flatten(),
                    stop.gone(),
                );
                let done = i.map_or(0, |i| progress[i].done);
                return Err(stop.failure(step, i, done, self.rank));
            }
            // Local links: ask each peer this step waits on to ring; one that moved meanwhile
            // lets the step go on without parking.
            let waits_on = |i: usize| !held(i, now);
            if self.arm(step, progress, waits_on)? || self.bells_left() {
                continue;
            }
            let wake = match self.watch.wake_by(quiet_since) {
                Some(at) if at < deadline => at.max(now),
                _ => deadline,
            };
            // Parked at most until the next look at the links' health.
            let wake = wake
                .min(self.links_checked.saturating_add(liveness::CHECK_EVERY))
                .min(if holding { due } else { deadline })
                .max(now);
            match self.poll.poll(&mut self.events, Some(wake - now)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let t = &step[0];
                    return Err(failure(t, 0, &e, self.link_timeout));
                }
            }
            for event in self.events.iter() {
                let Some(&(peer, link)) = self.tokens.get(event.token().0) else {
                    continue;
                };
                let l = &mut self.links[peer][link];
                if l.local.is_some() && !l.gone {
                    l.ring(drain(&l.stream));
                }
                if event.is_error() || event.is_read_closed() || told(event) || l.told || l.gone {
                    // A link failed, ended, or its peer said it failed: look at every link's
                    // health at the next pass that cannot progress.
                    self.look_now = true;
                }
            }
        }
    }

    /// Reads more of the doorbells a bounded [`drain`] left on the local links; whether there
    /// were any. Then the peer rang, so the step looks again rather than parks: parked, it
    /// would not be woken by those bytes (the poll reports a socket's bytes once), nor by the
    /// peer's next doorbell if they fill the socket's buffer.
    fn bells_left(&mut self) -> bool {
        let mut any = false;
        for l in self.links.iter_mut().flatten() {
            if l.bells_left && !l.gone {
                any = true;
                l.ring(drain(&l.stream));
            }
        }
        any
    }

    /// The first link found failed, silent (see [`liveness`]) or whose peer told it that it
    /// failed (see [`notice`]), as the failure of `step`'s open transfer on it (receives
    /// first), or of the link alone when `step` has none there; a link the step has nothing on
    /// that closed while a later step sends on it fails the transfer the step is stuck on
    /// ([`FailureKind::ClosedBy`]), unless another link failed too.
    fn check_links(
        &mut self,
        step: &[Transfer<'_>],
        progress: &[Progress],
        need: usize,
        quiet: Duration,
    ) -> Option<FabricError> {
        if let Some(e) = self.check_each_link(step, progress, need) {
            return Some(e);
        }
        if quiet >= notice::GRACE {
            return self.told(&step[..need], &progress[..need]);
        }
        None
    }

    /// [`check_links`](Self::check_links) but for the notices a step looks at only after
    /// [`notice::GRACE`]: the first link found failed, silent or reset by a peer that said
    /// it failed first.
    fn check_each_link(
        &self,
        step: &[Transfer<'_>],
        progress: &[Progress],
        need: usize,
    ) -> Option<FabricError> {
        let limit = self.link_timeout;
        // A link closed by a neighbour that this step has nothing on (see below).
        let mut closed_by = None;
        for (peer, row) in self.links.iter().enumerate() {
            for (link, l) in row.iter().enumerate() {
                // A peek returns the connection's hard error only (a reset, the kernel giving
                // up), where `SO_ERROR` also returns a soft one, such as the "no route to
                // host" of a glitch the connection survives. The end of a stream is left to
                // the step that reads it: a peer may leave after its last operation, unless
                // this operation still sends to it, in this step or a later one (`later`):
                // then it failed.
                let channel = Channel::new(peer, link);
                let needed = self.later.contains(&channel)
                    || step.iter().zip(progress).any(|(t, p)| {
                        t.channel() == channel
                            && t.direction() == Direction::Send
                            && p.done < t.len()
                    });
                let mut byte = [0u8; 1];
                let kind = match l.stream.peek(&mut byte) {
                    Err(e)
                        if !matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) =>
                    {
                        // A peer that said it failed and then reset the link (it left bytes
                        // of ours unread): its notice names it better than the reset, and no
                        // grace is due, since it left this operation's bytes unread.
                        if l.local.is_none() && notice::told(&l.stream) {
                            return Some(peer_failed(&step[..need], &progress[..need], peer));
                        }
                        // A local link's peer that left after its last operation with a
                        // doorbell of ours unread resets the stream: an end like another.
                        let kind = kind_of(&e, limit);
                        (needed || l.local.is_none() || kind != FailureKind::Closed).then_some(kind)
                    }
                    // A local link's stream ends when its peer closes it; `gone` when a drain
                    // of its doorbells met the end.
                    Ok(0) if needed => Some(FailureKind::Closed),
                    _ if needed && l.local.is_some() && l.gone => Some(FailureKind::Closed),
                    _ => (liveness::silent(&l.stream, limit) == Some(true))
                        .then_some(FailureKind::Silent { limit }),
                };
                let Some(kind) = kind else {
                    continue;
                };
                let open = step
                    .iter()
                    .zip(progress)
                    .filter(|(t, p)| t.channel() == channel && p.done < t.len())
                    .min_by_key(|(t, _)| t.direction() != Direction::Recv);
                // A link this step has nothing on closed, and a later step sends on it: the
                // error is the step's wait, elsewhere, which the close ended (a neighbour that
                // timed out on the same stalled rank closes its links a moment before this
                // rank would have timed out on it too).
                // Kept while the other links are looked at: one of them may have failed first.
                if open.is_none()
                    && needed
                    && kind == FailureKind::Closed
                    && let Some(i) = most_stuck(&step[..need], |i| progress[i].done)
                {
                    closed_by = closed_by.or(Some(FabricError {
                        channel: step[i].channel(),
                        direction: step[i].direction(),
                        done: progress[i].done,
                        total: step[i].len(),
                        kind: FailureKind::ClosedBy { rank: peer, link },
                    }));
                    continue;
                }
                return Some(match open {
                    Some((t, p)) => FabricError {
                        channel,
                        direction: t.direction(),
                        done: p.done,
                        total: t.len(),
                        kind,
                    },
                    // A later step's send, when the operation still needs the link.
                    None => FabricError {
                        channel,
                        direction: if needed {
                            Direction::Send
                        } else {
                            Direction::Recv
                        },
                        done: 0,
                        total: 0,
                        kind,
                    },
                });
            }
        }
        closed_by
    }

    /// The transfer of `step` a timeout names when some are on links that are losing bytes:
    /// the most stuck of the unfinished transfers on TCP links whose sent bytes the kernel is
    /// retransmitting with nothing acknowledged for at least half of `waited`, and never less
    /// than [`LOSING_AFTER`] ([`liveness::silent`]); `None` where no such link carries one.
    ///
    /// Otherwise the least progress names the transfer, and where a host is cut off that can
    /// be a live neighbour's: on 3 ranks, a rank's receive from the cut-off rank that had
    /// begun before the cut, beside a receive from its other neighbour that had not (that
    /// neighbour waits on the cut-off rank too). Both ranks left then blame each other, and
    /// the launcher names their link. A peer that is only slow or stopped acknowledges, so its
    /// link never counts as losing.
    fn on_a_losing_link(
        &self,
        step: &[Transfer<'_>],
        progress: &[Progress],
        waited: Duration,
    ) -> Option<usize> {
        let losing = |c: Channel| {
            self.links
                .get(c.peer)
                .and_then(|row| row.get(c.link))
                .is_some_and(|l| {
                    l.local.is_none()
                        && liveness::silent(&l.stream, losing_after(waited)) == Some(true)
                })
        };
        let on_losing: smallvec::SmallVec<[bool; 8]> = step
            .iter()
            .zip(progress)
            .map(|(t, p)| p.done < t.len() && losing(t.channel()))
            .collect();
        // The others count as done, so that only the transfers on losing links compete.
        most_stuck(step, |i| {
            if on_losing[i] {
                progress[i].done
            } else {
                step[i].len()
            }
        })
    }

    /// Failure `e` of `step`, or, where `e` is a link's close whose peer said first that it
    /// failed (see [`notice`]), that peer's failure ([`peer_failed`]): the close is its
    /// consequence, and the notice says why. A rank that fails on the nuvec wire tells its
    /// peers, then closes its links; a peer whose transfer on such a link meets the close
    /// before its step has looked for notices (a send to a local link found gone, a TCP
    /// link's end or reset) names the rank that failed, as a wait ended by the notice does,
    /// instead of a bare close. As [`check_each_link`](Self::check_each_link) does for a
    /// reset it finds.
    fn announced(
        &mut self,
        e: FabricError,
        step: &[Transfer<'_>],
        progress: &[Progress],
    ) -> FabricError {
        if e.kind != FailureKind::Closed {
            return e;
        }
        let peer = e.channel.peer;
        let Some(l) = self
            .links
            .get_mut(peer)
            .and_then(|row| row.get_mut(e.channel.link))
        else {
            return e;
        };
        if l.local.is_some() {
            // A local link's notice is a doorbell that no drain may have read yet, also where
            // the link is gone because a doorbell of ours could not be written (the peer reset
            // it): the bytes queued before the end are still read.
            l.ring(drain(&l.stream));
        }
        if !l.heard_notice() {
            return e;
        }
        match most_stuck(step, |i| progress[i].done) {
            Some(_) => peer_failed(step, progress, peer),
            // The failed transfer was one held for the next step, and the step's own are done:
            // the error stays on it.
            None => FabricError {
                kind: FailureKind::PeerFailed { rank: peer },
                ..e
            },
        }
    }

    /// The first peer's notice that it failed (see [`notice`]), as [`peer_failed`].
    fn told(&mut self, step: &[Transfer<'_>], progress: &[Progress]) -> Option<FabricError> {
        let peer = self
            .links
            .iter_mut()
            .position(|row| row.iter_mut().any(Link::heard_notice))?;
        Some(peer_failed(step, progress, peer))
    }

    /// What `step` waits for at `now`, for a report that it is slow: its most stuck transfer
    /// and what is known of its link.
    fn stall(&self, step: &[Transfer<'_>], progress: &[Progress], now: Duration) -> Option<Stall> {
        let i = most_stuck(step, |i| progress[i].done)?;
        let t = &step[i];
        let c = t.channel();
        let link = self.links.get(c.peer)?.get(c.link)?;
        Some(Stall {
            channel: c,
            direction: t.direction(),
            done: progress[i].done,
            total: t.len(),
            heard_ago: self.last_heard(c.peer).map(|at| now.saturating_sub(at)),
            alive: liveness::silent(&link.stream, self.link_timeout).map(|silent| !silent),
        })
    }

    /// Arms the local links of every transfer of `step` not done yet that the step `waits_on`
    /// (see [`local`]); whether one of them can move already.
    fn arm(
        &self,
        step: &[Transfer<'_>],
        progress: &[Progress],
        waits_on: impl Fn(usize) -> bool,
    ) -> Result<bool, FabricError> {
        for (i, (t, p)) in step.iter().zip(progress).enumerate() {
            if p.done == t.len() || !waits_on(i) {
                continue;
            }
            let c = t.channel();
            let link = &self.links[c.peer][c.link];
            let Some(local) = &link.local else {
                continue;
            };
            let ready = match t.direction() {
                Direction::Send => local.arm_send(),
                Direction::Recv => local.arm_recv(),
            };
            match ready {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(e) => {
                    let e = io::Error::new(io::ErrorKind::InvalidData, e.to_string());
                    return Err(failure(t, p.done, &e, self.link_timeout));
                }
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::Channel;
    use std::net::TcpListener;

    /// Two fabrics of ranks 0 and 1 over one loopback connection (link 0 of each).
    fn pair() -> (TcpFabric, TcpFabric) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let opened = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        let zero = TcpFabric::from_streams(0, vec![vec![], vec![opened]]).expect("rank 0");
        let one = TcpFabric::from_streams(1, vec![vec![accepted], vec![]]).expect("rank 1");
        (zero, one)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_congestion_control_is_set_on_every_link_and_one_the_kernel_lacks_is_named() {
        let (zero, _one) = pair();
        let log = Log::off();
        let zero = zero.with_congestion(Some("reno"), &log).expect("reno");
        assert_eq!(zero.link_settings().1, [vec![], vec!["reno".to_owned()]]);
        let zero = zero.with_congestion(None, &log).expect("the host's");
        assert_eq!(
            zero.link_settings().1[1],
            ["reno"],
            "None leaves a link as it is"
        );
        let Err(e) = zero.with_congestion(Some("no-such-cc"), &log) else {
            panic!("a name the kernel lacks was taken");
        };
        let e = e.to_string();
        for said in [
            "rank 0",
            "rank 1, link 0",
            "\"no-such-cc\"",
            "NUVEC_DISTRIBUTED_TCP_CONGESTION",
            "this host offers",
        ] {
            assert!(e.contains(said), "{said:?} missing in {e:?}");
        }
    }

    /// Rank 1 of a pair sends `data` to rank 0 on a thread of its own, in one step of at most
    /// 30 s.
    fn send_from_rank_one(mut one: TcpFabric, data: Vec<u8>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut step = [Transfer::Send {
                channel: Channel::new(0, 0),
                data: &data,
            }];
            let deadline = one.now() + Duration::from_secs(30);
            one.run(&mut step, deadline).expect("send");
        })
    }

    /// Accepts any header.
    struct Any;

    impl crate::fabric::Check for Any {
        fn check(&self, _: &[u8]) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn a_header_moves_together_with_the_payload_after_it_on_its_channel_only() {
        let (header, payload, none) = ([1u8; 32], [2u8; 64], [0u8; 0]);
        let (mut into, mut head, mut body, mut lone) = ([0u8; 8], [0u8; 32], [0u8; 64], [0u8; 32]);
        let (right, left) = (Channel::new(1, 0), Channel::new(2, 0));
        let step = [
            Transfer::Send {
                channel: right,
                data: &header,
            },
            Transfer::Recv {
                channel: left,
                landing: Landing::Into(&mut into),
            },
            Transfer::Send {
                channel: left,
                data: &header,
            },
            Transfer::Send {
                channel: right,
                data: &payload,
            },
            Transfer::Send {
                channel: left,
                data: &none,
            },
            Transfer::Recv {
                channel: right,
                landing: Landing::Checked {
                    buf: &mut head,
                    check: &Any,
                },
            },
            Transfer::Recv {
                channel: left,
                landing: Landing::Checked {
                    buf: &mut lone,
                    check: &Any,
                },
            },
            Transfer::Recv {
                channel: right,
                landing: Landing::Into(&mut body),
            },
        ];
        let together: Vec<bool> = (0..step.len()).map(|i| together(&step, i)).collect();
        // The first header's payload follows past a receive and a send on another channel;
        // the second header is followed only by an empty send; a receive goes with the
        // receive into a buffer after it on its channel (a payload, then a header), and alone
        // where none follows.
        assert_eq!(
            together,
            [true, true, false, false, false, true, false, false]
        );
    }

    /// Refuses a header whose first byte is 9.
    struct NotNine;

    impl crate::fabric::Check for NotNine {
        fn check(&self, bytes: &[u8]) -> Result<(), String> {
            if bytes.first() == Some(&9) {
                return Err("a header of 9s".into());
            }
            Ok(())
        }
    }

    /// `fabric` (rank 1 of a [`pair`]) sends `parts` to rank 0 in one step, on a thread of its
    /// own, within 30 s.
    fn send_in_one_step(mut fabric: TcpFabric, parts: Vec<Vec<u8>>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut step: Vec<Transfer<'_>> = parts
                .iter()
                .map(|data| Transfer::Send {
                    channel: Channel::new(0, 0),
                    data,
                })
                .collect();
            let deadline = fabric.now() + Duration::from_secs(30);
            fabric.run(&mut step, deadline).expect("send");
        })
    }

    /// The failure of a step whose header [`NotNine`] refused, checked to be that mismatch.
    fn refused_as_nines(result: Result<(), FabricError>) -> FabricError {
        let e = result.expect_err("a refused header");
        assert!(
            matches!(&e.kind, FailureKind::Mismatch(what) if what == "a header of 9s"),
            "{e:?}"
        );
        e
    }

    /// Rank 1 sends a vector, a header of `mark` and a second vector on one connection; rank 0
    /// receives them as the 4-rank relay's second step does (the vector, then the forwarded
    /// call's header, judged, and vector): the step's result and what landed.
    fn forwarded(mark: u8) -> (Result<(), FabricError>, [u8; 32], Vec<u8>) {
        let (mut zero, one) = pair();
        let first: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let second: Vec<u8> = (0..4096u32).map(|i| (i % 241) as u8).collect();
        let sender = send_in_one_step(one, vec![first.clone(), vec![mark; 32], second]);
        let (mut xs, mut h, mut ys) = (
            vec![0u8; 4096 + scratch::LINE],
            [0u8; 32],
            vec![0u8; 4096 + scratch::LINE],
        );
        let (x, y) = (
            clear_of_a_page_start(&mut xs, 4096),
            clear_of_a_page_start(&mut ys, 4096),
        );
        let mut step = [
            Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Into(x),
            },
            Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Checked {
                    buf: &mut h,
                    check: &NotNine,
                },
            },
            Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Into(y),
            },
        ];
        assert!(
            (0..2).all(|i| together(&step, i)),
            "the three receives share reads"
        );
        let deadline = zero.now() + Duration::from_secs(30);
        let result = zero.run(&mut step, deadline);
        sender.join().expect("the sender");
        let x = clear_of_a_page_start(&mut xs, 4096);
        assert!(*x == first[..], "the first vector, in order");
        let y = clear_of_a_page_start(&mut ys, 4096).to_vec();
        (result, h, y)
    }

    /// `len` bytes of `buf` (at least `len` + [`scratch::LINE`] long) that do not start in a
    /// page's first cache line, so that a receive into them is read in place (not
    /// [`scratch::aliases`]); the same bytes on every call.
    fn clear_of_a_page_start(buf: &mut [u8], len: usize) -> &mut [u8] {
        let at = if scratch::aliases(buf.as_ptr()) {
            scratch::LINE
        } else {
            0
        };
        &mut buf[at..at + len]
    }

    /// Rank 1 sends a header of `mark` and a payload of 4-byte elements on one connection;
    /// rank 0 receives them as MLX's schedule's first step on the nuvec wire does (the header,
    /// judged, then the payload handed to a sink): the step's result, the header, and the
    /// sink's bytes by offset (each piece whole elements).
    fn header_and_sink(mark: u8) -> (Result<(), FabricError>, [u8; 32], Vec<u8>) {
        let (mut zero, one) = pair();
        let payload: Vec<u8> = (0..65536u32).map(|i| (i % 253) as u8).collect();
        let sender = send_in_one_step(one, vec![vec![mark; 32], payload.clone()]);
        let mut h = [0u8; 32];
        let mut got = vec![0u8; payload.len()];
        let mut sink = |offset: usize, bytes: &[u8]| {
            assert_eq!(bytes.len() % 4, 0, "whole elements");
            got[offset..offset + bytes.len()].copy_from_slice(bytes);
        };
        let mut step = [
            Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Checked {
                    buf: &mut h,
                    check: &NotNine,
                },
            },
            Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Sink {
                    len: payload.len(),
                    grain: 4,
                    sink: &mut sink,
                },
            },
        ];
        assert!(together(&step, 0), "the header shares reads with the sink");
        let deadline = zero.now() + Duration::from_secs(30);
        let result = zero.run(&mut step, deadline);
        sender.join().expect("the sender");
        (result, h, got)
    }

    #[test]
    fn a_header_and_the_sink_after_it_share_reads_and_the_sink_gets_every_byte_in_order() {
        let (result, header, got) = header_and_sink(7);
        result.expect("the step");
        assert_eq!(header, [7u8; 32]);
        let sent: Vec<u8> = (0..65536u32).map(|i| (i % 253) as u8).collect();
        assert!(got == sent, "the payload, in order");
    }

    /// Ranks 0 → 1 → 2 over loopback: each opens a connection to the next.
    fn line() -> (TcpFabric, TcpFabric, TcpFabric) {
        let connected = || {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            let opened =
                TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
            (opened, listener.accept().expect("accept").0)
        };
        let ((a, b_from_a), (b, c_from_b)) = (connected(), connected());
        let zero = TcpFabric::from_streams(0, vec![vec![], vec![a], vec![]]).expect("rank 0");
        let one =
            TcpFabric::from_streams(1, vec![vec![b_from_a], vec![], vec![b]]).expect("rank 1");
        let two = TcpFabric::from_streams(2, vec![vec![], vec![c_from_b], vec![]]).expect("rank 2");
        (zero, one, two)
    }

    #[test]
    fn a_forward_sends_each_folded_byte_on_in_order_between_the_sends_of_its_channel() {
        const N: usize = 3 << 20;
        let (mut zero, mut one, mut two) = line();
        let theirs: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
        let sender = std::thread::spawn(move || {
            let mut step = [Transfer::Send {
                channel: Channel::new(1, 0),
                data: &theirs,
            }];
            zero.run(&mut step, Duration::from_secs(20))
                .expect("rank 0");
        });
        let receiver = std::thread::spawn(move || {
            let mut got = vec![0u8; N + 32];
            let mut step = [Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Into(&mut got),
            }];
            two.run(&mut step, Duration::from_secs(20)).expect("rank 2");
            got
        });
        let mine: Vec<u8> = (0..N).map(|i| (i % 13) as u8).collect();
        let mut buf = mine.clone();
        let (before, after) = ([0xAAu8; 16], [0xBBu8; 16]);
        let mut fold = |mine: &mut [u8], theirs: &[u8]| {
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m = m.wrapping_add(*t);
            }
        };
        let (from, to) = (Channel::new(0, 0), Channel::new(2, 0));
        assert!(one.forwards(), "a fabric of TCP links forwards");
        let mut step = [
            Transfer::Send {
                channel: to,
                data: &before,
            },
            Transfer::Recv {
                channel: from,
                landing: Landing::Fold {
                    buf: &mut buf,
                    grain: 4,
                    fold: &mut fold,
                },
            },
            Transfer::Forward {
                channel: to,
                of: 1,
                len: N,
            },
            Transfer::Send {
                channel: to,
                data: &after,
            },
        ];
        one.run(&mut step, Duration::from_secs(20)).expect("rank 1");
        sender.join().expect("rank 0's thread");
        let got = receiver.join().expect("rank 2's thread");
        let folded: Vec<u8> = (0..N)
            .map(|i| ((i % 13) as u8).wrapping_add((i % 251) as u8))
            .collect();
        assert_eq!(buf, folded, "rank 1's own buffer, folded");
        assert_eq!(got[..16], before, "the send before the forward, first");
        assert!(got[16..N + 16] == folded[..], "the folded bytes, in order");
        assert_eq!(got[N + 16..], after, "the send after the forward, last");
    }

    #[test]
    fn a_forward_is_refused_before_a_byte_moves_unless_it_names_an_earlier_receive_of_its_length() {
        let (mut zero, _one) = pair();
        let mut buf = [0u8; 8];
        let mut step = [
            Transfer::Forward {
                channel: Channel::new(1, 0),
                of: 1,
                len: 8,
            },
            Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Into(&mut buf),
            },
        ];
        let e = zero.run(&mut step, Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(&e.kind, FailureKind::Invalid(what) if what.contains("an earlier receive")),
            "{e}"
        );
    }

    #[test]
    fn a_refused_header_before_a_sink_fails_the_step_as_a_mismatch() {
        let (result, header, _) = header_and_sink(9);
        assert_eq!(header, [9u8; 32]);
        refused_as_nines(result);
    }

    #[test]
    fn a_vector_then_a_forwarded_call_arrive_whole_and_in_order_in_shared_reads() {
        let (result, header, second) = forwarded(7);
        result.expect("the step");
        assert_eq!(header, [7u8; 32]);
        let sent: Vec<u8> = (0..4096u32).map(|i| (i % 241) as u8).collect();
        assert!(second == sent, "the second vector, in order");
    }

    #[test]
    fn a_refused_header_between_two_vectors_of_a_shared_read_fails_the_step_as_a_mismatch() {
        let (result, header, _) = forwarded(9);
        assert_eq!(header, [9u8; 32]);
        let e = refused_as_nines(result);
        assert_eq!(
            (e.channel, e.direction),
            (Channel::new(1, 0), Direction::Recv)
        );
    }

    #[test]
    fn a_header_and_its_payload_arrive_whole_and_in_order_over_tcp() {
        let (mut zero, one) = pair();
        let payload: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let sender = send_in_one_step(one, vec![vec![7u8; 32], payload.clone()]);
        let (mut h, mut p) = ([0u8; 32], vec![0u8; 4096]);
        let mut step = [
            Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Into(&mut h),
            },
            Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Into(&mut p),
            },
        ];
        let deadline = zero.now() + Duration::from_secs(30);
        zero.run(&mut step, deadline).expect("receive");
        sender.join().expect("the sender");
        assert_eq!(h, [7u8; 32]);
        assert!(p == payload, "the payload, in order");
    }

    /// [`pair`], with a local link carrying the connection's bytes.
    #[cfg(target_os = "linux")]
    fn local_pair() -> (TcpFabric, TcpFabric) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let opened = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        let (opener, acceptor) = local::linux::pair();
        let zero = TcpFabric::from_links(0, vec![vec![], vec![(opened, Some(opener))]]);
        let one = TcpFabric::from_links(1, vec![vec![(accepted, Some(acceptor))], vec![]]);
        (zero.expect("rank 0"), one.expect("rank 1"))
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_fabric_with_a_local_link_refuses_a_forward_as_invalid() {
        let (mut zero, _one) = local_pair();
        assert!(!zero.forwards());
        let mut buf = [0u8; 8];
        let mut step = [
            Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Into(&mut buf),
            },
            Transfer::Forward {
                channel: Channel::new(1, 0),
                of: 0,
                len: 8,
            },
        ];
        let e = zero.run(&mut step, Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(&e.kind, FailureKind::Invalid(what) if what.contains("does not forward")),
            "{e}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_local_link_delivers_whole_elements_in_order_across_its_wrap_at_any_offset() {
        // Three bytes first, so every element of the reduction's receive straddles the
        // queue's wrap somewhere; more than the queue holds, so the sender parks for room.
        let (mut zero, one) = local_pair();
        let len = 2 * local::CAPACITY + 4 * 1001;
        let data: Vec<u8> = (0..3 + len).map(|i| (i * 13 % 251) as u8).collect();
        let sender = send_from_rank_one(one, data.clone());
        let mut head = [0u8; 3];
        let mut step = [Transfer::Recv {
            channel: Channel::new(1, 0),
            landing: Landing::Into(&mut head),
        }];
        let deadline = zero.now() + Duration::from_secs(30);
        zero.run(&mut step, deadline).expect("the first bytes");
        let mut got = vec![0u8; len];
        let mut pieces = 0;
        let mut sink = |offset: usize, bytes: &[u8]| {
            assert_eq!(bytes.len() % 4, 0, "a piece of whole elements");
            got[offset..offset + bytes.len()].copy_from_slice(bytes);
            pieces += 1;
        };
        let mut step = [Transfer::Recv {
            channel: Channel::new(1, 0),
            landing: Landing::Sink {
                len,
                grain: 4,
                sink: &mut sink,
            },
        }];
        zero.run(&mut step, deadline).expect("the elements");
        sender.join().expect("the sender");
        assert_eq!(&head, &data[..3]);
        assert!(got == data[3..], "the elements, in order");
        assert!(pieces >= 2, "{pieces} pieces");
    }

    /// The failure of rank 0's receive of 8 bytes from `peer` (link 0, a 30 s deadline), which
    /// must come within 5 s.
    fn receive_fails_soon(zero: &mut TcpFabric, peer: usize) -> FabricError {
        let mut buf = [0u8; 8];
        let mut step = [Transfer::Recv {
            channel: Channel::new(peer, 0),
            landing: Landing::Into(&mut buf),
        }];
        let started = Instant::now();
        let deadline = zero.now() + Duration::from_secs(30);
        let e = zero.run(&mut step, deadline).expect_err("a failure");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{e} after {:?}",
            started.elapsed()
        );
        e
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_peer_that_closes_a_local_link_fails_a_waiting_receive_as_closed() {
        // The queue stays empty, so only the TCP connection's end can tell the receive: it
        // comes through the poll the receive parks in.
        let (mut zero, one) = local_pair();
        drop(one);
        let e = receive_fails_soon(&mut zero, 1);
        assert_eq!(e.kind, FailureKind::Closed, "{e}");
        assert_eq!(e.peer(), 1, "{e}");
    }

    /// Rank 0 of a [`local_pair`] after rank 1 sent it `data` and left owing it a ring: rank
    /// 1's "writer waiting" flag is set (armed, never parked) and a doorbell of rank 0 lies
    /// unread in rank 1's socket, so that rank 1's end resets the connection when it goes,
    /// and rank 0's next doorbell write fails.
    #[cfg(target_os = "linux")]
    fn sender_left_owing_a_ring(data: &[u8]) -> TcpFabric {
        let (zero, mut one) = local_pair();
        let mut send = [Transfer::Send {
            channel: Channel::new(0, 0),
            data,
        }];
        let deadline = one.now() + Duration::from_secs(10);
        one.run(&mut send, deadline).expect("send");
        let sender = &one.links[0][0];
        let local = sender.local.as_ref().expect("a local link");
        assert_eq!(
            local.arm_send(),
            Ok(true),
            "armed, with room: it never parks"
        );
        doorbell(&zero.links[1][0].stream).expect("a doorbell for rank 1");
        // Until the doorbell is in rank 1's socket (bounded by the timeout).
        let socket = socket2::SockRef::from(&sender.stream);
        socket.set_nonblocking(false).expect("blocking");
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a timeout");
        let mut byte = [std::mem::MaybeUninit::new(0u8)];
        assert_eq!(socket.peek(&mut byte).expect("the doorbell arrives"), 1);
        drop(one);
        zero
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_receive_returns_its_bytes_when_its_sender_left_owing_a_ring() {
        let data = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let mut zero = sender_left_owing_a_ring(&data);
        let mut got = [0u8; 8];
        let mut step = [Transfer::Recv {
            channel: Channel::new(1, 0),
            landing: Landing::Into(&mut got),
        }];
        let deadline = zero.now() + Duration::from_secs(10);
        zero.run(&mut step, deadline)
            .expect("every byte arrived before the peer left");
        assert_eq!(got, data);
        // The next receive has no bytes to get: the peer is gone.
        let mut more = [0u8; 4];
        let mut step = [Transfer::Recv {
            channel: Channel::new(1, 0),
            landing: Landing::Into(&mut more),
        }];
        let e = zero.run(&mut step, deadline).expect_err("the peer left");
        assert_eq!(e.kind, FailureKind::Closed, "{e}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_reduced_receive_returns_its_bytes_when_its_sender_left_owing_a_ring() {
        let data = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let mut zero = sender_left_owing_a_ring(&data);
        let mut got = Vec::new();
        let mut sink = |offset: usize, bytes: &[u8]| {
            assert_eq!(offset, got.len(), "in order");
            got.extend_from_slice(bytes);
        };
        let mut step = [Transfer::Recv {
            channel: Channel::new(1, 0),
            landing: Landing::Sink {
                len: 8,
                grain: 4,
                sink: &mut sink,
            },
        }];
        let deadline = zero.now() + Duration::from_secs(10);
        zero.run(&mut step, deadline)
            .expect("every byte arrived before the peer left");
        assert_eq!(got, data);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_step_whose_peer_rings_without_end_still_ends_at_its_deadline() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let opened = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (mut accepted, _) = listener.accept().expect("accept");
        let (opener, _acceptor) = local::linux::pair();
        let mut zero =
            TcpFabric::from_links(0, vec![vec![], vec![(opened, Some(opener))]]).expect("rank 0");
        // The peer fills its doorbell's socket buffers, then keeps writing doorbells as fast as
        // it can, and never a byte into the queue.
        let bells = [1u8; 64 * 1024];
        accepted.set_nonblocking(true).expect("non-blocking");
        loop {
            match io::Write::write(&mut accepted, &bells) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("a doorbell: {e}"),
            }
        }
        accepted.set_nonblocking(false).expect("blocking");
        let stop = Arc::new(AtomicBool::new(false));
        let ringer = {
            let stop = stop.clone();
            accepted
                .set_write_timeout(Some(Duration::from_millis(100)))
                .expect("a timeout");
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match io::Write::write(&mut accepted, &bells) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                        Err(_) => break,
                    }
                }
            })
        };
        let (done, ended) = std::sync::mpsc::channel();
        let receiver = std::thread::spawn(move || {
            let mut buf = [0u8; 8];
            let mut step = [Transfer::Recv {
                channel: Channel::new(1, 0),
                landing: Landing::Into(&mut buf),
            }];
            let started = Instant::now();
            let deadline = zero.now() + Duration::from_millis(200);
            let result = zero.run(&mut step, deadline);
            let _ = done.send((result.err().map(|e| e.kind), started.elapsed()));
        });
        let ended = ended.recv_timeout(Duration::from_secs(30));
        stop.store(true, Ordering::Relaxed);
        ringer.join().expect("the ringer");
        receiver.join().expect("the receiver");
        match ended {
            Ok((Some(FailureKind::TimedOut { .. }), took)) => {
                assert!(
                    took < Duration::from_secs(1),
                    "a step of 200 ms took {took:?}"
                )
            }
            Ok(other) => panic!("the step ended without timing out: {other:?}"),
            Err(_) => panic!("the step ran 30 s past its deadline of 200 ms"),
        }
    }

    #[test]
    fn a_receive_into_a_page_start_is_bounced_through_the_scratch_only_where_that_copy_is_slow() {
        for slow in [true, false] {
            let (mut zero, one) = pair();
            let len = 3 * scratch::PIECE + 5;
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let sender = send_from_rank_one(one, data.clone());
            // 16 bytes into a page, as a large heap buffer starts.
            let mut backing = vec![0u8; len + 2 * scratch::PAGE];
            let start = backing.as_ptr().align_offset(scratch::PAGE) + 16;
            let into = &mut backing[start..start + len];
            let largest = scratch::tests::with_slow_aliased_copy(slow, || {
                let mut step = [Transfer::Recv {
                    channel: Channel::new(1, 0),
                    landing: Landing::Into(&mut *into),
                }];
                limits::take_largest();
                let deadline = zero.now() + Duration::from_secs(30);
                zero.run(&mut step, deadline).expect("recv");
                limits::take_largest()
            });
            sender.join().expect("the sender");
            assert!(*into == data[..], "slow {slow}: every byte, in order");
            assert!(
                largest <= scratch::PIECE,
                "slow {slow}: a read of {largest} bytes"
            );
            let bounced = !zero.links[1][0].scratch.bytes().is_empty();
            assert_eq!(bounced, slow, "read through the scratch");
        }
    }

    #[test]
    fn no_socket_call_of_a_transfer_over_a_gibibyte_asks_for_more_than_one() {
        // macOS fails a socket call of more than INT_MAX bytes with EINVAL; Linux returns a
        // short count, so what is checked here is the length each call asks for. The zeroed
        // source is never written (its pages stay the kernel's shared zero page).
        let len = limits::MAX_IO + (1 << 20) + 7;
        let (mut zero, mut one) = pair();
        let sender = std::thread::spawn(move || {
            let data = vec![0u8; len];
            let mut step = [Transfer::Send {
                channel: Channel::new(0, 0),
                data: &data,
            }];
            limits::take_largest();
            let deadline = one.now() + Duration::from_secs(120);
            one.run(&mut step, deadline).expect("send");
            limits::take_largest()
        });
        // Past the first cache line of a page, so that the receive reads straight into place
        // (not bounced through the scratch) on every CPU.
        let mut backing = vec![1u8; len + 8192];
        let start = backing.as_ptr().align_offset(4096) + 128;
        let into = &mut backing[start..start + len];
        let mut step = [Transfer::Recv {
            channel: Channel::new(1, 0),
            landing: Landing::Into(&mut *into),
        }];
        limits::take_largest();
        let deadline = zero.now() + Duration::from_secs(120);
        zero.run(&mut step, deadline).expect("recv");
        let received = limits::take_largest();
        let sent = sender.join().expect("the sender");
        // The send's first call asks for everything, clamped to exactly 1 GiB; a receive into
        // place asks for a piece at a time.
        assert_eq!(sent, limits::MAX_IO, "the largest send call");
        assert_eq!(received, scratch::PIECE, "the largest receive call");
        assert!(into.iter().all(|&b| b == 0), "every byte arrived");
    }

    #[test]
    fn a_sink_receive_that_is_not_a_whole_number_of_grains_is_invalid_not_a_closed_peer() {
        let (mut zero, mut one) = pair();
        let deadline = one.now() + Duration::from_secs(10);
        // The peer sends the 5 bytes the receive asks for.
        let data = [1u8, 2, 3, 4, 5];
        let mut send = [Transfer::Send {
            channel: Channel::new(0, 0),
            data: &data,
        }];
        one.run(&mut send, deadline).expect("send");
        let mut delivered = 0;
        let mut sink = |_: usize, bytes: &[u8]| delivered += bytes.len();
        let mut recv = [Transfer::Recv {
            channel: Channel::new(1, 0),
            landing: Landing::Sink {
                len: 5,
                grain: 4,
                sink: &mut sink,
            },
        }];
        let deadline = zero.now() + Duration::from_secs(10);
        let e = zero
            .run(&mut recv, deadline)
            .expect_err("5 bytes of 4-byte grains");
        match &e.kind {
            FailureKind::Invalid(what) => {
                assert!(what.contains("whole number of grains"), "{e}")
            }
            other => panic!("blamed on the peer: {other:?} ({e})"),
        }
        assert_eq!((e.done, e.total, e.peer()), (0, 5, 1), "{e}");
        assert_eq!(delivered, 0, "nothing moves before the check");
    }

    #[test]
    fn every_connection_of_a_fabric_sends_without_nagle_delay() {
        // JACCL's TCP cables and the ring's connections both come through `from_streams`; a
        // cable left with Nagle's algorithm stalls small messages for tens of milliseconds.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let opened = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        let fabric = TcpFabric::from_streams(0, vec![vec![], vec![opened, accepted]])
            .expect("a fabric over two streams");
        for link in &fabric.links[1] {
            assert!(
                link.stream.nodelay().expect("TCP_NODELAY"),
                "a link without TCP_NODELAY"
            );
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn every_connection_of_a_fabric_caps_its_retransmission_backoff_on_linux() {
        // A glitch shorter than the timeout must not outlast it waiting for a retry.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let opened = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        let fabric = TcpFabric::from_streams(0, vec![vec![], vec![opened, accepted]])
            .expect("a fabric over two streams");
        for link in &fabric.links[1] {
            let socket = socket2::SockRef::from(&link.stream);
            assert!(
                socket
                    .tcp_thin_linear_timeouts()
                    .expect("TCP_THIN_LINEAR_TIMEOUTS"),
                "a link without linear timeouts for thin streams"
            );
            // Kernels before 6.15 have no cap to set.
            if let Some(ms) = connect::retransmission_backoff_cap(&link.stream) {
                assert_eq!(ms, 1000, "the retransmission backoff cap");
            }
        }
    }

    /// Fills `stream`'s send window (its peer reads nothing) and makes its kernel reset it
    /// with `ETIMEDOUT` a second later (`TCP_USER_TIMEOUT` applies to a zero window): a link
    /// the kernel gives up on, without root or a cable to pull.
    #[cfg(target_os = "linux")]
    fn give_up_in_a_second(stream: &TcpStream) {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let ms: libc::c_int = 1000;
        // SAFETY: the descriptor is the open socket `stream` borrows for the call, and the
        // value is a live c_int whose size is passed with it.
        let set = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_USER_TIMEOUT,
                (&raw const ms).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "TCP_USER_TIMEOUT");
        stream.set_nonblocking(true).expect("non-blocking");
        let chunk = vec![0u8; 1 << 16];
        loop {
            match (&*stream).write(&chunk) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the window: {e}"),
            }
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_link_the_kernel_gives_up_on_fails_a_step_that_waits_on_another_link_naming_its_peer() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        let to_one = TcpStream::connect(address).expect("connect");
        let (_one, _) = listener.accept().expect("accept");
        let to_two = TcpStream::connect(address).expect("connect");
        let (_two, _) = listener.accept().expect("accept");
        give_up_in_a_second(&to_one);
        let mut zero =
            TcpFabric::from_streams(0, vec![vec![], vec![to_one], vec![to_two]]).expect("rank 0");
        // The step waits on rank 2 only, which is alive and sends nothing.
        let mut buf = [0u8; 8];
        let mut step = [Transfer::Recv {
            channel: Channel::new(2, 0),
            landing: Landing::Into(&mut buf),
        }];
        let started = Instant::now();
        let deadline = zero.now() + Duration::from_secs(20);
        let e = zero
            .run(&mut step, deadline)
            .expect_err("rank 1's link is dead");
        assert!(
            matches!(e.kind, FailureKind::Silent { .. }),
            "not a silent link: {e}"
        );
        assert_eq!(e.peer(), 1, "{e}");
        assert!(e.to_string().contains("went silent"), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    /// Rank 0's step, waiting on rank 2 only, against rank 1's notice that it failed: the
    /// step fails naming the transfer it waited on and rank 1, once it has waited the notice's
    /// grace, long before its deadline, and while rank 1 still holds its link open.
    #[test]
    fn a_peer_that_says_it_failed_fails_a_step_that_waits_on_another_link_naming_both() {
        let (mut zero, mut one, _two) = three();
        one.tell_failed();
        let e = receive_fails_soon(&mut zero, 2);
        assert_eq!(e.kind, FailureKind::PeerFailed { rank: 1 }, "{e}");
        assert_eq!(e.peer(), 2, "the transfer it waited on: {e}");
        drop(one);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_local_link_whose_peer_says_it_failed_fails_a_waiting_receive_before_the_deadline() {
        let (mut zero, mut one) = local_pair();
        one.tell_failed();
        let e = receive_fails_soon(&mut zero, 1);
        assert_eq!(e.kind, FailureKind::PeerFailed { rank: 1 }, "{e}");
        assert_eq!(e.peer(), 1, "{e}");
        drop(one);
    }

    /// A send to a local link whose peer said it failed and closed it fails at once, naming
    /// the peer's failure rather than a bare close (what a rank that starts its operation
    /// after a neighbour failed meets, before any of its waits has looked for notices).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_send_to_a_local_link_whose_peer_said_it_failed_and_left_names_the_failure() {
        let (mut zero, mut one) = local_pair();
        one.tell_failed();
        drop(one);
        // The wait that reads the notice, and the link's end after it.
        let e = receive_fails_soon(&mut zero, 1);
        assert_eq!(e.kind, FailureKind::PeerFailed { rank: 1 }, "{e}");
        let data = [7u8; 32];
        let mut step = [Transfer::Send {
            channel: Channel::new(1, 0),
            data: &data,
        }];
        let deadline = zero.now() + Duration::from_secs(30);
        let e = zero.run(&mut step, deadline).expect_err("rank 1 is gone");
        assert_eq!(e.kind, FailureKind::PeerFailed { rank: 1 }, "{e}");
        assert_eq!(
            (e.direction, e.done, e.total),
            (Direction::Send, 0, 32),
            "{e}"
        );
        assert!(e.to_string().contains("rank 1 failed"), "{e}");
    }

    /// The same over TCP: a send to a peer that said it failed and closed its link meets the
    /// link's reset (or its look at the links finds it first), and either way names the
    /// failure.
    #[test]
    fn a_send_to_a_tcp_link_whose_peer_said_it_failed_and_left_names_the_failure() {
        let (mut zero, mut one, _two) = three();
        one.tell_failed();
        drop(one);
        // More than the socket buffers hold, so that the send meets the reset.
        let data = vec![7u8; 16 << 20];
        let mut step = [Transfer::Send {
            channel: Channel::new(1, 0),
            data: &data,
        }];
        let started = Instant::now();
        let deadline = zero.now() + Duration::from_secs(30);
        let e = zero.run(&mut step, deadline).expect_err("rank 1 is gone");
        assert_eq!(e.kind, FailureKind::PeerFailed { rank: 1 }, "{e}");
        assert_eq!((e.direction, e.peer()), (Direction::Send, 1), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    /// `fabric` sends `bytes` to rank 0 on its link 0, in one step of at most 30 s.
    fn send_bytes(fabric: &mut TcpFabric, bytes: &[u8]) {
        let mut step = [Transfer::Send {
            channel: Channel::new(0, 0),
            data: bytes,
        }];
        let deadline = fabric.now() + Duration::from_secs(30);
        fabric.run(&mut step, deadline).expect("send to rank 0");
    }

    /// Ranks 0, 1 and 2 over loopback: rank 0 holds a link to each of the others, which hold
    /// only their link to rank 0.
    fn three() -> (TcpFabric, TcpFabric, TcpFabric) {
        let (zero, one, two) = rank_zero_of_three();
        let one = TcpFabric::from_streams(1, vec![vec![one], vec![], vec![]]).expect("rank 1");
        let two = TcpFabric::from_streams(2, vec![vec![two], vec![], vec![]]).expect("rank 2");
        (zero, one, two)
    }

    /// Rank 0's fabric of [`three`], with ranks 1's and 2's ends of its links as plain streams.
    fn rank_zero_of_three() -> (TcpFabric, TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        let to_one = TcpStream::connect(address).expect("connect");
        let (one, _) = listener.accept().expect("accept");
        let to_two = TcpStream::connect(address).expect("connect");
        let (two, _) = listener.accept().expect("accept");
        let zero =
            TcpFabric::from_streams(0, vec![vec![], vec![to_one], vec![to_two]]).expect("rank 0");
        (zero, one, two)
    }

    /// A step that waits to receive `bytes` on `wait`, then, ahead of the next step, sends
    /// `ours` to `to` and receives its header into `theirs`, judged by `check`.
    fn ahead_step<'a>(
        wait: Channel,
        bytes: &'a mut [u8],
        to: Channel,
        ours: &'a [u8],
        theirs: &'a mut [u8],
        check: &'a dyn crate::fabric::Check,
    ) -> [Transfer<'a>; 3] {
        [
            Transfer::Recv {
                channel: wait,
                landing: Landing::Into(bytes),
            },
            Transfer::Send {
                channel: to,
                data: ours,
            },
            Transfer::Recv {
                channel: to,
                landing: Landing::Checked { buf: theirs, check },
            },
        ]
    }

    #[test]
    fn transfers_that_go_ahead_are_left_to_the_next_step_when_the_step_ends_within_the_hold() {
        let (mut zero, mut one) = pair();
        let to_one = Channel::new(1, 0);
        // Rank 1 sends its bytes and its header at once; rank 0's step waits for the bytes
        // only, and neither sends its header nor reads rank 1's within the hold.
        let peer = std::thread::spawn(move || {
            let (bytes, header) = ([7u8; 4], [5u8; 32]);
            let mut sends = [
                Transfer::Send {
                    channel: Channel::new(0, 0),
                    data: &bytes,
                },
                Transfer::Send {
                    channel: Channel::new(0, 0),
                    data: &header,
                },
            ];
            let deadline = one.now() + Duration::from_secs(30);
            one.run(&mut sends, deadline).expect("rank 1 sends");
            let (mut header, mut payload) = ([0u8; 32], [0u8; 8]);
            let mut recvs = [
                Transfer::Recv {
                    channel: Channel::new(0, 0),
                    landing: Landing::Into(&mut header),
                },
                Transfer::Recv {
                    channel: Channel::new(0, 0),
                    landing: Landing::Into(&mut payload),
                },
            ];
            one.run(&mut recvs, deadline).expect("rank 1 receives");
            (header, payload)
        });
        let (ours, payload) = ([3u8; 32], [4u8; 8]);
        let (mut bytes, mut theirs) = ([0u8; 4], [0u8; 32]);
        let mut moved = [usize::MAX; 2];
        {
            let mut step = ahead_step(to_one, &mut bytes, to_one, &ours, &mut theirs, &Any);
            let ahead = Ahead {
                from: 1,
                hold: Duration::from_secs(30),
            };
            let deadline = zero.now() + Duration::from_secs(30);
            zero.run_ahead(&mut step, ahead, deadline, &mut moved)
                .expect("rank 0's step");
        }
        assert_eq!(bytes, [7; 4]);
        assert_eq!(moved, [0, 0], "nothing went ahead within the hold");
        assert_eq!(theirs, [0; 32], "rank 1's header was not read");
        // The next step sends the header with its payload and reads rank 1's.
        let mut step = [
            Transfer::Send {
                channel: to_one,
                data: &ours,
            },
            Transfer::Send {
                channel: to_one,
                data: &payload,
            },
            Transfer::Recv {
                channel: to_one,
                landing: Landing::Into(&mut theirs),
            },
        ];
        let deadline = zero.now() + Duration::from_secs(30);
        zero.run(&mut step, deadline).expect("rank 0's next step");
        assert_eq!(theirs, [5; 32]);
        let (header, got) = peer.join().expect("rank 1");
        assert_eq!(
            (header, got),
            (ours, payload),
            "the header came first, then its payload"
        );
    }

    #[test]
    fn a_step_held_up_past_the_hold_sends_and_judges_what_goes_ahead() {
        let (mut zero, mut one, mut two) = three();
        let (to_one, to_two) = (Channel::new(1, 0), Channel::new(2, 0));
        let (heard, hear) = std::sync::mpsc::channel();
        // Rank 1 sends its header at once and waits for rank 0's, which rank 0 sends only once
        // its step has waited the hold; rank 2 sends the bytes that step waits for only after
        // that, so the step ends only if it sent its header while held up.
        let first = std::thread::spawn(move || {
            let header = [5u8; 32];
            let mut theirs = [0u8; 32];
            let mut step = [
                Transfer::Send {
                    channel: Channel::new(0, 0),
                    data: &header,
                },
                Transfer::Recv {
                    channel: Channel::new(0, 0),
                    landing: Landing::Into(&mut theirs),
                },
            ];
            let deadline = one.now() + Duration::from_secs(30);
            one.run(&mut step, deadline).expect("rank 1");
            heard.send(()).expect("rank 2 waits");
            theirs
        });
        let second = std::thread::spawn(move || {
            hear.recv_timeout(Duration::from_secs(30))
                .expect("rank 1 heard rank 0's header");
            send_bytes(&mut two, &[8u8; 4]);
            two
        });
        let hold = Duration::from_millis(20);
        let (ours, mut bytes, mut theirs) = ([3u8; 32], [0u8; 4], [0u8; 32]);
        let mut moved = [0usize; 2];
        let started = zero.now();
        {
            let mut step = ahead_step(to_two, &mut bytes, to_one, &ours, &mut theirs, &Any);
            let deadline = zero.now() + Duration::from_secs(30);
            zero.run_ahead(&mut step, Ahead { from: 1, hold }, deadline, &mut moved)
                .expect("rank 0's step");
        }
        assert!(zero.now() - started >= hold, "{:?}", zero.now() - started);
        assert_eq!((bytes, moved, theirs), ([8; 4], [32, 32], [5; 32]));
        assert_eq!(first.join().expect("rank 1"), ours);
        drop(second.join().expect("rank 2"));
    }

    #[test]
    fn a_header_that_goes_ahead_is_judged_once_the_step_is_held_up() {
        let (mut zero, mut one, two) = three();
        let to_one = Channel::new(1, 0);
        send_bytes(&mut one, &[9u8; 32]);
        let hold = Duration::from_millis(20);
        let (ours, mut bytes, mut theirs) = ([3u8; 32], [0u8; 4], [0u8; 32]);
        let mut moved = [0usize; 2];
        let started = zero.now();
        let to_two = Channel::new(2, 0);
        let mut step = ahead_step(to_two, &mut bytes, to_one, &ours, &mut theirs, &NotNine);
        let deadline = zero.now() + Duration::from_secs(5);
        let e = zero
            .run_ahead(&mut step, Ahead { from: 1, hold }, deadline, &mut moved)
            .expect_err("a refused header");
        let waited = zero.now() - started;
        assert!(matches!(e.kind, FailureKind::Mismatch(_)), "{e}");
        assert_eq!(e.peer(), 1, "{e}");
        assert!(waited >= hold, "judged after {waited:?}, within the hold");
        drop(two);
    }

    #[test]
    fn a_step_whose_transfers_ahead_do_not_fit_is_invalid_before_anything_moves() {
        let (mut zero, _one) = pair();
        let data = [1u8; 4];
        let mut step = [Transfer::Send {
            channel: Channel::new(1, 0),
            data: &data,
        }];
        let deadline = zero.now() + Duration::from_secs(5);
        let ahead = Ahead {
            from: 0,
            hold: Duration::ZERO,
        };
        let e = zero
            .run_ahead(&mut step, ahead, deadline, &mut [])
            .expect_err("one transfer ahead, no count for it");
        assert!(matches!(e.kind, FailureKind::Invalid(_)), "{e}");
        assert_eq!(e.done, 0);
    }

    #[test]
    fn a_neighbour_that_closes_a_link_a_later_step_sends_on_fails_the_wait_elsewhere_naming_both() {
        let (mut zero, one, _two) = three();
        // Rank 0 waits for rank 2, which sends nothing; a later step sends to rank 1, which
        // closes its link (as a neighbour that timed out on the same rank does).
        zero.sends_later(&[Channel::new(1, 0)]);
        drop(one);
        let e = receive_fails_soon(&mut zero, 2);
        assert_eq!(e.kind, FailureKind::ClosedBy { rank: 1, link: 0 }, "{e}");
        assert_eq!((e.peer(), e.direction), (2, Direction::Recv), "{e}");
        assert!(!e.is_timeout(), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("rank 2") && text.contains("closed by rank 1"),
            "{text}"
        );
    }

    #[test]
    fn a_reset_of_a_link_no_step_sends_on_is_named_on_that_link_not_blamed_on_the_wait() {
        let (mut zero, one, _two) = rank_zero_of_three();
        // Rank 1 resets its link (it closes with no linger): this operation sends nothing to
        // it, so the error names that link, and does not say the operation still needs it.
        socket2::SockRef::from(&one)
            .set_linger(Some(Duration::ZERO))
            .expect("linger");
        drop(one);
        let e = receive_fails_soon(&mut zero, 2);
        assert_eq!((e.kind.clone(), e.peer()), (FailureKind::Closed, 1), "{e}");
    }

    #[test]
    fn a_link_counts_as_losing_after_half_the_wait_and_never_after_less_than_a_second() {
        assert_eq!(
            losing_after(Duration::from_secs(3)),
            Duration::from_millis(1500)
        );
        assert_eq!(
            losing_after(Duration::from_secs(30)),
            Duration::from_secs(15)
        );
        // A step that began just before the deadline: a live link can sit that long on a
        // retransmission timer.
        assert_eq!(losing_after(Duration::from_secs(2)), LOSING_AFTER);
        assert_eq!(losing_after(Duration::from_millis(10)), LOSING_AFTER);
        assert_eq!(losing_after(Duration::ZERO), LOSING_AFTER);
    }
}
