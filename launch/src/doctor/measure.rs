//! The connecting side of one link, as the job's connecting rank would see it: first a
//! bounded connect to the job's own port (nobody listens there before the job, so a refusal
//! is the answer expected; silence is a firewall dropping the SYN), then the probe's link to
//! the peer's probe port: the connect time, where the traffic leaves from, round trips of
//! small messages, then bulk bytes each way within a bound of bytes and time. Blocking
//! sockets, every read and write bounded by [`Budget::io`]; the wire is `protocol.rs`'s.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::endpoint::{Endpoint, endpoint};
use super::protocol::{Decoder, Message, Stream, encode};

/// The bulk frame size.
pub(crate) const FRAME: usize = 1 << 20;

/// How much a measurement may take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Budget {
    /// The longest connect (a SYN dropped is retried by the kernel after 1 s: 2 s sees one
    /// retry).
    pub(crate) connect: Duration,
    /// How many round trips of 8 bytes.
    pub(crate) pings: usize,
    /// At most this many bytes each way...
    pub(crate) bytes: u64,
    /// ...for at most this long each way.
    pub(crate) time: Duration,
    /// The longest any one read or write may wait.
    pub(crate) io: Duration,
}

/// What a bounded connect to a port found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct PortCheck {
    /// `refused` (nobody listens: the host answers), `open` (something listens), `timeout`
    /// (no answer at all: a firewall dropping the SYN, or no route), `error`.
    pub(crate) outcome: String,
    /// How long the answer took, in milliseconds.
    pub(crate) ms: f64,
    /// The system's error, for `error` and `timeout`.
    pub(crate) detail: Option<String>,
}

/// Round-trip latency of small messages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Rtt {
    /// Median, microseconds.
    pub(crate) p50_us: f64,
    /// 99th percentile, microseconds.
    pub(crate) p99_us: f64,
    /// How many round trips.
    pub(crate) count: usize,
}

/// One direction's bulk transfer, timed where the bytes landed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Transfer {
    /// Bytes delivered.
    pub(crate) bytes: u64,
    /// Seconds taken.
    pub(crate) seconds: f64,
}

impl Transfer {
    /// Bits per second.
    pub(crate) fn bps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 * 8.0 / self.seconds
        } else {
            0.0
        }
    }
}

/// Everything measured on one link; what could not be measured is `None`, and `error` says
/// where the measurement stopped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Measurement {
    /// The job's port, checked first.
    pub(crate) job_port: Option<PortCheck>,
    /// The connect to the peer's probe, in milliseconds.
    pub(crate) connect_ms: Option<f64>,
    /// Where the traffic left from.
    pub(crate) from: Option<Endpoint>,
    /// Where it arrived (the peer's answer).
    pub(crate) to: Option<Endpoint>,
    /// Round trips.
    pub(crate) rtt: Option<Rtt>,
    /// Bulk bytes from the connecting rank to its peer.
    pub(crate) forward: Option<Transfer>,
    /// Bulk bytes back.
    pub(crate) back: Option<Transfer>,
    /// Why the measurement stopped early.
    pub(crate) error: Option<String>,
}

/// A bounded connect to `addr`.
pub(crate) fn check_port(addr: SocketAddr, timeout: Duration) -> PortCheck {
    let start = Instant::now();
    let result = TcpStream::connect_timeout(&addr, timeout);
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let (outcome, detail) = match result {
        Ok(_) => ("open", None),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => ("refused", None),
        Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
            ("timeout", Some(format!("no answer within {timeout:?}")))
        }
        Err(e) => ("error", Some(e.to_string())),
    };
    PortCheck {
        outcome: outcome.to_owned(),
        ms,
        detail,
    }
}

/// The link's connection: a socket and the decoder of what it receives.
struct Conn {
    stream: TcpStream,
    decoder: Decoder,
    buf: Vec<u8>,
    at: usize,
    end: usize,
}

impl Conn {
    fn send(&mut self, bytes: &[u8], what: &str) -> Result<(), String> {
        self.stream
            .write_all(bytes)
            .map_err(|e| format!("{what}: sending {} bytes: {e}", bytes.len()))
    }

    /// The next message (bulk bytes as `Data` runs).
    fn next(&mut self, what: &str) -> Result<Message, String> {
        loop {
            let (used, m) = self
                .decoder
                .decode(&self.buf[self.at..self.end])
                .map_err(|e| format!("{what}: {e}"))?;
            self.at += used;
            if let Some(m) = m {
                return Ok(m);
            }
            self.at = 0;
            self.end = match self.stream.read(&mut self.buf) {
                Ok(0) => return Err(format!("{what}: the peer's probe closed the connection")),
                Ok(n) => n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(format!(
                        "{what}: nothing received within the read bound ({e})"
                    ));
                }
                Err(e) => return Err(format!("{what}: {e}")),
            };
        }
    }
}

/// Measures the link whose job address is `job` and whose probe listens at `probe`.
pub(crate) fn measure(job: SocketAddr, probe: SocketAddr, budget: &Budget) -> Measurement {
    let mut m = Measurement {
        job_port: Some(check_port(job, budget.connect)),
        ..Measurement::default()
    };
    if let Err(e) = measure_probe(probe, budget, &mut m) {
        m.error = Some(e);
    }
    m
}

fn measure_probe(probe: SocketAddr, budget: &Budget, m: &mut Measurement) -> Result<(), String> {
    let start = Instant::now();
    let stream = TcpStream::connect_timeout(&probe, budget.connect).map_err(|e| {
        if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) {
            format!(
                "connecting to the peer's probe at {probe}: no answer within {:?}",
                budget.connect
            )
        } else {
            format!("connecting to the peer's probe at {probe}: {e}")
        }
    })?;
    m.connect_ms = Some(start.elapsed().as_secs_f64() * 1e3);
    let set = |r: std::io::Result<()>| r.map_err(|e| format!("setting up the socket: {e}"));
    set(stream.set_nodelay(true))?;
    set(stream.set_read_timeout(Some(budget.io)))?;
    set(stream.set_write_timeout(Some(budget.io)))?;
    m.from = stream.local_addr().ok().map(endpoint);
    let mut c = Conn {
        stream,
        decoder: Decoder::default(),
        buf: vec![0; 256 << 10],
        at: 0,
        end: 0,
    };
    c.send(&encode(&Message::Hello), "hello")?;
    match c.next("hello")? {
        Message::Info(text) => m.to = serde_json::from_str(&text).ok(),
        other => return Err(format!("hello: answered {other:?}")),
    }

    let mut rtts = Vec::with_capacity(budget.pings);
    for i in 0..budget.pings {
        let token = (i as u64).to_be_bytes();
        let t = Instant::now();
        c.send(&encode(&Message::Ping(token)), "ping")?;
        match c.next("ping")? {
            Message::Ping(back) if back == token => {}
            other => return Err(format!("ping {i}: answered {other:?}")),
        }
        rtts.push(t.elapsed());
    }
    m.rtt = rtt(&mut rtts);

    // Forward: this side sends, the peer times the arrival.
    c.send(&encode(&Message::Upload), "upload")?;
    let zeros = vec![0u8; FRAME];
    let mut stream = Stream::new(budget.bytes, budget.time, FRAME);
    let t = Instant::now();
    while let Some(n) = stream.next(t.elapsed()) {
        c.send(&encode(&Message::Data(n)), "upload")?;
        c.send(&zeros[..n], "upload")?;
    }
    c.send(&encode(&Message::End), "upload")?;
    match c.next("upload")? {
        Message::Report { bytes, nanos } => {
            m.forward = Some(Transfer {
                bytes,
                seconds: nanos as f64 / 1e9,
            });
        }
        other => return Err(format!("upload: answered {other:?}")),
    }

    // Back: the peer sends, this side times the arrival.
    let nanos = budget.time.as_nanos().min(u128::from(u64::MAX)) as u64;
    let t = Instant::now();
    c.send(
        &encode(&Message::Download {
            bytes: budget.bytes,
            nanos,
        }),
        "download",
    )?;
    let mut bytes = 0u64;
    loop {
        match c.next("download")? {
            Message::Data(n) => bytes += n as u64,
            Message::End => break,
            other => return Err(format!("download: received {other:?}")),
        }
    }
    m.back = Some(Transfer {
        bytes,
        seconds: t.elapsed().as_secs_f64(),
    });
    c.send(&encode(&Message::Quit), "quit")?;
    Ok(())
}

/// p50 and p99 of `samples` (sorted in place).
pub(crate) fn rtt(samples: &mut [Duration]) -> Option<Rtt> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let at = |q: usize| samples[(samples.len() * q / 100).min(samples.len() - 1)];
    Some(Rtt {
        p50_us: at(50).as_secs_f64() * 1e6,
        p99_us: at(99).as_secs_f64() * 1e6,
        count: samples.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_percentiles_are_read_from_the_sorted_samples() {
        let mut s: Vec<Duration> = (1..=200).rev().map(Duration::from_micros).collect();
        let r = rtt(&mut s).expect("samples");
        assert_eq!(
            (r.p50_us.round(), r.p99_us.round(), r.count),
            (101.0, 199.0, 200)
        );
        assert_eq!(rtt(&mut []), None);
    }

    #[test]
    fn a_port_nobody_listens_on_is_refused_not_timed_out() {
        // A port bound then closed on loopback: nobody listens, the kernel answers RST.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let c = check_port(port, Duration::from_secs(2));
        assert_eq!(c.outcome, "refused", "{c:?}");
    }
}
