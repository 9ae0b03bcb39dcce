//! The side channel's thin TCP driver: rank 0's coordinator socket and the accepting of every
//! rank's connection, the other ranks' connecting with retries, and one bounded read or write
//! at a time for the [`protocol`](super::protocol) state machine.
//!
//! It may use the operating system's sockets (`std::net`, `mio`, `socket2`), the crate's
//! [`limits`] (every read and write asks for at most 1 GiB; every deadline saturates) and the
//! protocol's pure pieces ([`hello`], [`HelloReader`], [`Roster`], [`Stall`]); it knows nothing
//! of all-gathers. Invariants: no call waits past its deadline; a failure names the
//! coordinator or the peer and what failed; rank 0 never reads past a connection's hello.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::protocol::liveness::Look;
use super::protocol::{HelloReader, Roster, Short, Stall, hello};
use crate::limits;

/// One read of at most `buf.len()` bytes (and [`limits::MAX_IO`]) before `deadline`: how many
/// came, never 0.
pub(super) fn read_some(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<usize, Stall> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Stall::TimedOut);
        }
        stream.set_read_timeout(Some(left)).map_err(Stall::Io)?;
        match limits::read(&mut *stream, buf) {
            Ok(0) => return Err(Stall::Closed),
            Ok(k) => return Ok(k),
            Err(e) if is_wait(&e) => {}
            Err(e) if is_closed(&e) => return Err(Stall::Closed),
            Err(e) => return Err(Stall::Io(e)),
        }
    }
}

/// One write of a prefix of `buf` (at most [`limits::MAX_IO`] bytes) before `deadline`: how
/// many went, never 0.
pub(super) fn write_some(
    stream: &mut TcpStream,
    buf: &[u8],
    deadline: Instant,
) -> Result<usize, Stall> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Stall::TimedOut);
        }
        stream.set_write_timeout(Some(left)).map_err(Stall::Io)?;
        match limits::write(&mut *stream, buf) {
            Ok(0) => return Err(Stall::Closed),
            Ok(k) => return Ok(k),
            Err(e) if is_wait(&e) => {}
            Err(e) if is_closed(&e) => return Err(Stall::Closed),
            Err(e) => return Err(Stall::Io(e)),
        }
    }
}

/// One look at a non-blocking connection that reads and writes nothing: a peek at one byte
/// (left in place), which also returns the connection's error.
pub(super) fn look(stream: &TcpStream) -> Look {
    // The peek returns the connection's hard error (a reset; the kernel giving up on it once
    // its keepalive probes went unanswered), not a soft one such as the "no route to host"
    // of a glitch it survives, which `SO_ERROR` would return.
    let mut byte = [0u8; 1];
    loop {
        return match stream.peek(&mut byte) {
            Ok(0) => Look::Closed,
            Ok(_) => Look::Bytes,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Look::Nothing,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Look::Failed(format!(
                "went silent: its keepalive probes went unanswered for the link timeout (a dead \
                 host or a cut cable; {e})"
            )),
            Err(e) => Look::Failed(e.to_string()),
        };
    }
}

/// Waits until the peer has acknowledged every byte sent on `stream`, or `deadline` passes.
///
/// A rank other than 0 calls it right after sending its hello, so connecting means "hello
/// sent and acknowledged" (see the [module docs](super)): once rank 0's kernel acknowledges
/// the hello it holds an accepted connection for it, and nothing sent after can be taken for
/// a forged SYN cookie. No event says that bytes were acknowledged, so this reads how many
/// the send queue still holds (`SIOCOUTQ` on Linux, `SO_NWRITE` on macOS) and looks again
/// after 1 ms, then 2, 4, … up to 50 ms. Over loopback the first look usually finds none;
/// across hosts it usually finds the hello still in flight, so connecting takes a round trip
/// more, rounded up to the next look (1 ms on a local link). Elsewhere it does not wait.
fn wait_acknowledged(stream: &TcpStream, deadline: Instant) -> Result<(), Stall> {
    let mut wait = Duration::from_millis(1);
    loop {
        if let Some(e) = stream.take_error().map_err(Stall::Io)? {
            return Err(if is_closed(&e) {
                Stall::Closed
            } else {
                Stall::Io(e)
            });
        }
        if unacknowledged(stream).map_err(Stall::Io)? == 0 {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Stall::TimedOut);
        }
        std::thread::sleep(wait.min(left));
        wait = (wait * 2).min(Duration::from_millis(50));
    }
}

/// The bytes written to `stream` that its peer has not acknowledged yet.
#[cfg(target_os = "linux")]
fn unacknowledged(stream: &TcpStream) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut bytes: libc::c_int = 0;
    // SAFETY: the descriptor belongs to `stream`, borrowed for the call, and `SIOCOUTQ`
    // (`TIOCOUTQ`) writes one `int` to the valid, writable `bytes`.
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(bytes).unwrap_or(0))
}

/// The bytes written to `stream` that its peer has not acknowledged yet.
#[cfg(target_vendor = "apple")]
fn unacknowledged(stream: &TcpStream) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut bytes: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor belongs to `stream`, borrowed for the call; `SO_NWRITE` writes
    // at most `len` bytes (one `int`) to the valid, writable `bytes` and its size to `len`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NWRITE,
            (&raw mut bytes).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(bytes).unwrap_or(0))
}

/// Elsewhere: not known, so not waited for.
#[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
fn unacknowledged(_stream: &TcpStream) -> io::Result<usize> {
    Ok(0)
}

/// Writes all of `buf` before `deadline`.
fn write_by(stream: &mut TcpStream, buf: &[u8], deadline: Instant) -> Result<(), String> {
    let len = buf.len();
    let mut done = 0;
    while done < len {
        match write_some(stream, &buf[done..], deadline) {
            Ok(k) => done += k,
            Err(stall) => {
                return Err(Short {
                    stall: &stall,
                    done,
                    len,
                }
                .to_string());
            }
        }
    }
    Ok(())
}

/// A timed-out or interrupted socket call, to retry until the deadline.
fn is_wait(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// A socket error meaning the peer went away.
fn is_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

/// A connection accepted by rank 0 whose hello is not complete yet.
struct Pending {
    stream: mio::net::TcpStream,
    peer: SocketAddr,
    hello: HelloReader,
}

/// Rank 0: listens on the coordinator and accepts until every rank 1..size has said hello;
/// returns the connections ordered by rank.
pub(super) fn accept_ranks(
    addrs: &[SocketAddr],
    coordinator: &str,
    size: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<TcpStream>, String> {
    const LISTENER: Token = Token(0);
    let mut listener = listen(addrs, coordinator)?;
    let mut poll = Poll::new().map_err(|e| format!("cannot poll: {e}"))?;
    let mut events = Events::with_capacity(64);
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .map_err(|e| format!("cannot poll the coordinator {coordinator}: {e}"))?;
    let mut roster = Roster::new(size);
    let mut slots: Vec<Option<TcpStream>> = (1..size).map(|_| None).collect();
    let mut pending: Vec<Pending> = Vec::new();
    let mut next_token = 1usize;
    // Connections that closed or failed before their hello was complete.
    let mut dropped: Vec<String> = Vec::new();
    loop {
        // Accept every connection waiting.
        loop {
            match listener.accept() {
                Ok((mut stream, peer)) => {
                    let token = Token(next_token);
                    next_token += 1;
                    poll.registry()
                        .register(&mut stream, token, Interest::READABLE)
                        .map_err(|e| format!("cannot poll the connection from {peer}: {e}"))?;
                    pending.push(Pending {
                        stream,
                        peer,
                        hello: HelloReader::default(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A connection reset before it was accepted: the next one may be fine.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(format!("accepting on the coordinator {coordinator}: {e}")),
            }
        }
        // Read what each pending connection has sent of its hello, never past it: the bytes
        // after the hello belong to the first all-gather.
        let mut i = 0;
        while i < pending.len() {
            let p = &mut pending[i];
            let outcome = loop {
                let mut buf = [0u8; 4];
                let want = p.hello.wants();
                match limits::read(&mut p.stream, &mut buf[..want]) {
                    Ok(0) => break Some(Err("closed".to_owned())),
                    Ok(k) => {
                        p.hello.on_received(&buf[..k]);
                        if let Some(hello) = p.hello.hello() {
                            break Some(Ok(hello));
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => break Some(Err(e.to_string())),
                }
            };
            match outcome {
                None => i += 1,
                Some(Err(why)) => {
                    let p = pending.swap_remove(i);
                    dropped.push(format!(
                        "{} ({why} after {} of the 4 hello bytes)",
                        p.peer,
                        p.hello.got()
                    ));
                }
                Some(Ok(hello)) => {
                    let mut p = pending.swap_remove(i);
                    let peer = p.peer;
                    let r = roster.admit(hello, &peer.to_string(), coordinator)?;
                    // Leave the poll's registry before the stream becomes blocking again.
                    poll.registry()
                        .deregister(&mut p.stream)
                        .map_err(|e| format!("rank {r}'s connection from {peer}: {e}"))?;
                    let stream = TcpStream::from(p.stream);
                    stream
                        .set_nonblocking(false)
                        .map_err(|e| format!("rank {r}'s connection from {peer}: {e}"))?;
                    slots[r - 1] = Some(stream);
                }
            }
        }
        if roster.is_complete() {
            // Connections that never said hello are strangers: they are closed here.
            return Ok(slots.into_iter().flatten().collect());
        }
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<String> = roster.missing().iter().map(usize::to_string).collect();
            let mut what = format!(
                "rank{} {} did not connect to the coordinator {coordinator} and send {} rank \
                 within {timeout:?}",
                if missing.len() == 1 { "" } else { "s" },
                missing.join(", "),
                if missing.len() == 1 { "its" } else { "their" }
            );
            if !pending.is_empty() {
                let silent: Vec<String> = pending
                    .iter()
                    .map(|p| format!("{} ({} of 4 bytes)", p.peer, p.hello.got()))
                    .collect();
                what.push_str(&format!(
                    "; {} connection{} sent no complete rank hello: {}",
                    silent.len(),
                    if silent.len() == 1 { "" } else { "s" },
                    silent.join(", ")
                ));
            }
            if !dropped.is_empty() {
                what.push_str(&format!(
                    "; {} connection{} closed before saying hello: {}",
                    dropped.len(),
                    if dropped.len() == 1 { "" } else { "s" },
                    dropped.join(", ")
                ));
            }
            return Err(what);
        }
        match poll.poll(&mut events, Some(deadline - now)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("waiting on the coordinator {coordinator}: {e}")),
        }
    }
}

/// The coordinator's listening socket: the first of `addrs` that binds.
fn listen(addrs: &[SocketAddr], coordinator: &str) -> Result<TcpListener, String> {
    let mut last = String::from("it resolves to no address");
    for &addr in addrs {
        let attempt = (|| {
            let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
            socket.set_reuse_address(true)?;
            socket.bind(&SockAddr::from(addr))?;
            socket.listen(128)?;
            socket.set_nonblocking(true)?;
            Ok::<_, io::Error>(TcpListener::from_std(socket.into()))
        })();
        match attempt {
            Ok(listener) => return Ok(listener),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(format!(
        "rank 0 cannot listen on the coordinator {coordinator}: {last}"
    ))
}

/// Other ranks: connects to the coordinator, retrying while rank 0 is not listening yet, and
/// sends this rank's hello.
pub(super) fn connect_to_coordinator(
    addrs: &[SocketAddr],
    coordinator: &str,
    rank: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream, String> {
    let mut wait = Duration::from_millis(10);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let mut last = String::from("it resolves to no address");
        for addr in addrs {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), Duration::from_secs(5));
            match TcpStream::connect_timeout(addr, left) {
                Ok(s) => return send_hello(s, rank, coordinator, deadline),
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
        let now = Instant::now();
        if limits::deadline(now, wait) >= deadline {
            return Err(format!(
                "cannot reach the coordinator {coordinator} (rank 0) after {attempts} attempt{} \
                 in {timeout:?}: {last}",
                if attempts == 1 { "" } else { "s" }
            ));
        }
        // Back off: rank 0 may not be listening yet.
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_millis(500));
    }
}

/// Sends `rank` as MLX's 4-byte little-endian hello and waits until rank 0 has acknowledged
/// it, so that the first block sent after it cannot be taken for a forged SYN cookie (see
/// [`wait_acknowledged`]).
fn send_hello(
    mut stream: TcpStream,
    rank: usize,
    coordinator: &str,
    deadline: Instant,
) -> Result<TcpStream, String> {
    let hello = hello(rank)?;
    write_by(&mut stream, &hello, deadline)
        .map_err(|s| format!("sending this rank's hello to the coordinator {coordinator}: {s}"))?;
    wait_acknowledged(&stream, deadline).map_err(|stall| {
        let why = match stall {
            Stall::TimedOut => "timed out".to_string(),
            Stall::Closed => "the connection was closed (rank 0 failed or exited)".to_string(),
            Stall::Io(e) => e.to_string(),
        };
        format!("waiting for the coordinator {coordinator} to acknowledge this rank's hello: {why}")
    })?;
    Ok(stream)
}
