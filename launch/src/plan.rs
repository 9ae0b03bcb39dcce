//! What runs where: the backend, the ranks and their hosts, the ring's ports or JACCL's device
//! matrix and coordinator, the generated file (`MLX_HOSTFILE` or `MLX_IBV_DEVICES`) and the
//! environment of every rank, in `mlx.launch`'s order.
//!
//! Everything here is deterministic and free of side effects ([`plan`] takes the terminal
//! size as an argument), so that it is unit-tested. The generated file is Python's
//! `json.dumps` text, byte for byte ([`py_json`]: `serde_json` with [`PythonFormatter`]).
//! Half of the file is its unit tests (the plans `mlx.launch` makes, error by error).

use std::io;

use serde::Serialize;
use serde_json::Value;
use serde_json::ser::Formatter;

use crate::args::{Args, UsageError, usage_error};
use crate::hosts::{HOST_KEYS, HostList, quoted};

/// The hosts that are started directly rather than through `ssh` (`mlx.launch`: only
/// `127.0.0.1`).
pub(crate) const LOCAL_HOSTS: [&str; 2] = ["127.0.0.1", "localhost"];

/// The backends `nuvec-launch` starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LaunchBackend {
    /// MLX's TCP ring: `MLX_HOSTFILE`.
    Ring,
    /// JACCL over a mesh: `MLX_IBV_DEVICES` and `MLX_JACCL_COORDINATOR`.
    Jaccl,
    /// JACCL, preferring the ring topology: as [`LaunchBackend::Jaccl`] plus `MLX_JACCL_RING=1`.
    JacclRing,
}

/// One `KEY=VALUE` (or bare `KEY`) environment entry to export on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Export {
    /// The variable.
    pub(crate) key: String,
    /// The value; `None` for a bare `KEY` (exported empty, as `export KEY=`).
    pub(crate) value: Option<String>,
}

impl Export {
    /// The value the variable gets.
    pub(crate) fn value(&self) -> &str {
        self.value.as_deref().unwrap_or("")
    }
}

/// One rank of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RankPlan {
    /// Its rank.
    pub(crate) rank: usize,
    /// The host it runs on (the `ssh` name).
    pub(crate) host: String,
    /// Whether it is started directly (host `127.0.0.1` or `localhost`) rather than by ssh.
    pub(crate) local: bool,
}

/// Everything a job needs, before any process starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The backend.
    pub(crate) backend: LaunchBackend,
    /// One entry per rank, in rank order.
    pub(crate) ranks: Vec<RankPlan>,
    /// The variables exported on every rank, in `mlx.launch`'s order (later ones win): the host
    /// file's `envs`, `--env`, `COLUMNS` and `LINES`, then the backend's.
    pub(crate) exports: Vec<Export>,
    /// Environment entries that are ignored because their name is not a shell identifier,
    /// as given (`mlx.launch` warns about each).
    pub(crate) ignored: Vec<String>,
    /// The variable naming the generated file: `MLX_HOSTFILE` or `MLX_IBV_DEVICES`.
    pub(crate) file_var: &'static str,
    /// The generated file's content, without the trailing newline `echo` adds.
    pub(crate) file_content: String,
    /// The command each rank runs (`--python` first when given).
    pub(crate) command: Vec<String>,
    /// `--cwd`.
    pub(crate) cwd: Option<String>,
    /// `--verbose`.
    pub(crate) verbose: bool,
}

impl Plan {
    /// The generated file's bytes, as `mlx.launch` writes them (`echo CONTENT >FILE`).
    pub(crate) fn file_bytes(&self) -> String {
        format!("{}\n", self.file_content)
    }

    /// The environment a local rank gets on top of the launcher's, in order (a later entry
    /// for the same variable wins): the exports, the generated file's path and `MLX_RANK`.
    pub(crate) fn rank_env(&self, rank: usize, file_path: &str) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .exports
            .iter()
            .map(|e| (e.key.clone(), e.value().to_owned()))
            .collect();
        env.push((self.file_var.to_owned(), file_path.to_owned()));
        env.push(("MLX_RANK".to_owned(), rank.to_string()));
        env
    }
}

/// `shutil.get_terminal_size((0, 0))`, as `mlx.launch` uses it: `COLUMNS` and `LINES` from
/// the environment when they are positive integers, else the terminal's (`tty`, as
/// `(columns, lines)`, `None` when standard output is not a terminal), else 0.
pub(crate) fn terminal_size(
    env_columns: Option<&str>,
    env_lines: Option<&str>,
    tty: Option<(i64, i64)>,
) -> (i64, i64) {
    let int = |v: Option<&str>| v.and_then(|v| v.trim().parse::<i64>().ok()).unwrap_or(0);
    let (mut columns, mut lines) = (int(env_columns), int(env_lines));
    if columns <= 0 || lines <= 0 {
        let (tc, tl) = tty.unwrap_or((0, 0));
        if columns <= 0 {
            columns = tc;
        }
        if lines <= 0 {
            lines = tl;
        }
    }
    (columns, lines)
}

/// Whether `key` is a name `mlx.launch` exports (letters, digits and `_`) that the shell also
/// accepts (ASCII, not empty, not starting with a digit).
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !key.as_bytes()[0].is_ascii_digit()
}

/// `host:port` for the ring hostfile and the JACCL coordinator; an IPv6 literal (with or
/// without a zone, `fe80::1%en0`) is bracketed (MLX splits at the first `:`, so it cannot use
/// IPv6 either way; nuvec reads `[addr]:port`).
fn ring_address(ip: &str, port: i64) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// Plans a job as `mlx.launch` would: resolves the backend, checks the hosts for it, assigns
/// the ring's ports or builds the JACCL device matrix, and orders the exported variables.
///
/// `terminal` is [`terminal_size`]: when its columns are positive and no entry sets
/// `COLUMNS`, `COLUMNS` and `LINES` are exported.
///
/// # Errors
///
/// A [`UsageError`] with `mlx.launch`'s message for an unknown backend, ring hosts without
/// IPs, a JACCL host file without a full, well-formed `rdma` matrix or without an IP for
/// rank 0; and, unlike `mlx.launch`, for no hosts, a host name starting with `-`, fewer than
/// one connection per IP, a port outside 1 to 65535, or the `mpi` and `nccl` backends.
pub(crate) fn plan(args: &Args, list: HostList, terminal: (i64, i64)) -> Result<Plan, UsageError> {
    let backend_name = match &args.backend {
        Some(b) => b.clone(),
        None if !list.backend.is_empty() => list.backend.clone(),
        None => "ring".to_owned(),
    };
    let backend = match backend_name.as_str() {
        "ring" => LaunchBackend::Ring,
        "jaccl" => LaunchBackend::Jaccl,
        "jaccl-ring" => LaunchBackend::JacclRing,
        "mpi" | "nccl" => {
            return Err(usage_error(format!(
                "the {backend_name} backend is not supported by nuvec-launch (use mlx.launch); \
                 nuvec-launch starts ring, jaccl and jaccl-ring"
            )));
        }
        _ => {
            return Err(usage_error(
                "The backend should be one of {'ring', 'mpi', 'nccl', 'jaccl', 'jaccl-ring'} \
                 (nuvec-launch starts ring, jaccl and jaccl-ring)",
            ));
        }
    };
    let hosts = list.hosts;
    if hosts.is_empty() {
        return Err(usage_error("The hostfile lists no hosts"));
    }
    if let Some(h) = hosts.iter().find(|h| h.ssh.starts_with('-')) {
        return Err(usage_error(format!(
            "The host name {:?} starts with '-', which ssh would take as an option",
            h.ssh
        )));
    }
    if !(1..=65535).contains(&args.starting_port) {
        return Err(usage_error(format!(
            "argument -p/--starting-port: {} is not a port (1 to 65535)",
            args.starting_port
        )));
    }

    let mut env: Vec<String> = list.envs.clone();
    env.extend(args.env.iter().cloned());
    if let Some(wire) = &args.wire {
        env.push(format!("NUVEC_DISTRIBUTED_WIRE={wire}"));
    }
    let (columns, lines) = terminal;
    if columns > 0 && !env.iter().any(|e| e.starts_with("COLUMNS=")) {
        env.push(format!("COLUMNS={columns}"));
        env.push(format!("LINES={lines}"));
    }

    let (file_var, file_content) = match backend {
        LaunchBackend::Ring => {
            if let Some((i, h)) = hosts.iter().enumerate().find(|(_, h)| h.ips.is_empty()) {
                const MLX: &str =
                    "The ring backend requires IPs to be provided instead of hostnames";
                // MLX's message, and when the entry had keys a host file does not have, which
                // entry and which keys: the likely misspelling of "ips".
                return Err(usage_error(if h.unknown.is_empty() {
                    MLX.to_owned()
                } else {
                    let keys: Vec<&str> = h.unknown.iter().map(String::as_str).collect();
                    format!(
                        "{MLX}: host {i} (ssh {:?}) has no \"ips\"; its {} {} not known and \
                         ignored (a host has {})",
                        h.ssh,
                        if keys.len() == 1 { "key" } else { "keys" },
                        if keys.len() == 1 {
                            format!("{} is", quoted(&keys))
                        } else {
                            format!("{} are", quoted(&keys))
                        },
                        quoted(&HOST_KEYS)
                    )
                }));
            }
            if args.connections_per_ip < 1 {
                return Err(usage_error(format!(
                    "argument --connections-per-ip: {} is not a positive number",
                    args.connections_per_ip
                )));
            }
            // The port range is checked before an address is built: a huge
            // `--connections-per-ip` must be an error, not a loop.
            let ips: u128 = hosts.iter().map(|h| h.ips.len() as u128).sum();
            let last = args.starting_port as u128 + ips * args.connections_per_ip as u128 - 1;
            if last > 65535 {
                return Err(usage_error(format!(
                    "the ring needs ports {} to {last}, beyond 65535; lower -p/--starting-port \
                     or --connections-per-ip",
                    args.starting_port
                )));
            }
            let mut port = args.starting_port;
            let mut nodes = Vec::with_capacity(hosts.len());
            for h in &hosts {
                let mut node = Vec::new();
                for ip in &h.ips {
                    for _ in 0..args.connections_per_ip {
                        node.push(Value::String(ring_address(ip, port)));
                        port += 1;
                    }
                }
                nodes.push(Value::Array(node));
            }
            if args.verbose {
                env.push("MLX_RING_VERBOSE=1".to_owned());
            }
            ("MLX_HOSTFILE", py_json(&Value::Array(nodes)))
        }
        LaunchBackend::Jaccl | LaunchBackend::JacclRing => {
            let Some(coordinator) = hosts[0].ips.first() else {
                return Err(usage_error(
                    "Rank 0 should have an IP reachable from all other ranks",
                ));
            };
            let n = hosts.len();
            if hosts.iter().any(|h| h.rdma.len() != n) {
                return Err(usage_error(
                    "The hostfile is malformed: number of RDMA devices does not match hosts",
                ));
            }
            if hosts.iter().enumerate().any(|(i, h)| !h.rdma[i].is_null()) {
                return Err(usage_error(
                    "The hostfile is malformed: RDMA device of self should be null",
                ));
            }
            let ring = backend == LaunchBackend::JacclRing;
            let mut missing = Vec::new();
            for (i, h) in hosts.iter().enumerate() {
                let peers: Vec<usize> = if ring {
                    vec![(i + n - 1) % n, (i + 1) % n]
                } else {
                    (0..n).collect()
                };
                for j in peers {
                    if i != j && h.rdma[j].is_null() {
                        missing.push((i, j));
                    }
                }
            }
            if !missing.is_empty() {
                let mut pairs = missing
                    .iter()
                    .take(3)
                    .map(|&(i, j)| format!("{} to {}", hosts[i].ssh, hosts[j].ssh))
                    .collect::<Vec<_>>()
                    .join(", ");
                if missing.len() > 3 {
                    pairs += &format!(" and {} more", missing.len() - 3);
                }
                return Err(usage_error(format!(
                    "The hostfile is malformed: no RDMA device is listed for {pairs}"
                )));
            }
            env.push(format!(
                "MLX_JACCL_COORDINATOR={}",
                ring_address(coordinator, args.starting_port)
            ));
            if ring {
                env.push("MLX_JACCL_RING=1".to_owned());
            }
            let matrix = Value::Array(hosts.iter().map(|h| Value::Array(h.rdma.clone())).collect());
            ("MLX_IBV_DEVICES", py_json(&matrix))
        }
    };

    let mut exports = Vec::new();
    let mut ignored = Vec::new();
    for e in env {
        let (key, value) = match e.split_once('=') {
            Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
            None => (e.clone(), None),
        };
        if valid_key(&key) {
            exports.push(Export { key, value });
        } else {
            ignored.push(e);
        }
    }

    let mut command = Vec::with_capacity(args.command.len() + 1);
    command.extend(args.python.iter().cloned());
    command.extend(args.command.iter().cloned());

    let ranks = hosts
        .iter()
        .enumerate()
        .map(|(rank, h)| RankPlan {
            rank,
            host: h.ssh.clone(),
            local: LOCAL_HOSTS.contains(&h.ssh.as_str()),
        })
        .collect();

    Ok(Plan {
        backend,
        ranks,
        exports,
        ignored,
        file_var,
        file_content,
        command,
        cwd: args.cwd.clone(),
        verbose: args.verbose,
    })
}

/// Python's `json.dumps` with its defaults: `", "` and `": "` separators, and every character
/// outside printable ASCII escaped (`\uXXXX`, surrogate pairs beyond the BMP), for
/// `serde_json`'s serializer. Keys come in the map's order (sorted, as `serde_json`'s
/// `Value` keeps them); the files written here hold no numbers but integers, which both
/// write alike.
pub(crate) struct PythonFormatter;

impl Formatter for PythonFormatter {
    fn begin_array_value<W>(&mut self, writer: &mut W, first: bool) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W>(&mut self, writer: &mut W, first: bool) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W>(&mut self, writer: &mut W) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        writer.write_all(b": ")
    }

    /// A run of characters `serde_json` does not escape (it escapes `"`, `\` and the ASCII
    /// controls as Python does): the ones outside printable ASCII become `\uXXXX`.
    fn write_string_fragment<W>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if (' '..='~').contains(&c) {
                continue;
            }
            writer.write_all(&fragment.as_bytes()[start..i])?;
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                write!(writer, "\\u{unit:04x}")?;
            }
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

/// Python's `json.dumps(value)`.
pub(crate) fn py_json(value: &Value) -> String {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
    value
        .serialize(&mut serializer)
        .expect("a JSON value serializes into memory");
    String::from_utf8(out).expect("the formatter writes ASCII")
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn run(argv: &[&str]) -> Args {
        let full = std::iter::once("nuvec-launch").chain(argv.iter().copied());
        crate::args::parse(full).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn plan_of(argv: &[&str]) -> Result<Plan, UsageError> {
        let args = run(argv);
        let list = match &args.hostfile {
            Some(p) => HostList::from_file(p)?,
            None => HostList::from_list(&args.hosts, args.repeat_hosts)?,
        };
        plan(&args, list, (0, 0))
    }

    fn plan_with(argv: &[&str], hostfile: &str) -> Result<Plan, UsageError> {
        let args = run(argv);
        plan(&args, HostList::parse(hostfile, "h.json")?, (0, 0))
    }

    #[test]
    fn ring_ports_step_per_rank_ip_and_connection() {
        let p = plan_with(
            &["--connections-per-ip", "2", "-p", "5000", "x"],
            r#"[{"ssh": "a", "ips": ["10.0.0.1", "10.0.1.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]"#,
        )
        .unwrap();
        assert_eq!(p.file_var, "MLX_HOSTFILE");
        assert_eq!(
            p.file_content,
            r#"[["10.0.0.1:5000", "10.0.0.1:5001", "10.0.1.1:5002", "10.0.1.1:5003"], ["10.0.0.2:5004", "10.0.0.2:5005"]]"#
        );
    }

    #[test]
    fn the_local_ring_hostfile_is_mlx_launchs_list_of_address_lists() {
        let p = plan_of(&["-n", "4", "x"]).unwrap();
        assert_eq!(
            p.file_bytes(),
            "[[\"127.0.0.1:32323\"], [\"127.0.0.1:32324\"], [\"127.0.0.1:32325\"], \
             [\"127.0.0.1:32326\"]]\n"
        );
        // The ranks' reader (`nuvec_distributed`, tested end to end in `tests/processes/launch.rs`)
        // takes a JSON list of lists of `host:port` strings.
        let nodes: Vec<Vec<String>> = serde_json::from_str(&p.file_bytes()).unwrap();
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[3], strings(&["127.0.0.1:32326"]));
        assert!(p.ranks.iter().all(|r| r.local && r.host == "127.0.0.1"));
        assert_eq!(
            p.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
    }

    #[test]
    fn one_host_gets_a_one_rank_hostfile_not_mlx_launchs_empty_one() {
        let p = plan_of(&["x"]).unwrap();
        assert_eq!(p.file_content, r#"[["127.0.0.1:32323"]]"#);
    }

    #[test]
    fn ipv6_ring_addresses_are_bracketed() {
        let p = plan_of(&["--hosts", "::1", "-n", "2", "x"]).unwrap();
        assert_eq!(p.file_content, r#"[["[::1]:32323"], ["[::1]:32324"]]"#);
    }

    #[test]
    fn a_ring_entry_without_ips_names_the_entry_and_the_key_it_did_not_know() {
        let e = plan_with(
            &["x"],
            r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ip": ["10.0.0.2"]}]"#,
        )
        .unwrap_err()
        .0;
        assert!(
            e.starts_with("The ring backend requires IPs to be provided instead of hostnames")
                && e.contains("host 1 (ssh \"b\")")
                && e.contains("\"ip\"")
                && e.contains("\"ips\""),
            "{e}"
        );
        // A key the ring does not need is only warned about.
        let p = plan_with(
            &["x"],
            r#"[{"ssh": "a", "ips": ["10.0.0.1"], "rdma_devices": []}]"#,
        )
        .expect("the ring has what it needs");
        assert_eq!(p.file_content, r#"[["10.0.0.1:32323"]]"#);
    }

    #[test]
    fn ring_errors_match_mlx_launch() {
        assert_eq!(
            plan_of(&["--hosts", "localhost", "x"]).unwrap_err().0,
            "The ring backend requires IPs to be provided instead of hostnames"
        );
        assert!(
            plan_of(&["--connections-per-ip", "0", "x"])
                .unwrap_err()
                .0
                .contains("not a positive number")
        );
        assert!(
            plan_of(&["-p", "0", "x"])
                .unwrap_err()
                .0
                .contains("not a port")
        );
        assert!(
            plan_of(&["-n", "3", "-p", "65534", "x"])
                .unwrap_err()
                .0
                .contains("beyond 65535")
        );
        assert!(plan_of(&["-n", "2", "-p", "65534", "x"]).is_ok());
        assert!(
            plan_of(&["--backend", "mpi", "x"])
                .unwrap_err()
                .0
                .contains("not supported")
        );
        assert!(
            plan_of(&["--backend", "tcp", "x"])
                .unwrap_err()
                .0
                .starts_with("The backend should be one of")
        );
        assert!(plan_with(&["x"], "[]").unwrap_err().0.contains("no hosts"));
        assert!(
            plan_with(
                &["x"],
                r#"[{"ssh": "-oProxyCommand=x", "ips": ["1.2.3.4"]}]"#
            )
            .unwrap_err()
            .0
            .contains("starts with '-'")
        );
    }

    #[test]
    fn exports_follow_mlx_launchs_order_and_skip_invalid_names() {
        let args = run(&[
            "--verbose",
            "--env",
            "FOO=bar",
            "--env",
            "bad-key=1",
            "--env",
            "EMPTY",
            "--env",
            "1ST=x",
            "--env",
            "Q=it's a b",
            "--hostfile",
            "unused",
            "x",
        ]);
        let list = HostList::parse(
            r#"{"envs": ["FROM_FILE=1"], "hosts": [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]}"#,
            "h",
        )
        .unwrap();
        let p = plan(&args, list, (120, 40)).unwrap();
        let got: Vec<(String, Option<String>)> = p
            .exports
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect();
        let want = [
            ("FROM_FILE", Some("1")),
            ("FOO", Some("bar")),
            ("EMPTY", None),
            ("Q", Some("it's a b")),
            ("COLUMNS", Some("120")),
            ("LINES", Some("40")),
            ("MLX_RING_VERBOSE", Some("1")),
        ]
        .map(|(k, v)| (k.to_owned(), v.map(str::to_owned)));
        assert_eq!(got, want);
        assert_eq!(p.ignored, strings(&["bad-key=1", "1ST=x"]));
        let env = p.rank_env(2, "/tmp/f");
        assert_eq!(
            env[env.len() - 2],
            ("MLX_HOSTFILE".to_owned(), "/tmp/f".to_owned())
        );
        assert_eq!(env[env.len() - 1], ("MLX_RANK".to_owned(), "2".to_owned()));
        assert_eq!(env[2], ("EMPTY".to_owned(), String::new()));
    }

    #[test]
    fn a_wire_is_exported_to_every_rank_and_an_unknown_one_is_a_usage_error() {
        let p = plan_of(&["--wire", "mlx", "x"]).unwrap();
        let got: Vec<(String, Option<String>)> = p
            .exports
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect();
        assert_eq!(
            got,
            [("NUVEC_DISTRIBUTED_WIRE".to_owned(), Some("mlx".to_owned()))]
        );
        assert!(plan_of(&["x"]).unwrap().exports.is_empty());
        let e = crate::args::parse(["nuvec-launch", "--wire", "fast", "x"]).unwrap_err();
        let text = crate::args::message(&e);
        assert!(text.contains("fast") && text.contains("nuvec"), "{text}");
    }

    #[test]
    fn columns_are_exported_only_from_a_terminal_size_and_not_over_the_users() {
        let p = plan_of(&["x"]).unwrap();
        assert!(p.exports.is_empty());
        let args = run(&["--env", "COLUMNS=10", "x"]);
        let p = plan(
            &args,
            HostList::from_list("127.0.0.1", 1).unwrap(),
            (80, 24),
        )
        .unwrap();
        assert_eq!(p.exports.len(), 1);
        assert_eq!(terminal_size(Some("77"), None, None), (77, 0));
        assert_eq!(terminal_size(Some("77"), Some("5"), Some((1, 2))), (77, 5));
        assert_eq!(
            terminal_size(Some("-3"), Some("x"), Some((100, 30))),
            (100, 30)
        );
        assert_eq!(terminal_size(None, None, None), (0, 0));
    }

    const JACCL_MESH: &str = r#"{"backend": "jaccl", "envs": ["MLX_METAL_FAST_SYNCH=1"], "hosts": [
        {"ssh": "m1", "ips": ["10.0.0.1"], "rdma": [null, "rdma_en2", "rdma_en3"]},
        {"ssh": "m2", "ips": ["10.0.0.2"], "rdma": ["rdma_en2", null, "rdma_en3"]},
        {"ssh": "m3", "ips": ["10.0.0.3"], "rdma": ["rdma_en2", "rdma_en3", null]}]}"#;

    #[test]
    fn jaccl_gets_the_device_matrix_the_coordinator_and_the_hostfile_backend() {
        let p = plan_with(&["-p", "5555", "x"], JACCL_MESH).unwrap();
        assert_eq!(p.backend, LaunchBackend::Jaccl);
        assert_eq!(p.file_var, "MLX_IBV_DEVICES");
        assert_eq!(
            p.file_content,
            r#"[[null, "rdma_en2", "rdma_en3"], ["rdma_en2", null, "rdma_en3"], ["rdma_en2", "rdma_en3", null]]"#
        );
        let keys: Vec<(&str, &str)> = p
            .exports
            .iter()
            .map(|e| (e.key.as_str(), e.value()))
            .collect();
        assert_eq!(
            keys,
            [
                ("MLX_METAL_FAST_SYNCH", "1"),
                ("MLX_JACCL_COORDINATOR", "10.0.0.1:5555")
            ]
        );
        assert!(p.ranks.iter().all(|r| !r.local));
        let r = plan_with(&["--backend", "jaccl-ring", "--verbose", "x"], JACCL_MESH).unwrap();
        assert_eq!(r.backend, LaunchBackend::JacclRing);
        assert_eq!(r.exports.last().unwrap().key, "MLX_JACCL_RING");
        assert!(r.exports.iter().all(|e| e.key != "MLX_RING_VERBOSE"));
    }

    #[test]
    fn an_ipv6_jaccl_coordinator_is_bracketed_so_the_ranks_can_read_it() {
        for (ip, want) in [
            ("fe80::1", "[fe80::1]:5555"),
            ("::1", "[::1]:5555"),
            ("fe80::1%en0", "[fe80::1%en0]:5555"),
        ] {
            let hf = JACCL_MESH.replace("10.0.0.1", ip);
            let p = plan_with(&["-p", "5555", "x"], &hf).unwrap();
            let coordinator = p
                .exports
                .iter()
                .find(|e| e.key == "MLX_JACCL_COORDINATOR")
                .expect("a coordinator")
                .value();
            assert_eq!(coordinator, want);
            // The ranks read a bracketed `[addr]:port` (their reader takes no zones; the
            // launch tests run a JACCL job from this environment end to end).
            if !ip.contains('%') {
                let read: SocketAddr = coordinator.parse().expect("the ranks read it");
                assert_eq!(read.port(), 5555, "{coordinator}");
            }
        }
    }

    #[test]
    fn huge_rank_and_connection_counts_are_usage_errors_before_anything_is_built() {
        let started = std::time::Instant::now();
        let e = plan_of(&[
            "--hosts",
            "127.0.0.1",
            "--connections-per-ip",
            "100000000000",
            "x",
        ])
        .unwrap_err()
        .0;
        assert!(e.contains("beyond 65535"), "{e}");
        let e = plan_of(&["--connections-per-ip", "9223372036854775807", "x"])
            .unwrap_err()
            .0;
        assert!(e.contains("beyond 65535"), "{e}");
        let e = plan_of(&["-n", "100000000000", "x"]).unwrap_err().0;
        assert!(e.contains("more than 65535 ranks"), "{e}");
        let e = plan_of(&["--hosts", "a,b", "-n", "9223372036854775807", "x"])
            .unwrap_err()
            .0;
        assert!(e.contains("more than 65535 ranks"), "{e}");
        assert!(plan_of(&["-n", "2", "--connections-per-ip", "3", "x"]).is_ok());
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_multi_wire_mesh_keeps_its_cable_lists_as_mlx_distributed_config_writes_them() {
        // Every pair with two cables: mlx.distributed_config 0.32.4 lists both, in the same
        // cable order at both ends, and MLX 0.32.4's mesh runs one wire per cable.
        let hf = r#"[
            {"ssh": "a", "ips": ["10.0.0.1"], "rdma": [null, ["rdma_en1", "rdma_en2"], ["rdma_en3", "rdma_en4"]]},
            {"ssh": "b", "rdma": [["rdma_en1", "rdma_en2"], null, ["rdma_en5", "rdma_en6"]]},
            {"ssh": "c", "rdma": [["rdma_en3", "rdma_en4"], ["rdma_en5", "rdma_en6"], null]}]"#;
        let p = plan_with(&["--backend", "jaccl", "x"], hf).unwrap();
        assert_eq!(p.file_var, "MLX_IBV_DEVICES");
        assert_eq!(
            p.file_content,
            r#"[[null, ["rdma_en1", "rdma_en2"], ["rdma_en3", "rdma_en4"]], [["rdma_en1", "rdma_en2"], null, ["rdma_en5", "rdma_en6"]], [["rdma_en3", "rdma_en4"], ["rdma_en5", "rdma_en6"], null]]"#
        );
    }

    #[test]
    fn jaccl_ring_only_needs_the_neighbours_and_keeps_cable_lists() {
        let hf = r#"[
            {"ssh": "a", "ips": ["10.0.0.1"], "rdma": [null, ["rdma_en1", "rdma_en2"], null, "rdma_en4"]},
            {"ssh": "b", "rdma": [["rdma_en1", "rdma_en2"], null, "rdma_en3", null]},
            {"ssh": "c", "rdma": [null, "rdma_en3", null, "rdma_en4"]},
            {"ssh": "d", "rdma": ["rdma_en4", null, "rdma_en4", null]}]"#;
        let p = plan_with(&["--backend", "jaccl-ring", "x"], hf).unwrap();
        assert!(
            p.file_content
                .starts_with(r#"[[null, ["rdma_en1", "rdma_en2"], null, "rdma_en4"], "#)
        );
        let e = plan_with(&["--backend", "jaccl", "x"], hf).unwrap_err().0;
        assert_eq!(
            e,
            "The hostfile is malformed: no RDMA device is listed for a to c, b to d, c to a and 1 more"
        );
    }

    #[test]
    fn jaccl_errors_match_mlx_launch() {
        let no_ip = r#"[{"ssh": "a", "rdma": [null, "x"]}, {"ssh": "b", "rdma": ["x", null]}]"#;
        assert_eq!(
            plan_with(&["--backend", "jaccl", "x"], no_ip)
                .unwrap_err()
                .0,
            "Rank 0 should have an IP reachable from all other ranks"
        );
        assert_eq!(
            plan_of(&["--backend", "jaccl", "-n", "2", "x"])
                .unwrap_err()
                .0,
            "The hostfile is malformed: number of RDMA devices does not match hosts"
        );
        let self_dev = r#"[{"ssh": "a", "ips": ["1.1.1.1"], "rdma": ["x", "y"]}, {"ssh": "b", "rdma": ["x", null]}]"#;
        assert_eq!(
            plan_with(&["--backend", "jaccl", "x"], self_dev)
                .unwrap_err()
                .0,
            "The hostfile is malformed: RDMA device of self should be null"
        );
    }

    #[test]
    fn python_json_dumps_layout_and_escapes() {
        let v: Value = serde_json::from_str(
            r#"[[null, "rdma_é", ["a", "b"]], "x\u007f\n\"\\😀\t\u0001", true, {"k": 1}]"#,
        )
        .unwrap();
        assert_eq!(
            py_json(&v),
            r#"[[null, "rdma_\u00e9", ["a", "b"]], "x\u007f\n\"\\\ud83d\ude00\t\u0001", true, {"k": 1}]"#
        );
    }
}
