//! `nuvec-launch doctor`: checks a cluster as a job would use it, before the job runs.
//!
//! ```text
//! nuvec-launch doctor --hostfile cluster.json          # the backend from the host file
//! nuvec-launch doctor --hosts 192.168.0.1,192.168.0.2  # a ring over these addresses
//! ```
//!
//! What it does so far (the first part of issue 34's doctor): on every rank's host it runs
//! `ifconfig`, `networksetup -listallhardwareports` and, for JACCL, `ibv_devices` (over ssh;
//! directly on `127.0.0.1`/`localhost`; or from saved files with `--replay DIR`, as
//! `nuvec-launch config --replay` reads them, plus `ifconfig.txt`), and checks each rank's
//! host file entry against them ([`checks`]): which interface each address of the job is on,
//! an address on Wi-Fi while Thunderbolt has addresses, an address on the Thunderbolt Bridge
//! or on no interface, the bridge up over an interface the job uses, an RDMA device missing,
//! its interface without an IPv4 address (no IPv4-mapped GID) or unplugged. It exits with 1
//! when it finds a problem. Not done yet: the probe started on every host as a job starts, and
//! the measurements per link (connect time, latency, bandwidth each way, MTU), the all_sum
//! sweep, `--json` and the SVG.

/// `println!` that does not panic when standard output is closed (`| head`).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod checks;
mod interfaces;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::Command;

use clap::Parser;

use crate::config::discover::{HARDWARE_PORTS, IBV_DEVICES, hardware_ports, rdma_devices};
use crate::config::ssh::{COMMAND_TIMEOUT, Output, Replay, Runner, Ssh, bounded};
use crate::hosts::HostList;
use crate::plan::LOCAL_HOSTS;

/// The command line of `nuvec-launch doctor`.
#[derive(Clone, Debug, PartialEq, Eq, Parser)]
#[command(
    name = "nuvec-launch doctor",
    bin_name = "nuvec-launch doctor",
    about = "Check a cluster's hosts against its host file before a job runs (nuvec-launch's)",
    infer_long_args = true,
    args_override_self = true,
    after_help = "Exits with 1 when a problem is found, 2 for a usage error, 0 otherwise. \
Links are not measured yet (latency, bandwidth)."
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
    /// Run nothing: read each host's command outputs from DIR/HOST/ (ifconfig.txt,
    /// hardware-ports.txt, ibv_devices.txt)
    #[arg(long, value_name = "DIR")]
    replay: Option<PathBuf>,
}

/// Runs `nuvec-launch doctor` with `argv` (`doctor` first) and returns the exit status.
pub(crate) fn main(argv: Vec<OsString>) -> i32 {
    let args = match DoctorArgs::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
    let list = match &args.hostfile {
        Some(path) => HostList::from_file(path),
        None => HostList::from_list(&args.hosts, 1),
    };
    let list = match list {
        Ok(l) => l,
        Err(e) => {
            use clap::CommandFactory;
            return usage(
                &DoctorArgs::command().error(clap::error::ErrorKind::ValueValidation, &e.0),
            );
        }
    };
    for w in &list.warnings {
        eprintln!("[WARN] {w}");
    }
    if let Some(h) = list.hosts.iter().find(|h| h.ssh.starts_with('-')) {
        eprintln!(
            "[ERROR] the host name {:?} starts with '-', which ssh would take as an option",
            h.ssh
        );
        return 2;
    }
    let backend = match (&args.backend, list.backend.as_str()) {
        (Some(b), _) => b.clone(),
        (None, "") => "ring".to_owned(),
        (None, b) => b.to_owned(),
    };
    let runner: Box<dyn Runner> = match &args.replay {
        Some(dir) => Box::new(Replay(dir.clone())),
        None => Box::new(Ssh),
    };
    let mut states: HashMap<String, Result<checks::HostState, String>> = HashMap::new();
    let mut problems = 0;
    say!(
        "{} rank(s), backend {backend}; links are not measured (not implemented yet)",
        list.hosts.len()
    );
    for (rank, h) in list.hosts.iter().enumerate() {
        let state = states
            .entry(h.ssh.clone())
            .or_insert_with(|| state_of(&h.ssh, &backend, runner.as_ref(), args.replay.is_some()));
        say!("rank {rank} ({}):", h.ssh);
        match state {
            Err(why) => {
                problems += 1;
                say!("  PROBLEM: {why}");
            }
            Ok(state) => {
                let f = checks::check(rank, &backend, &h.ips, &h.rdma, state);
                for s in &f.seen {
                    say!("  {s}");
                }
                for p in &f.problems {
                    say!("  PROBLEM: {p}");
                }
                problems += f.problems.len();
            }
        }
    }
    if problems == 0 {
        say!("no problem found");
        0
    } else {
        say!("{problems} problem(s) found");
        1
    }
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
    Ok(checks::HostState {
        interfaces: interfaces::interfaces(&ifconfig.stdout),
        ports,
        rdma,
    })
}
