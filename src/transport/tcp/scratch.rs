//! Where a link reads received bytes that do not go straight to their place, and when bytes
//! should not go straight to their place.
//!
//! The kernel copies received bytes out of its socket buffers with the CPU's string-move
//! instruction, and on some x86 cores (measured on AMD EPYC, Linux, loopback) that copy runs at
//! half speed or worse when the destination starts within the first cache line of a page: the
//! socket buffer's pages are filled from their start, so destination and source then alias
//! within a page (4K aliasing) for the whole transfer. A large heap buffer starts 16 bytes into
//! a page (the allocator's header), so this is the common case, not a corner.
//!
//! So the scratch starts one cache line past a page boundary, and a receive whose destination
//! starts in a page's first cache line ([`aliases`]) is read through the scratch in pieces of
//! [`BOUNCE`] bytes and copied into place by the CPU, whose user-space copy does not have the
//! problem. Measured with `benches/allreduce/` on a 2-core EPYC VM (float32 all_sum, p50,
//! user buffer 16 bytes into a page), the extra copy more than pays for itself: 2 ranks, 1 MiB
//! 550–700 µs → 340–450 µs and 4 MiB 2.8–3.1 ms → 1.6–2.0 ms; 4 ranks, 1 MiB 2.6–2.7 ms →
//! 1.2–1.8 ms and 16 MiB 35–42 ms → 25–31 ms, about what a buffer at a good offset reaches.
//! Moving the scratch itself off the page's first cache line (it had the allocator's 16-byte
//! offset) cut 1 MiB with 2 ranks from 540–580 µs of CPU to 340–350 µs. On cores without the
//! effect, the only cost is the bounce's copy, in L2-sized pieces.

/// A page, the unit the kernel's socket buffers are filled in.
pub(super) const PAGE: usize = 4096;

/// A cache line: the scratch starts this far past a page boundary, and destinations that start
/// closer than this to a page boundary are read through the scratch.
pub(super) const LINE: usize = 64;

/// The largest piece a bounced receive reads at a time: small enough to stay in L2 between
/// the kernel's copy into the scratch and the copy into place.
pub(super) const BOUNCE: usize = 64 * 1024;

/// Whether the kernel's copy into a destination starting at `at` is the slow, aliasing one:
/// `at` lies in the first cache line of a page.
pub(super) fn aliases(at: *const u8) -> bool {
    (at as usize) % PAGE < LINE
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
mod tests {
    use super::*;

    #[test]
    fn the_scratch_starts_one_line_past_a_page_boundary_whatever_its_size() {
        let mut s = Scratch::default();
        for len in [1, 15, 4095, 4096, 4097, 100_000, 256 * 1024] {
            s.reserve(len);
            assert!(s.bytes().len() >= len);
            assert_eq!(s.bytes().as_ptr() as usize % PAGE, LINE, "len {len}");
            assert!(!aliases(s.bytes().as_ptr()));
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
    fn only_destinations_in_the_first_line_of_a_page_alias() {
        let page = vec![0u8; 3 * PAGE];
        let base = page.as_ptr().align_offset(PAGE);
        for offset in [0, 1, 16, 63] {
            assert!(aliases(page[base + offset..].as_ptr()), "offset {offset}");
        }
        for offset in [64, 65, 128, 2048, PAGE - 1] {
            assert!(!aliases(page[base + offset..].as_ptr()), "offset {offset}");
        }
        assert!(aliases(page[base + PAGE + 16..].as_ptr()));
    }
}
