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
//! found it closes its links (the communicator closes them after any failure on the nuvec wire).

use smallvec::SmallVec;

use super::RingTopology;
use super::fingerprint::{Fingerprint, HEADER};
use super::schedule::Side;
use crate::fabric::{Channel, Check, Landing, Transfer};

/// The headers of an operation's first step: this rank's, to send on each link in `sends`, and
/// a buffer for each header expected on a link of `recvs`.
#[derive(Debug)]
pub struct Headers {
    encoded: [u8; HEADER],
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

impl Headers {
    /// A collective's headers: to and from link 0 of both neighbours.
    pub fn collective(ring: &RingTopology, ours: Fingerprint) -> Self {
        let right = ring.channel(Side::Right, 0);
        let left = ring.channel(Side::Left, 0);
        Self {
            encoded: ours.encode(),
            sends: [right, left].into_iter().collect(),
            recvs: [left, right]
                .into_iter()
                .map(|c| (c, [0; HEADER]))
                .collect(),
            expect: [ring.left(), ring.right()]
                .into_iter()
                .map(|from| Expect { ours, from })
                .collect(),
        }
    }

    /// A send's header: on link 0 of the side the send goes out on.
    pub fn send(ring: &RingTopology, side: Side, ours: Fingerprint) -> Self {
        Self {
            encoded: ours.encode(),
            sends: [ring.channel(side, 0)].into_iter().collect(),
            recvs: SmallVec::new(),
            expect: SmallVec::new(),
        }
    }

    /// A receive's header: the send's, from link 0 of the side it comes in on.
    pub fn recv(ring: &RingTopology, side: Side, src: usize, ours: Fingerprint) -> Self {
        Self {
            encoded: ours.encode(),
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
