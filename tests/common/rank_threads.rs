//! A job's ranks as threads of this process: one scoped thread per rank, so that a rank's
//! body may borrow the test's addresses and options, and the results back in rank order.

/// Runs `body(rank)` for every rank of `ranks` on a thread of its own and returns what each
/// returned, in rank order; a rank that panics panics the caller (`rank thread`) once every
/// rank has ended.
pub fn run<T: Send>(ranks: usize, body: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let body = &body;
                s.spawn(move || body(rank))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}
