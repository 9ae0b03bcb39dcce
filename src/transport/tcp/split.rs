//! The sockets of a sub-group's ring: listeners on ephemeral ports, then MLX's ring order.
//!
//! A sub-group has no hostfile of its own. Each member listens on the interface its parent
//! entry names (the host of its first address), on ports the system picks, as many as its
//! parent ring has connections per neighbour; the members tell each other those addresses
//! through the parent group (the caller's business), and then connect exactly as a ring
//! formed from a hostfile does ([`connect::connect_ring_on`]): the same order, retries
//! and, with a key, the same authentication, within the default setup deadline (30 s, less
//! where the operation timeout is shorter: the split's `setup_deadline`). The listeners are bound before the
//! addresses are told, so a neighbour that connects early finds them.

use std::time::Duration;

use mio::net::TcpListener;

use super::TcpFabric;
use super::connect;
use crate::config::hostfile;
use crate::config::log::Log;
use crate::error::Error;
use crate::transport::tcp::auth::Key;

/// This rank's bound listeners of a sub-group's ring, before it connects.
pub(crate) struct Listening {
    rank: usize,
    listeners: Vec<(String, TcpListener)>,
}

impl std::fmt::Debug for Listening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Listening(rank {}: {:?})", self.rank, self.addresses())
    }
}

impl Listening {
    /// `conns` listeners of parent rank `rank` on ephemeral ports of the host of `entry` (an
    /// address of its parent hostfile entry, `host:port`).
    pub(crate) fn bind(rank: usize, entry: &str, conns: usize) -> Result<Self, Error> {
        let fail = |what: String| Error::Connect { rank, what };
        let (host, port) = hostfile::split_address(entry)?;
        let addrs = hostfile::resolve(entry)?;
        let mut listeners = Vec::with_capacity(conns);
        for _ in 0..conns {
            let mut last = None;
            let mut bound = None;
            for mut addr in addrs.iter().copied() {
                addr.set_port(0);
                match connect::listen_at(addr).and_then(|l| Ok((l.local_addr()?, l))) {
                    Ok(pair) => {
                        bound = Some(pair);
                        break;
                    }
                    Err(e) => last = Some(format!("{addr}: {e}")),
                }
            }
            let (local, listener) = bound.ok_or_else(|| {
                fail(format!(
                    "split: cannot listen on an ephemeral port of {host} (the host of \
                     {host}:{port}, this rank's hostfile entry): {}",
                    last.unwrap_or_else(|| "it resolves to nothing".into())
                ))
            })?;
            listeners.push((local.to_string(), listener));
        }
        Ok(Self { rank, listeners })
    }

    /// The addresses the listeners are bound to, `ip:port` each, connection c first.
    pub(crate) fn addresses(&self) -> Vec<String> {
        self.listeners.iter().map(|(a, _)| a.clone()).collect()
    }

    /// Connects rank `rank` of the sub-group's ring over `nodes` (every member's addresses, in
    /// sub-group order; `nodes[rank]` are this rank's) within `timeout`, its links `local`
    /// where they can be (see `TcpFabric::connect_ring`).
    pub(crate) fn connect(
        self,
        nodes: &[Vec<String>],
        rank: usize,
        timeout: Duration,
        key: Option<&Key>,
        local: bool,
        log: &Log,
    ) -> Result<TcpFabric, Error> {
        // No probe: a sub-group inherits its parent's wire.
        let sockets =
            connect::connect_ring_on(nodes, rank, self.listeners, timeout, key, local, None, log)?;
        TcpFabric::from_ring_sockets(rank, nodes.len(), sockets)
    }
}
