//! MLX's JACCL side channel: a TCP star through rank 0 that all-gathers the RDMA connection
//! details before any RDMA resource is used (reference §3.3), byte for byte.
//!
//! Rank 0 listens on the coordinator address and accepts one connection from every other
//! rank, which first sends its rank as a 4-byte little-endian `i32` (the *hello*). One
//! all-gather of n bytes per rank is then: every other rank sends its n bytes to rank 0; rank 0
//! reads them from rank 1, 2, … in rank order, then sends the R·n-byte concatenation (its own
//! block first) to rank 1, 2, …; every other rank reads those R·n bytes. There are no headers:
//! every rank must run the same sequence of all-gathers with the same sizes. On top of that:
//!
//! - a scalar all-gather is one all-gather of its 4 little-endian bytes
//!   ([`all_gather_i32`](SideChannel::all_gather_i32));
//! - a vector all-gather is an all-gather of the lengths (`i32`), then one of the vectors
//!   padded with zero bytes to the longest ([`all_gather_vec`](SideChannel::all_gather_vec));
//! - a barrier is two all-gathers of the `i32` 0 ([`barrier`](SideChannel::barrier));
//! - the QP details are 32-byte [`Destination`] records ([`exchange_mesh`](SideChannel::exchange_mesh),
//!   [`exchange_ring`](SideChannel::exchange_ring)).
//!
//! Differences from MLX, none visible on the wire:
//!
//! - every wait is bounded: connecting, the hellos and each all-gather take at most the
//!   timeout, and a failure is an [`Error::Connect`] naming this rank, the operation, the peer
//!   and how many bytes had moved; after one, every later call fails at once (the byte stream
//!   is no longer aligned);
//! - rank 0 reads the hellos of all connections at once and keeps accepting until every rank
//!   has said hello, so a stray connection that sends nothing neither takes a rank's place nor
//!   blocks the others (MLX accepts exactly R−1 connections and reads their hellos in turn); a
//!   hello with a rank out of range or a rank already seen is an error;
//! - the coordinator socket has `SO_REUSEADDR` but not MLX's `SO_REUSEPORT`, which would let two
//!   jobs on one port silently split each other's ranks; the listen backlog is 128, not 0;
//! - other ranks retry connecting until the timeout instead of MLX's 4 attempts over about 15 s;
//! - another rank's connecting ends only once rank 0 has acknowledged its hello, so its first block
//!   never leaves before that (the bytes are MLX's, only their timing differs). MLX's rank 0
//!   listens with a backlog of 0: when ranks connect at once, Linux answers with SYN cookies and
//!   drops what arrives while the one accepted connection waits, and a segment that reaches the
//!   listener before the connection is accepted but does not start at the first byte (the block
//!   sent after the hello, or the tail-loss probe that carries it past Nagle's algorithm) fails the
//!   cookie check and the connection is reset (`TcpExtSyncookiesFailed`), leaving rank 0 waiting
//!   for that rank. While only the hello is unacknowledged, whatever the kernel resends is the
//!   hello, which starts at the first byte;
//! - `TCP_NODELAY` is set (MLX leaves Nagle's algorithm on): only the timing changes;
//! - the ranks check what they can: that every rank sends as many records, that rank 0 sends
//!   back this rank's own block unchanged, that barriers carry 0;
//! - after bring-up the connections stay open for the life of the group (as in MLX) and are
//!   watched while an operation waits, so that a rank that dies is noticed within a second
//!   rather than at the deadline (as MLX's PR #4530 proposes): nothing is ever sent on them
//!   after the last exchange, a look peeks without reading, and a rank tells the others only
//!   by closing its connections, which puts no byte on the wire ([`protocol::liveness`]).
//!
//! # Layout
//!
//! - `record`: the [`Destination`] codec and [`RingDestinations`], pure;
//! - [`protocol`]: the hello and every operation as a state machine without I/O (also what
//!   the fuzz target drives);
//! - `socket`: the TCP driver: listening, accepting, connecting with retries, one bounded
//!   read or write at a time, and one look at a connection;
//! - `watcher`: the connections after bring-up as the group's liveness watcher;
//! - this file: [`SideChannel`], which runs the protocol over the sockets with a deadline per
//!   all-gather.
//!
//! This file may use its three submodules, `hostfile::resolve` for the coordinator's address and
//! `limits::deadline_in` for the deadlines. Invariants: every all-gather gets the whole timeout
//! from its first transfer, each socket call at most what is left of it; every byte read is fed
//! to the protocol, which never takes more than its current message asks, so nothing is read
//! ahead; a failure is the protocol's error, so it names this rank, the all-gather, the peer and
//! the bytes moved, and every later call fails with it.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::config::{ConfigError, hostfile};
use crate::error::Error;
use crate::limits;

pub mod protocol;
mod record;
mod socket;
mod watcher;

use protocol::{Next, Operation, Output, Protocol};
pub use record::{Destination, RingDestinations};
pub(crate) use watcher::Watcher;

/// The most bytes one receive asks the socket for (and the driver's buffer holds).
const RECEIVE_CHUNK: usize = 1 << 20;

/// One rank's end of MLX's JACCL side channel (see the [module docs](self)).
///
/// ```no_run
/// use std::time::Duration;
/// use nuvec_distributed::jaccl::{Destination, SideChannel};
/// # fn main() -> Result<(), nuvec_distributed::Error> {
/// let (rank, size) = (1, 2);
/// let mut channel = SideChannel::connect("10.0.0.1:32323", rank, size, Duration::from_secs(30))?;
/// let mine = vec![Destination::default(); size]; // this rank's QP towards each rank
/// let all = channel.exchange_mesh(&mine)?; // all[j][k]: rank j's QP towards rank k
/// // ... bring the QPs to RTR with all[j][rank] and to RTS, then, as MLX:
/// channel.barrier()?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct SideChannel {
    /// The side channel's state, without I/O.
    protocol: Protocol,
    /// Rank 0: the connection of rank k at index k − 1. Other ranks: the one to rank 0.
    streams: Vec<TcpStream>,
    /// What a receive reads into before the protocol takes it.
    buffer: Vec<u8>,
}

impl SideChannel {
    /// Connects rank `rank` of `size` to the side channel whose rank 0 listens on
    /// `coordinator` (`"ip:port"`), within `timeout`.
    ///
    /// Rank 0 binds the address (`SO_REUSEADDR`), accepts a connection from every other rank
    /// and reads its rank hello; the others connect, retrying until the timeout while rank 0
    /// is not listening yet, and send their rank. A group of one rank opens no socket.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `size` is 0, above `i32::MAX`, or `rank` is not below
    /// it; [`Error::Config`] when `coordinator` is not a `"host:port"` that resolves;
    /// [`Error::Connect`] when rank 0 cannot listen, a hello names a rank out of range or one
    /// already connected, a rank has not said hello within the timeout (naming the missing
    /// ranks and the silent connections), or another rank cannot reach the coordinator or
    /// send its hello and see it acknowledged within the timeout.
    pub fn connect(
        coordinator: &str,
        rank: usize,
        size: usize,
        timeout: Duration,
    ) -> Result<SideChannel, Error> {
        let protocol = Protocol::new(rank, size, timeout)?;
        let addrs = hostfile::resolve(coordinator)
            .map_err(|e| Error::Config(ConfigError::Coordinator(Box::new(e)).jaccl()))?;
        let deadline = limits::deadline_in(timeout);
        let fail = |what: String| Error::Connect {
            rank,
            what: format!("jaccl: side channel: {what}"),
        };
        let streams = if size == 1 {
            Vec::new()
        } else if rank == 0 {
            socket::accept_ranks(&addrs, coordinator, size, deadline, timeout).map_err(fail)?
        } else {
            vec![
                socket::connect_to_coordinator(&addrs, coordinator, rank, deadline, timeout)
                    .map_err(fail)?,
            ]
        };
        for stream in &streams {
            stream
                .set_nodelay(true)
                .map_err(|e| fail(format!("setting TCP_NODELAY: {e}")))?;
        }
        Ok(SideChannel {
            protocol,
            streams,
            buffer: Vec::new(),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.protocol.rank()
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.protocol.size()
    }

    /// How long each all-gather may take.
    pub fn timeout(&self) -> Duration {
        self.protocol.timeout()
    }

    /// This host's address on the side channel's connections (the interface that reaches
    /// the other ranks), or `None` in a group of one.
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.streams
            .first()
            .and_then(|s| s.local_addr().ok())
            .map(|a| a.ip())
    }

    /// All-gathers `mine` (the same length on every rank): every rank's bytes, in rank order.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] naming this rank, the all-gather's number, the peer and the bytes
    /// moved when a peer closes, a socket fails, the timeout passes, or rank 0 does not send
    /// back this rank's block unchanged; [`Error::Failed`] after an earlier failure.
    pub fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, Error> {
        match self.run(Operation::AllGather(mine.to_vec()))? {
            Output::Bytes(bytes) => Ok(bytes),
            other => Err(self.unexpected(&other)),
        }
    }

    /// All-gathers one `i32` per rank (MLX's `all_gather<int>`).
    ///
    /// # Errors
    ///
    /// As [`all_gather`](Self::all_gather).
    pub fn all_gather_i32(&mut self, value: i32) -> Result<Vec<i32>, Error> {
        let bytes = self.all_gather(&value.to_le_bytes())?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// All-gathers a vector of `record_len`-byte records of any length per rank, as MLX's
    /// `all_gather` of a container: an all-gather of the record counts (`i32`), then one of
    /// every rank's records padded with zero bytes to the longest count. Returns every rank's
    /// records, without the padding.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `record_len` is 0, `records` is not a whole number of
    /// records, or there are more than `i32::MAX`; [`Error::Connect`] when a rank announces a
    /// negative count or more than 64 MiB in all, and as [`all_gather`](Self::all_gather).
    pub fn all_gather_vec(
        &mut self,
        records: &[u8],
        record_len: usize,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let op = Operation::AllGatherVec {
            records: records.to_vec(),
            record_len,
        };
        match self.run(op)? {
            Output::Records(records) => Ok(records),
            other => Err(self.unexpected(&other)),
        }
    }

    /// MLX's side-channel barrier: two successive all-gathers of the `i32` 0.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when a rank sends anything but 0 (the ranks are out of step), and as
    /// [`all_gather`](Self::all_gather).
    pub fn barrier(&mut self) -> Result<(), Error> {
        match self.run(Operation::Barrier)? {
            Output::Done => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Exchanges the mesh's QP details in MLX's order: an all-gather of the count (`i32`, W·R
    /// on every rank for W wires), then of the W·R·32 bytes of `mine`, wire-major as MLX
    /// 0.32.4: `mine[w·R + j]` is this rank's QP towards rank j on wire w (this rank's own
    /// entries are placeholders; MLX sends `local_id` −1 there). With one wire that is
    /// `mine[j]`, as in MLX 0.32.1.
    ///
    /// Returns `all[j][w·R + k]`: rank j's QP towards rank k on wire w; this rank's QP
    /// towards j on wire w connects to `all[j][w·R + rank]`. As MLX, bring the QPs to RTR and
    /// RTS, then call [`barrier`](Self::barrier) before any RDMA traffic.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `mine` is empty or not a whole number of entries per
    /// rank (nothing is sent); [`Error::Connect`] when another rank announces a different
    /// count, and as [`all_gather`](Self::all_gather).
    pub fn exchange_mesh(&mut self, mine: &[Destination]) -> Result<Vec<Vec<Destination>>, Error> {
        match self.run(Operation::ExchangeMesh(mine.to_vec()))? {
            Output::Mesh(all) => Ok(all),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Exchanges the ring's QP details in MLX's order: count then records for the left QPs
    /// (`left[w]`: wire w towards the left neighbour), then count then records for the right
    /// QPs. Every rank must have the same number of wires. As MLX, bring the QPs to RTR and
    /// RTS (see [`RingDestinations`] for the pairing), then call [`barrier`](Self::barrier).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `left` and `right` differ in length (nothing is sent);
    /// [`Error::Connect`] when another rank announces a different count, and as
    /// [`all_gather`](Self::all_gather).
    pub fn exchange_ring(
        &mut self,
        left: &[Destination],
        right: &[Destination],
    ) -> Result<RingDestinations, Error> {
        let op = Operation::ExchangeRing {
            left: left.to_vec(),
            right: right.to_vec(),
        };
        match self.run(op)? {
            Output::Ring(ring) => Ok(ring),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The connections kept for the life of the group, as the watcher its operations consult
    /// while they wait (see [`protocol::liveness`]): nothing more is sent on them.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when a connection cannot be made non-blocking.
    ///
    /// Each connection gets the link liveness of `link_timeout` (keepalive probes, which carry
    /// no byte): a host that died without closing its sockets (power, kernel, cable) is
    /// found gone once its connection has been silent that long, as a socket error.
    pub(crate) fn into_watcher(self, link_timeout: Duration) -> Result<Watcher, Error> {
        let (rank, size) = (self.protocol.rank(), self.protocol.size());
        let fail = |e: std::io::Error| Error::Connect {
            rank,
            what: format!("jaccl: side channel: keeping the connections to watch them: {e}"),
        };
        for stream in &self.streams {
            crate::transport::tcp::tune_link(stream, link_timeout).map_err(fail)?;
        }
        Watcher::new(rank, size, self.streams).map_err(fail)
    }

    /// Runs `op` over the connections, each all-gather within the timeout.
    fn run(&mut self, op: Operation) -> Result<Output, Error> {
        self.protocol.start(op)?;
        let timeout = self.protocol.timeout();
        // The all-gather the deadline belongs to, and the deadline.
        let mut current: Option<(u64, Instant)> = None;
        let mut deadline_of = |gather: u64| match current {
            Some((g, at)) if g == gather => at,
            _ => {
                let at = limits::deadline_in(timeout);
                current = Some((gather, at));
                at
            }
        };
        let rank = self.protocol.rank();
        loop {
            let stall = match self.protocol.poll() {
                Next::Done(result) => return result,
                Next::Send {
                    peer,
                    bytes,
                    gather,
                } => {
                    let deadline = deadline_of(gather);
                    match self.streams.get_mut(link(rank, peer)) {
                        Some(stream) => match socket::write_some(stream, bytes, deadline) {
                            Ok(k) => {
                                self.protocol.on_sent(k);
                                continue;
                            }
                            Err(stall) => stall,
                        },
                        None => protocol::Stall::Closed,
                    }
                }
                Next::Receive { peer, len, gather } => {
                    let deadline = deadline_of(gather);
                    let want = len.min(RECEIVE_CHUNK);
                    if self.buffer.len() < want {
                        self.buffer.resize(want, 0);
                    }
                    match self.streams.get_mut(link(rank, peer)) {
                        Some(stream) => {
                            match socket::read_some(stream, &mut self.buffer[..want], deadline) {
                                Ok(k) => {
                                    self.protocol.on_received(&self.buffer[..k]);
                                    continue;
                                }
                                Err(stall) => stall,
                            }
                        }
                        None => protocol::Stall::Closed,
                    }
                }
            };
            return Err(self.protocol.stalled(stall));
        }
    }

    /// An output of another operation's kind (the protocol never gives one).
    fn unexpected(&self, output: &Output) -> Error {
        Error::Connect {
            rank: self.protocol.rank(),
            what: format!("jaccl: side channel: an operation returned {output:?}"),
        }
    }
}

/// The index in `streams` of the connection to `peer`: rank 0 holds rank k's at k − 1, the
/// others only the one to rank 0.
fn link(rank: usize, peer: usize) -> usize {
    if rank == 0 { peer.wrapping_sub(1) } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seed: u8) -> Destination {
        Destination {
            local_id: -1 - i32::from(seed),
            queue_pair_number: 0x0102_0304 + i32::from(seed),
            packet_sequence_number: 7,
            global_identifier: std::array::from_fn(|i| seed.wrapping_mul(31).wrapping_add(i as u8)),
        }
    }

    #[test]
    fn a_group_of_one_gathers_its_own_bytes_without_a_socket() {
        let mut c = SideChannel::connect("127.0.0.1:1", 0, 1, Duration::from_secs(1)).unwrap();
        assert_eq!(c.all_gather(b"abc").unwrap(), b"abc");
        assert_eq!(c.all_gather_i32(-5).unwrap(), vec![-5]);
        assert_eq!(
            c.all_gather_vec(&[1, 2, 3, 4], 2).unwrap(),
            vec![vec![1, 2, 3, 4]]
        );
        assert_eq!(c.all_gather_vec(&[], 2).unwrap(), vec![Vec::<u8>::new()]);
        c.barrier().unwrap();
        let d = sample(3);
        assert_eq!(c.exchange_mesh(&[d]).unwrap(), vec![vec![d]]);
        let ring = c.exchange_ring(&[d], &[d]).unwrap();
        assert_eq!(ring.remote_for_left(0), &[d]);
        assert_eq!(ring.remote_for_right(0), &[d]);
    }

    #[test]
    fn bad_arguments_are_refused_before_any_socket_is_opened() {
        let t = Duration::from_secs(1);
        for (rank, size) in [(0, 0), (2, 2), (5, 3)] {
            let e = SideChannel::connect("127.0.0.1:1", rank, size, t).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        }
        let e = SideChannel::connect("127.0.0.1", 0, 2, t).unwrap_err();
        assert!(
            matches!(&e, Error::Config(m) if m.to_string().contains("jaccl") && m.to_string().contains("no port")),
            "{e}"
        );
    }

    #[test]
    fn a_wrong_number_of_mesh_destinations_or_unequal_ring_sides_is_an_argument_error() {
        let mut c = SideChannel::connect("127.0.0.1:1", 0, 1, Duration::from_secs(1)).unwrap();
        let d = sample(1);
        let e = c.exchange_mesh(&[]).unwrap_err();
        assert!(e.to_string().contains("expected one per rank (1)"), "{e}");
        let e = c.exchange_ring(&[d], &[]).unwrap_err();
        assert!(
            e.to_string().contains("1 left destinations but 0 right"),
            "{e}"
        );
        let e = c.all_gather_vec(&[1, 2, 3], 2).unwrap_err();
        assert!(
            e.to_string().contains("whole number of 2-byte records"),
            "{e}"
        );
        let e = c.all_gather_vec(&[], 0).unwrap_err();
        assert!(e.to_string().contains("record length is 0"), "{e}");
        // Argument errors leave the channel usable.
        assert!(e.leaves_group_usable());
        c.barrier().unwrap();
    }
}
