//! The ring as a `nuvec_core` [`Communicator`](nuvec_core::distributed::Communicator): MLX's ring algorithms over the communicator
//! core ([`Core`]): argument checks before any byte moves, one deadline per operation,
//! sequence numbers, and a sticky failure.

use std::sync::Arc;
use std::time::Duration;

use nuvec_core::DType;

use super::{RingTopology, algorithm, schedule};
use crate::collective::checks::{self, communicator_over_try, lifecycle_of_core};
use crate::collective::core::Core;
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
    core: Core<F, Vec<u8>>,
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
            core: Core::new(ring.rank(), fabric, Vec::new(), timeout),
            splitter: None,
            wire: Wire::Mlx,
        }
    }

    /// Speaks `wire` (every rank of the ring must speak the same; [`new`](Self::new) speaks
    /// MLX's).
    pub fn with_wire(mut self, wire: Wire) -> Self {
        self.wire = wire;
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

    lifecycle_of_core!(Vec<u8>);

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
        self.operate(name, len, |fabric, scratch, deadline| {
            if self.ring.size() < 2 {
                return Ok(());
            }
            algorithm::all_reduce(fabric, &self.ring, reducer, data, scratch, deadline)
        })
    }

    /// [`Communicator::all_gather`](nuvec_core::distributed::Communicator::all_gather) with this crate's error.
    pub fn try_all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<(), Error> {
        checks::one_part_per_rank(
            "all_gather",
            "the output",
            output.len(),
            input.len(),
            self.ring.size(),
            |op, what| self.invalid(op, what),
        )?;
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

    /// [`Communicator::send`](nuvec_core::distributed::Communicator::send) with this crate's error.
    pub fn try_send(&self, dst: usize, data: &[u8]) -> Result<(), Error> {
        self.check_peer("send", dst, true)?;
        self.operate("send", data.len(), |fabric, _, deadline| {
            algorithm::send(fabric, &self.ring, dst, data, deadline)
        })
    }

    /// [`Communicator::recv`](nuvec_core::distributed::Communicator::recv) with this crate's error.
    pub fn try_recv(&self, src: usize, data: &mut [u8]) -> Result<(), Error> {
        self.check_peer("recv", src, false)?;
        self.operate("recv", data.len(), |fabric, _, deadline| {
            algorithm::recv(fabric, &self.ring, src, data, deadline)
        })
    }
}

communicator_over_try!(RingCommunicator);
