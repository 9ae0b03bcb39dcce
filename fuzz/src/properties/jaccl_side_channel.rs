//! Target `jaccl_side_channel`: MLX's JACCL side channel as rank r ≥ 1 of R ≤ 8, its state
//! machine ([`Protocol`], no socket, no thread) fed a scripted rank 0's bytes.
//!
//! The script: R, r, a fault, its position, then up to 8 operations (all-gathers of bytes and
//! of `i32`s, vector all-gathers, barriers, mesh and ring exchanges), each with its arguments,
//! the other ranks' data and whether rank 0 or another rank misbehaves (garbles this rank's
//! block, announces a different, negative or oversized count, breaks a barrier). A model of
//! rank 0 writes its replies in advance; the fault then cuts that stream short (where it ends,
//! the driver reports the connection closed) or flips one byte of it. The rest of the script
//! sizes each transfer: how many bytes one send takes and one receive delivers (a 0 byte, and
//! the end of the script, move all that is asked).
//!
//! The first version of this target drove a real `SideChannel` against a loopback rank 0 with
//! a reading thread; the input format is unchanged (bytes it left unread now size the
//! transfers), so the committed corpus still replays.

use nuvec_distributed::Error;
use nuvec_distributed::jaccl::side_channel::protocol::{
    self, Next, Operation, Output, Protocol, Stall,
};
use nuvec_distributed::jaccl::{Destination, RingDestinations};

use super::jaccl_destination::destination;
use super::script::Script;

/// One operation of a rank on the JACCL side channel.
#[derive(Debug)]
enum SideOp {
    Gather(Vec<u8>),
    GatherI32(i32),
    GatherVec(Vec<u8>, usize),
    Barrier,
    Mesh(Vec<Destination>),
    Ring(Vec<Destination>, Vec<Destination>),
}

/// What a side-channel operation returned.
#[derive(Debug, PartialEq)]
enum SideResult {
    Bytes(Vec<u8>),
    I32s(Vec<i32>),
    Records(Vec<Vec<u8>>),
    Done,
    Mesh(Vec<Vec<Destination>>),
    Ring(RingDestinations),
}

/// What the model expects of an operation.
#[derive(Debug)]
enum SideExpect {
    /// This result.
    Ok(SideResult),
    /// An argument error: nothing sent, the channel still usable.
    Invalid,
    /// A protocol or connection error (`Error::Connect`).
    Connect,
    /// Refused after an earlier failure (`Error::Failed`).
    Failed,
}

/// One all-gather as the scripted rank 0 runs it: what this rank sends, and where rank 0's
/// reply lies in the scripted stream.
struct SideGather {
    send: Vec<u8>,
    reply: std::ops::Range<usize>,
}

/// The model of an honest (or scripted-misbehaving) rank 0 for one rank r ≥ 1 of `size`.
struct SideModel<'a> {
    s: Script<'a>,
    rank: usize,
    size: usize,
    /// Rank 0's bytes to this rank.
    peer: Vec<u8>,
    gathers: Vec<SideGather>,
    /// A protocol failure has been modelled: later operations are refused.
    failed: bool,
}

impl SideModel<'_> {
    /// One all-gather of `mine`, the other ranks sending `others(k)`; with `garble`, rank 0
    /// sends back this rank's block changed. The reply, or `None` when this rank must refuse
    /// it.
    fn gather(
        &mut self,
        mine: &[u8],
        mut others: impl FnMut(&mut Script<'_>, usize) -> Vec<u8>,
        garble: bool,
    ) -> Option<Vec<u8>> {
        let n = mine.len();
        let mut reply = Vec::with_capacity(n * self.size);
        for k in 0..self.size {
            if k == self.rank {
                reply.extend_from_slice(mine);
            } else {
                let block = others(&mut self.s, k);
                assert_eq!(block.len(), n);
                reply.extend_from_slice(&block);
            }
        }
        let garbled = garble && n > 0;
        if garbled {
            let at = self.rank * n + usize::from(self.s.byte()) % n;
            reply[at] ^= self.s.byte() | 1;
        }
        let start = self.peer.len();
        self.peer.extend_from_slice(&reply);
        self.gathers.push(SideGather {
            send: mine.to_vec(),
            reply: start..self.peer.len(),
        });
        (!garbled).then_some(reply)
    }

    /// A gather of one `i32` per rank, the others sending `others(k)`.
    fn gather_i32(
        &mut self,
        mine: i32,
        mut others: impl FnMut(&mut Script<'_>, usize) -> i32,
        garble: bool,
    ) -> Option<Vec<i32>> {
        let reply = self.gather(
            &mine.to_le_bytes(),
            |s, k| others(s, k).to_le_bytes().to_vec(),
            garble,
        )?;
        Some(
            reply
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    }

    /// A rank other than this one and rank 0's own choice: the one that misbehaves.
    fn culprit(&mut self) -> usize {
        let k = usize::from(self.s.byte()) % (self.size - 1);
        if k >= self.rank { k + 1 } else { k }
    }

    /// MLX's exchange of `mine`: the counts, then the 32-byte records. `misbehave`: 1 a rank
    /// announces another count, 2 rank 0 garbles this rank's count, 3 its records.
    fn exchange(&mut self, mine: &[Destination], misbehave: u8) -> Option<Vec<Vec<Destination>>> {
        let n = mine.len() as i32;
        let odd = if misbehave == 1 {
            Some(self.culprit())
        } else {
            None
        };
        let counts = self.gather_i32(
            n,
            |s, k| {
                if Some(k) == odd {
                    n.wrapping_add(1 + i32::from(s.byte() % 4))
                        * if s.byte() & 1 == 1 { -1 } else { 1 }
                } else {
                    n
                }
            },
            misbehave == 2,
        )?;
        if counts.iter().any(|&c| c != n) {
            return None;
        }
        let bytes: Vec<u8> = mine.iter().flat_map(Destination::encode).collect();
        let reply = self.gather(
            &bytes,
            |s, _| s.bytes(mine.len() * Destination::BYTES),
            misbehave == 3,
        )?;
        let per_rank = mine.len() * Destination::BYTES;
        Some(
            (0..self.size)
                .map(|k| {
                    reply[k * per_rank..(k + 1) * per_rank]
                        .chunks_exact(Destination::BYTES)
                        .map(|r| Destination::decode(r).unwrap())
                        .collect()
                })
                .collect(),
        )
    }

    /// The next operation from the script and what it must do.
    fn op(&mut self) -> (SideOp, SideExpect) {
        let kind = self.s.byte();
        let behave = self.s.byte();
        // Rank 0 and the others are honest unless this byte says otherwise.
        let misbehave = if behave >= 192 { 1 + behave % 3 } else { 0 };
        let size = self.size;
        let (op, expect) = match kind % 6 {
            0 => {
                let n = usize::from(self.s.byte() % 48);
                let mine = self.s.bytes(n);
                let ok = (!self.failed)
                    .then(|| self.gather(&mine, |s, _| s.bytes(n), misbehave != 0))
                    .flatten();
                (SideOp::Gather(mine), ok.map(SideResult::Bytes))
            }
            1 => {
                let v = self.s.u32() as i32;
                let ok = (!self.failed)
                    .then(|| self.gather_i32(v, |s, _| s.u32() as i32, misbehave != 0))
                    .flatten();
                (SideOp::GatherI32(v), ok.map(SideResult::I32s))
            }
            2 => {
                let len_byte = self.s.byte();
                let record_len = if len_byte == 255 {
                    0
                } else {
                    1 + usize::from(len_byte % 40)
                };
                let count = usize::from(self.s.byte() % 5);
                let extra = usize::from(self.s.byte() == 255);
                let records = self.s.bytes(count * record_len + extra);
                if record_len == 0 || !records.len().is_multiple_of(record_len) {
                    return (SideOp::GatherVec(records, record_len), SideExpect::Invalid);
                }
                let count = records.len() / record_len;
                let ok = (!self.failed)
                    .then(|| self.gather_vec(&records, record_len, count, behave))
                    .flatten();
                (
                    SideOp::GatherVec(records, record_len),
                    ok.map(SideResult::Records),
                )
            }
            3 => {
                let ok = (!self.failed)
                    .then(|| {
                        for round in 0..2u8 {
                            // 1: a rank sends a non-zero value; 2: rank 0 garbles ours.
                            let odd =
                                (misbehave == 1 && behave & 8 == round * 8).then(|| self.culprit());
                            let values = self.gather_i32(
                                0,
                                |s, k| {
                                    if Some(k) == odd {
                                        (s.u32() | 1) as i32
                                    } else {
                                        0
                                    }
                                },
                                misbehave == 2 && behave & 8 == round * 8,
                            )?;
                            if values.iter().any(|&v| v != 0) {
                                return None;
                            }
                        }
                        Some(SideResult::Done)
                    })
                    .flatten();
                (SideOp::Barrier, ok)
            }
            4 => {
                let n = match self.s.byte() {
                    255 => size + 1,
                    254 => size - 1,
                    _ => size,
                };
                let mine: Vec<Destination> = (0..n).map(|_| destination(&mut self.s)).collect();
                if n != size {
                    return (SideOp::Mesh(mine), SideExpect::Invalid);
                }
                let ok = (!self.failed)
                    .then(|| self.exchange(&mine, misbehave))
                    .flatten();
                (SideOp::Mesh(mine), ok.map(SideResult::Mesh))
            }
            _ => {
                let wires = usize::from(self.s.byte() % 5);
                let uneven = usize::from(self.s.byte() == 255);
                let left: Vec<Destination> = (0..wires).map(|_| destination(&mut self.s)).collect();
                let right: Vec<Destination> = (0..wires + uneven)
                    .map(|_| destination(&mut self.s))
                    .collect();
                if uneven == 1 {
                    return (SideOp::Ring(left, right), SideExpect::Invalid);
                }
                let (on_left, on_right) = if behave & 8 == 0 {
                    (misbehave, 0)
                } else {
                    (0, misbehave)
                };
                let ok = (!self.failed)
                    .then(|| {
                        let l = self.exchange(&left, on_left)?;
                        let r = self.exchange(&right, on_right)?;
                        Some(SideResult::Ring(RingDestinations { left: l, right: r }))
                    })
                    .flatten();
                (SideOp::Ring(left, right), ok)
            }
        };
        let expect = match expect {
            Some(result) => SideExpect::Ok(result),
            None if self.failed => SideExpect::Failed,
            None => {
                self.failed = true;
                SideExpect::Connect
            }
        };
        (op, expect)
    }

    /// MLX's vector all-gather: counts, then the records padded to the longest.
    fn gather_vec(
        &mut self,
        records: &[u8],
        record_len: usize,
        count: usize,
        behave: u8,
    ) -> Option<Vec<Vec<u8>>> {
        let size = self.size;
        // 1: a negative count; 2: a count past the 64 MiB bound; 3: our count garbled;
        // 0: our records garbled.
        let misbehave = (behave >= 192).then_some(behave % 4);
        let odd = matches!(misbehave, Some(1 | 2)).then(|| self.culprit());
        let limit = (1usize << 26) / (record_len * size);
        let counts = self.gather_i32(
            count as i32,
            |s, k| match misbehave {
                Some(1) if Some(k) == odd => -1 - i32::from(s.byte()),
                Some(2) if Some(k) == odd => match s.byte() {
                    255 => i32::MAX,
                    b => i32::try_from(limit + 1 + usize::from(b)).unwrap_or(i32::MAX),
                },
                _ => i32::from(s.byte() % 5),
            },
            misbehave == Some(3),
        )?;
        if counts.iter().any(|&c| c < 0) {
            return None;
        }
        let counts: Vec<usize> = counts.iter().map(|&c| c as usize).collect();
        let longest = counts.iter().copied().max().unwrap_or(0);
        if longest > limit {
            return None;
        }
        let block = longest * record_len;
        let mut padded = records.to_vec();
        padded.resize(block, 0);
        let reply = self.gather(&padded, |s, _| s.bytes(block), misbehave == Some(0))?;
        Some(
            counts
                .iter()
                .enumerate()
                .map(|(k, &c)| reply[k * block..k * block + c * record_len].to_vec())
                .collect(),
        )
    }
}

/// Rank 0's side of the conversation: its scripted bytes, what the rank has sent, and the
/// script sizing each transfer.
struct Wire<'a> {
    /// Rank 0's bytes to this rank.
    peer: Vec<u8>,
    /// How many of them the rank has taken.
    taken: usize,
    /// The first bytes the rank sent (at most `keep`), and how many it sent in all.
    sent: Vec<u8>,
    sent_len: usize,
    keep: usize,
    sizes: Script<'a>,
}

impl Wire<'_> {
    /// How many of `want` bytes the next transfer moves: at least 1.
    fn size(&mut self, want: usize) -> usize {
        match self.sizes.byte() {
            0 => want,
            b => usize::from(b).min(want),
        }
    }
}

/// Runs `op` on the protocol over `wire`, checking what the protocol asks of its driver.
fn side_run(p: &mut Protocol, op: &SideOp, wire: &mut Wire<'_>) -> Result<SideResult, Error> {
    let operation = match op {
        SideOp::Gather(mine) => Operation::AllGather(mine.clone()),
        SideOp::GatherI32(v) => Operation::AllGather(v.to_le_bytes().to_vec()),
        SideOp::GatherVec(records, len) => Operation::AllGatherVec {
            records: records.clone(),
            record_len: *len,
        },
        SideOp::Barrier => Operation::Barrier,
        SideOp::Mesh(mine) => Operation::ExchangeMesh(mine.clone()),
        SideOp::Ring(left, right) => Operation::ExchangeRing {
            left: left.clone(),
            right: right.clone(),
        },
    };
    p.start(operation)?;
    let output = loop {
        match p.poll() {
            Next::Done(result) => break result?,
            Next::Send { peer, bytes, .. } => {
                assert_eq!(peer, 0, "rank {} sends only to rank 0", p.rank());
                assert!(!bytes.is_empty(), "the protocol asked to send nothing");
                let k = wire.size(bytes.len());
                let room = wire.keep.saturating_sub(wire.sent.len()).min(k);
                wire.sent.extend_from_slice(&bytes[..room]);
                wire.sent_len += k;
                p.on_sent(k);
            }
            Next::Receive { peer, len, .. } => {
                assert_eq!(peer, 0, "rank {} receives only from rank 0", p.rank());
                assert!(len > 0, "the protocol asked to receive nothing");
                let left = wire.peer.len() - wire.taken;
                if left == 0 {
                    return Err(p.stalled(Stall::Closed));
                }
                // When it is all that is asked, offer more: the protocol must take no byte past
                // its message.
                let k = wire.size(len);
                let extra = if k == len { 3 } else { 0 };
                let end = wire.peer.len().min(wire.taken + k + extra);
                let offer = &wire.peer[wire.taken..end];
                let took = p.on_received(offer);
                assert_eq!(
                    took,
                    offer.len().min(len),
                    "took {took} of {} offered, {len} asked",
                    offer.len()
                );
                wire.taken += took;
            }
        }
    };
    Ok(match (op, output) {
        (SideOp::GatherI32(_), Output::Bytes(b)) => SideResult::I32s(
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        (_, Output::Bytes(b)) => SideResult::Bytes(b),
        (_, Output::Records(r)) => SideResult::Records(r),
        (_, Output::Done) => SideResult::Done,
        (_, Output::Mesh(m)) => SideResult::Mesh(m),
        (_, Output::Ring(r)) => SideResult::Ring(r),
    })
}

/// MLX's JACCL side channel, byte for byte, as rank r ≥ 1 of R ≤ 8 against a scripted rank 0
/// (see the [module docs](self) for the script).
///
/// Properties: no panic; the protocol never asks to move zero bytes nor takes a byte past the
/// message it asked for; the rank sends its hello (its rank as a little-endian `i32`) and then
/// exactly each all-gather's block in MLX's order; every operation the stream reaches intact
/// returns what the model says: the gathered bytes, `i32`s, the unpadded records, the decoded
/// destinations, or an `Error::Connect` for a misbehaving peer; argument errors
/// (`InvalidArgument`) send nothing and leave the channel usable; the operation that runs
/// into the cut fails with `Error::Connect`; after any other error every later call fails with
/// `Error::Failed`.
pub(crate) fn jaccl_side_channel(data: &[u8]) {
    let mut s = Script(data);
    let size = 2 + usize::from(s.byte() % 7);
    let rank = 1 + usize::from(s.byte()) % (size - 1);
    let fault = s.byte();
    let fault_at = usize::from(s.u16());
    let ops = 1 + usize::from(s.byte() % 8);
    let mut model = SideModel {
        s,
        rank,
        size,
        peer: Vec::new(),
        gathers: Vec::new(),
        failed: false,
    };
    // Each operation with its expectation and the number of gathers modelled after it.
    let steps: Vec<(SideOp, SideExpect, usize)> = (0..ops)
        .map(|_| {
            let (op, expect) = model.op();
            (op, expect, model.gathers.len())
        })
        .collect();
    let SideModel {
        mut peer,
        gathers,
        s: sizes,
        ..
    } = model;

    // The fault: none, the stream cut at `cut`, or the byte at `flip` changed. Operations
    // whose gathers all end before it keep the model's expectations.
    let (cut, flip) = match fault {
        _ if peer.is_empty() => (None, None),
        0..=127 => (None, None),
        128..=191 => (Some(fault_at % (peer.len() + 1)), None),
        _ => (None, Some(fault_at % peer.len())),
    };
    let limit = cut.or(flip).unwrap_or(usize::MAX);
    if let Some(cut) = cut {
        peer.truncate(cut);
    }
    if let Some(at) = flip {
        peer[at] ^= 1 + (fault & 0x3f);
    }
    // The gathers whose blocks the rank sends for certain: those before the first reply that
    // runs into the fault, and that one.
    let reached = gathers
        .iter()
        .position(|g| g.reply.end > limit)
        .map_or(gathers.len(), |i| i + 1);
    let mut expected_sent = (rank as i32).to_le_bytes().to_vec();
    for g in &gathers[..reached] {
        expected_sent.extend_from_slice(&g.send);
    }

    // The driver sends the hello before the first operation.
    let hello = protocol::hello(rank).expect("a rank below 8 fits the hello");
    let mut wire = Wire {
        peer,
        taken: 0,
        sent: hello.to_vec(),
        sent_len: hello.len(),
        // After a flipped byte the rank may send up to 64 MiB: only the front is kept.
        keep: expected_sent.len() + 1,
        sizes,
    };
    let mut channel = Protocol::new(rank, size, std::time::Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("rank {rank} of {size}: {e}"));

    let mut failed_before = false;
    for (i, (op, expect, gathers_after)) in steps.iter().enumerate() {
        let result = side_run(&mut channel, op, &mut wire);
        if let Err(e) = &result {
            assert!(
                !e.to_string().contains("timed out"),
                "operation {i} ({op:?}) reported a timeout without a clock: {e}"
            );
        }
        let intact = gathers[..*gathers_after]
            .iter()
            .all(|g| g.reply.end <= limit);
        let what = || format!("operation {i} {op:?} (rank {rank} of {size})");
        match (expect, &result) {
            (SideExpect::Invalid, Err(Error::InvalidArgument { .. })) => {}
            (SideExpect::Invalid, other) => {
                panic!("{}: expected an argument error, got {other:?}", what())
            }
            (_, Err(Error::Failed { .. })) if failed_before => {}
            (_, other) if failed_before => {
                panic!("{}: expected Failed after a failure, got {other:?}", what())
            }
            (SideExpect::Ok(want), Ok(got)) if intact => {
                assert_eq!(got, want, "{}", what());
            }
            (SideExpect::Connect, Err(Error::Connect { .. })) if intact => {}
            (_, other) if intact => {
                panic!("{}: expected {expect:?}, got {other:?}", what())
            }
            // Runs into the cut: the stream ends, so the operation must fail.
            (_, Err(Error::Connect { .. })) if cut.is_some() => {}
            (_, other) if cut.is_some() => {
                panic!("{}: ran into the end of the stream, got {other:?}", what())
            }
            // After a flipped byte: anything but a panic, a hang or an unexpected error kind.
            (_, Ok(_) | Err(Error::Connect { .. })) => {}
            (_, other) => panic!("{}: after a flipped byte got {other:?}", what()),
        }
        if matches!(result, Err(Error::Connect { .. } | Error::Failed { .. })) {
            failed_before = true;
        }
    }
    let sent = &wire.sent;
    if flip.is_some() {
        assert!(
            sent.starts_with(&expected_sent),
            "rank {rank} of {size} sent {sent:02x?}, expected it to start with \
             {expected_sent:02x?}"
        );
    } else {
        assert_eq!(
            (&sent[..], wire.sent_len),
            (&expected_sent[..], expected_sent.len()),
            "what rank {rank} of {size} sent"
        );
    }
}
