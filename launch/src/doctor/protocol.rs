//! The probes' wire (sans-IO): what two probes say over one measured link, as bytes in and
//! messages out, with the serving side's state machine ([`Server`]) and the stream budget
//! ([`Stream`]). The socket code is `measure.rs` (the connecting side) and `probe.rs` (the
//! serving side); everything here is fed bytes and the time, so it is unit-tested.
//!
//! Wire facts (this protocol is nuvec-launch's own: no MLX rank ever sees it, it runs on
//! the probe ports, never on the job's): every message is an opcode byte and a fixed body,
//! integers big-endian.
//!
//! | opcode | body                    | sent by    | meaning                                       |
//! |--------|-------------------------|------------|-----------------------------------------------|
//! | `H`    |                         | connector  | hello: say where this connection arrived      |
//! | `I`    | u16 length, JSON        | server     | the arrival: `{"local", "interface", "mtu"}`  |
//! | `P`    | 8 bytes                 | both       | a ping, echoed unchanged                      |
//! | `U`    |                         | connector  | an upload starts (`B` frames, then `E`)       |
//! | `B`    | u32 length, payload     | both       | bulk bytes                                    |
//! | `E`    |                         | both       | the end of the bulk bytes                     |
//! | `R`    | u64 bytes, u64 nanos    | server     | what the upload delivered, timed on arrival   |
//! | `D`    | u64 bytes, u64 nanos    | connector  | download: stream until either bound, then `E` |
//! | `Q`    |                         | connector  | quit                                          |
//!
//! An upload is timed by the side that receives it, from `U` to `E`, so both directions are
//! measured where the bytes land (a sender's clock stops when its last write is queued).

use std::time::Duration;

/// The longest `I` body accepted (an arrival is a short JSON object).
pub(crate) const MAX_INFO: usize = 4096;
/// The longest `B` frame accepted.
pub(crate) const MAX_FRAME: usize = 4 << 20;

/// One message of the wire; `Data` is a run of a `B` frame's payload (not copied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Message {
    /// `H`.
    Hello,
    /// `I`: the arrival, as JSON text.
    Info(String),
    /// `P`.
    Ping([u8; 8]),
    /// `U`.
    Upload,
    /// Bytes of a `B` frame's payload, as they arrive.
    Data(usize),
    /// `E`.
    End,
    /// `R`.
    Report {
        /// Bytes the upload delivered.
        bytes: u64,
        /// Nanoseconds from `U` to `E` on arrival.
        nanos: u64,
    },
    /// `D`.
    Download {
        /// At most this many bytes.
        bytes: u64,
        /// For at most this many nanoseconds.
        nanos: u64,
    },
    /// `Q`.
    Quit,
}

/// A byte stream that is not this wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProtocolError(pub(crate) String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Turns received bytes into messages; a `B` frame's payload is counted, never copied.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// The bytes of a message not complete yet.
    pending: Vec<u8>,
    /// Payload bytes of the current `B` frame still to come.
    payload: usize,
}

fn body_len(op: u8, head: &[u8]) -> Result<Option<usize>, ProtocolError> {
    Ok(Some(match op {
        b'H' | b'U' | b'E' | b'Q' => 0,
        b'P' => 8,
        b'R' | b'D' => 16,
        b'B' => 4,
        b'I' => {
            if head.len() < 3 {
                return Ok(None);
            }
            let len = usize::from(u16::from_be_bytes([head[1], head[2]]));
            if len > MAX_INFO {
                return Err(ProtocolError(format!(
                    "an arrival of {len} bytes (at most {MAX_INFO})"
                )));
            }
            2 + len
        }
        other => {
            return Err(ProtocolError(format!(
                "opcode {other:#04x} is not the probes' wire"
            )));
        }
    }))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

impl Decoder {
    /// Reads from `input`: returns how many bytes were used and the message they completed,
    /// if any. Call again with the rest.
    pub(crate) fn decode(
        &mut self,
        input: &[u8],
    ) -> Result<(usize, Option<Message>), ProtocolError> {
        if self.payload > 0 {
            let n = self.payload.min(input.len());
            self.payload -= n;
            return Ok((n, (n > 0).then_some(Message::Data(n))));
        }
        let mut used = 0;
        loop {
            if self.pending.is_empty() {
                let Some(&op) = input.get(used) else {
                    return Ok((used, None));
                };
                self.pending.push(op);
                used += 1;
            }
            let op = self.pending[0];
            let Some(body) = body_len(op, &self.pending)? else {
                let Some(&b) = input.get(used) else {
                    return Ok((used, None));
                };
                self.pending.push(b);
                used += 1;
                continue;
            };
            let want = 1 + body;
            let take = (want - self.pending.len()).min(input.len() - used);
            self.pending.extend_from_slice(&input[used..used + take]);
            used += take;
            if self.pending.len() < want {
                return Ok((used, None));
            }
            let m = std::mem::take(&mut self.pending);
            let message = match op {
                b'H' => Message::Hello,
                b'U' => Message::Upload,
                b'E' => Message::End,
                b'Q' => Message::Quit,
                b'P' => {
                    let mut p = [0u8; 8];
                    p.copy_from_slice(&m[1..9]);
                    Message::Ping(p)
                }
                b'R' => Message::Report {
                    bytes: u64_at(&m, 1),
                    nanos: u64_at(&m, 9),
                },
                b'D' => Message::Download {
                    bytes: u64_at(&m, 1),
                    nanos: u64_at(&m, 9),
                },
                b'I' => Message::Info(String::from_utf8_lossy(&m[3..]).into_owned()),
                b'B' => {
                    let len = u32::from_be_bytes([m[1], m[2], m[3], m[4]]) as usize;
                    if len > MAX_FRAME {
                        return Err(ProtocolError(format!(
                            "a frame of {len} bytes (at most {MAX_FRAME})"
                        )));
                    }
                    self.payload = len;
                    let n = len.min(input.len() - used);
                    self.payload -= n;
                    used += n;
                    return Ok((used, Some(Message::Data(n))));
                }
                _ => unreachable!("body_len accepted only the opcodes above"),
            };
            return Ok((used, Some(message)));
        }
    }
}

/// `message` as bytes (`Data(n)` is a `B` frame header for `n` payload bytes, which the
/// caller sends after it).
pub(crate) fn encode(message: &Message) -> Vec<u8> {
    match message {
        Message::Hello => vec![b'H'],
        Message::Upload => vec![b'U'],
        Message::End => vec![b'E'],
        Message::Quit => vec![b'Q'],
        Message::Ping(p) => {
            let mut v = vec![b'P'];
            v.extend_from_slice(p);
            v
        }
        Message::Info(text) => {
            let bytes = &text.as_bytes()[..text.len().min(MAX_INFO)];
            let mut v = vec![b'I'];
            v.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
            v.extend_from_slice(bytes);
            v
        }
        Message::Data(n) => {
            let mut v = vec![b'B'];
            v.extend_from_slice(&(*n as u32).to_be_bytes());
            v
        }
        Message::Report { bytes, nanos } | Message::Download { bytes, nanos } => {
            let mut v = vec![if matches!(message, Message::Report { .. }) {
                b'R'
            } else {
                b'D'
            }];
            v.extend_from_slice(&bytes.to_be_bytes());
            v.extend_from_slice(&nanos.to_be_bytes());
            v
        }
    }
}

/// A bounded stream of bulk bytes: how big the next frame is, until either bound is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stream {
    /// At most this many bytes.
    pub(crate) bytes: u64,
    /// For at most this long.
    pub(crate) time: Duration,
    /// Bytes framed so far.
    pub(crate) sent: u64,
    /// The frame size.
    pub(crate) frame: usize,
}

impl Stream {
    /// A stream of at most `bytes` bytes for at most `time`, in frames of `frame` bytes.
    pub(crate) fn new(bytes: u64, time: Duration, frame: usize) -> Stream {
        Stream {
            bytes,
            time,
            sent: 0,
            frame: frame.clamp(1, MAX_FRAME),
        }
    }

    /// The next frame's size `elapsed` after the stream started, or `None` when it is done.
    pub(crate) fn next(&mut self, elapsed: Duration) -> Option<usize> {
        if self.sent >= self.bytes || elapsed >= self.time {
            return None;
        }
        let n = (self.bytes - self.sent).min(self.frame as u64) as usize;
        self.sent += n as u64;
        Some(n)
    }
}

/// What the serving side does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send these bytes.
    Send(Vec<u8>),
    /// Stream bulk bytes within these bounds, then `E`.
    Stream(Stream),
    /// Close the connection.
    Close,
}

/// The serving side of one link, fed the messages it receives and the time (since any fixed
/// instant); `info` is the arrival it tells a hello.
#[derive(Debug)]
pub(crate) struct Server {
    info: String,
    /// When the current upload started and how many bytes it delivered.
    upload: Option<(Duration, u64)>,
    frame: usize,
}

impl Server {
    /// A server that answers a hello with `info` and streams in frames of `frame` bytes.
    pub(crate) fn new(info: String, frame: usize) -> Server {
        Server {
            info,
            upload: None,
            frame,
        }
    }

    /// What to do on `message`, received at `now`.
    ///
    /// # Errors
    ///
    /// A message the connecting side never sends, or bulk bytes outside an upload.
    pub(crate) fn on(
        &mut self,
        message: Message,
        now: Duration,
    ) -> Result<Vec<Action>, ProtocolError> {
        Ok(match message {
            Message::Hello => vec![Action::Send(encode(&Message::Info(self.info.clone())))],
            Message::Ping(p) => vec![Action::Send(encode(&Message::Ping(p)))],
            Message::Upload => {
                self.upload = Some((now, 0));
                Vec::new()
            }
            Message::Data(n) => {
                let Some((_, bytes)) = &mut self.upload else {
                    return Err(ProtocolError("bulk bytes outside an upload".into()));
                };
                *bytes += n as u64;
                Vec::new()
            }
            Message::End => {
                let Some((start, bytes)) = self.upload.take() else {
                    return Err(ProtocolError("an end outside an upload".into()));
                };
                let nanos = now
                    .saturating_sub(start)
                    .as_nanos()
                    .min(u128::from(u64::MAX)) as u64;
                vec![Action::Send(encode(&Message::Report { bytes, nanos }))]
            }
            Message::Download { bytes, nanos } => vec![Action::Stream(Stream::new(
                bytes,
                Duration::from_nanos(nanos),
                self.frame,
            ))],
            Message::Quit => vec![Action::Close],
            m @ (Message::Info(_) | Message::Report { .. }) => {
                return Err(ProtocolError(format!("{m:?} from the connecting side")));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `bytes` fed in pieces of `step` bytes.
    fn decode_all(bytes: &[u8], step: usize) -> Vec<Message> {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for chunk in bytes.chunks(step) {
            let mut at = 0;
            loop {
                let (used, m) = d.decode(&chunk[at..]).expect("the probes' wire");
                at += used;
                match m {
                    // Payload runs are merged, so that every split gives the same list.
                    Some(Message::Data(n)) => match out.last_mut() {
                        Some(Message::Data(k)) => *k += n,
                        _ => out.push(Message::Data(n)),
                    },
                    Some(m) => out.push(m),
                    None => break,
                }
            }
        }
        out
    }

    #[test]
    fn every_message_decodes_as_it_was_encoded_however_the_bytes_are_split() {
        let messages = [
            Message::Hello,
            Message::Info(r#"{"interface":"en2"}"#.into()),
            Message::Ping(*b"12345678"),
            Message::Upload,
            Message::Data(10),
            Message::End,
            Message::Report {
                bytes: 1 << 40,
                nanos: 7,
            },
            Message::Download {
                bytes: 64 << 20,
                nanos: 1_000_000_000,
            },
            Message::Quit,
        ];
        let mut bytes = Vec::new();
        for m in &messages {
            bytes.extend(encode(m));
            if let Message::Data(n) = m {
                bytes.extend(std::iter::repeat_n(0xAB, *n));
            }
        }
        for step in [1, 2, 3, 7, bytes.len()] {
            assert_eq!(decode_all(&bytes, step), messages, "pieces of {step}");
        }
    }

    #[test]
    fn a_stranger_speaking_another_protocol_is_an_error_not_a_hang() {
        let mut d = Decoder::default();
        assert!(d.decode(b"GET / HTTP/1.1\r\n").is_err());
        let mut d = Decoder::default();
        let mut huge = vec![b'B'];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(d.decode(&huge).is_err());
    }

    #[test]
    fn the_server_times_an_upload_from_its_start_to_its_end_on_arrival() {
        let mut s = Server::new("{}".into(), 1 << 20);
        let t = Duration::from_millis;
        assert_eq!(s.on(Message::Upload, t(100)), Ok(vec![]));
        assert_eq!(s.on(Message::Data(1000), t(150)), Ok(vec![]));
        assert_eq!(s.on(Message::Data(24), t(200)), Ok(vec![]));
        assert_eq!(
            s.on(Message::End, t(600)),
            Ok(vec![Action::Send(encode(&Message::Report {
                bytes: 1024,
                nanos: 500_000_000
            }))])
        );
        // Bulk bytes outside an upload are a protocol error.
        assert!(s.on(Message::Data(1), t(700)).is_err());
        assert_eq!(
            s.on(Message::Ping(*b"abcdefgh"), t(800)),
            Ok(vec![Action::Send(encode(&Message::Ping(*b"abcdefgh")))])
        );
        assert_eq!(s.on(Message::Quit, t(900)), Ok(vec![Action::Close]));
    }

    #[test]
    fn a_stream_stops_at_whichever_bound_comes_first() {
        let mut by_bytes = Stream::new(2500, Duration::from_secs(1), 1000);
        let frames: Vec<usize> =
            std::iter::from_fn(|| by_bytes.next(Duration::from_millis(1))).collect();
        assert_eq!(frames, [1000, 1000, 500]);
        let mut by_time = Stream::new(u64::MAX, Duration::from_secs(1), 1000);
        assert_eq!(by_time.next(Duration::from_millis(999)), Some(1000));
        assert_eq!(by_time.next(Duration::from_secs(1)), None);
    }
}
