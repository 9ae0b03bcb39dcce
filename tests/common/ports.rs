//! Free loopback addresses for test rings, each held until a rank takes it.
//!
//! A port found free and released before a rank listens on it can be taken in between: by the
//! kernel, for another socket's `bind` to port 0 or a `connect`'s source port, when the port
//! lies in the ephemeral range (which on some machines starts as low as 1024); or by another
//! process's allocator. The rank then fails with "Address already in use". So on Linux every
//! port handed out here stays held: a TCP socket bound to `127.0.0.1:port` with
//! `SO_REUSEADDR`, never listening. Linux gives a bound port to no `bind` to port 0 and to no
//! `connect`, while a socket that sets `SO_REUSEADDR` itself (this crate's ranks and MLX's
//! do) can still bind there, on loopback or the wildcard, and listen. (Elsewhere the check's
//! socket is closed at once: BSD's `SO_REUSEADDR` lets no second socket bind the same address
//! and port.) The UDP port is checked, never held: the probe's socket binds it without
//! `SO_REUSEADDR`.
//!
//! A port counts as free when a TCP socket without `SO_REUSEADDR` can bind it (which another
//! allocator's hold, a listener and a connection in `TIME_WAIT` all refuse) and a UDP socket
//! can too (the nuvec wire's probe binds UDP on the ring's port); that first socket becomes
//! the hold, so there is no moment between the check and the hold. The ports come from
//! outside the ephemeral range where it leaves room (below it from [`LOWEST`], and above it),
//! one after another from a counter of this process, starting at an offset drawn from the
//! process id (binaries run side by side start apart). The holds of the last [`HELD`] ports
//! are kept: an older job's ranks have long bound theirs.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{LazyLock, Mutex, PoisonError};

use socket2::{Domain, Protocol, Socket, Type};

/// The lowest port handed out (above the well-known and most registered services' ports).
const LOWEST: u32 = 12_000;

/// The fewest ports outside the ephemeral range for the allocator to keep to them (else it
/// uses every port from [`LOWEST`]: on Linux the holds still keep the kernel off their TCP
/// ports).
const ROOM: u32 = 4_000;

/// How many of the latest ports stay held.
const HELD: usize = 256;

/// The ports this process hands out from, and the holds of the latest.
struct Allocator {
    /// Half-open ranges of ports, in order.
    ranges: Vec<(u32, u32)>,
    /// How many ports of the ranges have been handed out (or skipped).
    next: u32,
    /// Where this process starts in the ranges.
    offset: u32,
    /// The holds, oldest first.
    held: VecDeque<Socket>,
}

static ALLOCATOR: LazyLock<Mutex<Allocator>> = LazyLock::new(|| Mutex::new(Allocator::new()));

/// The kernel's ephemeral range, both ends included (the system's default where it cannot be
/// read).
fn ephemeral() -> (u32, u32) {
    let default = if cfg!(target_os = "linux") {
        (32_768, 60_999)
    } else {
        (49_152, 65_535)
    };
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut ends = s.split_whitespace().map(|e| e.parse().ok());
            Some((ends.next()??, ends.next()??))
        })
        .unwrap_or(default)
}

/// A hold on `port` if it is free (see the module documentation), else `None`; off Linux,
/// nothing is held (`Some(None)`).
fn hold(port: u16) -> Option<Option<Socket>> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).ok()?;
    socket.bind(&addr.into()).ok()?;
    UdpSocket::bind(addr).ok()?;
    if !cfg!(target_os = "linux") {
        return Some(None);
    }
    socket.set_reuse_address(true).ok()?;
    Some(Some(socket))
}

/// How many ports `ranges` hold.
fn count(ranges: &[(u32, u32)]) -> u32 {
    ranges.iter().map(|&(a, b)| b - a).sum()
}

impl Allocator {
    fn new() -> Self {
        let (low, high) = ephemeral();
        let outside: Vec<(u32, u32)> = [(LOWEST, low), (high + 1, 65_536)]
            .into_iter()
            .filter(|&(a, b)| b > a)
            .collect();
        let ranges = if count(&outside) >= ROOM {
            outside
        } else {
            vec![(LOWEST, 65_536)]
        };
        Self {
            offset: std::process::id().wrapping_mul(7919) % count(&ranges),
            ranges,
            next: 0,
            held: VecDeque::new(),
        }
    }

    /// The port at `index` of the ranges taken end to end, and how many ports follow it in
    /// its range (itself included).
    fn at(&self, mut index: u32) -> (u32, u32) {
        for &(a, b) in &self.ranges {
            if index < b - a {
                return (a + index, b - a - index);
            }
            index -= b - a;
        }
        unreachable!("an index within the ranges")
    }

    /// `n` consecutive ports, each free and now held, none handed out before by this process.
    fn take(&mut self, n: u32) -> u16 {
        let size = count(&self.ranges);
        for _ in 0..size / n.max(1) {
            let first = (self.offset + self.next) % size;
            self.next += n;
            let (base, left) = self.at(first);
            if left < n {
                continue;
            }
            let holds: Option<Vec<Option<Socket>>> = (base..base + n)
                .map(|p| hold(u16::try_from(p).ok()?))
                .collect();
            if let Some(holds) = holds {
                self.held.extend(holds.into_iter().flatten());
                while self.held.len() > HELD {
                    self.held.pop_front();
                }
                return u16::try_from(base).expect("a port");
            }
        }
        panic!("no {n} consecutive free loopback ports from {LOWEST}");
    }
}

/// `n` consecutive free loopback ports, held (see the module documentation).
fn take(n: u32) -> u16 {
    ALLOCATOR
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take(n)
}

/// `ranks` entries of `conns` free loopback addresses each, as MLX's hostfile lists them,
/// every port held until a rank binds it (see the module documentation).
pub fn free_nodes(ranks: usize, conns: usize) -> Vec<Vec<String>> {
    (0..ranks)
        .map(|_| {
            (0..conns)
                .map(|_| format!("127.0.0.1:{}", take(1)))
                .collect()
        })
        .collect()
}

/// `n` consecutive free loopback ports, for `nuvec-launch --starting-port` (which gives rank
/// r the port `start + r`), held as [`free_nodes`]'s.
pub fn consecutive(n: u16) -> u16 {
    take(u32::from(n))
}
