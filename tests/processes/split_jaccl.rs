//! `Group::split` on JACCL over TCP (`NUVEC_JACCL_FABRIC=tcp`'s fabric), the ranks as threads of
//! one process: a mesh split into rows and columns used interleaved with the parent, a split of
//! a split, and a ring whose sub-group lacks a cable.

use crate::common::group::{gather, sum};
use crate::common::ports;
use crate::common::rank_threads;

use std::time::Duration;

use nuvec_core::distributed::Group;
use nuvec_distributed::jaccl::{Config, FrameRule};
use nuvec_distributed::{JacclFabric, Options, connect_jaccl};

/// A device matrix of `size` ranks with one device between every pair (a mesh, and a ring too).
fn full_matrix(size: usize) -> Vec<Vec<Vec<String>>> {
    (0..size)
        .map(|i| {
            (0..size)
                .map(|j| {
                    if i == j {
                        Vec::new()
                    } else {
                        vec![format!("rdma_en{j}")]
                    }
                })
                .collect()
        })
        .collect()
}

/// Runs `body` on every rank of a JACCL job over TCP of `size` ranks (the ring if `ring`).
fn run_jaccl<T: Send>(size: usize, ring: bool, body: impl Fn(Group) -> T + Sync) -> Vec<T> {
    let coordinator = ports::free_nodes(1, 1)[0][0].clone();
    let options = Options::default().timeout(Duration::from_secs(20));
    rank_threads::run(size, |rank| {
        let config = Config::new(rank, full_matrix(size))
            .coordinator(&coordinator)
            .prefer_ring(ring);
        let group =
            connect_jaccl(&config, JacclFabric::Tcp, FrameRule::Small, &options).expect("connect");
        body(group)
    })
}

#[test]
fn a_mesh_splits_into_rows_and_columns_used_interleaved_with_the_parent() {
    let out = run_jaccl(4, false, |parent| {
        let r = parent.rank();
        let rows = parent.split((r / 2) as i32, -1).expect("rows");
        let columns = parent.split((r % 2) as i32, -1).expect("columns");
        let mut seen = Vec::new();
        for step in 0..4 {
            let v = (r * 10 + step) as f32;
            seen.push(sum(&rows, &[v; 3]));
            seen.push(sum(&columns, &[v]));
            seen.push(sum(&parent, &[v]));
        }
        // A split of a split: each row reversed by key.
        let reversed = rows.split(0, (1 - rows.rank()) as i32).expect("reversed");
        (
            r,
            seen,
            gather(&reversed, r as i32),
            gather(&columns, r as i32),
        )
    });
    for (r, seen, reversed, column_members) in out {
        let row = [(r / 2) * 2, (r / 2) * 2 + 1];
        let column = [r % 2, r % 2 + 2];
        for step in 0..4 {
            let v = |q: usize| (q * 10 + step) as f32;
            assert_eq!(seen[step * 3], vec![v(row[0]) + v(row[1]); 3], "rank {r}");
            assert_eq!(seen[step * 3 + 1], vec![v(column[0]) + v(column[1])]);
            assert_eq!(seen[step * 3 + 2], vec![(0..4).map(v).sum::<f32>()]);
        }
        assert_eq!(reversed, vec![row[1] as i32, row[0] as i32]);
        assert_eq!(column_members, vec![column[0] as i32, column[1] as i32]);
    }
}

#[test]
fn a_ring_splits_along_its_cables_and_names_the_missing_cable_otherwise() {
    let out = run_jaccl(4, true, |parent| {
        let r = parent.rank();
        // Neighbours 0-1 and 2-3 are cabled.
        let pairs = parent.split((r / 2) as i32, -1).expect("pairs");
        let pair_sum = sum(&pairs, &[r as f32]);
        // Ranks 0 and 2 are not.
        let err = parent
            .split((r % 2) as i32, -1)
            .expect_err("no cable")
            .to_string();
        (pair_sum, err, sum(&parent, &[1.0]))
    });
    for (r, (pair_sum, err, after)) in out.into_iter().enumerate() {
        assert_eq!(pair_sum, vec![if r < 2 { 1.0 } else { 5.0 }]);
        let cable = if r % 2 == 0 {
            "job ranks 0 and 2"
        } else {
            "job ranks 1 and 3"
        };
        assert!(err.contains(cable), "rank {r}: {err}");
        assert_eq!(after, vec![4.0], "the parent stays usable");
    }
}
