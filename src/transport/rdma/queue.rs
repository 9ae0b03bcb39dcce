//! One queue pair's bookkeeping during a step, without a verbs call: which transfer each send
//! frame carries, which receive frames hold a message, which message is due next, and what a
//! work completion means. [`RdmaFabric`](super::RdmaFabric)'s step loop drives it: it asks
//! for the next send to post, posts it, feeds every polled completion in, and asks for the
//! next message to deliver; the verbs calls stay in `queue_pair.rs`.
//!
//! Uses nothing but the completion's fields; every rule here is unit-tested without a device.
//!
//! Invariants: a send frame is busy from its post to its completion, and at most
//! [`IN_FLIGHT`] are; messages are delivered to the step's receives in arrival order, one each;
//! a send left in flight by a failed step completes no transfer of a later one.

use std::collections::VecDeque;

use super::{IN_FLIGHT, RECV_AHEAD};
use crate::fabric::Direction;

/// The kind of a send work request, in the upper half of its id.
const WR_SEND: u64 = 1;
/// The kind of a receive work request, in the upper half of its id.
const WR_RECV: u64 = 2;

/// The work request id of a send from send frame `slot`.
pub(crate) fn send_id(slot: usize) -> u64 {
    WR_SEND << 32 | slot as u64
}

/// The work request id of a receive into receive frame `frame`.
pub(crate) fn recv_id(frame: usize) -> u64 {
    WR_RECV << 32 | frame as u64
}

/// What a work completion says, as the verbs library reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Completion {
    /// The work request's id.
    pub(crate) id: u64,
    /// `None` on success, else the status and the vendor error.
    pub(crate) error: Option<(u32, u32)>,
    /// Bytes received (receives).
    pub(crate) len: usize,
    /// The immediate data of a received message: the sender's sequence number.
    pub(crate) seq: Option<u32>,
}

/// The state of a send frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Not in flight.
    Free,
    /// Posted; the transfer of the current step it carries, if any (a send left in flight by
    /// a failed step has none).
    Busy(Option<usize>),
}

/// A receive that completed and waits for a receive transfer to take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Arrival {
    frame: usize,
    error: Option<(u32, u32)>,
    len: usize,
    seq: Option<u32>,
}

/// The sequence numbers a queue pair's received messages must carry: 0, 1, 2 … wrapping at
/// 2³², one per message, so that a lost message is noticed when the next one arrives in its
/// place (UC delivers it to the next posted receive without a word).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct InOrder {
    expected: u32,
}

impl InOrder {
    /// Counts one received message that carried `seq`: `Err((expected, got))` when it is not
    /// the one due. A message without a number (from a peer that does not number, as MLX's
    /// C++) is taken as it comes.
    pub(crate) fn take(&mut self, seq: Option<u32>) -> Result<(), (u32, u32)> {
        let expected = self.expected;
        self.expected = expected.wrapping_add(1);
        match seq {
            Some(got) if got != expected => Err((expected, got)),
            _ => Ok(()),
        }
    }
}

/// What a completion meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Completed {
    /// A send finished; the transfer it carried, if it belongs to this step.
    Sent(Option<usize>),
    /// A send finished with an error status; the transfer it carried, if any.
    SendFailed {
        /// The transfer of this step it carried.
        owner: Option<usize>,
        /// The status and the vendor error.
        status: (u32, u32),
    },
    /// A receive frame now holds a message (or an error); `heard` when it succeeded.
    Arrived {
        /// Whether it succeeded, so the peer was heard from.
        heard: bool,
    },
    /// An id this queue pair never posted.
    Unknown(u64),
}

/// Why a message cannot be delivered to its receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Undeliverable {
    /// Its completion had an error status: the status and the vendor error.
    Completion(u32, u32),
    /// It carries another number than the one due: one was lost in between.
    Lost {
        /// The number due.
        expected: u32,
        /// The number it carries.
        got: u32,
    },
    /// It is not the receive's length.
    Size {
        /// The receive's length.
        want: usize,
        /// The message's.
        got: usize,
    },
}

/// A message paired with the receive that takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Delivery {
    /// The receive transfer.
    pub(crate) transfer: usize,
    /// The receive frame that holds the message (to be posted again once delivered).
    pub(crate) frame: usize,
    /// Its length, or why it cannot be delivered.
    pub(crate) outcome: Result<usize, Undeliverable>,
}

/// One queue pair's bookkeeping: see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Queue {
    slots: [Slot; IN_FLIGHT],
    arrived: VecDeque<Arrival>,
    inbound: InOrder,
    /// This step's sends and receives on the queue pair, in order.
    sends: VecDeque<usize>,
    recvs: VecDeque<usize>,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            slots: [Slot::Free; IN_FLIGHT],
            arrived: VecDeque::with_capacity(RECV_AHEAD),
            inbound: InOrder::default(),
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
        }
    }
}

impl Queue {
    /// Starts a step: what an earlier, failed step left in flight belongs to no transfer of
    /// this one, and its unfinished transfers are forgotten.
    pub(crate) fn begin_step(&mut self) {
        for slot in &mut self.slots {
            if let Slot::Busy(owner) = slot {
                *owner = None;
            }
        }
        self.sends.clear();
        self.recvs.clear();
    }

    /// Adds transfer `t` of the step, in order.
    pub(crate) fn push(&mut self, t: usize, direction: Direction) {
        match direction {
            Direction::Send => self.sends.push_back(t),
            Direction::Recv => self.recvs.push_back(t),
        }
    }

    /// Whether there is nothing to post, deliver or wait for.
    pub(crate) fn is_idle(&self) -> bool {
        self.sends.is_empty()
            && self.recvs.is_empty()
            && self.slots.iter().all(|s| *s == Slot::Free)
    }

    /// The next send to post and a free frame for it: `(frame, transfer)`.
    pub(crate) fn next_send(&self) -> Option<(usize, usize)> {
        let t = *self.sends.front()?;
        let slot = self.slots.iter().position(|s| *s == Slot::Free)?;
        Some((slot, t))
    }

    /// Send `t` was posted from frame `slot` (the pair [`Queue::next_send`] gave).
    pub(crate) fn posted(&mut self, slot: usize, t: usize) {
        debug_assert_eq!(self.next_send(), Some((slot, t)));
        self.slots[slot] = Slot::Busy(Some(t));
        self.sends.pop_front();
    }

    /// The transfer a failure of the queue pair itself is blamed on: its first waiting
    /// receive, else its first waiting send.
    pub(crate) fn waiting(&self) -> Option<usize> {
        self.recvs.front().or(self.sends.front()).copied()
    }

    /// Takes one polled completion.
    pub(crate) fn on_completion(&mut self, c: &Completion) -> Completed {
        let index = (c.id & 0xffff_ffff) as usize;
        match c.id >> 32 {
            WR_SEND if index < IN_FLIGHT => {
                let owner = match self.slots[index] {
                    Slot::Busy(owner) => owner,
                    Slot::Free => None,
                };
                self.slots[index] = Slot::Free;
                match c.error {
                    Some(status) => Completed::SendFailed { owner, status },
                    None => Completed::Sent(owner),
                }
            }
            WR_RECV if index < RECV_AHEAD => {
                self.arrived.push_back(Arrival {
                    frame: index,
                    error: c.error,
                    len: c.len,
                    seq: c.seq,
                });
                Completed::Arrived {
                    heard: c.error.is_none(),
                }
            }
            _ => Completed::Unknown(c.id),
        }
    }

    /// The oldest arrived message paired with the oldest waiting receive, whose length
    /// `len_of` gives; `None` while either is missing.
    pub(crate) fn next_delivery(&mut self, len_of: impl Fn(usize) -> usize) -> Option<Delivery> {
        if self.recvs.is_empty() || self.arrived.is_empty() {
            return None;
        }
        let t = self.recvs.pop_front()?;
        let arrival = self.arrived.pop_front()?;
        let outcome = if let Some((status, vendor)) = arrival.error {
            Err(Undeliverable::Completion(status, vendor))
        } else if let Err((expected, got)) = self.inbound.take(arrival.seq) {
            Err(Undeliverable::Lost { expected, got })
        } else if arrival.len != len_of(t) {
            Err(Undeliverable::Size {
                want: len_of(t),
                got: arrival.len,
            })
        } else {
            Ok(arrival.len)
        };
        Some(Delivery {
            transfer: t,
            frame: arrival.frame,
            outcome,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(slot: usize) -> Completion {
        Completion {
            id: send_id(slot),
            error: None,
            len: 0,
            seq: None,
        }
    }

    fn arrived(frame: usize, len: usize, seq: Option<u32>) -> Completion {
        Completion {
            id: recv_id(frame),
            error: None,
            len,
            seq,
        }
    }

    #[test]
    fn at_most_in_flight_sends_are_posted_and_a_completion_frees_a_frame() {
        let mut q = Queue::default();
        q.begin_step();
        for t in 0..IN_FLIGHT + 1 {
            q.push(t, Direction::Send);
        }
        for t in 0..IN_FLIGHT {
            let (slot, next) = q.next_send().expect("a free frame");
            assert_eq!(next, t);
            q.posted(slot, next);
        }
        assert_eq!(q.next_send(), None, "every frame is in flight");
        assert_eq!(q.on_completion(&sent(1)), Completed::Sent(Some(1)));
        assert_eq!(q.next_send(), Some((1, IN_FLIGHT)));
    }

    #[test]
    fn a_send_left_in_flight_by_a_failed_step_completes_no_later_transfer() {
        let mut q = Queue::default();
        q.begin_step();
        q.push(0, Direction::Send);
        q.posted(0, 0);
        q.begin_step();
        assert_eq!(q.on_completion(&sent(0)), Completed::Sent(None));
        assert!(q.is_idle());
    }

    #[test]
    fn messages_go_to_the_receives_in_arrival_order_and_are_checked() {
        let mut q = Queue::default();
        q.begin_step();
        q.push(3, Direction::Recv);
        q.push(5, Direction::Recv);
        assert_eq!(q.next_delivery(|_| 8), None, "nothing arrived");
        assert_eq!(
            q.on_completion(&arrived(2, 8, Some(0))),
            Completed::Arrived { heard: true }
        );
        q.on_completion(&arrived(0, 7, Some(1)));
        assert_eq!(
            q.next_delivery(|_| 8),
            Some(Delivery {
                transfer: 3,
                frame: 2,
                outcome: Ok(8)
            })
        );
        assert_eq!(
            q.next_delivery(|_| 8).map(|d| d.outcome),
            Some(Err(Undeliverable::Size { want: 8, got: 7 }))
        );
    }

    #[test]
    fn a_skipped_number_is_a_lost_message_and_an_error_status_is_reported() {
        let mut q = Queue::default();
        q.begin_step();
        q.push(0, Direction::Recv);
        q.push(1, Direction::Recv);
        q.on_completion(&arrived(0, 4, Some(1)));
        assert_eq!(
            q.next_delivery(|_| 4).map(|d| d.outcome),
            Some(Err(Undeliverable::Lost {
                expected: 0,
                got: 1
            }))
        );
        q.on_completion(&Completion {
            id: recv_id(1),
            error: Some((5, 0x81)),
            len: 0,
            seq: None,
        });
        assert_eq!(
            q.next_delivery(|_| 4).map(|d| d.outcome),
            Some(Err(Undeliverable::Completion(5, 0x81)))
        );
    }

    #[test]
    fn a_failed_send_names_the_transfer_it_carried_and_unknown_ids_are_flagged() {
        let mut q = Queue::default();
        q.begin_step();
        q.push(4, Direction::Send);
        q.posted(0, 4);
        let failed = Completion {
            error: Some((12, 0)),
            ..sent(0)
        };
        assert_eq!(
            q.on_completion(&failed),
            Completed::SendFailed {
                owner: Some(4),
                status: (12, 0)
            }
        );
        assert_eq!(
            q.on_completion(&Completion {
                id: 7 << 32,
                ..sent(0)
            }),
            Completed::Unknown(7 << 32)
        );
        assert_eq!(
            q.on_completion(&arrived(RECV_AHEAD, 0, None)),
            Completed::Unknown(recv_id(RECV_AHEAD))
        );
    }

    #[test]
    fn the_blame_for_a_broken_queue_pair_goes_to_a_waiting_receive_first() {
        let mut q = Queue::default();
        q.begin_step();
        assert_eq!(q.waiting(), None);
        q.push(1, Direction::Send);
        assert_eq!(q.waiting(), Some(1));
        q.push(2, Direction::Recv);
        assert_eq!(q.waiting(), Some(2));
    }

    #[test]
    fn a_message_that_skips_a_number_says_which_was_lost() {
        let mut order = InOrder::default();
        assert_eq!(order.take(Some(0)), Ok(()));
        assert_eq!(order.take(Some(1)), Ok(()));
        assert_eq!(order.take(Some(3)), Err((2, 3)));
        // Unnumbered messages are counted but not checked.
        let mut order = InOrder::default();
        assert_eq!(order.take(None), Ok(()));
        assert_eq!(order.take(Some(1)), Ok(()));
        assert_eq!(order.take(Some(1)), Err((2, 1)));
    }

    #[test]
    fn sequence_numbers_wrap_around() {
        let mut order = InOrder { expected: u32::MAX };
        assert_eq!(order.take(Some(u32::MAX)), Ok(()));
        assert_eq!(order.take(Some(0)), Ok(()));
    }
}
