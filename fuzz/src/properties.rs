//! The properties the fuzz targets check, one function per target, shared by the cargo-fuzz
//! binaries (`fuzz/fuzz_targets/*.rs`) and the stable replay test (`tests/fuzz_corpus.rs`),
//! which both include this file with `#[path]`.
//!
//! Each function takes the raw fuzzer input and panics when a property fails; a function
//! returns normally for every input that the code under test handles correctly, including
//! inputs it rightly refuses. Nothing here depends on a fuzzing crate, so the replay test
//! builds on stable with the crate's ordinary dependencies.
//!
//! To add a target: write `pub(crate) fn <name>(data: &[u8])` here, add it to [`TARGETS`], add
//! `fuzz/fuzz_targets/<name>.rs` (a copy of an existing one calling it) and a `[[bin]]` in
//! `fuzz/Cargo.toml`, and seed `fuzz/corpus/<name>/`.

// Every target uses one of these functions.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use nuvec_distributed::fabric::Wiring;
use nuvec_distributed::hostfile;
use nuvec_distributed::ring::RingTopology;
use nuvec_distributed::ring::schedule::{self, Flow, Phase};
use nuvec_distributed::stream::Reassembly;

/// A property: panics when the input shows a bug.
pub(crate) type Property = fn(&[u8]);

/// Every target by name (the directory names under `fuzz/corpus/` and `fuzz/artifacts/`).
pub(crate) const TARGETS: &[(&str, Property)] = &[
    ("hostfile", hostfile),
    ("address", address),
    ("stream_reassembly", stream_reassembly),
    ("ring_schedule", ring_schedule),
];

/// The input as text: itself when it is UTF-8, else with invalid bytes replaced (so binary
/// inputs still reach the parser).
fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// `hostfile::parse` never panics; when it accepts a text, the nodes are non-empty, every rank
/// lists the same (non-zero) number of addresses, every address passes
/// `hostfile::split_address`, and `parse(write(nodes)) == nodes` (also with `mlx.launch`'s
/// trailing newline and a byte-order mark).
pub(crate) fn hostfile(data: &[u8]) {
    let text = text(data);
    let Ok(nodes) = hostfile::parse(&text, "fuzz") else {
        return;
    };
    assert!(
        !nodes.is_empty(),
        "accepted a hostfile with no ranks: {text:?}"
    );
    let width = nodes[0].len();
    assert!(width > 0, "accepted a rank with no addresses: {text:?}");
    for (rank, addresses) in nodes.iter().enumerate() {
        assert_eq!(
            addresses.len(),
            width,
            "rank {rank} has a different address count: {text:?}"
        );
        for address in addresses {
            if let Err(e) = hostfile::split_address(address) {
                panic!("accepted address {address:?} does not split ({e}): {text:?}");
            }
        }
    }
    let written = hostfile::write(&nodes);
    for again in [
        written.clone(),
        format!("{written}\n"),
        format!("\u{feff}{written}"),
    ] {
        match hostfile::parse(&again, "rewritten") {
            Ok(back) => assert_eq!(back, nodes, "round trip of {text:?} via {again:?}"),
            Err(e) => panic!("the written form {again:?} of {text:?} does not parse: {e}"),
        }
    }
}

/// `hostfile::split_address` never panics; an accepted `(host, port)` has a non-empty host
/// without whitespace and a port from 1 to 65535, re-formats (an IPv6 host in brackets) to
/// an address that splits to the same pair, and the re-formatted address is the input up to
/// leading zeros of the port.
pub(crate) fn address(data: &[u8]) {
    let text = text(data);
    let Ok((host, port)) = hostfile::split_address(&text) else {
        return;
    };
    assert!(!host.is_empty(), "empty host from {text:?}");
    assert!(port >= 1, "port 0 from {text:?}");
    assert!(
        !host.chars().any(|c| c.is_whitespace() || c.is_control()),
        "host {host:?} from {text:?} has whitespace"
    );
    let is_v6 = host.contains(':');
    if is_v6 {
        assert!(
            host.parse::<std::net::Ipv6Addr>().is_ok(),
            "host {host:?} from {text:?} has a ':' but is not an IPv6 literal"
        );
    }
    let formatted = if is_v6 {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    match hostfile::split_address(&formatted) {
        Ok(back) => assert_eq!(back, (host.clone(), port), "{text:?} via {formatted:?}"),
        Err(e) => panic!("{text:?} re-formatted as {formatted:?} does not split: {e}"),
    }
    let (prefix, digits) = text
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("accepted {text:?} without a ':'"));
    let bare_prefix = if is_v6 { format!("[{host}]") } else { host };
    assert_eq!(prefix, bare_prefix, "the host part of {text:?}");
    assert_eq!(
        digits.trim_start_matches('0'),
        port.to_string(),
        "the port part of {text:?}"
    );
}

/// Reads a fuzzer input as a script of small numbers, then zeros once it runs out.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The byte at `i` of a scripted stream: no short period, so a piece delivered at the wrong
/// offset shows.
fn stream_byte(i: usize) -> u8 {
    let x = (i as u32).wrapping_mul(0x9E37_79B9) ^ (i as u32 >> 7);
    (x >> 24) as u8
}

/// Drives [`Reassembly`] as the TCP fabric does (`src/tcp/mod.rs`, `advance`): each read goes
/// into the range [`Reassembly::next_read`] offers and is at most what the scripted socket
/// returns. The script: grain `1 + b % 16`; length `grain × (u16 % 1024)`; scratch size `b % 80`
/// (it may be smaller than a grain); then one read size per byte, where 0 is a read that
/// found nothing (`absorb(0)` must be harmless); once the script ends, the socket returns all
/// it is offered.
///
/// Properties: no offered range goes past the scratch buffer or the end of the receive; the
/// pending tail is less than a grain; the pieces are contiguous from offset 0, non-empty
/// multiples of the grain, and together equal the stream; the receive completes. With a
/// scratch buffer of at least one grain, an incomplete receive always offers room (the TCP
/// fabric takes an empty read for a closed peer); with a smaller one it may stall, but only
/// without delivering anything wrong.
pub(crate) fn stream_reassembly(data: &[u8]) {
    let mut script = Script(data);
    let grain = 1 + usize::from(script.byte() % 16);
    let len = grain * usize::from(script.u16() % 1024);
    let scratch_len = usize::from(script.byte() % 80);
    let stream: Vec<u8> = (0..len).map(stream_byte).collect();
    let mut scratch = vec![0xAAu8; scratch_len];
    let mut r = Reassembly::new(len, grain);
    let mut delivered: Vec<u8> = Vec::with_capacity(len);
    // Every read after the script ends takes at least one byte, so this bounds the loop.
    while !r.is_complete() {
        let at = r.next_read(scratch_len);
        assert!(
            at.end <= scratch_len,
            "offered {at:?} past a scratch of {scratch_len}"
        );
        assert!(
            at.start < grain,
            "a pending tail of {} ≥ grain {grain}",
            at.start
        );
        let base = r.done();
        assert!(
            base + at.end <= len,
            "offered stream bytes {}..{} past the end {len}",
            base + at.start,
            base + at.end
        );
        if at.is_empty() {
            assert!(
                scratch_len < grain,
                "an incomplete receive (done {base} of {len}, grain {grain}, scratch \
                 {scratch_len}) offers no room: the TCP fabric would read 0 bytes and report \
                 a closed peer"
            );
            return;
        }
        let want = if script.is_empty() {
            at.len()
        } else {
            usize::from(script.byte())
        };
        let n = want.min(at.len());
        let from = base + at.start;
        scratch[at.start..at.start + n].copy_from_slice(&stream[from..from + n]);
        let before = r.done();
        r.absorb(&mut scratch, n, |offset, bytes| {
            assert_eq!(offset, delivered.len(), "a piece not contiguous");
            assert!(!bytes.is_empty(), "an empty piece at {offset}");
            assert_eq!(
                bytes.len() % grain,
                0,
                "a piece of {} bytes, grain {grain}",
                bytes.len()
            );
            assert!(offset + bytes.len() <= len, "a piece past the end");
            assert_eq!(
                bytes,
                &stream[offset..offset + bytes.len()],
                "wrong bytes at {offset}"
            );
            delivered.extend_from_slice(bytes);
        });
        assert_eq!(
            r.done(),
            delivered.len(),
            "done() disagrees with the pieces"
        );
        assert!(r.done() >= before, "done() went backwards");
    }
    assert_eq!(r.done(), len);
    assert_eq!(delivered, stream, "the pieces do not make the stream");
    assert!(
        r.next_read(scratch_len).is_empty(),
        "a complete receive offers more room"
    );
}

/// Checks that `ranges` are contiguous from 0 and end at `end`, so they cover `0..end` once.
fn partition(ranges: impl IntoIterator<Item = std::ops::Range<usize>>, end: usize, what: &str) {
    let mut next = 0;
    for r in ranges {
        assert_eq!(r.start, next, "{what}: a gap or overlap at {next}");
        assert!(r.start <= r.end, "{what}: a reversed range {r:?}");
        next = r.end;
    }
    assert_eq!(next, end, "{what}: covers 0..{next}, not 0..{end}");
}

/// [`schedule`]'s arithmetic for fuzzed E elements of s bytes over R ranks and C connections:
/// R = `1 + b % 24`, C = `1 + b % 8`, s = `1 + b % 16` (the widest real element is 8 bytes),
/// E a `u32` (biased by one more byte toward the sub-reduce thresholds).
///
/// Properties: a single rank has no parts; with E < R (0 included) the buffer is padded to R
/// elements; the all-reduce parts cover the (padded) buffer exactly once, in order, non-empty,
/// at most 2C of them, with MLX's pair and flow; the R segments of each part partition it; a
/// symbolic run of every rank's steps in each flow is an all-reduce (each received partial sum
/// is disjoint from the receiver's, every rank ends with every segment summed over all ranks,
/// and the gather phase copies only finished segments); the gather parts cover each block
/// once and a symbolic all-gather gives every rank every block; `p2p_split` covers the bytes
/// exactly with at most C sockets of at least 1024 bytes (all but the last exactly
/// `max(1024, ⌈n/C⌉)`); the send and receive sides agree between every pair of ranks; and each
/// side's channel is the far end of the matching channel in `Wiring::ring` (R ≤ 8).
pub(crate) fn ring_schedule(data: &[u8]) {
    let mut script = Script(data);
    let ranks = 1 + usize::from(script.byte() % 24);
    let conns = 1 + usize::from(script.byte() % 8);
    let size = 1 + usize::from(script.byte() % 16);
    let raw = script.u32() as usize;
    // Half the inputs land near a multiple of the 256 KiB-per-rank threshold.
    let elements = match script.byte() {
        b if b & 1 == 1 => {
            let k = usize::from(b >> 1) % (2 * conns + 2);
            let threshold = k * ranks * schedule::MIN_SEND_SIZE / size;
            threshold + (raw % 64) - 32.min(threshold)
        }
        _ => raw % (1 << 26),
    };

    // The all-reduce plan.
    let plan = schedule::all_reduce_plan(elements, size, ranks, conns);
    if ranks < 2 {
        assert!(plan.parts.is_empty() && plan.padded.is_none(), "{plan:?}");
    } else {
        // MLX takes the small (padded) path for E < R, E = 0 included.
        if elements < ranks {
            assert_eq!(plan.padded, Some(ranks), "E = {elements} < R = {ranks}");
            assert_eq!(plan.parts.len(), 1);
            assert_eq!(plan.parts[0].flow, Flow::Rightward);
        } else {
            assert_eq!(plan.padded, None);
        }
        let len = plan.padded.unwrap_or(elements);
        assert!(
            (1..=2 * conns).contains(&plan.parts.len()),
            "{} parts with C = {conns}",
            plan.parts.len()
        );
        partition(plan.parts.iter().map(|p| p.range.clone()), len, "parts");
        for (i, part) in plan.parts.iter().enumerate() {
            assert_eq!(part.index, i);
            assert_eq!(part.pair, i / 2);
            assert!(part.pair < conns, "pair {} with C = {conns}", part.pair);
            if plan.padded.is_none() {
                assert_eq!(part.flow, Flow::of(i));
            }
            assert!(!part.range.is_empty(), "part {i} is empty: {plan:?}");
            let plen = part.range.len();
            partition(
                (0..ranks).map(|j| schedule::segment(plen, ranks, j)),
                plen,
                "segments",
            );
        }
        // The symbolic runs depend on R alone: once per R and process (they cost more than
        // everything else here together).
        static SYMBOLIC_DONE: AtomicU32 = AtomicU32::new(0);
        if SYMBOLIC_DONE.load(Ordering::Relaxed) & (1 << ranks) == 0 {
            for flow in [Flow::Leftward, Flow::Rightward] {
                symbolic_all_reduce(ranks, flow);
                symbolic_all_gather(ranks, flow);
            }
            SYMBOLIC_DONE.fetch_or(1 << ranks, Ordering::Relaxed);
        }
    }

    // The all-gather plan over one rank's block of `elements × size` bytes.
    let bytes = elements.saturating_mul(size);
    let parts = schedule::all_gather_plan(bytes, conns);
    assert!(parts.len() <= 2 * conns);
    assert_eq!(parts.is_empty(), bytes == 0);
    partition(parts.iter().map(|p| p.range.clone()), bytes, "gather parts");
    for (i, part) in parts.iter().enumerate() {
        assert_eq!((part.index, part.pair, part.flow), (i, i / 2, Flow::of(i)));
        assert!(
            !part.range.is_empty(),
            "gather part {i} is empty: {parts:?}"
        );
    }

    // Point to point.
    let split = schedule::p2p_split(bytes, conns);
    assert!(split.len() <= conns, "{} sockets of {conns}", split.len());
    partition(split.iter().cloned(), bytes, "p2p_split");
    let seg = bytes.div_ceil(conns).max(schedule::MIN_P2P_SEGMENT);
    for (k, r) in split.iter().enumerate() {
        assert!(!r.is_empty(), "socket {k} gets nothing: {split:?}");
        if k + 1 < split.len() {
            assert_eq!(r.len(), seg, "socket {k} of {split:?}");
        } else {
            assert!(r.len() <= seg);
        }
    }

    // Sides and channels: every pair of ranks, in rings of up to 8 (larger rings are the same
    // rotated, and building their wiring is quadratic).
    if (2..=8).contains(&ranks) {
        let wiring = Wiring::ring(ranks, conns);
        for a in 0..ranks {
            for b in 0..ranks {
                let send = schedule::send_side(a, ranks, b);
                let recv = schedule::recv_side(b, ranks, a);
                let neighbours = a != b && (b == (a + 1) % ranks || a == (b + 1) % ranks);
                assert_eq!(send.is_some(), neighbours, "send_side({a}, {ranks}, {b})");
                assert_eq!(recv.is_some(), neighbours, "recv_side({b}, {ranks}, {a})");
                let (Some(send), Some(recv)) = (send, recv) else {
                    continue;
                };
                assert_ne!(send, recv, "{a} → {b}: both on the {send:?} side");
                let (ta, tb) = (
                    RingTopology::new(a, ranks, conns),
                    RingTopology::new(b, ranks, conns),
                );
                for c in 0..conns {
                    let (ca, cb) = (ta.channel(send, c), tb.channel(recv, c));
                    assert_eq!(ca.peer, b);
                    assert_eq!(cb.peer, a);
                    assert_eq!(
                        wiring.far_end(a, ca),
                        Some((b, cb.link)),
                        "rank {a} sends to {b} on {ca}, which receives on {cb}"
                    );
                }
            }
        }
    }
}

/// One symbolic sub-reduce in `flow` over `ranks` ranks: every rank holds, per segment, the
/// set of ranks whose input it has summed (a bit mask).
fn symbolic_all_reduce(ranks: usize, flow: Flow) {
    // R ≤ 24, so a rank set fits in a u32.
    let full: u32 = (1u32 << ranks) - 1;
    let mut held: Vec<Vec<u32>> = (0..ranks).map(|r| vec![1u32 << r; ranks]).collect();
    for t in 0..schedule::all_reduce_steps(ranks) {
        let steps: Vec<_> = (0..ranks)
            .map(|r| schedule::all_reduce_step(r, ranks, flow, t))
            .collect();
        let sent: Vec<u32> = (0..ranks).map(|r| held[r][steps[r].send]).collect();
        for (r, step) in steps.iter().enumerate() {
            assert!(step.send < ranks && step.recv < ranks);
            // Leftward data moves to r − 1, so r receives from r + 1; rightward the reverse.
            let from = match flow {
                Flow::Leftward => (r + 1) % ranks,
                Flow::Rightward => (r + ranks - 1) % ranks,
            };
            assert_eq!(
                steps[from].send, step.recv,
                "step {t}: rank {r} expects segment {} but rank {from} sends {}",
                step.recv, steps[from].send
            );
            let theirs = sent[from];
            let mine = &mut held[r][step.recv];
            match step.phase {
                Phase::Reduce => {
                    assert_eq!(
                        *mine & theirs,
                        0,
                        "step {t}: rank {r} counts a rank twice in segment {}",
                        step.recv
                    );
                    *mine |= theirs;
                }
                Phase::Copy => {
                    assert_eq!(
                        theirs, full,
                        "step {t}: rank {r} copies an unfinished segment {}",
                        step.recv
                    );
                    *mine = theirs;
                }
            }
        }
    }
    for (r, segments) in held.iter().enumerate() {
        assert!(
            segments.iter().all(|&s| s == full),
            "{flow:?}, R = {ranks}: rank {r} ends with {segments:x?}"
        );
    }
}

/// One symbolic all-gather in `flow`: every rank must end with every block, sending only
/// blocks it has and never receiving one twice.
fn symbolic_all_gather(ranks: usize, flow: Flow) {
    let mut has: Vec<Vec<bool>> = (0..ranks)
        .map(|r| (0..ranks).map(|b| b == r).collect())
        .collect();
    for t in 0..ranks - 1 {
        let steps: Vec<(usize, usize)> = (0..ranks)
            .map(|r| schedule::all_gather_step(r, ranks, flow, t))
            .collect();
        for (r, &(send, _)) in steps.iter().enumerate() {
            assert!(
                has[r][send],
                "step {t}: rank {r} sends block {send} it lacks"
            );
        }
        for (r, &(_, recv)) in steps.iter().enumerate() {
            let from = match flow {
                Flow::Leftward => (r + 1) % ranks,
                Flow::Rightward => (r + ranks - 1) % ranks,
            };
            assert_eq!(
                steps[from].0, recv,
                "step {t}: rank {r} gathers block {recv}"
            );
            assert!(
                !has[r][recv],
                "step {t}: rank {r} receives block {recv} twice"
            );
            has[r][recv] = true;
        }
    }
    assert!(has.iter().flatten().all(|&h| h), "{flow:?}, R = {ranks}");
}
