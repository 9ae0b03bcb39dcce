//! The network model and the state every rank shares: the [`World`] behind the simulator's
//! one lock. It holds the ranks' states, every wire (one direction of one connection), the
//! queue of timed events, virtual time, the seeded generator and the trace hash, and it holds
//! the scheduler ([`World::schedule`]) that picks the next rank or advances time.
//!
//! Uses: the builder's settings ([`Sim`]) and the faults ([`crate::fault`]) when it is made;
//! the stream and UC engines ([`crate::stream`], [`crate::uc`]) add their halves of the
//! network model (`pump`, `send_message`, `arrive_message`) as further `impl World` blocks.
//! Nothing here blocks or touches a thread.
//!
//! Invariants: every choice is drawn from `rng` in an order fixed by the seed and the ranks'
//! calls, and every decision that matters is mixed into `trace`, so one seed gives one trace;
//! events at equal times apply in the order they were queued (`event_seq`); a rank is given
//! the turn only when it can make progress (ready, woken by `dirty`, past its deadline, or
//! crashed and not yet told).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

use nuvec_distributed::fabric::{Channel, Connection, Wiring};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::sim::Sim;
use crate::uc::Uc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RankState {
    /// Not started yet, or returned from a fabric call: may run.
    Ready,
    /// Blocked in a fabric call until something arrives or the deadline.
    Waiting { deadline: Duration },
    /// Its closure returned.
    Done,
    /// Crashed by a fault.
    Crashed,
}

pub(crate) struct Rank {
    pub(crate) state: RankState,
    pub(crate) calls: u64,
    /// The operations its communicators began (see `Fabric::begin_operation`).
    pub(crate) operations: u64,
    pub(crate) stalled_until: Duration,
    /// Something happened that a waiting rank should look at.
    pub(crate) dirty: bool,
    /// Its closure has returned (its thread waits for nothing any more).
    pub(crate) finished: bool,
}

/// One direction of one connection: bytes from `from` on its link toward the far end.
pub(crate) struct Wire {
    pub(crate) to: (usize, usize),
    /// Bytes queued by the sender, not yet on the wire.
    pub(crate) outbox: VecDeque<u8>,
    /// Total bytes ever queued and ever put on the wire.
    pub(crate) queued: u64,
    pub(crate) sent: u64,
    /// Fragments on the wire: (arrival time, bytes), in order.
    pub(crate) in_flight: VecDeque<(Duration, Vec<u8>)>,
    pub(crate) in_flight_bytes: usize,
    /// Arrived at the receiver, not yet read.
    pub(crate) arrived: VecDeque<u8>,
    /// When the wire is free to start the next fragment.
    pub(crate) busy_until: Duration,
    pub(crate) last_arrival: Duration,
    pub(crate) closed: bool,
    pub(crate) record: Vec<u8>,
    /// Message channels: messages on the wire, `(arrival, sequence number, bytes)`.
    pub(crate) messages: VecDeque<(Duration, u64, Vec<u8>)>,
    /// Message channels: messages in posted receives (or held), not yet taken.
    pub(crate) inbox: VecDeque<(u64, Vec<u8>)>,
    /// Message channels: messages sent so far (the next sequence number).
    pub(crate) next_seq: u64,
    /// Message channels: the sequence number the receiver expects next.
    pub(crate) expect: u64,
    /// Message channels: a cut link, which drops everything silently.
    pub(crate) cut: bool,
    /// Message channels: the length of every message sent.
    pub(crate) sizes: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Event {
    /// A fragment sent by `rank` on its channel `(peer, link)` reaches the far end.
    Arrive {
        rank: usize,
        peer: usize,
        link: usize,
    },
    Crash {
        rank: usize,
    },
    StallEnd {
        rank: usize,
    },
    /// A message of `rank`'s has left: its send is complete.
    Wake {
        rank: usize,
    },
    Stall {
        rank: usize,
        until_nanos: u64,
    },
    Cut {
        rank: usize,
        peer: usize,
        link: usize,
    },
}

pub(crate) struct World {
    pub(crate) wiring: Wiring,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) now: Duration,
    pub(crate) ranks: Vec<Rank>,
    /// Every direction of every connection, keyed by its sender and the sender's channel.
    pub(crate) channels: BTreeMap<(usize, Channel), Wire>,
    pub(crate) events: BinaryHeap<Reverse<(Duration, u64, Event)>>,
    pub(crate) event_seq: u64,
    pub(crate) crash_calls: Vec<(usize, u64)>,
    /// `(rank, operation)`: the rank crashes as it begins that operation.
    pub(crate) crash_operations: Vec<(usize, u64)>,
    pub(crate) turn: Option<usize>,
    pub(crate) trace: u64,
    pub(crate) latency: Duration,
    pub(crate) jitter: Duration,
    pub(crate) bytes_per_sec: u64,
    pub(crate) max_fragment: usize,
    pub(crate) window: usize,
    pub(crate) record_wire: bool,
    pub(crate) uc: Option<Uc>,
    /// Messages to lose: `(sender, channel, sequence number)`.
    pub(crate) lose: Vec<(usize, Channel, u64)>,
    /// Sends that complete with an error status: `(sender, channel, sequence number)`.
    pub(crate) error_status: Vec<(usize, Channel, u64)>,
    /// When an injected fault first took effect: a crash of a rank still running, a stall of
    /// one, a cut with an end still running, a lost message or an error completion
    /// ([`crate::Report::fault_struck`]); `None` while none has.
    pub(crate) struck: Option<Duration>,
    /// `heard[rank][peer]`: when `rank` last took bytes from `peer`.
    pub(crate) heard: Vec<Vec<Option<Duration>>>,
    /// Bytes put on the wire so far ([`crate::Report::payload`]).
    pub(crate) payload: u64,
    /// How many times each job rank asked for a sub-group of exactly these members
    /// ([`crate::split`]).
    pub(crate) split_seen: BTreeMap<(usize, Vec<usize>), u64>,
    /// The channels of every sub-group made so far, by members and occurrence.
    pub(crate) splits: BTreeMap<(Vec<usize>, u64), crate::split::GroupLinks>,
}

pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    // FNV-1a's step over little-endian 8-byte words, then the tail bytes: a trace hash needs
    // determinism and spread, not FNV's exact values, and words are 8 times fewer steps.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        h ^= u64::from_le_bytes(word.try_into().expect("8 bytes"));
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    for &b in words.remainder() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl World {
    pub(crate) fn new(sim: &Sim, seed: u64) -> Self {
        let size = sim.wiring.size();
        let mut world = Self {
            wiring: sim.wiring.clone(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: Duration::ZERO,
            ranks: (0..size)
                .map(|_| Rank {
                    state: RankState::Ready,
                    calls: 0,
                    operations: 0,
                    stalled_until: Duration::ZERO,
                    dirty: false,
                    finished: false,
                })
                .collect(),
            channels: BTreeMap::new(),
            events: BinaryHeap::new(),
            event_seq: 0,
            crash_calls: Vec::new(),
            crash_operations: Vec::new(),
            turn: None,
            trace: 0xcbf2_9ce4_8422_2325 ^ seed,
            latency: sim.latency,
            jitter: sim.jitter,
            bytes_per_sec: sim.bytes_per_sec,
            max_fragment: sim.max_fragment,
            window: sim.window,
            record_wire: sim.record_wire,
            uc: sim.uc,
            lose: Vec::new(),
            error_status: Vec::new(),
            struck: None,
            heard: vec![vec![None; size]; size],
            payload: 0,
            split_seen: BTreeMap::new(),
            splits: BTreeMap::new(),
        };
        for c in sim.wiring.connections() {
            world.add_wires(*c);
        }
        world.inject(&sim.faults);
        world
    }

    /// The two wires of connection `c`, one per direction.
    fn add_wires(&mut self, c: Connection) {
        for (from, from_link, to, to_link) in [
            (c.opener, c.opener_link, c.acceptor, c.acceptor_link),
            (c.acceptor, c.acceptor_link, c.opener, c.opener_link),
        ] {
            self.channels.insert(
                (from, Channel::new(to, from_link)),
                Wire {
                    to: (to, to_link),
                    outbox: VecDeque::new(),
                    queued: 0,
                    sent: 0,
                    in_flight: VecDeque::new(),
                    in_flight_bytes: 0,
                    arrived: VecDeque::new(),
                    busy_until: Duration::ZERO,
                    last_arrival: Duration::ZERO,
                    closed: false,
                    record: Vec::new(),
                    messages: VecDeque::new(),
                    inbox: VecDeque::new(),
                    next_seq: 0,
                    expect: 0,
                    cut: false,
                    sizes: Vec::new(),
                },
            );
        }
    }

    /// Joins `opener` to `acceptor` with a new connection after all the others (a
    /// sub-group's), with its two wires, and returns it. A wire to or from a crashed rank is
    /// closed from the start.
    pub(crate) fn join(&mut self, opener: usize, acceptor: usize) -> Connection {
        let c = self.wiring.join(opener, acceptor);
        self.add_wires(c);
        self.hash(&[11, opener as u64, acceptor as u64, c.opener_link as u64]);
        for rank in [opener, acceptor] {
            if self.uc.is_none() && self.ranks[rank].state == RankState::Crashed {
                for (from, channel) in [
                    (c.opener, Channel::new(c.acceptor, c.opener_link)),
                    (c.acceptor, Channel::new(c.opener, c.acceptor_link)),
                ] {
                    self.channel_mut(from, channel).closed = true;
                }
            }
        }
        c
    }

    pub(crate) fn size(&self) -> usize {
        self.ranks.len()
    }

    pub(crate) fn hash(&mut self, words: &[u64]) {
        for &w in words {
            self.trace ^= w;
            self.trace = self
                .trace
                .wrapping_mul(0x0000_0100_0000_01b3)
                .rotate_left(17);
        }
    }

    pub(crate) fn at(&mut self, when: Duration, event: Event) {
        self.event_seq += 1;
        self.events.push(Reverse((when, self.event_seq, event)));
    }

    pub(crate) fn channel(&self, rank: usize, channel: Channel) -> &Wire {
        &self.channels[&(rank, channel)]
    }

    pub(crate) fn channel_mut(&mut self, rank: usize, channel: Channel) -> &mut Wire {
        self.channels
            .get_mut(&(rank, channel))
            .expect("validated channel")
    }

    /// The wire that carries bytes *to* `rank` on its `channel`.
    pub(crate) fn incoming_mut(&mut self, rank: usize, channel: Channel) -> &mut Wire {
        let (peer, link) = self
            .wiring
            .far_end(rank, channel)
            .expect("validated channel");
        self.channel_mut(peer, Channel::new(rank, link))
    }

    /// Closes every wire to and from `rank`.
    pub(crate) fn close_rank(&mut self, rank: usize) {
        if self.uc.is_some() {
            // Queue pairs close nothing on the far side: it only hears silence.
            return;
        }
        let keys: Vec<(usize, Channel)> = self
            .channels
            .iter()
            .filter(|(k, w)| k.0 == rank || w.to.0 == rank)
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            let wire = self.channels.get_mut(&k).expect("wire exists");
            wire.closed = true;
            let (a, b) = (k.0, wire.to.0);
            self.ranks[a].dirty = true;
            self.ranks[b].dirty = true;
        }
    }

    /// Notes that the injected fault took effect now, if `it_did` (the first time counts).
    pub(crate) fn strike(&mut self, it_did: bool) {
        if it_did && self.struck.is_none() {
            self.struck = Some(self.now);
        }
    }

    /// Whether `rank` has returned or crashed: nothing it does or suffers changes the job now.
    pub(crate) fn ended(&self, rank: usize) -> bool {
        matches!(self.ranks[rank].state, RankState::Done | RankState::Crashed)
    }

    pub(crate) fn crash(&mut self, rank: usize) {
        if self.ended(rank) {
            return;
        }
        self.ranks[rank].state = RankState::Crashed;
        self.strike(true);
        self.hash(&[5, rank as u64]);
        // Bytes already on the wire still arrive; nothing more leaves; then the peers see the
        // connection close.
        let keys: Vec<(usize, Channel)> = self
            .channels
            .keys()
            .filter(|k| k.0 == rank)
            .copied()
            .collect();
        for k in keys {
            self.channels.get_mut(&k).expect("wire").outbox.clear();
        }
        self.close_rank(rank);
    }

    pub(crate) fn apply(&mut self, event: Event) {
        match event {
            Event::Arrive { rank, peer, link } if self.uc.is_some() => {
                self.arrive_message(rank, Channel::new(peer, link));
            }
            Event::Arrive { rank, peer, link } => {
                let wire = self.channel_mut(rank, Channel::new(peer, link));
                if let Some((_, bytes)) = wire.in_flight.pop_front() {
                    wire.in_flight_bytes -= bytes.len();
                    wire.arrived.extend(bytes);
                    let to = wire.to.0;
                    self.ranks[to].dirty = true;
                }
            }
            Event::Crash { rank } => self.crash(rank),
            Event::Stall { rank, until_nanos } => {
                let until = Duration::from_nanos(until_nanos);
                self.strike(!self.ended(rank));
                self.ranks[rank].stalled_until = until;
                self.hash(&[6, rank as u64]);
                self.at(until, Event::StallEnd { rank });
            }
            Event::StallEnd { rank } | Event::Wake { rank } => self.ranks[rank].dirty = true,
            Event::Cut { rank, peer, link } => {
                let channel = Channel::new(peer, link);
                let Some((far, far_link)) = self.wiring.far_end(rank, channel) else {
                    return;
                };
                self.hash(&[7, rank as u64, peer as u64, link as u64]);
                // A cut between two ranks that have both returned (its event still comes: the
                // queue is run to its end) changes nothing.
                self.strike([rank, far].iter().any(|&r| !self.ended(r)));
                let silent = self.uc.is_some();
                for key in [(rank, channel), (far, Channel::new(rank, far_link))] {
                    let wire = self.channel_mut(key.0, key.1);
                    wire.closed = !silent;
                    wire.cut = true;
                    wire.messages.clear();
                    wire.in_flight.clear();
                    wire.in_flight_bytes = 0;
                    wire.outbox.clear();
                }
                self.ranks[rank].dirty = true;
                self.ranks[far].dirty = true;
            }
        }
    }

    /// Chooses the rank that runs next, advancing virtual time when none can run.
    pub(crate) fn schedule(&mut self) {
        loop {
            let now = self.now;
            let runnable: Vec<usize> = (0..self.size())
                .filter(|&r| {
                    let rank = &self.ranks[r];
                    rank.stalled_until <= now
                        && match rank.state {
                            RankState::Ready => true,
                            RankState::Waiting { deadline } => rank.dirty || deadline <= now,
                            RankState::Done => false,
                            // A crashed rank's thread may still wait for a turn (in a fabric
                            // call, or before it started): it runs once more to learn of the
                            // crash, and then finishes.
                            RankState::Crashed => !rank.finished,
                        }
                })
                .collect();
            if !runnable.is_empty() {
                let pick = runnable[self.rng.random_range(0..runnable.len())];
                self.ranks[pick].dirty = false;
                self.turn = Some(pick);
                self.hash(&[8, pick as u64, now.as_nanos() as u64]);
                return;
            }
            // Nobody can run: advance to the next event or deadline.
            let next_event = self.events.peek().map(|Reverse((t, _, _))| *t);
            let next_deadline = self
                .ranks
                .iter()
                .filter_map(|r| match r.state {
                    RankState::Waiting { deadline } => Some(deadline.max(r.stalled_until)),
                    _ => None,
                })
                .min();
            let next = match (next_event, next_deadline) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => {
                    // Every rank is done or crashed.
                    self.turn = None;
                    return;
                }
            };
            self.now = self.now.max(next);
            while let Some(Reverse((t, _, _))) = self.events.peek() {
                if *t > self.now {
                    break;
                }
                let Some(Reverse((_, _, event))) = self.events.pop() else {
                    break;
                };
                self.apply(event);
            }
            self.pump_all();
        }
    }
}
