//! The nuvec wire's fingerprint: a 32-byte header naming the call that sends it, written before
//! an operation's first bytes on a link, so that ranks that called different operations (or
//! the same one with other sizes) fail naming both calls instead of returning wrong numbers.
//!
//! MLX's wire has no header: a rank in `all_sum` reads a neighbour's `all_gather` bytes as
//! elements and returns their sum. On the nuvec wire (chosen only where every rank of the job
//! is this crate, see [`Wire`](crate::config::options::Wire)) every operation opens with one
//! header per link it uses, in both directions, and no rank folds or returns data before every
//! header it received matched its own call.
//!
//! # Layout (little-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `nuvW` |
//! | 4 | version (2: byte 7 names the schedule; version 1 left it 0) |
//! | 5 | the operation ([`Op`]) |
//! | 6 | the dtype (its index in [`DTYPES`], 255 for bytes) |
//! | 7 | the schedule ([`Schedule`]): 0 MLX's ring, 1 the relay, 2 MLX's ring turned rightward |
//! | 8..16 | the sequence number (see below) |
//! | 16..24 | the byte count per rank |
//! | 24..28 | the rank that made the header (the origin) |
//! | 28..32 | CRC-32 of bytes 0..28 |
//!
//! The checksum tells a whole header from a buffer a failed step left half written, so an
//! operation that failed for another reason can still say that its peer had called something
//! else.
//!
//! # Sequence numbers
//!
//! Every rank takes part in every collective, so collectives are numbered once for the group.
//! Point-to-point operations are not: rank 0 may send to rank 1 while rank 2 does nothing. So
//! a `send` carries the number of sends its rank made to that peer before, and the matching
//! `recv` compares it with the number of receives it made from that rank: the two counts agree
//! exactly when the two programs pair their sends and receives in the same order.
//!
//! # Schedules
//!
//! A collective's size picks its schedule (the relay up to a crossover, MLX's ring above it,
//! turned rightward on two ranks where it goes one way), and every rank must pick the same
//! one: they move other bytes on other links. The header names the schedule, so ranks whose
//! builds pick otherwise (another version of this crate, or a build made to measure the
//! crossover) fail naming both schedules rather than read each other's bytes as their own.

use std::fmt;

use nuvec_core::DType;

use crate::collective::reduce::{DTYPES, Reduction};

/// The length of a header.
pub const HEADER: usize = 32;

/// The first bytes of a header.
const MAGIC: &[u8; 4] = b"nuvW";

/// The layout's version: 2 since byte 7 names the schedule. A rank of version 1 (which left
/// that byte 0 whatever its schedule) is refused as a header that is not this wire's, rather
/// than trusted to have run the same schedule.
const VERSION: u8 = 2;

/// The dtype byte of an operation on raw bytes (all-gather, send, receive).
const BYTES: u8 = 255;

/// An operation, as the fingerprint names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `all_sum`.
    AllSum,
    /// `all_max`.
    AllMax,
    /// `all_min`.
    AllMin,
    /// `all_gather`.
    AllGather,
    /// `send` (the header's peer is the destination).
    Send,
    /// `recv` (never on the wire: a receive checks a `send`'s header).
    Recv,
    /// The all-gather by which `split` exchanges every rank's color and key.
    Split,
}

impl Op {
    /// The operation's name, as the collectives are called.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllSum => "all_sum",
            Op::AllMax => "all_max",
            Op::AllMin => "all_min",
            Op::AllGather => "all_gather",
            Op::Send => "send",
            Op::Recv => "recv",
            Op::Split => "split",
        }
    }

    /// The all-reduce of `reduction`.
    pub fn reduction(reduction: Reduction) -> Op {
        match reduction {
            Reduction::Sum => Op::AllSum,
            Reduction::Max => Op::AllMax,
            Reduction::Min => Op::AllMin,
        }
    }

    fn code(self) -> u8 {
        match self {
            Op::AllSum => 1,
            Op::AllMax => 2,
            Op::AllMin => 3,
            Op::AllGather => 4,
            Op::Send => 5,
            Op::Recv => 6,
            Op::Split => 7,
        }
    }

    fn from_code(code: u8) -> Option<Op> {
        Some(match code {
            1 => Op::AllSum,
            2 => Op::AllMax,
            3 => Op::AllMin,
            4 => Op::AllGather,
            5 => Op::Send,
            6 => Op::Recv,
            7 => Op::Split,
            _ => return None,
        })
    }
}

/// How a collective moves its bytes on the nuvec wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// MLX's ring schedule, the headers riding its first step (also every send and receive).
    Ring,
    /// The relay of small collectives ([`relay`](super::relay)).
    Relay,
    /// MLX's ring schedule where it moves every byte one way, on two ranks, turned to go
    /// rightward, the way the relay and a `send` go there, with the header only along it (see
    /// [`checked`](super::checked)): MLX's one way is leftward, where a header the other way
    /// would go as a packet of its own.
    RingRightward,
}

impl Schedule {
    fn code(self) -> u8 {
        match self {
            Schedule::Ring => 0,
            Schedule::Relay => 1,
            Schedule::RingRightward => 2,
        }
    }

    fn from_code(code: u8) -> Option<Schedule> {
        match code {
            0 => Some(Schedule::Ring),
            1 => Some(Schedule::Relay),
            2 => Some(Schedule::RingRightward),
            _ => None,
        }
    }

    /// The schedule as a mismatch names it.
    fn name(self) -> &'static str {
        match self {
            Schedule::Ring => "MLX's ring schedule",
            Schedule::Relay => "the relay",
            Schedule::RingRightward => "MLX's ring schedule turned rightward",
        }
    }
}

/// One rank's call, as the nuvec wire compares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// The operation.
    pub op: Op,
    /// The dtype of a reduction (`None` for operations on bytes).
    pub dtype: Option<DType>,
    /// The sequence number: of collectives in the group, or of sends to (receives from) the
    /// peer (see the [module documentation](self)).
    pub seq: u64,
    /// Bytes per rank (a send's or receive's length).
    pub bytes: u64,
    /// The rank that made the fingerprint.
    pub origin: usize,
    /// The other end of a send or receive (`None` for collectives).
    pub peer: Option<usize>,
    /// How the collective moves its bytes ([`Schedule::Ring`] for sends and receives).
    pub schedule: Schedule,
}

impl Fingerprint {
    /// The header of this fingerprint, as written on the wire. A receive is never written (a
    /// send's header is what a receive checks), and the peer of a send is implied by the link.
    pub fn encode(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[..4].copy_from_slice(MAGIC);
        h[4] = VERSION;
        h[5] = self.op.code();
        h[6] = self
            .dtype
            .and_then(|d| DTYPES.iter().position(|&x| x == d))
            .map_or(BYTES, |i| i as u8);
        h[7] = self.schedule.code();
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.bytes.to_le_bytes());
        h[24..28].copy_from_slice(&(self.origin as u32).to_le_bytes());
        let crc = crc32fast::hash(&h[..28]);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Reads a header, or `None` if it is not a whole, valid one (never received, half written
    /// by a failed step, or not this wire's). `peer` is the rank it was received from when it
    /// names a send (the send was to this rank).
    pub fn decode(h: &[u8; HEADER], receiver: usize) -> Option<Fingerprint> {
        let crc = u32::from_le_bytes(h[28..32].try_into().ok()?);
        if &h[..4] != MAGIC || h[4] != VERSION || crc32fast::hash(&h[..28]) != crc {
            return None;
        }
        let op = Op::from_code(h[5])?;
        let dtype = match h[6] {
            BYTES => None,
            i => Some(*DTYPES.get(usize::from(i))?),
        };
        let origin = u32::from_le_bytes(h[24..28].try_into().ok()?) as usize;
        let schedule = Schedule::from_code(h[7])?;
        Some(Fingerprint {
            op,
            dtype,
            seq: u64::from_le_bytes(h[8..16].try_into().ok()?),
            bytes: u64::from_le_bytes(h[16..24].try_into().ok()?),
            origin,
            peer: (op == Op::Send).then_some(receiver),
            schedule,
        })
    }

    /// Whether `theirs`, received from its origin, is the call that pairs with this one: the
    /// same collective with the same dtype, sequence number, size and schedule, or, for a
    /// receive, the matching send to this rank.
    pub fn matches(&self, theirs: &Fingerprint) -> bool {
        match self.op {
            Op::Recv => {
                theirs.op == Op::Send
                    && self.peer == Some(theirs.origin)
                    && theirs.peer == Some(self.origin)
                    && theirs.seq == self.seq
                    && theirs.bytes == self.bytes
            }
            _ => {
                theirs.op == self.op
                    && theirs.dtype == self.dtype
                    && theirs.seq == self.seq
                    && theirs.bytes == self.bytes
                    && theirs.schedule == self.schedule
            }
        }
    }

    /// The text of a mismatch between this rank's call and `theirs`: "rank 1 called all_gather
    /// #3 of 16 bytes per rank where this rank called all_sum #3 of 16 bytes (float32)".
    pub fn mismatch(&self, theirs: &Fingerprint) -> String {
        let same_call = Fingerprint {
            schedule: self.schedule,
            origin: self.origin,
            ..*theirs
        } == *self;
        if theirs.schedule != self.schedule && same_call {
            // The same call by another schedule: the programs agree, the builds do not.
            let differ = if Schedule::Relay == theirs.schedule || Schedule::Relay == self.schedule {
                "draw the nuvec wire's crossover elsewhere"
            } else {
                "choose the nuvec wire's schedules otherwise"
            };
            return format!(
                "rank {} ran {} by {} where this rank ran it by {}: the ranks' builds {differ} \
                 (different versions of nuvec-distributed?); run one build on every rank",
                theirs.origin,
                Call(theirs),
                theirs.schedule.name(),
                self.schedule.name()
            );
        }
        format!(
            "rank {} called {} where this rank called {}: the ranks' programs disagree (the \
             nuvec wire checks every operation's call on every link)",
            theirs.origin,
            Call(theirs),
            Call(self)
        )
    }
}

/// A fingerprint as the call it stands for.
struct Call<'a>(&'a Fingerprint);

impl fmt::Display for Call<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        write!(f, "{} #{}", c.op.name(), c.seq)?;
        match (c.op, c.peer) {
            (Op::Send, Some(p)) => write!(f, " to rank {p}")?,
            (Op::Recv, Some(p)) => write!(f, " from rank {p}")?,
            _ => {}
        }
        let unit = match c.op {
            Op::AllGather | Op::Split => " per rank",
            _ => "",
        };
        write!(f, " of {} bytes{unit}", c.bytes)?;
        if let Some(dtype) = c.dtype {
            write!(f, " ({dtype})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(seq: u64, bytes: u64, origin: usize) -> Fingerprint {
        Fingerprint {
            op: Op::AllSum,
            dtype: Some(DType::F32),
            seq,
            bytes,
            origin,
            peer: None,
            schedule: Schedule::Ring,
        }
    }

    #[test]
    fn a_header_reads_back_as_the_fingerprint_that_wrote_it() {
        for &dtype in DTYPES.iter() {
            let f = Fingerprint {
                dtype: Some(dtype),
                ..sum(7, 4096, 3)
            };
            assert_eq!(Fingerprint::decode(&f.encode(), 0), Some(f));
        }
        let gather = Fingerprint {
            op: Op::AllGather,
            dtype: None,
            ..sum(1, 16, 2)
        };
        assert_eq!(Fingerprint::decode(&gather.encode(), 0), Some(gather));
    }

    #[test]
    fn a_header_with_any_byte_changed_or_missing_is_not_read() {
        let h = sum(7, 4096, 3).encode();
        for i in 0..HEADER {
            let mut bad = h;
            bad[i] ^= 0x40;
            assert_eq!(Fingerprint::decode(&bad, 0), None, "byte {i}");
        }
        let mut half = h;
        half[HEADER / 2..].fill(0);
        assert_eq!(Fingerprint::decode(&half, 0), None);
        assert_eq!(Fingerprint::decode(&[0; HEADER], 0), None);
    }

    #[test]
    fn a_receive_matches_the_send_to_this_rank_with_the_same_count_and_size() {
        let send = Fingerprint {
            op: Op::Send,
            dtype: None,
            seq: 2,
            bytes: 64,
            origin: 0,
            peer: Some(1),
            schedule: Schedule::Ring,
        };
        let on_wire = Fingerprint::decode(&send.encode(), 1).expect("whole");
        let recv = Fingerprint {
            op: Op::Recv,
            origin: 1,
            peer: Some(0),
            ..send
        };
        assert!(recv.matches(&on_wire));
        assert!(!Fingerprint { seq: 3, ..recv }.matches(&on_wire));
        assert!(!Fingerprint { bytes: 65, ..recv }.matches(&on_wire));
        assert!(!recv.matches(&sum(2, 64, 0)));
    }

    #[test]
    fn a_mismatch_names_both_calls() {
        let ours = sum(3, 16, 0);
        let theirs = Fingerprint {
            op: Op::AllGather,
            dtype: None,
            ..sum(3, 16, 1)
        };
        assert!(!ours.matches(&theirs));
        let text = ours.mismatch(&theirs);
        assert!(
            text.starts_with(
                "rank 1 called all_gather #3 of 16 bytes per rank where this rank called \
                 all_sum #3 of 16 bytes (float32)"
            ),
            "{text}"
        );
    }

    /// The mismatch rank 0, running all_sum #4 of 65536 bytes by MLX's ring schedule, names
    /// when rank 1 runs the same call by `schedule` (whose header reads back whole).
    fn mismatch_by(schedule: Schedule) -> String {
        let ring = sum(4, 65536, 0);
        let theirs = Fingerprint {
            schedule,
            ..sum(4, 65536, 1)
        };
        assert_eq!(Fingerprint::decode(&theirs.encode(), 0), Some(theirs));
        assert!(!ring.matches(&theirs));
        ring.mismatch(&theirs)
    }

    #[test]
    fn the_same_call_by_another_schedule_is_a_mismatch_that_names_both_schedules() {
        let text = mismatch_by(Schedule::Relay);
        assert!(
            text.starts_with(
                "rank 1 ran all_sum #4 of 65536 bytes (float32) by the relay where this rank ran \
                 it by MLX's ring schedule: the ranks' builds draw the nuvec wire's crossover \
                 elsewhere"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_same_call_turned_rightward_by_one_build_only_names_both_schedules() {
        let text = mismatch_by(Schedule::RingRightward);
        assert!(
            text.starts_with(
                "rank 1 ran all_sum #4 of 65536 bytes (float32) by MLX's ring schedule turned \
                 rightward where this rank ran it by MLX's ring schedule: the ranks' builds \
                 choose the nuvec wire's schedules otherwise"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_header_naming_no_known_schedule_is_not_read() {
        let mut h = sum(1, 8, 0).encode();
        h[7] = 3;
        let crc = crc32fast::hash(&h[..28]);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(Fingerprint::decode(&h, 0), None);
    }
}
