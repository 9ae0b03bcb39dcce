//! Connection setup of MLX's ring, in MLX's order (reference §2.3).
//!
//! Rank r listens on every address of its own hostfile entry and connects to every address of
//! its right neighbour's entry, one connection per address, address c being connection c.
//! Every rank accepts before it connects, except rank R−1, which connects to rank 0 first:
//! that unrolls the chain without deadlock. No bytes are exchanged (MLX's ring has no
//! handshake). Unlike MLX, every wait is bounded by one deadline for the whole setup, a
//! connector retries while its peer is not listening yet, and each failure names the address
//! and the rank.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, SockAddr, Socket, TcpKeepalive, Type};

use crate::auth::{self, Acceptor, Key, Opener};
use crate::error::Error;
use crate::hostfile;
use crate::limits;
use crate::log::Log;

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
    let size = nodes.len();
    let deadline = limits::deadline_in(timeout);
    let fail = |what: String| Error::Connect { rank, what };
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    // Bind every listener first, so that a left neighbour that connects early finds us.
    let mut listeners = Vec::with_capacity(nodes[rank].len());
    for address in &nodes[rank] {
        listeners.push((address.clone(), listen(address).map_err(&fail)?));
    }
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
pub(super) fn tune(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let socket = socket2::SockRef::from(stream);
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(2));
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    let keepalive = keepalive.with_retries(5);
    socket.set_tcp_keepalive(&keepalive)
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
        let attempt = (|| {
            let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
            socket.set_reuse_address(true)?;
            if addr.is_ipv6() {
                socket.set_only_v6(false).ok();
            }
            socket.bind(&SockAddr::from(addr))?;
            socket.listen(16)?;
            socket.set_nonblocking(true)?;
            Ok::<_, io::Error>(TcpListener::from_std(socket.into()))
        })();
        match attempt {
            Ok(listener) => return Ok((addr, listener)),
            Err(e) => last = Some(format!("cannot listen on {address} ({addr}): {e}")),
        }
    }
    Err(last.unwrap_or_else(|| format!("cannot listen on {address}: it resolves to nothing")))
}

/// The two ends of the connections being made, and the key if they authenticate.
#[derive(Clone, Copy)]
struct Who<'a> {
    rank: usize,
    peer: usize,
    key: Option<&'a Key>,
}

/// Runs `exchange` on `stream` in blocking mode with every read and write bounded by the
/// handshake time (and the setup deadline).
fn bounded<T>(
    stream: &TcpStream,
    deadline: Instant,
    exchange: impl FnOnce(&TcpStream) -> io::Result<T>,
) -> io::Result<T> {
    let limit = deadline
        .saturating_duration_since(Instant::now())
        .min(HANDSHAKE)
        .max(Duration::from_millis(1));
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(limit))?;
    stream.set_write_timeout(Some(limit))?;
    let result = exchange(stream);
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    result
}

/// The acceptor's half of the handshake on an accepted connection.
fn authenticate_opener(
    stream: &TcpStream,
    who: Who<'_>,
    link: usize,
    key: &Key,
    deadline: Instant,
) -> Result<(), String> {
    bounded(stream, deadline, |s| {
        let mut hello = [0u8; auth::HELLO];
        limits::read_exact(s, &mut hello)?;
        let (acceptor, reply) =
            Acceptor::new(key, who.rank as u32, who.peer as u32, link as u32, &hello)
                .map_err(io::Error::other)?;
        limits::write_all(s, &reply)?;
        let mut proof = [0u8; auth::NONCE];
        limits::read_exact(s, &mut proof)?;
        acceptor.finish(&proof).map_err(io::Error::other)
    })
    .map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            "it sent no authentication in time".to_string()
        }
        io::ErrorKind::UnexpectedEof => "it closed the connection during authentication".into(),
        _ => e.to_string(),
    })
}

/// The opener's half of the handshake on a new connection.
fn authenticate_acceptor(
    stream: &TcpStream,
    who: Who<'_>,
    link: usize,
    key: &Key,
    deadline: Instant,
) -> Result<(), String> {
    bounded(stream, deadline, |s| {
        let opener = Opener::new(key, who.rank as u32, who.peer as u32, link as u32);
        limits::write_all(s, opener.hello())?;
        let mut reply = [0u8; 2 * auth::NONCE];
        limits::read_exact(s, &mut reply)?;
        let proof = opener.finish(&reply).map_err(io::Error::other)?;
        limits::write_all(s, &proof)
    })
    .map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            "it did not answer the authentication in time (no key on its side?)".to_string()
        }
        io::ErrorKind::UnexpectedEof => {
            "it closed the connection during authentication (a different key?)".into()
        }
        _ => e.to_string(),
    })
}

/// Accepts exactly one connection on each listener, in order; with a key, connections that
/// fail to authenticate are dropped and the listener waits for the next one.
fn accept_all(
    listeners: Vec<(String, (SocketAddr, TcpListener))>,
    who: Who<'_>,
    deadline: Instant,
    timeout: Duration,
    log: &Log,
) -> Result<Vec<TcpStream>, String> {
    let mut poll = Poll::new().map_err(|e| format!("cannot poll: {e}"))?;
    let mut events = Events::with_capacity(4);
    let mut streams = Vec::with_capacity(listeners.len());
    for (c, (address, (_, mut listener))) in listeners.into_iter().enumerate() {
        poll.registry()
            .register(&mut listener, Token(c), Interest::READABLE)
            .map_err(|e| format!("cannot poll {address}: {e}"))?;
        let stream = loop {
            match listener.accept() {
                Ok((stream, peer)) => {
                    log.debug(format_args!(
                        "accepted {peer} on {address} (connection {c})"
                    ));
                    let stream = TcpStream::from(stream);
                    let Some(key) = who.key else {
                        break stream;
                    };
                    match authenticate_opener(&stream, who, c, key, deadline) {
                        Ok(()) => break stream,
                        Err(why) => log.warn(format_args!(
                            "rejected a connection from {peer} on {address} (connection {c}): {why}"
                        )),
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("accepting on {address}: {e}")),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "rank {} never connected to {address} (connection {c}): timed out after {timeout:?}",
                    who.peer
                ));
            }
            // Wake up every few seconds to say who is still missing.
            let wait = (deadline - now).min(PROGRESS);
            match poll.poll(&mut events, Some(wait)) {
                Ok(()) if events.is_empty() && Instant::now() < deadline => log.info(format_args!(
                    "still waiting for rank {} to connect to {address} (connection {c}), {:?} left",
                    who.peer,
                    deadline.saturating_duration_since(Instant::now())
                )),
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("waiting on {address}: {e}")),
            }
        };
        stream
            .set_nonblocking(false)
            .map_err(|e| format!("accepted socket on {address}: {e}"))?;
        streams.push(stream);
    }
    Ok(streams)
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
        let stream = loop {
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
                break s;
            }
            let now = Instant::now();
            if limits::deadline(now, wait) >= deadline {
                return Err(format!(
                    "cannot connect to rank {to} at {address} (connection {c}) after {attempt} attempts in {timeout:?}: {last}"
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
        if let Some(key) = who.key {
            authenticate_acceptor(&stream, who, c, key, deadline).map_err(|why| {
                format!("authentication with rank {to} at {address} (connection {c}) failed: {why}")
            })?;
        }
        streams.push(stream);
    }
    Ok(streams)
}
