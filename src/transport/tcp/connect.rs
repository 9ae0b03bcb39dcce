//! The socket driver of the ring's connection setup (reference §2.3): it binds the
//! listeners, then does what [`Setup`](super::setup::Setup) says, in MLX's order, and reports
//! back what happened; every decision (which link next, retries and back-off, the deadline,
//! strangers) is the state machine's, so this file only holds socket calls.
//!
//! No bytes are exchanged without a key (MLX's ring has no handshake). With a key
//! ([`crate::transport::tcp::auth`]), an opener runs its half of the handshake blocking, bounded
//! by the time the setup gives it; an acceptor runs every accepted connection's half without
//! blocking, beside the others, and the setup drops the ones that fail or run out of time.
//!
//! Which connections are *native* (both ends are ranks of this crate that may speak the nuvec
//! wire) is found out here too, for the ring's agreement on a wire (`ring::agree`): without a
//! key by the probe ([`super::probe`], a UDP datagram beside the TCP port before each
//! connect, answered while this driver waits for anything), with a key by the handshake,
//! whose hello and reply carry each side's choice. A sub-group's ring (`split`) does neither:
//! it inherits its parent's wire.
//!
//! About 1000 lines because it is every socket call of setup in one place (listeners, connects,
//! both halves of the handshake's I/O, the socket options every link gets), so that the state
//! machine in `setup.rs` holds no I/O at all; the probes' socket calls are the driver's too,
//! in `connect/probing.rs`.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, UdpSocket};
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::config::hostfile;
use crate::config::log::Log;
use crate::config::options::WireChoice;
use crate::error::Error;
use crate::limits;
use crate::transport::tcp::auth::{self, Acceptor, Key, Opener};
use crate::transport::tcp::local::{LocalLink, Offers, Proposal};
use crate::transport::tcp::probe::{Answerer, NotNative};
use crate::transport::tcp::setup::{Action, Conn, Event, Failure, Note, Setup};

/// The sockets of one rank of a ring: `right[c]` was opened by this rank to its right
/// neighbour's address c, `left[c]` was accepted on this rank's own address c.
#[derive(Debug)]
pub(crate) struct RingSockets {
    pub(crate) right: Vec<(TcpStream, Option<LocalLink>)>,
    pub(crate) left: Vec<(TcpStream, Option<LocalLink>)>,
    /// Whether each connection of `right` is native (else why not).
    pub(crate) right_native: Vec<Result<(), NotNative>>,
    /// Whether each connection of `left` is native (else why not).
    pub(crate) left_native: Vec<Result<(), NotNative>>,
}

/// How a ring formed from a hostfile finds out which connections are native: the wire this
/// rank may speak, the job's identity, and (without a key, unless asked for MLX's wire) the
/// UDP socket bound beside each listener, `None` where it could not be bound.
pub(crate) struct Negotiation {
    pub(crate) choice: WireChoice,
    pub(crate) job: u64,
    pub(crate) udp: Vec<Option<UdpSocket>>,
    /// When the listeners, bound but not listening, start to listen (`None`: they listen
    /// already).
    pub(crate) listen_at: Option<Instant>,
}

/// The first poll token of the UDP sockets beside the listeners (far above the listeners'
/// and the accepted connections' tokens).
const UDP_TOKEN: usize = usize::MAX / 2;
/// The poll token of the socket an opener probes from.
const PROBE_TOKEN: usize = usize::MAX / 2 - 1;
/// The listeners' backlog.
const BACKLOG: i32 = 16;
/// The most datagrams answered in one go, so that a flood cannot hold up setup.
const MAX_DATAGRAMS: usize = 64;

/// Connects rank `rank` of the ring over `nodes` (per rank its addresses) within `timeout`.
pub(crate) fn connect_ring(
    nodes: &[Vec<String>],
    rank: usize,
    timeout: Duration,
    key: Option<&Key>,
    local: bool,
    wire: WireChoice,
    log: &Log,
) -> Result<RingSockets, Error> {
    let fail = |what: String| Error::Connect { rank, what };
    // Probes are answered by ranks that may speak the nuvec wire, in jobs without a key (a
    // key's handshake carries the choice instead).
    let probing = wire != WireChoice::Mlx && key.is_none();
    // Bind every UDP socket first, then every TCP socket, so that a left neighbour that
    // connects early finds them; the listening starts in the driver, the probe's quiet time
    // after the UDP sockets were bound (see `probe`), answering probes meanwhile.
    let mut listeners = Vec::with_capacity(nodes[rank].len());
    let mut udp = Vec::with_capacity(nodes[rank].len());
    for address in &nodes[rank] {
        let (_, listener, socket) = bind(address, probing).map_err(&fail)?;
        listeners.push((address.clone(), listener));
        udp.push(match socket {
            Some(Ok(socket)) => Some(socket),
            Some(Err(e)) => {
                log.warn(format_args!(
                    "cannot bind UDP on {address} to answer the nuvec wire's probe ({e}): its \
                     connection will speak MLX's wire"
                ));
                None
            }
            None => None,
        });
    }
    let listen_at = if udp.iter().any(Option::is_some) {
        limits::deadline(Instant::now(), crate::transport::tcp::probe::QUIET)
    } else {
        Instant::now()
    };
    let negotiation = Negotiation {
        choice: wire,
        job: crate::transport::tcp::probe::job_identity(nodes),
        udp,
        listen_at: Some(listen_at),
    };
    connect_ring_on(
        nodes,
        rank,
        listeners,
        timeout,
        key,
        local,
        Some(negotiation),
        log,
    )
}

/// [`connect_ring`] over `listeners`, already bound on this rank's addresses `nodes[rank]`
/// (a sub-group's ring binds ephemeral ports before it can tell its neighbours their numbers),
/// finding out which connections are native as `negotiation` says (`None`: none is, as in a
/// sub-group's ring, which inherits its parent's wire).
#[allow(
    clippy::too_many_arguments,
    reason = "the setup's inputs, each from a different source; bundling them would only move the list"
)]
pub(crate) fn connect_ring_on(
    nodes: &[Vec<String>],
    rank: usize,
    listeners: Vec<(String, TcpListener)>,
    timeout: Duration,
    key: Option<&Key>,
    local: bool,
    negotiation: Option<Negotiation>,
    log: &Log,
) -> Result<RingSockets, Error> {
    let fail = |what: String| Error::Connect { rank, what };
    let links = nodes[rank].len();
    // Offered before the first connection can arrive (see `local`'s rendezvous).
    let offers = local.then(|| {
        let addrs: Vec<Option<SocketAddr>> =
            listeners.iter().map(|(_, l)| l.local_addr().ok()).collect();
        Offers::bind(&addrs)
    });
    let started = Instant::now();
    let setup = Setup::new(rank, nodes.len(), links, key.is_some(), started, timeout);
    let until = limits::deadline(started, timeout);
    Driver::new(setup, nodes, key, log, offers, negotiation)
        .and_then(|driver| driver.run(listeners, until))
        .map_err(fail)
}

/// Socket options of every connection of a [`TcpFabric`](super::TcpFabric) (the ring's and
/// JACCL's over TCP): no Nagle delay (MLX's; without it a small message can wait for the
/// peer's delayed acknowledgement, tens of milliseconds), and the link liveness of link
/// timeout `link_timeout` (keepalive; see [`liveness`](super::liveness)) so a dead host or a
/// cut cable fails the group within it.
///
/// On Linux, a glitch shorter than the timeout (a cable out and back) should not outlast it
/// for want of a retransmission: TCP's exponential backoff (0.2, 0.4, 0.8 … s) can put the
/// first retry after the link is back seconds later, past the deadline. So the backoff is
/// capped at 1 s, or a fifteenth of the link timeout when longer (`TCP_RTO_MAX_MS`, Linux
/// 6.15; the kernel's smallest cap is 1 s) and thin streams
/// back off linearly (`TCP_THIN_LINEAR_TIMEOUTS`). Both are best effort: a kernel without them
/// keeps its defaults. Measured on a cluster of namespaces (`tests/cluster.rs`), 10 s timeout:
/// the longest outage survived went from 6 s to 9 s.
pub(crate) fn tune(stream: &impl std::os::fd::AsFd, link_timeout: Duration) -> io::Result<()> {
    let socket = socket2::SockRef::from(stream);
    socket.set_tcp_nodelay(true)?;
    super::liveness::arm(&socket, link_timeout)?;
    #[cfg(target_os = "linux")]
    {
        let _ = socket.set_tcp_thin_linear_timeouts(true);
        let cap = super::liveness::Settings::for_limit(link_timeout).backoff_cap;
        cap_retransmission_backoff(&*socket, cap);
    }
    Ok(())
}

/// Sets `stream`'s TCP congestion control to `name` (`TCP_CONGESTION`); the kernel refuses a
/// name it does not offer (`ENOENT`) or does not allow this process (`EPERM`).
#[cfg(target_os = "linux")]
pub(crate) fn set_congestion(stream: &impl std::os::fd::AsFd, name: &str) -> io::Result<()> {
    socket2::SockRef::from(stream).set_tcp_congestion(name.as_bytes())
}

/// What the kernel offers, for an error about a congestion control it refused: Linux's
/// `net.ipv4.tcp_available_congestion_control`, and the ones a process without privileges may
/// choose, `net.ipv4.tcp_allowed_congestion_control`; empty where neither can be read.
#[cfg(target_os = "linux")]
pub(crate) fn congestion_offered() -> String {
    let read = |leaf: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{leaf}"))
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let mut said = Vec::new();
    if let Some(v) = read("tcp_available_congestion_control") {
        said.push(format!("this host offers {v}"));
    }
    if let Some(v) = read("tcp_allowed_congestion_control") {
        said.push(format!("allows without privileges {v}"));
    }
    said.join(" and ")
}

/// Caps `stream`'s retransmission backoff at `cap` (`TCP_RTO_MAX_MS`); ignored where the
/// kernel (before 6.15) does not know the option.
#[cfg(target_os = "linux")]
fn cap_retransmission_backoff(stream: &impl std::os::fd::AsRawFd, cap: Duration) {
    /// `TCP_RTO_MAX_MS` of `include/uapi/linux/tcp.h`.
    const TCP_RTO_MAX_MS: libc::c_int = 44;
    let ms = libc::c_int::try_from(cap.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is the open socket `stream` borrows for the call, and the value
    // is a live c_int whose size is passed with it.
    let _ = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            TCP_RTO_MAX_MS,
            (&raw const ms).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// The retransmission backoff cap of `stream` in ms (`TCP_RTO_MAX_MS`), if the kernel has it.
#[cfg(all(test, target_os = "linux"))]
pub(super) fn retransmission_backoff_cap(
    stream: &impl std::os::fd::AsRawFd,
) -> Option<libc::c_int> {
    let mut ms: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is the open socket `stream` borrows for the call, and `ms` and
    // `len` are live and sized for the option's c_int.
    let got = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            44,
            (&raw mut ms).cast(),
            &raw mut len,
        )
    };
    (got == 0).then_some(ms)
}

/// A UDP socket bound beside a listener, or why it could not be (`None`: none was asked).
type Beside = Option<io::Result<UdpSocket>>;

/// A socket bound on `address` (MLX: `SO_REUSEADDR`, then bind), not listening yet, with
/// `udp` a UDP socket bound on the same address first.
fn bind(address: &str, udp: bool) -> Result<(SocketAddr, TcpListener, Beside), String> {
    let addrs = hostfile::resolve(address).map_err(|e| e.to_string())?;
    let mut last = None;
    for addr in addrs {
        let beside = udp.then(|| probing::bind_udp(addr));
        match bind_at(addr) {
            Ok(listener) => return Ok((addr, listener, beside)),
            Err(e) => last = Some(format!("cannot listen on {address} ({addr}): {e}")),
        }
    }
    Err(last.unwrap_or_else(|| format!("cannot listen on {address}: it resolves to nothing")))
}

/// A non-blocking TCP socket bound to `addr`, not listening: a connect to it is refused until
/// it [`listen`]s.
fn bind_at(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.bind(&SockAddr::from(addr))?;
    socket.set_nonblocking(true)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// Starts `listener`, bound by [`bind_at`], listening (MLX's backlog).
fn listen(listener: &TcpListener) -> io::Result<()> {
    socket2::SockRef::from(listener).listen(BACKLOG)
}

/// A non-blocking listening socket bound to `addr` (port 0: one the system picks).
pub(crate) fn listen_at(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.bind(&SockAddr::from(addr))?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// Binds `socket`, about to connect to `to`, to a port of its own choosing, the way `connect`
/// would have: an even port of the ephemeral range. Linux's `bind` to port 0 picks odd ports
/// (it leaves the even ones to `connect`), and odd ports are what a launcher or a test finds
/// "free" by binding port 0 and releasing it before a rank listens there: taking one of those
/// could fail that listener. `None` (the socket left unbound, so the connection stays TCP) if
/// no even port could be had in a few tries.
fn bind_like_connect(socket: &Socket, to: &SocketAddr) -> Option<u16> {
    const TRIES: u32 = 64;
    let (low, high) = ephemeral_ports();
    let evens = u32::from(high.saturating_sub(low)) / 2;
    if evens == 0 {
        return None;
    }
    let mut seed = [0u8; 4];
    getrandom::fill(&mut seed).ok()?;
    let first = u32::from_le_bytes(seed) % evens;
    let base = u32::from(low) + u32::from(low) % 2;
    for i in 0..TRIES.min(evens) {
        let port = u16::try_from(base + 2 * ((first + i) % evens)).ok()?;
        let any = match to {
            SocketAddr::V4(_) => SocketAddr::from(([0u8; 4], port)),
            SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], port)),
        };
        match socket.bind(&SockAddr::from(any)) {
            Ok(()) => return Some(port),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
            Err(_) => return None,
        }
    }
    None
}

/// The kernel's ephemeral port range (`/proc/sys/net/ipv4/ip_local_port_range`; Linux's
/// default where it cannot be read).
fn ephemeral_ports() -> (u16, u16) {
    const DEFAULT: (u16, u16) = (32768, 60999);
    let Ok(text) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
        return DEFAULT;
    };
    let mut bounds = text.split_whitespace().map(str::parse::<u16>);
    match (bounds.next(), bounds.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low < high => (low, high),
        _ => DEFAULT,
    }
}

/// The two ends of the connections being made.
#[derive(Clone, Copy)]
struct Who {
    rank: usize,
    peer: usize,
}

/// Reads exactly `buf.len()` bytes before `until`: the socket's read timeout is what is left
/// of the time before each read, so a peer that trickles bytes gets no more time in all.
fn read_until(stream: &TcpStream, buf: &mut [u8], until: Instant) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        match limits::read(stream, &mut buf[done..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if is_wait(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` before `until` (as [`read_until`]).
fn write_until(stream: &TcpStream, buf: &[u8], until: Instant) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match limits::write(stream, &buf[done..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if is_wait(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A socket call that timed out or was interrupted: try again while time is left.
fn is_wait(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Why the opener's half of a handshake failed, and whether trying again may help.
struct Refused {
    why: String,
    /// The connection failed (closed, timed out), not the protocol: a new connection may
    /// succeed (the acceptor may have been busy, or have dropped this one as a stranger).
    retry: bool,
}

/// The opener's half of the handshake on a new connection, all of it before `until`, saying
/// whether this side may speak the nuvec wire (`nuvec`); whether the acceptor may.
fn authenticate_acceptor(
    stream: &TcpStream,
    who: Who,
    link: usize,
    key: &Key,
    nuvec: bool,
    until: Instant,
) -> Result<bool, Refused> {
    let exchange = || {
        stream.set_nonblocking(false)?;
        let opener =
            Opener::new(key, who.rank as u32, who.peer as u32, link as u32).speaking(nuvec);
        write_until(stream, opener.hello(), until)?;
        let mut reply = [0u8; auth::REPLY];
        read_until(stream, &mut reply, until)?;
        let proof = opener.finish(&reply).map_err(io::Error::other)?;
        write_until(stream, &proof, until)?;
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(None)?;
        Ok(Opener::acceptor_speaks_nuvec(&reply))
    };
    exchange().map_err(|e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Refused {
            why: "it did not answer the authentication in time (no key on its side?)".into(),
            retry: true,
        },
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Refused {
            why: "it closed the connection during authentication (a different key?)".into(),
            retry: true,
        },
        // The protocol said no (a wrong proof): another connection would say the same.
        io::ErrorKind::Other => Refused {
            why: e.to_string(),
            retry: false,
        },
        _ => Refused {
            why: e.to_string(),
            retry: true,
        },
    })
}

/// An accepted connection whose fate the setup has not decided yet.
struct Arrival {
    conn: Conn,
    stream: mio::net::TcpStream,
    peer: SocketAddr,
    link: usize,
    /// Its handshake, once the setup asked for one.
    handshake: Option<Handshake>,
    /// Whether its opener said, in its handshake, that it may speak the nuvec wire.
    opener_nuvec: Option<bool>,
}

/// The acceptor's half of the handshake on one connection, run without blocking: the bytes
/// read and written so far.
struct Handshake {
    hello: [u8; auth::HELLO],
    got: usize,
    /// Made once the hello is in, with the reply to send.
    acceptor: Option<(Acceptor, [u8; auth::REPLY])>,
    sent: usize,
    proof: [u8; auth::NONCE],
    proved: usize,
}

/// Where a [`Handshake`] is.
enum Stage {
    /// It waits for the peer.
    Pending,
    /// The peer proved it holds the key, and said whether it may speak the nuvec wire.
    Done(bool),
    /// The peer failed (why).
    Failed(String),
}

impl Handshake {
    fn new() -> Self {
        Handshake {
            hello: [0; auth::HELLO],
            got: 0,
            acceptor: None,
            sent: 0,
            proof: [0; auth::NONCE],
            proved: 0,
        }
    }

    /// Moves the handshake of `stream`, accepted on `link`, as far as the socket allows now,
    /// saying whether this side may speak the nuvec wire (`nuvec`).
    fn advance(
        &mut self,
        stream: &mut mio::net::TcpStream,
        link: usize,
        key: &Key,
        who: Who,
        nuvec: bool,
    ) -> Stage {
        let Handshake {
            hello,
            got,
            acceptor,
            sent,
            proof,
            proved,
        } = self;
        loop {
            let moved = if *got < hello.len() {
                limits::read(&mut *stream, &mut hello[*got..]).map(|n| (n, &mut *got))
            } else if let Some((acceptor, reply)) = acceptor {
                if *sent < reply.len() {
                    limits::write(&mut *stream, &reply[*sent..]).map(|n| (n, &mut *sent))
                } else if *proved < proof.len() {
                    limits::read(&mut *stream, &mut proof[*proved..]).map(|n| (n, &mut *proved))
                } else {
                    return match acceptor.finish(proof) {
                        Ok(()) => Stage::Done(acceptor.opener_speaks_nuvec()),
                        Err(e) => Stage::Failed(e.to_string()),
                    };
                }
            } else {
                let (me, peer) = (who.rank as u32, who.peer as u32);
                match Acceptor::speaking(key, me, peer, link as u32, hello, nuvec) {
                    Ok(made) => *acceptor = Some(made),
                    Err(e) => return Stage::Failed(e.to_string()),
                }
                continue;
            };
            match moved {
                Ok((0, _)) => {
                    return Stage::Failed("it closed the connection during authentication".into());
                }
                Ok((n, counter)) => *counter += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Stage::Pending,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Stage::Failed(e.to_string()),
            }
        }
    }
}

mod probing;

/// The sockets of one setup, driven by its [`Setup`].
struct Driver<'a> {
    setup: Setup,
    nodes: &'a [Vec<String>],
    key: Option<&'a Key>,
    log: &'a Log,
    poll: Poll,
    /// The right neighbour's addresses of each link, resolved when first opened.
    resolved: Vec<Option<Vec<SocketAddr>>>,
    /// The connection being opened (connected, maybe authenticating), the local link
    /// proposed for it, and whether it is native.
    opening: Option<Opened>,
    opened: Vec<Opened>,
    /// Local links this rank's listeners offer (`None`: local links are off).
    offers: Option<Offers>,
    arrivals: Vec<Arrival>,
    /// The connection kept on each link, its local link if its opener proposed one, and
    /// whether it is native.
    accepted: Vec<Option<Accepted>>,
    next_conn: u64,
    /// The wire this rank may speak (`None`: it does not negotiate, as a sub-group's ring).
    choice: Option<WireChoice>,
    /// The job's identity, named in probes.
    job: u64,
    /// The UDP socket beside each listener, where probes are answered.
    udp: Vec<Option<UdpSocket>>,
    /// The acceptor's half of the probes (`None`: this rank neither probes nor answers).
    answerer: Option<Answerer>,
    /// How many probes this rank made, and the time they took (what probing adds to setup).
    probed: (u32, Duration),
    /// When the listeners, bound but not listening, start to listen (`None`: they listen
    /// already).
    listen_at: Option<Instant>,
}

/// An opened connection: its stream, the local link proposed for it, whether it is native.
type Opened = (TcpStream, Option<Proposal>, Result<(), NotNative>);
/// An accepted connection: its stream, its local link, whether it is native.
type Accepted = (TcpStream, Option<LocalLink>, Result<(), NotNative>);

impl<'a> Driver<'a> {
    fn new(
        setup: Setup,
        nodes: &'a [Vec<String>],
        key: Option<&'a Key>,
        log: &'a Log,
        offers: Option<Offers>,
        negotiation: Option<Negotiation>,
    ) -> Result<Self, String> {
        let links = nodes[setup.rank()].len();
        let (choice, job, udp, listen_at) = match negotiation {
            Some(n) => (Some(n.choice), n.job, n.udp, n.listen_at),
            None => (None, 0, Vec::new(), None),
        };
        // Probes are for jobs without a key, between ranks that may speak the nuvec wire.
        let probes = key.is_none() && choice.is_some_and(|c| c != WireChoice::Mlx);
        let answerer = probes.then(|| Answerer::new(job, setup.left(), links));
        Ok(Driver {
            setup,
            nodes,
            key,
            log,
            poll: Poll::new().map_err(|e| format!("cannot poll: {e}"))?,
            resolved: vec![None; links],
            opening: None,
            opened: Vec::with_capacity(links),
            offers,
            arrivals: Vec::new(),
            accepted: (0..links).map(|_| None).collect(),
            next_conn: 0,
            choice,
            job,
            udp,
            answerer,
            probed: (0, Duration::ZERO),
            listen_at,
        })
    }

    /// This rank's address of `link`.
    fn own(&self, link: usize) -> &str {
        self.nodes[self.setup.rank()]
            .get(link)
            .map_or("?", String::as_str)
    }

    /// The right neighbour's address of `link`.
    fn theirs(&self, link: usize) -> &str {
        self.nodes[self.setup.right()]
            .get(link)
            .map_or("?", String::as_str)
    }

    fn who(&self, peer: usize) -> Who {
        Who {
            rank: self.setup.rank(),
            peer,
        }
    }

    fn run(
        mut self,
        mut listeners: Vec<(String, TcpListener)>,
        until: Instant,
    ) -> Result<RingSockets, String> {
        for (c, (address, listener)) in listeners.iter_mut().enumerate() {
            self.poll
                .registry()
                .register(listener, Token(c), Interest::READABLE)
                .map_err(|e| format!("cannot poll {address}: {e}"))?;
        }
        for (c, socket) in self.udp.iter_mut().enumerate() {
            if let Some(socket) = socket {
                self.poll
                    .registry()
                    .register(socket, Token(UDP_TOKEN + c), Interest::READABLE)
                    .map_err(|e| format!("cannot poll the UDP socket of connection {c}: {e}"))?;
            }
        }
        if let Some(at) = self.listen_at {
            self.idle_until(at);
            for (address, listener) in &listeners {
                listen(listener).map_err(|e| format!("cannot listen on {address}: {e}"))?;
            }
        }
        let mut events = Events::with_capacity(16);
        loop {
            let now = Instant::now();
            let action = self.setup.poll(now);
            while let Some(note) = self.setup.poll_note() {
                self.say(&note);
            }
            match action {
                Action::Open { link, within, .. } => self.open(link, within)?,
                Action::AuthenticateOpened { link, until } => self.authenticate_opened(link, until),
                Action::AuthenticateAccepted { conn, .. } => self.authenticate_accepted(conn)?,
                Action::Keep { conn, link } => {
                    if let Some(arrival) = self.take_arrival(conn) {
                        let native = self.accepted_native(link, &arrival);
                        // Answered now, not after the setup: the opener's wait for the answer
                        // must not depend on this rank's other connections. Its hello was
                        // queued before it connected, so it is there already.
                        let local = self
                            .offers
                            .as_mut()
                            .and_then(|offers| offers.answer(link, arrival.peer));
                        self.accepted[link] =
                            Some((TcpStream::from(arrival.stream), local, native));
                    }
                }
                Action::Drop { conn, link, why } => {
                    if let Some(arrival) = self.take_arrival(conn) {
                        self.log.warn(format_args!(
                            "rejected a connection from {} on {} (connection {link}): {why}",
                            arrival.peer,
                            self.own(link)
                        ));
                    }
                }
                Action::Wait { until } => {
                    // Probes first: a connection whose probe was answered must find its
                    // answer recorded (it was, before the opener could connect).
                    let probed = self.answer_probes();
                    if !self.accept(&mut listeners)? && !self.advance_handshakes() && !probed {
                        let missing = self.setup.connections().1.iter().position(Option::is_none);
                        let wait = until.saturating_duration_since(Instant::now());
                        match self.poll.poll(&mut events, Some(wait)) {
                            Ok(()) => {}
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => {
                                let address = self.own(missing.unwrap_or(0));
                                return Err(format!("waiting on {address}: {e}"));
                            }
                        }
                    }
                }
                // A back-off between connection attempts: the peer may not be listening yet.
                // Probes are answered meanwhile (the left neighbour may be probing).
                Action::Sleep { until } => self.idle_until(until),
                Action::Done => break,
                Action::Failed(failure) => return Err(self.describe(&failure)),
            }
        }
        self.arrivals.clear();
        let mut left = Vec::with_capacity(self.accepted.len());
        let mut left_native = Vec::with_capacity(self.accepted.len());
        for (link, kept) in std::mem::take(&mut self.accepted).into_iter().enumerate() {
            let address = self.own(link);
            let Some((stream, local, native)) = kept else {
                return Err(format!("no connection on {address}"));
            };
            stream
                .set_nonblocking(false)
                .map_err(|e| format!("accepted socket on {address}: {e}"))?;
            left.push((stream, local));
            left_native.push(native);
        }
        // Every acceptor answered the proposal of a connection when it kept it, so this wait
        // is for a rank that has accepted this rank's connection already.
        let right_rank = self.setup.right();
        let mut right = Vec::with_capacity(self.opened.len());
        let mut right_native = Vec::with_capacity(self.opened.len());
        for (link, (stream, proposal, native)) in
            std::mem::take(&mut self.opened).into_iter().enumerate()
        {
            right_native.push(native);
            let local = match proposal {
                Some(p) => p.confirm(until).map_err(|e| {
                    format!(
                        "rank {right_rank} took this rank's proposal of a local link on {} \
                         (connection {link}) but did not answer it: {e}",
                        self.theirs(link)
                    )
                })?,
                None => None,
            };
            right.push((stream, local));
        }
        for (side, peer, row) in [
            ("to", right_rank, &right),
            ("from", self.setup.left(), &left),
        ] {
            for (link, (_, local)) in row.iter().enumerate() {
                if local.is_some() {
                    self.log.debug(format_args!(
                        "connection {link} {side} rank {peer} is a local link (shared memory)"
                    ));
                }
            }
        }
        if self.choice.is_some() {
            let how = if self.key.is_some() {
                "handshake"
            } else {
                "probe answered"
            };
            for (side, peer, row) in [
                ("to", right_rank, &right_native),
                ("from", self.setup.left(), &left_native),
            ] {
                for (link, native) in row.iter().enumerate() {
                    match native {
                        Ok(()) => self.log.info(format_args!(
                            "connection {link} {side} rank {peer}: nuvec wire ({how})"
                        )),
                        Err(why) => self.log.info(format_args!(
                            "connection {link} {side} rank {peer}: MLX's wire ({})",
                            why.short()
                        )),
                    }
                }
            }
        }
        if self.probed.0 > 0 {
            self.log.info(format_args!(
                "{} probes of the nuvec wire took {:?} in all",
                self.probed.0, self.probed.1
            ));
        }
        Ok(RingSockets {
            right,
            left,
            right_native,
            left_native,
        })
    }

    /// One attempt to open `link`, each of its resolved addresses in turn.
    fn open(&mut self, link: usize, within: Duration) -> Result<(), String> {
        if self.resolved[link].is_none() {
            let addrs = hostfile::resolve(self.theirs(link)).map_err(|e| e.to_string())?;
            self.resolved[link] = Some(addrs);
        }
        let mut last = String::from("no address");
        let mut connected = None;
        let addrs = self.resolved[link].clone().unwrap_or_default();
        for addr in &addrs {
            match self.connect_to(link, addr, within) {
                Ok(s) => {
                    connected = Some(s);
                    break;
                }
                Err(e) => last = e.to_string(),
            }
        }
        let event = match connected {
            Some(stream) => {
                self.opening = Some(stream);
                Event::Opened { link }
            }
            None => Event::OpenFailed { link, why: last },
        };
        self.report(event);
        Ok(())
    }

    fn authenticate_opened(&mut self, link: usize, until: Instant) {
        let who = self.who(self.setup.right());
        let nuvec = self.speaks_nuvec();
        let event = match (&mut self.opening, self.key) {
            (Some((stream, _, native)), Some(key)) => {
                match authenticate_acceptor(stream, who, link, key, nuvec, until) {
                    Ok(acceptor_nuvec) => {
                        if native.is_ok() && !acceptor_nuvec {
                            *native = Err(NotNative::AcceptorAskedMlx);
                        }
                        Event::OpenerAuthenticated { link }
                    }
                    Err(Refused { why, retry }) => Event::OpenerRefused { link, why, retry },
                }
            }
            _ => Event::OpenerRefused {
                link,
                why: "no connection or no key to authenticate".into(),
                retry: false,
            },
        };
        self.report(event);
    }

    /// Hands `event` to the setup; a link it now counts as open takes the connection opened.
    fn report(&mut self, event: Event) {
        // A refused handshake closes its connection (a new attempt opens another).
        let refused = matches!(event, Event::OpenerRefused { .. });
        self.setup.handle(Instant::now(), event);
        if self.setup.connections().0 > self.opened.len() {
            if let Some(stream) = self.opening.take() {
                self.opened.push(stream);
            }
        } else if refused {
            self.opening = None;
        }
    }

    fn take_arrival(&mut self, conn: Conn) -> Option<Arrival> {
        let at = self.arrivals.iter().position(|a| a.conn == conn)?;
        let mut arrival = self.arrivals.swap_remove(at);
        if arrival.handshake.is_some() {
            let _ = self.poll.registry().deregister(&mut arrival.stream);
        }
        Some(arrival)
    }

    fn authenticate_accepted(&mut self, conn: Conn) -> Result<(), String> {
        let token = Token(self.nodes[self.setup.rank()].len() + conn.0 as usize);
        let Some(arrival) = self.arrivals.iter_mut().find(|a| a.conn == conn) else {
            return Ok(());
        };
        self.poll
            .registry()
            .register(
                &mut arrival.stream,
                token,
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| format!("cannot poll a connection from {}: {e}", arrival.peer))?;
        arrival.handshake = Some(Handshake::new());
        Ok(())
    }

    /// Accepts every connection waiting on a link the setup accepts on; whether any came.
    fn accept(&mut self, listeners: &mut [(String, TcpListener)]) -> Result<bool, String> {
        let mut any = false;
        for (c, (address, listener)) in listeners.iter_mut().enumerate() {
            while self.setup.accepting(c) {
                let (stream, peer) = match listener.accept() {
                    Ok(pair) => pair,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                    Err(e) => return Err(format!("accepting on {address}: {e}")),
                };
                self.log.debug(format_args!(
                    "accepted {peer} on {address} (connection {c})"
                ));
                let conn = Conn(self.next_conn);
                self.next_conn += 1;
                self.arrivals.push(Arrival {
                    conn,
                    stream,
                    peer,
                    link: c,
                    handshake: None,
                    opener_nuvec: None,
                });
                self.setup
                    .handle(Instant::now(), Event::Arrived { link: c, conn });
                any = true;
                // The setup decides (keep, authenticate, drop) before the next one is taken.
                break;
            }
        }
        Ok(any)
    }

    /// Moves every handshake on; whether any of them ended.
    fn advance_handshakes(&mut self) -> bool {
        let Some(key) = self.key else {
            return false;
        };
        let who = self.who(self.setup.left());
        let nuvec = self.speaks_nuvec();
        let mut ended = Vec::new();
        for arrival in &mut self.arrivals {
            let Some(handshake) = &mut arrival.handshake else {
                continue;
            };
            match handshake.advance(&mut arrival.stream, arrival.link, key, who, nuvec) {
                Stage::Pending => {}
                Stage::Done(opener_nuvec) => {
                    arrival.opener_nuvec = Some(opener_nuvec);
                    ended.push(Event::AcceptorAuthenticated { conn: arrival.conn });
                }
                Stage::Failed(why) => ended.push(Event::AcceptorFailed {
                    conn: arrival.conn,
                    why,
                }),
            }
        }
        let any = !ended.is_empty();
        for event in ended {
            self.setup.handle(Instant::now(), event);
        }
        any
    }

    fn say(&self, note: &Note) {
        let (rank, right, left) = (self.setup.rank(), self.setup.right(), self.setup.left());
        match note {
            Note::Accepting => self.log.info(format_args!("Rank {rank} accepting")),
            Note::Connecting => self
                .log
                .info(format_args!("Rank {rank} connecting to {right}")),
            Note::Retrying {
                link,
                attempt,
                last,
                wait,
                left,
            } => self.log.info(format_args!(
                "Attempt {attempt} to connect to rank {right} at {} failed ({last}); retrying in {wait:?}, {left:?} left",
                self.theirs(*link)
            )),
            Note::StillWaiting { link, left: time } => self.log.info(format_args!(
                "still waiting for rank {left} to connect to {} (connection {link}), {time:?} left",
                self.own(*link)
            )),
            Note::Connected => self.log.info(format_args!(
                "Rank {rank} connected: {} to rank {right}, {} from rank {left}",
                self.setup.connections().0,
                self.setup.connections().1.iter().flatten().count()
            )),
        }
    }

    /// The message of a failed setup, naming the addresses.
    fn describe(&self, failure: &Failure) -> String {
        match failure {
            Failure::NeverConnected {
                peer,
                link,
                timeout,
            } => format!(
                "rank {peer} never connected to {} (connection {link}): timed out after {timeout:?}",
                self.own(*link)
            ),
            Failure::CannotConnect {
                peer,
                link,
                attempts,
                timeout,
                last,
                earlier,
            } => {
                let earlier = earlier.as_ref().map_or(String::new(), |why| {
                    format!("; an earlier connection's authentication failed: {why}")
                });
                format!(
                    "cannot connect to rank {peer} at {} (connection {link}) after {attempts} attempts in {timeout:?}: {last}{earlier}",
                    self.theirs(*link)
                )
            }
            Failure::AuthenticationFailed { peer, link, why } => format!(
                "authentication with rank {peer} at {} (connection {link}) failed: {why}",
                self.theirs(*link)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opener_binds_an_even_ephemeral_port_as_connect_would_not_an_odd_one_bind_gives() {
        let (low, high) = ephemeral_ports();
        let to: SocketAddr = "127.0.0.1:9".parse().expect("address");
        for _ in 0..8 {
            let socket =
                Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket");
            let port = bind_like_connect(&socket, &to).expect("a port");
            assert_eq!(port % 2, 0, "{port}");
            assert!(
                (low..=high).contains(&port),
                "{port} outside {low}..={high}"
            );
            let bound = socket
                .local_addr()
                .expect("bound")
                .as_socket()
                .expect("inet");
            assert_eq!(bound.port(), port);
        }
    }
}
