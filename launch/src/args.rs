//! The command line: `mlx.launch`'s options (names, defaults, help), parsed with `clap`.
//!
//! The options are `mlx.launch` 0.32.4's, less those of the backends `nuvec-launch` does not
//! start (`--mpi-arg`, `--nccl-port`, `--print-python`), plus `--wire` (this crate's choice of
//! the ring's wire, as `NUVEC_DISTRIBUTED_WIRE`). As with `argparse`, long options may
//! be abbreviated to a unique prefix (`--conn 2`), take their value as the next argument or
//! after `=`, and `-n`/`-p` also take it attached (`-n4`); the command starts at the first
//! argument that is not an option (or after `--`), and everything from there on is the
//! command's, even arguments that look like options.
//!
//! A repeated option takes its last value (`argparse`'s `store`), `--env` collects them all.
//!
//! Errors are `clap`'s (`error: ...`, a tip where it has one, the usage line for a mistake of
//! the command line's shape, `For more information, try '--help'.`), prefixed with the
//! program's name as `argparse` prefixes them (`nuvec-launch: error: ...`); the exit status
//! is 2, as `mlx.launch`'s (`argparse`'s `parser.error`). The mistakes found after
//! parsing (the host file, the plan: [`UsageError`], whose messages are `mlx.launch`'s) are
//! printed the same way ([`to_clap`], [`exit_code`]). `-h`/`--help` prints the help on
//! standard output and exits 0. What differs from `mlx.launch`: the wording of the
//! command-line errors is `clap`'s (`unexpected argument '--x' found` for `argparse`'s
//! `unrecognized arguments`), the help starts with `Usage:`, and an unknown option before the
//! command is an error where `mlx.launch` (`parse_known_args`) would run it as the command.

use std::ffi::OsString;
use std::fmt;
use std::io::IsTerminal;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

/// `mlx.launch`'s default `--starting-port`.
pub(crate) const DEFAULT_STARTING_PORT: i64 = 32323;

/// A configuration mistake found after parsing (host file, hosts, plan): reported as a usage
/// error, exit status 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UsageError(pub(crate) String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A [`UsageError`] with message `what`.
pub(crate) fn usage_error(what: impl Into<String>) -> UsageError {
    UsageError(what.into())
}

/// The parsed command line.
#[derive(Clone, Debug, PartialEq, Eq, Parser)]
#[command(
    name = "nuvec-launch",
    about = "Launch an MLX distributed program (ring or JACCL backend), as mlx.launch does",
    override_usage = "nuvec-launch [OPTIONS] [--] COMMAND [ARG]...",
    help_template = "{usage-heading} {usage}\n\n{about-with-newline}\n{all-args}{after-help}",
    infer_long_args = true,
    args_override_self = true,
    after_help = "\
Ranks whose host is 127.0.0.1 or localhost are started directly, the others with
`ssh -tt HOST SCRIPT` as mlx.launch does. Each line a rank prints is prefixed with
\"[rank R] \"; standard input is sent to every rank. When a rank fails the others are
stopped (SIGTERM, then SIGKILL after 5 s; a remote rank gets SIGTERM through its PID file,
as mlx.launch sends it, SIGHUP as its ssh session ends, and SIGKILL on its host 5 s after
the SIGTERM if it is still running), nuvec-launch names the first
rank to fail (by time) with its last lines and the ranks' flight records, and exits with its
status (128+N for signal N); 0 when every rank succeeds. The first Ctrl-C prints where every rank is (its
flight record); the second stops the job. Usage errors exit with 2.

`nuvec-launch diagnose [--json] DIR` merges the records of a job (rank-R.jsonl files, as
--dump-records keeps them, or as ranks started by mlx.launch write them to
NUVEC_DISTRIBUTED_RECORD_DIR).

`nuvec-launch config` plans a cluster's Thunderbolt cabling and writes its host file, as
mlx.distributed_config does (`nuvec-launch config --help`); `nuvec-launch doctor` checks each
host against a host file, measures every link of the job's topology, latency, bandwidth
each way and the interface it goes over, then runs an all_sum sweep of the whole job with the
slowest link named (`nuvec-launch doctor --help`)."
)]
pub(crate) struct Args {
    /// Print debug messages (what is launched, each rank's end) on stderr, and set
    /// MLX_RING_VERBOSE=1 (ring backend)
    #[arg(long)]
    pub(crate) verbose: bool,
    /// A comma separated list of hosts; an entry that is an IP address is also the address
    /// the ring listens on
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) hosts: String,
    /// Repeat each host a given number of times
    #[arg(
        short = 'n',
        long,
        value_name = "N",
        default_value = "1",
        allow_negative_numbers = true,
        value_parser = positive_number
    )]
    pub(crate) repeat_hosts: usize,
    /// The file containing the hosts (MLX's JSON host file, used instead of --hosts): a list
    /// of hosts {"ssh", "ips", "rdma"}, or {"backend", "envs", "hosts"}
    #[arg(long)]
    pub(crate) hostfile: Option<PathBuf>,
    /// Which distributed backend to launch: ring, jaccl or jaccl-ring [default: the host
    /// file's backend, else ring]
    #[arg(long)]
    pub(crate) backend: Option<String>,
    /// Set environment variables for the jobs (repeatable)
    #[arg(long, value_name = "KEY=VALUE")]
    pub(crate) env: Vec<String>,
    /// How many connections per ip to use for the ring backend
    #[arg(
        long,
        value_name = "N",
        default_value = "1",
        allow_negative_numbers = true,
        value_parser = integer
    )]
    pub(crate) connections_per_ip: i64,
    /// For the ring backend listen on this port increasing by 1 per rank and IP; for JACCL,
    /// the coordinator's port on rank 0's first IP
    #[arg(
        short = 'p',
        long,
        value_name = "PORT",
        default_value_t = DEFAULT_STARTING_PORT,
        allow_negative_numbers = true,
        value_parser = integer
    )]
    pub(crate) starting_port: i64,
    /// Set the working directory on each node to the provided one [default: the current
    /// one, where it exists]
    #[arg(long)]
    pub(crate) cwd: Option<String>,
    /// Which wire the ring's ranks may speak (sets NUVEC_DISTRIBUTED_WIRE for every rank):
    /// auto (the nuvec wire when every rank is nuvec-distributed, MLX's otherwise), mlx (MLX's
    /// wire on every link), nuvec (the nuvec wire, or no group) [default: unset, which is
    /// auto]; Python MLX ranks ignore it
    #[arg(long, value_name = "WIRE", value_parser = ["auto", "mlx", "nuvec"])]
    pub(crate) wire: Option<String>,
    /// Launch the command with this python interpreter
    #[arg(long)]
    pub(crate) python: Option<String>,
    /// Keep the ranks' flight records (rank-R.jsonl) in this directory, rather than in a
    /// temporary one removed at the end (an earlier job's records there are removed first);
    /// read them with `nuvec-launch diagnose DIR`
    #[arg(long, value_name = "DIR")]
    pub(crate) dump_records: Option<PathBuf>,
    /// When no rank has completed an operation for this many seconds, ask the ranks for
    /// their records and print where each one is (as the first Ctrl-C does); the progress of
    /// ranks on other hosts is fetched over ssh before a job is called stalled
    #[arg(long, value_name = "S", value_parser = seconds)]
    pub(crate) hang_report: Option<std::time::Duration>,
    /// The command each rank runs, and its arguments
    #[arg(value_name = "COMMAND", trailing_var_arg = true)]
    pub(crate) command: Vec<String>,
}

/// `nuvec-launch diagnose [--json] DIR`: the flight recorder's files of a job, merged.
#[derive(Clone, Debug, PartialEq, Eq, Parser)]
#[command(
    name = "nuvec-launch diagnose",
    about = "Merge the flight recorder's files of a job (rank-R.jsonl, written by the ranks to \
             NUVEC_DISTRIBUTED_RECORD_DIR) into one table, a row per rank, and say where the \
             ranks disagree, which is behind, which is gone and which failed first"
)]
pub(crate) struct DiagnoseArgs {
    /// Print the table and the findings as one JSON object, for scripts
    #[arg(long)]
    pub(crate) json: bool,
    /// The directory holding the rank-R.jsonl files
    #[arg(value_name = "DIR")]
    pub(crate) dir: PathBuf,
}

/// Parses `diagnose`'s arguments (`argv[0]` is `diagnose`).
///
/// # Errors
///
/// `clap`'s, as for [`parse`].
pub(crate) fn parse_diagnose<I, T>(argv: I) -> Result<DiagnoseArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    DiagnoseArgs::try_parse_from(argv)
}

/// A positive number of seconds.
fn seconds(value: &str) -> Result<std::time::Duration, String> {
    match value.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(std::time::Duration::from_secs_f64(s)),
        _ => Err(format!("{value:?} is not a positive number of seconds")),
    }
}

/// Python's `int()` on a command-line value.
fn integer(value: &str) -> Result<i64, String> {
    value
        .trim()
        .parse::<i64>()
        .map_err(|_| format!("invalid int value: {value:?}"))
}

/// `mlx.launch`'s `positive_number`, bounded by what a rank count can be.
fn positive_number(value: &str) -> Result<usize, String> {
    let n = integer(value)?;
    if n <= 0 {
        return Err(format!("{value:?} is not a positive number"));
    }
    usize::try_from(n).map_err(|_| format!("{value:?} is too large"))
}

/// Parses the arguments, the program name first.
///
/// # Errors
///
/// `clap`'s error for `--help` (kind `DisplayHelp`, printed with exit status 0), an unknown
/// or ambiguous option, a missing or invalid value, a non-UTF-8 argument; and `mlx.launch`'s
/// `No script is provided` when there is no command.
pub(crate) fn parse<I, T>(argv: I) -> Result<Args, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = Args::try_parse_from(argv)?;
    if args.command.is_empty() {
        return Err(
            Args::command().error(ErrorKind::MissingRequiredArgument, "No script is provided")
        );
    }
    Ok(args)
}

/// A mistake found after parsing, as a `clap` error (so that it prints as the others do).
pub(crate) fn to_clap(e: &UsageError) -> clap::Error {
    Args::command().error(ErrorKind::ValueValidation, &e.0)
}

/// Prints `e` (help on standard output, errors on standard error, prefixed
/// `nuvec-launch: `, coloured when standard error is a terminal) and returns the exit status:
/// 0 for `--help`, 2 for a usage error.
pub(crate) fn exit_code(e: &clap::Error) -> i32 {
    if !e.use_stderr() {
        print!("{}", e.render());
        return 0;
    }
    let rendered = e.render();
    let text = if std::io::stderr().is_terminal() {
        rendered.ansi().to_string()
    } else {
        rendered.to_string()
    };
    eprint!("nuvec-launch: {text}");
    2
}

/// The text [`exit_code`] prints for `e` to a pipe.
#[cfg(test)]
pub(crate) fn message(e: &clap::Error) -> String {
    format!("nuvec-launch: {}", e.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(argv: &[&str]) -> Args {
        let full = std::iter::once("nuvec-launch").chain(argv.iter().copied());
        match parse(full) {
            Ok(a) => a,
            Err(e) => panic!("{argv:?}: {e}"),
        }
    }

    fn err(argv: &[&str]) -> clap::Error {
        let full = std::iter::once("nuvec-launch").chain(argv.iter().copied());
        match parse(full) {
            Err(e) => e,
            Ok(a) => panic!("{argv:?}: expected an error, got {a:?}"),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Args::command().debug_assert();
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
            "-h",
        ]);
        assert!(!a.verbose);
        assert_eq!(a.starting_port, 32323);
        assert_eq!(
            a.command,
            strings(&["python", "train.py", "--verbose", "--", "-p", "1", "-h"])
        );
    }

    #[test]
    fn help_wins_wherever_it_is_before_the_command() {
        for argv in [&["-h"][..], &["-n", "2", "--help", "x"], &["--he"]] {
            let e = err(argv);
            assert_eq!(e.kind(), ErrorKind::DisplayHelp, "{argv:?}");
            let help = e.render().to_string();
            assert!(
                help.starts_with("Usage: nuvec-launch [OPTIONS] [--] COMMAND"),
                "{help}"
            );
            for option in [
                "--verbose",
                "--hosts <HOSTS>",
                "-n, --repeat-hosts <N>",
                "--hostfile <HOSTFILE>",
                "--backend <BACKEND>",
                "--env <KEY=VALUE>",
                "--connections-per-ip <N>",
                "-p, --starting-port <PORT>",
                "--cwd <CWD>",
                "--python <PYTHON>",
                "[default: 32323]",
                "Usage errors exit with 2.",
            ] {
                assert!(help.contains(option), "{option}: {help}");
            }
        }
    }

    #[test]
    fn bad_command_lines_are_usage_errors_in_one_layout() {
        let says = |argv: &[&str], what: &str| {
            let e = err(argv);
            assert_ne!(e.kind(), ErrorKind::DisplayHelp, "{argv:?}");
            let text = message(&e);
            assert!(
                text.starts_with("nuvec-launch: error: "),
                "{argv:?}: {text}"
            );
            assert!(text.contains(what), "{argv:?}: {what:?} not in {text}");
            assert!(
                text.contains("For more information, try '--help'."),
                "{argv:?}: {text}"
            );
        };
        says(&[], "No script is provided");
        says(&["-n", "2"], "No script is provided");
        says(&["--"], "No script is provided");
        says(&["-n", "0", "x"], "\"0\" is not a positive number");
        says(&["-n", "-1", "x"], "\"-1\" is not a positive number");
        says(&["-n", "two", "x"], "invalid int value: \"two\"");
        says(&["-p", "7e3", "x"], "invalid int value: \"7e3\"");
        says(&["--hosts"], "a value is required for '--hosts <HOSTS>'");
        says(&["--frobnicate", "x"], "unexpected argument '--frobnicate'");
        says(&["-x", "y"], "unexpected argument '-x'");
        says(&["--host", "a", "x"], "unexpected argument '--host'");
        says(
            &["--verbose=1", "x"],
            "unexpected value '1' for '--verbose'",
        );
        let later = message(&to_clap(&usage_error("Hostname cannot be empty")));
        assert!(
            later.starts_with("nuvec-launch: error: Hostname cannot be empty\n"),
            "{later}"
        );
    }

    #[test]
    fn a_non_utf8_argument_is_refused() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![b'x', 0xff]);
        let argv = [OsString::from("nuvec-launch"), "-n".into(), "2".into(), bad];
        let e = parse(argv).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUtf8);
    }
}
