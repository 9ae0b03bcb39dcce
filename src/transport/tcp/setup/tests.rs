//! Unit tests of the connection setup's state machine: MLX's order, retries and back-off, the
//! deadline, strangers, all without a socket.

use super::*;

const MS: Duration = Duration::from_millis(1);

/// Polls at `now` until the setup asks for something that takes time or ends (not a
/// `Keep`, `Drop` or `AuthenticateAccepted`, which are returned before it).
fn drain(setup: &mut Setup, now: Instant) -> (Vec<Action>, Action) {
    let mut quick = Vec::new();
    loop {
        match setup.poll(now) {
            a @ (Action::Keep { .. }
            | Action::Drop { .. }
            | Action::AuthenticateAccepted { .. }) => {
                quick.push(a);
            }
            a => return (quick, a),
        }
    }
}

fn next(setup: &mut Setup, now: Instant) -> Action {
    drain(setup, now).1
}

#[test]
fn a_rank_accepts_every_link_before_it_opens_any() {
    let t = Instant::now();
    let mut s = Setup::new(0, 3, 2, false, t, Duration::from_secs(10));
    assert!(matches!(next(&mut s, t), Action::Wait { .. }));
    assert!(s.accepting(0) && s.accepting(1));
    s.handle(
        t,
        Event::Arrived {
            link: 1,
            conn: Conn(7),
        },
    );
    assert!(!s.accepting(1));
    assert_eq!(
        drain(&mut s, t).0,
        vec![Action::Keep {
            conn: Conn(7),
            link: 1
        }]
    );
    s.handle(
        t,
        Event::Arrived {
            link: 0,
            conn: Conn(8),
        },
    );
    let (quick, then) = drain(&mut s, t);
    assert_eq!(
        quick,
        vec![Action::Keep {
            conn: Conn(8),
            link: 0
        }]
    );
    assert!(
        matches!(
            then,
            Action::Open {
                link: 0,
                attempt: 1,
                ..
            }
        ),
        "{then:?}"
    );
    assert!(!s.accepting(0), "the accepting half is over");
    s.handle(t, Event::Opened { link: 0 });
    assert!(matches!(
        next(&mut s, t),
        Action::Open {
            link: 1,
            attempt: 1,
            ..
        }
    ));
    s.handle(t, Event::Opened { link: 1 });
    assert_eq!(next(&mut s, t), Action::Done);
    assert_eq!(s.connections(), (2, &[Some(Conn(8)), Some(Conn(7))][..]));
    let notes: Vec<Note> = std::iter::from_fn(|| s.poll_note()).collect();
    assert_eq!(
        notes,
        vec![Note::Accepting, Note::Connecting, Note::Connected]
    );
}

#[test]
fn the_last_rank_opens_before_it_accepts() {
    let t = Instant::now();
    let mut s = Setup::new(2, 3, 1, false, t, Duration::from_secs(10));
    assert!(matches!(next(&mut s, t), Action::Open { link: 0, .. }));
    assert!(!s.accepting(0));
    s.handle(t, Event::Opened { link: 0 });
    assert!(matches!(next(&mut s, t), Action::Wait { .. }));
    assert!(s.accepting(0));
    s.handle(
        t,
        Event::Arrived {
            link: 0,
            conn: Conn(0),
        },
    );
    assert_eq!(next(&mut s, t), Action::Done);
}

#[test]
fn a_refused_connection_is_retried_with_a_back_off_doubling_to_half_a_second() {
    let t = Instant::now();
    let mut s = Setup::new(1, 2, 1, false, t, Duration::from_secs(60));
    let mut now = t;
    let mut waits = Vec::new();
    for attempt in 1..=8 {
        match next(&mut s, now) {
            Action::Open { attempt: a, .. } => assert_eq!(a, attempt),
            other => panic!("attempt {attempt}: {other:?}"),
        }
        s.handle(
            now,
            Event::OpenFailed {
                link: 0,
                why: "refused".into(),
            },
        );
        let Action::Sleep { until } = next(&mut s, now) else {
            panic!("no back-off");
        };
        waits.push(until - now);
        now = until;
    }
    let ms = |n| n * MS;
    assert_eq!(
        waits,
        vec![
            ms(10),
            ms(20),
            ms(40),
            ms(80),
            ms(160),
            ms(320),
            ms(500),
            ms(500)
        ]
    );
}

#[test]
fn a_link_that_never_opens_fails_before_the_deadline_naming_the_attempts() {
    let t = Instant::now();
    let timeout = 100 * MS;
    let mut s = Setup::new(1, 2, 1, false, t, timeout);
    let mut now = t;
    let failure = loop {
        match next(&mut s, now) {
            Action::Open { within, .. } => {
                assert!(now + within <= s.deadline().max(now + MIN_ATTEMPT));
                s.handle(
                    now,
                    Event::OpenFailed {
                        link: 0,
                        why: "Connection refused".into(),
                    },
                );
            }
            Action::Sleep { until } => {
                assert!(until < s.deadline());
                now = until;
            }
            Action::Failed(f) => break f,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        failure,
        Failure::CannotConnect {
            peer: 0,
            link: 0,
            attempts: 4,
            timeout,
            last: "Connection refused".into(),
            earlier: None,
        }
    );
    assert!(now < s.deadline());
}

#[test]
fn a_wrong_proof_fails_at_once_and_a_closed_handshake_is_retried() {
    let t = Instant::now();
    let mut s = Setup::new(1, 2, 1, true, t, Duration::from_secs(10));
    assert!(matches!(next(&mut s, t), Action::Open { .. }));
    s.handle(t, Event::Opened { link: 0 });
    let Action::AuthenticateOpened { link: 0, until } = next(&mut s, t) else {
        panic!("no handshake");
    };
    assert_eq!(until, t + HANDSHAKE);
    s.handle(
        t,
        Event::OpenerRefused {
            link: 0,
            why: "closed".into(),
            retry: true,
        },
    );
    let Action::Sleep { until } = next(&mut s, t) else {
        panic!("no retry");
    };
    assert!(matches!(
        next(&mut s, until),
        Action::Open { attempt: 2, .. }
    ));
    s.handle(until, Event::Opened { link: 0 });
    assert!(matches!(
        next(&mut s, until),
        Action::AuthenticateOpened { .. }
    ));
    s.handle(
        until,
        Event::OpenerRefused {
            link: 0,
            why: "the proof is wrong".into(),
            retry: false,
        },
    );
    assert_eq!(
        next(&mut s, until),
        Action::Failed(Failure::AuthenticationFailed {
            peer: 0,
            link: 0,
            why: "the proof is wrong".into()
        })
    );
}

#[test]
fn a_failure_after_a_refused_handshake_still_names_the_refusal() {
    let t = Instant::now();
    let mut s = Setup::new(1, 2, 1, true, t, 30 * MS);
    assert!(matches!(next(&mut s, t), Action::Open { .. }));
    s.handle(t, Event::Opened { link: 0 });
    assert!(matches!(next(&mut s, t), Action::AuthenticateOpened { .. }));
    s.handle(
        t,
        Event::OpenerRefused {
            link: 0,
            why: "no answer".into(),
            retry: true,
        },
    );
    let Action::Sleep { until } = next(&mut s, t) else {
        panic!("no retry");
    };
    assert!(matches!(next(&mut s, until), Action::Open { .. }));
    s.handle(
        until,
        Event::OpenFailed {
            link: 0,
            why: "refused".into(),
        },
    );
    let Action::Failed(Failure::CannotConnect { last, earlier, .. }) = next(&mut s, until) else {
        panic!("no failure");
    };
    assert_eq!(
        (last.as_str(), earlier.as_deref()),
        ("refused", Some("no answer"))
    );
}

#[test]
fn the_first_connection_to_prove_the_key_takes_the_link_and_the_others_are_dropped() {
    let t = Instant::now();
    let mut s = Setup::new(0, 2, 1, true, t, Duration::from_secs(10));
    assert!(matches!(next(&mut s, t), Action::Wait { .. }));
    for c in 0..3 {
        s.handle(
            t,
            Event::Arrived {
                link: 0,
                conn: Conn(c),
            },
        );
    }
    let (quick, _) = drain(&mut s, t);
    assert_eq!(quick.len(), 3);
    assert!(quick.iter().all(
        |a| matches!(a, Action::AuthenticateAccepted { until, .. } if *until == t + HANDSHAKE)
    ));
    s.handle(
        t,
        Event::AcceptorFailed {
            conn: Conn(0),
            why: "a wrong proof".into(),
        },
    );
    s.handle(t, Event::AcceptorAuthenticated { conn: Conn(2) });
    let (quick, then) = drain(&mut s, t);
    assert_eq!(
        quick,
        vec![
            Action::Drop {
                conn: Conn(0),
                link: 0,
                why: "a wrong proof".into()
            },
            Action::Keep {
                conn: Conn(2),
                link: 0
            },
            Action::Drop {
                conn: Conn(1),
                link: 0,
                why: "the connection is taken".into()
            },
        ]
    );
    assert!(matches!(then, Action::Open { .. }));
}

#[test]
fn a_silent_stranger_is_dropped_when_its_handshake_time_is_up() {
    let t = Instant::now();
    let mut s = Setup::new(0, 2, 1, true, t, Duration::from_secs(30));
    assert!(matches!(next(&mut s, t), Action::Wait { .. }));
    s.handle(
        t,
        Event::Arrived {
            link: 0,
            conn: Conn(0),
        },
    );
    let (_, wait) = drain(&mut s, t);
    assert_eq!(
        wait,
        Action::Wait {
            until: t + HANDSHAKE
        }
    );
    let (quick, wait) = drain(&mut s, t + HANDSHAKE);
    assert!(
        matches!(&quick[..], [Action::Drop { conn: Conn(0), why, .. }] if why.contains("did not authenticate within 5s")),
        "{quick:?}"
    );
    assert!(matches!(wait, Action::Wait { .. }));
    assert!(s.accepting(0));
}

#[test]
fn connections_beyond_the_limit_of_handshakes_are_dropped_at_once() {
    let t = Instant::now();
    let mut s = Setup::new(0, 2, 1, true, t, Duration::from_secs(30));
    assert!(matches!(next(&mut s, t), Action::Wait { .. }));
    for c in 0..=MAX_PENDING as u64 {
        s.handle(
            t,
            Event::Arrived {
                link: 0,
                conn: Conn(c),
            },
        );
    }
    let (quick, _) = drain(&mut s, t);
    let dropped: Vec<&Action> = quick
        .iter()
        .filter(|a| matches!(a, Action::Drop { .. }))
        .collect();
    assert_eq!(dropped.len(), 1);
    assert!(
        matches!(dropped[0], Action::Drop { conn, why, .. } if conn.0 == MAX_PENDING as u64 && why.contains("authenticating already"))
    );
}

#[test]
fn the_accepting_half_fails_at_the_deadline_naming_the_missing_link() {
    let t = Instant::now();
    let timeout = Duration::from_secs(12);
    let mut s = Setup::new(0, 4, 2, false, t, timeout);
    assert!(matches!(next(&mut s, t), Action::Wait { until } if until == t + PROGRESS));
    s.handle(
        t,
        Event::Arrived {
            link: 0,
            conn: Conn(0),
        },
    );
    let mut now = t;
    let mut notes = 0;
    loop {
        match next(&mut s, now) {
            Action::Wait { until } => {
                assert!(until <= s.deadline() && until > now);
                now = until;
            }
            Action::Failed(f) => {
                assert_eq!(
                    f,
                    Failure::NeverConnected {
                        peer: 3,
                        link: 1,
                        timeout
                    }
                );
                break;
            }
            other => panic!("{other:?}"),
        }
        while let Some(note) = s.poll_note() {
            if let Note::StillWaiting { link: 1, .. } = note {
                notes += 1;
            }
        }
    }
    assert_eq!(now, s.deadline());
    assert_eq!(notes, 2, "one note every 5 s of 12");
}

#[test]
fn an_event_the_setup_did_not_ask_for_changes_nothing() {
    let t = Instant::now();
    let mut s = Setup::new(0, 2, 1, false, t, Duration::from_secs(10));
    assert!(matches!(next(&mut s, t), Action::Wait { .. }));
    s.handle(t, Event::Opened { link: 0 });
    s.handle(t, Event::AcceptorAuthenticated { conn: Conn(9) });
    assert_eq!(s.connections(), (0, &[None][..]));
    s.handle(
        t,
        Event::Arrived {
            link: 5,
            conn: Conn(1),
        },
    );
    assert!(matches!(
        drain(&mut s, t).0[..],
        [Action::Drop { conn: Conn(1), .. }]
    ));
}
