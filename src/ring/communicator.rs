//! The ring as a `nuvec_core` [`Communicator`](nuvec_core::distributed::Communicator): MLX's ring algorithms over the communicator
//! core ([`Core`]): argument checks before any byte moves, one deadline per operation,
//! sequence numbers, and a sticky failure.

use std::sync::Arc;
use std::time::Duration;

use nuvec_core::DType;

use super::checked::{self, Headers};
use super::fingerprint::{Fingerprint, Op, Schedule};
use super::{RingTopology, algorithm, relay, schedule};
use crate::collective::checks::{self, communicator_over_try, lifecycle_of_core};
use crate::collective::core::Core;
use crate::collective::record::Call;
use crate::collective::reduce::{Reducer, Reduction};
use crate::collective::split::Splitter;
use crate::config::options::Wire;
use crate::error::Error;
use crate::fabric::Fabric;

/// MLX's ring over a fabric, as a `nuvec_core` communicator.
///
/// Built by [`init_with`](crate::init_with) over TCP, or over the simulator by
/// `nuvec-fabric-sim`; wrap it in `nuvec_core::distributed::Group::new(Arc::new(..))`.
pub struct RingCommunicator<F: Fabric> {
    ring: RingTopology,
    core: Core<F, RingState>,
    /// How its fabric makes a sub-group's (`split`); `None`: it cannot.
    splitter: Option<Arc<dyn Splitter<F>>>,
    /// The wire every rank of the ring agreed on.
    wire: Wire,
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

impl<F: Fabric> RingCommunicator<F> {
    /// The ring over `fabric`, whose channels must be numbered as
    /// [`Wiring::ring`](crate::fabric::Wiring::ring) with `conns` links per neighbour; every
    /// operation must finish within `timeout`.
    ///
    /// # Panics
    /// If the fabric does not have `conns` links to each neighbour.
    pub fn new(fabric: F, conns: usize, timeout: Duration) -> Self {
        let ring = RingTopology::over(&fabric, conns, "ring");
        Self {
            ring,
            core: Core::new(ring.rank(), fabric, RingState::new(), timeout),
            splitter: None,
            wire: Wire::Mlx,
        }
    }

    /// Speaks `wire` (every rank of the ring must speak the same; [`new`](Self::new) speaks
    /// MLX's).
    pub fn with_wire(mut self, wire: Wire) -> Self {
        self.wire = wire;
        // A rank that failed on the nuvec wire closes its links at once, so that its peers fail
        // too instead of waiting for bytes it will never send (see `checked`).
        self.core.set_close_on_failure(wire == Wire::Nuvec);
        self
    }

    /// The wire this ring speaks.
    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// This rank's place in the ring.
    pub fn topology(&self) -> RingTopology {
        self.ring
    }

    lifecycle_of_core!(RingState);

    /// The number of ranks.
    fn size(&self) -> usize {
        self.ring.size()
    }

    /// [`Communicator::all_reduce`](nuvec_core::distributed::Communicator::all_reduce) with this crate's error.
    pub fn try_all_reduce(
        &self,
        op: Reduction,
        dtype: DType,
        data: &mut [u8],
    ) -> Result<(), Error> {
        let name = op.collective();
        let len = data.len();
        let reducer = checks::reducer(name, op, dtype, len, Reducer::new, |op, what| {
            self.invalid(op, what)
        })?;
        let ring = &self.ring;
        let call = Call {
            dtype: Some(dtype),
            ..Call::new(name, len)
        };
        self.operate_call(call, |fabric, state, deadline, seq| {
            if ring.size() < 2 {
                return Ok(());
            }
            let RingState { scratch, headers } = state;
            if self.wire == Wire::Mlx {
                return algorithm::all_reduce(fabric, ring, reducer, data, scratch, None, deadline);
            }
            let relayed = relay::relays(true, len, ring.size());
            let schedule = if relayed {
                Schedule::Relay
            } else {
                let s = reducer.element_size();
                let plan = schedule::all_reduce_plan(len / s, s, ring.size(), ring.conns());
                checked::ring_schedule(ring.size(), &plan.parts)
            };
            let ours = collective(ring, seq, Op::reduction(op), Some(dtype), len, schedule);
            if relayed {
                relay::all_reduce(
                    fabric, ring, reducer, data, scratch, headers, &ours, deadline,
                )
            } else {
                let mut headers = Headers::collective(ring, ours);
                let headers = Some(&mut headers);
                algorithm::all_reduce(fabric, ring, reducer, data, scratch, headers, deadline)
            }
        })
    }

    /// [`Communicator::all_gather`](nuvec_core::distributed::Communicator::all_gather) with this crate's error.
    pub fn try_all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<(), Error> {
        self.gather(Op::AllGather, input, output)
    }

    /// The all-gather by which `split` exchanges every rank's color and key: on the nuvec wire
    /// its fingerprint says `split`, so a rank that splits while another gathers is caught.
    fn try_split_exchange(&self, input: &[u8], output: &mut [u8]) -> Result<(), Error> {
        self.gather(Op::Split, input, output)
    }

    /// An all-gather that the nuvec wire names `op`.
    fn gather(&self, op: Op, input: &[u8], output: &mut [u8]) -> Result<(), Error> {
        checks::one_part_per_rank(
            "all_gather",
            "the output",
            output.len(),
            input.len(),
            self.ring.size(),
            |op, what| self.invalid(op, what),
        )?;
        let ring = &self.ring;
        let name = op.name();
        self.operate(name, input.len(), |fabric, state, deadline, seq| {
            if self.wire == Wire::Mlx || ring.size() < 2 {
                return algorithm::all_gather(fabric, ring, input, output, None, deadline);
            }
            let relayed = relay::relays(false, input.len(), ring.size());
            let schedule = if relayed {
                Schedule::Relay
            } else {
                let parts = schedule::all_gather_plan(input.len(), ring.conns());
                checked::ring_schedule(ring.size(), &parts)
            };
            let ours = collective(ring, seq, op, None, input.len(), schedule);
            if relayed {
                relay::all_gather(
                    fabric,
                    ring,
                    input,
                    output,
                    &mut state.headers,
                    &ours,
                    deadline,
                )
            } else {
                let mut headers = Headers::collective(ring, ours);
                algorithm::all_gather(fabric, ring, input, output, Some(&mut headers), deadline)
            }
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

    /// [`Communicator::send`](nuvec_core::distributed::Communicator::send) with this crate's error.
    pub fn try_send(&self, dst: usize, data: &[u8]) -> Result<(), Error> {
        self.check_peer("send", dst, true)?;
        let ring = &self.ring;
        let call = Call {
            peer: Some(dst),
            ..Call::new("send", data.len())
        };
        self.operate_call(call, |fabric, _, deadline, seq| {
            if self.wire == Wire::Mlx {
                return algorithm::send(fabric, ring, dst, data, None, deadline);
            }
            let ours = point_to_point(ring, seq, Op::Send, dst, data.len());
            let side = schedule::send_side(ring.rank(), ring.size(), dst);
            let mut headers = side.map(|side| Headers::send(ring, side, ours));
            algorithm::send(fabric, ring, dst, data, headers.as_mut(), deadline)
        })
    }

    /// [`Communicator::recv`](nuvec_core::distributed::Communicator::recv) with this crate's error.
    pub fn try_recv(&self, src: usize, data: &mut [u8]) -> Result<(), Error> {
        self.check_peer("recv", src, false)?;
        let ring = &self.ring;
        let call = Call {
            peer: Some(src),
            ..Call::new("recv", data.len())
        };
        self.operate_call(call, |fabric, _, deadline, seq| {
            if self.wire == Wire::Mlx {
                return algorithm::recv(fabric, ring, src, data, None, deadline);
            }
            let ours = point_to_point(ring, seq, Op::Recv, src, data.len());
            let side = schedule::recv_side(ring.rank(), ring.size(), src);
            let mut headers = side.map(|side| Headers::recv(ring, side, src, ours));
            algorithm::recv(fabric, ring, src, data, headers.as_mut(), deadline)
        })
    }
}

communicator_over_try!(RingCommunicator);

/// What a ring keeps between operations, under the communicator's lock.
pub(crate) struct RingState {
    /// MLX's zero-padded copy on its small path; the relay's other vectors.
    scratch: Vec<u8>,
    /// The relay's headers, one per rank.
    headers: Vec<u8>,
}

impl RingState {
    fn new() -> Self {
        Self {
            scratch: Vec::new(),
            headers: Vec::new(),
        }
    }
}

/// The fingerprint of this rank's collective number `seq`, `op` of `bytes` per rank, run by
/// `schedule`. The numbers are the communicator core's, the same that errors and
/// the flight record show (see [`fingerprint`](super::fingerprint)).
fn collective(
    ring: &RingTopology,
    seq: u64,
    op: Op,
    dtype: Option<DType>,
    bytes: usize,
    schedule: Schedule,
) -> Fingerprint {
    Fingerprint {
        op,
        dtype,
        seq,
        bytes: bytes as u64,
        origin: ring.rank(),
        peer: None,
        schedule,
    }
}

/// The fingerprint of this rank's `op` (send or receive) number `seq` with `peer`, of
/// `bytes`.
fn point_to_point(ring: &RingTopology, seq: u64, op: Op, peer: usize, bytes: usize) -> Fingerprint {
    Fingerprint {
        op,
        dtype: None,
        seq,
        bytes: bytes as u64,
        origin: ring.rank(),
        peer: Some(peer),
        schedule: Schedule::Ring,
    }
}
