//! The README's main job: an all_sum across N ranks of a TCP ring on this machine.
//!
//! `cargo run --release --ignore-rust-version --example all_sum -- -n 4` starts 4 local ranks
//! (processes of this example, connected over loopback; on Linux their links then carry the
//! bytes through shared memory, `NUVEC_DISTRIBUTED_LOCAL_LINKS=0` keeps them on TCP), each of which joins the ring with
//! `nuvec_distributed::init`, checks an all_sum of small arrays, then times all_sums of
//! growing float32 arrays; rank 0 prints the results and the bandwidth. Under `mlx.launch`
//! (which sets `MLX_HOSTFILE` and `MLX_RANK`) the same binary runs as one rank:
//! `mlx.launch -n 4 target/release/examples/all_sum`.
//!
//! The local ranks are started by this workspace's `nuvec-local` (a dev-dependency, not
//! published): in a program of your own, run it under `nuvec-launch -n 4` instead.

use std::time::{Duration, Instant};

use nuvec_core::{Array, array, distributed, ops};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// How the launcher tells its ranks the largest size to time.
const MAX_BYTES: &str = "NUVEC_EXAMPLE_MAX_BYTES";

fn main() -> Result<()> {
    if std::env::var_os("MLX_RANK").is_some() {
        return rank();
    }
    let mut args = std::env::args().skip(1);
    let mut ranks = 4usize;
    let mut conns = 1usize;
    let mut max_bytes = 64usize << 20;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--max-bytes" => {
                max_bytes = args.next().ok_or("--max-bytes needs a number")?.parse()?
            }
            "-n" | "--ranks" => ranks = args.next().ok_or("-n needs a number")?.parse()?,
            "-c" | "--connections" => conns = args.next().ok_or("-c needs a number")?.parse()?,
            "-h" | "--help" => {
                println!("usage: all_sum [-n RANKS] [-c CONNECTIONS_PER_RANK] [--max-bytes B]");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)").into()),
        }
    }
    launch(ranks.max(1), conns.max(1), max_bytes)
}

/// Starts `ranks` copies of this program as the ranks of a local ring and waits for them
/// (bounded; a failing rank stops the others and its output is printed).
fn launch(ranks: usize, conns: usize, max_bytes: usize) -> Result<()> {
    // Free loopback ports in a hostfile, MLX_HOSTFILE and MLX_RANK on every rank: what
    // `nuvec-launch -n 4 -- target/release/examples/all_sum` does.
    let job = nuvec_local::Job::this_program("all-sum", ranks)?.ring(conns)?;
    if let Some(hostfile) = job.hostfile() {
        println!(
            "{ranks} ranks, {conns} connection(s) per neighbour, hostfile {}",
            hostfile.display()
        );
    }
    job.env(MAX_BYTES, max_bytes.to_string()).run_ok()?;
    Ok(())
}

/// One rank: join the ring, check, and time.
fn rank() -> Result<()> {
    let group = nuvec_distributed::init(true)?;
    let (r, n) = (group.rank(), group.size());
    // Every rank contributes [r, 1]: the sum is [0 + 1 + … + (n−1), n] on every rank.
    let x = array![r as f32, 1.0];
    let total = distributed::all_sum(&x, None).to_vec::<f32>()?;
    println!("rank {r} of {n}: all_sum([rank, 1]) = {total:?}");
    assert_eq!(total, [(n * (n - 1) / 2) as f32, n as f32]);
    if r == 0 {
        println!(
            "{:>12} {:>10} {:>12} {:>12}",
            "bytes", "p50 (µs)", "algbw GB/s", "busbw GB/s"
        );
    }
    let max_bytes: usize = match std::env::var(MAX_BYTES) {
        Ok(v) => v.parse()?,
        Err(_) => 64 << 20,
    };
    let mut bytes = 4096usize;
    while bytes <= max_bytes {
        let elements = bytes / 4;
        let x = ops::full([elements], 1.0f32);
        x.eval()?;
        let reps = (256 << 20) / bytes.max(1 << 20) + 4;
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            // A barrier, so every rank starts the timed all_sum together.
            distributed::all_sum(&Array::from(0.0f32), None).eval()?;
            let start = Instant::now();
            let y = distributed::all_sum(&x, None);
            y.eval()?;
            times.push(start.elapsed());
        }
        let y = distributed::all_sum(&x, None).to_vec::<f32>()?;
        assert!(y.iter().all(|&v| v == n as f32), "wrong all_sum result");
        times.sort();
        let p50: Duration = times[times.len() / 2];
        let algbw = bytes as f64 / p50.as_secs_f64() / 1e9;
        let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
        if r == 0 {
            println!(
                "{bytes:>12} {:>10.1} {algbw:>12.2} {busbw:>12.2}",
                p50.as_secs_f64() * 1e6
            );
        }
        bytes *= 4;
    }
    Ok(())
}
