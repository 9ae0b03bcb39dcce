//! The builder of a simulated job ([`Sim`]: wiring, network model, faults, seed) and its
//! runners: [`Sim::run`] starts one thread per rank, hands each its [`SimFabric`], gives the
//! first turn and collects the [`Report`]; [`Sim::run_ring`] and [`Sim::run_jaccl`] wrap the
//! fabric in MLX's ring or JACCL's communicator first.
//!
//! Uses: the world it makes ([`World::new`]), the turn hand-off ([`Shared`]) and the report.
//! Invariants: the builder only records settings (clamped to what the model needs: at least
//! one byte per fragment, 16 per window, one receive posted); the seed in effect is read once
//! per run ([`SEED_VAR`] first); a rank's closure runs only while it holds the turn, and every
//! rank's thread finishes (passing the turn on) whether its closure returns or panics.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use nuvec_core::distributed::Group;
use nuvec_distributed::fabric::{ChannelKind, Wiring};
use nuvec_distributed::jaccl::{FrameRule, JacclCommunicator};
use nuvec_distributed::{RingCommunicator, Wire};

use crate::default_group;
use crate::fabric::SimFabric;
use crate::fault::Fault;
use crate::report::{Outcome, Report, panic_text};
use crate::split::{Shape, SimSplitter};
use crate::turn::Shared;
use crate::uc::Uc;
use crate::world::World;

/// The environment variable that overrides the seed of every [`Sim`] (to replay a failure).
pub const SEED_VAR: &str = "NUVEC_SIM_SEED";

/// A simulated job: its size, wiring, network model, faults and seed.
#[derive(Clone, Debug)]
pub struct Sim {
    pub(crate) wiring: Wiring,
    seed: u64,
    pub(crate) latency: Duration,
    pub(crate) jitter: Duration,
    pub(crate) bytes_per_sec: u64,
    pub(crate) max_fragment: usize,
    pub(crate) window: usize,
    pub(crate) faults: Vec<Fault>,
    pub(crate) record_wire: bool,
    /// Connections per neighbour, for a ring made by [`Sim::ring`].
    ring_links: Option<usize>,
    /// Message channels with RDMA UC semantics instead of streams.
    pub(crate) uc: Option<Uc>,
    /// The wire of [`Sim::run_ring`]'s rings.
    wire: Wire,
}

impl Sim {
    /// A job of `ranks` ranks in MLX's ring with one connection per neighbour, seed 0 (or
    /// [`SEED_VAR`]), 5 µs ± 5 µs latency, 10 GB/s, fragments up to 64 KiB, 256 KiB windows.
    pub fn ring(ranks: usize, links: usize) -> Self {
        let mut sim = Self::new(Wiring::ring(ranks, links));
        sim.ring_links = Some(links);
        sim
    }

    /// A job over any wiring.
    pub fn new(wiring: Wiring) -> Self {
        Self {
            wiring,
            seed: 0,
            latency: Duration::from_micros(5),
            jitter: Duration::from_micros(5),
            bytes_per_sec: 10_000_000_000,
            max_fragment: 64 * 1024,
            window: 256 * 1024,
            faults: Vec::new(),
            record_wire: false,
            ring_links: None,
            uc: None,
            wire: Wire::Nuvec,
        }
    }

    /// A JACCL mesh of `ranks` ranks: one UC queue pair between every pair, [`Uc::default`].
    pub fn mesh(ranks: usize) -> Self {
        Self::mesh_wires(ranks, 1)
    }

    /// A JACCL mesh of `ranks` ranks with `wires` cables between every pair (MLX 0.32.4's
    /// multi-wire mesh): `wires` UC queue pairs between every pair, wire w being link w at
    /// both ends, [`Uc::default`].
    pub fn mesh_wires(ranks: usize, wires: usize) -> Self {
        Self::new(Wiring::mesh(ranks, wires)).uc(Uc::default())
    }

    /// A JACCL ring of `ranks` ranks with `wires` UC queue pairs to each neighbour, numbered as
    /// [`Sim::ring`]'s connections, [`Uc::default`].
    pub fn jaccl_ring(ranks: usize, wires: usize) -> Self {
        Self::ring(ranks, wires).uc(Uc::default())
    }

    /// Makes every channel a message channel with RDMA UC semantics ([`Uc`]).
    pub fn uc(mut self, uc: Uc) -> Self {
        self.uc = Some(Uc {
            posted: uc.posted.max(1),
            ..uc
        });
        self
    }

    /// The wire [`Sim::run_ring`]'s rings speak: the nuvec wire by default (every rank of a
    /// simulated job is this crate), [`Wire::Mlx`] to run MLX's byte for byte.
    pub fn wire(mut self, wire: Wire) -> Self {
        self.wire = wire;
        self
    }

    /// The wire [`Sim::run_ring`]'s rings speak.
    pub fn ring_wire(&self) -> Wire {
        self.wire
    }

    /// The seed that fixes every choice (overridden by [`SEED_VAR`] when it is set).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The seed in effect: [`SEED_VAR`] if set and valid, else the configured one.
    pub fn effective_seed(&self) -> u64 {
        std::env::var(SEED_VAR)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(self.seed)
    }

    /// Base one-way latency and uniform jitter added to it per fragment.
    pub fn latency(mut self, latency: Duration, jitter: Duration) -> Self {
        self.latency = latency;
        self.jitter = jitter;
        self
    }

    /// Bandwidth of each direction of each connection, in bytes per second.
    pub fn bandwidth(mut self, bytes_per_sec: u64) -> Self {
        self.bytes_per_sec = bytes_per_sec.max(1);
        self
    }

    /// The largest fragment (sizes are drawn uniformly from `1..=max`).
    pub fn max_fragment(mut self, max: usize) -> Self {
        self.max_fragment = max.max(1);
        self
    }

    /// Bytes in flight or unread allowed per direction (the socket buffer; at least 16, so
    /// that a whole element of any dtype fits).
    pub fn window(mut self, bytes: usize) -> Self {
        self.window = bytes.max(16);
        self
    }

    /// Adds a fault.
    pub fn fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// Records every byte each channel direction carried into [`Report::wire`] (and, on
    /// message channels, every message's length into [`Report::messages`]).
    pub fn record_wire(mut self, on: bool) -> Self {
        self.record_wire = on;
        self
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.wiring.size()
    }

    /// Runs `body` on every rank with its `nuvec_core` group: MLX's ring over this simulated
    /// fabric, speaking [`Sim::wire`] (the nuvec wire unless set), every operation bounded by
    /// `timeout` of virtual time. This is how to test your
    /// own distributed nuvec code in one process, deterministically. Pass the group the body
    /// gets (`Some(&group)`): the default group (`None`) cannot be every rank's in one process,
    /// and an operation on it inside a simulated rank fails at once saying so:
    ///
    /// ```
    /// use std::time::Duration;
    /// use nuvec_core::{array, distributed};
    /// use nuvec_fabric_sim::Sim;
    ///
    /// let report = Sim::ring(3, 1).seed(42).run_ring(Duration::from_secs(30), |group| {
    ///     let x = array![1.0, 2.0];
    ///     distributed::all_sum(&x, Some(&group)).to_vec::<f32>()
    /// });
    /// for outcome in report.outcomes {
    ///     assert_eq!(outcome.returned().unwrap().unwrap(), [3.0, 6.0]);
    /// }
    /// ```
    ///
    /// # Panics
    /// If the simulation was not made by [`Sim::ring`].
    pub fn run_ring<T, F>(&self, timeout: Duration, body: F) -> Report<T>
    where
        T: Send,
        F: Fn(Group) -> T + Sync,
    {
        let links = self
            .ring_links
            .expect("run_ring needs a simulation made by Sim::ring");
        default_group::install();
        self.run(|fabric| {
            let splitter = SimSplitter::new(&fabric, Shape::Ring { links });
            let _default = default_group::enter(fabric.job_rank());
            let comm = RingCommunicator::new(fabric, links, timeout)
                .with_wire(self.wire)
                .with_splitter(Arc::new(splitter));
            body(Group::new(Arc::new(comm)))
        })
    }

    /// Runs `body` on every rank with its `nuvec_core` group over JACCL: the mesh for a
    /// simulation made by [`Sim::mesh`] or [`Sim::mesh_wires`], the ring for one made by
    /// [`Sim::jaccl_ring`], every
    /// rank with the frame rule `rule` and every operation bounded by `timeout` of virtual time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use nuvec_core::{array, distributed};
    /// use nuvec_distributed::jaccl::FrameRule;
    /// use nuvec_fabric_sim::Sim;
    ///
    /// let report = Sim::mesh(4).seed(7).run_jaccl(Duration::from_secs(30), FrameRule::Small, |group| {
    ///     let x = array![1.0, 2.0];
    ///     distributed::all_sum(&x, Some(&group)).to_vec::<f32>()
    /// });
    /// for outcome in report.outcomes {
    ///     assert_eq!(outcome.returned().unwrap().unwrap(), [4.0, 8.0]);
    /// }
    /// ```
    pub fn run_jaccl<T, F>(&self, timeout: Duration, rule: FrameRule, body: F) -> Report<T>
    where
        T: Send,
        F: Fn(Group) -> T + Sync,
    {
        let ring = self.ring_links;
        default_group::install();
        self.run(|fabric| {
            let shape = match ring {
                Some(wires) => Shape::JacclRing { wires },
                None => Shape::Mesh { links: 1 },
            };
            let _default = default_group::enter(fabric.job_rank());
            let splitter = Arc::new(SimSplitter::new(&fabric, shape));
            let comm = match ring {
                Some(wires) => JacclCommunicator::ring(fabric, wires, rule, timeout),
                None => JacclCommunicator::mesh(fabric, rule, timeout),
            };
            body(Group::new(Arc::new(comm.with_splitter(splitter))))
        })
    }

    /// Runs `body` on every rank at once, each with its fabric, and reports every outcome.
    pub fn run<T, F>(&self, body: F) -> Report<T>
    where
        T: Send,
        F: Fn(SimFabric) -> T + Sync,
    {
        let seed = self.effective_seed();
        let kind = if self.uc.is_some() {
            ChannelKind::Message
        } else {
            ChannelKind::Stream
        };
        let (shared, parkers) = Shared::new(World::new(self, seed));
        let shared = Arc::new(shared);
        let outcomes: Vec<Outcome<T>> = std::thread::scope(|scope| {
            let handles: Vec<_> = parkers
                .into_iter()
                .enumerate()
                .map(|(rank, parker)| {
                    let shared = Arc::clone(&shared);
                    let body = &body;
                    scope.spawn(move || {
                        shared.wait_turn(rank, &parker);
                        let fabric = SimFabric::new(Arc::clone(&shared), kind, rank, parker);
                        let result = catch_unwind(AssertUnwindSafe(|| body(fabric)));
                        let crashed = shared.finish(rank);
                        match result {
                            Ok(_) if crashed => Outcome::Crashed,
                            Ok(value) => Outcome::Returned(value),
                            Err(panic) => Outcome::Panicked(panic_text(panic.as_ref())),
                        }
                    })
                })
                .collect();
            shared.start();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|p| Outcome::Panicked(panic_text(p.as_ref())))
                })
                .collect()
        });
        Report::new(outcomes, seed, &shared.lock())
    }
}
