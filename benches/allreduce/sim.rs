//! `--fabric sim`: every rank a thread of this process over `nuvec-fabric-sim`, timed in
//! virtual time (a sanity check of the schedule, not a measurement of this machine).

use std::time::{Duration, Instant};

use nuvec_distributed::RingCommunicator;
use nuvec_distributed::jaccl::{FrameRule, JacclCommunicator};
use nuvec_fabric_sim::{Sim, SimFabric};

use crate::Result;
use crate::args::{Agg, Args, Backend};
use crate::measure::{Clock, measure_all};
use crate::report::{Row, print_header, print_rows};

/// Runs every rank in this process over the simulator (the ring over its stream channels,
/// JACCL over its UC message channels) and prints rank 0's virtual times.
pub(crate) fn run_sim(args: &Args) -> Result<()> {
    let n = args.ranks.max(2);
    let mut args = args.clone();
    args.ranks = n;
    args.agg = Agg::Rank0;
    let (sim, fabric) = match args.backend {
        Backend::Ring => (Sim::ring(n, args.conns), "sim"),
        Backend::JacclMesh => (Sim::mesh(n), "sim (UC message channels)"),
        Backend::JacclRing => (Sim::jaccl_ring(n, args.conns), "sim (UC message channels)"),
    };
    let (sim, link) = match args.sim_link {
        None => (sim, "5 ± 5 µs latency, 10 GB/s per link".to_string()),
        Some(link) => (
            sim.latency(link.latency, Duration::ZERO)
                .bandwidth(link.bytes_per_sec)
                .window(link.window),
            format!(
                "{:?} latency, {:.1} Gbit/s per link and direction, {} KiB windows",
                link.latency,
                link.bytes_per_sec as f64 * 8.0 / 1e9,
                link.window >> 10
            ),
        ),
    };
    let fabric = format!("{fabric}, virtual time: {link}");
    let started = Instant::now();
    let report = sim.run(|fabric| sim_rank(&args, fabric));
    let wall = started.elapsed();
    let mut rows = Vec::new();
    for (r, outcome) in report.outcomes.into_iter().enumerate() {
        match outcome.returned() {
            Some(Ok(rank_rows)) if r == 0 => rows = rank_rows,
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(format!("simulated rank {r}: {e}").into()),
            None => return Err(format!("simulated rank {r} panicked or crashed").into()),
        }
    }
    print_header(&args, n, &fabric);
    print_rows(&args, n, &rows, &[]);
    println!(
        "# simulated end time {:?}, seed {}",
        report.end, report.seed
    );
    // The simulator's own speed: every byte any rank put on a simulated wire (warm-up,
    // barriers and timed iterations) over the wall-clock time of the whole run.
    println!(
        "# simulator speed: {:.1} MB of payload in {:.3} s of wall-clock time = {:.0} MB/s",
        report.payload as f64 / 1e6,
        wall.as_secs_f64(),
        report.payload as f64 / 1e6 / wall.as_secs_f64()
    );
    Ok(())
}

/// One simulated rank: the communicator of `args.backend` over its fabric, timed on the
/// virtual clock, with no wire; its rows (every rank's check included in each).
pub(crate) fn sim_rank(args: &Args, fabric: SimFabric) -> Result<Vec<Row>> {
    let clock = Clock::Virtual(fabric.clock());
    let (rule, timeout) = (FrameRule::Small, args.timeout);
    let measured = match args.backend {
        Backend::Ring => {
            let comm = RingCommunicator::new(fabric, args.conns, timeout);
            measure_all(args, &comm, &clock, None)?
        }
        Backend::JacclMesh => {
            let comm = JacclCommunicator::mesh(fabric, rule, timeout);
            measure_all(args, &comm, &clock, None)?
        }
        Backend::JacclRing => {
            let comm = JacclCommunicator::ring(fabric, args.conns, rule, timeout);
            measure_all(args, &comm, &clock, None)?
        }
    };
    Ok(measured.rows)
}
