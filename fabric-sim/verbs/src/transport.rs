//! The wire between processes: one Linux abstract-namespace Unix socket per (process, device).
//!
//! Why Unix sockets: the provider must carry messages between unrelated processes on one
//! machine, started by a launcher that knows nothing of it, with no files to clean up after a
//! process is killed. An abstract-namespace socket is named by a string, vanishes with its
//! process, and is refused (`ECONNREFUSED`) once its owner is gone, which is exactly the
//! silence a dead RDMA peer leaves.
//!
//! Each endpoint has a random 24-bit id, made unique on the machine by binding its name
//! `nuvec-verbs-emu.<id as 6 hex digits>`; the GIDs carry that id. A thread accepts
//! connections, and one thread per accepted connection reads length-prefixed messages
//! (destination QPN, source endpoint, source QPN, the sender's path MTU, an immediate-data
//! flag and word, length, all little-endian `u32`, then the payload) and hands
//! each to the destination queue pair. Sending connects on first use and keeps one stream per
//! destination endpoint, written with `MSG_NOSIGNAL`. A refused connection, `EPIPE`, a reset or
//! a message cut short by the sender's death are all silence: UC has no acknowledgement, so the
//! sender's completion does not depend on them.
//!
//! Not modelled: packets (a message is one unit on the wire, whatever the path MTU), link
//! speed, reordering (a stream keeps order, as one UC path does).

use crate::qp::{Origin, Qp};
use rand::RngExt;
use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Mutex, PoisonError};

/// The bytes of a message header: destination QPN, source endpoint, source QPN, the
/// sender's path MTU, whether immediate data follows (0 or 1), the immediate data, payload
/// length.
const HEADER_BYTES: usize = 28;

/// A (process, device) endpoint.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// The 24-bit id the GIDs carry.
    pub(crate) id: u32,
    /// The queue pairs that receive here, by number.
    qps: Mutex<HashMap<u32, Arc<Qp>>>,
    /// One stream per destination endpoint id (`None` until connected, or after it broke).
    conns: Mutex<HashMap<u32, Arc<Mutex<Option<UnixStream>>>>>,
}

/// The abstract socket name of endpoint `id`.
fn socket_name(id: u32) -> String {
    format!("nuvec-verbs-emu.{id:06x}")
}

impl Endpoint {
    /// Binds a new endpoint under a fresh id and starts its receiver thread.
    pub(crate) fn bind() -> io::Result<Arc<Endpoint>> {
        let mut rng = rand::rng();
        let mut last = io::Error::from(io::ErrorKind::AddrInUse);
        for _ in 0..256 {
            let id = rng.random_range(1..=0x00FF_FFFFu32);
            let addr = SocketAddr::from_abstract_name(socket_name(id).as_bytes())?;
            match UnixListener::bind_addr(&addr) {
                Ok(listener) => {
                    let endpoint = Arc::new(Endpoint {
                        id,
                        qps: Mutex::new(HashMap::new()),
                        conns: Mutex::new(HashMap::new()),
                    });
                    let accepting = Arc::clone(&endpoint);
                    std::thread::Builder::new()
                        .name(format!("verbs-emu-{id:06x}"))
                        .spawn(move || accept_loop(&accepting, &listener))?;
                    return Ok(endpoint);
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
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

    /// Sends one message to queue pair `dest_qpn` of endpoint `dest`. Whatever happens on the
    /// way is silence to the sender.
    pub(crate) fn send(&self, dest: u32, dest_qpn: u32, origin: Origin, parts: &[&[u8]]) {
        let slot = {
            let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(conns.entry(dest).or_default())
        };
        let mut stream = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if stream.is_none() {
            let Ok(addr) = SocketAddr::from_abstract_name(socket_name(dest).as_bytes()) else {
                return;
            };
            match UnixStream::connect_addr(&addr) {
                Ok(s) => *stream = Some(s),
                // Nobody there (never was, or gone): the message is lost, as on a dead link.
                Err(_) => return,
            }
        }
        let Some(s) = stream.as_ref() else { return };
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut header = [0u8; HEADER_BYTES];
        let words = [
            dest_qpn,
            origin.endpoint,
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
            // The peer went away (EPIPE, ECONNRESET): forget the stream; the next message
            // tries to connect again and is lost if nobody is there.
            *stream = None;
        }
    }
}

/// Writes all of `bytes` to `stream` without raising `SIGPIPE`.
fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
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

/// Accepts connections for the life of the process, one reader thread each.
fn accept_loop(endpoint: &Arc<Endpoint>, listener: &UnixListener) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let reading = Arc::clone(endpoint);
        let spawned = std::thread::Builder::new()
            .name(format!("verbs-emu-{:06x}-rx", endpoint.id))
            .spawn(move || read_loop(&reading, stream));
        // Without a thread the connection is dropped: its sender sees silence.
        drop(spawned);
    }
}

/// Reads messages from one connection until it ends, delivering each.
fn read_loop(endpoint: &Endpoint, mut stream: UnixStream) {
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; HEADER_BYTES];
        if stream.read_exact(&mut header).is_err() {
            return;
        }
        let word =
            |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (dest_qpn, len) = (word(0), word(24));
        let origin = Origin {
            endpoint: word(4),
            qpn: word(8),
            mtu: word(12),
            imm: (word(16) != 0).then_some(word(20)),
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
