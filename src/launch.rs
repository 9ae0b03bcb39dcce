//! The pure logic of the `nuvec-launch` binary: MLX's `mlx.launch` for the ring and JACCL
//! backends, without Python.
//!
//! Everything here is deterministic and free of side effects, so that it can be unit-tested:
//! argument parsing ([`parse_args`]), the host list ([`HostList`], from `--hosts`/`-n` or
//! MLX's JSON host file), and the [`Plan`] of a job (ranks, ports, the hostfile or device
//! file, the exported environment), plus the shell text `mlx.launch` sends through `ssh`
//! ([`launch_script`], [`ssh_command`], [`kill_script`]) and Python's `json.dumps` and
//! `shlex.quote` ([`py_json`], [`shell_quote`]) that the file contents and scripts are made
//! of. The binary (`src/bin/nuvec-launch.rs`) starts and supervises the processes.
//!
//! Not a stable API: it exists for the binary and its tests.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// `mlx.launch`'s default `--starting-port`.
pub const DEFAULT_STARTING_PORT: i64 = 32323;

/// The hosts that are started directly rather than through `ssh` (`mlx.launch`: only
/// `127.0.0.1`).
pub const LOCAL_HOSTS: [&str; 2] = ["127.0.0.1", "localhost"];

/// The most ranks a job may have: every ring rank listens on at least one port of its own.
pub const MAX_RANKS: usize = 65535;

/// The help text (`-h`/`--help`).
pub const USAGE: &str = "\
usage: nuvec-launch [-h] [--verbose] [--hosts HOSTS] [-n N] [--hostfile HOSTFILE]
                    [--backend {ring,jaccl,jaccl-ring}] [--env KEY=VALUE]...
                    [--connections-per-ip N] [-p PORT] [--cwd CWD] [--python PYTHON]
                    [--] COMMAND [ARG]...

Launch an MLX distributed program (ring or JACCL backend) on this and other hosts, as
mlx.launch does.

options:
  -h, --help             show this help message and exit
  --verbose              print what is launched and each rank's end on stderr, and set
                         MLX_RING_VERBOSE=1 (ring backend)
  --hosts HOSTS          a comma separated list of hosts (default 127.0.0.1); an entry that
                         is an IP address is also the address the ring listens on
  -n, --repeat-hosts N   repeat each host of --hosts N times (default 1)
  --hostfile HOSTFILE    MLX's JSON host file, used instead of --hosts: a list of hosts
                         {\"ssh\", \"ips\", \"rdma\"}, or {\"backend\", \"envs\", \"hosts\"}
  --backend BACKEND      ring, jaccl or jaccl-ring (default: the host file's backend, else
                         ring)
  --env KEY=VALUE        set an environment variable on every rank (repeatable)
  --connections-per-ip N ring: connections (ports) per IP address (default 1)
  -p, --starting-port PORT
                         ring: the first port, +1 per rank, IP and connection; JACCL: the
                         coordinator's port on rank 0's first IP (default 32323)
  --cwd CWD              the working directory of every rank (default: the current one, where
                         it exists)
  --python PYTHON        run the command with this interpreter

Ranks whose host is 127.0.0.1 or localhost are started directly, the others with
`ssh -tt HOST SCRIPT` as mlx.launch does. Each line a rank prints is prefixed with
\"[rank R] \"; standard input is sent to every rank. When a rank fails the others are
stopped (SIGTERM, then SIGKILL after 5 s) and nuvec-launch exits with the failing rank's
status (128+N for signal N); 0 when every rank succeeds. Usage errors exit with 2.
";

/// A command-line or configuration mistake: printed after the usage line, exit status 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage_error(what: impl Into<String>) -> UsageError {
    UsageError(what.into())
}

/// The parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// `--verbose`.
    pub verbose: bool,
    /// `--hosts` (default `127.0.0.1`).
    pub hosts: String,
    /// `-n`/`--repeat-hosts` (default 1, always positive).
    pub repeat_hosts: usize,
    /// `--hostfile`.
    pub hostfile: Option<PathBuf>,
    /// `--backend`, as given.
    pub backend: Option<String>,
    /// Every `--env`, in order.
    pub env: Vec<String>,
    /// `--connections-per-ip` (default 1).
    pub connections_per_ip: i64,
    /// `-p`/`--starting-port` (default 32323).
    pub starting_port: i64,
    /// `--cwd`.
    pub cwd: Option<String>,
    /// `--python`.
    pub python: Option<String>,
    /// The command and its arguments (never empty).
    pub command: Vec<String>,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            verbose: false,
            hosts: "127.0.0.1".to_owned(),
            repeat_hosts: 1,
            hostfile: None,
            backend: None,
            env: Vec::new(),
            connections_per_ip: 1,
            starting_port: DEFAULT_STARTING_PORT,
            cwd: None,
            python: None,
            command: Vec::new(),
        }
    }
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// `-h`/`--help`: print [`USAGE`] and exit 0.
    Help,
    /// Launch a job.
    Run(Args),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opt {
    Help,
    Verbose,
    Hosts,
    Repeat,
    Hostfile,
    Backend,
    Env,
    Connections,
    Port,
    Cwd,
    Python,
}

const LONG_OPTIONS: [(&str, Opt); 11] = [
    ("help", Opt::Help),
    ("verbose", Opt::Verbose),
    ("hosts", Opt::Hosts),
    ("repeat-hosts", Opt::Repeat),
    ("hostfile", Opt::Hostfile),
    ("backend", Opt::Backend),
    ("env", Opt::Env),
    ("connections-per-ip", Opt::Connections),
    ("starting-port", Opt::Port),
    ("cwd", Opt::Cwd),
    ("python", Opt::Python),
];

impl Opt {
    fn display(self) -> &'static str {
        match self {
            Opt::Help => "-h/--help",
            Opt::Verbose => "--verbose",
            Opt::Hosts => "--hosts",
            Opt::Repeat => "-n/--repeat-hosts",
            Opt::Hostfile => "--hostfile",
            Opt::Backend => "--backend",
            Opt::Env => "--env",
            Opt::Connections => "--connections-per-ip",
            Opt::Port => "-p/--starting-port",
            Opt::Cwd => "--cwd",
            Opt::Python => "--python",
        }
    }

    fn takes_value(self) -> bool {
        !matches!(self, Opt::Help | Opt::Verbose)
    }
}

/// Resolves a long option name, exactly or by a unique prefix (as Python's `argparse`).
fn long_option(name: &str) -> Result<Opt, UsageError> {
    if let Some((_, opt)) = LONG_OPTIONS.iter().find(|(n, _)| *n == name) {
        return Ok(*opt);
    }
    let matches: Vec<&(&str, Opt)> = LONG_OPTIONS
        .iter()
        .filter(|(n, _)| !name.is_empty() && n.starts_with(name))
        .collect();
    match matches.as_slice() {
        [(_, opt)] => Ok(*opt),
        [] => Err(usage_error(format!("unrecognized option: --{name}"))),
        several => Err(usage_error(format!(
            "ambiguous option: --{name} could match {}",
            several
                .iter()
                .map(|(n, _)| format!("--{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Python's `int()` on a command-line value, for the options that take numbers.
fn integer(opt: Opt, value: &str) -> Result<i64, UsageError> {
    value.trim().parse::<i64>().map_err(|_| {
        usage_error(format!(
            "argument {}: invalid int value: {value:?}",
            opt.display()
        ))
    })
}

/// Parses the arguments after the program name.
///
/// Options come first; the command starts at the first argument that is not an option (or
/// after `--`), and everything from there on is the command's, even arguments that look
/// like options. Long options may be abbreviated to a unique prefix and take their value as
/// the next argument or after `=`; `-n` and `-p` also take it attached (`-n4`).
///
/// # Errors
///
/// A [`UsageError`] for an unknown or ambiguous option, a missing or invalid value, a
/// non-UTF-8 argument, or no command.
pub fn parse_args<I, S>(argv: I) -> Result<Parsed, UsageError>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString>,
{
    let argv = argv
        .into_iter()
        .map(|a| {
            a.into()
                .into_string()
                .map_err(|a| usage_error(format!("the argument {a:?} is not valid UTF-8")))
        })
        .collect::<Result<Vec<String>, _>>()?;
    let mut args = Args::default();
    let mut i = 0;
    while i < argv.len() {
        let arg = &argv[i];
        i += 1;
        let (opt, attached) = if arg == "--" {
            args.command = argv[i..].to_vec();
            break;
        } else if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((name, value)) => (long_option(name)?, Some(value.to_owned())),
                None => (long_option(long)?, None),
            }
        } else if arg.len() > 1 && arg.starts_with('-') {
            let mut chars = arg[1..].chars();
            let flag = chars.next().unwrap_or('-');
            let rest: String = chars.collect();
            let opt = match flag {
                'h' => Opt::Help,
                'n' => Opt::Repeat,
                'p' => Opt::Port,
                _ => return Err(usage_error(format!("unrecognized option: {arg}"))),
            };
            if opt == Opt::Help && !rest.is_empty() {
                return Err(usage_error(format!("unrecognized option: {arg}")));
            }
            (opt, (!rest.is_empty()).then_some(rest))
        } else {
            args.command = argv[i - 1..].to_vec();
            break;
        };
        let value = if opt.takes_value() {
            match attached {
                Some(v) => v,
                None => {
                    let Some(v) = argv.get(i) else {
                        return Err(usage_error(format!(
                            "argument {}: expected one argument",
                            opt.display()
                        )));
                    };
                    i += 1;
                    v.clone()
                }
            }
        } else {
            if attached.is_some() {
                return Err(usage_error(format!(
                    "argument {}: ignored explicit argument",
                    opt.display()
                )));
            }
            String::new()
        };
        match opt {
            Opt::Help => return Ok(Parsed::Help),
            Opt::Verbose => args.verbose = true,
            Opt::Hosts => args.hosts = value,
            Opt::Repeat => {
                let n = integer(opt, &value)?;
                if n <= 0 {
                    return Err(usage_error(format!(
                        "argument {}: {value:?} is not a positive number",
                        opt.display()
                    )));
                }
                args.repeat_hosts = usize::try_from(n).map_err(|_| {
                    usage_error(format!(
                        "argument {}: {value:?} is too large",
                        opt.display()
                    ))
                })?;
            }
            Opt::Hostfile => args.hostfile = Some(PathBuf::from(value)),
            Opt::Backend => args.backend = Some(value),
            Opt::Env => args.env.push(value),
            Opt::Connections => args.connections_per_ip = integer(opt, &value)?,
            Opt::Port => args.starting_port = integer(opt, &value)?,
            Opt::Cwd => args.cwd = Some(value),
            Opt::Python => args.python = Some(value),
        }
    }
    if args.command.is_empty() {
        return Err(usage_error("No script is provided"));
    }
    Ok(Parsed::Run(args))
}

/// One host of the job: one rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Host {
    /// The name `ssh` connects to (`"ssh"` in the host file).
    pub ssh: String,
    /// The addresses the ring listens on (`"ips"`).
    pub ips: Vec<String>,
    /// The RDMA device(s) towards each rank (`"rdma"`): `null`, a string or a list of strings.
    pub rdma: Vec<Value>,
}

/// The hosts of a job, with the host file's backend and environment.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct HostList {
    /// One host per rank, in rank order.
    pub hosts: Vec<Host>,
    /// The host file's `"backend"` (empty when absent).
    pub backend: String,
    /// The host file's `"envs"` (`KEY=VALUE` strings).
    pub envs: Vec<String>,
}

/// Whether `host` is an IP address literal (Python's `ipaddress.ip_address`; an IPv6 zone
/// such as `%en0` is allowed).
fn is_ip(host: &str) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        return true;
    }
    match host.split_once('%') {
        Some((addr, zone)) => !zone.is_empty() && addr.parse::<Ipv6Addr>().is_ok(),
        None => false,
    }
}

impl HostList {
    /// The hosts of `--hosts a,b,c` with `-n repeats`: each host `repeats` times in a row; a
    /// host that is an IP address listens on it (`ips = [host]`).
    ///
    /// # Errors
    ///
    /// A [`UsageError`] when an entry is empty.
    pub fn from_list(list: &str, repeats: usize) -> Result<HostList, UsageError> {
        let names: Vec<&str> = list.split(',').collect();
        if names.iter().any(|h| h.is_empty()) {
            return Err(usage_error("Hostname cannot be empty"));
        }
        // Checked before a host is built: `-n 100000000000` must be an error, not a loop.
        if names
            .len()
            .checked_mul(repeats)
            .is_none_or(|ranks| ranks > MAX_RANKS)
        {
            return Err(usage_error(format!(
                "argument -n: {repeats} rank(s) on each of {} host(s) is more than {MAX_RANKS} \
                 ranks (a ring rank listens on a port of its own)",
                names.len()
            )));
        }
        let mut hosts = Vec::with_capacity(names.len() * repeats);
        for h in names {
            let ips = if is_ip(h) {
                vec![h.to_owned()]
            } else {
                Vec::new()
            };
            for _ in 0..repeats {
                hosts.push(Host {
                    ssh: h.to_owned(),
                    ips: ips.clone(),
                    rdma: Vec::new(),
                });
            }
        }
        Ok(HostList {
            hosts,
            ..HostList::default()
        })
    }

    /// Reads MLX's JSON host file at `path` (see [`HostList::parse`]).
    ///
    /// # Errors
    ///
    /// A [`UsageError`] when the file does not exist, cannot be read or does not parse.
    pub fn from_file(path: &Path) -> Result<HostList, UsageError> {
        let shown = path.display();
        if !path.exists() {
            return Err(usage_error(format!("Hostfile {shown} doesn't exist")));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage_error(format!("Failed to parse hostfile {shown} ({e})")))?;
        HostList::parse(&text, &shown.to_string())
    }

    /// Parses the text of MLX's JSON host file: a list of hosts, or an object with `"hosts"`
    /// and optionally `"backend"` and `"envs"`; each host is `{"ssh": name, "ips": [...],
    /// "rdma": [...]}` with `"ips"` and `"rdma"` optional. `origin` names the file in errors.
    ///
    /// # Errors
    ///
    /// A [`UsageError`] `Failed to parse hostfile ORIGIN (what)` when the text is not JSON,
    /// the top level is neither a list nor an object, `"hosts"` is missing, a host has no
    /// `"ssh"` string, or a field has the wrong type (stricter than MLX, which only fails on
    /// a missing key).
    pub fn parse(text: &str, origin: &str) -> Result<HostList, UsageError> {
        let fail =
            |what: String| usage_error(format!("Failed to parse hostfile {origin} ({what})"));
        let data: Value = serde_json::from_str(text).map_err(|e| fail(e.to_string()))?;
        let mut list = HostList::default();
        let hosts = match &data {
            Value::Object(map) => {
                match map.get("backend") {
                    None | Some(Value::Null) => {}
                    Some(Value::String(b)) => list.backend = b.clone(),
                    Some(_) => return Err(fail("\"backend\" must be a string".into())),
                }
                match map.get("envs") {
                    None | Some(Value::Null) => {}
                    Some(v) => {
                        list.envs = strings(v).ok_or_else(|| {
                            fail("\"envs\" must be a list of \"KEY=VALUE\" strings".into())
                        })?
                    }
                }
                map.get("hosts").ok_or_else(|| fail("'hosts'".into()))?
            }
            Value::Array(_) => &data,
            _ => {
                return Err(fail(
                    "expected a list of hosts or an object with \"hosts\"".into(),
                ));
            }
        };
        let Value::Array(hosts) = hosts else {
            return Err(fail("\"hosts\" must be a list".into()));
        };
        for (i, h) in hosts.iter().enumerate() {
            let Value::Object(h) = h else {
                return Err(fail(format!("host {i}: expected an object with \"ssh\"")));
            };
            let ssh = match h.get("ssh") {
                Some(Value::String(s)) => s.clone(),
                Some(_) => return Err(fail(format!("host {i}: \"ssh\" must be a string"))),
                None => return Err(fail("'ssh'".into())),
            };
            let ips = match h.get("ips") {
                None => Vec::new(),
                Some(v) => strings(v)
                    .ok_or_else(|| fail(format!("host {i}: \"ips\" must be a list of strings")))?,
            };
            let rdma = match h.get("rdma") {
                None => Vec::new(),
                Some(Value::Array(entries)) => {
                    for (j, e) in entries.iter().enumerate() {
                        let ok = match e {
                            Value::Null | Value::String(_) => true,
                            Value::Array(_) => strings(e).is_some(),
                            _ => false,
                        };
                        if !ok {
                            return Err(fail(format!(
                                "host {i}: \"rdma\"[{j}] must be null, a device name or a list \
                                 of device names"
                            )));
                        }
                    }
                    entries.clone()
                }
                Some(_) => return Err(fail(format!("host {i}: \"rdma\" must be a list"))),
            };
            list.hosts.push(Host { ssh, ips, rdma });
        }
        Ok(list)
    }
}

/// A JSON list of strings.
fn strings(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    }
}

/// The backends `nuvec-launch` starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchBackend {
    /// MLX's TCP ring: `MLX_HOSTFILE`.
    Ring,
    /// JACCL over a mesh: `MLX_IBV_DEVICES` and `MLX_JACCL_COORDINATOR`.
    Jaccl,
    /// JACCL, preferring the ring topology: as [`LaunchBackend::Jaccl`] plus `MLX_JACCL_RING=1`.
    JacclRing,
}

impl LaunchBackend {
    /// `mlx.launch`'s name of the backend.
    pub fn name(self) -> &'static str {
        match self {
            LaunchBackend::Ring => "ring",
            LaunchBackend::Jaccl => "jaccl",
            LaunchBackend::JacclRing => "jaccl-ring",
        }
    }
}

/// One `KEY=VALUE` (or bare `KEY`) environment entry to export on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    /// The variable.
    pub key: String,
    /// The value; `None` for a bare `KEY` (exported empty, as `export KEY=`).
    pub value: Option<String>,
}

impl Export {
    /// The value the variable gets.
    pub fn value(&self) -> &str {
        self.value.as_deref().unwrap_or("")
    }
}

/// One rank of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankPlan {
    /// Its rank.
    pub rank: usize,
    /// The host it runs on (the `ssh` name).
    pub host: String,
    /// Whether it is started directly (host `127.0.0.1` or `localhost`) rather than by ssh.
    pub local: bool,
}

/// Everything a job needs, before any process starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The backend.
    pub backend: LaunchBackend,
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankPlan>,
    /// The variables exported on every rank, in `mlx.launch`'s order (later ones win): the host
    /// file's `envs`, `--env`, `COLUMNS` and `LINES`, then the backend's.
    pub exports: Vec<Export>,
    /// Environment entries that are ignored because their name is not a shell identifier,
    /// as given (`mlx.launch` warns about each).
    pub ignored: Vec<String>,
    /// The variable naming the generated file: `MLX_HOSTFILE` or `MLX_IBV_DEVICES`.
    pub file_var: &'static str,
    /// The generated file's content, without the trailing newline `echo` adds.
    pub file_content: String,
    /// The command each rank runs (`--python` first when given).
    pub command: Vec<String>,
    /// `--cwd`.
    pub cwd: Option<String>,
    /// `--verbose`.
    pub verbose: bool,
}

impl Plan {
    /// The generated file's bytes, as `mlx.launch` writes them (`echo CONTENT >FILE`).
    pub fn file_bytes(&self) -> String {
        format!("{}\n", self.file_content)
    }

    /// The environment a local rank gets on top of the launcher's, in order (a later entry
    /// for the same variable wins): the exports, the generated file's path and `MLX_RANK`.
    pub fn rank_env(&self, rank: usize, file_path: &str) -> Vec<(String, String)> {
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
pub fn terminal_size(
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
pub fn plan(args: &Args, list: HostList, terminal: (i64, i64)) -> Result<Plan, UsageError> {
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
    let (columns, lines) = terminal;
    if columns > 0 && !env.iter().any(|e| e.starts_with("COLUMNS=")) {
        env.push(format!("COLUMNS={columns}"));
        env.push(format!("LINES={lines}"));
    }

    let (file_var, file_content) = match backend {
        LaunchBackend::Ring => {
            if hosts.iter().any(|h| h.ips.is_empty()) {
                return Err(usage_error(
                    "The ring backend requires IPs to be provided instead of hostnames",
                ));
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

/// The bash script `mlx.launch` runs for a rank (`RemoteProcess.make_launch_script`), byte for
/// byte for the exports `plan` keeps: `stty -echo` (remote), the PID file it prints first,
/// `cd`, the exports, the generated file (a `mktemp` file on the rank's host), `MLX_RANK`,
/// then `exec` of the command. `launcher_cwd` is the directory it changes to without `--cwd`.
pub fn launch_script(plan: &Plan, rank: usize, launcher_cwd: &str, is_local: bool) -> String {
    let mut script = String::new();
    if !is_local {
        script += "stty -echo; ";
    }
    script += "pidfile=$(mktemp); ";
    script += "echo $$ > $pidfile; ";
    script += "printf \"%s\\n\" $pidfile; ";
    let dir = match plan.cwd.as_deref() {
        Some(c) if !c.is_empty() => c,
        _ => launcher_cwd,
    };
    let qd = shell_quote(dir);
    script += &format!("if [[ -d {qd} ]]; then ");
    script += &format!("  cd {qd}; ");
    if plan.cwd.is_some() {
        script += "else ";
        script += &format!(" echo 'Failed to change directory to' {qd} >&2; ");
    }
    script += "fi; ";
    for e in &plan.exports {
        let value = e.value.as_deref().map(shell_quote).unwrap_or_default();
        script += &format!("export {}={value}; ", e.key);
    }
    script += "fname=$(mktemp); ";
    script += &format!("echo {} >$fname; ", shell_quote(&plan.file_content));
    script += &format!("export {}=$fname; ", plan.file_var);
    script += &format!("export MLX_RANK={rank}; ");
    let command: Vec<String> = plan.command.iter().map(|c| shell_quote(c)).collect();
    script += &format!("cmd=({}); ", command.join(" "));
    script += "exec \"${cmd[@]}\"";
    script
}

/// The command that starts a remote rank: `ssh -tt -o LogLevel=QUIET HOST SCRIPT`.
pub fn ssh_command(host: &str, script: &str) -> Vec<String> {
    ["ssh", "-tt", "-o", "LogLevel=QUIET", host, script]
        .map(str::to_owned)
        .to_vec()
}

/// The PID file named by a line a remote rank printed, if the line is one: [`launch_script`]
/// prints the path `mktemp` made before anything else, but a login banner (conda, nvm) may
/// come first, and whatever is taken for the path ends up in [`kill_script`]. So only an
/// absolute path of plain components (`[A-Za-z0-9_.+-]`, no `.` or `..`, at most 4096
/// bytes) whose file name is `mktemp`'s (`tmp.` and letters or digits) is accepted.
pub fn pidfile_path(line: &str) -> Option<&str> {
    let path = line.trim();
    let rest = path.strip_prefix('/')?;
    if path.len() > 4096 {
        return None;
    }
    let parts: Vec<&str> = rest.split('/').collect();
    let plain = |c: &&str| {
        !c.is_empty()
            && *c != "."
            && *c != ".."
            && c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b))
    };
    let name = parts.last()?.strip_prefix("tmp.")?;
    let mktemp = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric());
    (mktemp && parts.iter().all(plain)).then_some(path)
}

/// The script that kills a remote rank through its PID file (`make_kill_script`, with the
/// path quoted); it prints 1 when the process was still running, else 0.
pub fn kill_script(pidfile: &str) -> String {
    let pidfile = shell_quote(pidfile);
    format!(
        "pid=$(cat {pidfile}); if ps -p $pid >/dev/null; then     kill $pid;     echo 1; \
         else     echo 0; fi; rm {pidfile}"
    )
}

/// The command that runs [`kill_script`] on `host`: `ssh HOST SCRIPT`.
pub fn kill_command(host: &str, pidfile: &str) -> Vec<String> {
    vec!["ssh".to_owned(), host.to_owned(), kill_script(pidfile)]
}

/// Python's `shlex.quote`: the word unchanged when it only has `[A-Za-z0-9_@%+=:,./-]`,
/// else in single quotes (a `'` becomes `'"'"'`); `''` for the empty word.
pub fn shell_quote(word: &str) -> String {
    if word.is_empty() {
        return "''".to_owned();
    }
    let safe = word
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if safe {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\"'\"'"))
    }
}

/// Python's `shlex.join`.
pub fn shell_join(words: &[String]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Python's `json.dumps` with its defaults: `", "` and `": "` separators, and every character
/// outside printable ASCII escaped (`\uXXXX`, surrogate pairs beyond the BMP).
pub fn py_json(value: &Value) -> String {
    let mut out = String::new();
    write_py_json(value, &mut out);
    out
}

fn write_py_json(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_py_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_string(k, out);
                out.push_str(": ");
                write_py_json(v, out);
            }
            out.push('}');
        }
    }
}

fn write_py_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(argv: &[&str]) -> Args {
        match parse_args(argv.iter().copied()) {
            Ok(Parsed::Run(a)) => a,
            other => panic!("{argv:?}: {other:?}"),
        }
    }

    fn err(argv: &[&str]) -> String {
        match parse_args(argv.iter().copied()) {
            Err(e) => e.0,
            other => panic!("{argv:?}: expected an error, got {other:?}"),
        }
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
    fn defaults_are_mlx_launchs() {
        let a = run(&["prog"]);
        assert_eq!(a.hosts, "127.0.0.1");
        assert_eq!(a.repeat_hosts, 1);
        assert_eq!(a.starting_port, 32323);
        assert_eq!(a.connections_per_ip, 1);
        assert_eq!(a.command, strings(&["prog"]));
        assert!(!a.verbose && a.backend.is_none() && a.hostfile.is_none());
    }

    #[test]
    fn every_option_in_its_long_short_attached_and_abbreviated_forms() {
        let a = run(&[
            "--verbose",
            "--hosts=10.0.0.1,10.0.0.2",
            "-n3",
            "--backend",
            "jaccl",
            "--env",
            "A=1",
            "--env=B=2=3",
            "--conn",
            "2",
            "-p",
            "4000",
            "--cwd",
            "/w",
            "--python",
            "python3",
            "--hostf",
            "h.json",
            "--",
            "--not-an-option",
            "-n",
        ]);
        assert!(a.verbose);
        assert_eq!(a.hosts, "10.0.0.1,10.0.0.2");
        assert_eq!(a.repeat_hosts, 3);
        assert_eq!(a.backend.as_deref(), Some("jaccl"));
        assert_eq!(a.env, strings(&["A=1", "B=2=3"]));
        assert_eq!(a.connections_per_ip, 2);
        assert_eq!(a.starting_port, 4000);
        assert_eq!(a.cwd.as_deref(), Some("/w"));
        assert_eq!(a.python.as_deref(), Some("python3"));
        assert_eq!(a.hostfile, Some(PathBuf::from("h.json")));
        assert_eq!(a.command, strings(&["--not-an-option", "-n"]));
        let b = run(&["--repeat-hosts", "2", "--starting-port=5", "-p", "6", "x"]);
        assert_eq!((b.repeat_hosts, b.starting_port), (2, 6));
    }

    #[test]
    fn the_command_starts_at_the_first_non_option_and_keeps_its_options() {
        let a = run(&[
            "-n",
            "2",
            "python",
            "train.py",
            "--verbose",
            "--",
            "-p",
            "1",
        ]);
        assert!(!a.verbose);
        assert_eq!(a.starting_port, 32323);
        assert_eq!(
            a.command,
            strings(&["python", "train.py", "--verbose", "--", "-p", "1"])
        );
    }

    #[test]
    fn help_wins_wherever_it_is_before_the_command() {
        assert_eq!(parse_args(["-h"]), Ok(Parsed::Help));
        assert_eq!(parse_args(["-n", "2", "--help", "x"]), Ok(Parsed::Help));
        assert_eq!(parse_args(["--he"]), Ok(Parsed::Help));
        assert!(matches!(parse_args(["x", "-h"]), Ok(Parsed::Run(_))));
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        assert_eq!(err(&[]), "No script is provided");
        assert_eq!(err(&["-n", "2"]), "No script is provided");
        assert_eq!(err(&["--"]), "No script is provided");
        assert!(err(&["-n", "0", "x"]).contains("not a positive number"));
        assert!(err(&["-n", "-1", "x"]).contains("not a positive number"));
        assert!(err(&["-n", "two", "x"]).contains("invalid int value: \"two\""));
        assert!(err(&["--hosts"]).contains("--hosts: expected one argument"));
        assert_eq!(
            err(&["--frobnicate", "x"]),
            "unrecognized option: --frobnicate"
        );
        assert_eq!(err(&["-x", "y"]), "unrecognized option: -x");
        assert_eq!(
            err(&["--host", "a", "x"]),
            "ambiguous option: --host could match --hosts, --hostfile"
        );
        assert!(err(&["--verbose=1", "x"]).contains("ignored explicit argument"));
        assert!(err(&["-p", "7e3", "x"]).contains("invalid int value"));
    }

    #[test]
    fn a_non_utf8_argument_is_refused() {
        use std::os::unix::ffi::OsStringExt;
        let bad = std::ffi::OsString::from_vec(vec![b'x', 0xff]);
        let e = parse_args([std::ffi::OsString::from("-n"), "2".into(), bad]).unwrap_err();
        assert!(e.0.contains("not valid UTF-8"), "{e}");
    }

    #[test]
    fn hosts_expand_in_order_with_repeats_and_ips_only_for_addresses() {
        let l = HostList::from_list("10.0.0.1,mac-b,::1", 2).unwrap();
        let got: Vec<(&str, Vec<String>)> = l
            .hosts
            .iter()
            .map(|h| (h.ssh.as_str(), h.ips.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("10.0.0.1", strings(&["10.0.0.1"])),
                ("10.0.0.1", strings(&["10.0.0.1"])),
                ("mac-b", vec![]),
                ("mac-b", vec![]),
                ("::1", strings(&["::1"])),
                ("::1", strings(&["::1"])),
            ]
        );
        assert!(is_ip("fe80::1%en0") && !is_ip("localhost") && !is_ip("1.2.3"));
        assert_eq!(
            HostList::from_list("a,,b", 1).unwrap_err().0,
            "Hostname cannot be empty"
        );
        assert_eq!(
            HostList::from_list("", 1).unwrap_err().0,
            "Hostname cannot be empty"
        );
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
    fn the_local_ring_hostfile_is_mlx_launchs_and_nuvec_reads_it() {
        let p = plan_of(&["-n", "4", "x"]).unwrap();
        assert_eq!(
            p.file_bytes(),
            "[[\"127.0.0.1:32323\"], [\"127.0.0.1:32324\"], [\"127.0.0.1:32325\"], \
             [\"127.0.0.1:32326\"]]\n"
        );
        let nodes = crate::config::hostfile::parse(&p.file_bytes(), "planned").unwrap();
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
            // What `jaccl::Config::validate` checks of the coordinator (nuvec's reader takes
            // no zones; bracketed, a zoned address is at least read as one address).
            if !ip.contains('%') {
                assert!(
                    crate::config::hostfile::split_address(coordinator).is_ok(),
                    "{coordinator}"
                );
                let read =
                    crate::config::hostfile::resolve(coordinator).expect("the ranks read it");
                assert_eq!(read[0].port(), 5555, "{coordinator}");
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
    fn only_a_plain_mktemp_path_is_taken_for_a_remote_ranks_pid_file() {
        for ok in [
            "/tmp/tmp.Ab12cD",
            "/var/folders/x_/a-b+c/T/tmp.XyZ09",
            " /tmp/tmp.q \r\n",
        ] {
            assert_eq!(pidfile_path(ok), Some(ok.trim()), "{ok:?}");
        }
        for bad in [
            "conda: /tmp/victim activated",
            "Welcome to Ubuntu",
            "tmp/tmp.abc",
            "/etc/motd",
            "/tmp/tmp.",
            "/tmp/tmp.a b",
            "/tmp/../etc/tmp.abc",
            "/tmp//tmp.abc",
            "/tmp/tmp.abc;rm",
            "/tmp/$(x)/tmp.abc",
            "",
        ] {
            assert_eq!(pidfile_path(bad), None, "{bad:?}");
        }
        assert_eq!(pidfile_path(&format!("/{}/tmp.a", "d".repeat(5000))), None);
        // A path that needs quoting would be quoted in the kill script.
        assert!(kill_script("/tmp/a b").contains("rm '/tmp/a b'"));
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
    fn host_files_that_mlx_would_misread_are_refused() {
        let e = |t: &str| HostList::parse(t, "h.json").unwrap_err().0;
        assert!(e("{").starts_with("Failed to parse hostfile h.json ("));
        assert_eq!(
            e(r#"{"backend": "ring"}"#),
            "Failed to parse hostfile h.json ('hosts')"
        );
        assert_eq!(
            e(r#"[{"ips": []}]"#),
            "Failed to parse hostfile h.json ('ssh')"
        );
        assert!(e(r#"[{"ssh": "a", "ips": "1.2.3.4"}]"#).contains("\"ips\" must be a list"));
        assert!(e(r#"[{"ssh": "a", "rdma": [1]}]"#).contains("\"rdma\"[0]"));
        assert!(e(r#"{"envs": "A=1", "hosts": []}"#).contains("\"envs\""));
        assert!(e("3").contains("expected a list of hosts"));
        assert_eq!(
            HostList::from_file(Path::new("/nonexistent/h.json"))
                .unwrap_err()
                .0,
            "Hostfile /nonexistent/h.json doesn't exist"
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

    #[test]
    fn shell_quoting_is_pythons_shlex() {
        assert_eq!(shell_quote(""), "''");
        assert_eq!(
            shell_quote("a-b_c/d.e:f,g=h+i@j%k"),
            "a-b_c/d.e:f,g=h+i@j%k"
        );
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\"'\"'s'");
        assert_eq!(shell_quote("é"), "'é'");
        assert_eq!(
            shell_join(&strings(&["sh", "-c", "echo $X"])),
            "sh -c 'echo $X'"
        );
    }

    /// The expected strings were produced by `mlx.launch` 0.32.4's own
    /// `RemoteProcess.make_launch_script` (run from `/tmp`) and `shlex.quote`.
    #[test]
    fn the_remote_script_and_ssh_command_are_mlx_launchs() {
        let args = run(&[
            "--env",
            "FOO=bar",
            "--env",
            "A=it's",
            "--env",
            "bad-key=1",
            "--env",
            "EMPTY",
            "--env",
            "COLUMNS=80",
            "-n",
            "2",
            "--",
            "python3",
            "train.py",
            "--lr",
            "1e-3",
            "a b",
            "",
        ]);
        let mut p = plan(
            &args,
            HostList::from_list("10.0.0.1,10.0.0.2", 1).unwrap(),
            (0, 0),
        )
        .unwrap();
        p.file_content = r#"[["10.0.0.1:32323"], ["10.0.0.2:32324"]]"#.to_owned();
        let script = launch_script(&p, 2, "/tmp", false);
        assert_eq!(
            script,
            "stty -echo; pidfile=$(mktemp); echo $$ > $pidfile; printf \"%s\\n\" $pidfile; \
             if [[ -d /tmp ]]; then   cd /tmp; fi; export FOO=bar; export A='it'\"'\"'s'; \
             export EMPTY=; export COLUMNS=80; fname=$(mktemp); \
             echo '[[\"10.0.0.1:32323\"], [\"10.0.0.2:32324\"]]' >$fname; \
             export MLX_HOSTFILE=$fname; export MLX_RANK=2; \
             cmd=(python3 train.py --lr 1e-3 'a b' ''); exec \"${cmd[@]}\""
        );
        let ssh = ssh_command("mac-2.local", &script);
        assert_eq!(
            ssh[..5],
            strings(&["ssh", "-tt", "-o", "LogLevel=QUIET", "mac-2.local"])
        );
        assert_eq!(ssh[5], script);
        assert_eq!(
            shell_join(&ssh),
            r#"ssh -tt -o LogLevel=QUIET mac-2.local 'stty -echo; pidfile=$(mktemp); echo $$ > $pidfile; printf "%s\n" $pidfile; if [[ -d /tmp ]]; then   cd /tmp; fi; export FOO=bar; export A='"'"'it'"'"'"'"'"'"'"'"'s'"'"'; export EMPTY=; export COLUMNS=80; fname=$(mktemp); echo '"'"'[["10.0.0.1:32323"], ["10.0.0.2:32324"]]'"'"' >$fname; export MLX_HOSTFILE=$fname; export MLX_RANK=2; cmd=(python3 train.py --lr 1e-3 '"'"'a b'"'"' '"'"''"'"'); exec "${cmd[@]}"'"#
        );
    }

    #[test]
    fn the_jaccl_remote_script_with_cwd_and_python_is_mlx_launchs() {
        let hf = r#"[{"ssh": "m1", "ips": ["10.0.0.1"], "rdma": [null, "rdma_en2"]},
                     {"ssh": "m2", "ips": ["10.0.0.2"], "rdma": ["rdma_en2", null]}]"#;
        let p = plan_with(
            &[
                "--backend",
                "jaccl-ring",
                "--cwd",
                "/Users/me/my proj",
                "--python",
                "/usr/bin/python3",
                "train.py",
            ],
            hf,
        )
        .unwrap();
        assert_eq!(
            launch_script(&p, 0, "/ignored", false),
            "stty -echo; pidfile=$(mktemp); echo $$ > $pidfile; printf \"%s\\n\" $pidfile; \
             if [[ -d '/Users/me/my proj' ]]; then   cd '/Users/me/my proj'; else  echo \
             'Failed to change directory to' '/Users/me/my proj' >&2; fi; \
             export MLX_JACCL_COORDINATOR=10.0.0.1:32323; export MLX_JACCL_RING=1; \
             fname=$(mktemp); echo '[[null, \"rdma_en2\"], [\"rdma_en2\", null]]' >$fname; \
             export MLX_IBV_DEVICES=$fname; export MLX_RANK=0; \
             cmd=(/usr/bin/python3 train.py); exec \"${cmd[@]}\""
        );
        let local = launch_script(&p, 1, "/x", true);
        assert!(local.starts_with("pidfile=$(mktemp); "), "{local}");
    }

    #[test]
    fn the_kill_script_is_mlx_launchs() {
        assert_eq!(
            kill_script("/tmp/tmp.abc"),
            "pid=$(cat /tmp/tmp.abc); if ps -p $pid >/dev/null; then     kill $pid;     echo 1; \
             else     echo 0; fi; rm /tmp/tmp.abc"
        );
        assert_eq!(kill_command("h", "/p")[..2], strings(&["ssh", "h"]));
    }
}
