//! The side channel kept for the life of a group as a [`Liveness`] watcher: the thin driver of
//! [`protocol::liveness`](super::protocol::liveness), which says who watches whom and what a
//! look means. A look peeks at one byte and reads the socket's error, without waiting, without
//! reading or writing a byte; closing the connections (when the group fails, or rank 0 finds a
//! rank gone) is how a rank tells the others.

use std::net::{Shutdown, TcpStream};

use super::protocol::liveness::{verdict, watched};
use super::socket;
use crate::fabric::{Gone, Liveness};

/// One rank's side-channel connections after bring-up, watched while its operations wait.
#[derive(Debug)]
pub(crate) struct Watcher {
    rank: usize,
    /// `(peer, connection)` for every watched peer.
    streams: Vec<(usize, TcpStream)>,
    /// Whether this rank has closed its connections (after which nothing is watched).
    closed: bool,
}

impl Watcher {
    /// Watches `streams` (rank 0: rank k's at k − 1; the others: the one to rank 0).
    pub(super) fn new(
        rank: usize,
        size: usize,
        streams: Vec<TcpStream>,
    ) -> std::io::Result<Watcher> {
        let peers = watched(rank, size);
        let mut watched = Vec::with_capacity(streams.len());
        for (peer, stream) in peers.into_iter().zip(streams) {
            // A look must never wait.
            stream.set_nonblocking(true)?;
            watched.push((peer, stream));
        }
        Ok(Watcher {
            rank,
            streams: watched,
            closed: false,
        })
    }

    /// Closes every connection: each peer sees the end of the stream, and no byte is sent.
    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        for (_, stream) in &self.streams {
            // Nothing to do if it fails: the connection is gone already.
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Liveness for Watcher {
    fn check(&mut self) -> Option<Gone> {
        if self.closed {
            return None;
        }
        let looks: Vec<_> = self
            .streams
            .iter()
            .map(|(peer, stream)| (*peer, socket::look(stream)))
            .collect();
        let gone = verdict(self.rank, &looks)?;
        // Rank 0 passes the death on to every other rank.
        self.close();
        Some(gone)
    }

    fn failed(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        (a, b)
    }

    /// Waits (bounded) until `w` finds a peer gone.
    fn gone_within(w: &mut Watcher, secs: u64) -> Option<Gone> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while std::time::Instant::now() < until {
            if let Some(g) = w.check() {
                return Some(g);
            }
            std::thread::yield_now();
        }
        None
    }

    #[test]
    fn rank_zero_finds_a_closed_rank_and_closes_the_others_without_sending_a_byte() {
        let (zero_1, one) = pair();
        let (zero_2, two) = pair();
        let mut zero = Watcher::new(0, 3, vec![zero_1, zero_2]).unwrap();
        let mut one = Watcher::new(1, 3, vec![one]).unwrap();
        assert_eq!(zero.check(), None);
        assert_eq!(one.check(), None);
        drop(two);
        let g = gone_within(&mut zero, 5).expect("rank 2 found gone");
        assert_eq!((g.peer, g.itself), (2, true));
        // Rank 1 sees rank 0 close: end of stream, no byte.
        let g = gone_within(&mut one, 5).expect("rank 0's close seen");
        assert_eq!((g.peer, g.itself), (0, false));
        let mut byte = [0u8; 1];
        let (_, stream) = &one.streams[0];
        assert_eq!(stream.peek(&mut byte).unwrap(), 0);
    }

    #[test]
    fn a_byte_waiting_is_left_unread_and_means_the_peer_is_there() {
        use std::io::Write;
        let (zero, mut one) = pair();
        let mut w = Watcher::new(0, 2, vec![zero]).unwrap();
        one.write_all(b"x").unwrap();
        for _ in 0..100 {
            assert_eq!(w.check(), None);
        }
        let mut byte = [0u8; 1];
        let (_, stream) = &w.streams[0];
        stream.set_nonblocking(false).unwrap();
        assert_eq!(stream.peek(&mut byte).unwrap(), 1);
    }
}
