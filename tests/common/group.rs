//! The collectives the tests of `Group::split` run on a group of nuvec's distributed API
//! (`tests/processes/split.rs`, `split_ring.rs`, `split_jaccl.rs`), with plain vectors in and
//! out, so that a rank's results compare with a model's numbers.

use nuvec_core::Array;
use nuvec_core::distributed::{self, Group};

/// The sum over `group` of `values`, as float32.
pub fn sum(group: &Group, values: &[f32]) -> Vec<f32> {
    let x = Array::from_slice(values, [values.len()]);
    distributed::all_sum(&x, Some(group))
        .to_vec::<f32>()
        .expect("all_sum")
}

/// Every rank's `value`, gathered over `group`, as int32.
pub fn gather(group: &Group, value: i32) -> Vec<i32> {
    let x = Array::from_slice(&[value], [1]);
    distributed::all_gather(&x, Some(group))
        .to_vec::<i32>()
        .expect("all_gather")
}
