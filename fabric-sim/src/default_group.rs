//! The default group (`None` in `nuvec_core::distributed`'s collectives) inside a simulation:
//! an error that says to pass the rank's group, instead of a silent group of one.
//!
//! `nuvec_core` keeps one default group per process, and the simulator runs every rank in
//! one process: no one group can be every rank's. (A group that forwarded each call to the
//! calling rank's communicator would deadlock: `nuvec_core` runs one operation of a group at
//! a time, and a collective waits for the other ranks' calls.) So the default group the
//! simulator installs ([`install`], once per process) fails every operation made on a
//! simulated rank's thread ([`enter`], for the length of the rank's body) with an error
//! naming the fix, at once. On any other thread it is the group of that thread alone, as the
//! default group was before: reductions leave the data as it is, a gather copies it, a send
//! or receive is an error.
//!
//! `nuvec_core` reads a group's rank and size once, when the group is made, and skips the
//! communicator when the size is 1. The default group is made outside any rank, so while it
//! is made it says rank and size [`usize::MAX`]: every call then reaches it.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use nuvec_core::distributed::{AllReduce, Communicator, Group, set_default_group};
use nuvec_core::{DType, Error, Result};

thread_local! {
    /// The rank running on this thread, if a simulated one is.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
    /// Whether the forwarder is being made (on this thread).
    static MAKING: Cell<bool> = const { Cell::new(false) };
}

/// Makes the forwarder the process's default group, once.
pub(crate) fn install() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        MAKING.with(|m| m.set(true));
        let group = Group::new(Arc::new(Forwarder));
        MAKING.with(|m| m.set(false));
        set_default_group(group);
    });
}

/// While the guard lives, this thread runs simulated rank `rank`.
pub(crate) fn enter(rank: usize) -> Entered {
    CURRENT.with(|c| c.set(Some(rank)));
    Entered(())
}

/// Ends [`enter`] when dropped.
pub(crate) struct Entered(());

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(None));
    }
}

/// The simulated rank running on this thread, if one is.
fn current() -> Option<usize> {
    CURRENT.with(Cell::get)
}

/// The default group of a process that runs simulations.
struct Forwarder;

impl Communicator for Forwarder {
    fn rank(&self) -> usize {
        if MAKING.with(Cell::get) {
            usize::MAX
        } else {
            0
        }
    }

    fn size(&self) -> usize {
        if MAKING.with(Cell::get) {
            usize::MAX
        } else {
            1
        }
    }

    fn all_reduce(&self, _op: AllReduce, _dtype: DType, _data: &mut [u8]) -> Result<()> {
        match current() {
            Some(rank) => Err(in_rank(rank, "all_reduce")),
            None => Ok(()),
        }
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        match current() {
            Some(rank) => Err(in_rank(rank, "all_gather")),
            None if input.len() == output.len() => {
                output.copy_from_slice(input);
                Ok(())
            }
            None => Err(alone("all_gather")),
        }
    }

    fn send(&self, dst: usize, _data: &[u8]) -> Result<()> {
        let what = format!("send to rank {dst}");
        Err(current().map_or_else(|| alone(&what), |rank| in_rank(rank, &what)))
    }

    fn recv(&self, src: usize, _data: &mut [u8]) -> Result<()> {
        let what = format!("recv from rank {src}");
        Err(current().map_or_else(|| alone(&what), |rank| in_rank(rank, &what)))
    }

    fn split(&self, _color: i32, _key: i32) -> Result<Arc<dyn Communicator>> {
        Err(current().map_or_else(|| alone("split"), |rank| in_rank(rank, "split")))
    }
}

/// The error of `what` on the default group on simulated rank `rank`'s thread.
fn in_rank(rank: usize, what: &str) -> Error {
    Error::InvalidArgument(format!(
        "distributed: {what} on the default group (None) in simulated rank {rank}: the \
         simulator runs every rank in one process, which has one default group; pass the \
         rank's group that run_ring or run_jaccl gives its body (Some(&group))"
    ))
}

/// The error of `what` on the default group outside a simulated rank.
fn alone(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "distributed: {what} on the default group outside a simulated rank: this thread is the \
         group of itself alone"
    ))
}
