//! `nuvec-launch probe --sweep` (hidden): one rank of the doctor's all_sum sweep. The doctor
//! starts it on every rank's host exactly as it starts the probes (as a job's rank: `MLX_RANK`,
//! `MLX_HOSTFILE` or JACCL's variables, `--cwd`, `--env`), after the probes have measured the
//! links and quit.
//!
//! A ring job's rank connects the ring of this crate (`nuvec_distributed::connect_ring`) over
//! the job's host file with every port moved by `--offset`: the probe ports, the block right
//! after the job's, as the link measurements used. Not the job's own ports, for the reasons the
//! doctor's module doc gives (it never takes a port from a job that is starting, and leaves none
//! in `TIME_WAIT` for the job after it; the ring binds with `SO_REUSEADDR`, so the probes'
//! connections closed just before do not keep it from the probe ports); whether the job's ports
//! answer is what the link measurements checked. The addresses, hence the interfaces and
//! routes, are the job's. `NUVEC_DISTRIBUTED_WIRE` and `NUVEC_DISTRIBUTED_KEY` are read as a
//! rank reads them (so a `--env` of either applies); the other options are the defaults, but
//! for the timeout, which bounds connection setup and every operation by
//! [`SETUP`] plus the budget.
//!
//! A JACCL job's rank (`MLX_IBV_DEVICES` set: `--backend jaccl` or `jaccl-ring`) reads JACCL's
//! configuration as a rank does (`MLX_IBV_DEVICES`, `MLX_RANK`, `MLX_JACCL_COORDINATOR`,
//! `MLX_JACCL_RING`), moves the coordinator by `--offset` (the probe port beside the job's,
//! which the side channel binds with `SO_REUSEADDR` too) and connects with
//! `nuvec_distributed::connect_jaccl` over the fabric `NUVEC_JACCL_FABRIC` names (`rdma`, the
//! default, or `tcp`: JACCL's cables as TCP connections on ports the system picks) with the frame
//! rule of `NUVEC_JACCL_FRAMES`. The RDMA fabric needs this program built with its feature
//! `jaccl` and a verbs library with a device; without them the library's error is the rank's.
//! Its all_sum is the one under a job's arrays (`nuvec_core::distributed::all_sum` over the
//! group): the timed part is the array's evaluation, which copies the input once, as a job's
//! does.
//!
//! A JACCL rank first measures the job's cables with the group, one at a time
//! ([`super::cables`]); then it runs what `sweep.rs` plans: before each iteration an all_sum of one byte per rank
//! in which only rank 0's byte is not zero carries rank 0's [`Step`] to every rank (and is the
//! barrier); each iteration is an all_sum of float32 (the ring: `RingCommunicator::try_all_reduce`
//! in place, the collective under a job's arrays), every element rank + 1, timed on each rank
//! and checked against R(R+1)/2; when a size is done its times are reduced to the slowest
//! rank's. It prints one line, `{"swept": Swept}`, and exits; a failure is the library's error
//! in it.

use std::time::{Duration, Instant};

use nuvec_core::distributed::{Group, all_max, all_sum, recv, send};
use nuvec_core::{Array, DType};
use nuvec_distributed::jaccl::{Config, FrameRule, Topology};
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{
    JacclFabric, Options, RingCommunicator, TcpFabric, WireChoice, connect_jaccl, connect_ring,
    hostfile,
};

use super::cables::{self, Cable};
use super::measure::Transfer;
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

/// The ring's options as a rank would have them, for a sweep of `budget` seconds: the wire,
/// the TCP congestion control and the key from the environment, as `init` reads them.
fn options(budget: Duration) -> Result<Options, String> {
    options_from(budget, |k| std::env::var_os(k))
}

/// [`options`] with the environment's variables from `var`.
fn options_from(
    budget: Duration,
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Options, String> {
    let text = |k: &str| var(k).map(|v| v.to_string_lossy().into_owned());
    let mut options = Options::new().timeout(SETUP + budget);
    if let Some(wire) = text("NUVEC_DISTRIBUTED_WIRE") {
        options = options.wire(match wire.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => WireChoice::Auto,
            "mlx" => WireChoice::Mlx,
            "nuvec" => WireChoice::Nuvec,
            other => return Err(format!("NUVEC_DISTRIBUTED_WIRE={other:?} is not a wire")),
        });
    }
    // The congestion control the doctor advises on a BBR host: swept as the ranks would run.
    if let Some(name) = text("NUVEC_DISTRIBUTED_TCP_CONGESTION").filter(|n| !n.trim().is_empty()) {
        options = options
            .tcp_congestion(name.trim())
            .map_err(|e| format!("NUVEC_DISTRIBUTED_TCP_CONGESTION: {e}"))?;
    }
    if let Some(key) = var("NUVEC_DISTRIBUTED_KEY").filter(|k| !k.is_empty()) {
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
    // As `nuvec_distributed::init`: JACCL when its variables are set, else the ring.
    if let Some(config) = Config::from_env().map_err(|e| e.to_string())? {
        return jaccl(config, offset, budget, swept);
    }
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

/// Which fabric carries JACCL's frames and with which frame rule, as a rank reads them
/// (`NUVEC_JACCL_FABRIC`, `NUVEC_JACCL_FRAMES`).
fn jaccl_transport() -> Result<(JacclFabric, FrameRule), String> {
    let read = |k: &str| std::env::var(k).map(|v| v.trim().to_ascii_lowercase());
    let fabric = match read("NUVEC_JACCL_FABRIC").as_deref() {
        Err(_) | Ok("" | "rdma") => JacclFabric::Rdma,
        Ok("tcp") => JacclFabric::Tcp,
        Ok(other) => return Err(format!("NUVEC_JACCL_FABRIC={other:?} is not rdma or tcp")),
    };
    let rule = match read("NUVEC_JACCL_FRAMES").as_deref() {
        Err(_) | Ok("" | "small") => FrameRule::Small,
        Ok("large") => FrameRule::Large,
        Ok(other) => {
            return Err(format!(
                "NUVEC_JACCL_FRAMES={other:?} is not small or large"
            ));
        }
    };
    Ok((fabric, rule))
}

/// JACCL's group of this rank, its coordinator on the probe port, swept.
fn jaccl(config: Config, offset: u16, budget: Duration, swept: &mut Swept) -> Result<(), String> {
    swept.rank = config.rank();
    swept.ranks = config.size();
    let coordinator = config
        .coordinator_address()
        .ok_or_else(|| "MLX_JACCL_COORDINATOR is not set".to_owned())?;
    let moved = shifted(coordinator, offset)?;
    let config = config.coordinator(&moved);
    let (fabric, rule) = jaccl_transport()?;
    let (topology, ring) = match config.topology().map_err(|e| e.to_string())? {
        Topology::Mesh { wires } => (format!("mesh of {wires} cable(s) per pair"), false),
        Topology::Ring { wires } => (format!("ring of {wires} cable(s) per direction"), true),
    };
    let mine: Vec<Vec<String>> = config
        .devices()
        .get(config.rank())
        .cloned()
        .unwrap_or_default();
    let group =
        connect_jaccl(&config, fabric, rule, &options(budget)?).map_err(|e| e.to_string())?;
    if group.size() < 2 {
        return Err("a group of one rank has nothing to sum".to_owned());
    }
    let carried = match fabric {
        JacclFabric::Rdma => "RDMA",
        JacclFabric::Tcp => "TCP cables",
    };
    swept.wire = Some(format!("JACCL {topology}, {carried}"));
    let comm = Jaccl(group);
    measure_cables(&comm, ring, &mine, swept)?;
    sweep(&comm, budget, swept)
}

/// `data` sent to `to` over the group, as a job's array is.
fn send_bytes(group: &Group, data: &Array, to: usize) -> Result<(), String> {
    send(data, to, Some(group))
        .eval()
        .map_err(|e| e.to_string())
}

/// `n` bytes received from `from` over the group, as a job's array is.
fn recv_bytes(group: &Group, n: usize, from: usize) -> Result<(), String> {
    recv([n], DType::U8, from, Some(group))
        .eval()
        .map_err(|e| e.to_string())
}

/// Every cable of the job, one at a time ([`cables::pairs`]), measured by its lower rank,
/// with a one-byte all_sum of every rank after each (the barrier); this rank's cables (to
/// higher ranks) go into `swept`. `devices`: this rank's devices to each rank.
fn measure_cables(
    comm: &Jaccl,
    ring: bool,
    devices: &[Vec<String>],
    swept: &mut Swept,
) -> Result<(), String> {
    let rank = swept.rank;
    for (lower, higher) in cables::pairs(swept.ranks, ring) {
        if rank == lower {
            let mut cable = Cable {
                from: lower,
                to: higher,
                devices: devices.get(higher).cloned().unwrap_or_default(),
                ..Cable::default()
            };
            let measured = measure_as_lower(&comm.0, higher, &mut cable);
            if let Err(e) = &measured {
                cable.error = Some(e.clone());
            }
            swept.cables.push(cable);
            measured?;
        } else if rank == higher {
            answer_as_higher(&comm.0, lower)?;
        }
        comm.reduce(Reduction::Sum, DType::U8, &mut [0u8])?;
    }
    Ok(())
}

/// What a cable's two ends send, evaluated: 8 bytes (a round trip's), 1 byte (an answer or
/// a go) and [`cables::BYTES`] of `fill`.
fn messages(fill: u8) -> Result<[Array; 3], String> {
    let sent = [
        Array::from_slice(&[0u8; 8], [8]),
        Array::from_slice(&[1u8], [1]),
        Array::from_slice(&vec![fill; cables::BYTES], [cables::BYTES]),
    ];
    for a in &sent {
        a.eval().map_err(|e| e.to_string())?;
    }
    Ok(sent)
}

/// The lower rank's side of a cable to `peer`: round trips, then each direction.
fn measure_as_lower(group: &Group, peer: usize, cable: &mut Cable) -> Result<(), String> {
    let [small, one, bulk] = messages(7)?;
    let mut samples = Vec::with_capacity(cables::PINGS);
    for i in 0..cables::WARM + cables::PINGS {
        let t = Instant::now();
        send_bytes(group, &small, peer)?;
        recv_bytes(group, 8, peer)?;
        if i >= cables::WARM {
            samples.push(t.elapsed());
        }
    }
    cable.rtt = super::measure::rtt(&mut samples);
    let best = |t: Option<f64>, s: f64| Some(t.map_or(s, |t: f64| t.min(s)));
    let (mut forward, mut back) = (None, None);
    // The first transfer each way warms the buffers (first touch, registration) and is not
    // counted.
    for i in 0..=cables::TRANSFERS {
        let t = Instant::now();
        send_bytes(group, &bulk, peer)?;
        recv_bytes(group, 1, peer)?;
        let took = t.elapsed().as_secs_f64();
        if i > 0 {
            forward = best(forward, took);
        }
        let t = Instant::now();
        send_bytes(group, &one, peer)?;
        recv_bytes(group, cables::BYTES, peer)?;
        let took = t.elapsed().as_secs_f64();
        if i > 0 {
            back = best(back, took);
        }
    }
    let transfer = |seconds: Option<f64>| {
        seconds.map(|seconds| Transfer {
            bytes: cables::BYTES as u64,
            seconds,
        })
    };
    cable.forward = transfer(forward);
    cable.back = transfer(back);
    Ok(())
}

/// The higher rank's side of a cable to `peer`: answers what [`measure_as_lower`] sends.
fn answer_as_higher(group: &Group, peer: usize) -> Result<(), String> {
    let [small, one, bulk] = messages(9)?;
    for _ in 0..cables::WARM + cables::PINGS {
        recv_bytes(group, 8, peer)?;
        send_bytes(group, &small, peer)?;
    }
    for _ in 0..=cables::TRANSFERS {
        recv_bytes(group, cables::BYTES, peer)?;
        send_bytes(group, &one, peer)?;
        recv_bytes(group, 1, peer)?;
        send_bytes(group, &bulk, peer)?;
    }
    Ok(())
}

/// What the sweep reduces over: in place, returning the seconds the collective took.
trait Collective {
    /// Reduces `data` (elements of `dtype`) with `op` over every rank, in place.
    fn reduce(&self, op: Reduction, dtype: DType, data: &mut [u8]) -> Result<f64, String>;
}

impl Collective for RingCommunicator<TcpFabric> {
    fn reduce(&self, op: Reduction, dtype: DType, data: &mut [u8]) -> Result<f64, String> {
        let t = Instant::now();
        self.try_all_reduce(op, dtype, data)
            .map_err(|e| e.to_string())?;
        Ok(t.elapsed().as_secs_f64())
    }
}

/// A JACCL group, reduced as a job's arrays are.
struct Jaccl(Group);

/// The elements of `N` bytes each in `data`, read by `f`.
fn elements<T, const N: usize>(data: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    data.chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            f(a)
        })
        .collect()
}

impl Collective for Jaccl {
    fn reduce(&self, op: Reduction, dtype: DType, data: &mut [u8]) -> Result<f64, String> {
        let e = |e: nuvec_core::Error| e.to_string();
        let x = match dtype {
            DType::U8 => Array::from_slice(data, [data.len()]),
            DType::F32 => Array::from_slice(&elements(data, f32::from_ne_bytes), [data.len() / 4]),
            DType::F64 => Array::from_slice(&elements(data, f64::from_ne_bytes), [data.len() / 8]),
            other => return Err(format!("the sweep does not reduce {other:?}")),
        };
        x.eval().map_err(e)?;
        let y = match op {
            Reduction::Sum => all_sum(&x, Some(&self.0)),
            Reduction::Max => all_max(&x, Some(&self.0)),
            Reduction::Min => return Err("the sweep does not take a minimum".to_owned()),
        };
        let t = Instant::now();
        y.eval().map_err(e)?;
        let seconds = t.elapsed().as_secs_f64();
        let bytes: Vec<u8> = match dtype {
            DType::F32 => y
                .to_vec::<f32>()
                .map_err(e)?
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect(),
            DType::F64 => y
                .to_vec::<f64>()
                .map_err(e)?
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect(),
            _ => y.to_vec::<u8>().map_err(e)?,
        };
        if bytes.len() != data.len() {
            return Err(format!(
                "the all_sum returned {} bytes for {}",
                bytes.len(),
                data.len()
            ));
        }
        data.copy_from_slice(&bytes);
        Ok(seconds)
    }
}

/// The iterations, as rank 0 paces them.
fn sweep(comm: &dyn Collective, budget: Duration, swept: &mut Swept) -> Result<(), String> {
    let (rank, n) = (swept.rank, swept.ranks);
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
        comm.reduce(Reduction::Sum, DType::U8, &mut control)?;
        let step = Step::decode(control[0]);
        if let Some(done) = current.filter(|&c| step.is_none_or(|s| s.size != c)) {
            // Every rank ran the same iterations: the slowest rank's time of each.
            if !times.is_empty() {
                let mut bytes: Vec<u8> = times.iter().flat_map(|t| t.to_ne_bytes()).collect();
                comm.reduce(Reduction::Max, DType::F64, &mut bytes)?;
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
        let seconds = comm.reduce(Reduction::Sum, DType::F32, &mut data)?;
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
    // Every rank's results are final. A rank that left now could leave a slower one still
    // waiting on its last frame, and JACCL's side channel tells a departed rank as gone: one
    // more all_sum keeps every rank until all have come this far. Its own failure (the same
    // race, one operation later) is not the sweep's.
    let _ = comm.reduce(Reduction::Sum, DType::U8, &mut vec![0u8; n]);
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

    #[test]
    fn the_sweep_runs_on_the_congestion_control_its_environment_names() {
        let budget = Duration::from_secs(1);
        let with = |name: &'static str| {
            options_from(budget, move |k| {
                (k == "NUVEC_DISTRIBUTED_TCP_CONGESTION").then(|| name.into())
            })
        };
        let reno = with("reno").expect("a name");
        assert_eq!(
            reno,
            Options::new()
                .timeout(SETUP + budget)
                .tcp_congestion("reno")
                .expect("a name")
        );
        assert_eq!(
            with(" ").expect("unset"),
            Options::new().timeout(SETUP + budget)
        );
        let e = with("not a name!").expect_err("refused");
        assert!(e.starts_with("NUVEC_DISTRIBUTED_TCP_CONGESTION: "), "{e}");
    }
}
