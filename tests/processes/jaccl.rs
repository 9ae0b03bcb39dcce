//! JACCL's mesh and ring algorithms across processes, over TCP (`NUVEC_JACCL_FABRIC=tcp`) and,
//! with the feature `jaccl`, over the real RDMA fabric driving the software RDMA provider
//! (`fabric-sim/verbs/`), each rank started with the environment `mlx.launch --backend jaccl`
//! writes (`MLX_RANK`, `MLX_IBV_DEVICES`, `MLX_JACCL_COORDINATOR`, `MLX_JACCL_RING`) and
//! initialised by `nuvec_distributed::init`: every collective and dtype gives the model's bits
//! on every rank and the same bits over both fabrics, a lost peer fails the others naming it,
//! and the provider's faults end in errors naming a peer, with nothing left registered.
//!
//! Over 700 lines because every case runs the same rank scenarios through one job runner
//! (`job_over`), over TCP and over RDMA side by side: splitting by fabric would split the pairs
//! that compare the two.

#[cfg(feature = "jaccl")]
use crate::common::emu;
use crate::common::jaccl_model;
use crate::common::mlx_model;
use crate::common::ports;
use crate::common::procs;
use crate::common::values;

use std::time::Duration;

use nuvec_core::distributed::{self, Group};
use nuvec_core::{Array, DType, ops};
use nuvec_distributed::reduce::Reduction;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const CHILD_TEST: &str = concat!(module_path!(), "::a_jaccl_rank_runs_its_scenario");
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

/// Rank `rank`'s input of `n` elements of `dtype` (NaNs, infinities and friends included).
fn typed_input(rank: usize, dtype: DType, n: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed ^ (rank as u64) << 8 ^ n as u64);
    values::typed_values(&mut rng, dtype, n, 0.05)
}

/// The every-dtype scenario: all_sum, all_max and all_min of every dtype at sizes on both sides
/// of the frame thresholds, each checked against the JACCL model's fold and its hash printed.
fn dtypes(group: &Group) {
    let (rank, size) = (group.rank(), group.size());
    let ring = std::env::var("MLX_JACCL_RING").is_ok();
    let large = std::env::var("NUVEC_JACCL_FRAMES").is_ok_and(|f| f == "large");
    let wires: usize = std::env::var("NUVEC_TEST_WIRES")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(1);
    for dtype in values::DTYPES {
        let lane = mlx_model::Lane::of(dtype).size();
        for bytes in [lane, 4096 + lane, 40_000, 300_000] {
            let n = bytes / lane;
            let inputs: Vec<Vec<u8>> = (0..size).map(|r| typed_input(r, dtype, n)).collect();
            let x = ops::view(&Array::from_slice(&inputs[rank], [n * lane]), dtype);
            for op in values::OPS {
                let got = match op {
                    Reduction::Sum => distributed::all_sum(&x, Some(group)),
                    Reduction::Max => distributed::all_max(&x, Some(group)),
                    Reduction::Min => distributed::all_min(&x, Some(group)),
                };
                let got = bytes_of(&got);
                let want = if ring {
                    jaccl_model::ring_fold(large, dtype, op, wires, &inputs)
                } else {
                    jaccl_model::mesh_all_reduce(dtype, op, &inputs, 1)
                };
                assert!(got == want, "{op:?} of {n} {dtype:?}: not the model's bits");
                println!("HASH {op:?} {dtype:?} {n} {:016x}", hash(&got));
            }
        }
    }
    println!("DTYPES OK");
}

/// The raw bytes of an array of any dtype.
fn bytes_of(a: &Array) -> Vec<u8> {
    let n: i32 = a.shape().iter().product();
    ops::view(&ops::reshape(a, [n as usize]), DType::U8)
        .to_vec::<u8>()
        .expect("array bytes")
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

/// All-sums of this many floats in the fault scenario: 49 frames of 4 KiB per step.
#[cfg(feature = "jaccl")]
const FAULT_FLOATS: usize = 50_000;

/// The fault scenario (RDMA): the fabric connected directly, so that it can be closed and
/// dropped, then all-sums until one fails. Every result that arrives is checked, the error and
/// when it came are printed, and the fabric is closed and dropped: the provider's ledger then
/// shows what was left registered.
#[cfg(feature = "jaccl")]
fn fault() {
    use nuvec_distributed::jaccl::{self, Config, FrameRule, JacclCommunicator, SideChannel};
    use std::time::Instant;
    let config = Config::from_env()
        .expect("the JACCL environment")
        .expect("a JACCL job");
    let (rank, size) = (config.rank(), config.size());
    let setup = Duration::from_secs(20);
    let coordinator = config
        .coordinator_address()
        .expect("a coordinator")
        .to_owned();
    let mut side = SideChannel::connect(&coordinator, rank, size, setup).expect("side channel");
    let fabric = jaccl::rdma::connect(&config, &mut side, setup).expect("the RDMA fabric");
    let comm = match config.topology().expect("a topology") {
        jaccl::Topology::Mesh { .. } => {
            JacclCommunicator::mesh(fabric, FrameRule::Small, FAULT_TIMEOUT)
        }
        jaccl::Topology::Ring { wires } => {
            JacclCommunicator::ring(fabric, wires, FrameRule::Small, FAULT_TIMEOUT)
        }
    };
    let inputs: Vec<Vec<f32>> = (0..size).map(|r| floats(r, FAULT_FLOATS)).collect();
    let want: Vec<f32> = (0..FAULT_FLOATS)
        .map(|i| inputs.iter().map(|x| x[i]).sum())
        .collect();
    let mine: Vec<u8> = floats(rank, FAULT_FLOATS)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let mut failed = None;
    for round in 0..40 {
        let mut data = mine.clone();
        let began = Instant::now();
        match comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data) {
            Ok(()) => {
                let got: Vec<f32> = data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                assert!(got == want, "WRONG DATA in round {round}");
            }
            Err(e) => {
                failed = Some((round, began.elapsed(), e));
                break;
            }
        }
    }
    match failed {
        Some((round, waited, e)) => {
            println!(
                "FAILED AS EXPECTED in round {round} after {} ms: {e}",
                waited.as_millis()
            );
        }
        None => println!("NO FAILURE"),
    }
    drop(comm.close());
    drop(comm);
    println!("CLOSED");
}

/// The deadline of every operation in the fault scenario.
#[cfg(feature = "jaccl")]
const FAULT_TIMEOUT: Duration = Duration::from_secs(4);

#[test]
fn a_jaccl_rank_runs_its_scenario() {
    if !procs::is_child(CHILD_TEST) {
        return;
    }
    let scenario = std::env::var(SCENARIO).expect("scenario");
    #[cfg(feature = "jaccl")]
    if scenario == "fault" {
        fault();
        return;
    }
    let group = nuvec_distributed::init_backend(true, nuvec_distributed::Backend::Any)
        .unwrap_or_else(|e| {
            println!("INIT FAILED {e}");
            std::process::exit(3)
        });
    match scenario.as_str() {
        "collectives" => collectives(&group),
        "lost_peer" => lost_peer(&group),
        "dtypes" => dtypes(&group),
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

/// What carries a job's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Over {
    /// TCP connections, one per cable.
    Tcp,
    /// The RDMA fabric over the software provider.
    #[cfg(feature = "jaccl")]
    Rdma,
}

/// Runs a JACCL-over-TCP job of `ranks` processes; `ring` is `Some(wires)` for the ring.
fn job(
    name: &str,
    scenario: &str,
    ranks: usize,
    ring: Option<usize>,
    frames: &str,
) -> Vec<procs::Finished> {
    job_over(name, scenario, ranks, ring, frames, Over::Tcp, &|_| {
        Vec::new()
    })
    .0
}

/// Runs a JACCL job of `ranks` processes over `over`, rank r with the extra environment
/// `env(r)`; returns every rank's end and the job's scratch directory.
fn job_over(
    name: &str,
    scenario: &str,
    ranks: usize,
    ring: Option<usize>,
    frames: &str,
    over: Over,
    env: &dyn Fn(usize) -> Vec<(&'static str, String)>,
) -> (Vec<procs::Finished>, procs::Scratch) {
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch(name);
    let devices = dir.join("devices.json");
    let device_file = device_file(ranks, ring);
    std::fs::write(&devices, &device_file).expect("write the device file");
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
                .env("NUVEC_TEST_WIRES", ring.unwrap_or(1).to_string())
                .env_remove("MLX_HOSTFILE");
            if ring.is_some() {
                cmd.env("MLX_JACCL_RING", "1");
            }
            match over {
                Over::Tcp => {}
                #[cfg(feature = "jaccl")]
                Over::Rdma => emu::configure(&mut cmd, &device_file, &dir.join("ledger")),
            }
            for (key, value) in env(rank) {
                cmd.env(key, value);
            }
            cmd
        })
        .collect();
    // A fault scenario runs every rank to its end (one may die on purpose); the others stop
    // the job at the first failure.
    let began = std::time::Instant::now();
    let finished = if scenario.starts_with("fault") {
        procs::run_each(&dir, commands, Duration::from_secs(120))
    } else {
        procs::run_all(&dir, commands, Duration::from_secs(120))
    };
    eprintln!(
        "{name}: {ranks} ranks ran {scenario} in {:?}",
        began.elapsed()
    );
    (finished, dir)
}

fn hashes(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("HASH ")).collect()
}

fn collectives_on(name: &str, ranks: usize, ring: Option<usize>, frames: &str) {
    collectives_over(name, ranks, ring, frames, Over::Tcp);
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

#[test]
fn every_dtype_gives_the_models_bits_over_tcp() {
    dtype_job("dtypes-tcp-mesh-3", 3, None, Over::Tcp);
    dtype_job("dtypes-tcp-ring-3x2", 3, Some(2), Over::Tcp);
}

/// Runs the every-dtype scenario and returns rank 0's hashes, after checking every rank's.
fn dtype_job(name: &str, ranks: usize, ring: Option<usize>, over: Over) -> Vec<String> {
    let (finished, _) = job_over(name, "dtypes", ranks, ring, "small", over, &|_| Vec::new());
    procs::assert_all_ok(name, &finished);
    for f in &finished {
        assert!(f.output.contains("DTYPES OK"), "{name}: {}", f.output);
        assert_eq!(hashes(&f.output), hashes(&finished[0].output), "{name}");
    }
    hashes(&finished[0].output)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// Runs the collectives scenario and returns rank 0's hashes, after checking every rank's.
fn collectives_over(
    name: &str,
    ranks: usize,
    ring: Option<usize>,
    frames: &str,
    over: Over,
) -> Vec<String> {
    let (finished, _) = job_over(name, "collectives", ranks, ring, frames, over, &|_| {
        Vec::new()
    });
    procs::assert_all_ok(name, &finished);
    for f in &finished {
        assert!(f.output.contains("COLLECTIVES OK"), "{name}: {}", f.output);
        assert_eq!(hashes(&f.output), hashes(&finished[0].output), "{name}");
    }
    hashes(&finished[0].output)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// JACCL over the real RDMA fabric and the software provider.
#[cfg(feature = "jaccl")]
mod over_rdma {
    use super::*;

    #[test]
    fn meshes_of_two_to_four_ranks_give_the_bits_of_the_same_job_over_tcp() {
        for ranks in [2, 3, 4] {
            let tcp = collectives_over(
                &format!("tcp-mesh-{ranks}"),
                ranks,
                None,
                "small",
                Over::Tcp,
            );
            let rdma = collectives_over(
                &format!("rdma-mesh-{ranks}"),
                ranks,
                None,
                "small",
                Over::Rdma,
            );
            assert_eq!(rdma, tcp, "mesh of {ranks}");
        }
    }

    #[test]
    fn rings_of_two_to_four_ranks_and_one_or_two_wires_give_the_bits_over_tcp() {
        for (ranks, wires) in [(2, 1), (2, 2), (3, 1), (3, 2), (4, 1), (4, 2)] {
            let name = format!("ring-{ranks}x{wires}");
            let tcp = collectives_over(
                &format!("tcp-{name}"),
                ranks,
                Some(wires),
                "small",
                Over::Tcp,
            );
            let rdma = collectives_over(
                &format!("rdma-{name}"),
                ranks,
                Some(wires),
                "small",
                Over::Rdma,
            );
            assert_eq!(rdma, tcp, "{name}");
        }
    }

    #[test]
    fn large_frames_over_rdma_give_the_bits_over_tcp() {
        for (name, ranks, ring) in [("mesh-3", 3, None), ("ring-3x2", 3, Some(2))] {
            let tcp = collectives_over(
                &format!("tcp-{name}-large"),
                ranks,
                ring,
                "large",
                Over::Tcp,
            );
            let rdma = collectives_over(
                &format!("rdma-{name}-large"),
                ranks,
                ring,
                "large",
                Over::Rdma,
            );
            assert_eq!(rdma, tcp, "{name}, large frames");
        }
    }

    #[test]
    fn every_dtype_over_rdma_gives_the_models_bits_and_those_over_tcp() {
        for (name, ranks, ring) in [("mesh-3", 3, None), ("ring-2x2", 2, Some(2))] {
            let tcp = dtype_job(&format!("dtypes-tcp-{name}"), ranks, ring, Over::Tcp);
            let rdma = dtype_job(&format!("dtypes-rdma-{name}"), ranks, ring, Over::Rdma);
            assert_eq!(rdma, tcp, "{name}");
        }
    }

    #[test]
    fn a_lost_peer_over_rdma_fails_the_others_naming_it() {
        for (name, ring) in [("rdma-lost-mesh", None), ("rdma-lost-ring", Some(1))] {
            let (finished, _) = job_over(name, "lost_peer", 3, ring, "small", Over::Rdma, &|_| {
                vec![("NUVEC_DISTRIBUTED_TIMEOUT", "5".to_owned())]
            });
            for (rank, f) in finished.iter().enumerate().take(2) {
                assert!(
                    f.output.contains("FAILED AS EXPECTED") && f.output.contains("rank 2"),
                    "{name} rank {rank}: {}",
                    f.output
                );
            }
        }
    }

    /// Runs the fault scenario with `env(rank)` on `ranks` ranks; checks that every rank that
    /// lives fails by its deadline with an error naming a peer (`peer`, when given), that no
    /// rank saw wrong data, and that every device was closed with nothing registered.
    fn fault_job(
        name: &str,
        ranks: usize,
        ring: Option<usize>,
        env: &dyn Fn(usize) -> Vec<(&'static str, String)>,
        dies: Option<usize>,
        peer: Option<usize>,
        must_fail: bool,
    ) -> Vec<String> {
        let (finished, dir) = job_over(name, "fault", ranks, ring, "small", Over::Rdma, env);
        let mut lines = Vec::new();
        for (rank, f) in finished.iter().enumerate() {
            assert!(
                !f.output.contains("WRONG DATA"),
                "{name} rank {rank}: {}",
                f.output
            );
            if Some(rank) == dies {
                assert_ne!(
                    f.code,
                    Some(0),
                    "{name}: rank {rank} was to die: {}",
                    f.output
                );
                continue;
            }
            assert_eq!(f.code, Some(0), "{name} rank {rank}: {}", f.output);
            // (The test harness may print its own "test … ..." before it on the line.)
            let line = f
                .output
                .lines()
                .find_map(|l| l.find("FAILED AS EXPECTED").map(|at| &l[at..]));
            let Some(line) = line else {
                assert!(
                    !must_fail && f.output.contains("NO FAILURE"),
                    "{name} rank {rank} did not fail: {}",
                    f.output
                );
                continue;
            };
            let named = match peer {
                Some(p) => line.contains(&format!("rank {p}")),
                None => (0..ranks).any(|p| p != rank && line.contains(&format!("rank {p}"))),
            };
            assert!(named, "{name} rank {rank} names no peer: {line}");
            // By the deadline: the failing operation waited at most its timeout, and a little.
            let ms: u128 = line
                .split(" after ")
                .nth(1)
                .and_then(|rest| rest.split(" ms").next())
                .and_then(|ms| ms.parse().ok())
                .unwrap_or_else(|| panic!("{name}: no time in {line}"));
            assert!(
                ms <= FAULT_TIMEOUT.as_millis() + 2000,
                "{name} rank {rank} failed after {ms} ms: {line}"
            );
            assert!(
                f.output.contains("CLOSED"),
                "{name} rank {rank}: {}",
                f.output
            );
            lines.push(line.to_owned());
        }
        let ledger = dir.join("ledger");
        assert_eq!(
            emu::leaks(&ledger),
            Vec::<String>::new(),
            "{name}: left registered"
        );
        assert!(
            emu::closes(&ledger) >= ranks - usize::from(dies.is_some()),
            "{name}: devices not closed"
        );
        lines
    }

    #[test]
    fn lost_messages_end_in_errors_naming_a_peer_and_never_in_wrong_data() {
        for (name, ring) in [("loss-mesh", None), ("loss-ring", Some(1))] {
            let lines = fault_job(
                name,
                3,
                ring,
                &|rank| {
                    vec![
                        ("NUVEC_VERBS_EMU_LOSS", "0.01".to_owned()),
                        ("NUVEC_VERBS_EMU_SEED", (rank + 1).to_string()),
                    ]
                },
                None,
                None,
                true,
            );
            assert!(
                lines.iter().any(|l| l.contains("was lost")),
                "{name}: no rank saw a lost message: {lines:?}"
            );
        }
    }

    #[test]
    fn an_error_completion_fails_its_rank_naming_the_status_and_the_others_by_the_deadline() {
        let lines = fault_job(
            "fail-wr",
            3,
            None,
            &|rank| {
                if rank == 1 {
                    vec![("NUVEC_VERBS_EMU_FAIL_WR", "150".to_owned())]
                } else {
                    Vec::new()
                }
            },
            None,
            None,
            true,
        );
        assert!(
            lines[1].contains("IBV_WC_GENERAL_ERR"),
            "rank 1 does not name the status: {}",
            lines[1]
        );
    }

    #[test]
    fn a_rank_that_dies_in_silence_is_named_by_the_others_at_their_deadline() {
        for (name, ring) in [("die-mesh", None), ("die-ring", Some(1))] {
            fault_job(
                name,
                3,
                ring,
                &|rank| {
                    if rank == 2 {
                        vec![("NUVEC_VERBS_EMU_DIE_AFTER", "120".to_owned())]
                    } else {
                        Vec::new()
                    }
                },
                Some(2),
                Some(2),
                true,
            );
        }
    }

    #[test]
    fn under_strict_uc_drops_a_job_succeeds_or_fails_naming_a_peer_never_with_wrong_data() {
        for (name, ring) in [("drop-mesh", None), ("drop-ring", Some(2))] {
            fault_job(
                name,
                3,
                ring,
                &|_| vec![("NUVEC_VERBS_EMU_UNEXPECTED", "drop".to_owned())],
                None,
                None,
                false,
            );
        }
    }

    #[test]
    fn without_immediate_data_the_fabric_falls_back_to_plain_sends_with_the_same_bits() {
        let tcp = collectives_over("tcp-mesh-3-plain", 3, None, "small", Over::Tcp);
        let (finished, _) = job_over(
            "rdma-mesh-3-plain",
            "collectives",
            3,
            None,
            "small",
            Over::Rdma,
            &|_| vec![("NUVEC_VERBS_EMU_NO_IMM", "1".to_owned())],
        );
        procs::assert_all_ok("rdma-mesh-3-plain", &finished);
        for f in &finished {
            assert!(f.output.contains("COLLECTIVES OK"), "{}", f.output);
            assert_eq!(hashes(&f.output), tcp, "plain sends");
        }
    }

    #[test]
    fn over_the_providers_tcp_wire_meshes_and_rings_give_the_bits_over_unix_sockets() {
        for (name, ranks, ring) in [("mesh-3", 3, None), ("ring-3x2", 3, Some(2))] {
            let unix = collectives_over(
                &format!("rdma-{name}-unix"),
                ranks,
                ring,
                "large",
                Over::Rdma,
            );
            let (finished, _) = job_over(
                &format!("rdma-{name}-tcp-wire"),
                "collectives",
                ranks,
                ring,
                "large",
                Over::Rdma,
                &|_| vec![("NUVEC_VERBS_EMU_WIRE", "tcp:127.0.0.1".to_owned())],
            );
            procs::assert_all_ok(name, &finished);
            for f in &finished {
                assert!(f.output.contains("COLLECTIVES OK"), "{}", f.output);
                assert_eq!(hashes(&f.output), unix, "{name} over the TCP wire");
            }
        }
    }
}
