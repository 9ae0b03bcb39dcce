//! Diagnostics on standard error, as MLX's `MLX_RING_VERBOSE` (lines start with `[ring]`).
//!
//! The level comes from `NUVEC_DISTRIBUTED_LOG` (off, error, warn, info, debug); the presence
//! of `MLX_RING_VERBOSE` makes it at least `info`, as in MLX. One line is printed whatever
//! the level: that an operation has waited long, every `NUVEC_DISTRIBUTED_WARN_AFTER`
//! ([`Log::slow`]), since a job that seems to hang should say why without being rerun.

use std::fmt;

pub(crate) use crate::config::env::LogLevel;

/// Where a rank's diagnostics go.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Log {
    level: LogLevel,
    rank: usize,
    /// How long an operation waits before [`Log::slow`] says so, and how often again.
    slow_after: Option<std::time::Duration>,
}

impl Log {
    /// A log for `rank` at `level`.
    pub(crate) fn new(level: LogLevel, rank: usize) -> Self {
        Self {
            level,
            rank,
            slow_after: None,
        }
    }

    /// This log, saying after `after` (then every `after`) that an operation still waits
    /// (`None`: never).
    pub(crate) fn with_slow_after(mut self, after: Option<std::time::Duration>) -> Self {
        self.slow_after = after;
        self
    }

    /// How long an operation waits before it is said to be slow (`None`: never).
    pub(crate) fn slow_after(&self) -> Option<std::time::Duration> {
        self.slow_after
    }

    /// An operation has waited long: printed at `warn` whatever the level, unless slow
    /// waits are not reported at all.
    pub(crate) fn slow(&self, args: fmt::Arguments<'_>) {
        if self.slow_after.is_some() {
            eprintln!("[ring] [rank {}] warning: {args}", self.rank);
        }
    }

    /// A log that prints nothing.
    pub(crate) fn off() -> Self {
        Self::new(LogLevel::Off, 0)
    }

    fn emit(&self, at: LogLevel, args: fmt::Arguments<'_>) {
        if self.level >= at && at != LogLevel::Off {
            eprintln!("[ring] [rank {}] {args}", self.rank);
        }
    }

    /// Errors: a group failed.
    pub(crate) fn error(&self, args: fmt::Arguments<'_>) {
        self.emit(LogLevel::Error, args);
    }

    /// Warnings: a rejected connection.
    pub(crate) fn warn(&self, args: fmt::Arguments<'_>) {
        self.emit(LogLevel::Warn, args);
    }

    /// Progress of connection setup (MLX_RING_VERBOSE).
    pub(crate) fn info(&self, args: fmt::Arguments<'_>) {
        self.emit(LogLevel::Info, args);
    }

    /// Details.
    pub(crate) fn debug(&self, args: fmt::Arguments<'_>) {
        self.emit(LogLevel::Debug, args);
    }
}
