//! The semantics of `Group::split`, written once for every backend: from every parent rank's
//! `(color, key)`, which ranks form each sub-group and in which order.
//!
//! As `mx.distributed.Group.split` documents for MLX's MPI backend (`MPI_Comm_split`): the
//! ranks that pass the same `color` form one new group, ordered by `key`, ties broken by their
//! parent rank; a negative `key` (−1, say) means "my parent rank", as MLX documents it and its
//! MPI backend passes it (`key < 0 ? rank : key`). The call is a collective on the parent:
//! every parent rank passes its pair, and the pairs travel through the parent's own
//! `all_gather` ([`encode`], [`decode`]), so the exchange works over every fabric, and every
//! rank checks every pair ([`plan`]). A bad pair is therefore found by every rank at once,
//! before any connection is made: every rank returns the same error, which names the rank that
//! passed it, and the parent stays usable.
//!
//! [`Alone`] is the sub-group of a rank whose color no other rank passed.

use std::sync::Arc;
use std::time::Duration;

use nuvec_core::distributed::{AllReduce, Communicator};

use crate::config::log::Log;
use crate::error::Error;

/// Whether `key` means "order me by my parent rank": any negative key, as MLX documents
/// ("If the key is negative then the rank in the current group is used") and its MPI backend
/// passes (`key < 0 ? rank : key`).
pub(crate) fn is_parent_rank(key: i32) -> bool {
    key < 0
}

/// The bytes of one rank's `(color, key)` in the exchange.
pub(crate) const RECORD: usize = 8;

/// One rank's sub-group: its rank and the parent ranks of every member in sub-group order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The color this rank passed.
    pub(crate) color: i32,
    /// This rank's rank in the sub-group.
    pub(crate) rank: usize,
    /// The parent rank of each member, in sub-group rank order (`members[rank]` is this rank).
    pub(crate) members: Vec<usize>,
}

impl Plan {
    /// The number of ranks in the sub-group.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// This rank's rank in the sub-group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The parent rank of each member, in sub-group rank order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// The color of the sub-group.
    pub fn color(&self) -> i32 {
        self.color
    }
}

/// The exchange record of `(color, key)`: both little-endian.
pub(crate) fn encode(color: i32, key: i32) -> [u8; RECORD] {
    let mut out = [0; RECORD];
    out[..4].copy_from_slice(&color.to_le_bytes());
    out[4..].copy_from_slice(&key.to_le_bytes());
    out
}

/// Every rank's `(color, key)` from the all-gathered records (a whole number of them).
pub(crate) fn decode(records: &[u8]) -> Vec<(i32, i32)> {
    records
        .chunks_exact(RECORD)
        .map(|r| {
            let word = |i: usize| i32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
            (word(0), word(4))
        })
        .collect()
}

/// The arguments of one rank, checked alone: a color is non-negative (MPI's rule; MLX passes
/// it to `MPI_Comm_split`); every key is accepted (a negative one means the parent rank). The
/// error says what is wrong.
pub(crate) fn check_arguments(color: i32, _key: i32) -> Result<(), String> {
    if color < 0 {
        return Err(format!("color {color} is negative (colors are 0 or more)"));
    }
    Ok(())
}

/// The sub-group of parent rank `me` when parent rank r passed `choices[r]`, or what is wrong
/// with the first bad pair, naming the rank that passed it.
pub(crate) fn plan(me: usize, choices: &[(i32, i32)]) -> Result<Plan, String> {
    for (r, &(color, key)) in choices.iter().enumerate() {
        check_arguments(color, key).map_err(|why| format!("rank {r} passed {why}"))?;
    }
    let Some(&(color, _)) = choices.get(me) else {
        return Err(format!(
            "rank {me} is not among the {} ranks that passed arguments",
            choices.len()
        ));
    };
    let order = |r: usize| -> (i64, usize) {
        let key = choices[r].1;
        let key = if is_parent_rank(key) {
            r as i64
        } else {
            i64::from(key)
        };
        (key, r)
    };
    let mut members: Vec<usize> = (0..choices.len())
        .filter(|&r| choices[r].0 == color)
        .collect();
    members.sort_by_key(|&r| order(r));
    let rank = members
        .iter()
        .position(|&r| r == me)
        .ok_or_else(|| format!("rank {me} is missing from its own sub-group"))?;
    Ok(Plan {
        color,
        rank,
        members,
    })
}

/// The most bytes one rank may contribute to [`gather_bytes`]: a sub-group's addresses are
/// far smaller, and a peer's claim of more must not make this rank allocate it.
pub(crate) const MAX_GATHERED: usize = 64 * 1024;

/// Every rank's variable-length bytes over `all_gather` (equal lengths in, concatenated in rank
/// order out), as two all-gathers: the lengths, then the bytes padded to the longest. A rank
/// claiming more than [`MAX_GATHERED`] bytes makes `too_long(rank, bytes)` the error.
pub(crate) fn gather_bytes<E>(
    size: usize,
    mine: &[u8],
    mut all_gather: impl FnMut(&[u8], &mut [u8]) -> Result<(), E>,
    too_long: impl Fn(usize, u64) -> E,
) -> Result<Vec<Vec<u8>>, E> {
    let mut lengths = vec![0u8; 8 * size];
    all_gather(&(mine.len() as u64).to_le_bytes(), &mut lengths)?;
    let mut claimed = Vec::with_capacity(size);
    for (r, c) in lengths.chunks_exact(8).enumerate() {
        let mut word = [0u8; 8];
        word.copy_from_slice(c);
        let n = u64::from_le_bytes(word);
        match usize::try_from(n) {
            Ok(n) if n <= MAX_GATHERED => claimed.push(n),
            _ => return Err(too_long(r, n)),
        }
    }
    let longest = claimed.iter().copied().max().unwrap_or(0);
    let mut padded = mine.to_vec();
    padded.resize(longest, 0);
    let mut all = vec![0u8; longest * size];
    all_gather(&padded, &mut all)?;
    Ok(claimed
        .iter()
        .enumerate()
        .map(|(r, &n)| all[r * longest..r * longest + n].to_vec())
        .collect())
}

/// Gathers every parent rank's bytes (any lengths) over the parent group, in
/// parent rank order: the one way a sub-group's members tell each other how to reach them.
pub type Exchange<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>, Error> + 'a;

/// A sub-group's new fabric, and how that fabric makes its own sub-groups (a split of a split).
pub struct SubFabric<F> {
    /// This rank's fabric among the members, ranks numbered as the [`Plan`] orders them.
    pub(crate) fabric: F,
    /// How the new fabric splits in turn.
    pub(crate) splitter: Arc<dyn Splitter<F>>,
    /// The log of the new group's failures.
    pub(crate) log: Log,
}

impl<F> SubFabric<F> {
    /// `fabric`, which splits in turn with `splitter`; its group logs nothing.
    pub fn new(fabric: F, splitter: Arc<dyn Splitter<F>>) -> Self {
        Self {
            fabric,
            splitter,
            log: Log::off(),
        }
    }
}

/// How a communicator over fabric `F` makes the fabric of a sub-group: each fabric its own way
/// (new sockets, new queue pairs, new simulated channels).
///
/// Every parent rank calls [`Splitter::sub_fabric`] in the same split, whatever its plan, and
/// must make the same calls of `exchange` in the same order (they are collectives on the
/// parent); a rank alone in its color takes part in them and returns `None`.
pub trait Splitter<F>: Send + Sync {
    /// This rank's fabric of the sub-group `plan`, every connection made within `timeout`.
    fn sub_fabric(
        &self,
        plan: &Plan,
        exchange: &mut Exchange<'_>,
        timeout: Duration,
    ) -> Result<Option<SubFabric<F>>, Error>;
}

/// A parent's all-gather: equal lengths in, every rank's bytes in rank order out.
pub(crate) type AllGather<'a> = dyn Fn(&[u8], &mut [u8]) -> Result<(), Error> + 'a;

/// What a split asks of the parent communicator: its place, its all-gather, and how its
/// fabric splits.
pub(crate) struct Parent<'a, F> {
    /// This rank in the parent.
    pub(crate) rank: usize,
    /// The parent's size.
    pub(crate) size: usize,
    /// The parent's all-gather (equal lengths in, rank order out).
    pub(crate) all_gather: &'a AllGather<'a>,
    /// How the parent's fabric makes new ones; `None`: it cannot.
    pub(crate) splitter: Option<&'a Arc<dyn Splitter<F>>>,
    /// The parent's operation timeout (zero: none), which bounds the new connections'
    /// deadline too (see `setup_deadline`).
    pub(crate) timeout: Duration,
}

/// Runs a split on `parent`: all-gathers every rank's `(color, key)`, checks them all and
/// plans this rank's sub-group, then has the fabric make it, and `child` the sub-group's
/// communicator over it (each backend its own algorithm). A rank alone in its color gets
/// [`Alone`].
///
/// # Errors
/// A bad pair on any rank: `InvalidArgument` on every rank, naming that rank (the parent stays
/// usable). The exchange failing (a rank that never calls `split`, such as a Python MLX rank,
/// whose ring has no `split`): the parent's error, within its deadline, saying so. The new
/// connections failing: the fabric's error (the parent stays usable).
pub(crate) fn split_over<F>(
    parent: &Parent<'_, F>,
    color: i32,
    key: i32,
    child: impl FnOnce(SubFabric<F>) -> Arc<dyn Communicator>,
) -> Result<Arc<dyn Communicator>, Error> {
    let Parent {
        rank,
        size,
        all_gather,
        ..
    } = *parent;
    let invalid = |what: String| Error::InvalidArgument {
        rank,
        op: "split",
        what,
    };
    let mut records = vec![0u8; RECORD * size];
    all_gather(&encode(color, key), &mut records).map_err(|e| Error::Connect {
        rank,
        what: format!(
            "split: the exchange of every rank's (color, key) over the parent group failed \
             (every rank of the parent must call split at the same point of its program; \
             Python MLX ranks never do, as MLX's ring cannot split): {e}"
        ),
    })?;
    let plan = plan(rank, &decode(&records)).map_err(invalid)?;
    let Some(splitter) = parent.splitter else {
        // Every rank has the same kind of fabric, so every rank says this.
        return Err(invalid(
            "this group's fabric cannot make the connections of a sub-group".into(),
        ));
    };
    let mut exchange = |mine: &[u8]| {
        gather_bytes(size, mine, all_gather, |r, n| Error::Connect {
            rank,
            what: format!("split: rank {r} claims {n} bytes of addresses (at most {MAX_GATHERED})"),
        })
    };
    // The members are all running (they have just exchanged their addresses), so connecting
    // takes what setup takes: at most the default setup deadline, less where the operation
    // timeout is shorter, and a deadline even where the parent has no operation timeout.
    // (The parent's operation timeout, 10 minutes by default, would keep every member of a
    // color whose ports a firewall drops in `split` for that long.)
    let setup = setup_deadline(parent.timeout);
    let made = splitter.sub_fabric(&plan, &mut exchange, setup)?;
    Ok(match made {
        None => Arc::new(Alone),
        Some(sub) => child(sub),
    })
}

/// Two parent ranks on threads of this process, both of color 0, whose exchange swaps their
/// records (at most 20 s each): each has the splitter `splitter()` make its sub-fabric, within
/// 20 s, and returns `read` of it, rank 0's first. For the splitters' tests.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn split_two<F, S, T>(
    splitter: impl Fn() -> S + Sync,
    read: impl Fn(F) -> T + Sync,
) -> Vec<T>
where
    S: Splitter<F>,
    T: Send,
{
    use std::sync::mpsc;
    let (to_one, from_zero) = mpsc::channel::<Vec<u8>>();
    let (to_zero, from_one) = mpsc::channel::<Vec<u8>>();
    let ends = [(to_one, from_one), (to_zero, from_zero)];
    let (splitter, read) = (&splitter, &read);
    std::thread::scope(|s| {
        let handles: Vec<_> = ends
            .into_iter()
            .enumerate()
            .map(|(rank, (tx, rx))| {
                s.spawn(move || {
                    let plan = Plan {
                        color: 0,
                        rank,
                        members: vec![0, 1],
                    };
                    let mut exchange = |mine: &[u8]| -> Result<Vec<Vec<u8>>, Error> {
                        tx.send(mine.to_vec()).expect("the other rank listens");
                        let theirs = rx
                            .recv_timeout(Duration::from_secs(20))
                            .expect("the other rank's record");
                        let mut all = vec![Vec::new(), Vec::new()];
                        all[rank] = mine.to_vec();
                        all[1 - rank] = theirs;
                        Ok(all)
                    };
                    let sub = splitter()
                        .sub_fabric(&plan, &mut exchange, Duration::from_secs(20))
                        .expect("connect")
                        .expect("a sub-group of two");
                    read(sub.fabric)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// The deadline of a sub-group's connections under a parent whose operation timeout is
/// `timeout` (zero: none): [`DEFAULT_SETUP_TIMEOUT`], or `timeout` where it is shorter.
///
/// [`DEFAULT_SETUP_TIMEOUT`]: crate::config::options::DEFAULT_SETUP_TIMEOUT
fn setup_deadline(timeout: Duration) -> Duration {
    let default = crate::config::options::DEFAULT_SETUP_TIMEOUT;
    if timeout.is_zero() {
        default
    } else {
        timeout.min(default)
    }
}

/// The sub-group of a rank that is alone in its color: every collective is the identity, as
/// `nuvec_core`'s group of one process (which `Group::new` makes of it).
#[derive(Debug)]
pub(crate) struct Alone;

impl Communicator for Alone {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn all_reduce(
        &self,
        _: AllReduce,
        _: nuvec_core::DType,
        _: &mut [u8],
    ) -> nuvec_core::Result<()> {
        Ok(())
    }

    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> nuvec_core::Result<()> {
        if input.len() != output.len() {
            return Err(nuvec_core::Error::InvalidArgument(format!(
                "distributed: all_gather: the output has {} bytes, not {} × 1 rank",
                output.len(),
                input.len()
            )));
        }
        output.copy_from_slice(input);
        Ok(())
    }

    fn send(&self, dst: usize, _: &[u8]) -> nuvec_core::Result<()> {
        Err(nuvec_core::Error::InvalidArgument(format!(
            "distributed: send: rank {dst} is not in a group of one rank"
        )))
    }

    fn recv(&self, src: usize, _: &mut [u8]) -> nuvec_core::Result<()> {
        Err(nuvec_core::Error::InvalidArgument(format!(
            "distributed: recv: rank {src} is not in a group of one rank"
        )))
    }

    fn split(&self, color: i32, key: i32) -> nuvec_core::Result<Arc<dyn Communicator>> {
        check_arguments(color, key).map_err(|why| {
            nuvec_core::Error::InvalidArgument(format!("distributed: split: rank 0 passed {why}"))
        })?;
        Ok(Arc::new(Alone))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_sub_group_connects_within_the_setup_deadline_not_the_operation_timeout() {
        let setup = crate::config::options::DEFAULT_SETUP_TIMEOUT;
        // The default operation timeout (10 minutes), none, and a short one.
        assert_eq!(
            setup_deadline(crate::config::options::DEFAULT_TIMEOUT),
            setup
        );
        assert_eq!(setup_deadline(Duration::ZERO), setup);
        assert_eq!(
            setup_deadline(Duration::from_secs(5)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn ranks_with_the_same_color_form_a_group_ordered_by_key_then_parent_rank() {
        // Rows and columns of a 2 × 2 grid.
        let rows = [(0, -1), (0, -1), (1, -1), (1, -1)];
        assert_eq!(
            plan(3, &rows),
            Ok(Plan {
                color: 1,
                rank: 1,
                members: vec![2, 3]
            })
        );
        let columns = [(0, -1), (1, -1), (0, -1), (1, -1)];
        assert_eq!(
            plan(2, &columns).map(|p| (p.rank, p.members)),
            Ok((1, vec![0, 2]))
        );
        // Keys reorder; equal keys fall back to the parent rank.
        let keyed = [(5, 9), (5, 0), (5, 0), (7, 3)];
        assert_eq!(
            plan(0, &keyed).map(|p| (p.rank, p.members)),
            Ok((2, vec![1, 2, 0]))
        );
        assert_eq!(
            plan(3, &keyed).map(|p| (p.rank, p.members)),
            Ok((0, vec![3]))
        );
    }

    #[test]
    fn a_bad_argument_names_the_rank_that_passed_it() {
        let err = plan(0, &[(0, -1), (-2, 0), (0, -1)]).expect_err("negative color");
        assert!(err.contains("rank 1 passed color -2"), "{err}");
        let err = plan(2, &[(0, -1), (0, -7), (i32::MIN, -1)]).expect_err("negative color");
        assert!(err.contains("rank 2 passed color -2147483648"), "{err}");
    }

    #[test]
    fn every_negative_key_orders_its_rank_by_its_parent_rank_as_mlx_documents() {
        // Parent ranks 0 and 2 pass keys below -1: they sort as keys 0 and 2.
        let choices = [(0, -7), (0, 1), (0, i32::MIN), (0, -1)];
        assert_eq!(
            plan(1, &choices).map(|p| (p.rank, p.members)),
            Ok((1, vec![0, 1, 2, 3]))
        );
        assert_eq!(check_arguments(0, i32::MIN), Ok(()));
        assert_eq!(check_arguments(0, -2), Ok(()));
    }

    #[test]
    fn records_round_trip() {
        let mut all = Vec::new();
        for pair in [(0, -1), (i32::MAX, i32::MIN), (-5, 7)] {
            all.extend_from_slice(&encode(pair.0, pair.1));
        }
        assert_eq!(decode(&all), vec![(0, -1), (i32::MAX, i32::MIN), (-5, 7)]);
    }

    #[test]
    fn variable_length_bytes_gather_in_rank_order() {
        let inputs: [&[u8]; 3] = [b"a", b"", b"ccc"];
        // A model all-gather over three ranks: every rank's call must give the same lengths,
        // so feed the three calls from the three inputs in turn.
        let mut phase = 0;
        let out = gather_bytes(
            3,
            inputs[0],
            |input: &[u8], output: &mut [u8]| {
                let part = input.len();
                for (r, chunk) in output.chunks_mut(part.max(1)).enumerate().take(3) {
                    let bytes: Vec<u8> = if phase == 0 {
                        (inputs[r].len() as u64).to_le_bytes().to_vec()
                    } else {
                        let mut b = inputs[r].to_vec();
                        b.resize(part, 0);
                        b
                    };
                    chunk.copy_from_slice(&bytes[..chunk.len()]);
                }
                phase += 1;
                Ok::<(), ()>(())
            },
            |_, _| (),
        )
        .expect("gather");
        assert_eq!(out, vec![b"a".to_vec(), Vec::new(), b"ccc".to_vec()]);
    }

    proptest! {
        #[test]
        fn every_rank_agrees_on_every_sub_group(
            choices in prop::collection::vec((0i32..3, -4i32..4), 1..9)
        ) {
            let plans: Vec<Plan> = (0..choices.len())
                .map(|me| plan(me, &choices).expect("valid"))
                .collect();
            for (me, p) in plans.iter().enumerate() {
                // This rank is where its plan says, with its color.
                prop_assert_eq!(p.members[p.rank], me);
                prop_assert_eq!(p.color, choices[me].0);
                // The members are exactly the ranks of that color, in (key, parent rank) order.
                let mut expected: Vec<usize> =
                    (0..choices.len()).filter(|&r| choices[r].0 == p.color).collect();
                let key = |r: usize| if choices[r].1 < 0 { r as i64 } else { i64::from(choices[r].1) };
                expected.sort_by_key(|&r| (key(r), r));
                prop_assert_eq!(&p.members, &expected);
                // Every member computes the same group.
                for &m in &p.members {
                    prop_assert_eq!(&plans[m].members, &p.members);
                }
            }
            // Every rank is in exactly one sub-group.
            let total: usize = plans.iter().filter(|p| p.rank == 0).map(Plan::size).sum();
            prop_assert_eq!(total, choices.len());
        }
    }
}
