//! The ring over real TCP sockets on loopback, with the ranks as threads of one process.

use crate::common::ports;
use crate::common::rank_threads;

use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Options, connect_ring};

fn run_ring<T: Send>(
    ranks: usize,
    conns: usize,
    body: impl Fn(nuvec_distributed::RingGroup) -> T + Sync,
) -> Vec<T> {
    let nodes = ports::free_nodes(ranks, conns);
    let options = Options::default().timeout(Duration::from_secs(20));
    rank_threads::run(ranks, |rank| {
        body(connect_ring(&nodes, rank, &options).expect("connect"))
    })
}

#[test]
fn float_sums_over_loopback_match_the_exact_sum() {
    for (ranks, conns, n) in [(2, 1, 10usize), (3, 2, 3 << 20), (4, 1, 2), (2, 2, 1 << 22)] {
        let out = run_ring(ranks, conns, |g| {
            let rank = g.rank();
            let comm = g.communicator().expect("a ring");
            let mut data: Vec<u8> = (0..n)
                .flat_map(|i| (((i * 7 + rank) % 1000) as f32).to_le_bytes())
                .collect();
            comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)
                .expect("all_sum");
            data
        });
        let expect: Vec<u8> = (0..n)
            .flat_map(|i| {
                ((0..ranks).map(|r| ((i * 7 + r) % 1000) as f32).sum::<f32>()).to_le_bytes()
            })
            .collect();
        for d in out {
            assert!(d == expect, "ranks {ranks} conns {conns} n {n}");
        }
    }
}

#[test]
fn health_names_a_peer_that_closed_and_close_releases_the_group() {
    let closed = std::sync::Barrier::new(3);
    let out = run_ring(3, 1, |g| {
        let comm = g.communicator().expect("a ring");
        let mut data = vec![0u8; 64];
        comm.try_all_reduce(Reduction::Sum, DType::U8, &mut data)
            .expect("all_sum");
        assert!(g.health().is_empty(), "{:?}", g.health());
        // Everyone agrees before rank 2 leaves.
        comm.try_all_reduce(Reduction::Sum, DType::U8, &mut data)
            .expect("all_sum");
        if g.rank() == 2 {
            g.close();
            let err = comm
                .try_all_reduce(Reduction::Sum, DType::U8, &mut data)
                .expect_err("closed");
            assert!(err.to_string().contains("closed"), "{err}");
            closed.wait();
            return Vec::new();
        }
        // The others find out without running a collective, once the close has reached their
        // sockets (on a loaded machine the kernel may deliver it after rank 2 passes the
        // barrier): bounded.
        closed.wait();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let down = loop {
            let down = g.health();
            if down.iter().any(|(peer, _)| *peer == 2) || std::time::Instant::now() >= deadline {
                break down;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        g.close();
        down
    });
    for (rank, down) in out.iter().enumerate().take(2) {
        assert!(
            down.iter().any(|(peer, _)| *peer == 2),
            "rank {rank} reports {down:?}"
        );
    }
    // A new group forms in the same process after the old one closed.
    let again = run_ring(3, 1, |g| {
        let mut data = vec![1u8; 8];
        g.communicator()
            .expect("a ring")
            .try_all_reduce(Reduction::Sum, DType::U8, &mut data)
            .expect("all_sum");
        data
    });
    assert!(again.iter().all(|d| d == &vec![3u8; 8]));
}

#[test]
fn a_ring_over_ipv6_loopback_works() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback on this machine; skipping");
        return;
    }
    let nodes: Vec<Vec<String>> = (0..2)
        .map(|_| {
            let l = std::net::TcpListener::bind("[::1]:0").expect("bind");
            vec![format!("[::1]:{}", l.local_addr().expect("addr").port())]
        })
        .collect();
    let options = Options::default().timeout(Duration::from_secs(10));
    let out: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (nodes, options) = (&nodes, &options);
                s.spawn(move || {
                    let g = connect_ring(nodes, rank, options).expect("connect over IPv6");
                    let mut d = vec![rank as u8 + 1; 3000];
                    g.communicator()
                        .expect("ring")
                        .try_all_reduce(Reduction::Max, DType::U8, &mut d)
                        .expect("all_max");
                    g.close();
                    d
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    assert!(out.iter().all(|d| d.iter().all(|&b| b == 2)));
}

/// A slice of `len` bytes of `backing` that starts `offset` bytes past a page boundary.
fn at_page_offset(backing: &mut [u8], offset: usize, len: usize) -> &mut [u8] {
    let start = backing.as_ptr().align_offset(4096) + offset;
    &mut backing[start..start + len]
}

#[test]
fn buffers_at_every_kind_of_page_offset_receive_exactly_their_bytes() {
    // Destinations in the first cache line of a page are read through the link's scratch,
    // others straight into place: both must land every byte, whatever the sizes.
    for offset in [0usize, 1, 16, 63, 64, 100, 4095] {
        for len in [1usize, 100, (64 << 10) + 3, 300_001] {
            let out = run_ring(2, 1, |g| {
                let rank = g.rank();
                let comm = g.communicator().expect("a ring");
                let pattern = |i: usize| (i * 31 + len) as u8;
                let mut backing = vec![0u8; len + 8192];
                let buf = at_page_offset(&mut backing, offset, len);
                if rank == 0 {
                    let sent: Vec<u8> = (0..len).map(pattern).collect();
                    comm.try_send(1, &sent).expect("send");
                    comm.try_recv(1, buf).expect("recv");
                } else {
                    comm.try_recv(0, buf).expect("recv");
                    comm.try_send(0, buf).expect("send");
                }
                let received = buf.iter().enumerate().all(|(i, &b)| b == pattern(i));
                // An all-gather lands the others' blocks straight in the output.
                let block: Vec<u8> = (0..len).map(|i| (i + rank) as u8).collect();
                let mut gathered_backing = vec![0u8; 2 * len + 8192];
                let gathered = at_page_offset(&mut gathered_backing, offset, 2 * len);
                comm.try_all_gather(&block, gathered).expect("all_gather");
                let gathered_ok = (0..2 * len).all(|i| gathered[i] == (i % len + i / len) as u8);
                (received, gathered_ok)
            });
            for (rank, (received, gathered)) in out.into_iter().enumerate() {
                assert!(
                    received,
                    "rank {rank}, offset {offset}, {len} bytes: send/recv"
                );
                assert!(
                    gathered,
                    "rank {rank}, offset {offset}, {len} bytes: all_gather"
                );
            }
        }
    }
}

#[test]
fn a_group_forms_and_reduces_with_a_timeout_too_large_for_a_deadline() {
    // `Duration::MAX` is the natural "no timeout"; 9.3e18 s is a `NUVEC_DISTRIBUTED_TIMEOUT`
    // value the environment accepts. Neither fits an `Instant` once added to now.
    let plain = Options::default();
    let keyed = Options::default()
        .key("a secret of sixteen bytes or more")
        .expect("a key");
    for timeout in [Duration::MAX, Duration::from_secs_f64(9.3e18)] {
        for options in [&plain, &keyed] {
            let options = options.clone().timeout(timeout);
            let nodes = ports::free_nodes(2, 2);
            let out: Vec<Vec<u8>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2)
                    .map(|rank| {
                        let (nodes, options) = (&nodes, &options);
                        s.spawn(move || {
                            let g = connect_ring(nodes, rank, options).expect("connect");
                            let mut d = vec![rank as u8 + 1; 1000];
                            g.communicator()
                                .expect("a ring")
                                .try_all_reduce(Reduction::Sum, DType::U8, &mut d)
                                .expect("all_sum");
                            g.close();
                            d
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("rank")).collect()
            });
            assert!(out.iter().all(|d| d.iter().all(|&b| b == 3)), "{timeout:?}");
        }
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_ring_given_a_congestion_control_sums_and_one_the_kernel_lacks_fails_every_rank_naming_it() {
    let nodes = ports::free_nodes(3, 2);
    let reno = Options::default()
        .timeout(Duration::from_secs(20))
        .local_links(false)
        .tcp_congestion("reno")
        .expect("a name");
    let out = rank_threads::run(3, |rank| {
        let g = connect_ring(&nodes, rank, &reno).expect("connect");
        let mut data: Vec<u8> = (0..1000)
            .flat_map(|i| ((i + rank) as f32).to_le_bytes())
            .collect();
        let comm = g.communicator().expect("a ring");
        comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)
            .expect("all_sum");
        data
    });
    let expect: Vec<u8> = (0..1000)
        .flat_map(|i| (3.0 * i as f32 + 3.0).to_le_bytes())
        .collect();
    assert!(out.iter().all(|d| *d == expect));

    let nodes = ports::free_nodes(3, 1);
    let lacking = Options::default()
        .timeout(Duration::from_secs(10))
        .tcp_congestion("no-such-cc")
        .expect("a name");
    let errors = rank_threads::run(3, |rank| {
        let Err(e) = connect_ring(&nodes, rank, &lacking) else {
            panic!("rank {rank}: setup went through a congestion control the kernel lacks");
        };
        e.to_string()
    });
    for (rank, e) in errors.iter().enumerate() {
        for said in [
            format!("rank {rank}"),
            "\"no-such-cc\"".to_owned(),
            "NUVEC_DISTRIBUTED_TCP_CONGESTION".to_owned(),
        ] {
            assert!(e.contains(&said), "{said:?} missing in {e:?}");
        }
    }
    let bad = Options::default()
        .tcp_congestion("cu bic")
        .expect_err("not a name");
    assert!(
        bad.to_string().contains("not a congestion control's name"),
        "{bad}"
    );
}
