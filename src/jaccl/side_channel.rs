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
//! - `TCP_NODELAY` is set (MLX leaves Nagle's algorithm on): only the timing changes;
//! - the ranks check what they can: that every rank sends as many records, that rank 0 sends
//!   back this rank's own block unchanged, that barriers carry 0.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::config::hostfile;
use crate::error::Error;
use crate::limits;

/// The most bytes one vector all-gather may move to a rank (R times the longest vector), so a
/// garbled length cannot make a rank allocate without bound.
const MAX_GATHER_BYTES: usize = 1 << 26;

/// The `op` of argument errors.
const OP: &str = "jaccl side channel";

/// The details another rank needs to connect a queue pair to one of this rank's, as MLX's
/// `Destination`: 32 bytes on the wire (see [`encode`](Destination::encode)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Destination {
    /// The port's LID (`ibv_query_port`); MLX sends −1 for a rank's own placeholder entry.
    pub local_id: i32,
    /// The queue pair number.
    pub queue_pair_number: i32,
    /// The packet sequence number the queue pair starts at (MLX: always 7).
    pub packet_sequence_number: i32,
    /// The GID (`ibv_gid`, 16 raw bytes; MLX advertises the first IPv4-mapped one).
    pub global_identifier: [u8; 16],
}

impl Destination {
    /// The size of the encoding: MLX's `sizeof(Destination)` with an 8-byte aligned `ibv_gid`.
    pub const BYTES: usize = 32;

    /// MLX's native layout on arm64: `local_id`, `queue_pair_number`, `packet_sequence_number`
    /// as little-endian `i32`s (bytes 0–11), 4 padding bytes (12–15, zero here), then the 16
    /// GID bytes (16–31).
    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[0..4].copy_from_slice(&self.local_id.to_le_bytes());
        out[4..8].copy_from_slice(&self.queue_pair_number.to_le_bytes());
        out[8..12].copy_from_slice(&self.packet_sequence_number.to_le_bytes());
        out[16..32].copy_from_slice(&self.global_identifier);
        out
    }

    /// Decodes [`encode`](Destination::encode)'s layout; the padding bytes 12–15 are ignored
    /// (MLX sends whatever its stack held there).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when `bytes` is not exactly [`BYTES`](Destination::BYTES) long.
    pub fn decode(bytes: &[u8]) -> Result<Destination, Error> {
        let Ok(bytes) = <&[u8; Self::BYTES]>::try_from(bytes) else {
            return Err(Error::Config(format!(
                "jaccl: a Destination record is exactly {} bytes (MLX's struct layout), got {}",
                Self::BYTES,
                bytes.len()
            )));
        };
        let i32_at = |at: usize| {
            i32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut global_identifier = [0u8; 16];
        global_identifier.copy_from_slice(&bytes[16..32]);
        Ok(Destination {
            local_id: i32_at(0),
            queue_pair_number: i32_at(4),
            packet_sequence_number: i32_at(8),
            global_identifier,
        })
    }
}

/// Every rank's ring [`Destination`]s, from [`SideChannel::exchange_ring`]: `left[r]` are rank
/// r's QPs towards its left neighbour (one per wire), `right[r]` towards its right one.
///
/// As in MLX, wire w of my left QPs pairs with wire w of my left neighbour's right QPs, and my
/// right QPs with my right neighbour's left QPs ([`remote_for_left`](Self::remote_for_left),
/// [`remote_for_right`](Self::remote_for_right)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingDestinations {
    /// Per rank, its left QPs' details.
    pub left: Vec<Vec<Destination>>,
    /// Per rank, its right QPs' details.
    pub right: Vec<Vec<Destination>>,
}

impl RingDestinations {
    /// The remote ends of `rank`'s left QPs: its left neighbour's right QPs.
    ///
    /// # Panics
    ///
    /// When `rank` is not below the number of ranks.
    pub fn remote_for_left(&self, rank: usize) -> &[Destination] {
        let size = self.right.len();
        assert!(rank < size, "rank {rank} of {size}");
        &self.right[(rank + size - 1) % size]
    }

    /// The remote ends of `rank`'s right QPs: its right neighbour's left QPs.
    ///
    /// # Panics
    ///
    /// When `rank` is not below the number of ranks.
    pub fn remote_for_right(&self, rank: usize) -> &[Destination] {
        let size = self.left.len();
        assert!(rank < size, "rank {rank} of {size}");
        &self.left[(rank + 1) % size]
    }
}

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
    rank: usize,
    size: usize,
    timeout: Duration,
    /// Rank 0: the connection of rank k at index k − 1. Other ranks: the one to rank 0.
    streams: Vec<TcpStream>,
    /// All-gathers started so far, to number them in messages.
    started: u64,
    /// The first failure on the wire; every later call returns it.
    failed: Option<Error>,
}

/// Why a read or write of one message stopped early.
#[derive(Debug)]
enum Stall {
    TimedOut,
    Closed,
    Io(io::Error),
}

/// A read or write that stopped after `done` of `len` bytes.
#[derive(Debug)]
struct Short {
    stall: Stall,
    done: usize,
    len: usize,
}

impl fmt::Display for Short {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (done, len) = (self.done, self.len);
        match &self.stall {
            Stall::TimedOut => write!(f, "timed out with {done} of {len} bytes moved"),
            Stall::Closed => write!(
                f,
                "the connection was closed after {done} of {len} bytes (the rank failed or exited)"
            ),
            Stall::Io(e) => write!(f, "{e} after {done} of {len} bytes"),
        }
    }
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
    /// send its hello within the timeout.
    pub fn connect(
        coordinator: &str,
        rank: usize,
        size: usize,
        timeout: Duration,
    ) -> Result<SideChannel, Error> {
        if size == 0 || size > i32::MAX as usize {
            return Err(invalid(
                rank,
                format!(
                    "a group of {size} ranks is not possible (1 to {})",
                    i32::MAX
                ),
            ));
        }
        if rank >= size {
            return Err(invalid(
                rank,
                format!("rank {rank} is out of range for a group of {size}"),
            ));
        }
        let addrs = hostfile::resolve(coordinator).map_err(|e| {
            Error::Config(format!(
                "jaccl: side channel coordinator: {}",
                match e {
                    Error::Config(text) => text,
                    other => other.to_string(),
                }
            ))
        })?;
        let deadline = limits::deadline_in(timeout);
        let fail = |what: String| Error::Connect {
            rank,
            what: format!("jaccl: side channel: {what}"),
        };
        let streams = if size == 1 {
            Vec::new()
        } else if rank == 0 {
            accept_ranks(&addrs, coordinator, size, deadline, timeout).map_err(fail)?
        } else {
            vec![
                connect_to_coordinator(&addrs, coordinator, rank, deadline, timeout)
                    .map_err(fail)?,
            ]
        };
        for stream in &streams {
            stream
                .set_nodelay(true)
                .map_err(|e| fail(format!("setting TCP_NODELAY: {e}")))?;
        }
        Ok(SideChannel {
            rank,
            size,
            timeout,
            streams,
            started: 0,
            failed: None,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// How long each all-gather may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
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
        self.check_usable("all_gather")?;
        let result = self.gather(mine);
        self.record(result)
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
        let count = self.record_count(records, record_len)?;
        let counts = self.gather_counts(count)?;
        let longest = counts.iter().copied().max().unwrap_or(0);
        if longest
            .checked_mul(record_len)
            .and_then(|b| b.checked_mul(self.size))
            .is_none_or(|b| b > MAX_GATHER_BYTES)
        {
            let (who, n) = counts
                .iter()
                .enumerate()
                .max_by_key(|(_, n)| **n)
                .map(|(r, n)| (r, *n))
                .unwrap_or_default();
            return self.fail_now(format!(
                "all_gather of a vector: rank {who} announced {n} records of {record_len} bytes, \
                 more than the side channel moves ({MAX_GATHER_BYTES} bytes in all)"
            ));
        }
        let block = longest * record_len;
        let mut padded = vec![0u8; block];
        padded[..records.len()].copy_from_slice(records);
        // With every count 0 this moves no byte, as MLX's.
        let all = self.all_gather(&padded)?;
        Ok(counts
            .iter()
            .enumerate()
            .map(|(r, n)| all[r * block..r * block + n * record_len].to_vec())
            .collect())
    }

    /// MLX's side-channel barrier: two successive all-gathers of the `i32` 0.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when a rank sends anything but 0 (the ranks are out of step), and as
    /// [`all_gather`](Self::all_gather).
    pub fn barrier(&mut self) -> Result<(), Error> {
        for _ in 0..2 {
            let values = self.all_gather_i32(0)?;
            if let Some((r, v)) = values.iter().enumerate().find(|(_, v)| **v != 0) {
                return self.fail_now(format!(
                    "barrier: rank {r} sent {v} instead of 0; the ranks are not running the same \
                     sequence of side-channel operations"
                ));
            }
        }
        Ok(())
    }

    /// Exchanges the mesh's QP details in MLX's order: an all-gather of the count (`i32`, R on
    /// every rank), then of the R·32 bytes of `mine`, where `mine[j]` is this rank's QP towards
    /// rank j (this rank's own entry is a placeholder; MLX sends `local_id` −1 there).
    ///
    /// Returns `all[j][k]`: rank j's QP towards rank k; this rank's QP towards j connects to
    /// `all[j][rank]`. As MLX, bring the QPs to RTR and RTS, then call
    /// [`barrier`](Self::barrier) before any RDMA traffic.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `mine` does not hold one entry per rank (nothing is
    /// sent); [`Error::Connect`] when another rank announces a different count, and as
    /// [`all_gather`](Self::all_gather).
    pub fn exchange_mesh(&mut self, mine: &[Destination]) -> Result<Vec<Vec<Destination>>, Error> {
        if mine.len() != self.size {
            return Err(invalid(
                self.rank,
                format!(
                    "exchange_mesh: {} destinations, expected one per rank ({}), with a \
                     placeholder for this rank",
                    mine.len(),
                    self.size
                ),
            ));
        }
        self.exchange("mesh", mine)
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
        if left.len() != right.len() {
            return Err(invalid(
                self.rank,
                format!(
                    "exchange_ring: {} left destinations but {} right ones; every wire has both",
                    left.len(),
                    right.len()
                ),
            ));
        }
        let left = self.exchange("ring (left QPs)", left)?;
        let right = self.exchange("ring (right QPs)", right)?;
        Ok(RingDestinations { left, right })
    }

    /// MLX's vector all-gather of `mine`, requiring every rank to send as many records.
    fn exchange(
        &mut self,
        what: &str,
        mine: &[Destination],
    ) -> Result<Vec<Vec<Destination>>, Error> {
        let n = i32::try_from(mine.len())
            .map_err(|_| invalid(self.rank, format!("exchange {what}: too many destinations")))?;
        let counts = self.all_gather_i32(n)?;
        if let Some((r, c)) = counts.iter().enumerate().find(|(_, c)| **c != n) {
            return self.fail_now(format!(
                "exchange {what}: rank {r} sent {c} destinations but this rank sent {n}; the \
                 ranks disagree on the connections"
            ));
        }
        let bytes: Vec<u8> = mine.iter().flat_map(Destination::encode).collect();
        let all = self.all_gather(&bytes)?;
        let per_rank = mine.len() * Destination::BYTES;
        Ok((0..self.size)
            .map(|r| {
                all[r * per_rank..(r + 1) * per_rank]
                    .chunks_exact(Destination::BYTES)
                    .map(|record| Destination::decode(record).expect("32-byte records"))
                    .collect()
            })
            .collect())
    }

    /// The record count of `records`, checked.
    fn record_count(&self, records: &[u8], record_len: usize) -> Result<i32, Error> {
        if record_len == 0 {
            return Err(invalid(
                self.rank,
                "all_gather_vec: the record length is 0".to_owned(),
            ));
        }
        if !records.len().is_multiple_of(record_len) {
            return Err(invalid(
                self.rank,
                format!(
                    "all_gather_vec: {} bytes are not a whole number of {record_len}-byte records",
                    records.len()
                ),
            ));
        }
        i32::try_from(records.len() / record_len).map_err(|_| {
            invalid(
                self.rank,
                format!(
                    "all_gather_vec: {} records do not fit MLX's i32 count",
                    records.len() / record_len
                ),
            )
        })
    }

    /// All-gathers `count`, refusing negative counts.
    fn gather_counts(&mut self, count: i32) -> Result<Vec<usize>, Error> {
        let counts = self.all_gather_i32(count)?;
        let mut checked = Vec::with_capacity(counts.len());
        for (r, c) in counts.into_iter().enumerate() {
            match usize::try_from(c) {
                Ok(c) => checked.push(c),
                Err(_) => {
                    return self.fail_now(format!(
                        "all_gather of a vector: rank {r} announced {c} records, a negative count"
                    ));
                }
            }
        }
        Ok(checked)
    }

    /// Refuses to run after a failure.
    fn check_usable(&self, op: &'static str) -> Result<(), Error> {
        match &self.failed {
            None => Ok(()),
            Some(first) => Err(Error::Failed {
                rank: self.rank,
                op,
                first: Box::new(first.clone()),
            }),
        }
    }

    /// Keeps the first failure (argument errors, raised before any byte moves, leave the
    /// channel usable).
    fn record<T>(&mut self, result: Result<T, Error>) -> Result<T, Error> {
        if let Err(e) = &result
            && !e.leaves_group_usable()
            && self.failed.is_none()
        {
            self.failed = Some(e.clone());
        }
        result
    }

    /// Fails the channel with a protocol error.
    fn fail_now<T>(&mut self, what: String) -> Result<T, Error> {
        let e = Error::Connect {
            rank: self.rank,
            what: format!("jaccl: side channel: {what}"),
        };
        self.record(Err(e))
    }

    /// One all-gather on the wire.
    fn gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, Error> {
        let (rank, size, n) = (self.rank, self.size, mine.len());
        let Some(total) = n.checked_mul(size) else {
            return Err(invalid(
                rank,
                format!("all_gather: {n} bytes from each of {size} ranks overflow"),
            ));
        };
        let seq = self.started;
        self.started += 1;
        let mut out = vec![0u8; total];
        if size == 1 {
            out.copy_from_slice(mine);
            return Ok(out);
        }
        let timeout = self.timeout;
        let deadline = limits::deadline_in(timeout);
        let fail = |doing: String, short: Short| Error::Connect {
            rank,
            what: format!(
                "jaccl: side channel: all_gather #{seq} ({n} bytes per rank): {doing}: {short} \
                 (timeout {timeout:?})"
            ),
        };
        if rank == 0 {
            out[..n].copy_from_slice(mine);
            for peer in 1..size {
                read_by(
                    &mut self.streams[peer - 1],
                    &mut out[peer * n..(peer + 1) * n],
                    deadline,
                )
                .map_err(|s| fail(format!("reading rank {peer}'s block"), s))?;
            }
            for peer in 1..size {
                write_by(&mut self.streams[peer - 1], &out, deadline)
                    .map_err(|s| fail(format!("sending the gathered blocks to rank {peer}"), s))?;
            }
        } else {
            write_by(&mut self.streams[0], mine, deadline)
                .map_err(|s| fail("sending this rank's block to rank 0".to_owned(), s))?;
            read_by(&mut self.streams[0], &mut out, deadline)
                .map_err(|s| fail("reading the gathered blocks from rank 0".to_owned(), s))?;
            if out[rank * n..(rank + 1) * n] != *mine {
                return Err(Error::Connect {
                    rank,
                    what: format!(
                        "jaccl: side channel: all_gather #{seq} ({n} bytes per rank): rank 0 \
                         sent back a different block for this rank; the ranks are not running \
                         the same sequence of side-channel operations"
                    ),
                });
            }
        }
        Ok(out)
    }
}

/// An argument error of the side channel.
fn invalid(rank: usize, what: String) -> Error {
    Error::InvalidArgument { rank, op: OP, what }
}

/// Reads exactly `buf.len()` bytes before `deadline`.
fn read_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), Short> {
    let len = buf.len();
    let mut done = 0;
    while done < len {
        let short = |stall| Short { stall, done, len };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(short(Stall::TimedOut));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| short(Stall::Io(e)))?;
        match limits::read(&mut *stream, &mut buf[done..]) {
            Ok(0) => return Err(short(Stall::Closed)),
            Ok(k) => done += k,
            Err(e) if is_wait(&e) => {}
            Err(e) if is_closed(&e) => return Err(short(Stall::Closed)),
            Err(e) => return Err(short(Stall::Io(e))),
        }
    }
    Ok(())
}

/// Writes all of `buf` before `deadline`.
fn write_by(stream: &mut TcpStream, buf: &[u8], deadline: Instant) -> Result<(), Short> {
    let len = buf.len();
    let mut done = 0;
    while done < len {
        let short = |stall| Short { stall, done, len };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(short(Stall::TimedOut));
        }
        stream
            .set_write_timeout(Some(left))
            .map_err(|e| short(Stall::Io(e)))?;
        match limits::write(&mut *stream, &buf[done..]) {
            Ok(0) => return Err(short(Stall::Closed)),
            Ok(k) => done += k,
            Err(e) if is_wait(&e) => {}
            Err(e) if is_closed(&e) => return Err(short(Stall::Closed)),
            Err(e) => return Err(short(Stall::Io(e))),
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
    hello: [u8; 4],
    got: usize,
}

/// Rank 0: listens on the coordinator and accepts until every rank 1..size has said hello;
/// returns the connections ordered by rank.
fn accept_ranks(
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
    let mut slots: Vec<Option<(TcpStream, SocketAddr)>> = (1..size).map(|_| None).collect();
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
                        hello: [0; 4],
                        got: 0,
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
                match limits::read(&mut p.stream, &mut p.hello[p.got..]) {
                    Ok(0) => break Some(Err("closed".to_owned())),
                    Ok(k) => {
                        p.got += k;
                        if p.got == 4 {
                            break Some(Ok(i32::from_le_bytes(p.hello)));
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
                        p.peer, p.got
                    ));
                }
                Some(Ok(hello)) => {
                    let mut p = pending.swap_remove(i);
                    let peer = p.peer;
                    let Some(r) = usize::try_from(hello)
                        .ok()
                        .filter(|r| (1..size).contains(r))
                    else {
                        return Err(format!(
                            "the connection from {peer} said it is rank {hello} (bytes {:02x?}), \
                             but the other ranks of a group of {size} are 1 to {}",
                            p.hello,
                            size - 1
                        ));
                    };
                    if let Some((_, first)) = &slots[r - 1] {
                        return Err(format!(
                            "rank {r} connected twice to the coordinator {coordinator}, from \
                             {first} and from {peer}; is another job using the same \
                             coordinator?"
                        ));
                    }
                    // Leave the poll's registry before the stream becomes blocking again.
                    poll.registry()
                        .deregister(&mut p.stream)
                        .map_err(|e| format!("rank {r}'s connection from {peer}: {e}"))?;
                    let stream = TcpStream::from(p.stream);
                    stream
                        .set_nonblocking(false)
                        .map_err(|e| format!("rank {r}'s connection from {peer}: {e}"))?;
                    slots[r - 1] = Some((stream, peer));
                }
            }
        }
        if slots.iter().all(Option::is_some) {
            // Connections that never said hello are strangers: they are closed here.
            return Ok(slots.into_iter().flatten().map(|(s, _)| s).collect());
        }
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<String> = slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_none())
                .map(|(k, _)| (k + 1).to_string())
                .collect();
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
                    .map(|p| format!("{} ({} of 4 bytes)", p.peer, p.got))
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
fn connect_to_coordinator(
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

/// Sends `rank` as MLX's 4-byte little-endian hello.
fn send_hello(
    mut stream: TcpStream,
    rank: usize,
    coordinator: &str,
    deadline: Instant,
) -> Result<TcpStream, String> {
    let hello = i32::try_from(rank)
        .map_err(|_| format!("rank {rank} does not fit MLX's i32 hello"))?
        .to_le_bytes();
    write_by(&mut stream, &hello, deadline)
        .map_err(|s| format!("sending this rank's hello to the coordinator {coordinator}: {s}"))?;
    Ok(stream)
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
    fn a_destination_encodes_as_mlx_native_layout_with_zero_padding() {
        let d = Destination {
            local_id: 1,
            queue_pair_number: 0x0a0b_0c0d,
            packet_sequence_number: 7,
            global_identifier: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 2],
        };
        let expected: [u8; 32] = [
            1, 0, 0, 0, 0x0d, 0x0c, 0x0b, 0x0a, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0xff, 0xff, 192, 168, 1, 2,
        ];
        assert_eq!(d.encode(), expected);
        assert_eq!(Destination::BYTES, 32);
    }

    #[test]
    fn a_negative_local_id_is_twos_complement_little_endian() {
        let d = Destination {
            local_id: -1,
            ..Destination::default()
        };
        assert_eq!(d.encode()[..4], [0xff; 4]);
    }

    #[test]
    fn decoding_an_encoding_gives_back_the_destination() {
        for seed in [0, 1, 77, 255] {
            let d = sample(seed);
            assert_eq!(Destination::decode(&d.encode()).unwrap(), d);
        }
    }

    #[test]
    fn decoding_ignores_the_padding_bytes() {
        let d = sample(9);
        let mut bytes = d.encode();
        bytes[12..16].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(Destination::decode(&bytes).unwrap(), d);
    }

    #[test]
    fn decoding_anything_but_32_bytes_is_an_error_naming_the_length() {
        for len in [0, 31, 33, 64] {
            let e = Destination::decode(&vec![0; len]).unwrap_err();
            let m = e.to_string();
            assert!(
                m.contains("exactly 32 bytes") && m.contains(&format!("got {len}")),
                "{m}"
            );
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
            matches!(&e, Error::Config(m) if m.contains("jaccl") && m.contains("no port")),
            "{e}"
        );
    }

    #[test]
    fn a_wrong_number_of_mesh_destinations_or_unequal_ring_sides_is_an_argument_error() {
        let mut c = SideChannel::connect("127.0.0.1:1", 0, 1, Duration::from_secs(1)).unwrap();
        let d = sample(1);
        let e = c.exchange_mesh(&[d, d]).unwrap_err();
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

    #[test]
    fn ring_destinations_pair_each_side_with_the_neighbours_other_side() {
        let d = |r: u8, side: u8| sample(r * 10 + side);
        let ring = RingDestinations {
            left: (0..3).map(|r| vec![d(r, 0)]).collect(),
            right: (0..3).map(|r| vec![d(r, 1)]).collect(),
        };
        // Rank 0's left neighbour is rank 2; its right neighbour is rank 1.
        assert_eq!(ring.remote_for_left(0), &[d(2, 1)]);
        assert_eq!(ring.remote_for_right(0), &[d(1, 0)]);
        assert_eq!(ring.remote_for_left(1), &[d(0, 1)]);
        assert_eq!(ring.remote_for_right(2), &[d(0, 0)]);
    }
}
