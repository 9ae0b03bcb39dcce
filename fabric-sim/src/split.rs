//! `split` in the simulator: a sub-group's fabric is new simulated connections between its
//! members' ranks, joined to the job's wiring when the first member asks for them.
//!
//! The members of one sub-group find the same connections by a key every member computes
//! alike: the job ranks of the members in group order, and how many times this rank has asked
//! for a group of exactly those members (a split is a collective, called in the same order on
//! every member). The first member to ask joins the connections ([`World::join`]); the others
//! find them. Everything happens under the world's lock while the asking rank holds the turn,
//! so the new channels are as deterministic as the job's own: the same seed, the same trace.
//! The new wires are ordinary wires of the world, with its fragmentation, latency, windows and
//! faults; a rank that crashes closes them with the rest.

use std::sync::Arc;
use std::time::Duration;

use nuvec_distributed::Error;
use nuvec_distributed::fabric::Wiring;
use nuvec_distributed::internals::{Exchange, Plan, Splitter, SubFabric};
use nuvec_distributed::jaccl::{Topology, check_cables};

use crate::fabric::{Handles, SimFabric, View};
use crate::world::World;

/// How a sub-group of a simulated job is wired: MLX's ring with `links` connections per
/// neighbour, or a full mesh with `links` between every pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// [`Wiring::ring`].
    Ring {
        /// Connections per neighbour.
        links: usize,
    },
    /// [`Wiring::mesh`].
    Mesh {
        /// Connections per pair.
        links: usize,
    },
    /// JACCL's ring: [`Wiring::ring`] with `wires` per neighbour, for sub-groups that are rings
    /// of the job's cables only ([`check_cables`]).
    JacclRing {
        /// Cables per neighbour.
        wires: usize,
    },
}

impl Shape {
    fn wiring(self, size: usize) -> Wiring {
        match self {
            Shape::Ring { links } | Shape::JacclRing { wires: links } => Wiring::ring(size, links),
            Shape::Mesh { links } => Wiring::mesh(size, links),
        }
    }
}

/// The channels of every member of one sub-group: `[member][peer][link]`, the job link.
pub(crate) type GroupLinks = Vec<Vec<Vec<usize>>>;

impl World {
    /// The job links of `job_rank`'s channels in the sub-group of `members` (job ranks, in
    /// group order) wired as `shape`: joined now if this is the first member to ask for this
    /// occurrence of the group, else found.
    pub(crate) fn sub_group(
        &mut self,
        job_rank: usize,
        members: &[usize],
        shape: Shape,
    ) -> Vec<Vec<usize>> {
        let seen = self
            .split_seen
            .entry((job_rank, members.to_vec()))
            .or_insert(0);
        let key = (members.to_vec(), *seen);
        *seen += 1;
        if !self.splits.contains_key(&key) {
            let wiring = shape.wiring(members.len());
            let k = members.len();
            let mut links: GroupLinks = (0..k)
                .map(|i| (0..k).map(|j| vec![0; wiring.links(i, j)]).collect())
                .collect();
            for c in wiring.connections() {
                let job = self.join(members[c.opener], members[c.acceptor]);
                links[c.opener][c.acceptor][c.opener_link] = job.opener_link;
                links[c.acceptor][c.opener][c.acceptor_link] = job.acceptor_link;
            }
            self.splits.insert(key.clone(), links);
        }
        let me = members.iter().position(|&m| m == job_rank).unwrap_or(0);
        self.splits[&key][me].clone()
    }
}

/// How a simulated fabric makes a sub-group's: new simulated connections of `shape`.
pub(crate) struct SimSplitter {
    /// The world, parker and channel kind of the rank.
    handles: Handles,
    /// The job rank of each rank of the group.
    members: Vec<usize>,
    shape: Shape,
}

impl SimSplitter {
    /// The splitter of `fabric`'s group, whose sub-groups are wired as `shape`.
    pub(crate) fn new(fabric: &SimFabric, shape: Shape) -> Self {
        Self {
            handles: fabric.handles(),
            members: fabric.job_members(),
            shape,
        }
    }
}

impl std::fmt::Debug for SimSplitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimSplitter({:?} over {:?})", self.shape, self.members)
    }
}

impl Splitter<SimFabric> for SimSplitter {
    fn sub_fabric(
        &self,
        plan: &Plan,
        exchange: &mut Exchange<'_>,
        _timeout: Duration,
    ) -> Result<Option<SubFabric<SimFabric>>, Error> {
        // As a real fabric's: one exchange through the parent, so that every fabric's split is
        // the same collective on the parent.
        exchange(&[])?;
        if plan.size() == 1 {
            return Ok(None);
        }
        let members: Vec<usize> = plan.members().iter().map(|&m| self.members[m]).collect();
        let job_rank = members[plan.rank()];
        if let Shape::JacclRing { wires } = self.shape {
            let job_size = self.handles.shared.lock().size();
            check_cables(
                Topology::Ring { wires },
                job_size,
                job_rank,
                plan.color(),
                &members,
            )?;
        }
        let links = self
            .handles
            .shared
            .lock()
            .sub_group(job_rank, &members, self.shape);
        let fabric = SimFabric::sub(&self.handles, plan.rank(), View { members, links });
        let splitter = SimSplitter::new(&fabric, self.shape);
        Ok(Some(SubFabric::new(fabric, Arc::new(splitter))))
    }
}
