//! Link liveness: how a connection that went silent (a cut cable, a dead host) is told from
//! one whose peer is only slow, without a byte on the wire that MLX would not send.
//!
//! Two kernel mechanisms, both below the stream of bytes (a Python MLX peer sees nothing it
//! would not expect, and this crate's peers need nothing new):
//!
//! - **Idle links: keepalive.** After [`Settings::idle`] without traffic the kernel sends an
//!   empty probe every [`Settings::interval`]; [`Settings::probes`] unanswered ones in a row
//!   reset the connection with `ETIMEDOUT`. The three add up to the link timeout. The probes
//!   start after a sixth of it and come every fifteenth (at least a second), so that a glitch
//!   shorter than 70 % of the timeout still leaves a probe answered (for the default 15 s:
//!   2 s idle, then a probe a second, 13 of them; a 10.5 s glitch is survived).
//! - **Links with bytes in flight: the acknowledgements.** On Linux a waiting step looks, at
//!   most every [`CHECK_EVERY`], at each link's `TCP_INFO`: a link whose sent bytes are being
//!   retransmitted and that has acknowledged nothing for the link timeout is silent
//!   ([`silent`]). The retransmission backoff is capped at a fifteenth of the timeout (at least
//!   1 s, `TCP_RTO_MAX_MS` from Linux 6.15), so that the retry after a glitch comes in time,
//!   and the kernel's own limit (about 13 capped retries, `tcp_retries2`) falls near the
//!   timeout or after it. macOS drops a connection whose retransmissions go unacknowledged for
//!   the timeout itself (`TCP_RXT_CONNDROPTIME`).
//!
//! Why not `TCP_USER_TIMEOUT`, which bounds unacknowledged data in one option: Linux applies
//! it to a zero window too (a peer that stops reading, its buffers full, answering every
//! window probe), so a rank busy for longer than the timeout (a checkpoint) would reset its
//! neighbour's connection, exactly the failure on slowness this is meant to avoid (measured:
//! a 2 s `TCP_USER_TIMEOUT` resets a loopback connection 2 s into a zero window). A zero
//! window has no bytes in retransmission and a peer that acknowledges, so [`silent`] never
//! calls it silent.
//!
//! A connection the kernel resets shows as an error on the socket (`ETIMEDOUT`): the TCP
//! fabric's step loop sees it on any of its sockets, not only those its step waits on, as a
//! poll error event and at its periodic look.

use std::io;
use std::time::Duration;

/// How often, at most, a waiting step looks at the health of every link.
pub(super) const CHECK_EVERY: Duration = Duration::from_millis(500);

/// The kernel's settings of a link for link timeout `limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Settings {
    /// Idle time before the first keepalive probe.
    pub(super) idle: Duration,
    /// Time between probes.
    pub(super) interval: Duration,
    /// Unanswered probes that reset the connection.
    pub(super) probes: u32,
    /// The cap of the retransmission backoff.
    pub(super) backoff_cap: Duration,
}

impl Settings {
    /// The settings for link timeout `limit` (whole seconds, at least 1 s each, as the
    /// kernel counts them).
    pub(super) fn for_limit(limit: Duration) -> Self {
        let total = limit.as_secs().max(1);
        let idle = (total / 6).max(1);
        let interval = (total / 15).max(1);
        let probes = (total.saturating_sub(idle) / interval).max(1);
        Settings {
            idle: Duration::from_secs(idle),
            interval: Duration::from_secs(interval),
            probes: u32::try_from(probes).unwrap_or(u32::MAX),
            backoff_cap: (limit / 15).max(Duration::from_secs(1)),
        }
    }
}

/// Arms `stream` with the keepalive and retransmission settings of link timeout `limit`.
pub(super) fn arm(socket: &socket2::SockRef<'_>, limit: Duration) -> io::Result<()> {
    let settings = Settings::for_limit(limit);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(settings.idle)
        .with_interval(settings.interval);
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    let keepalive = keepalive.with_retries(settings.probes);
    socket.set_tcp_keepalive(&keepalive)?;
    #[cfg(target_os = "macos")]
    drop_unacknowledged_after(&**socket, limit);
    Ok(())
}

/// macOS: drops `stream` when its retransmissions go unacknowledged for `limit`
/// (`TCP_RXT_CONNDROPTIME`, whole seconds); best effort, as the Linux backoff cap: a system
/// without the option keeps its own limit.
#[cfg(target_os = "macos")]
fn drop_unacknowledged_after(stream: &impl std::os::fd::AsRawFd, limit: Duration) {
    /// `TCP_RXT_CONNDROPTIME` of macOS's `netinet/tcp.h`.
    const TCP_RXT_CONNDROPTIME: libc::c_int = 0x80;
    let secs = libc::c_int::try_from(limit.as_secs().max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is the open socket `stream` borrows for the call, and the value
    // is a live c_int whose size is passed with it.
    let _ = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            TCP_RXT_CONNDROPTIME,
            (&raw const secs).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Whether `stream` has gone silent for `limit`: bytes it sent are being retransmitted and
/// the peer has acknowledged nothing for `limit` (Linux, from `TCP_INFO`). A peer that is
/// only slow acknowledges (a full receive buffer is a zero window, answered), so it never is.
/// `None` where the kernel cannot tell (or on other systems, whose kernel decides alone).
pub(super) fn silent(stream: &impl std::os::fd::AsRawFd, limit: Duration) -> Option<bool> {
    #[cfg(target_os = "linux")]
    {
        let info = tcp_info(stream)?;
        let unacked = info.tcpi_unacked > 0 && info.tcpi_retransmits > 0;
        let quiet = Duration::from_millis(u64::from(info.tcpi_last_ack_recv));
        Some(unacked && quiet >= limit)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (stream, limit);
        None
    }
}

/// `TCP_INFO` of `stream`.
#[cfg(target_os = "linux")]
fn tcp_info(stream: &impl std::os::fd::AsRawFd) -> Option<libc::tcp_info> {
    // SAFETY: `tcp_info` is a C struct of integers, for which all zero bytes are a value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is the open socket `stream` borrows for the call; `info` and
    // `len` are live, and `len` is `info`'s size, so the kernel writes no more than that.
    let got = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &raw mut len,
        )
    };
    (got == 0).then_some(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_link_timeout_probes_an_idle_link_after_two_seconds_every_second() {
        let s = Settings::for_limit(Duration::from_secs(15));
        assert_eq!(
            s,
            Settings {
                idle: Duration::from_secs(2),
                interval: Duration::from_secs(1),
                probes: 13,
                backoff_cap: Duration::from_secs(1),
            }
        );
    }

    #[test]
    fn keepalive_adds_up_to_the_timeout_and_survives_a_glitch_of_seventy_percent() {
        for secs in [10, 15, 20, 30, 60, 120, 600, 3600] {
            let limit = Duration::from_secs(secs);
            let s = Settings::for_limit(limit);
            let total = s.idle + s.interval * s.probes;
            assert!(
                total <= limit && total + s.interval > limit,
                "{secs} s: {s:?} adds up to {total:?}"
            );
            // A glitch survives when it leaves at least one of the probes answered: it
            // covers at most glitch / interval + 1 of them.
            let glitch = limit.mul_f64(0.7);
            let covered = (glitch.as_secs_f64() / s.interval.as_secs_f64()) as u32 + 1;
            assert!(covered < s.probes, "{secs} s: {s:?} covers {covered}");
            // The retry after a glitch comes before the timeout.
            assert!(glitch + s.backoff_cap < limit, "{secs} s: {s:?}");
        }
    }

    #[test]
    fn a_link_timeout_of_a_second_is_a_probe_after_a_second() {
        let s = Settings::for_limit(Duration::from_secs(1));
        assert_eq!(
            (s.idle, s.interval, s.probes),
            (Duration::from_secs(1), Duration::from_secs(1), 1)
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_peer_that_stops_reading_is_not_silent_however_long_its_window_stays_closed() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut sender =
            std::net::TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (_reader, _) = listener.accept().expect("accept");
        arm(&socket2::SockRef::from(&sender), Duration::from_secs(1)).expect("armed");
        sender.set_nonblocking(true).expect("non-blocking");
        let chunk = vec![7u8; 1 << 16];
        loop {
            match sender.write(&chunk) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("a write into a full window failed: {e}"),
            }
        }
        // Twice the link timeout into the zero window, the peer still answers its probes.
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < until {
            assert_eq!(silent(&sender, Duration::from_secs(1)), Some(false));
            assert!(sender.take_error().expect("SO_ERROR").is_none());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
