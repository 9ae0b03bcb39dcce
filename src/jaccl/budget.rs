//! What a JACCL topology asks of each RDMA device (feature `jaccl`), against each device's
//! own limits: the queue pairs and memory regions per device and the work requests per queue
//! of a queue pair that the device reports (`ibv_query_device`'s `max_qp`, `max_mr`,
//! `max_qp_wr`, read at bring-up: [`DeviceLimits`]), or, when it cannot be asked, Apple's
//! reported limits for a Thunderbolt device (`nuvec_verbs_abi::APPLE_MAX_*`: 10 queue pairs,
//! 100 memory regions, 63 work requests, which the software provider enforces by default).
//! Devices differ: users report 11 queue pairs on M3 Ultra and M5 Max, and 3 on a Mac behind
//! a 6-port hub (ml-explore/mlx#3205). MLX asks nothing and fails at the first refused
//! `ibv_create_qp`.
//!
//! Every queue pair of the RDMA fabric lives on the device its cable is named by, and owns
//! 6 memory regions (its frames: 2 to send, 4 to receive) and a capacity of 32 sends and as
//! many receives, of which at most 2 and 4 are ever posted. So a device carries as many queue pairs as the cables named
//! by it: with one device per cable, as a Thunderbolt port is, one in a mesh and in a ring of
//! more than 2 ranks, two in a ring of 2 (each wire carries the `left_` and the `right_` queue
//! pair of the one neighbour). [`Needs::of`] counts a topology with one device per cable,
//! [`Needs::of_devices`] the device names this rank will really open (a device file may name
//! one device for several cables), and [`check_devices`] (or [`Needs::check_with`] for one
//! device's limits), at bring-up before any queue pair is created, says which limit of which
//! device a configuration would pass, by how much, and what would fit.
//!
//! | topology | queue pairs | devices | per device: queue pairs, regions | work requests per queue |
//! |---|---|---|---|---|
//! | mesh of 8, 1 wire | 7 | 7 | 1, 6 | 32 (2 sends, 4 receives posted) |
//! | mesh of 8, 2 wires | 14 | 14 | 1, 6 | 32 |
//! | ring of 3 or more, 4 wires | 8 | 8 | 1, 6 | 32 |
//! | ring of 2, 4 wires | 8 | 4 | 2, 12 | 32 |

use std::collections::BTreeMap;

pub use crate::transport::rdma::{DeviceLimits, LimitSource};

use super::config::{Config, Topology};
use crate::config::error::ConfigError;
use crate::error::Error;
use crate::transport::rdma::{
    IN_FLIGHT, RECV_AHEAD, REGIONS_PER_QUEUE_PAIR, WORK_REQUESTS, device_limits,
};

const _: () = assert!(IN_FLIGHT as u32 <= WORK_REQUESTS && RECV_AHEAD as u32 <= WORK_REQUESTS);

/// How the ranks are cabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Every pair of ranks.
    Mesh,
    /// Each rank to its two neighbours.
    Ring,
}

/// What one rank asks of its RDMA devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Needs {
    /// The queue pairs it opens.
    pub queue_pairs: usize,
    /// The devices they are on.
    pub devices: usize,
    /// The most queue pairs on one device, and that device.
    pub busiest: (usize, String),
    /// The most memory regions on one device.
    pub regions_per_device: usize,
    /// The work requests asked of each queue (send and receive) of a queue pair.
    pub work_requests: u32,
}

impl Needs {
    /// What a rank of `ranks` cabled as `kind` with `wires` cables per pair of neighbours (in
    /// a mesh: per pair of ranks) asks, with one device per cable.
    pub fn of(kind: Kind, ranks: usize, wires: usize) -> Needs {
        let mut names = Vec::new();
        match kind {
            Kind::Mesh => {
                for peer in 1..ranks {
                    for w in 0..wires {
                        names.push(format!("cable to rank {peer}, wire {w}"));
                    }
                }
            }
            Kind::Ring if ranks < 2 => {}
            Kind::Ring => {
                // Rank 0: its left neighbour, then its right one (the same rank when 2).
                for (side, peer) in [("left", ranks - 1), ("right", 1)] {
                    for w in 0..wires {
                        let cable = if ranks == 2 { "" } else { side };
                        names.push(format!("{cable} cable to rank {peer}, wire {w}"));
                    }
                }
            }
        }
        Needs::of_devices(names.iter().map(String::as_str))
    }

    /// What a rank asks that opens one queue pair on each device of `devices`, in order (a
    /// name may repeat).
    pub fn of_devices<'a>(devices: impl IntoIterator<Item = &'a str>) -> Needs {
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        let mut queue_pairs = 0;
        for name in devices {
            *count.entry(name).or_default() += 1;
            queue_pairs += 1;
        }
        let busiest = count
            .iter()
            .max_by_key(|(name, n)| (**n, std::cmp::Reverse(**name)))
            .map_or((0, String::new()), |(name, n)| (*n, (*name).to_owned()));
        Needs {
            queue_pairs,
            devices: count.len(),
            regions_per_device: busiest.0 * REGIONS_PER_QUEUE_PAIR,
            busiest,
            work_requests: WORK_REQUESTS,
        }
    }

    /// What this rank of `config` will open for `topology` (a mesh of `wires` opens one queue
    /// pair on each of the first `wires` devices named for every peer).
    pub fn planned(config: &Config, topology: Topology) -> Needs {
        Needs::of_devices(planned_names(config, topology))
    }
}

/// The device of each queue pair this rank of `config` will open for `topology`, in order.
fn planned_names(config: &Config, topology: Topology) -> Vec<&str> {
    let rank = config.rank();
    let row = config.devices().get(rank).map_or(&[][..], Vec::as_slice);
    let size = config.size();
    match topology {
        Topology::Mesh { wires } => row
            .iter()
            .enumerate()
            .filter(|(peer, _)| *peer != rank)
            .flat_map(|(_, names)| names.iter().take(wires).map(String::as_str))
            .collect(),
        Topology::Ring { .. } if size < 2 => Vec::new(),
        Topology::Ring { wires } => {
            let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
            [left, right]
                .into_iter()
                .flat_map(|p| row.get(p).into_iter().flatten().take(wires))
                .map(String::as_str)
                .collect()
        }
    }
}

impl Needs {
    /// Whether these needs fit Apple's reported limits on every device; otherwise which
    /// limit they pass, by how much, and what would fit.
    pub fn check(&self) -> Result<(), String> {
        self.check_with(&DeviceLimits::apple("not asked"))
    }

    /// Whether these needs fit a device that allows `limits` (every device of these needs
    /// alike: [`check_devices`] checks each device against its own); otherwise which limit
    /// they pass on the busiest device, by how much, and what would fit.
    pub fn check_with(&self, limits: &DeviceLimits) -> Result<(), String> {
        let (on_busiest, device) = &self.busiest;
        let who = &limits.source;
        let max_qp = limits.queue_pairs;
        if *on_busiest > max_qp {
            return Err(format!(
                "this rank would open {on_busiest} queue pairs on device {device}, {} more than \
                 the {max_qp} {who}: at most {max_qp} cables may name one device (give each \
                 cable the device of its own port, or use fewer wires)",
                on_busiest - max_qp
            ));
        }
        let max_mr = limits.regions;
        if self.regions_per_device > max_mr {
            return Err(format!(
                "this rank would register {} memory regions on device {device} \
                 ({REGIONS_PER_QUEUE_PAIR} per queue pair), {} more than the {max_mr} {who}: \
                 at most {} queue pairs fit on one device",
                self.regions_per_device,
                self.regions_per_device - max_mr,
                max_mr / REGIONS_PER_QUEUE_PAIR
            ));
        }
        let max_wr = limits.work_requests;
        if self.queue_pairs > 0 && self.work_requests > max_wr {
            return Err(format!(
                "each queue pair on device {device} would ask for {} work requests per queue, \
                 {} more than the {max_wr} {who}",
                self.work_requests,
                self.work_requests - max_wr
            ));
        }
        Ok(())
    }
}

/// Checks what this rank of `config` opens for `topology` on each device against that
/// device's own limits (`limits_of(name)`): the busiest device first, so that with equal
/// limits the error is [`Needs::check`]'s.
///
/// # Errors
///
/// Which limit of which device the configuration would pass, by how much, and what would fit.
pub fn check_devices(
    config: &Config,
    topology: Topology,
    mut limits_of: impl FnMut(&str) -> DeviceLimits,
) -> Result<(), String> {
    let planned = planned_names(config, topology);
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for name in &planned {
        *count.entry(name).or_default() += 1;
    }
    let mut devices: Vec<(&str, usize)> = count.into_iter().collect();
    devices.sort_by_key(|&(name, n)| (std::cmp::Reverse(n), name));
    for (name, n) in devices {
        Needs::of_devices(std::iter::repeat_n(name, n)).check_with(&limits_of(name))?;
    }
    Ok(())
}

/// The bring-up's check: this rank of `config` fits each device's limits (asked of the
/// device, Apple's reported ones when it cannot be asked) for `topology`, or an
/// [`Error::Config`] saying which limit it would pass.
pub(crate) fn check(config: &Config, topology: Topology) -> Result<(), Error> {
    check_devices(config, topology, device_limits).map_err(|problem| {
        Error::Config(
            ConfigError::AppleLimit {
                rank: config.rank(),
                problem,
            }
            .jaccl(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(n: &Needs) -> (usize, usize, usize, usize, u32) {
        (
            n.queue_pairs,
            n.devices,
            n.busiest.0,
            n.regions_per_device,
            n.work_requests,
        )
    }

    #[test]
    fn a_mesh_of_eight_with_two_wires_puts_one_queue_pair_on_each_of_fourteen_devices() {
        let n = Needs::of(Kind::Mesh, 8, 2);
        assert_eq!(counts(&n), (14, 14, 1, 6, 32));
        assert_eq!(n.check(), Ok(()));
        assert_eq!(counts(&Needs::of(Kind::Mesh, 8, 1)), (7, 7, 1, 6, 32));
    }

    #[test]
    fn a_ring_with_four_wires_needs_one_queue_pair_per_device_or_two_with_two_ranks() {
        let n = Needs::of(Kind::Ring, 4, 4);
        assert_eq!(counts(&n), (8, 8, 1, 6, 32));
        assert_eq!(n.check(), Ok(()));
        let two = Needs::of(Kind::Ring, 2, 4);
        assert_eq!(counts(&two), (8, 4, 2, 12, 32));
        assert_eq!(two.check(), Ok(()));
    }

    #[test]
    fn the_edges_count_nothing_or_one() {
        assert_eq!(counts(&Needs::of(Kind::Mesh, 1, 1)), (0, 0, 0, 0, 32));
        assert_eq!(counts(&Needs::of(Kind::Ring, 1, 4)), (0, 0, 0, 0, 32));
        assert_eq!(counts(&Needs::of(Kind::Mesh, 2, 1)), (1, 1, 1, 6, 32));
        assert_eq!(counts(&Needs::of(Kind::Ring, 3, 1)), (2, 2, 1, 6, 32));
        assert_eq!(Needs::of(Kind::Mesh, 8, 0).queue_pairs, 0);
    }

    #[test]
    fn ten_queue_pairs_on_one_device_fit_and_eleven_say_by_how_much() {
        let ten = Needs::of_devices(["rdma_en1"; 10]);
        assert_eq!(counts(&ten), (10, 1, 10, 60, 32));
        assert_eq!(ten.check(), Ok(()));
        let mut names = vec!["rdma_en1"; 11];
        names.push("rdma_en2");
        let e = Needs::of_devices(names).check().unwrap_err();
        assert!(
            e.contains("11 queue pairs on device rdma_en1")
                && e.contains("1 more than the 10")
                && e.contains("at most 10 cables"),
            "{e}"
        );
    }

    #[test]
    fn a_device_file_naming_one_device_for_a_whole_mesh_of_eight_is_refused_at_bring_up() {
        let devices: Vec<Vec<Vec<String>>> = (0..8)
            .map(|i| {
                (0..8)
                    .map(|j| {
                        if i == j {
                            Vec::new()
                        } else {
                            vec!["rdma_en3".to_owned(), "rdma_en3".to_owned()]
                        }
                    })
                    .collect()
            })
            .collect();
        let config = Config::new(0, devices);
        check(&config, Topology::Mesh { wires: 1 }).expect("one wire fits");
        let e = check(&config, Topology::Mesh { wires: 2 })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 0")
                && e.contains("14 queue pairs on device rdma_en3")
                && e.contains("4 more than the 10")
                && e.contains("before any queue pair was created"),
            "{e}"
        );
    }

    #[test]
    fn the_memory_region_limit_says_how_many_queue_pairs_fit() {
        let n = Needs {
            queue_pairs: 17,
            devices: 1,
            busiest: (9, "rdma_en1".into()),
            regions_per_device: 102,
            work_requests: 32,
        };
        let e = n.check().unwrap_err();
        assert!(
            e.contains("102 memory regions") && e.contains("2 more than the 100"),
            "{e}"
        );
        assert!(e.contains("at most 16 queue pairs"), "{e}");
    }

    /// The limits a device reports.
    fn reported(queue_pairs: usize) -> DeviceLimits {
        DeviceLimits {
            queue_pairs,
            regions: 100,
            work_requests: 63,
            source: LimitSource::Queried,
        }
    }

    #[test]
    fn a_device_that_reports_eleven_queue_pairs_takes_eleven_and_one_that_reports_three_four_not() {
        let eleven = Needs::of_devices(["rdma_en1"; 11]);
        assert!(eleven.check().is_err(), "Apple's 10 refuse 11");
        assert_eq!(eleven.check_with(&reported(11)), Ok(()));
        let e = Needs::of_devices(["rdma_en2"; 4])
            .check_with(&reported(3))
            .unwrap_err();
        assert!(
            e.contains("4 queue pairs on device rdma_en2")
                && e.contains("1 more than the 3 it reports (ibv_query_device)"),
            "{e}"
        );
        let few_wr = DeviceLimits {
            work_requests: 16,
            ..reported(10)
        };
        let e = Needs::of_devices(["rdma_en2"])
            .check_with(&few_wr)
            .unwrap_err();
        assert!(
            e.contains("32 work requests") && e.contains("16 more than the 16"),
            "{e}"
        );
    }

    #[test]
    fn each_device_is_checked_against_its_own_limits() {
        // Rank 0 of a mesh of 4: rdma_en1 towards ranks 1 and 2, rdma_en2 towards rank 3.
        let row = |names: [&str; 4]| -> Vec<Vec<String>> {
            names
                .iter()
                .map(|n| {
                    if n.is_empty() {
                        Vec::new()
                    } else {
                        vec![(*n).to_owned()]
                    }
                })
                .collect()
        };
        let mut devices = vec![row(["", "rdma_en1", "rdma_en1", "rdma_en2"])];
        devices.extend((1..4).map(|_| row(["rdma_en9", "", "", ""])));
        let config = Config::new(0, devices);
        let mesh = Topology::Mesh { wires: 1 };
        let limits = |one_on_en1: usize| {
            move |name: &str| reported(if name == "rdma_en1" { one_on_en1 } else { 1 })
        };
        assert_eq!(check_devices(&config, mesh, limits(2)), Ok(()));
        let e = check_devices(&config, mesh, limits(1)).unwrap_err();
        assert!(
            e.contains("2 queue pairs on device rdma_en1") && e.contains("1 more than the 1"),
            "{e}"
        );
    }
}
