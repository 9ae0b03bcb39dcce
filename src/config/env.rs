//! The launch environment: MLX's ring variables and this crate's own.
//!
//! | Variable | Meaning |
//! | --- | --- |
//! | `MLX_HOSTFILE` | path of the ring hostfile (see [`crate::config::hostfile`]) |
//! | `MLX_RANK` | this process's rank, a non-negative integer below the hostfile's size |
//! | `MLX_RING_VERBOSE` | present (any value): log at least at `info` |
//! | `NUVEC_DISTRIBUTED_TIMEOUT` | the backstop of every operation, non-negative finite seconds (default 600), `0`: none |
//! | `NUVEC_DISTRIBUTED_LINK_TIMEOUT` | how long a link may go silent (no acknowledgement, no keepalive answer) before the operation fails, 1 to 3600 seconds (default 15) |
//! | `NUVEC_DISTRIBUTED_WARN_AFTER` | how long an operation waits before it warns (then again at that interval), non-negative seconds (default 30), `0`: never |
//! | `NUVEC_DISTRIBUTED_KEY` | shared key, at least 16 bytes (never printed) |
//! | `NUVEC_DISTRIBUTED_LOG` | `off`, `error`, `warn`, `info` or `debug` (any case) |
//! | `NUVEC_DISTRIBUTED_SPIN_US` | a fixed time a waiting step looks before it parks, 0 to 1 000 000 µs (unset: it adapts) |
//! | `NUVEC_DISTRIBUTED_LOCAL_LINKS` | `1` (the default) or `0`: whether ring links between ranks on one machine may use shared memory |
//! | `NUVEC_DISTRIBUTED_TCP_CONGESTION` | the TCP congestion control of the ring's connections, a name the kernel allows (`cubic`, `reno`, `bbr`…; Linux only; unset: the host's; see [`Options::tcp_congestion`](crate::Options::tcp_congestion)) |
//! | `NUVEC_DISTRIBUTED_WIRE` | `auto` (the default), `mlx` or `nuvec` (any case): which wire the ring may speak (see [`WireChoice`](crate::WireChoice)) |
//! | `NUVEC_DISTRIBUTED_RECORD` | how many operations each group's flight recorder keeps, 0 to 1 000 000 (default 256), `0`: none |
//! | `NUVEC_DISTRIBUTED_RECORD_DIR` | a directory where a rank writes its flight record (on a failure, and when asked; see `collective::record`), made if missing while the recorder keeps operations (with `NUVEC_DISTRIBUTED_RECORD=0` nothing is written there, and the variable is not read) |
//! | `JACCL_PROGRESS_TIMEOUT_S` / `MLX_JACCL_PROGRESS_TIMEOUT_S` | JACCL: the longest a wait may go without progress, non-negative seconds, 0 off (`JACCL_*` wins) |
//!
//! Values are read through an injectable lookup ([`Env::from_fn`]) so tests never touch the
//! process environment. Unlike MLX (which reads `MLX_RANK` with `atoi`), every value is checked,
//! and a wrong one is a [`ConfigError`] naming the variable, the value (except for the key)
//! and what is wrong.
//!
//! Over 700 lines because it is the one reader of every variable the crate knows: the table of
//! names, their parsers and the tests of every bad value stay together, so that no variable is
//! read or checked anywhere else.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::error::{ConfigError, FileKind, RankProblem};
use crate::config::options::WireChoice;

/// The path of the ring hostfile.
pub(crate) const MLX_HOSTFILE: &str = "MLX_HOSTFILE";
/// This process's rank.
pub(crate) const MLX_RANK: &str = "MLX_RANK";
/// Verbose ring logging when present.
pub(crate) const MLX_RING_VERBOSE: &str = "MLX_RING_VERBOSE";
/// The per-operation timeout (the backstop) in seconds, 0 for none.
pub(crate) const TIMEOUT: &str = "NUVEC_DISTRIBUTED_TIMEOUT";
/// How long a link may go silent before the operation fails, in seconds.
pub(crate) const LINK_TIMEOUT: &str = "NUVEC_DISTRIBUTED_LINK_TIMEOUT";
/// How long an operation waits before it warns, in seconds, 0 for never.
pub(crate) const WARN_AFTER: &str = "NUVEC_DISTRIBUTED_WARN_AFTER";
/// The shared key.
#[allow(
    dead_code,
    reason = "the shared key is read once the handshake that uses it exists"
)]
pub(crate) const KEY: &str = "NUVEC_DISTRIBUTED_KEY";
/// The log level.
pub(crate) const LOG: &str = "NUVEC_DISTRIBUTED_LOG";
/// How long a TCP step keeps looking before it parks, in microseconds.
pub(crate) const SPIN: &str = "NUVEC_DISTRIBUTED_SPIN_US";
/// Whether ring links between ranks on one machine may be local (shared memory).
pub(crate) const LOCAL_LINKS: &str = "NUVEC_DISTRIBUTED_LOCAL_LINKS";
/// Which wire the ring may speak: `auto`, `mlx` or `nuvec`.
pub(crate) const WIRE: &str = "NUVEC_DISTRIBUTED_WIRE";
/// The TCP congestion control of the ring's connections.
pub(crate) const TCP_CONGESTION: &str = "NUVEC_DISTRIBUTED_TCP_CONGESTION";
/// How many operations a flight recorder keeps.
pub(crate) const RECORD: &str = "NUVEC_DISTRIBUTED_RECORD";
/// Where a rank writes its flight record.
pub(crate) const RECORD_DIR: &str = "NUVEC_DISTRIBUTED_RECORD_DIR";
/// The flight recorder's default capacity, in operations.
pub(crate) const DEFAULT_RECORD: usize = 256;
/// The largest capacity `NUVEC_DISTRIBUTED_RECORD` takes.
const MAX_RECORD: usize = 1_000_000;
/// Which fabric carries JACCL: `rdma` (the default) or `tcp` (one connection per cable).
pub(crate) const JACCL_FABRIC: &str = "NUVEC_JACCL_FABRIC";
/// JACCL's frame rule: `small` (the default, macOS 26.2) or `large` (macOS 26.3 and later).
pub(crate) const JACCL_FRAMES: &str = "NUVEC_JACCL_FRAMES";

/// JACCL's progress timeout in seconds, by the names of MLX's PR #4530 (the first set wins).
pub(crate) const JACCL_PROGRESS_TIMEOUT: [&str; 2] =
    ["JACCL_PROGRESS_TIMEOUT_S", "MLX_JACCL_PROGRESS_TIMEOUT_S"];

/// The shortest key accepted, in bytes.
#[allow(
    dead_code,
    reason = "the shared key is read once the handshake that uses it exists"
)]
pub(crate) const MIN_KEY_BYTES: usize = 16;

/// A source of environment variables.
///
/// The lookup returns the raw value (`OsString`), so that the process environment is read
/// losslessly: a path may be any bytes, and a value that must be text but is not UTF-8 is an
/// error naming the variable rather than silently replaced.
#[derive(Clone, Copy)]
pub(crate) struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<OsString>,
}

fn process_lookup(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// MLX's ring configuration: `MLX_HOSTFILE`, `MLX_RANK` and `MLX_RING_VERBOSE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RingEnv {
    /// The hostfile's path (`MLX_HOSTFILE`).
    pub(crate) hostfile: PathBuf,
    /// This process's rank (`MLX_RANK`); not yet checked against the hostfile's size.
    pub(crate) rank: usize,
    /// Whether `MLX_RING_VERBOSE` is present, whatever its value.
    pub(crate) verbose: bool,
}

/// How much is logged to standard error, from least to most.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum LogLevel {
    /// Nothing.
    #[default]
    Off,
    /// Failures.
    Error,
    /// Failures and suspicious conditions.
    Warn,
    /// Connection progress (MLX's `MLX_RING_VERBOSE`).
    Info,
    /// Details.
    Debug,
}

impl<'a> Env<'a> {
    /// The process environment (`std::env::var_os`).
    pub(crate) fn process() -> Env<'static> {
        Env {
            lookup: &process_lookup,
        }
    }

    /// An environment read through `lookup` (a variable is unset when it returns `None`).
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "the injectable lookup is for tests")
    )]
    pub(crate) fn from_fn(lookup: &'a dyn Fn(&str) -> Option<OsString>) -> Self {
        Env { lookup }
    }

    /// The raw value of `name`, if set.
    pub(crate) fn raw(&self, name: &str) -> Option<OsString> {
        (self.lookup)(name)
    }

    fn present(&self, name: &str) -> bool {
        self.raw(name).is_some()
    }

    /// The value of `name` as text; not UTF-8 is an error that shows the value escaped.
    pub(crate) fn text(&self, name: &str) -> Result<Option<String>, ConfigError> {
        self.raw(name)
            .map(|v| {
                v.into_string().map_err(|value| ConfigError::NotUtf8 {
                    var: name.to_owned(),
                    value,
                    expected: None,
                })
            })
            .transpose()
    }

    /// MLX's ring configuration, or `None` when neither `MLX_HOSTFILE` nor `MLX_RANK` is set.
    ///
    /// Errors when only one of them is set, when `MLX_HOSTFILE` is empty, or when `MLX_RANK` is
    /// not a non-negative decimal integer. The rank is checked against the hostfile's size by
    /// [`check_rank`] once the file is read.
    pub(crate) fn ring(&self) -> Result<Option<RingEnv>, ConfigError> {
        let hostfile = self.raw(MLX_HOSTFILE);
        let rank = self.raw(MLX_RANK);
        let verbose = self.present(MLX_RING_VERBOSE);
        let (hostfile, rank) = match (hostfile, rank) {
            (None, None) => return Ok(None),
            (Some(h), None) => {
                return Err(ConfigError::MissingVariable {
                    set: MLX_HOSTFILE.into(),
                    shown: Path::new(&h).display().to_string(),
                    missing: vec![MLX_RANK.into()],
                    hint: format!(
                        "set {MLX_RANK} to this process's rank (0 to the number of ranks in the \
                         hostfile minus 1)"
                    ),
                });
            }
            (None, Some(r)) => {
                return Err(ConfigError::MissingVariable {
                    set: MLX_RANK.into(),
                    shown: format!("{r:?}"),
                    missing: vec![MLX_HOSTFILE.into()],
                    hint: format!("set {MLX_HOSTFILE} to the path of the ring hostfile"),
                });
            }
            (Some(h), Some(r)) => (h, r),
        };
        if hostfile.is_empty() {
            return Err(ConfigError::EmptyVariable {
                var: MLX_HOSTFILE.into(),
                expected: "the path of the ring hostfile".into(),
            });
        }
        let rank = parse_rank(&rank)?;
        Ok(Some(RingEnv {
            hostfile: PathBuf::from(hostfile),
            rank,
            verbose,
        }))
    }

    /// Whether JACCL's device file variable is set (a JACCL launch, not a ring one).
    pub(crate) fn jaccl_launch(&self) -> bool {
        self.present("JACCL_IBV_DEVICES") || self.present("MLX_IBV_DEVICES")
    }

    /// Whether the ring's hostfile variable is set.
    pub(crate) fn ring_launch(&self) -> bool {
        self.present(MLX_HOSTFILE)
    }

    /// The per-operation timeout from `NUVEC_DISTRIBUTED_TIMEOUT` (seconds), `None` if unset;
    /// `Some(Duration::ZERO)` for `0`: no operation timeout (liveness still bounds every wait).
    ///
    /// The value must be a non-negative finite decimal number of seconds (`"30"`, `"2.5"`,
    /// `"1e-3"`, `"0"`), zero or at least one nanosecond, and small enough for a `Duration`.
    pub(crate) fn timeout(&self) -> Result<Option<Duration>, ConfigError> {
        let Some(v) = self.text(TIMEOUT)? else {
            return Ok(None);
        };
        let bad = |what: &str| bad_value(TIMEOUT, &v, what);
        let secs = self.seconds(
            TIMEOUT,
            &v,
            "is not a number of seconds (e.g. \"30\" or \"2.5\"; 0: no timeout)",
        )?;
        let d = Duration::try_from_secs_f64(secs).map_err(|_| bad("is too large for a timeout"))?;
        if d.is_zero() && secs > 0.0 {
            return Err(bad("is below one nanosecond (0: no timeout)"));
        }
        Ok(Some(d))
    }

    /// `value` of variable `name` as a non-negative finite number of seconds (`not_number`
    /// says what is wrong when it is not a number at all).
    fn seconds(&self, name: &str, value: &str, not_number: &str) -> Result<f64, ConfigError> {
        let bad = |what: &str| bad_value(name, value, what);
        let secs: f64 = value.trim().parse().map_err(|_| bad(not_number))?;
        if !secs.is_finite() {
            return Err(bad("must be a finite number of seconds"));
        }
        if secs < 0.0 || secs.is_sign_negative() {
            return Err(bad("must not be negative"));
        }
        Ok(secs)
    }

    /// How long a link may go silent, from `NUVEC_DISTRIBUTED_LINK_TIMEOUT` (seconds), `None`
    /// if unset: between 1 s (the kernel counts keepalive in whole seconds) and an hour.
    pub(crate) fn link_timeout(&self) -> Result<Option<Duration>, ConfigError> {
        let Some(v) = self.text(LINK_TIMEOUT)? else {
            return Ok(None);
        };
        let secs = self.seconds(
            LINK_TIMEOUT,
            &v,
            "is not a number of seconds (e.g. \"15\" or \"2.5\")",
        )?;
        let range = crate::config::options::LINK_TIMEOUT_RANGE;
        let d = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
        if !range.contains(&d) {
            return Err(bad_value(
                LINK_TIMEOUT,
                &v,
                &format!(
                    "is outside {} to {} seconds",
                    range.start().as_secs(),
                    range.end().as_secs()
                ),
            ));
        }
        Ok(Some(d))
    }

    /// How long an operation waits before it warns, from `NUVEC_DISTRIBUTED_WARN_AFTER`
    /// (seconds): `None` if unset, `Some(None)` for `0` (never warn).
    pub(crate) fn warn_after(&self) -> Result<Option<Option<Duration>>, ConfigError> {
        let Some(v) = self.text(WARN_AFTER)? else {
            return Ok(None);
        };
        let secs = self.seconds(
            WARN_AFTER,
            &v,
            "is not a number of seconds (e.g. \"30\" or \"0.5\"; 0: never warn)",
        )?;
        let d = Duration::try_from_secs_f64(secs)
            .map_err(|_| bad_value(WARN_AFTER, &v, "is too large for an interval"))?;
        if d.is_zero() && secs > 0.0 {
            // Not 0 as written, so not "never": refused rather than read as it.
            return Err(bad_value(
                WARN_AFTER,
                &v,
                "is below one nanosecond (0: never warn)",
            ));
        }
        Ok(Some((!d.is_zero()).then_some(d)))
    }

    /// JACCL's progress timeout from `JACCL_PROGRESS_TIMEOUT_S` or else
    /// `MLX_JACCL_PROGRESS_TIMEOUT_S` (seconds): `None` when unset or 0 (off: only the
    /// operation's deadline bounds a wait).
    ///
    /// The value must be a non-negative finite decimal number of seconds (`"5"`, `"0.5"`).
    pub(crate) fn jaccl_progress_timeout(&self) -> Result<Option<Duration>, ConfigError> {
        let mut found = None;
        for name in JACCL_PROGRESS_TIMEOUT {
            if let Some(v) = self.text(name)? {
                found = Some((name, v));
                break;
            }
        }
        let Some((name, v)) = found else {
            return Ok(None);
        };
        let bad = |what: &str| bad_value(name, &v, what);
        let secs: f64 = v.trim().parse().map_err(|_| {
            bad("is not a number of seconds (e.g. \"5\" or \"0.5\"; 0 turns it off)")
        })?;
        if !secs.is_finite() {
            return Err(bad("must be a finite number of seconds"));
        }
        if secs < 0.0 {
            return Err(bad("must not be negative (0 turns it off)"));
        }
        let d = Duration::try_from_secs_f64(secs)
            .map_err(|_| bad("is too large for a progress timeout"))?;
        if d.is_zero() && secs > 0.0 {
            // Not 0 as written, so not "off": refused rather than read as it.
            return Err(bad("is below one nanosecond (0 turns it off)"));
        }
        Ok((!d.is_zero()).then_some(d))
    }

    /// Whether links may be local, from `NUVEC_DISTRIBUTED_LOCAL_LINKS` (`1` or `0`), `None` if
    /// unset.
    pub(crate) fn local_links(&self) -> Result<Option<bool>, ConfigError> {
        let Some(v) = self.text(LOCAL_LINKS)? else {
            return Ok(None);
        };
        match v.trim() {
            "1" => Ok(Some(true)),
            "0" => Ok(Some(false)),
            _ => Err(bad_value(
                LOCAL_LINKS,
                &v,
                "is neither 1 (ring links between ranks on one machine may use shared memory) \
                 nor 0 (they stay TCP)",
            )),
        }
    }

    /// How many operations a group's flight recorder keeps, from `NUVEC_DISTRIBUTED_RECORD`
    /// (0 to 1 000 000), `None` if unset.
    pub(crate) fn record(&self) -> Result<Option<usize>, ConfigError> {
        let Some(v) = self.text(RECORD)? else {
            return Ok(None);
        };
        match v.trim().parse::<usize>() {
            Ok(n) if n <= MAX_RECORD => Ok(Some(n)),
            _ => Err(bad_value(
                RECORD,
                &v,
                "is not a number of operations from 0 (no record) to 1000000",
            )),
        }
    }

    /// The directory a rank writes its flight record to, from `NUVEC_DISTRIBUTED_RECORD_DIR`,
    /// `None` if unset or empty, or while the recorder keeps nothing
    /// (`NUVEC_DISTRIBUTED_RECORD=0`: nothing is written, so the directory is neither checked
    /// nor made; a `NUVEC_DISTRIBUTED_RECORD` that is not a number is [`record`](Self::record)'s
    /// to refuse, and here leaves the recorder on). The directory is made (with its parents) if
    /// it does not exist, so that a failure's record is not lost to a directory nobody made: a
    /// path that names something else, or that cannot be made, is refused with the reason.
    pub(crate) fn record_dir(&self) -> Result<Option<PathBuf>, ConfigError> {
        if let Ok(Some(0)) = self.record() {
            return Ok(None);
        }
        let Some(dir) = self
            .raw(RECORD_DIR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
        else {
            return Ok(None);
        };
        let shown = dir.display().to_string();
        if dir.exists() && !dir.is_dir() {
            return Err(bad_value(RECORD_DIR, &shown, "is not a directory"));
        }
        std::fs::create_dir_all(&dir).map_err(|e| {
            bad_value(
                RECORD_DIR,
                &shown,
                &format!("cannot be made a directory: {e}"),
            )
        })?;
        Ok(Some(dir))
    }

    /// Which wire the ring may speak, from `NUVEC_DISTRIBUTED_WIRE` (`auto`, `mlx` or `nuvec`,
    /// any case), `None` if unset.
    pub(crate) fn wire(&self) -> Result<Option<WireChoice>, ConfigError> {
        let Some(v) = self.text(WIRE)? else {
            return Ok(None);
        };
        match v.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Some(WireChoice::Auto)),
            "mlx" => Ok(Some(WireChoice::Mlx)),
            "nuvec" => Ok(Some(WireChoice::Nuvec)),
            _ => Err(bad_value(
                WIRE,
                &v,
                "is not a wire: auto (the nuvec wire where every rank speaks it), mlx (MLX's wire on every link) or nuvec (the nuvec wire, or no group)",
            )),
        }
    }

    /// The TCP congestion control of the ring's connections, from
    /// `NUVEC_DISTRIBUTED_TCP_CONGESTION` (surrounding spaces ignored), `None` if unset.
    pub(crate) fn tcp_congestion(&self) -> Result<Option<String>, ConfigError> {
        let Some(v) = self.text(TCP_CONGESTION)? else {
            return Ok(None);
        };
        let name = v.trim();
        match crate::config::options::congestion_problem(name) {
            Some(problem) => Err(bad_value(TCP_CONGESTION, &v, problem)),
            None => Ok(Some(name.to_owned())),
        }
    }

    /// The fixed spin before parking from `NUVEC_DISTRIBUTED_SPIN_US` (whole microseconds, 0 to
    /// [`MAX_SPIN`](crate::config::options::MAX_SPIN)), `None` if unset.
    pub(crate) fn spin(&self) -> Result<Option<Duration>, ConfigError> {
        let Some(v) = self.text(SPIN)? else {
            return Ok(None);
        };
        let max = crate::config::options::MAX_SPIN.as_micros();
        let micros: u64 = v.parse().map_err(|_| {
            bad_value(
                SPIN,
                &v,
                "is not a whole number of microseconds (e.g. \"100\", or \"0\" to park at once)",
            )
        })?;
        if u128::from(micros) > max {
            return Err(bad_value(
                SPIN,
                &v,
                &format!("is above the limit of {max} microseconds"),
            ));
        }
        Ok(Some(Duration::from_micros(micros)))
    }

    /// The shared key from `NUVEC_DISTRIBUTED_KEY` (its UTF-8 bytes), `None` if unset.
    ///
    /// It must be at least [`MIN_KEY_BYTES`] bytes. Error messages never show the value.
    #[allow(
        dead_code,
        reason = "the shared key is read once the handshake that uses it exists"
    )]
    pub(crate) fn key(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        let Some(v) = self.raw(KEY) else {
            return Ok(None);
        };
        let Ok(v) = v.into_string() else {
            return Err(ConfigError::KeyNotUtf8 { var: KEY.into() });
        };
        if v.len() < MIN_KEY_BYTES {
            return Err(ConfigError::KeyTooShort {
                var: Some(KEY.into()),
                bytes: v.len(),
                min: MIN_KEY_BYTES,
            });
        }
        Ok(Some(v.into_bytes()))
    }

    /// The log level: `NUVEC_DISTRIBUTED_LOG` (`off` if unset), raised to at least
    /// [`LogLevel::Info`] when `MLX_RING_VERBOSE` is present.
    pub(crate) fn log_level(&self) -> Result<LogLevel, ConfigError> {
        let level = match self.text(LOG)? {
            None => LogLevel::Off,
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "off" => LogLevel::Off,
                "error" => LogLevel::Error,
                "warn" => LogLevel::Warn,
                "info" => LogLevel::Info,
                "debug" => LogLevel::Debug,
                _ => {
                    return Err(bad_value(
                        LOG,
                        &v,
                        "is not a log level; expected off, error, warn, info or debug",
                    ));
                }
            },
        };
        if self.present(MLX_RING_VERBOSE) {
            Ok(level.max(LogLevel::Info))
        } else {
            Ok(level)
        }
    }
}

/// A [`ConfigError::BadValue`] of variable `var`.
pub(crate) fn bad_value(var: &str, value: &str, problem: &str) -> ConfigError {
    ConfigError::BadValue {
        var: var.to_owned(),
        value: value.to_owned(),
        problem: problem.to_owned(),
    }
}

/// `MLX_RANK` as a non-negative decimal integer.
fn parse_rank(raw: &OsStr) -> Result<usize, ConfigError> {
    rank_of(MLX_RANK, raw)
}

/// The rank that variable `var` gives as `raw`: a non-negative decimal integer; else a
/// [`ConfigError::BadRank`] saying what is wrong with it (the ring's `MLX_RANK` and JACCL's
/// `JACCL_RANK` / `MLX_RANK` are read by this one rule).
pub(crate) fn rank_of(var: &str, raw: &OsStr) -> Result<usize, ConfigError> {
    let bad = |problem| ConfigError::BadRank {
        var: var.to_owned(),
        value: raw.to_owned(),
        problem,
    };
    let Some(v) = raw.to_str() else {
        return Err(bad(RankProblem::NotUtf8));
    };
    if v.is_empty() {
        return Err(bad(RankProblem::Empty));
    }
    if let Some(rest) = v.strip_prefix('-')
        && !rest.is_empty()
        && rest.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad(RankProblem::Negative));
    }
    if !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(RankProblem::NotAnInteger));
    }
    v.parse::<usize>().map_err(|_| bad(RankProblem::TooLarge))
}

/// Checks `rank` (from `MLX_RANK`) against the number of ranks in the hostfile at `hostfile`.
pub(crate) fn check_rank(rank: usize, size: usize, hostfile: &Path) -> Result<(), ConfigError> {
    if rank < size {
        return Ok(());
    }
    Err(ConfigError::RankOutOfRange {
        var: MLX_RANK.into(),
        rank,
        size,
        kind: FileKind::Hostfile,
        file: hostfile.display().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment holding exactly `vars`.
    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(*v)))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    fn message(r: Result<impl std::fmt::Debug, ConfigError>) -> String {
        match r {
            Err(e) => e.to_string(),
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    /// One test per row: the environment and the fragments its error message must contain.
    macro_rules! bad_env {
        ($($name:ident: $call:ident, [$(($k:expr, $v:expr)),* $(,)?] => [$($frag:expr),+ $(,)?];)+) => {$(
            #[test]
            fn $name() {
                let f = lookup(&[$(($k, $v)),*]);
                let m = message(Env::from_fn(&f).$call());
                $(assert!(m.contains($frag), "missing {:?} in {m:?}", $frag);)+
            }
        )+};
    }

    bad_env! {
        a_hostfile_without_a_rank_names_mlx_rank:
            ring, [("MLX_HOSTFILE", "/tmp/h.json")] => ["MLX_RANK is not", "/tmp/h.json"];
        a_rank_without_a_hostfile_names_mlx_hostfile:
            ring, [("MLX_RANK", "1")] => ["MLX_HOSTFILE is not", "MLX_RANK is set (to \"1\")"];
        an_empty_hostfile_path_is_refused:
            ring, [("MLX_HOSTFILE", ""), ("MLX_RANK", "0")] => ["MLX_HOSTFILE is set but empty"];
        a_rank_that_is_text_is_not_read_as_zero:
            ring, [("MLX_HOSTFILE", "h"), ("MLX_RANK", "abc")]
                => ["MLX_RANK=\"abc\"", "not a non-negative integer"];
        a_negative_rank_is_refused:
            ring, [("MLX_HOSTFILE", "h"), ("MLX_RANK", "-1")] => ["MLX_RANK=\"-1\"", "negative"];
        an_empty_rank_is_refused:
            ring, [("MLX_HOSTFILE", "h"), ("MLX_RANK", "")] => ["MLX_RANK=\"\"", "empty"];
        a_rank_with_a_plus_sign_is_refused:
            ring, [("MLX_HOSTFILE", "h"), ("MLX_RANK", "+1")]
                => ["MLX_RANK=\"+1\"", "not a non-negative integer"];
        a_rank_with_spaces_is_refused:
            ring, [("MLX_HOSTFILE", "h"), ("MLX_RANK", " 1")]
                => ["MLX_RANK=\" 1\"", "not a non-negative integer"];
        a_rank_with_a_fraction_is_refused:
            ring, [("MLX_HOSTFILE", "h"), ("MLX_RANK", "1.0")]
                => ["MLX_RANK=\"1.0\"", "not a non-negative integer"];
        a_rank_beyond_usize_is_refused:
            ring, [("MLX_HOSTFILE", "h"), ("MLX_RANK", "99999999999999999999999")]
                => ["MLX_RANK=\"99999999999999999999999\"", "too large"];
        a_negative_timeout_is_refused:
            timeout, [("NUVEC_DISTRIBUTED_TIMEOUT", "-5")]
                => ["NUVEC_DISTRIBUTED_TIMEOUT=\"-5\"", "negative"];
        a_negative_zero_timeout_is_refused:
            timeout, [("NUVEC_DISTRIBUTED_TIMEOUT", "-0.0")]
                => ["NUVEC_DISTRIBUTED_TIMEOUT=\"-0.0\"", "negative"];
        a_nan_timeout_is_refused:
            timeout, [("NUVEC_DISTRIBUTED_TIMEOUT", "NaN")]
                => ["NUVEC_DISTRIBUTED_TIMEOUT=\"NaN\"", "finite"];
        an_infinite_timeout_is_refused:
            timeout, [("NUVEC_DISTRIBUTED_TIMEOUT", "inf")]
                => ["NUVEC_DISTRIBUTED_TIMEOUT=\"inf\"", "finite"];
        a_garbage_timeout_is_refused:
            timeout, [("NUVEC_DISTRIBUTED_TIMEOUT", "30s")]
                => ["NUVEC_DISTRIBUTED_TIMEOUT=\"30s\"", "not a number of seconds"];
        an_empty_timeout_is_refused:
            timeout, [("NUVEC_DISTRIBUTED_TIMEOUT", "")]
                => ["NUVEC_DISTRIBUTED_TIMEOUT=\"\"", "not a number of seconds"];
        a_huge_timeout_is_refused:
            timeout, [("NUVEC_DISTRIBUTED_TIMEOUT", "1e300")]
                => ["NUVEC_DISTRIBUTED_TIMEOUT=\"1e300\"", "too large"];
        a_sub_nanosecond_timeout_is_refused:
            timeout, [("NUVEC_DISTRIBUTED_TIMEOUT", "1e-12")]
                => ["NUVEC_DISTRIBUTED_TIMEOUT=\"1e-12\"", "below one nanosecond"];
        a_zero_link_timeout_is_refused:
            link_timeout, [("NUVEC_DISTRIBUTED_LINK_TIMEOUT", "0")]
                => ["NUVEC_DISTRIBUTED_LINK_TIMEOUT=\"0\"", "outside 1 to 3600 seconds"];
        a_link_timeout_below_a_second_is_refused:
            link_timeout, [("NUVEC_DISTRIBUTED_LINK_TIMEOUT", "0.5")]
                => ["NUVEC_DISTRIBUTED_LINK_TIMEOUT=\"0.5\"", "outside 1 to 3600 seconds"];
        a_link_timeout_above_an_hour_is_refused:
            link_timeout, [("NUVEC_DISTRIBUTED_LINK_TIMEOUT", "1e300")]
                => ["NUVEC_DISTRIBUTED_LINK_TIMEOUT=\"1e300\"", "outside 1 to 3600 seconds"];
        a_link_timeout_that_is_not_seconds_is_refused:
            link_timeout, [("NUVEC_DISTRIBUTED_LINK_TIMEOUT", "15s")]
                => ["NUVEC_DISTRIBUTED_LINK_TIMEOUT=\"15s\"", "not a number of seconds"];
        a_negative_link_timeout_is_refused:
            link_timeout, [("NUVEC_DISTRIBUTED_LINK_TIMEOUT", "-15")]
                => ["NUVEC_DISTRIBUTED_LINK_TIMEOUT=\"-15\"", "negative"];
        a_negative_warning_interval_is_refused:
            warn_after, [("NUVEC_DISTRIBUTED_WARN_AFTER", "-1")]
                => ["NUVEC_DISTRIBUTED_WARN_AFTER=\"-1\"", "negative"];
        a_warning_interval_that_is_not_seconds_is_refused:
            warn_after, [("NUVEC_DISTRIBUTED_WARN_AFTER", "soon")]
                => ["NUVEC_DISTRIBUTED_WARN_AFTER=\"soon\"", "not a number of seconds"];
        an_infinite_warning_interval_is_refused:
            warn_after, [("NUVEC_DISTRIBUTED_WARN_AFTER", "inf")]
                => ["NUVEC_DISTRIBUTED_WARN_AFTER=\"inf\"", "finite"];
        a_progress_timeout_below_a_nanosecond_is_refused_rather_than_read_as_off:
            jaccl_progress_timeout, [("JACCL_PROGRESS_TIMEOUT_S", "1e-10")]
                => ["JACCL_PROGRESS_TIMEOUT_S=\"1e-10\"", "below one nanosecond"];
        a_warning_interval_below_a_nanosecond_is_refused_rather_than_read_as_never:
            warn_after, [("NUVEC_DISTRIBUTED_WARN_AFTER", "1e-10")]
                => ["NUVEC_DISTRIBUTED_WARN_AFTER=\"1e-10\"", "below one nanosecond"];
        a_spin_that_is_not_whole_microseconds_is_refused:
            spin, [("NUVEC_DISTRIBUTED_SPIN_US", "2.5")]
                => ["NUVEC_DISTRIBUTED_SPIN_US=\"2.5\"", "whole number of microseconds"];
        a_negative_spin_is_refused:
            spin, [("NUVEC_DISTRIBUTED_SPIN_US", "-1")]
                => ["NUVEC_DISTRIBUTED_SPIN_US=\"-1\"", "whole number of microseconds"];
        a_spin_above_a_second_is_refused:
            spin, [("NUVEC_DISTRIBUTED_SPIN_US", "1000001")]
                => ["NUVEC_DISTRIBUTED_SPIN_US=\"1000001\"", "limit of 1000000 microseconds"];
        a_local_links_value_other_than_0_or_1_is_refused:
            local_links, [("NUVEC_DISTRIBUTED_LOCAL_LINKS", "yes")]
                => ["NUVEC_DISTRIBUTED_LOCAL_LINKS=\"yes\"", "neither 1", "nor 0"];
        an_unknown_wire_is_refused:
            wire, [("NUVEC_DISTRIBUTED_WIRE", "fast")]
                => ["NUVEC_DISTRIBUTED_WIRE=\"fast\"", "not a wire", "auto", "mlx", "nuvec"];
        a_congestion_control_with_a_space_is_refused:
            tcp_congestion, [("NUVEC_DISTRIBUTED_TCP_CONGESTION", "cu bic")]
                => ["NUVEC_DISTRIBUTED_TCP_CONGESTION=\"cu bic\"", "not a congestion control's name"];
        a_congestion_control_longer_than_the_kernel_takes_is_refused:
            tcp_congestion, [("NUVEC_DISTRIBUTED_TCP_CONGESTION", "cubic-but-longer-still")]
                => ["NUVEC_DISTRIBUTED_TCP_CONGESTION=\"cubic-but-longer-still\"", "15 bytes"];
        an_empty_congestion_control_is_refused:
            tcp_congestion, [("NUVEC_DISTRIBUTED_TCP_CONGESTION", " ")]
                => ["NUVEC_DISTRIBUTED_TCP_CONGESTION=\" \"", "is empty"];
        an_empty_wire_is_refused:
            wire, [("NUVEC_DISTRIBUTED_WIRE", "")] => ["NUVEC_DISTRIBUTED_WIRE=\"\"", "not a wire"];
        a_short_key_is_refused_without_showing_it:
            key, [("NUVEC_DISTRIBUTED_KEY", "fifteen-bytes!!")]
                => ["NUVEC_DISTRIBUTED_KEY is too short", "15 bytes", "at least 16"];
        an_empty_key_is_refused:
            key, [("NUVEC_DISTRIBUTED_KEY", "")] => ["NUVEC_DISTRIBUTED_KEY is too short", "0 bytes"];
        an_unknown_log_level_is_refused:
            log_level, [("NUVEC_DISTRIBUTED_LOG", "verbose")]
                => ["NUVEC_DISTRIBUTED_LOG=\"verbose\"", "off, error, warn, info or debug"];
        an_empty_log_level_is_refused:
            log_level, [("NUVEC_DISTRIBUTED_LOG", "")] => ["NUVEC_DISTRIBUTED_LOG=\"\"", "not a log level"];
        a_numeric_log_level_is_refused:
            log_level, [("NUVEC_DISTRIBUTED_LOG", "3")] => ["NUVEC_DISTRIBUTED_LOG=\"3\"", "not a log level"];
        a_progress_timeout_that_is_not_seconds_is_refused:
            jaccl_progress_timeout, [("MLX_JACCL_PROGRESS_TIMEOUT_S", "5s")]
                => ["MLX_JACCL_PROGRESS_TIMEOUT_S=\"5s\"", "not a number of seconds"];
        a_negative_progress_timeout_is_refused:
            jaccl_progress_timeout, [("JACCL_PROGRESS_TIMEOUT_S", "-1")]
                => ["JACCL_PROGRESS_TIMEOUT_S=\"-1\"", "must not be negative"];
        an_infinite_progress_timeout_is_refused:
            jaccl_progress_timeout, [("JACCL_PROGRESS_TIMEOUT_S", "inf")]
                => ["JACCL_PROGRESS_TIMEOUT_S=\"inf\"", "finite"];
    }

    #[test]
    fn the_progress_timeout_is_read_in_seconds_jaccl_first_and_zero_is_off() {
        let read = |vars: &[(&str, &str)]| {
            let f = lookup(vars);
            Env::from_fn(&f)
                .jaccl_progress_timeout()
                .expect("a valid value")
        };
        assert_eq!(read(&[]), None);
        assert_eq!(read(&[("JACCL_PROGRESS_TIMEOUT_S", "0")]), None);
        assert_eq!(
            read(&[("MLX_JACCL_PROGRESS_TIMEOUT_S", "2.5")]),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(
            read(&[
                ("JACCL_PROGRESS_TIMEOUT_S", "3"),
                ("MLX_JACCL_PROGRESS_TIMEOUT_S", "oops")
            ]),
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn local_links_are_read_as_1_or_0_and_unset_is_none() {
        let read = |vars: &[(&str, &str)]| {
            let f = lookup(vars);
            Env::from_fn(&f).local_links().expect("a valid value")
        };
        assert_eq!(read(&[(LOCAL_LINKS, "1")]), Some(true));
        assert_eq!(read(&[(LOCAL_LINKS, " 0 ")]), Some(false));
        assert_eq!(read(&[]), None);
    }

    #[test]
    fn a_wire_is_read_as_auto_mlx_or_nuvec_in_any_case_and_unset_is_none() {
        let read = |vars: &[(&str, &str)]| {
            let f = lookup(vars);
            Env::from_fn(&f).wire().expect("a valid value")
        };
        assert_eq!(read(&[(WIRE, "auto")]), Some(WireChoice::Auto));
        assert_eq!(read(&[(WIRE, " MLX ")]), Some(WireChoice::Mlx));
        assert_eq!(read(&[(WIRE, "Nuvec")]), Some(WireChoice::Nuvec));
        assert_eq!(read(&[]), None);
    }

    #[test]
    fn a_congestion_control_is_read_as_named_and_unset_is_none() {
        let read = |vars: &[(&str, &str)]| {
            let f = lookup(vars);
            Env::from_fn(&f).tcp_congestion().expect("a valid name")
        };
        assert_eq!(
            read(&[(TCP_CONGESTION, " cubic ")]).as_deref(),
            Some("cubic")
        );
        assert_eq!(read(&[(TCP_CONGESTION, "bbr")]).as_deref(), Some("bbr"));
        assert_eq!(read(&[]), None);
    }

    #[test]
    fn a_spin_is_read_in_microseconds_and_zero_parks_at_once() {
        let spin = |v: &str| {
            let f = lookup(&[("NUVEC_DISTRIBUTED_SPIN_US", v)]);
            Env::from_fn(&f).spin().expect("a valid spin")
        };
        assert_eq!(spin("250"), Some(Duration::from_micros(250)));
        assert_eq!(spin("0"), Some(Duration::ZERO));
        assert_eq!(spin("1000000"), Some(crate::config::options::MAX_SPIN));
        let unset = lookup(&[]);
        assert_eq!(Env::from_fn(&unset).spin().expect("unset"), None);
    }

    #[test]
    fn a_short_key_never_appears_in_the_message() {
        let f = lookup(&[("NUVEC_DISTRIBUTED_KEY", "s3cr3t")]);
        let m = message(Env::from_fn(&f).key());
        assert!(!m.contains("s3cr3t"), "{m}");
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_values_are_errors_naming_the_variable() {
        use std::os::unix::ffi::OsStringExt;
        let bad = || OsString::from_vec(vec![b'1', 0xff]);
        for name in [
            MLX_RANK,
            TIMEOUT,
            LINK_TIMEOUT,
            WARN_AFTER,
            LOG,
            KEY,
            SPIN,
            LOCAL_LINKS,
            WIRE,
        ] {
            let f = |n: &str| match n {
                "MLX_HOSTFILE" => Some(OsString::from("h")),
                n if n == name => Some(bad()),
                _ => None,
            };
            let env = Env::from_fn(&f);
            let m = match name {
                MLX_RANK => message(env.ring()),
                TIMEOUT => message(env.timeout()),
                LINK_TIMEOUT => message(env.link_timeout()),
                WARN_AFTER => message(env.warn_after()),
                LOG => message(env.log_level()),
                SPIN => message(env.spin()),
                LOCAL_LINKS => message(env.local_links()),
                WIRE => message(env.wire()),
                _ => message(env.key()),
            };
            assert!(m.contains(name) && m.contains("not valid UTF-8"), "{m}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_non_utf8_hostfile_path_is_kept_byte_for_byte() {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let f = |n: &str| match n {
            "MLX_HOSTFILE" => Some(OsString::from_vec(b"/tmp/h\xff.json".to_vec())),
            "MLX_RANK" => Some(OsString::from("0")),
            _ => None,
        };
        let ring = Env::from_fn(&f).ring().unwrap().unwrap();
        assert_eq!(ring.hostfile.as_os_str().as_bytes(), b"/tmp/h\xff.json");
    }

    #[test]
    fn neither_ring_variable_means_no_ring() {
        let f = lookup(&[("MLX_RING_VERBOSE", "1")]);
        assert_eq!(Env::from_fn(&f).ring().unwrap(), None);
    }

    #[test]
    fn the_ring_variables_as_mlx_launch_sets_them_are_read() {
        let f = lookup(&[("MLX_HOSTFILE", "/tmp/tmp.x"), ("MLX_RANK", "3")]);
        assert_eq!(
            Env::from_fn(&f).ring().unwrap(),
            Some(RingEnv {
                hostfile: PathBuf::from("/tmp/tmp.x"),
                rank: 3,
                verbose: false
            })
        );
    }

    #[test]
    fn verbose_is_on_whenever_mlx_ring_verbose_is_present_even_empty() {
        for v in ["1", "0", ""] {
            let f = lookup(&[
                ("MLX_HOSTFILE", "h"),
                ("MLX_RANK", "0"),
                ("MLX_RING_VERBOSE", v),
            ]);
            let env = Env::from_fn(&f);
            assert!(env.ring().unwrap().unwrap().verbose, "{v:?}");
            assert_eq!(env.log_level().unwrap(), LogLevel::Info, "{v:?}");
        }
    }

    #[test]
    fn a_rank_inside_the_hostfile_passes_the_check() {
        assert_eq!(check_rank(0, 1, Path::new("h")), Ok(()));
        assert_eq!(check_rank(3, 4, Path::new("h")), Ok(()));
    }

    #[test]
    fn a_rank_equal_to_the_size_names_the_rank_the_size_and_the_file() {
        let m = message(check_rank(2, 2, Path::new("/tmp/hosts.json")));
        assert_eq!(
            m,
            "MLX_RANK=2 is out of range: the hostfile /tmp/hosts.json lists 2 ranks, so valid \
             ranks are 0 to 1"
        );
    }

    #[test]
    fn a_rank_beyond_a_single_rank_hostfile_says_only_zero_is_valid() {
        let m = message(check_rank(5, 1, Path::new("h")));
        assert!(
            m.contains("MLX_RANK=5")
                && m.contains("lists 1 rank,")
                && m.contains("only valid rank is 0"),
            "{m}"
        );
    }

    #[test]
    fn timeouts_in_seconds_become_durations() {
        for (v, d) in [
            ("30", Duration::from_secs(30)),
            ("2.5", Duration::from_millis(2500)),
            ("1e-3", Duration::from_millis(1)),
        ] {
            let f = lookup(&[("NUVEC_DISTRIBUTED_TIMEOUT", v)]);
            assert_eq!(Env::from_fn(&f).timeout().unwrap(), Some(d), "{v}");
        }
        let f = lookup(&[]);
        assert_eq!(Env::from_fn(&f).timeout().unwrap(), None);
    }

    #[test]
    fn a_zero_timeout_means_no_operation_timeout() {
        for v in ["0", "0.0", " 0 "] {
            let f = lookup(&[("NUVEC_DISTRIBUTED_TIMEOUT", v)]);
            assert_eq!(
                Env::from_fn(&f).timeout().unwrap(),
                Some(Duration::ZERO),
                "{v:?}"
            );
        }
    }

    #[test]
    fn a_records_directory_is_made_when_missing_and_a_file_in_its_place_is_refused() {
        let base =
            std::env::temp_dir().join(format!("nuvec-env-record-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("not").join("yet");
        let read = |path: &Path| {
            let path = path.display().to_string();
            let f = lookup(&[("NUVEC_DISTRIBUTED_RECORD_DIR", &path)]);
            Env::from_fn(&f).record_dir()
        };
        assert_eq!(read(&dir).expect("made"), Some(dir.clone()));
        assert!(dir.is_dir(), "the directory and its parents are made");
        assert_eq!(read(&dir).expect("already there"), Some(dir.clone()));
        let file = base.join("a-file");
        std::fs::write(&file, b"").expect("a file");
        let m = message(read(&file));
        assert!(
            m.contains("NUVEC_DISTRIBUTED_RECORD_DIR=") && m.contains("is not a directory"),
            "{m}"
        );
        let m = message(read(&file.join("below")));
        assert!(m.contains("cannot be made a directory"), "{m}");
        let none = lookup(&[("NUVEC_DISTRIBUTED_RECORD_DIR", "")]);
        assert_eq!(Env::from_fn(&none).record_dir().expect("empty"), None);
        std::fs::remove_dir_all(&base).expect("cleaned up");
    }

    #[test]
    fn a_link_timeout_and_a_warning_interval_are_read_in_seconds_and_zero_stops_the_warnings() {
        let link = |v: &str| {
            let f = lookup(&[("NUVEC_DISTRIBUTED_LINK_TIMEOUT", v)]);
            Env::from_fn(&f)
                .link_timeout()
                .expect("a valid link timeout")
        };
        assert_eq!(link("15"), Some(Duration::from_secs(15)));
        assert_eq!(link("1"), Some(Duration::from_secs(1)));
        assert_eq!(link("2.5"), Some(Duration::from_millis(2500)));
        assert_eq!(link("3600"), Some(Duration::from_secs(3600)));
        let warn = |v: &str| {
            let f = lookup(&[("NUVEC_DISTRIBUTED_WARN_AFTER", v)]);
            Env::from_fn(&f).warn_after().expect("a valid interval")
        };
        assert_eq!(warn("30"), Some(Some(Duration::from_secs(30))));
        assert_eq!(warn("0.5"), Some(Some(Duration::from_millis(500))));
        assert_eq!(warn("0"), Some(None));
        let unset = lookup(&[]);
        let env = Env::from_fn(&unset);
        assert_eq!(env.link_timeout().expect("unset"), None);
        assert_eq!(env.warn_after().expect("unset"), None);
    }

    #[test]
    fn a_key_of_sixteen_bytes_or_more_is_its_bytes() {
        let f = lookup(&[("NUVEC_DISTRIBUTED_KEY", "0123456789abcdef")]);
        assert_eq!(
            Env::from_fn(&f).key().unwrap(),
            Some(b"0123456789abcdef".to_vec())
        );
        let f = lookup(&[]);
        assert_eq!(Env::from_fn(&f).key().unwrap(), None);
    }

    #[test]
    fn log_levels_are_read_in_any_case_and_ordered() {
        for (v, l) in [
            ("off", LogLevel::Off),
            ("ERROR", LogLevel::Error),
            ("Warn", LogLevel::Warn),
            ("info", LogLevel::Info),
            ("DeBuG", LogLevel::Debug),
        ] {
            let f = lookup(&[("NUVEC_DISTRIBUTED_LOG", v)]);
            assert_eq!(Env::from_fn(&f).log_level().unwrap(), l, "{v}");
        }
        let f = lookup(&[]);
        assert_eq!(Env::from_fn(&f).log_level().unwrap(), LogLevel::Off);
        assert!(
            LogLevel::Off < LogLevel::Error
                && LogLevel::Error < LogLevel::Warn
                && LogLevel::Warn < LogLevel::Info
                && LogLevel::Info < LogLevel::Debug
        );
    }

    #[test]
    fn mlx_ring_verbose_raises_the_level_to_info_but_never_lowers_it() {
        for (v, l) in [
            ("off", LogLevel::Info),
            ("warn", LogLevel::Info),
            ("debug", LogLevel::Debug),
        ] {
            let f = lookup(&[("NUVEC_DISTRIBUTED_LOG", v), ("MLX_RING_VERBOSE", "1")]);
            assert_eq!(Env::from_fn(&f).log_level().unwrap(), l, "{v}");
        }
    }

    #[test]
    fn the_process_environment_reads_without_error_when_nothing_is_set() {
        // Reads only; the test harness does not set these variables.
        let env = Env::process();
        if std::env::var_os(MLX_HOSTFILE).is_none() && std::env::var_os(MLX_RANK).is_none() {
            assert_eq!(env.ring().unwrap(), None);
        }
    }
}
