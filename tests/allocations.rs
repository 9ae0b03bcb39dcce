//! In steady state the ring's own code allocates nothing per operation.
//!
//! A counting global allocator wraps the system's and counts, per thread, every allocation
//! (`alloc`, `alloc_zeroed`, `realloc`). Two ranks of a ring over loopback TCP run as threads
//! of this process; each warms up, then counts what its own thread allocates during a run of
//! identical operations. The TCP fabric has no I/O threads (every byte moves on the calling
//! thread), so the calling thread's count is the ring's whole count. Every buffer the
//! operations use is made before counting starts.

mod common;

use common::ports;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Options, RingCommunicator, connect_ring};

/// The system allocator, counting the allocations of each thread.
struct Counting;

thread_local! {
    /// Allocations made by this thread so far (a `const` thread-local without a destructor:
    /// reading or bumping it never allocates).
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// Counts one allocation of this thread.
fn bump() {
    // `try_with`: a thread being torn down may still allocate after its locals are gone.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

/// The number of allocations this thread has made.
fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every method forwards its arguments unchanged to `System`, which implements
// `GlobalAlloc` correctly; the only other thing done is bumping a thread-local counter, which
// neither allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: the caller upholds `alloc`'s contract for `layout`; we pass it on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: the caller guarantees `ptr` came from this allocator (that is, from
        // `System`, to which every allocation is forwarded) with `layout`, and that
        // `new_size` is valid for it.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller guarantees `ptr` came from this allocator (from `System`) with
        // `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Operations of each kind counted, after as many to warm up.
const OPS: usize = 20;

/// One kind of operation, run identically by both ranks.
type Operation<'a> = Box<dyn FnMut(&RingCommunicator<nuvec_distributed::TcpFabric>) + 'a>;

/// Per kind of operation, its name and the allocations the thread made during [`OPS`] of them.
fn count(
    comm: &RingCommunicator<nuvec_distributed::TcpFabric>,
    megabytes: usize,
) -> Vec<(String, usize)> {
    let rank = comm.topology().rank();
    let peer = 1 - rank;
    let big = megabytes << 20;
    let mut reduce = vec![0u8; big];
    let mut tiny = vec![0u8; 4]; // one f32 element on two ranks: MLX's E < R path
    let gather_in = vec![rank as u8; big / 2];
    let mut gather_out = vec![0u8; big];
    let mut p2p = vec![0u8; 64 << 10];
    let mut kinds: Vec<(String, Operation<'_>)> = vec![
        (
            format!("all_sum of {megabytes} MiB float32"),
            Box::new(|c| {
                c.try_all_reduce(Reduction::Sum, DType::F32, &mut reduce)
                    .expect("all_sum")
            }),
        ),
        (
            "all_sum of 1 float32 (E < R)".into(),
            Box::new(|c| {
                c.try_all_reduce(Reduction::Sum, DType::F32, &mut tiny)
                    .expect("small all_sum")
            }),
        ),
        (
            format!("all_gather of {megabytes} MiB"),
            Box::new(|c| {
                c.try_all_gather(&gather_in, &mut gather_out)
                    .expect("all_gather")
            }),
        ),
        (
            "send/recv of 64 KiB".into(),
            Box::new(move |c| {
                if rank == 0 {
                    c.try_send(peer, &p2p).expect("send");
                    c.try_recv(peer, &mut p2p).expect("recv");
                } else {
                    c.try_recv(peer, &mut p2p).expect("recv");
                    c.try_send(peer, &p2p).expect("send");
                }
            }),
        ),
    ];
    let mut counts = Vec::with_capacity(kinds.len());
    for (name, op) in &mut kinds {
        for _ in 0..OPS {
            op(comm);
        }
        let before = allocations();
        for _ in 0..OPS {
            op(comm);
        }
        counts.push((std::mem::take(name), allocations() - before));
    }
    counts
}

#[test]
fn steady_state_operations_allocate_nothing() {
    // One connection per neighbour (two sub-reduces), and two (four sub-reduces: the most
    // transfers per step at this size).
    let mut allocating: Vec<String> = Vec::new();
    for (conns, megabytes) in [(1, 1), (2, 4)] {
        let nodes = ports::free_nodes(2, conns);
        let options = Options::default().timeout(Duration::from_secs(30));
        let per_rank: Vec<Vec<(String, usize)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|rank| {
                    let (nodes, options) = (&nodes, &options);
                    s.spawn(move || {
                        let group = connect_ring(nodes, rank, options).expect("connect");
                        let counts = count(group.communicator().expect("a ring"), megabytes);
                        group.close();
                        counts
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank thread"))
                .collect()
        });
        for (rank, counts) in per_rank.iter().enumerate() {
            for (name, n) in counts.iter().filter(|(_, n)| *n > 0) {
                allocating.push(format!(
                    "rank {rank}, {conns} connection(s): {name}: {n} allocations in {OPS} operations"
                ));
            }
        }
    }
    assert!(
        allocating.is_empty(),
        "the ring allocates in steady state:\n{}",
        allocating.join("\n")
    );
}
