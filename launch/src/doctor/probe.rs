//! `nuvec-launch probe` (hidden): what `nuvec-launch doctor` starts on every rank's host,
//! the way a job's rank is started, so that it sees what the rank would see: its rank
//! (`MLX_RANK`) and the job's topology from the same variables (`MLX_HOSTFILE` for the ring;
//! `MLX_JACCL_COORDINATOR` and `MLX_IBV_DEVICES` for JACCL).
//!
//! Its links ([`ring_links`], [`jaccl_links`]) are the job's: for the ring, rank r's
//! connection c to address c of rank r+1 (MLX's ring: r connects to every address of its
//! right neighbour); for JACCL, every rank but 0 to the coordinator. It listens where the job's ranks would listen, at
//! the job's port plus `--offset` (the doctor passes the number of ports the job uses, so the
//! probe ports are the block right after the job's and never the job's own), and answers
//! every connection with `protocol.rs`'s [`Server`].
//!
//! It speaks to the doctor in JSON lines: on standard output first
//! `{"ready": {rank, size, listening, errors, links}}`, then for each `{"measure": I}` read
//! on standard input `{"measured": {index, ...}}` (`measure.rs`). It exits when standard
//! input ends, on `{"quit": true}`, or after `--lifetime` seconds whatever happens.
//!
//! With `--sweep` it is instead one rank of the all_sum sweep (`sweep_rank.rs`): it prints
//! `{"swept": ...}` when done and exits.

use std::io::{BufRead, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::endpoint::endpoint;
use super::measure::{Budget, FRAME, Measurement, measure};
use super::protocol::{Action, Decoder, Message, Server, encode};

/// One link of the job, from the probe's rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LinkSpec {
    /// Its index among this rank's links.
    pub(crate) index: usize,
    /// The peer rank.
    pub(crate) to_rank: usize,
    /// The connection (the address index in the peer's host file entry; 0 for JACCL).
    pub(crate) connection: usize,
    /// The job's address there (`host:port`, as the host file has it).
    pub(crate) job: String,
}

/// What a probe found about its job before measuring.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ready {
    /// Its rank.
    pub(crate) rank: usize,
    /// The job's size.
    pub(crate) size: usize,
    /// The probe addresses it listens on.
    pub(crate) listening: Vec<String>,
    /// What went wrong listening.
    pub(crate) errors: Vec<String>,
    /// Its links.
    pub(crate) links: Vec<LinkSpec>,
}

/// The job's topology as a rank sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Topology {
    /// The rank.
    pub(crate) rank: usize,
    /// The job's size.
    pub(crate) size: usize,
    /// The job addresses this rank listens on.
    pub(crate) listen: Vec<String>,
    /// The links this rank opens.
    pub(crate) links: Vec<LinkSpec>,
}

/// The ring's topology for `rank` of `nodes` (the `MLX_HOSTFILE` list).
pub(crate) fn ring_links(rank: usize, nodes: &[Vec<String>]) -> Topology {
    let size = nodes.len();
    let right = (rank + 1) % size.max(1);
    let links = if size < 2 {
        Vec::new()
    } else {
        nodes[right]
            .iter()
            .enumerate()
            .map(|(c, a)| LinkSpec {
                index: c,
                to_rank: right,
                connection: c,
                job: a.clone(),
            })
            .collect()
    };
    Topology {
        rank,
        size,
        listen: nodes.get(rank).cloned().unwrap_or_default(),
        links,
    }
}

/// JACCL's side channel for `rank` of `size`: every rank but 0 connects to `coordinator`.
pub(crate) fn jaccl_links(rank: usize, size: usize, coordinator: &str) -> Topology {
    Topology {
        rank,
        size,
        listen: if rank == 0 {
            vec![coordinator.to_owned()]
        } else {
            Vec::new()
        },
        links: if rank == 0 {
            Vec::new()
        } else {
            vec![LinkSpec {
                index: 0,
                to_rank: 0,
                connection: 0,
                job: coordinator.to_owned(),
            }]
        },
    }
}

/// `host:port` (or `[v6]:port`) resolved, with `offset` added to the port.
pub(crate) fn address(text: &str, offset: u16) -> Result<SocketAddr, String> {
    let mut addr = text
        .to_socket_addrs()
        .map_err(|e| format!("{text}: {e}"))?
        .next()
        .ok_or_else(|| format!("{text}: no address"))?;
    let port = addr
        .port()
        .checked_add(offset)
        .ok_or_else(|| format!("{text}: its port plus {offset} is beyond 65535"))?;
    addr.set_port(port);
    Ok(addr)
}

/// The topology from this process's environment, as a rank reads it.
fn topology_from_env() -> Result<Topology, String> {
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    let rank: usize = var("MLX_RANK")?
        .trim()
        .parse()
        .map_err(|_| "MLX_RANK is not a rank".to_owned())?;
    if let Ok(coordinator) = var("MLX_JACCL_COORDINATOR") {
        let path = var("MLX_IBV_DEVICES")?;
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        let matrix: Vec<Value> = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
        return Ok(jaccl_links(rank, matrix.len(), &coordinator));
    }
    let path = var("MLX_HOSTFILE")?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let nodes: Vec<Vec<String>> =
        serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    if rank >= nodes.len().max(1) {
        return Err(format!("MLX_RANK {rank} is not a rank of {}", nodes.len()));
    }
    Ok(ring_links(rank, &nodes))
}

/// Prints one JSON line.
fn say(value: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

/// The probe's command line.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "nuvec-launch probe")]
struct ProbeArgs {
    /// Added to every job port for the probe's own.
    #[arg(long)]
    offset: u16,
    /// Bulk bytes each way, at most.
    #[arg(long, default_value_t = 64 << 20)]
    bytes: u64,
    /// Bulk seconds each way, at most.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Round trips per link.
    #[arg(long, default_value_t = 200)]
    pings: usize,
    /// The longest connect, seconds.
    #[arg(long, default_value_t = 2.0)]
    connect_timeout: f64,
    /// Exit after this many seconds whatever happens.
    #[arg(long, default_value_t = 600.0)]
    lifetime: f64,
    /// Run the all_sum sweep of the job instead (`sweep_rank.rs`), on the probe ports.
    #[arg(long)]
    sweep: bool,
    /// The sweep's budget, seconds.
    #[arg(long, default_value_t = 10.0)]
    sweep_seconds: f64,
}

fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::from_secs(1))
}

/// Runs the probe (`argv[0]` is `probe`); returns its exit status.
pub(crate) fn main(argv: Vec<std::ffi::OsString>) -> i32 {
    use clap::Parser as _;
    let args = match ProbeArgs::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            say(&json!({ "error": e.to_string() }));
            return 2;
        }
    };
    let mut lifetime = seconds(args.lifetime);
    if args.sweep {
        // A sweep ends by itself within its setup, its budget and one operation beyond it.
        lifetime = lifetime.max(2 * (super::sweep_rank::SETUP + seconds(args.sweep_seconds)));
    }
    std::thread::spawn(move || {
        // The probe's bound: a doctor that died without closing our input ends us here.
        std::thread::sleep(lifetime);
        std::process::exit(3);
    });
    if args.sweep {
        let swept = super::sweep_rank::run(args.offset, seconds(args.sweep_seconds));
        say(&json!({ "swept": swept }));
        return 0;
    }
    let topology = match topology_from_env() {
        Ok(t) => t,
        Err(e) => {
            say(&json!({ "error": format!("the job's environment: {e}") }));
            return 2;
        }
    };
    let mut listening = Vec::new();
    let mut errors = Vec::new();
    for job in &topology.listen {
        let bound = address(job, args.offset).and_then(|a| {
            TcpListener::bind(a).map_err(|e| format!("listening on {a} (for the job's {job}): {e}"))
        });
        match bound {
            Ok(l) => {
                listening.push(l.local_addr().map(|a| a.to_string()).unwrap_or_default());
                std::thread::spawn(move || serve(&l));
            }
            Err(e) => errors.push(e),
        }
    }
    let ready = Ready {
        rank: topology.rank,
        size: topology.size,
        listening,
        errors,
        links: topology.links.clone(),
    };
    say(&json!({ "ready": ready }));
    let budget = Budget {
        connect: seconds(args.connect_timeout),
        pings: args.pings,
        bytes: args.bytes,
        time: seconds(args.seconds),
        io: seconds(args.seconds + 10.0),
    };
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Ok(command) = serde_json::from_str::<Value>(line.trim()) else {
            continue;
        };
        if command.get("quit").is_some() {
            break;
        }
        let Some(index) = command.get("measure").and_then(Value::as_u64) else {
            continue;
        };
        let Some(link) = topology.links.get(index as usize) else {
            say(&json!({ "error": format!("no link {index}") }));
            continue;
        };
        let m = match (address(&link.job, 0), address(&link.job, args.offset)) {
            (Ok(job), Ok(probe)) => measure(job, probe, &budget),
            (Err(e), _) | (_, Err(e)) => Measurement {
                error: Some(e),
                ..Measurement::default()
            },
        };
        say(&json!({ "measured": { "index": index, "measurement": m } }));
    }
    0
}

/// Accepts connections for ever (the process's life bounds it), one thread each.
fn serve(listener: &TcpListener) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        std::thread::spawn(move || {
            let _ = serve_one(stream);
        });
    }
}

/// Drives [`Server`] over one accepted connection.
fn serve_one(mut stream: TcpStream) -> Result<(), String> {
    let e = |e: std::io::Error| e.to_string();
    stream.set_nodelay(true).map_err(e)?;
    // An idle connection is dropped after a minute: no wait here is unbounded.
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(e)?;
    stream
        .set_write_timeout(Some(Duration::from_secs(60)))
        .map_err(e)?;
    let info = stream
        .local_addr()
        .map(|a| serde_json::to_string(&endpoint(a)).unwrap_or_default())
        .unwrap_or_default();
    let mut server = Server::new(info, FRAME);
    let mut decoder = Decoder::default();
    let start = Instant::now();
    let mut buf = vec![0u8; 256 << 10];
    let zeros = vec![0u8; FRAME];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err) => return Err(err.to_string()),
        };
        let mut at = 0;
        while at < n {
            let (used, message) = decoder.decode(&buf[at..n]).map_err(|p| p.0)?;
            at += used;
            let Some(message) = message else { break };
            for action in server.on(message, start.elapsed()).map_err(|p| p.0)? {
                match action {
                    Action::Send(bytes) => stream.write_all(&bytes).map_err(e)?,
                    Action::Stream(mut s) => {
                        let t = Instant::now();
                        while let Some(k) = s.next(t.elapsed()) {
                            stream.write_all(&encode(&Message::Data(k))).map_err(e)?;
                            stream.write_all(&zeros[..k]).map_err(e)?;
                        }
                        stream.write_all(&encode(&Message::End)).map_err(e)?;
                    }
                    Action::Close => return Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_ring_rank_links_to_every_address_of_its_right_neighbour() {
        let nodes = vec![
            strings(&["10.0.0.1:5000", "10.0.1.1:5001"]),
            strings(&["10.0.0.2:5002", "10.0.1.2:5003"]),
            strings(&["10.0.0.3:5004", "10.0.1.3:5005"]),
        ];
        let t = ring_links(2, &nodes);
        assert_eq!(t.listen, nodes[2]);
        let to: Vec<(usize, usize, &str)> = t
            .links
            .iter()
            .map(|l| (l.to_rank, l.connection, l.job.as_str()))
            .collect();
        assert_eq!(to, [(0, 0, "10.0.0.1:5000"), (0, 1, "10.0.1.1:5001")]);
        assert!(ring_links(0, &nodes[..1]).links.is_empty());
    }

    #[test]
    fn jaccl_ranks_link_to_the_coordinator_which_listens() {
        assert_eq!(
            jaccl_links(0, 3, "10.0.0.1:32323").listen,
            ["10.0.0.1:32323"]
        );
        let t = jaccl_links(2, 3, "10.0.0.1:32323");
        assert!(t.listen.is_empty());
        assert_eq!(t.links[0].to_rank, 0);
    }

    #[test]
    fn a_probe_port_is_the_job_port_plus_the_offset_and_never_beyond_65535() {
        assert_eq!(
            address("127.0.0.1:32323", 4),
            Ok("127.0.0.1:32327".parse().expect("an address"))
        );
        assert!(address("127.0.0.1:65535", 1).is_err());
    }

    #[test]
    fn a_link_measured_on_loopback_has_every_number() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let probe = listener.local_addr().expect("its address");
        std::thread::spawn(move || serve(&listener));
        let budget = Budget {
            connect: Duration::from_secs(2),
            pings: 20,
            bytes: 4 << 20,
            time: Duration::from_secs(1),
            io: Duration::from_secs(10),
        };
        // The job's port: nobody listens on port 1 of loopback.
        let m = measure("127.0.0.1:1".parse().expect("an address"), probe, &budget);
        assert_eq!(m.error, None, "{m:?}");
        assert_eq!(
            m.job_port.as_ref().map(|p| p.outcome.as_str()),
            Some("refused")
        );
        assert_eq!(m.rtt.as_ref().map(|r| r.count), Some(20));
        assert_eq!(m.forward.as_ref().map(|t| t.bytes), Some(4 << 20));
        assert_eq!(m.back.as_ref().map(|t| t.bytes), Some(4 << 20));
        assert!(
            m.from.as_ref().is_some_and(|f| f.interface.is_some()),
            "{m:?}"
        );
        assert!(
            m.to.as_ref().is_some_and(|t| t.local == probe.to_string()),
            "{m:?}"
        );
    }
}
