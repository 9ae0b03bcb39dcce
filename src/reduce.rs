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
//! and `MinOp` (`std::min(*output, *input)`) from `mlx/distributed/reduction_ops.h`, where
//! `output` is this rank's data ("local") and `input` is what arrived ("received"):
//!
//! - **bool** (one byte): sum and max are *or*, min is *and*. Any nonzero byte is true; the
//!   result is always `0` or `1`.
//! - **integers**: sum wraps (two's complement); max and min compare natively.
//! - **float32, float64**: sum is `local + received` in the type itself. `std::max(a, b)` is
//!   `a < b ? b : a`, so max takes `received` only if `local < received`, and min takes
//!   `received` only if `received < local`; otherwise `local` is kept, bit for bit. With NaNs
//!   this is order-dependent: a NaN in `local` stays, a NaN in `received` is never taken, and
//!   `-0.0`/`+0.0` keep `local`. A NaN *sum* is whatever NaN the host's floating-point unit
//!   produces (as in MLX, which does not canonicalise it either).
//! - **float16, bfloat16**: as MLX's `_MLX_Float16` / `_MLX_BFloat16` (the types MLX uses on
//!   Linux; MLX on macOS also uses `_MLX_BFloat16`), every operation converts both operands to
//!   `float32`. The sum is added in `float32` and rounded once, to nearest-even, back to the
//!   half type (that is correctly rounded: `float32` has more than twice the precision of
//!   either half type, so the double rounding is innocuous). Max and min compare the `float32`
//!   values with the rule above and return the *original bits* of the chosen operand (NaN
//!   payloads, signalling NaNs and the sign of zero are untouched).
//!
//!   A NaN sum is given MLX's software-conversion bit pattern, not the `half` crate's (which
//!   keeps the payload):
//!   - bfloat16: always `0x7FC0` (`__MLX_BFLOAT_NAN__`; the sign is dropped);
//!   - float16: `sign | 0x7D00` (`__MLX_HALF_NAN__`), where `sign` is the sign bit of the
//!     `float32` NaN that the addition produced. Following IEEE 754 NaN propagation as the
//!     hardware does it, that is the sign of `local` if `local` is NaN, else the sign of
//!     `received` if `received` is NaN, else (`inf + -inf`) the sign of the host's default
//!     NaN: negative on x86 / x86-64 (`0xFFC00000`), positive elsewhere (ARM, RISC-V, ...).
//!     So `inf + -inf` gives `0xFD00` on x86-64 and `0x7D00` on aarch64, as MLX built for the
//!     same host does. (MLX built with native `__fp16` arithmetic, i.e. on Apple silicon,
//!     produces hardware NaNs instead: `0x7E00` or the quieted input NaN.)
//! - **complex64** (`re`, `im` as two `float32`): sum is per lane. Max and min use MLX's
//!   lexicographic `complex64_t` order, `a < b` iff `a.re < b.re || (a.re == b.re && a.im <
//!   b.im)`, with the `std::max` / `std::min` rule above (and the original bits of the chosen
//!   operand).
//!
//! Newer MLX releases (`mlx/distributed/nan_ops.h`) replace `std::max` / `std::min` with
//! NaN-propagating variants; this module implements the `std::max` / `std::min` behaviour of
//! the ring described above.

use bytemuck::{Pod, Zeroable};
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
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
/// conversion buffers.
const BLOCK: usize = 256;

/// One dtype's element: its in-memory representation and its reduction.
trait Lane {
    /// The element as it sits in memory (same size, little-endian on little-endian hosts).
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
    // Unaligned (or big-endian host): decode blocks into aligned stack buffers.
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

/// `std::max(local, received)`: `received` iff `local < received`.
#[inline(always)]
fn std_max<T: Copy>(local: T, received: T, local_lt_received: bool) -> T {
    if local_lt_received { received } else { local }
}

/// `std::min(local, received)`: `received` iff `received < local`.
#[inline(always)]
fn std_min<T: Copy>(local: T, received: T, received_lt_local: bool) -> T {
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

/// float32 and float64: sum in the type, `std::max` / `std::min`.
macro_rules! float_lanes {
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
                    SUM => l + r,
                    MAX => std_max(l, r, l < r),
                    _ => std_min(l, r, r < l),
                }
            }
        }
    )*};
}

float_lanes!(f32, f64);

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

/// complex64: per-lane sum, lexicographic `std::max` / `std::min`.
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
            SUM => Complex64::new(l.re + r.re, l.im + r.im),
            MAX => std_max(l, r, lt(l, r)),
            _ => std_min(l, r, lt(r, l)),
        }
    }
}

/// float16 and bfloat16, stored as `u16` bits: every operation goes through `float32`.
trait HalfLane {
    /// Converts a block of bits to `float32` (exact).
    fn to_f32_block(bits: &[u16], out: &mut [f32]);
    /// Rounds a block of `float32` to bits, to nearest-even (NaNs are fixed by `nan_sum`).
    fn from_f32_block(values: &[f32], out: &mut [u16]);
    /// The bits of `local + received` given the rounded sum `sum`: `sum` unless it is NaN,
    /// in which case MLX's NaN pattern.
    fn nan_sum(sum: u16, local: u16, received: u16) -> u16;
}

/// float16 bits are NaN.
#[inline(always)]
fn f16_is_nan(bits: u16) -> bool {
    bits & 0x7FFF > 0x7C00
}

/// bfloat16 bits are NaN.
#[inline(always)]
fn bf16_is_nan(bits: u16) -> bool {
    bits & 0x7FFF > 0x7F80
}

/// MLX's float16 NaN (`__MLX_HALF_NAN__`), or'ed with the sign of the `float32` NaN.
const F16_NAN: u16 = 0x7D00;
/// MLX's bfloat16 NaN (`__MLX_BFLOAT_NAN__`), whatever the sign of the `float32` NaN.
const BF16_NAN: u16 = 0x7FC0;
/// The sign bit (as float16 bits) of the host's default NaN, which `inf + -inf` produces:
/// x86's "real indefinite" `0xFFC00000` is negative, ARM's and RISC-V's `0x7FC00000` positive.
const DEFAULT_NAN_SIGN: u16 = if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
    0x8000
} else {
    0
};

/// float16 (as MLX's `_MLX_Float16`).
struct F16Lane;

impl HalfLane for F16Lane {
    #[inline(always)]
    fn to_f32_block(bits: &[u16], out: &mut [f32]) {
        bits.reinterpret_cast::<f16>().convert_to_f32_slice(out);
    }

    #[inline(always)]
    fn from_f32_block(values: &[f32], out: &mut [u16]) {
        out.reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(values);
    }

    #[inline(always)]
    fn nan_sum(sum: u16, l: u16, r: u16) -> u16 {
        // The sign of the float32 NaN: the first NaN operand's, else the default NaN's.
        let sign = if f16_is_nan(l) {
            l & 0x8000
        } else if f16_is_nan(r) {
            r & 0x8000
        } else {
            DEFAULT_NAN_SIGN
        };
        if f16_is_nan(sum) {
            sign | F16_NAN
        } else {
            sum
        }
    }
}

/// bfloat16 (as MLX's `_MLX_BFloat16`).
struct Bf16Lane;

impl HalfLane for Bf16Lane {
    #[inline(always)]
    fn to_f32_block(bits: &[u16], out: &mut [f32]) {
        bits.reinterpret_cast::<bf16>().convert_to_f32_slice(out);
    }

    #[inline(always)]
    fn from_f32_block(values: &[f32], out: &mut [u16]) {
        out.reinterpret_cast_mut::<bf16>()
            .convert_from_f32_slice(values);
    }

    #[inline(always)]
    fn nan_sum(sum: u16, _l: u16, _r: u16) -> u16 {
        if bf16_is_nan(sum) { BF16_NAN } else { sum }
    }
}

/// The half types' `Lane`: scalar definition plus a blocked slice kernel that converts
/// 256 elements at a time to `float32` (vectorised by `half` where the CPU can).
macro_rules! half_lanes {
    ($($lane:ty: $half:ty),*) => {$(
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
                let (a, b) = (<$half>::from_bits(l).to_f32(), <$half>::from_bits(r).to_f32());
                match OP {
                    SUM => <Self as HalfLane>::nan_sum(<$half>::from_f32(a + b).to_bits(), l, r),
                    MAX => std_max(l, r, a < b),
                    _ => std_min(l, r, b < a),
                }
            }

            #[inline(always)]
            fn combine_slice<const OP: u8>(local: &mut [u16], received: &[u16]) {
                half_combine_slice::<Self, OP>(local, received);
            }
        }
    )*};
}

half_lanes!(F16Lane: f16, Bf16Lane: bf16);

/// `local[i] = local[i] ⊕ received[i]` for a half type, a block at a time through `float32`.
#[inline(always)]
fn half_combine_slice<H: HalfLane, const OP: u8>(local: &mut [u16], received: &[u16]) {
    let mut a = [0f32; BLOCK];
    let mut b = [0f32; BLOCK];
    let mut sum = [0u16; BLOCK];
    for (lc, rc) in local.chunks_mut(BLOCK).zip(received.chunks(BLOCK)) {
        let n = lc.len();
        let (a, b, sum) = (&mut a[..n], &mut b[..n], &mut sum[..n]);
        H::to_f32_block(lc, a);
        H::to_f32_block(rc, b);
        match OP {
            SUM => {
                for (x, &y) in a.iter_mut().zip(b.iter()) {
                    *x += y;
                }
                H::from_f32_block(a, sum);
                for ((l, &r), &s) in lc.iter_mut().zip(rc).zip(sum.iter()) {
                    *l = H::nan_sum(s, *l, r);
                }
            }
            MAX => {
                for ((l, &r), (&x, &y)) in lc.iter_mut().zip(rc).zip(a.iter().zip(b.iter())) {
                    *l = std_max(*l, r, x < y);
                }
            }
            _ => {
                for ((l, &r), (&x, &y)) in lc.iter_mut().zip(rc).zip(a.iter().zip(b.iter())) {
                    *l = std_min(*l, r, y < x);
                }
            }
        }
    }
}
