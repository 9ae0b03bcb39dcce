//! `nuvec-launch config`: MLX's `mlx.distributed_config` (0.32.4) without Python.
//!
//! ```text
//! nuvec-launch config --hosts mac1,mac2,mac3,mac4 --output-hostfile cluster.json
//! nuvec-launch config --hosts mac1,mac2 --dot | dot -Tpng > cabling.png
//! nuvec-launch config --hostfile hosts.json --backend jaccl-ring --auto-setup
//! ```
//!
//! It checks that every host answers over ssh (and has passwordless sudo), reads each Mac's
//! Thunderbolt ports, their interfaces and its RDMA devices, gives every cable a /30, picks the
//! backend (or checks the one asked for), prints the commands that configure each host (or,
//! with `--auto-setup`, runs them with sudo over ssh) and writes MLX's JSON hostfile, which
//! both `mlx.launch` and `nuvec-launch` read.
//!
//! The options, messages, standard output and hostfile are `mlx.distributed_config`'s,
//! byte for byte where they are data (the hostfile, the setup commands, the `--dot` graph);
//! tests compare them with MLX's own `config.py` fed the same command outputs. The modules:
//! [`discover`] reads the commands' outputs, [`plan`] plans (both pure), [`mod@write`] writes the
//! hostfile's JSON, [`ssh`] runs the commands (or replays them from files, `--replay`); this
//! file is the flow between them.
//!
//! Differences from MLX: `--replay DIR` is this tool's; a host whose output cannot be read is
//! an error naming the host and command (MLX stops with a Python traceback), and so is a
//! Thunderbolt plan for fewer than two hosts (MLX stops with a `ValueError` when they have
//! RDMA); a command on a
//! host is bounded by 60 s; a host name starting with `-` is refused (ssh would read it as an
//! option); unknown keys of a `--hostfile` are warned about, as `nuvec-launch` warns; log lines are coloured only on a terminal; at the end of standard
//! input, "Enter to continue" goes on (MLX stops with `EOFError`).

/// `println!` that does not panic when standard output is closed (`| head`): what cannot be
/// printed is dropped, and the run goes on as it would have.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `print!`, as [`out!`].
macro_rules! out_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

pub(crate) mod discover;
mod plan;
pub(crate) mod ssh;
mod write;

use std::ffi::OsString;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use clap::Parser;

use self::discover::{HARDWARE_PORTS, IBV_DEVICES, THUNDERBOLT};
use self::plan::{Addresses, Backend, Named, NoBackend, Topology};
use self::ssh::{Replay, Runner, Ssh};
use crate::hosts::hosts_of;

/// The command line of `nuvec-launch config` (`mlx.distributed_config`'s options).
#[derive(Clone, Debug, PartialEq, Eq, Parser)]
#[command(
    name = "nuvec-launch config",
    bin_name = "nuvec-launch config",
    about = "Configure remote machines for use with MLX distributed (as mlx.distributed_config)",
    infer_long_args = true,
    args_override_self = true,
    after_help = "\
Without --backend: jaccl for a full Thunderbolt mesh with RDMA on every host, jaccl-ring for a
full ring with RDMA, ring for a full ring without. Exits with 1 when the cabling fits none (try
--dot), 2 for a usage error."
)]
pub(crate) struct ConfigArgs {
    /// Print debug messages in stderr
    #[arg(long)]
    verbose: bool,
    /// A comma separated list of hosts
    #[arg(long, default_value = "127.0.0.1")]
    hosts: String,
    /// Ignore hosts that are not reachable via ssh
    #[arg(long)]
    ignore_unreachable: bool,
    /// The file containing the hosts (MLX's JSON host file)
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// What type of connectivity to configure
    #[arg(long, default_value = "thunderbolt", value_parser = ["thunderbolt", "ethernet"])]
    over: String,
    /// If provided, save the hostfile to this path
    #[arg(long, value_name = "PATH")]
    output_hostfile: Option<PathBuf>,
    /// Run the setup commands on each host over ssh with sudo, instead of printing them
    #[arg(long, overrides_with = "no_auto_setup")]
    auto_setup: bool,
    /// Print the setup commands and wait for Enter after each host (the default)
    #[arg(long, overrides_with = "auto_setup")]
    no_auto_setup: bool,
    /// Output the topology in DOT format and exit
    #[arg(long)]
    dot: bool,
    /// Which distributed backend to configure
    #[arg(long, value_parser = ["ring", "jaccl", "jaccl-ring"])]
    backend: Option<String>,
    /// Set environment variables for the jobs (repeatable)
    #[arg(long, value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Run nothing: read each host's command outputs from DIR/HOST/ (thunderbolt.json,
    /// hardware-ports.txt, ibv_devices.txt, en0.txt, en1.txt; a no-sudo file when sudo needs a
    /// password), and print the setup commands --auto-setup would run
    #[arg(long, value_name = "DIR")]
    replay: Option<PathBuf>,
}

/// A failure that ends the run with this exit status (its messages are already printed): 1,
/// or 2 for a usage error.
struct Exit(i32);

/// Runs `nuvec-launch config` with `argv` (`config` first) and returns the exit status.
pub(crate) fn main(argv: Vec<OsString>) -> i32 {
    let args = match ConfigArgs::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            if !e.use_stderr() {
                print!("{}", e.render());
                return 0;
            }
            let text = if std::io::stderr().is_terminal() {
                e.render().ansi().to_string()
            } else {
                e.render().to_string()
            };
            eprint!("nuvec-launch config: {text}");
            return 2;
        }
    };
    let runner: Box<dyn Runner> = match &args.replay {
        Some(dir) => Box::new(Replay(dir.clone())),
        None => Box::new(Ssh),
    };
    match run(&args, runner.as_ref()) {
        Ok(()) => 0,
        Err(Exit(code)) => code,
    }
}

/// `[TAG] words...`, as MLX's `log`, `log_warning` and `log_error` print it (coloured only on
/// a terminal).
fn log(color: &str, tag: &str, words: &[&str]) {
    let stderr = std::io::stderr();
    let colored = stderr.is_terminal();
    let text = std::iter::once(tag)
        .chain(words.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = stderr.lock();
    let _ = if colored {
        writeln!(out, "\x1b[{color}m{text} \x1b[0m")
    } else {
        writeln!(out, "{text}")
    };
}

fn info(verbose: bool, words: &[&str]) {
    if verbose {
        log("32", "[INFO]", words);
    }
}

fn warn(words: &[&str]) {
    log("33", "[WARN]", words);
}

fn error(words: &[&str]) {
    log("31", "[ERROR]", words);
}

/// What a host answered to the reachability checks.
#[derive(Clone, Copy, Debug)]
struct Access {
    ssh: bool,
    sudo: bool,
}

const BATCH: [&str; 4] = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5"];

fn run(args: &ConfigArgs, runner: &dyn Runner) -> Result<(), Exit> {
    let list = match hosts_of(args.hostfile.as_deref(), &args.hosts) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{}", ConfigArgs::command_error(&e.0));
            return Err(Exit(2));
        }
    };
    for w in &list.warnings {
        warn(&[w]);
    }
    let names: Vec<&str> = list.hosts.iter().map(|h| h.ssh.as_str()).collect();
    info(
        args.verbose,
        &[&format!("Checking for ssh access for {}", names.join(", "))],
    );
    let access: Vec<Access> = std::thread::scope(|s| {
        let checks: Vec<_> = names
            .iter()
            .map(|&h| {
                s.spawn(move || {
                    let ssh = runner.run(h, &BATCH, &["echo", "success"]).success;
                    let sudo = ssh && runner.run(h, &BATCH, &["sudo", "ls"]).success;
                    Access { ssh, sudo }
                })
            })
            .collect();
        checks
            .into_iter()
            .map(|c| {
                c.join().unwrap_or(Access {
                    ssh: false,
                    sudo: false,
                })
            })
            .collect()
    });
    if access.iter().any(|a| !a.ssh) && !args.ignore_unreachable {
        error(&["Could not ssh to the following hosts:"]);
        for (h, a) in names.iter().zip(&access) {
            if !a.ssh {
                error(&["  - ", h]);
            }
        }
        error(&[]);
        error(&["Maybe they are not set-up for password-less ssh?"]);
        return Err(Exit(1));
    }
    let mut hosts = Vec::new();
    let mut sudo = Vec::new();
    for (h, a) in list.hosts.iter().zip(&access) {
        if a.ssh {
            hosts.push(Named {
                ssh: h.ssh.clone(),
                ips: h.ips.clone(),
            });
            sudo.push(a.sudo);
        }
    }

    if args.over == "ethernet" {
        info(args.verbose, &["Preparing an ethernet hostfile"]);
        add_ips(&mut hosts, runner, args.verbose);
        return save(args, &plan::ethernet_hostfile(&hosts, &args.env));
    }

    info(
        args.verbose,
        &["Preparing for communication over thunderbolt"],
    );
    let topology = discover_all(&hosts, runner, args.verbose)?;
    if args.dot {
        let names: Vec<String> = hosts.iter().map(|h| h.ssh.clone()).collect();
        out_part!("{}", topology.dot(&names));
        return Ok(());
    }
    // MLX goes on with fewer than two hosts and stops with a Python error (or, without RDMA,
    // says no ring was found): there is nothing to cable.
    if hosts.len() < 2 {
        let names: Vec<&str> = hosts.iter().map(|h| h.ssh.as_str()).collect();
        error(&[&format!(
            "Thunderbolt links need two or more hosts; the hosts to configure are: {}",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )]);
        return Err(Exit(1));
    }
    let Ok(addresses) = Addresses::plan(&topology) else {
        error(&["Ran out of available local IPs (192.168.0.0/16 has 16384 /30s)"]);
        return Err(Exit(1));
    };
    let connectivity = topology.connectivity();
    let rings = plan::rings(&connectivity);
    let n = hosts.len();
    let mesh = plan::mesh_gap(&connectivity);
    let full_ring = plan::has_full_ring(&rings, n);

    let backend = match args.backend.as_deref() {
        None => {
            let rdma = check_rdma(&hosts, runner, args.verbose, false)?;
            match plan::choose_backend(mesh.is_none(), full_ring, rdma) {
                Ok(b) => b,
                Err(NoBackend::NeitherMeshNorRing) => {
                    error(&["Neither thunderbolt mesh nor ring found."]);
                    error(&["Perhaps run with --dot to generate a plot of the connectivity."]);
                    return Err(Exit(1));
                }
                Err(NoBackend::NoRdmaNoRing) => {
                    error(&["RDMA is not available and ring is not found."]);
                    error(&["Perhaps run with --dot to generate a plot of the connectivity."]);
                    return Err(Exit(1));
                }
            }
        }
        Some("jaccl") => {
            if let Some((i, j)) = mesh {
                error(&[&format!(
                    "Incomplete mesh, {} is not connected to {}",
                    hosts[i].ssh, hosts[j].ssh
                )]);
                error(&[]);
                error(&["Try passing --dot to visualize the connectivity"]);
                return Err(Exit(1));
            }
            check_rdma(&hosts, runner, args.verbose, true)?;
            Backend::Jaccl
        }
        Some(ring_backend) => {
            if !full_ring {
                error(&["Could not find a full ring."]);
                error(&[]);
                error(&["Try passing --dot to visualize the connectivity"]);
                if !rings.is_empty() {
                    error(&["Rings found:"]);
                    for r in &rings {
                        let members: Vec<&str> =
                            r.hosts.iter().map(|&i| hosts[i].ssh.as_str()).collect();
                        error(&[&format!(" - {}", members.join(","))]);
                    }
                }
                return Err(Exit(1));
            }
            if ring_backend == "ring" {
                Backend::Ring
            } else {
                check_rdma(&hosts, runner, args.verbose, true)?;
                Backend::JacclRing
            }
        }
    };

    let hostfile = match backend {
        Backend::Ring => {
            info(args.verbose, &["Prepare a ring hostfile"]);
            plan::ring_hostfile(&hosts, &addresses, &rings[0], &args.env)
        }
        Backend::Jaccl => {
            info(args.verbose, &["Prepare a jaccl hostfile"]);
            add_ips(&mut hosts, runner, args.verbose);
            plan::jaccl_hostfile(&hosts, &addresses, &args.env)
        }
        Backend::JacclRing => {
            info(args.verbose, &["Prepare a jaccl-ring hostfile"]);
            add_ips(&mut hosts, runner, args.verbose);
            plan::jaccl_ring_hostfile(&hosts, &addresses, &rings[0], &args.env)
        }
    };

    let all_sudo = sudo.iter().all(|&s| s);
    if args.auto_setup && !all_sudo {
        warn(&["Automatic setup requested but the following hosts do not have passwordless sudo"]);
        for (h, &s) in hosts.iter().zip(&sudo) {
            if !s {
                warn(&[" - ", &h.ssh]);
            }
        }
    }
    setup(
        &hosts,
        &addresses,
        runner,
        args.verbose,
        args.auto_setup && all_sudo,
    )?;
    save(args, &hostfile)
}

impl ConfigArgs {
    /// A mistake found after parsing (the hosts), printed as `clap` prints errors.
    fn command_error(what: &str) -> String {
        use clap::CommandFactory;
        let e = ConfigArgs::command().error(clap::error::ErrorKind::ValueValidation, what);
        format!("nuvec-launch config: {}", e.render())
            .trim_end()
            .to_owned()
    }
}

/// MLX's `add_ips`: each host's `en0` address, else its `en1` one, after the ones it has.
fn add_ips(hosts: &mut [Named], runner: &dyn Runner, verbose: bool) {
    for h in hosts {
        info(verbose, &["Getting the ip from", &h.ssh]);
        let found = ["en0", "en1"].iter().find_map(|iface| {
            let out = runner.run(&h.ssh, &[], &["ipconfig", "getifaddr", iface]);
            let ip = out.stdout.trim();
            (!ip.is_empty()).then(|| ip.to_owned())
        });
        match found {
            Some(ip) => h.ips.push(ip),
            None => warn(&["Could not extract ip for", &h.ssh]),
        }
    }
}

/// Every host's ports, from its `system_profiler` and `networksetup` outputs.
fn discover_all(hosts: &[Named], runner: &dyn Runner, verbose: bool) -> Result<Topology, Exit> {
    let words = |c: &'static str| c.split(' ').collect::<Vec<_>>();
    let mut profiles = Vec::new();
    for h in hosts {
        info(verbose, &["Getting connectivity from", &h.ssh]);
        profiles.push(runner.run(&h.ssh, &[], &words(THUNDERBOLT)));
    }
    let mut port_maps = Vec::new();
    for h in hosts {
        info(verbose, &["Getting interface names from", &h.ssh]);
        let out = runner.run(&h.ssh, &[], &words(HARDWARE_PORTS));
        port_maps.push(discover::hardware_ports(&out.stdout));
    }
    let mut tb = Vec::new();
    for ((h, profile), map) in hosts.iter().zip(&profiles).zip(&port_maps) {
        match discover::thunderbolt_host(&h.ssh, &profile.stdout, map) {
            Ok(t) => tb.push(t),
            Err(e) => {
                error(&[&e.to_string()]);
                if let Some(why) = &profile.failure {
                    error(&[why]);
                }
                return Err(Exit(1));
            }
        }
    }
    Ok(Topology::new(tb))
}

/// MLX's `check_rdma`: whether every host lists an `rdma_` device; the hosts without are
/// named (as warnings, or as errors and exit 1 when `strict`).
fn check_rdma(
    hosts: &[Named],
    runner: &dyn Runner,
    verbose: bool,
    strict: bool,
) -> Result<bool, Exit> {
    let say = |w: &[&str]| if strict { error(w) } else { warn(w) };
    let mut failed = false;
    for h in hosts {
        info(verbose, &["Checking that", &h.ssh, "supports RDMA"]);
        let out = runner.run(&h.ssh, &[], &[IBV_DEVICES]);
        if discover::rdma_devices(&out.stdout).is_empty() {
            say(&[&h.ssh, "does not seem to have RDMA enabled"]);
            failed = true;
        }
    }
    if failed {
        say(&[]);
        say(&["Some of the hosts don't have RDMA enabled or they don't support RDMA."]);
        say(&[]);
        say(&["See https://ml-explore.github.io/mlx/build/html/usage/distributed.html"]);
        say(&["for instructions on how to enable RDMA."]);
        if strict {
            return Err(Exit(1));
        }
    }
    Ok(!failed)
}

/// Prints each host's setup commands and waits for Enter, or runs them over ssh.
fn setup(
    hosts: &[Named],
    addresses: &Addresses,
    runner: &dyn Runner,
    verbose: bool,
    auto: bool,
) -> Result<(), Exit> {
    let mut stdout = std::io::stdout();
    for (i, h) in hosts.iter().enumerate() {
        let command = addresses.setup_commands(i, hosts.len());
        if auto {
            out!("Running auto setup for {}", h.ssh);
            let script = command.trim().replace('\n', " ; ");
            let shown =
                crate::script::shell_join(&["ssh".to_owned(), h.ssh.clone(), script.clone()]);
            info(verbose, &[&shown]);
            let _ = stdout.flush();
            let out = runner.apply(&h.ssh, &script, &shown);
            // MLX ignores how the setup ended; a failure is at least said here.
            if let Some(why) = out.failure {
                warn(&[&format!("the setup of {} did not run: {why}", h.ssh)]);
            } else if !out.success {
                warn(&[&format!(
                    "the setup of {} failed (ssh exited with a failure)",
                    h.ssh
                )]);
            }
        } else {
            let title = format!("Setup for {}", h.ssh);
            out!("{title}");
            out!("{}", "=".repeat(title.chars().count()));
            out!("{command}");
            out_part!("Enter to continue");
            let _ = stdout.flush();
            let mut line = String::new();
            // The end of standard input goes on (MLX stops with EOFError).
            let _ = std::io::stdin().lock().read_line(&mut line);
        }
        out!();
    }
    Ok(())
}

/// Writes the hostfile to `--output-hostfile` (`json.dump`, no trailing newline) or prints it.
fn save(args: &ConfigArgs, hostfile: &plan::Hostfile) -> Result<(), Exit> {
    let text = write::hostfile_json(hostfile);
    match &args.output_hostfile {
        Some(path) => std::fs::write(path, text).map_err(|e| {
            error(&[&format!(
                "could not write the hostfile {}: {e}",
                path.display()
            )]);
            Exit(1)
        }),
        None => {
            out!("Hostfile");
            out!("========");
            out!("{text}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::plan::{Hostfile, Ring};
    use super::*;
    use crate::hosts::HostList;

    /// The topology and the hosts of a fixture cluster, read through the replay driver.
    fn fixture(name: &str, hosts: &[&str]) -> (Topology, Vec<Named>) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/config")
            .join(name);
        let runner = Replay(dir);
        let mut named: Vec<Named> = hosts
            .iter()
            .map(|h| Named {
                ssh: (*h).to_owned(),
                ips: Vec::new(),
            })
            .collect();
        let topology = match discover_all(&named, &runner, false) {
            Ok(t) => t,
            Err(Exit(code)) => panic!("{name}: discovery failed with {code}"),
        };
        add_ips(&mut named, &runner, false);
        (topology, named)
    }

    /// The hostfile for `backend`, and whether `nuvec-launch` plans a job from its text.
    fn launchable(hostfile: &Hostfile) -> Result<(), String> {
        let text = write::hostfile_json(hostfile);
        let list = HostList::parse(&text, "hostfile.json").map_err(|e| e.0)?;
        let args = crate::args::parse(["nuvec-launch", "true"]).map_err(|e| e.to_string())?;
        crate::plan::plan(&args, list, (0, 0))
            .map(|_| ())
            .map_err(|e| e.0)
    }

    #[test]
    fn every_hostfile_config_writes_is_one_nuvec_launch_starts_a_job_from() {
        let four = ["mac-a", "mac-b", "mac-c", "mac-d"];
        for (name, hosts) in [
            ("two-macs-one-cable", &four[..2]),
            ("two-macs-two-cables", &four[..2]),
            ("three-macs-mesh", &four[..3]),
            ("four-macs-mesh", &four[..]),
            ("four-macs-ring", &four[..]),
            ("four-macs-ring-two-cables", &four[..]),
        ] {
            let (topology, named) = fixture(name, hosts);
            let addresses = Addresses::plan(&topology).expect("a few cables fit");
            let m = topology.connectivity();
            let rings: Vec<Ring> = plan::rings(&m);
            assert!(plan::has_full_ring(&rings, hosts.len()), "{name}");
            let ring = &rings[0];
            let mut files = vec![
                plan::ring_hostfile(&named, &addresses, ring, &[]),
                plan::jaccl_ring_hostfile(&named, &addresses, ring, &[]),
                plan::ethernet_hostfile(&named, &[]),
            ];
            if plan::mesh_gap(&m).is_none() {
                files.push(plan::jaccl_hostfile(&named, &addresses, &[]));
            }
            for f in &files {
                if let Err(e) = launchable(f) {
                    panic!("{name} {}: {e}\n{}", f.backend, write::hostfile_json(f));
                }
            }
        }
    }

    #[test]
    fn the_ring_of_a_cabled_ring_follows_the_cables_not_the_host_order() {
        let (topology, _) = fixture("four-macs-ring", &["mac-a", "mac-b", "mac-c", "mac-d"]);
        let m = topology.connectivity();
        assert_eq!(
            m,
            [[0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]],
            "a-c, c-b, b-d, d-a"
        );
        let rings = plan::rings(&m);
        assert_eq!(rings[0].hosts, [0, 2, 1, 3]);
        assert_eq!(rings[0].cables, 1);
        assert_eq!(plan::mesh_gap(&m), Some((0, 1)));
    }

    #[test]
    fn two_cables_per_pair_give_two_addresses_and_two_devices_in_one_cable_order() {
        let (topology, named) = fixture("two-macs-two-cables", &["mac-a", "mac-b"]);
        let addresses = Addresses::plan(&topology).expect("two cables fit");
        let ends = |i, j| -> Vec<(String, String)> {
            addresses
                .between(i, j)
                .iter()
                .map(|e| (e.iface.clone(), e.ip.clone()))
                .collect()
        };
        // mac-a (a Mac mini: Thunderbolt 1, 2, 3 on en9, en8, en10) has its receptacle 1 cabled
        // to mac-b's 2 (en3) and its 3 to mac-b's 1 (en2): sorted by interface, en10 comes
        // first, and mac-b lists the cables in mac-a's order.
        let s = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(
            ends(0, 1),
            [s("en10", "192.168.0.1"), s("en9", "192.168.0.5")]
        );
        assert_eq!(
            ends(1, 0),
            [s("en2", "192.168.0.2"), s("en3", "192.168.0.6")]
        );
        let j = plan::jaccl_hostfile(&named, &addresses, &[]);
        assert_eq!(
            j.hosts[1].rdma[0],
            plan::Devices::Many(vec!["rdma_en2".into(), "rdma_en3".into()])
        );
    }

    #[test]
    fn the_backend_is_chosen_as_mlx_chooses_it() {
        use plan::choose_backend as c;
        assert_eq!(c(true, true, true), Ok(Backend::Jaccl));
        assert_eq!(c(false, true, true), Ok(Backend::JacclRing));
        assert_eq!(c(true, true, false), Ok(Backend::Ring));
        assert_eq!(c(false, false, true), Err(NoBackend::NeitherMeshNorRing));
        assert_eq!(c(true, false, false), Err(NoBackend::NoRdmaNoRing));
    }

    #[test]
    fn the_options_are_mlx_distributed_configs() {
        use clap::CommandFactory;
        ConfigArgs::command().debug_assert();
        let a = ConfigArgs::try_parse_from([
            "config",
            "--output",
            "h.json",
            "--auto-setup",
            "--no-auto-setup",
            "--env",
            "A=1",
            "--env=B=2",
        ])
        .expect("abbreviations and repeats parse");
        assert_eq!(a.output_hostfile.as_deref(), Some(Path::new("h.json")));
        assert!(
            !a.auto_setup,
            "the last of --auto-setup/--no-auto-setup wins"
        );
        assert_eq!(a.env, ["A=1", "B=2"]);
        assert_eq!(
            (a.hosts.as_str(), a.over.as_str()),
            ("127.0.0.1", "thunderbolt")
        );
        assert!(ConfigArgs::try_parse_from(["config", "--backend", "nccl"]).is_err());
        assert!(ConfigArgs::try_parse_from(["config", "--over", "wifi"]).is_err());
    }
}
