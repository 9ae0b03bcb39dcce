//! RDMA Unreliable Connected message channels: their settings ([`Uc`], [`Unexpected`]), the
//! message step engine ([`Shared::run_messages`]) and the message half of the network model
//! ([`World::send_message`], [`World::arrive_message`]).
//!
//! Uses: the [`World`] under the lock it is given, and the turn hand-off
//! ([`Shared::yield_turn`]) while a step waits. Invariants: one send is one message and one
//! receive takes exactly one; messages carry their sequence number, so a receiver that finds
//! one missing fails at once ([`FailureKind::Lost`]) rather than taking the next for it; a
//! send's completion is local (the message has left) and says nothing about delivery; a peer
//! that crashes or finishes, or a cut link, closes nothing: the far side hears silence. Each
//! look at a waiting step costs its number of channels, not its length (a step can hold
//! thousands of messages).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::MutexGuard;
use std::time::Duration;

use crossbeam_utils::sync::Parker;
use nuvec_distributed::fabric::{Channel, FabricError, FailureKind, Transfer, most_stuck};
use rand::RngExt;

use crate::fabric::{crash_error, fail};
use crate::turn::Shared;
use crate::world::{Event, RankState, World, fnv};

/// What becomes of a message that arrives when its queue pair has no receive posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unexpected {
    /// It is dropped, as InfiniBand's UC specifies.
    Drop,
    /// It waits until a receive is posted, as Apple's Thunderbolt provider appears to do
    /// (MLX's JACCL relies on it).
    Hold,
}

/// The model of RDMA Unreliable Connected queue pairs for [`Sim::uc`](crate::Sim::uc): every send is one
/// message; every receive takes exactly one. The fabric keeps `posted` receives posted per
/// queue pair, re-posting one as each is consumed; a message that finds none is dropped or
/// held ([`Unexpected`]), and a message may be lost on the way (`loss`, and
/// [`crate::Fault::Lose`]). A sender's completion is local: it says nothing about delivery. Messages
/// carry their sequence number as RDMA immediate data would, so a receiver that finds one
/// missing fails at once instead of taking the next message for it. A peer that crashes or
/// finishes, or a cut link, closes nothing: the other side only hears silence.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Uc {
    /// Receives kept posted per queue pair (at least 1).
    pub posted: usize,
    /// What happens to a message that finds no receive posted.
    pub unexpected: Unexpected,
    /// The probability that any message is lost.
    pub loss: f64,
}

impl Default for Uc {
    /// Two receives posted (MLX's depth), messages held as on Apple's provider, no loss.
    fn default() -> Self {
        Self {
            posted: 2,
            unexpected: Unexpected::Hold,
            loss: 0.0,
        }
    }
}

impl Shared {
    /// The fabric call's step over message channels (UC semantics; see [`Uc`]): posts every
    /// send at once, then takes arrived messages for the receives in the order of the step,
    /// handing the turn on whenever the step cannot finish yet.
    pub(crate) fn run_messages<'a>(
        &'a self,
        mut world: MutexGuard<'a, World>,
        rank: usize,
        parker: &Parker,
        step: &mut [Transfer<'_>],
        deadline: Duration,
        started: Duration,
    ) -> Result<(), FabricError> {
        // A rank that crashed at this call sends nothing.
        let crashed = world.ranks[rank].state == RankState::Crashed;
        // Post every send at once; each completes when its message has left.
        let mut departures: Vec<Option<Duration>> = Vec::with_capacity(step.len());
        for t in step.iter() {
            if crashed {
                break;
            }
            if let Transfer::Send { channel, data } = t {
                match world.send_message(rank, *channel, data) {
                    Ok(departure) => departures.push(Some(departure)),
                    Err(kind) => return Err(fail(t, 0, kind)),
                }
            } else {
                departures.push(None);
            }
        }
        // A step can hold thousands of messages (one per frame), and the rank looks at it
        // again after every turn, so each look must not walk the whole step: the receives are
        // queued per channel, and the sends sorted by when their message leaves.
        let mut done = vec![false; step.len()];
        let mut remaining = step.len();
        let mut queues: Vec<(Channel, VecDeque<usize>)> = Vec::new();
        for (i, t) in step.iter().enumerate() {
            if let Transfer::Recv { channel, .. } = t {
                match queues.iter_mut().find(|(c, _)| c == channel) {
                    Some((_, queue)) => queue.push_back(i),
                    None => queues.push((*channel, VecDeque::from([i]))),
                }
            }
        }
        let mut sends: Vec<(Duration, usize)> = departures
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.map(|d| (d, i)))
            .collect();
        sends.sort_unstable();
        let mut departed = 0;
        let mut heads: BinaryHeap<Reverse<(usize, usize)>> = BinaryHeap::new();
        loop {
            if world.ranks[rank].state == RankState::Crashed {
                return Err(crash_error(rank, step));
            }
            while departed < sends.len() && sends[departed].0 <= world.now {
                done[sends[departed].1] = true;
                remaining -= 1;
                departed += 1;
            }
            // Deliver in the order of the step, as a walk over it would: a channel's next
            // receive is looked at once its earlier ones are done, and a channel with nothing
            // in its inbox waits for the next look.
            heads.clear();
            heads.extend(
                queues
                    .iter()
                    .enumerate()
                    .filter_map(|(q, (_, queue))| queue.front().map(|&i| Reverse((i, q)))),
            );
            while let Some(Reverse((i, q))) = heads.pop() {
                let channel = queues[q].0;
                let incoming = world.incoming_mut(rank, channel);
                let Some((seq, bytes)) = incoming.inbox.pop_front() else {
                    continue;
                };
                let expected = incoming.expect;
                incoming.expect = seq + 1;
                let t = &mut step[i];
                let Transfer::Recv { landing, .. } = t else {
                    unreachable!("only receives are queued");
                };
                let want = landing.len();
                if seq != expected {
                    let kind = FailureKind::Lost { expected, got: seq };
                    return Err(fail(t, 0, kind));
                }
                if bytes.len() != want {
                    let kind = FailureKind::MessageSize {
                        want,
                        got: bytes.len(),
                    };
                    return Err(fail(t, 0, kind));
                }
                landing.deliver(0, &bytes);
                if let Err(what) = landing.verdict() {
                    return Err(fail(t, 0, FailureKind::Mismatch(what)));
                }
                done[i] = true;
                remaining -= 1;
                world.heard[rank][channel.peer] = Some(world.now);
                world.hash(&[2, rank as u64, channel.peer as u64, seq]);
                queues[q].1.pop_front();
                if let Some(&next) = queues[q].1.front() {
                    heads.push(Reverse((next, q)));
                }
            }
            if remaining == 0 {
                let now = world.now.as_nanos() as u64;
                world.hash(&[3, rank as u64, now]);
                world.ranks[rank].state = RankState::Ready;
                let _world = self.yield_turn(world, rank, parker);
                return Ok(());
            }
            if world.now >= deadline {
                let waited = world.now.saturating_sub(started);
                let i =
                    most_stuck(step, |i| if done[i] { step_len(&step[i]) } else { 0 }).unwrap_or(0);
                world.hash(&[4, rank as u64]);
                return Err(fail(&step[i], 0, FailureKind::TimedOut { waited }));
            }
            world.ranks[rank].state = RankState::Waiting { deadline };
            world = self.yield_turn(world, rank, parker);
        }
    }
}

/// The length of a transfer (for progress by fraction).
fn step_len(t: &Transfer<'_>) -> usize {
    t.len()
}

impl World {
    /// Queues one message from `rank` on `channel` (message channels): assigns its sequence
    /// number, decides whether it is lost, and puts it on the wire. Returns when its send
    /// completes (it has left), or the error status of its completion.
    pub(crate) fn send_message(
        &mut self,
        rank: usize,
        channel: Channel,
        data: &[u8],
    ) -> Result<Duration, FailureKind> {
        let (latency, jitter, bps, now, record) = (
            self.latency,
            self.jitter,
            self.bytes_per_sec,
            self.now,
            self.record_wire,
        );
        let loss = self.uc.map_or(0.0, |uc| uc.loss);
        let wire = self.channel_mut(rank, channel);
        let seq = wire.next_seq;
        wire.next_seq += 1;
        if record {
            wire.sizes.push(data.len());
            wire.record.extend_from_slice(data);
        }
        if self.error_status.contains(&(rank, channel, seq)) {
            self.strike(true);
            self.hash(&[10, rank as u64, seq]);
            return Err(FailureKind::Completion(format!(
                "error status on message {seq} (simulated)"
            )));
        }
        let chosen = self.lose.contains(&(rank, channel, seq));
        self.strike(chosen);
        let lost = chosen || (loss > 0.0 && self.rng.random_bool(loss.min(1.0)));
        let jitter_ns = if jitter.is_zero() {
            0
        } else {
            self.rng.random_range(0..=jitter.as_nanos() as u64)
        };
        self.payload += data.len() as u64;
        let wire = self.channel_mut(rank, channel);
        let start = wire.busy_until.max(now);
        let on_wire =
            Duration::from_nanos((data.len() as u128 * 1_000_000_000 / bps as u128) as u64);
        wire.busy_until = start + on_wire;
        let departure = wire.busy_until;
        let arrival =
            (departure + latency + Duration::from_nanos(jitter_ns)).max(wire.last_arrival);
        if !lost && !wire.cut {
            wire.last_arrival = arrival;
            wire.messages.push_back((arrival, seq, data.to_vec()));
            self.at(
                arrival,
                Event::Arrive {
                    rank,
                    peer: channel.peer,
                    link: channel.link,
                },
            );
        }
        self.hash(&[11, rank as u64, seq, u64::from(lost), fnv(data)]);
        self.at(departure, Event::Wake { rank });
        Ok(departure)
    }

    /// The next message on `rank`'s `channel` reaches the far end: it takes a posted receive,
    /// or is held, or is dropped.
    pub(crate) fn arrive_message(&mut self, rank: usize, channel: Channel) {
        let Some(uc) = self.uc else { return };
        let wire = self.channel_mut(rank, channel);
        let Some((_, seq, bytes)) = wire.messages.pop_front() else {
            return;
        };
        let to = wire.to.0;
        let gone = self.ended(to);
        let wire = self.channel_mut(rank, channel);
        let full = wire.inbox.len() >= uc.posted && uc.unexpected == Unexpected::Drop;
        let dropped = gone || wire.cut || full;
        if !dropped {
            wire.inbox.push_back((seq, bytes));
            self.ranks[to].dirty = true;
        }
        self.hash(&[12, rank as u64, seq, u64::from(dropped)]);
    }
}
