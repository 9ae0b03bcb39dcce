//! The errors of this crate, and how they become `nuvec_core::Error`s.
//!
//! Every error says which rank saw it, and for failures of a collective which operation (and
//! its sequence number in this group), how many bytes, which peer and link, how far the
//! transfer got and how long it waited, in the spirit of PyTorch's watchdog line. Users match
//! on the `nuvec_core::Error` they get: [`InvalidArgument`](nuvec_core::Error::InvalidArgument)
//! for their own mistakes (which leave the group usable), [`Io`](nuvec_core::Error::Io) for
//! the network and the environment (after which the group is failed).

use std::time::Duration;

use crate::config::ConfigError;
use crate::fabric::FabricError;

/// An error of a distributed group or of setting one up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument the caller controls is wrong; nothing was sent, and the group is usable.
    #[error("distributed: rank {rank}: {op}: {what}")]
    InvalidArgument {
        /// The rank that rejected it.
        rank: usize,
        /// The operation (MLX's name).
        op: &'static str,
        /// What is wrong.
        what: String,
    },
    /// A collective failed on the wire; the group is failed from now on.
    #[error(
        "distributed: rank {rank}: {op} #{seq} ({bytes} bytes) failed after {waited:.3?}: {source}{}",
        Unreachable(unreachable)
    )]
    Transport {
        /// The rank that saw the failure.
        rank: usize,
        /// The operation (MLX's name).
        op: &'static str,
        /// Its sequence number among this group's operations, from 0.
        seq: u64,
        /// The size of the operation's buffer.
        bytes: usize,
        /// How long the operation had run.
        waited: Duration,
        /// The failed transfer: peer, link, direction, progress and cause.
        source: Box<FabricError>,
        /// Other peers found unreachable when it failed, `(peer, what)`: the one that failed
        /// first may be among them when this rank only saw a neighbour give up.
        unreachable: Vec<(usize, String)>,
    },
    /// An operation was called on a group that had failed before.
    #[error(
        "distributed: rank {rank}: {op}: the group failed earlier, no further operation runs ({first})"
    )]
    Failed {
        /// The rank.
        rank: usize,
        /// The operation refused.
        op: &'static str,
        /// The first failure.
        first: Box<Error>,
    },
    /// The group was closed.
    #[error("distributed: rank {rank}: {op}: the group is closed")]
    Closed {
        /// The rank.
        rank: usize,
        /// The operation refused.
        op: &'static str,
    },
    /// The launch configuration is wrong: an environment variable, the hostfile, an address,
    /// an option; the [`ConfigError`] says which, with what was seen and what was expected.
    #[error("distributed: {0}")]
    Config(#[from] ConfigError),
    /// Connecting the group failed.
    #[error("distributed: rank {rank}: {what}")]
    Connect {
        /// The rank that could not connect.
        rank: usize,
        /// What failed: which address, which peer, after how long.
        what: String,
    },
}

/// The list of other unreachable peers, as it ends a transport error's message.
struct Unreachable<'a>(&'a [(usize, String)]);

impl std::fmt::Display for Unreachable<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (peer, what)) in self.0.iter().enumerate() {
            let lead = if i == 0 { "; also unreachable: " } else { ", " };
            write!(f, "{lead}rank {peer} ({what})")?;
        }
        Ok(())
    }
}

impl Error {
    /// Whether the group is still usable after this error.
    pub fn leaves_group_usable(&self) -> bool {
        matches!(self, Error::InvalidArgument { .. })
    }
}

impl From<ConfigError> for nuvec_core::Error {
    /// A configuration error is the caller's to fix: `InvalidArgument`, as from [`Error`].
    fn from(e: ConfigError) -> Self {
        Error::Config(e).into()
    }
}

impl From<Error> for nuvec_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument { .. } => nuvec_core::Error::InvalidArgument(e.to_string()),
            Error::Config(_) => nuvec_core::Error::InvalidArgument(e.to_string()),
            _ => nuvec_core::Error::Io(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_errors_display_with_the_crate_prefix() {
        let e = crate::config::hostfile::parse("{}", "f.json").unwrap_err();
        let e = Error::from(e);
        assert!(
            e.to_string().starts_with("distributed: hostfile f.json: "),
            "{e}"
        );
        assert!(matches!(
            nuvec_core::Error::from(e),
            nuvec_core::Error::InvalidArgument(_)
        ));
    }
}
