//! Where a link reads received bytes that do not go straight to their place, and when bytes
//! should not go straight to their place.
//!
//! The kernel copies received bytes out of its socket buffers with the CPU's string-move
//! instruction, and on AMD's cores (measured on EPYC, Linux, loopback) that copy runs at half
//! speed or worse when the destination starts within the first cache line of a page: the
//! socket buffer's pages are filled from their start, so destination and source then alias
//! within a page (4K aliasing) for the whole transfer. A large heap buffer starts 16 bytes into
//! a page (the allocator's header), so this is the common case, not a corner.
//!
//! So the scratch starts one cache line past a page boundary, and on such a core a receive
//! whose destination starts in a page's first cache line ([`aliases`]) is read through the
//! scratch in pieces of [`BOUNCE`] bytes and copied into place by the CPU, whose user-space copy
//! does not have the problem. Measured with `benches/allreduce/` on a 2-core EPYC VM (float32
//! all_sum, p50, user buffer 16 bytes into a page), the extra copy more than pays for itself:
//! 2 ranks, 1 MiB 550–700 µs → 340–450 µs and 4 MiB 2.8–3.1 ms → 1.6–2.0 ms; 4 ranks, 1 MiB
//! 2.6–2.7 ms → 1.2–1.8 ms and 16 MiB 35–42 ms → 25–31 ms, about what a buffer at a good offset
//! reaches. Moving the scratch itself off the page's first cache line (it had the allocator's
//! 16-byte offset) cut 1 MiB with 2 ranks from 540–580 µs of CPU to 340–350 µs.
//!
//! Other cores do not have the effect, and there the bounce is only a second copy of every
//! byte: on a 2-core Intel Xeon VM (Linux, loopback, 2 GiB read in 256 KiB calls) the kernel's
//! copy ran at 6.6–7.2 GB/s into a destination 16 bytes into a page and 5.9–7.5 GB/s at 64, 128
//! and 2048, and a 16 MiB all_sum on 2 ranks over loopback TCP took 6.3–6.7 ms of CPU per
//! operation and rank reading in place against 7.2 bounced. So only AMD's cores bounce
//! ([`slow_aliased_copy`]); Apple's, where the crate's users mostly run, read in place.

/// A page, the unit the kernel's socket buffers are filled in.
pub(super) const PAGE: usize = 4096;

/// A cache line: the scratch starts this far past a page boundary, and destinations that start
/// closer than this to a page boundary are read through the scratch.
pub(super) const LINE: usize = 64;

/// The largest piece a bounced receive reads at a time: small enough to stay in L2 between
/// the kernel's copy into the scratch and the copy into place.
pub(super) const BOUNCE: usize = 64 * 1024;

/// The most a receive into place reads in one call, alone or sharing the read: as much as a
/// bounced one, so that the kernel's copy holds the socket for as long whether or not it
/// bounces.
pub(super) const PIECE: usize = BOUNCE;

/// Whether the kernel's copy into a destination starting at `at` is the slow, aliasing one:
/// this CPU's copy slows on aliasing ([`slow_aliased_copy`]) and `at` lies in the first cache
/// line of a page.
pub(super) fn aliases(at: *const u8) -> bool {
    in_first_line(at) && slow_aliased_copy()
}

/// Whether `at` lies in the first cache line of a page.
fn in_first_line(at: *const u8) -> bool {
    (at as usize) % PAGE < LINE
}

/// Whether this CPU's string-move copy slows when its destination aliases its source within a
/// page: AMD's cores (and Hygon's, built on them), where it was measured; not Intel's, where it
/// was measured not to (the module's docs), nor any other architecture's. Asked of the CPU
/// once per process.
pub(super) fn slow_aliased_copy() -> bool {
    #[cfg(test)]
    if let Some(forced) = tests::FORCED.get() {
        return forced;
    }
    static SLOW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SLOW.get_or_init(zen)
}

/// Whether the CPU is AMD's or Hygon's, by its vendor string.
#[cfg(target_arch = "x86_64")]
fn zen() -> bool {
    let id = std::arch::x86_64::__cpuid(0);
    let vendor = [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes).concat();
    vendor == b"AuthenticAMD" || vendor == b"HygonGenuine"
}

/// No CPU of another architecture is known to have the effect.
#[cfg(not(target_arch = "x86_64"))]
fn zen() -> bool {
    false
}

/// A growable byte buffer whose usable part starts one cache line past a page boundary.
#[derive(Default)]
pub(super) struct Scratch {
    /// The allocation, up to `PAGE + LINE - 1` bytes longer than the usable part.
    buf: Vec<u8>,
    /// Where the usable part starts in `buf`.
    start: usize,
    /// The usable length.
    len: usize,
}

impl Scratch {
    /// Makes the usable part at least `len` bytes long, keeping its contents. Allocates only
    /// when it grows, so a link reuses its scratch from one operation to the next.
    pub(super) fn reserve(&mut self, len: usize) {
        if len <= self.len {
            return;
        }
        let mut buf = vec![0u8; len + PAGE + LINE - 1];
        // `align_offset` may decline (usize::MAX); the offset is only a matter of speed here.
        let start = buf.as_ptr().align_offset(PAGE).min(PAGE - 1) + LINE;
        buf[start..start + self.len].copy_from_slice(&self.buf[self.start..self.start + self.len]);
        *self = Self { buf, start, len };
    }

    /// The usable part.
    pub(super) fn bytes(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        /// What [`slow_aliased_copy`] answers on this thread, when set: so that both ways of
        /// receiving are tested on any CPU.
        pub(in super::super) static FORCED: Cell<Option<bool>> = const { Cell::new(None) };
    }

    /// Runs `f` with [`slow_aliased_copy`] answering `slow` on this thread.
    pub(in super::super) fn with_slow_aliased_copy<T>(slow: bool, f: impl FnOnce() -> T) -> T {
        FORCED.set(Some(slow));
        let out = f();
        FORCED.set(None);
        out
    }

    #[test]
    fn the_cpu_is_asked_once_and_answers_the_same() {
        assert_eq!(slow_aliased_copy(), slow_aliased_copy());
        assert_eq!(slow_aliased_copy(), zen());
    }

    #[test]
    fn a_destination_aliases_only_where_the_copy_is_slow() {
        let page = vec![0u8; 2 * PAGE];
        let at = page[page.as_ptr().align_offset(PAGE) + 16..].as_ptr();
        assert!(with_slow_aliased_copy(true, || aliases(at)));
        assert!(!with_slow_aliased_copy(false, || aliases(at)));
    }

    #[test]
    fn the_scratch_starts_one_line_past_a_page_boundary_whatever_its_size() {
        let mut s = Scratch::default();
        for len in [1, 15, 4095, 4096, 4097, 100_000, 256 * 1024] {
            s.reserve(len);
            assert!(s.bytes().len() >= len);
            assert_eq!(s.bytes().as_ptr() as usize % PAGE, LINE, "len {len}");
            assert!(!in_first_line(s.bytes().as_ptr()));
        }
    }

    #[test]
    fn growing_keeps_the_bytes_and_not_growing_keeps_the_allocation() {
        let mut s = Scratch::default();
        s.reserve(3);
        s.bytes().copy_from_slice(&[1, 2, 3]);
        s.reserve(10_000);
        assert_eq!(&s.bytes()[..3], &[1, 2, 3]);
        let at = s.bytes().as_ptr();
        s.reserve(5_000);
        assert_eq!(s.bytes().len(), 10_000);
        assert_eq!(s.bytes().as_ptr(), at);
    }

    #[test]
    fn only_destinations_in_the_first_line_of_a_page_can_alias() {
        let page = vec![0u8; 3 * PAGE];
        let base = page.as_ptr().align_offset(PAGE);
        for offset in [0, 1, 16, 63] {
            assert!(
                in_first_line(page[base + offset..].as_ptr()),
                "offset {offset}"
            );
        }
        for offset in [64, 65, 128, 2048, PAGE - 1] {
            assert!(
                !in_first_line(page[base + offset..].as_ptr()),
                "offset {offset}"
            );
        }
        assert!(in_first_line(page[base + PAGE + 16..].as_ptr()));
    }
}
