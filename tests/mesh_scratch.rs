//! The JACCL mesh all-reduce's scratch is bounded: at most R·n bytes for an n-byte buffer.
//!
//! A counting global allocator wraps the system's and tracks the bytes live and the most live
//! at once. A 2-rank mesh (which always takes the fold path) runs one rank of each kind over
//! a fabric of this file that answers every receive with zeros at once and drops every send,
//! so that nothing but the algorithm and its scratch allocates; the growth of the peak over
//! the bytes live before the operation is its scratch (and a few small step records).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::fabric::{ChannelKind, Fabric, FabricError, Transfer};
use nuvec_distributed::jaccl::{FrameRule, JacclCommunicator};
use nuvec_distributed::reduce::Reduction;

/// The system allocator, tracking the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let live = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(n: usize) {
    LIVE.fetch_sub(n, Ordering::Relaxed);
}

// SAFETY: every method forwards its arguments unchanged to `System`, which implements
// `GlobalAlloc` correctly; the only other thing done is updating two atomics, which neither
// allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller upholds `alloc`'s contract for `layout`; we pass it on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size);
        shrank(layout.size());
        // SAFETY: the caller guarantees `ptr` came from this allocator (that is, from
        // `System`, to which every allocation is forwarded) with `layout`, and that
        // `new_size` is valid for it.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size());
        // SAFETY: the caller guarantees `ptr` came from this allocator (from `System`) with
        // `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Rank `rank` of 2 whose peer answers every receive with zeros at once.
struct Zeros {
    rank: usize,
}

/// What a zero-answering peer delivers at a time (a multiple of every element size).
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

impl Fabric for Zeros {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        2
    }

    fn kind(&self) -> ChannelKind {
        ChannelKind::Stream
    }

    fn links(&self, peer: usize) -> usize {
        usize::from(peer != self.rank && peer < 2)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }

    fn run(&mut self, step: &mut [Transfer<'_>], _deadline: Duration) -> Result<(), FabricError> {
        for t in step.iter_mut() {
            if let Transfer::Recv { landing, .. } = t {
                let (len, grain) = (landing.len(), landing.grain());
                let piece = ZEROS.len() - ZEROS.len() % grain;
                let mut at = 0;
                while at < len {
                    let n = piece.min(len - at);
                    landing.deliver(at, &ZEROS[..n]);
                    at += n;
                }
            }
        }
        Ok(())
    }
}

#[test]
fn a_two_rank_mesh_all_reduce_takes_at_most_two_buffers_of_scratch() {
    const N: usize = 16 << 20;
    for rank in 0..2 {
        let comm =
            JacclCommunicator::mesh(Zeros { rank }, FrameRule::Small, Duration::from_secs(5));
        let data: Vec<u8> = (0..N / 4)
            .flat_map(|i| ((i % 1000) as f32 + 1.0).to_le_bytes())
            .collect();
        let mut buf = data.clone();
        for round in 0..2 {
            let before = LIVE.load(Ordering::Relaxed);
            PEAK.store(before, Ordering::Relaxed);
            comm.try_all_reduce(Reduction::Sum, DType::F32, &mut buf)
                .expect("all_sum");
            let scratch = PEAK.load(Ordering::Relaxed) - before;
            // The bound the docs state: R·n on rank 0, (R−1)·n on the others, with 1/16 of
            // the buffer's slack for the step's frames and records.
            let bound = if rank == 0 { 2 * N } else { N } + N / 16;
            assert!(
                scratch <= bound,
                "rank {rank}, round {round}: {scratch} bytes of scratch for a buffer of {N} \
                 ({:.2} buffers; the bound is {:.2})",
                scratch as f64 / N as f64,
                bound as f64 / N as f64
            );
            assert!(buf == data, "rank {rank}: x + 0 must be x");
        }
    }
}
