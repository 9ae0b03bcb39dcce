//! Everything read before a byte moves: the launch environment ([`env`]), MLX's ring hostfile
//! and the crate's address reading ([`hostfile`]), the options of a group ([`options`]), the
//! pre-shared key ([`key`]) and the log level ([`log`]); what can be wrong with any of them
//! ([`error`]: [`ConfigError`]).
//!
//! The layer below the crate's errors (`crate::error` wraps a [`ConfigError`]): it knows
//! nothing of fabrics, transports or backends. JACCL's own device file and variables are read by `crate::jaccl`, through
//! [`env::Env`].

pub(crate) mod env;
pub(crate) mod error;
pub mod hostfile;
pub(crate) mod key;
pub(crate) mod log;
pub(crate) mod options;

pub use error::{AddressProblem, ConfigError, FileKind, HostfileProblem, RankProblem};
