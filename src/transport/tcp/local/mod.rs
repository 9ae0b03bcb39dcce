//! Local links: between two ranks of this crate on one machine, the bytes of a ring connection
//! go through memory both processes map instead of through the kernel's TCP stack, while the
//! TCP connection stays open as the link's doorbell and its sign of life.
//!
//! **Why.** Over loopback TCP every byte is copied twice by the kernel (into a socket buffer,
//! out of it) with the protocol's work on top, and on a machine whose cores are shared with
//! other work that CPU is what a large collective is bound by: at 16 MiB under `mlx.launch` the
//! in-place ring reached about 60 % of plain blocking sockets, which themselves leave no room
//! for the array API's cost. A shared queue is one copy in by the sender and one copy out by
//! the receiver (into the destination, or into the link's scratch when the bytes are reduced:
//! the peer can still write the queue's memory, so the reduction never reads it in place),
//! and a rank that is looking for bytes looks at a counter instead of making a system call.
//!
//! **When.** Only when both ends are ranks of this crate (a Python MLX rank, or
//! nuvec-distributed 0.5.0, never sees any of this: its links stay TCP, byte for byte as
//! before), on Linux, on one machine and in one network namespace, with local links allowed
//! ([`Options::local_links`](crate::Options::local_links), `NUVEC_DISTRIBUTED_LOCAL_LINKS`).
//! The bytes on a local link are exactly those the TCP connection would carry, so the
//! algorithms do not know which kind a link is. How the two ends agree, without a byte on the
//! TCP connection that MLX would not send, is `rendezvous`'s.
//!
//! **Layout.** One memory file per link (`memory`), two queues in it (`queue`): the opener's
//! sends in the first, the acceptor's in the second, each a page of counters then
//! [`CAPACITY`] bytes.
//!
//! **Waiting.** A step that cannot progress looks at the queues as it looks at sockets; before
//! it parks in the poll, it arms every queue it waits on, and the peer rings (one byte on the
//! TCP connection) when it moves one that was armed. A step reads a bounded number of
//! doorbells at a time (a peer that rings without end cannot hold it past its deadline), and
//! does not park while some are left unread. A peer that dies closes its TCP connection,
//! which wakes the poll and fails the step, as on a TCP link; a doorbell that cannot be
//! written (the peer is gone) fails only a transfer that then misses bytes.

#[cfg(target_os = "linux")]
mod memory;
// Off Linux only its `Corrupt` is used (by the type without values below).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
mod queue;
#[cfg(target_os = "linux")]
mod rendezvous;

#[cfg(target_os = "linux")]
pub(super) use rendezvous::{Offers, Proposal, propose};

pub(crate) use queue::Corrupt;

/// The bytes each direction of a local link queues: large enough that a step's segment
/// streams without a hand-off per socket-buffer's worth, small enough for many links.
#[cfg(target_os = "linux")]
pub(crate) const CAPACITY: usize = 2 << 20;

/// The counters' page before each queue's bytes.
#[cfg(target_os = "linux")]
const HEADER: usize = 4096;

/// A link's memory: two queues.
#[cfg(target_os = "linux")]
const MAPPING: usize = 2 * (HEADER + CAPACITY);

#[cfg(target_os = "linux")]
pub(crate) use linux::LocalLink;

#[cfg(target_os = "linux")]
pub(crate) mod linux {
    use super::memory::Mapping;
    use super::queue::{Corrupt, Header, Reader, Writer, pieces};
    use super::{CAPACITY, HEADER, MAPPING};
    use std::io;

    /// Which end of the TCP connection a rank is: the opener's sends go in the first queue.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum End {
        /// The rank that opened (connected) the TCP connection.
        Opener,
        /// The rank that accepted it.
        Acceptor,
    }

    /// The counters of the queue at `queue` of a link's `mapping`.
    fn header_of(mapping: &Mapping, queue: usize) -> &Header {
        // SAFETY: `queue` is 0 or HEADER + CAPACITY, both page-aligned offsets inside the
        // mapping (of MAPPING bytes, which `LocalLink::new` checks) with a page after them;
        // `Header` (four 64-byte lines of atomics) fits a page and needs 64-byte alignment;
        // atomics are valid for any bit pattern, and the mapping outlives the borrow.
        let at = mapping.as_ptr().wrapping_add(queue).cast::<Header>();
        // SAFETY: see above.
        unsafe { &*at }
    }

    /// One rank's end of a local link: it writes one queue and reads the other.
    pub(crate) struct LocalLink {
        mapping: Mapping,
        /// Where the queue this rank writes starts in the mapping.
        out: usize,
        /// Where the queue it reads starts.
        inn: usize,
        writer: Writer,
        reader: Reader,
    }

    impl std::fmt::Debug for LocalLink {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "LocalLink({} bytes each way)", CAPACITY)
        }
    }

    impl LocalLink {
        /// This rank's end over a link's `mapping` (both queues empty); an error if the
        /// mapping is not [`MAPPING`] bytes long, the length every access below relies on.
        pub(crate) fn new(mapping: Mapping, end: End) -> io::Result<Self> {
            if mapping.len() != MAPPING {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "a local link's memory has {} bytes, not {MAPPING}",
                        mapping.len()
                    ),
                ));
            }
            let (first, second) = (0, HEADER + CAPACITY);
            let (out, inn) = match end {
                End::Opener => (first, second),
                End::Acceptor => (second, first),
            };
            Ok(Self {
                mapping,
                out,
                inn,
                writer: Writer::new(CAPACITY),
                reader: Reader::new(CAPACITY),
            })
        }

        /// The counters of the queue at `queue`.
        fn header(&self, queue: usize) -> &Header {
            header_of(&self.mapping, queue)
        }

        /// The first of the `CAPACITY` bytes of the queue at `queue` (they follow its page of
        /// counters in the mapping).
        fn bytes(&self, queue: usize) -> *mut u8 {
            self.mapping.as_ptr().wrapping_add(queue + HEADER)
        }

        /// Copies as much of `data` into the outgoing queue as it has room for; how much, and
        /// whether the peer is parked and must be rung.
        pub(crate) fn write(&mut self, data: &[u8]) -> Result<(usize, bool), Corrupt> {
            let header = header_of(&self.mapping, self.out);
            let (at, n) = self.writer.room(header, data.len())?;
            if n == 0 {
                return Ok((0, false));
            }
            let (a, b) = pieces(at, n, CAPACITY);
            let bytes = self.bytes(self.out);
            // SAFETY: (and for the copy after) `a` and `b` lie in the queue's CAPACITY bytes
            // (`pieces`), inside the mapping, in its free part, which an honest reader does not
            // read until `commit` publishes it (a peer that reads it early only sees bytes
            // change under its own copy, nothing of this process's); `data` has
            // `n` = `a.len() + b.len()` bytes and is this process's own memory, which no
            // mapping of a link overlaps.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), bytes.wrapping_add(a.start), a.len())
            };
            let rest = data[a.len()..n].as_ptr();
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(rest, bytes.wrapping_add(b.start), b.len()) };
            let ring = self.writer.commit(header_of(&self.mapping, self.out), n);
            Ok((n, ring))
        }

        /// Copies as much of the incoming queue into `into` as it holds (never more than
        /// `into`: the next operation's bytes stay queued); how much, and whether the peer is
        /// parked and must be rung.
        pub(crate) fn read(&mut self, into: &mut [u8]) -> Result<(usize, bool), Corrupt> {
            let header = header_of(&self.mapping, self.inn);
            let (at, n) = self.reader.filled(header, into.len())?;
            if n == 0 {
                return Ok((0, false));
            }
            let (a, b) = pieces(at, n, CAPACITY);
            let bytes = self.bytes(self.inn);
            let (first, rest) = into[..n].split_at_mut(a.len());
            // SAFETY: (and for the copy after) `a` and `b` lie in the queue's CAPACITY bytes
            // (`pieces`), inside the mapping, in its filled part, which an honest writer does
            // not touch until `release` hands it back; `first` and `rest` are this process's
            // own memory, `a.len()` and `b.len()` long, which no mapping of a link overlaps.
            // A misbehaving peer may write those bytes during the copy (Rust's memory model
            // speaks of one program's threads, not of another process's writes). What holds
            // then: this process reads the queue's bytes only here, each once, by this raw copy, never
            // through a reference (so nothing is assumed about them staying put, and the
            // reductions see only the private copy); what lands in `into` is some bytes, and
            // every byte pattern is a valid `u8`. The peer can change what is received, as a
            // peer can over TCP, and nothing else.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.wrapping_add(a.start),
                    first.as_mut_ptr(),
                    a.len(),
                )
            };
            // SAFETY: as above.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.wrapping_add(b.start),
                    rest.as_mut_ptr(),
                    b.len(),
                )
            };
            let ring = self.reader.release(header_of(&self.mapping, self.inn), n);
            Ok((n, ring))
        }

        /// Before parking on a send: asks the peer to ring when it frees room; whether there is
        /// room already.
        pub(crate) fn arm_send(&self) -> Result<bool, Corrupt> {
            self.writer.arm(self.header(self.out))
        }

        /// Before parking on a receive: asks the peer to ring when it writes; whether bytes are
        /// queued already.
        pub(crate) fn arm_recv(&self) -> Result<bool, Corrupt> {
            self.reader.arm(self.header(self.inn))
        }
    }

    /// Both ends of one link in one process (two mappings of one memory file, as two
    /// processes have): the opener's and the acceptor's.
    #[cfg(test)]
    pub(crate) fn pair() -> (LocalLink, LocalLink) {
        let (a, fd) = Mapping::create(MAPPING).expect("memory file");
        let b = Mapping::open(&fd, MAPPING).expect("second mapping");
        (
            LocalLink::new(a, End::Opener).expect("the opener's end"),
            LocalLink::new(b, End::Acceptor).expect("the acceptor's end"),
        )
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn bytes_cross_a_link_both_ways_in_order_wrapping_around_the_queues() {
            let (mut opener, mut acceptor) = pair();
            let stream: Vec<u8> = (0..3 * CAPACITY + 12345)
                .map(|i| (i * 7 % 251) as u8)
                .collect();
            let mut got = vec![0u8; stream.len()];
            let mut back = vec![0u8; stream.len()];
            let (mut sent, mut recvd, mut sent_back, mut recvd_back) = (0, 0, 0, 0);
            // Uneven pieces, so that both copies meet the wrap at odd offsets.
            let mut piece = 1;
            while recvd_back < stream.len() {
                piece = piece * 3 % 999_983 + 1;
                let end = (sent + piece).min(stream.len());
                sent += opener.write(&stream[sent..end]).expect("write").0;
                let end = (recvd + piece / 2 + 1).min(stream.len());
                recvd += acceptor.read(&mut got[recvd..end]).expect("read").0;
                let end = recvd.min(sent_back + piece);
                sent_back += acceptor.write(&got[sent_back..end]).expect("write back").0;
                recvd_back += opener.read(&mut back[recvd_back..]).expect("read back").0;
            }
            assert!(got == stream, "one way");
            assert!(back == stream, "and back");
        }

        #[test]
        fn a_receive_never_takes_the_bytes_past_its_end() {
            let (mut opener, mut acceptor) = pair();
            opener.write(&[1, 2, 3, 4, 5]).expect("write");
            let mut two = [0u8; 2];
            assert_eq!(acceptor.read(&mut two).expect("read").0, 2);
            let mut rest = [0u8; 8];
            assert_eq!(acceptor.read(&mut rest).expect("read").0, 3);
            assert_eq!((two, &rest[..3]), ([1, 2], &[3, 4, 5][..]));
        }

        #[test]
        fn a_mapping_of_another_length_is_no_link() {
            let (mapping, _fd) = Mapping::create(4096).expect("memory file");
            let e = LocalLink::new(mapping, End::Opener).expect_err("4096 bytes");
            assert!(e.to_string().contains("4096 bytes"), "{e}");
        }

        #[test]
        fn a_file_whose_size_is_not_sealed_is_refused() {
            let file = std::fs::File::open("/proc/self/exe").expect("a file");
            let e = Mapping::open(&file.into(), MAPPING).expect_err("not sealed");
            assert!(e.to_string().contains("sealed"), "{e}");
        }

        #[test]
        fn a_memory_file_of_another_size_is_refused() {
            let (_, fd) = Mapping::create(4096).expect("memory file");
            let e = Mapping::open(&fd, MAPPING).expect_err("too small");
            assert!(e.to_string().contains("4096 bytes"), "{e}");
        }
    }
}

/// No local links off Linux: the type exists so the TCP fabric compiles the same everywhere,
/// and has no values.
#[cfg(not(target_os = "linux"))]
#[derive(Debug)]
pub(crate) enum LocalLink {}

#[cfg(not(target_os = "linux"))]
impl LocalLink {
    pub(crate) fn write(&mut self, _: &[u8]) -> Result<(usize, bool), Corrupt> {
        match *self {}
    }
    pub(crate) fn read(&mut self, _: &mut [u8]) -> Result<(usize, bool), Corrupt> {
        match *self {}
    }
    pub(crate) fn arm_send(&self) -> Result<bool, Corrupt> {
        match *self {}
    }
    pub(crate) fn arm_recv(&self) -> Result<bool, Corrupt> {
        match *self {}
    }
}

/// No local links off Linux: nobody offers or proposes one.
#[cfg(not(target_os = "linux"))]
mod elsewhere {
    use super::LocalLink;
    use std::net::SocketAddr;
    use std::time::Instant;

    /// The acceptor's offers: none.
    pub(crate) struct Offers;

    impl Offers {
        pub(crate) fn bind(_: &[Option<SocketAddr>]) -> Self {
            Offers
        }
        pub(crate) fn answer(&mut self, _: usize, _: SocketAddr) -> Option<LocalLink> {
            None
        }
    }

    /// A proposal: there are none.
    #[derive(Debug)]
    pub(crate) enum Proposal {}

    impl Proposal {
        pub(crate) fn confirm(self, _: Instant) -> std::io::Result<Option<LocalLink>> {
            match self {}
        }
    }

    /// Never a proposal.
    pub(crate) fn propose(_: SocketAddr, _: u16) -> Option<Proposal> {
        None
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) use elsewhere::{Offers, Proposal, propose};
