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
//!   wherever the stream stands, before or after the link's end, until a read of the stream
//!   passes it (then that read meets the link's end and fails the step by itself).
//! - **Local links: a doorbell of its own**, [`FAILED`], on the link's TCP connection, which
//!   carries only doorbells: whoever drains them notes it.
//!
//! A waiting step looks for it on every link at its periodic look at the links' health
//! ([`CHECK_EVERY`](super::liveness::CHECK_EVERY)), fails with
//! [`FailureKind::PeerFailed`](crate::fabric::FailureKind::PeerFailed), and tells its own
//! peers in turn: every rank of a ring fails within about a look per hop.
//!
//! MLX's wire never carries it (a Python MLX rank would not expect it), nor does a rank that
//! ends its job normally. Best effort: where a link's send buffer is full the byte is not
//! written, and the close alone tells the peer once it has read what is queued.

use std::io;
use std::mem::MaybeUninit;

use socket2::SockRef;

/// The byte a failed rank writes (a local link's other doorbells are 1).
pub(super) const FAILED: u8 = b'F';

/// Writes the notice on `stream`, without waiting, as urgent data or (`local`: the stream of a
/// local link) as a doorbell: whether it was written.
pub(super) fn tell(stream: &mio::net::TcpStream, local: bool) -> bool {
    if local {
        io::Write::write(&mut &*stream, &[FAILED]).is_ok_and(|n| n == 1)
    } else {
        SockRef::from(stream).send_out_of_band(&[FAILED]).is_ok()
    }
}

/// Whether the peer of TCP link `stream` wrote the notice (read once: a second look finds
/// nothing).
pub(super) fn told(stream: &mio::net::TcpStream) -> bool {
    let mut byte = [MaybeUninit::new(0u8)];
    // An error is EINVAL (no urgent byte), EAGAIN (one announced but not arrived yet: the next
    // look finds it), or the stream's own error, which the look at the links reports apart.
    SockRef::from(stream)
        .recv_out_of_band(&mut byte)
        .is_ok_and(|n| n == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

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
        assert!(tell(&a, false), "told");
        assert!(
            told_within(&b),
            "the notice, with the stream's bytes unread"
        );
        assert!(!told(&b), "read once");
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        while got.len() < 3 && Instant::now() < until {
            let mut buf = [0u8; 8];
            match b.read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, [1, 2, 3], "the stream without the notice's byte");
    }

    #[test]
    fn the_notice_is_found_after_the_peer_closed() {
        let (a, b) = pair();
        assert!(tell(&a, false));
        drop(a);
        assert!(told_within(&b));
    }
}
