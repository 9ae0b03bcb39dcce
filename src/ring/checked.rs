//! The nuvec wire's check of an operation on MLX's schedule: a header each way on link 0 to
//! every neighbour the operation uses, ahead of its bytes.
//!
//! Operations above the relay's crossover (see [`relay`](super::relay)) run MLX's schedule
//! unchanged but for this: their first step also sends this rank's [`Fingerprint`] ahead of its
//! bytes on link 0 to each neighbour it talks to and receives theirs ahead of theirs; transfers
//! on one channel and direction run in order, so a header is always the first thing on its
//! link, and the headers cost no hop. Each header lands as a [`Landing::Checked`] receive: the
//! fabric compares it with this rank's call the moment it is whole and fails the step at once
//! on a mismatch, naming both calls, whatever else the step waits for. So a rank whose peer
//! called something else never waits for a segment that peer will not send, and no rank folds
//! or returns a result before every header it received matched.
//!
//! A `send` writes its header ahead of its bytes; a `recv` reads the send's header ahead of the
//! bytes, in the same step.
//!
//! Every collective exchanges headers with both neighbours, so ranks whose calls differ find it
//! on both sides of every boundary between them; a rank further away fails when a neighbour that
//! found it tells it so and closes its links (the communicator does both after any failure on
//! the nuvec wire: [`Fabric::tell_failed`](crate::fabric::Fabric::tell_failed)), also where it
//! waits on another link (see the TCP fabric's `notice` for where a notice is not written).
//!
//! # Two ranks
//!
//! Below 2R × 256 KiB (512 KiB per rank for an all-gather) MLX's schedule moves every byte
//! one way (leftward), so the header the other way has no bytes to travel with: it goes as a
//! packet of its own and is read by a call of its own, which cost 4–5 µs an all_sum of
//! 32–256 KiB on 2 hosts of the emulated cluster (the README's "Performance against the
//! link"). On two ranks both neighbours are one rank, so a header along the flow alone lets
//! both ranks name a mismatch; but MLX's one way is not the one the relay's step and a `send`
//! take there (rightward), and a rank in either of those and one in a collective whose header
//! went only leftward would each wait on a link the other does not write. So on two ranks
//! such a collective runs MLX's schedule turned rightward ([`Schedule::RingRightward`], which
//! its header names), with its header only along it.
//!
//! On more ranks a collective keeps a header each way, alone against the flow as it is. Turned
//! rightward with its header only along it, it would read nothing from its right neighbour,
//! and a neighbour that calls `send` to its left (writing only there) or `recv` from its right
//! (reading only there) would not be seen: a rank beside a `recv` from its right would wait for
//! a header the receiving rank never writes, while that rank waits for the collective's bytes,
//! until the deadline (tried; `tests/sim/wire.rs` draws sends and receives both ways). On two
//! ranks both neighbours are one rank and every `send` goes right and every `recv` comes from
//! the left, so there the turn is safe.

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

/// The schedule by which the nuvec wire runs a collective above the relay on `ranks` ranks,
/// given MLX's plan of it (`parts`): turned rightward where there are two ranks and the plan
/// has one part (every byte one way), else MLX's (see the [module documentation](self)).
pub fn ring_schedule(ranks: usize, parts: &[Part]) -> Schedule {
    if ranks == 2 && parts.len() == 1 {
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
    fn only_a_collective_of_two_ranks_that_goes_one_way_turns_rightward() {
        let one_way = all_reduce_plan(16_384, 4, 2, 1).parts;
        assert_eq!(one_way.len(), 1);
        assert_eq!(ring_schedule(2, &one_way), Schedule::RingRightward);
        assert_eq!(
            ring_schedule(2, &all_gather_plan(4, 2)),
            Schedule::RingRightward
        );
        let both_ways = all_reduce_plan(262_144, 4, 2, 1).parts;
        assert_eq!(both_ways.len(), 2);
        assert_eq!(ring_schedule(2, &both_ways), Schedule::Ring);
        assert_eq!(
            ring_schedule(4, &all_reduce_plan(16_384, 4, 4, 1).parts),
            Schedule::Ring
        );
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
