//! The reductions' tests: every dtype and op against MLX's semantics, exhaustive half
//! precision conversions, the aligned and unaligned paths, and property tests. Long because it
//! is one suite over one kernel family; the code it tests is `mod.rs`, `kernel.rs` and `half.rs`.

use super::half::*;
use super::kernel::*;
use super::*;
use ::half::{bf16, f16};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Ordering;

const INTEGERS: [DType; 8] = [
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
];
const OPS: [Reduction; 3] = [Reduction::Sum, Reduction::Max, Reduction::Min];

#[test]
fn every_listed_dtype_has_every_reduction() {
    for dtype in DTYPES {
        for op in OPS {
            assert!(Reducer::new(op, dtype).is_ok(), "{op:?} of {dtype}");
        }
    }
}

/// The sign bit of the NaN this host's FPU makes for `inf + -inf`, asked of the hardware.
fn host_default_nan_sign() -> u16 {
    let nan = std::hint::black_box(f32::INFINITY) + std::hint::black_box(f32::NEG_INFINITY);
    assert!(nan.is_nan());
    ((nan.to_bits() >> 16) as u16) & 0x8000
}

// ---- The reference: one element at a time, written from the definitions -----------------

/// `std::max(local, received)` / `std::min(local, received)` as MLX defines them, given
/// how `local` and `received` compare (`None` if unordered: NaN).
fn pick<T>(op: Reduction, local: T, received: T, ord: Option<Ordering>) -> T {
    match (op, ord) {
        (Reduction::Max, Some(Ordering::Less)) => received,
        (Reduction::Min, Some(Ordering::Greater)) => received,
        _ => local,
    }
}

/// Rounds an exact (or innocuously rounded) sum to float16 bits, to nearest-even.
fn round_to_f16(x: f64) -> u16 {
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a.is_infinite() {
        return sign | 0x7C00;
    }
    if a == 0.0 {
        return sign;
    }
    let exponent = ((a.to_bits() >> 52) as i32) - 1023; // floor(log2(a))
    let quantum = 2f64.powi(exponent.max(-14) - 10); // float16's spacing at `a`
    let rounded = (a / quantum).round_ties_even() * quantum;
    if rounded >= 65536.0 {
        return sign | 0x7C00;
    }
    let bits = f16::from_f64(rounded).to_bits();
    assert_eq!(f16::from_bits(bits).to_f64(), rounded, "representable");
    sign | bits
}

/// Rounds a sum (computed in f64, whose rounding is innocuous for bfloat16) to bfloat16
/// bits, to nearest-even.
fn round_to_bf16(x: f64) -> u16 {
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a.is_infinite() {
        return sign | 0x7F80;
    }
    if a == 0.0 {
        return sign;
    }
    let exponent = ((a.to_bits() >> 52) as i32) - 1023;
    let quantum = 2f64.powi(exponent.max(-126) - 7); // bfloat16's spacing at `a`
    let rounded = (a / quantum).round_ties_even() * quantum;
    if rounded >= 2f64.powi(128) {
        return sign | 0x7F80;
    }
    let bits = (rounded as f32).to_bits();
    assert_eq!(bits & 0xFFFF, 0, "representable");
    sign | (bits >> 16) as u16
}

fn ref_f32_sum(l: f32, r: f32) -> f32 {
    if r.is_nan() {
        f32::from_bits(r.to_bits() | 0x0040_0000)
    } else {
        l + r
    }
}

fn ref_f64_sum(l: f64, r: f64) -> f64 {
    if r.is_nan() {
        f64::from_bits(r.to_bits() | 0x0008_0000_0000_0000)
    } else {
        l + r
    }
}

/// float16 / bfloat16 sum from the definition: exact sum, one rounding, MLX's NaNs.
fn ref_half_sum(l: u16, r: u16, bf: bool) -> u16 {
    let widen = |b: u16| {
        if bf {
            bf16::from_bits(b).to_f64()
        } else {
            f16::from_bits(b).to_f64()
        }
    };
    let (a, b) = (widen(l), widen(r));
    let nan = a.is_nan() || b.is_nan() || (a.is_infinite() && b.is_infinite() && a != b);
    if nan {
        if bf {
            return 0x7FC0;
        }
        let sign = if b.is_nan() {
            r & 0x8000
        } else if a.is_nan() {
            l & 0x8000
        } else {
            host_default_nan_sign()
        };
        return sign | 0x7D00;
    }
    if bf {
        round_to_bf16(a + b)
    } else {
        round_to_f16(a + b)
    }
}

fn ref_half_pick(op: Reduction, l: u16, r: u16, bf: bool) -> u16 {
    let widen = |b: u16| {
        if bf {
            bf16::from_bits(b).to_f64()
        } else {
            f16::from_bits(b).to_f64()
        }
    };
    pick(op, l, r, widen(l).partial_cmp(&widen(r)))
}

/// One element of `local ⊕ received`, from the definitions.
fn ref_element(op: Reduction, dtype: DType, l: &[u8], r: &[u8]) -> Vec<u8> {
    macro_rules! int {
        ($t:ty) => {{
            let a = <$t>::from_le_bytes(l.try_into().unwrap());
            let b = <$t>::from_le_bytes(r.try_into().unwrap());
            let out: $t = match op {
                // Exact sum, then truncation to the type's width.
                Reduction::Sum => (a as i128 + b as i128) as $t,
                Reduction::Max => std::cmp::max(a, b),
                Reduction::Min => std::cmp::min(a, b),
            };
            out.to_le_bytes().to_vec()
        }};
    }
    match dtype {
        DType::Bool => {
            let (a, b) = (l[0] != 0, r[0] != 0);
            let out = match op {
                Reduction::Sum | Reduction::Max => a || b,
                Reduction::Min => a && b,
            };
            vec![u8::from(out)]
        }
        DType::U8 => int!(u8),
        DType::U16 => int!(u16),
        DType::U32 => int!(u32),
        DType::U64 => int!(u64),
        DType::I8 => int!(i8),
        DType::I16 => int!(i16),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::F32 => {
            let a = f32::from_le_bytes(l.try_into().unwrap());
            let b = f32::from_le_bytes(r.try_into().unwrap());
            let out = match op {
                Reduction::Sum => ref_f32_sum(a, b),
                _ => pick(op, a, b, a.partial_cmp(&b)),
            };
            out.to_le_bytes().to_vec()
        }
        DType::F64 => {
            let a = f64::from_le_bytes(l.try_into().unwrap());
            let b = f64::from_le_bytes(r.try_into().unwrap());
            let out = match op {
                Reduction::Sum => ref_f64_sum(a, b),
                _ => pick(op, a, b, a.partial_cmp(&b)),
            };
            out.to_le_bytes().to_vec()
        }
        DType::F16 | DType::BF16 => {
            let bf = dtype == DType::BF16;
            let a = u16::from_le_bytes(l.try_into().unwrap());
            let b = u16::from_le_bytes(r.try_into().unwrap());
            let out = match op {
                Reduction::Sum => ref_half_sum(a, b, bf),
                _ => ref_half_pick(op, a, b, bf),
            };
            out.to_le_bytes().to_vec()
        }
        DType::Complex64 => {
            let f = |b: &[u8]| f32::from_le_bytes(b.try_into().unwrap());
            let (a, b) = ((f(&l[..4]), f(&l[4..])), (f(&r[..4]), f(&r[4..])));
            let out = match op {
                Reduction::Sum => (ref_f32_sum(a.0, b.0), ref_f32_sum(a.1, b.1)),
                // Tuples compare lexicographically: re first, then im.
                _ => {
                    let ord = if a < b {
                        Some(Ordering::Less)
                    } else if b < a {
                        Some(Ordering::Greater)
                    } else {
                        None
                    };
                    pick(op, a, b, ord)
                }
            };
            [out.0.to_le_bytes(), out.1.to_le_bytes()].concat()
        }
        other => unreachable!("{other}"),
    }
}

fn reference(op: Reduction, dtype: DType, local: &[u8], received: &[u8]) -> Vec<u8> {
    let size = dtype.size();
    local
        .chunks_exact(size)
        .zip(received.chunks_exact(size))
        .flat_map(|(l, r)| ref_element(op, dtype, l, r))
        .collect()
}

/// Runs the reducer on copies of `local` and `received` placed at byte offsets `lo` and
/// `ro` of 8-aligned buffers (guard bytes around them), and compares with the reference.
fn check(
    op: Reduction,
    dtype: DType,
    local: &[u8],
    received: &[u8],
    lo: usize,
    ro: usize,
) -> Result<(), TestCaseError> {
    let len = local.len();
    let mut lstore = vec![0u64; len / 8 + 3];
    let mut rstore = vec![0u64; len / 8 + 3];
    let lbuf: &mut [u8] = bytemuck::cast_slice_mut(&mut lstore);
    let rbuf: &mut [u8] = bytemuck::cast_slice_mut(&mut rstore);
    lbuf.fill(0xA5);
    rbuf.fill(0x5A);
    lbuf[lo..lo + len].copy_from_slice(local);
    rbuf[ro..ro + len].copy_from_slice(received);
    let reducer = Reducer::new(op, dtype).unwrap();
    reducer.apply(&mut lbuf[lo..lo + len], &rbuf[ro..ro + len]);
    let want = reference(op, dtype, local, received);
    let size = dtype.size();
    for (i, (got, want)) in lbuf[lo..lo + len]
        .chunks_exact(size)
        .zip(want.chunks_exact(size))
        .enumerate()
    {
        prop_assert_eq!(
            got,
            want,
            "{} {} element {}: local {:02x?} received {:02x?} (offsets {}, {})",
            op.name(),
            dtype,
            i,
            &local[i * size..(i + 1) * size],
            &received[i * size..(i + 1) * size],
            lo,
            ro
        );
    }
    prop_assert!(
        lbuf[..lo]
            .iter()
            .chain(&lbuf[lo + len..])
            .all(|&b| b == 0xA5)
    );
    prop_assert_eq!(&rbuf[ro..ro + len], received);
    Ok(())
}

// ---- Generators ---------------------------------------------------------------------------

/// Bit patterns worth hitting often, as little-endian elements of `dtype`.
fn specials(dtype: DType) -> Vec<Vec<u8>> {
    let f16s: &[u16] = &[
        0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x1000, 0x3C00, 0xBC00, 0x3C01, 0x6800,
        0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7D55, 0xFFFF,
    ];
    let bf16s: &[u16] = &[
        0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3B80, 0x3F80, 0xBF80, 0x3F81, 0x4380,
        0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFFF,
    ];
    let f32s: &[u32] = &[
        0x0000_0000,
        0x8000_0000,
        0x0000_0001,
        0x8000_0001,
        0x3380_0000,
        0x3F80_0000,
        0xBF80_0000,
        0x3F80_0001,
        0x7F7F_FFFF,
        0xFF7F_FFFF,
        0x7F80_0000,
        0xFF80_0000,
        0x7FC0_0000,
        0xFFC0_0000,
        0x7F80_0001,
        0x7FC0_0001,
        0xFFFF_FFFF,
    ];
    let f64s: &[u64] = &[
        0,
        0x8000_0000_0000_0000,
        1,
        0x3FF0_0000_0000_0000,
        0xBFF0_0000_0000_0000,
        0x3FF0_0000_0000_0001,
        0x7FEF_FFFF_FFFF_FFFF,
        0x7FF0_0000_0000_0000,
        0xFFF0_0000_0000_0000,
        0x7FF8_0000_0000_0000,
        0xFFF8_0000_0000_0000,
        0x7FF0_0000_0000_0001,
        0x7FF8_0000_0000_0001,
        u64::MAX,
    ];
    match dtype {
        DType::Bool => [0u8, 1, 2, 0xFF].iter().map(|&b| vec![b]).collect(),
        DType::F16 => f16s.iter().map(|b| b.to_le_bytes().to_vec()).collect(),
        DType::BF16 => bf16s.iter().map(|b| b.to_le_bytes().to_vec()).collect(),
        DType::F32 => f32s.iter().map(|b| b.to_le_bytes().to_vec()).collect(),
        DType::F64 => f64s.iter().map(|b| b.to_le_bytes().to_vec()).collect(),
        DType::Complex64 => {
            // Few distinct parts, so that real parts are often equal.
            let parts = [
                0x0000_0000u32,
                0x8000_0000,
                0x3F80_0000,
                0xBF80_0000,
                0x7F80_0000,
                0x7FC0_0000,
                0xFFC0_0001,
            ];
            parts
                .iter()
                .flat_map(|re| {
                    parts
                        .iter()
                        .map(move |im| [re.to_le_bytes(), im.to_le_bytes()].concat())
                })
                .collect()
        }
        _ => {
            // Integers: 0, 1, all ones, the signed minimum and maximum.
            let size = dtype.size();
            let mut min = vec![0u8; size];
            min[size - 1] = 0x80;
            let mut max = vec![0xFFu8; size];
            max[size - 1] = 0x7F;
            let mut one = vec![0u8; size];
            one[0] = 1;
            vec![vec![0; size], one, vec![0xFF; size], min, max]
        }
    }
}

/// One element: random bytes or a special value.
fn element(dtype: DType) -> BoxedStrategy<Vec<u8>> {
    let size = dtype.size();
    prop_oneof![
        prop::collection::vec(any::<u8>(), size),
        prop::sample::select(specials(dtype)),
    ]
    .boxed()
}

/// `(local, received, local offset, received offset)` of `lens` elements of `dtype`.
fn buffers(
    dtype: DType,
    lens: std::ops::Range<usize>,
) -> impl Strategy<Value = (Vec<u8>, Vec<u8>, usize, usize)> {
    lens.prop_flat_map(move |n| {
        (
            prop::collection::vec(element(dtype), n),
            prop::collection::vec(element(dtype), n),
            0usize..2,
            0usize..2,
        )
    })
    .prop_map(|(l, r, lo, ro)| (l.concat(), r.concat(), lo, ro))
}

fn op() -> impl Strategy<Value = Reduction> {
    prop::sample::select(OPS.to_vec())
}

// ---- Properties: every dtype and op against the reference ---------------------------------

proptest! {
    #[test]
    fn bool_reductions_match_the_reference(op in op(), (l, r, lo, ro) in buffers(DType::Bool, 0..100)) {
        check(op, DType::Bool, &l, &r, lo, ro)?;
    }

    #[test]
    fn integer_reductions_match_the_reference(
        op in op(),
        (dtype, (l, r, lo, ro)) in prop::sample::select(INTEGERS.to_vec()).prop_flat_map(|d| (Just(d), buffers(d, 0..100))),
    ) {
        check(op, dtype, &l, &r, lo, ro)?;
    }

    #[test]
    fn float32_reductions_match_the_reference(op in op(), (l, r, lo, ro) in buffers(DType::F32, 0..100)) {
        check(op, DType::F32, &l, &r, lo, ro)?;
    }

    #[test]
    fn float64_reductions_match_the_reference(op in op(), (l, r, lo, ro) in buffers(DType::F64, 0..100)) {
        check(op, DType::F64, &l, &r, lo, ro)?;
    }

    #[test]
    fn float16_reductions_match_the_reference(op in op(), (l, r, lo, ro) in buffers(DType::F16, 0..100)) {
        check(op, DType::F16, &l, &r, lo, ro)?;
    }

    #[test]
    fn bfloat16_reductions_match_the_reference(op in op(), (l, r, lo, ro) in buffers(DType::BF16, 0..100)) {
        check(op, DType::BF16, &l, &r, lo, ro)?;
    }

    #[test]
    fn complex64_reductions_match_the_reference(op in op(), (l, r, lo, ro) in buffers(DType::Complex64, 0..100)) {
        check(op, DType::Complex64, &l, &r, lo, ro)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn long_buffers_match_the_reference_across_block_boundaries(
        op in op(),
        (dtype, (l, r, lo, ro)) in prop::sample::select(DTYPES.to_vec()).prop_flat_map(|d| (Just(d), buffers(d, 200..1100))),
    ) {
        check(op, dtype, &l, &r, lo, ro)?;
    }
}

// ---- Specific cases -----------------------------------------------------------------------

/// `local ⊕ received` for single elements given as little-endian bytes.
fn apply1(op: Reduction, dtype: DType, local: &[u8], received: &[u8]) -> Vec<u8> {
    let mut l = local.to_vec();
    Reducer::new(op, dtype).unwrap().apply(&mut l, received);
    l
}

fn f16_op(op: Reduction, l: u16, r: u16) -> u16 {
    u16::from_le_bytes(
        apply1(op, DType::F16, &l.to_le_bytes(), &r.to_le_bytes())
            .try_into()
            .unwrap(),
    )
}

fn bf16_op(op: Reduction, l: u16, r: u16) -> u16 {
    u16::from_le_bytes(
        apply1(op, DType::BF16, &l.to_le_bytes(), &r.to_le_bytes())
            .try_into()
            .unwrap(),
    )
}

fn f32_op(op: Reduction, l: u32, r: u32) -> u32 {
    u32::from_le_bytes(
        apply1(op, DType::F32, &l.to_le_bytes(), &r.to_le_bytes())
            .try_into()
            .unwrap(),
    )
}

fn f64_op(op: Reduction, l: u64, r: u64) -> u64 {
    u64::from_le_bytes(
        apply1(op, DType::F64, &l.to_le_bytes(), &r.to_le_bytes())
            .try_into()
            .unwrap(),
    )
}

fn c64_op(op: Reduction, l: (f32, f32), r: (f32, f32)) -> (u32, u32) {
    let enc = |c: (f32, f32)| [c.0.to_le_bytes(), c.1.to_le_bytes()].concat();
    let out = apply1(op, DType::Complex64, &enc(l), &enc(r));
    (
        u32::from_le_bytes(out[..4].try_into().unwrap()),
        u32::from_le_bytes(out[4..].try_into().unwrap()),
    )
}

fn h(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

#[test]
fn bool_sum_is_or() {
    let l = [0u8, 0, 1, 1, 2, 0, 0xFF, 0];
    let r = [0u8, 1, 0, 1, 0, 7, 0xFF, 0];
    assert_eq!(
        apply1(Reduction::Sum, DType::Bool, &l, &r),
        [0, 1, 1, 1, 1, 1, 1, 0]
    );
}

#[test]
fn bool_max_is_or() {
    let l = [0u8, 0, 1, 1, 2, 0];
    let r = [0u8, 1, 0, 1, 0, 0x80];
    assert_eq!(
        apply1(Reduction::Max, DType::Bool, &l, &r),
        [0, 1, 1, 1, 1, 1]
    );
}

#[test]
fn bool_min_is_and() {
    let l = [0u8, 0, 1, 1, 2, 0xFF];
    let r = [0u8, 1, 0, 1, 3, 0];
    assert_eq!(
        apply1(Reduction::Min, DType::Bool, &l, &r),
        [0, 0, 0, 1, 1, 0]
    );
}

#[test]
fn integer_sum_wraps() {
    let sum = |d, l: &[u8], r: &[u8]| apply1(Reduction::Sum, d, l, r);
    assert_eq!(
        sum(DType::I8, &127i8.to_le_bytes(), &1i8.to_le_bytes()),
        (-128i8).to_le_bytes()
    );
    assert_eq!(sum(DType::U8, &[255], &[2]), [1]);
    assert_eq!(
        sum(DType::I16, &i16::MIN.to_le_bytes(), &(-1i16).to_le_bytes()),
        i16::MAX.to_le_bytes()
    );
    assert_eq!(
        sum(DType::U16, &u16::MAX.to_le_bytes(), &u16::MAX.to_le_bytes()),
        (u16::MAX - 1).to_le_bytes()
    );
    assert_eq!(
        sum(DType::I32, &i32::MAX.to_le_bytes(), &i32::MAX.to_le_bytes()),
        (-2i32).to_le_bytes()
    );
    assert_eq!(
        sum(DType::U32, &u32::MAX.to_le_bytes(), &1u32.to_le_bytes()),
        0u32.to_le_bytes()
    );
    assert_eq!(
        sum(DType::I64, &i64::MAX.to_le_bytes(), &1i64.to_le_bytes()),
        i64::MIN.to_le_bytes()
    );
    assert_eq!(
        sum(DType::U64, &u64::MAX.to_le_bytes(), &1u64.to_le_bytes()),
        0u64.to_le_bytes()
    );
}

#[test]
fn integer_max_and_min_respect_signedness() {
    // 0xFF is -1 as int8 and 255 as uint8.
    assert_eq!(apply1(Reduction::Max, DType::I8, &[0xFF], &[1]), [1]);
    assert_eq!(apply1(Reduction::Max, DType::U8, &[0xFF], &[1]), [0xFF]);
    assert_eq!(apply1(Reduction::Min, DType::I8, &[0xFF], &[1]), [0xFF]);
    assert_eq!(apply1(Reduction::Min, DType::U8, &[0xFF], &[1]), [1]);
    let (a, b) = (i64::MIN.to_le_bytes(), 5i64.to_le_bytes());
    assert_eq!(apply1(Reduction::Max, DType::I64, &a, &b), b);
    assert_eq!(apply1(Reduction::Min, DType::U64, &a, &b), b);
}

#[test]
fn f32_max_keeps_a_local_nan_and_ignores_a_received_nan() {
    let (nan, one) = (0x7FC0_0000, 1f32.to_bits());
    assert_eq!(f32_op(Reduction::Max, nan, one), nan);
    assert_eq!(f32_op(Reduction::Max, one, nan), one);
    // A signalling NaN kept in `local` keeps its exact bits.
    assert_eq!(f32_op(Reduction::Max, 0xFF80_0001, one), 0xFF80_0001);
    assert_eq!(f32_op(Reduction::Max, one, 0xFF80_0001), one);
    assert_eq!(f32_op(Reduction::Max, one, 2f32.to_bits()), 2f32.to_bits());
    assert_eq!(
        f32_op(Reduction::Max, f32::NEG_INFINITY.to_bits(), 0xFF7F_FFFF),
        0xFF7F_FFFF
    );
}

#[test]
fn f32_min_keeps_a_local_nan_and_ignores_a_received_nan() {
    let (nan, one) = (0x7FC0_0000, 1f32.to_bits());
    assert_eq!(f32_op(Reduction::Min, nan, one), nan);
    assert_eq!(f32_op(Reduction::Min, one, nan), one);
    assert_eq!(f32_op(Reduction::Min, 2f32.to_bits(), one), one);
}

#[test]
fn f64_max_and_min_keep_a_local_nan_and_ignore_a_received_nan() {
    let (nan, one) = (0xFFF8_0000_0000_0001, 1f64.to_bits());
    for op in [Reduction::Max, Reduction::Min] {
        assert_eq!(f64_op(op, nan, one), nan);
        assert_eq!(f64_op(op, one, nan), one);
    }
}

#[test]
fn float_max_and_min_keep_local_on_signed_zero_ties() {
    let (pz, nz) = (0f32.to_bits(), (-0f32).to_bits());
    for op in [Reduction::Max, Reduction::Min] {
        assert_eq!(f32_op(op, pz, nz), pz);
        assert_eq!(f32_op(op, nz, pz), nz);
        assert_eq!(f64_op(op, (-0f64).to_bits(), 0), (-0f64).to_bits());
        assert_eq!(f16_op(op, 0x8000, 0x0000), 0x8000);
        assert_eq!(bf16_op(op, 0x0000, 0x8000), 0x0000);
    }
}

#[test]
fn f32_nan_sum_takes_the_received_nan_quieted() {
    let one = 1f32.to_bits();
    // Received NaN wins (quieted), whatever local is.
    assert_eq!(
        f32_op(Reduction::Sum, 0x7FC0_0001, 0xFFC0_0002),
        0xFFC0_0002
    );
    assert_eq!(
        f32_op(Reduction::Sum, 0xFFC0_0002, 0x7FC0_0001),
        0x7FC0_0001
    );
    assert_eq!(
        f32_op(Reduction::Sum, 0xFFC0_0002, 0x7F80_0001),
        0x7FC0_0001
    );
    assert_eq!(f32_op(Reduction::Sum, one, 0x7F80_0001), 0x7FC0_0001);
    // Only local is NaN: the hardware propagates it, quieted.
    assert_eq!(f32_op(Reduction::Sum, 0xFFC0_0003, one), 0xFFC0_0003);
    assert_eq!(f32_op(Reduction::Sum, 0x7F80_0005, one), 0x7FC0_0005);
    // inf + -inf: the host's default NaN.
    let nan = f32_op(
        Reduction::Sum,
        f32::INFINITY.to_bits(),
        f32::NEG_INFINITY.to_bits(),
    );
    assert!(f32::from_bits(nan).is_nan());
    assert_eq!((nan >> 16) as u16 & 0x8000, host_default_nan_sign());
    assert_eq!(f32_op(Reduction::Sum, one, one), 2f32.to_bits());
}

#[test]
fn f64_nan_sum_takes_the_received_nan_quieted() {
    let one = 1f64.to_bits();
    assert_eq!(
        f64_op(Reduction::Sum, 0x7FF8_0000_0000_0001, 0xFFF8_0000_0000_0002),
        0xFFF8_0000_0000_0002
    );
    assert_eq!(
        f64_op(Reduction::Sum, one, 0x7FF0_0000_0000_0001),
        0x7FF8_0000_0000_0001
    );
    assert_eq!(
        f64_op(Reduction::Sum, 0xFFF8_0000_0000_0003, one),
        0xFFF8_0000_0000_0003
    );
    assert_eq!(f64_op(Reduction::Sum, one, one), 2f64.to_bits());
}

#[test]
fn default_nan_sign_matches_the_host() {
    assert_eq!(DEFAULT_NAN_SIGN, host_default_nan_sign());
}

#[test]
fn f16_sum_rounds_once_to_nearest_even() {
    let sum = |a: f32, b: f32| f16_op(Reduction::Sum, h(a), h(b));
    // Exact ties go to even.
    assert_eq!(sum(1.0, 2f32.powi(-11)), h(1.0));
    assert_eq!(
        sum(1.0 + 2f32.powi(-10), 2f32.powi(-11)),
        h(1.0 + 2f32.powi(-9))
    );
    assert_eq!(sum(2048.0, 1.0), h(2048.0));
    assert_eq!(sum(2050.0, 1.0), h(2052.0));
    // Just above a tie rounds up: 2049 + 2^-10 would become the tie 2049, and then 2048,
    // if the sum were rounded twice (to fewer bits first).
    assert_eq!(sum(2048.0, 1.0 + 2f32.powi(-10)), h(2050.0));
    assert_eq!(sum(-2048.0, -(1.0 + 2f32.powi(-10))), h(-2050.0));
    // Overflow: 65504 + 16 is the tie between 65504 and 2^16, rounding to inf.
    assert_eq!(sum(65504.0, 16.0), 0x7C00);
    assert_eq!(sum(65504.0, 8.0), h(65504.0));
    assert_eq!(sum(-65504.0, -65504.0), 0xFC00);
    // Subnormals add exactly.
    assert_eq!(f16_op(Reduction::Sum, 0x0001, 0x0001), 0x0002);
    assert_eq!(f16_op(Reduction::Sum, 0x03FF, 0x0001), 0x0400);
    assert_eq!(f16_op(Reduction::Sum, 0x8001, 0x0001), 0x0000);
    assert_eq!(f16_op(Reduction::Sum, 0x8000, 0x8000), 0x8000);
}

#[test]
fn f16_sum_is_correctly_rounded_for_every_local_value() {
    let received = [
        0x0000u16, 0x8000, 0x0001, 0x3C00, 0xBC00, 0x1000, 0x9001, 0x6800, 0x7BFF, 0xFBFF, 0x0C01,
        0x3555,
    ];
    let local: Vec<u16> = (0..=u16::MAX).collect();
    for &r in &received {
        let mut l = local.clone();
        let rs = vec![r; l.len()];
        F16Lane::combine_slice::<SUM>(&mut l, &rs);
        for (&a, &got) in local.iter().zip(&l) {
            assert_eq!(got, ref_half_sum(a, r, false), "{a:#06x} + {r:#06x}");
        }
    }
}

#[test]
fn f16_nan_sum_is_the_nan_sign_or_0x7d00() {
    let one = h(1.0);
    assert_eq!(f16_op(Reduction::Sum, 0x7E00, one), 0x7D00);
    assert_eq!(f16_op(Reduction::Sum, 0xFE00, one), 0xFD00);
    assert_eq!(f16_op(Reduction::Sum, one, 0xFE00), 0xFD00);
    assert_eq!(f16_op(Reduction::Sum, 0x7C01, one), 0x7D00); // signalling
    assert_eq!(f16_op(Reduction::Sum, 0xFC00, 0x7D55), 0x7D00);
    // Both NaN: received's sign (as MLX's float16 loop on x86-64).
    assert_eq!(f16_op(Reduction::Sum, 0xFE02, 0x7E01), 0x7D00);
    assert_eq!(f16_op(Reduction::Sum, 0x7E01, 0xFE02), 0xFD00);
    // inf + -inf: the host's default NaN's sign (0xFD00 on x86-64, 0x7D00 on ARM).
    let sign = host_default_nan_sign();
    assert_eq!(f16_op(Reduction::Sum, 0x7C00, 0xFC00), sign | 0x7D00);
    assert_eq!(f16_op(Reduction::Sum, 0xFC00, 0x7C00), sign | 0x7D00);
}

#[test]
fn f16_sum_with_infinities() {
    assert_eq!(f16_op(Reduction::Sum, 0x7C00, 0x7C00), 0x7C00);
    assert_eq!(f16_op(Reduction::Sum, 0xFC00, 0xFC00), 0xFC00);
    assert_eq!(f16_op(Reduction::Sum, 0x7C00, h(-65504.0)), 0x7C00);
    assert_eq!(f16_op(Reduction::Sum, h(1.0), 0xFC00), 0xFC00);
}

#[test]
fn bf16_nan_sum_gives_0x7fc0() {
    let one = 0x3F80;
    for (l, r) in [
        (0x7FC0, one),
        (0xFFC0, one),
        (one, 0xFFC1),
        (0x7F81, one),
        (0xFFC1, 0x7FC2),
        (0x7F80, 0xFF80),
        (0xFF80, 0x7F80),
    ] {
        assert_eq!(bf16_op(Reduction::Sum, l, r), 0x7FC0, "{l:#06x} + {r:#06x}");
    }
    assert_eq!(bf16_op(Reduction::Sum, 0x7F80, 0x7F80), 0x7F80);
    assert_eq!(bf16_op(Reduction::Sum, 0xFF80, one), 0xFF80);
}

#[test]
fn bf16_sum_rounds_once_to_nearest_even() {
    let b = |x: f32| {
        let bits = x.to_bits();
        assert_eq!(bits & 0xFFFF, 0);
        (bits >> 16) as u16
    };
    let sum = |x: f32, y: f32| bf16_op(Reduction::Sum, b(x), b(y));
    assert_eq!(sum(1.0, 2f32.powi(-8)), b(1.0)); // tie to even
    assert_eq!(
        sum(1.0 + 2f32.powi(-7), 2f32.powi(-8)),
        b(1.0 + 2f32.powi(-6))
    ); // tie to even
    assert_eq!(sum(256.0, 1.0), b(256.0)); // tie to even
    assert_eq!(sum(256.0, 1.0 + 2f32.powi(-7)), b(258.0)); // above the tie
    // The largest bfloat16 plus half its spacing is the tie with 2^128: inf.
    assert_eq!(bf16_op(Reduction::Sum, 0x7F7F, 0x7B00), 0x7F80);
    assert_eq!(bf16_op(Reduction::Sum, 0x7F7F, 0x7F7F), 0x7F80);
    // Subnormals add exactly.
    assert_eq!(bf16_op(Reduction::Sum, 0x0001, 0x007F), 0x0080);
}

#[test]
fn half_max_and_min_return_the_original_bits() {
    for (op_, l, r, want) in [
        (Reduction::Max, 0x7C01u16, 0x3C00u16, 0x7C01u16), // local signalling NaN stays
        (Reduction::Max, 0x3C00, 0x7C01, 0x3C00),          // received NaN is ignored
        (Reduction::Min, 0xFD55, 0x3C00, 0xFD55),
        (Reduction::Max, 0xFC00, 0x7C00, 0x7C00),
        (Reduction::Min, 0xFC00, 0x7C00, 0xFC00),
        (Reduction::Max, 0x0001, 0x8001, 0x0001),
        (Reduction::Min, 0x0001, 0x8001, 0x8001),
        (Reduction::Max, 0x3C00, 0x3C01, 0x3C01),
    ] {
        assert_eq!(f16_op(op_, l, r), want, "{} {l:#06x} {r:#06x}", op_.name());
    }
    assert_eq!(bf16_op(Reduction::Max, 0xFFC1, 0x3F80), 0xFFC1);
    assert_eq!(bf16_op(Reduction::Max, 0x3F80, 0xFFC1), 0x3F80);
    assert_eq!(bf16_op(Reduction::Min, 0x3F80, 0xBF80), 0xBF80);
    assert_eq!(bf16_op(Reduction::Max, 0xFF80, 0xFF7F), 0xFF7F);
}

#[test]
fn half_comparison_keys_order_like_float32() {
    let others: Vec<u16> = (0..=u16::MAX)
        .step_by(97)
        .chain([
            0x0000, 0x8000, 0x7C00, 0xFC00, 0x7F80, 0xFF80, 0x7BFF, 0x0001, 0x8001,
        ])
        .collect();
    for a in 0..=u16::MAX {
        for &b in &others {
            let (fa, fb) = (f16::from_bits(a).to_f32(), f16::from_bits(b).to_f32());
            assert_eq!(half_lt::<F16Lane>(a, b), fa < fb, "f16 {a:#06x} < {b:#06x}");
            let (ba, bb) = (bf16::from_bits(a).to_f32(), bf16::from_bits(b).to_f32());
            assert_eq!(
                half_lt::<Bf16Lane>(a, b),
                ba < bb,
                "bf16 {a:#06x} < {b:#06x}"
            );
        }
    }
}

#[test]
fn bf16_widening_is_exact() {
    for bits in 0..=u16::MAX {
        let y = bf16::from_bits(bits);
        if !y.is_nan() {
            assert_eq!(Bf16Lane::widen(bits).to_bits(), y.to_f32().to_bits());
        }
    }
}

#[test]
fn bf16_narrowing_is_round_to_nearest_even() {
    // Every sign and exponent, with the bits that decide the rounding varied.
    for high in 0..=u16::MAX {
        for low in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000] {
            let x = f32::from_bits((u32::from(high) << 16) | low);
            if !x.is_nan() {
                assert_eq!(
                    Bf16Lane::narrow(x),
                    bf16::from_f32(x).to_bits(),
                    "{:#010x}",
                    x.to_bits()
                );
            }
        }
    }
}

// ---- float16 conversions ------------------------------------------------------------------

/// `f32_to_f16(bits)` is `half::f16::from_f32`'s result, unless `bits` is a NaN (for
/// which it must only not panic).
fn assert_narrows_like_half(bits: u32) {
    let x = f32::from_bits(bits);
    let got = f32_to_f16(x);
    if !x.is_nan() {
        assert_eq!(got, f16::from_f32(x).to_bits(), "{bits:#010x} ({x:e})");
    }
}

#[test]
fn float16_widening_is_exact_for_every_input() {
    for bits in 0..=u16::MAX {
        let want = f16::from_bits(bits).to_f32();
        let got = f16_to_f32(bits);
        assert_eq!(got.is_nan(), want.is_nan(), "{bits:#06x}");
        // `half` keeps a NaN's sign and payload (and sets the quiet bit): NaNs too are
        // compared bit for bit.
        assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x}");
        if want.is_finite() {
            assert_eq!(
                f16_finite_to_f32(bits).to_bits(),
                want.to_bits(),
                "{bits:#06x}"
            );
        }
    }
}

#[test]
fn float16_narrowing_matches_half_around_every_rounding_boundary() {
    // Every finite float16 and the midpoint between it and the next one up (65520, the
    // overflow threshold, after the largest), with their float32 neighbours, both signs.
    for bits in 0..0x7C00u16 {
        let value = f16::from_bits(bits).to_f32();
        let next = if bits == 0x7BFF {
            65536.0
        } else {
            f16::from_bits(bits + 1).to_f32()
        };
        let midpoint = (value + next) / 2.0;
        assert_eq!(
            f64::from(midpoint),
            (f64::from(value) + f64::from(next)) / 2.0,
            "exact"
        );
        for centre in [value.to_bits(), midpoint.to_bits()] {
            for step in -2..=2 {
                if let Some(x) = centre.checked_add_signed(step) {
                    assert_narrows_like_half(x);
                    assert_narrows_like_half(x | 0x8000_0000);
                }
            }
        }
    }
}

#[test]
fn float16_narrowing_matches_half_for_every_float32_exponent() {
    let mantissas = [
        0u32,
        1,
        2,
        0x0FFF,
        0x1000,
        0x1001,
        0x1FFF,
        0x2000,
        0x2001,
        0x2FFF,
        0x3000,
        0x3001,
        0x0012_3456,
        0x002A_AAAA,
        0x0040_0000,
        0x0040_1000,
        0x0055_5555,
        0x007F_DFFF,
        0x007F_E000,
        0x007F_EFFF,
        0x007F_F000,
        0x007F_F001,
        0x007F_FFFF,
    ];
    for exponent in 0..=255u32 {
        for mantissa in mantissas {
            for sign in [0, 0x8000_0000] {
                assert_narrows_like_half(sign | (exponent << 23) | mantissa);
            }
        }
    }
}

#[test]
fn float16_narrowing_handles_zeros_infinities_overflow_and_the_smallest_subnormals() {
    let below = |x: f32| f32::from_bits(x.to_bits() - 1);
    let above = |x: f32| f32::from_bits(x.to_bits() + 1);
    let tiny = 2f32.powi(-25); // half of the smallest subnormal float16
    for (x, want) in [
        (0.0, 0x0000),
        (f32::INFINITY, 0x7C00),
        (f32::MAX, 0x7C00),
        (65504.0, 0x7BFF),
        (below(65520.0), 0x7BFF),
        (65520.0, 0x7C00), // the tie between 65504 and 2^16 rounds to even: infinity
        (above(65520.0), 0x7C00),
        (65536.0, 0x7C00),
        (f32::from_bits(1), 0x0000),
        (2f32.powi(-26), 0x0000),
        (tiny, 0x0000), // the tie between 0 and 2^-24 rounds to even: 0
        (above(tiny), 0x0001),
        (below(2.0 * tiny), 0x0001),
        (2.0 * tiny, 0x0001),
        (3.0 * tiny, 0x0002),            // tie, to even
        (5.0 * tiny, 0x0002),            // tie, to even
        (7.0 * tiny, 0x0004),            // tie, to even
        (2f32.powi(-14) - tiny, 0x0400), // tie between 0x03FF and 0x0400
        (below(2f32.powi(-14) - tiny), 0x03FF),
        (2f32.powi(-14), 0x0400),
    ] {
        assert_eq!(f16::from_f32(x).to_bits(), want, "{x:e} (half)");
        assert_eq!(f32_to_f16(x), want, "{x:e}");
        assert_eq!(f32_to_f16(-x), want | 0x8000, "{:e}", -x);
    }
    // NaNs give some bits, without panicking.
    for bits in [
        0x7F80_0001u32,
        0x7FC0_0000,
        0x7FFF_FFFF,
        0xFF80_0001,
        0xFFFF_FFFF,
    ] {
        std::hint::black_box(f32_to_f16(f32::from_bits(bits)));
    }
}

#[test]
fn float16_narrowing_matches_half_on_random_bit_patterns() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x00F1_6F16);
    for _ in 0..2_000_000 {
        assert_narrows_like_half(rng.next_u32());
    }
    // Exponents around float16's range (2^-27 to 2^16), where the rounding happens.
    for _ in 0..2_000_000 {
        let bits = rng.next_u32();
        let exponent = 100 + (bits >> 23 & 0xFF) % 44;
        assert_narrows_like_half((bits & 0x807F_FFFF) | (exponent << 23));
    }
}

#[test]
fn half_sums_over_unaligned_bytes_match_the_reference() {
    // Every value as `local`, at byte offsets that leave one or both buffers unaligned
    // (the kernel then reads and writes byte pairs), for blocks with and without
    // infinities and NaNs.
    let local: Vec<u16> = (0..=u16::MAX).collect();
    let bytes = |xs: &[u16]| xs.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let reversed: Vec<u16> = local.iter().rev().copied().collect();
    for received in [
        reversed,
        vec![0x3C00; local.len()],
        vec![0x8001; local.len()],
    ] {
        for dtype in [DType::F16, DType::BF16] {
            for (lo, ro) in [(1, 0), (0, 1), (1, 1)] {
                check(
                    Reduction::Sum,
                    dtype,
                    &bytes(&local),
                    &bytes(&received),
                    lo,
                    ro,
                )
                .unwrap();
            }
        }
    }
}

#[test]
fn half_scalar_combine_matches_the_slice_kernel() {
    let values: Vec<u16> = (0..=u16::MAX)
        .step_by(13)
        .chain([0x7C00, 0xFC00, 0x7F80, 0xFF80, 0x7E00, 0xFFC0])
        .collect();
    let received: Vec<u16> = values.iter().rev().copied().collect();
    macro_rules! same {
        ($lane:ty, $op:expr) => {{
            let mut slice = values.clone();
            <$lane>::combine_slice::<$op>(&mut slice, &received);
            let scalar: Vec<u16> = values
                .iter()
                .zip(&received)
                .map(|(&l, &r)| <$lane>::combine::<$op>(l, r))
                .collect();
            assert_eq!(slice, scalar);
        }};
    }
    same!(F16Lane, SUM);
    same!(F16Lane, MAX);
    same!(F16Lane, MIN);
    same!(Bf16Lane, SUM);
    same!(Bf16Lane, MAX);
    same!(Bf16Lane, MIN);
}

#[test]
fn complex_sum_adds_each_lane() {
    assert_eq!(
        c64_op(Reduction::Sum, (1.0, 2.0), (3.0, -5.0)),
        (4f32.to_bits(), (-3f32).to_bits())
    );
    let nan = f32::from_bits(0xFFC0_0002);
    assert_eq!(
        c64_op(Reduction::Sum, (1.0, 2.0), (nan, 1.0)),
        (0xFFC0_0002, 3f32.to_bits())
    );
}

#[test]
fn complex_max_is_lexicographic() {
    let bits = |c: (f32, f32)| (c.0.to_bits(), c.1.to_bits());
    let max = |l, r| c64_op(Reduction::Max, l, r);
    assert_eq!(max((1.0, 9.0), (2.0, 0.0)), bits((2.0, 0.0))); // real part decides
    assert_eq!(max((2.0, 0.0), (1.0, 9.0)), bits((2.0, 0.0)));
    assert_eq!(max((1.0, 2.0), (1.0, 3.0)), bits((1.0, 3.0))); // equal real parts: imaginary
    assert_eq!(max((1.0, 3.0), (1.0, 2.0)), bits((1.0, 3.0)));
    assert_eq!(max((0.0, 1.0), (-0.0, 2.0)), bits((-0.0, 2.0))); // 0 == -0
    assert_eq!(max((1.0, 1.0), (1.0, 1.0)), bits((1.0, 1.0)));
    let nan = f32::NAN;
    assert_eq!(max((nan, 0.0), (1.0, 0.0)), bits((nan, 0.0))); // unordered: local stays
    assert_eq!(max((1.0, 0.0), (nan, 5.0)), bits((1.0, 0.0)));
    assert_eq!(max((1.0, nan), (1.0, 5.0)), bits((1.0, nan)));
    assert_eq!(max((1.0, 0.0), (2.0, nan)), bits((2.0, nan))); // real part decides
}

#[test]
fn complex_min_is_lexicographic() {
    let bits = |c: (f32, f32)| (c.0.to_bits(), c.1.to_bits());
    let min = |l, r| c64_op(Reduction::Min, l, r);
    assert_eq!(min((1.0, 9.0), (2.0, 0.0)), bits((1.0, 9.0)));
    assert_eq!(min((2.0, 0.0), (1.0, 9.0)), bits((1.0, 9.0)));
    assert_eq!(min((1.0, 2.0), (1.0, 3.0)), bits((1.0, 2.0)));
    assert_eq!(min((1.0, 3.0), (1.0, 2.0)), bits((1.0, 2.0)));
    let nan = f32::NAN;
    assert_eq!(min((nan, 0.0), (1.0, 0.0)), bits((nan, 0.0)));
    assert_eq!(min((1.0, 0.0), (1.0, nan)), bits((1.0, 0.0)));
    assert_eq!(min((1.0, 0.0), (-1.0, nan)), bits((-1.0, nan)));
}

#[test]
fn unaligned_and_aligned_buffers_agree() {
    for dtype in DTYPES {
        for op_ in OPS {
            let n = 700 * dtype.size();
            let local: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            let received: Vec<u8> = (0..n).map(|i| (i * 101 + 3) as u8).collect();
            for (lo, ro) in [(0, 0), (1, 0), (0, 1), (1, 1), (3, 5)] {
                check(op_, dtype, &local, &received, lo, ro).unwrap();
            }
        }
    }
}

#[test]
fn empty_buffers_are_left_alone() {
    for dtype in DTYPES {
        for op_ in OPS {
            Reducer::new(op_, dtype).unwrap().apply(&mut [], &[]);
        }
    }
}

#[test]
fn reducer_reports_its_op_dtype_and_element_size() {
    for dtype in DTYPES {
        for op_ in OPS {
            let reducer = Reducer::new(op_, dtype).unwrap();
            assert_eq!(reducer.op(), op_);
            assert_eq!(reducer.dtype(), dtype);
            assert_eq!(reducer.element_size(), dtype.size());
        }
    }
}

#[test]
fn reductions_have_names_and_convert_from_all_reduce() {
    assert_eq!(Reduction::Sum.name(), "sum");
    assert_eq!(Reduction::Max.name(), "max");
    assert_eq!(Reduction::Min.name(), "min");
    assert_eq!(Reduction::try_from(AllReduce::Sum), Ok(Reduction::Sum));
    assert_eq!(Reduction::try_from(AllReduce::Max), Ok(Reduction::Max));
    assert_eq!(Reduction::try_from(AllReduce::Min), Ok(Reduction::Min));
}

#[test]
fn unsupported_reduction_names_the_op_and_dtype() {
    let e = UnsupportedReduction {
        op: "sum".into(),
        dtype: "float8".into(),
    };
    assert_eq!(e.to_string(), "distributed: no sum reduction for float8");
}

#[test]
#[should_panic(expected = "differ in length")]
fn apply_panics_on_different_lengths() {
    Reducer::new(Reduction::Sum, DType::F32)
        .unwrap()
        .apply(&mut [0; 8], &[0; 4]);
}

#[test]
#[should_panic(expected = "not a multiple")]
fn apply_panics_on_a_partial_element() {
    Reducer::new(Reduction::Sum, DType::F32)
        .unwrap()
        .apply(&mut [0; 6], &[0; 6]);
}

#[test]
fn jaccl_max_and_min_keep_the_received_operand_where_the_ring_keeps_the_local_one() {
    let f = |xs: &[f32]| xs.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let local = f(&[f32::NAN, 0.0, 1.0, 3.0]);
    let received = f(&[1.0, -0.0, f32::NAN, 2.0]);
    for (op, ring_keeps, jaccl_keeps) in [
        (
            Reduction::Max,
            f(&[f32::NAN, 0.0, 1.0, 3.0]),
            f(&[1.0, -0.0, f32::NAN, 3.0]),
        ),
        (
            Reduction::Min,
            f(&[f32::NAN, 0.0, 1.0, 2.0]),
            f(&[1.0, -0.0, f32::NAN, 2.0]),
        ),
    ] {
        let mut ring = local.clone();
        Reducer::new(op, DType::F32)
            .unwrap()
            .apply(&mut ring, &received);
        let mut jaccl = local.clone();
        Reducer::jaccl(op, DType::F32)
            .unwrap()
            .apply(&mut jaccl, &received);
        assert_eq!(ring, ring_keeps, "{op:?}");
        assert_eq!(jaccl, jaccl_keeps, "{op:?}");
    }
    // Sums are the same kernel; long unaligned buffers go through the blocked copy.
    let long: Vec<u8> = (0..4099u32).map(|i| i as u8).collect();
    for dtype in [DType::I8, DType::BF16, DType::F64, DType::Complex64] {
        let n = long.len() / dtype.size() * dtype.size();
        let (a, b) = (&long[1..n], &long[..n - 1]);
        let a = &a[..a.len() / dtype.size() * dtype.size()];
        let b = &b[..a.len()];
        let mut swapped = a.to_vec();
        Reducer::jaccl(Reduction::Max, dtype)
            .unwrap()
            .apply(&mut swapped, b);
        let mut plain = b.to_vec();
        Reducer::new(Reduction::Max, dtype)
            .unwrap()
            .apply(&mut plain, a);
        assert_eq!(swapped, plain, "{dtype}");
    }
}
