//! What both backends' communicators share, above the fabric and below the algorithms: the
//! communicator [`core`] (lock, deadline, sequence numbers, sticky failure, diagnosis) and the
//! element-wise [`reduce`]tions of every dtype MLX reduces.

pub(crate) mod core;
pub mod reduce;
