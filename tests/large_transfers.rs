//! An all_sum of more than 4 GiB per rank over loopback TCP: sizes past `u32` and past 2 GiB per socket call.
//!
//! Two ranks run as threads of this process; each reduces 4 GiB + 3 MiB + 5 bytes of `uint8`
//! in place, so the job holds about 8.1 GiB. macOS rejects a socket call of more than
//! `INT_MAX` bytes (MLX #4280), so every call of this crate asks for at most 1 GiB (the crate's
//! own unit tests check the lengths); this checks that a transfer that needs several such calls
//! per segment, and offsets past 4 GiB, land every byte. The binary holds this one test: cargo
//! runs test binaries one after another, so no other test runs beside it (the processes'
//! binary, whose tests run in parallel threads, would put a job beside these 8 GiB).

mod common;

use common::ports;

use std::time::{Duration, Instant};

use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Options, connect_ring};

/// The bytes per rank: more than 4 GiB, and not a multiple of anything convenient.
const LEN: usize = (4 << 30) + (3 << 20) + 5;
/// The pattern's block: rank r's byte i is `(i / BLOCK * 7 + r * 13) mod 256`.
const BLOCK: usize = 4096;

fn value(block: usize, rank: usize) -> u8 {
    (block * 7 + rank * 13) as u8
}

#[test]
fn an_all_sum_of_more_than_four_gibibytes_per_rank_lands_every_byte() {
    let nodes = ports::free_nodes(2, 1);
    let options = Options::default().timeout(Duration::from_secs(600));
    let started = Instant::now();
    let wrong: Vec<Option<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let (nodes, options) = (&nodes, &options);
                s.spawn(move || {
                    let mut data = vec![0u8; LEN];
                    for (b, block) in data.chunks_mut(BLOCK).enumerate() {
                        block.fill(value(b, rank));
                    }
                    let group = connect_ring(nodes, rank, options).expect("connect");
                    group
                        .communicator()
                        .expect("a ring")
                        .try_all_reduce(Reduction::Sum, DType::U8, &mut data)
                        .expect("all_sum");
                    group.close();
                    // The first wrong byte, if any.
                    data.chunks(BLOCK).enumerate().find_map(|(b, block)| {
                        let want = value(b, 0).wrapping_add(value(b, 1));
                        block.iter().position(|&x| x != want).map(|i| b * BLOCK + i)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    for (rank, at) in wrong.iter().enumerate() {
        assert_eq!(*at, None, "rank {rank}: the first wrong byte");
    }
    eprintln!("all_sum of {LEN} bytes on 2 ranks: {:?}", started.elapsed());
}
