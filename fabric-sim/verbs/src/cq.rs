//! Completion queues.
//!
//! A completion queue holds at most `cqe` completions (the number `ibv_create_cq` was given).
//! One more is an overrun: as on hardware, the queue enters an error state, the completion is
//! lost, and every later poll returns a negative value (`-EOVERFLOW`).
//!
//! Polling also retires work requests: a queue pair's send and receive queues hold a work
//! request from its post until its completion is polled, and an unsignaled send until the
//! completion of a later signaled one is polled, as providers that reclaim queue slots on poll
//! do. That is what makes "more outstanding than the queue pair was created with" observable.

use nuvec_verbs_abi::ibv_wc;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The work requests of one queue pair not yet retired.
#[derive(Debug, Default)]
pub(crate) struct Outstanding {
    /// Send work requests.
    pub(crate) send: AtomicU32,
    /// Receive work requests.
    pub(crate) recv: AtomicU32,
}

/// A completion and what polling it retires.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The completion.
    pub(crate) wc: ibv_wc,
    /// Whose work requests it retires.
    pub(crate) owner: Arc<Outstanding>,
    /// How many send work requests (itself and the unsignaled ones before it).
    pub(crate) sends: u32,
    /// How many receive work requests.
    pub(crate) recvs: u32,
}

/// The locked part of a completion queue.
#[derive(Debug, Default)]
struct Inner {
    /// Completions not yet polled, oldest first.
    entries: VecDeque<Entry>,
    /// Whether the queue overran.
    overrun: bool,
}

/// A completion queue.
#[derive(Debug)]
pub(crate) struct Cq {
    /// The address of its `ibv_cq`.
    pub(crate) ptr: usize,
    /// The address of its context's `ibv_context`.
    pub(crate) ctx: usize,
    /// Its capacity.
    cqe: usize,
    /// Its completions.
    inner: Mutex<Inner>,
}

impl Cq {
    /// A queue of `cqe` completions.
    pub(crate) fn new(ptr: usize, ctx: usize, cqe: usize) -> Cq {
        Cq {
            ptr,
            ctx,
            cqe,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Adds a completion, or overruns.
    pub(crate) fn push(&self, entry: Entry) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.overrun {
            return;
        }
        if inner.entries.len() >= self.cqe {
            inner.overrun = true;
            inner.entries.clear();
            return;
        }
        inner.entries.push_back(entry);
    }

    /// Moves up to `out.len()` completions into `out`; their count, or `-EOVERFLOW` after an
    /// overrun.
    pub(crate) fn poll(&self, out: &mut [ibv_wc]) -> i32 {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.overrun {
            return -libc::EOVERFLOW;
        }
        let mut n = 0;
        for slot in out.iter_mut() {
            let Some(entry) = inner.entries.pop_front() else {
                break;
            };
            *slot = entry.wc;
            entry.owner.send.fetch_sub(entry.sends, Ordering::Relaxed);
            entry.owner.recv.fetch_sub(entry.recvs, Ordering::Relaxed);
            n += 1;
        }
        n
    }

    /// Removes the completions of queue pair `qp_num` (it was reset or destroyed).
    pub(crate) fn clean(&self, qp_num: u32) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.entries.retain(|e| e.wc.qp_num != qp_num);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(owner: &Arc<Outstanding>, wr_id: u64) -> Entry {
        owner.send.fetch_add(1, Ordering::Relaxed);
        Entry {
            wc: ibv_wc {
                wr_id,
                ..Default::default()
            },
            owner: Arc::clone(owner),
            sends: 1,
            recvs: 0,
        }
    }

    #[test]
    fn completions_come_out_in_order_and_retire_their_requests() {
        let owner = Arc::new(Outstanding::default());
        let cq = Cq::new(0, 0, 4);
        for id in 0..3 {
            cq.push(entry(&owner, id));
        }
        let mut out = [ibv_wc::default(); 2];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!([out[0].wr_id, out[1].wr_id], [0, 1]);
        assert_eq!(owner.send.load(Ordering::Relaxed), 1);
        assert_eq!(cq.poll(&mut out), 1);
        assert_eq!(cq.poll(&mut out), 0);
    }

    #[test]
    fn one_completion_too_many_is_an_overrun_every_later_poll_reports() {
        let owner = Arc::new(Outstanding::default());
        let cq = Cq::new(0, 0, 2);
        for id in 0..3 {
            cq.push(entry(&owner, id));
        }
        let mut out = [ibv_wc::default(); 4];
        assert_eq!(cq.poll(&mut out), -libc::EOVERFLOW);
        assert_eq!(cq.poll(&mut out), -libc::EOVERFLOW);
    }
}
