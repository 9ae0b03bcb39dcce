//! Measuring on any communicator: what the bench needs of MLX's ring and of JACCL
//! (`Collectives`), the clock (wall or virtual), the job's warm-up before its first size, and
//! the timed loop of every size: warm-up, a barrier before every timed iteration, the per-rank
//! times combined over the ranks, the check.

use std::time::Instant;

use nuvec_core::DType;
use nuvec_distributed::RingCommunicator;
use nuvec_distributed::fabric::Fabric;
use nuvec_distributed::jaccl::JacclCommunicator;
use nuvec_distributed::reduce::Reduction;
use nuvec_fabric_sim::SimClock;

use crate::Result;
use crate::args::{Agg, Args, Op};
use crate::cpu_time::cpu_time;
use crate::data::{check_gathered, check_reduced, fill, gather_input};
use crate::report::{Row, Stats};
use crate::warmup::{self, JOB_WARMUP_BYTES};
use crate::wire::Wire;

/// What the bench times, as MLX's ring and JACCL both provide it (their `try_*` methods).
pub(crate) trait Collectives {
    /// This rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// All-reduces `data` in place.
    fn all_reduce(&self, op: Reduction, dtype: DType, data: &mut [u8]) -> Result<()>;
    /// Gathers every rank's `input` into `output`, in rank order.
    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()>;
    /// Sends `data` to rank `dst`.
    fn send(&self, dst: usize, data: &[u8]) -> Result<()>;
    /// Receives `data` from rank `src`.
    fn recv(&self, src: usize, data: &mut [u8]) -> Result<()>;
}

/// MLX's ring over any fabric.
impl<F: Fabric> Collectives for RingCommunicator<F> {
    fn rank(&self) -> usize {
        self.topology().rank()
    }

    fn size(&self) -> usize {
        self.topology().size()
    }

    fn all_reduce(&self, op: Reduction, dtype: DType, data: &mut [u8]) -> Result<()> {
        Ok(self.try_all_reduce(op, dtype, data)?)
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        Ok(self.try_all_gather(input, output)?)
    }

    fn send(&self, dst: usize, data: &[u8]) -> Result<()> {
        Ok(self.try_send(dst, data)?)
    }

    fn recv(&self, src: usize, data: &mut [u8]) -> Result<()> {
        Ok(self.try_recv(src, data)?)
    }
}

/// JACCL's mesh or ring over any fabric.
impl<F: Fabric> Collectives for JacclCommunicator<F> {
    fn rank(&self) -> usize {
        self.layout().rank()
    }

    fn size(&self) -> usize {
        self.layout().size()
    }

    fn all_reduce(&self, op: Reduction, dtype: DType, data: &mut [u8]) -> Result<()> {
        Ok(self.try_all_reduce(op, dtype, data)?)
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        Ok(self.try_all_gather(input, output)?)
    }

    fn send(&self, dst: usize, data: &[u8]) -> Result<()> {
        Ok(self.try_send(dst, data)?)
    }

    fn recv(&self, src: usize, data: &mut [u8]) -> Result<()> {
        Ok(self.try_recv(src, data)?)
    }
}

/// Where the times of the iterations are read.
#[derive(Clone, Debug)]
pub(crate) enum Clock {
    /// This machine's monotonic clock (seconds since this instant), and this process's CPU
    /// time.
    Wall(Instant),
    /// The simulator's virtual clock; no CPU time (every simulated rank is a thread of this
    /// process).
    Virtual(SimClock),
}

/// Reading the clock.
impl Clock {
    /// Seconds since the clock's start.
    pub(crate) fn now(&self) -> f64 {
        match self {
            Clock::Wall(start) => start.elapsed().as_secs_f64(),
            Clock::Virtual(clock) => clock.now().as_secs_f64(),
        }
    }

    /// CPU seconds this rank has run (all its threads), NaN where unknown.
    pub(crate) fn cpu(&self) -> f64 {
        match self {
            Clock::Wall(_) => cpu_time(),
            Clock::Virtual(_) => f64::NAN,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring, on any communicator
// ---------------------------------------------------------------------------------------------

/// The barrier before every timed iteration: an all_sum of one byte per rank, so that every
/// rank sends and waits in every step (as `benches/upstream` and `benches/mlx_allsum.py`).
pub(crate) fn barrier(comm: &impl Collectives) -> Result<()> {
    let mut b = vec![0u8; comm.size()];
    comm.all_reduce(Reduction::Sum, DType::U8, &mut b)
}

/// Warms the job up before its first size is timed (`benches/common/warmup.rs`): all_sums of
/// float32, each after a barrier. Not in the simulator, whose time is virtual.
fn warm_up_job(comm: &impl Collectives) -> Result<()> {
    let mut data = vec![0u8; JOB_WARMUP_BYTES];
    warmup::warm_up_job(
        comm.rank(),
        || {
            barrier(comm)?;
            comm.all_reduce(Reduction::Sum, DType::F32, &mut data)
        },
        |more| {
            let mut more = [u8::from(more)];
            comm.all_reduce(Reduction::Sum, DType::U8, &mut more)?;
            Ok(more[0] == 1)
        },
    )
}

/// Runs `op` `warmup` times, then `iters` times each after a barrier and timed on `clock`,
/// and combines every rank's times per iteration as `agg` says.
pub(crate) fn measure(
    comm: &impl Collectives,
    clock: &Clock,
    warmup: usize,
    iters: usize,
    agg: Agg,
    mut op: impl FnMut() -> Result<()>,
) -> Result<Stats> {
    for _ in 0..warmup {
        barrier(comm)?;
        op()?;
    }
    let mut times = Vec::with_capacity(iters);
    let mut cpu = 0.0;
    for _ in 0..iters {
        barrier(comm)?;
        let cpu_start = clock.cpu();
        let start = clock.now();
        op()?;
        times.push(clock.now() - start);
        cpu += clock.cpu() - cpu_start;
    }
    let n = comm.size() as f64;
    let mut cpu_bytes = (cpu / iters as f64).to_le_bytes();
    comm.all_reduce(Reduction::Sum, DType::F64, &mut cpu_bytes)?;
    let mut bytes: Vec<u8> = times.iter().flat_map(|t| t.to_le_bytes()).collect();
    let reduction = match agg {
        Agg::Max => Reduction::Max,
        Agg::Mean | Agg::Rank0 => Reduction::Sum,
    };
    comm.all_reduce(reduction, DType::F64, &mut bytes)?;
    if agg != Agg::Rank0 {
        times = bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
            .map(|t| if agg == Agg::Mean { t / n } else { t })
            .collect();
    }
    Ok(Stats {
        cpu: f64::from_le_bytes(cpu_bytes) / n,
        ..Stats::of(times)
    })
}

/// Whether `ok` holds on every rank.
pub(crate) fn everyone(comm: &impl Collectives, ok: bool) -> Result<bool> {
    let mut b = [u8::from(ok)];
    comm.all_reduce(Reduction::Min, DType::U8, &mut b)?;
    Ok(b[0] == 1)
}

/// What one rank measured.
pub(crate) struct Measured {
    /// The communicator's row of every size.
    pub(crate) rows: Vec<Row>,
    /// The wire's row of every size, when there is a wire.
    pub(crate) wire_rows: Vec<Option<Row>>,
    /// The round trips over the wire and over the communicator, when there is a wire and
    /// `--pingpong` is not 0.
    pub(crate) pingpong: Option<(Stats, Stats)>,
}

/// Times every size of `args.sizes` on `comm` (and on `wire`), then the round trips.
pub(crate) fn measure_all(
    args: &Args,
    comm: &impl Collectives,
    clock: &Clock,
    mut wire: Option<&mut Wire>,
) -> Result<Measured> {
    let mut rows = Vec::new();
    let mut wire_rows = Vec::new();
    if !args.sim {
        warm_up_job(comm)?;
    }
    for &size in &args.sizes {
        let (row, wire_row) = measure_size(args, comm, clock, wire.as_deref_mut(), size)?;
        rows.push(row);
        wire_rows.push(wire_row);
    }
    let pingpong = match (wire, args.pingpong) {
        (Some(w), bytes) if bytes > 0 => Some(measure_pingpong(args, comm, clock, w, bytes)?),
        _ => None,
    };
    Ok(Measured {
        rows,
        wire_rows,
        pingpong,
    })
}

/// Times `args.op` on `size` bytes over the communicator, checks it, and times the wire's
/// equivalent.
pub(crate) fn measure_size(
    args: &Args,
    comm: &impl Collectives,
    clock: &Clock,
    wire: Option<&mut Wire>,
    size: usize,
) -> Result<(Row, Option<Row>)> {
    let (rank, n) = (comm.rank(), comm.size());
    let iters = args.iters(size);
    let warmup = args.warmup(iters);
    let es = args.dtype.size();
    let (bytes, stats, ok) = match args.op {
        Op::AllReduce(reduction) => {
            let bytes = size / es * es;
            let mut data = vec![0u8; bytes];
            fill(args.dtype, rank, n, &mut data);
            let stats = measure(comm, clock, warmup, iters, args.agg, || {
                comm.all_reduce(reduction, args.dtype, &mut data)
            })?;
            fill(args.dtype, rank, n, &mut data);
            comm.all_reduce(reduction, args.dtype, &mut data)?;
            let ok = check_reduced(reduction, args.dtype, n, &data);
            (bytes, stats, ok)
        }
        Op::AllGather => {
            let per = size / n / es * es;
            let input = gather_input(rank, per);
            let mut output = vec![0u8; per * n];
            let stats = measure(comm, clock, warmup, iters, args.agg, || {
                comm.all_gather(&input, &mut output)
            })?;
            output.fill(0);
            comm.all_gather(&input, &mut output)?;
            (per * n, stats, check_gathered(n, &output))
        }
        Op::SendRecv => {
            let mut data = vec![0u8; size];
            // Rank 0 times the whole round trip; the others only part of it.
            let stats = measure(comm, clock, warmup, iters, Agg::Rank0, || {
                pingpong(comm, &mut data)
            })?;
            let ok = match rank {
                0 => {
                    let sent = gather_input(0, size);
                    comm.send(1, &sent)?;
                    comm.recv(1, &mut data)?;
                    data == sent
                }
                1 => {
                    comm.recv(0, &mut data)?;
                    comm.send(0, &data)?;
                    true
                }
                _ => true,
            };
            (size, stats, ok)
        }
    };
    let ok = everyone(comm, ok)?;
    let row = Row {
        bytes,
        stats,
        ok: Some(ok),
    };
    let wire_row = match wire {
        None => None,
        Some(w) => {
            let stats = match args.op {
                Op::AllReduce(_) => {
                    let seg = bytes.div_ceil(n);
                    measure(comm, clock, warmup, iters, args.agg, || {
                        w.ring(2 * (n - 1), seg)
                    })?
                }
                Op::AllGather => {
                    let seg = bytes / n;
                    measure(comm, clock, warmup, iters, args.agg, || w.ring(n - 1, seg))?
                }
                Op::SendRecv => measure(comm, clock, warmup, iters, Agg::Rank0, || {
                    w.pingpong(rank, bytes)
                })?,
            };
            Some(Row {
                bytes,
                stats,
                ok: None,
            })
        }
    };
    Ok((row, wire_row))
}

/// A round trip of `data` between ranks 0 and 1 over the communicator's
/// `try_send`/`try_recv`.
pub(crate) fn pingpong(comm: &impl Collectives, data: &mut [u8]) -> Result<()> {
    match comm.rank() {
        0 => {
            comm.send(1, data)?;
            comm.recv(1, data)?;
        }
        1 => {
            comm.recv(0, data)?;
            comm.send(0, data)?;
        }
        _ => {}
    }
    Ok(())
}

/// Round trips of `bytes` between ranks 0 and 1: over the wire, and over the communicator.
pub(crate) fn measure_pingpong(
    args: &Args,
    comm: &impl Collectives,
    clock: &Clock,
    wire: &mut Wire,
    bytes: usize,
) -> Result<(Stats, Stats)> {
    let rank = comm.rank();
    let iters = args.iters(bytes);
    let warmup = args.warmup(iters);
    let wire_rtt = measure(comm, clock, warmup, iters, Agg::Rank0, || {
        wire.pingpong(rank, bytes)
    })?;
    let mut data = vec![0u8; bytes];
    let comm_rtt = measure(comm, clock, warmup, iters, Agg::Rank0, || {
        pingpong(comm, &mut data)
    })?;
    Ok((wire_rtt, comm_rtt))
}
