//! What a fabric consults while a step waits: a [`Liveness`] watcher that can tell, without
//! sending anything, that a peer is gone, and a progress timeout that bounds how long a wait
//! may go without moving a byte.
//!
//! A fabric holds one [`Watch`] for its whole life and calls [`Watch::waiting`] whenever a
//! step cannot progress. The watch checks its watcher only once the step has been silent for
//! [`QUIET`] and at most every [`CHECK_EVERY`] (on the fabric's clock, across steps), so a
//! step that keeps moving never pays for it, and a fabric that parks asks
//! [`Watch::wake_by`] how long it may sleep. When a check finds a peer gone, the step fails
//! with [`FailureKind::Gone`](super::FailureKind::Gone); [`blame`] says which transfer the
//! error names. When a step fails for any reason, the fabric calls [`Watch::failed`], which
//! lets the watcher tell the other ranks the only way it can without sending anything.
//!
//! Why the silence first: a rank that leaves cleanly after its last operation looks exactly
//! like one that died (its sockets close either way), while a slower rank may still be
//! waiting for the last bytes of the same operation from a live peer. Those bytes are in
//! flight; only a step that has heard nothing for [`QUIET`] takes a closed peer for a dead
//! one.
//!
//! A watch also carries the [`Patience`] of the communicator above it: while a step waits
//! past the moment it gives ([`Patience::due`]), the fabric hands it a [`Stall`] (the
//! transfer waited on longest, how far it got, whether its link is alive) and the
//! communicator says what its operation waits for. The fabric knows transfers, links and
//! time; the communicator knows operations: neither needs the other's words.
//!
//! Uses nothing of the crate but the fabric's own vocabulary.

use std::fmt;
use std::time::Duration;

use super::{Channel, Direction, FabricError, FailureKind, Transfer};

/// How often, at most, a waiting step consults its watcher.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// How long a step must have made no progress before its watcher is consulted.
pub const QUIET: Duration = Duration::from_millis(100);

/// A peer found gone by a [`Liveness`] watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gone {
    /// The rank whose connection closed.
    pub peer: usize,
    /// Whether `peer` itself is the rank that is gone (`false`: `peer` may only be passing on
    /// that another rank is gone, so the error blames the transfer this rank has waited
    /// longest on).
    pub itself: bool,
    /// What was seen, naming the rank.
    pub what: String,
}

/// Something that can tell, without sending anything, whether the other ranks of a group are
/// still there (JACCL's side channel).
pub trait Liveness: Send {
    /// Looks, without waiting and without sending, whether a watched peer is gone.
    fn check(&mut self) -> Option<Gone>;

    /// The group has failed: tell the other ranks, as far as this watcher can without sending
    /// anything (closing its connections).
    fn failed(&mut self);
}

/// What a slow step is waiting for: the transfer it has waited on longest (see
/// [`most_stuck`](super::most_stuck)) and what the fabric knows of its link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stall {
    /// The transfer's channel (its peer and link).
    pub channel: Channel,
    /// Whether it sends or receives.
    pub direction: Direction,
    /// Bytes of it moved so far.
    pub done: usize,
    /// Bytes it has to move.
    pub total: usize,
    /// How long ago bytes last came from the peer (`None`: never, or not known).
    pub heard_ago: Option<Duration>,
    /// Whether the link is known to be alive (its peer's kernel acknowledges and answers
    /// keepalive probes within the link timeout); `None`: the fabric cannot tell.
    pub alive: Option<bool>,
}

/// Who is told that a step waits long: the communicator above the fabric, which knows the
/// operation the step belongs to. Called on the fabric's thread while a step waits, never
/// while it moves bytes.
pub trait Patience: Send {
    /// When, on the fabric's clock, the next report is due (`None`: none is, no operation is
    /// running or reports are off).
    fn due(&self) -> Option<Duration>;

    /// A step is still waiting at `now`, past [`due`](Self::due), for `stall`; the next
    /// [`due`](Self::due) must be later than `now`.
    fn report(&mut self, now: Duration, stall: &Stall);
}

/// Why a waiting step must stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The watcher found a peer gone.
    Gone(Gone),
    /// The step made no progress for longer than the progress timeout.
    NoProgress {
        /// How long it had made none.
        waited: Duration,
        /// The progress timeout.
        limit: Duration,
    },
}

impl Stop {
    /// The gone peer, when that is why.
    pub fn gone(&self) -> Option<&Gone> {
        match self {
            Stop::Gone(g) => Some(g),
            Stop::NoProgress { .. } => None,
        }
    }

    /// The failure of transfer `blamed` of `step` (which had moved `done` bytes), or of this
    /// rank `rank` when no transfer is open.
    pub fn failure(
        self,
        step: &[Transfer<'_>],
        blamed: Option<usize>,
        done: usize,
        rank: usize,
    ) -> FabricError {
        let kind = match self {
            Stop::Gone(g) => FailureKind::Gone(g.what),
            Stop::NoProgress { waited, limit } => FailureKind::NoProgress { waited, limit },
        };
        match blamed.and_then(|i| step.get(i)) {
            Some(t) => FabricError {
                channel: t.channel(),
                direction: t.direction(),
                done,
                total: t.len(),
                kind,
            },
            None => FabricError {
                channel: Channel::new(rank, 0),
                direction: Direction::Recv,
                done: 0,
                total: 0,
                kind,
            },
        }
    }
}

/// A fabric's watcher and progress timeout; the default watches nothing and has no progress
/// timeout.
///
/// A fabric holds one for its whole life and calls [`waiting`](Self::waiting) whenever a step
/// cannot progress: the watcher is consulted only once the step has heard nothing for
/// [`QUIET`], and at most every [`CHECK_EVERY`] (across steps), so a step that keeps moving
/// never pays for it. The silence comes first because a rank that leaves cleanly after its
/// last operation looks exactly like one that died, while a slower rank may still be waiting
/// for the last bytes of that operation from a live peer. When a step fails for any reason
/// the fabric calls [`failed`](Self::failed), and the watcher tells the other ranks.
#[derive(Default)]
pub struct Watch {
    liveness: Option<Box<dyn Liveness>>,
    progress: Option<Duration>,
    /// Who is told that a step waits long.
    patience: Option<Box<dyn Patience>>,
    /// When the watcher was last consulted, on the fabric's clock.
    checked: Option<Duration>,
    /// The first peer found gone: every later wait stops with it.
    gone: Option<Gone>,
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch")
            .field("liveness", &self.liveness.is_some())
            .field("progress", &self.progress)
            .field("patience", &self.patience.is_some())
            .field("gone", &self.gone)
            .finish()
    }
}

impl Watch {
    /// A watch over `liveness` (none: no peer is ever found gone) with a progress timeout
    /// (`None`: only the step's own deadline bounds a wait).
    pub fn new(liveness: Option<Box<dyn Liveness>>, progress: Option<Duration>) -> Self {
        Self {
            liveness,
            progress: progress.filter(|p| !p.is_zero()),
            patience: None,
            checked: None,
            gone: None,
        }
    }

    /// Tells `patience` when a step waits long (replacing any before).
    pub fn set_patience(&mut self, patience: Box<dyn Patience>) {
        self.patience = Some(patience);
    }

    /// Whether a report of a slow step is due at `now`.
    pub fn report_due(&self, now: Duration) -> bool {
        self.patience
            .as_ref()
            .and_then(|p| p.due())
            .is_some_and(|due| now >= due)
    }

    /// Reports that a step still waits at `now` for `stall`.
    pub fn report(&mut self, now: Duration, stall: &Stall) {
        if let Some(p) = self.patience.as_mut() {
            p.report(now, stall);
        }
    }

    /// Whether this watch does anything at all.
    pub fn is_idle(&self) -> bool {
        self.liveness.is_none() && self.progress.is_none()
    }

    /// Called by a step that cannot progress, at `now`, having made its last progress (or
    /// started) at `quiet_since`: whether it must stop.
    pub fn waiting(&mut self, now: Duration, quiet_since: Duration) -> Result<(), Stop> {
        let silent = now.saturating_sub(quiet_since);
        if let Some(limit) = self.progress
            && silent >= limit
        {
            return Err(Stop::NoProgress {
                waited: silent,
                limit,
            });
        }
        if silent < QUIET {
            return Ok(());
        }
        if let Some(gone) = &self.gone {
            return Err(Stop::Gone(gone.clone()));
        }
        let Some(liveness) = self.liveness.as_mut() else {
            return Ok(());
        };
        if self
            .checked
            .is_some_and(|at| now.saturating_sub(at) < CHECK_EVERY)
        {
            return Ok(());
        }
        self.checked = Some(now);
        match liveness.check() {
            Some(gone) => {
                self.gone = Some(gone.clone());
                Err(Stop::Gone(gone))
            }
            None => Ok(()),
        }
    }

    /// The latest instant (on the fabric's clock) a parked step may sleep to, so that
    /// [`waiting`](Self::waiting) runs when a check or the progress timeout is due and a
    /// report when one is; `None`: only the step's deadline matters.
    pub fn wake_by(&self, quiet_since: Duration) -> Option<Duration> {
        let report = self.patience.as_ref().and_then(|p| p.due());
        match (self.wake_for_watch(quiet_since), report) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// [`wake_by`](Self::wake_by) for the watcher and the progress timeout alone.
    fn wake_for_watch(&self, quiet_since: Duration) -> Option<Duration> {
        let progress = self.progress.map(|p| quiet_since.saturating_add(p));
        let check = self.liveness.as_ref().map(|_| {
            let quiet = quiet_since.saturating_add(QUIET);
            match self.checked {
                Some(at) => quiet.max(at.saturating_add(CHECK_EVERY)),
                None => quiet,
            }
        });
        match (progress, check) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The step failed (for any reason): the group is failed, and the watcher tells the other
    /// ranks what it can.
    pub fn failed(&mut self) {
        if let Some(liveness) = self.liveness.as_mut() {
            liveness.failed();
        }
    }
}

/// The transfer a [`Stop`] fails: for a peer that is [`itself`](Gone::itself) gone, an
/// unfinished transfer with it (receives first); otherwise the unfinished transfer whose peer
/// was heard from least recently (never first, receives before sends), since a rank that
/// passes on a death keeps talking until it does. `done(i)`: whether transfer `i` finished;
/// `heard(peer)`: when bytes last came from `peer`. `None` when every transfer is done.
pub fn blame(
    step: &[Transfer<'_>],
    done: impl Fn(usize) -> bool,
    heard: impl Fn(usize) -> Option<Duration>,
    gone: Option<&Gone>,
) -> Option<usize> {
    let open = || (0..step.len()).filter(|&i| !done(i) && !step[i].is_empty());
    let recv_first = |i: &usize| step[*i].direction() != Direction::Recv;
    if let Some(g) = gone.filter(|g| g.itself)
        && let Some(i) = open()
            .filter(|&i| step[i].channel().peer == g.peer)
            .min_by_key(recv_first)
    {
        return Some(i);
    }
    open().min_by_key(|&i| (heard(step[i].channel().peer), recv_first(&i)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{Channel, Landing};

    struct Script(Vec<Option<Gone>>, usize);

    impl Liveness for Script {
        fn check(&mut self) -> Option<Gone> {
            self.1 += 1;
            self.0.pop().flatten()
        }
        fn failed(&mut self) {}
    }

    fn gone(peer: usize) -> Gone {
        Gone {
            peer,
            itself: true,
            what: format!("rank {peer} is gone"),
        }
    }

    const MS: Duration = Duration::from_millis(1);
    const T0: Duration = Duration::ZERO;

    #[test]
    fn a_step_is_checked_only_once_silent_and_at_most_every_period() {
        let mut w = Watch::new(Some(Box::new(Script(vec![None; 10], 0))), None);
        // Not silent long enough: no check.
        assert_eq!(w.waiting(50 * MS, T0), Ok(()));
        assert_eq!(w.checked, None);
        assert_eq!(w.wake_by(T0), Some(QUIET));
        // Silent for QUIET: checked, then not again within the period.
        assert_eq!(w.waiting(100 * MS, T0), Ok(()));
        assert_eq!(w.checked, Some(100 * MS));
        assert_eq!(w.waiting(200 * MS, T0), Ok(()));
        assert_eq!(w.checked, Some(100 * MS));
        assert_eq!(w.wake_by(T0), Some(350 * MS));
        assert_eq!(w.waiting(350 * MS, T0), Ok(()));
        assert_eq!(w.checked, Some(350 * MS));
    }

    #[test]
    fn a_gone_peer_stops_every_later_wait() {
        let mut w = Watch::new(Some(Box::new(Script(vec![Some(gone(2))], 0))), None);
        assert_eq!(w.waiting(QUIET, T0), Err(Stop::Gone(gone(2))));
        // Sticky, without asking the watcher again.
        assert_eq!(w.waiting(QUIET + MS, T0), Err(Stop::Gone(gone(2))));
    }

    #[test]
    fn the_progress_timeout_bounds_a_silent_wait_and_zero_is_off() {
        let mut w = Watch::new(None, Some(2 * QUIET));
        assert!(!w.is_idle());
        assert_eq!(w.waiting(QUIET, T0), Ok(()));
        assert_eq!(w.wake_by(T0), Some(2 * QUIET));
        assert_eq!(
            w.waiting(2 * QUIET, T0),
            Err(Stop::NoProgress {
                waited: 2 * QUIET,
                limit: 2 * QUIET
            })
        );
        let mut off = Watch::new(None, Some(Duration::ZERO));
        assert!(off.is_idle());
        assert_eq!(off.waiting(Duration::from_secs(3600), T0), Ok(()));
        assert_eq!(off.wake_by(T0), None);
    }

    /// Reports every `every` from `next`, keeping what it was told.
    struct Every {
        next: Duration,
        every: Duration,
        told: std::sync::Arc<std::sync::Mutex<Vec<(Duration, Stall)>>>,
    }

    impl Patience for Every {
        fn due(&self) -> Option<Duration> {
            Some(self.next)
        }
        fn report(&mut self, now: Duration, stall: &Stall) {
            self.told
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((now, stall.clone()));
            self.next = now + self.every;
        }
    }

    #[test]
    fn a_report_is_due_at_the_time_its_patience_gives_and_wakes_a_parked_step_for_it() {
        let told = std::sync::Arc::default();
        let mut w = Watch::new(None, None);
        assert!(!w.report_due(Duration::from_secs(3600)));
        assert_eq!(w.wake_by(T0), None);
        w.set_patience(Box::new(Every {
            next: 500 * MS,
            every: 500 * MS,
            told: std::sync::Arc::clone(&told),
        }));
        assert!(w.is_idle(), "patience alone stops no step");
        assert_eq!(w.wake_by(T0), Some(500 * MS));
        assert!(!w.report_due(499 * MS));
        assert!(w.report_due(500 * MS));
        let stall = Stall {
            channel: Channel::new(1, 0),
            direction: Direction::Recv,
            done: 3,
            total: 8,
            heard_ago: Some(400 * MS),
            alive: Some(true),
        };
        w.report(600 * MS, &stall);
        assert!(!w.report_due(700 * MS));
        assert_eq!(w.wake_by(T0), Some(1100 * MS));
        // A progress timeout earlier than the report wakes the step first.
        let progress = Watch {
            progress: Some(200 * MS),
            ..w
        };
        assert_eq!(progress.wake_by(T0), Some(200 * MS));
        let told = told
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert_eq!(*told, vec![(600 * MS, stall)]);
    }

    #[test]
    fn the_blame_goes_to_the_gone_peer_or_to_the_one_heard_from_least_recently() {
        let (mut a, mut b, mut c) = ([0u8; 4], [0u8; 4], [0u8; 4]);
        let data = [1u8; 4];
        let step = [
            Transfer::Send {
                channel: Channel::new(0, 0),
                data: &data,
            },
            Transfer::Recv {
                channel: Channel::new(0, 0),
                landing: Landing::Into(&mut a),
            },
            Transfer::Recv {
                channel: Channel::new(2, 0),
                landing: Landing::Into(&mut b),
            },
            Transfer::Recv {
                channel: Channel::new(3, 0),
                landing: Landing::Into(&mut c),
            },
        ];
        let heard = |p: usize| match p {
            0 => Some(900 * MS),
            2 => Some(100 * MS),
            _ => Some(500 * MS),
        };
        let none_done = |_| false;
        // Rank 0 passed a death on: the peer heard from least recently is blamed.
        let relayed = Gone {
            itself: false,
            ..gone(0)
        };
        assert_eq!(blame(&step, none_done, heard, Some(&relayed)), Some(2));
        // Rank 3 itself is gone: its receive.
        assert_eq!(blame(&step, none_done, heard, Some(&gone(3))), Some(3));
        // Rank 0 itself: its receive before its send.
        assert_eq!(blame(&step, none_done, heard, Some(&gone(0))), Some(1));
        // A gone peer with nothing open here: the least recently heard.
        assert_eq!(blame(&step, none_done, heard, Some(&gone(7))), Some(2));
        assert_eq!(blame(&step, |_| true, heard, None), None);
    }
}
