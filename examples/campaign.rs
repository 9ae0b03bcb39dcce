//! A fault campaign: seeded scenarios of MLX's ring and of JACCL in simulation, each checked against the
//! invariants (no hang, no wrong result, failures name a peer, replays match).
//!
//! `cargo run --release --ignore-rust-version --example campaign -- --count 10000 [--seed FIRST]`
//! A failing seed replays with `--seed S --count 1`.

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut first = 0u64;
    let mut count = 1000u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--seed" => first = value()?.parse()?,
            "--count" => count = value()?.parse()?,
            "-h" | "--help" => {
                println!("usage: campaign [--seed FIRST] [--count N]");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)").into()),
        }
    }
    let started = Instant::now();
    let violations = nuvec_fabric_sim::campaign::run(first, count, 10);
    for v in &violations {
        println!("VIOLATION {v}");
    }
    println!(
        "{count} scenarios from seed {first}: {} violations in {:.1?}",
        violations.len(),
        started.elapsed()
    );
    if violations.is_empty() {
        Ok(())
    } else {
        Err("the campaign found violations".into())
    }
}
