//! JACCL over TCP: the JACCL topology and algorithms on TCP connections, one per cable, so
//! that JACCL's code runs on a real network without RDMA hardware (in CI, or to try a job
//! across machines before cabling them). Selected with `NUVEC_JACCL_FABRIC=tcp`.
//!
//! The job is set up exactly as JACCL's: the same [`Config`] (device file, rank, coordinator),
//! the same side channel. Where JACCL exchanges queue-pair [`Destination`](super::Destination)s
//! over the side channel, each rank here listens on an ephemeral TCP port and all-gathers its
//! address (18 bytes: an IPv6 or IPv4-mapped address and a port). Then every cable becomes a
//! connection: in a mesh of W wires, rank i connects its W cables to every rank j > i; in a
//! ring, every rank connects
//! its C wires to its right neighbour. A connection opens with a 12-byte hello (`b"NJT1"`, the
//! opener's rank and the cable, little-endian `u32`s), so the acceptor knows which channel it
//! is. The acceptor reads the hellos of all its accepted connections at once without blocking,
//! so a connection that sends no whole hello (a stranger) holds up no cable; it is dropped
//! once the real cables are in, or named when the deadline passes. The channels are numbered as [`Wiring`](crate::fabric::Wiring) numbers them, so the
//! mesh's channel to `p` on wire w is link w and the ring's `right_[w]`/`left_[w]` are
//! [`RingTopology::channel`](crate::ring::RingTopology::channel)'s.
//!
//! This is not wire-compatible with anything of MLX's (MLX's JACCL speaks only RDMA): it exists
//! to exercise the algorithms, the side channel and the failure handling across processes.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};

use super::config::{Config, Topology};
use super::side_channel::SideChannel;
use crate::error::Error;
use crate::limits;
use crate::transport::tcp::TcpFabric;

/// The first bytes of every connection.
const MAGIC: &[u8; 4] = b"NJT1";
/// The hello: magic, opener's rank, cable.
const HELLO: usize = 12;
/// The bytes of one rank's listen address in the all-gather ([`encode_address`]).
pub const ADDRESS: usize = 18;

/// Cables as `(peer, cable index)`.
type Cables = Vec<(usize, usize)>;

/// Connects this rank's cables as TCP connections, rendezvousing over `side`, within
/// `timeout`; returns the fabric and the topology it carries.
pub fn connect(
    config: &Config,
    side: &mut SideChannel,
    timeout: Duration,
) -> Result<(TcpFabric, Topology), Error> {
    let topology = config.topology()?;
    let ip = side
        .local_ip()
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    let fabric = connect_over(
        config.rank(),
        config.size(),
        topology,
        ip,
        |mine| side.all_gather(mine),
        timeout,
    )?;
    Ok((fabric, topology))
}

/// [`connect`] for rank `rank` of `size` cabled as `topology`, listening on `ip`, with
/// `all_gather` (this rank's [`ADDRESS`] bytes in, every rank's concatenated in rank order out)
/// as the rendezvous: JACCL's side channel for a job, the parent group for a sub-group.
pub(crate) fn connect_over(
    rank: usize,
    size: usize,
    topology: Topology,
    ip: IpAddr,
    all_gather: impl FnOnce(&[u8]) -> Result<Vec<u8>, Error>,
    timeout: Duration,
) -> Result<TcpFabric, Error> {
    let deadline = limits::deadline_in(timeout);
    let fail = |what: String| Error::Connect {
        rank,
        what: format!("jaccl over tcp: {what}"),
    };
    let mut listener = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(|e| fail(format!("cannot listen on {ip}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| fail(format!("no listening address: {e}")))?;
    let gathered = all_gather(&encode_address(local))?;
    if gathered.len() != size * ADDRESS {
        return Err(fail(format!(
            "the address exchange returned {} bytes, not {ADDRESS} × {size} ranks",
            gathered.len()
        )));
    }
    let address = |r: usize| decode_address(&gathered[r * ADDRESS..(r + 1) * ADDRESS]);

    // Which cables this rank opens (peer, cable) and how many it accepts per peer.
    let wires = match topology {
        Topology::Mesh { wires } | Topology::Ring { wires } => wires,
    };
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    let (opens, accepts): (Cables, Cables) = match topology {
        Topology::Mesh { .. } => (
            (rank + 1..size)
                .flat_map(|j| (0..wires).map(move |w| (j, w)))
                .collect(),
            (0..rank)
                .flat_map(|i| (0..wires).map(move |w| (i, w)))
                .collect(),
        ),
        Topology::Ring { .. } if size < 2 => (Vec::new(), Vec::new()),
        Topology::Ring { .. } => (
            (0..wires).map(|w| (right, w)).collect(),
            (0..wires).map(|w| (left, w)).collect(),
        ),
    };

    let mut opened: Vec<TcpStream> = Vec::with_capacity(opens.len());
    for &(peer, cable) in &opens {
        let to = address(peer);
        let left_over = deadline.saturating_duration_since(Instant::now());
        let stream = TcpStream::connect_timeout(&to, left_over.max(Duration::from_millis(1)))
            .map_err(|e| {
                fail(format!(
                    "cannot connect cable {cable} to rank {peer} at {to}: {e}"
                ))
            })?;
        let mut hello = [0u8; HELLO];
        hello[..4].copy_from_slice(MAGIC);
        hello[4..8].copy_from_slice(&(rank as u32).to_le_bytes());
        hello[8..].copy_from_slice(&(cable as u32).to_le_bytes());
        stream
            .set_write_timeout(Some(left_over.max(Duration::from_millis(1))))
            .and_then(|()| limits::write_all(&stream, &hello))
            .map_err(|e| fail(format!("cannot greet rank {peer} on cable {cable}: {e}")))?;
        opened.push(stream);
    }
    let mut accepted =
        accept_cables(&mut listener, &accepts, size, deadline, timeout).map_err(fail)?;

    let mut by_peer: Vec<Vec<TcpStream>> = (0..size).map(|_| Vec::new()).collect();
    // Opened connections first, then accepted ones, each in cable order (the Wiring rule).
    for (stream, &(peer, _)) in opened.into_iter().zip(&opens) {
        by_peer[peer].push(stream);
    }
    accepted.sort_by_key(|(peer, cable, _)| (*peer, *cable));
    for (peer, _, stream) in accepted {
        by_peer[peer].push(stream);
    }
    TcpFabric::from_streams(rank, by_peer)
        .map_err(|e| fail(format!("cannot set up the connections: {e}")))
}

/// `addr` as [`ADDRESS`] bytes: its IPv6 (or IPv4-mapped) address, then its port
/// (little-endian).
pub fn encode_address(addr: SocketAddr) -> [u8; ADDRESS] {
    let mut out = [0u8; ADDRESS];
    let ip = match addr.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    out[..16].copy_from_slice(&ip.octets());
    out[16..].copy_from_slice(&addr.port().to_le_bytes());
    out
}

/// The address [`encode_address`] wrote into the first [`ADDRESS`] bytes of `bytes` (IPv4-mapped
/// addresses back as IPv4).
///
/// # Panics
/// If `bytes` is shorter than [`ADDRESS`].
pub fn decode_address(bytes: &[u8]) -> SocketAddr {
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&bytes[..16]);
    let v6 = Ipv6Addr::from(octets);
    let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
    SocketAddr::new(ip, u16::from_le_bytes([bytes[16], bytes[17]]))
}

/// An accepted connection whose hello is not complete yet.
struct Pending {
    stream: mio::net::TcpStream,
    from: SocketAddr,
    hello: [u8; HELLO],
    got: usize,
}

/// Accepts the cables in `expected` (peer, cable), reading each one's hello; connections that
/// close or fail before a whole hello, or whose magic is wrong, are dropped.
///
/// Hellos are read without blocking, from every accepted connection at once, never past the
/// hello (what follows belongs to the first operation): a connection that sends part of a
/// hello, or nothing, holds up no other, and only waits with them for the deadline.
fn accept_cables(
    listener: &mut TcpListener,
    expected: &[(usize, usize)],
    size: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<(usize, usize, TcpStream)>, String> {
    const LISTENER: Token = Token(0);
    let mut poll = Poll::new().map_err(|e| format!("cannot poll: {e}"))?;
    let mut events = Events::with_capacity(16);
    poll.registry()
        .register(listener, LISTENER, Interest::READABLE)
        .map_err(|e| format!("cannot poll the listener: {e}"))?;
    let mut got: Vec<(usize, usize, TcpStream)> = Vec::new();
    let mut pending: Vec<Pending> = Vec::new();
    let mut next_token = 1;
    while got.len() < expected.len() {
        loop {
            let (mut stream, from) = match listener.accept() {
                Ok(pair) => pair,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) => return Err(format!("accepting: {e}")),
            };
            poll.registry()
                .register(&mut stream, Token(next_token), Interest::READABLE)
                .map_err(|e| format!("cannot poll a connection from {from}: {e}"))?;
            next_token += 1;
            pending.push(Pending {
                stream,
                from,
                hello: [0; HELLO],
                got: 0,
            });
        }
        // Read what each connection has sent of its hello.
        let mut i = 0;
        while i < pending.len() {
            let p = &mut pending[i];
            let outcome = loop {
                match limits::read(&mut p.stream, &mut p.hello[p.got..]) {
                    Ok(0) => break Some(false),
                    Ok(k) => {
                        p.got += k;
                        if p.got == HELLO {
                            break Some(true);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break Some(false),
                }
            };
            let Some(complete) = outcome else {
                i += 1;
                continue;
            };
            let mut p = pending.swap_remove(i);
            let _ = poll.registry().deregister(&mut p.stream);
            if !complete || &p.hello[..4] != MAGIC {
                // Not one of ours (or it gave up): drop it.
                continue;
            }
            let hello = p.hello;
            let peer = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]) as usize;
            let cable = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]) as usize;
            let from = p.from;
            if peer >= size || !expected.contains(&(peer, cable)) {
                return Err(format!(
                    "a connection from {from} says it is rank {peer} cable {cable}, which this rank does not expect"
                ));
            }
            if got.iter().any(|(gp, gc, _)| (*gp, *gc) == (peer, cable)) {
                return Err(format!(
                    "rank {peer} cable {cable} connected twice (the second from {from})"
                ));
            }
            got.push((peer, cable, TcpStream::from(p.stream)));
        }
        if got.len() == expected.len() {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<String> = expected
                .iter()
                .filter(|(p, c)| !got.iter().any(|(gp, gc, _)| (gp, gc) == (p, c)))
                .map(|(p, c)| format!("rank {p} cable {c}"))
                .collect();
            let strangers = if pending.is_empty() {
                String::new()
            } else {
                let from: Vec<String> = pending.iter().map(|p| p.from.to_string()).collect();
                format!(
                    " ({} connection(s) sent no whole hello: {})",
                    pending.len(),
                    from.join(", ")
                )
            };
            return Err(format!(
                "timed out after {timeout:?} waiting for {}{strangers}",
                missing.join(", ")
            ));
        }
        match poll.poll(&mut events, Some(deadline - now)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("polling the listener: {e}")),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_survive_the_gather_encoding() {
        for a in ["127.0.0.1:5000", "[::1]:65535", "10.1.2.3:0"] {
            let addr: SocketAddr = a.parse().unwrap();
            assert_eq!(decode_address(&encode_address(addr)), addr);
        }
    }
}
