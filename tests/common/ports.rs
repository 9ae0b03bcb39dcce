//! Free loopback addresses for test rings.
//!
//! A port found by binding port 0 and releasing it comes from the kernel's ephemeral range,
//! the range every outgoing connection also takes its source port from: a test running in
//! parallel that connects anywhere can be given that port before the rank listens on it, and
//! the rank then fails with "Address already in use". So the ports handed out here come from
//! below the ephemeral range, where the kernel never picks one by itself, one after another
//! from a counter of this process (no two tests of a binary get the same port), starting at
//! an offset drawn from the process id (binaries run side by side start apart), each checked
//! free for TCP and UDP (the nuvec wire's probe binds UDP on the ring's port) before it is
//! handed out. Where the ephemeral range leaves too little room below it, the kernel's choice
//! of port 0 is used, as before.

use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out (above the well-known and most registered services' ports).
const LOWEST: u32 = 12_000;

/// The fewest ports below the ephemeral range for this allocator to be used.
const ROOM: u32 = 4_000;

/// How many ports of the range have been handed out (or skipped) by this process.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Whether `port` can be bound on loopback now, for TCP and UDP.
fn free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok() && UdpSocket::bind(("127.0.0.1", port)).is_ok()
}

/// `n` consecutive loopback ports, each free when checked, none handed out before by this
/// process, below the ephemeral range (see the module documentation); `None` where that range
/// leaves too little room.
fn below_ephemeral(n: u32) -> Option<u16> {
    let end = ephemeral_start();
    let room = end.checked_sub(LOWEST).filter(|&r| r >= ROOM)?;
    let offset = (std::process::id().wrapping_mul(7919)) % room;
    for _ in 0..room / n.max(1) {
        let at = NEXT.fetch_add(n, Ordering::Relaxed);
        let first = (offset + at) % room;
        if first + n > room {
            continue;
        }
        let base = LOWEST + first;
        let ports: Vec<u16> = (base..base + n)
            .filter_map(|p| u16::try_from(p).ok())
            .collect();
        if ports.len() == n as usize && ports.iter().all(|&p| free(p)) {
            return ports.first().copied();
        }
    }
    None
}

/// One free loopback port: below the ephemeral range, or else the kernel's choice.
fn port() -> u16 {
    below_ephemeral(1).unwrap_or_else(|| {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind a loopback port")
            .port()
    })
}

/// `ranks` entries of `conns` free loopback addresses each, as MLX's hostfile lists them. The
/// ports are checked free and then released, so another process could still take one in
/// between (see the module documentation for why that is rare); tests retry nothing, so a
/// collision shows as a setup error naming the address.
pub fn free_nodes(ranks: usize, conns: usize) -> Vec<Vec<String>> {
    (0..ranks)
        .map(|_| {
            (0..conns)
                .map(|_| format!("127.0.0.1:{}", port()))
                .collect()
        })
        .collect()
}

/// `n` consecutive free loopback ports, for `nuvec-launch --starting-port` (which gives rank
/// r the port `start + r`), found as [`free_nodes`]'s (all released before returning).
pub fn consecutive(n: u16) -> u16 {
    if let Some(base) = below_ephemeral(u32::from(n)) {
        return base;
    }
    for _ in 0..100 {
        let first = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let base = first.local_addr().expect("address").port();
        if u32::from(base) + u32::from(n) > 65535 {
            continue;
        }
        let rest: Result<Vec<TcpListener>, _> = (1..n)
            .map(|i| TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if rest.is_ok() {
            return base;
        }
    }
    panic!("no {n} consecutive free loopback ports");
}
