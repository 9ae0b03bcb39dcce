//! JACCL's multi-wire mesh (MLX 0.32.4's `MeshGroup` with `n_wires_`) across processes: jobs
//! of 2 to 8 ranks whose device file lists 1, 2 or 3 devices per pair (the list form
//! `mlx.distributed_config` writes), over TCP (`NUVEC_JACCL_FABRIC=tcp`, one connection per
//! cable) and, with the feature `jaccl`, over the RDMA fabric driving the software RDMA
//! provider (`over_rdma`, one queue pair per wire per peer, every wire on devices of its own).
//! Every rank runs operations of `tests/common/jaccl_wires.rs` (every collective and dtype on
//! both sides of 32 KiB and 512 KiB) and every result must be the model's on every rank.

#[cfg(feature = "jaccl")]
use crate::common::emu;
use crate::common::jaccl_wires;
use crate::common::ports;
use crate::common::procs;

use std::time::Duration;

use nuvec_distributed::fabric::Fabric;
use nuvec_distributed::jaccl::{self, Config, FrameRule, JacclCommunicator, SideChannel};

use jaccl_wires::{SendOrder, WireOp};

const CHILD_TEST: &str = concat!(module_path!(), "::a_multi_wire_rank_runs_its_operations");
/// How many operations of the matrix a job runs (all of them when 0).
const OPS_VAR: &str = "NUVEC_TEST_WIRE_OPS";
/// The number of wires the device file gives.
const WIRES_VAR: &str = "NUVEC_TEST_WIRES";
/// The seed of the inputs and of the pick of operations.
const SEED: u64 = 32;

/// The operations a job of `ranks` ranks and `wires` wires runs: `count` of the matrix's
/// (every collective among them), or all of them when `count` is 0.
fn job_ops(ranks: usize, wires: usize, count: usize) -> Vec<WireOp> {
    let all = jaccl_wires::ops(ranks, wires);
    if count == 0 {
        all
    } else {
        jaccl_wires::sample(&all, count, SEED + ranks as u64)
    }
}

#[test]
fn a_multi_wire_rank_runs_its_operations() {
    if !procs::is_child(CHILD_TEST) {
        return;
    }
    let timeout = Duration::from_secs(30);
    let config = Config::from_env()
        .expect("the JACCL environment")
        .expect("a JACCL job");
    let (rank, size) = (config.rank(), config.size());
    let wires: usize = std::env::var(WIRES_VAR).expect("wires").parse().unwrap();
    assert_eq!(
        config.topology().expect("a topology"),
        jaccl::Topology::Mesh { wires },
        "the device file's wires"
    );
    let rule = match std::env::var("NUVEC_JACCL_FRAMES").as_deref() {
        Ok("large") => FrameRule::Large,
        _ => FrameRule::Small,
    };
    let coordinator = config
        .coordinator_address()
        .expect("coordinator")
        .to_owned();
    let mut side = SideChannel::connect(&coordinator, rank, size, timeout).expect("side channel");
    let fabric: Box<dyn Fabric + Send> = match std::env::var("NUVEC_JACCL_FABRIC").as_deref() {
        Ok("tcp") => Box::new(
            jaccl::tcp::connect(&config, &mut side, timeout)
                .expect("JACCL over TCP")
                .0,
        ),
        #[cfg(feature = "jaccl")]
        Ok("rdma") => Box::new(jaccl::rdma::connect(&config, &mut side, timeout).expect("RDMA")),
        other => panic!("no fabric for {other:?}"),
    };
    for peer in (0..size).filter(|&p| p != rank) {
        assert_eq!(fabric.links(peer), wires, "links to rank {peer}");
    }
    let comm = JacclCommunicator::mesh(fabric, rule, timeout);
    let count: usize = std::env::var(OPS_VAR).map_or(0, |c| c.parse().unwrap());
    let ops = job_ops(size, wires, count);
    for (i, op) in ops.iter().enumerate() {
        let ins: Vec<Vec<u8>> = (0..size)
            .map(|r| jaccl_wires::input(SEED, i, r, size, op))
            .collect();
        let got = jaccl_wires::run(&comm, op, rank, size, &ins[rank], SendOrder::Alternating)
            .unwrap_or_else(|e| panic!("rank {rank} op {i} ({op:?}): {e}"));
        let want = jaccl_wires::result(op, rank, wires, &ins);
        assert!(
            got == want,
            "rank {rank} op {i} ({op:?}): not the model's bits"
        );
        println!("OP {i} {op:?} OK");
    }
    println!("WIRES OK {}", ops.len());
}

/// Runs a job of `ranks` ranks over `wires` wires (`count` operations, 0 for all) on `fabric`
/// (`tcp` or `rdma`) with `frames`, and checks that every rank ran every operation.
fn wires_job(ranks: usize, wires: usize, count: usize, fabric: &str, frames: &str) {
    let name = format!("wires-{fabric}-{ranks}x{wires}-{frames}");
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch(&name);
    let devices = dir.join("devices.json");
    let text = jaccl_wires::mesh_device_file(ranks, wires);
    std::fs::write(&devices, &text).expect("write the device file");
    let coordinator = ports::free_nodes(1, 1)[0][0].clone();
    let commands = (0..ranks)
        .map(|rank| {
            let mut cmd = procs::this_test(CHILD_TEST);
            cmd.env("MLX_RANK", rank.to_string())
                .env("MLX_IBV_DEVICES", &devices)
                .env("MLX_JACCL_COORDINATOR", &coordinator)
                .env("NUVEC_JACCL_FABRIC", fabric)
                .env("NUVEC_JACCL_FRAMES", frames)
                .env(WIRES_VAR, wires.to_string())
                .env(OPS_VAR, count.to_string())
                .env_remove("MLX_JACCL_RING")
                .env_remove("MLX_HOSTFILE");
            #[cfg(feature = "jaccl")]
            if fabric == "rdma" {
                emu::configure(&mut cmd, &text, &dir.join("ledger"));
            }
            cmd
        })
        .collect();
    let began = std::time::Instant::now();
    let finished = procs::run_all(&dir, commands, Duration::from_secs(180));
    procs::assert_all_ok(&name, &finished);
    let ops = job_ops(ranks, wires, count).len();
    for (rank, f) in finished.iter().enumerate() {
        assert!(
            f.output.contains(&format!("WIRES OK {ops}")),
            "{name} rank {rank}: {}",
            f.output
        );
    }
    #[cfg(feature = "jaccl")]
    if fabric == "rdma" {
        let ledger = dir.join("ledger");
        assert_eq!(
            emu::leaks(&ledger),
            Vec::<String>::new(),
            "{name}: left registered"
        );
        // Every rank opened a device per (peer, wire).
        assert!(
            emu::closes(&ledger) >= ranks * (ranks - 1) * wires,
            "{name}: {} devices closed",
            emu::closes(&ledger)
        );
    }
    eprintln!("{name}: {ops} operations in {:?}", began.elapsed());
}

#[test]
fn meshes_of_two_to_eight_ranks_over_one_to_three_tcp_wires_give_the_models_bits() {
    wires_job(2, 2, 0, "tcp", "small");
    wires_job(3, 3, 0, "tcp", "large");
    wires_job(5, 1, 10, "tcp", "small");
    wires_job(8, 3, 8, "tcp", "large");
}

/// The multi-wire mesh over the real RDMA fabric and the software provider.
#[cfg(feature = "jaccl")]
mod over_rdma {
    use super::*;

    #[test]
    fn multi_wire_meshes_over_rdma_give_the_models_bits_on_every_rank() {
        wires_job(2, 3, 0, "rdma", "small");
        wires_job(4, 2, 12, "rdma", "large");
        wires_job(8, 3, 6, "rdma", "large");
    }
}
