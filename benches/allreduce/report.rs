//! The printed tables: the `#` header lines, the communicator's rows (with `%wire` and
//! `cpu÷wire` against the wire row of the same size), the wire's rows and the ping-pong lines.
//! `benches/compare.sh` and `benches/plot.py` parse this output: its columns are an interface.

use crate::args::{Agg, Args, Backend, Op};
use crate::wire::{INLINE_STEP, Wire};

/// Percentiles of one row's iteration times, in seconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stats {
    /// The median.
    pub(crate) p50: f64,
    /// The 99th percentile (nearest rank).
    pub(crate) p99: f64,
    /// CPU seconds one operation took on a rank (all its threads), the mean over ranks and
    /// iterations; NaN where unknown.
    pub(crate) cpu: f64,
}

/// Percentiles from iteration times.
impl Stats {
    /// The p50 and p99 of `times` (nearest rank); the CPU time unknown.
    pub(crate) fn of(mut times: Vec<f64>) -> Self {
        times.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let i = ((q * times.len() as f64).ceil() as usize).saturating_sub(1);
            times[i.min(times.len() - 1)]
        };
        Stats {
            p50: at(0.5),
            p99: at(0.99),
            cpu: f64::NAN,
        }
    }
}

/// One measured row: what was moved and how long it took.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    /// Bytes moved (an all-gather's gathered total).
    pub(crate) bytes: usize,
    /// The iterations' times.
    pub(crate) stats: Stats,
    /// Whether every rank's result was exact; `None` for the wire, which checks nothing.
    pub(crate) ok: Option<bool>,
}

/// `bytes / seconds` in GB/s.
pub(crate) fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// Prints what is measured and how, as `#` lines.
pub(crate) fn print_header(args: &Args, n: usize, fabric: &str) {
    let time = match (args.sim, args.agg) {
        (true, _) => "virtual time of rank 0",
        (false, Agg::Mean) => "the mean over the ranks",
        (false, Agg::Max) => "the slowest rank's",
        (false, Agg::Rank0) => "rank 0's",
    };
    let cabling = match args.backend {
        Backend::Ring => format!("{} connection(s) per neighbour", args.conns),
        Backend::JacclMesh => "one cable per pair of ranks, small frames".into(),
        Backend::JacclRing => format!("{} cable(s) per neighbour, small frames", args.conns),
    };
    println!(
        "# nuvec-distributed {}: {} of {}, {n} ranks, {cabling}, fabric {fabric}",
        args.backend.label(),
        args.op.name(),
        args.dtype.name(),
    );
    println!(
        "# per size: warm-up, then timed iterations each after a barrier (all_sum of one byte per rank); time of an iteration = {time}; p50/p99 over iterations"
    );
    let what = match args.op {
        Op::AllReduce(_) => "busbw = algbw × 2(n−1)/n",
        Op::AllGather => "bytes = gathered total, busbw = algbw × (n−1)/n",
        Op::SendRecv => "time = rank 0's round trip 0→1→0, algbw = busbw = bytes / (time/2)",
    };
    println!("# algbw = bytes / p50; {what}");
}

/// `secs` in µs, or `-` when unknown.
pub(crate) fn micros(secs: f64) -> String {
    if secs.is_finite() {
        format!("{:.1}", secs * 1e6)
    } else {
        "-".into()
    }
}

/// Prints the table of the communicator's rows, with each row's busbw as a percentage of the wire
/// row of the same size and its CPU time as a multiple of the wire's.
pub(crate) fn print_rows(args: &Args, n: usize, rows: &[Row], wire: &[Option<Row>]) {
    let vs_wire = if wire.iter().any(Option::is_some) {
        format!(" {:>6} {:>9}", "%wire", "cpu÷wire")
    } else {
        String::new()
    };
    println!(
        "{:>12} {:>11} {:>9} {:>10} {:>10} {:>11} {:>10} {:>10} {:>5} {:>5}{vs_wire}",
        "bytes",
        "elements",
        "dtype",
        "p50 µs",
        "p99 µs",
        "cpu µs/rank",
        "algbw GB/s",
        "busbw GB/s",
        "check",
        "iters"
    );
    for (i, row) in rows.iter().enumerate() {
        let (algbw, busbw) = bandwidth(args.op, n, row);
        let check = match row.ok {
            Some(true) => "ok",
            Some(false) => "FAIL",
            None => "-",
        };
        let mut line = format!(
            "{:>12} {:>11} {:>9} {:>10} {:>10} {:>11} {:>10.3} {:>10.3} {:>5} {:>5}",
            row.bytes,
            row.bytes / args.dtype.size(),
            args.dtype.name(),
            micros(row.stats.p50),
            micros(row.stats.p99),
            micros(row.stats.cpu),
            algbw,
            busbw,
            check,
            args.iters(row.bytes),
        );
        if let Some(Some(w)) = wire.get(i) {
            let (_, wire_busbw) = bandwidth(args.op, n, w);
            let cpu = row.stats.cpu / w.stats.cpu;
            line += &format!(" {:>5.0}% {:>9.2}", 100.0 * busbw / wire_busbw, cpu);
        }
        println!("{line}");
    }
}

/// (algbw, busbw) of a row in GB/s.
pub(crate) fn bandwidth(op: Op, n: usize, row: &Row) -> (f64, f64) {
    let secs = match op {
        Op::SendRecv => row.stats.p50 / 2.0,
        _ => row.stats.p50,
    };
    let algbw = gbps(row.bytes, secs);
    (algbw, algbw * op.bus_factor(n))
}

/// Prints the wire's rows.
pub(crate) fn print_wire(args: &Args, n: usize, wire: &Wire, rows: &[Option<Row>]) {
    let steps = "each step sending right while receiving left";
    let pattern = match args.op {
        Op::AllReduce(_) => format!("{} steps of ⌈S/n⌉ bytes, {steps}", 2 * (n - 1)),
        Op::AllGather => format!("{} steps of S/n bytes, {steps}", n - 1),
        Op::SendRecv => "a round trip 0→1→0 on one socket".into(),
    };
    println!(
        "# wire: the same ranks and bytes over blocking std sockets ({}), no reduction: {pattern} (steps ≤ {} KiB written then read on one thread, larger ones with a writer thread)",
        wire.describe(),
        INLINE_STEP / 1024
    );
    println!(
        "{:>12} {:>10} {:>10} {:>11} {:>10} {:>10}",
        "bytes", "p50 µs", "p99 µs", "cpu µs/rank", "algbw GB/s", "busbw GB/s"
    );
    for row in rows.iter().flatten() {
        let (algbw, busbw) = bandwidth(args.op, n, row);
        println!(
            "{:>12} {:>10} {:>10} {:>11} {:>10.3} {:>10.3}",
            row.bytes,
            micros(row.stats.p50),
            micros(row.stats.p99),
            micros(row.stats.cpu),
            algbw,
            busbw
        );
    }
}

/// Prints the round trips (over the wire and over the communicator), and the op of the same
/// size as a multiple of the wire's.
pub(crate) fn print_pingpong(args: &Args, rows: &[Row], bytes: usize, wire: Stats, comm: Stats) {
    println!(
        "# ping-pong: {bytes} bytes rank 0 → 1 → 0, round trip timed by rank 0, p50 / p99 (µs): wire {:.1} / {:.1}, {} try_send+try_recv {:.1} / {:.1}",
        wire.p50 * 1e6,
        wire.p99 * 1e6,
        args.backend.label(),
        comm.p50 * 1e6,
        comm.p99 * 1e6
    );
    if let Some(row) = rows.iter().find(|r| r.bytes == bytes) {
        println!(
            "# {} of {bytes} bytes: p50 {:.1} µs = {:.2} × the wire's round trip",
            args.op.name(),
            row.stats.p50 * 1e6,
            row.stats.p50 / wire.p50
        );
    }
}
