//! A failed rank's notice to its peers, on the nuvec wire only: one byte on every link, written
//! just before it closes them.
//!
//! A rank that fails on the nuvec wire closes its links, and a peer reading one of them fails
//! at once. A peer waiting on another link does not: it may wait for bytes from a neighbour
//! whose `send` returned and who went on, or from a neighbour that waits in turn, and only its
//! deadline (600 s by default) would end the wait. The end of a stream cannot tell it either:
//! a peer that finished the job after its last operation closes its links too.
//!
//! So the failing rank says so first, in a byte its peer can find whatever the link carries:
//!
//! - **TCP links: one byte of urgent data** (`send(MSG_OOB)`). The receiving kernel keeps it
//!   apart from the stream (`SO_OOBINLINE` is off, the default on Linux and macOS): the
//!   stream's reads skip it, so whatever the link was carrying (half a segment, a header,
//!   nothing) arrives byte for byte as it would have, and `recv(MSG_OOB)` finds the byte
//!   wherever the stream's reads stand, before or after the link's end, until a read of the
//!   stream passes it (then that read meets the link's end and fails the step by itself). The
//!   byte itself travels after the bytes written before it: where the peer's buffer is full
//!   of bytes it has not read, it waits behind them.
//! - **Local links: a doorbell of its own**, [`FAILED`], on the link's TCP connection, which
//!   carries only doorbells: whoever drains them notes it.
//!
//! A waiting step looks for it on every link when it looks at the links' health (at least
//! every [`CHECK_EVERY`](super::liveness::CHECK_EVERY), and at once when the poll reports urgent
//! data, Linux's `EPOLLPRI`, or the end of a link). Once it has waited [`GRACE`] with nothing
//! moving, a notice fails it with
//! [`FailureKind::PeerFailed`](crate::fabric::FailureKind::PeerFailed), naming the rank that
//! told and the transfer it was stuck on, and it tells its own peers in turn: every rank of a
//! ring fails within about a second. A transfer that meets the close of a link whose peer told
//! first fails at once, and names the notice too, not the bare close
//! (`TcpFabric::announced`).
//!
//! MLX's wire never carries it (a Python MLX rank would not expect it), nor does a rank that
//! ends its job normally. The TCP fabric does not write it on a TCP link on which the failed
//! operation still owes bytes (`TcpFabric::tell_failed`): the peer waits for them there and
//! meets the link's end. That also bounds what a middlebox that clears TCP's urgent flag (or
//! hosts that count the urgent pointer differently, `tcp_stdurg`) could do by leaving the byte
//! in the stream: it lands where the peer expects the next operation's header, whose checksum
//! refuses it, never among the data a rank returns.
//!
//! Best effort: where a link's send buffer is full the byte is not written on Linux (macOS
//! takes urgent data past a full buffer), nor is a local link's doorbell where its socket is
//! full of doorbells unread (which wake the peer anyway); then only the close reaches the peer,
//! which fails it where it reads that link or its operation still sends on it.

use std::mem::MaybeUninit;
use std::time::Duration;

use socket2::SockRef;

/// How long a step must have waited with nothing moving before a peer's notice fails it.
///
/// A notice says a rank will send nothing more, not that this rank's operation needs anything
/// from it: a peer that finished this operation and failed the next one tells as well, and
/// this rank's operation may still end well on what the others send. So a step that is still
/// moving, or has waited only briefly, carries on; one that has waited this long with nothing
/// moving is taken to wait for what will not come. The waits the notice ends would otherwise
/// last until the operation's deadline (600 s by default).
pub(super) const GRACE: Duration = Duration::from_millis(500);

/// The byte a failed rank writes (a local link's other doorbells are 1).
pub(super) const FAILED: u8 = b'F';

/// Writes the notice on `stream`, without waiting, as urgent data or (`local`: the stream of a
/// local link) as a doorbell. Best effort: a full buffer or a link already gone leaves it
/// unwritten, and the close that follows is all the peer gets.
pub(super) fn tell(stream: &mio::net::TcpStream, local: bool) {
    if local {
        // A doorbell's write (std's sets `MSG_NOSIGNAL`).
        let _ = super::ring_with(stream, FAILED);
    } else {
        // A peer that reset the link must not raise `SIGPIPE` in the process, as the ring's
        // other writes do not (std's write sets `MSG_NOSIGNAL`; on macOS its sockets are made
        // with `SO_NOSIGPIPE`).
        #[cfg(target_os = "linux")]
        let _ =
            SockRef::from(stream).send_with_flags(&[FAILED], libc::MSG_OOB | libc::MSG_NOSIGNAL);
        #[cfg(not(target_os = "linux"))]
        let _ = SockRef::from(stream).send_out_of_band(&[FAILED]);
    }
}

/// Whether the peer of TCP link `stream` wrote the notice (read once: a second look finds
/// nothing).
pub(super) fn told(stream: &mio::net::TcpStream) -> bool {
    let mut byte = [MaybeUninit::new(0u8)];
    match SockRef::from(stream).recv_out_of_band(&mut byte) {
        Ok(n) => n == 1,
        // Linux refuses with ENOTCONN only where urgent data was announced and not read, and
        // the link was reset since (the failed rank closed it with bytes of its peer unread):
        // the notice came, and its byte went with the reset.
        #[cfg(target_os = "linux")]
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => true,
        // EINVAL: no urgent byte; EAGAIN: one announced but not arrived yet (the next look
        // finds it); else the stream's own error, which the look at the links reports apart.
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{self, Read, Write};
    use std::time::Instant;

    /// A connected pair of non-blocking streams over loopback.
    fn pair() -> (mio::net::TcpStream, mio::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let opened =
            std::net::TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        opened.set_nonblocking(true).expect("non-blocking");
        accepted.set_nonblocking(true).expect("non-blocking");
        (
            mio::net::TcpStream::from_std(opened),
            mio::net::TcpStream::from_std(accepted),
        )
    }

    /// Looks for the notice on `stream` for at most 10 s.
    fn told_within(stream: &mio::net::TcpStream) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if told(stream) {
                return true;
            }
            std::thread::yield_now();
        }
        false
    }

    #[test]
    fn the_notice_is_found_behind_unread_bytes_and_leaves_the_stream_as_it_was() {
        let (mut a, mut b) = pair();
        assert!(!told(&b), "nothing told yet");
        a.write_all(&[1, 2, 3]).expect("the stream's bytes");
        tell(&a, false);
        assert!(
            told_within(&b),
            "the notice, with the stream's bytes unread"
        );
        assert!(!told(&b), "read once");
        drop(a);
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < until, "the stream's end, in 10 s: {got:?}");
            let mut buf = [0u8; 8];
            match b.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(
            got,
            [1, 2, 3],
            "the stream, to its end, without the notice's byte"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_notice_is_found_after_the_peer_reset_the_link() {
        // `a` leaves bytes of `b` unread, so its close resets the link.
        let (a, mut b) = pair();
        b.write_all(&[9; 64]).expect("bytes a never reads");
        let until = Instant::now() + Duration::from_secs(10);
        let mut byte = [MaybeUninit::new(0u8)];
        while SockRef::from(&a).peek(&mut byte).is_err() {
            assert!(Instant::now() < until, "b's bytes never reached a");
            std::thread::yield_now();
        }
        tell(&a, false);
        drop(a);
        assert!(told_within(&b));
    }

    #[test]
    fn the_notice_is_found_after_the_peer_closed() {
        let (a, b) = pair();
        tell(&a, false);
        drop(a);
        assert!(told_within(&b));
    }
}
