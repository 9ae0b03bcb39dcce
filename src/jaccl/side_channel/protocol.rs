//! MLX's JACCL side channel without I/O (reference §3.3): the rank hello, and every operation
//! (all-gather, vector all-gather, barrier, mesh and ring exchange) as a state machine that is
//! asked for the bytes to send and fed the bytes received, in the spirit of quinn-proto and of
//! this crate's `auth`.
//!
//! It may use only the record codec ([`Destination`], [`RingDestinations`]) and
//! [`Error`]: no socket, no clock, no thread. The driver
//! ([`SideChannel`](super::SideChannel) over TCP, or a fuzz target over a script) owns the
//! connections and the deadlines; a [`Duration`] is held here only to name the timeout in
//! messages.
//!
//! One file for one state machine: every operation is a step of the same cursor (the
//! message, the peer and the bytes moved) over the same sticky failure, so splitting it by
//! operation would scatter one state across files; its tests are in `protocol/tests.rs`, and
//! about a sixth of this file is its documentation.
//!
//! # Driving it
//!
//! [`Protocol::start`] an [`Operation`], then loop on [`Protocol::poll`]: send what
//! [`Next::Send`] asks on the connection to `peer` and report how much went with
//! [`Protocol::on_sent`]; receive at most what [`Next::Receive`] asks from `peer` and feed it
//! to [`Protocol::on_received`]; [`Next::Done`] carries the operation's result. When the
//! connection fails or the deadline passes, [`Protocol::stalled`] turns the [`Stall`] into the
//! error naming the operation, the peer and the bytes moved.
//!
//! # Invariants
//!
//! - Bytes go out and are expected in exactly MLX's order: rank 0 reads the blocks of ranks 1,
//!   2, … in turn, then sends the concatenation to ranks 1, 2, …; any other rank sends its
//!   block, then reads the concatenation. Zero-length transfers are skipped (nothing moves, as
//!   in MLX). [`Protocol::on_received`] never takes a byte past the current message: what
//!   follows belongs to the next one.
//! - Nothing a peer sends makes it panic or allocate without bound: counts are checked
//!   (negative, or more than [`MAX_GATHER_BYTES`] in all) before any buffer is sized from them.
//! - The first failure is sticky: every later [`Protocol::start`] of a valid operation is
//!   [`Error::Failed`], as the byte stream is no longer aligned. Argument errors
//!   ([`Error::InvalidArgument`]) move no byte and leave it usable.

use std::fmt;
use std::io;
use std::time::Duration;

use super::record::{Destination, RingDestinations};
use crate::error::Error;
use gather::{Gather, Stage};
pub use hello::{HelloReader, Roster, hello};

mod gather;
mod hello;
pub mod liveness;

/// The most bytes one vector all-gather may move to a rank (R times the longest vector), so a
/// garbled length cannot make a rank allocate without bound.
pub const MAX_GATHER_BYTES: usize = 1 << 26;

/// The `op` of argument errors.
const OP: &str = "jaccl side channel";

/// A side-channel operation, as [`SideChannel`](super::SideChannel)'s methods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    /// One all-gather of these bytes (the same length on every rank).
    AllGather(Vec<u8>),
    /// MLX's all-gather of a vector: the record counts, then the records padded to the longest.
    AllGatherVec {
        /// This rank's records, back to back.
        records: Vec<u8>,
        /// The length of one record.
        record_len: usize,
    },
    /// MLX's barrier: two all-gathers of the `i32` 0.
    Barrier,
    /// The mesh's queue pair details: this rank's towards every rank, on every wire
    /// (wire-major: wire w's towards rank j at `w·R + j`).
    ExchangeMesh(Vec<Destination>),
    /// The ring's queue pair details: left QPs, then right QPs, one per wire.
    ExchangeRing {
        /// Towards the left neighbour.
        left: Vec<Destination>,
        /// Towards the right neighbour.
        right: Vec<Destination>,
    },
}

/// What an [`Operation`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// An all-gather's bytes, every rank's block in rank order.
    Bytes(Vec<u8>),
    /// A vector all-gather's records per rank, without the padding.
    Records(Vec<Vec<u8>>),
    /// A barrier passed.
    Done,
    /// `all[j][w·R + k]`: rank j's QP towards rank k on wire w.
    Mesh(Vec<Vec<Destination>>),
    /// Every rank's ring QPs.
    Ring(RingDestinations),
}

/// What the driver does next.
#[derive(Debug)]
pub enum Next<'a> {
    /// Send (a prefix of) `bytes` to rank `peer`, then report it with
    /// [`Protocol::on_sent`].
    Send {
        /// The rank at the other end.
        peer: usize,
        /// The rest of the current message.
        bytes: &'a [u8],
        /// The number of the all-gather it belongs to (a new one starts a new deadline).
        gather: u64,
    },
    /// Receive at most `len` bytes from rank `peer` and feed them to
    /// [`Protocol::on_received`].
    Receive {
        /// The rank at the other end.
        peer: usize,
        /// The rest of the current message.
        len: usize,
        /// The number of the all-gather it belongs to.
        gather: u64,
    },
    /// The operation ended (or none was running): its result.
    Done(Result<Output, Error>),
}

/// Why a transfer stopped before its message was complete.
#[derive(Debug)]
pub enum Stall {
    /// The deadline passed.
    TimedOut,
    /// The peer closed the connection.
    Closed,
    /// The socket failed.
    Io(io::Error),
}

/// A transfer that stopped after `done` of `len` bytes, for messages.
pub(crate) struct Short<'a> {
    /// Why it stopped.
    pub(crate) stall: &'a Stall,
    /// The bytes moved.
    pub(crate) done: usize,
    /// The bytes of the message.
    pub(crate) len: usize,
}

impl fmt::Display for Short<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (done, len) = (self.done, self.len);
        match self.stall {
            Stall::TimedOut => write!(f, "timed out with {done} of {len} bytes moved"),
            Stall::Closed => write!(
                f,
                "the connection was closed after {done} of {len} bytes (the rank failed or exited)"
            ),
            Stall::Io(e) => write!(f, "{e} after {done} of {len} bytes"),
        }
    }
}

/// What comes after a completed all-gather of an [`Operation`].
#[derive(Debug)]
enum Plan {
    /// A plain all-gather: its bytes are the output.
    Plain,
    /// The counts of a vector all-gather were gathered; the records come next.
    VecCounts { records: Vec<u8>, record_len: usize },
    /// The padded records of a vector all-gather were gathered.
    VecRecords {
        counts: Vec<usize>,
        block: usize,
        record_len: usize,
    },
    /// Round `round` (0 or 1) of a barrier was gathered.
    Barrier { round: u8 },
    /// The counts of an exchange were gathered; the records come next.
    ExchangeCounts {
        what: &'static str,
        mine: Vec<Destination>,
        side: Side,
    },
    /// The records of an exchange were gathered.
    ExchangeRecords { per_rank: usize, side: Side },
}

/// Which exchange of an operation is running.
#[derive(Debug)]
enum Side {
    /// The mesh's only one.
    Mesh,
    /// The ring's left QPs; the right ones follow.
    RingLeft { right: Vec<Destination> },
    /// The ring's right QPs, after the left ones.
    RingRight { left: Vec<Vec<Destination>> },
}

/// After a completed all-gather: the next one, or the operation's output.
enum Then {
    Gather(Plan, Vec<u8>),
    Output(Output),
}

/// Where the protocol stands.
#[derive(Debug)]
enum State {
    /// No operation is running.
    Idle,
    /// An all-gather of an operation is under way.
    Gathering { plan: Plan, gather: Gather },
    /// The operation ended.
    Done(Result<Output, Error>),
}

/// One rank's end of the side channel, without I/O (see the [module docs](self)).
#[derive(Debug)]
pub struct Protocol {
    rank: usize,
    size: usize,
    /// For messages only: how long the driver lets each all-gather take.
    timeout: Duration,
    /// All-gathers started so far, to number them in messages.
    started: u64,
    /// The first failure on the wire; every later operation returns it.
    failed: Option<Error>,
    state: State,
}

impl Protocol {
    /// Rank `rank` of `size`, whose driver gives each all-gather `timeout` (named in messages).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `size` is 0, above `i32::MAX`, or `rank` is not below it.
    pub fn new(rank: usize, size: usize, timeout: Duration) -> Result<Protocol, Error> {
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
        Ok(Protocol {
            rank,
            size,
            timeout,
            started: 0,
            failed: None,
            state: State::Idle,
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

    /// The timeout named in messages.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Starts `op`; [`poll`](Self::poll) then drives it. An operation still running is
    /// abandoned (its bytes are lost, so the channel counts as failed).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for `op`'s arguments, with nothing sent: a record length of
    /// 0, records that are not a whole number of records or more than `i32::MAX` of them, a
    /// mesh exchange without one destination per rank, ring sides of different lengths, or an
    /// all-gather whose R·n bytes overflow; [`Error::Failed`] after an earlier failure.
    pub fn start(&mut self, op: Operation) -> Result<(), Error> {
        if matches!(self.state, State::Gathering { .. }) {
            self.record(&Error::Connect {
                rank: self.rank,
                what: "jaccl: side channel: an operation was abandoned before its all-gathers \
                       completed"
                    .to_owned(),
            });
        }
        self.state = State::Idle;
        let (plan, first) = match op {
            Operation::AllGather(mine) => (Plan::Plain, mine),
            Operation::AllGatherVec {
                records,
                record_len,
            } => {
                let count = self.record_count(&records, record_len)?;
                (
                    Plan::VecCounts {
                        records,
                        record_len,
                    },
                    count.to_le_bytes().to_vec(),
                )
            }
            Operation::Barrier => (Plan::Barrier { round: 0 }, 0i32.to_le_bytes().to_vec()),
            Operation::ExchangeMesh(mine) => {
                if mine.is_empty() || !mine.len().is_multiple_of(self.size) {
                    return Err(invalid(
                        self.rank,
                        format!(
                            "exchange_mesh: {} destinations, expected one per rank ({}) and \
                             wire, with a placeholder for this rank",
                            mine.len(),
                            self.size
                        ),
                    ));
                }
                self.exchange_counts("mesh", mine, Side::Mesh)?
            }
            Operation::ExchangeRing { left, right } => {
                if left.len() != right.len() {
                    return Err(invalid(
                        self.rank,
                        format!(
                            "exchange_ring: {} left destinations but {} right ones; every wire \
                             has both",
                            left.len(),
                            right.len()
                        ),
                    ));
                }
                self.exchange_counts("ring (left QPs)", left, Side::RingLeft { right })?
            }
        };
        if let Some(first) = &self.failed {
            return Err(Error::Failed {
                rank: self.rank,
                op: "all_gather",
                first: Box::new(first.clone()),
            });
        }
        let gather = self.gather(first)?;
        self.state = State::Gathering { plan, gather };
        self.settle();
        Ok(())
    }

    /// What the driver does next (see [`Next`]). After [`Next::Done`] the protocol is idle;
    /// when idle, it is `Done` with an argument error.
    pub fn poll(&mut self) -> Next<'_> {
        if !matches!(self.state, State::Gathering { .. }) {
            return Next::Done(match std::mem::replace(&mut self.state, State::Idle) {
                State::Done(result) => result,
                _ => Err(invalid(
                    self.rank,
                    "no side-channel operation is running".to_owned(),
                )),
            });
        }
        let State::Gathering { gather: g, .. } = &self.state else {
            return Next::Done(Err(invalid(
                self.rank,
                "no side-channel operation is running".to_owned(),
            )));
        };
        match g.stage {
            Stage::ReadBlock { peer, done } => Next::Receive {
                peer,
                len: g.n - done,
                gather: g.seq,
            },
            Stage::SendAll { peer, done } => Next::Send {
                peer,
                bytes: &g.out[done..],
                gather: g.seq,
            },
            Stage::SendMine { done } => Next::Send {
                peer: 0,
                bytes: &g.mine[done..],
                gather: g.seq,
            },
            Stage::ReadAll { done } => Next::Receive {
                peer: 0,
                len: g.out.len() - done,
                gather: g.seq,
            },
            // `settle` never leaves a complete gather in place.
            Stage::Complete => Next::Done(Err(invalid(
                self.rank,
                "a completed all-gather was not settled".to_owned(),
            ))),
        }
    }

    /// Reports that the first `k` bytes [`Next::Send`] offered went out (more than offered
    /// counts as all of them).
    pub fn on_sent(&mut self, k: usize) {
        let size = self.size;
        if let State::Gathering { gather, .. } = &mut self.state {
            let len = gather.len();
            match &mut gather.stage {
                Stage::SendAll { done, .. } | Stage::SendMine { done } => {
                    *done = (*done + k).min(len);
                }
                _ => return,
            }
            gather.settle(size);
        }
        self.settle();
    }

    /// Feeds bytes received from the peer [`Next::Receive`] named; how many it took (never
    /// past the current message: the driver keeps the rest for the next one).
    pub fn on_received(&mut self, bytes: &[u8]) -> usize {
        let size = self.size;
        let State::Gathering { gather, .. } = &mut self.state else {
            return 0;
        };
        let n = gather.n;
        let (at, left) = match gather.stage {
            Stage::ReadBlock { peer, done } => (peer * n + done, n - done),
            Stage::ReadAll { done } => (done, gather.out.len() - done),
            _ => return 0,
        };
        let k = bytes.len().min(left);
        gather.out[at..at + k].copy_from_slice(&bytes[..k]);
        if let Stage::ReadBlock { done, .. } | Stage::ReadAll { done } = &mut gather.stage {
            *done += k;
        }
        gather.settle(size);
        self.settle();
        k
    }

    /// The current transfer stopped for `stall`: fails the channel with the error naming the
    /// all-gather, the peer, the bytes moved and the timeout, and returns it.
    pub fn stalled(&mut self, stall: Stall) -> Error {
        let e = match std::mem::replace(&mut self.state, State::Idle) {
            State::Gathering { gather, .. } => {
                let (doing, done) = gather.doing();
                let short = Short {
                    stall: &stall,
                    done,
                    len: gather.len(),
                };
                Error::Connect {
                    rank: self.rank,
                    what: format!(
                        "jaccl: side channel: all_gather #{} ({} bytes per rank): {doing}: \
                         {short} (timeout {:?})",
                        gather.seq, gather.n, self.timeout
                    ),
                }
            }
            _ => Error::Connect {
                rank: self.rank,
                what: format!(
                    "jaccl: side channel: {}",
                    Short {
                        stall: &stall,
                        done: 0,
                        len: 0
                    }
                ),
            },
        };
        self.record(&e);
        e
    }

    /// Ends the operation with the output or the next all-gather once the current one is
    /// complete.
    fn settle(&mut self) {
        loop {
            let State::Gathering { gather, .. } = &self.state else {
                return;
            };
            if gather.stage != Stage::Complete {
                return;
            }
            let State::Gathering { plan, gather } = std::mem::replace(&mut self.state, State::Idle)
            else {
                return;
            };
            let then = self
                .check_echo(&gather)
                .and_then(|()| self.then(plan, gather.out));
            self.state = match then {
                Ok(Then::Output(out)) => State::Done(Ok(out)),
                Ok(Then::Gather(plan, mine)) => match self.gather(mine) {
                    Ok(gather) => State::Gathering { plan, gather },
                    Err(e) => State::Done(Err(e)),
                },
                Err(e) => {
                    self.record(&e);
                    State::Done(Err(e))
                }
            };
        }
    }

    /// Another rank checks that rank 0 sent back its block unchanged.
    fn check_echo(&self, g: &Gather) -> Result<(), Error> {
        let n = g.n;
        if self.rank == 0 || g.out.get(self.rank * n..(self.rank + 1) * n) == Some(&g.mine[..]) {
            return Ok(());
        }
        Err(Error::Connect {
            rank: self.rank,
            what: format!(
                "jaccl: side channel: all_gather #{} ({n} bytes per rank): rank 0 sent back a \
                 different block for this rank; the ranks are not running the same sequence of \
                 side-channel operations",
                g.seq
            ),
        })
    }

    /// What follows the all-gather of `plan` that gathered `all`.
    fn then(&self, plan: Plan, all: Vec<u8>) -> Result<Then, Error> {
        let size = self.size;
        Ok(match plan {
            Plan::Plain => Then::Output(Output::Bytes(all)),
            Plan::VecCounts {
                mut records,
                record_len,
            } => {
                let mut counts = Vec::with_capacity(size);
                for (r, c) in i32s(&all).enumerate() {
                    match usize::try_from(c) {
                        Ok(c) => counts.push(c),
                        Err(_) => {
                            return Err(self.protocol_error(format!(
                                "all_gather of a vector: rank {r} announced {c} records, a \
                                 negative count"
                            )));
                        }
                    }
                }
                let longest = counts.iter().copied().max().unwrap_or(0);
                if longest
                    .checked_mul(record_len)
                    .and_then(|b| b.checked_mul(size))
                    .is_none_or(|b| b > MAX_GATHER_BYTES)
                {
                    let (who, n) = counts
                        .iter()
                        .enumerate()
                        .max_by_key(|(_, n)| **n)
                        .map(|(r, n)| (r, *n))
                        .unwrap_or_default();
                    return Err(self.protocol_error(format!(
                        "all_gather of a vector: rank {who} announced {n} records of \
                         {record_len} bytes, more than the side channel moves \
                         ({MAX_GATHER_BYTES} bytes in all)"
                    )));
                }
                let block = longest * record_len;
                // With every count 0 this moves no byte, as MLX's.
                records.resize(block, 0);
                Then::Gather(
                    Plan::VecRecords {
                        counts,
                        block,
                        record_len,
                    },
                    records,
                )
            }
            Plan::VecRecords {
                counts,
                block,
                record_len,
            } => Then::Output(Output::Records(
                counts
                    .iter()
                    .enumerate()
                    .map(|(r, n)| {
                        all.get(r * block..r * block + n * record_len)
                            .unwrap_or_default()
                            .to_vec()
                    })
                    .collect(),
            )),
            Plan::Barrier { round } => {
                if let Some((r, v)) = i32s(&all).enumerate().find(|(_, v)| *v != 0) {
                    return Err(self.protocol_error(format!(
                        "barrier: rank {r} sent {v} instead of 0; the ranks are not running the \
                         same sequence of side-channel operations"
                    )));
                }
                if round == 0 {
                    Then::Gather(Plan::Barrier { round: 1 }, 0i32.to_le_bytes().to_vec())
                } else {
                    Then::Output(Output::Done)
                }
            }
            Plan::ExchangeCounts { what, mine, side } => {
                // `exchange_counts` checked that the count fits.
                let n = i32::try_from(mine.len()).unwrap_or(i32::MAX);
                if let Some((r, c)) = i32s(&all).enumerate().find(|(_, c)| *c != n) {
                    return Err(self.protocol_error(format!(
                        "exchange {what}: rank {r} sent {c} destinations but this rank sent {n}; \
                         the ranks disagree on the connections"
                    )));
                }
                let bytes: Vec<u8> = mine.iter().flat_map(Destination::encode).collect();
                Then::Gather(
                    Plan::ExchangeRecords {
                        per_rank: mine.len() * Destination::BYTES,
                        side,
                    },
                    bytes,
                )
            }
            Plan::ExchangeRecords { per_rank, side } => {
                let got: Vec<Vec<Destination>> = (0..size)
                    .map(|r| {
                        all.get(r * per_rank..(r + 1) * per_rank)
                            .map(Destination::decode_all)
                            .unwrap_or_default()
                    })
                    .collect();
                match side {
                    Side::Mesh => Then::Output(Output::Mesh(got)),
                    Side::RingLeft { right } => {
                        let (plan, count) = self.exchange_counts(
                            "ring (right QPs)",
                            right,
                            Side::RingRight { left: got },
                        )?;
                        Then::Gather(plan, count)
                    }
                    Side::RingRight { left } => {
                        Then::Output(Output::Ring(RingDestinations { left, right: got }))
                    }
                }
            }
        })
    }

    /// The first all-gather of an exchange of `mine`: its count.
    fn exchange_counts(
        &self,
        what: &'static str,
        mine: Vec<Destination>,
        side: Side,
    ) -> Result<(Plan, Vec<u8>), Error> {
        let n = i32::try_from(mine.len())
            .map_err(|_| invalid(self.rank, format!("exchange {what}: too many destinations")))?;
        Ok((
            Plan::ExchangeCounts { what, mine, side },
            n.to_le_bytes().to_vec(),
        ))
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

    /// Starts the next all-gather of `mine`.
    fn gather(&mut self, mine: Vec<u8>) -> Result<Gather, Error> {
        let (n, size) = (mine.len(), self.size);
        let Some(total) = n.checked_mul(size) else {
            return Err(invalid(
                self.rank,
                format!("all_gather: {n} bytes from each of {size} ranks overflow"),
            ));
        };
        let seq = self.started;
        self.started += 1;
        Ok(Gather::new(self.rank, size, seq, mine, total))
    }

    /// A protocol error: a peer sent something this rank must refuse.
    fn protocol_error(&self, what: String) -> Error {
        Error::Connect {
            rank: self.rank,
            what: format!("jaccl: side channel: {what}"),
        }
    }

    /// Keeps the first failure (argument errors leave the channel usable).
    fn record(&mut self, e: &Error) {
        if !e.leaves_group_usable() && self.failed.is_none() {
            self.failed = Some(e.clone());
        }
    }
}

/// Little-endian `i32`s, 4 bytes each.
fn i32s(bytes: &[u8]) -> impl Iterator<Item = i32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// An argument error of the side channel.
fn invalid(rank: usize, what: String) -> Error {
    Error::InvalidArgument { rank, op: OP, what }
}

#[cfg(test)]
mod tests;
