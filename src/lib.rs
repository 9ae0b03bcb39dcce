//! Distributed backends for nuvec (crate docs are written in full with the public API).

pub mod comm;
pub mod error;
pub mod fabric;
pub mod reduce;
pub mod ring;

pub use comm::RingCommunicator;
pub use error::Error;
