//! `split` for JACCL: a sub-group runs the parent's algorithm (mesh or ring) over a new
//! fabric among its members, made by the parent fabric's [`Splitter`].
//!
//! The members agree on the sub-group through the parent
//! ([`split_over`](crate::collective::split::split_over)). A JACCL ring can only split into
//! sub-groups whose members are joined by cables in the sub-group's ring order; a mesh can
//! split any way, every pair being cabled.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::options::{DEFAULT_LINK_TIMEOUT, Spin};

use nuvec_core::distributed::Communicator;

use super::comm::{JacclCommunicator, Layout};
use super::config::Topology;
use super::tcp;
use crate::collective::split::{Exchange, Plan, Splitter, SubFabric};
use crate::config::log::Log;
use crate::error::Error;
use crate::fabric::{Fabric, Watch};
use crate::transport::tcp::TcpFabric;

impl<F: Fabric + Send + 'static> JacclCommunicator<F> {
    /// [`Communicator::split`] with this crate's error: the ranks that pass the same `color`
    /// form a new group of the same algorithm, ordered by `key` (negative: the parent rank), ties by
    /// parent rank. A collective on this group.
    pub fn try_split(&self, color: i32, key: i32) -> Result<Arc<dyn Communicator>, Error> {
        self.split_with(color, key, |fabric| match self.layout() {
            Layout::Mesh(_) => JacclCommunicator::mesh(fabric, self.rule(), self.timeout()),
            Layout::Ring(r) => {
                JacclCommunicator::ring(fabric, r.conns(), self.rule(), self.timeout())
            }
        })
    }
}

/// Whether job ranks `a` and `b` of a job of `size` cabled as `topology` share a cable.
fn cabled(topology: Topology, size: usize, a: usize, b: usize) -> bool {
    match topology {
        Topology::Mesh { .. } => a != b,
        Topology::Ring { .. } => a != b && ((a + 1) % size == b || (b + 1) % size == a),
    }
}

/// The first pair of consecutive members of a JACCL ring's sub-group (in its ring order, the
/// last back to the first) that no cable joins, as job ranks.
pub(crate) fn missing_cable(
    topology: Topology,
    job_size: usize,
    members: &[usize],
) -> Option<(usize, usize)> {
    if members.len() < 2 {
        return None;
    }
    (0..members.len())
        .map(|i| (members[i], members[(i + 1) % members.len()]))
        .find(|&(a, b)| !cabled(topology, job_size, a, b))
}

/// That the sub-group of color `color` whose members are job ranks `job` (in its order) can
/// be cabled as a JACCL job cabled as `topology` over `job_size` ranks is: a mesh splits any
/// way; a ring's sub-group must be a ring of the job's cables.
///
/// # Errors
/// `InvalidArgument` of parent rank `rank`, naming the first missing cable.
pub fn check_cables(
    topology: Topology,
    job_size: usize,
    rank: usize,
    color: i32,
    job: &[usize],
) -> Result<(), Error> {
    match missing_cable(topology, job_size, job) {
        None => Ok(()),
        Some((a, b)) => Err(Error::InvalidArgument {
            rank,
            op: "split",
            what: format!(
                "the sub-group of color {color} (job ranks {job:?}, in its ring order) needs a \
                 cable between job ranks {a} and {b}, and JACCL's ring has cables between ring \
                 neighbours only (a mesh splits any way)"
            ),
        }),
    }
}

/// How JACCL over TCP makes a sub-group's fabric: new connections between the members, one
/// per cable of the sub-group's topology (every pair for a mesh, C per neighbour for a ring),
/// rendezvousing through the parent instead of the side channel. A ring's sub-group must be
/// a ring of cables of the job.
#[derive(Clone, Debug)]
pub(crate) struct TcpCables {
    /// The job's cabling.
    topology: Topology,
    job_size: usize,
    /// The job rank of each rank of this group.
    job_ranks: Vec<usize>,
    /// The address this rank listens on.
    ip: IpAddr,
    log: Log,
    spin: Spin,
    /// The parent's link timeout (see [`Options::link_timeout`](crate::Options::link_timeout)).
    link_timeout: Duration,
    /// The parent's progress timeout (`JACCL_PROGRESS_TIMEOUT_S`), if any.
    progress: Option<Duration>,
}

impl TcpCables {
    /// The splitter of a whole JACCL job over TCP cabled as `topology`, whose rank listens on
    /// `ip`.
    pub(crate) fn new(
        topology: Topology,
        job_size: usize,
        ip: IpAddr,
        log: Log,
        spin: Spin,
    ) -> Self {
        Self {
            topology,
            job_size,
            job_ranks: (0..job_size).collect(),
            ip,
            log,
            spin,
            link_timeout: DEFAULT_LINK_TIMEOUT,
            progress: None,
        }
    }

    /// Gives a sub-group's cables the parent's link timeout and progress timeout, as the
    /// job's cables get them from its options.
    pub(crate) fn with_links(mut self, link_timeout: Duration, progress: Option<Duration>) -> Self {
        self.link_timeout = link_timeout;
        self.progress = progress;
        self
    }
}

impl Splitter<TcpFabric> for TcpCables {
    fn sub_fabric(
        &self,
        plan: &Plan,
        exchange: &mut Exchange<'_>,
        timeout: Duration,
    ) -> Result<Option<SubFabric<TcpFabric>>, Error> {
        let me = plan.members[plan.rank];
        let job_ranks: Vec<usize> = plan
            .members
            .iter()
            .map(|&m| self.job_ranks.get(m).copied().unwrap_or(m))
            .collect();
        if plan.size() == 1 {
            exchange(&[])?;
            return Ok(None);
        }
        if let Err(e) = check_cables(self.topology, self.job_size, me, plan.color, &job_ranks) {
            // Take part in the exchange, so that the other sub-groups go on.
            exchange(&[])?;
            return Err(e);
        }
        let size = plan.size();
        let fabric = tcp::connect_over(
            plan.rank,
            size,
            self.topology,
            self.ip,
            |mine| {
                let all = exchange(mine)?;
                let mut out = Vec::with_capacity(size * tcp::ADDRESS);
                for &m in &plan.members {
                    match all.get(m) {
                        Some(bytes) if bytes.len() == tcp::ADDRESS => out.extend_from_slice(bytes),
                        _ => {
                            return Err(Error::Connect {
                                rank: me,
                                what: format!(
                                    "split: rank {m} of the parent sent no listening address for \
                                     the sub-group of color {}",
                                    plan.color
                                ),
                            });
                        }
                    }
                }
                Ok(out)
            },
            timeout,
        )?
        .with_wait(self.spin)
        // No side channel of its own: a sub-group finds a dead peer by its cables' link
        // timeout, and a stuck one by the progress timeout, as the job's cables do.
        .with_watch(Watch::new(None, self.progress))
        .with_link_timeout(self.link_timeout)
        .map_err(|e| Error::Connect {
            rank: me,
            what: format!(
                "split: cannot set the link timeout of the sub-group of color {}'s cables: {e}",
                plan.color
            ),
        })?;
        Ok(Some(SubFabric {
            fabric,
            splitter: Arc::new(Self {
                job_ranks,
                ..self.clone()
            }),
            log: self.log,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_sub_group_over_tcp_cables_gets_the_parents_link_timeout() {
        let limit = Duration::from_secs(4);
        // Two job ranks on loopback, cabled as a mesh, both of color 0.
        let timeouts = crate::collective::split::split_two(
            || {
                TcpCables::new(
                    Topology::Mesh { wires: 1 },
                    2,
                    IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                    Log::off(),
                    Spin::Fixed(Duration::ZERO),
                )
                .with_links(limit, Some(Duration::from_secs(7)))
            },
            |fabric: TcpFabric| fabric.link_settings().0,
        );
        assert_eq!(timeouts, [limit, limit]);
    }

    #[test]
    fn a_ring_sub_group_needs_a_cable_between_every_pair_of_ring_neighbours() {
        let ring = Topology::Ring { wires: 1 };
        assert_eq!(missing_cable(ring, 4, &[0, 1, 2, 3]), None);
        assert_eq!(missing_cable(ring, 4, &[3, 2, 1, 0]), None);
        assert_eq!(missing_cable(ring, 4, &[1, 2]), None);
        assert_eq!(missing_cable(ring, 4, &[3, 0]), None);
        assert_eq!(missing_cable(ring, 4, &[0, 2]), Some((0, 2)));
        assert_eq!(missing_cable(ring, 4, &[0, 1, 3, 2]), Some((1, 3)));
        assert_eq!(missing_cable(Topology::Mesh { wires: 1 }, 4, &[0, 2]), None);
        assert_eq!(missing_cable(ring, 4, &[2]), None);
    }
}
