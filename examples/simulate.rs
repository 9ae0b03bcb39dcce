//! An all-reduce across N simulated ranks in one process: deterministic per seed, in virtual
//! time, optionally with a fault, showing the results, the trace hash and the error a user gets.
//!
//! `cargo run --ignore-rust-version --example simulate -- --ranks 4`
//! `cargo run --ignore-rust-version --example simulate -- --ranks 4 --crash 2 --seed 7`
//! `cargo run --ignore-rust-version --example simulate -- --ranks 2 --mismatch 1 --wire mlx`
//! (rank 1 calls all_gather where the others call all_sum: wrong numbers on MLX's wire, an
//! error naming both calls on the nuvec wire, the default)

use std::time::Duration;

use nuvec_core::{Array, distributed};
use nuvec_distributed::Wire;
use nuvec_fabric_sim::{Fault, Outcome, Sim};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut ranks = 4usize;
    let mut links = 1usize;
    let mut seed = 1u64;
    let mut crash: Option<usize> = None;
    let mut mismatch: Option<usize> = None;
    let mut wire = Wire::Nuvec;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--ranks" | "-n" => ranks = value()?.parse()?,
            "--links" | "-c" => links = value()?.parse()?,
            "--seed" => seed = value()?.parse()?,
            "--crash" => crash = Some(value()?.parse()?),
            "--mismatch" => mismatch = Some(value()?.parse()?),
            "--wire" => {
                wire = match value()?.as_str() {
                    "mlx" => Wire::Mlx,
                    "nuvec" => Wire::Nuvec,
                    other => return Err(format!("no wire {other:?} (mlx or nuvec)").into()),
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: simulate [--ranks N] [--links C] [--seed S] [--crash RANK] \
                     [--mismatch RANK] [--wire mlx|nuvec]"
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)").into()),
        }
    }
    let mut sim = Sim::ring(ranks.max(1), links.max(1))
        .seed(seed)
        .max_fragment(1500)
        .latency(Duration::from_micros(20), Duration::from_micros(30))
        .wire(wire);
    if let Some(rank) = crash {
        // The rank crashes at its second fabric call: in the middle of the first all_sum.
        sim = sim.fault(Fault::Crash { rank, call: 1 });
    }
    println!(
        "{ranks} simulated ranks, {links} link(s) per neighbour, {wire}, seed {}",
        sim.effective_seed()
    );
    let report = sim.run_ring(Duration::from_secs(30), |group| {
        let rank = group.rank() as f32;
        // Every rank contributes rank + i for element i of 10: a few steps of MLX's ring.
        let x = Array::from_slice(&(0..10).map(|i| rank + i as f32).collect::<Vec<_>>(), [10]);
        if mismatch == Some(group.rank()) {
            // A bug: this rank gathers where the others sum.
            return distributed::all_gather(&x, Some(&group)).to_vec::<f32>();
        }
        distributed::all_sum(&x, Some(&group)).to_vec::<f32>()
    });
    for (rank, outcome) in report.outcomes.iter().enumerate() {
        match outcome {
            Outcome::Returned(Ok(values)) => println!("rank {rank}: {values:?}"),
            Outcome::Returned(Err(error)) => println!("rank {rank}: error: {error}"),
            Outcome::Crashed => println!("rank {rank}: crashed (injected)"),
            Outcome::Panicked(message) => println!("rank {rank}: panicked: {message}"),
        }
    }
    println!(
        "virtual time {:?}, trace hash {:016x} (replay: {} cargo run --example simulate ...)",
        report.end,
        report.trace_hash,
        report.replay()
    );
    Ok(())
}
