//! One failure model: argument errors are found before a byte moves and leave the group
//! usable; the upstream 0.5.0 misalignment (an unsupported reduction failing mid-transfer, then
//! a wrong next all_sum) cannot happen; after a wire failure every call fails at once, and the
//! group can say when and in which operation each peer was last heard from.

use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Error, RingCommunicator};
use nuvec_fabric_sim::{Fault, Outcome, Sim};

const TIMEOUT: Duration = Duration::from_secs(30);

fn f32s(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

#[test]
fn complex_max_then_sum_gives_the_right_sum_on_every_rank() {
    // Upstream 0.5.0 failed this all_max mid-transfer and then returned rank-dependent sums.
    let report = Sim::ring(2, 1).seed(3).run(|fabric| {
        let rank = nuvec_distributed::fabric::Fabric::rank(&fabric);
        let comm = RingCommunicator::new(fabric, 1, TIMEOUT);
        let mut big = f32s((0..(2 << 20)).map(|i| (i % 7) as f32 + rank as f32));
        comm.try_all_reduce(Reduction::Max, DType::Complex64, &mut big)
            .expect("complex64 all_max is MLX's lexicographic max");
        let mut small = f32s([1.0f32, 1.0, 1.0, 1.0].into_iter());
        comm.try_all_reduce(Reduction::Sum, DType::F32, &mut small)
            .expect("all_sum");
        small
    });
    for outcome in report.outcomes {
        assert_eq!(
            outcome.returned().expect("returned"),
            f32s([2.0f32; 4].into_iter())
        );
    }
}

#[test]
fn argument_errors_move_no_byte_and_leave_the_group_usable() {
    let report = Sim::ring(3, 2).seed(9).record_wire(true).run(|fabric| {
        let comm = RingCommunicator::new(fabric, 2, TIMEOUT);
        let mut errors = Vec::new();
        // A length that is not a whole number of elements.
        let mut odd = vec![0u8; 7];
        errors.push(comm.try_all_reduce(Reduction::Sum, DType::F32, &mut odd));
        // An all_gather output of the wrong size.
        errors.push(comm.try_all_gather(&[1, 2, 3], &mut [0u8; 8]));
        // A ring sends and receives between neighbours only; a rank is not its own neighbour.
        let me = comm.topology().rank();
        errors.push(comm.try_send(me, &[1, 2, 3]));
        errors.push(comm.try_recv(5, &mut [0u8; 3]));
        for e in &errors {
            let e = e.as_ref().expect_err("an argument error");
            assert!(e.leaves_group_usable(), "{e}");
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            assert!(e.to_string().contains(&format!("rank {me}")), "{e}");
        }
        let mut data = f32s((0..10).map(|i| i as f32));
        comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)
            .expect("the group is still usable");
        data
    });
    let want = f32s((0..10).map(|i| 3.0 * i as f32));
    let total_wire: usize = report.wire.values().map(Vec::len).sum();
    for outcome in report.outcomes {
        assert_eq!(outcome.returned().expect("returned"), want);
    }
    // Only the final all_sum's bytes are on the wire: 10 f32 over 3 ranks is one sub-reduce
    // whose segments are 4, 4 and 2 elements; at each of its 4 steps the 3 ranks send the 3
    // segments once between them.
    assert_eq!(total_wire, 4 * (16 + 16 + 8), "argument errors sent bytes");
}

#[test]
fn after_a_wire_failure_every_call_fails_at_once_with_the_first_error() {
    let report = Sim::ring(3, 1)
        .seed(5)
        .fault(Fault::Crash { rank: 2, call: 0 })
        .run(|fabric| {
            let comm = RingCommunicator::new(fabric, 1, TIMEOUT);
            let mut data = vec![1u8; 1000];
            let first = comm
                .try_all_reduce(Reduction::Sum, DType::U8, &mut data)
                .expect_err("a peer crashed");
            let second = comm
                .try_all_gather(&[1], &mut [0u8; 3])
                .expect_err("the group failed");
            (first, second)
        });
    for (rank, outcome) in report.outcomes.into_iter().enumerate() {
        let (first, second) = match outcome {
            Outcome::Returned(pair) => pair,
            Outcome::Crashed => continue,
            Outcome::Panicked(p) => panic!("rank {rank}: {p}"),
        };
        assert!(matches!(first, Error::Transport { .. }), "{first}");
        assert!(first.to_string().contains("all_sum #0"), "{first}");
        match second {
            Error::Failed {
                first: inner, op, ..
            } => {
                assert_eq!(*inner, first);
                assert_eq!(op, "all_gather");
            }
            other => panic!("rank {rank}: {other}"),
        }
    }
}

#[test]
fn after_a_failure_every_peer_is_summarised_with_the_operation_it_was_last_heard_in() {
    // Rank 2 crashes at its first step of the fourth operation (each all-reduce of 3 ranks is
    // 2 fabric steps over the simulator, which forwards: a reduce-scatter and an all-gather);
    // the survivors fail in that operation, and the one that
    // receives from rank 2 (data flows one way on a small all-reduce) says it was last heard
    // during operation #2.
    let report = Sim::ring(3, 1)
        .seed(9)
        .fault(Fault::Crash { rank: 2, call: 6 })
        .run(|fabric| {
            let comm = RingCommunicator::new(fabric, 1, TIMEOUT);
            assert!(comm.diagnosis().is_empty(), "no diagnosis while healthy");
            let mut failed = None;
            for _ in 0..5 {
                let mut data = vec![1u8; 16];
                if let Err(e) = comm.try_all_reduce(Reduction::Sum, DType::U8, &mut data) {
                    failed = Some(e);
                    break;
                }
            }
            (failed.map(|e| e.to_string()), comm.diagnosis())
        });
    let mut about_2 = Vec::new();
    for (rank, outcome) in report.outcomes.into_iter().enumerate() {
        let (error, diagnosis) = match outcome {
            Outcome::Returned(pair) => pair,
            Outcome::Crashed => continue,
            Outcome::Panicked(p) => panic!("rank {rank}: {p}"),
        };
        assert!(error.is_some(), "rank {rank} must fail");
        assert_eq!(diagnosis.len(), 2, "rank {rank}: {diagnosis:?}");
        for line in &diagnosis {
            assert!(
                line.contains(": last heard ") || line.ends_with(": never heard from"),
                "rank {rank}: {line}"
            );
        }
        about_2.extend(diagnosis.into_iter().filter(|l| l.starts_with("rank 2:")));
    }
    assert!(
        about_2.iter().any(|l| l.contains("during all_sum #2")),
        "{about_2:?}"
    );
}

#[test]
fn the_diagnosis_of_a_ring_of_five_names_only_its_two_neighbours() {
    // A ring rank has links to its two neighbours only: the others it never hears from by
    // design, and listing them as "never heard from" would point at healthy ranks.
    let report = Sim::ring(5, 1)
        .seed(4)
        .fault(Fault::Crash { rank: 2, call: 9 })
        .run(|fabric| {
            let rank = nuvec_distributed::fabric::Fabric::rank(&fabric);
            let comm = RingCommunicator::new(fabric, 1, TIMEOUT);
            for _ in 0..5 {
                let mut data = vec![1u8; 16];
                if comm
                    .try_all_reduce(Reduction::Sum, DType::U8, &mut data)
                    .is_err()
                {
                    break;
                }
            }
            (rank, comm.diagnosis())
        });
    let mut diagnosed = 0;
    for outcome in report.outcomes {
        let (rank, diagnosis) = match outcome {
            Outcome::Returned(pair) => pair,
            Outcome::Crashed => continue,
            Outcome::Panicked(p) => panic!("{p}"),
        };
        let neighbours = [(rank + 4) % 5, (rank + 1) % 5];
        let mut named: Vec<usize> = diagnosis
            .iter()
            .map(|line| {
                let peer = line
                    .strip_prefix("rank ")
                    .and_then(|l| l.split(':').next())
                    .and_then(|p| p.parse().ok());
                peer.unwrap_or_else(|| panic!("rank {rank}: {line}"))
            })
            .collect();
        named.sort_unstable();
        let mut expected = neighbours.to_vec();
        expected.sort_unstable();
        assert_eq!(named, expected, "rank {rank}: {diagnosis:?}");
        diagnosed += 1;
    }
    assert_eq!(diagnosed, 4, "every survivor fails and diagnoses");
}

#[test]
fn a_timeout_set_before_an_operation_is_its_deadline() {
    // Rank 1 stalls for 10 s; rank 0 gives its operation 1 s and fails after 1 s, not 30.
    let report = Sim::ring(2, 1)
        .seed(3)
        .fault(Fault::Stall {
            rank: 1,
            at: Duration::ZERO,
            duration: Duration::from_secs(10),
        })
        .run(|fabric| {
            let clock = fabric.clock();
            let rank = nuvec_distributed::fabric::Fabric::rank(&fabric);
            let comm = RingCommunicator::new(fabric, 1, TIMEOUT);
            if rank == 0 {
                comm.set_timeout(Duration::from_secs(1));
                assert_eq!(comm.timeout(), Duration::from_secs(1));
            }
            let mut data = vec![1u8; 64];
            let result = comm.try_all_reduce(Reduction::Sum, DType::U8, &mut data);
            (result.is_err(), clock.now())
        });
    let Outcome::Returned((failed, at)) = &report.outcomes[0] else {
        panic!("{:?}", report.outcomes[0])
    };
    assert!(*failed, "rank 0 must time out");
    assert!(
        *at >= Duration::from_secs(1) && *at < Duration::from_millis(1010),
        "failed at {at:?}"
    );
}

/// Rank 0 of `size` ranks whose neighbours have left: every step fails at once with the
/// connection closed, as when a Python MLX neighbour raised and exited.
struct Deserted {
    size: usize,
}

impl nuvec_distributed::fabric::Fabric for Deserted {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        self.size
    }

    fn kind(&self) -> nuvec_distributed::fabric::ChannelKind {
        nuvec_distributed::fabric::ChannelKind::Stream
    }

    fn links(&self, peer: usize) -> usize {
        usize::from(peer == 1 || peer == self.size - 1)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }

    fn run(
        &mut self,
        step: &mut [nuvec_distributed::fabric::Transfer<'_>],
        _deadline: Duration,
    ) -> Result<(), nuvec_distributed::fabric::FabricError> {
        let t = &step[0];
        Err(nuvec_distributed::fabric::FabricError {
            channel: t.channel(),
            direction: t.direction(),
            done: 0,
            total: t.len(),
            kind: nuvec_distributed::fabric::FailureKind::Closed,
        })
    }
}

#[test]
fn a_peer_closing_during_an_all_reduce_mlx_refuses_fails_naming_mlxs_rule() {
    use nuvec_distributed::fabric::FailureKind;
    // 129 ranks, one 8-byte element: E < R and s·R = 1032 > 1024, where MLX throws.
    let comm = RingCommunicator::new(Deserted { size: 129 }, 1, TIMEOUT);
    let mut one = vec![0u8; 8];
    let e = comm
        .try_all_reduce(Reduction::Sum, DType::U64, &mut one)
        .expect_err("the neighbours left");
    let text = e.to_string();
    match &e {
        Error::Transport { source, .. } => {
            assert!(
                matches!(source.kind, FailureKind::ClosedBeyondMlx(_)),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    for words in [
        "1032 > 1024",
        "Can't perform the ring all reduce",
        "at least 129 elements",
    ] {
        assert!(text.contains(words), "{words:?} in {text}");
    }
    // Within MLX's limit (s·R = 516), a close is only a close.
    let comm = RingCommunicator::new(Deserted { size: 129 }, 1, TIMEOUT);
    let mut one = vec![0u8; 4];
    let e = comm
        .try_all_reduce(Reduction::Sum, DType::F32, &mut one)
        .expect_err("the neighbours left");
    match &e {
        Error::Transport { source, .. } => assert_eq!(source.kind, FailureKind::Closed, "{e}"),
        other => panic!("{other:?}"),
    }
}

/// One all_sum of 16 floats on `ranks` ranks under `fault`: when the fault struck, if it did,
/// and whether every rank returned the right sum.
fn one_all_sum_under(fault: Fault) -> (Option<Duration>, bool) {
    let ranks = 3;
    let report = Sim::ring(ranks, 1).seed(11).fault(fault).run(|fabric| {
        let comm = RingCommunicator::new(fabric, 1, TIMEOUT);
        let mut data = f32s((0..16).map(|i| i as f32));
        comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)
            .map(|()| data)
            .map_err(|e| e.to_string())
    });
    let want = f32s((0..16).map(|i| (ranks * i) as f32));
    let all_right = report
        .outcomes
        .into_iter()
        .all(|o| o.returned().is_some_and(|r| r.as_ref() == Ok(&want)));
    (report.fault_struck, all_right)
}

#[test]
fn the_report_says_whether_and_when_the_fault_struck_and_one_that_did_not_changes_nothing() {
    // Past the job's end (its all_sum takes microseconds): no rank is left to crash.
    let late = one_all_sum_under(Fault::CrashAt {
        rank: 1,
        at: Duration::from_secs(100),
    });
    assert_eq!(late, (None, true), "a crash after the job");
    // A fabric call the rank never makes.
    let never = one_all_sum_under(Fault::Crash {
        rank: 1,
        call: 1_000,
    });
    assert_eq!(never, (None, true), "a crash at a call never made");
    // A cut long after both its ends returned.
    let late_cut = one_all_sum_under(Fault::Cut {
        rank: 0,
        channel: nuvec_distributed::fabric::Channel::new(1, 0),
        at: Duration::from_secs(100),
    });
    assert_eq!(late_cut, (None, true), "a cut after the job");
    // Its first call: it struck at once, and the job failed.
    let first = one_all_sum_under(Fault::Crash { rank: 1, call: 0 });
    assert_eq!(
        first,
        (Some(Duration::ZERO), false),
        "a crash at the first call"
    );
    // A short stall of a running rank strikes and fails nothing.
    let stall = one_all_sum_under(Fault::Stall {
        rank: 2,
        at: Duration::ZERO,
        duration: Duration::from_millis(20),
    });
    assert_eq!(stall, (Some(Duration::ZERO), true), "a short stall");
}
