//! The collectives of MLX's TCP ring and of MLX's JACCL (its mesh and its ring) timed
//! nccl-tests style, against the wire: the same ranks moving the same bytes in the same ring
//! pattern over plain blocking sockets, with no reduction.
//!
//! ```text
//! cargo bench --ignore-rust-version --bench allreduce -- [--backend ring|jaccl|jaccl-ring]
//!     [--ranks N] [--conns C] [--fabric tcp|sim]
//!     [--op all_sum|all_max|all_min|all_gather|sendrecv]
//!     [--dtype float32|float16|bfloat16|float64|int32|uint8|...]
//!     [--sizes 4K..64M | --sizes 4K,1M,16M] [--step 4] [--iters K] [--warmup W]
//!     [--agg mean|max|rank0] [--pingpong 4K|0] [--no-wire] [--timeout SECS] [--spin US]
//!     [--tcp-only] [--sim-link LATENCY_US,GBIT_PER_S,WINDOW]
//! ```
//!
//! `--tcp-only` keeps the ring's links on loopback TCP between ranks on one machine, where by
//! default they are local links through shared memory ([`Options::local_links`]): the wire
//! is always TCP, so this is the ring against the wire on the same medium.
//!
//! `--spin` fixes how long a step that waits keeps looking before it parks, every time
//! ([`Options::spin`]; 0 parks at once), to compare with the default, which adapts (at most
//! 100 µs, and only while looking pays).
//!
//! `--fabric rdma` (built with `--features jaccl`) runs JACCL over the RDMA fabric, the verbs
//! library the environment names (`NUVEC_JACCL_VERBS`: with the software provider,
//! `NUVEC_VERBS_EMU_DEVICES` listing the device file's devices); its ranks poll their
//! completion queues, at once while looking pays and yielding the core between polls after.
//! The wire is still TCP, on the side channel's interface: over the provider, a reference.
//!
//! `--backend` names the algorithms as MLX's launcher does: `ring` (the default) is MLX's TCP
//! ring, `RingCommunicator` over `TcpFabric` with `--conns` connections per neighbour; `jaccl`
//! is JACCL's mesh (2 to 8 ranks, one cable between every pair) and `jaccl-ring` JACCL's ring
//! (2 or more ranks, `--conns` cables per neighbour, MLX's C, 1 to 4), both
//! `nuvec_distributed::jaccl::JacclCommunicator` with MLX's default frames
//! (`FrameRule::Small`). Over `--fabric tcp` JACCL's cables are TCP connections, one per cable
//! (`nuvec_distributed::jaccl::tcp`, what `NUVEC_JACCL_FABRIC=tcp` selects): JACCL's
//! algorithms between real processes, but not RDMA.
//!
//! Without `MLX_RANK` in the environment the program starts `--ranks` local ranks itself
//! (copies of this binary over loopback, with `MLX_RANK` set, and `MLX_HOSTFILE` for the ring;
//! for JACCL a device file of a mesh or a ring of local ranks in `MLX_IBV_DEVICES`, rank 0's
//! side channel in `MLX_JACCL_COORDINATOR`, and `MLX_JACCL_RING` for `jaccl-ring`) and waits
//! for them; with it, the program is one rank of a job, so it also runs under MLX's launcher:
//! `mlx.launch -n 4 --backend ring -- target/release/deps/allreduce-<hash> --sizes 4K..16M`,
//! or `mlx.launch --backend jaccl-ring ... -- <the same> --backend jaccl-ring` (the topology
//! the device file gives must be the one `--backend` names; the cables are TCP connections on
//! the side channel's interface). `--fabric sim` runs every rank in this process over
//! `nuvec-fabric-sim` instead (the ring over its stream channels, JACCL over its UC message
//! channels), in virtual time (a sanity check of the schedule, not a measurement of this
//! machine); `--sim-link 250,50,4M` sets its links (one-way latency in µs, Gbit/s each way,
//! window), to set a schedule's time against a link's that this machine does not have.
//!
//! Rank 0 prints one row per size: bytes, elements, dtype, the p50 and p99 time of one
//! operation (µs), algbw = bytes / p50 and busbw = algbw × 2(n−1)/n for an all-reduce,
//! × (n−1)/n for an all-gather (whose size is the gathered total), × 1 for send/recv; a check
//! column (every rank's result compared element by element with the exact answer: inputs are
//! small integers, so even float sums are exact); and the busbw as a percentage of the wire
//! row of the same size. Every timed iteration is preceded by a barrier (an all_sum of one
//! byte per rank); the time of an iteration is the mean over the ranks of what each measured
//! (`--agg`; a round trip is always rank 0's time; in simulation, rank 0's virtual time). The
//! `cpu µs/rank` column is the CPU time one operation took on a rank, all its threads, those
//! that exited during it included (`CLOCK_PROCESS_CPUTIME_ID`), the mean over ranks and iterations: unlike the wall-clock
//! columns it does not depend on how many threads the job has when the machine is shared, so
//! `cpu÷wire` compares the work done, and `%wire` the bandwidth reached.
//!
//! The **wire** rows (over TCP) time the machine's limit for the same traffic: a ring of plain
//! blocking `std::net` sockets (one to the right neighbour, one from the left; each rank
//! listens on its hostfile address, or for JACCL on its side channel's interface, and the
//! addresses are all-gathered over the communicator), over which each rank runs the
//! collective's steps — 2(n−1) for an all-reduce, n−1 for an all-gather — each step sending
//! ⌈S/n⌉ bytes to the right while receiving as many from the left (a writer thread and the
//! calling thread; both on the calling thread when a step fits in the socket buffers), with no
//! reduction. The pattern is the ring's for every backend: JACCL's mesh exchanges with every
//! peer at once instead (above 32 KiB on more than 2 ranks as many bytes per rank as a ring,
//! else its whole buffer to every peer), so for it the wire is the machine's limit for a
//! ring's traffic, a reference rather than the same messages. The **ping-pong** row is a
//! round trip of `--pingpong` bytes between ranks 0 and 1 over one of those sockets; the same
//! round trip over the communicator (`try_send`/`try_recv`) is printed beside it.
//!
//! The files, one job each: `args.rs` (the command line), `launch.rs` (local ranks, through the
//! workspace's one local launcher, `nuvec-local`), this file (the entry, and one rank over TCP:
//! joining the job, the wire, the tables), `measure.rs` (the timed loop on any communicator),
//! `data.rs` (inputs and checks), `wire.rs` (the wire), `report.rs` (the printed tables, which
//! `benches/compare.sh` and `benches/plot.py` parse) and `sim.rs` (`--fabric sim`).

mod args;
#[path = "../common/cpu_time.rs"]
mod cpu_time;
mod data;
mod launch;
mod measure;
mod report;
mod sim;
#[path = "../common/warmup.rs"]
mod warmup;
mod wire;

use std::error::Error as StdError;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Instant;

use nuvec_distributed::fabric::Fabric;
use nuvec_distributed::jaccl::{self, FrameRule, JacclCommunicator, SideChannel, Topology};
use nuvec_distributed::{Options, connect_ring, hostfile};

use crate::args::{Args, Backend};
use crate::launch::launch;
use crate::measure::{Clock, Collectives, measure_all};
use crate::report::{print_header, print_pingpong, print_rows, print_wire};
use crate::sim::run_sim;
use crate::wire::Wire;

/// Errors of every kind, sendable between threads (the simulator's ranks are threads).
type Result<T> = std::result::Result<T, Box<dyn StdError + Send + Sync>>;

/// Runs the simulation, one rank, or the launcher of local ranks; prints the synopsis and
/// exits 0 on `-h`/`--help`, exits 2 on a bad command line and 1 on a failure.
fn main() {
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        println!("{}", args::USAGE);
        return;
    }
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    // JACCL also reads its rank from `JACCL_RANK`.
    let is_rank = std::env::var_os("MLX_RANK").is_some()
        || (args.backend != Backend::Ring && std::env::var_os("JACCL_RANK").is_some());
    let result = if args.sim {
        run_sim(&args)
    } else if is_rank {
        run_rank(&args)
    } else {
        launch(&args)
    };
    if let Err(e) = result {
        let rank = std::env::var("MLX_RANK").unwrap_or_else(|_| "launcher".into());
        eprintln!("allreduce bench (rank {rank}): {e}");
        std::process::exit(1);
    }
}

/// One rank of a TCP job of `args.backend`.
fn run_rank(args: &Args) -> Result<()> {
    match args.backend {
        Backend::Ring => run_ring_rank(args),
        Backend::JacclMesh | Backend::JacclRing => run_jaccl_rank(args),
    }
}

/// One rank of MLX's ring: joins it from `MLX_HOSTFILE`/`MLX_RANK`, then [`tcp_rank`] with
/// the wire on this rank's first hostfile address.
fn run_ring_rank(args: &Args) -> Result<()> {
    let path = std::env::var("MLX_HOSTFILE").map_err(|_| {
        if std::env::var_os("MLX_IBV_DEVICES").is_some() {
            "MLX_RANK is set but MLX_HOSTFILE is not (MLX_IBV_DEVICES is: a JACCL job? pass --backend jaccl or jaccl-ring)"
        } else {
            "MLX_RANK is set but MLX_HOSTFILE is not"
        }
    })?;
    let rank: usize = std::env::var("MLX_RANK")?
        .parse()
        .map_err(|_| "MLX_RANK is not a number")?;
    let nodes = hostfile::read(Path::new(&path))?;
    let mut options = Options::default()
        .timeout(args.timeout)
        .local_links(!args.tcp_only)
        .wire(args.ring_wire);
    if let Some(spin) = args.spin {
        options = options.spin(spin);
    }
    let group = connect_ring(&nodes, rank, &options)?;
    let comm = group
        .communicator()
        .ok_or("the bench needs a ring of at least 2 ranks")?;
    let mut args = args.clone();
    args.conns = comm.topology().conns();
    let (host, _) = hostfile::split_address(&nodes[rank][0])?;
    let links = if args.tcp_only {
        "tcp only"
    } else {
        "tcp, local links between ranks on one machine"
    };
    let fabric = format!("{links}, {}", comm.wire());
    tcp_rank(&args, comm, &host, &fabric)?;
    group.close();
    Ok(())
}

/// One rank of a JACCL job over TCP: reads the job as JACCL does (`MLX_RANK`,
/// `MLX_IBV_DEVICES`, `MLX_JACCL_COORDINATOR`, `MLX_JACCL_RING`), connects every cable as a
/// TCP connection through the side channel, builds the mesh or ring the device file gives
/// (which must be the one `--backend` names), then [`tcp_rank`] with the wire on the side
/// channel's interface.
fn run_jaccl_rank(args: &Args) -> Result<()> {
    let config = jaccl::Config::from_env()?.ok_or(
        "JACCL needs MLX_IBV_DEVICES (the device file), MLX_RANK and MLX_JACCL_COORDINATOR",
    )?;
    config.validate()?;
    let wires = match (args.backend, config.topology()?) {
        (Backend::JacclMesh, Topology::Mesh { .. }) => None,
        (Backend::JacclRing, Topology::Ring { wires }) => Some(wires),
        (backend, topology) => {
            let found = match topology {
                Topology::Mesh { .. } => "a mesh".to_string(),
                Topology::Ring { wires } => format!("a ring of {wires} cable(s) per neighbour"),
            };
            return Err(format!(
                "--backend {} but the device file and MLX_JACCL_RING give {found} (--backend jaccl times the mesh, jaccl-ring the ring)",
                backend.name()
            )
            .into());
        }
    };
    let coordinator = config
        .coordinator_address()
        .ok_or("no MLX_JACCL_COORDINATOR")?;
    let mut side = SideChannel::connect(coordinator, config.rank(), config.size(), args.timeout)?;
    let host = side
        .local_ip()
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .to_string();
    if args.rdma {
        #[cfg(feature = "jaccl")]
        {
            let mut fabric = jaccl::rdma::connect(&config, &mut side, args.timeout)?;
            if let Some(spin) = args.spin {
                fabric = fabric.with_spin(spin);
            }
            drop(side);
            return jaccl_rank(args, fabric, wires, &host, "rdma (a queue pair per cable)");
        }
        #[cfg(not(feature = "jaccl"))]
        return Err("--fabric rdma needs the bench built with --features jaccl".into());
    }
    let (mut fabric, _) = jaccl::tcp::connect(&config, &mut side, args.timeout)?;
    if let Some(spin) = args.spin {
        fabric = fabric.with_spin(spin);
    }
    drop(side);
    jaccl_rank(
        args,
        fabric,
        wires,
        &host,
        "tcp (one TCP connection per cable)",
    )
}

/// One rank of a JACCL job over `fabric`: its mesh, or its ring of `wires` cables per
/// neighbour, then [`tcp_rank`].
fn jaccl_rank<F: Fabric + Send + 'static>(
    args: &Args,
    fabric: F,
    wires: Option<usize>,
    host: &str,
    what: &str,
) -> Result<()> {
    let (rule, timeout) = (FrameRule::Small, args.timeout);
    let mut args = args.clone();
    let comm = match wires {
        None => JacclCommunicator::mesh(fabric, rule, timeout),
        Some(wires) => {
            args.conns = wires;
            JacclCommunicator::ring(fabric, wires, rule, timeout)
        }
    };
    tcp_rank(&args, &comm, host, what)?;
    drop(comm.close());
    Ok(())
}

/// One rank of a TCP job over `comm`: connects the wire (listening on `host`), measures every
/// size, and prints the tables on rank 0 (`fabric` in the header).
fn tcp_rank(args: &Args, comm: &impl Collectives, host: &str, fabric: &str) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let mut wire = if args.wire {
        Some(Wire::connect(comm, host)?)
    } else {
        None
    };
    if rank == 0 {
        print_header(args, n, fabric);
    }
    let clock = Clock::Wall(Instant::now());
    let measured = measure_all(args, comm, &clock, wire.as_mut())?;
    if rank == 0 {
        print_rows(args, n, &measured.rows, &measured.wire_rows);
        if let Some(w) = wire.as_ref() {
            print_wire(args, n, w, &measured.wire_rows);
        }
        if let Some((wire_rtt, comm_rtt)) = measured.pingpong {
            print_pingpong(args, &measured.rows, args.pingpong, wire_rtt, comm_rtt);
        }
    }
    if let Some(w) = wire {
        w.close();
    }
    Ok(())
}
