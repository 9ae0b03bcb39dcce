//! The ring's connection setup as a state machine without I/O: which connection to open or
//! accept next, in MLX's order, what to do when one is refused, times out or turns out to be a
//! stranger, and when the deadline has passed (reference §2.3).
//!
//! Rank r accepts one connection on each of its own addresses (from its left neighbour) and
//! opens one to each address of its right neighbour, address c being connection (link) c.
//! Every rank accepts first and then connects, except rank R−1, which connects to rank 0
//! first: that unrolls the chain without deadlock (MLX's order). The links are opened one
//! after the other, in order; each is retried, with a back-off from 10 ms doubling to 500 ms,
//! while its peer is not listening yet. Accepted connections arrive on any link, in any order.
//!
//! With a key, an opened connection is authenticated before the next link is opened (a
//! refusal that a new connection could cure is retried; a wrong proof fails at once), and
//! every accepted connection is authenticated beside the others, each within [`HANDSHAKE`] of
//! its arrival: the first to prove the key takes its link, and every other one (a stranger, a
//! slow one, one beyond [`MAX_PENDING`]) is dropped. Without a key the first connection
//! accepted on a link takes it, as MLX's.
//!
//! [`Setup`] is fed [`Event`]s and the time, and returns [`Action`]s, in the style of
//! [`auth`](super::auth) and of quinn-proto: [`Setup::poll`] gives the next thing to do,
//! [`Setup::handle`] takes what happened, and [`Setup::poll_note`] what is worth logging. The
//! socket driver (`connect.rs`) does nothing but what it is told, so every rule above is
//! tested (and fuzzed) without a socket.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::limits;

/// The longest an accepted connection may take to authenticate: a stranger that connects and
/// says nothing holds up setup for no longer than this.
pub const HANDSHAKE: Duration = Duration::from_secs(5);

/// How often a rank waiting for a connection says who it is still waiting for.
pub const PROGRESS: Duration = Duration::from_secs(5);

/// The most accepted connections authenticated at once; more are dropped at once (the opener
/// of the real neighbour retries).
pub const MAX_PENDING: usize = 64;

/// The longest one attempt to open a connection may wait (a `connect` with a timeout).
pub const ATTEMPT: Duration = Duration::from_secs(5);

/// The first back-off between attempts to open a link.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(10);

/// The longest back-off between attempts to open a link.
pub const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// The shortest time an attempt is given, even at the deadline.
pub const MIN_ATTEMPT: Duration = Duration::from_millis(1);

/// An accepted connection, as the driver numbers them (each number once).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Conn(pub u64);

/// What the driver saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The connection to the right neighbour's address `link` was made.
    Opened {
        /// The link.
        link: usize,
    },
    /// No connection to the right neighbour's address `link` could be made (refused, timed
    /// out, unreachable).
    OpenFailed {
        /// The link.
        link: usize,
        /// The last system error.
        why: String,
    },
    /// The opened connection of `link` authenticated its acceptor.
    OpenerAuthenticated {
        /// The link.
        link: usize,
    },
    /// The opened connection of `link` failed its handshake.
    OpenerRefused {
        /// The link.
        link: usize,
        /// Why.
        why: String,
        /// Whether a new connection may succeed (the connection failed, not the proof).
        retry: bool,
    },
    /// A connection arrived on this rank's address `link`.
    Arrived {
        /// The link (the listener it arrived on).
        link: usize,
        /// Its number.
        conn: Conn,
    },
    /// An accepted connection proved it holds the key.
    AcceptorAuthenticated {
        /// The connection.
        conn: Conn,
    },
    /// An accepted connection failed its handshake (closed, wrong proof, wrong link).
    AcceptorFailed {
        /// The connection.
        conn: Conn,
        /// Why.
        why: String,
    },
}

/// What the driver is to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Open a connection to the right neighbour's address `link`, waiting at most `within`,
    /// then report [`Event::Opened`] or [`Event::OpenFailed`].
    Open {
        /// The link.
        link: usize,
        /// Which attempt for this link, from 1.
        attempt: u32,
        /// The longest the attempt may wait.
        within: Duration,
    },
    /// Run the opener's half of the handshake on the opened connection of `link`, done by
    /// `until`, then report [`Event::OpenerAuthenticated`] or [`Event::OpenerRefused`].
    AuthenticateOpened {
        /// The link.
        link: usize,
        /// When the handshake must be done.
        until: Instant,
    },
    /// Start the acceptor's half of the handshake on `conn`, done by `until`, and report
    /// [`Event::AcceptorAuthenticated`] or [`Event::AcceptorFailed`] when it ends.
    AuthenticateAccepted {
        /// The connection.
        conn: Conn,
        /// When the handshake must be done (the setup drops it then).
        until: Instant,
    },
    /// `conn` is the accepted connection of `link`: keep it.
    Keep {
        /// The connection.
        conn: Conn,
        /// Its link.
        link: usize,
    },
    /// Close `conn`: it will not be part of the ring.
    Drop {
        /// The connection.
        conn: Conn,
        /// Its link.
        link: usize,
        /// Why.
        why: String,
    },
    /// Accept on every link of [`Setup::accepting`] and move every handshake on, reporting
    /// what happens; when nothing does, wait for the sockets until `until`.
    Wait {
        /// The latest time to look again.
        until: Instant,
    },
    /// Wait until `until` (a back-off before the next attempt); nothing is expected before.
    Sleep {
        /// When to go on.
        until: Instant,
    },
    /// Every connection is made: the ones opened and the ones kept.
    Done,
    /// The setup failed.
    Failed(Failure),
}

/// Why a setup failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The left neighbour never connected to `link` before the deadline.
    NeverConnected {
        /// The left neighbour.
        peer: usize,
        /// The first link without a connection.
        link: usize,
        /// The setup's timeout.
        timeout: Duration,
    },
    /// The right neighbour's address `link` could not be opened before the deadline.
    CannotConnect {
        /// The right neighbour.
        peer: usize,
        /// The link.
        link: usize,
        /// How many attempts were made.
        attempts: u32,
        /// The setup's timeout.
        timeout: Duration,
        /// What the last attempt saw.
        last: String,
        /// The last handshake that failed on a connection that was made, when the last
        /// attempt did not get that far.
        earlier: Option<String>,
    },
    /// The right neighbour refused the proof of `link` (a wrong key): no retry can help.
    AuthenticationFailed {
        /// The right neighbour.
        peer: usize,
        /// The link.
        link: usize,
        /// Why.
        why: String,
    },
}

/// What is worth logging.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// The accepting half starts.
    Accepting,
    /// The connecting half starts.
    Connecting,
    /// An attempt to open `link` failed; the next one is in `wait`.
    Retrying {
        /// The link.
        link: usize,
        /// The attempt that failed, from 1.
        attempt: u32,
        /// What it saw.
        last: String,
        /// The back-off.
        wait: Duration,
        /// The time left before the deadline.
        left: Duration,
    },
    /// Still no connection on `link` from the left neighbour.
    StillWaiting {
        /// The first link without a connection.
        link: usize,
        /// The time left before the deadline.
        left: Duration,
    },
    /// Every connection is made.
    Connected,
}

/// The two halves, in the order this rank runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Half {
    Accept,
    Connect,
}

/// Where the link being opened is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dial {
    /// Its next attempt is due.
    Ready,
    /// An attempt is under way.
    Opening,
    /// Its connection is being authenticated.
    Authenticating,
    /// Waiting before the next attempt.
    BackingOff(Instant),
}

/// An accepted connection being authenticated.
#[derive(Clone, Copy, Debug)]
struct Pending {
    conn: Conn,
    link: usize,
    until: Instant,
}

/// The connection setup of one rank of a ring (see the module docs).
#[derive(Debug)]
pub struct Setup {
    rank: usize,
    right: usize,
    left: usize,
    links: usize,
    keyed: bool,
    timeout: Duration,
    deadline: Instant,
    order: [Half; 2],
    /// Which of `order` runs (2: both are done).
    half: usize,
    started: bool,
    /// How many links are open (they open in order).
    opened: usize,
    dial: Dial,
    attempt: u32,
    backoff: Duration,
    last: String,
    /// The last handshake refused on a connection that was made, on this link.
    refused: Option<String>,
    accepted: Vec<Option<Conn>>,
    pending: Vec<Pending>,
    next_progress: Instant,
    actions: VecDeque<Action>,
    notes: VecDeque<Note>,
    outcome: Option<Action>,
}

impl Setup {
    /// The setup of rank `rank` of a ring of `size` ranks (at least 2) with `links`
    /// connections per neighbour (at least 1), authenticated when `keyed`, started at `now`
    /// and bounded by `timeout`.
    pub fn new(
        rank: usize,
        size: usize,
        links: usize,
        keyed: bool,
        now: Instant,
        timeout: Duration,
    ) -> Setup {
        let size = size.max(2);
        let rank = rank % size;
        let right = (rank + 1) % size;
        let left = (rank + size - 1) % size;
        let order = if rank < right {
            [Half::Accept, Half::Connect]
        } else {
            [Half::Connect, Half::Accept]
        };
        Setup {
            rank,
            right,
            left,
            links,
            keyed,
            timeout,
            deadline: limits::deadline(now, timeout),
            order,
            half: 0,
            started: false,
            opened: 0,
            dial: Dial::Ready,
            attempt: 0,
            backoff: FIRST_BACKOFF,
            last: String::from("no address"),
            refused: None,
            accepted: vec![None; links],
            pending: Vec::new(),
            next_progress: limits::deadline(now, PROGRESS),
            actions: VecDeque::new(),
            notes: VecDeque::new(),
            outcome: None,
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The right neighbour (the one connected to).
    pub fn right(&self) -> usize {
        self.right
    }

    /// The left neighbour (the one accepted from).
    pub fn left(&self) -> usize {
        self.left
    }

    /// When the whole setup must be done.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the driver should accept a new connection on `link` now: in the accepting
    /// half, while the link has no connection.
    pub fn accepting(&self, link: usize) -> bool {
        self.current() == Some(Half::Accept) && self.accepted.get(link) == Some(&None)
    }

    /// How many links are open, and which connection each link accepted.
    pub fn connections(&self) -> (usize, &[Option<Conn>]) {
        (self.opened, &self.accepted)
    }

    /// The next note to log, if any.
    pub fn poll_note(&mut self) -> Option<Note> {
        self.notes.pop_front()
    }

    fn current(&self) -> Option<Half> {
        if self.outcome.is_some() {
            return None;
        }
        self.order.get(self.half).copied()
    }

    /// Takes what the driver saw at `now`. An event the setup did not ask for (a link not
    /// being opened, a connection it does not know) is ignored, or the connection dropped.
    pub fn handle(&mut self, now: Instant, event: Event) {
        match event {
            Event::Arrived { link, conn } => self.arrived(now, link, conn),
            Event::AcceptorAuthenticated { conn } => {
                let Some(at) = self.pending.iter().position(|p| p.conn == conn) else {
                    return;
                };
                let p = self.pending.swap_remove(at);
                if self.accepted[p.link].is_none() && self.current() == Some(Half::Accept) {
                    self.take(p.link, conn);
                } else {
                    self.drop_conn(conn, p.link, "the connection is taken".into());
                }
            }
            Event::AcceptorFailed { conn, why } => {
                if let Some(at) = self.pending.iter().position(|p| p.conn == conn) {
                    let p = self.pending.swap_remove(at);
                    self.drop_conn(conn, p.link, why);
                }
            }
            Event::Opened { link } if self.dialling(link, Dial::Opening) => {
                if self.keyed && now >= self.deadline {
                    // Connected with no time left to authenticate: the attempt counts as
                    // failed, and setup fails by its deadline rather than waiting past it.
                    self.last = "it connected at the deadline, with no time left to \
                                 authenticate"
                        .into();
                    self.retry(now);
                } else if self.keyed {
                    self.dial = Dial::Authenticating;
                    let until = limits::deadline(now, HANDSHAKE).min(self.deadline);
                    self.actions
                        .push_back(Action::AuthenticateOpened { link, until });
                } else {
                    self.link_opened();
                }
            }
            Event::OpenFailed { link, why } if self.dialling(link, Dial::Opening) => {
                self.last = why;
                self.retry(now);
            }
            Event::OpenerAuthenticated { link } if self.dialling(link, Dial::Authenticating) => {
                self.link_opened();
            }
            Event::OpenerRefused { link, why, retry }
                if self.dialling(link, Dial::Authenticating) =>
            {
                if !retry {
                    self.fail(Failure::AuthenticationFailed {
                        peer: self.right,
                        link,
                        why,
                    });
                    return;
                }
                self.last = format!("the authentication failed: {why}");
                self.refused = Some(why);
                self.retry(now);
            }
            Event::Opened { .. }
            | Event::OpenFailed { .. }
            | Event::OpenerAuthenticated { .. }
            | Event::OpenerRefused { .. } => {}
        }
    }

    /// The next thing to do at `now`.
    pub fn poll(&mut self, now: Instant) -> Action {
        if let Some(action) = self.actions.pop_front() {
            return action;
        }
        if let Some(outcome) = &self.outcome {
            return outcome.clone();
        }
        if !self.started {
            self.started = true;
            self.enter(now);
        }
        match self.current() {
            Some(Half::Accept) => self.poll_accept(now),
            Some(Half::Connect) => self.poll_connect(now),
            None => {
                let outcome = self.outcome.get_or_insert(Action::Done);
                outcome.clone()
            }
        }
    }

    fn poll_accept(&mut self, now: Instant) -> Action {
        // Handshakes out of time are dropped, however far they got.
        let mut i = 0;
        while i < self.pending.len() {
            if now >= self.pending[i].until {
                let p = self.pending.swap_remove(i);
                let why = format!(
                    "it did not authenticate within {:?} of connecting",
                    HANDSHAKE.min(self.timeout)
                );
                self.drop_conn(p.conn, p.link, why);
            } else {
                i += 1;
            }
        }
        if let Some(action) = self.actions.pop_front() {
            return action;
        }
        let Some(missing) = self.accepted.iter().position(Option::is_none) else {
            self.next_half(now);
            return self.poll(now);
        };
        if now >= self.deadline {
            return self.fail(Failure::NeverConnected {
                peer: self.left,
                link: missing,
                timeout: self.timeout,
            });
        }
        if now >= self.next_progress {
            self.next_progress = limits::deadline(now, PROGRESS);
            self.notes.push_back(Note::StillWaiting {
                link: missing,
                left: self.deadline.saturating_duration_since(now),
            });
        }
        let until = self
            .pending
            .iter()
            .map(|p| p.until)
            .fold(self.deadline.min(self.next_progress), Instant::min);
        Action::Wait { until }
    }

    fn poll_connect(&mut self, now: Instant) -> Action {
        if self.opened == self.links {
            self.next_half(now);
            return self.poll(now);
        }
        match self.dial {
            Dial::BackingOff(until) if now < until => Action::Sleep { until },
            Dial::Ready | Dial::BackingOff(_) => {
                self.dial = Dial::Opening;
                self.attempt += 1;
                let within = self
                    .deadline
                    .saturating_duration_since(now)
                    .max(MIN_ATTEMPT)
                    .min(ATTEMPT);
                Action::Open {
                    link: self.opened,
                    attempt: self.attempt,
                    within,
                }
            }
            // The driver runs the attempt or the handshake it was given and reports it; a
            // poll in between has nothing new to say.
            Dial::Opening | Dial::Authenticating => Action::Sleep { until: now },
        }
    }

    fn arrived(&mut self, now: Instant, link: usize, conn: Conn) {
        if link >= self.links || !self.accepting(link) {
            self.drop_conn(conn, link, "the connection is taken".into());
            return;
        }
        if !self.keyed {
            self.take(link, conn);
            return;
        }
        if self.pending.len() >= MAX_PENDING {
            self.drop_conn(
                conn,
                link,
                format!("{MAX_PENDING} connections are authenticating already"),
            );
            return;
        }
        if now >= self.deadline {
            self.drop_conn(
                conn,
                link,
                "it arrived at the deadline, with no time left to authenticate".into(),
            );
            return;
        }
        let until = limits::deadline(now, HANDSHAKE).min(self.deadline);
        self.pending.push(Pending { conn, link, until });
        self.actions
            .push_back(Action::AuthenticateAccepted { conn, until });
    }

    /// `conn` takes `link`; every other connection waiting for it is dropped.
    fn take(&mut self, link: usize, conn: Conn) {
        self.accepted[link] = Some(conn);
        self.actions.push_back(Action::Keep { conn, link });
        let (others, rest): (Vec<Pending>, Vec<Pending>) =
            self.pending.drain(..).partition(|p| p.link == link);
        self.pending = rest;
        for p in others {
            self.drop_conn(p.conn, link, "the connection is taken".into());
        }
    }

    fn drop_conn(&mut self, conn: Conn, link: usize, why: String) {
        self.actions.push_back(Action::Drop { conn, link, why });
    }

    fn dialling(&self, link: usize, dial: Dial) -> bool {
        self.current() == Some(Half::Connect) && link == self.opened && self.dial == dial
    }

    fn link_opened(&mut self) {
        self.opened += 1;
        self.dial = Dial::Ready;
        self.attempt = 0;
        self.backoff = FIRST_BACKOFF;
        self.last = String::from("no address");
        self.refused = None;
    }

    /// After a failed attempt at `now`: back off, or fail when the back-off would reach the
    /// deadline.
    fn retry(&mut self, now: Instant) {
        let wait = self.backoff;
        if limits::deadline(now, wait) >= self.deadline {
            let earlier = match &self.refused {
                Some(why) if !self.last.starts_with("the authentication") => Some(why.clone()),
                _ => None,
            };
            self.fail(Failure::CannotConnect {
                peer: self.right,
                link: self.opened,
                attempts: self.attempt,
                timeout: self.timeout,
                last: self.last.clone(),
                earlier,
            });
            return;
        }
        self.notes.push_back(Note::Retrying {
            link: self.opened,
            attempt: self.attempt,
            last: self.last.clone(),
            wait,
            left: self.deadline.saturating_duration_since(now),
        });
        self.dial = Dial::BackingOff(limits::deadline(now, wait));
        self.backoff = (wait * 2).min(MAX_BACKOFF);
    }

    fn enter(&mut self, now: Instant) {
        match self.current() {
            Some(Half::Accept) => {
                self.next_progress = limits::deadline(now, PROGRESS);
                self.notes.push_back(Note::Accepting);
            }
            Some(Half::Connect) => self.notes.push_back(Note::Connecting),
            None => {}
        }
    }

    fn next_half(&mut self, now: Instant) {
        self.half += 1;
        if self.half == self.order.len() {
            self.notes.push_back(Note::Connected);
            for p in std::mem::take(&mut self.pending) {
                self.drop_conn(p.conn, p.link, "the connection is taken".into());
            }
        } else {
            self.enter(now);
        }
    }

    fn fail(&mut self, failure: Failure) -> Action {
        let action = Action::Failed(failure);
        self.outcome = Some(action.clone());
        action
    }
}

#[cfg(test)]
mod tests;
