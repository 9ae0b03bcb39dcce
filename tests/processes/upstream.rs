//! Jobs that mix this crate's ranks with nuvec-distributed 0.5.0's (ranks as threads, on
//! loopback). 0.5.0 never spoke MLX's wire: its opener sends its rank (8 bytes) on connecting
//! and its acceptor waits for them, where MLX sends nothing. So such a job cannot run on
//! either wire; what is checked is that it fails on every rank, within the timeouts, with no
//! rank returning data, and that this crate never chooses the nuvec wire beside 0.5.0 (which
//! neither sends nor answers the probe). A rank of this crate whose left neighbour is 0.5.0's
//! forms its group (0.5.0's opener connected) and fails at its first collective, when 0.5.0,
//! failed at setup, has closed the connection; the 8 bytes 0.5.0 sent are as MLX's wire would
//! take them, data, so a first collective of 8 bytes or fewer there could return them (MLX's
//! wire has no header to tell): 0.5.0's ranks do not belong in a ring of MLX's wire.

use crate::common::ports;
use crate::common::rank_threads;

use std::time::{Duration, Instant};

use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Options, Wire, connect_ring};

/// A job of `ranks` ranks where those in `old` are 0.5.0's, each setting up with `timeout`:
/// per rank, its error (`Ok` if it returned data) and how long it took. A rank of this crate
/// that forms a group runs a 4 KiB all_sum, and must be on MLX's wire.
fn mixed(ranks: usize, old: &[usize], timeout: Duration) -> Vec<(Result<(), String>, Duration)> {
    let nodes = ports::free_nodes(ranks, 1);
    rank_threads::run(ranks, |rank| {
        let started = Instant::now();
        let outcome = if old.contains(&rank) {
            let options = nuvec_distributed_050::Options::default().timeout(timeout);
            nuvec_distributed_050::init_with(&nodes, rank, &options)
                .map(drop)
                .map_err(|e| format!("0.5.0 at setup: {e}"))
        } else {
            match connect_ring(&nodes, rank, &Options::default().timeout(timeout)) {
                Err(e) => Err(format!("at setup: {e}")),
                Ok(group) => {
                    let comm = group.communicator().expect("a ring");
                    assert_eq!(comm.wire(), Wire::Mlx, "rank {rank}");
                    let mut data = vec![1u8; 4096];
                    comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)
                        .map_err(|e| format!("at its first collective: {e}"))
                }
            }
        };
        (outcome, started.elapsed())
    })
}

#[test]
fn a_job_that_mixes_0_5_0_s_ranks_with_this_crates_fails_on_every_rank_and_returns_no_data() {
    let timeout = Duration::from_secs(3);
    for (ranks, old) in [(2, vec![0]), (2, vec![1]), (3, vec![1]), (4, vec![1, 2])] {
        for (rank, (outcome, took)) in mixed(ranks, &old, timeout).iter().enumerate() {
            let what = format!("{ranks} ranks, 0.5.0 at {old:?}: rank {rank}: {outcome:?}");
            assert!(outcome.is_err(), "{what}");
            // A neighbour's failure may start only when its own setup times out: at most
            // two timeouts, and the operation's own wait is cut short by the close.
            assert!(*took < 3 * timeout, "{what} took {took:?}");
        }
    }
}
