//! Target `ring_setup`: the ring's connection setup state machine fed random events and time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nuvec_distributed::internals::tcp::setup::{
    ATTEMPT, Action, Conn, Event, Failure, MAX_BACKOFF, MIN_ATTEMPT, Setup,
};

use super::script::Script;

/// The most steps a setup may take: zeros (an input that ran out) always move time on, so
/// every setup ends long before.
const MAX_STEPS: usize = 100_000;

/// What the fuzzer did with an accepted connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Arrived; the setup has not said what to do.
    Arrived,
    /// The setup asked for its handshake.
    Authenticating,
    /// It proved the key (a neighbour's connection).
    Proved,
    /// It failed its handshake (a stranger).
    Stranger,
    /// The setup kept it.
    Kept,
    /// The setup dropped it.
    Dropped,
}

/// The setup of one rank (rank, ring size 2 to 6, 1 to 4 links, with or without a key,
/// timeout 1 ms to 20 s, from the script), driven by the script: each action is answered by
/// an event the script picks (a connection made or refused, a handshake passed, refused or
/// failed for good, a connection arriving on any link, in or out of range, a pending handshake
/// proving the key or failing, time passing).
///
/// Properties: links are opened in order, one attempt at a time, and only in the connecting
/// half, which comes after the accepting half except on rank R−1 (MLX's order); no action
/// waits past the deadline (`Wait` and `AuthenticateOpened`/`AuthenticateAccepted` end by it,
/// `Sleep` before it, an attempt is given at most the time left, or 1 ms, and at most 5 s);
/// handshakes are asked for only with a key; every connection that failed its handshake, and
/// every one that arrived on a link out of range, is dropped, never kept; a connection is kept
/// only once, on the link it arrived on, and with a key only after it proved the key; a
/// finished setup has every link opened, exactly one connection kept per link, and every other
/// connection dropped; a failure is final and fits its cause (never connected: at the
/// deadline; cannot connect: within a back-off of it; authentication: only after a refusal
/// that may not be retried). Every setup ends.
pub(crate) fn ring_setup(data: &[u8]) {
    let mut s = Script(data);
    let size = 2 + usize::from(s.byte() % 5);
    let rank = usize::from(s.byte()) % size;
    let links = 1 + usize::from(s.byte() % 4);
    let keyed = s.byte() % 2 == 1;
    let timeout = Duration::from_millis(1 + u64::from(s.u16()) % 20_000);
    let start = Instant::now();
    let mut setup = Setup::new(rank, size, links, keyed, start, timeout);
    let deadline = setup.deadline();
    let last = rank == size - 1;
    let mut now = start;
    let mut opened = 0usize;
    let mut accept_done = false;
    let mut conns: BTreeMap<Conn, (usize, Fate)> = BTreeMap::new();
    let mut kept = vec![None; links];
    let mut final_refusal = false;
    let mut next_conn = 0u64;
    for _ in 0..MAX_STEPS {
        let action = setup.poll(now);
        match action {
            Action::Open {
                link,
                attempt,
                within,
            } => {
                assert_eq!(link, opened, "links open in order");
                assert!(attempt >= 1);
                assert!(!last || !accept_done, "rank R-1 opens before it accepts");
                assert!(last || accept_done, "a rank accepts before it opens");
                let left = deadline.saturating_duration_since(now).max(MIN_ATTEMPT);
                assert!(
                    within <= left && within <= ATTEMPT,
                    "{within:?} of {left:?}"
                );
                now += within * u32::from(s.byte()) / 255;
                let event = if s.byte() % 3 == 1 {
                    Event::Opened { link }
                } else {
                    Event::OpenFailed {
                        link,
                        why: "refused".into(),
                    }
                };
                let made = matches!(event, Event::Opened { .. });
                setup.handle(now, event);
                if made && !keyed {
                    opened += 1;
                }
            }
            Action::AuthenticateOpened { link, until } => {
                assert!(keyed, "a handshake without a key");
                assert_eq!(link, opened);
                assert!(until <= deadline && until >= now);
                now += until.saturating_duration_since(now) * u32::from(s.byte()) / 255;
                let event = match s.byte() % 4 {
                    1 | 2 => Event::OpenerAuthenticated { link },
                    3 => {
                        final_refusal = true;
                        Event::OpenerRefused {
                            link,
                            why: "a wrong proof".into(),
                            retry: false,
                        }
                    }
                    _ => Event::OpenerRefused {
                        link,
                        why: "closed".into(),
                        retry: true,
                    },
                };
                let ok = matches!(event, Event::OpenerAuthenticated { .. });
                setup.handle(now, event);
                if ok {
                    opened += 1;
                }
            }
            Action::AuthenticateAccepted { conn, until } => {
                assert!(keyed, "a handshake without a key");
                assert!(until <= deadline && until > now);
                let entry = conns.get_mut(&conn).expect("a connection that arrived");
                assert_eq!(entry.1, Fate::Arrived);
                entry.1 = Fate::Authenticating;
            }
            Action::Keep { conn, link } => {
                let entry = conns.get_mut(&conn).expect("a connection that arrived");
                assert_eq!(entry.0, link, "kept on the link it arrived on");
                let want = if keyed { Fate::Proved } else { Fate::Arrived };
                assert_eq!(entry.1, want, "kept {conn:?}");
                entry.1 = Fate::Kept;
                assert!(kept[link].is_none(), "link {link} kept twice");
                kept[link] = Some(conn);
                if kept.iter().all(Option::is_some) {
                    accept_done = true;
                }
            }
            Action::Drop { conn, .. } => {
                let entry = conns.get_mut(&conn).expect("a connection that arrived");
                assert!(
                    !matches!(entry.1, Fate::Kept | Fate::Dropped),
                    "dropped after {:?}",
                    entry.1
                );
                entry.1 = Fate::Dropped;
            }
            Action::Wait { until } => {
                assert!(until <= deadline, "a wait past the deadline");
                assert!(until > now, "a wait that is already over");
                assert!(!accept_done, "a wait after the accepting half");
                assert!(last || opened == 0, "a wait in the connecting half");
                match s.byte() % 4 {
                    1 => {
                        let link = usize::from(s.byte()) % (links + 1);
                        let conn = Conn(next_conn);
                        next_conn += 1;
                        conns.insert(conn, (link, Fate::Arrived));
                        if setup.accepting(link) || link >= links {
                            setup.handle(now, Event::Arrived { link, conn });
                        } else {
                            // The driver accepts only on the links the setup asks for.
                            conns.remove(&conn);
                        }
                    }
                    2 | 3 => {
                        let waiting: Vec<Conn> = conns
                            .iter()
                            .filter(|(_, (_, f))| *f == Fate::Authenticating)
                            .map(|(c, _)| *c)
                            .collect();
                        if let Some(&conn) =
                            waiting.get(usize::from(s.byte()) % waiting.len().max(1))
                        {
                            let stranger = s.byte() % 2 == 0;
                            let entry = conns.get_mut(&conn).expect("listed");
                            if stranger {
                                entry.1 = Fate::Stranger;
                                setup.handle(
                                    now,
                                    Event::AcceptorFailed {
                                        conn,
                                        why: "a wrong proof".into(),
                                    },
                                );
                            } else {
                                entry.1 = Fate::Proved;
                                setup.handle(now, Event::AcceptorAuthenticated { conn });
                            }
                        } else {
                            now = until;
                        }
                    }
                    _ => now = until,
                }
            }
            Action::Sleep { until } => {
                assert!(until < deadline, "a back-off up to the deadline");
                assert!(until >= now);
                now = until;
            }
            Action::Done => {
                assert_eq!(opened, links, "every link opened");
                assert_eq!(setup.connections().0, links);
                assert!(kept.iter().all(Option::is_some), "every link kept");
                assert_eq!(setup.connections().1, &kept[..]);
                for (conn, (_, fate)) in &conns {
                    assert!(
                        matches!(fate, Fate::Kept | Fate::Dropped),
                        "{conn:?} left {fate:?}"
                    );
                }
                assert_eq!(setup.poll(now), Action::Done, "done is final");
                return;
            }
            Action::Failed(failure) => {
                match &failure {
                    Failure::NeverConnected { link, .. } => {
                        assert!(now >= deadline, "gave up before the deadline");
                        assert!(kept[*link].is_none());
                    }
                    Failure::CannotConnect { link, .. } => {
                        assert_eq!(*link, opened);
                        assert!(deadline.saturating_duration_since(now) <= MAX_BACKOFF);
                    }
                    Failure::AuthenticationFailed { .. } => assert!(final_refusal),
                }
                assert_eq!(
                    setup.poll(now),
                    Action::Failed(failure),
                    "a failure is final"
                );
                return;
            }
        }
        for (conn, (link, fate)) in &conns {
            if *link >= links || *fate == Fate::Stranger {
                assert_ne!(*fate, Fate::Kept, "{conn:?} kept");
            }
        }
    }
    panic!("the setup did not end in {MAX_STEPS} steps");
}
