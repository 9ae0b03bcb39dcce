//! The wire: the machine's limit for the same traffic, a ring of plain blocking `std::net`
//! sockets over which every rank runs the collective's ring steps with no reduction, and a
//! round trip between ranks 0 and 1.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;

use nuvec_distributed::jaccl;

use crate::Result;
use crate::measure::Collectives;

/// A ring step of at most this many bytes is written and then read on the calling thread:
/// the kernel's socket buffers hold it, so neither rank can block the other.
pub(crate) const INLINE_STEP: usize = 32 * 1024;

/// A command to the writer thread: write this many bytes, or stop.
pub(crate) enum Job {
    /// Write this many bytes.
    Write(usize),
    /// Stop the thread.
    Stop,
}

/// A thread that writes to the right neighbour while the calling thread reads from the left.
pub(crate) struct Writer {
    /// Where the jobs go.
    pub(crate) jobs: mpsc::Sender<Job>,
    /// How each write ended.
    pub(crate) done: mpsc::Receiver<std::io::Result<()>>,
    /// The thread.
    pub(crate) thread: JoinHandle<()>,
}

/// Starting the writer.
impl Writer {
    /// A writer thread on `stream`, writing from a buffer of its own.
    pub(crate) fn spawn(mut stream: TcpStream) -> Self {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (done_tx, done) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut buf: Vec<u8> = Vec::new();
            while let Ok(Job::Write(len)) = job_rx.recv() {
                if buf.len() < len {
                    buf.resize(len, 0x5a);
                }
                if done_tx.send(stream.write_all(&buf[..len])).is_err() {
                    break;
                }
            }
        });
        Writer { jobs, done, thread }
    }
}

/// This rank's wire sockets: to its right neighbour and from its left one.
pub(crate) struct Wire {
    /// To the right neighbour (opened by this rank).
    pub(crate) right: TcpStream,
    /// From the left neighbour (accepted by this rank).
    pub(crate) left: TcpStream,
    /// Writes large steps to `right`.
    pub(crate) writer: Writer,
    /// What small steps write.
    pub(crate) send: Vec<u8>,
    /// Where steps and round trips read (through [`placed`]).
    pub(crate) recv: Vec<u8>,
}

/// `len` bytes of `buf` (grown as needed) starting one cache line past a page boundary: the
/// wire is the machine's limit, so it reads where the kernel's receive copy is fastest (on
/// some x86 cores that copy runs at half speed into a destination in a page's first cache
/// line, which is where a large heap buffer starts; see the TCP fabric's scratch).
pub(crate) fn placed(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    const PAGE: usize = 4096;
    const LINE: usize = 64;
    if buf.len() < len + PAGE + LINE {
        buf.resize(len + PAGE + LINE, 0);
    }
    let start = buf.as_ptr().align_offset(PAGE).min(PAGE - 1) + LINE;
    &mut buf[start..start + len]
}

/// Connecting and running the wire.
impl Wire {
    /// Connects the wire ring: every rank listens on a fresh port of `host` (its own
    /// address), the listeners' addresses are all-gathered over `comm`, and every rank
    /// connects to its right neighbour's and accepts its left neighbour's.
    pub(crate) fn connect(comm: &impl Collectives, host: &str) -> Result<Self> {
        let (rank, n) = (comm.rank(), comm.size());
        let listener = TcpListener::bind((host, 0))?;
        let mut addresses = vec![0u8; jaccl::tcp::ADDRESS * n];
        comm.all_gather(
            &jaccl::tcp::encode_address(listener.local_addr()?),
            &mut addresses,
        )?;
        let right_rank = (rank + 1) % n;
        let right_address = jaccl::tcp::decode_address(
            &addresses[jaccl::tcp::ADDRESS * right_rank..jaccl::tcp::ADDRESS * (right_rank + 1)],
        );
        // The listener's backlog takes the connection before anyone accepts.
        let right = TcpStream::connect(right_address)?;
        let (left, _) = listener.accept()?;
        right.set_nodelay(true)?;
        left.set_nodelay(true)?;
        let writer = Writer::spawn(right.try_clone()?);
        Ok(Wire {
            right,
            left,
            writer,
            send: Vec::new(),
            recv: Vec::new(),
        })
    }

    /// The socket addresses and options, for the table's header.
    pub(crate) fn describe(&self) -> String {
        match (self.right.local_addr(), self.right.peer_addr()) {
            (Ok(a), Ok(b)) => format!("e.g. {a} → {b}, TCP_NODELAY"),
            _ => "TCP_NODELAY".into(),
        }
    }

    /// `steps` ring steps of `seg` bytes: each sends `seg` bytes right while receiving `seg`
    /// bytes from the left, and the next starts when both are done.
    pub(crate) fn ring(&mut self, steps: usize, seg: usize) -> Result<()> {
        if seg <= INLINE_STEP && self.send.len() < seg {
            self.send.resize(seg, 0xa5);
        }
        for _ in 0..steps {
            if seg <= INLINE_STEP {
                self.right.write_all(&self.send[..seg])?;
                self.left.read_exact(placed(&mut self.recv, seg))?;
            } else {
                self.writer.jobs.send(Job::Write(seg))?;
                self.left.read_exact(placed(&mut self.recv, seg))?;
                self.writer.done.recv()??;
            }
        }
        Ok(())
    }

    /// A round trip of `bytes` between ranks 0 and 1 over the socket rank 0 opened to rank 1.
    pub(crate) fn pingpong(&mut self, rank: usize, bytes: usize) -> Result<()> {
        let buf = placed(&mut self.recv, bytes);
        match rank {
            0 => {
                self.right.write_all(buf)?;
                self.right.read_exact(buf)?;
            }
            1 => {
                self.left.read_exact(buf)?;
                self.left.write_all(buf)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Stops the writer thread.
    pub(crate) fn close(self) {
        let _ = self.writer.jobs.send(Job::Stop);
        let _ = self.writer.thread.join();
    }
}
