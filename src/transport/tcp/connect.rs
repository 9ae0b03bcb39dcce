//! Connection setup of MLX's ring, in MLX's order (reference §2.3).
//!
//! Rank r listens on every address of its own hostfile entry and connects to every address of
//! its right neighbour's entry, one connection per address, address c being connection c.
//! Every rank accepts before it connects, except rank R−1, which connects to rank 0 first:
//! that unrolls the chain without deadlock. No bytes are exchanged (MLX's ring has no
//! handshake). Unlike MLX, every wait is bounded by one deadline for the whole setup, a
//! connector retries while its peer is not listening yet, and each failure names the address
//! and the rank.
//!
//! With a key ([`crate::transport::tcp::auth`]), an acceptor authenticates every connection it accepts at
//! once, beside the others, each within [`HANDSHAKE`] (5 s) of its arrival in all, however
//! it trickles its bytes; the first to prove the key takes the listener's place. An opener
//! whose handshake gets no answer, or sees the connection close, opens a new connection and
//! tries again until the deadline; one told the key is wrong fails at once. So strangers,
//! silent or slow, neither join nor block a forming group.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, SockAddr, Socket, TcpKeepalive, Type};

use crate::config::hostfile;
use crate::config::log::Log;
use crate::error::Error;
use crate::limits;
use crate::transport::tcp::auth::{self, Acceptor, Key, Opener};

/// The longest a connection may take to authenticate: a stranger that connects and says
/// nothing holds up setup for no longer than this.
const HANDSHAKE: Duration = Duration::from_secs(5);

/// How often a rank waiting for a connection says who it is still waiting for.
const PROGRESS: Duration = Duration::from_secs(5);

/// The sockets of one rank of a ring: `right[c]` was opened by this rank to its right
/// neighbour's address c, `left[c]` was accepted on this rank's own address c.
#[derive(Debug)]
pub(crate) struct RingSockets {
    pub(crate) right: Vec<TcpStream>,
    pub(crate) left: Vec<TcpStream>,
}

/// Connects rank `rank` of the ring over `nodes` (per rank its addresses) within `timeout`.
pub(crate) fn connect_ring(
    nodes: &[Vec<String>],
    rank: usize,
    timeout: Duration,
    key: Option<&Key>,
    log: &Log,
) -> Result<RingSockets, Error> {
    let fail = |what: String| Error::Connect { rank, what };
    // Bind every listener first, so that a left neighbour that connects early finds us.
    let mut listeners = Vec::with_capacity(nodes[rank].len());
    for address in &nodes[rank] {
        listeners.push((address.clone(), listen(address).map_err(&fail)?));
    }
    connect_ring_on(nodes, rank, listeners, timeout, key, log)
}

/// [`connect_ring`] over `listeners`, already bound on this rank's addresses `nodes[rank]`
/// (a sub-group's ring binds ephemeral ports before it can tell its neighbours their numbers).
pub(crate) fn connect_ring_on(
    nodes: &[Vec<String>],
    rank: usize,
    listeners: Vec<(String, (SocketAddr, TcpListener))>,
    timeout: Duration,
    key: Option<&Key>,
    log: &Log,
) -> Result<RingSockets, Error> {
    let size = nodes.len();
    let deadline = limits::deadline_in(timeout);
    let fail = |what: String| Error::Connect { rank, what };
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    let accept = |listeners| {
        log.info(format_args!("Rank {rank} accepting"));
        let who = Who {
            rank,
            peer: left,
            key,
        };
        accept_all(listeners, who, deadline, timeout, log).map_err(&fail)
    };
    let connect = || {
        log.info(format_args!("Rank {rank} connecting to {right}"));
        let who = Who {
            rank,
            peer: right,
            key,
        };
        connect_all(&nodes[right], who, deadline, timeout, log).map_err(&fail)
    };
    let (opened, accepted) = if rank < right {
        let accepted = accept(listeners)?;
        (connect()?, accepted)
    } else {
        let opened = connect()?;
        (opened, accept(listeners)?)
    };
    log.info(format_args!(
        "Rank {rank} connected: {} to rank {right}, {} from rank {left}",
        opened.len(),
        accepted.len()
    ));
    Ok(RingSockets {
        right: opened,
        left: accepted,
    })
}

/// Socket options of every connection of a [`TcpFabric`](super::TcpFabric) (the ring's and
/// JACCL's over TCP): no Nagle delay (MLX's; without it a small message can wait for the
/// peer's delayed acknowledgement, tens of milliseconds), and keepalive so an idle group
/// notices a dead host.
///
/// On Linux, a glitch shorter than the timeout (a cable out and back) should not outlast it
/// for want of a retransmission: TCP's exponential backoff (0.2, 0.4, 0.8 … s) can put the
/// first retry after the link is back seconds later, past the deadline. So the backoff is
/// capped at 1 s (`TCP_RTO_MAX_MS`, Linux 6.15; the kernel's smallest cap) and thin streams
/// back off linearly (`TCP_THIN_LINEAR_TIMEOUTS`). Both are best effort: a kernel without them
/// keeps its defaults. Measured on a cluster of namespaces (`tests/cluster.rs`), 10 s timeout:
/// the longest outage survived went from 6 s to 9 s.
pub(super) fn tune(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let socket = socket2::SockRef::from(stream);
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(2));
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    let keepalive = keepalive.with_retries(5);
    socket.set_tcp_keepalive(&keepalive)?;
    #[cfg(target_os = "linux")]
    {
        let _ = socket.set_tcp_thin_linear_timeouts(true);
        cap_retransmission_backoff(stream);
    }
    Ok(())
}

/// Caps `stream`'s retransmission backoff at 1 s (`TCP_RTO_MAX_MS`); ignored where the
/// kernel (before 6.15) does not know the option.
#[cfg(target_os = "linux")]
fn cap_retransmission_backoff(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    /// `TCP_RTO_MAX_MS` of `include/uapi/linux/tcp.h`.
    const TCP_RTO_MAX_MS: libc::c_int = 44;
    let ms: libc::c_int = 1000;
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

/// The text of a configuration error, without the crate's prefix (it is wrapped again).
fn config_text(e: Error) -> String {
    match e {
        Error::Config(text) => text,
        other => other.to_string(),
    }
}

/// A listening socket on `address` (MLX: `SO_REUSEADDR`, then bind and listen).
fn listen(address: &str) -> Result<(SocketAddr, TcpListener), String> {
    let addrs = hostfile::resolve(address).map_err(config_text)?;
    let mut last = None;
    for addr in addrs {
        match listen_at(addr) {
            Ok(listener) => return Ok((addr, listener)),
            Err(e) => last = Some(format!("cannot listen on {address} ({addr}): {e}")),
        }
    }
    Err(last.unwrap_or_else(|| format!("cannot listen on {address}: it resolves to nothing")))
}

/// A non-blocking listening socket bound to `addr` (port 0: one the system picks).
pub(crate) fn listen_at(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.bind(&SockAddr::from(addr))?;
    socket.listen(16)?;
    socket.set_nonblocking(true)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// The two ends of the connections being made, and the key if they authenticate.
#[derive(Clone, Copy)]
struct Who<'a> {
    rank: usize,
    peer: usize,
    key: Option<&'a Key>,
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

/// The opener's half of the handshake on a new connection, all of it before `until`.
fn authenticate_acceptor(
    stream: &TcpStream,
    who: Who<'_>,
    link: usize,
    key: &Key,
    until: Instant,
) -> Result<(), Refused> {
    let exchange = || {
        stream.set_nonblocking(false)?;
        let opener = Opener::new(key, who.rank as u32, who.peer as u32, link as u32);
        write_until(stream, opener.hello(), until)?;
        let mut reply = [0u8; 2 * auth::NONCE];
        read_until(stream, &mut reply, until)?;
        let proof = opener.finish(&reply).map_err(io::Error::other)?;
        write_until(stream, &proof, until)?;
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(None)
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

/// The most connections a rank authenticates at once; more are closed at once (the opener of
/// the real neighbour retries).
const MAX_PENDING: usize = 64;

/// An accepted connection being authenticated: the acceptor's half of the handshake, run
/// without blocking beside every other connection's.
struct Handshake {
    stream: mio::net::TcpStream,
    peer: SocketAddr,
    /// The listener (connection index) it arrived on.
    link: usize,
    /// The whole handshake must be done by then.
    until: Instant,
    hello: [u8; auth::HELLO],
    got: usize,
    /// Made once the hello is in, with the reply to send.
    acceptor: Option<(Acceptor, [u8; 2 * auth::NONCE])>,
    sent: usize,
    proof: [u8; auth::NONCE],
    proved: usize,
}

/// Where a [`Handshake`] is.
enum Stage {
    /// It waits for the peer.
    Pending,
    /// The peer proved it holds the key.
    Done,
    /// The peer failed (why).
    Failed(String),
}

impl Handshake {
    /// Moves the handshake as far as the socket allows now.
    fn advance(&mut self, key: &Key, who: Who<'_>) -> Stage {
        let Handshake {
            stream,
            link,
            hello,
            got,
            acceptor,
            sent,
            proof,
            proved,
            ..
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
                        Ok(()) => Stage::Done,
                        Err(e) => Stage::Failed(e.to_string()),
                    };
                }
            } else {
                match Acceptor::new(key, who.rank as u32, who.peer as u32, *link as u32, hello) {
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

/// Accepts exactly one connection on each listener. With a key, every accepted connection is
/// authenticated at once beside the others, each within [`HANDSHAKE`] of its arrival: one
/// that fails or runs out of time is dropped, and its listener takes the first that succeeds.
/// So strangers, silent or slow, cannot keep the real neighbour waiting.
fn accept_all(
    listeners: Vec<(String, (SocketAddr, TcpListener))>,
    who: Who<'_>,
    deadline: Instant,
    timeout: Duration,
    log: &Log,
) -> Result<Vec<TcpStream>, String> {
    let mut poll = Poll::new().map_err(|e| format!("cannot poll: {e}"))?;
    let mut events = Events::with_capacity(16);
    let mut listeners: Vec<(String, TcpListener)> = listeners
        .into_iter()
        .map(|(address, (_, listener))| (address, listener))
        .collect();
    for (c, (address, listener)) in listeners.iter_mut().enumerate() {
        poll.registry()
            .register(listener, Token(c), Interest::READABLE)
            .map_err(|e| format!("cannot poll {address}: {e}"))?;
    }
    let mut streams: Vec<Option<TcpStream>> = (0..listeners.len()).map(|_| None).collect();
    let mut pending: Vec<Handshake> = Vec::new();
    let mut next_token = listeners.len();
    let mut last_said = Instant::now();
    loop {
        for (c, (address, listener)) in listeners.iter_mut().enumerate() {
            while streams[c].is_none() {
                let (mut stream, peer) = match listener.accept() {
                    Ok(pair) => pair,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                    Err(e) => return Err(format!("accepting on {address}: {e}")),
                };
                log.debug(format_args!(
                    "accepted {peer} on {address} (connection {c})"
                ));
                if who.key.is_none() {
                    streams[c] = Some(TcpStream::from(stream));
                    break;
                }
                if pending.len() >= MAX_PENDING {
                    log.warn(format_args!(
                        "rejected a connection from {peer} on {address} (connection {c}): \
                         {MAX_PENDING} connections are authenticating already"
                    ));
                    continue;
                }
                poll.registry()
                    .register(
                        &mut stream,
                        Token(next_token),
                        Interest::READABLE | Interest::WRITABLE,
                    )
                    .map_err(|e| format!("cannot poll a connection from {peer}: {e}"))?;
                next_token += 1;
                pending.push(Handshake {
                    stream,
                    peer,
                    link: c,
                    until: limits::deadline_in(HANDSHAKE).min(deadline),
                    hello: [0; auth::HELLO],
                    got: 0,
                    acceptor: None,
                    sent: 0,
                    proof: [0; auth::NONCE],
                    proved: 0,
                });
            }
        }
        if let Some(key) = who.key {
            let now = Instant::now();
            let mut i = 0;
            while i < pending.len() {
                let h = &mut pending[i];
                let stage = if streams[h.link].is_some() {
                    // Its listener has its connection: no need to hear it out.
                    Stage::Failed("the connection is taken".into())
                } else {
                    match h.advance(key, who) {
                        Stage::Pending if now >= h.until => Stage::Failed(format!(
                            "it did not authenticate within {:?} of connecting",
                            HANDSHAKE.min(timeout)
                        )),
                        stage => stage,
                    }
                };
                if let Stage::Pending = stage {
                    i += 1;
                    continue;
                }
                let mut h = pending.swap_remove(i);
                let _ = poll.registry().deregister(&mut h.stream);
                let address = &listeners[h.link].0;
                match stage {
                    Stage::Done => streams[h.link] = Some(TcpStream::from(h.stream)),
                    Stage::Failed(why) => log.warn(format_args!(
                        "rejected a connection from {} on {address} (connection {}): {why}",
                        h.peer, h.link
                    )),
                    Stage::Pending => {}
                }
            }
        }
        if streams.iter().all(Option::is_some) {
            break;
        }
        let now = Instant::now();
        let missing = streams.iter().position(Option::is_none).unwrap_or(0);
        let address = &listeners[missing].0;
        if now >= deadline {
            return Err(format!(
                "rank {} never connected to {address} (connection {missing}): timed out after {timeout:?}",
                who.peer
            ));
        }
        if now.saturating_duration_since(last_said) >= PROGRESS {
            last_said = now;
            log.info(format_args!(
                "still waiting for rank {} to connect to {address} (connection {missing}), {:?} left",
                who.peer,
                deadline.saturating_duration_since(now)
            ));
        }
        // Wake up for the next connection or handshake bytes, a handshake's time running out,
        // or every few seconds to say who is still missing.
        let wait = pending
            .iter()
            .map(|h| h.until.saturating_duration_since(now))
            .fold((deadline - now).min(PROGRESS), Duration::min);
        match poll.poll(&mut events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("waiting on {address}: {e}")),
        }
    }
    drop(pending);
    let mut out = Vec::with_capacity(streams.len());
    for (stream, (address, _)) in streams.into_iter().zip(&listeners) {
        let Some(stream) = stream else {
            return Err(format!("no connection on {address}"));
        };
        stream
            .set_nonblocking(false)
            .map_err(|e| format!("accepted socket on {address}: {e}"))?;
        out.push(stream);
    }
    Ok(out)
}

/// Connects once to every address of `to`'s entry, in order, retrying each while the peer is
/// not listening yet.
fn connect_all(
    addresses: &[String],
    who: Who<'_>,
    deadline: Instant,
    timeout: Duration,
    log: &Log,
) -> Result<Vec<TcpStream>, String> {
    let mut streams = Vec::with_capacity(addresses.len());
    let to = who.peer;
    for (c, address) in addresses.iter().enumerate() {
        let addrs = hostfile::resolve(address).map_err(config_text)?;
        let mut wait = Duration::from_millis(10);
        let mut attempt = 0u32;
        // The last handshake that failed on a connection that was made, if any.
        let mut refused: Option<String> = None;
        let stream = 'connected: loop {
            attempt += 1;
            let now = Instant::now();
            let mut last = String::from("no address");
            let mut connected = None;
            for addr in &addrs {
                let left = deadline
                    .saturating_duration_since(now)
                    .max(Duration::from_millis(1));
                match TcpStream::connect_timeout(addr, left.min(Duration::from_secs(5))) {
                    Ok(s) => {
                        connected = Some(s);
                        break;
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            if let Some(s) = connected {
                let Some(key) = who.key else {
                    break s;
                };
                let until = limits::deadline_in(HANDSHAKE).min(deadline);
                match authenticate_acceptor(&s, who, c, key, until) {
                    Ok(()) => break 'connected s,
                    Err(Refused { why, retry }) => {
                        if !retry {
                            return Err(format!(
                                "authentication with rank {to} at {address} (connection {c}) failed: {why}"
                            ));
                        }
                        last = format!("the authentication failed: {why}");
                        refused = Some(why);
                    }
                }
            }
            let now = Instant::now();
            if limits::deadline(now, wait) >= deadline {
                let earlier = match &refused {
                    Some(why) if !last.starts_with("the authentication") => {
                        format!("; an earlier connection's authentication failed: {why}")
                    }
                    _ => String::new(),
                };
                return Err(format!(
                    "cannot connect to rank {to} at {address} (connection {c}) after {attempt} attempts in {timeout:?}: {last}{earlier}"
                ));
            }
            log.info(format_args!(
                "Attempt {attempt} to connect to rank {to} at {address} failed ({last}); retrying in {wait:?}, {:?} left",
                deadline - now
            ));
            // A back-off between connection attempts: the peer may not be listening yet.
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_millis(500));
        };
        streams.push(stream);
    }
    Ok(streams)
}
