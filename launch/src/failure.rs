//! Which rank failed first, and the summary that names it.
//!
//! When one rank of a ring fails, its neighbours fail too, a moment later, each blaming the
//! connection it lost ("the connection was closed by the peer"); the launcher then stops the
//! rest. Reporting the lowest-numbered rank that failed, or the first one reaped in rank
//! order, names a victim as often as the culprit. So the supervisor records *when* it saw
//! each rank end (the poll that reaped it, every 20 ms, and the time since the start), and
//! [`culprit`] picks the first failure by time:
//!
//! - a rank the launcher stopped never counts, whatever its status;
//! - among the failures seen within [`SETTLE`] of the first one (a panicking rank may close
//!   its sockets while it unwinds, so its peers can end in the same poll or the one before
//!   it is reaped), one whose last lines do not blame a peer ([`blames_a_peer`]) wins;
//! - then the earliest poll, then the lowest rank.
//!
//! [`summary`] renders what the user reads: the culprit, its status or signal name and its
//! last lines, MLX's `Node with rank R exited with code C` line for every rank (the culprit
//! first: users grep for them), and one line for what the others did in consequence. The
//! culprit is never called "killed": only ranks the launcher stopped are.
//!
//! Everything here is pure (exits in, lines out), so that it is unit-tested; `main.rs`
//! observes the processes.

use std::time::Duration;

/// How long after the first failure another one may still be the culprit (see the module
/// docs); the supervisor also waits this long before stopping the other ranks, so that a
/// culprit already exiting is reaped as a failure rather than stopped.
pub(crate) const SETTLE: Duration = Duration::from_millis(250);

/// How many of a rank's last lines the summary shows.
pub(crate) const TAIL_LINES: usize = 5;

/// A rank's last lines as the summary shows them: the last [`TAIL_LINES`], except that a
/// panic's message (the `panicked at` line and the message after it) is kept whatever
/// follows it, since a backtrace (`RUST_BACKTRACE`) or the test harness's report would push
/// it out of any short tail.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tail {
    /// The last lines, oldest first.
    last: std::collections::VecDeque<String>,
    /// The last panic's lines: from `panicked at` to the line before its backtrace or note.
    panic: Vec<String>,
    /// Whether the panic's message is still being read.
    in_panic: bool,
}

impl Tail {
    /// Adds a line (its end of line trimmed; empty lines are skipped).
    pub(crate) fn push(&mut self, line: &str) {
        let line = line.trim_end();
        if line.is_empty() {
            self.in_panic = false;
            return;
        }
        if line.contains("panicked at ") {
            self.panic = vec![line.to_owned()];
            self.in_panic = true;
        } else if self.in_panic {
            if line.starts_with("stack backtrace:")
                || line.starts_with("note: ")
                || self.panic.len() == TAIL_LINES
            {
                self.in_panic = false;
            } else {
                self.panic.push(line.to_owned());
            }
        }
        if self.last.len() == TAIL_LINES {
            self.last.pop_front();
        }
        self.last.push_back(line.to_owned());
    }

    /// The lines to show: the panic's when there was one, else the last ones.
    pub(crate) fn lines(&self) -> Vec<String> {
        if self.panic.is_empty() {
            self.last.iter().cloned().collect()
        } else {
            self.panic.clone()
        }
    }
}

/// How a rank ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

impl Ending {
    /// The status a shell reports: the code, or 128 + the signal.
    pub(crate) fn status(self) -> i32 {
        match self {
            Ending::Code(code) => code,
            Ending::Signal(sig) => 128 + sig,
        }
    }

    /// Whether it is a failure (anything but exit code 0).
    pub(crate) fn failed(self) -> bool {
        self != Ending::Code(0)
    }

    /// "exit code 101", "signal SIGKILL (status 137)".
    pub(crate) fn describe(self) -> String {
        match self {
            Ending::Code(code) => format!("exit code {code}"),
            Ending::Signal(sig) => format!("signal {} (status {})", signal_name(sig), 128 + sig),
        }
    }
}

/// What the supervisor saw of one rank's end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Exit {
    /// The rank.
    pub(crate) rank: usize,
    /// How it ended.
    pub(crate) ending: Ending,
    /// The poll in which its end was seen (0 for a rank that could not start).
    pub(crate) poll: u64,
    /// When its end was seen, since the job started.
    pub(crate) seen: Duration,
    /// Whether the launcher had stopped it (SIGTERM, SIGKILL) before it ended.
    pub(crate) stopped: bool,
    /// Its last lines of standard error (and of its terminal, for an ssh rank), oldest first.
    pub(crate) tail: Vec<String>,
}

/// The name of signal `sig` (`SIGKILL`), or `signal N` for one not in the table.
pub(crate) fn signal_name(sig: i32) -> String {
    const NAMES: [(i32, &str); 15] = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
    ];
    NAMES
        .iter()
        .find(|(n, _)| *n == sig)
        .map_or_else(|| format!("signal {sig}"), |(_, name)| (*name).to_owned())
}

/// Whether a rank's last lines (or a recorded error) say it failed because of a peer (a
/// closed connection, a silent link, a wait for a peer past its deadline, an unreachable or
/// failed rank, a peer's notice that it failed, a group that had failed earlier): the words of nuvec-distributed's and MLX's
/// errors for a peer that left or stopped. Such a rank is a consequence, not a cause, when
/// the cause ended at about the same time.
pub(crate) fn blames_a_peer(tail: &[String]) -> bool {
    const WORDS: [&str; 11] = [
        "closed by the peer",
        "failed and left the group",
        "closed by rank",
        "connection was closed",
        "unreachable",
        "failed or exited",
        "Connection reset by peer",
        "link went silent",
        "the group failed earlier",
        "timed out after",
        "no progress for",
    ];
    tail.iter().any(|l| WORDS.iter().any(|w| l.contains(w)))
}

/// The index in `exits` of the first rank to fail (see the module docs), or `None` when no
/// rank failed on its own (every failure was a rank the launcher stopped).
pub(crate) fn culprit(exits: &[Exit]) -> Option<usize> {
    let failures: Vec<usize> = (0..exits.len())
        .filter(|&i| exits[i].ending.failed() && !exits[i].stopped)
        .collect();
    let first = failures.iter().map(|&i| exits[i].seen).min()?;
    failures
        .into_iter()
        .filter(|&i| exits[i].seen <= first + SETTLE)
        .min_by_key(|&i| {
            let e = &exits[i];
            (blames_a_peer(&e.tail), e.poll, e.rank)
        })
}

/// How a summary line is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// `[ERROR]`.
    Error,
    /// `[WARN]`.
    Warn,
}

/// MLX's line for one rank's end: `Node with rank R exited with code C`, with the signal's
/// name for a signal, and "was killed" only for a rank the launcher stopped.
fn node_line(e: &Exit) -> String {
    let rank = e.rank;
    match (e.stopped, e.ending) {
        (true, _) => format!(
            "Node with rank {rank} was killed (stopped by the launcher, {})",
            e.ending.describe()
        ),
        (false, Ending::Code(code)) => format!("Node with rank {rank} exited with code {code}"),
        (false, Ending::Signal(sig)) => format!(
            "Node with rank {rank} exited with code {} (signal {})",
            128 + sig,
            signal_name(sig)
        ),
    }
}

/// "rank 2", "ranks 0, 2, 3".
pub(crate) fn ranks_text(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
    match ranks.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

/// The failure summary for `exits` (every rank's end, in the order seen): the culprit and
/// its last lines, the `Node with rank R ...` lines (culprit first, then the order seen) and
/// what the others did in consequence. Empty when no rank failed. The job's status is the
/// culprit's ([`Ending::status`]).
pub(crate) fn summary(exits: &[Exit]) -> Vec<(Level, String)> {
    let mut lines = Vec::new();
    let Some(c) = culprit(exits) else {
        for e in exits.iter().filter(|e| e.ending.failed()) {
            lines.push((Level::Warn, node_line(e)));
        }
        return lines;
    };
    let cause = &exits[c];
    lines.push((
        Level::Error,
        format!(
            "rank {} failed first: {}, {:.2} s after the start",
            cause.rank,
            cause.ending.describe(),
            cause.seen.as_secs_f64()
        ),
    ));
    if cause.tail.is_empty() {
        lines.push((
            Level::Error,
            format!("rank {} printed nothing on stderr", cause.rank),
        ));
    } else {
        lines.push((Level::Error, format!("rank {}'s last lines:", cause.rank)));
        for l in &cause.tail {
            lines.push((Level::Error, format!("  {l}")));
        }
    }
    lines.push((Level::Warn, node_line(cause)));
    for (i, e) in exits.iter().enumerate() {
        if i != c && e.ending.failed() {
            lines.push((Level::Warn, node_line(e)));
        }
    }
    let (mut naming, mut erring, mut stopped, mut completed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, e) in exits.iter().enumerate() {
        if i == c {
            continue;
        }
        if e.stopped {
            stopped.push(e.rank);
        } else if !e.ending.failed() {
            completed.push(e.rank);
        } else if e.tail.iter().any(|l| names_rank(l, cause.rank)) {
            naming.push(e.rank);
        } else {
            erring.push(e.rank);
        }
    }
    let mut parts = Vec::new();
    if !naming.is_empty() {
        parts.push(format!(
            "{} exited with errors naming rank {}",
            ranks_text(&naming),
            cause.rank
        ));
    }
    if !erring.is_empty() {
        parts.push(format!("{} exited with errors", ranks_text(&erring)));
    }
    if !stopped.is_empty() {
        parts.push(format!("{} stopped by the launcher", ranks_text(&stopped)));
    }
    if !completed.is_empty() {
        parts.push(format!("{} completed", ranks_text(&completed)));
    }
    if !parts.is_empty() {
        lines.push((
            Level::Error,
            format!("in consequence: {}", parts.join("; ")),
        ));
    }
    lines
}

/// Whether `line` names `rank` as "rank N" with no digit after it: rank 1 is not named by
/// "rank 10" or "rank 12" (in a job of 12 ranks every line of rank 10 begins with its own name).
fn names_rank(line: &str, rank: usize) -> bool {
    let named = format!("rank {rank}");
    line.match_indices(&named)
        .any(|(at, _)| !line[at + named.len()..].starts_with(|c: char| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(rank: usize, ending: Ending, poll: u64, tail: &[&str]) -> Exit {
        Exit {
            rank,
            ending,
            poll,
            seen: Duration::from_millis(20 * poll),
            stopped: false,
            tail: tail.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn stopped(rank: usize, poll: u64) -> Exit {
        Exit {
            stopped: true,
            ..exit(rank, Ending::Signal(libc::SIGTERM), poll, &[])
        }
    }

    const CLOSED: &str = "distributed: rank 0: all_sum #1: the connection was closed by the peer";

    #[test]
    fn the_culprit_is_the_rank_that_failed_first_not_the_lowest_numbered() {
        // Rank 1 panicked; ranks 0 and 2 failed in consequence, reaped in the same poll.
        let exits = [
            exit(0, Ending::Code(3), 10, &[CLOSED]),
            exit(
                1,
                Ending::Code(101),
                10,
                &["thread 'main' panicked at x.rs:1:1:", "boom"],
            ),
            exit(2, Ending::Code(3), 10, &[CLOSED]),
            stopped(3, 23),
        ];
        assert_eq!(culprit(&exits), Some(1));
        // Seen one poll before the culprit, within the settling time, a victim still loses.
        let exits = [
            exit(0, Ending::Code(3), 9, &[CLOSED]),
            exit(1, Ending::Code(101), 10, &["boom"]),
        ];
        assert_eq!(culprit(&exits), Some(1));
        // Long before, the first failure is the first failure, whatever it says.
        let exits = [
            exit(0, Ending::Code(3), 1, &[CLOSED]),
            exit(1, Ending::Code(101), 100, &["boom"]),
        ];
        assert_eq!(culprit(&exits), Some(0));
        // In the same poll, with nothing to tell them apart: the lower rank.
        let exits = [
            exit(2, Ending::Code(1), 4, &[]),
            exit(1, Ending::Code(1), 4, &[]),
        ];
        assert_eq!(culprit(&exits), Some(1));
    }

    #[test]
    fn a_rank_the_launcher_stopped_is_never_the_culprit() {
        let exits = [
            stopped(0, 1),
            exit(1, Ending::Signal(libc::SIGKILL), 2, &[]),
        ];
        assert_eq!(culprit(&exits), Some(1));
        assert_eq!(culprit(&[stopped(0, 1), stopped(1, 1)]), None);
        assert_eq!(culprit(&[exit(0, Ending::Code(0), 1, &[])]), None);
    }

    #[test]
    fn the_summary_names_the_culprit_first_with_its_last_lines_and_the_consequences() {
        let exits = [
            exit(
                0,
                Ending::Code(3),
                10,
                &["rank 0: the connection was closed by rank 1"],
            ),
            exit(
                1,
                Ending::Code(101),
                10,
                &["thread 'main' panicked at x.rs:1:1:", "boom"],
            ),
            exit(2, Ending::Code(3), 11, &[CLOSED]),
            stopped(3, 23),
        ];
        let text: Vec<String> = summary(&exits).into_iter().map(|(_, l)| l).collect();
        assert_eq!(
            text,
            [
                "rank 1 failed first: exit code 101, 0.20 s after the start",
                "rank 1's last lines:",
                "  thread 'main' panicked at x.rs:1:1:",
                "  boom",
                "Node with rank 1 exited with code 101",
                "Node with rank 0 exited with code 3",
                "Node with rank 2 exited with code 3",
                "Node with rank 3 was killed (stopped by the launcher, signal SIGTERM (status 143))",
                "in consequence: rank 0 exited with errors naming rank 1; rank 2 exited with \
                 errors; rank 3 stopped by the launcher",
            ]
        );
    }

    #[test]
    fn a_rank_whose_number_begins_with_the_culprits_is_not_said_to_name_it() {
        // Rank 1 failed in a job of 12: rank 10's lines name only itself, rank 11's name rank 1.
        let exits = [
            exit(1, Ending::Code(101), 10, &["boom"]),
            exit(
                10,
                Ending::Code(3),
                11,
                &["distributed: rank 10: all_sum #1: timed out"],
            ),
            exit(
                11,
                Ending::Code(3),
                11,
                &["rank 11: the connection was closed by rank 1"],
            ),
        ];
        let text: Vec<String> = summary(&exits).into_iter().map(|(_, l)| l).collect();
        assert_eq!(
            text.last().map(String::as_str),
            Some(
                "in consequence: rank 11 exited with errors naming rank 1; rank 10 exited with errors"
            )
        );
        assert!(names_rank("closed by rank 1", 1));
        assert!(names_rank("rank 1: x", 1));
        assert!(!names_rank("rank 12: x", 1));
        assert!(names_rank("rank 12 and rank 1.", 1));
    }

    #[test]
    fn a_culprit_ended_by_a_signal_is_named_with_the_signal_and_never_killed() {
        let exits = [
            exit(1, Ending::Signal(libc::SIGKILL), 3, &[]),
            stopped(0, 15),
        ];
        let text: Vec<String> = summary(&exits).into_iter().map(|(_, l)| l).collect();
        assert_eq!(
            text[0],
            "rank 1 failed first: signal SIGKILL (status 137), 0.06 s after the start"
        );
        assert_eq!(
            text[2],
            "Node with rank 1 exited with code 137 (signal SIGKILL)"
        );
        assert!(
            text.iter()
                .filter(|l| l.contains("killed"))
                .all(|l| l.contains("rank 0"))
        );
        assert_eq!(Ending::Signal(libc::SIGKILL).status(), 137);
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        assert_eq!(signal_name(77), "signal 77");
    }

    #[test]
    fn a_panics_message_is_kept_past_its_backtrace_and_the_harness_report() {
        let mut tail = Tail::default();
        for l in [
            "starting",
            "thread 'main' panicked at src/main.rs:3:5:",
            "boom",
            "on two lines",
        ] {
            tail.push(l);
        }
        for i in 0..40 {
            tail.push(&format!("   {i}: frame"));
        }
        assert_eq!(
            tail.lines(),
            [
                "thread 'main' panicked at src/main.rs:3:5:",
                "boom",
                "on two lines",
                "   0: frame",
                "   1: frame"
            ]
        );
        let mut tail = Tail::default();
        for l in [
            "thread 'main' panicked at a.rs:1:1:",
            "boom",
            "stack backtrace:",
            "   0: x",
        ] {
            tail.push(l);
        }
        assert_eq!(
            tail.lines(),
            ["thread 'main' panicked at a.rs:1:1:", "boom"]
        );
        let mut tail = Tail::default();
        for i in 0..9 {
            tail.push(&format!("line {i}\n"));
        }
        tail.push("\n");
        assert_eq!(
            tail.lines(),
            ["line 4", "line 5", "line 6", "line 7", "line 8"]
        );
    }

    #[test]
    fn a_job_that_succeeded_has_no_summary() {
        assert!(summary(&[exit(0, Ending::Code(0), 1, &[])]).is_empty());
    }
}
