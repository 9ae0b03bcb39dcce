//! The nuvec wire's small collectives: every rank's vector goes both ways round the ring at
//! once, so an all-reduce or all-gather takes ⌈(R−1)/2⌉ hops where MLX's ring takes 2(R−1)
//! and R−1.
//!
//! In step t (1 ≤ t ≤ ⌈(R−1)/2⌉) rank r receives the vector of rank r−t from its left
//! neighbour and that of rank r+t from its right one, and sends on what it received in step
//! t−1 (its own in step 1): to the right what came from the left, to the left what came from the
//! right. With R even the last step's two vectors are one rank's, so only the rightward one
//! moves. On 4 ranks the same 2 hops go by pairs instead, in fewer messages: each rank swaps its
//! vector with one neighbour, then both vectors it holds with the other (see `plan`). Every
//! vector travels with the [`Fingerprint`] of its origin's call, judged the moment
//! it lands ([`Landing::Checked`]), so every rank compares every other rank's call with its own
//! before it folds or returns anything, and a mismatch fails the step at once.
//!
//! An all-reduce then folds the R vectors in rank order (((v₀ ⊕ v₁) ⊕ v₂) …), the same
//! sequence on every rank, so every rank returns the same bits, run after run, and max/min treat
//! NaNs alike everywhere; the bits may differ from MLX's ring, which reduces each segment in
//! another order. An all-gather lands each vector straight in its place of the output.
//!
//! Only link 0 to each neighbour is used: the ring's own links, which are all a hostfile of a
//! Thunderbolt ring has. Each rank sends (R−1) vectors in all, against 2(R−1)/R of one for
//! MLX's all-reduce, so above a few KiB MLX's schedule wins; see [`ALL_REDUCE_CROSSOVER`] for
//! the crossovers and the measurements behind them.

use std::ops::Range;
use std::time::Duration;

use smallvec::SmallVec;

use super::RingTopology;
use super::algorithm::{carve, distinct};
use super::checked::Expect;
use super::fingerprint::{Fingerprint, HEADER};
use super::schedule::Side;
use crate::collective::reduce::Reducer;
use crate::fabric::{Ahead, Check, Direction, Fabric, FabricError, Landing, Transfer};

/// The largest all-reduce, in bytes per rank, that the relay takes.
///
/// The cost model, per operation on R ranks: a hop costs its link's latency α, every message
/// a fixed μ of system calls, packets and wake-ups on both ends, and every byte β. The relay
/// takes ⌈(R−1)/2⌉·α, and each rank sends R−1 messages of n bytes; MLX's ring takes 2(R−1)·α
/// and sends 2(R−1) messages of n/R. So the relay saves 2(R−1)−⌈(R−1)/2⌉ hops, and pays
/// (R−1)·(R−2)/R·n·β more bytes per rank: it wins below a size that grows with α.
///
/// Measured where α is smallest, on one machine (`benches/cluster.sh` with `CROSSOVER=65536
/// RATE=none`, one rank per host of the emulated cluster; and the allreduce bench over
/// loopback TCP, `--tcp-only`), float32, p50 of the relay on the nuvec wire ÷ p50 of MLX's
/// wire, best of 3, one run each on a quiet 2-core machine:
///
/// | ranks | 4 KiB | 8 KiB | 16 KiB | 32 KiB | 64 KiB |
/// |---|---|---|---|---|---|
/// | 2 hosts | 0.94 | 0.76 | 0.76 | 1.06 | 1.44 |
/// | 4 hosts | 0.54 | 0.62 | 0.62 | 0.77 | 1.09 |
/// | 2, loopback | 0.66 | | 0.95 | | 1.31 |
/// | 4, loopback | 0.46 | | 0.73 | | 1.28 |
/// | 8, loopback | 0.60 | | 0.86 | | 2.13 |
///
/// On 4 ranks the relay now goes by pairs (`plan`); the same curve on 4 hosts with it
/// (2026-12-05, the same command, best of 3): 0.48, 0.59, 0.64, 0.82, 1.13.
///
/// The relay wins up to 16 KiB at every R measured and loses at 64 KiB at every R (at 32
/// KiB on 2 hosts already), so the crossover is 16 KiB. Where a hop costs more (Thunderbolt IP
/// pings 0.38–0.95 ms, against tens of µs here) the relay gains more and the crossover would
/// be higher; it is kept where it is measured. Those runs had each header sent together with
/// its payload (`MSG_MORE`, see the TCP fabric); before that, a header went out as a packet of
/// its own and 4 KiB on 4 hosts took 0.78× MLX's wire's time instead of 0.54×.
pub const ALL_REDUCE_CROSSOVER: usize = 16 * 1024;

/// The largest all-gather, in bytes per rank, that the relay takes, on 3 ranks or more (on 2
/// an all-gather takes one hop either way, so the relay would only add its header).
///
/// An all-gather by the relay sends the same R−1 messages of n bytes as MLX's, over
/// ⌈(R−1)/2⌉ hops instead of R−1, so it saves hops and no bytes. Over loopback TCP, where a hop
/// costs almost nothing, it measured 0.82, 1.12 and 1.14 × MLX's wire's time at 4, 16 and 64
/// KiB on 4 ranks and 0.89, 1.04 and 1.20 on 8 (the final build, best of 3, quiet machine;
/// the README's table): even where hops are free it is within 12 % up to 16 KiB, and across
/// hosts each hop it saves is a link's latency. So it takes the all-reduce's crossover.
pub const ALL_GATHER_CROSSOVER: usize = 16 * 1024;

/// Whether an all-reduce (`reduce`) or all-gather of `bytes` per rank goes by the relay on
/// the nuvec wire.
///
/// A build with `NUVEC_DISTRIBUTED_RELAY_CROSSOVER=BYTES` in its environment moves both
/// crossovers to `BYTES`: that is how the crossover curve is measured (`benches/cluster.sh`'s
/// `CROSSOVER`). It is read when the crate is compiled, not when it runs, so every rank of a
/// job running one build agrees on it. Ranks whose builds disagree (this, or two versions of
/// the crate with other crossovers) fail their first operation between the two crossovers,
/// naming both schedules: every header names its schedule
/// ([`Schedule`](super::fingerprint::Schedule)).
pub fn relays(reduce: bool, bytes: usize, ranks: usize) -> bool {
    let crossover = built_crossover().unwrap_or(if reduce {
        ALL_REDUCE_CROSSOVER
    } else {
        ALL_GATHER_CROSSOVER
    });
    // An all-gather on two ranks takes one hop either way: the relay would only add its header.
    let fewer_hops = if reduce { ranks > 1 } else { ranks > 2 };
    fewer_hops && bytes <= crossover
}

/// The crossover this build was compiled with, if any (see [`relays`]).
fn built_crossover() -> Option<usize> {
    BUILT_CROSSOVER
}

/// `NUVEC_DISTRIBUTED_RELAY_CROSSOVER` as read when compiling: a value that is not a number of
/// bytes fails the build rather than leave a measurement run on the default unawares.
const BUILT_CROSSOVER: Option<usize> = match option_env!("NUVEC_DISTRIBUTED_RELAY_CROSSOVER") {
    Some(bytes) => Some(parse_bytes(bytes)),
    None => None,
};

/// `text` as a decimal number, at compile time.
const fn parse_bytes(text: &str) -> usize {
    let digits = text.as_bytes();
    assert!(
        !digits.is_empty(),
        "NUVEC_DISTRIBUTED_RELAY_CROSSOVER is empty: give a number of bytes"
    );
    let mut value: usize = 0;
    let mut i = 0;
    while i < digits.len() {
        let d = digits[i];
        assert!(
            d.is_ascii_digit(),
            "NUVEC_DISTRIBUTED_RELAY_CROSSOVER takes a number of bytes, in decimal digits"
        );
        value = match value.checked_mul(10) {
            Some(v) => match v.checked_add((d - b'0') as usize) {
                Some(v) => v,
                None => panic!("NUVEC_DISTRIBUTED_RELAY_CROSSOVER is too large"),
            },
            None => panic!("NUVEC_DISTRIBUTED_RELAY_CROSSOVER is too large"),
        };
        i += 1;
    }
    value
}

/// How long the first step of the relay on 4 ranks waits before it sends its header to the
/// neighbour it sends nothing else in that step, and reads that neighbour's (see `plan` and
/// [`Fabric::run_ahead`]).
///
/// The header goes ahead so that a neighbour whose program called something else reads it
/// whichever link it waits on; but alone it is a message of its own, with its system calls,
/// packet and wake-up at both ends, where the second step's message to that neighbour can
/// carry it. So it waits: a step that ends within the hold (every step where the ranks'
/// calls agree and they arrive within the hold, less a hop, of each other) leaves it to the
/// second step, which sends it with its vectors in one write and reads the neighbour's with
/// theirs, and a step held up sends and reads it then. A mismatch is found about this much
/// (and a hop) later, which is nothing next to a job that fails; a rank that arrives later
/// than this costs what the header sent at once cost before. A millisecond is long next to
/// the step it waits on on one machine (a few tens of µs), and 2 to 5 times a hop over
/// Thunderbolt IP (half a ping of 0.38–0.95 ms), where ranks may then arrive about half a
/// millisecond apart and still send 2 messages each.
///
/// Measured on 4 unshaped hosts of the emulated cluster, 4 KiB all_sum through nuvec arrays
/// (`RATE=none RANKS=4 SIZES=4K REPS=3 IMPLS="arrays arraysmlx" benches/cluster.sh`, p50 µs
/// and its ratio to MLX's wire's in the same run, best of 3; 2026-12-07, a 2-core AMD EPYC
/// host): with the header sent at once 75.7–79.6 µs (0.50–0.52×, 4 runs, 41–47 µs of CPU per
/// operation and rank); held, 63.2–63.9 µs (0.41–0.42×, 3 runs, 35–37 µs of CPU), as fast as
/// with no header ahead at all (62.4–64.3, 0.42–0.43×, which waits a mismatch out).
pub const HOLD: Duration = Duration::from_millis(1);

/// The number of steps of the relay over `ranks` ranks: ⌈(R−1)/2⌉.
pub fn steps(ranks: usize) -> usize {
    ranks / 2
}

/// All-reduces `data` (elements of `reducer`'s dtype) by the relay; `scratch` holds the other
/// ranks' vectors and `headers` their headers (both reused across calls). `ours` is this
/// rank's call.
#[allow(
    clippy::too_many_arguments,
    reason = "the relay's buffers, one argument each"
)]
pub fn all_reduce<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    reducer: Reducer,
    data: &mut [u8],
    scratch: &mut Vec<u8>,
    headers: &mut Vec<u8>,
    ours: &Fingerprint,
    deadline: Duration,
) -> Result<(), FabricError> {
    let (n, ranks) = (data.len(), ring.size());
    scratch.clear();
    scratch.resize(n * ranks, 0);
    scratch[ring.rank() * n..(ring.rank() + 1) * n].copy_from_slice(data);
    relay(fabric, ring, scratch, headers, n, ours, deadline)?;
    data.copy_from_slice(&scratch[..n]);
    for origin in 1..ranks {
        reducer.apply(data, &scratch[origin * n..(origin + 1) * n]);
    }
    Ok(())
}

/// Gathers every rank's `input` into `output` (`input.len() × R` bytes, rank order) by the
/// relay; `headers` holds every rank's header (reused across calls). `ours` is this rank's
/// call.
///
/// # Panics
/// If `output.len() != input.len() * R` (the communicator checks it first).
pub fn all_gather<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    input: &[u8],
    output: &mut [u8],
    headers: &mut Vec<u8>,
    ours: &Fingerprint,
    deadline: Duration,
) -> Result<(), FabricError> {
    let (n, rank) = (input.len(), ring.rank());
    assert_eq!(output.len(), n * ring.size(), "all_gather: output size");
    output[rank * n..(rank + 1) * n].copy_from_slice(input);
    relay(fabric, ring, output, headers, n, ours, deadline)
}

/// The relay over `slots`, R slots of `n` bytes in rank order, this rank's filled: on return
/// every slot holds its rank's vector, and every rank's call was found equal to `ours`.
/// `headers` is where every rank's header lands.
fn relay<F: Fabric + ?Sized>(
    fabric: &mut F,
    ring: &RingTopology,
    slots: &mut [u8],
    headers: &mut Vec<u8>,
    n: usize,
    ours: &Fingerprint,
    deadline: Duration,
) -> Result<(), FabricError> {
    let (rank, ranks) = (ring.rank(), ring.size());
    headers.clear();
    headers.resize(HEADER * ranks, 0);
    headers[rank * HEADER..(rank + 1) * HEADER].copy_from_slice(&ours.encode());
    let span = |o: usize, size: usize| -> Range<usize> { o * size..(o + 1) * size };
    let steps = plan(rank, ranks);
    // The headers that went ahead of their step and how many of their bytes moved: what is
    // left of each goes at the start of the next step on its link.
    let mut went: SmallVec<[(Move, Direction, usize); 2]> = SmallVec::new();
    for (t, moves) in steps.iter().enumerate() {
        // The links later steps send on (see `Fabric::sends_later`).
        let later = steps[t + 1..].iter().flat_map(|s| &s.sends);
        fabric.sends_later(&distinct(later.map(|m| ring.channel(m.side, 0))));
        // One slice per distinct origin: both sends of step 1 may read this rank's vector.
        let mut origins: SmallVec<[usize; 4]> = SmallVec::new();
        for m in moves.sends.iter().chain(&moves.recvs) {
            if !origins.contains(&m.origin) {
                origins.push(m.origin);
            }
        }
        let payload_ranges: SmallVec<[Range<usize>; 4]> =
            origins.iter().map(|&o| span(o, n)).collect();
        let header_ranges: SmallVec<[Range<usize>; 4]> =
            origins.iter().map(|&o| span(o, HEADER)).collect();
        let mut payloads: SmallVec<[Option<&mut [u8]>; 4]> = carve(slots, &payload_ranges)
            .into_iter()
            .map(Some)
            .collect();
        let mut heads: SmallVec<[Option<&mut [u8]>; 4]> = carve(headers, &header_ranges)
            .into_iter()
            .map(Some)
            .collect();
        let index = |o: usize| origins.iter().position(|&x| x == o).unwrap_or(0);
        // Sent slices are shared (read by every send of their origin); received ones are not:
        // a step never sends and receives one origin.
        let mut sent: SmallVec<[Sent<'_>; 2]> = SmallVec::new();
        for m in &moves.sends {
            let i = index(m.origin);
            if let (Some(h), Some(p)) = (heads[i].take(), payloads[i].take()) {
                sent.push((m.origin, h, p));
            }
        }
        // How much of a header that went ahead in the last step moved there (all of one that
        // did not go ahead): the rest moves in this step.
        let moved_ahead = |m: &Move, way: Direction| {
            went.iter()
                .find(|(w, d, _)| *d == way && w.side == m.side && w.origin == m.origin)
                .map_or(HEADER, |&(.., moved)| moved)
        };
        // Each receive's judge (its header's whole, or what is left of one that went ahead)
        // and where that lands.
        let mut bufs: SmallVec<[Option<&mut [u8]>; 2]> = SmallVec::new();
        let judges: SmallVec<[Rest<'_>; 2]> = moves
            .recvs
            .iter()
            .map(|m| {
                let i = index(m.origin);
                let expect = Expect {
                    ours: *ours,
                    from: m.origin,
                };
                let landed = match m.part {
                    Part::Payload => moved_ahead(m, Direction::Recv).min(HEADER),
                    _ => 0,
                };
                let head: &[u8] = match heads[i].take() {
                    Some(h) if m.part.header() || landed < HEADER => {
                        let (head, buf) = h.split_at_mut(landed);
                        bufs.push(Some(buf));
                        head
                    }
                    other => {
                        heads[i] = other;
                        bufs.push(None);
                        &[]
                    }
                };
                Rest { head, expect }
            })
            .collect();
        let mut step: SmallVec<[Transfer<'_>; 8]> = SmallVec::new();
        let mut ahead: SmallVec<[(Move, Direction); 2]> = SmallVec::new();
        // The step's own transfers first, then those that go ahead of the next step: one
        // header each.
        let mut from = 0;
        for early in [false, true] {
            from = step.len();
            for m in moves.sends.iter().filter(|m| m.part.ahead() == early) {
                let channel = ring.channel(m.side, 0);
                let Some(&(_, h, p)) = sent.iter().find(|(o, ..)| *o == m.origin) else {
                    continue;
                };
                if m.part.header() {
                    step.push(Transfer::Send { channel, data: h });
                } else {
                    let moved = moved_ahead(m, Direction::Send).min(HEADER);
                    if moved < HEADER {
                        step.push(Transfer::Send {
                            channel,
                            data: &h[moved..],
                        });
                    }
                }
                if m.part.payload() {
                    step.push(Transfer::Send { channel, data: p });
                }
                if early {
                    ahead.push((*m, Direction::Send));
                }
            }
            for (j, m) in moves.recvs.iter().enumerate() {
                if m.part.ahead() != early {
                    continue;
                }
                let channel = ring.channel(m.side, 0);
                let i = index(m.origin);
                if let Some(buf) = bufs[j].take() {
                    // The header is judged as it lands, before the step waits for anything
                    // else.
                    step.push(Transfer::Recv {
                        channel,
                        landing: Landing::Checked {
                            buf,
                            check: &judges[j],
                        },
                    });
                }
                if m.part.payload()
                    && let Some(p) = payloads[i].take()
                {
                    step.push(Transfer::Recv {
                        channel,
                        landing: Landing::Into(p),
                    });
                }
                if early {
                    ahead.push((*m, Direction::Recv));
                }
            }
        }
        went.clear();
        if ahead.is_empty() {
            fabric.run(&mut step, deadline)?;
        } else {
            let mut moved: SmallVec<[usize; 2]> = smallvec::smallvec![0; ahead.len()];
            debug_assert_eq!(
                step.len() - from,
                ahead.len(),
                "one transfer per header ahead"
            );
            fabric.run_ahead(&mut step, Ahead { from, hold: HOLD }, deadline, &mut moved)?;
            went.extend(
                ahead
                    .iter()
                    .zip(moved.iter())
                    .map(|(&(m, d), &n)| (m, d, n)),
            );
        }
    }
    Ok(())
}

/// The judge of a header's receive, or of what is left of it when part of it landed in the
/// step it went ahead of.
struct Rest<'a> {
    /// The header's bytes that landed in an earlier step.
    head: &'a [u8],
    /// What the whole header must say.
    expect: Expect,
}

impl Check for Rest<'_> {
    fn check(&self, bytes: &[u8]) -> Result<(), String> {
        if self.head.is_empty() {
            self.expect.check(bytes)
        } else {
            self.expect.check(&[self.head, bytes].concat())
        }
    }
}

/// A vector this rank sends in a step: its origin, its header and its payload.
type Sent<'a> = (usize, &'a [u8], &'a [u8]);

/// Which part of a rank's call a [`Move`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Its header, then its vector.
    Whole,
    /// Its header alone, ahead of the next step (see [`HOLD`]): the step does not wait for
    /// it, and what of it the step did not move goes at the start of the next step's
    /// [`Part::Payload`] on the same link, with the vector.
    Header,
    /// Its vector alone, after what is left of its header.
    Payload,
}

impl Part {
    fn header(self) -> bool {
        matches!(self, Part::Whole | Part::Header)
    }

    fn payload(self) -> bool {
        matches!(self, Part::Whole | Part::Payload)
    }

    /// Whether it goes ahead of the next step rather than in its own.
    fn ahead(self) -> bool {
        self == Part::Header
    }
}

/// One rank's call, or part of it, crossing one link in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Move {
    /// The neighbour it goes to or comes from.
    side: Side,
    /// The rank whose call it is.
    origin: usize,
    /// What of it moves.
    part: Part,
}

/// What one rank sends and receives in one step of the relay, in the order it goes on the
/// wire.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Moves {
    sends: SmallVec<[Move; 3]>,
    recvs: SmallVec<[Move; 3]>,
}

/// The relay's steps for `rank` of `ranks`, as a pure schedule.
///
/// On 4 ranks the ring's four links hold two pairings, {0,1}{2,3} and {0,3}{1,2}. In step 1
/// each rank swaps its vector with its partner in the first (and its header with its partner
/// in the second, held: below); in step 2 it sends the second partner its own vector and its
/// first partner's call, in one message. That is the same 2 hops and the same 3 vectors as going both
/// ways round, in 2 messages of vectors per rank instead of 3, where a message's system calls
/// and wake-ups cost more than its bytes, as they do below the crossover. The header to the
/// second partner goes ahead of step 2, held for [`HOLD`]: as on every other schedule, an
/// operation's header reaches each of a rank's links soon after the rank begins, whatever it
/// waits for, so that a rank whose program called something else reads it, whichever link it
/// waits on, and the mismatch is found instead of waited out; and where step 1 ends within
/// the hold, it rides with step 2's vectors, so each rank sends 2 messages in all. On other
/// sizes the vectors go both ways round the ring.
fn plan(rank: usize, ranks: usize) -> SmallVec<[Moves; 4]> {
    let side_of = |peer: usize| {
        if peer == (rank + 1) % ranks {
            Side::Right
        } else {
            Side::Left
        }
    };
    let go = |peer: usize, origin: usize, part: Part| Move {
        side: side_of(peer),
        origin,
        part,
    };
    if ranks == 4 {
        let (first, second) = (rank ^ 1, 3 - rank);
        let mut pairs = SmallVec::new();
        pairs.push(Moves {
            sends: [go(first, rank, Part::Whole), go(second, rank, Part::Header)]
                .into_iter()
                .collect(),
            recvs: [
                go(first, first, Part::Whole),
                go(second, second, Part::Header),
            ]
            .into_iter()
            .collect(),
        });
        pairs.push(Moves {
            sends: [
                go(second, rank, Part::Payload),
                go(second, first, Part::Whole),
            ]
            .into_iter()
            .collect(),
            recvs: [
                go(second, second, Part::Payload),
                go(second, second ^ 1, Part::Whole),
            ]
            .into_iter()
            .collect(),
        });
        return pairs;
    }
    let at = |back: bool, t: usize| {
        if back {
            (rank + ranks - t % ranks) % ranks
        } else {
            (rank + t) % ranks
        }
    };
    let whole = |side: Side, origin: usize| Move {
        side,
        origin,
        part: Part::Whole,
    };
    let last = steps(ranks);
    (1..=last)
        .map(|t| {
            let mut moves = Moves::default();
            moves.sends.push(whole(Side::Right, at(true, t - 1)));
            moves.recvs.push(whole(Side::Left, at(true, t)));
            // With R even the last step's two vectors are one rank's: only the rightward one
            // moves.
            if !(ranks.is_multiple_of(2) && t == last) {
                moves.sends.push(whole(Side::Left, at(false, t - 1)));
                moves.recvs.push(whole(Side::Right, at(false, t)));
            }
            moves
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_that_landed_in_part_ahead_of_its_step_is_judged_whole_with_its_rest() {
        use super::super::fingerprint::{Op, Schedule};
        use nuvec_core::DType;
        let call = |origin: usize, op: Op| Fingerprint {
            op,
            dtype: Some(DType::F32),
            seq: 3,
            bytes: 4096,
            origin,
            peer: None,
            schedule: Schedule::Relay,
        };
        let expect = Expect {
            ours: call(0, Op::AllSum),
            from: 3,
        };
        let (same, other) = (call(3, Op::AllSum).encode(), call(3, Op::AllMax).encode());
        for landed in [0, 1, 10, HEADER - 1] {
            let rest = |header: &[u8; HEADER]| {
                Rest {
                    head: &header[..landed],
                    expect,
                }
                .check(&header[landed..])
            };
            assert_eq!(rest(&same), Ok(()), "{landed} bytes landed ahead");
            let refused = rest(&other).expect_err("another operation");
            assert!(refused.contains("all_max"), "{landed}: {refused}");
        }
    }

    #[test]
    fn the_relay_takes_half_the_ring_in_hops() {
        let hops: Vec<usize> = (2..=9).map(steps).collect();
        assert_eq!(hops, [1, 1, 2, 2, 3, 3, 4, 4]);
        for ranks in 2..=9usize {
            assert_eq!(steps(ranks), (ranks - 1).div_ceil(2), "{ranks}");
        }
    }

    #[test]
    fn every_send_of_the_plan_meets_its_receive_and_every_rank_ends_with_every_call() {
        let opposite = |side: Side| match side {
            Side::Right => Side::Left,
            Side::Left => Side::Right,
        };
        let peer = |r: usize, side: Side, ranks: usize| match side {
            Side::Right => (r + 1) % ranks,
            Side::Left => (r + ranks - 1) % ranks,
        };
        for ranks in 2..=9usize {
            let plans: Vec<_> = (0..ranks).map(|r| plan(r, ranks)).collect();
            // (origin, header held, payload held) per rank.
            let mut held: Vec<Vec<(usize, bool, bool)>> =
                (0..ranks).map(|r| vec![(r, true, true)]).collect();
            for (r, steps_of_r) in plans.iter().enumerate() {
                assert_eq!(steps_of_r.len(), steps(ranks), "{ranks} ranks, rank {r}");
                // An operation's first bytes to each neighbour are a header, sent in step 1.
                for side in [Side::Left, Side::Right] {
                    let first = steps_of_r.iter().enumerate().find_map(|(t, m)| {
                        m.sends.iter().find(|s| s.side == side).map(|s| (t, *s))
                    });
                    if let Some((t, m)) = first {
                        assert!(m.part.header(), "{ranks}: rank {r} {side:?}");
                        assert_eq!(t, 0, "{ranks}: rank {r} {side:?}");
                    }
                }
                let neighbours: Vec<usize> = steps_of_r[0]
                    .sends
                    .iter()
                    .map(|m| peer(r, m.side, ranks))
                    .collect();
                for side in [Side::Left, Side::Right] {
                    assert!(
                        neighbours.contains(&peer(r, side, ranks)),
                        "{ranks}: rank {r}"
                    );
                }
            }
            #[allow(
                clippy::needless_range_loop,
                reason = "step t of every rank's plan, and the peer's"
            )]
            for t in 0..steps(ranks) {
                let before = held.clone();
                for r in 0..ranks {
                    let moves = &plans[r][t];
                    for m in &moves.sends {
                        let (_, h, p) = before[r]
                            .iter()
                            .copied()
                            .find(|x| x.0 == m.origin)
                            .unwrap_or((m.origin, false, false));
                        assert!(h || !m.part.header(), "{ranks}: rank {r} step {t}");
                        assert!(p || !m.part.payload(), "{ranks}: rank {r} step {t}");
                    }
                    for side in [Side::Left, Side::Right] {
                        let to = peer(r, side, ranks);
                        let sent: Vec<Move> = moves
                            .sends
                            .iter()
                            .copied()
                            .filter(|m| m.side == side)
                            .collect();
                        let landed: Vec<Move> = plans[to][t]
                            .recvs
                            .iter()
                            .copied()
                            .filter(|m| m.side == opposite(side))
                            .map(|m| Move { side, ..m })
                            .collect();
                        assert_eq!(sent, landed, "{ranks}: rank {r} step {t} {side:?}");
                    }
                    for m in &moves.recvs {
                        let at = match held[r].iter().position(|x| x.0 == m.origin) {
                            Some(at) => at,
                            None => {
                                held[r].push((m.origin, false, false));
                                held[r].len() - 1
                            }
                        };
                        let entry = &mut held[r][at];
                        assert!(
                            !(entry.1 && m.part.header()),
                            "{ranks}: header twice at {r}"
                        );
                        assert!(
                            !(entry.2 && m.part.payload()),
                            "{ranks}: payload twice at {r}"
                        );
                        entry.1 |= m.part.header();
                        entry.2 |= m.part.payload();
                    }
                }
            }
            for (r, h) in held.iter_mut().enumerate() {
                h.sort_unstable();
                let every: Vec<_> = (0..ranks).map(|o| (o, true, true)).collect();
                assert_eq!(*h, every, "{ranks}: rank {r}");
            }
        }
    }

    #[test]
    fn four_ranks_send_two_messages_of_vectors_each_where_going_both_ways_takes_three() {
        for rank in 0..4 {
            let messages: usize = plan(rank, 4)
                .iter()
                .flat_map(|m| &m.sends)
                .filter(|m| m.part.payload())
                .map(|m| m.side)
                .collect::<Vec<_>>()
                .chunk_by(|a, b| a == b)
                .count();
            assert_eq!(messages, 2, "rank {rank}");
        }
    }
}
