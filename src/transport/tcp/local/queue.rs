//! One direction of a local link: a byte queue in memory both ranks map, with one writer and
//! one reader, and the flags that tell the other side to ring the doorbell.
//!
//! The queue is a ring of `capacity` bytes with two counters that only grow: `tail`, the bytes
//! written so far (stored by the writer), and `head`, the bytes read so far (stored by the
//! reader); byte `i` of the stream lives at `i % capacity`. The writer copies into the free
//! part and then publishes `tail` (release), the reader copies out of the filled part and then
//! publishes `head`, so each side only ever touches bytes the other has handed over.
//!
//! **Parking without losing a wake-up.** A side that cannot move (the reader finds the queue
//! empty, the writer finds it full) and is about to park sets its `waiting` flag and looks at
//! the other counter again; the other side, after it publishes its counter, takes the flag and,
//! if it was set, rings the doorbell (one byte on the link's TCP connection, which the parked
//! side polls). Both the publishing and the second look are read-modify-writes of the counter
//! (a swap, an add of 0), so one of them comes first in the counter's order: if the look does,
//! the publish reads from it, and the flag set before the look is seen after the publish (the
//! publisher rings); if the publish does, the look sees the new count (the side does not park).
//! Plain stores and loads would need sequential consistency to rule out both missing each
//! other (the store-buffer pattern), which the loom model below caught: loom runs sequentially
//! consistent accesses as acquire/release ones, and with loads the model deadlocked. The model
//! (`loom` below, under `--cfg loom`) is in this file because the queue is private.
//!
//! **A peer is not trusted with memory safety.** The counters come from another process, and
//! every offset used to index is computed from this side's own counter (reduced modulo the
//! capacity), never from the peer's. What is checked, at each look at the peer's counter, and
//! reported as [`Corrupt`]: that it does not say more is filled than the queue holds, nor
//! less than nothing (a `tail` below the reader's `head`, a `head` above the writer's
//! `tail`), and that it is not below the value this side last saw of it (it went back). What
//! is not caught: a counter that moves forward by a plausible amount without the bytes behind
//! it (the reader then copies whatever the queue holds, which changes only what is received),
//! flags set or cleared at random (a spurious ring, or a missed one and a step that times
//! out), and bytes written in the reader's part.

use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A counter or flag alone in its cache line, so the writer's and the reader's stores do not
/// contend for one line.
#[repr(C, align(64))]
pub(crate) struct Line<T>(pub(crate) T);

/// The shared state of one queue; the bytes follow it in the mapping.
#[repr(C)]
pub(crate) struct Header {
    /// Bytes written so far (the writer's).
    pub(crate) tail: Line<AtomicU64>,
    /// Bytes read so far (the reader's).
    pub(crate) head: Line<AtomicU64>,
    /// Set by the reader before it parks on an empty queue.
    pub(crate) reader_waiting: Line<AtomicU32>,
    /// Set by the writer before it parks on a full queue.
    pub(crate) writer_waiting: Line<AtomicU32>,
}

impl Header {
    /// A header of an empty queue (the mapping's pages start zeroed, which is the same).
    #[cfg(any(test, loom))]
    pub(crate) fn new() -> Self {
        Self {
            tail: Line(AtomicU64::new(0)),
            head: Line(AtomicU64::new(0)),
            reader_waiting: Line(AtomicU32::new(0)),
            writer_waiting: Line(AtomicU32::new(0)),
        }
    }
}

/// The peer broke the queue's invariants (see the [module documentation](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Corrupt {
    /// The counters say `filled` bytes are in a queue of `capacity` (a count below zero
    /// wraps around to a huge one).
    Overfull {
        /// What the counters say the queue holds.
        filled: u64,
        /// What it can hold.
        capacity: u64,
    },
    /// The peer's counter `counter` is `now`, below the `seen` this side read of it before.
    WentBack {
        /// Which counter: `tail` or `head`.
        counter: &'static str,
        /// What this side read of it before.
        seen: u64,
        /// What it reads now.
        now: u64,
    },
}

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Corrupt::Overfull { filled, capacity } => write!(
                f,
                "the peer's shared-memory queue is corrupt: its counters say {filled} bytes \
                 are queued in a queue of {capacity}"
            ),
            Corrupt::WentBack { counter, seen, now } => write!(
                f,
                "the peer's shared-memory queue is corrupt: its counter {counter} went back \
                 from {seen} to {now}"
            ),
        }
    }
}

/// Bytes filled in a queue of `capacity` whose counters are `tail` and `head`, checked.
fn filled(tail: u64, head: u64, capacity: usize) -> Result<usize, Corrupt> {
    let filled = tail.wrapping_sub(head);
    if filled > capacity as u64 {
        return Err(Corrupt::Overfull {
            filled,
            capacity: capacity as u64,
        });
    }
    Ok(filled as usize)
}

/// The peer's `counter`, read as `now`, checked against the `seen` read of it before: an
/// honest peer's counter only grows, and reads of one atomic never see its stores out of
/// order.
fn not_back(counter: &'static str, seen: u64, now: u64) -> Result<u64, Corrupt> {
    if now < seen {
        return Err(Corrupt::WentBack { counter, seen, now });
    }
    Ok(now)
}

/// The (at most two) ranges of a ring of `capacity` bytes that hold `len` bytes of the stream
/// from stream offset `at`: the second is empty unless the bytes wrap around.
pub(crate) fn pieces(
    at: u64,
    len: usize,
    capacity: usize,
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let start = (at % capacity as u64) as usize;
    let first = len.min(capacity - start);
    (start..start + first, 0..len - first)
}

/// The writer's end of a queue.
pub(crate) struct Writer {
    capacity: usize,
    /// Bytes written so far: the writer's own copy of `tail`, which only it stores.
    tail: u64,
    /// The reader's `head` as last read by [`room`](Self::room).
    head: u64,
}

impl Writer {
    /// The writer of a queue of `capacity` bytes, with nothing written yet. Each call takes
    /// the queue's shared [`Header`].
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            tail: 0,
            head: 0,
        }
    }

    /// Where the next `want` bytes may go: stream offset and length (maybe 0: the queue is
    /// full).
    pub(crate) fn room(&mut self, header: &Header, want: usize) -> Result<(u64, usize), Corrupt> {
        let head = not_back("head", self.head, header.head.0.load(Ordering::Acquire))?;
        let free = self.capacity - filled(self.tail, head, self.capacity)?;
        self.head = head;
        Ok((self.tail, want.min(free)))
    }

    /// Publishes `n` more bytes copied in at [`room`](Self::room)'s offset; whether the reader
    /// parked and must be woken (the doorbell).
    pub(crate) fn commit(&mut self, header: &Header, n: usize) -> bool {
        self.tail += n as u64;
        header.tail.0.swap(self.tail, Ordering::SeqCst);
        take(&header.reader_waiting.0)
    }

    /// Before parking on a full queue: asks the reader to ring when it frees room; whether
    /// there is room already (then do not park).
    pub(crate) fn arm(&self, header: &Header) -> Result<bool, Corrupt> {
        header.writer_waiting.0.store(1, Ordering::SeqCst);
        let head = not_back(
            "head",
            self.head,
            header.head.0.fetch_add(0, Ordering::SeqCst),
        )?;
        Ok(filled(self.tail, head, self.capacity)? < self.capacity)
    }
}

/// The reader's end of a queue.
pub(crate) struct Reader {
    capacity: usize,
    /// Bytes read so far: the reader's own copy of `head`.
    head: u64,
    /// The writer's `tail` as last read by [`filled`](Self::filled).
    tail: u64,
}

impl Reader {
    /// The reader of a queue of `capacity` bytes, with nothing read yet. Each call takes the
    /// queue's shared [`Header`].
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            head: 0,
            tail: 0,
        }
    }

    /// What can be read now, at most `want` bytes: stream offset and length (maybe 0).
    pub(crate) fn filled(&mut self, header: &Header, want: usize) -> Result<(u64, usize), Corrupt> {
        let tail = not_back("tail", self.tail, header.tail.0.load(Ordering::Acquire))?;
        let n = filled(tail, self.head, self.capacity)?;
        self.tail = tail;
        Ok((self.head, want.min(n)))
    }

    /// Hands `n` bytes read at [`filled`](Self::filled)'s offset back to the writer; whether
    /// it parked and must be woken.
    pub(crate) fn release(&mut self, header: &Header, n: usize) -> bool {
        self.head += n as u64;
        header.head.0.swap(self.head, Ordering::SeqCst);
        take(&header.writer_waiting.0)
    }

    /// Before parking on an empty queue: asks the writer to ring when it writes; whether there
    /// are bytes already (then do not park).
    pub(crate) fn arm(&self, header: &Header) -> Result<bool, Corrupt> {
        header.reader_waiting.0.store(1, Ordering::SeqCst);
        let tail = not_back(
            "tail",
            self.tail,
            header.tail.0.fetch_add(0, Ordering::SeqCst),
        )?;
        Ok(filled(tail, self.head, self.capacity)? > 0)
    }
}

/// Clears a waiting flag; whether it was set. The common case (nobody parked) is one load.
fn take(flag: &AtomicU32) -> bool {
    flag.load(Ordering::SeqCst) != 0 && flag.swap(0, Ordering::SeqCst) != 0
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bytes_that_wrap_around_the_ring_come_in_two_pieces() {
        assert_eq!(pieces(6, 4, 8), (6..8, 0..2));
        assert_eq!(pieces(8, 4, 8), (0..4, 0..0));
        assert_eq!(pieces(13, 3, 8), (5..8, 0..0));
    }

    #[test]
    fn the_writer_gets_only_the_room_the_reader_has_freed() {
        let header = Header::new();
        let mut w = Writer::new(8);
        let mut r = Reader::new(8);
        assert_eq!(w.room(&header, 100), Ok((0, 8)));
        assert!(!w.commit(&header, 6), "nobody waits");
        assert_eq!(w.room(&header, 100), Ok((6, 2)));
        assert_eq!(r.filled(&header, 4), Ok((0, 4)));
        assert!(!r.release(&header, 4));
        assert_eq!(w.room(&header, 100), Ok((6, 6)));
        assert_eq!(r.filled(&header, 100), Ok((4, 2)));
    }

    #[test]
    fn a_parked_reader_is_rung_once_and_a_writer_that_armed_sees_freed_room() {
        let header = Header::new();
        let mut w = Writer::new(8);
        let mut r = Reader::new(8);
        assert_eq!(r.arm(&header), Ok(false), "empty: park");
        assert!(w.commit(&header, 8), "the reader parked: ring");
        assert!(!w.commit(&header, 0), "and only once");
        assert_eq!(w.arm(&header), Ok(false), "full: park");
        assert!(r.release(&header, 1), "the writer parked: ring");
        assert_eq!(w.arm(&header), Ok(true), "room again: do not park");
        assert_eq!(r.arm(&header), Ok(true), "bytes queued: do not park");
    }

    #[test]
    fn counters_a_peer_broke_are_corrupt_not_an_index() {
        let header = Header::new();
        let mut r = Reader::new(8);
        header.tail.0.store(9, Ordering::SeqCst);
        assert_eq!(
            r.filled(&header, 1),
            Err(Corrupt::Overfull {
                filled: 9,
                capacity: 8
            })
        );
        let mut w = Writer::new(8);
        header.head.0.store(1, Ordering::SeqCst);
        let e = w.room(&header, 1).expect_err("head ahead of tail");
        assert!(e.to_string().contains("corrupt"), "{e}");
    }

    #[test]
    fn a_counter_that_went_back_is_corrupt_even_where_it_stays_in_the_queue() {
        let header = Header::new();
        let mut w = Writer::new(8);
        let mut r = Reader::new(8);
        w.commit(&header, 6);
        assert_eq!(r.filled(&header, 8), Ok((0, 6)));
        // The writer's counter goes back, though not below what the reader has read.
        header.tail.0.store(3, Ordering::SeqCst);
        let e = r.filled(&header, 8).expect_err("tail went back");
        assert!(e.to_string().contains("went back"), "{e}");
        let e = r.arm(&header).expect_err("tail went back");
        assert!(e.to_string().contains("went back"), "{e}");
        // And the reader's, though not above what the writer has written.
        header.tail.0.store(6, Ordering::SeqCst);
        assert!(!r.release(&header, 4));
        assert_eq!(w.room(&header, 8), Ok((6, 6)));
        header.head.0.store(2, Ordering::SeqCst);
        let e = w.room(&header, 8).expect_err("head went back");
        assert!(e.to_string().contains("went back"), "{e}");
        let e = w.arm(&header).expect_err("head went back");
        assert!(e.to_string().contains("went back"), "{e}");
    }
}

/// The parking protocol under loom: a reader that parks whenever it finds the queue empty and
/// a writer that rings whenever it finds the flag set never strand the reader (loom fails a
/// model whose threads all block).
#[cfg(all(test, loom))]
mod loom {
    use super::*;
    use ::loom::sync::{Arc, Condvar, Mutex};

    /// The doorbell: a count of rings and a condition to park on.
    #[derive(Default)]
    struct Bell {
        rung: Mutex<u32>,
        ring: Condvar,
    }

    impl Bell {
        fn ring(&self) {
            *self.rung.lock().expect("bell") += 1;
            self.ring.notify_one();
        }
        /// Parks until a ring arrives, and takes it (a ring left over is a spurious wake-up,
        /// after which the side looks again, as the fabric's pass does).
        fn park(&self) {
            let mut rung = self.rung.lock().expect("bell");
            while *rung == 0 {
                rung = self.ring.wait(rung).expect("bell");
            }
            *rung -= 1;
        }
    }

    #[test]
    fn a_side_that_parks_is_always_woken_when_the_other_moves() {
        let mut builder = ::loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let header = Arc::new(Header::new());
            // Each side's own doorbell (its end of the TCP connection): the reader's is rung
            // by the writer, the writer's by the reader.
            let reader_bell = Arc::new(Bell::default());
            let writer_bell = Arc::new(Bell::default());
            let writer = {
                let (header, reader_bell, writer_bell) =
                    (header.clone(), reader_bell.clone(), writer_bell.clone());
                ::loom::thread::spawn(move || {
                    // Three bytes through a queue of one: each after the first waits for room.
                    let mut w = Writer::new(1);
                    for _ in 0..3 {
                        loop {
                            let (_, n) = w.room(&header, 1).expect("room");
                            if n == 1 {
                                break;
                            }
                            if !w.arm(&header).expect("arm") {
                                writer_bell.park();
                            }
                        }
                        if w.commit(&header, 1) {
                            reader_bell.ring();
                        }
                    }
                })
            };
            let mut r = Reader::new(1);
            let mut got = 0;
            while got < 3 {
                let (_, n) = r.filled(&header, 1).expect("filled");
                if n == 0 {
                    if !r.arm(&header).expect("arm") {
                        reader_bell.park();
                    }
                    continue;
                }
                got += n;
                if r.release(&header, n) {
                    writer_bell.ring();
                }
            }
            writer.join().expect("writer");
        });
    }
}
