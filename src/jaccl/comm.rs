//! JACCL as a `nuvec_core` [`Communicator`](nuvec_core::distributed::Communicator): the mesh or ring algorithms over any message
//! fabric (RDMA queue pairs, the simulator's UC channels) or stream fabric (TCP, one
//! connection per cable), with the same guarantees as the ring's communicator: arguments
//! checked before any byte moves, one deadline per operation, sequence numbers, a sticky
//! failure.
//!
//! MLX's JACCL has no deadline at all: a rank whose peer died spins forever (MLX issues #3910
//! and #4278). Here every operation fails by its deadline with an error naming the peer it was
//! waiting for, and the group stays failed: UC messages carry no headers, so after an
//! operation breaks off in the middle nothing could say which message belongs to which
//! operation.

use std::sync::Arc;
use std::time::Duration;

use nuvec_core::DType;

use super::frames::FrameRule;
use super::mesh::{self, MeshTopology};
use super::ring;
use super::wire::Scratch;
use crate::collective::checks::{self, communicator_over_try, lifecycle_of_core};
use crate::collective::core::Core;
use crate::collective::record::Call;
use crate::collective::reduce::{Reducer, Reduction};
use crate::collective::split::Splitter;
use crate::error::Error;
use crate::fabric::Fabric;
use crate::ring::RingTopology;

/// How the ranks of a JACCL group are cabled, with this rank's place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// A full mesh: one queue pair per wire to every peer (wire w: channel link w).
    Mesh(MeshTopology),
    /// A ring: C queue pairs to each neighbour, numbered as the TCP ring's connections.
    Ring(RingTopology),
}

impl Layout {
    /// This rank.
    pub fn rank(&self) -> usize {
        match self {
            Layout::Mesh(m) => m.rank(),
            Layout::Ring(r) => r.rank(),
        }
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        match self {
            Layout::Mesh(m) => m.size(),
            Layout::Ring(r) => r.size(),
        }
    }
}

/// MLX's JACCL algorithms over a fabric, as a `nuvec_core` communicator; wrap it in
/// `nuvec_core::distributed::Group::new(Arc::new(..))`.
pub struct JacclCommunicator<F: Fabric> {
    layout: Layout,
    rule: FrameRule,
    core: Core<F, Scratch>,
    /// How its fabric makes a sub-group's (`split`); `None`: it cannot.
    splitter: Option<Arc<dyn Splitter<F>>>,
}

impl<F: Fabric> std::fmt::Debug for JacclCommunicator<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "JacclCommunicator({:?}, {:?} frames)",
            self.layout, self.rule
        )
    }
}

impl<F: Fabric> JacclCommunicator<F> {
    /// The mesh over `fabric`, which must have the same number of channels (links 0 to
    /// W − 1, one per wire) to every peer, and the same W on every rank, as
    /// [`Wiring::mesh`](crate::fabric::Wiring::mesh) and the JACCL fabrics give them
    /// (W is the configuration's least number of cables over all pairs,
    /// [`Topology::Mesh`](super::Topology::Mesh)).
    ///
    /// # Panics
    /// If a peer has no channel, or the peers do not all have the same number.
    pub fn mesh(fabric: F, rule: FrameRule, timeout: Duration) -> Self {
        let mesh = MeshTopology::new(fabric.rank(), fabric.size(), rule);
        let links: Vec<usize> = mesh.peers().map(|p| fabric.links(p)).collect();
        for (p, &n) in mesh.peers().zip(&links) {
            assert!(n >= 1, "jaccl mesh: no channel to rank {p}");
            assert_eq!(
                n, links[0],
                "jaccl mesh: rank {p} has {n} links, the first peer {}",
                links[0]
            );
        }
        let mesh = mesh.with_wires(links.first().copied().unwrap_or(1));
        Self::with(fabric, Layout::Mesh(mesh), rule, timeout)
    }

    /// The ring over `fabric`, whose channels must be numbered as
    /// [`Wiring::ring`](crate::fabric::Wiring::ring) with `wires` links per neighbour.
    ///
    /// # Panics
    /// If the fabric does not have `wires` links to each neighbour.
    pub fn ring(fabric: F, wires: usize, rule: FrameRule, timeout: Duration) -> Self {
        let ring = RingTopology::over(&fabric, wires, "jaccl ring");
        Self::with(fabric, Layout::Ring(ring), rule, timeout)
    }

    fn with(fabric: F, layout: Layout, rule: FrameRule, timeout: Duration) -> Self {
        Self {
            layout,
            rule,
            core: Core::new(layout.rank(), fabric, Scratch::default(), timeout),
            splitter: None,
        }
    }

    /// The topology and this rank's place in it.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The frame rule every rank of the job uses.
    pub fn rule(&self) -> FrameRule {
        self.rule
    }

    lifecycle_of_core!(Scratch);

    /// The number of ranks.
    fn size(&self) -> usize {
        self.layout.size()
    }

    fn reducer(
        &self,
        name: &'static str,
        op: Reduction,
        dtype: DType,
        len: usize,
    ) -> Result<Reducer, Error> {
        checks::reducer(name, op, dtype, len, Reducer::jaccl, |op, what| {
            self.invalid(op, what)
        })
    }

    /// [`Communicator::all_reduce`](nuvec_core::distributed::Communicator::all_reduce) with this crate's error.
    pub fn try_all_reduce(
        &self,
        op: Reduction,
        dtype: DType,
        data: &mut [u8],
    ) -> Result<(), Error> {
        let name = op.collective();
        let reducer = self.reducer(name, op, dtype, data.len())?;
        let rule = self.rule;
        let call = Call {
            dtype: Some(dtype),
            ..Call::new(name, data.len())
        };
        self.operate_call(call, |fabric, scratch, deadline, _| match &self.layout {
            Layout::Mesh(m) => mesh::all_reduce(fabric, m, reducer, data, scratch, deadline),
            Layout::Ring(r) => ring::all_reduce(fabric, r, rule, reducer, data, scratch, deadline),
        })
    }

    /// The all-gather by which `split` exchanges every rank's color and key: JACCL's wire is
    /// MLX's, so it is an ordinary all-gather.
    fn try_split_exchange(&self, input: &[u8], output: &mut [u8]) -> Result<(), Error> {
        self.try_all_gather(input, output)
    }

    /// [`Communicator::all_gather`](nuvec_core::distributed::Communicator::all_gather) with this crate's error.
    pub fn try_all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<(), Error> {
        checks::one_part_per_rank(
            "all_gather",
            "the output",
            output.len(),
            input.len(),
            self.layout.size(),
            |op, what| self.invalid(op, what),
        )?;
        let rule = self.rule;
        self.operate(
            "all_gather",
            input.len(),
            |fabric, scratch, deadline, _| match &self.layout {
                Layout::Mesh(m) => mesh::all_gather(fabric, m, input, output, scratch, deadline),
                Layout::Ring(r) => {
                    ring::all_gather(fabric, r, rule, input, output, scratch, deadline)
                }
            },
        )
    }

    /// MLX's `sum_scatter` (with any reduction): `input` holds R shards of `output.len()`
    /// bytes, and rank r's `output` becomes the reduction of shard r over every rank: on the
    /// mesh rank r's own shard, then the peers' in rank order (one of MLX's results); on the
    /// ring in MLX's ring order (see [`ring`]).
    pub fn try_sum_scatter(
        &self,
        op: Reduction,
        dtype: DType,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<(), Error> {
        let name = "sum_scatter";
        let reducer = self.reducer(name, op, dtype, output.len())?;
        checks::one_part_per_rank(
            name,
            "the input",
            input.len(),
            output.len(),
            self.layout.size(),
            |op, what| self.invalid(op, what),
        )?;
        let rule = self.rule;
        self.operate(
            name,
            output.len(),
            |fabric, scratch, deadline, _| match &self.layout {
                Layout::Mesh(m) => {
                    mesh::sum_scatter(fabric, m, reducer, input, output, scratch, deadline)
                }
                Layout::Ring(r) => {
                    ring::sum_scatter(fabric, r, rule, reducer, input, output, scratch, deadline)
                }
            },
        )
    }

    fn check_peer(&self, op: &'static str, peer: usize, receive: bool) -> Result<(), Error> {
        let (rank, size) = (self.layout.rank(), self.layout.size());
        let ok = match &self.layout {
            Layout::Mesh(_) => peer < size && peer != rank,
            Layout::Ring(r) => ring::side(r, peer, receive).is_some(),
        };
        if ok {
            return Ok(());
        }
        let what = match &self.layout {
            Layout::Mesh(_) => format!(
                "rank {peer} is not another rank of this mesh of {size} (ranks 0..{size}, not {rank})"
            ),
            Layout::Ring(r) => format!(
                "rank {peer} is not a neighbour in a JACCL ring of {size}: it sends and receives between neighbours only (ranks {} and {}), as MLX's",
                r.left(),
                r.right()
            ),
        };
        Err(self.invalid(op, what))
    }

    /// [`Communicator::send`](nuvec_core::distributed::Communicator::send) with this crate's error.
    pub fn try_send(&self, dst: usize, data: &[u8]) -> Result<(), Error> {
        self.check_peer("send", dst, false)?;
        let rule = self.rule;
        let call = Call {
            peer: Some(dst),
            ..Call::new("send", data.len())
        };
        self.operate_call(call, |fabric, scratch, deadline, _| match &self.layout {
            Layout::Mesh(m) => mesh::send(fabric, m, dst, data, scratch, deadline),
            Layout::Ring(r) => ring::send(fabric, r, rule, dst, data, scratch, deadline),
        })
    }

    /// [`Communicator::recv`](nuvec_core::distributed::Communicator::recv) with this crate's error.
    pub fn try_recv(&self, src: usize, data: &mut [u8]) -> Result<(), Error> {
        self.check_peer("recv", src, true)?;
        let rule = self.rule;
        let call = Call {
            peer: Some(src),
            ..Call::new("recv", data.len())
        };
        self.operate_call(call, |fabric, _, deadline, _| match &self.layout {
            Layout::Mesh(m) => mesh::recv(fabric, m, src, data, deadline),
            Layout::Ring(r) => ring::recv(fabric, r, rule, src, data, deadline),
        })
    }
}

communicator_over_try!(JacclCommunicator);
