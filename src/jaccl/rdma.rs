//! JACCL's RDMA fabric (cargo feature `jaccl`): which queue pairs a rank opens on which
//! device for the [`Config`]'s topology, and the exchange of their details over the
//! [`SideChannel`] in MLX's order. The queue pairs themselves, the verbs library and the data
//! path are the RDMA transport's (`src/transport/rdma/`, whose docs state the bring-up and
//! the data path).
//!
//! - [`devices`] lists the RDMA devices, [`available`] says whether the fabric can run here
//!   and [`unavailable`] why not;
//! - [`connect`] opens one queue pair per connection of the topology, exchanges their details
//!   over the side channel in MLX's order, connects them and ends with MLX's side-channel
//!   barrier, giving an [`RdmaFabric`].
//!
//! # Channels
//!
//! - **Mesh** of W wires: one queue pair per wire per peer, on the wire's device of the
//!   device file's entry, the channel `(peer, link w)` for wire w; it connects to the peer's
//!   queue pair of the same wire towards this rank (MLX 0.32.4: one exchange of W·R details,
//!   wire-major, the peer's entry at `w·R + rank`).
//! - **Ring** of R > 2 ranks with C cables per direction: the queue pair of MLX's `right_[w]`
//!   is the channel `(right neighbour, link w)` and that of `left_[w]` the channel
//!   `(left neighbour, link w)`, w in `0..C`.
//! - **Ring of 2 ranks**: both neighbours are the same peer, with `2C` links: `right_[w]` is
//!   link `w` and `left_[w]` link `C + w`.
//!
//! My `right_[w]` connects to my right neighbour's `left_[w]` (and my `left_[w]` to my left
//! neighbour's `right_[w]`), so this numbering is [`Wiring::ring`](crate::fabric::Wiring::ring)'s:
//! every rank "opens" its right links and "accepts" its left ones.
//!
//! # The verbs library
//!
//! Nothing is linked: the library is loaded when first needed, as MLX does, so a binary built
//! with the feature starts on any machine and [`available`] is false where the library, one of
//! its 16 functions or a device is missing ([`unavailable`] says which). It is, in order:
//! `NUVEC_JACCL_VERBS` (a path) when set; on macOS `/usr/lib/librdma.dylib`, then
//! `librdma.dylib` (macOS 26.2 and later: Apple's Thunderbolt 5 provider); elsewhere
//! `libibverbs.so.1` (rdma-core). The struct layouts are the `nuvec-verbs-abi` crate's, whose
//! docs say what is checked (rdma-core's header, in CI) and what is assumed (Apple's).
//!
//! **On macOS 26.2 and later**: enable RDMA once (`rdma_ctl enable` in recoveryOS, then
//! reboot), give each Thunderbolt interface an IPv4 address (a link-local one is enough), and
//! `cargo build --features jaccl`; `mlx.launch --backend jaccl` (or `nuvec-launch`) writes
//! the environment [`crate::init`] reads.
//!
//! # What is verified
//!
//! - In CI, across processes over the software RDMA provider `nuvec-verbs-emu`
//!   (`fabric-sim/verbs/`, loaded through `NUVEC_JACCL_VERBS`), which checks the queue-pair
//!   state machine, registrations, UC's drop rule and Apple's limits: the bring-up, the data
//!   path, the teardown, and faults (`tests/processes/jaccl_rdma.rs`).
//! - In CI, the type check of the feature for `aarch64-apple-darwin`, and the verbs structs
//!   against rdma-core's header.
//! - In CI, interoperation with ranks built from MLX 0.32.4's own JACCL headers over the same
//!   provider, bit for bit and message for message (`tests/processes/jaccl_mlx.rs`).
//! - **Not verified**: Apple's hardware and its `verbs.h`; MLX's own `libjaccl.dylib`.

use std::time::{Duration, Instant};

use super::config::{Config, Topology};
use super::side_channel::{Destination, SideChannel};
use crate::config::ConfigError;
use crate::error::Error;
use crate::fabric::Channel;
use crate::transport::rdma::{self as transport, Local, Qp, Remote};

pub use crate::transport::rdma::{
    IN_FLIGHT, MAX_FRAME, NUVEC_JACCL_VERBS, RECV_AHEAD, RdmaFabric, Unavailable, leaked_regions,
};

const _: () =
    assert!(MAX_FRAME == super::frames::MAX_FRAME && IN_FLIGHT == super::frames::IN_FLIGHT);

/// The RDMA device names of this machine, in the library's order.
///
/// # Errors
///
/// [`Error::Config`] saying that no RDMA device is available and why: the verbs library does
/// not load (naming each path tried), lacks a function (naming it), or cannot list devices.
pub fn devices() -> Result<Vec<String>, Error> {
    transport::device_names().map_err(|e| {
        let problem = match e {
            Unavailable::NoDevice { .. } => e.to_string(),
            _ => format!("no RDMA device is available: {e}"),
        };
        Error::Config(ConfigError::Rdma { problem }.jaccl())
    })
}

/// Whether this machine can run the RDMA fabric: the verbs library loads, every function
/// resolves and it lists at least one device (whether a device is cabled and has an address
/// is only known when connecting).
pub fn available() -> bool {
    transport::check_available().is_ok()
}

/// Why this machine cannot run the RDMA fabric, or `None` when it can ([`available`]).
pub fn unavailable() -> Option<Unavailable> {
    transport::check_available().err()
}

/// Which of MLX's ring queue pairs: `left_[w]` or `right_[w]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Left,
    Right,
}

/// The channel of ring queue pair `side`, wire `wire`, at `rank` of `size` with `wires`
/// cables per direction (see the [module docs](self)).
pub(crate) fn ring_channel(
    rank: usize,
    size: usize,
    wires: usize,
    side: Side,
    wire: usize,
) -> Channel {
    let left = (rank + size - 1) % size;
    let right = (rank + 1) % size;
    match side {
        Side::Right => Channel::new(right, wire),
        Side::Left if size == 2 => Channel::new(left, wires + wire),
        Side::Left => Channel::new(left, wire),
    }
}

/// A queue pair's details as JACCL's side channel carries them.
pub(crate) fn destination(local: &Local) -> Result<Destination, String> {
    Ok(Destination {
        local_id: i32::from(local.lid),
        queue_pair_number: i32::try_from(local.qpn).map_err(|_| {
            format!(
                "the queue pair number {} does not fit MLX's 32-bit signed field",
                local.qpn
            )
        })?,
        packet_sequence_number: local.psn as i32,
        global_identifier: local.gid,
    })
}

/// Checks the details `peer` advertised: a 16-bit LID, a 24-bit QP number and PSN.
pub(crate) fn remote(peer: usize, d: &Destination) -> Result<Remote, String> {
    let lid = u16::try_from(d.local_id).map_err(|_| {
        format!(
            "rank {peer} advertised LID {}, which is not a 16-bit LID (a placeholder entry, or \
             ranks disagreeing on the topology)",
            d.local_id
        )
    })?;
    let qpn = u32::try_from(d.queue_pair_number)
        .ok()
        .filter(|q| *q < 1 << 24)
        .ok_or_else(|| {
            format!(
                "rank {peer} advertised queue pair number {}, not a 24-bit number",
                d.queue_pair_number
            )
        })?;
    let psn = u32::try_from(d.packet_sequence_number)
        .ok()
        .filter(|p| *p < 1 << 24)
        .ok_or_else(|| {
            format!(
                "rank {peer} advertised packet sequence number {}, not a 24-bit number",
                d.packet_sequence_number
            )
        })?;
    Ok(Remote::new(lid, qpn, psn, d.global_identifier))
}

/// Connects this rank's queue pairs for the topology that `config` gives
/// ([`Config::topology`]), exchanging their details over `side` and ending with MLX's
/// side-channel barrier.
///
/// Every wait on a peer is the side channel's, each bounded by its own timeout; the verbs
/// calls do not wait on peers. `timeout` bounds the whole bring-up on top of that: it is
/// checked before each exchange and before the barrier.
///
/// # Errors
///
/// [`Error::Config`] when the configuration has no topology, or would pass a limit of a
/// device (the one it reports, or Apple's when it cannot be asked: [`budget`](super::budget));
/// [`Error::InvalidArgument`] when `side` is not this rank's side channel of the same
/// group; [`Error::Connect`] naming the device, the peer and the failing verbs call (a
/// missing device, no IPv4-mapped GID, a refused queue pair…), a peer's malformed
/// details, or `timeout` passing; and the side channel's errors.
pub fn connect(
    config: &Config,
    side: &mut SideChannel,
    timeout: Duration,
) -> Result<RdmaFabric, Error> {
    let begun = Instant::now();
    let (rank, size) = (config.rank(), config.size());
    if side.rank() != rank || side.size() != size {
        return Err(Error::InvalidArgument {
            rank,
            op: "jaccl rdma connect",
            what: format!(
                "the side channel is rank {} of {} but the configuration is rank {rank} of \
                     {size}",
                side.rank(),
                side.size()
            ),
        });
    }
    let topology = config.topology()?;
    // Each device's limits, before anything is half built (one queue pair per peer in the
    // mesh): asked of the device, Apple's reported ones when it cannot be asked.
    super::budget::check(config, topology)?;
    let fail = |what: String| Error::Connect {
        rank,
        what: format!("jaccl: rdma: {what}"),
    };
    let in_time = |next: &str| {
        let waited = begun.elapsed();
        if waited > timeout {
            Err(fail(format!(
                "the bring-up took {waited:.3?}, more than the timeout of {timeout:?}, \
                     before {next}"
            )))
        } else {
            Ok(())
        }
    };
    // The verbs library is loaded when the first queue pair is opened, so that a missing
    // library is reported with the device and peer it was needed for.
    let open = |name: &str, channel: Channel, what: String| -> Result<Qp, Error> {
        let verbs = transport::verbs()
            .map_err(|e| fail(format!("{what}: no RDMA device is available: {e}")))?;
        Qp::open(verbs, name, channel, what.clone()).map_err(|e| fail(format!("{what}: {e}")))
    };
    let details = |qp: &Qp| destination(&qp.local).map_err(|e| fail(format!("{}: {e}", qp.what)));
    let mut fabric = RdmaFabric::new(rank, size);
    match topology {
        Topology::Mesh { wires } => {
            // MLX 0.32.4: every queue pair of every wire, wire-major, then one exchange of
            // wires × R details, wire w's towards rank j at index w·R + j.
            let names = config.mesh_wire_devices()?;
            let mut mine = vec![
                Destination {
                    local_id: -1,
                    ..Destination::default()
                };
                wires * size
            ];
            for (w, row) in names.iter().enumerate() {
                for (peer, name) in row.iter().enumerate() {
                    let Some(name) = name else { continue };
                    let channel = Channel::new(peer, w);
                    let what = format!("device {name} (queue pair to rank {peer}, wire {w})");
                    let qp = open(name, channel, what)?;
                    mine[w * size + peer] = details(&qp)?;
                    fabric.add(qp);
                }
            }
            in_time("exchanging the queue pairs' details")?;
            let all = side.exchange_mesh(&mine)?;
            for qp in fabric.queue_pairs_mut() {
                let (peer, w) = (qp.channel.peer, qp.channel.link);
                let theirs = all
                    .get(peer)
                    .and_then(|row| row.get(w * size + rank))
                    .ok_or_else(|| {
                        fail(format!(
                            "rank {peer} sent no details for rank {rank} on wire {w}"
                        ))
                    })?;
                let remote = remote(peer, theirs).map_err(|e| fail(format!("{}: {e}", qp.what)))?;
                qp.connect(&remote)
                    .map_err(|e| fail(format!("{}: {e}", qp.what)))?;
            }
        }
        Topology::Ring { wires } => {
            let (left_names, right_names) = config.ring_devices()?;
            let left_peer = (rank + size - 1) % size;
            let right_peer = (rank + 1) % size;
            let mut left = Vec::with_capacity(wires);
            let mut right = Vec::with_capacity(wires);
            // MLX's order: the left connections, then the right ones.
            for (side_of, names, peer, into) in [
                (Side::Left, left_names, left_peer, &mut left),
                (Side::Right, right_names, right_peer, &mut right),
            ] {
                for (w, name) in names.iter().enumerate().take(wires) {
                    let channel = ring_channel(rank, size, wires, side_of, w);
                    let what = format!(
                        "device {name} (queue pair to the {} neighbour rank {peer}, wire {w}, \
                             link {})",
                        if side_of == Side::Left {
                            "left"
                        } else {
                            "right"
                        },
                        channel.link
                    );
                    let qp = open(name, channel, what)?;
                    into.push(details(&qp)?);
                    fabric.add(qp);
                }
            }
            in_time("exchanging the queue pairs' details")?;
            let all = side.exchange_ring(&left, &right)?;
            // The queue pairs were added left ones first, then right ones.
            let first_right = left.len();
            for (first, count, remotes, peer) in [
                (0, left.len(), all.remote_for_left(rank), left_peer),
                (
                    first_right,
                    right.len(),
                    all.remote_for_right(rank),
                    right_peer,
                ),
            ] {
                for w in 0..count {
                    let qp = &mut fabric.queue_pairs_mut()[first + w];
                    let theirs = remotes
                        .get(w)
                        .ok_or_else(|| fail(format!("rank {peer} sent no details for wire {w}")))?;
                    let remote =
                        remote(peer, theirs).map_err(|e| fail(format!("{}: {e}", qp.what)))?;
                    qp.connect(&remote)
                        .map_err(|e| fail(format!("{}: {e}", qp.what)))?;
                }
            }
        }
    }
    in_time("the final barrier")?;
    side.barrier()?;
    fabric.start_clock();
    Ok(fabric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_of_more_than_two_numbers_both_sides_from_zero() {
        // Rank 1 of 4, 2 wires: right is rank 2, left rank 0.
        assert_eq!(ring_channel(1, 4, 2, Side::Right, 1), Channel::new(2, 1));
        assert_eq!(ring_channel(1, 4, 2, Side::Left, 0), Channel::new(0, 0));
        assert_eq!(ring_channel(0, 3, 1, Side::Left, 0), Channel::new(2, 0));
    }

    #[test]
    fn a_ring_of_two_puts_the_left_queue_pairs_after_the_right_ones() {
        assert_eq!(ring_channel(0, 2, 3, Side::Right, 2), Channel::new(1, 2));
        assert_eq!(ring_channel(0, 2, 3, Side::Left, 0), Channel::new(1, 3));
        assert_eq!(ring_channel(1, 2, 3, Side::Left, 2), Channel::new(0, 5));
    }

    #[test]
    fn the_ring_numbering_is_the_wiring_of_a_ring() {
        use crate::fabric::Wiring;
        for (size, wires) in [(2, 1), (2, 3), (3, 2), (5, 4)] {
            let wiring = Wiring::ring(size, wires);
            for rank in 0..size {
                for w in 0..wires {
                    // My right_[w] connects to my right neighbour's left_[w].
                    let mine = ring_channel(rank, size, wires, Side::Right, w);
                    let right = (rank + 1) % size;
                    let theirs = ring_channel(right, size, wires, Side::Left, w);
                    assert_eq!(
                        wiring.far_end(rank, mine),
                        Some((right, theirs.link)),
                        "size {size}, wires {wires}, rank {rank}, wire {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_peer_gid_is_routed_to_only_when_its_interface_id_is_set() {
        let mut d = Destination {
            local_id: 3,
            queue_pair_number: 0x1234,
            packet_sequence_number: 7,
            global_identifier: [0; 16],
        };
        assert_eq!(
            remote(1, &d).unwrap(),
            Remote {
                lid: 3,
                qpn: 0x1234,
                psn: 7,
                gid: None
            }
        );
        d.global_identifier[15] = 9;
        assert_eq!(remote(1, &d).unwrap().gid, Some(d.global_identifier));
        // A subnet prefix alone does not count (MLX tests the interface id).
        d.global_identifier = [0; 16];
        d.global_identifier[0] = 0xfe;
        assert_eq!(remote(1, &d).unwrap().gid, None);
    }

    #[test]
    fn malformed_peer_details_are_errors_naming_the_peer() {
        let good = Destination {
            local_id: 1,
            queue_pair_number: 2,
            packet_sequence_number: 7,
            global_identifier: [0; 16],
        };
        for (bad, what) in [
            (
                Destination {
                    local_id: -1,
                    ..good
                },
                "LID -1",
            ),
            (
                Destination {
                    local_id: 70_000,
                    ..good
                },
                "LID 70000",
            ),
            (
                Destination {
                    queue_pair_number: -5,
                    ..good
                },
                "queue pair number -5",
            ),
            (
                Destination {
                    queue_pair_number: 1 << 24,
                    ..good
                },
                "queue pair number 16777216",
            ),
            (
                Destination {
                    packet_sequence_number: -7,
                    ..good
                },
                "packet sequence number -7",
            ),
        ] {
            let e = remote(4, &bad).unwrap_err();
            assert!(e.contains("rank 4") && e.contains(what), "{e}");
        }
    }

    #[test]
    fn listing_devices_never_panics() {
        // With or without hardware: a list, or an error that says what failed.
        match devices() {
            Ok(names) => assert_eq!(available(), !names.is_empty()),
            Err(e) => {
                assert!(e.to_string().contains("no RDMA device"), "{e}");
                assert!(!available());
            }
        }
    }
}
