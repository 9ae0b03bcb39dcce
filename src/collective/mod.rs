//! What both backends' communicators share, above the fabric and below the algorithms: the
//! communicator [`core`] (lock, deadline, sequence numbers, sticky failure, diagnosis), the
//! reports of operations that wait long ([`patience`]), the flight recorder ([`record`]), the
//! argument [`checks`] and the `Communicator` forwarders of both communicators, and the
//! element-wise [`reduce`]tions of every dtype MLX reduces.

pub(crate) mod checks;
pub(crate) mod core;
pub(crate) mod patience;
pub(crate) mod record;
pub mod reduce;
pub(crate) mod split;
