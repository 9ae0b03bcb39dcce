//! Local ranks: the environment of a loopback job of each backend (a hostfile for the ring;
//! a device file and a coordinator for JACCL), and copies of this program started as its ranks.

use std::ffi::OsString;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nuvec_distributed::hostfile;

use crate::Result;
use crate::args::{Args, Backend};

/// The launch variables of both backends, removed from the local ranks' environment before
/// their own are set (JACCL's `JACCL_*` names would win over the `MLX_*` ones).
pub(crate) const LAUNCH_VARS: [&str; 8] = [
    "MLX_HOSTFILE",
    "MLX_IBV_DEVICES",
    "MLX_JACCL_COORDINATOR",
    "MLX_JACCL_RING",
    "JACCL_RANK",
    "JACCL_IBV_DEVICES",
    "JACCL_COORDINATOR",
    "JACCL_RING",
];

/// Starts `args.ranks` copies of this program as the ranks of a loopback job of
/// `args.backend` (a hostfile for the ring; a device file and a coordinator for JACCL),
/// forwards the command line, and waits; kills the others when one fails.
pub(crate) fn launch(args: &Args) -> Result<()> {
    let path =
        std::env::temp_dir().join(format!("nuvec-bench-allreduce-{}.json", std::process::id()));
    let env: Vec<(&str, OsString)> = match args.backend {
        Backend::Ring => {
            let listeners: Vec<Vec<TcpListener>> = (0..args.ranks)
                .map(|_| {
                    (0..args.conns)
                        .map(|_| TcpListener::bind("127.0.0.1:0"))
                        .collect()
                })
                .collect::<std::io::Result<_>>()?;
            let nodes: Vec<Vec<String>> = listeners
                .iter()
                .map(|row| {
                    row.iter()
                        .map(|l| l.local_addr().map(|a| a.to_string()))
                        .collect()
                })
                .collect::<std::io::Result<_>>()?;
            drop(listeners);
            std::fs::write(&path, hostfile::write(&nodes))?;
            vec![("MLX_HOSTFILE", path.clone().into())]
        }
        Backend::JacclMesh | Backend::JacclRing => {
            let ring = args.backend == Backend::JacclRing;
            std::fs::write(&path, device_file(args.ranks, ring.then_some(args.conns)))?;
            // Rank 0 listens there for the side channel (with SO_REUSEADDR).
            let coordinator = TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
            let mut env = vec![
                ("MLX_IBV_DEVICES", path.clone().into()),
                ("MLX_JACCL_COORDINATOR", coordinator.into()),
            ];
            if ring {
                env.push(("MLX_JACCL_RING", "1".into()));
            }
            env
        }
    };
    let exe = std::env::current_exe()?;
    let mut children: Vec<Child> = (0..args.ranks)
        .map(|r| {
            let mut command = Command::new(&exe);
            command.args(std::env::args().skip(1));
            for var in LAUNCH_VARS {
                command.env_remove(var);
            }
            command
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env("MLX_RANK", r.to_string())
                .stdin(Stdio::null())
                .stdout(if r == 0 {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                })
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    let mut status: Vec<Option<std::process::ExitStatus>> = vec![None; children.len()];
    let failed = loop {
        for (s, child) in status.iter_mut().zip(children.iter_mut()) {
            if s.is_none() {
                *s = child.try_wait()?;
            }
        }
        if let Some(r) = status.iter().position(|s| s.is_some_and(|s| !s.success())) {
            break Some(r);
        }
        if status.iter().all(Option::is_some) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if failed.is_some() {
        for (s, child) in status.iter().zip(children.iter_mut()) {
            if s.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    match failed {
        Some(r) => Err(format!("rank {r} failed ({:?})", status[r]).into()),
        None => Ok(()),
    }
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
