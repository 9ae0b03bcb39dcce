//! The probing half of the setup's driver: the socket calls of the nuvec wire's probe
//! ([`probe`], its protocol): the UDP sockets beside the listeners, answering probes wherever
//! the driver waits, and an opener's probe before its connect. Which connections come out
//! native is decided here, from the probe's outcome, the handshake's wire bytes or this
//! rank's choice.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use mio::net::UdpSocket;
use mio::{Events, Interest, Token};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::{Arrival, Driver, MAX_DATAGRAMS, Opened, PROBE_TOKEN, bind_like_connect};
use crate::config::options::WireChoice;
use crate::transport::tcp::local;
use crate::transport::tcp::probe::{self, NotNative, Outcome, Probe, Step};

/// A non-blocking UDP socket bound to `addr`, where an acceptor answers probes. Without
/// `SO_REUSEADDR`: on Linux it would let another socket bind the same port and take the
/// probes.
pub(super) fn bind_udp(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.bind(&SockAddr::from(addr))?;
    socket.set_nonblocking(true)?;
    Ok(UdpSocket::from_std(socket.into()))
}

/// A non-blocking UDP socket connected to `to`, on an ephemeral port, to probe from: being
/// connected, it receives only from `to`, and an ICMP refusal shows as `ECONNREFUSED`.
fn probe_socket(to: SocketAddr) -> io::Result<UdpSocket> {
    let any = match to {
        SocketAddr::V4(_) => SocketAddr::from(([0u8; 4], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    };
    let socket = UdpSocket::bind(any)?;
    socket.connect(to)?;
    Ok(socket)
}

impl Driver<'_> {
    /// Whether this side says it may speak the nuvec wire (a sub-group's ring says so too:
    /// it inherits its parent's wire, and nothing of its own depends on it).
    pub(super) fn speaks_nuvec(&self) -> bool {
        self.choice != Some(WireChoice::Mlx)
    }

    /// Whether a connection opened without a probe is native, until its handshake says more.
    fn opened_unprobed(&self) -> Result<(), NotNative> {
        match self.choice {
            None => Err(NotNative::Unprobed),
            Some(WireChoice::Mlx) => Err(NotNative::OpenerAskedMlx),
            // With a key the handshake decides (see `authenticate_opened`).
            Some(_) if self.key.is_some() => Ok(()),
            Some(_) => Err(NotNative::Unprobed),
        }
    }

    /// Whether `arrival`, kept on `link`, is native.
    pub(super) fn accepted_native(&self, link: usize, arrival: &Arrival) -> Result<(), NotNative> {
        match self.choice {
            None => Err(NotNative::Unprobed),
            Some(WireChoice::Mlx) => Err(NotNative::AcceptorAskedMlx),
            Some(_) if self.key.is_some() => match arrival.opener_nuvec {
                Some(true) => Ok(()),
                Some(false) => Err(NotNative::OpenerAskedMlx),
                None => Err(NotNative::Unprobed),
            },
            Some(_) => match (&self.answerer, self.udp.get(link)) {
                (Some(answerer), Some(Some(_))) => {
                    if answerer.native(link, arrival.peer) {
                        Ok(())
                    } else {
                        Err(NotNative::Unprobed)
                    }
                }
                _ => Err(NotNative::NoUdp),
            },
        }
    }

    /// Answers every probe waiting on the UDP sockets (at most [`MAX_DATAGRAMS`] each);
    /// whether any datagram came. Junk and strangers' probes are dropped.
    pub(super) fn answer_probes(&mut self) -> bool {
        let Driver {
            answerer: Some(answerer),
            udp,
            log,
            nodes,
            setup,
            ..
        } = self
        else {
            return false;
        };
        let mut any = false;
        // One byte more than a datagram, so that a longer one is not taken for one.
        let mut buf = [0u8; probe::LEN + 1];
        for (link, socket) in udp.iter().enumerate() {
            let Some(socket) = socket else { continue };
            let own = nodes[setup.rank()].get(link).map_or("?", String::as_str);
            for _ in 0..MAX_DATAGRAMS {
                let (n, from) = match socket.recv_from(&mut buf) {
                    Ok(got) => got,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    // Would block, or an error an earlier answer's ICMP left: nothing to read.
                    Err(_) => break,
                };
                any = true;
                match answerer.handle(link, from, &buf[..n]) {
                    Ok(answer) => match socket.send_to(&answer, from) {
                        Ok(_) => log.debug(format_args!(
                            "answered the nuvec wire's probe of rank {} from {from} on {own} \
                             (connection {link})",
                            setup.left()
                        )),
                        Err(e) => log.debug(format_args!(
                            "cannot answer the probe from {from} on {own}: {e}"
                        )),
                    },
                    Err(why) => log.debug(format_args!(
                        "dropped a datagram of {n} bytes from {from} on {own}: {why}"
                    )),
                }
            }
        }
        any
    }

    /// Waits until `until` (a back-off), answering probes meanwhile.
    pub(super) fn idle_until(&mut self, until: Instant) {
        let mut events = Events::with_capacity(16);
        loop {
            self.answer_probes();
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            if self.answerer.is_none() {
                std::thread::sleep(left);
                return;
            }
            // Woken by a datagram (or another socket), or at `until`; an error is a spurious
            // wake-up at worst.
            let _ = self.poll.poll(&mut events, Some(left));
        }
    }

    /// [`probe`](Self::probe), counted and timed.
    fn timed_probe(&mut self, link: usize, to: SocketAddr, port: u16) -> Outcome {
        let started = Instant::now();
        let outcome = self.probe(link, to, port);
        self.probed.0 += 1;
        self.probed.1 += started.elapsed();
        outcome
    }

    /// [`timed_probe`](Self::timed_probe), probed again (up to [`probe::FRESH_TRIES`] times in
    /// all) while a refusal came [`probe::QUIET`] / 2 or more after the probe began: such a
    /// refusal may be older than the acceptor's quiet time, so a connect after it could reach
    /// an acceptor that came up meanwhile (see `probe`). A rank that requires the nuvec wire
    /// probes again instead, after a late refusal and after no answer alike, starting no probe
    /// that could end after `patience` (when its [`probe::PATIENCE`], or the attempt's time,
    /// runs out). `started`: when the last probe began.
    fn fresh_probe(
        &mut self,
        link: usize,
        to: SocketAddr,
        port: u16,
        started: &mut Instant,
        patience: Instant,
    ) -> Outcome {
        let required = self.choice == Some(WireChoice::Nuvec);
        let mut tries = 0;
        loop {
            *started = Instant::now();
            let outcome = self.timed_probe(link, to, port);
            tries += 1;
            let settled = match outcome {
                Outcome::Answered => true,
                Outcome::Refused => started.elapsed() < probe::QUIET / 2,
                Outcome::TimedOut => false,
            };
            let again = if required {
                Instant::now() + probe::WAIT < patience
            } else {
                outcome == Outcome::Refused && tries < probe::FRESH_TRIES
            };
            if settled || !again {
                return outcome;
            }
            self.log.debug(format_args!(
                "probe of {to} (connection {link}) {outcome:?} after {:?}: probing again",
                started.elapsed()
            ));
        }
    }

    /// Probes the acceptor at `to` for `link`, announcing TCP source port `port`, answering
    /// this rank's own probes while it waits (see [`probe`]).
    fn probe(&mut self, link: usize, to: SocketAddr, port: u16) -> Outcome {
        let socket = match probe_socket(to) {
            Ok(socket) => socket,
            Err(e) => {
                // Nothing was sent, so nothing can have been answered: as a refusal.
                self.log
                    .debug(format_args!("cannot make a UDP socket to probe {to}: {e}"));
                return Outcome::Refused;
            }
        };
        let mut socket = socket;
        let token = Token(PROBE_TOKEN);
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut socket, token, Interest::READABLE)
        {
            self.log
                .debug(format_args!("cannot poll the probe of {to}: {e}"));
            return Outcome::Refused;
        }
        let mut nonce = [0u8; 8];
        let _ = getrandom::fill(&mut nonce);
        let rank = self.setup.rank() as u32;
        let mut probe = Probe::new(
            self.job,
            rank,
            link as u32,
            port,
            u64::from_le_bytes(nonce),
            Instant::now(),
        );
        let mut events = Events::with_capacity(16);
        let mut buf = [0u8; probe::LEN + 1];
        let outcome = loop {
            match probe.poll(Instant::now()) {
                Step::Send(bytes) => match socket.send(&bytes) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) => {}
                    // Refused (an earlier send's ICMP), or no route: no answer will come.
                    Err(_) => probe.refused(),
                },
                Step::Wait { until } => {
                    loop {
                        match socket.recv(&mut buf) {
                            Ok(n) => probe.received(&buf[..n]),
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                            Err(_) => {
                                probe.refused();
                                break;
                            }
                        }
                    }
                    if matches!(probe.poll(Instant::now()), Step::Done(_)) {
                        continue;
                    }
                    self.answer_probes();
                    let left = until.saturating_duration_since(Instant::now());
                    let _ = self.poll.poll(&mut events, Some(left));
                }
                Step::Done(outcome) => break outcome,
            }
        };
        let _ = self.poll.registry().deregister(&mut socket);
        self.log.debug(format_args!(
            "probe of {to} (connection {link}, port {port}): {outcome:?} after {} sends",
            probe.sent()
        ));
        outcome
    }

    /// A connection to `addr` within `within`: probed first when this rank probes, with a
    /// local link proposed when local links are on (both need the connection's port before
    /// it connects), and whether it is native.
    pub(super) fn connect_to(
        &mut self,
        link: usize,
        addr: &SocketAddr,
        within: Duration,
    ) -> io::Result<Opened> {
        let local = self.offers.is_some() && cfg!(target_os = "linux");
        let probing = self.answerer.is_some();
        if !local && !probing {
            let stream = TcpStream::connect_timeout(addr, within)?;
            return Ok((stream, None, self.opened_unprobed()));
        }
        let tcp = || {
            Socket::new(
                Domain::for_address(*addr),
                Type::STREAM,
                Some(Protocol::TCP),
            )
        };
        let socket = tcp()?;
        let port = bind_like_connect(&socket, addr);
        let began = Instant::now();
        let patience = began + probe::PATIENCE.min(within);
        let mut probed = began;
        // Held, still bound, until the new socket connects, so that its port differs.
        let mut old = None;
        let (socket, port, native) = match (probing, port) {
            (false, _) => (socket, port, self.opened_unprobed()),
            (true, None) => (socket, None, Err(NotNative::NoPort)),
            (true, Some(port)) => {
                match self.fresh_probe(link, *addr, port, &mut probed, patience) {
                    Outcome::Answered => (socket, Some(port), Ok(())),
                    Outcome::Refused => (socket, Some(port), Err(NotNative::Refused)),
                    Outcome::TimedOut => {
                        // An answer may be on its way: the acceptor must not count this
                        // connection as the one it answered, so it comes from another port.
                        let fresh = tcp()?;
                        let fresh_port = bind_like_connect(&fresh, addr);
                        old = Some(socket);
                        (fresh, fresh_port, Err(NotNative::TimedOut))
                    }
                }
            }
        };
        let proposal = if local {
            port.and_then(|port| local::propose(*addr, port))
        } else {
            None
        };
        // The probes' time comes out of the attempt's (a probe's wait at least is left).
        let left = within.saturating_sub(began.elapsed()).max(probe::WAIT);
        socket.connect_timeout(&SockAddr::from(*addr), left)?;
        drop(old);
        if native == Err(NotNative::Refused) && probed.elapsed() >= probe::QUIET {
            // The acceptor may have come up between the refusal and this connect (see
            // `probe`'s quiet time): the link is MLX's either way, at both ends (the probe
            // was refused, so the acceptor answered none announcing this port).
            self.log.debug(format_args!(
                "connected to {addr} {:?} after a refused probe: the refusal may have come \
                 before the acceptor was up",
                probed.elapsed()
            ));
        }
        Ok((socket.into(), proposal, native))
    }
}
