//! An independent model of MLX's `ring` backend (`mlx/distributed/ring/ring.cpp`; reference
//! `mlx-distributed.md` §2.5–2.8), for the simulator tests.
//!
//! Nothing here calls `nuvec_distributed::ring` or `nuvec_distributed::reduce`: the K /
//! segment / direction arithmetic, the element reductions and the socket choice are written
//! again, as a naive translation of MLX's loops, so that a mistake in the crate is not
//! mirrored here. Two things are modelled:
//!
//! - [`fold`]: the value MLX computes for every element, written as the closed-form fold in
//!   MLX's association order (see [`fold_element`] for the derivation);
//! - [`all_reduce_wire`], [`all_gather_wire`], [`send_wire`]: the exact bytes MLX's C++ puts on
//!   every socket direction, computed by running all ranks in lockstep, step by step, as MLX's
//!   `all_sum_impl` / `all_gather_impl` / `send` loops do (the C++ packets within a step are not
//!   visible on a TCP stream, so a step is one piece of bytes here).
//!
//! Socket directions are named as `nuvec_distributed::fabric::Wiring::ring` names them: rank
//! r's `right[c]` is `Channel { peer: r+1, link: c }`, its `left[c]` is
//! `Channel { peer: r−1, link: c + (C if R == 2 else 0) }`, and a stream is keyed by
//! `(sender rank, sender's channel)`.
//!
//! About 800 lines, one file on purpose: it is read side by side with `ring.cpp` in that file's
//! order, and the element layouts, the fold and the lockstep wire loops all turn on one [`Lane`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::Range;

use half::f16;
use nuvec_core::DType;
use nuvec_distributed::fabric::Channel;
use nuvec_distributed::reduce::Reduction;

/// MLX's `min_send_size` (ring.cpp, a local constant of `all_sum` and `all_gather`).
pub const MIN_SEND_SIZE: usize = 262_144;

/// The sign bit (as float16 bits) of the default NaN that `inf + -inf` produces on this host:
/// x86's "real indefinite" is negative, ARM's and RISC-V's positive (src/collective/reduce documents
/// the same rule for MLX's `_MLX_Float16` built on the same host).
const DEFAULT_NAN_SIGN_F16: u16 = if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
    0x8000
} else {
    0
};

// ---------------------------------------------------------------------------------------------
// Elements
// ---------------------------------------------------------------------------------------------

/// One dtype's element layout, decided once per collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    Bf16,
    F32,
    F64,
    C64,
}

impl Lane {
    /// The lane of `dtype`, from MLX's dtype names (not from nuvec's `size()`).
    pub fn of(dtype: DType) -> Lane {
        match dtype.name() {
            "bool" => Lane::Bool,
            "uint8" => Lane::U8,
            "uint16" => Lane::U16,
            "uint32" => Lane::U32,
            "uint64" => Lane::U64,
            "int8" => Lane::I8,
            "int16" => Lane::I16,
            "int32" => Lane::I32,
            "int64" => Lane::I64,
            "float16" => Lane::F16,
            "bfloat16" => Lane::Bf16,
            "float32" => Lane::F32,
            "float64" => Lane::F64,
            "complex64" => Lane::C64,
            other => panic!("model: no MLX dtype {other}"),
        }
    }

    /// `sizeof(T)` in MLX.
    pub fn size(self) -> usize {
        match self {
            Lane::Bool | Lane::U8 | Lane::I8 => 1,
            Lane::U16 | Lane::I16 | Lane::F16 | Lane::Bf16 => 2,
            Lane::U32 | Lane::I32 | Lane::F32 => 4,
            Lane::U64 | Lane::I64 | Lane::F64 | Lane::C64 => 8,
        }
    }
}

fn rd<const N: usize>(b: &[u8]) -> [u8; N] {
    b[..N].try_into().expect("element bytes")
}

fn f16_is_nan(bits: u16) -> bool {
    bits & 0x7FFF > 0x7C00
}

fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// MLX's `_MLX_BFloat16(float)`: NaN becomes `0x7FC0`, everything else rounds to nearest even
/// with the "add 0x7FFF + lsb, keep the high half" trick.
fn f32_to_bf16_mlx(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let b = x.to_bits();
    ((b.wrapping_add(0x7FFF + ((b >> 16) & 1))) >> 16) as u16
}

/// MLX's `_MLX_Float16` sum: add in float32, round once to nearest even; a NaN sum is
/// `sign | 0x7D00`, the sign being that of the float32 NaN: `received`'s if it is NaN, else
/// `local`'s if it is NaN, else the host's default NaN (`inf + -inf`). That is the rule
/// `src/collective/reduce` documents (checked there against MLX 0.32.4 on x86-64).
fn f16_sum(l: u16, r: u16) -> u16 {
    let s = f16::from_bits(l).to_f32() + f16::from_bits(r).to_f32();
    if s.is_nan() {
        let sign = if f16_is_nan(r) {
            r & 0x8000
        } else if f16_is_nan(l) {
            l & 0x8000
        } else {
            DEFAULT_NAN_SIGN_F16
        };
        sign | 0x7D00
    } else {
        f16::from_f32(s).to_bits()
    }
}

/// The default NaN of this host's FPU (`inf + -inf`), as float32 / float64 bits: x86's "real
/// indefinite" is negative, ARM's and RISC-V's positive.
const DEFAULT_NAN_F32: u32 = if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
    0xFFC0_0000
} else {
    0x7FC0_0000
};
const DEFAULT_NAN_F64: u64 = if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
    0xFFF8_0000_0000_0000
} else {
    0x7FF8_0000_0000_0000
};

/// float32 `local + received` with the NaN bits `src/collective/reduce` documents (checked there
/// against MLX 0.32.4's x86-64 wheel, whose vectorised loop has `received` as the first
/// `addps` operand): `received` quieted if it is NaN, else `local` quieted if it is NaN, else
/// the default NaN if the sum is invalid (`inf + -inf`), else the IEEE sum.
fn f32_sum(l: f32, r: f32) -> f32 {
    if r.is_nan() {
        f32::from_bits(r.to_bits() | 0x0040_0000)
    } else if l.is_nan() {
        f32::from_bits(l.to_bits() | 0x0040_0000)
    } else {
        let s = l + r;
        if s.is_nan() {
            f32::from_bits(DEFAULT_NAN_F32)
        } else {
            s
        }
    }
}

/// float64 `local + received`, with [`f32_sum`]'s NaN rule.
fn f64_sum(l: f64, r: f64) -> f64 {
    if r.is_nan() {
        f64::from_bits(r.to_bits() | 0x0008_0000_0000_0000)
    } else if l.is_nan() {
        f64::from_bits(l.to_bits() | 0x0008_0000_0000_0000)
    } else {
        let s = l + r;
        if s.is_nan() {
            f64::from_bits(DEFAULT_NAN_F64)
        } else {
            s
        }
    }
}

/// `std::max(local, received)` is `local < received ? received : local`;
/// `std::min(local, received)` is `received < local ? received : local`.
fn pick<T: Copy>(op: Reduction, l: T, r: T, l_lt_r: bool, r_lt_l: bool) -> T {
    match op {
        Reduction::Max if l_lt_r => r,
        Reduction::Min if r_lt_l => r,
        _ => l,
    }
}

/// `out = local ⊕ received` for one element of `lane` (MLX's `SumOp`, `MaxOp`, `MinOp`:
/// `*output = op(*output, *input)` where `output` is this rank's data).
pub fn combine_element(lane: Lane, op: Reduction, local: &[u8], received: &[u8], out: &mut [u8]) {
    macro_rules! int {
        ($t:ty, $n:literal) => {{
            let l = <$t>::from_le_bytes(rd::<$n>(local));
            let r = <$t>::from_le_bytes(rd::<$n>(received));
            let v = match op {
                Reduction::Sum => l.wrapping_add(r),
                _ => pick(op, l, r, l < r, r < l),
            };
            out[..$n].copy_from_slice(&v.to_le_bytes());
        }};
    }
    match lane {
        Lane::Bool => {
            let (l, r) = (local[0] != 0, received[0] != 0);
            out[0] = u8::from(match op {
                Reduction::Sum | Reduction::Max => l || r,
                Reduction::Min => l && r,
            });
        }
        Lane::U8 => int!(u8, 1),
        Lane::U16 => int!(u16, 2),
        Lane::U32 => int!(u32, 4),
        Lane::U64 => int!(u64, 8),
        Lane::I8 => int!(i8, 1),
        Lane::I16 => int!(i16, 2),
        Lane::I32 => int!(i32, 4),
        Lane::I64 => int!(i64, 8),
        Lane::F32 => {
            let l = f32::from_le_bytes(rd::<4>(local));
            let r = f32::from_le_bytes(rd::<4>(received));
            let v = match op {
                Reduction::Sum => f32_sum(l, r),
                _ => pick(op, l, r, l < r, r < l),
            };
            out[..4].copy_from_slice(&v.to_le_bytes());
        }
        Lane::F64 => {
            let l = f64::from_le_bytes(rd::<8>(local));
            let r = f64::from_le_bytes(rd::<8>(received));
            let v = match op {
                Reduction::Sum => f64_sum(l, r),
                _ => pick(op, l, r, l < r, r < l),
            };
            out[..8].copy_from_slice(&v.to_le_bytes());
        }
        Lane::F16 => {
            let l = u16::from_le_bytes(rd::<2>(local));
            let r = u16::from_le_bytes(rd::<2>(received));
            let (a, b) = (f16::from_bits(l).to_f32(), f16::from_bits(r).to_f32());
            let v = match op {
                Reduction::Sum => f16_sum(l, r),
                _ => pick(op, l, r, a < b, b < a),
            };
            out[..2].copy_from_slice(&v.to_le_bytes());
        }
        Lane::Bf16 => {
            let l = u16::from_le_bytes(rd::<2>(local));
            let r = u16::from_le_bytes(rd::<2>(received));
            let (a, b) = (bf16_to_f32(l), bf16_to_f32(r));
            let v = match op {
                Reduction::Sum => f32_to_bf16_mlx(a + b),
                _ => pick(op, l, r, a < b, b < a),
            };
            out[..2].copy_from_slice(&v.to_le_bytes());
        }
        Lane::C64 => {
            let (lre, lim) = (
                f32::from_le_bytes(rd::<4>(local)),
                f32::from_le_bytes(rd::<4>(&local[4..])),
            );
            let (rre, rim) = (
                f32::from_le_bytes(rd::<4>(received)),
                f32::from_le_bytes(rd::<4>(&received[4..])),
            );
            // MLX's complex64_t operator<: real parts first, then imaginary parts.
            let lt = |a: (f32, f32), b: (f32, f32)| a.0 < b.0 || (a.0 == b.0 && a.1 < b.1);
            let v = match op {
                Reduction::Sum => (f32_sum(lre, rre), f32_sum(lim, rim)),
                _ => pick(
                    op,
                    (lre, lim),
                    (rre, rim),
                    lt((lre, lim), (rre, rim)),
                    lt((rre, rim), (lre, lim)),
                ),
            };
            out[..4].copy_from_slice(&v.0.to_le_bytes());
            out[4..8].copy_from_slice(&v.1.to_le_bytes());
        }
    }
}

/// `local[i] = local[i] ⊕ received[i]` over whole slices (MLX's `sum_inplace` and friends).
pub fn combine_into(lane: Lane, op: Reduction, local: &mut [u8], received: &[u8]) {
    let s = lane.size();
    assert_eq!(local.len(), received.len());
    let mut tmp = [0u8; 8];
    for (l, r) in local.chunks_exact_mut(s).zip(received.chunks_exact(s)) {
        combine_element(lane, op, l, r, &mut tmp);
        l.copy_from_slice(&tmp[..s]);
    }
}

// ---------------------------------------------------------------------------------------------
// MLX's split arithmetic (written again, not taken from src/ring/schedule.rs)
// ---------------------------------------------------------------------------------------------

/// MLX's `ceildiv`, as written there.
#[allow(clippy::manual_div_ceil)]
fn ceildiv(a: usize, b: usize) -> usize {
    (a + b - 1) / b
}

/// One of MLX's parallel `all_sum_impl` calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubReduce {
    /// Its index i.
    pub index: usize,
    /// Offset of its data in the (padded) buffer, in elements (`i * step`).
    pub start: usize,
    /// Its `data_size` in elements.
    pub len: usize,
    /// `(i % 2) ? -1 : 1`.
    pub direction: isize,
    /// `sockets_right_[i / 2]`, `sockets_left_[i / 2]`.
    pub pair: usize,
}

/// What MLX's `all_sum<T>` does with E elements of s bytes in a ring of R with C connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReducePlan {
    /// `Some(R)` if `size < size_`: copied into R zeroed elements.
    pub padded: Option<usize>,
    pub subs: Vec<SubReduce>,
}

/// `RingGroup::all_sum` (ring.cpp), after `ops.cpp`'s size-1 shortcut, except that E = 0
/// moves nothing (see [`EMPTY_REDUCE_IS_SILENT`]).
pub fn reduce_plan(e: usize, s: usize, r: usize, c: usize) -> ReducePlan {
    if e == 0 && EMPTY_REDUCE_IS_SILENT {
        return ReducePlan {
            padded: None,
            subs: vec![],
        };
    }
    reduce_plan_literal(e, s, r, c)
}

/// [`reduce_plan`] without the E = 0 exception: ring.cpp read literally.
pub fn reduce_plan_literal(e: usize, s: usize, r: usize, c: usize) -> ReducePlan {
    if r == 1 {
        // ops.cpp: `if (group.size() == 1) return x;`
        return ReducePlan {
            padded: None,
            subs: vec![],
        };
    }
    if e < r {
        assert!(
            s * r <= 1024,
            "MLX throws: can't perform the ring all reduce"
        );
        return ReducePlan {
            padded: Some(r),
            subs: vec![SubReduce {
                index: 0,
                start: 0,
                len: r,
                direction: -1,
                pair: 0,
            }],
        };
    }
    let nbytes = e * s;
    let n_reduces = (2 * c).min(nbytes / (r * MIN_SEND_SIZE)).max(1);
    let step = ceildiv(e, n_reduces);
    let subs = (0..n_reduces)
        .map(|i| SubReduce {
            index: i,
            start: i * step,
            len: e.min((i + 1) * step) - i * step,
            direction: if i % 2 == 1 { -1 } else { 1 },
            pair: i / 2,
        })
        .collect();
    ReducePlan { padded: None, subs }
}

/// Whether an all-reduce of zero elements puts nothing on the wire: no. MLX takes the small
/// path for E = 0 (`size < size_`) and exchanges 2(R−1) zero elements, which a mixed job with
/// `mlx[cpu]==0.32.4` confirms (`tests/interop/main.rs` includes E = 0).
pub const EMPTY_REDUCE_IS_SILENT: bool = false;

/// `[min(j·S, D), min((j+1)·S, D))` with `S = ⌈D/R⌉`: MLX's `send_start`/`send_stop` (an empty
/// range where `j·S ≥ D`).
pub fn segment(d: usize, r: usize, j: usize) -> Range<usize> {
    let s = ceildiv(d, r);
    (j * s).min(d)..((j + 1) * s).min(d)
}

fn modr(x: isize, r: usize) -> usize {
    x.rem_euclid(r as isize) as usize
}

/// Rank r's `right[c]`.
pub fn right(r: usize, ranks: usize, c: usize) -> Channel {
    Channel::new((r + 1) % ranks, c)
}

/// Rank r's `left[c]` (links `C..2C` when R = 2, the accepted ones).
pub fn left(r: usize, ranks: usize, conns: usize, c: usize) -> Channel {
    let offset = if ranks == 2 { conns } else { 0 };
    Channel::new((r + ranks - 1) % ranks, offset + c)
}

// ---------------------------------------------------------------------------------------------
// The fold: MLX's association order, in closed form
// ---------------------------------------------------------------------------------------------

/// The fully reduced value of one element of segment `j` of a sub-reduce in `direction`,
/// from every rank's own value `x[q]` of that element.
///
/// Derivation (MLX's loop: at step t rank r sends segment `(r + t·d) mod R` and receives
/// segment `(r + d + t·d) mod R` from the rank it receives from, `r + d`, which sent that same
/// segment at the same step; reduce-scatter steps compute `mine ⊕ theirs`):
///
/// - step 0: rank j sends its own `x_j` of segment j; rank `j − d` receives it and computes
///   `x_{j−d} ⊕ x_j` (it has not touched segment j before, so `x_{j−d}` is its input);
/// - step 1: rank `j − d` forwards that; rank `j − 2d` computes `x_{j−2d} ⊕ (x_{j−d} ⊕ x_j)`;
/// - …; after R−1 steps rank `j − (R−1)d = j + d` holds the result and the all-gather phase
///   copies it to everyone unchanged.
///
/// So for d = +1 (leftward) the fold order is x_j, x_{j−1}, x_{j−2}, …, x_{j+1} as the
/// reference says (§2.6.5), but with `⊕ = local ⊕ received` every step has the **new rank's
/// own value on the left** and the partial on the right:
/// `x_{j+1} ⊕ (x_{j+2} ⊕ (… ⊕ (x_{j−1} ⊕ x_j)))`. That matters for max/min ties and NaNs,
/// where `std::max`/`std::min` keep the left operand. For d = −1 the chain is x_j, x_{j+1}, …,
/// x_{j−1}: `x_{j−1} ⊕ (… ⊕ (x_{j+1} ⊕ x_j))`.
pub fn fold_element(
    lane: Lane,
    op: Reduction,
    x: &[&[u8]],
    j: usize,
    direction: isize,
    out: &mut [u8],
) {
    let ranks = x.len();
    let s = lane.size();
    let mut acc = [0u8; 8];
    acc[..s].copy_from_slice(&x[j][..s]);
    let mut next = [0u8; 8];
    for k in 1..ranks {
        let owner = modr(j as isize - k as isize * direction, ranks);
        combine_element(lane, op, x[owner], &acc[..s], &mut next);
        acc = next;
    }
    out[..s].copy_from_slice(&acc[..s]);
}

/// What every rank holds after MLX's `all_sum`/`all_max`/`all_min` of `inputs` (one buffer
/// per rank, E elements each), computed element by element with [`fold_element`].
pub fn fold(dtype: DType, op: Reduction, conns: usize, inputs: &[Vec<u8>]) -> Vec<u8> {
    let lane = Lane::of(dtype);
    let s = lane.size();
    let ranks = inputs.len();
    let len = inputs[0].len();
    let e = len / s;
    let plan = reduce_plan(e, s, ranks, conns);
    if plan.subs.is_empty() {
        return inputs[0].clone();
    }
    let mut out = vec![0u8; len];
    let zero = [0u8; 8];
    for sub in &plan.subs {
        for j in 0..ranks {
            for p in segment(sub.len, ranks, j) {
                let at = sub.start + p;
                if at >= e {
                    // Padding of the small path: never copied back.
                    continue;
                }
                let x: Vec<&[u8]> = inputs
                    .iter()
                    .map(|b| b.get(at * s..(at + 1) * s).unwrap_or(&zero[..s]))
                    .collect();
                fold_element(
                    lane,
                    op,
                    &x,
                    j,
                    sub.direction,
                    &mut out[at * s..(at + 1) * s],
                );
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The wire: all ranks in lockstep
// ---------------------------------------------------------------------------------------------

/// One labelled run of bytes on a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// Offset in the stream.
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
    /// What MLX was doing (op index, op, sub-reduce, step, segment).
    pub what: String,
}

/// The bytes of one socket direction, with what produced them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stream {
    pub bytes: Vec<u8>,
    pub spans: Vec<Span>,
}

impl Stream {
    fn push(&mut self, bytes: &[u8], what: impl FnOnce() -> String) {
        if bytes.is_empty() {
            return;
        }
        self.spans.push(Span {
            start: self.bytes.len(),
            len: bytes.len(),
            what: what(),
        });
        self.bytes.extend_from_slice(bytes);
    }
}

/// Every stream of a run, keyed as `Report::wire`: `(sender rank, sender's channel)`.
pub type Wire = BTreeMap<(usize, Channel), Stream>;

/// The bytes of MLX's `all_sum`/`all_max`/`all_min` of `inputs` on every socket direction,
/// appended to `wire`, and every rank's result. `label` names the op in diagnostics.
pub fn all_reduce_wire(
    wire: &mut Wire,
    label: &str,
    dtype: DType,
    op: Reduction,
    conns: usize,
    inputs: &[Vec<u8>],
) -> Vec<Vec<u8>> {
    let s = Lane::of(dtype).size();
    let plan = reduce_plan(inputs[0].len() / s, s, inputs.len(), conns);
    all_reduce_wire_with(wire, label, dtype, op, conns, inputs, &plan)
}

/// [`all_reduce_wire`] for a given plan (e.g. [`reduce_plan_literal`]).
pub fn all_reduce_wire_with(
    wire: &mut Wire,
    label: &str,
    dtype: DType,
    op: Reduction,
    conns: usize,
    inputs: &[Vec<u8>],
    plan: &ReducePlan,
) -> Vec<Vec<u8>> {
    let lane = Lane::of(dtype);
    let s = lane.size();
    let ranks = inputs.len();
    let e = inputs[0].len() / s;
    // `buffer` (small path) or `out_ptr` (normal path) of every rank.
    let mut data: Vec<Vec<u8>> = inputs
        .iter()
        .map(|b| {
            let mut v = b.clone();
            if let Some(padded) = plan.padded {
                v.resize(padded * s, 0);
            }
            v
        })
        .collect();
    // The K sub-reduces run in parallel in MLX, each on its own socket direction, so running
    // them one after the other gives the same bytes per socket.
    for sub in &plan.subs {
        let d = sub.direction;
        let base = sub.start * s;
        for t in 0..2 * (ranks - 1) {
            // Every rank writes segment (r + t·d) of its current data…
            let mut sent: Vec<Vec<u8>> = Vec::with_capacity(ranks);
            for (r, buf) in data.iter().enumerate() {
                let seg = modr(r as isize + t as isize * d, ranks);
                let range = segment(sub.len, ranks, seg);
                let bytes = &buf[base + range.start * s..base + range.end * s];
                let channel = if d < 0 {
                    right(r, ranks, sub.pair)
                } else {
                    left(r, ranks, conns, sub.pair)
                };
                wire.entry((r, channel)).or_default().push(bytes, || {
                    format!(
                        "{label} sub-reduce {} (d={d}) step {t} segment {seg}",
                        sub.index
                    )
                });
                sent.push(bytes.to_vec());
            }
            // …and reads segment (r + d + t·d) from rank r + d.
            for (r, buf) in data.iter_mut().enumerate() {
                let seg = modr(r as isize + d + t as isize * d, ranks);
                let from = modr(r as isize + d, ranks);
                let range = segment(sub.len, ranks, seg);
                let mine = &mut buf[base + range.start * s..base + range.end * s];
                let theirs = &sent[from];
                assert_eq!(mine.len(), theirs.len(), "model: segment sizes");
                if t < ranks - 1 {
                    combine_into(lane, op, mine, theirs);
                } else {
                    mine.copy_from_slice(theirs);
                }
            }
        }
    }
    for buf in &mut data {
        buf.truncate(e * s);
    }
    data
}

/// The bytes of MLX's ring `all_gather` of `inputs` (N bytes per rank) on every socket
/// direction, appended to `wire`, and the result (the same for every rank).
pub fn all_gather_wire(wire: &mut Wire, label: &str, conns: usize, inputs: &[Vec<u8>]) -> Vec<u8> {
    let ranks = inputs.len();
    let nbytes = inputs[0].len();
    let result: Vec<u8> = inputs.concat();
    if ranks == 1 {
        return result;
    }
    let n_gathers = (2 * conns).min(nbytes / MIN_SEND_SIZE).max(1);
    let bytes_per_gather = ceildiv(nbytes, n_gathers);
    for i in 0..n_gathers {
        let offset = i * bytes_per_gather;
        let size = if offset + bytes_per_gather > nbytes {
            nbytes.saturating_sub(offset)
        } else {
            bytes_per_gather
        };
        let d: isize = if i % 2 == 1 { -1 } else { 1 };
        for t in 0..ranks - 1 {
            for r in 0..ranks {
                let block = modr(r as isize + t as isize * d, ranks);
                let channel = if d < 0 {
                    right(r, ranks, i / 2)
                } else {
                    left(r, ranks, conns, i / 2)
                };
                wire.entry((r, channel))
                    .or_default()
                    .push(&inputs[block][offset..offset + size], || {
                        format!("{label} gather {i} (d={d}) step {t} block {block}")
                    });
            }
        }
    }
    result
}

/// The bytes of MLX's ring `send(x, dst)` from rank `from` (which must be a neighbour), appended
/// to `wire`: `max(1024, ⌈n/C⌉)` bytes per socket, on the right sockets if `dst` is the right
/// neighbour, else the left ones.
pub fn send_wire(
    wire: &mut Wire,
    label: &str,
    ranks: usize,
    conns: usize,
    from: usize,
    dst: usize,
    data: &[u8],
) {
    let n = data.len();
    let segment_size = 1024usize.max(ceildiv(n, conns));
    let to_right = dst == (from + 1) % ranks;
    assert!(
        to_right || dst == (from + ranks - 1) % ranks,
        "model: not a neighbour"
    );
    for i in 0..conns {
        if i * segment_size >= n {
            break;
        }
        let channel = if to_right {
            right(from, ranks, i)
        } else {
            left(from, ranks, conns, i)
        };
        let bytes = &data[i * segment_size..n.min((i + 1) * segment_size)];
        wire.entry((from, channel))
            .or_default()
            .push(bytes, || format!("{label} socket {i}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

fn hex(bytes: &[u8]) -> String {
    let mut s = String::new();
    for b in bytes.iter().take(16) {
        let _ = write!(s, "{b:02x}");
    }
    if bytes.len() > 16 {
        s.push('…');
    }
    s
}

/// The first difference between a recorded stream and the model's, or `None`. With
/// `prefix_only`, the recording may stop early (a fault cut it short).
pub fn stream_difference(got: &[u8], want: &Stream, prefix_only: bool) -> Option<String> {
    if let Some(d) = first_span_difference(got, want) {
        return Some(d);
    }
    if got.len() > want.bytes.len() {
        return Some(format!(
            "{} bytes recorded, the model has only {} (extra bytes {})",
            got.len(),
            want.bytes.len(),
            hex(&got[want.bytes.len()..])
        ));
    }
    if !prefix_only && got.len() < want.bytes.len() {
        let missing = want
            .spans
            .iter()
            .find(|s| s.start + s.len > got.len())
            .map_or(String::new(), |s| s.what.clone());
        return Some(format!(
            "only {} of the model's {} bytes recorded (missing from {missing})",
            got.len(),
            want.bytes.len()
        ));
    }
    None
}

fn first_span_difference(got: &[u8], want: &Stream) -> Option<String> {
    for span in &want.spans {
        if span.start >= got.len() {
            break;
        }
        let end = (span.start + span.len).min(got.len());
        let g = &got[span.start..end];
        let w = &want.bytes[span.start..end];
        if g != w {
            let first = g.iter().zip(w).position(|(a, b)| a != b).unwrap_or(0);
            let at = span.start + first;
            return Some(format!(
                "byte {at} (in {}, offset {first} of {}): recorded {} model {}",
                span.what,
                span.len,
                hex(&got[at..end]),
                hex(&want.bytes[at..end])
            ));
        }
    }
    None
}

/// Compares a recorded wire (`Report::wire`, empty streams omitted) with the model's.
pub fn wire_difference(
    got: &BTreeMap<(usize, Channel), Vec<u8>>,
    want: &Wire,
    prefix_only: bool,
) -> Option<String> {
    for (key, stream) in want {
        if stream.bytes.is_empty() {
            continue;
        }
        let recorded = got.get(key).map_or(&[][..], Vec::as_slice);
        if let Some(d) = stream_difference(recorded, stream, prefix_only) {
            return Some(format!("rank {} sending on {}: {d}", key.0, key.1));
        }
    }
    for (key, bytes) in got {
        if !bytes.is_empty() && want.get(key).is_none_or(|s| s.bytes.is_empty()) {
            return Some(format!(
                "rank {} sent {} bytes on {}, where MLX sends nothing (first bytes {})",
                key.0,
                bytes.len(),
                key.1,
                hex(bytes)
            ));
        }
    }
    None
}
