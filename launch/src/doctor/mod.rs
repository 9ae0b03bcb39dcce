//! `nuvec-launch doctor`: checks a cluster as a job would use it, before the job runs.
//!
//! ```text
//! nuvec-launch doctor --hostfile cluster.json          # the backend from the host file
//! nuvec-launch doctor --hosts 192.168.0.1,192.168.0.2  # a ring over these addresses
//! ```
//!
//! On every rank's host it runs `ifconfig` (and `ip -o addr show up`, for the secondary IPv4
//! addresses Linux's `ifconfig` does not show), `networksetup -listallhardwareports`, for
//! JACCL `ibv_devices` and for the ring a read of `/proc/sys/net/ipv4/tcp_congestion_control`
//! (over ssh; directly on `127.0.0.1`/`localhost`; or from saved files
//! with `--replay DIR`, as `nuvec-launch config --replay` reads them, plus `ifconfig.txt` and `ip-addr.txt`), and
//! checks each rank's host file entry against them ([`checks`]): which interface each address
//! of the job is on, an address on Wi-Fi while Thunderbolt has addresses, an address on the
//! Thunderbolt Bridge or on no interface, the bridge up over an interface the job uses, an
//! RDMA device missing, its interface without an IPv4 address (no IPv4-mapped GID) or
//! unplugged; and a Linux host's TCP congestion control (`tcp_congestion_control.txt` when
//! replayed), with advice where it is BBR.
//!
//! Then (not with `--replay` or `--no-measure`) it measures every link of the job's topology
//! as the job would use it: it starts itself as a probe (`nuvec-launch probe`, [`probe`]) on
//! every rank's host exactly as a job's rank is started ([`probes`]: the same ssh command and
//! script, `--cwd`, `--env`, `MLX_RANK` and the generated host file or device file), and has
//! each probe, one link at a time, check the job's port of its link and measure the link on
//! the probe port beside it ([`measure`]): connect time, where the traffic leaves from
//! (interface, address, MTU), round trips of 8 bytes (p50/p99), and bulk bytes each way
//! within `--probe-mib` and `--probe-seconds`. The links are a ring rank's connections to its
//! right neighbour's addresses, and JACCL's connections to its coordinator. JACCL's RDMA
//! cables are not TCP: the sweep's ranks measure them (below).
//!
//! The probe ports: the job's port plus the number of ports the job uses, i.e. the block right
//! after the job's (`-p 32323`, 4 ranks: the job uses 32323–32326, the probes listen on
//! 32327–32330). Not the job's own ports, so that the doctor never takes a port from a job
//! that is starting, and a job started right after it finds its ports free (no `TIME_WAIT`
//! left on them by the measurements); the job's own port is still checked by a connect
//! bounded by `--connect-timeout`: before the job, nobody listens there and the host refuses
//! at once, so no answer at all is a firewall dropping the port.
//!
//! The findings ([`report`]): a port that does not answer or is taken, a link that could not
//! be measured, a direction slower than half the median of all the job's directions,
//! directions asymmetric below 0.7x, different MTUs at a link's ends, a host whose links use
//! several interfaces.
//!
//! Last (not with `--no-sweep`), the job as a whole: an all_sum sweep of float32 from 4 KiB to
//! 64 MiB within `--sweep-seconds` ([`mod@sweep`], the pacing, busbw and the verdict;
//! [`sweep_rank`], a rank of it). The probes are started again, as the ranks of the job, with
//! `--sweep`: each connects this crate's ring over the job's host file on the probe ports, as a
//! job's rank connects it on the job's, and rank 0 reports per size the slowest rank's time and
//! the busbw. The largest size's busbw is set against the slowest link direction measured,
//! which is named: a ring goes at its slowest link's pace, so a sweep well below it points at
//! the hosts (CPU, memory) rather than the network, and one that cannot connect, or sums
//! wrong, is a problem. A JACCL job (`jaccl`, `jaccl-ring`) is swept as its ranks would run:
//! each connects this crate's JACCL from the job's device file with the coordinator moved to
//! the probe port, over RDMA (this program built with its feature `jaccl`; a machine without
//! the verbs library or a device is a problem in the library's words), or over TCP cables with
//! `--env NUVEC_JACCL_FABRIC=tcp`. Before it sums, that group measures every cable of the job
//! one at a time ([`cables`]: round trips, 8 MiB each way), and the links' findings (slow
//! against the median of the cables, asymmetric, a rank on every slow cable) apply to the
//! cables.
//!
//! Output: the table, `--json`, `--svg FILE` ([`svg`]). It exits with 1 when it finds a
//! problem.

/// `println!` that does not panic when standard output is closed (`| head`).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod cables;
mod checks;
mod endpoint;
mod interfaces;
mod measure;
pub(crate) mod probe;
mod probes;
mod protocol;
mod report;
mod svg;
mod sweep;
mod sweep_rank;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;

use self::measure::Budget;
use crate::args::Args;
use crate::config::discover::{
    CONGESTION, HARDWARE_PORTS, IBV_DEVICES, IP_ADDRESSES, IP_ADDRESSES_REMOTE, hardware_ports,
    rdma_devices,
};
use crate::config::ssh::{COMMAND_TIMEOUT, Output, Replay, Runner, Ssh, bounded};
use crate::hosts::{HostList, hosts_of};
use crate::plan::{LOCAL_HOSTS, Plan};

/// The command line of `nuvec-launch doctor`.
#[derive(Clone, Debug, PartialEq, Parser)]
#[command(
    name = "nuvec-launch doctor",
    bin_name = "nuvec-launch doctor",
    about = "Check a cluster as a job would use it: each host against the host file, then every \
             link of the job's topology measured by a probe started on each host as a rank is",
    infer_long_args = true,
    args_override_self = true,
    after_help = "\
Per link (a ring rank's connection to each address of its right neighbour; a JACCL rank's to
the coordinator): the job's port answering (no answer: a firewall dropping it), connect time,
the interface, address and MTU the traffic leaves from, round trips of 8 bytes (p50/p99),
bulk bytes each way. The probes listen on the job's ports plus the number of ports the job
uses (the block after the job's). Flags: a port that does not answer, a direction below 0.5x
the median of the job's links, directions below 0.7x of each other, different MTUs, a host
whose links use several interfaces. Then an all_sum sweep of the whole job, float32, 4 KiB
to 64 MiB, over the probe ports: the ring of nuvec-distributed, or for a JACCL job its JACCL
with the coordinator on the probe port, over RDMA (nuvec-launch built with the feature jaccl)
or over TCP cables with --env NUVEC_JACCL_FABRIC=tcp. Per size the slowest rank's time and
busbw (2(R-1)/R x bytes / time), the largest size set against the slowest link direction,
which is named; a sweep that cannot connect is a problem. Exits with 1 when a problem is
found, 2 for a usage error, 0 otherwise."
)]
pub(crate) struct DoctorArgs {
    /// A comma separated list of hosts (a ring over those that are addresses)
    #[arg(long, default_value = "127.0.0.1")]
    hosts: String,
    /// The file containing the hosts (MLX's JSON host file)
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// The backend the job uses: ring, jaccl or jaccl-ring [default: the host file's backend,
    /// else ring]
    #[arg(long, value_parser = ["ring", "jaccl", "jaccl-ring"])]
    backend: Option<String>,
    /// The job's starting port, as nuvec-launch's -p
    #[arg(short = 'p', long, value_name = "PORT", default_value_t = crate::args::DEFAULT_STARTING_PORT)]
    starting_port: i64,
    /// The job's connections per IP (ring), as nuvec-launch's
    #[arg(long, value_name = "N", default_value_t = 1)]
    connections_per_ip: i64,
    /// Environment variables for the probes, as for a job's ranks (repeatable)
    #[arg(long, value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// The working directory of the probes on each host, as nuvec-launch's --cwd
    #[arg(long)]
    cwd: Option<String>,
    /// The nuvec-launch that runs as the probe on every host [default: this one's path]
    #[arg(long, value_name = "PATH")]
    probe_program: Option<String>,
    /// At most this many MiB each way per link
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    probe_mib: u64,
    /// At most this many seconds each way per link
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    probe_seconds: f64,
    /// Round trips of 8 bytes per link
    #[arg(long, value_name = "N", default_value_t = 200)]
    pings: usize,
    /// The longest connect, in seconds (a port that answers within it is not dropped)
    #[arg(long, value_name = "S", default_value_t = 2.0)]
    connect_timeout: f64,
    /// At most this many seconds for the all_sum sweep of the whole job (larger sizes are
    /// skipped when it is spent)
    #[arg(long, value_name = "S", default_value_t = 10.0)]
    sweep_seconds: f64,
    /// Measure the links but run no all_sum sweep
    #[arg(long)]
    no_sweep: bool,
    /// Check the hosts only; measure no link, run no sweep
    #[arg(long)]
    no_measure: bool,
    /// Print the report as JSON, for scripts
    #[arg(long)]
    json: bool,
    /// Also draw the topology with each link's measured rates to this SVG file
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Run nothing: read each host's command outputs from DIR/HOST/ (ifconfig.txt,
    /// ip-addr.txt, hardware-ports.txt, ibv_devices.txt, tcp_congestion_control.txt); links
    /// are not measured
    #[arg(long, value_name = "DIR")]
    replay: Option<PathBuf>,
}

/// Runs `nuvec-launch doctor` with `argv` (`doctor` first) and returns the exit status.
pub(crate) fn main(argv: Vec<OsString>) -> i32 {
    use clap::CommandFactory;
    let args = match DoctorArgs::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
    let invalid = |what: &str| {
        usage(&DoctorArgs::command().error(clap::error::ErrorKind::ValueValidation, what))
    };
    // Bounded so that every deadline and byte count derived from them fits: an hour per link,
    // 1 TiB each way, a million round trips.
    let seconds = |v: f64| v.is_finite() && v > 0.0 && v <= 3600.0;
    if !seconds(args.probe_seconds)
        || !seconds(args.connect_timeout)
        || !seconds(args.sweep_seconds)
    {
        return invalid(
            "--probe-seconds, --connect-timeout and --sweep-seconds take a number of seconds \
             above 0, at most 3600",
        );
    }
    if args.probe_mib == 0 || args.probe_mib > 1 << 20 {
        return invalid("--probe-mib takes 1 to 1048576 (1 TiB)");
    }
    if args.pings > 1_000_000 {
        return invalid("--pings takes at most 1000000");
    }
    let list = match hosts_of(args.hostfile.as_deref(), &args.hosts) {
        Ok(l) => l,
        Err(e) => return invalid(&e.0),
    };
    for w in &list.warnings {
        eprintln!("[WARN] {w}");
    }
    let backend = match (&args.backend, list.backend.as_str()) {
        (Some(b), _) => b.clone(),
        (None, "") => "ring".to_owned(),
        (None, b) => b.to_owned(),
    };
    let measuring = args.replay.is_none() && !args.no_measure;
    // The job's plan, with the probe as its command: what a rank would be given.
    let plan = if measuring {
        match probe_plan(&args, &backend, list.clone()) {
            Ok(p) => Some(p),
            Err(e) => return invalid(&e),
        }
    } else {
        None
    };
    let runner: Box<dyn Runner> = match &args.replay {
        Some(dir) => Box::new(Replay(dir.clone())),
        None => Box::new(Ssh),
    };
    let mut report = report::Report {
        backend: backend.clone(),
        ..report::Report::default()
    };
    let mut states: HashMap<String, Result<checks::HostState, String>> = HashMap::new();
    for (rank, h) in list.hosts.iter().enumerate() {
        let state = states
            .entry(h.ssh.clone())
            .or_insert_with(|| state_of(&h.ssh, &backend, runner.as_ref(), args.replay.is_some()));
        let mut r = report::RankReport {
            rank,
            host: h.ssh.clone(),
            ..report::RankReport::default()
        };
        match state {
            Err(why) => r.problems.push(why.clone()),
            Ok(state) => {
                let f = checks::check(rank, &backend, &h.ips, &h.rdma, state);
                r.seen = f.seen;
                r.problems = f.problems;
            }
        }
        report.ranks.push(r);
    }
    if let Some(plan) = &plan {
        let budget = Budget {
            connect: secs(args.connect_timeout),
            pings: args.pings,
            bytes: args.probe_mib << 20,
            time: secs(args.probe_seconds),
            io: secs(args.probe_seconds + 10.0),
        };
        let (links, started) = measure_links(plan, &backend, &list, &budget);
        report.links = links;
        let (problems, median) = report::findings(&mut report.links);
        report.link_problems = problems;
        report.median_bps = median;
        if !args.no_sweep {
            report.sweep = Some(match started {
                _ if plan.ranks.len() < 2 => not_run("one rank: there is no group to sum over"),
                Ok(()) => sweep::Sweep {
                    backend: backend.clone(),
                    ..sweep(plan, args.sweep_seconds, &report.links)
                },
                Err(why) => not_run(&why),
            });
        }
    }
    if let Some(path) = &args.svg {
        let hosts: Vec<String> = list.hosts.iter().map(|h| h.ssh.clone()).collect();
        let title = format!(
            "nuvec-launch doctor: {} rank(s), backend {backend}",
            hosts.len()
        );
        let note = report.sweep.as_ref().and_then(sweep::Sweep::verdict);
        let drawn = svg::svg(&title, note.as_deref(), &hosts, &report.links);
        if let Err(e) = std::fs::write(path, drawn) {
            eprintln!("[ERROR] cannot write {}: {e}", path.display());
            return 2;
        }
    }
    let problems = report.problems();
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => say!("{text}"),
            Err(e) => {
                eprintln!("[ERROR] cannot write JSON: {e}");
                return 1;
            }
        }
    } else {
        print_report(&report, plan.is_some(), &args);
    }
    i32::from(problems > 0)
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::from_secs(1))
}

/// Prints the report for people.
fn print_report(report: &report::Report, measured: bool, args: &DoctorArgs) {
    let how = if measured {
        format!(
            "every link measured by a probe on each host, one link at a time, {} MiB or {} s \
             each way",
            args.probe_mib, args.probe_seconds
        )
    } else if args.replay.is_some() {
        "links not measured (--replay)".to_owned()
    } else {
        "links not measured (--no-measure)".to_owned()
    };
    say!(
        "{} rank(s), backend {}; {how}",
        report.ranks.len(),
        report.backend
    );
    for r in &report.ranks {
        say!("rank {} ({}):", r.rank, r.host);
        for s in &r.seen {
            say!("  {s}");
        }
        for p in &r.problems {
            say!("  PROBLEM: {p}");
        }
    }
    if measured {
        say!("links:");
        for line in report::table(&report.links).lines() {
            say!("  {line}");
        }
        for p in &report.link_problems {
            say!("PROBLEM: {p}");
        }
    }
    if let Some(sweep) = &report.sweep {
        for line in sweep.lines() {
            say!("{line}");
        }
        for p in &sweep.problems {
            say!("PROBLEM: {p}");
        }
    }
    let problems = report.problems();
    if problems == 0 {
        say!("no problem found");
    } else {
        say!("{problems} problem(s) found");
    }
}

/// The job's plan with the probe as every rank's command, and the probe port offset: the
/// number of ports the job uses.
fn probe_plan(args: &DoctorArgs, backend: &str, list: HostList) -> Result<Plan, String> {
    // In i128: a port or a count from the command line may be any i64.
    let span: i128 = if backend == "ring" {
        list.hosts.iter().map(|h| h.ips.len() as i128).sum::<i128>()
            * i128::from(args.connections_per_ip.max(1))
    } else {
        1
    };
    let last = i128::from(args.starting_port) + 2 * span - 1;
    if last > 65535 {
        return Err(format!(
            "the probes need ports up to {last} (the job's {} ports, then as many beside them), \
             beyond 65535; lower -p/--starting-port",
            span
        ));
    }
    let program = match &args.probe_program {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot find this program for the probes: {e}"))?
            .to_string_lossy()
            .into_owned(),
    };
    let command = vec![
        program,
        "probe".to_owned(),
        "--offset".to_owned(),
        span.to_string(),
        "--bytes".to_owned(),
        (args.probe_mib << 20).to_string(),
        "--seconds".to_owned(),
        args.probe_seconds.to_string(),
        "--pings".to_owned(),
        args.pings.to_string(),
        "--connect-timeout".to_owned(),
        args.connect_timeout.to_string(),
    ];
    let launch = Args {
        verbose: false,
        hosts: args.hosts.clone(),
        repeat_hosts: 1,
        hostfile: args.hostfile.clone(),
        backend: Some(backend.to_owned()),
        env: args.env.clone(),
        connections_per_ip: args.connections_per_ip,
        starting_port: args.starting_port,
        cwd: args.cwd.clone(),
        wire: None,
        python: None,
        dump_records: None,
        hang_report: None,
        command,
    };
    crate::plan::plan(&launch, list, (0, 0)).map_err(|e| e.0)
}

/// A sweep that was not run, and why.
fn not_run(why: &str) -> sweep::Sweep {
    sweep::Sweep {
        not_run: Some(why.to_owned()),
        ..sweep::Sweep::default()
    }
}

/// Starts the probes of `plan` again as the ranks of the all_sum sweep (`probe --sweep`) and
/// waits for each one's outcome.
fn sweep(plan: &Plan, seconds: f64, links: &[report::Row]) -> sweep::Sweep {
    let mut plan = plan.clone();
    // Only here: a `--probe-program` that predates the sweep still measures the links.
    plan.command.extend([
        "--sweep".to_owned(),
        "--sweep-seconds".to_owned(),
        seconds.to_string(),
    ]);
    let budget = secs(seconds);
    // The ssh logins, setup, the budget, and one operation that overruns it (the ranks bound
    // setup and every operation by `sweep_rank::SETUP` plus the budget).
    let deadline = Instant::now() + PROBE_START + 2 * (sweep_rank::SETUP + budget);
    let outcomes = match probes::Probes::start(&plan) {
        Ok(mut probes) => {
            let outcomes = probes.swept(deadline);
            probes.stop();
            outcomes
        }
        Err(e) => vec![Err(e); plan.ranks.len()],
    };
    let hosts: Vec<String> = plan.ranks.iter().map(|r| r.host.clone()).collect();
    sweep::combine(outcomes, seconds, links, &hosts)
}

/// Starts the probes of `plan` and has each measure its links, one at a time; also says
/// whether every probe started (the sweep needs them all).
fn measure_links(
    plan: &Plan,
    backend: &str,
    list: &HostList,
    budget: &Budget,
) -> (Vec<report::Row>, Result<(), String>) {
    let n = plan.ranks.len();
    let topologies: Vec<probe::Topology> = if backend == "ring" {
        let nodes: Vec<Vec<String>> = serde_json::from_str(&plan.file_content).unwrap_or_default();
        (0..n).map(|r| probe::ring_links(r, &nodes)).collect()
    } else {
        let coordinator = plan
            .exports
            .iter()
            .find(|e| e.key == "MLX_JACCL_COORDINATOR")
            .map(|e| e.value().to_owned())
            .unwrap_or_default();
        (0..n)
            .map(|r| probe::jaccl_links(r, n, &coordinator))
            .collect()
    };
    let host = |r: usize| list.hosts.get(r).map(|h| h.ssh.clone()).unwrap_or_default();
    let mut rows = Vec::new();
    // Each link: two connects, the round trips, both directions and the replies.
    let per_link = budget.connect * 2
        + budget.io
        + budget.time * 2
        + Duration::from_millis(budget.pings as u64 * 10);
    let links = topologies.iter().map(|t| t.links.len()).sum();
    let lifetime = probe_lifetime(per_link, links);
    let mut plan = plan.clone();
    plan.command
        .extend(["--lifetime".to_owned(), lifetime.as_secs_f64().to_string()]);
    let mut probes = match probes::Probes::start(&plan) {
        Ok(p) => p,
        Err(e) => {
            for t in &topologies {
                for l in &t.links {
                    rows.push(report::Row {
                        from: t.rank,
                        to: l.to_rank,
                        from_host: host(t.rank),
                        to_host: host(l.to_rank),
                        connection: l.connection,
                        address: l.job.clone(),
                        failure: Some(e.clone()),
                        ..report::Row::default()
                    });
                }
            }
            return (rows, Err(e));
        }
    };
    let ready = probes.ready(Instant::now() + PROBE_START);
    let started = match ready
        .iter()
        .enumerate()
        .find_map(|(r, x)| Some(r).zip(x.as_ref().err()))
    {
        Some((r, e)) => Err(format!("the probe on rank {r} did not start: {e}")),
        None => Ok(()),
    };
    for t in &topologies {
        for l in &t.links {
            let mut row = report::Row {
                from: t.rank,
                to: l.to_rank,
                from_host: host(t.rank),
                to_host: host(l.to_rank),
                connection: l.connection,
                address: l.job.clone(),
                ..report::Row::default()
            };
            let peer_listening = match &ready[l.to_rank] {
                Ok(r) if r.errors.is_empty() => Ok(()),
                Ok(r) => Err(format!(
                    "the probe on rank {} could not listen: {}",
                    l.to_rank,
                    r.errors.join("; ")
                )),
                Err(e) => Err(format!("the probe on rank {}: {e}", l.to_rank)),
            };
            match &ready[t.rank] {
                Err(e) => row.failure = Some(format!("the probe on rank {}: {e}", t.rank)),
                Ok(_) => match probes.measure(t.rank, l.index, Instant::now() + per_link) {
                    Ok(m) => {
                        row.measurement = Some(m);
                        if let Err(e) = peer_listening {
                            row.failure = Some(e);
                        }
                    }
                    Err(e) => row.failure = Some(format!("the probe on rank {}: {e}", t.rank)),
                },
            }
            rows.push(row);
        }
    }
    probes.stop();
    (rows, started)
}

/// How long the probes get to start and say they are ready (ssh logins included).
const PROBE_START: Duration = Duration::from_secs(30);

/// How long the probes may live (they end themselves after it whatever happens): long enough
/// for `links` links measured one after the other, each at its longest (`per_link`), after
/// their start, and a minute to spare; 10 minutes at least (the probe's default).
fn probe_lifetime(per_link: Duration, links: usize) -> Duration {
    let links = u32::try_from(links).unwrap_or(u32::MAX);
    PROBE_START
        .saturating_add(per_link.saturating_mul(links))
        .saturating_add(Duration::from_secs(60))
        .max(Duration::from_secs(600))
}

fn usage(e: &clap::Error) -> i32 {
    if !e.use_stderr() {
        print!("{}", e.render());
        return 0;
    }
    let text = if std::io::stderr().is_terminal() {
        e.render().ansi().to_string()
    } else {
        e.render().to_string()
    };
    eprint!("nuvec-launch doctor: {text}");
    2
}

/// Runs `command` on `host`: directly when it is this machine (and not replayed), else
/// through `runner`.
fn run_on(host: &str, command: &[&str], runner: &dyn Runner, replay: bool) -> Output {
    if !replay && LOCAL_HOSTS.contains(&host) {
        let mut c = Command::new(command[0]);
        c.args(&command[1..]);
        return bounded(c, COMMAND_TIMEOUT);
    }
    runner.run(host, &[], command)
}

/// What `host` has, from its commands' outputs.
fn state_of(
    host: &str,
    backend: &str,
    runner: &dyn Runner,
    replay: bool,
) -> Result<checks::HostState, String> {
    let ifconfig = run_on(host, &["ifconfig"], runner, replay);
    if !ifconfig.success {
        return Err(format!(
            "`ifconfig` on {host} failed{}",
            ifconfig
                .failure
                .map_or(String::new(), |why| format!(": {why}"))
        ));
    }
    let words: Vec<&str> = HARDWARE_PORTS.split(' ').collect();
    let ports = hardware_ports(&run_on(host, &words, runner, replay).stdout)
        .into_iter()
        .map(|(port, device)| (device, port))
        .collect();
    let rdma = (backend != "ring")
        .then(|| rdma_devices(&run_on(host, &[IBV_DEVICES], runner, replay).stdout));
    // A Linux host's congestion control, which the ring's speed depends on (README, "TCP
    // congestion control"); none where the command fails (macOS).
    let congestion = (backend == "ring")
        .then(|| {
            let words: Vec<&str> = CONGESTION.split(' ').collect();
            run_on(host, &words, runner, replay)
        })
        .filter(|out| out.success)
        .map(|out| out.stdout.trim().to_owned())
        .filter(|name| !name.is_empty());
    let mut interfaces = interfaces::interfaces(&ifconfig.stdout);
    // Linux's `ifconfig` leaves out secondary IPv4 addresses; `ip` shows them. macOS has no
    // `ip` (its `ifconfig` shows every address): here the command cannot start, and on
    // another host its shell's complaint goes to /dev/null.
    let ip = if !replay && LOCAL_HOSTS.contains(&host) {
        run_on(host, &IP_ADDRESSES, runner, replay)
    } else {
        runner.run(host, &[], &[IP_ADDRESSES_REMOTE])
    };
    if ip.success {
        interfaces::add_ip_addresses(&mut interfaces, &ip.stdout);
    }
    Ok(checks::HostState {
        interfaces,
        ports,
        rdma,
        congestion,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probes_live_long_enough_to_measure_every_link_at_its_longest() {
        let minute = Duration::from_secs(60);
        // Short links: the probe's default 10 minutes.
        assert_eq!(probe_lifetime(Duration::from_secs(5), 8), 10 * minute);
        // `--probe-seconds 400`: one link alone needs more than 10 minutes.
        assert_eq!(
            probe_lifetime(Duration::from_secs(820), 2),
            PROBE_START + Duration::from_secs(1640) + minute
        );
        assert_eq!(probe_lifetime(Duration::MAX, usize::MAX), Duration::MAX);
    }
}
