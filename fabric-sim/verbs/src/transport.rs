//! The wire between processes: one stream listener per (process, device), over Linux
//! abstract-namespace Unix sockets (the default) or over TCP (`NUVEC_VERBS_EMU_WIRE=tcp`).
//!
//! Why Unix sockets by default: the provider must carry messages between unrelated processes
//! on one machine, started by a launcher that knows nothing of it, with no files to clean up
//! after a process is killed. An abstract-namespace socket is named by a string, vanishes with
//! its process, and is refused (`ECONNREFUSED`) once its owner is gone, which is exactly the
//! silence a dead RDMA peer leaves. Each such endpoint has a random 24-bit id, made unique on
//! the machine by binding its name `nuvec-verbs-emu.<id as 6 hex digits>`; the GIDs carry that
//! id.
//!
//! Why TCP too: abstract sockets belong to a network namespace, so ranks on different hosts
//! of a cluster (one namespace each, joined by shaped veth links) cannot reach each other
//! through them, and their messages would never cross a link that can be slow or pulled. Over
//! TCP an endpoint listens on an IPv4 address of its host, on a port the kernel picks; its
//! id is `address << 16 | port`. The IPv4-mapped GID is the host's real address (as on a Mac,
//! whose Thunderbolt interface's address is the GID MLX advertises), and the port, which a
//! GID has no room for, travels in the queue pair numbers: every QPN of a TCP endpoint is
//! `port << 8 | n`, so the destination GID and QPN that MLX's bring-up exchanges name the
//! endpoint. Connections are made with a 250 ms timeout (and, after one failed, not tried
//! again for a second) and written with a 500 ms stall timeout: a message that cannot leave
//! within them (a pulled cable, a dead host) is lost, as UC loses it. A post here writes
//! before it returns (a real device queues it), so over a dead link a post can take up to
//! 500 ms: a fabric's deadline may be overrun by that much, never by more.
//!
//! A thread accepts connections, and one thread per accepted connection reads length-prefixed
//! messages (destination QPN, source endpoint as two words, low first, source QPN, the
//! sender's path MTU, an immediate-data flag and word, length, all little-endian `u32`, then
//! the payload) and hands each to the destination queue pair. Sending connects on first use
//! and keeps one stream per destination endpoint, written with `MSG_NOSIGNAL`. A refused
//! connection, `EPIPE`, a reset, a timeout or a message cut short by the sender's death are
//! all silence: UC has no acknowledgement, so the sender's completion does not depend on them.
//!
//! Not modelled: packets (a message is one unit on the wire, whatever the path MTU), link
//! speed beyond what the real link in between imposes, reordering (a stream keeps order, as
//! one UC path does).

use crate::config::{self, WireChoice};
use crate::qp::{Origin, Qp};
use crate::qp_state::MAX_QPN;
use rand::RngExt;
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

/// The bytes of a message header: destination QPN, source endpoint (two words), source QPN,
/// the sender's path MTU, whether immediate data follows (0 or 1), the immediate data,
/// payload length.
const HEADER_BYTES: usize = 32;

/// How long a TCP connection to a peer's endpoint may take before the message is lost (on a
/// working link it takes well under a millisecond; a lost SYN would wait 1 s to be resent).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);

/// How long a TCP write may make no progress before the stream is given up and the message
/// lost (a pulled cable: nothing acknowledges, the send buffer stays full). Long enough for a
/// retransmission on a shaped, busy link (Linux's minimum RTO is 200 ms).
const STALL_TIMEOUT: Duration = Duration::from_millis(500);

/// After a connection to an endpoint failed, how long messages to it are lost at once rather
/// than waiting for another connection attempt.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// Where an endpoint listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// An abstract Unix socket named after a 24-bit id.
    Unix,
    /// A TCP port on an IPv4 address of this host.
    Tcp {
        /// The address, which the IPv4-mapped GID carries.
        address: Ipv4Addr,
        /// The port, which the queue pair numbers carry.
        port: u16,
    },
}

/// A (process, device) endpoint.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// The id the GIDs (and, over TCP, the QPNs) carry: a 24-bit number over Unix sockets,
    /// `address << 16 | port` over TCP.
    pub(crate) id: u64,
    /// Where it listens.
    pub(crate) place: Place,
    /// The next queue pair number of a TCP endpoint (its low 8 bits).
    next_qp: AtomicU32,
    /// The queue pairs that receive here, by number.
    qps: Mutex<HashMap<u32, Arc<Qp>>>,
    /// One link per destination endpoint id.
    conns: Mutex<HashMap<u64, Arc<Mutex<Link>>>>,
}

/// The sending side of the connection to one destination endpoint.
#[derive(Debug, Default)]
struct Link {
    /// The stream (`None` until connected, or after it broke).
    stream: Option<Stream>,
    /// When the last connection attempt failed, if it did and no stream has been made since.
    refused_at: Option<std::time::Instant>,
}

/// A connected stream of either wire.
#[derive(Debug)]
enum Stream {
    /// An abstract Unix socket.
    Unix(UnixStream),
    /// A TCP connection.
    Tcp(TcpStream),
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

/// The abstract socket name of Unix endpoint `id`.
fn socket_name(id: u64) -> String {
    format!("nuvec-verbs-emu.{id:06x}")
}

/// The endpoint id of a TCP endpoint.
pub(crate) fn tcp_id(address: Ipv4Addr, port: u16) -> u64 {
    (u64::from(u32::from(address)) << 16) | u64::from(port)
}

/// The wire the configuration asks for (Unix when the configuration is bad: nothing is then
/// listed, so nothing binds).
fn wire() -> WireChoice {
    config::get()
        .as_ref()
        .map_or(WireChoice::Unix, |config| config.wire)
}

impl Endpoint {
    /// Binds a new endpoint on the configured wire and starts its receiver thread.
    pub(crate) fn bind() -> io::Result<Arc<Endpoint>> {
        match wire() {
            WireChoice::Unix => Endpoint::bind_unix(),
            WireChoice::Tcp(address) => {
                Endpoint::bind_tcp(address.unwrap_or_else(first_host_address))
            }
        }
    }

    /// A new endpoint with this id and place.
    fn new(id: u64, place: Place) -> Arc<Endpoint> {
        Arc::new(Endpoint {
            id,
            place,
            next_qp: AtomicU32::new(0),
            qps: Mutex::new(HashMap::new()),
            conns: Mutex::new(HashMap::new()),
        })
    }

    /// Binds an abstract Unix socket under a fresh 24-bit id.
    fn bind_unix() -> io::Result<Arc<Endpoint>> {
        let mut rng = rand::rng();
        let mut last = io::Error::from(io::ErrorKind::AddrInUse);
        for _ in 0..256 {
            let id = u64::from(rng.random_range(1..=0x00FF_FFFFu32));
            let addr = SocketAddr::from_abstract_name(socket_name(id).as_bytes())?;
            match UnixListener::bind_addr(&addr) {
                Ok(listener) => {
                    let endpoint = Endpoint::new(id, Place::Unix);
                    let accepting = Arc::clone(&endpoint);
                    std::thread::Builder::new()
                        .name(format!("verbs-emu-{id:06x}"))
                        .spawn(move || {
                            for stream in listener.incoming() {
                                let Ok(stream) = stream else { continue };
                                start_reader(&accepting, stream);
                            }
                        })?;
                    return Ok(endpoint);
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Binds a TCP listener on `address`, on a port the kernel picks.
    fn bind_tcp(address: Ipv4Addr) -> io::Result<Arc<Endpoint>> {
        let listener = TcpListener::bind(SocketAddrV4::new(address, 0))?;
        let port = listener.local_addr()?.port();
        let endpoint = Endpoint::new(tcp_id(address, port), Place::Tcp { address, port });
        let accepting = Arc::clone(&endpoint);
        std::thread::Builder::new()
            .name(format!("verbs-emu-{port}"))
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let _ = stream.set_nodelay(true);
                    start_reader(&accepting, stream);
                }
            })?;
        Ok(endpoint)
    }

    /// A queue pair number for a new queue pair of this endpoint: from a process-wide counter
    /// over Unix sockets; `port << 8 | n` over TCP, with `n` (1 to 255) not in use here.
    pub(crate) fn next_qpn(&self) -> Result<u32, i32> {
        match self.place {
            Place::Unix => Ok(next_unix_qpn()),
            Place::Tcp { port, .. } => {
                let attached = self.qps.lock().unwrap_or_else(PoisonError::into_inner);
                for _ in 0..255 {
                    let n = self.next_qp.fetch_add(1, Ordering::Relaxed) % 255 + 1;
                    let qpn = (u32::from(port) << 8) | n;
                    if !attached.contains_key(&qpn) {
                        return Ok(qpn);
                    }
                }
                Err(libc::ENOMEM)
            }
        }
    }

    /// Makes queue pair `qp` reachable under its number.
    pub(crate) fn attach(&self, qpn: u32, qp: Arc<Qp>) {
        self.qps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(qpn, qp);
    }

    /// Makes queue pair `qpn` unreachable: messages to it are dropped from now on.
    pub(crate) fn detach(&self, qpn: u32) {
        self.qps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&qpn);
    }

    /// Connects to endpoint `dest` on this endpoint's wire, or `None` when nobody answers.
    fn connect(&self, dest: u64) -> Option<Stream> {
        match self.place {
            Place::Unix => {
                let addr = SocketAddr::from_abstract_name(socket_name(dest).as_bytes()).ok()?;
                UnixStream::connect_addr(&addr).ok().map(Stream::Unix)
            }
            Place::Tcp { .. } => {
                let address = Ipv4Addr::from((dest >> 16) as u32);
                let port = (dest & 0xFFFF) as u16;
                let stream = TcpStream::connect_timeout(
                    &SocketAddrV4::new(address, port).into(),
                    CONNECT_TIMEOUT,
                )
                .ok()?;
                stream.set_nodelay(true).ok()?;
                stream.set_write_timeout(Some(STALL_TIMEOUT)).ok()?;
                Some(Stream::Tcp(stream))
            }
        }
    }

    /// Sends one message to queue pair `dest_qpn` of endpoint `dest`. Whatever happens on the
    /// way is silence to the sender.
    pub(crate) fn send(&self, dest: u64, dest_qpn: u32, origin: Origin, parts: &[&[u8]]) {
        let slot = {
            let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(conns.entry(dest).or_default())
        };
        let mut link = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if link.stream.is_none() {
            if link
                .refused_at
                .is_some_and(|at| at.elapsed() < RECONNECT_AFTER)
            {
                return;
            }
            // Nobody there (never was, or gone, or unreachable): the message is lost, as on a
            // dead link.
            link.stream = self.connect(dest);
            // Over Unix sockets a refusal is immediate, so every message may try again.
            let tcp = matches!(self.place, Place::Tcp { .. });
            link.refused_at = (tcp && link.stream.is_none()).then(std::time::Instant::now);
        }
        let Some(s) = link.stream.as_ref() else {
            return;
        };
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut header = [0u8; HEADER_BYTES];
        let words = [
            dest_qpn,
            origin.endpoint as u32,
            (origin.endpoint >> 32) as u32,
            origin.qpn,
            origin.mtu,
            u32::from(origin.imm.is_some()),
            origin.imm.unwrap_or(0),
            len as u32,
        ];
        for (chunk, word) in header.chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        let whole = std::iter::once(&header[..])
            .chain(parts.iter().copied())
            .try_for_each(|part| send_all(s, part));
        if whole.is_err() {
            // The peer went away (EPIPE, ECONNRESET) or the link stalled: forget the stream;
            // the next message tries to connect again and is lost if nobody is there.
            link.stream = None;
        }
    }
}

/// A queue pair number of a Unix endpoint: unique in the process, 24 bits, never 0 or 1 (the
/// special queue pairs), starting from a value derived from the process id so that two
/// processes rarely hand out the same numbers (a peer's QPN used in place of one's own shows).
fn next_unix_qpn() -> u32 {
    static NEXT: LazyLock<AtomicU32> =
        LazyLock::new(|| AtomicU32::new((std::process::id() & 0xFFF) << 8));
    loop {
        let qpn = NEXT.fetch_add(1, Ordering::Relaxed) & MAX_QPN;
        if qpn > 1 {
            return qpn;
        }
    }
}

/// The first IPv4 address of an interface that is up and not loopback, in the order the
/// kernel lists them, or 127.0.0.1.
fn first_host_address() -> Ipv4Addr {
    let mut found = None;
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is a valid place for the list's head; on success the kernel's list is
    // ours until `freeifaddrs`.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Ipv4Addr::LOCALHOST;
    }
    let mut entry = list;
    while !entry.is_null() && found.is_none() {
        // SAFETY: `entry` is a non-null node of the list `getifaddrs` returned, not yet freed.
        let ifa = unsafe { &*entry };
        let up = ifa.ifa_flags & libc::IFF_UP as u32 != 0;
        let loopback = ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0;
        let family = if ifa.ifa_addr.is_null() {
            None
        } else {
            // SAFETY: a non-null `ifa_addr` points at a socket address of the list.
            Some(i32::from(unsafe { (*ifa.ifa_addr).sa_family }))
        };
        let address = (family == Some(libc::AF_INET)).then(|| {
            // SAFETY: an `AF_INET` socket address of the list is a `sockaddr_in`.
            let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
            Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))
        });
        if up && !loopback {
            found = address;
        }
        entry = ifa.ifa_next;
    }
    // SAFETY: `list` came from a successful `getifaddrs` and is freed once.
    unsafe { libc::freeifaddrs(list) };
    found.unwrap_or(Ipv4Addr::LOCALHOST)
}

/// Writes all of `bytes` to `stream` without raising `SIGPIPE`.
fn send_all(stream: &impl AsRawFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a live slice of `bytes.len()` readable bytes and the descriptor
        // belongs to `stream`, borrowed for the call; MSG_NOSIGNAL turns a closed peer into
        // EPIPE instead of a signal that would kill a host process that does not ignore it.
        let sent = unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if sent < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        bytes = &bytes[sent as usize..];
    }
    Ok(())
}

/// Starts the thread that reads one accepted connection. Without a thread the connection is
/// dropped: its sender sees silence.
fn start_reader(endpoint: &Arc<Endpoint>, stream: impl Read + Send + 'static) {
    let reading = Arc::clone(endpoint);
    let spawned = std::thread::Builder::new()
        .name(format!("verbs-emu-{:x}-rx", endpoint.id))
        .spawn(move || read_loop(&reading, stream));
    drop(spawned);
}

/// Reads messages from one connection until it ends, delivering each.
fn read_loop(endpoint: &Endpoint, mut stream: impl Read) {
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; HEADER_BYTES];
        if stream.read_exact(&mut header).is_err() {
            return;
        }
        let word =
            |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (dest_qpn, len) = (word(0), word(28));
        let origin = Origin {
            endpoint: u64::from(word(4)) | (u64::from(word(8)) << 32),
            qpn: word(12),
            mtu: word(16),
            imm: (word(20) != 0).then_some(word(24)),
        };
        if len > crate::device::MAX_MSG_SZ {
            return;
        }
        payload.resize(len as usize, 0);
        if stream.read_exact(&mut payload).is_err() {
            // Cut short by the sender's death: never delivered, as a partial UC message.
            return;
        }
        let qp = endpoint
            .qps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&dest_qpn)
            .cloned();
        if let Some(qp) = qp {
            qp.deliver(origin, &payload);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcp_endpoint_numbers_its_queue_pairs_after_its_port_and_reuses_none_in_use() {
        let endpoint = Endpoint::new(
            tcp_id(Ipv4Addr::LOCALHOST, 0x1234),
            Place::Tcp {
                address: Ipv4Addr::LOCALHOST,
                port: 0x1234,
            },
        );
        let mut seen = std::collections::HashSet::new();
        for _ in 0..255 {
            let qpn = endpoint.next_qpn().unwrap();
            assert_eq!(qpn >> 8, 0x1234);
            assert_ne!(qpn & 0xFF, 0);
            assert!(seen.insert(qpn), "{qpn:#x} twice");
        }
    }

    #[test]
    fn the_host_address_found_is_ipv4_and_not_unspecified() {
        assert!(!first_host_address().is_unspecified());
    }
}
