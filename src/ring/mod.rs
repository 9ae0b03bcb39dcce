//! MLX's TCP ring: its schedules ([`schedule`], pure arithmetic) and its algorithms over any
//! [`Fabric`](crate::fabric::Fabric) ([`algorithm`]).
//!
//! The ring is MLX's `ring` backend (`mlx/distributed/ring/ring.cpp`): every rank listens on
//! the addresses of its own hostfile entry and connects to those of its right neighbour, so
//! each rank has C connections to each neighbour, and every collective is a fixed sequence of
//! raw element bytes on each direction of each connection. [`RingTopology`] names those
//! connections as fabric channels.

// Public for the simulator's tests (through `internals`), not part of the API.
#[doc(hidden)]
pub mod agree;
pub mod algorithm;
pub mod checked;
pub(crate) mod communicator;
pub mod fingerprint;
pub mod relay;
pub mod schedule;
pub(crate) mod split;

use crate::fabric::Channel;
use schedule::Side;

/// Where this rank sits in a ring and how its connections are numbered as channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingTopology {
    rank: usize,
    size: usize,
    conns: usize,
}

impl RingTopology {
    /// Rank `rank` of a ring of `size` ranks with `conns` connections per neighbour.
    ///
    /// # Panics
    /// If `rank >= size` or `conns == 0` while `size > 1`.
    pub fn new(rank: usize, size: usize, conns: usize) -> Self {
        assert!(rank < size, "ring: rank {rank} of {size}");
        assert!(size < 2 || conns > 0, "ring: no connections");
        Self { rank, size, conns }
    }

    /// The ring of `fabric`'s rank with `conns` connections per neighbour, checked against
    /// the fabric's links: the one check both communicators on a ring (MLX's and JACCL's)
    /// make; `what` names the caller in the panic.
    ///
    /// # Panics
    /// As [`new`](RingTopology::new), and if the fabric does not have `conns` links to each
    /// neighbour (`2 × conns` to the one neighbour of a ring of two).
    pub(crate) fn over<F: crate::fabric::Fabric>(fabric: &F, conns: usize, what: &str) -> Self {
        let ring = Self::new(fabric.rank(), fabric.size(), conns);
        if ring.size() > 1 {
            let expected = if ring.size() == 2 { 2 * conns } else { conns };
            assert_eq!(
                fabric.links(ring.right()),
                expected,
                "{what}: links to the right neighbour"
            );
            assert_eq!(
                fabric.links(ring.left()),
                expected,
                "{what}: links to the left neighbour"
            );
        }
        ring
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Connections per neighbour (C).
    pub fn conns(&self) -> usize {
        self.conns
    }

    /// The right neighbour, `(r + 1) mod R`.
    pub fn right(&self) -> usize {
        (self.rank + 1) % self.size
    }

    /// The left neighbour, `(r − 1) mod R`.
    pub fn left(&self) -> usize {
        (self.rank + self.size - 1) % self.size
    }

    /// The channel of connection `c` to the neighbour on `side`, numbered as
    /// [`Wiring::ring`](crate::fabric::Wiring::ring) does: the connections this rank opened to
    /// its right neighbour are links `0..C`; those its left neighbour opened to it are links
    /// `0..C` of the left neighbour, or `C..2C` when the two neighbours are one rank (R = 2).
    pub fn channel(&self, side: Side, c: usize) -> Channel {
        match side {
            Side::Right => Channel::new(self.right(), c),
            Side::Left => {
                let offset = if self.size == 2 { self.conns } else { 0 };
                Channel::new(self.left(), offset + c)
            }
        }
    }
}
