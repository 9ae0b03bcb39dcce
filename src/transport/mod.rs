//! Transports: the code that moves a fabric's bytes over a real medium, below the collective
//! algorithms and above the operating system's interfaces. A transport uses only the
//! [`fabric`](crate::fabric) trait and the crate's [`Error`](crate::Error); it knows nothing of
//! JACCL's or the ring's configuration, which the backends translate into its terms.
//!
//! - [`tcp`]: MLX's ring sockets as a stream fabric ([`TcpFabric`](tcp::TcpFabric)), the
//!   connection setup with its optional authentication ([`tcp::auth`]), and the reassembly of
//!   received bytes ([`tcp::stream`]);
//! - [`rdma`] (feature `jaccl`): UC queue pairs through the verbs library, loaded at run time;
//! - `wait`: when a step that cannot progress looks again and when it parks, for both.
//!
//! A transport may also use the crate's configuration (addresses, the key, the log), never a
//! layer above it: JACCL's TCP cables and RDMA bring-up, which need JACCL's configuration and
//! side channel, are `crate::jaccl`'s.

#[cfg(feature = "jaccl")]
pub(crate) mod rdma;
pub mod tcp;
pub(crate) mod wait;
