//! Distributed backends for nuvec: MLX's TCP ring, and MLX's JACCL (RDMA over Thunderbolt 5;
//! experimental, feature `jaccl`).
//!
//! [`init`] reads MLX's launch environment, connects a backend and makes it the default group
//! of `nuvec::distributed`'s collectives, as `mx.distributed.init()`. The ring reads
//! `MLX_HOSTFILE` (a JSON list with one entry per rank of `"host:port"` addresses) and
//! `MLX_RANK`; JACCL reads the variables `mlx.launch --backend jaccl` writes
//! (`jaccl::Config::from_env`). [`init_backend`] names the backend. Every rank runs the same
//! program; the processes may share one Mac (over loopback) or run on several (over Ethernet
//! or Thunderbolt IP for the ring, Thunderbolt 5 cables for JACCL).
//!
//! ```
//! # fn main() -> nuvec_core::Result<()> {
//! use nuvec_core::{array, distributed};
//! let group = nuvec_distributed::init(false)?; // size 1 without a hostfile
//! let x = array![1.0, 2.0];
//! let total = distributed::all_sum(&x, None); // the sum over every rank
//! println!("rank {} of {}: {:?}", group.rank(), group.size(), total.to_vec::<f32>()?);
//! # Ok(())
//! # }
//! ```
//!
//! # Wire compatibility
//!
//! The ring is MLX's, byte for byte (MLX 0.32.x, `mlx[cpu]==0.32.4`): the same connection order,
//! no handshake, and the same raw element bytes on each direction of each connection, split
//! into the same sub-reduces, segments and directions. Rust and Python MLX ranks can therefore
//! share one ring, and every rank gets the same bits: each segment of an all-reduce is reduced
//! once, in MLX's order, then copied to every rank.
//!
//! # Design
//!
//! The collective algorithms ([`ring::algorithm`]) are plain blocking code written once over
//! the [`fabric::Fabric`] trait, with their schedules as pure arithmetic
//! ([`ring::schedule`]). The same code runs over TCP ([`TcpFabric`]) and over the
//! deterministic simulator of the `nuvec-fabric-sim` crate, where it is property-tested with
//! injected fragmentation, latency and faults. See each module for the why.
//!
//! # Failures
//!
//! Every wait is bounded: a link that goes silent (a cut cable, a dead host) fails the
//! operation within the link timeout ([`Options::link_timeout`], 15 s), and the operation
//! timeout ([`Options::timeout`], 10 minutes, or none) is a backstop against a peer that is
//! alive but never comes; a healthy peer that is slow only makes the waiting ranks say so
//! ([`Options::warn_after`]). Arguments are checked before a byte
//! moves (an unsupported dtype, a wrong size, a peer that is not a neighbour: an
//! `InvalidArgument` error, and the group stays usable). Any failure on the wire fails the
//! group: the error names this rank, the operation and its sequence number, the peer, the link,
//! how many bytes had moved and how long it waited; every later call returns that first error
//! at once (an `Io` error). A wrong configuration (a variable, the hostfile, an address, an
//! option) is an [`Error::Config`] holding a [`ConfigError`]: a value to `match` on, naming the
//! variable or file, the value seen and what was expected.
//!
//! Stability: no promise when this crate is depended on directly; depend on nuvec, whose
//! re-exports are semver-tracked.

// The layers, lowest first (`ARCHITECTURE.md` draws them; `tests/layers.rs` checks that no
// module uses one above its own): `fabric`, `limits` and `sync` under everything; `config`
// (with its errors); `error`, which wraps them; `transport`; `collective`; the backends `ring`
// and `jaccl`; `backend`; this file.
mod backend;
mod collective;
mod config;
mod error;
pub mod fabric;
pub mod jaccl;
mod limits;
pub mod ring;
mod sync;
mod transport;

pub use backend::{Backend, RingGroup, connect_jaccl, connect_ring, is_available, wire};
pub use collective::reduce;
pub use config::hostfile;
pub use config::options::{
    DEFAULT_LINK_TIMEOUT, DEFAULT_SETUP_TIMEOUT, DEFAULT_SPIN, DEFAULT_TIMEOUT, DEFAULT_WARN_AFTER,
    MAX_SPIN, Options, Wire, WireChoice,
};
pub use config::{AddressProblem, ConfigError, FileKind, HostfileProblem, RankProblem};
pub use error::Error;
pub use jaccl::JacclFabric;
pub use ring::communicator::RingCommunicator;
pub use transport::tcp::TcpFabric;

/// The crate's building blocks that its own tests, fuzz targets and benchmarks drive directly:
/// not part of the API, no stability of any kind.
#[doc(hidden)]
pub mod internals {
    pub use crate::collective::split::{Exchange, Plan, Splitter, SubFabric};
    pub use crate::ring::agree;
    /// The verbs library loader, over a list of paths (feature `jaccl`).
    #[cfg(feature = "jaccl")]
    pub use crate::transport::rdma::load_library as load_verbs;
    pub use crate::transport::tcp;
    pub use crate::transport::tcp::{auth, stream};
}

use nuvec_core::distributed::Group;

/// The guide (`docs/guide.md`): its Rust code blocks are compiled and run as doctests, so
/// what it shows is the API as it is (blocks that are not Rust carry their language's fence).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct Guide;

/// Initialises the first backend whose launch environment is set and makes its group the
/// default: [`init_backend`]`(strict, Backend::Any)`, as `mx.distributed.init(strict)`.
pub fn init(strict: bool) -> nuvec_core::Result<Group> {
    init_backend(strict, Backend::Any)
}

/// Initialises `backend` from MLX's launch environment and makes its group the default, as
/// `mx.distributed.init(strict, backend)`.
///
/// A backend initialised before returns its group (`Any`: the first group initialised). The
/// ring reads `MLX_HOSTFILE` (the path of the JSON hostfile) and `MLX_RANK`;
/// `MLX_RING_VERBOSE` prints connection setup; `NUVEC_DISTRIBUTED_TIMEOUT` (seconds) sets
/// [`Options::timeout`]. Without the environment: an error naming the missing variables if
/// `strict`, else the group of this process alone.
pub fn init_backend(strict: bool, backend: Backend) -> nuvec_core::Result<Group> {
    Ok(backend::init_from(
        &config::env::Env::process(),
        strict,
        backend,
    )?)
}

/// Connects rank `rank` of the ring over `nodes` (per rank its `host:port` addresses) and
/// returns its group, not made the default; one node is the group of this process alone.
/// See [`connect_ring`] for a handle that can also report the group's failure.
pub fn init_with(
    nodes: &[Vec<String>],
    rank: usize,
    options: &Options,
) -> nuvec_core::Result<Group> {
    Ok(connect_ring(nodes, rank, options)?.group())
}
