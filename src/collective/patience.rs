//! Saying that an operation waits long: the [`Patience`] a communicator's core gives its
//! fabric.
//!
//! The core marks the operation that is running ([`Running::begin`], [`Running::end`]); the
//! fabric, while a step of it waits past the time the [`Reporter`] gives, hands it the transfer
//! it waits on longest, and the reporter logs one line, whatever the log level:
//!
//! ```text
//! [ring] [rank 2] warning: all_sum #14 (64 MiB) has waited 60 s for rank 1 (link 0,
//! 12 MiB of 48 MiB received; the link is alive, last byte 58 s ago)
//! ```
//!
//! The first line comes `NUVEC_DISTRIBUTED_WARN_AFTER` after the operation started, then one
//! every interval while it still waits. A slow peer is not a failure: the line says who is
//! slow, so that a job that seems to hang tells why (a rank writing a checkpoint, a stopped
//! process), while the operation keeps waiting for as long as its links are alive.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use crate::config::log::Log;
use crate::fabric::{Direction, Patience, Stall};
use crate::sync::Mutex;

/// The operation that is running, as a report names it.
#[derive(Clone, Copy, Debug)]
struct Operation {
    seq: u64,
    op: &'static str,
    bytes: usize,
    /// When it started, on the fabric's clock.
    start: Duration,
    /// When the next report is due.
    next: Duration,
}

/// The operation a core is running, shared with its [`Reporter`] (none between operations).
#[derive(Clone, Default)]
pub(crate) struct Running(Arc<Mutex<Option<Operation>>>);

impl Running {
    /// Operation `op` #`seq` of `bytes` starts at `start`; its first report is due `after`
    /// later (`None`: it is never reported).
    pub(crate) fn begin(
        &self,
        seq: u64,
        op: &'static str,
        bytes: usize,
        start: Duration,
        after: Option<Duration>,
    ) {
        *self.lock() = after.map(|after| Operation {
            seq,
            op,
            bytes,
            start,
            next: start.saturating_add(after),
        });
    }

    /// The operation is over.
    pub(crate) fn end(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, Option<Operation>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Logs, every interval, what the running operation waits for.
pub(crate) struct Reporter {
    running: Running,
    log: Log,
    every: Duration,
}

impl Reporter {
    /// A reporter of `running` to `log`, every `every`.
    pub(crate) fn new(running: Running, log: Log, every: Duration) -> Self {
        Self {
            running,
            log,
            every,
        }
    }
}

impl Patience for Reporter {
    fn due(&self) -> Option<Duration> {
        self.running.lock().map(|o| o.next)
    }

    fn report(&mut self, now: Duration, stall: &Stall) {
        let mut running = self.running.lock();
        let Some(o) = running.as_mut() else {
            return;
        };
        while o.next <= now {
            o.next = o
                .next
                .saturating_add(self.every.max(Duration::from_millis(1)));
        }
        let line = describe(o, now, stall);
        drop(running);
        self.log.slow(format_args!("{line}"));
    }
}

/// Two [`Patience`]s as one: the log's reports and the flight recorder's notes.
pub(crate) struct Both(pub(crate) Box<dyn Patience>, pub(crate) Box<dyn Patience>);

impl Patience for Both {
    fn due(&self) -> Option<Duration> {
        match (self.0.due(), self.1.due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn report(&mut self, now: Duration, stall: &Stall) {
        for p in [&mut self.0, &mut self.1] {
            if p.due().is_some_and(|due| due <= now) {
                p.report(now, stall);
            }
        }
    }
}

/// The report of operation `o` at `now`, waiting for `stall`.
fn describe(o: &Operation, now: Duration, stall: &Stall) -> String {
    let moved = match stall.direction {
        Direction::Recv => "received",
        Direction::Send => "sent",
    };
    let link = match stall.alive {
        Some(true) => "the link is alive",
        Some(false) => "the link is silent",
        None => "the link's state is unknown",
    };
    let heard = match stall.heard_ago {
        Some(ago) => format!("last byte {} ago", seconds(ago)),
        None => "no byte yet".to_owned(),
    };
    format!(
        "{} #{} ({}) has waited {} for rank {} (link {}, {} of {} {moved}; {link}, {heard})",
        o.op,
        o.seq,
        size(o.bytes),
        seconds(now.saturating_sub(o.start)),
        stall.channel.peer,
        stall.channel.link,
        size(stall.done),
        size(stall.total),
    )
}

/// `d` in whole seconds, or tenths below ten.
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.0} s")
    }
}

/// `bytes` in the largest binary unit it has a whole one of.
fn size(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let digits = if value < 10.0 { 1 } else { 0 };
    format!("{value:.digits$} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::Channel;

    #[test]
    fn a_report_names_the_operation_the_peer_the_link_and_how_far_it_got() {
        let o = Operation {
            seq: 14,
            op: "all_sum",
            bytes: 64 << 20,
            start: Duration::from_secs(1),
            next: Duration::from_secs(61),
        };
        let stall = Stall {
            channel: Channel::new(1, 0),
            direction: Direction::Recv,
            done: 12 << 20,
            total: 48 << 20,
            heard_ago: Some(Duration::from_secs(58)),
            alive: Some(true),
        };
        assert_eq!(
            describe(&o, Duration::from_secs(61), &stall),
            "all_sum #14 (64 MiB) has waited 60 s for rank 1 (link 0, 12 MiB of 48 MiB received; \
             the link is alive, last byte 58 s ago)"
        );
    }

    #[test]
    fn reports_come_every_interval_while_an_operation_runs_and_none_between_operations() {
        let running = Running::default();
        let mut r = Reporter::new(running.clone(), Log::off(), Duration::from_secs(30));
        assert_eq!(r.due(), None);
        running.begin(3, "all_gather", 100, Duration::from_secs(5), Some(r.every));
        assert_eq!(r.due(), Some(Duration::from_secs(35)));
        let stall = Stall {
            channel: Channel::new(2, 1),
            direction: Direction::Send,
            done: 0,
            total: 100,
            heard_ago: None,
            alive: None,
        };
        // A report late by more than an interval skips to the next one still ahead.
        r.report(Duration::from_secs(70), &stall);
        assert_eq!(r.due(), Some(Duration::from_secs(95)));
        running.end();
        assert_eq!(r.due(), None);
        r.report(Duration::from_secs(100), &stall);
        assert_eq!(r.due(), None);
    }

    #[test]
    fn sizes_are_in_binary_units() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(64 << 20), "64 MiB");
        assert_eq!(size(3 << 30), "3.0 GiB");
    }
}
