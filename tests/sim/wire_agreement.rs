//! The agreement on a wire (`ring::agree`) over the simulator: for every set of connections
//! that are not native, R = 2 to 6 ranks, one and two connections per neighbour, every rank
//! chooses the same wire (the nuvec wire exactly when every connection is native), learns of
//! a connection that is not native exactly when the job has one, and no byte of the agreement
//! goes on a connection that is not native.

use std::time::Duration;

use nuvec_distributed::fabric::Fabric;
use nuvec_distributed::internals::agree::{self, Agreement, Unfit};
use nuvec_distributed::internals::tcp::NotNative;
use nuvec_distributed::ring::RingTopology;
use nuvec_distributed::ring::schedule::Side;
use nuvec_distributed::{Wire, WireChoice};
use nuvec_fabric_sim::{Outcome, Sim};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the agreement of a ring of `ranks` with `conns` connections per neighbour where the
/// connection opened by rank o on link c is not native when bit `o × conns + c` of `mask` is
/// set, every rank asked for [`WireChoice::Auto`], and checks what every rank agreed on.
fn agree_over(ranks: usize, conns: usize, mask: u64) {
    let unfit = |opener: usize, c: usize| mask >> (opener * conns + c) & 1 == 1;
    let report = Sim::ring(ranks, conns)
        .seed(mask)
        .record_wire(true)
        .run(|mut fabric| {
            let rank = fabric.rank();
            let ring = RingTopology::new(rank, ranks, conns);
            let known = |side: Side, c: usize| {
                let opener = match side {
                    Side::Right => rank,
                    Side::Left => ring.left(),
                };
                unfit(opener, c).then_some(NotNative::Refused)
            };
            agree::agree(&mut fabric, ring, WireChoice::Auto, &known, TIMEOUT)
        });
    let case = format!("{ranks} ranks, {conns} connections, not native {mask:#b}");
    for (rank, outcome) in report.outcomes.into_iter().enumerate() {
        let agreed: Agreement = match outcome {
            Outcome::Returned(Ok(a)) => a,
            other => panic!("{case}: rank {rank}: {other:?}"),
        };
        let want = if mask == 0 { Wire::Nuvec } else { Wire::Mlx };
        assert_eq!(agreed.wire, want, "{case}: rank {rank}");
        match agreed.unfit {
            None => assert_eq!(mask, 0, "{case}: rank {rank} learnt of none"),
            Some(Unfit { opener, link, why }) => {
                assert!(
                    unfit(opener, link),
                    "{case}: rank {rank} names {opener}/{link}"
                );
                assert_eq!(why, NotNative::Refused);
            }
        }
    }
    // Not a byte on a connection that is not native, in either direction.
    for opener in 0..ranks {
        for c in (0..conns).filter(|&c| unfit(opener, c)) {
            let acceptor = (opener + 1) % ranks;
            let from_opener = RingTopology::new(opener, ranks, conns).channel(Side::Right, c);
            let from_acceptor = RingTopology::new(acceptor, ranks, conns).channel(Side::Left, c);
            for key in [(opener, from_opener), (acceptor, from_acceptor)] {
                let sent = report.wire.get(&key).map_or(0, Vec::len);
                assert_eq!(sent, 0, "{case}: {key:?} carried {sent} bytes");
            }
        }
    }
}

#[test]
fn every_rank_agrees_for_every_set_of_connections_that_are_not_native_with_one_connection() {
    for ranks in 2..=6 {
        for mask in 0..1u64 << ranks {
            agree_over(ranks, 1, mask);
        }
    }
}

#[test]
fn every_rank_agrees_for_every_set_of_connections_that_are_not_native_with_two_connections() {
    for ranks in 2..=6 {
        for mask in 0..1u64 << (2 * ranks) {
            agree_over(ranks, 2, mask);
        }
    }
}

#[test]
fn a_single_connection_that_is_not_native_reaches_the_farthest_rank_in_the_last_round() {
    // Seven ranks, three rounds: the connection 0 → 1 is the only one; rank 4 is three edges
    // from either end.
    agree_over(7, 1, 0b1);
    agree_over(8, 1, 0b1000_0000);
}
