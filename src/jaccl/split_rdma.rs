//! `split` for JACCL over the RDMA fabric: new queue pairs on the same devices.
//!
//! Every pair of a mesh is cabled, so a sub-group of a mesh is a mesh of the same cables: each
//! member opens one new queue pair to each other member, on the device its device file names
//! for that member. A ring's sub-group must be a ring of the job's cables
//! ([`check_cables`]): each member opens C queue pairs to its sub-group's left neighbour and
//! C to its right one (MLX's order and numbering), on the devices of the cable to that
//! neighbour. The members exchange the queue pairs' details ([`Destination`]s, in MLX's
//! side-channel encoding) through the parent group instead of the side channel, bring them up
//! as a job's, and end with a barrier through the parent (MLX's rule: no RDMA traffic before
//! every queue pair is ready).

use std::sync::Arc;
use std::time::Duration;

use super::config::Topology;
use super::rdma::{RdmaFabric, Side, destination, remote, ring_channel};
use super::side_channel::Destination;
use super::split::check_cables;
use crate::collective::split::{Exchange, Plan, Splitter, SubFabric};
use crate::config::log::Log;
use crate::config::options::{DEFAULT_SPIN, Spin};
use crate::error::Error;
use crate::fabric::{Channel, Watch};
use crate::transport::rdma::{self as transport, Qp};

/// How JACCL over RDMA makes a sub-group's fabric.
#[derive(Clone, Debug)]
pub(crate) struct RdmaCables {
    /// The job's cabling.
    topology: Topology,
    /// This rank's devices toward each job rank (empty: no cable), cable c the c-th.
    devices: Vec<Vec<String>>,
    /// The job rank of each rank of this group.
    job_ranks: Vec<usize>,
    log: Log,
    /// The parent's wait policy.
    spin: Spin,
    /// The parent's progress timeout (`JACCL_PROGRESS_TIMEOUT_S`), if any.
    progress: Option<Duration>,
}

impl RdmaCables {
    /// The splitter of a whole JACCL job cabled as `topology` whose rank reaches job rank p
    /// on `devices[p]`.
    pub(crate) fn new(topology: Topology, devices: Vec<Vec<String>>, log: Log) -> Self {
        Self {
            topology,
            job_ranks: (0..devices.len()).collect(),
            devices,
            log,
            spin: Spin::Adaptive(DEFAULT_SPIN),
            progress: None,
        }
    }

    /// Gives a sub-group's queue pairs the parent's wait policy and progress timeout, as the
    /// job's get them from its options.
    pub(crate) fn with_waits(mut self, spin: Spin, progress: Option<Duration>) -> Self {
        self.spin = spin;
        self.progress = progress;
        self
    }

    /// Cable `c`'s device toward job rank `j`.
    fn device(&self, j: usize, c: usize) -> Result<String, String> {
        self.devices
            .get(j)
            .and_then(|d| d.get(c))
            .cloned()
            .ok_or_else(|| format!("the device file names no device {c} toward job rank {j}"))
    }

    /// As [`open`](Self::open) for a ring of `wires` cables: C queue pairs to the left
    /// neighbour, then C to the right one; their details in that order.
    fn open_ring(
        &self,
        plan: &Plan,
        job: &[usize],
        wires: usize,
    ) -> Result<(RdmaFabric, Vec<u8>), String> {
        let verbs = transport::verbs().map_err(|e| format!("no RDMA device is available: {e}"))?;
        let (i, k) = (plan.rank(), plan.size());
        let mut fabric = RdmaFabric::new(i, k);
        fabric.set_log(self.log);
        let mut mine = Vec::with_capacity(2 * wires * Destination::BYTES);
        for (side, j) in [
            (Side::Left, job[(i + k - 1) % k]),
            (Side::Right, job[(i + 1) % k]),
        ] {
            for w in 0..wires {
                let name = self.device(j, w)?;
                let channel = ring_channel(i, k, wires, side, w);
                let what = format!(
                    "device {name} (sub-group queue pair to job rank {j}, wire {w}, link {})",
                    channel.link
                );
                let qp = Qp::open(verbs, &name, channel, what.clone())
                    .map_err(|e| format!("{what}: {e}"))?;
                mine.extend_from_slice(
                    &destination(&qp.local)
                        .map_err(|e| format!("{what}: {e}"))?
                        .encode(),
                );
                fabric.add(qp);
            }
        }
        Ok((fabric, mine))
    }

    /// This rank's queue pairs to every other member of `plan` (job ranks `job`), and their
    /// details in member order (a placeholder for itself).
    fn open(&self, plan: &Plan, job: &[usize]) -> Result<(RdmaFabric, Vec<u8>), String> {
        let verbs = transport::verbs().map_err(|e| format!("no RDMA device is available: {e}"))?;
        let mut fabric = RdmaFabric::new(plan.rank(), plan.size());
        fabric.set_log(self.log);
        let mut mine = Vec::with_capacity(plan.size() * Destination::BYTES);
        for (peer, &j) in job.iter().enumerate() {
            if peer == plan.rank() {
                let placeholder = Destination {
                    local_id: -1,
                    ..Destination::default()
                };
                mine.extend_from_slice(&placeholder.encode());
                continue;
            }
            let name = self.device(j, 0)?;
            let what = format!("device {name} (sub-group queue pair to job rank {j})");
            let qp = Qp::open(verbs, &name, Channel::new(peer, 0), what.clone())
                .map_err(|e| format!("{what}: {e}"))?;
            mine.extend_from_slice(
                &destination(&qp.local)
                    .map_err(|e| format!("{what}: {e}"))?
                    .encode(),
            );
            fabric.add(qp);
        }
        Ok((fabric, mine))
    }
}

impl Splitter<RdmaFabric> for RdmaCables {
    fn sub_fabric(
        &self,
        plan: &Plan,
        exchange: &mut Exchange<'_>,
        _timeout: Duration,
    ) -> Result<Option<SubFabric<RdmaFabric>>, Error> {
        let me = plan.members()[plan.rank()];
        let fail = |what: String| Error::Connect {
            rank: me,
            what: format!("jaccl: rdma: split: {what}"),
        };
        // Every parent rank makes the same two exchanges (details, barrier), whatever happens.
        if plan.size() == 1 {
            exchange(&[])?;
            exchange(&[])?;
            return Ok(None);
        }
        let job: Vec<usize> = plan
            .members()
            .iter()
            .map(|&m| self.job_ranks.get(m).copied().unwrap_or(m))
            .collect();
        let wires = match self.topology {
            Topology::Mesh { .. } => None,
            Topology::Ring { wires } => Some(wires),
        };
        if let Err(e) = check_cables(self.topology, self.devices.len(), me, plan.color(), &job) {
            exchange(&[])?;
            exchange(&[])?;
            return Err(e);
        }
        let opened = match wires {
            None => self.open(plan, &job),
            Some(wires) => self.open_ring(plan, &job, wires),
        };
        let mine = opened.as_ref().map(|(_, d)| d.clone()).unwrap_or_default();
        let all = exchange(&mine)?;
        let (i, k) = (plan.rank(), plan.size());
        let brought_up = opened.map_err(&fail).and_then(|(mut fabric, _)| {
            let expected = match wires {
                None => k * Destination::BYTES,
                Some(wires) => 2 * wires * Destination::BYTES,
            };
            for (n, qp) in fabric.queue_pairs_mut().iter_mut().enumerate() {
                let peer = qp.channel.peer;
                let member = plan.members()[peer];
                let bytes = all
                    .get(member)
                    .filter(|b| b.len() == expected)
                    .ok_or_else(|| {
                        fail(format!(
                            "rank {member} of the parent sent no queue pair details (it could \
                         not open its queue pairs)"
                        ))
                    })?;
                // The far end: in a mesh, the peer's queue pair to this rank; in a ring, my
                // left queue pair w meets the left neighbour's right one w, and the other way.
                let at = match wires {
                    None => i,
                    Some(wires) if n < wires => wires + n,
                    Some(wires) => n - wires,
                } * Destination::BYTES;
                let theirs = Destination::decode(&bytes[at..at + Destination::BYTES])?;
                let remote =
                    remote(peer, &theirs).map_err(|e| fail(format!("{}: {e}", qp.what)))?;
                qp.connect(&remote)
                    .map_err(|e| fail(format!("{}: {e}", qp.what)))?;
            }
            Ok(fabric)
        });
        // The barrier: nobody sends before every queue pair of the sub-group is ready.
        exchange(&[])?;
        let mut fabric = brought_up?;
        // No side channel of its own: a stuck peer is found by the progress timeout.
        fabric.set_watch(Watch::new(None, self.progress));
        fabric.set_wait(self.spin);
        fabric.set_log(self.log);
        fabric.start_clock();
        Ok(Some(SubFabric {
            fabric,
            splitter: Arc::new(Self {
                job_ranks: job,
                ..self.clone()
            }),
            log: self.log,
        }))
    }
}
