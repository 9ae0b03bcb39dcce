//! What a run produced: every rank's [`Outcome`] and the [`Report`] (seed, trace hash, end
//! time, and on request every byte and message each channel carried).
//!
//! Uses: the finished [`World`], read once after every rank thread has joined. Invariants:
//! outcomes are in rank order; a crashed rank's return value is dropped ([`Outcome::Crashed`]);
//! [`Report::replay`] names the seed that was in effect, so it replays the same run.

use std::collections::BTreeMap;
use std::time::Duration;

use nuvec_distributed::fabric::Channel;

use crate::sim::SEED_VAR;
use crate::world::World;

pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "a panic".into())
}

/// How one rank's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The closure returned this.
    Returned(T),
    /// The rank crashed (an injected fault); what its closure returned is dropped.
    Crashed,
    /// The closure panicked with this message.
    Panicked(String),
}

impl<T> Outcome<T> {
    /// The returned value, if any.
    pub fn returned(self) -> Option<T> {
        match self {
            Outcome::Returned(v) => Some(v),
            _ => None,
        }
    }
}

/// What a simulated run produced.
#[derive(Debug)]
pub struct Report<T> {
    /// Every rank's outcome, in rank order.
    pub outcomes: Vec<Outcome<T>>,
    /// The seed that was used.
    pub seed: u64,
    /// A hash of every scheduling decision and transfer: equal seeds give equal hashes.
    pub trace_hash: u64,
    /// Virtual time at the end.
    pub end: Duration,
    /// With [`Sim::record_wire`](crate::Sim::record_wire): every byte sent, per `(sender, sender's channel)`.
    pub wire: BTreeMap<(usize, Channel), Vec<u8>>,
    /// Message channels: the length of every message sent, per `(sender, sender's channel)`
    /// (lost ones included).
    pub messages: BTreeMap<(usize, Channel), Vec<usize>>,
    /// Bytes of payload the ranks put on the wire (stream fragments and messages, lost ones
    /// included): divided by the wall-clock time of the run, the simulator's own speed.
    pub payload: u64,
    /// When a fault of [`Sim::fault`](crate::Sim::fault) took effect (virtual time from the
    /// start, as [`SimFabric::clock`](crate::SimFabric::clock) reads it), `None` if it did
    /// not: a crash or a stall of a rank that had not returned, a cut of a link with an end
    /// that had not, a lost message or an error completion. A fault that came after its ranks
    /// returned, or whose call or message never came, did not: the run was then as without
    /// it. No operation that ended before this time can have been failed by the fault.
    pub fault_struck: Option<Duration>,
}

impl<T> Report<T> {
    /// The command-line fragment that replays this run: set the seed variable.
    pub fn replay(&self) -> String {
        format!("{SEED_VAR}={}", self.seed)
    }

    /// The report of a finished run: the ranks' outcomes and what the world recorded.
    pub(crate) fn new(outcomes: Vec<Outcome<T>>, seed: u64, world: &World) -> Self {
        Report {
            outcomes,
            seed,
            trace_hash: world.trace,
            fault_struck: world.struck,
            end: world.now,
            wire: world
                .channels
                .iter()
                .filter(|(_, w)| !w.record.is_empty())
                .map(|(&key, w)| (key, w.record.clone()))
                .collect(),
            messages: world
                .channels
                .iter()
                .filter(|(_, w)| !w.sizes.is_empty())
                .map(|(&key, w)| (key, w.sizes.clone()))
                .collect(),
            payload: world.payload,
        }
    }
}
