//! `nuvec-launch probe --sweep` (hidden): one rank of the doctor's all_sum sweep. The doctor
//! starts it on every rank's host exactly as it starts the probes (as a job's rank: `MLX_RANK`,
//! `MLX_HOSTFILE`, `--cwd`, `--env`), after the probes have measured the links and quit.
//!
//! It connects the ring of this crate (`nuvec_distributed::connect_ring`) over the job's host
//! file with every port moved by `--offset`: the probe ports, the block right after the job's,
//! as the link measurements used. Not the job's own ports, for the reasons the doctor's module
//! doc gives (it never takes a port from a job that is starting, and leaves none in
//! `TIME_WAIT` for the job after it; the ring binds with `SO_REUSEADDR`, so the probes'
//! connections closed just before do not keep it from the probe ports); whether the job's ports
//! answer is what the link measurements checked. The addresses, hence the interfaces and
//! routes, are the job's. `NUVEC_DISTRIBUTED_WIRE` and `NUVEC_DISTRIBUTED_KEY` are read as a
//! rank reads them (so a `--env` of either applies); the other options are the defaults, but
//! for the timeout, which bounds connection setup and every operation by
//! [`SETUP`] plus the budget.
//!
//! Then it runs what `sweep.rs` plans: before each iteration an all_sum of one byte per rank
//! in which only rank 0's byte is not zero carries rank 0's [`Step`] to every rank (and is the
//! barrier); each iteration is `RingCommunicator::try_all_reduce` of float32 in place (the
//! collective under a job's arrays), every element rank + 1, timed on each rank and checked
//! against R(R+1)/2; when a size is done its times are reduced to the slowest rank's. It
//! prints one line, `{"swept": Swept}`, and exits; a failure is the library's error in it.

use std::time::{Duration, Instant};

use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Options, RingCommunicator, TcpFabric, WireChoice, connect_ring, hostfile};

use super::sweep::{Pacer, SIZES, SizeRow, Step, Swept};

/// Added to the budget for connection setup and for any one operation.
pub(crate) const SETUP: Duration = Duration::from_secs(30);

/// `addr` (`host:port`) with `offset` added to its port.
fn shifted(addr: &str, offset: u16) -> Result<String, String> {
    let (host, port) = hostfile::split_address(addr).map_err(|e| e.to_string())?;
    let port = port
        .checked_add(offset)
        .ok_or_else(|| format!("{addr}: its port plus {offset} is beyond 65535"))?;
    Ok(if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// The ring's options as a rank would have them, for a sweep of `budget` seconds.
fn options(budget: Duration) -> Result<Options, String> {
    let mut options = Options::new().timeout(SETUP + budget);
    if let Ok(wire) = std::env::var("NUVEC_DISTRIBUTED_WIRE") {
        options = options.wire(match wire.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => WireChoice::Auto,
            "mlx" => WireChoice::Mlx,
            "nuvec" => WireChoice::Nuvec,
            other => return Err(format!("NUVEC_DISTRIBUTED_WIRE={other:?} is not a wire")),
        });
    }
    if let Some(key) = std::env::var_os("NUVEC_DISTRIBUTED_KEY").filter(|k| !k.is_empty()) {
        options = options
            .key(key.as_encoded_bytes())
            .map_err(|e| format!("NUVEC_DISTRIBUTED_KEY: {e}"))?;
    }
    Ok(options)
}

/// Runs this rank's part of the sweep within `budget` on the probe ports (`offset`).
pub(crate) fn run(offset: u16, budget: Duration) -> Swept {
    let mut swept = Swept::default();
    if let Err(e) = connect_and_sweep(offset, budget, &mut swept) {
        swept.error = Some(e);
    }
    swept
}

fn connect_and_sweep(offset: u16, budget: Duration, swept: &mut Swept) -> Result<(), String> {
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    swept.rank = var("MLX_RANK")?
        .trim()
        .parse()
        .map_err(|_| "MLX_RANK is not a rank".to_owned())?;
    let path = var("MLX_HOSTFILE")?;
    let nodes = hostfile::read(std::path::Path::new(&path)).map_err(|e| e.to_string())?;
    swept.ranks = nodes.len();
    let nodes = nodes
        .iter()
        .map(|entry| entry.iter().map(|a| shifted(a, offset)).collect())
        .collect::<Result<Vec<Vec<String>>, String>>()?;
    let ring = connect_ring(&nodes, swept.rank, &options(budget)?).map_err(|e| e.to_string())?;
    let Some(comm) = ring.communicator() else {
        return Err("a ring of one rank has nothing to sum".to_owned());
    };
    swept.wire = Some(comm.wire().to_string());
    let result = sweep(comm, budget, swept);
    ring.close();
    result
}

/// The iterations, as rank 0 paces them.
fn sweep(
    comm: &RingCommunicator<TcpFabric>,
    budget: Duration,
    swept: &mut Swept,
) -> Result<(), String> {
    let (rank, n) = (swept.rank, swept.ranks);
    let e = |e: nuvec_distributed::Error| e.to_string();
    let mut pacer = (rank == 0).then(|| Pacer::new(budget.as_secs_f64()));
    let start = Instant::now();
    let mine = ((rank + 1) as f32).to_ne_bytes();
    let sum = ((n * (n + 1) / 2) as f32).to_ne_bytes();
    let mut data: Vec<u8> = Vec::new();
    let mut current: Option<usize> = None;
    let mut times: Vec<f64> = Vec::new();
    loop {
        let began = Instant::now();
        let mut control = vec![0u8; n];
        if let Some(p) = pacer.as_mut() {
            control[0] = Step::encode(p.next(start.elapsed().as_secs_f64()));
        }
        comm.try_all_reduce(Reduction::Sum, DType::U8, &mut control)
            .map_err(e)?;
        let step = Step::decode(control[0]);
        if let Some(done) = current.filter(|&c| step.is_none_or(|s| s.size != c)) {
            // Every rank ran the same iterations: the slowest rank's time of each.
            if !times.is_empty() {
                let mut bytes: Vec<u8> = times.iter().flat_map(|t| t.to_ne_bytes()).collect();
                comm.try_all_reduce(Reduction::Max, DType::F64, &mut bytes)
                    .map_err(e)?;
                let slowest: Vec<f64> = bytes
                    .chunks_exact(8)
                    .map(|b| {
                        let mut a = [0u8; 8];
                        a.copy_from_slice(b);
                        f64::from_ne_bytes(a)
                    })
                    .collect();
                if rank == 0 {
                    swept.rows.extend(SizeRow::of(SIZES[done], n, &slowest));
                }
            }
            times.clear();
        }
        let Some(step) = step else { break };
        if current != Some(step.size) {
            data = vec![0u8; SIZES[step.size] as usize];
            current = Some(step.size);
        }
        for x in data.chunks_exact_mut(4) {
            x.copy_from_slice(&mine);
        }
        let t = Instant::now();
        comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)
            .map_err(e)?;
        let seconds = t.elapsed().as_secs_f64();
        if swept.wrong.is_none()
            && let Some(i) = data.chunks_exact(4).position(|x| x != sum)
        {
            let mut got = [0u8; 4];
            got.copy_from_slice(&data[4 * i..4 * i + 4]);
            swept.wrong = Some(format!(
                "element {i} of the {} all_sum is {}, expected {} (the sum of 1 to {n})",
                super::sweep::size_name(SIZES[step.size]),
                f32::from_ne_bytes(got),
                f32::from_ne_bytes(sum)
            ));
        }
        if let Some(p) = pacer.as_mut() {
            p.record(step, began.elapsed().as_secs_f64());
        }
        if step.timed {
            times.push(seconds);
        }
    }
    if rank == 0 {
        swept.skipped = SIZES
            .iter()
            .copied()
            .filter(|b| !swept.rows.iter().any(|r| r.bytes == *b))
            .collect();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_address_is_the_jobs_with_the_offset_added_to_its_port() {
        assert_eq!(
            shifted("10.0.0.2:32323", 4).as_deref(),
            Ok("10.0.0.2:32327")
        );
        assert_eq!(
            shifted("[fe80::1]:5000", 2).as_deref(),
            Ok("[fe80::1]:5002")
        );
        assert!(shifted("10.0.0.2:65535", 1).is_err());
        assert!(shifted("10.0.0.2", 1).is_err());
    }
}
