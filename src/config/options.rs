//! [`Options`]: how a group connects and how long it waits.

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
///     .verbose(true);
/// assert_eq!(options.timeout, Duration::from_secs(10));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Options {
    /// The deadline of connection setup and of every collective (default 30 s;
    /// `NUVEC_DISTRIBUTED_TIMEOUT` for [`init`](crate::init)). A collective that has not
    /// finished by then fails the group, naming the peer it was waiting for.
    pub timeout: Duration,
    pub(crate) log: LogLevel,
    pub(crate) key: Option<Key>,
    pub(crate) spin: Spin,
    pub(crate) progress: Option<Duration>,
    pub(crate) local_links: bool,
    pub(crate) wire: WireChoice,
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

/// The longest [`Options::spin`] accepted: a second.
pub const MAX_SPIN: Duration = Duration::from_secs(1);

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            log: LogLevel::Off,
            key: None,
            spin: Spin::Adaptive(DEFAULT_SPIN),
            progress: None,
            local_links: true,
            wire: WireChoice::Auto,
        }
    }
}

impl Options {
    /// The default options: a 30 s timeout, quiet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the deadline of connection setup and of every collective.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
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
