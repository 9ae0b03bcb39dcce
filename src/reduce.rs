//! The element-wise reductions of MLX's distributed ring (`all_sum`, `all_max`, `all_min`),
//! bit-exact with MLX for every nuvec dtype.
//!
//! A [`Reducer`] is chosen once per collective from a [`Reduction`] and a [`DType`], and then
//! applied to every piece that arrives: `local[i] = local[i] ⊕ received[i]`. Buffers are raw
//! little-endian bytes at any alignment. When both buffers are aligned for their element type
//! the kernel runs directly over typed slices (auto-vectorised); otherwise it decodes blocks
//! of elements into aligned stack buffers, reduces them and writes them back.
//!
//! # Semantics
//!
//! MLX's ring applies `SumOp` (`*output += *input`), `MaxOp` (`std::max(*output, *input)`)
//! and `MinOp` (`std::min(*output, *input)`) of `mlx/distributed/reduction_ops.h`, where
//! `output` is this rank's data ("local") and `input` is what arrived ("received"). The
//! choices below were checked against MLX 0.32.4's ring (the Linux x86-64 `mlx-cpu` wheel)
//! with special values on both sides, in both orders.
//!
//! - **bool** (one byte): sum and max are *or*, min is *and*. Any nonzero byte is true; the
//!   result is always `0` or `1`.
//! - **integers**: sum wraps (two's complement); max and min compare natively.
//! - **float32, float64**: `std::max(a, b)` is `a < b ? b : a`, so max takes `received` only
//!   if `local < received`, and min takes `received` only if `received < local`; otherwise
//!   `local` is kept, bit for bit. With NaNs this is order-dependent: a NaN in `local` stays,
//!   a NaN in `received` is never taken; `-0.0` and `+0.0` keep `local`.
//!
//!   Sum is `local + received` in the type itself. Its NaN bits are made deterministic: if
//!   `received` is NaN the result is `received`, quieted (quiet bit set); otherwise it is the
//!   hardware's `local + received` (a NaN `local` comes out quieted, `inf + -inf` gives the
//!   host's default NaN: `0xFFC00000` / `0xFFF8000000000000` on x86-64, positive on ARM).
//!   That is what MLX's auto-vectorised loop produces on x86-64 (`received` is the first
//!   operand of its `addps`/`addpd`). When *both* operands are NaN, MLX's own result depends
//!   on how GCC compiled it (its scalar tail loop returns `local`'s NaN), which cannot be
//!   reproduced in general; this module always returns `received`'s.
//! - **float16, bfloat16**: as MLX's software types `_MLX_Float16` / `_MLX_BFloat16` (MLX's
//!   `float16_t` on Linux, and its `bfloat16_t` everywhere except with native `__ARM_FEATURE_BF16`),
//!   every operation is done on the operands converted to `float32`:
//!   - the sum is added in `float32` and rounded once, to nearest-even, back to the half type.
//!     That is the correctly rounded half-precision sum (`float32` has more than twice the
//!     precision of either half type, so that double rounding is innocuous);
//!   - max and min compare the `float32` values with the `std::max` / `std::min` rule above
//!     and return the *original bits* of the chosen operand (NaN payloads, signalling NaNs and
//!     the sign of zero are untouched).
//!
//!   A NaN sum has MLX's bit pattern (its `float32 -> half` conversions build NaNs from
//!   constants; the `half` crate would keep the payload instead):
//!   - bfloat16: always `0x7FC0` (`__MLX_BFLOAT_NAN__`; the sign is dropped);
//!   - float16: `sign | 0x7D00` (`__MLX_HALF_NAN__`), `sign` being the sign of the `float32`
//!     NaN: `received`'s if `received` is NaN, else `local`'s if `local` is NaN, else
//!     (`inf + -inf`) the sign of the host's default NaN, negative on x86 / x86-64
//!     (`0xFFC00000`, so `0xFD00`), positive elsewhere (ARM, RISC-V: `0x7D00`). MLX's
//!     float16 loop is scalar, and on x86-64 it gives `received`'s sign when both are NaN.
//!     (MLX built with native `__fp16` arithmetic, as on Apple silicon, produces hardware
//!     NaNs instead: `0x7E00` or the quieted input NaN.)
//! - **complex64** (`re`, `im` as two `float32`): sum is per lane, with the float32 NaN rule
//!   per lane. Max and min use MLX's lexicographic `complex64_t` order, `a < b` iff
//!   `a.re < b.re || (a.re == b.re && a.im < b.im)`, with the `std::max` / `std::min` rule
//!   (and the original bits of the chosen operand).
//!
//! Newer MLX sources (`mlx/distributed/nan_ops.h`) replace `std::max` / `std::min` with
//! NaN-propagating variants; MLX 0.32.4's ring still behaves as described above.
//!
//! # Performance
//!
//! One generic kernel serves every dtype: each element type is a `Lane` (its in-memory
//! representation and its `combine`), and the kernel works on typed slices (aligned buffers)
//! or on 256-element stack blocks decoded with `from_le_bytes` (unaligned buffers). The inner
//! loops are branch-free so that they auto-vectorise. float16 and bfloat16 are widened to
//! `float32` exactly with integer arithmetic; float16 sums are narrowed a block at a time
//! with `half`'s slice conversion (F16C / NEON where the CPU has it), bfloat16 sums with
//! MLX's own round-to-nearest-even bit trick; half-precision max and min never convert at
//! all: they compare sign-magnitude integer keys, which order exactly as the `float32`
//! values do.

use bytemuck::{Pod, Zeroable};
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use nuvec_core::distributed::AllReduce;
use nuvec_core::{Complex64, DType};

/// Sum, Max or Min.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// Element-wise sum (booleans: or; integers wrap).
    Sum,
    /// Element-wise maximum (booleans: or).
    Max,
    /// Element-wise minimum (booleans: and).
    Min,
}

impl Reduction {
    /// The reduction's lowercase name: `"sum"`, `"max"` or `"min"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Max => "max",
            Self::Min => "min",
        }
    }
}

impl TryFrom<AllReduce> for Reduction {
    type Error = UnsupportedReduction;

    /// The reduction of a collective; fails for reductions added to nuvec-core after this
    /// crate was written.
    fn try_from(op: AllReduce) -> Result<Self, Self::Error> {
        match op {
            AllReduce::Sum => Ok(Self::Sum),
            AllReduce::Max => Ok(Self::Max),
            AllReduce::Min => Ok(Self::Min),
            other => Err(UnsupportedReduction {
                op: format!("{other:?}").to_lowercase(),
                dtype: "any dtype".to_owned(),
            }),
        }
    }
}

/// A reduction for one dtype, chosen once (a function pointer to a monomorphised generic kernel).
#[derive(Clone, Copy, Debug)]
pub struct Reducer {
    op: Reduction,
    dtype: DType,
    element_size: usize,
    kernel: fn(&mut [u8], &[u8]),
}

impl Reducer {
    /// The kernel of `op` over elements of `dtype`. Fails for dtypes this crate does not know
    /// (`DType` is non-exhaustive).
    pub fn new(op: Reduction, dtype: DType) -> Result<Self, UnsupportedReduction> {
        let kernel = match dtype {
            DType::Bool => select::<BoolLane>(op),
            DType::U8 => select::<u8>(op),
            DType::U16 => select::<u16>(op),
            DType::U32 => select::<u32>(op),
            DType::U64 => select::<u64>(op),
            DType::I8 => select::<i8>(op),
            DType::I16 => select::<i16>(op),
            DType::I32 => select::<i32>(op),
            DType::I64 => select::<i64>(op),
            DType::F16 => select::<F16Lane>(op),
            DType::BF16 => select::<Bf16Lane>(op),
            DType::F32 => select::<f32>(op),
            DType::F64 => select::<f64>(op),
            DType::Complex64 => select::<Complex64>(op),
            other => {
                return Err(UnsupportedReduction {
                    op: op.name().to_owned(),
                    dtype: other.to_string(),
                });
            }
        };
        Ok(Self {
            op,
            dtype,
            element_size: dtype.size(),
            kernel,
        })
    }

    /// The reduction.
    pub fn op(&self) -> Reduction {
        self.op
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The size of one element in bytes.
    pub fn element_size(&self) -> usize {
        self.element_size
    }

    /// local[i] = local[i] ⊕ received[i] for every element. Panics if lengths differ or are not a multiple of the element size (callers guarantee it).
    ///
    /// Both buffers are little-endian elements at any alignment; aligned buffers take the
    /// fast path.
    pub fn apply(&self, local: &mut [u8], received: &[u8]) {
        assert_eq!(
            local.len(),
            received.len(),
            "reduce: local and received buffers differ in length"
        );
        assert_eq!(
            local.len() % self.element_size,
            0,
            "reduce: buffer length {} is not a multiple of the {} element size {}",
            local.len(),
            self.dtype,
            self.element_size
        );
        (self.kernel)(local, received);
    }
}

/// A reduction this crate cannot perform: an unknown operation or dtype.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("distributed: no {op} reduction for {dtype}")]
pub struct UnsupportedReduction {
    /// The reduction's name (`"sum"`, `"max"`, `"min"` or the unknown operation).
    pub op: String,
    /// The dtype's name (or `"any dtype"` for an unknown operation).
    pub dtype: String,
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

/// The `OP` const parameter of the kernels.
const SUM: u8 = 0;
const MAX: u8 = 1;
const MIN: u8 = 2;

/// Elements per block: the unaligned fallback's stack buffers and the half types' `float32`
/// buffers.
const BLOCK: usize = 256;

/// One dtype's element: its in-memory representation and its reduction.
trait Lane {
    /// The element as it sits in memory (same size; little-endian on little-endian hosts).
    type Bits: Pod;
    /// Size of one element in bytes.
    const SIZE: usize = size_of::<Self::Bits>();

    /// Decodes one element from `Self::SIZE` little-endian bytes.
    fn from_le(bytes: &[u8]) -> Self::Bits;
    /// Encodes one element into `Self::SIZE` little-endian bytes.
    fn to_le(value: Self::Bits, bytes: &mut [u8]);
    /// `local ⊕ received` for one element.
    fn combine<const OP: u8>(local: Self::Bits, received: Self::Bits) -> Self::Bits;

    /// `local[i] = local[i] ⊕ received[i]` over equal-length typed slices.
    #[inline(always)]
    fn combine_slice<const OP: u8>(local: &mut [Self::Bits], received: &[Self::Bits]) {
        for (l, &r) in local.iter_mut().zip(received) {
            *l = Self::combine::<OP>(*l, r);
        }
    }
}

/// The kernel for `op` over `T`.
fn select<T: Lane>(op: Reduction) -> fn(&mut [u8], &[u8]) {
    match op {
        Reduction::Sum => kernel::<T, SUM>,
        Reduction::Max => kernel::<T, MAX>,
        Reduction::Min => kernel::<T, MIN>,
    }
}

/// The one generic kernel: `local[i] = local[i] ⊕ received[i]` over raw little-endian bytes.
fn kernel<T: Lane, const OP: u8>(local: &mut [u8], received: &[u8]) {
    assert_eq!(local.len(), received.len());
    assert_eq!(local.len() % T::SIZE, 0);
    if cfg!(target_endian = "little") {
        if let (Ok(l), Ok(r)) = (
            bytemuck::try_cast_slice_mut::<u8, T::Bits>(&mut *local),
            bytemuck::try_cast_slice::<u8, T::Bits>(received),
        ) {
            T::combine_slice::<OP>(l, r);
            return;
        }
    }
    // Unaligned (or a big-endian host): decode blocks into aligned stack buffers.
    let mut l = [T::Bits::zeroed(); BLOCK];
    let mut r = [T::Bits::zeroed(); BLOCK];
    for (lc, rc) in local
        .chunks_mut(BLOCK * T::SIZE)
        .zip(received.chunks(BLOCK * T::SIZE))
    {
        let n = lc.len() / T::SIZE;
        let (l, r) = (&mut l[..n], &mut r[..n]);
        for (d, s) in l.iter_mut().zip(lc.chunks_exact(T::SIZE)) {
            *d = T::from_le(s);
        }
        for (d, s) in r.iter_mut().zip(rc.chunks_exact(T::SIZE)) {
            *d = T::from_le(s);
        }
        T::combine_slice::<OP>(l, r);
        for (&s, d) in l.iter().zip(lc.chunks_exact_mut(T::SIZE)) {
            T::to_le(s, d);
        }
    }
}

/// `std::max(local, received)` given `local < received`.
#[inline(always)]
fn std_max<T>(local: T, received: T, local_lt_received: bool) -> T {
    if local_lt_received { received } else { local }
}

/// `std::min(local, received)` given `received < local`.
#[inline(always)]
fn std_min<T>(local: T, received: T, received_lt_local: bool) -> T {
    if received_lt_local { received } else { local }
}

/// Integers: wrapping sum, native max and min.
macro_rules! integer_lanes {
    ($($t:ty),*) => {$(
        impl Lane for $t {
            type Bits = $t;

            #[inline(always)]
            fn from_le(bytes: &[u8]) -> $t {
                <$t>::from_le_bytes(bytes.try_into().expect("one element"))
            }

            #[inline(always)]
            fn to_le(value: $t, bytes: &mut [u8]) {
                bytes.copy_from_slice(&value.to_le_bytes());
            }

            #[inline(always)]
            fn combine<const OP: u8>(l: $t, r: $t) -> $t {
                match OP {
                    SUM => l.wrapping_add(r),
                    MAX => std_max(l, r, l < r),
                    _ => std_min(l, r, r < l),
                }
            }
        }
    )*};
}

integer_lanes!(u8, u16, u32, u64, i8, i16, i32, i64);

/// float32 and float64: `std::max` / `std::min`, and a sum whose NaN is `received`'s if
/// `received` is NaN (quieted), else the hardware's.
macro_rules! float_lanes {
    ($($t:ty, $sum:ident, $quiet:expr);*) => {$(
        /// `local + received`, `received` (quieted) if it is NaN.
        #[inline(always)]
        fn $sum(l: $t, r: $t) -> $t {
            let sum = l + r;
            if r.is_nan() { <$t>::from_bits(r.to_bits() | $quiet) } else { sum }
        }

        impl Lane for $t {
            type Bits = $t;

            #[inline(always)]
            fn from_le(bytes: &[u8]) -> $t {
                <$t>::from_le_bytes(bytes.try_into().expect("one element"))
            }

            #[inline(always)]
            fn to_le(value: $t, bytes: &mut [u8]) {
                bytes.copy_from_slice(&value.to_le_bytes());
            }

            #[inline(always)]
            fn combine<const OP: u8>(l: $t, r: $t) -> $t {
                match OP {
                    SUM => $sum(l, r),
                    MAX => std_max(l, r, l < r),
                    _ => std_min(l, r, r < l),
                }
            }
        }
    )*};
}

float_lanes!(f32, f32_sum, 0x0040_0000; f64, f64_sum, 0x0008_0000_0000_0000);

/// bool, one byte: sum and max are or, min is and; any nonzero byte is true.
struct BoolLane;

impl Lane for BoolLane {
    type Bits = u8;

    #[inline(always)]
    fn from_le(bytes: &[u8]) -> u8 {
        bytes[0]
    }

    #[inline(always)]
    fn to_le(value: u8, bytes: &mut [u8]) {
        bytes[0] = value;
    }

    #[inline(always)]
    fn combine<const OP: u8>(l: u8, r: u8) -> u8 {
        match OP {
            SUM | MAX => u8::from(l != 0 || r != 0),
            _ => u8::from(l != 0 && r != 0),
        }
    }
}

/// complex64: per-lane float32 sum, lexicographic `std::max` / `std::min`.
impl Lane for Complex64 {
    type Bits = Complex64;

    #[inline(always)]
    fn from_le(bytes: &[u8]) -> Complex64 {
        let (re, im) = bytes.split_at(4);
        Complex64::new(
            f32::from_le_bytes(re.try_into().expect("four bytes")),
            f32::from_le_bytes(im.try_into().expect("four bytes")),
        )
    }

    #[inline(always)]
    fn to_le(value: Complex64, bytes: &mut [u8]) {
        bytes[..4].copy_from_slice(&value.re.to_le_bytes());
        bytes[4..].copy_from_slice(&value.im.to_le_bytes());
    }

    #[inline(always)]
    fn combine<const OP: u8>(l: Complex64, r: Complex64) -> Complex64 {
        /// MLX's `complex64_t` `a < b`.
        #[inline(always)]
        fn lt(a: Complex64, b: Complex64) -> bool {
            a.re < b.re || (a.re == b.re && a.im < b.im)
        }
        match OP {
            SUM => Complex64::new(f32_sum(l.re, r.re), f32_sum(l.im, r.im)),
            MAX => std_max(l, r, lt(l, r)),
            _ => std_min(l, r, lt(r, l)),
        }
    }
}

// --- float16 and bfloat16 --------------------------------------------------------------------

/// float16 and bfloat16, stored as `u16` bits; both are sign-magnitude with the exponent
/// field all ones for infinities and NaNs.
trait HalfLane {
    /// The bits of `+inf` (the exponent mask).
    const INF: u16;
    /// MLX's NaN for a NaN sum whose `float32` NaN has sign bit `sign` (`0` or `0x8000`).
    fn nan(sign: u16) -> u16;
    /// The value as `float32`, exactly, for every finite value (infinities and NaNs give
    /// some finite number).
    fn widen(bits: u16) -> f32;
    /// `float32` rounded to nearest-even, for finite and infinite inputs (NaNs give anything).
    fn narrow(value: f32) -> u16;
    /// `narrow` over a block.
    #[inline(always)]
    fn narrow_block(values: &[f32], out: &mut [u16]) {
        for (o, &v) in out.iter_mut().zip(values) {
            *o = Self::narrow(v);
        }
    }
}

/// The sign bit (as half bits) of the host's default NaN, which `inf + -inf` produces:
/// x86's "real indefinite" `0xFFC00000` is negative, ARM's and RISC-V's `0x7FC00000` positive.
const DEFAULT_NAN_SIGN: u16 = if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
    0x8000
} else {
    0
};

/// All ones if `b`, else zero.
#[inline(always)]
fn mask(b: bool) -> u16 {
    0u16.wrapping_sub(u16::from(b))
}

/// `if m { a } else { b }` for a mask `m` of all ones or zero (branch-free, vectorises).
#[inline(always)]
fn blend(m: u16, a: u16, b: u16) -> u16 {
    (a & m) | (b & !m)
}

/// The bits of `local + received` given `sum`, the rounded `float32` sum of the widened
/// operands (meaningless when an operand is infinite or NaN): infinities and NaNs follow
/// IEEE 754 and MLX's NaN patterns.
#[inline(always)]
fn half_sum<H: HalfLane>(sum: u16, l: u16, r: u16) -> u16 {
    let (la, ra) = (l & 0x7FFF, r & 0x7FFF);
    let (l_nan, r_nan) = (mask(la > H::INF), mask(ra > H::INF));
    let (l_inf, r_inf) = (mask(la == H::INF), mask(ra == H::INF));
    // inf + -inf is NaN, with the default NaN's sign.
    let invalid = l_inf & r_inf & mask(l != r);
    let nan = l_nan | r_nan | invalid;
    let sign = blend(r_nan, r, blend(l_nan, l, DEFAULT_NAN_SIGN)) & 0x8000;
    let finite_or_inf = blend(l_inf, l, blend(r_inf, r, sum));
    blend(nan, H::nan(sign), finite_or_inf)
}

/// A key whose signed order is the order of the (non-NaN) values: `-0` and `+0` both map
/// to 0, magnitudes are monotone in their bits.
#[inline(always)]
fn half_key(bits: u16) -> i16 {
    let magnitude = (bits & 0x7FFF) as i16;
    let negative = (bits as i16) >> 15; // all ones if negative
    (magnitude ^ negative).wrapping_sub(negative)
}

/// `local < received` for half types as MLX computes it (through `float32`): false if
/// either is NaN.
#[inline(always)]
fn half_lt<H: HalfLane>(a: u16, b: u16) -> bool {
    (a & 0x7FFF) <= H::INF && (b & 0x7FFF) <= H::INF && half_key(a) < half_key(b)
}

/// float16 (as MLX's `_MLX_Float16`).
struct F16Lane;

impl HalfLane for F16Lane {
    const INF: u16 = 0x7C00;

    #[inline(always)]
    fn nan(sign: u16) -> u16 {
        sign | 0x7D00 // __MLX_HALF_NAN__
    }

    #[inline(always)]
    fn widen(bits: u16) -> f32 {
        // Exponent and mantissa moved to float32's positions (as i32: all values < 2^28).
        let shifted = i32::from(bits & 0x7FFF) << 13;
        // Normal: rebias the exponent (15 -> 127).
        let normal = shifted + (112 << 23);
        // Subnormal or zero: 2^-14 * (1 + m / 1024) - 2^-14 = m * 2^-24, exactly.
        let magic = f32::from_bits(113 << 23);
        let subnormal = (f32::from_bits((shifted + (113 << 23)) as u32) - magic).to_bits() as i32;
        let magnitude = if shifted < (1 << 23) { subnormal } else { normal };
        f32::from_bits((magnitude as u32) | (u32::from(bits & 0x8000) << 16))
    }

    #[inline(always)]
    fn narrow(value: f32) -> u16 {
        f16::from_f32(value).to_bits()
    }

    #[inline(always)]
    fn narrow_block(values: &[f32], out: &mut [u16]) {
        // F16C / NEON when available, else `half`'s software conversion; both RNE.
        out.reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(values);
    }
}

/// bfloat16 (as MLX's `_MLX_BFloat16`).
struct Bf16Lane;

impl HalfLane for Bf16Lane {
    const INF: u16 = 0x7F80;

    #[inline(always)]
    fn nan(_sign: u16) -> u16 {
        0x7FC0 // __MLX_BFLOAT_NAN__, whatever the sign
    }

    #[inline(always)]
    fn widen(bits: u16) -> f32 {
        f32::from_bits(u32::from(bits) << 16)
    }

    #[inline(always)]
    fn narrow(value: f32) -> u16 {
        // MLX's round-to-nearest-even: add 0x7FFF plus the lowest kept bit, truncate.
        let bits = value.to_bits();
        (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16
    }
}

/// The half types' `Lane`: the scalar definition, and a blocked slice kernel (sums go
/// through `float32` 256 elements at a time; max and min compare integer keys).
macro_rules! half_lanes {
    ($($lane:ty),*) => {$(
        impl Lane for $lane {
            type Bits = u16;

            #[inline(always)]
            fn from_le(bytes: &[u8]) -> u16 {
                u16::from_le_bytes(bytes.try_into().expect("two bytes"))
            }

            #[inline(always)]
            fn to_le(value: u16, bytes: &mut [u8]) {
                bytes.copy_from_slice(&value.to_le_bytes());
            }

            #[inline(always)]
            fn combine<const OP: u8>(l: u16, r: u16) -> u16 {
                match OP {
                    SUM => half_sum::<Self>(Self::narrow(Self::widen(l) + Self::widen(r)), l, r),
                    MAX => std_max(l, r, half_lt::<Self>(l, r)),
                    _ => std_min(l, r, half_lt::<Self>(r, l)),
                }
            }

            #[inline(always)]
            fn combine_slice<const OP: u8>(local: &mut [u16], received: &[u16]) {
                half_combine_slice::<Self, OP>(local, received);
            }
        }
    )*};
}

half_lanes!(F16Lane, Bf16Lane);

/// `local[i] = local[i] ⊕ received[i]` for a half type.
#[inline(always)]
fn half_combine_slice<H: HalfLane, const OP: u8>(local: &mut [u16], received: &[u16]) {
    match OP {
        SUM => {
            let mut sums = [0f32; BLOCK];
            let mut rounded = [0u16; BLOCK];
            for (lc, rc) in local.chunks_mut(BLOCK).zip(received.chunks(BLOCK)) {
                let n = lc.len();
                let (sums, rounded) = (&mut sums[..n], &mut rounded[..n]);
                for ((s, &l), &r) in sums.iter_mut().zip(lc.iter()).zip(rc) {
                    *s = H::widen(l) + H::widen(r);
                }
                H::narrow_block(sums, rounded);
                for ((l, &r), &s) in lc.iter_mut().zip(rc).zip(rounded.iter()) {
                    *l = half_sum::<H>(s, *l, r);
                }
            }
        }
        MAX => {
            for (l, &r) in local.iter_mut().zip(received) {
                *l = blend(mask(half_lt::<H>(*l, r)), r, *l);
            }
        }
        _ => {
            for (l, &r) in local.iter_mut().zip(received) {
                *l = blend(mask(half_lt::<H>(r, *l)), r, *l);
            }
        }
    }
}
