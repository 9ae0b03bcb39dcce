//! `split` for JACCL: a sub-group runs the parent's algorithm (mesh or ring) over a new
//! fabric among its members, made by the parent fabric's [`Splitter`].
//!
//! The members agree on the sub-group through the parent
//! ([`split_over`](crate::collective::split::split_over)). A JACCL ring can only split into
//! sub-groups whose members are joined by cables in the sub-group's ring order; a mesh can
//! split any way, every pair being cabled.

use std::sync::Arc;

use nuvec_core::distributed::Communicator;

use super::comm::{JacclCommunicator, Layout};
use crate::collective::split::{Alone, Parent, split_over};
use crate::error::Error;
use crate::fabric::Fabric;

impl<F: Fabric + Send + 'static> JacclCommunicator<F> {
    /// [`Communicator::split`] with this crate's error: the ranks that pass the same `color`
    /// form a new group of the same algorithm, ordered by `key` (−1: the parent rank), ties by
    /// parent rank. A collective on this group.
    pub fn try_split(&self, color: i32, key: i32) -> Result<Arc<dyn Communicator>, Error> {
        let layout = self.layout();
        let all_gather = |input: &[u8], output: &mut [u8]| self.try_all_gather(input, output);
        let parent = Parent {
            rank: layout.rank(),
            size: layout.size(),
            all_gather: &all_gather,
            splitter: self.splitter(),
            timeout: self.timeout(),
        };
        Ok(match split_over(&parent, color, key)? {
            None => Arc::new(Alone),
            Some((_, sub)) => {
                let comm = match layout {
                    Layout::Mesh(_) => {
                        JacclCommunicator::mesh(sub.fabric, self.rule(), self.timeout())
                    }
                    Layout::Ring(r) => {
                        JacclCommunicator::ring(sub.fabric, r.conns(), self.rule(), self.timeout())
                    }
                };
                Arc::new(comm.with_log(sub.log).with_splitter(sub.splitter))
            }
        })
    }
}
