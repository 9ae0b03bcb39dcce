//! Frames on the fabric: how a run of JACCL messages becomes fabric transfers.
//!
//! A payload goes out as `count` messages of exactly `frame` bytes each: whole frames straight
//! from the caller's buffer, the last partial one through a staging frame padded with zeros,
//! and any further ones (a ring slice shorter than its step's message count) as frames of zeros.
//! MLX pads with whatever its buffers held before; the receiver never reads padding, so the
//! zeros only make the wire deterministic. A receive is one frame per message, of which only the
//! payload is kept (copied, or reduced into place).

use crate::collective::reduce::Reducer;
use crate::fabric::{Channel, Landing, Transfer};

/// The transfers of one step.
pub(crate) type Step<'a> = Vec<Transfer<'a>>;

/// A receive sink that keeps only the payload at the front of its frame.
pub(crate) type Sink<'a> = Box<dyn FnMut(usize, &[u8]) + Send + 'a>;

/// Buffers the JACCL algorithms reuse from one operation to the next: one lane per wire
/// that runs at once (the ring uses the first only).
#[derive(Debug, Default)]
pub struct Scratch {
    lanes: Vec<Lane>,
}

impl Scratch {
    /// The first `n` lanes (made when missing).
    pub(crate) fn lanes(&mut self, n: usize) -> &mut [Lane] {
        if self.lanes.len() < n {
            self.lanes.resize_with(n, Lane::default);
        }
        &mut self.lanes[..n]
    }

    /// The staging frames of the first lane.
    pub(crate) fn staging(&mut self) -> &mut Staging {
        &mut self.lanes(1)[0].staging
    }
}

/// The scratch of one wire: what the peers sent (for the mesh's rank-order folds), the fold
/// itself, and the staging frames of sends.
#[derive(Debug, Default)]
pub(crate) struct Lane {
    pub(crate) received: Vec<u8>,
    pub(crate) acc: Vec<u8>,
    pub(crate) staging: Staging,
}

/// Frame buffers for the sends of one step: one staging frame per partial payload, and a
/// frame of zeros shared by every padding message.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    frames: Vec<u8>,
    zeros: Vec<u8>,
}

impl Staging {
    /// Room for `partials` partial frames of `frame` bytes, and the zero frame.
    pub(crate) fn prepare(&mut self, frame: usize, partials: usize) -> (Vec<&mut [u8]>, &[u8]) {
        self.frames.clear();
        self.frames.resize(frame * partials, 0);
        if self.zeros.len() != frame {
            self.zeros.clear();
            self.zeros.resize(frame, 0);
        }
        let slots = if frame == 0 {
            Vec::new()
        } else {
            self.frames.chunks_mut(frame).collect()
        };
        (slots, &self.zeros)
    }
}

/// Fills `tail` (one frame) with the partial last frame of `payload`: its payload at the
/// front, zeros after.
pub(crate) fn stage_tail(tail: &mut [u8], payload: &[u8], frame: usize) {
    let rest = &payload[payload.len() / frame * frame..];
    tail[..rest.len()].copy_from_slice(rest);
    tail[rest.len()..].fill(0);
}

/// Appends the `count` messages carrying `payload` on `channel` to `step`. `tail` is the
/// staged partial last frame ([`stage_tail`]; unused when `payload.len()` is a multiple of
/// `frame`), `zeros` a frame of zeros.
pub(crate) fn push_sends<'a>(
    step: &mut Step<'a>,
    channel: Channel,
    payload: &'a [u8],
    frame: usize,
    count: usize,
    tail: &'a [u8],
    zeros: &'a [u8],
) {
    let whole = payload.len() / frame;
    let partial = is_partial(payload.len(), frame);
    for i in 0..count {
        let data: &'a [u8] = if i < whole {
            &payload[i * frame..(i + 1) * frame]
        } else if i == whole && partial {
            tail
        } else {
            zeros
        };
        step.push(Transfer::Send { channel, data });
    }
}

/// Whether a payload of `len` bytes in frames of `frame` needs a staging frame.
pub(crate) fn is_partial(len: usize, frame: usize) -> bool {
    !len.is_multiple_of(frame)
}

/// What a receive does with the payload of each frame.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Keep {
    /// Copies it into place.
    Copy,
    /// Reduces it into place: `local = local ⊕ received`.
    Reduce(Reducer),
}

/// Makes the sinks of the `count` messages whose payloads fill `dest` (frames of `frame`
/// bytes; messages past the end of `dest` are padding and their bytes are dropped).
pub(crate) fn recv_sinks<'a>(
    sinks: &mut Vec<(Channel, Sink<'a>)>,
    channel: Channel,
    dest: &'a mut [u8],
    frame: usize,
    count: usize,
    keep: Keep,
) {
    let mut pieces = dest.chunks_mut(frame.max(1));
    for _ in 0..count {
        let piece: &'a mut [u8] = pieces.next().unwrap_or_default();
        let sink: Sink<'a> = Box::new(move |offset: usize, bytes: &[u8]| {
            let valid = piece.len();
            if offset >= valid {
                return;
            }
            let n = bytes.len().min(valid - offset);
            let (local, received) = (&mut piece[offset..offset + n], &bytes[..n]);
            match keep {
                Keep::Copy => local.copy_from_slice(received),
                Keep::Reduce(reducer) => reducer.apply(local, received),
            }
        });
        sinks.push((channel, sink));
    }
}

/// Appends a receive of one `frame`-byte message per sink to `step`, in order; `grain` is the
/// element size (pieces of a stream channel never split an element).
pub(crate) fn push_recvs<'a, 'b: 'a>(
    step: &mut Step<'a>,
    sinks: &'a mut [(Channel, Sink<'b>)],
    frame: usize,
    grain: usize,
) {
    for (channel, sink) in sinks.iter_mut() {
        step.push(Transfer::Recv {
            channel: *channel,
            landing: Landing::Sink {
                len: frame,
                grain,
                sink: sink.as_mut(),
            },
        });
    }
}
