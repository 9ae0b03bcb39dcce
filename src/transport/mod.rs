//! Transports: the code that moves a fabric's bytes over a real medium, below the collective
//! algorithms and above the operating system's interfaces. A transport uses only the
//! [`fabric`](crate::fabric) trait and the crate's [`Error`](crate::Error); it knows nothing of
//! JACCL's or the ring's configuration, which the backends translate into its terms.
//!
//! - [`rdma`] (feature `jaccl`): UC queue pairs through the verbs library, loaded at run time.
//!
//! The TCP transport (`crate::tcp`) and JACCL's TCP cables move here with the layout step of
//! the architecture plan.

#[cfg(feature = "jaccl")]
pub(crate) mod rdma;
