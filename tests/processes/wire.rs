//! The nuvec wire's negotiation over real sockets on loopback, the ranks as threads: which
//! wire a job of this crate's ranks agrees on (the probe without a key, the handshake with
//! one), a rank asked for MLX's wire, a job asked for the nuvec wire that cannot have it, a
//! stranger's datagrams, a UDP port that answers nothing, and a peer that answers late.

use crate::common::ports;
use crate::common::rank_threads;

use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nuvec_core::DType;
use nuvec_distributed::internals::tcp::probe::{
    Datagram, PATIENCE, QUIET, SENDS, WAIT, job_identity,
};
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Error, Options, RingGroup, Wire, WireChoice, connect_ring};

const SECRET: &str = "the wire tests' shared secret";

fn options(wire: WireChoice) -> Options {
    Options::default()
        .timeout(Duration::from_secs(20))
        .wire(wire)
}

/// Connects a ring of `ranks` × `conns` on loopback, rank r with `options(r)`.
fn connect(
    ranks: usize,
    conns: usize,
    options: impl Fn(usize) -> Options + Sync,
) -> Vec<Result<RingGroup, Error>> {
    let nodes = ports::free_nodes(ranks, conns);
    rank_threads::run(ranks, |rank| connect_ring(&nodes, rank, &options(rank)))
}

/// The wire every rank's group speaks, after checking that an all_sum still adds up.
fn wires(groups: Vec<Result<RingGroup, Error>>) -> Vec<Wire> {
    let n = groups.len();
    rank_threads::run(n, |rank| {
        let group = groups[rank]
            .as_ref()
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        let comm = group.communicator().expect("a ring");
        let mut data = vec![rank as u8 + 1; 1000];
        comm.try_all_reduce(Reduction::Sum, DType::U8, &mut data)
            .expect("all_sum");
        let want = (1..=n as u8).sum::<u8>();
        assert!(data.iter().all(|&b| b == want), "rank {rank}");
        comm.wire()
    })
}

#[test]
fn a_job_of_this_crates_ranks_agrees_on_the_nuvec_wire() {
    for (ranks, conns) in [(2, 1), (3, 2), (4, 1)] {
        let got = wires(connect(ranks, conns, |_| options(WireChoice::Auto)));
        assert_eq!(got, vec![Wire::Nuvec; ranks], "{ranks} ranks × {conns}");
    }
}

#[test]
fn a_job_asked_for_the_nuvec_wire_on_every_rank_gets_it() {
    let got = wires(connect(3, 1, |_| options(WireChoice::Nuvec)));
    assert_eq!(got, vec![Wire::Nuvec; 3]);
}

#[test]
fn one_rank_asked_for_mlx_makes_the_whole_job_speak_mlx() {
    for mlx in 0..3 {
        let got = wires(connect(3, 1, |rank| {
            options(if rank == mlx {
                WireChoice::Mlx
            } else {
                WireChoice::Auto
            })
        }));
        assert_eq!(got, vec![Wire::Mlx; 3], "rank {mlx} asked for mlx");
    }
    // Four ranks: the native connections form a path, and the farthest rank learns in the
    // last round.
    let got = wires(connect(4, 2, |rank| {
        options(if rank == 0 {
            WireChoice::Mlx
        } else {
            WireChoice::Auto
        })
    }));
    assert_eq!(got, vec![Wire::Mlx; 4]);
}

#[test]
fn a_job_asked_for_nuvec_with_one_rank_asked_for_mlx_fails_on_every_rank_asked_for_nuvec_naming_it()
{
    let nodes = ports::free_nodes(4, 1);
    let groups = rank_threads::run(4, |rank| {
        let wire = if rank == 2 {
            WireChoice::Mlx
        } else {
            WireChoice::Nuvec
        };
        connect_ring(&nodes, rank, &options(wire))
    });
    for (rank, group) in groups.iter().enumerate() {
        match (rank, group) {
            (2, Ok(g)) => assert_eq!(g.communicator().map(|c| c.wire()), Some(Wire::Mlx)),
            (2, Err(e)) => panic!("rank 2, asked for MLX's wire, failed: {e}"),
            (_, Ok(_)) => panic!("rank {rank} formed a group without the nuvec wire"),
            (_, Err(e)) => {
                let text = e.to_string();
                assert!(
                    text.contains("NUVEC_DISTRIBUTED_WIRE=nuvec") && text.contains("rank 2"),
                    "rank {rank}: {text}"
                );
            }
        }
    }
}

#[test]
fn a_keyed_job_agrees_through_the_handshake() {
    let keyed = |wire| options(wire).key(SECRET).expect("a long enough key");
    let got = wires(connect(3, 2, |_| keyed(WireChoice::Auto)));
    assert_eq!(got, vec![Wire::Nuvec; 3]);
    let got = wires(connect(3, 1, |rank| {
        keyed(if rank == 1 {
            WireChoice::Mlx
        } else {
            WireChoice::Auto
        })
    }));
    assert_eq!(got, vec![Wire::Mlx; 3]);
    let groups = connect(2, 1, |rank| {
        keyed(if rank == 0 {
            WireChoice::Mlx
        } else {
            WireChoice::Nuvec
        })
    });
    let text = groups[1]
        .as_ref()
        .expect_err("rank 1 was asked for nuvec")
        .to_string();
    assert!(text.contains("rank 0 was asked for MLX's wire"), "{text}");
}

#[test]
fn a_strangers_datagrams_do_not_break_setup() {
    let nodes = ports::free_nodes(3, 2);
    let stop = AtomicBool::new(false);
    let job = job_identity(&nodes);
    let strange = |rank: u32, link: u32, job: u64, answer: bool| {
        Datagram {
            answer,
            job,
            rank,
            link,
            port: 40_000,
            nonce: 7,
        }
        .encode()
        .to_vec()
    };
    let junk: Vec<Vec<u8>> = vec![
        b"hello".to_vec(),
        vec![0xff; 40],
        vec![0; 2000],
        strange(0, 0, job ^ 1, false),
        strange(5, 0, job, false),
        strange(0, 9, job, false),
        strange(0, 0, job, true),
    ];
    let groups = std::thread::scope(|s| {
        let stranger = s.spawn(|| {
            let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
            while !stop.load(Ordering::Relaxed) {
                for address in nodes.iter().flatten() {
                    for datagram in &junk {
                        let _ = socket.send_to(datagram, address);
                    }
                }
                // A stranger that keeps knocking, at its own pace.
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let groups = rank_threads::run(3, |rank| {
            connect_ring(&nodes, rank, &options(WireChoice::Auto))
        });
        stop.store(true, Ordering::Relaxed);
        stranger.join().expect("the stranger");
        groups
    });
    assert_eq!(wires(groups), vec![Wire::Nuvec; 3]);
}

/// Connects a ring of 2 with `options` while something else holds rank 1's UDP port and reads
/// nothing: rank 1 cannot bind it, and rank 0's probe goes unanswered, as behind a firewall
/// that drops UDP. Every rank's group, and how long setup took.
fn behind_a_silent_udp_port(options: &Options) -> (Vec<Result<RingGroup, Error>>, Duration) {
    let nodes = ports::free_nodes(2, 1);
    let silent = UdpSocket::bind(&nodes[1][0]).expect("rank 1's UDP port");
    let started = Instant::now();
    let groups = rank_threads::run(2, |rank| connect_ring(&nodes, rank, options));
    let took = started.elapsed();
    drop(silent);
    (groups, took)
}

#[test]
fn a_udp_port_that_answers_nothing_costs_the_probes_wait_and_leaves_the_job_mlx() {
    let (groups, took) = behind_a_silent_udp_port(&options(WireChoice::Auto).verbose(true));
    assert_eq!(wires(groups), vec![Wire::Mlx; 2]);
    assert!(took >= Duration::from_millis(60), "setup took {took:?}");
}

#[test]
fn a_udp_port_that_answers_nothing_fails_a_job_that_requires_the_nuvec_wire_after_its_patience() {
    let (groups, took) = behind_a_silent_udp_port(&options(WireChoice::Nuvec));
    for (rank, group) in groups.iter().enumerate() {
        let text = match group {
            Ok(_) => panic!("rank {rank} formed a group without the nuvec wire"),
            Err(e) => e.to_string(),
        };
        assert!(
            text.contains("NUVEC_DISTRIBUTED_WIRE=nuvec") && text.contains("rank 1"),
            "rank {rank}: {text}"
        );
    }
    // It probed for its patience, less at most one probe's wait.
    assert!(took >= PATIENCE - WAIT, "setup failed after {took:?}");
}

#[test]
fn a_rank_that_requires_the_nuvec_wire_probes_on_past_a_peer_that_answers_late() {
    // Rank 0's place is taken first by this test, as by a rank of this crate stalled after it
    // began listening (a loaded host): a UDP socket that reads probes and answers none, and a
    // TCP listener. Rank 1 (the last rank, which connects before it accepts) requires the
    // nuvec wire, so it must not connect on MLX's wire after one probe's wait: it probes on,
    // and once the real rank 0 takes its place, the job speaks the nuvec wire.
    let nodes = ports::free_nodes(2, 1);
    let place = &nodes[0][0];
    let udp = UdpSocket::bind(place).expect("rank 0's UDP port");
    udp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let tcp = TcpListener::bind(place).expect("rank 0's TCP port");
    tcp.set_nonblocking(true).expect("a non-blocking listener");
    std::thread::scope(|s| {
        let rank1 = s.spawn(|| connect_ring(&nodes, 1, &options(WireChoice::Nuvec)));
        // The datagrams of a third probe: by then an opener that gave up after one probe's
        // wait would have connected.
        let mut buf = [0u8; 64];
        let want = 2 * SENDS + 1;
        for got in 0..want {
            udp.recv(&mut buf)
                .unwrap_or_else(|e| panic!("rank 1 sent {got} datagrams, then none: {e}"));
            // Once rank 1 probes, its probes follow each other within a probe's wait.
            udp.set_read_timeout(Some(PATIENCE / 2))
                .expect("a read timeout");
        }
        match tcp.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => {
                panic!("rank 1 connected to a peer that answered none of its probes: {other:?}")
            }
        }
        // Rank 1's next probe finds no one at rank 0's place, or the real rank 0 (which
        // answers it). (Were it refused just before rank 0 binds, and rank 1 then stalled for
        // the quiet time before its connect, it could reach a listening rank 0 on MLX's wire:
        // the race `probe`'s docs leave, which needs both.)
        drop((udp, tcp));
        let rank0 = connect_ring(&nodes, 0, &options(WireChoice::Nuvec));
        let rank1 = rank1.join().expect("rank 1");
        assert_eq!(wires(vec![rank0, rank1]), vec![Wire::Nuvec; 2]);
    });
}

#[test]
fn an_acceptor_answers_probes_for_its_quiet_time_before_a_connect_can_succeed() {
    let nodes = ports::free_nodes(2, 1);
    let acceptor = &nodes[0][0];
    let probe = Datagram {
        answer: false,
        job: job_identity(&nodes),
        rank: 1,
        link: 0,
        port: 40_001,
        nonce: 9,
    }
    .encode();
    let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    socket.connect(acceptor).expect("connect the UDP socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(5)))
        .expect("a read timeout");
    std::thread::scope(|s| {
        let mut rank0 = None;
        // When the last refused probe was sent: rank 0 bound its UDP socket after it.
        let mut refused_at = None;
        let deadline = Instant::now() + Duration::from_secs(20);
        let answered = loop {
            assert!(Instant::now() < deadline, "rank 0 never answered a probe");
            let sent = Instant::now();
            let _ = socket.send(&probe);
            let mut buf = [0u8; 64];
            match socket.recv(&mut buf) {
                Ok(n) => {
                    let answer = Datagram::decode(&buf[..n]).expect("an answer");
                    assert!(answer.answer && answer.nonce == 9, "{answer:?}");
                    break Instant::now();
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    refused_at = Some(sent);
                    // Rank 0 starts only once a probe was refused.
                    rank0.get_or_insert_with(|| {
                        s.spawn(|| connect_ring(&nodes, 0, &options(WireChoice::Auto)))
                    });
                }
                Err(_) => {}
            }
        };
        let refused_at = refused_at.expect("a refused probe");
        let connected = std::net::TcpStream::connect(acceptor);
        // Measured once the connect returned: its SYN went out before.
        let took = refused_at.elapsed();
        if took < QUIET {
            assert!(
                connected.is_err(),
                "rank 0 accepted a connection {took:?} after refusing a probe (answered after \
                 {:?})",
                answered - refused_at
            );
        } else if connected.is_ok() {
            // This thread stalled past the quiet time, so rank 0 was listening and took this
            // connection for its left neighbour's: the job cannot form as it should, and
            // nothing is left to check. Rank 1 still joins, so that rank 0 returns.
            eprintln!("this thread stalled {took:?} after the refusal: nothing to check");
            drop(connected);
            drop(connect_ring(&nodes, 1, &options(WireChoice::Auto)));
            drop(rank0.expect("rank 0 started").join().expect("rank 0"));
            return;
        }
        drop(connected);
        let rank1 = connect_ring(&nodes, 1, &options(WireChoice::Auto));
        let rank0 = rank0.expect("rank 0 started").join().expect("rank 0");
        assert_eq!(wires(vec![rank0, rank1]), vec![Wire::Nuvec; 2]);
    });
}
