//! Two limits every socket call of this crate keeps: a deadline never overflows, and no call
//! asks for more than [`MAX_IO`] bytes.
//!
//! - **Deadlines.** `Instant::now() + timeout` panics when the sum does not fit an `Instant`
//!   (`Options::timeout(Duration::MAX)`, the natural "no timeout", or a huge
//!   `NUVEC_DISTRIBUTED_TIMEOUT`). [`deadline`] saturates instead: a timeout too large to
//!   represent becomes the farthest instant that is (billions of years away).
//! - **Socket lengths.** macOS's `send`, `recv`, `read` and `write` fail with `EINVAL` when
//!   asked for more than `INT_MAX` bytes, and Rust's standard library does not split socket
//!   calls there (MLX hit this, #4280, and clamps each call to 1 GiB since its #4281). Linux
//!   returns a short count instead, so nothing on Linux would notice. Every read and write of
//!   a socket in this crate (the ring's TCP fabric, JACCL over TCP, the side channel, the
//!   authentication and hello exchanges) goes through [`read`] and [`write`] here, which ask
//!   for at most [`MAX_IO`] bytes per call; a caller loops as it does for any short count.

use std::time::{Duration, Instant};

/// The instant `timeout` after `from`, or the farthest representable instant when that
/// overflows.
pub(crate) fn deadline(from: Instant, timeout: Duration) -> Instant {
    let mut wait = timeout;
    loop {
        if let Some(at) = from.checked_add(wait) {
            return at;
        }
        // Halving converges on a representable instant (`from + 0` always is).
        wait /= 2;
    }
}

/// The instant `timeout` from now, saturating (see [`deadline`]).
pub(crate) fn deadline_in(timeout: Duration) -> Instant {
    deadline(Instant::now(), timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_saturates_instead_of_overflowing() {
        let now = Instant::now();
        assert_eq!(
            deadline(now, Duration::from_secs(3)),
            now + Duration::from_secs(3)
        );
        let far = deadline(now, Duration::MAX);
        assert!(far > now + Duration::from_secs(1 << 40), "{:?}", far - now);
        let far = deadline(now, Duration::from_secs_f64(9.3e18));
        assert!(far > now + Duration::from_secs(1 << 40), "{:?}", far - now);
    }
}
