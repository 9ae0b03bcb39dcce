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

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

/// The most bytes one socket call asks for: 1 GiB, as MLX (below macOS's `INT_MAX` limit).
pub(crate) const MAX_IO: usize = 1 << 30;

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

/// `len` clamped to [`MAX_IO`]: the length one socket call may ask for.
pub(crate) fn clamp(len: usize) -> usize {
    let n = len.min(MAX_IO);
    #[cfg(test)]
    record(n);
    n
}

/// One read of at most [`MAX_IO`] bytes into the front of `buf`.
pub(crate) fn read(mut from: impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let n = clamp(buf.len());
    from.read(&mut buf[..n])
}

/// One write of at most [`MAX_IO`] bytes from the front of `buf`.
pub(crate) fn write(mut to: impl Write, buf: &[u8]) -> io::Result<usize> {
    let n = clamp(buf.len());
    to.write(&buf[..n])
}

/// Writes all of `buf` with [`write`], retrying interrupted calls.
pub(crate) fn write_all(mut to: impl Write, buf: &[u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match write(&mut to, &buf[done..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// The largest length this thread's socket calls asked for since [`take_largest`].
    static LARGEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Notes that a socket call of this thread asks for `n` bytes.
#[cfg(test)]
fn record(n: usize) {
    LARGEST.with(|l| l.set(l.get().max(n)));
}

/// The largest length a socket call of this thread asked for since the last call, resetting it.
#[cfg(test)]
pub(crate) fn take_largest() -> usize {
    LARGEST.with(|l| l.replace(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_lengths_are_clamped_to_one_gibibyte() {
        assert_eq!(clamp(0), 0);
        assert_eq!(clamp(12), 12);
        assert_eq!(clamp(MAX_IO), MAX_IO);
        assert_eq!(clamp(MAX_IO + 1), MAX_IO);
        assert_eq!(clamp(usize::MAX), MAX_IO);
        assert!(
            MAX_IO <= i32::MAX as usize,
            "macOS rejects lengths above INT_MAX"
        );
    }

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
