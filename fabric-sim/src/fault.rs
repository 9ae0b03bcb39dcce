//! The faults a simulated run can inject ([`Fault`]), and how each enters the world: as an
//! event at a virtual time (crash at a time, stall, cut link) or as an entry in one of the
//! world's tables that the step engines consult (crash at a fabric call, lost message, error
//! completion).
//!
//! Uses: [`World`] (its event queue and fault tables). Invariants: injecting draws nothing
//! from the generator and hashes nothing, so a fault changes the trace only when it strikes;
//! faults are injected once, before the first turn.

use std::time::Duration;

use nuvec_distributed::fabric::Channel;

use crate::world::{Event, World};

/// A fault injected into a simulated run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `rank` crashes when it makes its `call`-th fabric call (counting from 0): that call
    /// and every later one fail, and all its connections close.
    Crash {
        /// The rank that crashes.
        rank: usize,
        /// The index of the fabric call at which it crashes.
        call: u64,
    },
    /// `rank` crashes as it begins its `operation`-th operation (counting from 0 every
    /// operation its communicators begin, collectives and sends and receives alike, in every
    /// group): "the second all_sum" of a program of all_sums is operation 1. That operation
    /// and every later one fail, and all its connections close.
    CrashAtOperation {
        /// The rank that crashes.
        rank: usize,
        /// The index of the operation at whose start it crashes.
        operation: u64,
    },
    /// `rank` crashes at virtual time `at`.
    CrashAt {
        /// The rank that crashes.
        rank: usize,
        /// When.
        at: Duration,
    },
    /// `rank` is not scheduled from `at` for `duration` (its connections stay open).
    Stall {
        /// The rank that stalls.
        rank: usize,
        /// When it stops.
        at: Duration,
        /// For how long.
        duration: Duration,
    },
    /// Message channels: the `message`-th message (counting from 0) that `rank` sends on
    /// `channel` is lost without a trace, as UC loses a packet.
    Lose {
        /// The sender.
        rank: usize,
        /// The sender's channel.
        channel: Channel,
        /// Which of its messages.
        message: u64,
    },
    /// Message channels: the send of the `message`-th message `rank` sends on `channel`
    /// completes with an error status (and the message is not delivered).
    ErrorStatus {
        /// The sender.
        rank: usize,
        /// The sender's channel.
        channel: Channel,
        /// Which of its messages.
        message: u64,
    },
    /// The connection at `rank`'s channel `channel` is cut at `at`: both directions close
    /// and bytes in flight are lost (message channels: silently, as a cable pulled under UC).
    Cut {
        /// One end of the connection.
        rank: usize,
        /// That end's channel.
        channel: Channel,
        /// When.
        at: Duration,
    },
}

impl World {
    /// Enters `faults` into the world (once, when it is made).
    pub(crate) fn inject(&mut self, faults: &[Fault]) {
        for f in faults {
            match *f {
                Fault::Crash { rank, call } => self.crash_calls.push((rank, call)),
                Fault::CrashAtOperation { rank, operation } => {
                    self.crash_operations.push((rank, operation))
                }
                Fault::CrashAt { rank, at } => self.at(at, Event::Crash { rank }),
                Fault::Stall { rank, at, duration } => self.at(
                    at,
                    Event::Stall {
                        rank,
                        until_nanos: (at + duration).as_nanos() as u64,
                    },
                ),
                Fault::Lose {
                    rank,
                    channel,
                    message,
                } => self.lose.push((rank, channel, message)),
                Fault::ErrorStatus {
                    rank,
                    channel,
                    message,
                } => self.error_status.push((rank, channel, message)),
                Fault::Cut { rank, channel, at } => self.at(
                    at,
                    Event::Cut {
                        rank,
                        peer: channel.peer,
                        link: channel.link,
                    },
                ),
            }
        }
    }
}
