//! Diagnostics on standard error, as MLX's `MLX_RING_VERBOSE` (lines start with `[ring]`).
//!
//! The level comes from `NUVEC_DISTRIBUTED_LOG` (off, error, warn, info, debug); the presence
//! of `MLX_RING_VERBOSE` makes it at least `info`, as in MLX.

use std::fmt;

pub(crate) use crate::config::env::LogLevel;

/// Where a rank's diagnostics go.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Log {
    level: LogLevel,
    rank: usize,
}

impl Log {
    /// A log for `rank` at `level`.
    pub(crate) fn new(level: LogLevel, rank: usize) -> Self {
        Self { level, rank }
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
