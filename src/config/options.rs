//! [`Options`]: how a group connects and how long it waits.
//!
//! Three durations, three jobs. The *link timeout* ([`Options::link_timeout`], 15 s) is how
//! long a connection may go silent (no acknowledgement of sent bytes, no answer to the
//! kernel's keepalive probes) before the operation using it fails: it catches a cut cable or a
//! dead host, and it is never tripped by a slow peer, whose kernel keeps answering. The
//! *operation timeout* ([`Options::timeout`], 10 minutes, or none) is only a backstop against
//! a peer that is alive but never comes. The *warning interval* ([`Options::warn_after`],
//! 30 s) says, while an operation waits, what it waits for. Connection setup keeps a deadline
//! of its own ([`DEFAULT_SETUP_TIMEOUT`], or the operation timeout when one is set; a
//! sub-group's connections, made once every member runs, [`DEFAULT_SETUP_TIMEOUT`] or the
//! operation timeout where it is shorter).

use std::time::Duration;

use crate::config::error::ConfigError;
use crate::config::key::{Key, MIN_SECRET};
use crate::config::log::LogLevel;

/// How a group is connected and run: every rank should use the same options.
///
/// ```
/// use std::time::Duration;
/// let options = nuvec_distributed::Options::default()
///     .timeout(Duration::from_secs(10))
///     .link_timeout(Duration::from_secs(5))
///     .verbose(true);
/// assert_eq!(options.timeout, Duration::from_secs(10));
/// assert_eq!(nuvec_distributed::Options::new().no_timeout().timeout, Duration::ZERO);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Options {
    /// The backstop of every collective (default [`DEFAULT_TIMEOUT`], 10 minutes;
    /// `NUVEC_DISTRIBUTED_TIMEOUT` for [`init`](crate::init)); [`Duration::ZERO`] means none
    /// (see [`Options::no_timeout`]). A collective that has not finished by then fails the
    /// group, naming the peer it was waiting for. A dead link fails it much sooner, after
    /// the [link timeout](Options::link_timeout). Setting it through
    /// [`Options::timeout`] also bounds connection setup.
    pub timeout: Duration,
    /// The deadline of connection setup when set apart from the default.
    pub(crate) setup: Option<Duration>,
    pub(crate) link_timeout: Duration,
    pub(crate) warn_after: Option<Duration>,
    pub(crate) log: LogLevel,
    pub(crate) key: Option<Key>,
    pub(crate) spin: Spin,
    pub(crate) progress: Option<Duration>,
    pub(crate) local_links: bool,
    pub(crate) wire: WireChoice,
    pub(crate) congestion: Option<String>,
}

/// Which wire a ring may speak, as asked for (`NUVEC_DISTRIBUTED_WIRE`, [`Options::wire`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WireChoice {
    /// The nuvec wire where every rank of the job speaks it, MLX's wire otherwise (the
    /// default).
    #[default]
    Auto,
    /// MLX's wire on every link, whoever the peers are.
    Mlx,
    /// The nuvec wire, or no group: setup fails naming a rank that cannot speak it.
    Nuvec,
}

/// The wire a ring speaks once its ranks have agreed: one for the whole job.
///
/// MLX's wire is raw element bytes in MLX's order (what Python MLX ranks and nuvec-distributed
/// 0.5 speak); the nuvec wire is this crate's own, chosen only where every rank speaks it: each
/// operation's first bytes on each link carry a fingerprint of the call, so ranks that called
/// different collectives (or passed different sizes) fail naming both calls instead of
/// returning wrong numbers, and small reductions take ⌈(R−1)/2⌉ hops instead of 2(R−1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wire {
    /// MLX's wire, byte for byte.
    Mlx,
    /// This crate's wire.
    Nuvec,
}

impl std::fmt::Display for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Wire::Mlx => "MLX's wire",
            Wire::Nuvec => "the nuvec wire",
        })
    }
}

/// How a step that cannot progress looks for bytes before it parks (the fabrics' `wait`
/// module says why and how).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spin {
    /// Looks for at most this long, less (or not at all) when looking does not pay: the
    /// default.
    Adaptive(Duration),
    /// Looks for this long every time; zero parks at once.
    Fixed(Duration),
}

/// The longest, by default, a step that cannot progress keeps looking before it parks: the
/// cap of the adaptive wait (see [`Options::spin`]).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(100);

/// The default backstop of an operation ([`Options::timeout`]): 10 minutes. Long enough for
/// any rank's pause between collectives that a job survives (a checkpoint, an evaluation, a
/// compilation), since faults of the network are caught by the link timeout instead.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The deadline of connection setup unless [`Options::timeout`] sets another: 30 s, for the
/// launcher to start every rank (setup never waits forever, even without an operation
/// timeout).
pub const DEFAULT_SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The default [link timeout](Options::link_timeout): 15 s.
///
/// Why 15 s: it must outlast what a healthy network does (a switch's spanning tree or a
/// bond failing over takes a few seconds, and a glitch shorter than 70 % of it, 10.5 s, is
/// survived), and it should not be much longer than the 14.7 s in which the kernel already
/// gave up on a cut cable before this setting existed, so no fault is noticed later than it
/// was.
pub const DEFAULT_LINK_TIMEOUT: Duration = Duration::from_secs(15);

/// The link timeouts accepted: 1 s (the kernel counts keepalive in whole seconds) to an hour.
pub(crate) const LINK_TIMEOUT_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(3600);

/// How long, by default, an operation waits before it says what it waits for, and how often
/// it says it again ([`Options::warn_after`]): 30 s.
pub const DEFAULT_WARN_AFTER: Duration = Duration::from_secs(30);

/// The longest [`Options::spin`] accepted: a second.
pub const MAX_SPIN: Duration = Duration::from_secs(1);

/// The longest name of a TCP congestion control the kernel takes: 15 bytes (its
/// `TCP_CA_NAME_MAX` of 16 counts the terminating zero; a longer name would be cut short).
const MAX_CONGESTION_NAME: usize = 15;

/// Why `name` cannot name a TCP congestion control ([`Options::tcp_congestion`]), `None`
/// when it can: the one check of the option and of its variable.
pub(crate) fn congestion_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty: name a congestion control (e.g. cubic)")
    } else if name.len() > MAX_CONGESTION_NAME {
        Some("is longer than the 15 bytes of a congestion control's name in Linux")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        Some(
            "is not a congestion control's name (letters, digits, _ and -, as in \
             net.ipv4.tcp_available_congestion_control)",
        )
    } else {
        None
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            setup: None,
            link_timeout: DEFAULT_LINK_TIMEOUT,
            warn_after: Some(DEFAULT_WARN_AFTER),
            log: LogLevel::Off,
            key: None,
            spin: Spin::Adaptive(DEFAULT_SPIN),
            progress: None,
            local_links: true,
            wire: WireChoice::Auto,
            congestion: None,
        }
    }
}

impl Options {
    /// The default options: a 10 minute backstop, a 15 s link timeout, a warning after
    /// 30 s of waiting, otherwise quiet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the backstop of every collective and the deadline of connection setup;
    /// [`Duration::ZERO`] is [`no_timeout`](Self::no_timeout).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.setup = (!timeout.is_zero()).then_some(timeout);
        self
    }

    /// No operation timeout: a collective waits for as long as its peers are alive (the
    /// [link timeout](Self::link_timeout) still fails it when a link goes silent, and
    /// warnings say what it waits for); connection setup keeps [`DEFAULT_SETUP_TIMEOUT`].
    /// `NUVEC_DISTRIBUTED_TIMEOUT=0` for [`init`](crate::init).
    pub fn no_timeout(mut self) -> Self {
        self.timeout = Duration::ZERO;
        self.setup = None;
        self
    }

    /// How long a connection may go silent before the operation using it fails, naming the
    /// peer (default [`DEFAULT_LINK_TIMEOUT`]; `NUVEC_DISTRIBUTED_LINK_TIMEOUT` for
    /// [`init`](crate::init); clamped to 1 s to an hour). Silent means the peer's kernel
    /// acknowledges nothing: no sent byte and no keepalive probe, which the kernel sends
    /// while a connection is idle (probes carry no data: a Python MLX peer sees no byte it
    /// would not expect). A peer that is merely busy or stopped keeps answering, so it never
    /// trips this; a cut cable or a dead host does. See [`tcp`](crate::transport::tcp).
    pub fn link_timeout(mut self, limit: Duration) -> Self {
        self.link_timeout = limit.clamp(*LINK_TIMEOUT_RANGE.start(), *LINK_TIMEOUT_RANGE.end());
        self
    }

    /// How long an operation waits before this rank logs (at `warn`, even when the log is
    /// otherwise off) what it is waiting for, and how often it logs it again while it keeps
    /// waiting (default [`DEFAULT_WARN_AFTER`]; `NUVEC_DISTRIBUTED_WARN_AFTER` for
    /// [`init`](crate::init)); zero never warns. The line names the operation, its sequence
    /// number and size, the peer and link, the bytes received so far and whether the link is
    /// alive: a slow peer, not a failure.
    pub fn warn_after(mut self, interval: Duration) -> Self {
        self.warn_after = (!interval.is_zero()).then_some(interval);
        self
    }

    /// The deadline of connection setup: the timeout when one was set
    /// ([`timeout`](Self::timeout)), [`DEFAULT_SETUP_TIMEOUT`] otherwise.
    pub(crate) fn setup_timeout(&self) -> Duration {
        self.setup.unwrap_or(DEFAULT_SETUP_TIMEOUT)
    }

    /// Authenticates every connection with a pre-shared `secret` (at least 16 bytes, the same
    /// on every rank; `NUVEC_DISTRIBUTED_KEY` for [`init`](crate::init)): a mutual
    /// HMAC-SHA256 challenge-response before any data, so a stranger cannot join or block a
    /// forming group (see [`auth`](crate::transport::tcp::auth)). Without a key the wire is MLX's. The traffic
    /// is not encrypted.
    ///
    /// # Errors
    ///
    /// [`ConfigError::KeyTooShort`] when `secret` has fewer than 16 bytes.
    pub fn key(mut self, secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let secret = secret.as_ref();
        self.key = Some(Key::from_secret(secret).ok_or(ConfigError::KeyTooShort {
            var: None,
            bytes: secret.len(),
            min: MIN_SECRET,
        })?);
        Ok(self)
    }

    /// Makes a step that cannot progress keep looking for bytes (yielding the core between
    /// looks) for exactly `spin` every time before it parks until a socket is ready (at most
    /// [`MAX_SPIN`]; `NUVEC_DISTRIBUTED_SPIN_US` for [`init`](crate::init)); zero parks at
    /// once and leaves the cores idle while waiting.
    ///
    /// Without it (the default) the wait adapts: it looks for at most [`DEFAULT_SPIN`], and
    /// only while looking pays, parking at once when the core is contended (a busy machine)
    /// or when waits are long. Setting a fixed spin is for measuring: see
    /// [`tcp`](crate::transport::tcp) for what each costs where.
    pub fn spin(mut self, spin: Duration) -> Self {
        self.spin = Spin::Fixed(spin.min(MAX_SPIN));
        self
    }

    /// JACCL only: the longest a wait of an operation may go without any progress before the
    /// operation fails, on top of its deadline (`JACCL_PROGRESS_TIMEOUT_S` or
    /// `MLX_JACCL_PROGRESS_TIMEOUT_S` for [`init`](crate::init), as MLX's PR #4530 names
    /// them; default off, and zero turns it off).
    pub fn progress_timeout(mut self, limit: Duration) -> Self {
        self.progress = (!limit.is_zero()).then_some(limit);
        self
    }

    /// Whether a ring connection between two ranks of this crate on one machine may carry its
    /// bytes through memory both map instead of loopback TCP (default on, Linux only;
    /// `NUVEC_DISTRIBUTED_LOCAL_LINKS=0` turns it off for [`init`](crate::init)). The TCP
    /// connection is made either way and stays open as the link's doorbell; links to Python
    /// MLX ranks, to other versions and to other machines are TCP, byte for byte MLX's. See
    /// [`tcp`](crate::transport::tcp) for what it changes and why.
    pub fn local_links(mut self, on: bool) -> Self {
        self.local_links = on;
        self
    }

    /// The TCP congestion control of the ring's connections, sub-groups' included, by the
    /// kernel's name (`cubic`, `reno`, `bbr`, …: one of Linux's
    /// `net.ipv4.tcp_allowed_congestion_control`, or of `tcp_available_congestion_control` for
    /// a process with `CAP_NET_ADMIN`;
    /// `NUVEC_DISTRIBUTED_TCP_CONGESTION` for [`init`](crate::init)). Without it (the default)
    /// a connection takes the host's (`net.ipv4.tcp_congestion_control`). Linux only: elsewhere
    /// it is ignored, with a warning (macOS has no choice per connection and runs CUBIC).
    ///
    /// Why choose: on hosts running BBR the ring was measured slower at several sizes than on
    /// CUBIC (Linux's and macOS's default) or Reno (which every process may choose): 3 points
    /// of a 1 Gbit/s link at 16 MiB on 4 hosts of the emulated cluster, and 1.8× the time at
    /// 1 MiB on 4 unshaped hosts; unshaped, Reno was also ahead of CUBIC at 16 MiB (the
    /// README's "TCP congestion control"). A name the kernel refuses fails setup, naming it and what the host offers
    /// and allows.
    ///
    /// # Errors
    ///
    /// [`ConfigError::BadValue`] when `name` cannot be a congestion control's name (empty,
    /// longer than the kernel's 15 bytes, or other than letters, digits, `_` and `-`).
    pub fn tcp_congestion(mut self, name: &str) -> Result<Self, ConfigError> {
        if let Some(problem) = congestion_problem(name) {
            return Err(ConfigError::BadValue {
                var: "Options::tcp_congestion".to_owned(),
                value: name.to_owned(),
                problem: problem.to_owned(),
            });
        }
        self.congestion = Some(name.to_owned());
        Ok(self)
    }

    /// Which wire the ring may speak (default [`WireChoice::Auto`]: the nuvec wire where every
    /// rank of the job speaks it; `NUVEC_DISTRIBUTED_WIRE=auto|mlx|nuvec` for
    /// [`init`](crate::init)). See [`Wire`].
    pub fn wire(mut self, wire: WireChoice) -> Self {
        self.wire = wire;
        self
    }

    /// Prints connection setup and failures on standard error, as `MLX_RING_VERBOSE`.
    pub fn verbose(mut self, on: bool) -> Self {
        self.log = if on {
            self.log.max(LogLevel::Info)
        } else {
            LogLevel::Off
        };
        self
    }
}
