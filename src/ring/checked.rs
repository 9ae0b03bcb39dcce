//! The nuvec wire's check of an operation on MLX's schedule: a header each way on link 0 to
//! every neighbour the operation uses, before any of its bytes.
//!
//! Operations above the relay's crossover (see [`relay`](super::relay)) run MLX's schedule
//! unchanged but for this: a first step of their own sends this rank's [`Fingerprint`] on link
//! 0 to each neighbour it talks to and receives theirs, and every whole header received is
//! compared with this rank's call before a byte of data moves. The step holds only headers, so
//! it completes as soon as they arrive whatever the peers called: a peer that called something
//! else is found at once, never after a wait for bytes it will not send. That costs one hop
//! (tens of µs across hosts) on operations of 64 KiB and more; merging the headers into the
//! schedule's first step would save it, but a rank whose peer called another operation could
//! then wait for a segment the peer never sends.
//!
//! A `send` writes its header in the same step as its bytes (a send waits for nobody); a `recv`
//! reads the header in a step of its own, then the bytes.
//!
//! Every collective exchanges headers with both neighbours, so ranks whose calls differ find it
//! on both sides of every boundary between them; a rank further away fails when a neighbour that
//! found it closes its links (the communicator closes them after any failure on the nuvec wire).

use smallvec::SmallVec;

use super::RingTopology;
use super::fingerprint::{Fingerprint, HEADER};
use super::schedule::Side;
use crate::fabric::{Channel, Direction, FabricError, FailureKind, Landing, Transfer};

/// The headers of an operation's first step: this rank's, to send on each link in `sends`, and
/// a buffer for each header expected on a link of `recvs`.
#[derive(Debug)]
pub struct Headers {
    ours: Fingerprint,
    encoded: [u8; HEADER],
    sends: SmallVec<[Channel; 2]>,
    recvs: SmallVec<[(Channel, usize, [u8; HEADER]); 2]>,
}

impl Headers {
    /// A collective's headers: to and from link 0 of both neighbours.
    pub fn collective(ring: &RingTopology, ours: Fingerprint) -> Self {
        let right = ring.channel(Side::Right, 0);
        let left = ring.channel(Side::Left, 0);
        Self {
            ours,
            encoded: ours.encode(),
            sends: [right, left].into_iter().collect(),
            recvs: [(left, ring.left()), (right, ring.right())]
                .into_iter()
                .map(|(c, from)| (c, from, [0; HEADER]))
                .collect(),
        }
    }

    /// A send's header: on link 0 of the side the send goes out on.
    pub fn send(ring: &RingTopology, side: Side, ours: Fingerprint) -> Self {
        Self {
            ours,
            encoded: ours.encode(),
            sends: [ring.channel(side, 0)].into_iter().collect(),
            recvs: SmallVec::new(),
        }
    }

    /// A receive's header: the send's, from link 0 of the side it comes in on.
    pub fn recv(ring: &RingTopology, side: Side, src: usize, ours: Fingerprint) -> Self {
        Self {
            ours,
            encoded: ours.encode(),
            sends: SmallVec::new(),
            recvs: [(ring.channel(side, 0), src, [0; HEADER])]
                .into_iter()
                .collect(),
        }
    }

    /// Puts the header transfers in `step`: before any other transfer on their links, so that
    /// each header goes first.
    pub fn push<'a>(&'a mut self, step: &mut impl Extend<Transfer<'a>>) {
        let Headers {
            encoded,
            sends,
            recvs,
            ..
        } = self;
        let encoded: &'a [u8] = &encoded[..];
        step.extend(sends.iter().map(|&channel| Transfer::Send {
            channel,
            data: encoded,
        }));
        step.extend(recvs.iter_mut().map(|(channel, _, buf)| Transfer::Recv {
            channel: *channel,
            landing: Landing::Into(&mut buf[..]),
        }));
    }

    /// The verdict on the step that carried the headers, whose result was `result`: a mismatch
    /// found in any whole header received comes first (a peer that found it too may have closed
    /// its links, which failed the step); then the step's own failure.
    pub fn settle(&self, result: Result<(), FabricError>) -> Result<(), FabricError> {
        for (channel, from, buf) in &self.recvs {
            if let Some(theirs) = Fingerprint::decode(buf, self.ours.origin)
                && (theirs.origin != *from || !self.ours.matches(&theirs))
            {
                return Err(mismatch(*channel, self.ours.mismatch(&theirs)));
            }
        }
        result?;
        // After a step that succeeded every header is whole; one that is not was not this
        // wire's.
        if let Some((channel, from, _)) = self
            .recvs
            .iter()
            .find(|(_, _, buf)| Fingerprint::decode(buf, self.ours.origin).is_none())
        {
            return Err(mismatch(
                *channel,
                format!(
                    "rank {from} sent no nuvec wire header where this rank's {} began (a rank \
                     speaking another wire, or a stream misaligned by an earlier operation)",
                    self.ours.op.name()
                ),
            ));
        }
        Ok(())
    }
}

/// The failure of a mismatch found on `channel`.
pub(crate) fn mismatch(channel: Channel, what: String) -> FabricError {
    FabricError {
        channel,
        direction: Direction::Recv,
        done: HEADER,
        total: HEADER,
        kind: FailureKind::Mismatch(what),
    }
}
