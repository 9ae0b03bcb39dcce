//! The nuvec wire's probe: how the two ends of one ring connection find out, before it is
//! made, whether both are ranks of this crate that may speak the nuvec wire, without a byte
//! on the connection that MLX would not expect. Sans-IO: [`Probe`] is the opener's half, fed
//! datagrams, refusals and the time; [`Answerer`] the acceptor's, fed datagrams. The socket
//! code is in `connect.rs`.
//!
//! # Why UDP, beside the TCP port
//!
//! MLX's ring sends no byte before an operation's data, so nothing on the TCP connection can
//! ask a question: a Python MLX rank would take any byte for data. But an address `ip:port`
//! of the hostfile names a UDP port too, which MLX never binds. So every rank of this crate
//! that may speak the nuvec wire binds a UDP socket on the same address as each TCP
//! listener, *before* it listens on TCP (a TCP listener that accepts implies a UDP socket
//! that answers). The opener of a connection first sends one datagram there, naming the TCP
//! source port it is about to connect from, and connects only once it knows the outcome:
//!
//! - **answered** (the answer echoes its nonce): it connects from the announced port, and
//!   the connection is *native* at both ends;
//! - **refused** (the connected UDP socket reports `ECONNREFUSED`: the ICMP "port
//!   unreachable" of a host where nothing listens on UDP, i.e. a Python MLX rank, this crate
//!   before 0.6 or a rank asked for MLX's wire): it connects from the same port, and the
//!   connection is MLX's;
//! - **timed out** (no answer within [`WAIT`]; an answer may have been sent and lost): it
//!   connects from a *different* port (a new socket, bound while the old one still holds its
//!   port), so that an acceptor that did answer does not count the connection as native.
//!
//! The acceptor counts an accepted connection as native only when its source address is the
//! one a probe it answered on that link announced (the probe's IP, the announced port; the
//! latest answered probe of each link). Since the opener connects only after the answer came
//! back, the acceptor has recorded it before the connection arrives. So both ends of every
//! connection agree whether it is native, with no byte on the connection itself.
//!
//! # The datagram (both directions, [`LEN`] = 40 bytes, integers little-endian)
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `nuvecWIR` |
//! | 8 | 1 | version, 1 |
//! | 9 | 1 | kind: 1 probe (opener → acceptor), 2 answer (acceptor → opener) |
//! | 10 | 2 | zero |
//! | 12 | 8 | the job's identity: the first 8 bytes of SHA-256 of the hostfile's addresses ([`job_identity`]) |
//! | 20 | 4 | the opener's rank |
//! | 24 | 4 | the link index (the position of the acceptor's address in its hostfile entry) |
//! | 28 | 2 | the opener's TCP source port |
//! | 30 | 2 | zero |
//! | 32 | 8 | the opener's random nonce |
//!
//! An answer is the probe with its kind set to 2. The acceptor answers only a probe of its
//! job, from its left neighbour, for the link of the socket it came in on; anything else (a
//! stranger, another job, junk) is dropped without an answer, and setup goes on.
//!
//! # What it costs
//!
//! Between ranks of this crate: one datagram each way per connection, a round trip before
//! the connect. Against a rank that does not bind the port (Python MLX): the refusal arrives
//! as fast as the answer would (Linux does not rate-limit ICMP on loopback). Behind a
//! firewall that drops UDP silently: [`WAIT`] per connection (60 ms, the probe sent
//! [`SENDS`] times, [`RESEND`] apart), and the link is MLX's. A host that rate-limits its
//! ICMP errors may make a refusal look like a drop: the same 60 ms, the same outcome.
//!
//! # Differences from MLX
//!
//! MLX has no probe. A Python MLX rank sees nothing of it but a datagram to a port it does
//! not bind, which its kernel refuses.
//!
//! # The acceptor's quiet time
//!
//! A refusal proves an acceptor that answers no probe only if the acceptor was already up:
//! a rank of this crate that has not yet bound its UDP socket refuses the probe too, and if
//! it binds and listens between the refusal and the opener's connect, that connect succeeds
//! on an MLX link. (A CI run met this: ranks started as threads at once, and a job asked for
//! the nuvec wire failed.) So:
//!
//! - an acceptor listens on TCP no sooner than [`QUIET`] after binding its UDP sockets,
//!   answering probes meanwhile;
//! - an opener connects after a refusal only if the refusal came within [`QUIET`] / 2 of the
//!   probe's start, else it probes again (at most [`FRESH_TRIES`] probes in all). The
//!   refusal took a round trip, so the connect's SYN reaches the acceptor within
//!   3/2 × [`QUIET`] / 2 < [`QUIET`] of the probe: if the acceptor is listening by then, its
//!   UDP socket, had it one, was bound before the probe arrived and would have answered.
//!
//! What is left: an opener stalled between its refusal and its connect call, or a link whose
//! round trip exceeds [`QUIET`] / 2 (after [`FRESH_TRIES`] stale refusals it connects anyway),
//! can still meet an acceptor that came up meanwhile. The opener logs it; that link and so the
//! job speak MLX's wire (correct, but not the faster wire). The quiet time is what setup pays:
//! every rank waits it at once.
//!
//! An opener that *requires* the nuvec wire (`=nuvec`) would fail its job there, and on a
//! loaded host a peer may also answer later than [`WAIT`]. So it keeps probing, for up to
//! [`PATIENCE`] per connection, while its probes time out or are refused too late to count; a
//! refusal in time (within [`QUIET`] / 2 of the probe: the acceptor is up and does not answer,
//! an MLX rank) still settles at once.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::limits;

/// The first bytes of every datagram.
pub const MAGIC: &[u8; 8] = b"nuvecWIR";
/// The probe's version.
pub const VERSION: u8 = 1;
/// The length of a datagram, probe or answer.
pub const LEN: usize = 40;
/// How long the opener waits between two sends of its probe.
pub const RESEND: Duration = Duration::from_millis(20);
/// How many times the opener sends its probe.
pub const SENDS: u32 = 3;
/// The longest the opener waits for an answer, from its first send: [`SENDS`] × [`RESEND`].
pub const WAIT: Duration = Duration::from_millis(60);
/// How long an acceptor waits between binding its UDP sockets and listening on TCP (see the
/// module's docs): twice the longest round trip a refusal may take to count (Thunderbolt IP
/// pings 0.4–1 ms), and within the 10 ms a mixed job's setup may grow by.
pub const QUIET: Duration = Duration::from_millis(5);
/// How many probes an opener makes, at most, while their refusals come too late to count.
pub const FRESH_TRIES: u32 = 3;
/// How long an opener that requires the nuvec wire (`=nuvec`) keeps probing while its probes
/// go unanswered or are refused too late to count, before it connects on MLX's wire (and the
/// job then fails, naming the link): a peer stalled for longer than [`WAIT`] (a loaded host)
/// must not fail a job that asked for the nuvec wire, while a peer that refuses at once (an MLX
/// rank) still fails it at once.
pub const PATIENCE: Duration = Duration::from_secs(2);

const PROBE: u8 = 1;
const ANSWER: u8 = 2;

/// The identity of a job: the first 8 bytes of SHA-256 of every rank's addresses, so that a
/// probe of another job (another hostfile) is not answered.
pub fn job_identity(nodes: &[Vec<String>]) -> u64 {
    let mut hash = Sha256::new();
    for (rank, addresses) in nodes.iter().enumerate() {
        hash.update((rank as u64).to_le_bytes());
        for address in addresses {
            hash.update((address.len() as u64).to_le_bytes());
            hash.update(address.as_bytes());
        }
    }
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// The fields of a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Datagram {
    /// Whether it is an answer (else a probe).
    pub answer: bool,
    /// The job's identity.
    pub job: u64,
    /// The opener's rank.
    pub rank: u32,
    /// The link index.
    pub link: u32,
    /// The opener's TCP source port.
    pub port: u16,
    /// The opener's nonce.
    pub nonce: u64,
}

impl Datagram {
    /// Its bytes (see the module docs).
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8] = VERSION;
        b[9] = if self.answer { ANSWER } else { PROBE };
        b[12..20].copy_from_slice(&self.job.to_le_bytes());
        b[20..24].copy_from_slice(&self.rank.to_le_bytes());
        b[24..28].copy_from_slice(&self.link.to_le_bytes());
        b[28..30].copy_from_slice(&self.port.to_le_bytes());
        b[32..40].copy_from_slice(&self.nonce.to_le_bytes());
        b
    }

    /// The datagram in `bytes`, if they are one of this version (any other bytes: `None`).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let b: &[u8; LEN] = bytes.try_into().ok()?;
        if &b[..8] != MAGIC || b[8] != VERSION || b[10..12] != [0, 0] || b[30..32] != [0, 0] {
            return None;
        }
        let answer = match b[9] {
            PROBE => false,
            ANSWER => true,
            _ => return None,
        };
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let mut job = [0u8; 8];
        job.copy_from_slice(&b[12..20]);
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&b[32..40]);
        Some(Datagram {
            answer,
            job: u64::from_le_bytes(job),
            rank: u32_at(20),
            link: u32_at(24),
            port: u16::from_le_bytes([b[28], b[29]]),
            nonce: u64::from_le_bytes(nonce),
        })
    }
}

/// How a probe ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The acceptor answered: connect from the announced port; the connection is native.
    Answered,
    /// The acceptor's host refused the datagram: connect (from any port); MLX's wire.
    Refused,
    /// No answer in time: connect from another port than the announced one; MLX's wire.
    TimedOut,
}

/// What the opener's driver is to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send these bytes to the acceptor's address.
    Send([u8; LEN]),
    /// Wait for a datagram (or a refusal) until `until`.
    Wait {
        /// When to poll again.
        until: Instant,
    },
    /// The probe is over.
    Done(Outcome),
}

/// The opener's half of one probe (see the module docs).
#[derive(Debug)]
pub struct Probe {
    probe: Datagram,
    sent: u32,
    next_send: Instant,
    deadline: Instant,
    outcome: Option<Outcome>,
}

impl Probe {
    /// The probe of rank `rank` for link `link` of job `job`, about to connect from TCP port
    /// `port`, with the random `nonce`, started at `now`.
    pub fn new(job: u64, rank: u32, link: u32, port: u16, nonce: u64, now: Instant) -> Self {
        Probe {
            probe: Datagram {
                answer: false,
                job,
                rank,
                link,
                port,
                nonce,
            },
            sent: 0,
            next_send: now,
            deadline: limits::deadline(now, WAIT),
            outcome: None,
        }
    }

    /// The next thing to do at `now`.
    pub fn poll(&mut self, now: Instant) -> Step {
        if let Some(outcome) = self.outcome {
            return Step::Done(outcome);
        }
        if now >= self.deadline {
            self.outcome = Some(Outcome::TimedOut);
            return Step::Done(Outcome::TimedOut);
        }
        if self.sent < SENDS && now >= self.next_send {
            self.sent += 1;
            self.next_send = limits::deadline(now, RESEND);
            return Step::Send(self.probe.encode());
        }
        let until = if self.sent < SENDS {
            self.next_send.min(self.deadline)
        } else {
            self.deadline
        };
        Step::Wait { until }
    }

    /// A datagram came back: the answer if it echoes the probe, else ignored.
    pub fn received(&mut self, bytes: &[u8]) {
        let echo = Datagram {
            answer: true,
            ..self.probe
        };
        if self.outcome.is_none() && Datagram::decode(bytes) == Some(echo) {
            self.outcome = Some(Outcome::Answered);
        }
    }

    /// The acceptor's host refused a datagram (`ECONNREFUSED` on the connected socket).
    pub fn refused(&mut self) {
        if self.outcome.is_none() {
            self.outcome = Some(Outcome::Refused);
        }
    }

    /// How many times the probe was sent.
    pub fn sent(&self) -> u32 {
        self.sent
    }
}

/// Why a connection is not native (it speaks MLX's wire only), as both of its ends or one of
/// them know it; in the ring's terms (opener and acceptor), so that any rank can say it. Its
/// [`code`](NotNative::code) is what the agreement (`ring::agree`) carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NotNative {
    /// The acceptor's host refused the probe: nothing listens on its UDP port (a Python MLX
    /// rank, this crate before 0.6).
    Refused,
    /// No answer came within the probe's wait (a firewall dropping UDP, or a lost answer).
    TimedOut,
    /// The opener could not bind a port to announce.
    NoPort,
    /// The acceptor answered no probe announcing this connection (its opener did not probe,
    /// or gave up waiting).
    Unprobed,
    /// The acceptor could not bind a UDP socket on its address.
    NoUdp,
    /// The opener was asked for MLX's wire (`NUVEC_DISTRIBUTED_WIRE=mlx`).
    OpenerAskedMlx,
    /// The acceptor was asked for MLX's wire (`NUVEC_DISTRIBUTED_WIRE=mlx`).
    AcceptorAskedMlx,
}

impl NotNative {
    const ALL: [NotNative; 7] = [
        NotNative::Refused,
        NotNative::TimedOut,
        NotNative::NoPort,
        NotNative::Unprobed,
        NotNative::NoUdp,
        NotNative::OpenerAskedMlx,
        NotNative::AcceptorAskedMlx,
    ];

    /// Its code on the agreement's wire, from 1.
    pub fn code(self) -> u8 {
        NotNative::ALL
            .iter()
            .position(|&n| n == self)
            .map_or(0, |i| i as u8 + 1)
    }

    /// The reason of `code` (`None`: not a code of this version).
    pub fn from_code(code: u8) -> Option<Self> {
        NotNative::ALL
            .get(usize::from(code).checked_sub(1)?)
            .copied()
    }

    /// What it says of the connection `link` opened by rank `opener` to rank `acceptor` at
    /// `address` (the acceptor's address of that link).
    pub fn describe(self, opener: usize, acceptor: usize, link: usize, address: &str) -> String {
        match self {
            NotNative::Refused | NotNative::TimedOut => format!(
                "rank {acceptor} did not answer the nuvec wire's probe on {address} (an MLX \
                 rank, nuvec-distributed 0.5, or a firewall dropping UDP; connection {link} \
                 from rank {opener}: {})",
                if self == NotNative::Refused {
                    "the probe was refused"
                } else {
                    "no answer in time"
                }
            ),
            NotNative::Unprobed => format!(
                "rank {opener} connected to {address} (connection {link} to rank {acceptor}) \
                 without an answered probe of the nuvec wire (an MLX rank, nuvec-distributed \
                 0.5, or a probe that went unanswered)"
            ),
            NotNative::NoPort => format!(
                "rank {opener} could not bind a port to probe {address} (connection {link} to \
                 rank {acceptor})"
            ),
            NotNative::NoUdp => format!(
                "rank {acceptor} could not bind UDP on {address} to answer the nuvec wire's \
                 probe (connection {link} from rank {opener})"
            ),
            NotNative::OpenerAskedMlx => format!(
                "rank {opener} was asked for MLX's wire (NUVEC_DISTRIBUTED_WIRE=mlx) on \
                 connection {link} to rank {acceptor} at {address}"
            ),
            NotNative::AcceptorAskedMlx => format!(
                "rank {acceptor} was asked for MLX's wire (NUVEC_DISTRIBUTED_WIRE=mlx) on \
                 {address} (connection {link} from rank {opener})"
            ),
        }
    }

    /// A few words for the log of one connection.
    pub fn short(self) -> &'static str {
        match self {
            NotNative::Refused => "probe refused",
            NotNative::TimedOut => "probe not answered in time",
            NotNative::NoPort => "no port to probe from",
            NotNative::Unprobed => "no probe answered for it",
            NotNative::NoUdp => "no UDP socket to answer probes",
            NotNative::OpenerAskedMlx => "its opener was asked for MLX's wire",
            NotNative::AcceptorAskedMlx => "its acceptor was asked for MLX's wire",
        }
    }
}

/// Why an acceptor did not answer a datagram (for its debug log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// Not a probe of this version (junk, or an answer).
    NotAProbe,
    /// A probe of another job.
    OtherJob,
    /// A probe from another rank than the left neighbour.
    OtherRank(u32),
    /// A probe for another link than the socket's.
    OtherLink(u32),
}

impl std::fmt::Display for Ignored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ignored::NotAProbe => f.write_str("not a probe of the nuvec wire"),
            Ignored::OtherJob => f.write_str("a probe of another job"),
            Ignored::OtherRank(r) => write!(f, "a probe from rank {r}, not the left neighbour"),
            Ignored::OtherLink(l) => write!(f, "a probe for link {l}, not this address's"),
        }
    }
}

/// The acceptor's half: it answers the probes of its left neighbour and tells which accepted
/// connections are native.
#[derive(Debug)]
pub struct Answerer {
    job: u64,
    left: u32,
    /// Per link, the source address the latest answered probe announced.
    answered: Vec<Option<(IpAddr, u16)>>,
}

impl Answerer {
    /// The acceptor of job `job` whose left neighbour is `left`, with `links` addresses.
    pub fn new(job: u64, left: usize, links: usize) -> Self {
        Answerer {
            job,
            left: left as u32,
            answered: vec![None; links],
        }
    }

    /// Takes `bytes` that came from `from` on the UDP socket of `link`: the answer to send
    /// back to `from`, or why there is none.
    pub fn handle(
        &mut self,
        link: usize,
        from: SocketAddr,
        bytes: &[u8],
    ) -> Result<[u8; LEN], Ignored> {
        let probe = Datagram::decode(bytes)
            .filter(|d| !d.answer)
            .ok_or(Ignored::NotAProbe)?;
        if probe.job != self.job {
            return Err(Ignored::OtherJob);
        }
        if probe.rank != self.left {
            return Err(Ignored::OtherRank(probe.rank));
        }
        let slot = self
            .answered
            .get_mut(link)
            .filter(|_| probe.link as usize == link)
            .ok_or(Ignored::OtherLink(probe.link))?;
        *slot = Some((from.ip().to_canonical(), probe.port));
        Ok(Datagram {
            answer: true,
            ..probe
        }
        .encode())
    }

    /// Whether the connection accepted on `link` from `peer` is native: its source is what
    /// the latest probe answered on that link announced.
    pub fn native(&self, link: usize, peer: SocketAddr) -> bool {
        self.answered.get(link).copied().flatten() == Some((peer.ip().to_canonical(), peer.port()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: u64 = 0x5eed;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("an address")
    }

    /// Runs `probe` until it waits, returning what it sent.
    fn sends(probe: &mut Probe, now: Instant) -> Vec<[u8; LEN]> {
        let mut out = Vec::new();
        while let Step::Send(bytes) = probe.poll(now) {
            out.push(bytes);
        }
        out
    }

    #[test]
    fn an_answered_probe_makes_the_connection_native_at_both_ends() {
        let t0 = Instant::now();
        let mut probe = Probe::new(JOB, 2, 1, 40002, 77, t0);
        let sent = sends(&mut probe, t0);
        assert_eq!(sent.len(), 1);
        let mut acceptor = Answerer::new(JOB, 2, 2);
        let answer = acceptor
            .handle(1, addr("10.0.0.2:51000"), &sent[0])
            .expect("answered");
        probe.received(&answer);
        assert_eq!(probe.poll(t0), Step::Done(Outcome::Answered));
        assert!(acceptor.native(1, addr("10.0.0.2:40002")));
        assert!(!acceptor.native(1, addr("10.0.0.2:40004")), "another port");
        assert!(!acceptor.native(1, addr("10.0.0.9:40002")), "another host");
        assert!(!acceptor.native(0, addr("10.0.0.2:40002")), "another link");
    }

    #[test]
    fn a_refused_probe_ends_at_once_as_mlx() {
        let t0 = Instant::now();
        let mut probe = Probe::new(JOB, 0, 0, 40000, 1, t0);
        assert_eq!(sends(&mut probe, t0).len(), 1);
        probe.refused();
        assert_eq!(probe.poll(t0), Step::Done(Outcome::Refused));
    }

    #[test]
    fn an_unanswered_probe_is_sent_three_times_and_times_out_after_the_wait() {
        let t0 = Instant::now();
        let mut probe = Probe::new(JOB, 0, 0, 40000, 1, t0);
        assert_eq!(sends(&mut probe, t0).len(), 1);
        assert_eq!(probe.poll(t0), Step::Wait { until: t0 + RESEND });
        assert_eq!(sends(&mut probe, t0 + RESEND).len(), 1);
        assert_eq!(sends(&mut probe, t0 + 2 * RESEND).len(), 1);
        assert_eq!(probe.poll(t0 + 2 * RESEND), Step::Wait { until: t0 + WAIT });
        assert_eq!(probe.poll(t0 + WAIT), Step::Done(Outcome::TimedOut));
        assert_eq!(probe.sent(), SENDS);
        // A late answer changes nothing: the driver connects from another port.
        probe.received(
            &Datagram {
                answer: true,
                job: JOB,
                rank: 0,
                link: 0,
                port: 40000,
                nonce: 1,
            }
            .encode(),
        );
        assert_eq!(probe.poll(t0 + WAIT), Step::Done(Outcome::TimedOut));
    }

    #[test]
    fn an_answer_that_does_not_echo_the_probe_is_ignored() {
        let t0 = Instant::now();
        let mut probe = Probe::new(JOB, 0, 0, 40000, 1, t0);
        let sent = sends(&mut probe, t0);
        let mut other = Datagram::decode(&sent[0]).expect("a probe");
        other.answer = true;
        for wrong in [
            Datagram { nonce: 2, ..other },
            Datagram {
                port: 40002,
                ..other
            },
            Datagram { job: 1, ..other },
            Datagram {
                answer: false,
                ..other
            },
        ] {
            probe.received(&wrong.encode());
        }
        probe.received(b"junk");
        assert!(matches!(probe.poll(t0), Step::Wait { .. }));
    }

    #[test]
    fn a_probe_of_another_job_is_not_answered() {
        let mut acceptor = Answerer::new(JOB, 0, 1);
        let probe = Datagram {
            answer: false,
            job: JOB + 1,
            rank: 0,
            link: 0,
            port: 40000,
            nonce: 3,
        };
        let from = addr("127.0.0.1:50000");
        assert_eq!(
            acceptor.handle(0, from, &probe.encode()),
            Err(Ignored::OtherJob)
        );
        assert!(!acceptor.native(0, addr("127.0.0.1:40000")));
    }

    #[test]
    fn a_probe_from_another_rank_or_for_another_link_is_not_answered() {
        let mut acceptor = Answerer::new(JOB, 3, 2);
        let probe = Datagram {
            answer: false,
            job: JOB,
            rank: 3,
            link: 0,
            port: 40000,
            nonce: 3,
        };
        let from = addr("127.0.0.1:50000");
        let wrong_rank = Datagram { rank: 1, ..probe };
        assert_eq!(
            acceptor.handle(0, from, &wrong_rank.encode()),
            Err(Ignored::OtherRank(1))
        );
        assert_eq!(
            acceptor.handle(1, from, &probe.encode()),
            Err(Ignored::OtherLink(0))
        );
        let beyond = Datagram { link: 7, ..probe };
        assert_eq!(
            acceptor.handle(7, from, &beyond.encode()),
            Err(Ignored::OtherLink(7))
        );
        assert!(!acceptor.native(0, addr("127.0.0.1:40000")));
        assert!(!acceptor.native(1, addr("127.0.0.1:40000")));
    }

    #[test]
    fn junk_is_dropped_without_an_answer() {
        let mut acceptor = Answerer::new(JOB, 0, 1);
        let from = addr("127.0.0.1:50000");
        let good = Datagram {
            answer: false,
            job: JOB,
            rank: 0,
            link: 0,
            port: 40000,
            nonce: 3,
        }
        .encode();
        let mut bad_version = good;
        bad_version[8] = 9;
        let mut bad_kind = good;
        bad_kind[9] = 7;
        let mut bad_padding = good;
        bad_padding[31] = 1;
        for junk in [
            &[][..],
            b"hello",
            &good[..LEN - 1],
            &[0u8; LEN],
            &bad_version,
            &bad_kind,
            &bad_padding,
        ] {
            assert_eq!(acceptor.handle(0, from, junk), Err(Ignored::NotAProbe));
        }
        let mut longer = good.to_vec();
        longer.push(0);
        assert_eq!(acceptor.handle(0, from, &longer), Err(Ignored::NotAProbe));
        assert!(acceptor.handle(0, from, &good).is_ok());
    }

    #[test]
    fn the_latest_answered_probe_of_a_link_decides_its_nativeness() {
        let mut acceptor = Answerer::new(JOB, 0, 1);
        let from = addr("127.0.0.1:50000");
        let first = Datagram {
            answer: false,
            job: JOB,
            rank: 0,
            link: 0,
            port: 40000,
            nonce: 3,
        };
        acceptor.handle(0, from, &first.encode()).expect("answered");
        let second = Datagram {
            port: 40002,
            nonce: 4,
            ..first
        };
        acceptor
            .handle(0, from, &second.encode())
            .expect("answered");
        assert!(!acceptor.native(0, addr("127.0.0.1:40000")));
        assert!(acceptor.native(0, addr("127.0.0.1:40002")));
    }

    #[test]
    fn every_reason_round_trips_through_its_code_and_no_other_code_is_one() {
        for n in NotNative::ALL {
            assert_eq!(NotNative::from_code(n.code()), Some(n));
        }
        assert_eq!(NotNative::from_code(0), None);
        assert_eq!(NotNative::from_code(8), None);
        let said = NotNative::Refused.describe(1, 2, 0, "10.0.0.3:5000");
        assert!(
            said.starts_with(
                "rank 2 did not answer the nuvec wire's probe on 10.0.0.3:5000 (an MLX rank"
            ),
            "{said}"
        );
    }

    #[test]
    fn a_datagram_round_trips_and_the_job_identity_depends_on_every_address() {
        let d = Datagram {
            answer: true,
            job: u64::MAX,
            rank: 5,
            link: 2,
            port: 65535,
            nonce: 0x0102_0304_0506_0708,
        };
        assert_eq!(Datagram::decode(&d.encode()), Some(d));
        let a = vec![
            vec!["10.0.0.1:5000".to_owned()],
            vec!["10.0.0.2:5000".into()],
        ];
        let b = vec![
            vec!["10.0.0.1:5000".to_owned()],
            vec!["10.0.0.2:5001".into()],
        ];
        assert_eq!(job_identity(&a), job_identity(&a.clone()));
        assert_ne!(job_identity(&a), job_identity(&b));
    }
}
