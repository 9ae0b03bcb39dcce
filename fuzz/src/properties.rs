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

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use nuvec_distributed::Error;
use nuvec_distributed::fabric::Wiring;
use nuvec_distributed::hostfile;
use nuvec_distributed::internals::auth::{self, Acceptor, AuthError, Key, Opener};
use nuvec_distributed::internals::stream::Reassembly;
use nuvec_distributed::jaccl::{
    Config, Destination, MESH_MAX_PEERS, RING_MAX_CONNS, RingDestinations, SideChannel, Topology,
    parse_devices,
};
use nuvec_distributed::ring::RingTopology;
use nuvec_distributed::ring::schedule::{self, Flow, Phase};

/// A property: panics when the input shows a bug.
pub(crate) type Property = fn(&[u8]);

/// Every target by name (the directory names under `fuzz/corpus/` and `fuzz/artifacts/`).
pub(crate) const TARGETS: &[(&str, Property)] = &[
    ("hostfile", hostfile),
    ("address", address),
    ("stream_reassembly", stream_reassembly),
    ("ring_schedule", ring_schedule),
    ("jaccl_devices", jaccl_devices),
    ("jaccl_env", jaccl_env),
    ("jaccl_destination", jaccl_destination),
    ("jaccl_side_channel", jaccl_side_channel),
    ("auth_handshake", auth_handshake),
    ("jaccl_frames", jaccl_frames),
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

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.byte())
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

/// A JACCL device matrix: `m[i][j]` lists the devices on rank i cabled to rank j.
type Matrix = Vec<Vec<Vec<String>>>;

/// The message of a configuration error; panics on any other error (every JACCL configuration
/// error is an [`Error::Config`] starting with `jaccl:`).
fn config_message<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) -> String {
    match result {
        Err(Error::Config(m)) => {
            assert!(m.starts_with("jaccl: "), "{what}: message {m:?}");
            m
        }
        other => panic!("{what}: expected a configuration error, got {other:?}"),
    }
}

/// `s` as a JSON string literal, escaped by hand (nothing here depends on a JSON crate).
fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The device file of `m` as MLX writes it (`null`, a name, or a list of names), or with
/// `lists` every entry as a list (`[]` for none), which means the same.
fn write_devices(m: &Matrix, lists: bool) -> String {
    let mut out = String::from("[");
    for (i, row) in m.iter().enumerate() {
        out.push_str(if i == 0 { "[" } else { ",\n [" });
        for (j, entry) in row.iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            match entry.as_slice() {
                [] if !lists => out.push_str("null"),
                [name] if !lists => json_string(name, &mut out),
                names => {
                    out.push('[');
                    for (k, name) in names.iter().enumerate() {
                        if k > 0 {
                            out.push(',');
                        }
                        json_string(name, &mut out);
                    }
                    out.push(']');
                }
            }
        }
        out.push(']');
    }
    out.push(']');
    out
}

/// Checks every query of a JACCL [`Config`] against MLX's rules restated here: no panic for any
/// matrix (square or not) and rank; `is_valid_mesh` (at least 2 ranks, square, the diagonal and
/// only it empty) and `is_valid_ring` (at least 2 ranks, square, entry `[0][1]` non-empty and
/// every rank's left and right entries as long); `topology` picks the preferred ring, else the
/// mesh, else the ring, within `MESH_MAX_PEERS` and `RING_MAX_CONNS`; `mesh_devices` and
/// `ring_devices` succeed exactly for a valid mesh or ring and a rank in range, and give this
/// rank's first device towards every other rank, and its left and right entries; `validate`
/// succeeds exactly when the matrix is square, the rank in range, the coordinator a
/// `host:port` and the topology defined. Every failure is a `jaccl:` configuration error.
fn check_config(c: &Config) {
    let m = c.devices();
    let size = m.len();
    let rank = c.rank();
    assert_eq!(c.size(), size);
    let square = m.iter().all(|row| row.len() == size);
    let mesh = square
        && size >= 2
        && m.iter().enumerate().all(|(i, row)| {
            row.iter()
                .enumerate()
                .all(|(j, entry)| (i == j) == entry.is_empty())
        });
    let wires = if square && size >= 2 {
        m[0][1].len()
    } else {
        0
    };
    let ring = square
        && size >= 2
        && wires > 0
        && (0..size).all(|i| {
            m[i][(i + size - 1) % size].len() == wires && m[i][(i + 1) % size].len() == wires
        });
    assert_eq!(c.is_valid_mesh(), mesh, "is_valid_mesh of {m:?}");
    assert_eq!(c.is_valid_ring(), ring, "is_valid_ring of {m:?}");

    let chosen = if c.prefers_ring() && ring {
        Some(Topology::Ring { wires })
    } else if mesh {
        Some(Topology::Mesh)
    } else if ring {
        Some(Topology::Ring { wires })
    } else {
        None
    };
    let expected = chosen.filter(|t| match t {
        Topology::Mesh => size <= MESH_MAX_PEERS,
        Topology::Ring { wires } => *wires <= RING_MAX_CONNS,
    });
    let topology = c.topology();
    match expected {
        Some(t) => assert_eq!(topology.ok(), Some(t), "topology of {c:?}"),
        None => {
            config_message(topology, "topology");
        }
    }

    let in_range = rank < size;
    match c.mesh_devices() {
        Ok(row) => {
            assert!(mesh && in_range, "mesh_devices of {c:?}");
            assert_eq!(row.len(), size);
            for (j, device) in row.iter().enumerate() {
                let want = (j != rank).then(|| m[rank][j][0].as_str());
                assert_eq!(*device, want, "mesh device towards {j} of {c:?}");
            }
        }
        Err(e) => assert!(
            !(mesh && in_range),
            "mesh_devices of a valid mesh: {e} for {c:?}"
        ),
    }
    match c.ring_devices() {
        Ok((left, right)) => {
            assert!(ring && in_range, "ring_devices of {c:?}");
            assert_eq!(left, m[rank][(rank + size - 1) % size].as_slice());
            assert_eq!(right, m[rank][(rank + 1) % size].as_slice());
            assert_eq!((left.len(), right.len()), (wires, wires));
        }
        Err(e) => assert!(
            !(ring && in_range),
            "ring_devices of a valid ring: {e} for {c:?}"
        ),
    }

    let coordinator_ok = c
        .coordinator_address()
        .is_some_and(|a| hostfile::split_address(a).is_ok());
    let valid = square && in_range && coordinator_ok && expected.is_some();
    let validated = c.validate();
    if valid {
        assert!(validated.is_ok(), "validate of {c:?}: {validated:?}");
    } else {
        config_message(validated, "validate");
    }
}

/// Checks `m` under a few ranks, coordinators and preferences, and reshaped to non-square.
fn check_matrix(m: &Matrix, pick: u8) {
    let size = m.len();
    let ranks = [
        0,
        size.saturating_sub(1),
        size,
        usize::from(pick) % (size + 2),
    ];
    for rank in ranks {
        for prefer in [false, true] {
            let base = Config::new(rank, m.clone()).prefer_ring(prefer);
            check_config(&base);
            check_config(&base.clone().coordinator("10.0.0.1:32323"));
            check_config(&base.coordinator("10.0.0.1"));
        }
    }
    // Not square: a short last row, an extra row, an extra entry.
    let mut short = m.clone();
    if let Some(row) = short.last_mut() {
        row.pop();
    }
    let mut tall = m.clone();
    tall.push(vec![Vec::new(); size]);
    let mut wide = m.clone();
    if let Some(row) = wide.first_mut() {
        row.push(vec!["rdma_extra".to_owned()]);
    }
    for odd in [short, tall, wide] {
        let c = Config::new(usize::from(pick) % 3, odd)
            .coordinator("h:1")
            .prefer_ring(pick & 1 == 1);
        check_config(&c);
    }
}

/// MLX's JACCL device file (`MLX_IBV_DEVICES`'s JSON matrix): `jaccl::parse_devices` never
/// panics and refuses with a `jaccl:` configuration error naming the file; an accepted matrix
/// is square with at least one row and no empty device name, and parses back unchanged from
/// its written form (`null`/name/list, with a byte-order mark and `echo`'s newline) and from the
/// all-lists form. Every accepted matrix, and non-square variants of it, then goes through
/// [`check_config`]: `validate`, `topology`, `mesh_devices` and `ring_devices` agree with MLX's
/// rules and never panic.
pub(crate) fn jaccl_devices(data: &[u8]) {
    let text = text(data);
    let m = match parse_devices(&text, "fuzz.json") {
        Ok(m) => m,
        Err(e) => {
            let message = config_message(Err::<(), _>(e), "parse_devices");
            assert!(
                message.contains("fuzz.json"),
                "the error does not name the file: {message}"
            );
            return;
        }
    };
    let size = m.len();
    assert!(size > 0, "accepted a matrix with no rows: {text:?}");
    for (i, row) in m.iter().enumerate() {
        assert_eq!(row.len(), size, "row {i} of an accepted {text:?}");
        for entry in row {
            assert!(
                entry.iter().all(|name| !name.is_empty()),
                "an empty device name accepted from {text:?}"
            );
        }
    }
    let written = write_devices(&m, false);
    for again in [
        written.clone(),
        format!("{written}\n"),
        format!("\u{feff}{written}"),
        write_devices(&m, true),
    ] {
        match parse_devices(&again, "rewritten") {
            Ok(back) => assert_eq!(back, m, "round trip of {text:?} via {again:?}"),
            Err(e) => panic!("the written form {again:?} of {text:?} does not parse: {e}"),
        }
    }
    check_matrix(&m, data.last().copied().unwrap_or(0));
}

/// The variables `Config::from_vars` may read.
const JACCL_VARS: [&str; 8] = [
    "JACCL_RANK",
    "MLX_RANK",
    "JACCL_IBV_DEVICES",
    "MLX_IBV_DEVICES",
    "JACCL_COORDINATOR",
    "MLX_JACCL_COORDINATOR",
    "JACCL_RING",
    "MLX_JACCL_RING",
];

/// Raw bytes as an environment value (on Unix any bytes but NUL; elsewhere lossy UTF-8).
fn os_value(bytes: Vec<u8>) -> OsString {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        OsString::from_vec(bytes)
    }
    #[cfg(not(unix))]
    {
        OsString::from(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Whether `message` names the variable `var` (not only as the tail of a longer name, as
/// `JACCL_COORDINATOR` is of `MLX_JACCL_COORDINATOR`).
fn names_var(message: &str, var: &str) -> bool {
    message.match_indices(var).any(|(at, _)| {
        !message[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// A file removed when dropped.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `Config::from_vars` over a fuzzed environment and device file. The input is text lines
/// `NAME=VALUE` (the first line of a name wins; a line without `=` sets the name to the empty
/// value), then optionally a line `--` after which the rest of the input is the device file's
/// bytes, written to a temporary file of this process. In a device variable every `@` stands
/// for that file's path; any other non-empty value becomes a path in a directory that does not
/// exist, so the fuzzer never makes the library read an arbitrary file.
///
/// Properties: only the eight JACCL and MLX variables are looked up; the result is exactly
/// what the documented rules give, restated here: no device variable is `Ok(None)`; an empty
/// device path, a missing rank, a rank that is not a decimal `usize`, a coordinator that is
/// not UTF-8 `host:port`, an unreadable, non-UTF-8 or malformed device file, or a rank not
/// below its row count is a `jaccl:` configuration error naming the responsible variable;
/// otherwise the configuration has the rank, `parse_devices` of the file, the coordinator and
/// the ring preference (either ring variable present) given. An accepted configuration then
/// goes through [`check_config`].
pub(crate) fn jaccl_env(data: &[u8]) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir();
    let tag = format!(
        "nuvec-fuzz-jaccl-env-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let file_path = dir.join(format!("{tag}.json"));
    let absent_dir = dir.join(format!("{tag}.absent"));

    let mut vars: Vec<(String, Vec<u8>)> = Vec::new();
    let mut file: Option<&[u8]> = None;
    let mut rest = data;
    while !rest.is_empty() {
        let (line, next) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        if line == b"--" {
            file = Some(next);
            break;
        }
        let (name, value) = match line.iter().position(|&b| b == b'=') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line, &line[line.len()..]),
        };
        vars.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
        rest = next;
    }
    let _file = file.map(|bytes| {
        std::fs::write(&file_path, bytes).expect("writing the device file");
        TempFile(file_path.clone())
    });
    let path_bytes = file_path.as_os_str().as_encoded_bytes().to_vec();
    let absent_bytes = absent_dir.as_os_str().as_encoded_bytes().to_vec();
    let env: Vec<(String, OsString)> = vars
        .into_iter()
        .map(|(name, value)| {
            let value = if !name.ends_with("_IBV_DEVICES") || value.is_empty() {
                value
            } else if value.contains(&b'@') {
                let mut v = Vec::new();
                for &b in &value {
                    if b == b'@' {
                        v.extend_from_slice(&path_bytes);
                    } else {
                        v.push(b);
                    }
                }
                v
            } else {
                let mut v = absent_bytes.clone();
                v.push(b'/');
                v.extend_from_slice(&value);
                v
            };
            (name, os_value(value))
        })
        .collect();
    let lookup = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());

    let asked = std::cell::RefCell::new(Vec::<String>::new());
    let result = Config::from_vars(|name| {
        asked.borrow_mut().push(name.to_owned());
        lookup(name)
    });
    for name in asked.borrow().iter() {
        assert!(
            JACCL_VARS.contains(&name.as_str()),
            "from_vars looked up {name:?}"
        );
    }

    // The rules, restated.
    let first =
        |names: [&'static str; 2]| names.into_iter().find_map(|n| lookup(n).map(|v| (n, v)));
    let expected: Result<Option<Config>, &'static str> = (|| {
        let Some((devices_var, path)) = first(["JACCL_IBV_DEVICES", "MLX_IBV_DEVICES"]) else {
            return Ok(None);
        };
        if path.is_empty() {
            return Err(devices_var);
        }
        let Some((rank_var, rank)) = first(["JACCL_RANK", "MLX_RANK"]) else {
            return Err(devices_var);
        };
        let rank = rank
            .to_str()
            .filter(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|r| r.parse::<usize>().ok())
            .ok_or(rank_var)?;
        let coordinator = match first(["JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR"]) {
            None => None,
            Some((var, value)) => {
                let value = value.to_str().ok_or(var)?;
                hostfile::split_address(value).map_err(|_| var)?;
                Some(value.to_owned())
            }
        };
        let prefer = first(["JACCL_RING", "MLX_JACCL_RING"]).is_some();
        let bytes = std::fs::read(&path).map_err(|_| devices_var)?;
        let text = String::from_utf8(bytes).map_err(|_| devices_var)?;
        let devices = parse_devices(&text, "the model").map_err(|_| devices_var)?;
        if rank >= devices.len() {
            return Err(rank_var);
        }
        let mut c = Config::new(rank, devices).prefer_ring(prefer);
        if let Some(a) = coordinator {
            c = c.coordinator(&a);
        }
        Ok(Some(c))
    })();

    match expected {
        Ok(want) => match result {
            Ok(got) => {
                assert_eq!(got, want, "from_vars of {env:?}");
                if let Some(c) = got {
                    check_config(&c);
                }
            }
            Err(e) => panic!("from_vars refused {env:?}: {e}"),
        },
        Err(var) => {
            let message = config_message(result, "from_vars");
            assert!(
                names_var(&message, var),
                "the error does not name {var}: {message} (environment {env:?})"
            );
        }
    }
}

/// A [`Destination`] from 28 script bytes (three `i32`s and a GID).
fn destination(s: &mut Script<'_>) -> Destination {
    Destination {
        local_id: s.u32() as i32,
        queue_pair_number: s.u32() as i32,
        packet_sequence_number: s.u32() as i32,
        global_identifier: s.array(),
    }
}

/// MLX's 32-byte `Destination` record: `Destination::decode` never panics, accepts exactly
/// the 32-byte inputs (anything else is a `jaccl:` configuration error giving both lengths),
/// reads the three little-endian `i32`s at 0, 4 and 8 and the GID at 16, and ignores the
/// padding 12–15; `encode` of a decoded record is the input with zero padding, and
/// `decode(encode(d)) == d` for the record made of the input's first 28 bytes, with any
/// padding bytes. The same holds for every 32-byte chunk of the input (a gathered block of
/// records) and every shorter or longer slice is refused.
pub(crate) fn jaccl_destination(data: &[u8]) {
    let check = |bytes: &[u8]| match Destination::decode(bytes) {
        Ok(d) => {
            assert_eq!(bytes.len(), Destination::BYTES, "decoded {bytes:02x?}");
            let le = |at: usize| i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            assert_eq!(d.local_id, le(0));
            assert_eq!(d.queue_pair_number, le(4));
            assert_eq!(d.packet_sequence_number, le(8));
            assert_eq!(d.global_identifier[..], bytes[16..32]);
            let e = d.encode();
            assert_eq!(e[..12], bytes[..12], "encode keeps the fields");
            assert_eq!(e[12..16], [0; 4], "encode pads with zeros");
            assert_eq!(e[16..], bytes[16..], "encode keeps the GID");
            assert_eq!(Destination::decode(&e).ok(), Some(d));
        }
        Err(e) => {
            assert_ne!(bytes.len(), Destination::BYTES, "refused 32 bytes: {e}");
            let message = config_message(Err::<(), _>(e), "decode");
            assert!(
                message.contains("32") && message.contains(&bytes.len().to_string()),
                "{message}"
            );
        }
    };
    check(data);
    for chunk in data.chunks(Destination::BYTES) {
        check(chunk);
    }
    if data.len() > Destination::BYTES {
        check(&data[..Destination::BYTES - 1]);
        check(&data[..Destination::BYTES + 1]);
    }

    let mut s = Script(data);
    let d = destination(&mut s);
    let mut e = d.encode();
    assert_eq!(e[12..16], [0; 4]);
    assert_eq!(Destination::decode(&e).ok(), Some(d), "round trip of {d:?}");
    e[12..16].copy_from_slice(&s.array::<4>());
    assert_eq!(
        Destination::decode(&e).ok(),
        Some(d),
        "the padding {:02x?} changed {d:?}",
        &e[12..16]
    );
    assert_eq!(Destination::default().encode(), [0; Destination::BYTES]);
}

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

/// Runs `op` on the channel.
fn side_run(c: &mut SideChannel, op: &SideOp) -> Result<SideResult, Error> {
    Ok(match op {
        SideOp::Gather(mine) => SideResult::Bytes(c.all_gather(mine)?),
        SideOp::GatherI32(v) => SideResult::I32s(c.all_gather_i32(*v)?),
        SideOp::GatherVec(records, len) => SideResult::Records(c.all_gather_vec(records, *len)?),
        SideOp::Barrier => {
            c.barrier()?;
            SideResult::Done
        }
        SideOp::Mesh(mine) => SideResult::Mesh(c.exchange_mesh(mine)?),
        SideOp::Ring(left, right) => SideResult::Ring(c.exchange_ring(left, right)?),
    })
}

/// Everything the rank sent on `conn` until it closed.
fn read_all_sent(conn: &mut std::net::TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // The rank closed with rank 0's bytes unread (after a fault).
            Err(_) => break,
        }
    }
    got
}

/// A job of [`Rank0`]'s reading thread: its id, the connection, and how many bytes to wait
/// for before reporting.
type ReadJob = (u64, std::net::TcpStream, usize);

/// [`Rank0`]'s reading thread: its jobs, and its reports (a job's id and the bytes read).
struct Reader {
    jobs: std::sync::mpsc::Sender<ReadJob>,
    reports: std::sync::mpsc::Receiver<(u64, Vec<u8>)>,
}

/// Rank 0's listener, one for the whole process (binding an ephemeral port per input slows
/// down as closed connections accumulate in `TIME_WAIT`), and a thread that reads what the
/// rank sends while it runs, when it may send more than the socket buffers hold.
///
/// That thread reports what it has read as soon as it holds the bytes the rank must have
/// sent, and keeps reading until the connection ends: the rank is then closed only after they
/// were read, as a close with rank 0's bytes unread resets the connection, which may discard
/// what the rank sent last.
struct Rank0 {
    listener: TcpListener,
    /// The listener's address.
    addr: String,
    /// The reading thread, started when first needed.
    reader: Option<Reader>,
    next: u64,
}

impl Rank0 {
    /// The process's rank 0, locked for one input.
    fn get() -> std::sync::MutexGuard<'static, Rank0> {
        static RANK0: std::sync::OnceLock<std::sync::Mutex<Rank0>> = std::sync::OnceLock::new();
        RANK0
            .get_or_init(|| {
                let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
                let addr = listener.local_addr().expect("its address").to_string();
                std::sync::Mutex::new(Rank0 {
                    listener,
                    addr,
                    reader: None,
                    next: 0,
                })
            })
            .lock()
            // An input that failed (in the stable replay test) leaves it usable.
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Has the reading thread read `conn`, reporting once it holds `want` bytes (or the
    /// connection ends, or nothing comes for 5 s); the job's id.
    fn read_meanwhile(&mut self, conn: std::net::TcpStream, want: usize) -> u64 {
        let reader = self.reader.get_or_insert_with(|| {
            let (jobs, inbox) = std::sync::mpsc::channel::<ReadJob>();
            let (outbox, reports) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                for (id, mut conn, want) in inbox {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut got = Vec::new();
                    let mut reported = false;
                    loop {
                        if !reported && got.len() >= want {
                            reported = true;
                            let _ = outbox.send((id, got.clone()));
                        }
                        match conn.read(&mut buf) {
                            Ok(0) => break,
                            Ok(k) => got.extend_from_slice(&buf[..k]),
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(_) => break,
                        }
                    }
                    if !reported {
                        let _ = outbox.send((id, got));
                    }
                }
            });
            Reader { jobs, reports }
        });
        self.next += 1;
        reader
            .jobs
            .send((self.next, conn, want))
            .expect("the reading thread");
        self.next
    }

    /// What the reading thread reported for job `id` (reports for inputs that failed before
    /// collecting theirs are skipped).
    fn finish(&mut self, id: u64) -> Vec<u8> {
        let reader = self.reader.as_ref().expect("a job was started");
        loop {
            let (done, sent) = reader.reports.recv().expect("the reading thread");
            if done == id {
                return sent;
            }
        }
    }
}

/// MLX's JACCL side channel, byte for byte, as rank r ≥ 1 of R ≤ 8 against a scripted rank 0
/// over a real loopback connection. The script: R, r, a fault, its position, then up to 8
/// operations (all-gathers of bytes and of `i32`s, vector all-gathers, barriers, mesh and ring
/// exchanges), each with its arguments, the other ranks' data and whether rank 0 or another
/// rank misbehaves (garbles this rank's block, announces a different, negative or oversized
/// count, breaks a barrier). A model of rank 0 writes its replies in advance, then closes its
/// sending side; the fault then cuts that stream short or flips one byte of it.
///
/// Properties: no panic and no wait for the timeout (rank 0 has always closed); the rank
/// sends its hello (its rank as a little-endian `i32`) and then exactly each all-gather's
/// block in MLX's order; every operation the stream reaches intact returns what the model
/// says: the gathered bytes, `i32`s, the unpadded records, the decoded destinations, or an
/// `Error::Connect` for a misbehaving peer; argument errors (`InvalidArgument`) send nothing
/// and leave the channel usable; the operation that runs into the cut fails with
/// `Error::Connect`; after any other error every later call fails with `Error::Failed`.
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
        mut peer, gathers, ..
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

    let mut rank0 = Rank0::get();
    let addr = rank0.addr.clone();
    let mut channel = SideChannel::connect(&addr, rank, size, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("rank {rank} of {size} cannot connect to {addr}: {e}"));
    // The rank's connection is in the backlog; rank 0's replies (at most about 17 KiB) fit in
    // the socket buffers, so this thread writes them all before the rank reads any.
    let (mut conn, _) = rank0.listener.accept().expect("accepting the rank");
    let _ = conn.write_all(&peer);
    let _ = conn.shutdown(Shutdown::Write);
    // After a flipped byte the rank may send up to 64 MiB, more than the socket buffers hold:
    // another thread reads it meanwhile. Otherwise it sends exactly `expected_sent`, which fits.
    let reading = flip
        .is_some()
        .then(|| rank0.read_meanwhile(conn.try_clone().unwrap(), expected_sent.len()));

    let mut failed_before = false;
    for (i, (op, expect, gathers_after)) in steps.iter().enumerate() {
        let result = side_run(&mut channel, op);
        if let Err(e) = &result {
            assert!(
                !e.to_string().contains("timed out"),
                "operation {i} ({op:?}) waited for the timeout: {e}"
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
    let sent = match reading {
        Some(id) => {
            let sent = rank0.finish(id);
            drop(channel);
            sent
        }
        None => {
            drop(channel);
            read_all_sent(&mut conn)
        }
    };
    drop(conn);
    if flip.is_some() {
        assert!(
            sent.starts_with(&expected_sent),
            "rank {rank} of {size} sent {sent:02x?}, expected it to start with \
             {expected_sent:02x?}"
        );
    } else {
        assert_eq!(sent, expected_sent, "what rank {rank} of {size} sent");
    }
}

/// The fuzz ring's key when the fuzzed secret is too short.
const FALLBACK_SECRET: &[u8] = b"the fuzz ring's pre-shared secret";

/// The authentication handshake (`auth`, HMAC-SHA256 over a pre-shared key) fed fuzzed peer
/// messages. The script: a secret (a key exists exactly when it has at least `MIN_SECRET`
/// bytes), a hello (raw, or with the magic and version set, or honest, in which case the
/// acceptor expects exactly its ranks and link, or honest with one expected value off), the
/// acceptor's nonce, then forged replies and proofs.
///
/// Properties: `Acceptor` refuses a hello without the magic (`NotAuthenticating`), of another
/// version (`Version`), or from another rank, to another rank or on another link
/// (`WrongRank`, echoing the claimed and expected values), and accepts every other hello,
/// replying its nonce and a proof the honest `Opener` of that hello (which rebuilds the same 57
/// bytes) accepts; the opener's proof is accepted by the acceptor; a fuzzed proof is accepted
/// exactly when it equals the correct one, and a correct one with any single bit flipped is
/// refused (`BadProof`); a fuzzed reply is accepted by the opener exactly when it equals the
/// honest reply for its nonce; a proof for another nonce (a replay) or made with another key
/// is refused, on both sides. Nothing panics.
pub(crate) fn auth_handshake(data: &[u8]) {
    let mut s = Script(data);
    let secret_len = usize::from(s.byte() % 48);
    let secret = s.bytes(secret_len);
    let key = Key::from_secret(&secret);
    assert_eq!(
        key.is_some(),
        secret.len() >= auth::MIN_SECRET,
        "a key from a secret of {} bytes",
        secret.len()
    );
    let (key, secret) = match key {
        Some(k) => (k, secret),
        None => (
            Key::from_secret(FALLBACK_SECRET).unwrap(),
            FALLBACK_SECRET.to_vec(),
        ),
    };

    let mode = s.byte();
    let mut hello: [u8; auth::HELLO] = s.array();
    if mode % 4 != 0 {
        hello[..8].copy_from_slice(auth::MAGIC);
        hello[8] = auth::VERSION;
    }
    let word = |at: usize| u32::from_le_bytes(hello[at..at + 4].try_into().unwrap());
    let (claimed, target, link) = (word(9), word(13), word(17));
    let (mut me, mut expected, mut want_link) = (s.u32(), s.u32(), s.u32());
    if mode % 4 >= 2 {
        (me, expected, want_link) = (target, claimed, link);
        if mode % 4 == 3 {
            let by = s.u32() | 1;
            match s.byte() % 3 {
                0 => me ^= by,
                1 => expected ^= by,
                _ => want_link ^= by,
            }
        }
    }
    let nonce: [u8; auth::NONCE] = s.array();

    let accepted = Acceptor::with_nonce(&key, me, expected, want_link, &hello, nonce);
    let model = if hello[..8] != auth::MAGIC[..] {
        Err(AuthError::NotAuthenticating)
    } else if hello[8] != auth::VERSION {
        Err(AuthError::Version(hello[8]))
    } else if (claimed, target, link) != (expected, me, want_link) {
        Err(AuthError::WrongRank {
            claimed,
            target,
            link,
            expected,
            me,
            want_link,
        })
    } else {
        Ok(())
    };
    let (acceptor, reply) = match (accepted, model) {
        (Ok(accepted), Ok(())) => accepted,
        (Err(got), Err(want)) => {
            assert_eq!(got, want, "the refusal of hello {hello:02x?}");
            return;
        }
        (got, want) => panic!(
            "hello {hello:02x?} for rank {me} from {expected}, link {want_link}: got {:?}, \
             expected {want:?}",
            got.map(|_| ())
        ),
    };
    assert_eq!(
        reply[..auth::NONCE],
        nonce,
        "the reply starts with the nonce"
    );

    // The honest opener of this hello.
    let hello_nonce: [u8; auth::NONCE] = hello[21..].try_into().unwrap();
    let opener = Opener::with_nonce(&key, claimed, target, link, hello_nonce);
    assert_eq!(opener.hello(), &hello, "the opener rebuilds the hello");
    let proof = opener
        .finish(&reply)
        .unwrap_or_else(|e| panic!("the honest reply is refused: {e}"));
    assert_eq!(
        acceptor.finish(&proof),
        Ok(()),
        "the honest proof is refused"
    );

    // Forged proofs.
    let forged: [u8; auth::NONCE] = s.array();
    assert_eq!(
        acceptor.finish(&forged).is_ok(),
        forged == proof,
        "a fuzzed proof {forged:02x?}"
    );
    let bit = usize::from(s.byte());
    let mut flipped = proof;
    flipped[bit / 8 % auth::NONCE] ^= 1 << (bit % 8);
    assert_eq!(acceptor.finish(&flipped), Err(AuthError::BadProof));

    // Forged replies: checked against the honest reply for the forged nonce.
    let forged_reply: [u8; 2 * auth::NONCE] = s.array();
    let other_nonce: [u8; auth::NONCE] = forged_reply[..auth::NONCE].try_into().unwrap();
    let (other_acceptor, honest_other) =
        Acceptor::with_nonce(&key, me, expected, want_link, &hello, other_nonce)
            .expect("the same hello");
    let opened = opener.finish(&forged_reply);
    assert_eq!(
        opened.is_ok(),
        forged_reply == honest_other,
        "a fuzzed reply {forged_reply:02x?}: {opened:?}"
    );
    if let Err(e) = opened {
        assert_eq!(e, AuthError::BadProof);
    }
    let mut flipped_reply = reply;
    let bit = usize::from(s.byte()) * 2 + usize::from(s.byte() & 1);
    flipped_reply[bit / 8 % (2 * auth::NONCE)] ^= 1 << (bit % 8);
    assert_eq!(opener.finish(&flipped_reply), Err(AuthError::BadProof));

    // A replay: the proof made for one nonce, shown to an acceptor that chose another.
    let other_proof = opener.finish(&honest_other).expect("the honest reply");
    assert_eq!(other_acceptor.finish(&other_proof), Ok(()));
    assert_eq!(
        acceptor.finish(&other_proof).is_ok(),
        other_nonce == nonce,
        "a proof for nonce {other_nonce:02x?} replayed against {nonce:02x?}"
    );

    // Another key, on either side.
    let mut other_secret = secret.clone();
    other_secret.push(s.byte());
    let other_key = Key::from_secret(&other_secret).unwrap();
    assert_ne!(other_key, key, "two secrets give one key");
    let (stranger, stranger_reply) =
        Acceptor::with_nonce(&other_key, me, expected, want_link, &hello, nonce)
            .expect("the hello does not depend on the key");
    assert_eq!(opener.finish(&stranger_reply), Err(AuthError::BadProof));
    assert_eq!(stranger.finish(&proof), Err(AuthError::BadProof));
    let impostor = Opener::with_nonce(&other_key, claimed, target, link, hello_nonce);
    assert_eq!(impostor.finish(&reply), Err(AuthError::BadProof));
}

/// JACCL's frame arithmetic (`jaccl::frames`) for fuzzed R = `1 + b % 12`, C = `1 + b % 4`,
/// s ∈ {1, 2, 4, 8}, either frame rule, and E a `u32` (biased by one more byte toward the
/// 32 KiB, 2·R·C and 64 KiB thresholds and frame boundaries), at most 2^22.
///
/// Properties: a frame is `4096 · 2^k` (k ≤ 7), 4 KiB under the small rule and never above a
/// message of 4 KiB or more under the large one; the frames of a payload cover it once; the
/// mesh folds exactly when R ≤ 2 or N ≤ 32 KiB, and its shards and tail add up to E; the ring
/// uses one direction of one wire exactly below MLX's thresholds, its (direction, wire) slices
/// of all chunks cover the E elements once, each within its step's message count, and what a
/// rank sends at a step is what its neighbour receives; the ring all-gather's pieces cover a
/// block once in two halves; point-to-point pieces cover the bytes once.
pub(crate) fn jaccl_frames(data: &[u8]) {
    use nuvec_distributed::jaccl::frames::{
        FRAME, FrameRule, Frames, MAX_FRAME, MeshReduce, RingGather, RingReduce, ring_p2p,
    };
    let mut script = Script(data);
    let ranks = 1 + usize::from(script.byte() % 12);
    let conns = 1 + usize::from(script.byte() % 4);
    let size = 1usize << (script.byte() % 4);
    let rule = if script.byte() & 1 == 1 {
        FrameRule::Large
    } else {
        FrameRule::Small
    };
    let raw = script.u32() as usize;
    let elements = match script.byte() % 4 {
        0 => {
            let near = [
                32_768 / size,
                2 * ranks * conns,
                65_536 / size,
                ranks * FRAME / size,
            ];
            let base = near[raw % near.len()];
            (base + (raw >> 8) % 9).saturating_sub(4)
        }
        _ => raw % (1 << 22),
    };
    let bytes = elements * size;

    for m in [0, 1, bytes, bytes / ranks.max(1), raw] {
        let f = rule.frame(m);
        assert!(
            f.is_power_of_two() && (FRAME..=MAX_FRAME).contains(&f),
            "frame {f}"
        );
        match rule {
            FrameRule::Small => assert_eq!(f, FRAME),
            FrameRule::Large => {
                assert!(m < FRAME || f <= m, "frame {f} above message {m}");
                assert!(
                    m < 2 * f || f == MAX_FRAME,
                    "frame {f} not the largest for {m}"
                );
            }
        }
        let frames = Frames::new(rule, m, bytes);
        assert_eq!(frames.count(), bytes.div_ceil(f));
        partition(
            (0..frames.count()).map(|i| frames.payload(i)),
            bytes,
            "frames",
        );
    }

    match MeshReduce::choose(elements, size, ranks) {
        MeshReduce::Fold => assert!(ranks <= 2 || bytes <= 32_768),
        MeshReduce::ScatterGather { shard, tail } => {
            assert!(ranks > 2 && bytes > 32_768);
            assert_eq!(shard * ranks + tail, elements);
            assert!(tail < ranks);
        }
    }

    if ranks >= 2 {
        let plan = RingReduce::new(rule, elements, size, ranks, conns);
        let small = bytes <= 32_768 || elements < 2 * ranks * conns;
        assert_eq!((plan.dirs, plan.wires) == (1, 1), small);
        if !small {
            assert_eq!((plan.dirs, plan.wires), (2, conns));
        }
        let mut slices: Vec<std::ops::Range<usize>> = Vec::new();
        for j in 0..ranks {
            for lr in 0..plan.dirs {
                for w in 0..plan.wires {
                    let s = plan.slice(j, lr, w);
                    assert!(s.len() <= plan.messages_per_step() * plan.frame_elements());
                    if !s.is_empty() {
                        slices.push(s);
                    }
                }
            }
        }
        slices.sort_by_key(|r| r.start);
        partition(slices, elements, "ring slices");
        for k in 0..plan.steps() {
            for lr in 0..plan.dirs {
                for rank in 0..ranks {
                    let next = if lr == 0 {
                        (rank + 1) % ranks
                    } else {
                        (rank + ranks - 1) % ranks
                    };
                    assert_eq!(plan.step(rank, k, lr).0, plan.step(next, k, lr).1);
                }
            }
        }
        let gather = RingGather::new(rule, bytes % 100_000, ranks, conns);
        partition(
            (0..2)
                .flat_map(|lr| (0..conns).map(move |w| (lr, w)))
                .map(|(lr, w)| gather.piece(lr, w)),
            bytes % 100_000,
            "gather pieces",
        );
    }
    let (_, pieces) = ring_p2p(rule, bytes, conns);
    partition(pieces, bytes, "p2p pieces");
}
