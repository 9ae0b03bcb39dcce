//! Local ranks: the environment of a loopback job of each backend (a hostfile for the ring;
//! a device file and a coordinator for JACCL), with copies of this program, given the same
//! command line, started as its ranks by the workspace's one local launcher (`nuvec-local`).

use std::time::Duration;

use nuvec_local::Job;

use crate::Result;
use crate::args::{Args, Backend};

/// The bound of a whole local job: the default sizes on 4 ranks of a loaded machine take
/// minutes, and a stuck operation fails far sooner on its own deadline (`--timeout`).
const JOB_TIMEOUT: Duration = Duration::from_secs(3600);

/// Starts `args.ranks` copies of this program as the ranks of a loopback job of
/// `args.backend` (a hostfile for the ring; a device file and a coordinator for JACCL),
/// forwards the command line, and waits; kills the others when one fails. Rank 0's output is
/// this process's; a failing rank's is in the error.
pub(crate) fn launch(args: &Args) -> Result<()> {
    let job = Job::this_program("bench-allreduce", args.ranks)?.timeout(JOB_TIMEOUT);
    let job = match args.backend {
        Backend::Ring => job.ring(args.conns)?,
        Backend::JacclMesh | Backend::JacclRing => {
            let ring = args.backend == Backend::JacclRing;
            let devices = job.dir().join("devices.json");
            std::fs::write(
                &devices,
                device_file(args.ranks, ring.then_some(args.conns)),
            )?;
            // Rank 0 listens there for the side channel (with SO_REUSEADDR).
            let job = job
                .env("MLX_IBV_DEVICES", &devices)
                .env("MLX_JACCL_COORDINATOR", nuvec_local::free_address()?);
            if ring {
                job.env("MLX_JACCL_RING", "1")
            } else {
                job
            }
        }
    };
    job.run_ok()?;
    Ok(())
}

/// A JACCL device file (`MLX_IBV_DEVICES`) for `ranks` local ranks: a mesh, one device
/// between every pair, or with `Some(cables)` a ring of that many devices between neighbours.
/// Over TCP no device is opened, so the names only have to agree between the two ends.
pub(crate) fn device_file(ranks: usize, ring: Option<usize>) -> String {
    let cable = |a: usize, b: usize, c: usize| {
        serde_json::Value::from(format!("loop{}to{}.{c}", a.min(b), a.max(b)))
    };
    let entry = |a: usize, b: usize| {
        let next = |x: usize| (x + 1) % ranks;
        match ring {
            _ if a == b => serde_json::Value::Null,
            None => cable(a, b, 0),
            Some(cables) if next(a) == b || next(b) == a => {
                (0..cables).map(|c| cable(a, b, c)).collect()
            }
            Some(_) => serde_json::Value::Null,
        }
    };
    let matrix: serde_json::Value = (0..ranks)
        .map(|a| {
            (0..ranks)
                .map(|b| entry(a, b))
                .collect::<serde_json::Value>()
        })
        .collect();
    matrix.to_string()
}
