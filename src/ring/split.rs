//! `split` for MLX's ring: a sub-group is an ordinary ring of its members.
//!
//! The members agree on the sub-group through the parent
//! ([`split_over`](crate::collective::split::split_over)), then build a new fabric with the
//! parent fabric's [`Splitter`], and run MLX's ring algorithms on it unchanged: a sub-ring of
//! Rust ranks is a ring like any other, with the same connections per neighbour. Over TCP
//! ([`TcpRing`]) each member listens on ephemeral ports of the interface its hostfile entry
//! names, the members tell each other those addresses through the parent's all-gather, and
//! connect in MLX's order, authenticating with the parent's key if it has one.
//!
//! A sub-group speaks its parent's wire (`with_wire`): no probe, no agreement. If the parent
//! agreed on the nuvec wire, every rank of the job is this crate; if on MLX's, the sub-group
//! keeps MLX's, as a sub-group of a ring with a Python MLX rank must.
//!
//! MLX's ring has no `split` (it throws), and its wire has no room for a question, so a ring
//! cannot find out whether all its ranks are Rust before it tries: a Python MLX rank never
//! joins the exchange, which then fails at the parent's deadline with an error that says why
//! (and leaves the parent failed, as any collective that a rank skips).

use std::sync::Arc;
use std::time::Duration;

use crate::config::options::{DEFAULT_LINK_TIMEOUT, Spin};

use nuvec_core::distributed::Communicator;

use super::communicator::RingCommunicator;
use crate::collective::split::{Exchange, Plan, Splitter, SubFabric};
use crate::config::log::Log;
use crate::error::Error;
use crate::fabric::Fabric;
use crate::transport::tcp::TcpFabric;
use crate::transport::tcp::auth::Key;
use crate::transport::tcp::split::Listening;

impl<F: Fabric + Send + 'static> RingCommunicator<F> {
    /// [`Communicator::split`] with this crate's error: the ranks that pass the same `color`
    /// form a new ring ordered by `key` (negative: the parent rank), ties by parent rank. A
    /// collective on this group: every rank calls it at the same point of its program.
    pub fn try_split(&self, color: i32, key: i32) -> Result<Arc<dyn Communicator>, Error> {
        let conns = self.topology().conns();
        // The parent's wire: if the parent agreed on the nuvec wire, every rank is this crate.
        let wire = self.wire();
        self.split_with(color, key, |fabric| {
            RingCommunicator::new(fabric, conns, self.timeout()).with_wire(wire)
        })
    }
}

/// How a ring over TCP makes a sub-group's ring: new listeners on ephemeral ports of the
/// interface of this rank's hostfile entry, the same connections per neighbour, the same key.
#[derive(Clone)]
pub(crate) struct TcpRing {
    /// An address of this rank's hostfile entry (`host:port`): its host is the interface.
    entry: String,
    conns: usize,
    key: Option<Key>,
    log: Log,
    spin: Spin,
    /// Whether links between ranks on one machine may be local (shared memory).
    local: bool,
    /// The parent's link timeout (see [`Options::link_timeout`](crate::Options::link_timeout)).
    link_timeout: Duration,
    /// The parent's TCP congestion control, if it chose one.
    congestion: Option<String>,
}

impl TcpRing {
    /// The splitter of a ring whose rank listens on `entry`, with `conns` connections per
    /// neighbour, `key` if it authenticates, its `log`, its fabric's `spin`, and whether its
    /// links may be `local` (shared memory between ranks on one machine).
    pub(crate) fn new(
        entry: String,
        conns: usize,
        key: Option<Key>,
        log: Log,
        spin: Spin,
        local: bool,
    ) -> Self {
        Self {
            entry,
            conns,
            key,
            log,
            spin,
            local,
            link_timeout: DEFAULT_LINK_TIMEOUT,
            congestion: None,
        }
    }

    /// Gives a sub-group's links the parent's link timeout and TCP congestion control, as a
    /// ring from a hostfile gets them from its options.
    pub(crate) fn with_links(mut self, link_timeout: Duration, congestion: Option<String>) -> Self {
        self.link_timeout = link_timeout;
        self.congestion = congestion;
        self
    }
}

/// The exchange record of a rank's addresses: one per line. Empty: it could not listen.
fn addresses_record(addresses: &[String]) -> Vec<u8> {
    addresses.join("\n").into_bytes()
}

impl Splitter<TcpFabric> for TcpRing {
    fn sub_fabric(
        &self,
        plan: &Plan,
        exchange: &mut Exchange<'_>,
        timeout: Duration,
    ) -> Result<Option<SubFabric<TcpFabric>>, Error> {
        let me = plan.members[plan.rank];
        if plan.size() == 1 {
            // Alone in its color: it still takes part in the parent's exchange.
            exchange(&[])?;
            return Ok(None);
        }
        // A rank that cannot listen still joins the exchange (with nothing), so that its
        // members fail at once, naming it, instead of at the parent's deadline.
        let listening = Listening::bind(me, &self.entry, self.conns);
        let mine = match &listening {
            Ok(l) => addresses_record(&l.addresses()),
            Err(_) => Vec::new(),
        };
        let all = exchange(&mine)?;
        let listening = listening?;
        let mut nodes = Vec::with_capacity(plan.size());
        for &member in &plan.members {
            let text = all
                .get(member)
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or("");
            let addresses: Vec<String> = text
                .split('\n')
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect();
            if addresses.len() != self.conns {
                return Err(Error::Connect {
                    rank: me,
                    what: format!(
                        "split: rank {member} of the parent sent {} listening addresses for the \
                         sub-group of color {}, not {} (it could not listen, or its ring has \
                         another number of connections per neighbour)",
                        addresses.len(),
                        plan.color,
                        self.conns
                    ),
                });
            }
            nodes.push(addresses);
        }
        let fabric = listening
            .connect(
                &nodes,
                plan.rank,
                timeout,
                self.key.as_ref(),
                self.local,
                &self.log,
            )
            .map_err(|e| {
                let inner = match e {
                    Error::Connect { rank, what } => format!("as its rank {rank}: {what}"),
                    other => other.to_string(),
                };
                Error::Connect {
                    rank: me,
                    what: format!(
                        "split: connecting the sub-group of color {} (parent ranks {:?}; the \
                         ranks and addresses that follow are the sub-group's, numbered within \
                         it, on ports it chose), {inner}",
                        plan.color, plan.members
                    ),
                }
            })?
            .with_wait(self.spin)
            .with_link_timeout(self.link_timeout)
            .map_err(|e| Error::Connect {
                rank: me,
                what: format!(
                    "split: cannot set the link timeout of the sub-group of color {}: {e}",
                    plan.color
                ),
            })?
            .with_congestion(self.congestion.as_deref(), &self.log)
            .map_err(|e| Error::Connect {
                rank: me,
                what: format!(
                    "split: the sub-group of color {} (its ranks numbered within it): {e}",
                    plan.color
                ),
            })?;
        Ok(Some(SubFabric {
            fabric,
            splitter: Arc::new(self.clone()),
            log: self.log,
        }))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_sub_group_that_cannot_connect_says_so_naming_the_split_and_its_numbering() {
        // Parent rank 3 is rank 0 of the sub-group {3, 7}; rank 7's address refuses.
        let ring = TcpRing::new(
            "127.0.0.1:1".to_owned(),
            1,
            None,
            Log::off(),
            Spin::Fixed(Duration::ZERO),
            false,
        );
        let plan = Plan {
            color: 5,
            rank: 0,
            members: vec![3, 7],
        };
        let mut exchange = |mine: &[u8]| -> Result<Vec<Vec<u8>>, Error> {
            let mut all = vec![Vec::new(); 8];
            all[3] = mine.to_vec();
            all[7] = b"127.0.0.1:1".to_vec();
            Ok(all)
        };
        let started = std::time::Instant::now();
        let e = match ring.sub_fabric(&plan, &mut exchange, Duration::from_millis(500)) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("connected to a port that refuses"),
        };
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        for said in [
            "distributed: rank 3: split: connecting the sub-group of color 5 (parent ranks [3, 7];",
            "as its rank 0: ",
        ] {
            assert!(e.contains(said), "{said:?} missing in {e:?}");
        }
    }

    #[test]
    fn a_sub_group_gets_the_parents_link_timeout_and_congestion_control() {
        let limit = Duration::from_secs(4);
        // Two parent ranks on loopback, both of color 0.
        let settings = crate::collective::split::split_two(
            || {
                TcpRing::new(
                    "127.0.0.1:1".to_owned(), // the host is what counts
                    1,
                    None,
                    Log::off(),
                    Spin::Fixed(Duration::ZERO),
                    false,
                )
                .with_links(limit, Some("reno".to_owned()))
            },
            |fabric: TcpFabric| fabric.link_settings(),
        );
        for (rank, (timeout, names)) in settings.into_iter().enumerate() {
            assert_eq!(timeout, limit, "rank {rank}'s link timeout");
            assert!(
                names.iter().flatten().all(|n| n == "reno") && names.iter().flatten().count() == 2,
                "rank {rank}'s links: {names:?}"
            );
        }
    }
}
