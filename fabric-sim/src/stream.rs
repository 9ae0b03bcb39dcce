//! The stream step engine ([`Shared::run_stream`]) and the stream half of the network model
//! ([`World::pump`]): a sender's bytes are cut into fragments of random sizes, each put on the
//! wire as the window allows and delivered in order after its latency, jitter and time on the
//! wire; a receive completes with exactly the bytes it asked for (in whole grains while it
//! waits).
//!
//! Uses: the [`World`] (wires, generator, trace, events) under the lock it is given, and the
//! turn hand-off ([`Shared::yield_turn`]) while a step waits. Invariants: bytes of one
//! direction arrive in order and never overtake (`last_arrival`); at most `window` bytes are
//! in flight or unread per direction; a send completes when its last byte is on the wire, and
//! a forward queues what its receive has landed, each only after every earlier send of its
//! channel in the step is queued whole; a
//! step that completes hashes the time it completed at, and passes the turn before it returns.

use std::sync::MutexGuard;
use std::time::Duration;

use crossbeam_utils::sync::Parker;
use nuvec_distributed::fabric::{
    Ahead, Channel, Direction, FabricError, FailureKind, Transfer, most_stuck,
};
use rand::RngExt;

use crate::fabric::{crash_error, fail};
use crate::turn::Shared;
use crate::world::{Event, RankState, World, fnv};

impl Shared {
    /// [`Shared::step`](crate::fabric) over stream channels: queues the sends into their
    /// channels' outboxes, then takes in order what arrives for the receives, handing the
    /// turn on whenever the step cannot finish yet, until it is done, fails or times out.
    ///
    /// The transfers from `ahead.from` on go ahead of the next step ([`Fabric::run_ahead`]):
    /// the step does not wait for them, and they start once it has waited `ahead.hold` (the
    /// rank waits in virtual time until then at the latest): its receives among them take
    /// what has arrived, its sends among them are queued. A send queued is moved whole (the
    /// outbox keeps its bytes ahead of the next step's); `moved` gets what each moved.
    #[allow(
        clippy::too_many_arguments,
        reason = "the step, what goes ahead of it, its clock and its results"
    )]
    pub(crate) fn run_stream<'a>(
        &'a self,
        mut world: MutexGuard<'a, World>,
        rank: usize,
        parker: &Parker,
        step: &mut [Transfer<'_>],
        ahead: Ahead,
        deadline: Duration,
        started: Duration,
        moved: &mut [usize],
    ) -> Result<(), FabricError> {
        let mut progress: Vec<Progress> = (0..step.len())
            .map(|_| Progress {
                done: 0,
                queued: 0,
                whole: false,
                base: 0,
            })
            .collect();
        let need = ahead.from;
        let due = started.saturating_add(ahead.hold);
        let mut holding = need < step.len() && !ahead.hold.is_zero();
        queue_sends(
            &mut world,
            rank,
            step,
            &mut progress,
            if holding { need } else { step.len() },
        );
        world.pump_all();
        let result = loop {
            if holding && world.now >= due {
                holding = false;
                if queue_sends(&mut world, rank, step, &mut progress, step.len()) {
                    world.pump_all();
                }
            }
            if world.ranks[rank].state == RankState::Crashed {
                return Err(crash_error(rank, step));
            }
            // Take what has arrived for the receives, in order per channel.
            let mut blocked_recv: Vec<Channel> = Vec::new();
            let mut all_done = true;
            let mut landed = false;
            for (i, (t, p)) in step.iter_mut().zip(progress.iter_mut()).enumerate() {
                let len = t.len();
                // Whether the step waits for this transfer (not one that goes ahead).
                let waited = i < need;
                match t {
                    Transfer::Send { channel, .. } | Transfer::Forward { channel, .. } => {
                        let chan = world.channel(rank, *channel);
                        if p.whole {
                            p.done = (chan.sent.saturating_sub(p.base) as usize).min(len);
                        }
                        if p.done < len && (waited || p.whole) {
                            all_done &= !waited;
                            if chan.closed {
                                let done = p.done;
                                return Err(fail(t, done, FailureKind::Closed));
                            }
                        }
                    }
                    Transfer::Recv { channel, landing } => {
                        if !waited && holding {
                            continue;
                        }
                        if blocked_recv.contains(channel) {
                            all_done &= !waited || p.done == landing.len();
                            continue;
                        }
                        let grain = landing.grain();
                        let want = landing.len() - p.done;
                        let incoming = world.incoming_mut(rank, *channel);
                        let avail = incoming.arrived.len();
                        let take = if avail >= want {
                            want
                        } else {
                            avail - avail % grain
                        };
                        if take > 0 {
                            landing.deliver(p.done, &incoming.arrived.make_contiguous()[..take]);
                            landed = true;
                            incoming.arrived.drain(..take);
                            p.done += take;
                            world.heard[rank][channel.peer] = Some(world.now);
                            let (peer, link) = world
                                .wiring
                                .far_end(rank, *channel)
                                .expect("validated channel");
                            world.hash(&[2, rank as u64, channel.peer as u64, take as u64]);
                            world.pump((peer, Channel::new(rank, link)));
                            if p.done == landing.len()
                                && let Err(what) = landing.verdict()
                            {
                                // A checked receive is judged the moment it is whole.
                                let (channel, total) = (*channel, landing.len());
                                return Err(FabricError {
                                    channel,
                                    direction: Direction::Recv,
                                    done: total,
                                    total,
                                    kind: FailureKind::Mismatch(what),
                                });
                            }
                        }
                        if p.done < landing.len() {
                            all_done &= !waited;
                            blocked_recv.push(*channel);
                            let incoming = world.incoming_mut(rank, *channel);
                            if incoming.closed && incoming.in_flight.is_empty() {
                                let done = p.done;
                                return Err(fail(t, done, FailureKind::Closed));
                            }
                        }
                    }
                }
            }
            // A forward may send what its receive landed in this pass.
            let queue_to = if holding { need } else { step.len() };
            if landed && queue_sends(&mut world, rank, step, &mut progress, queue_to) {
                world.pump_all();
                continue;
            }
            if all_done {
                let now = world.now.as_nanos() as u64;
                world.hash(&[3, rank as u64, now]);
                world.ranks[rank].state = RankState::Ready;
                let _world = self.yield_turn(world, rank, parker);
                break Ok(());
            }
            if world.now >= deadline {
                let waited = world.now.saturating_sub(started);
                let i = most_stuck(&step[..need], |i| progress[i].done).unwrap_or(0);
                let p = progress[i].done;
                world.hash(&[4, rank as u64]);
                return Err(fail(&step[i], p, FailureKind::TimedOut { waited }));
            }
            // Woken at the deadline, or when the held sends are due.
            let wake = if holding { deadline.min(due) } else { deadline };
            world.ranks[rank].state = RankState::Waiting { deadline: wake };
            world = self.yield_turn(world, rank, parker);
        };
        // A send that went ahead is moved whole once queued: its bytes leave the outbox ahead
        // of the next step's.
        for (m, (t, p)) in moved.iter_mut().zip(step.iter().zip(&progress).skip(need)) {
            *m = match t.direction() {
                Direction::Send => p.queued,
                Direction::Recv => p.done,
            };
        }
        result
    }
}

/// How far one transfer of a stream step has come.
struct Progress {
    /// Bytes delivered (receives) or on the wire (sends and forwards).
    done: usize,
    /// For sends and forwards: bytes queued into the channel's outbox.
    queued: usize,
    /// For sends and forwards: whether every byte is queued.
    whole: bool,
    /// For sends and forwards: the channel's `queued` count before this one's first byte.
    base: u64,
}

/// Queues into their channels' outboxes what the sends of `step` before index `to` may send
/// now: a send all at once, a forward what its receive has landed; each only once every
/// earlier send of its channel is queued whole, so that the bytes keep the step's order.
/// Returns whether any was queued (the caller pumps the wires).
fn queue_sends(
    world: &mut World,
    rank: usize,
    step: &[Transfer<'_>],
    progress: &mut [Progress],
    to: usize,
) -> bool {
    let mut any = false;
    for i in 0..to {
        let (channel, len) = (step[i].channel(), step[i].len());
        if step[i].direction() != Direction::Send || progress[i].whole {
            continue;
        }
        let earlier_whole = (0..i).all(|j| {
            step[j].channel() != channel
                || step[j].direction() != Direction::Send
                || progress[j].whole
        });
        if !earlier_whole {
            continue;
        }
        let (send, bytes): (bool, &[u8]) = match &step[i] {
            Transfer::Send { data, .. } => (true, data),
            Transfer::Forward { of, .. } => match &step[*of] {
                Transfer::Recv { landing, .. } => {
                    (false, landing.landed(progress[*of].done).unwrap_or(&[]))
                }
                _ => (false, &[]),
            },
            Transfer::Recv { .. } => continue,
        };
        let bytes = &bytes[progress[i].queued.min(bytes.len())..];
        if !send && bytes.is_empty() && len > 0 {
            continue;
        }
        let chan = world.channel_mut(rank, channel);
        let p = &mut progress[i];
        if p.queued == 0 {
            p.base = chan.queued;
        }
        chan.outbox.extend(bytes.iter().copied());
        chan.queued += bytes.len() as u64;
        p.queued += bytes.len();
        p.whole = p.queued == len;
        any = true;
        world.hash(&[
            if send { 1 } else { 5 },
            rank as u64,
            channel.peer as u64,
            channel.link as u64,
            bytes.len() as u64,
            fnv(bytes),
        ]);
    }
    any
}

impl World {
    /// Puts queued bytes on every wire, as far as the windows allow (after a step queued its
    /// sends, and after time advanced).
    pub(crate) fn pump_all(&mut self) {
        let keys: Vec<(usize, Channel)> = self.channels.keys().copied().collect();
        for key in keys {
            self.pump(key);
        }
    }

    /// Puts as many queued bytes on the wire `key` as its window allows.
    pub(crate) fn pump(&mut self, key: (usize, Channel)) {
        loop {
            let (latency, jitter, bps, max_frag, window, now) = (
                self.latency,
                self.jitter,
                self.bytes_per_sec,
                self.max_fragment,
                self.window,
                self.now,
            );
            let wire = &self.channels[&key];
            if wire.closed || wire.outbox.is_empty() {
                return;
            }
            let used = wire.in_flight_bytes + wire.arrived.len();
            if used >= window {
                return;
            }
            let room = (window - used).min(wire.outbox.len());
            let size = self.rng.random_range(1..=max_frag.min(room).max(1));
            let jitter_ns = if jitter.is_zero() {
                0
            } else {
                self.rng.random_range(0..=jitter.as_nanos() as u64)
            };
            let wire = self.channels.get_mut(&key).expect("wire exists");
            let bytes = wire.outbox.make_contiguous()[..size].to_vec();
            wire.outbox.drain(..size);
            let emptied = wire.outbox.is_empty();
            let start = wire.busy_until.max(now);
            let on_wire = Duration::from_nanos((size as u128 * 1_000_000_000 / bps as u128) as u64);
            wire.busy_until = start + on_wire;
            let arrival = (wire.busy_until + latency + Duration::from_nanos(jitter_ns))
                .max(wire.last_arrival);
            wire.last_arrival = arrival;
            wire.sent += size as u64;
            wire.in_flight_bytes += size;
            self.payload += size as u64;
            if self.record_wire {
                wire.record.extend_from_slice(&bytes);
            }
            wire.in_flight.push_back((arrival, bytes));
            // The sender's sends complete when the last queued byte is on the wire; a look at
            // every fragment before that would find nothing to do.
            if emptied {
                self.ranks[key.0].dirty = true;
            }
            self.at(
                arrival,
                Event::Arrive {
                    rank: key.0,
                    peer: key.1.peer,
                    link: key.1.link,
                },
            );
        }
    }
}
