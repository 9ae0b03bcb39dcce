//! The ring as a `nuvec_core` [`Communicator`]: argument checks before any byte moves, one
//! deadline per operation, sequence numbers, and a sticky failure.
//!
//! Every rank must issue the same operations in the same order (MLX's contract): the bytes of
//! operation k+1 follow those of operation k on every connection, with no framing. An error in
//! the middle of an operation therefore leaves the connections misaligned, and the only safe
//! answer is to fail the group: every later call returns at once with the first error. Errors
//! that the caller can cause (an unsupported dtype, a wrong size, a peer that is not a
//! neighbour) are found before anything is sent and leave the group usable.

use std::sync::PoisonError;
use std::time::Duration;

use nuvec_core::DType;
use nuvec_core::distributed::{AllReduce, Communicator};

use crate::error::Error;
use crate::fabric::{Fabric, FabricError};
use crate::log::Log;
use crate::reduce::{Reducer, Reduction};
use crate::ring::{RingTopology, algorithm, schedule};
use crate::sync::{Mutex, MutexGuard};

/// MLX's ring over a fabric, as a `nuvec_core` communicator.
///
/// Built by [`init_with`](crate::init_with) over TCP, or over the simulator by
/// `nuvec-fabric-sim`; wrap it in `nuvec_core::distributed::Group::new(Arc::new(..))`.
pub struct RingCommunicator<F: Fabric> {
    ring: RingTopology,
    core: Core<F, Vec<u8>>,
}

/// What a communicator guards with its lock: the fabric, reusable buffers, the sequence
/// number and the first failure.
struct State<F, S> {
    fabric: Option<F>,
    /// Buffers the algorithms reuse (the ring's zero-padded copy of its small path, say).
    scratch: S,
    /// The number of operations started so far.
    seq: u64,
    /// The first failure, returned by every later call.
    failed: Option<Error>,
    /// The latest operations, `(sequence number, name, start on the fabric's clock)`, to say in
    /// which one each peer was last heard from.
    history: std::collections::VecDeque<(u64, &'static str, Duration)>,
    /// After a failure: one line per peer, when and in which operation it was last heard.
    diagnosis: Vec<String>,
}

/// How many operations [`State`] remembers for the diagnosis.
const HISTORY: usize = 64;

impl<F: Fabric, S> State<F, S> {
    /// A fresh state over `fabric`.
    fn new(fabric: F, scratch: S) -> Self {
        Self {
            fabric: Some(fabric),
            scratch,
            seq: 0,
            failed: None,
            history: std::collections::VecDeque::with_capacity(HISTORY),
            diagnosis: Vec::new(),
        }
    }

    /// After a failure, one line per peer: when it was last heard from and during which
    /// operation (empty before any failure).
    pub(crate) fn diagnosis(&self) -> Vec<String> {
        self.diagnosis.clone()
    }

    /// The diagnosis lines of `rank`'s peers at `now`.
    fn diagnose(&self, fabric: &F, rank: usize, now: Duration) -> Vec<String> {
        (0..fabric.size())
            .filter(|&p| p != rank)
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
    pub(crate) fn operate(
        &mut self,
        rank: usize,
        timeout: Duration,
        log: &Log,
        op: &'static str,
        bytes: usize,
        body: impl FnOnce(&mut F, &mut S, Duration) -> Result<(), FabricError>,
    ) -> Result<(), Error> {
        if let Some(first) = &self.failed {
            return Err(Error::Failed {
                rank,
                op,
                first: Box::new(first.clone()),
            });
        }
        let seq = self.seq;
        self.seq += 1;
        let Some(fabric) = self.fabric.as_mut() else {
            return Err(Error::Closed { rank, op });
        };
        let start = fabric.now();
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back((seq, op, start));
        let result = body(fabric, &mut self.scratch, start + timeout);
        if let Err(source) = result {
            let waited = fabric.now().saturating_sub(start);
            // The peer this rank was waiting for may only have given up because another one
            // failed first: say which other peers are unreachable too.
            let unreachable = fabric
                .probe()
                .into_iter()
                .filter(|(peer, _)| *peer != source.peer())
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
            log.error(format_args!("{error}"));
            let now = fabric.now();
            let Some(fabric) = self.fabric.as_ref() else {
                return Err(error);
            };
            self.diagnosis = self.diagnose(fabric, rank, now);
            for line in &self.diagnosis {
                log.error(format_args!("{line}"));
            }
            self.failed = Some(error.clone());
            return Err(error);
        }
        Ok(())
    }
}

impl<F: Fabric> std::fmt::Debug for RingCommunicator<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RingCommunicator(rank {} of {}, {} connections per neighbour)",
            self.ring.rank(),
            self.ring.size(),
            self.ring.conns()
        )
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
    state: Mutex<State<F, S>>,
}

impl<F: Fabric, S> Core<F, S> {
    /// The core of `rank` over `fabric`, with `scratch` for its algorithms.
    pub(crate) fn new(rank: usize, fabric: F, scratch: S, timeout: Duration) -> Self {
        let core = Self {
            rank,
            timeout: std::sync::atomic::AtomicU64::new(0),
            log: Log::off(),
            state: Mutex::new(State::new(fabric, scratch)),
        };
        core.set_timeout(timeout);
        core
    }

    /// Prints failures to `log`.
    pub(crate) fn set_log(&mut self, log: Log) {
        self.log = log;
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

    /// Runs one operation whose arguments the caller has checked ([`State::operate`]).
    pub(crate) fn operate(
        &self,
        op: &'static str,
        bytes: usize,
        body: impl FnOnce(&mut F, &mut S, Duration) -> Result<(), FabricError>,
    ) -> Result<(), Error> {
        self.lock()
            .operate(self.rank, self.timeout(), &self.log, op, bytes, body)
    }
}

impl<F: Fabric> RingCommunicator<F> {
    /// The ring over `fabric`, whose channels must be numbered as
    /// [`Wiring::ring`](crate::fabric::Wiring::ring) with `conns` links per neighbour; every
    /// operation must finish within `timeout`.
    ///
    /// # Panics
    /// If the fabric does not have `conns` links to each neighbour.
    pub fn new(fabric: F, conns: usize, timeout: Duration) -> Self {
        let ring = RingTopology::new(fabric.rank(), fabric.size(), conns);
        if ring.size() > 1 {
            let expected = if ring.size() == 2 { 2 * conns } else { conns };
            assert_eq!(
                fabric.links(ring.right()),
                expected,
                "ring: links to the right neighbour"
            );
            assert_eq!(
                fabric.links(ring.left()),
                expected,
                "ring: links to the left neighbour"
            );
        }
        Self {
            ring,
            core: Core::new(ring.rank(), fabric, Vec::new(), timeout),
        }
    }

    /// Prints failures to `log`.
    pub(crate) fn with_log(mut self, log: Log) -> Self {
        self.core.set_log(log);
        self
    }

    /// This rank's place in the ring.
    pub fn topology(&self) -> RingTopology {
        self.ring
    }

    /// The deadline of every operation.
    pub fn timeout(&self) -> Duration {
        self.core.timeout()
    }

    /// Changes the deadline of the operations that start from now on (an operation in
    /// progress keeps its own): set a longer one before a slow operation and restore it after.
    pub fn set_timeout(&self, timeout: Duration) {
        self.core.set_timeout(timeout);
    }

    /// The first failure of this group, if it has failed.
    pub fn failure(&self) -> Option<Error> {
        self.core.failure()
    }

    /// After the group failed: one line per peer saying when it was last heard from and during
    /// which operation, e.g. `rank 2: last heard 29.871s ago, during all_sum #14` (also
    /// printed at the `error` log level). Empty while the group is healthy.
    pub fn diagnosis(&self) -> Vec<String> {
        self.core.diagnosis()
    }

    /// Which peers are unreachable, checked without running a collective (it waits for an
    /// operation in progress, never interleaves with one): `(peer, what)` for each.
    pub fn health(&self) -> Vec<(usize, String)> {
        self.core.health()
    }

    /// Releases the fabric (and with it the connections); later calls fail with
    /// [`Error::Closed`]. Returns the fabric if it was still there.
    pub fn close(&self) -> Option<F> {
        self.core.close()
    }

    fn invalid(&self, op: &'static str, what: String) -> Error {
        self.core.invalid(op, what)
    }

    fn operate(
        &self,
        op: &'static str,
        bytes: usize,
        body: impl FnOnce(&mut F, &mut Vec<u8>, Duration) -> Result<(), FabricError>,
    ) -> Result<(), Error> {
        self.core.operate(op, bytes, body)
    }

    /// [`Communicator::all_reduce`] with this crate's error.
    pub fn try_all_reduce(
        &self,
        op: Reduction,
        dtype: DType,
        data: &mut [u8],
    ) -> Result<(), Error> {
        let name = match op {
            Reduction::Sum => "all_sum",
            Reduction::Max => "all_max",
            Reduction::Min => "all_min",
        };
        let len = data.len();
        let reducer = Reducer::new(op, dtype).map_err(|e| self.invalid(name, e.to_string()))?;
        if !len.is_multiple_of(reducer.element_size()) {
            return Err(self.invalid(
                name,
                format!("{len} bytes is not a whole number of {dtype} elements"),
            ));
        }
        self.operate(name, len, |fabric, scratch, deadline| {
            if self.ring.size() < 2 {
                return Ok(());
            }
            algorithm::all_reduce(fabric, &self.ring, reducer, data, scratch, deadline)
        })
    }

    /// [`Communicator::all_gather`] with this crate's error.
    pub fn try_all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<(), Error> {
        let size = self.ring.size();
        if output.len() != input.len() * size {
            return Err(self.invalid(
                "all_gather",
                format!(
                    "the output has {} bytes, not {} × {size} ranks",
                    output.len(),
                    input.len()
                ),
            ));
        }
        self.operate("all_gather", input.len(), |fabric, _, deadline| {
            algorithm::all_gather(fabric, &self.ring, input, output, deadline)
        })
    }

    fn check_peer(&self, op: &'static str, peer: usize, is_send: bool) -> Result<(), Error> {
        let (rank, size) = (self.ring.rank(), self.ring.size());
        let side = if is_send {
            schedule::send_side(rank, size, peer)
        } else {
            schedule::recv_side(rank, size, peer)
        };
        if side.is_none() {
            return Err(self.invalid(
                op,
                format!(
                    "rank {peer} is not a neighbour in a ring of {size}: the ring sends and receives between neighbours only (ranks {} and {}), as MLX's",
                    self.ring.left(),
                    self.ring.right()
                ),
            ));
        }
        Ok(())
    }

    /// [`Communicator::send`] with this crate's error.
    pub fn try_send(&self, dst: usize, data: &[u8]) -> Result<(), Error> {
        self.check_peer("send", dst, true)?;
        self.operate("send", data.len(), |fabric, _, deadline| {
            algorithm::send(fabric, &self.ring, dst, data, deadline)
        })
    }

    /// [`Communicator::recv`] with this crate's error.
    pub fn try_recv(&self, src: usize, data: &mut [u8]) -> Result<(), Error> {
        self.check_peer("recv", src, false)?;
        self.operate("recv", data.len(), |fabric, _, deadline| {
            algorithm::recv(fabric, &self.ring, src, data, deadline)
        })
    }
}

impl<F: Fabric + Send> Communicator for RingCommunicator<F> {
    fn rank(&self) -> usize {
        self.ring.rank()
    }

    fn size(&self) -> usize {
        self.ring.size()
    }

    fn all_reduce(&self, op: AllReduce, dtype: DType, data: &mut [u8]) -> nuvec_core::Result<()> {
        let op = Reduction::try_from(op).map_err(|e| self.invalid("all_reduce", e.to_string()))?;
        Ok(self.try_all_reduce(op, dtype, data)?)
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> nuvec_core::Result<()> {
        Ok(self.try_all_gather(input, output)?)
    }

    fn send(&self, dst: usize, data: &[u8]) -> nuvec_core::Result<()> {
        Ok(self.try_send(dst, data)?)
    }

    fn recv(&self, src: usize, data: &mut [u8]) -> nuvec_core::Result<()> {
        Ok(self.try_recv(src, data)?)
    }
}
