//! The ring over real TCP sockets on loopback, with the ranks as threads of one process.

#[path = "common/ports.rs"]
mod ports;

use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Options, connect_ring};

fn run_ring<T: Send>(ranks: usize, conns: usize, body: impl Fn(nuvec_distributed::RingGroup) -> T + Sync) -> Vec<T> {
    let nodes = ports::free_nodes(ranks, conns);
    let options = Options::default().timeout(Duration::from_secs(20));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let (nodes, options, body) = (&nodes, &options, &body);
                s.spawn(move || body(connect_ring(nodes, rank, options).expect("connect")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

#[test]
fn float_sums_over_loopback_match_the_exact_sum() {
    for (ranks, conns, n) in [(2, 1, 10usize), (3, 2, 3 << 20), (4, 1, 2), (2, 2, 1 << 22)] {
        let out = run_ring(ranks, conns, |g| {
            let rank = g.rank();
            let comm = g.communicator().expect("a ring");
            let mut data: Vec<u8> = (0..n).flat_map(|i| (((i * 7 + rank) % 1000) as f32).to_le_bytes()).collect();
            comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data).expect("all_sum");
            data
        });
        let expect: Vec<u8> = (0..n)
            .flat_map(|i| ((0..ranks).map(|r| ((i * 7 + r) % 1000) as f32).sum::<f32>()).to_le_bytes())
            .collect();
        for d in out {
            assert!(d == expect, "ranks {ranks} conns {conns} n {n}");
        }
    }
}
