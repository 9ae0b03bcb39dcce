//! The nuvec wire's check of an operation on MLX's schedule: a header on link 0 to each
//! neighbour the operation writes to, ahead of its bytes.
//!
//! Operations above the relay's crossover (see [`relay`](super::relay)) run MLX's schedule
//! unchanged but for this: their first step also sends this rank's [`Fingerprint`] ahead of its
//! bytes on link 0 to each neighbour it writes to and receives theirs ahead of theirs from each
//! it reads from; transfers on one channel and direction run in order, so a header is always
//! the first thing on its link, and the headers cost no hop. Each header lands as a
//! [`Landing::Checked`] receive: the fabric compares it with this rank's call the moment it is
//! whole and fails the step at once on a mismatch, naming both calls, whatever else the step
//! waits for. So a rank whose peer called something else never waits for a segment that peer
//! will not send, and no rank folds or returns a result before every header it received
//! matched.
//!
//! A `send` writes its header ahead of its bytes; a `recv` reads the send's header ahead of the
//! bytes, in the same step. A collective whose bytes go both ways round the ring exchanges
//! headers with both neighbours; one whose bytes go one way sends its header only along them
//! (below). A rank that did not read the other call itself fails when a neighbour that did
//! closes its links (the communicator closes them after any failure on the nuvec wire), and so
//! on round the ring: no rank waits for its deadline, and none returns data but a `send` whose
//! bytes were all written.
//!
//! # Collectives that go one way
//!
//! Below 2R × 256 KiB (512 KiB per rank for an all-gather) MLX's schedule moves every byte
//! one way (leftward), so a header the other way has no bytes to travel with: it went as a
//! packet of its own and was read by a call of its own, a `sendto` and a `recvfrom` more per
//! operation (the README's "Performance against the link" has what that cost). So such a
//! collective sends its header only along its flow, and that flow must be the one the other
//! calls read on. MLX's leftward flow is not: the relay's steps and a `send` write rightward,
//! so a rank in one of those and a rank in the collective would each wait on a link the other
//! does not write. So a collective that goes one way runs MLX's schedule turned rightward
//! ([`Schedule::RingRightward`], which its header names). Then every call but a `recv` writes
//! rightward, its header first, and every call but a `send` reads its left link, the header
//! first: wherever two neighbours' calls differ and the left one writes and the right one
//! reads, the right one names both calls (the mismatch property tests draw every pairing, in
//! the simulator and across processes). The bytes on each link are MLX's, in MLX's order, on
//! the other link of each pair of neighbours; MLX's wire keeps MLX's directions.

use smallvec::SmallVec;

use super::RingTopology;
use super::fingerprint::{Fingerprint, HEADER, Schedule};
use super::schedule::{Flow, Part, Side};
use crate::fabric::{Channel, Check, Landing, Transfer};

/// The headers of an operation's first step: this rank's, to send on each link in `sends`, and
/// a buffer for each header expected on a link of `recvs`.
#[derive(Debug)]
pub struct Headers {
    encoded: [u8; HEADER],
    /// The schedule the header names, which says how the collective runs.
    schedule: Schedule,
    sends: SmallVec<[Channel; 2]>,
    recvs: SmallVec<[(Channel, [u8; HEADER]); 2]>,
    /// The judge of each header of `recvs`, in order.
    expect: SmallVec<[Expect; 2]>,
}

/// What a header received from `from` must say: a call that pairs with `ours`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expect {
    /// This rank's call.
    pub(crate) ours: Fingerprint,
    /// The rank the header comes from (its origin).
    pub(crate) from: usize,
}

impl Check for Expect {
    fn check(&self, bytes: &[u8]) -> Result<(), String> {
        let header = <&[u8; HEADER]>::try_from(bytes).ok();
        match header.and_then(|h| Fingerprint::decode(h, self.ours.origin)) {
            Some(theirs) if theirs.origin == self.from && self.ours.matches(&theirs) => Ok(()),
            Some(theirs) => Err(self.ours.mismatch(&theirs)),
            None => Err(format!(
                "rank {} sent no nuvec wire header where this rank's {} began (a rank speaking \
                 another wire, or a stream misaligned by an earlier operation)",
                self.from,
                self.ours.op.name()
            )),
        }
    }
}

/// The schedule by which the nuvec wire runs a collective above the relay, given MLX's plan of
/// it (`parts`): turned rightward where the plan has one part (every byte one way), else
/// MLX's (see the [module documentation](self)).
pub fn ring_schedule(parts: &[Part]) -> Schedule {
    if parts.len() == 1 {
        Schedule::RingRightward
    } else {
        Schedule::Ring
    }
}

/// MLX's plan (`parts`) as the collective's `headers` name it: every part turned rightward
/// for [`Schedule::RingRightward`], else unchanged.
pub fn plan_as_named(parts: &mut [Part], headers: Option<&Headers>) {
    if headers.is_some_and(|h| h.schedule == Schedule::RingRightward) {
        for part in parts {
            part.flow = Flow::Rightward;
        }
    }
}

impl Headers {
    /// A collective's headers: to and from link 0 of both neighbours, or, for
    /// [`Schedule::RingRightward`], to the right and from the left only.
    pub fn collective(ring: &RingTopology, ours: Fingerprint) -> Self {
        let (sends, recvs): (&[Side], &[Side]) = if ours.schedule == Schedule::RingRightward {
            (&[Side::Right], &[Side::Left])
        } else {
            (&[Side::Right, Side::Left], &[Side::Left, Side::Right])
        };
        let recvs: SmallVec<[Channel; 2]> = recvs.iter().map(|&s| ring.channel(s, 0)).collect();
        Self {
            encoded: ours.encode(),
            schedule: ours.schedule,
            sends: sends.iter().map(|&s| ring.channel(s, 0)).collect(),
            expect: recvs
                .iter()
                .map(|c| Expect { ours, from: c.peer })
                .collect(),
            recvs: recvs.into_iter().map(|c| (c, [0; HEADER])).collect(),
        }
    }

    /// A send's header: on link 0 of the side the send goes out on.
    pub fn send(ring: &RingTopology, side: Side, ours: Fingerprint) -> Self {
        Self {
            encoded: ours.encode(),
            schedule: ours.schedule,
            sends: [ring.channel(side, 0)].into_iter().collect(),
            recvs: SmallVec::new(),
            expect: SmallVec::new(),
        }
    }

    /// A receive's header: the send's, from link 0 of the side it comes in on.
    pub fn recv(ring: &RingTopology, side: Side, src: usize, ours: Fingerprint) -> Self {
        Self {
            encoded: ours.encode(),
            schedule: ours.schedule,
            sends: SmallVec::new(),
            recvs: [(ring.channel(side, 0), [0; HEADER])].into_iter().collect(),
            expect: [Expect { ours, from: src }].into_iter().collect(),
        }
    }

    /// Puts the header transfers in `step`: before any other transfer on their links, so that
    /// each header goes first.
    pub fn push<'a>(&'a mut self, step: &mut impl Extend<Transfer<'a>>) {
        let Headers {
            encoded,
            schedule: _,
            sends,
            recvs,
            expect,
        } = self;
        let encoded: &'a [u8] = &encoded[..];
        step.extend(sends.iter().map(|&channel| Transfer::Send {
            channel,
            data: encoded,
        }));
        step.extend(
            recvs
                .iter_mut()
                .zip(expect.iter())
                .map(|((channel, buf), check)| Transfer::Recv {
                    channel: *channel,
                    landing: Landing::Checked {
                        buf: &mut buf[..],
                        check,
                    },
                }),
        );
    }
}

#[cfg(test)]
mod tests {
    use nuvec_core::DType;

    use super::*;
    use crate::fabric::{Channel, Direction};
    use crate::ring::fingerprint::Op;
    use crate::ring::schedule::{all_gather_plan, all_reduce_plan};

    fn sum(ring: &RingTopology, bytes: usize, schedule: Schedule) -> Fingerprint {
        Fingerprint {
            op: Op::AllSum,
            dtype: Some(DType::F32),
            seq: 0,
            bytes: bytes as u64,
            origin: ring.rank(),
            peer: None,
            schedule,
        }
    }

    #[test]
    fn a_collective_that_goes_one_way_turns_rightward_on_every_ring_size() {
        for ranks in [2, 3, 4, 8] {
            let one_way = all_reduce_plan(16_384, 4, ranks, 1).parts;
            assert_eq!(one_way.len(), 1, "{ranks} ranks");
            assert_eq!(ring_schedule(&one_way), Schedule::RingRightward);
            // From 2R × 256 KiB MLX's goes both ways.
            let both_ways = all_reduce_plan(ranks * 131_072, 4, ranks, 1).parts;
            assert_eq!(both_ways.len(), 2, "{ranks} ranks");
            assert_eq!(ring_schedule(&both_ways), Schedule::Ring);
        }
        // An all-gather's plan is per rank's block: one way below 512 KiB.
        let one_way = all_gather_plan(524_287, 2);
        assert_eq!(ring_schedule(&one_way), Schedule::RingRightward);
        assert_eq!(ring_schedule(&all_gather_plan(524_288, 1)), Schedule::Ring);
    }

    #[test]
    fn a_collective_turned_rightward_runs_every_part_rightward_with_its_header_along_it() {
        let ring = RingTopology::new(0, 2, 1);
        let mut parts = all_reduce_plan(16_384, 4, 2, 1).parts;
        let mut kept = parts.clone();
        let mut turned = Headers::collective(&ring, sum(&ring, 65_536, Schedule::RingRightward));
        plan_as_named(&mut parts, Some(&turned));
        assert!(parts.iter().all(|p| p.flow == Flow::Rightward));
        let mut step = Vec::new();
        turned.push(&mut step);
        let channels: Vec<_> = step.iter().map(|t| (t.channel(), t.direction())).collect();
        // Right: the link this rank opened (0); left: the one its neighbour opened (1).
        assert_eq!(
            channels,
            [
                (Channel::new(1, 0), Direction::Send),
                (Channel::new(1, 1), Direction::Recv)
            ]
        );
        // MLX's schedule keeps its flows and a header each way.
        let mut both = Headers::collective(&ring, sum(&ring, 65_536, Schedule::Ring));
        plan_as_named(&mut kept, Some(&both));
        assert_eq!(kept[0].flow, Flow::Leftward);
        let mut step = Vec::new();
        both.push(&mut step);
        assert_eq!(step.len(), 4);
    }
}
