//! JACCL's RDMA fabric (feature `jaccl`): whether it is available and why not, bring-up
//! errors that name what failed, and the hardware exchange, run here over the software RDMA
//! provider (`fabric-sim/verbs/`) and on real hardware under `mlx.launch --backend jaccl`.
//!
//! The hardware test is ignored by default; `the_hardware_exchange_runs_over_the_software_provider`
//! runs it across processes over the provider. On hardware it needs hosts with RDMA devices
//! that have an IPv4-mapped GID: Macs cabled for JACCL (RDMA enabled, an IPv4 address on each
//! Thunderbolt interface) or Linux hosts with RDMA NICs. Build the test binary on every host
//! (`cargo test --features jaccl --test processes --no-run` prints its path), write the
//! device file for the cabling, and start the binary on every rank through the launcher, which
//! runs any command:
//!
//! ```text
//! mlx.launch --backend jaccl --hostfile hosts.json \
//!     <test binary> --ignored --nocapture every_peer_receives
//! ```
//!
//! (`--backend jaccl-ring` tests a ring cabling.) The test reads the job from the environment
//! that `mlx.launch` writes (`MLX_RANK`, `MLX_IBV_DEVICES`, `MLX_JACCL_COORDINATOR`) and
//! returns early, saying so, when it is not set. Only loopback addresses are used by the other
//! tests.
#![cfg(feature = "jaccl")]

use std::thread;
use std::time::Duration;

use crate::common::emu;
use crate::common::ports;
use crate::common::procs;

use nuvec_core::DType;
use nuvec_distributed::Error;
use nuvec_distributed::fabric::{Channel, ChannelKind, Fabric, Landing, Transfer, Wiring};
use nuvec_distributed::jaccl::rdma::{self, MAX_FRAME};
use nuvec_distributed::jaccl::{self, Config, FrameRule, JacclCommunicator, SideChannel, Topology};
use nuvec_distributed::reduce::Reduction;

/// The timeout of the side channel and the bring-up.
const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn listing_devices_on_a_machine_without_rdma_returns_cleanly_and_nothing_is_available() {
    let listed = jaccl::devices();
    eprintln!("devices() on this machine: {listed:?}");
    match listed {
        Ok(names) if !names.is_empty() => {
            eprintln!(
                "skipped: this machine has RDMA devices ({})",
                names.join(", ")
            );
            assert!(rdma::available());
        }
        Ok(_) => assert!(!rdma::available()),
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains("no RDMA device"), "{m}");
            assert!(matches!(e, Error::Config(_)), "{e:?}");
            assert!(!rdma::available());
        }
    }
}

#[test]
fn a_side_channel_of_another_group_is_refused_before_any_device_is_opened() {
    let devices = mesh_matrix(2, "rdma_nonexistent");
    let config = Config::new(0, devices).coordinator("127.0.0.1:1");
    let mut side = SideChannel::connect("127.0.0.1:1", 0, 1, TIMEOUT).unwrap();
    let e = rdma::connect(&config, &mut side, TIMEOUT).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { rank: 0, .. })
            && e.to_string()
                .contains("the side channel is rank 0 of 1 but the configuration is rank 0 of 2"),
        "{e}"
    );
}

#[test]
fn connecting_over_a_device_that_does_not_exist_names_the_device_and_the_peer() {
    let coordinator = ports::free_nodes(1, 1)[0][0].clone();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let coordinator = coordinator.clone();
            thread::spawn(move || {
                let config =
                    Config::new(rank, mesh_matrix(2, "rdma_nonexistent")).coordinator(&coordinator);
                let mut side = SideChannel::connect(&coordinator, rank, 2, TIMEOUT)?;
                rdma::connect(&config, &mut side, TIMEOUT).map(|_| ())
            })
        })
        .collect();
    for (rank, handle) in ranks.into_iter().enumerate() {
        let e = handle.join().unwrap().unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(e, Error::Connect { rank: r, .. } if r == rank)
                && m.contains("device rdma_nonexistent")
                && m.contains(&format!("queue pair to rank {}", 1 - rank))
                && m.contains("no RDMA device"),
            "rank {rank}: {m}"
        );
    }
}

#[test]
#[ignore = "needs RDMA hardware: run under `mlx.launch --backend jaccl` with --ignored"]
fn every_peer_receives_the_frames_sent_to_it_on_every_channel() {
    let config = match Config::from_env() {
        Ok(Some(config)) => config,
        Ok(None) => {
            eprintln!(
                "skipped: no JACCL job in the environment (MLX_IBV_DEVICES is not set); run \
                 under `mlx.launch --backend jaccl`"
            );
            return;
        }
        Err(e) => panic!("the JACCL environment is malformed: {e}"),
    };
    config.validate().unwrap();
    let (rank, size) = (config.rank(), config.size());
    let coordinator = config.coordinator_address().unwrap().to_owned();
    let mut side = SideChannel::connect(&coordinator, rank, size, TIMEOUT).unwrap();
    let mut fabric = rdma::connect(&config, &mut side, TIMEOUT).unwrap();
    assert_eq!(fabric.kind(), ChannelKind::Message);
    let wiring = match config.topology().unwrap() {
        Topology::Mesh { wires } => Wiring::mesh(size, wires),
        Topology::Ring { wires } => Wiring::ring(size, wires),
    };
    let channels: Vec<Channel> = (0..size)
        .flat_map(|peer| (0..fabric.links(peer)).map(move |link| Channel::new(peer, link)))
        .collect();
    assert!(!channels.is_empty(), "rank {rank} has no channel");

    // Two messages per channel per step: both of a queue pair's send frames in flight.
    for len in [1, 4096, 65_536, MAX_FRAME] {
        let outgoing: Vec<[Vec<u8>; 2]> = channels
            .iter()
            .map(|c| [0, 1].map(|k| pattern(rank, c.peer, c.link, k, len)))
            .collect();
        let expected: Vec<[Vec<u8>; 2]> = channels
            .iter()
            .map(|c| {
                let (peer, their_link) = wiring.far_end(rank, *c).unwrap();
                [0, 1].map(|k| pattern(peer, rank, their_link, k, len))
            })
            .collect();
        let mut incoming: Vec<[Vec<u8>; 2]> = channels
            .iter()
            .map(|_| [vec![0u8; len], vec![0u8; len]])
            .collect();
        let mut step: Vec<Transfer<'_>> = Vec::new();
        for (c, data) in channels.iter().zip(&outgoing) {
            for d in data {
                step.push(Transfer::Send {
                    channel: *c,
                    data: d,
                });
            }
        }
        for (c, bufs) in channels.iter().zip(incoming.iter_mut()) {
            for b in bufs.iter_mut() {
                step.push(Transfer::Recv {
                    channel: *c,
                    landing: Landing::Into(b),
                });
            }
        }
        let deadline = fabric.now() + Duration::from_secs(30);
        fabric
            .run(&mut step, deadline)
            .unwrap_or_else(|e| panic!("rank {rank}, {len}-byte messages: {e}"));
        drop(step);
        for ((c, got), want) in channels.iter().zip(&incoming).zip(&expected) {
            for k in 0..2 {
                assert!(
                    got[k] == want[k],
                    "rank {rank}: message {k} of {len} bytes from {c} differs"
                );
            }
        }
        side.barrier().unwrap();
    }
    eprintln!(
        "rank {rank}: exchanged frames of 1 B to {MAX_FRAME} B on {} channels",
        channels.len()
    );
}

/// The bytes rank `from` sends on its link `link` to rank `to` as message `k` of `len` bytes.
fn pattern(from: usize, to: usize, link: usize, k: usize, len: usize) -> Vec<u8> {
    let seed = from * 31 + to * 7 + link * 13 + k * 101 + len;
    (0..len).map(|i| ((seed + i * 3) % 251) as u8).collect()
}

/// A mesh device matrix of `size` ranks with every entry `name`.
fn mesh_matrix(size: usize, name: &str) -> Vec<Vec<Vec<String>>> {
    (0..size)
        .map(|i| {
            (0..size)
                .map(|j| {
                    if i == j {
                        Vec::new()
                    } else {
                        vec![name.to_owned()]
                    }
                })
                .collect()
        })
        .collect()
}

/// The hardware test, as a child of this binary.
const HARDWARE_TEST: &str = concat!(
    module_path!(),
    "::every_peer_receives_the_frames_sent_to_it_on_every_channel"
);

/// The availability report, as a child of this binary.
const AVAILABILITY_TEST: &str = concat!(
    module_path!(),
    "::a_child_reports_whether_jaccl_is_available"
);

/// The device file of a JACCL job of `ranks` ranks: a mesh, or a ring of `wires` cables.
fn device_file(ranks: usize, ring: Option<usize>) -> String {
    let rows: Vec<serde_json::Value> = (0..ranks)
        .map(|i| {
            (0..ranks)
                .map(|j| {
                    let neighbours = (i + 1) % ranks == j || (j + 1) % ranks == i;
                    match ring {
                        _ if i == j => serde_json::Value::Null,
                        None => format!("rdma_en{}", i.min(j) * 10 + i.max(j)).into(),
                        Some(wires) if neighbours => (0..wires)
                            .map(|w| format!("rdma_en{}_{w}", i.min(j) * 10 + i.max(j)))
                            .collect::<Vec<_>>()
                            .into(),
                        Some(_) => serde_json::Value::Null,
                    }
                })
                .collect::<Vec<_>>()
                .into()
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

#[test]
fn the_hardware_exchange_runs_over_the_software_provider() {
    if procs::is_child(HARDWARE_TEST) {
        return;
    }
    for (name, ranks, ring) in [
        ("hw-mesh-3", 3, None),
        ("hw-ring-2x2", 2, Some(2)),
        ("hw-ring-4x1", 4, Some(1)),
    ] {
        let dir = procs::scratch(name);
        exchange_over_the_provider(&dir, name, ranks, ring, &device_file(ranks, ring));
    }
}

/// Runs the hardware exchange on `ranks` processes over the provider with the device file
/// `devices` (a ring of `ring` wires, or a mesh): every rank exchanges its frames, and
/// nothing is left registered.
fn exchange_over_the_provider(
    dir: &std::path::Path,
    name: &str,
    ranks: usize,
    ring: Option<usize>,
    devices: &str,
) {
    let _one_job_at_a_time = procs::exclusive();
    let path = dir.join("devices.json");
    std::fs::write(&path, devices).expect("write the device file");
    let coordinator = ports::free_nodes(1, 1)[0][0].clone();
    let ledger = dir.join("ledger");
    let commands = (0..ranks)
        .map(|rank| {
            let mut cmd = procs::this_test(HARDWARE_TEST);
            cmd.arg("--ignored")
                .env("MLX_RANK", rank.to_string())
                .env("MLX_IBV_DEVICES", &path)
                .env("MLX_JACCL_COORDINATOR", &coordinator);
            if ring.is_some() {
                cmd.env("MLX_JACCL_RING", "1");
            }
            emu::configure(&mut cmd, devices, &ledger);
            cmd
        })
        .collect();
    let finished = procs::run_all(dir, commands, Duration::from_secs(120));
    procs::assert_all_ok(name, &finished);
    for (rank, f) in finished.iter().enumerate() {
        assert!(
            f.output.contains("exchanged frames of 1 B to 524288 B"),
            "{name} rank {rank}: {}",
            f.output
        );
    }
    assert_eq!(
        emu::leaks(&ledger),
        Vec::<String>::new(),
        "{name}: left registered"
    );
    assert!(emu::closes(&ledger) >= ranks, "{name}: devices not closed");
}

/// Prints whether JACCL is available in this process and why not.
#[test]
fn a_child_reports_whether_jaccl_is_available() {
    if !procs::is_child(AVAILABILITY_TEST) {
        return;
    }
    let available = nuvec_distributed::is_available(nuvec_distributed::Backend::Jaccl);
    println!("AVAILABLE {available}");
    if let Some(why) = rdma::unavailable() {
        println!("WHY {why}");
    }
    match nuvec_distributed::init_backend(true, nuvec_distributed::Backend::Jaccl) {
        Ok(group) => println!("INIT OK {}", group.size()),
        Err(e) => println!("INIT FAILED {e}"),
    }
}

/// Brings up the RDMA fabric of the JACCL job in the environment (its limits checked
/// first), sums over it, closes it (its queue pairs are destroyed and their frames
/// deregistered) and prints how many memory regions this process leaked.
#[test]
fn a_child_sums_over_a_jaccl_group_then_drops_it() {
    if !procs::is_child(DROP_TEST) {
        return;
    }
    let config = match Config::from_env() {
        Ok(Some(config)) => config,
        other => panic!("no JACCL job in the environment: {other:?}"),
    };
    let (rank, size) = (config.rank(), config.size());
    let coordinator = config.coordinator_address().unwrap().to_owned();
    let mut side = SideChannel::connect(&coordinator, rank, size, TIMEOUT).unwrap();
    let fabric = match rdma::connect(&config, &mut side, TIMEOUT) {
        Ok(fabric) => fabric,
        Err(e) => {
            println!("INIT FAILED {e}");
            return;
        }
    };
    let comm = match config.topology().unwrap() {
        Topology::Mesh { .. } => JacclCommunicator::mesh(fabric, FrameRule::Small, TIMEOUT),
        Topology::Ring { wires } => {
            JacclCommunicator::ring(fabric, wires, FrameRule::Small, TIMEOUT)
        }
    };
    let mut one = 1.0f32.to_le_bytes();
    let sum = comm.try_all_reduce(Reduction::Sum, DType::F32, &mut one);
    println!("SUM {:?}", sum.map(|()| f32::from_le_bytes(one)));
    drop(comm.close());
    println!("LEAKED {}", rdma::leaked_regions());
}

/// The child that drops its group, as a child of this binary.
const DROP_TEST: &str = concat!(
    module_path!(),
    "::a_child_sums_over_a_jaccl_group_then_drops_it"
);

/// Runs the availability child with the verbs library `verbs` and the extra environment
/// `env`, in a job of 2 ranks of which only rank 0 is started; its output.
fn availability(verbs: &str, env: &[(&str, &str)]) -> String {
    availability_of(1, verbs, env).swap_remove(0)
}

/// As [`availability`], with the first `started` ranks of the 2 started; their outputs.
fn availability_of(started: usize, verbs: &str, env: &[(&str, &str)]) -> Vec<String> {
    child_over(
        AVAILABILITY_TEST,
        started,
        verbs,
        &device_file(2, None),
        env,
    )
}

/// As [`availability_of`], with the child `test`, over the device file `devices` (of 2 ranks).
fn child_over(
    test: &str,
    started: usize,
    verbs: &str,
    devices: &str,
    env: &[(&str, &str)],
) -> Vec<String> {
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch(&format!(
        "availability-{started}-{}-{}-{}",
        verbs.len(),
        devices.len(),
        test.len()
    ));
    let path = dir.join("devices.json");
    std::fs::write(&path, devices).expect("write the device file");
    let coordinator = ports::free_nodes(1, 1)[0][0].clone();
    let commands = (0..started)
        .map(|rank| {
            let mut cmd = procs::this_test(test);
            cmd.env("MLX_RANK", rank.to_string())
                .env("MLX_IBV_DEVICES", &path)
                .env("MLX_JACCL_COORDINATOR", &coordinator)
                .env("NUVEC_DISTRIBUTED_TIMEOUT", "5")
                .env("NUVEC_JACCL_VERBS", verbs)
                .env("NUVEC_VERBS_EMU_DEVICES", emu::device_names(devices));
            for (key, value) in env {
                cmd.env(key, value);
            }
            cmd
        })
        .collect();
    let finished = procs::run_each(&dir, commands, Duration::from_secs(60));
    finished.into_iter().map(|f| f.output).collect()
}

#[test]
fn a_port_without_an_ipv4_mapped_gid_fails_the_bring_up_saying_to_assign_an_address() {
    let library = emu::library().display().to_string();
    let outputs = availability_of(2, &library, &[("NUVEC_VERBS_EMU_NO_IPV4", "1")]);
    for (rank, out) in outputs.iter().enumerate() {
        assert!(out.contains("AVAILABLE true"), "rank {rank}: {out}");
        let init = out.lines().find(|l| l.contains("INIT")).unwrap_or_default();
        assert!(
            init.contains("INIT FAILED")
                && init.contains("no IPv4-mapped GID on port 1 of rdma_en1")
                && init.contains("queue pair to rank")
                && init.contains("169.254.0.1"),
            "rank {rank}: {out}"
        );
    }
}

#[test]
fn the_largest_mesh_on_one_device_per_rank_stays_within_apples_limits() {
    // Eight ranks (MLX's most), every connection of a rank on the same device: 7 queue pairs
    // and 42 memory regions on it, inside the provider's 10 and 100.
    let dir = procs::scratch("limits");
    let ranks = 8;
    let rows: Vec<Vec<Option<&str>>> = (0..ranks)
        .map(|i| (0..ranks).map(|j| (i != j).then_some("rdma_en0")).collect())
        .collect();
    let devices = serde_json::to_string(&rows).expect("json");
    exchange_over_the_provider(&dir, "limits", ranks, None, &devices);
}

#[test]
fn a_multi_wire_mesh_opens_a_queue_pair_per_wire_per_peer_within_apples_limits() {
    // Eight ranks with three cables per pair (the list form of mlx.distributed_config 0.32.4),
    // wire w of every rank on its device rdma_en{w}: 21 queue pairs per rank, 7 and 42 memory
    // regions per device, inside the provider's 10 and 100; every channel (peer, wire)
    // carries its frames to the same wire of the peer.
    let dir = procs::scratch("limits-wires");
    let (ranks, wires) = (8, 3);
    let rows: Vec<Vec<Option<Vec<String>>>> = (0..ranks)
        .map(|i| {
            (0..ranks)
                .map(|j| (i != j).then(|| (0..wires).map(|w| format!("rdma_en{w}")).collect()))
                .collect()
        })
        .collect();
    let devices = serde_json::to_string(&rows).expect("json");
    exchange_over_the_provider(&dir, "limits-wires", ranks, None, &devices);
}

#[test]
fn without_the_verbs_library_jaccl_is_unavailable_and_init_says_which_library_failed() {
    let out = availability("/nonexistent/librdma-missing.so", &[]);
    assert!(out.contains("AVAILABLE false"), "{out}");
    assert!(
        out.contains("WHY the verbs library could not be loaded"),
        "{out}"
    );
    let init = out
        .lines()
        .find(|l| l.starts_with("INIT"))
        .unwrap_or_default();
    assert!(
        init.starts_with("INIT FAILED")
            && init.contains("/nonexistent/librdma-missing.so")
            && init.contains("cannot run on this machine"),
        "{out}"
    );
}

#[test]
fn a_library_without_the_verbs_functions_is_named_with_the_missing_function() {
    let out = availability("libc.so.6", &[]);
    assert!(out.contains("AVAILABLE false"), "{out}");
    assert!(out.contains("has no function ibv_get_device_list"), "{out}");
    assert!(out.contains("INIT FAILED"), "{out}");
}

#[test]
fn a_library_that_lists_no_device_makes_jaccl_unavailable_saying_so() {
    let library = emu::library().display().to_string();
    let out = availability(&library, &[("NUVEC_VERBS_EMU_DEVICES", "")]);
    assert!(out.contains("AVAILABLE false"), "{out}");
    assert!(out.contains("no RDMA device is available"), "{out}");
    assert!(out.contains("INIT FAILED"), "{out}");
}

#[test]
fn with_the_software_provider_jaccl_is_available() {
    let library = emu::library().display().to_string();
    let out = availability(&library, &[]);
    assert!(out.contains("AVAILABLE true"), "{out}");
    assert!(!out.contains("WHY"), "{out}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_library_that_loads_without_the_verbs_functions_is_passed_over_for_the_next_one() {
    // libm and libc load everywhere and have none of the functions; the provider has them all.
    let provider = emu::library().as_os_str().to_owned();
    let loaded = nuvec_distributed::internals::load_verbs(&[
        "libm.so.6".into(),
        "libc.so.6".into(),
        provider.clone(),
    ]);
    assert_eq!(loaded, Ok(provider.to_string_lossy().into_owned()));
    // When none serves, the error still names what the first loaded one lacks.
    let e = nuvec_distributed::internals::load_verbs(&[
        "/nonexistent/libverbs-missing.so".into(),
        "libm.so.6".into(),
    ])
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("libm.so.6 has no function ibv_get_device_list"),
        "{e}"
    );
}

#[test]
fn a_region_the_device_will_not_deregister_is_leaked_and_counted_not_freed() {
    let library = emu::library().display().to_string();
    let env = [("NUVEC_VERBS_EMU_FAIL_DEREG", "1")];
    let outputs = child_over(DROP_TEST, 2, &library, &device_file(2, None), &env);
    for (rank, out) in outputs.iter().enumerate() {
        assert!(out.contains("SUM Ok(2.0)"), "rank {rank}: {out}");
        // One queue pair to the one peer: its 2 send and 4 receive frames.
        assert!(out.contains("LEAKED 6"), "rank {rank}: {out}");
    }
}

#[test]
fn a_device_that_reports_three_queue_pairs_refuses_a_fourth_at_bring_up_naming_it() {
    // A ring of 2 with both cables on rdma_en0 opens 4 queue pairs there (each cable carries
    // the left and the right one): Apple's 10 would take them, a Mac behind a hub's 3 not.
    let cables = serde_json::json!([
        [null, ["rdma_en0", "rdma_en0"]],
        [["rdma_en0", "rdma_en0"], null]
    ])
    .to_string();
    let library = emu::library().display().to_string();
    let env = [("MLX_JACCL_RING", "1"), ("NUVEC_VERBS_EMU_MAX_QP", "3")];
    let outputs = child_over(DROP_TEST, 2, &library, &cables, &env);
    for (rank, out) in outputs.iter().enumerate() {
        let init = out.lines().find(|l| l.contains("INIT")).unwrap_or_default();
        assert!(
            init.contains("INIT FAILED")
                && init.contains("rank")
                && init.contains("4 queue pairs on device rdma_en0")
                && init.contains("1 more than the 3")
                && init.contains("before any queue pair was created"),
            "rank {rank}: {out}"
        );
    }
    // The same job fits a device that reports 4.
    let env = [("MLX_JACCL_RING", "1"), ("NUVEC_VERBS_EMU_MAX_QP", "4")];
    for (rank, out) in child_over(DROP_TEST, 2, &library, &cables, &env)
        .iter()
        .enumerate()
    {
        assert!(out.contains("SUM Ok(2.0)"), "rank {rank}: {out}");
        assert!(out.contains("LEAKED 0"), "rank {rank}: {out}");
    }
}
