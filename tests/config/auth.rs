//! Authentication with a pre-shared key: keyed rings work, strays, wrong keys and replayed
//! handshakes are turned away, and a key on one rank only fails setup with a clear error.

use crate::common::ports;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use nuvec_core::DType;
use nuvec_distributed::internals::auth::{self, Acceptor, Key, Opener};
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Options, RingGroup, connect_ring};

const SECRET: &str = "correct horse battery staple";

/// Connects every rank of a ring in threads, rank r with `options(r)`, while `meddle` runs on
/// its own thread with the ring's addresses; returns each rank's result.
fn ring(
    ranks: usize,
    conns: usize,
    options: impl Fn(usize) -> Options + Sync,
    meddle: impl FnOnce(&[Vec<String>]) + Send,
) -> Vec<Result<RingGroup, nuvec_distributed::Error>> {
    let nodes = ports::free_nodes(ranks, conns);
    std::thread::scope(|s| {
        let nodes = &nodes;
        let options = &options;
        let handles: Vec<_> = (0..ranks)
            .map(|rank| s.spawn(move || connect_ring(nodes, rank, &options(rank))))
            .collect();
        s.spawn(move || meddle(nodes));
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    })
}

fn keyed(secret: &str) -> Options {
    Options::default()
        .timeout(Duration::from_secs(15))
        .key(secret)
        .expect("a long enough key")
}

fn all_sum_works(groups: Vec<Result<RingGroup, nuvec_distributed::Error>>) {
    let n = groups.len() as u8;
    std::thread::scope(|s| {
        for g in groups {
            s.spawn(move || {
                let g = g.expect("connected");
                let mut data = vec![1u8; 5000];
                g.communicator()
                    .expect("ring")
                    .try_all_reduce(Reduction::Sum, DType::U8, &mut data)
                    .expect("all_sum");
                assert!(data.iter().all(|&b| b == n));
                g.close();
            });
        }
    });
}

#[test]
fn a_keyed_ring_connects_and_reduces() {
    all_sum_works(ring(3, 2, |_| keyed(SECRET), |_| {}));
}

#[test]
fn a_stray_client_during_setup_is_rejected_and_does_not_block_the_group() {
    let started = Instant::now();
    let groups = ring(
        3,
        1,
        |_| keyed(SECRET),
        |nodes| {
            // Strangers knock on rank 1's port before (or while) rank 0 does: one sends
            // garbage, one says hello without the key's proof.
            for _ in 0..2 {
                if let Ok(mut s) = TcpStream::connect(&nodes[1][0]) {
                    let _ = s.write_all(&[0x42; auth::HELLO]);
                }
            }
            let wrong = Key::from_secret(b"not the ring's secret at all").expect("key");
            if let Ok(mut s) = TcpStream::connect(&nodes[1][0]) {
                let opener = Opener::new(&wrong, 0, 1, 0);
                let _ = s.write_all(opener.hello());
                let mut reply = [0u8; auth::REPLY];
                if s.read_exact(&mut reply).is_ok() {
                    assert!(
                        opener.finish(&reply).is_err(),
                        "a wrong key must not verify"
                    );
                    let _ = s.write_all(&[0u8; auth::NONCE]);
                }
            }
        },
    );
    all_sum_works(groups);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_replayed_handshake_is_rejected() {
    let key = Key::from_secret(SECRET.as_bytes()).expect("key");
    // A handshake recorded from an earlier session between rank 0 and rank 1.
    let recorded = Opener::new(&key, 0, 1, 0);
    let (_, old_reply) = Acceptor::new(&key, 1, 0, 0, recorded.hello()).expect("hello");
    let old_proof = recorded.finish(&old_reply).expect("proof");
    let groups = ring(
        2,
        1,
        |_| keyed(SECRET),
        |nodes| {
            if let Ok(mut s) = TcpStream::connect(&nodes[1][0]) {
                let _ = s.write_all(recorded.hello());
                let mut reply = [0u8; auth::REPLY];
                if s.read_exact(&mut reply).is_ok() {
                    assert_ne!(reply, old_reply, "the acceptor's nonce must be fresh");
                    let _ = s.write_all(&old_proof);
                    // The acceptor drops us: the next read sees the close.
                    let mut byte = [0u8; 1];
                    assert!(matches!(s.read(&mut byte), Ok(0) | Err(_)));
                }
            }
        },
    );
    all_sum_works(groups);
}

#[test]
fn a_wrong_key_fails_setup_naming_the_peer() {
    let started = Instant::now();
    let results = ring(
        2,
        1,
        |rank| {
            keyed(if rank == 0 {
                SECRET
            } else {
                "a different secret, also long"
            })
            .timeout(Duration::from_secs(4))
        },
        |_| {},
    );
    let errors: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("authentication with rank")),
        "{errors:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_key_on_one_rank_only_fails_setup_with_a_clear_error() {
    let results = ring(
        2,
        1,
        |rank| {
            let options = Options::default().timeout(Duration::from_secs(3));
            if rank == 1 {
                options.key(SECRET).expect("key")
            } else {
                options
            }
        },
        |_| {},
    );
    let keyed_rank = results[1].as_ref().expect_err("the keyed rank must fail");
    let text = keyed_rank.to_string();
    assert!(
        text.contains("authentication") || text.contains("never connected"),
        "{text}"
    );
}

#[test]
fn short_keys_are_refused_without_printing_them() {
    let err = Options::default().key("short").expect_err("too short");
    assert!(err.to_string().contains("at least 16"));
    assert!(!err.to_string().contains("short\""));
    let options = keyed(SECRET);
    assert!(!format!("{options:?}").contains("horse"));
}

/// Connects to `addr`, retrying for 10 s while nobody listens there yet.
fn connect_retry(addr: &str) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("cannot connect to {addr}: {e}"),
        }
    }
}

/// A keyed 2-rank ring where `strangers` connect to rank 1's address before its real
/// neighbour can: rank 1 starts first (it connects to rank 0 before it accepts), the
/// strangers connect once it listens and are handed to `stranger` (with a receiver that ends
/// when the ranks have returned), and only then rank 0 starts. Returns the ranks' results
/// and how long they took from rank 0's start.
fn strangers_first(
    strangers: usize,
    timeout: Duration,
    stranger: impl Fn(TcpStream, &std::sync::mpsc::Receiver<()>) + Sync,
) -> (Vec<Result<RingGroup, nuvec_distributed::Error>>, Duration) {
    let nodes = ports::free_nodes(2, 1);
    let options = keyed(SECRET).timeout(timeout);
    std::thread::scope(|s| {
        let (nodes, options, stranger) = (&nodes, &options, &stranger);
        let one = s.spawn(move || connect_ring(nodes, 1, options));
        let mut stop = Vec::new();
        for _ in 0..strangers {
            let stream = connect_retry(&nodes[1][0]);
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            stop.push(tx);
            s.spawn(move || stranger(stream, &rx));
        }
        let started = Instant::now();
        let zero = s.spawn(move || connect_ring(nodes, 0, options));
        let results = vec![zero.join().expect("rank 0"), one.join().expect("rank 1")];
        let took = started.elapsed();
        drop(stop);
        (results, took)
    })
}

#[test]
fn a_slow_loris_stranger_before_the_neighbour_does_not_stop_a_keyed_group_forming() {
    // The stranger sends a byte of a hello every 2 s: each byte came within the 5 s a read
    // was allowed, so it held the acceptor for as long as it kept sending.
    let (groups, took) = strangers_first(1, Duration::from_secs(12), |mut s, stop| {
        for _ in 0..auth::HELLO {
            if s.write_all(b"n").is_err() {
                return;
            }
            // A slow peer, simulated; returns at once when the group has formed.
            if stop.recv_timeout(Duration::from_secs(2))
                != Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            {
                return;
            }
        }
    });
    for (rank, g) in groups.iter().enumerate() {
        if let Err(e) = g {
            panic!("rank {rank} after {took:?}: {e}");
        }
    }
    assert!(took < Duration::from_secs(4), "setup took {took:?}");
    all_sum_works(groups);
}

#[test]
fn silent_strangers_racing_the_neighbour_do_not_stop_a_keyed_group_forming() {
    // Two strangers that connect just before the real neighbour and say nothing: each held
    // the acceptor for 5 s in turn, longer than this setup's timeout.
    let (groups, took) = strangers_first(2, Duration::from_secs(8), |_s, stop| {
        // Holds the connection open, silent, until the ranks have returned.
        let _ = stop.recv_timeout(Duration::from_secs(30));
    });
    for (rank, g) in groups.iter().enumerate() {
        if let Err(e) = g {
            panic!("rank {rank} after {took:?}: {e}");
        }
    }
    assert!(took < Duration::from_secs(4), "setup took {took:?}");
    all_sum_works(groups);
}
