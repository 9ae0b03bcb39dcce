//! The communicator core both backends share: one lock over the fabric and its scratch, one
//! deadline per operation, sequence numbers, a sticky failure and, after a failure, a diagnosis
//! of when each peer was last heard.
//!
//! Every rank must issue the same operations in the same order (MLX's contract): the bytes of
//! operation k+1 follow those of operation k on every connection, with no framing. An error in
//! the middle of an operation therefore leaves the connections misaligned, and the only safe
//! answer is to fail the group: every later call returns at once with the first error. Errors
//! that the caller can cause are found before anything is sent ([`Core::invalid`]) and leave
//! the group usable.
//!
//! An operation's deadline is its start plus the communicator's timeout, or none when the
//! timeout is zero (the fabric's link liveness still bounds every wait). While it waits, the
//! fabric tells the core's [`Reporter`] what for, which logs it every interval
//! (`NUVEC_DISTRIBUTED_WARN_AFTER`, see [`patience`](super::patience)).
//!
//! Uses the fabric trait, the crate's errors and its log; nothing of either backend.

use std::sync::PoisonError;
use std::time::Duration;

use crate::collective::patience::{Both, Reporter, Running};
use crate::collective::record::{self, Call, Record};
use crate::config::log::Log;
use crate::error::Error;
use crate::fabric::{Fabric, FabricError, FailureKind};
use crate::sync::{Mutex, MutexGuard};

/// What a communicator guards with its lock: the fabric, reusable buffers, the sequence
/// number and the first failure.
struct State<F, S> {
    fabric: Option<F>,
    /// Buffers the algorithms reuse (the ring's zero-padded copy of its small path, say).
    scratch: S,
    /// The operations' sequence numbers.
    numbers: Numbers,
    /// The first failure, returned by every later call.
    failed: Option<Error>,
    /// The latest operations, `(sequence number, name, start on the fabric's clock)`, to say in
    /// which one each peer was last heard from.
    history: std::collections::VecDeque<(u64, &'static str, Duration)>,
    /// After a failure: one line per peer, when and in which operation it was last heard.
    diagnosis: Vec<String>,
    /// Whether a failure tells the peers ([`Fabric::tell_failed`]) and releases the fabric
    /// (and with it the links) at once, so that peers waiting for this rank, or for a rank
    /// that waits in turn, fail too (the nuvec wire) instead of waiting for their deadline.
    close_on_failure: bool,
    /// The flight recorder's record of this group (`None`: off).
    record: Option<Record>,
}

/// The operations' sequence numbers, one numbering for everything that names an operation
/// (errors, the warnings of a long wait, the flight record, the nuvec wire's fingerprints):
/// collectives are numbered once for the group, since every rank takes part in each;
/// sends and receives per peer, since rank 0 may send to rank 1 while rank 2 does nothing.
/// So the same operation has the same number on every rank whose program is the same.
struct Numbers {
    collectives: u64,
    sends: Vec<u64>,
    recvs: Vec<u64>,
}

impl Numbers {
    /// Numbers for a group of `size` ranks.
    fn new(size: usize) -> Self {
        Self {
            collectives: 0,
            sends: vec![0; size],
            recvs: vec![0; size],
        }
    }

    /// The number of `call`, counted.
    fn next(&mut self, call: &Call) -> u64 {
        let counter = match (call.op, call.peer) {
            ("send", Some(p)) => self.sends.get_mut(p),
            ("recv", Some(p)) => self.recvs.get_mut(p),
            _ => Some(&mut self.collectives),
        };
        counter.map_or(0, |c| {
            *c += 1;
            *c - 1
        })
    }
}

/// How many operations [`State`] remembers for the diagnosis.
const HISTORY: usize = 64;

impl<F: Fabric, S> State<F, S> {
    /// A fresh state over `fabric`.
    fn new(rank: usize, mut fabric: F, scratch: S) -> Self {
        let record = Record::new(rank, fabric.size(), record::capacity(), fabric.epoch_us());
        if let Some(record) = &record {
            fabric.set_patience(record.patience());
        }
        let numbers = Numbers::new(fabric.size());
        Self {
            fabric: Some(fabric),
            scratch,
            numbers,
            failed: None,
            history: std::collections::VecDeque::with_capacity(HISTORY),
            diagnosis: Vec::new(),
            close_on_failure: false,
            record,
        }
    }

    /// After a failure, one line per peer: when it was last heard from and during which
    /// operation (empty before any failure).
    pub(crate) fn diagnosis(&self) -> Vec<String> {
        self.diagnosis.clone()
    }

    /// The diagnosis lines of `rank`'s peers at `now`: only those it has links to (a ring
    /// rank's two neighbours), since it never hears from the others by design.
    fn diagnose(&self, fabric: &F, rank: usize, now: Duration) -> Vec<String> {
        (0..fabric.size())
            .filter(|&p| p != rank && fabric.links(p) > 0)
            .map(|p| match fabric.last_heard(p) {
                None => format!("rank {p}: never heard from"),
                Some(at) => {
                    // Bytes heard at the very instant an operation started belong to the
                    // one before (a simulated clock does not move between the two).
                    let during = self
                        .history
                        .iter()
                        .rev()
                        .find(|(_, _, start)| *start < at)
                        .or_else(|| self.history.front().filter(|(_, _, s)| *s <= at))
                        .map_or(String::new(), |(seq, op, _)| {
                            format!(", during {op} #{seq}")
                        });
                    format!(
                        "rank {p}: last heard {:.3}s ago{during}",
                        now.saturating_sub(at).as_secs_f64()
                    )
                }
            })
            .collect()
    }

    /// Runs one operation of `rank` whose arguments the caller has checked: refuses it if the
    /// group failed or closed, then runs `body` with a deadline `timeout` away and fails the
    /// group if it fails (logging the error to `log`).
    #[allow(
        clippy::too_many_arguments,
        reason = "the operation's context, passed through"
    )]
    pub(crate) fn operate(
        &mut self,
        rank: usize,
        timeout: Duration,
        log: &Log,
        running: &Running,
        call: Call,
        body: impl FnOnce(&mut F, &mut S, Duration, u64) -> Result<(), FabricError>,
    ) -> Result<(), Error> {
        let Call { op, bytes, .. } = call;
        if let Some(first) = &self.failed {
            return Err(Error::Failed {
                rank,
                op,
                first: Box::new(first.clone()),
            });
        }
        let seq = self.numbers.next(&call);
        let Some(fabric) = self.fabric.as_mut() else {
            return Err(Error::Closed { rank, op });
        };
        let start = fabric.now();
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back((seq, op, start));
        if let Some(record) = self.record.as_mut() {
            let peers = (0..fabric.size()).filter(|&p| p != rank && fabric.links(p) > 0);
            record.begin(&call, seq, peers, start);
        }
        // A zero timeout is none: the deadline never comes.
        let deadline = if timeout.is_zero() {
            Duration::MAX
        } else {
            start.saturating_add(timeout)
        };
        running.begin(seq, op, bytes, start, log.slow_after());
        fabric.begin_operation();
        let result = body(fabric, &mut self.scratch, deadline, seq);
        running.end();
        if result.is_ok()
            && let Some(record) = self.record.as_mut()
        {
            // The last clock reading of the operation's last step, not one more read.
            record.end(None, fabric.recent());
        }
        if let Err(source) = result {
            let waited = fabric.now().saturating_sub(start);
            // The peer this rank was waiting for may only have given up because another one
            // failed first: say which other peers are unreachable too.
            let closer = match source.kind {
                FailureKind::ClosedBy { rank, .. } => Some(rank),
                _ => None,
            };
            let unreachable = fabric
                .probe()
                .into_iter()
                .filter(|(peer, _)| *peer != source.peer() && Some(*peer) != closer)
                .collect();
            let error = Error::Transport {
                rank,
                op,
                seq,
                bytes,
                waited,
                source: Box::new(source),
                unreachable,
            };
            let now = fabric.now();
            let Some(fabric) = self.fabric.as_ref() else {
                log.error(format_args!("{error}"));
                return Err(error);
            };
            self.diagnosis = self.diagnose(fabric, rank, now);
            if self.close_on_failure
                && let Some(mut fabric) = self.fabric.take()
            {
                // Peers waiting on other links learn it too, then the links close: before
                // anything slower (the log, the flight record's file), after the look at the
                // links above (peers answering the notice would blur which were unreachable).
                fabric.tell_failed();
            }
            log.error(format_args!("{error}"));
            for line in &self.diagnosis {
                log.error(format_args!("{line}"));
            }
            self.failed = Some(error.clone());
            if let Some(record) = self.record.as_mut() {
                record.end(Some(&error), now);
                record.keep();
                record::dump_on_failure();
            }
            return Err(error);
        }
        Ok(())
    }
}

/// What every communicator of this crate shares: its rank, the deadline of its operations, its
/// log and its guarded [`State`], with the lifecycle every communicator offers (failure,
/// diagnosis, health, close) and the one way operations run ([`Core::operate`]).
pub(crate) struct Core<F, S> {
    rank: usize,
    /// The deadline of every operation, in nanoseconds (changeable while in use).
    timeout: std::sync::atomic::AtomicU64,
    log: Log,
    /// The operation running, for the reports of a long wait.
    running: Running,
    /// The flight record's reader (`None`: the recorder is off).
    record: Option<record::Reader>,
    state: Mutex<State<F, S>>,
}

impl<F: Fabric, S> Core<F, S> {
    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// The core of `rank` over `fabric`, with `scratch` for its algorithms.
    pub(crate) fn new(rank: usize, fabric: F, scratch: S, timeout: Duration) -> Self {
        let state = State::new(rank, fabric, scratch);
        let core = Self {
            rank,
            timeout: std::sync::atomic::AtomicU64::new(0),
            log: Log::off(),
            running: Running::default(),
            record: state.record.as_ref().map(Record::reader),
            state: Mutex::new(state),
        };
        core.set_timeout(timeout);
        core
    }

    /// Makes a failure release the fabric at once (see [`State`]'s `close_on_failure`).
    pub(crate) fn set_close_on_failure(&mut self, on: bool) {
        self.lock().close_on_failure = on;
    }

    /// Prints failures to `log`, and operations that wait long (see
    /// [`Log::slow_after`]).
    pub(crate) fn set_log(&mut self, log: Log) {
        self.log = log;
        if let Some(every) = log.slow_after() {
            let mut state = self.lock();
            let State { fabric, record, .. } = &mut *state;
            if let Some(fabric) = fabric.as_mut() {
                let reporter = Box::new(Reporter::new(self.running.clone(), log, every));
                fabric.set_patience(match record {
                    Some(record) => Box::new(Both(reporter, record.patience())),
                    None => reporter,
                });
            }
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        self.timeout
            .store(nanos, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn failure(&self) -> Option<Error> {
        self.lock().failed.clone()
    }

    pub(crate) fn diagnosis(&self) -> Vec<String> {
        self.lock().diagnosis()
    }

    pub(crate) fn flight_record(&self) -> Option<String> {
        self.record.as_ref().map(record::Reader::text)
    }

    pub(crate) fn health(&self) -> Vec<(usize, String)> {
        match self.lock().fabric.as_mut() {
            Some(fabric) => fabric.probe(),
            None => Vec::new(),
        }
    }

    pub(crate) fn close(&self) -> Option<F> {
        self.lock().fabric.take()
    }

    fn lock(&self) -> MutexGuard<'_, State<F, S>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An argument error of operation `op`: nothing moved, the group stays usable.
    pub(crate) fn invalid(&self, op: &'static str, what: String) -> Error {
        Error::InvalidArgument {
            rank: self.rank,
            op,
            what,
        }
    }

    /// Runs one operation, `call`, whose arguments the caller has checked
    /// ([`State::operate`]).
    pub(crate) fn operate(
        &self,
        call: Call,
        body: impl FnOnce(&mut F, &mut S, Duration, u64) -> Result<(), FabricError>,
    ) -> Result<(), Error> {
        self.lock().operate(
            self.rank,
            self.timeout(),
            &self.log,
            &self.running,
            call,
            body,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_are_numbered_per_group_and_sends_and_receives_per_peer() {
        let mut numbers = Numbers::new(3);
        let send = |peer| Call {
            peer: Some(peer),
            ..Call::new("send", 8)
        };
        let recv = |peer| Call {
            peer: Some(peer),
            ..Call::new("recv", 8)
        };
        let got: Vec<u64> = [
            Call::new("all_sum", 4),
            send(1),
            send(1),
            recv(1),
            send(2),
            Call::new("all_gather", 4),
            Call::new("split", 4),
            recv(1),
        ]
        .iter()
        .map(|call| numbers.next(call))
        .collect();
        assert_eq!(got, vec![0, 0, 1, 0, 0, 1, 2, 1]);
    }
}
