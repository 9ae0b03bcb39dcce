//! The ring across processes over loopback, through `nuvec_core::distributed`: every
//! collective, dtype and shape class on 2, 3, 4 and 8 ranks with 1 and 2 connections, the same
//! bits on every rank and on reruns, transforms through collectives, and lost peers; and
//! local links: ranks on one machine use them, every result's bits are those of TCP links,
//! and with them turned off every link stays TCP.

use crate::common::pattern;
use crate::common::ports;
use crate::common::procs;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nuvec_core::distributed::{self, Group};
use nuvec_core::{Array, DType, array, grad, ops, vmap};

const CHILD_TEST: &str = concat!(module_path!(), "::a_rank_runs_its_scenario");
const SCENARIO: &str = "NUVEC_TEST_SCENARIO";

const DTYPES: [(&str, DType); 14] = [
    ("bool", DType::Bool),
    ("uint8", DType::U8),
    ("uint16", DType::U16),
    ("uint32", DType::U32),
    ("uint64", DType::U64),
    ("int8", DType::I8),
    ("int16", DType::I16),
    ("int32", DType::I32),
    ("int64", DType::I64),
    ("float16", DType::F16),
    ("bfloat16", DType::BF16),
    ("float32", DType::F32),
    ("float64", DType::F64),
    ("complex64", DType::Complex64),
];

/// The raw bytes of an array.
fn bytes(a: &Array) -> Vec<u8> {
    let n: i32 = a.shape().iter().product();
    ops::view(&ops::reshape(a, [n as usize]), DType::U8)
        .to_vec::<u8>()
        .expect("array bytes")
}

/// An array of `shape` and `dtype` holding `data`.
fn array_of(data: &[u8], dtype: DType, shape: &[usize]) -> Array {
    let flat = Array::from_slice(data, [data.len()]);
    let n: usize = shape.iter().product();
    let typed = ops::view(&flat, dtype);
    let typed = ops::reshape(&typed, [n]);
    ops::reshape(&typed, shape.to_vec())
}

fn hash(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The shapes of every class: empty, scalar, fewer elements than ranks, as many, not
/// divisible, and a multi-MiB one.
fn shapes(size: usize) -> Vec<Vec<usize>> {
    vec![
        vec![0],
        vec![],
        vec![size - 1],
        vec![size],
        vec![7, 5],
        vec![1001],
        vec![3, 1 << 18],
    ]
}

/// Every collective over every dtype and shape, printing one `RESULT` line per result.
fn collectives(group: &Group) {
    let (rank, size) = (group.rank(), group.size());
    let mut index = 0;
    for (name, dtype) in DTYPES {
        for shape in shapes(size) {
            let n: usize = shape.iter().product();
            if n > 1000 && !matches!(dtype, DType::F32 | DType::U8 | DType::BF16) {
                continue;
            }
            let input = pattern::pattern(name, index as u64 + 1, rank, n);
            let x = array_of(&input, dtype, &shape);
            let results = [
                ("all_sum", distributed::all_sum(&x, Some(group))),
                ("all_max", distributed::all_max(&x, Some(group))),
                ("all_min", distributed::all_min(&x, Some(group))),
                ("all_gather", distributed::all_gather(&x, Some(group))),
            ];
            for (op, y) in results {
                let got = bytes(&y);
                let want_shape: Vec<i32> = if op == "all_gather" {
                    match shape.split_first() {
                        None => vec![size as i32],
                        Some((first, rest)) => std::iter::once((first * size) as i32)
                            .chain(rest.iter().map(|&d| d as i32))
                            .collect(),
                    }
                } else {
                    shape.iter().map(|&d| d as i32).collect()
                };
                assert_eq!(y.shape(), want_shape.as_slice(), "{op} {name} {shape:?}");
                println!("RESULT {index} {op} {name} {shape:?} {:016x}", hash(&got));
                // Check what can be checked exactly against every rank's input.
                let inputs: Vec<Vec<u8>> = (0..size)
                    .map(|r| pattern::pattern(name, index as u64 + 1, r, n))
                    .collect();
                if op == "all_gather" {
                    assert_eq!(got, inputs.concat(), "{op} {name} {shape:?}");
                } else if matches!(dtype, DType::I32 | DType::U8 | DType::I64) && op == "all_sum" {
                    let s = pattern::dtype_size(name).expect("size");
                    let mut want = vec![0u8; n * s];
                    for e in 0..n {
                        let total = inputs.iter().fold(0u64, |acc, inp| {
                            let mut b = [0u8; 8];
                            b[..s].copy_from_slice(&inp[e * s..(e + 1) * s]);
                            acc.wrapping_add(match s {
                                1 => u64::from(b[0]),
                                4 => {
                                    i32::from_le_bytes(b[..4].try_into().expect("4")) as i64 as u64
                                }
                                _ => u64::from_le_bytes(b),
                            })
                        });
                        want[e * s..(e + 1) * s].copy_from_slice(&total.to_le_bytes()[..s]);
                    }
                    assert_eq!(got, want, "{op} {name} {shape:?}");
                }
            }
            index += 1;
        }
    }
    // Neighbour send and receive, both ways, through nuvec's framing.
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    for n in [1usize, 300, 5000] {
        let mine = Array::from_slice(&pattern::pattern("int32", n as u64, rank, n), [n * 4]);
        let mine = ops::view(&mine, DType::I32);
        let theirs = if rank % 2 == 0 {
            distributed::send(&mine, right, Some(group))
                .eval()
                .expect("send");
            distributed::recv([n], DType::I32, left, Some(group))
        } else {
            let got = distributed::recv([n], DType::I32, left, Some(group));
            got.eval().expect("recv");
            distributed::send(&mine, right, Some(group))
                .eval()
                .expect("send");
            got
        };
        assert_eq!(
            bytes(&theirs),
            pattern::pattern("int32", n as u64, left, n),
            "recv of {n} from {left}"
        );
    }
    println!("DONE");
}

/// Gradients and vmap through collectives.
fn transforms(group: &Group) {
    let size = group.size() as f32;
    let rank = group.rank() as f32;
    // d/dx sum(all_sum(x * x)) = 2x on every rank (the cotangent passes through).
    let g = grad(|x: &Array| distributed::all_sum(&x.multiply(x), Some(group)).sum(..));
    let x = array![1.0, 2.0, 3.0].add(Array::from(rank));
    let gx = g(&x).expect("grad").to_vec::<f32>().expect("grad values");
    let want: Vec<f32> = [1.0, 2.0, 3.0].iter().map(|v| 2.0 * (v + rank)).collect();
    assert_eq!(gx, want);
    // all_gather's vjp takes this rank's rows.
    let g = grad(|x: &Array| {
        distributed::all_gather(x, Some(group))
            .multiply(ops::arange(0.0f32, size, 1.0f32))
            .sum(..)
    });
    let gx = g(&Array::from_slice(&[5.0f32], [1]))
        .expect("grad")
        .to_vec::<f32>()
        .expect("values");
    assert_eq!(gx, [rank]);
    // vmap keeps the batch axis for reductions.
    let batched = vmap(|x: &Array| distributed::all_sum(x, Some(group)));
    let xs = array![[1.0, 2.0], [3.0, 4.0]];
    let ys = batched
        .call(&xs)
        .expect("vmap")
        .to_vec::<f32>()
        .expect("values");
    assert_eq!(ys, [size, 2.0 * size, 3.0 * size, 4.0 * size]);
    println!("DONE");
}

/// The last rank exits after one collective; the others run a second one.
fn lost_peer(group: &Group) {
    let x = array![1.0, 2.0];
    distributed::all_sum(&x, Some(group))
        .eval()
        .expect("first all_sum");
    if group.rank() + 1 == group.size() {
        println!("EXITING");
        std::process::exit(0);
    }
    let started = Instant::now();
    let err = distributed::all_sum(&x, Some(group))
        .eval()
        .expect_err("the second all_sum must fail");
    println!("ERROR {err}");
    println!("WAITED {:?}", started.elapsed());
    let again = Instant::now();
    let err2 = distributed::all_sum(&x, Some(group))
        .eval()
        .expect_err("still failed");
    println!("AGAIN {err2}");
    assert!(again.elapsed() < Duration::from_secs(1));
    println!("DONE");
}

/// The last rank sends itself `signal` at the start of its second all_sum of 16 MiB; the
/// others report the error they get and how long it took.
fn signalled(group: &Group, signal: &str) {
    let x = ops::full([4usize << 20], 1.0f32);
    distributed::all_sum(&x, Some(group))
        .eval()
        .expect("first all_sum");
    if group.rank() + 1 == group.size() {
        let pid = std::process::id().to_string();
        let mut kill = std::process::Command::new("kill");
        kill.args([signal, &pid]);
        // Not waited for: the signal stops or ends this very process.
        #[allow(clippy::zombie_processes)]
        kill.spawn().expect("run kill");
    }
    let started = Instant::now();
    let result = distributed::all_sum(&x, Some(group)).eval();
    match result {
        Ok(()) => println!("SUCCEEDED"),
        Err(e) => println!("ERROR {e}"),
    }
    println!("WAITED_MS {}", started.elapsed().as_millis());
}

#[test]
fn a_rank_runs_its_scenario() {
    if !procs::is_child(CHILD_TEST) {
        return;
    }
    let scenario = std::env::var(SCENARIO).expect("scenario");
    let group = nuvec_distributed::init(true).unwrap_or_else(|e| {
        println!("INIT FAILED {e}");
        std::process::exit(3)
    });
    assert_eq!(distributed::default_group().size(), group.size());
    match scenario.as_str() {
        "collectives" => collectives(&group),
        "transforms" => transforms(&group),
        "lost_peer" => lost_peer(&group),
        "sigkill" => signalled(&group, "-KILL"),
        "sigstop" => signalled(&group, "-STOP"),
        other => panic!("unknown scenario {other}"),
    }
}

/// Runs `ranks` processes of `scenario` with `conns` connections per neighbour; `skip` ranks
/// are not started. Returns each started rank's output.
fn job(
    name: &str,
    scenario: &str,
    ranks: usize,
    conns: usize,
    timeout_secs: &str,
    skip: &[usize],
) -> Vec<procs::Finished> {
    job_until(
        name,
        scenario,
        (ranks, conns),
        timeout_secs,
        skip,
        None,
        &[],
    )
}

/// As [`job`] of `(ranks, conns)`; with `until`, waits only for those ranks and kills the
/// rest; every rank gets `env` on top.
fn job_until(
    name: &str,
    scenario: &str,
    (ranks, conns): (usize, usize),
    timeout_secs: &str,
    skip: &[usize],
    until: Option<&[usize]>,
    env: &[(&str, &str)],
) -> Vec<procs::Finished> {
    let _one_job_at_a_time = procs::exclusive();
    let dir = procs::scratch(name);
    let nodes = ports::free_nodes(ranks, conns);
    let hostfile = procs::write_hostfile(&dir, &nodes);
    let commands = (0..ranks)
        .filter(|r| !skip.contains(r))
        .map(|r| {
            let mut cmd = procs::this_test(CHILD_TEST);
            cmd.env(SCENARIO, scenario)
                .env("MLX_HOSTFILE", &hostfile)
                .env("MLX_RANK", r.to_string())
                .env("NUVEC_DISTRIBUTED_TIMEOUT", timeout_secs)
                .envs(env.iter().copied());
            cmd
        })
        .collect();
    let timeout = Duration::from_secs(300);
    match until {
        Some(ranks) => procs::run_until(&dir, commands, timeout, ranks),
        None if skip.is_empty() => procs::run_all(&dir, commands, timeout),
        None => procs::run_each(&dir, commands, timeout),
    }
}

/// The rest of a line after `tag` (the test harness may print its own text before it).
fn tagged<'a>(line: &'a str, tag: &str) -> Option<&'a str> {
    line.find(tag).map(|i| &line[i + tag.len()..])
}

fn find_tagged<'a>(output: &'a str, tag: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| tagged(l, tag))
        .unwrap_or_else(|| panic!("no {tag:?} line in:\n{output}"))
}

fn results(finished: &[procs::Finished]) -> Vec<BTreeMap<String, String>> {
    finished
        .iter()
        .map(|f| {
            f.output
                .lines()
                .filter_map(|l| tagged(l, "RESULT "))
                .map(|l| {
                    let (key, hash) = l.rsplit_once(' ').expect("a result line");
                    (key.to_string(), hash.to_string())
                })
                .collect()
        })
        .collect()
}

fn collectives_agree(ranks: usize, conns: usize) {
    let name = format!("collectives-r{ranks}-c{conns}");
    let first = job(&name, "collectives", ranks, conns, "60", &[]);
    procs::assert_all_ok(&name, &first);
    let first = results(&first);
    assert!(first[0].len() > 100, "too few results: {}", first[0].len());
    for (r, res) in first.iter().enumerate() {
        assert_eq!(res, &first[0], "rank {r} differs from rank 0 ({name})");
    }
    let again = job(&name, "collectives", ranks, conns, "60", &[]);
    procs::assert_all_ok(&name, &again);
    assert_eq!(results(&again)[0], first[0], "a rerun differs ({name})");
}

#[test]
fn collectives_agree_on_two_ranks_with_one_and_two_connections() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    collectives_agree(2, 1);
    collectives_agree(2, 2);
}

#[test]
fn collectives_agree_on_three_ranks_with_one_and_two_connections() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    collectives_agree(3, 1);
    collectives_agree(3, 2);
}

#[test]
fn collectives_agree_on_four_ranks_with_one_and_two_connections() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    collectives_agree(4, 1);
    collectives_agree(4, 2);
}

#[test]
fn collectives_agree_on_eight_ranks() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    collectives_agree(8, 1);
}

#[test]
fn gradients_and_vmap_pass_through_collectives() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    for ranks in [2, 3] {
        let finished = job("transforms", "transforms", ranks, 1, "30", &[]);
        procs::assert_all_ok("transforms", &finished);
    }
}

#[test]
fn a_peer_that_exits_fails_the_others_naming_it() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    let finished = job("lost-peer", "lost_peer", 3, 1, "20", &[]);
    procs::assert_all_ok("lost peer", &finished);
    for f in &finished[..2] {
        let error = find_tagged(&f.output, "ERROR ");
        assert!(
            error.contains("rank 2"),
            "the error names the lost rank: {error}"
        );
        assert!(
            error.contains("all_sum #1"),
            "the error names the operation: {error}"
        );
        let again = find_tagged(&f.output, "AGAIN ");
        assert!(again.contains("failed earlier"), "{again}");
    }
}

#[test]
fn a_rank_that_never_starts_fails_init_within_the_timeout() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    let started = Instant::now();
    let finished = job("never-starts", "collectives", 3, 1, "2", &[1]);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    for f in &finished {
        assert_eq!(f.code, Some(3), "{}", f.output);
        let line = find_tagged(&f.output, "INIT FAILED ");
        assert!(
            line.contains("rank 1"),
            "the error names the missing rank: {line}"
        );
    }
}

/// Runs a 3-rank job whose last rank signals itself mid-collective, and checks that the other
/// two fail naming it, within the timeout (plus slack for loaded machines).
fn the_others_fail_naming_the_signalled_rank(scenario: &str, timeout_secs: u64) {
    let started = Instant::now();
    let finished = job_until(
        scenario,
        scenario,
        (3, 1),
        &timeout_secs.to_string(),
        &[],
        Some(&[0, 1]),
        &[],
    );
    for (rank, f) in finished.iter().enumerate().take(2) {
        assert_eq!(f.code, Some(0), "rank {rank}:\n{}", f.output);
        let error = find_tagged(&f.output, "ERROR ");
        assert!(
            error.contains("rank 2"),
            "rank {rank}'s error names rank 2: {error}"
        );
        let waited: u64 = find_tagged(&f.output, "WAITED_MS ")
            .parse()
            .expect("milliseconds");
        assert!(
            waited <= timeout_secs * 1000 + 2000,
            "rank {rank} waited {waited} ms for a {timeout_secs} s timeout"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_rank_killed_mid_collective_fails_the_others_naming_it() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    the_others_fail_naming_the_signalled_rank("sigkill", 20);
}

#[test]
fn a_stalled_rank_fails_the_others_naming_it_within_the_timeout() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    the_others_fail_naming_the_signalled_rank("sigstop", 3);
}

/// How many of a rank's connections its log (`NUVEC_DISTRIBUTED_LOG=debug`) calls local links.
fn local_links_logged(output: &str) -> usize {
    output
        .lines()
        .filter(|l| l.contains("is a local link (shared memory)"))
        .count()
}

#[test]
fn ranks_on_one_machine_use_local_links_and_the_bits_of_tcp_links() {
    if procs::is_child(CHILD_TEST) {
        return;
    }
    // Every collective, dtype and shape class, once over local links and once over TCP.
    let debug = [("NUVEC_DISTRIBUTED_LOG", "debug")];
    let local = job_until(
        "local-links",
        "collectives",
        (3, 2),
        "60",
        &[],
        None,
        &debug,
    );
    procs::assert_all_ok("local links", &local);
    for (r, f) in local.iter().enumerate() {
        // Two connections to the right neighbour and two from the left one.
        assert_eq!(local_links_logged(&f.output), 4, "rank {r}:\n{}", f.output);
    }
    let tcp_env = [
        ("NUVEC_DISTRIBUTED_LOG", "debug"),
        ("NUVEC_DISTRIBUTED_LOCAL_LINKS", "0"),
    ];
    let tcp = job_until(
        "tcp-links",
        "collectives",
        (3, 2),
        "60",
        &[],
        None,
        &tcp_env,
    );
    procs::assert_all_ok("tcp links", &tcp);
    for (r, f) in tcp.iter().enumerate() {
        assert_eq!(local_links_logged(&f.output), 0, "rank {r}:\n{}", f.output);
    }
    let (local, tcp) = (results(&local), results(&tcp));
    assert!(local[0].len() > 100, "too few results: {}", local[0].len());
    for r in 0..3 {
        assert_eq!(
            local[r], local[0],
            "rank {r} differs from rank 0 over local links"
        );
        assert_eq!(
            tcp[r], local[0],
            "rank {r} over TCP differs from local links"
        );
    }
}
