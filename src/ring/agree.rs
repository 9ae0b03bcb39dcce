//! The job-wide agreement on a wire: after its connections are made and before its first
//! operation, every rank of a ring learns whether every connection of the job is *native*
//! (both ends are ranks of this crate that may speak the nuvec wire), and so every rank
//! chooses the same wire: the nuvec wire if all are, MLX's otherwise.
//!
//! # What each rank knows, and what it sends
//!
//! A rank knows which of *its own* connections are native (the connection setup found out,
//! the same at both ends: the `probe` module of the TCP transport, or the handshake with a
//! key). It knows nothing of the others'. So the ranks tell each other, over native
//! connections only: per neighbour the lowest-index native connection (both ends compute it
//! alike, from what both know of their connections), none where every connection to that
//! neighbour is MLX's. In each of [`rounds`]`(R)` rounds, every rank sends each such
//! neighbour a [`RECORD`] of 12 bytes, "the first connection that is not native I know of",
//! and takes the least of what it knows and what it received:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 1 | 1 if a connection follows, 0 if none is known (and the rest zero) |
//! | 1 | 1 | why it is not native ([`NotNative::code`]) |
//! | 2 | 2 | zero |
//! | 4 | 4 | the rank that opened it (u32 LE) |
//! | 8 | 4 | its link index (u32 LE) |
//!
//! No byte of the agreement goes on a connection that is not native, so a Python MLX rank
//! (whose connections are never native) sees none: a rank that speaks MLX's wire never
//! receives a byte MLX would not send it.
//!
//! # Why ⌊(R−1)/2⌋ rounds reach every rank
//!
//! Call the pair of neighbours (r, r+1) an *edge*, *cut* when none of its connections is
//! native (R = 2 has one pair of ranks, and each rank sees every connection of the job: zero
//! rounds). A rank *knows* after round t if a rank that knew from the start is within t
//! edges of it along edges that are not cut: each round moves what a rank knows one edge
//! further, both ways. At the start the ranks that know are exactly the two ends of every
//! connection that is not native.
//!
//! - No edge cut, some connection of edge (a, a+1) not native: a and a+1 know, and the
//!   ring of R ranks is whole, so every rank is within ⌈(R−2)/2⌉ = ⌊(R−1)/2⌋ edges of a or
//!   a+1 (the R−2 others lie on the path from a+1 round to a).
//! - k ≥ 1 edges cut: the ring falls into k paths of L₁ + … + L_k = R ranks, each path's
//!   two end ranks (one rank: itself) being ends of a cut edge, so they know. A rank of a
//!   path of L ranks is within ⌊(L−1)/2⌋ ≤ ⌊(R−1)/2⌋ edges of one of its ends.
//! - Every connection native: nobody knows, nobody learns anything, and all choose the
//!   nuvec wire.
//!
//! So after ⌊(R−1)/2⌋ rounds every rank knows whether the job has a connection that is not
//! native, whatever the set of such connections. The simulator's tests check it for every
//! set, R = 2 to 6, one and two connections per neighbour (`tests/sim/wire_agreement.rs`).
//! Every rank runs the same number of rounds, and the two ends of a connection both use it
//! in every round or neither does, so every send has its receive.
//!
//! # Differences from MLX
//!
//! MLX has one wire and no agreement. A rank asked for MLX's wire (`WireChoice::Mlx`) neither
//! probes nor answers, so its connections are not native and the job speaks MLX's wire.

use std::time::Duration;

use crate::config::options::{Wire, WireChoice};
use crate::error::Error;
use crate::fabric::{Fabric, Landing, Transfer};
use crate::ring::RingTopology;
use crate::ring::schedule::Side;
use crate::transport::tcp::NotNative;

/// The length of the record each round sends each neighbour.
pub const RECORD: usize = 12;

/// A connection of the ring that is not native: the rank that opened it, its link index and
/// why (ordered so, so that every rank takes the same least one it knows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Unfit {
    /// The rank that opened the connection (the acceptor is its right neighbour).
    pub opener: usize,
    /// The link index.
    pub link: usize,
    /// Why it is not native.
    pub why: NotNative,
}

impl Unfit {
    /// The rank that accepted the connection, in a ring of `size` ranks.
    pub fn acceptor(&self, size: usize) -> usize {
        (self.opener + 1) % size.max(1)
    }

    /// Its record (see the module docs).
    pub fn encode(this: Option<Unfit>) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        if let Some(u) = this {
            b[0] = 1;
            b[1] = u.why.code();
            b[4..8].copy_from_slice(&(u.opener as u32).to_le_bytes());
            b[8..12].copy_from_slice(&(u.link as u32).to_le_bytes());
        }
        b
    }

    /// The connection a record names (`Ok(None)`: none), or [`NotARecord`].
    pub fn decode(b: &[u8; RECORD]) -> Result<Option<Unfit>, NotARecord> {
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        match b[0] {
            0 if b.iter().all(|&x| x == 0) => Ok(None),
            1 if b[2..4] == [0, 0] => {
                let why = NotNative::from_code(b[1]).ok_or(NotARecord)?;
                Ok(Some(Unfit {
                    opener: word(4) as usize,
                    link: word(8) as usize,
                    why,
                }))
            }
            _ => Err(NotARecord),
        }
    }
}

/// Bytes that are not a record of the agreement (a peer of another version, or a bug).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotARecord;

/// What the ranks agreed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreement {
    /// The wire the job speaks.
    pub wire: Wire,
    /// A connection that is not native, if the job has one (the least this rank learnt of).
    pub unfit: Option<Unfit>,
}

/// The rounds of a ring of `size` ranks: ⌊(R−1)/2⌋ (see the module docs).
pub fn rounds(size: usize) -> usize {
    size.saturating_sub(1) / 2
}

/// Runs the agreement of this rank of `ring` over `fabric`, this rank asked for `choice`,
/// where `known(side, c)` says why connection `c` to the neighbour on `side` is not native
/// (`None`: it is), all of it within `timeout`. Every rank of the ring calls it at the same
/// point, before the first operation.
pub fn agree<F: Fabric>(
    fabric: &mut F,
    ring: RingTopology,
    choice: WireChoice,
    known: &dyn Fn(Side, usize) -> Option<NotNative>,
    timeout: Duration,
) -> Result<Agreement, Error> {
    let (rank, size, conns) = (ring.rank(), ring.size(), ring.conns());
    let mut least: Option<Unfit> = None;
    let learn = |u: Unfit, least: &mut Option<Unfit>| {
        if least.is_none_or(|l| u < l) {
            *least = Some(u);
        }
    };
    if size > 1 {
        for c in 0..conns {
            for (side, opener) in [(Side::Right, rank), (Side::Left, ring.left())] {
                if let Some(why) = known(side, c) {
                    learn(
                        Unfit {
                            opener,
                            link: c,
                            why,
                        },
                        &mut least,
                    );
                }
            }
        }
    }
    // Per neighbour, the lowest-index native connection (both ends find the same).
    let talk = |side: Side| {
        (0..conns)
            .find(|&c| known(side, c).is_none())
            .map(|c| ring.channel(side, c))
    };
    let channels: Vec<_> = [talk(Side::Right), talk(Side::Left)]
        .into_iter()
        .flatten()
        .collect();
    let deadline = fabric.now().saturating_add(timeout);
    for round in 0..rounds(size) {
        let out = Unfit::encode(least);
        let mut got = vec![[0u8; RECORD]; channels.len()];
        {
            let mut step: Vec<Transfer<'_>> = Vec::with_capacity(2 * channels.len());
            for (&channel, into) in channels.iter().zip(got.iter_mut()) {
                step.push(Transfer::Send {
                    channel,
                    data: &out,
                });
                step.push(Transfer::Recv {
                    channel,
                    landing: Landing::Into(into),
                });
            }
            fabric
                .run(&mut step, deadline)
                .map_err(|e| Error::Connect {
                    rank,
                    what: format!(
                        "agreeing on a wire with the neighbours, round {} of {}: {e}",
                        round + 1,
                        rounds(size)
                    ),
                })?;
        }
        for (channel, record) in channels.iter().zip(&got) {
            match Unfit::decode(record) {
                Ok(Some(u)) => learn(u, &mut least),
                Ok(None) => {}
                Err(NotARecord) => {
                    return Err(Error::Connect {
                        rank,
                        what: format!(
                            "agreeing on a wire, round {} of {}: {channel} sent {record:02x?}, \
                             not a record of the agreement",
                            round + 1,
                            rounds(size)
                        ),
                    });
                }
            }
        }
    }
    let wire = if least.is_none() && choice != WireChoice::Mlx {
        Wire::Nuvec
    } else {
        Wire::Mlx
    };
    Ok(Agreement { wire, unfit: least })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_other_bytes_are_not_one() {
        let u = Unfit {
            opener: 4,
            link: 1,
            why: NotNative::TimedOut,
        };
        assert_eq!(Unfit::decode(&Unfit::encode(Some(u))), Ok(Some(u)));
        assert_eq!(Unfit::decode(&Unfit::encode(None)), Ok(None));
        let mut bad = Unfit::encode(Some(u));
        bad[1] = 0;
        assert_eq!(Unfit::decode(&bad), Err(NotARecord));
        let mut bad = Unfit::encode(None);
        bad[5] = 1;
        assert_eq!(Unfit::decode(&bad), Err(NotARecord));
        assert_eq!(Unfit::decode(&[2; RECORD]), Err(NotARecord));
    }

    #[test]
    fn the_rounds_are_half_the_ring_rounded_down() {
        let got: Vec<usize> = (1..=8).map(rounds).collect();
        assert_eq!(got, [0, 0, 1, 1, 2, 2, 3, 3]);
    }
}
