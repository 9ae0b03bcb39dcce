//! A first run of the ring over the simulator.
use nuvec_core::DType;
use nuvec_distributed::RingCommunicator;
use nuvec_distributed::reduce::Reduction;
use nuvec_fabric_sim::{Outcome, Sim};
use std::time::Duration;

#[test]
fn four_ranks_sum_floats() {
    for (ranks, links, n) in [
        (2, 1, 10usize),
        (4, 2, 10),
        (3, 1, 2),
        (4, 2, 1 << 20),
        (5, 3, 1000),
    ] {
        let report = Sim::ring(ranks, links).seed(7).run(|fabric| {
            let rank = nuvec_distributed::fabric::Fabric::rank(&fabric);
            let comm = RingCommunicator::new(fabric, links, Duration::from_secs(30));
            let mut data: Vec<u8> = (0..n)
                .flat_map(|i| ((i + rank) as f32).to_le_bytes())
                .collect();
            comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)
                .map(|_| data)
        });
        let expect: Vec<u8> = (0..n)
            .flat_map(|i| ((0..ranks).map(|r| (i + r) as f32).sum::<f32>()).to_le_bytes())
            .collect();
        for o in report.outcomes {
            match o {
                Outcome::Returned(Ok(d)) => assert!(d == expect, "ranks {ranks} n {n}"),
                other => panic!("{other:?}"),
            }
        }
        println!(
            "{ranks} {links} {n}: end {:?} hash {:x}",
            report.end, report.trace_hash
        );
    }
}

#[test]
fn a_sink_receive_that_is_not_a_whole_number_of_grains_is_invalid_on_the_simulator() {
    use nuvec_distributed::fabric::{Channel, Fabric, FailureKind, Landing, Transfer};
    let report = Sim::ring(2, 1).seed(3).run(|mut fabric| {
        if fabric.rank() == 1 {
            return None;
        }
        let mut sink = |_: usize, _: &[u8]| {};
        let mut step = [Transfer::Recv {
            channel: Channel::new(1, 0),
            landing: Landing::Sink {
                len: 6,
                grain: 4,
                sink: &mut sink,
            },
        }];
        Some(fabric.run(&mut step, Duration::from_secs(10)))
    });
    match &report.outcomes[0] {
        Outcome::Returned(Some(Err(e))) => match &e.kind {
            FailureKind::Invalid(what) => assert!(what.contains("whole number of grains"), "{e}"),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}
