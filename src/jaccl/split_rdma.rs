//! `split` for JACCL's mesh over the RDMA fabric: new queue pairs on the same devices.
//!
//! Every pair of a mesh is cabled, so a sub-group of a mesh is a mesh of the same cables: each
//! member opens one new queue pair to each other member, on the device its device file names
//! for that member, and the members exchange the queue pairs' details
//! ([`Destination`]s, in MLX's side-channel encoding) through the parent group instead of the
//! side channel, bring them up as a job's, and end with a barrier through the parent (MLX's
//! rule: no RDMA traffic before every queue pair is ready). A JACCL ring over RDMA does not
//! split yet (its members say so, after the exchange).

use std::sync::Arc;
use std::time::Duration;

use super::rdma::{RdmaFabric, destination, remote};
use super::side_channel::Destination;
use crate::collective::split::{Exchange, Plan, Splitter, SubFabric};
use crate::config::log::Log;
use crate::error::Error;
use crate::fabric::Channel;
use crate::transport::rdma::{self as transport, Qp};

/// How JACCL's mesh over RDMA makes a sub-group's fabric.
#[derive(Clone, Debug)]
pub(crate) struct RdmaMesh {
    /// This rank's device toward each job rank (`None` for itself).
    devices: Vec<Option<String>>,
    /// The job rank of each rank of this group.
    job_ranks: Vec<usize>,
    log: Log,
}

impl RdmaMesh {
    /// The splitter of a whole JACCL mesh job whose rank reaches job rank p on `devices[p]`.
    pub(crate) fn new(devices: Vec<Option<String>>, log: Log) -> Self {
        Self {
            job_ranks: (0..devices.len()).collect(),
            devices,
            log,
        }
    }

    /// This rank's queue pairs to every other member of `plan` (job ranks `job`), and their
    /// details in member order (a placeholder for itself).
    fn open(&self, plan: &Plan, job: &[usize]) -> Result<(RdmaFabric, Vec<u8>), String> {
        let verbs = transport::verbs().map_err(|e| format!("no RDMA device is available: {e}"))?;
        let mut fabric = RdmaFabric::new(plan.rank(), plan.size());
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
            let name =
                self.devices.get(j).cloned().flatten().ok_or_else(|| {
                    format!("the device file names no device toward job rank {j}")
                })?;
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

impl Splitter<RdmaFabric> for RdmaMesh {
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
        let opened = self.open(plan, &job);
        let mine = opened.as_ref().map(|(_, d)| d.clone()).unwrap_or_default();
        let all = exchange(&mine)?;
        let brought_up = opened.map_err(&fail).and_then(|(mut fabric, _)| {
            for qp in fabric.queue_pairs_mut() {
                let peer = qp.channel.peer;
                let member = plan.members()[peer];
                let bytes = all
                    .get(member)
                    .filter(|b| b.len() == plan.size() * Destination::BYTES)
                    .ok_or_else(|| {
                        fail(format!(
                            "rank {member} of the parent sent no queue pair details (it could \
                             not open its queue pairs)"
                        ))
                    })?;
                let at = plan.rank() * Destination::BYTES;
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
