//! `Group::split` on MLX's ring over real TCP sockets on loopback, the ranks as threads of one
//! process: rows and columns of a grid used interleaved with the parent, keys, a split of a
//! split, authentication, bad arguments, and a rank that never splits (as a Python MLX rank).

use crate::common::group::{gather, sum};
use crate::common::ports;
use crate::common::rank_threads;

use std::time::{Duration, Instant};

use nuvec_distributed::{Options, RingGroup, connect_ring};

fn run_ring<T: Send>(
    ranks: usize,
    conns: usize,
    options: Options,
    body: impl Fn(RingGroup) -> T + Sync,
) -> Vec<T> {
    let nodes = ports::free_nodes(ranks, conns);
    rank_threads::run(ranks, |rank| {
        body(connect_ring(&nodes, rank, &options).expect("connect"))
    })
}

fn options() -> Options {
    Options::default().timeout(Duration::from_secs(20))
}

#[test]
fn rows_and_columns_of_a_two_by_two_grid_sum_interleaved_with_the_parent() {
    for conns in [1, 2] {
        let out = run_ring(4, conns, options(), |g| {
            let parent = g.group();
            let r = parent.rank();
            let rows = parent.split((r / 2) as i32, -1).expect("rows");
            let columns = parent.split((r % 2) as i32, -1).expect("columns");
            assert_eq!((rows.rank(), rows.size()), (r % 2, 2));
            assert_eq!((columns.rank(), columns.size()), (r / 2, 2));
            let mut seen = Vec::new();
            // Training-style: several steps, each touching all three groups in one order.
            for step in 0..5 {
                let v = (r * 10 + step) as f32;
                seen.push(sum(&rows, &[v, 1.0]));
                seen.push(sum(&columns, &[v, 2.0]));
                seen.push(sum(&parent, &[v]));
                seen.push(
                    gather(&rows, r as i32)
                        .into_iter()
                        .map(|x| x as f32)
                        .collect(),
                );
            }
            (r, seen)
        });
        for (r, seen) in out {
            let row = [(r / 2) * 2, (r / 2) * 2 + 1];
            let column = [r % 2, r % 2 + 2];
            for step in 0..5 {
                let v = |q: usize| (q * 10 + step) as f32;
                let s = &seen[step * 4..step * 4 + 4];
                assert_eq!(s[0], vec![v(row[0]) + v(row[1]), 2.0], "rank {r} row");
                assert_eq!(
                    s[1],
                    vec![v(column[0]) + v(column[1]), 4.0],
                    "rank {r} column"
                );
                assert_eq!(s[2], vec![(0..4).map(v).sum::<f32>()], "rank {r} parent");
                assert_eq!(s[3], vec![row[0] as f32, row[1] as f32], "rank {r} gather");
            }
        }
    }
}

#[test]
fn keys_order_a_sub_group_and_ties_fall_back_to_the_parent_rank() {
    // Five ranks: colors 0,1,0,1,0; keys put rank 4 first, then ranks 0 and 2 (a tie).
    let out = run_ring(5, 1, options(), |g| {
        let parent = g.group();
        let r = parent.rank();
        let key = match r {
            4 => 0,
            0 | 2 => 7,
            _ => -1,
        };
        let sub = parent.split((r % 2) as i32, key).expect("split");
        (r, sub.rank(), sub.size(), gather(&sub, r as i32))
    });
    for (r, rank, size, members) in out {
        if r % 2 == 0 {
            assert_eq!((size, members.clone()), (3, vec![4, 0, 2]), "rank {r}");
            assert_eq!(members[rank], r as i32);
        } else {
            assert_eq!((size, members.clone()), (2, vec![1, 3]), "rank {r}");
            assert_eq!(members[rank], r as i32);
        }
    }
}

#[test]
fn a_split_of_a_split_works_and_a_rank_alone_in_its_color_is_a_group_of_one() {
    let out = run_ring(4, 1, options(), |g| {
        let parent = g.group();
        let r = parent.rank();
        // Ranks 0..3 in one group, then each of those alone; the parent still sums.
        let all = parent.split(0, (3 - r) as i32).expect("reversed");
        assert_eq!(all.rank(), 3 - r);
        let halves = all.split((all.rank() / 2) as i32, -1).expect("halves");
        let alone = halves.split(halves.rank() as i32, -1).expect("alone");
        assert_eq!(alone.size(), 1);
        (
            r,
            sum(&halves, &[r as f32]),
            sum(&alone, &[r as f32]),
            sum(&parent, &[1.0]),
            gather(&all, r as i32),
        )
    });
    for (r, halves, alone, parent, all) in out {
        // `all` is in reversed order: ranks 3,2 form its first half, ranks 1,0 its second.
        let expect = if r >= 2 { 5.0 } else { 1.0 };
        assert_eq!(halves, vec![expect], "rank {r}");
        assert_eq!(alone, vec![r as f32]);
        assert_eq!(parent, vec![4.0]);
        assert_eq!(all, vec![3, 2, 1, 0]);
    }
}

#[test]
fn a_sub_ring_of_an_authenticated_ring_authenticates_too() {
    let options = options()
        .key("a secret of at least sixteen bytes")
        .expect("key");
    let out = run_ring(4, 1, options, |g| {
        let parent = g.group();
        let r = parent.rank();
        let sub = parent.split((r % 2) as i32, -1).expect("split");
        sum(&sub, &[r as f32])
    });
    assert_eq!(out, vec![vec![2.0], vec![4.0], vec![2.0], vec![4.0]]);
}

#[test]
fn a_bad_color_fails_every_rank_naming_who_passed_it_and_the_parent_stays_usable() {
    let out = run_ring(3, 1, options(), |g| {
        let parent = g.group();
        let r = parent.rank();
        let bad_color = parent
            .split(if r == 1 { -3 } else { 0 }, -1)
            .expect_err("negative color")
            .to_string();
        // Any negative key means "my parent rank", as MLX documents.
        let sub = parent
            .split(0, if r == 2 { -9 } else { -1 })
            .expect("a key below -1 orders by parent rank");
        (
            bad_color,
            sub.rank(),
            sum(&sub, &[1.0]),
            sum(&parent, &[1.0]),
        )
    });
    for (r, (bad_color, sub_rank, in_sub, after)) in out.into_iter().enumerate() {
        assert!(bad_color.contains("rank 1 passed color -3"), "{bad_color}");
        assert_eq!(sub_rank, r);
        assert_eq!(in_sub, vec![3.0]);
        assert_eq!(after, vec![3.0]);
    }
}

#[test]
fn a_rank_that_never_splits_fails_the_others_by_the_deadline_saying_mlx_ranks_cannot() {
    let timeout = Duration::from_secs(2);
    let release = std::sync::Barrier::new(3);
    let out = run_ring(3, 1, Options::default().timeout(timeout), |g| {
        let parent = g.group();
        if parent.rank() == 2 {
            // As a Python MLX rank: it never calls split, and leaves when the others are done.
            release.wait();
            return None;
        }
        let start = Instant::now();
        let err = parent.split(0, -1).expect_err("no split").to_string();
        let waited = start.elapsed();
        release.wait();
        Some((err, waited))
    });
    for (err, waited) in out.into_iter().flatten() {
        assert!(err.contains("Python MLX ranks never do"), "{err}");
        assert!(
            waited < timeout + Duration::from_secs(3),
            "waited {waited:?}"
        );
    }
}
