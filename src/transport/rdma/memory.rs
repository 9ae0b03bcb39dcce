//! Page-aligned memory for registered frames.

use std::ptr::NonNull;

/// The alignment of frames: a multiple of the page size of every system this runs on (4 KiB
/// on x86-64 Linux, 16 KiB on Apple silicon), as MLX's page-aligned buffers.
pub(crate) const FRAME_ALIGN: usize = 16 << 10;

/// A page-aligned, zeroed block of memory, freed on drop.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

impl Region {
    /// `len` (non-zero) bytes aligned to [`FRAME_ALIGN`]; `None` when out of memory.
    pub(crate) fn new(len: usize) -> Option<Region> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), FRAME_ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| Region { ptr, layout })
    }

    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes, while no work request is using them.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised (zeroed, then written) bytes owned by this
        // region; the fabric only reads a frame while no posted receive targets it, so the
        // device does not write it during the borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    /// The bytes, mutably, while no work request is using them.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes the borrow unique; the fabric only
        // writes a send frame that is not in flight, so the device does not read it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated by `alloc_zeroed` with `layout` and is freed only here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_aligned_to_the_largest_page_size() {
        let region = Region::new(512 << 10).unwrap();
        assert_eq!(region.as_ptr() as usize % FRAME_ALIGN, 0);
        assert_eq!(region.len(), 512 << 10);
        assert!(region.bytes().iter().all(|b| *b == 0));
    }
}
