//! JACCL's mesh and ring algorithms across processes over TCP (`NUVEC_JACCL_FABRIC=tcp`), each
//! rank started with the environment `mlx.launch --backend jaccl` writes (`MLX_RANK`,
//! `MLX_IBV_DEVICES`, `MLX_JACCL_COORDINATOR`, `MLX_JACCL_RING`) and initialised by
//! `nuvec_distributed::init`: every collective gives the expected bits on every rank, and a
//! lost peer fails the others naming it.

#[path = "common/ports.rs"]
mod ports;
#[path = "common/procs.rs"]
mod procs;

use std::time::Duration;

use nuvec_core::distributed::{self, Group};
use nuvec_core::{Array, DType, ops};

const CHILD_TEST: &str = "a_jaccl_rank_runs_its_scenario";
const SCENARIO: &str = "NUVEC_TEST_SCENARIO";

/// The raw bytes of an array.
fn bytes(a: &Array) -> Vec<u8> {
    let n: i32 = a.shape().iter().product();
    ops::view(&ops::reshape(a, [n as usize]), DType::U8)
        .to_vec::<u8>()
        .expect("array bytes")
}

fn hash(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Rank `rank`'s input of `n` float32 values: small integers, so every sum is exact.
fn floats(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((rank * 7 + i * 3) % 17) as f32).collect()
}

/// The collectives scenario: all-reduces around every JACCL threshold (4 KiB frames, 32 KiB,
/// the ring's 2·R·C elements, 64 KiB and more), all-gathers and neighbour send/recv; each
/// result is checked here and its hash printed for the parent to compare across ranks.
fn collectives(group: &Group) {
    let (rank, size) = (group.rank(), group.size());
    for n in [1usize, 5, 1024, 8192, 8193, 16_411, 100_000] {
        let x = Array::from_slice(&floats(rank, n), [n]);
        let got = distributed::all_sum(&x, Some(group))
            .to_vec::<f32>()
            .expect("all_sum");
        let inputs: Vec<Vec<f32>> = (0..size).map(|r| floats(r, n)).collect();
        let want: Vec<f32> = (0..n).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
        assert_eq!(got, want, "all_sum of {n}");
        let max = distributed::all_max(&x, Some(group))
            .to_vec::<f32>()
            .expect("all_max");
        let want: Vec<f32> = (0..n)
            .map(|i| inputs.iter().map(|x| x[i]).fold(f32::MIN, f32::max))
            .collect();
        assert_eq!(max, want, "all_max of {n}");
        println!(
            "HASH all_sum {n} {:016x}",
            hash(&bytes(&distributed::all_sum(&x, Some(group))))
        );
    }
    for n in [0usize, 3, 4096, 40_000] {
        let mine: Vec<u8> = (0..n).map(|i| (rank * 31 + i) as u8).collect();
        let x = Array::from_slice(&mine, [n]);
        let got = bytes(&distributed::all_gather(&x, Some(group)));
        let want: Vec<u8> = (0..size)
            .flat_map(|r| (0..n).map(move |i| (r * 31 + i) as u8))
            .collect();
        assert_eq!(got, want, "all_gather of {n}");
    }
    // Neighbour send/recv (a ring sends between neighbours only; the mesh allows it too).
    if size > 1 {
        let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
        for n in [1usize, 4097, 70_000] {
            let mine: Vec<u8> = (0..n).map(|i| (rank * 13 + i * 7) as u8).collect();
            let x = Array::from_slice(&mine, [n]);
            let got = if rank % 2 == 0 {
                distributed::send(&x, right, Some(group))
                    .eval()
                    .expect("send");
                distributed::recv([n], DType::U8, left, Some(group))
            } else {
                let got = distributed::recv([n], DType::U8, left, Some(group));
                got.eval().expect("recv");
                distributed::send(&x, right, Some(group))
                    .eval()
                    .expect("send");
                got
            };
            let want: Vec<u8> = (0..n).map(|i| (left * 13 + i * 7) as u8).collect();
            assert_eq!(bytes(&got), want, "recv of {n} from rank {left}");
        }
    }
    println!("COLLECTIVES OK");
}

/// The last rank leaves at once; the others' next all-reduce must fail naming it.
fn lost_peer(group: &Group) {
    let (rank, size) = (group.rank(), group.size());
    if rank == size - 1 {
        std::process::exit(0);
    }
    let comm_error = std::panic::catch_unwind(|| {
        let x = Array::from_slice(&floats(rank, 50_000), [50_000]);
        distributed::all_sum(&x, Some(group)).to_vec::<f32>()
    });
    let text = match comm_error {
        Ok(Ok(_)) => panic!("the all_sum succeeded without rank {}", size - 1),
        Ok(Err(e)) => e.to_string(),
        Err(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic".into()),
    };
    println!("FAILED AS EXPECTED: {text}");
}

#[test]
fn a_jaccl_rank_runs_its_scenario() {
    if !procs::is_child(CHILD_TEST) {
        return;
    }
    let scenario = std::env::var(SCENARIO).expect("scenario");
    let group = nuvec_distributed::init_backend(true, nuvec_distributed::Backend::Any)
        .unwrap_or_else(|e| {
            println!("INIT FAILED {e}");
            std::process::exit(3)
        });
    match scenario.as_str() {
        "collectives" => collectives(&group),
        "lost_peer" => lost_peer(&group),
        other => panic!("unknown scenario {other}"),
    }
}

/// The device file of a job: a mesh (one device per pair) or a ring of `wires` cables per
/// neighbour pair (the names only need to be consistent: TCP does not open them).
fn device_file(ranks: usize, ring: Option<usize>) -> String {
    let rows: Vec<serde_json::Value> = (0..ranks)
        .map(|i| {
            serde_json::Value::Array(
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
                    .collect(),
            )
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// Runs a JACCL-over-TCP job of `ranks` processes; `ring` is `Some(wires)` for the ring.
fn job(
    name: &str,
    scenario: &str,
    ranks: usize,
    ring: Option<usize>,
    frames: &str,
) -> Vec<procs::Finished> {
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch(name);
    let devices = dir.join("devices.json");
    std::fs::write(&devices, device_file(ranks, ring)).expect("write the device file");
    let coordinator = ports::free_nodes(1, 1)[0][0].clone();
    let commands = (0..ranks)
        .map(|rank| {
            let mut cmd = procs::this_test(CHILD_TEST);
            cmd.env(SCENARIO, scenario)
                .env("MLX_RANK", rank.to_string())
                .env("MLX_IBV_DEVICES", &devices)
                .env("MLX_JACCL_COORDINATOR", &coordinator)
                .env("NUVEC_JACCL_FABRIC", "tcp")
                .env("NUVEC_JACCL_FRAMES", frames)
                .env("NUVEC_DISTRIBUTED_TIMEOUT", "20")
                .env_remove("MLX_HOSTFILE");
            if ring.is_some() {
                cmd.env("MLX_JACCL_RING", "1");
            }
            cmd
        })
        .collect();
    procs::run_all(&dir, commands, Duration::from_secs(120))
}

fn hashes(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("HASH ")).collect()
}

fn collectives_on(name: &str, ranks: usize, ring: Option<usize>, frames: &str) {
    let finished = job(name, "collectives", ranks, ring, frames);
    procs::assert_all_ok(name, &finished);
    for f in &finished {
        assert!(f.output.contains("COLLECTIVES OK"), "{name}: {}", f.output);
        assert_eq!(
            hashes(&f.output),
            hashes(&finished[0].output),
            "{name}: every rank the same bits"
        );
    }
}

#[test]
fn the_mesh_over_tcp_gives_every_rank_the_expected_bits() {
    for ranks in [2, 3, 4] {
        collectives_on(&format!("mesh-{ranks}"), ranks, None, "small");
    }
}

#[test]
fn the_ring_over_tcp_gives_every_rank_the_expected_bits() {
    for (ranks, wires) in [(2, 1), (3, 2), (4, 1), (4, 2)] {
        collectives_on(
            &format!("ring-{ranks}x{wires}"),
            ranks,
            Some(wires),
            "small",
        );
    }
}

#[test]
fn large_frames_work_on_both_topologies() {
    collectives_on("mesh-3-large", 3, None, "large");
    collectives_on("ring-3x2-large", 3, Some(2), "large");
}

#[test]
fn a_lost_peer_fails_the_others_naming_it() {
    for (name, ring) in [("lost-mesh", None), ("lost-ring", Some(1))] {
        let finished = job(name, "lost_peer", 3, ring, "small");
        for (rank, f) in finished.iter().enumerate().take(2) {
            assert!(
                f.output.contains("FAILED AS EXPECTED") && f.output.contains("rank 2"),
                "{name} rank {rank}: {}",
                f.output
            );
        }
    }
}
