//! What a new user of the simulator meets first: a panicking rank's report shows its message,
//! a crash aims at the k-th operation, and the default group (`None`) inside `run_ring` and
//! `run_jaccl` fails at once saying to pass the rank's group, not a silent group of one.

use std::time::Duration;

use nuvec_core::{array, distributed};
use nuvec_distributed::jaccl::FrameRule;
use nuvec_fabric_sim::{Fault, Outcome, Sim};

#[test]
fn a_rank_that_panics_is_reported_with_its_message() {
    let report = Sim::ring(3, 1)
        .seed(1)
        .run_ring(Duration::from_secs(5), |group| {
            if group.rank() == 1 {
                panic!("rank {} gave up", group.rank());
            }
            group.rank()
        });
    assert_eq!(
        report.outcomes[1],
        Outcome::Panicked("rank 1 gave up".to_owned())
    );
    let report = Sim::ring(2, 1)
        .seed(1)
        .run_ring(Duration::from_secs(5), |group| {
            if group.rank() == 0 {
                panic!("a static message");
            }
        });
    assert_eq!(
        report.outcomes[0],
        Outcome::Panicked("a static message".to_owned())
    );
}

#[test]
fn a_crash_aimed_at_the_second_all_sum_lets_the_first_complete_everywhere() {
    let report = Sim::ring(4, 1)
        .seed(3)
        .fault(Fault::CrashAtOperation {
            rank: 2,
            operation: 1,
        })
        .run_ring(Duration::from_secs(5), |group| {
            let x = array![1.0f32, 2.0];
            let first = distributed::all_sum(&x, Some(&group)).to_vec::<f32>();
            let second = distributed::all_sum(&x, Some(&group)).to_vec::<f32>();
            (first.map_err(|e| e.to_string()), second.is_ok())
        });
    for (rank, outcome) in report.outcomes.iter().enumerate() {
        match outcome {
            Outcome::Crashed => assert_eq!(rank, 2, "{outcome:?}"),
            Outcome::Returned((first, second)) => {
                assert_eq!(first.as_deref(), Ok(&[4.0f32, 8.0][..]), "rank {rank}");
                assert!(!second, "rank {rank}'s second all_sum succeeded");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}

#[test]
fn the_default_group_inside_a_simulation_fails_at_once_saying_to_pass_the_ranks_group() {
    let report = Sim::ring(3, 1)
        .seed(5)
        .run_ring(Duration::from_secs(5), |group| {
            let x = array![1.0f32, 2.0];
            let none = distributed::all_sum(&x, None).to_vec::<f32>();
            let some = distributed::all_sum(&x, Some(&group)).to_vec::<f32>();
            (none.map_err(|e| e.to_string()), some.ok())
        });
    for (rank, outcome) in report.outcomes.into_iter().enumerate() {
        let (none, some) = outcome.returned().expect("every rank returns");
        let text = none.expect_err("an all_sum on None in a simulated rank");
        assert!(
            text.contains(&format!("simulated rank {rank}")) && text.contains("Some(&group)"),
            "{text}"
        );
        assert_eq!(
            some,
            Some(vec![3.0f32, 6.0]),
            "the rank's group still works"
        );
    }
    let report =
        Sim::mesh(4)
            .seed(5)
            .run_jaccl(Duration::from_secs(5), FrameRule::Small, |_group| {
                distributed::all_sum(&array![1.0f32], None)
                    .to_vec::<f32>()
                    .is_err()
            });
    for outcome in report.outcomes {
        assert_eq!(outcome.returned(), Some(true));
    }
    // Outside a simulated rank, the default group is still the thread alone.
    let alone = distributed::all_sum(&array![5.0f32], None).to_vec::<f32>();
    assert_eq!(alone.ok(), Some(vec![5.0f32]));
}
