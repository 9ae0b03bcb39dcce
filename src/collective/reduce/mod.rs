//! The element-wise reductions of MLX's distributed ring (`all_sum`, `all_max`, `all_min`),
//! bit-exact with MLX for every nuvec dtype.
//!
//! A [`Reducer`] is chosen once per collective from a [`Reduction`] and a [`DType`], and then
//! applied to every piece that arrives: `local[i] = local[i] ⊕ received[i]`. Buffers are raw
//! little-endian bytes at any alignment. When both buffers are aligned for their element type
//! the kernel runs directly over typed slices (auto-vectorised); otherwise it decodes blocks
//! of elements into aligned stack buffers, reduces them and writes them back (float16 and
//! bfloat16 instead run their kernel over the bytes in place, two at a time).
//!
//! # Semantics
//!
//! MLX's ring applies `SumOp` (`*output += *input`), `MaxOp` (`std::max(*output, *input)`)
//! and `MinOp` (`std::min(*output, *input)`) of `mlx/distributed/reduction_ops.h`, where
//! `output` is this rank's data ("local") and `input` is what arrived ("received"). The
//! choices below were checked against MLX 0.32.4's ring (the Linux x86-64 `mlx-cpu` wheel,
//! two ranks on loopback): for every dtype and op, on random bits mixed with special values
//! (NaNs with payloads, signalling NaNs, infinities, signed zeros, subnormals, extremes),
//! the results are bit-identical except where noted below.
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
//!   operand of its `addps`/`addpd`). The exception: when *both* operands are NaN, MLX's
//!   result depends on how GCC compiled its loop: its scalar remainder iterations (e.g. the
//!   last element of an odd-length float64 chunk) return `local`'s NaN. That depends on
//!   chunk lengths and compiler flags and is not reproduced; this module always returns
//!   `received`'s.
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
//! loops are branch-free so that they auto-vectorise (the build assumes only baseline SSE2 on
//! x86-64). The half types read their elements as byte pairs when a buffer is unaligned, so
//! unaligned buffers take the same kernel as aligned ones, without copies.
//!
//! Half-precision sums go through `float32`, 256 elements at a time: bfloat16 is widened with
//! a shift and narrowed with MLX's own round-to-nearest-even bit trick; float16 is widened
//! (exactly, as a small integer times a power of two) and narrowed (round-to-nearest-even,
//! bit-identical with `half::f16::from_f32`) by branch-free integer and float arithmetic that
//! vectorises 8 elements at a time, rather than through `half`'s F16C / NEON routines, which
//! are only reachable through run-time detection and non-inlined calls. The loop that sums a
//! block also finds whether it holds an infinity or a NaN; only such blocks take the
//! NaN/infinity fix-up pass. Half-precision max and min convert nothing: they compare
//! sign-magnitude integer keys, which order exactly as the `float32` values do.

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

    /// The collective that applies it: `all_sum`, `all_max` or `all_min`.
    pub fn collective(self) -> &'static str {
        match self {
            Self::Sum => "all_sum",
            Self::Max => "all_max",
            Self::Min => "all_min",
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

/// Every dtype a [`Reducer`] reduces (all of MLX's but none it lacks), in MLX's order.
pub const DTYPES: [DType; 14] = [
    DType::Bool,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::Complex64,
];

/// A reduction for one dtype, chosen once (a function pointer to a monomorphised generic kernel).
#[derive(Clone, Copy, Debug)]
pub struct Reducer {
    op: Reduction,
    dtype: DType,
    element_size: usize,
    kernel: fn(&mut [u8], &[u8]),
    /// JACCL's max and min: the kernel with its operands exchanged.
    swapped: bool,
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
            swapped: false,
        })
    }

    /// The reduction as MLX's JACCL backend applies it (`lib/jaccl/reduction_ops.h`): the sum
    /// is the ring's, but max is `(local > received) ? local : received` and min
    /// `(local < received) ? local : received`, which keep `received` where the ring's
    /// `std::max`/`std::min` keep `local`: on NaNs and on equal values such as `-0.0` and
    /// `+0.0`. That is the ring's kernel with its operands exchanged.
    pub fn jaccl(op: Reduction, dtype: DType) -> Result<Self, UnsupportedReduction> {
        let mut reducer = Self::new(op, dtype)?;
        reducer.swapped = op != Reduction::Sum;
        Ok(reducer)
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

    /// `local[i] = local[i] ⊕ received[i]` for every element. Panics if lengths differ or are
    /// not a multiple of the element size (callers guarantee it).
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
        if !self.swapped {
            (self.kernel)(local, received);
            return;
        }
        // local = received ⊕ local, a block at a time through a stack copy of `received`.
        let mut copy = [0u8; BLOCK * 16];
        let step = BLOCK * self.element_size;
        for (l, r) in local.chunks_mut(step).zip(received.chunks(step)) {
            let copy = &mut copy[..r.len()];
            copy.copy_from_slice(r);
            (self.kernel)(copy, l);
            l.copy_from_slice(copy);
        }
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

mod half;
mod kernel;
#[cfg(test)]
mod tests;

use half::{Bf16Lane, F16Lane};
use kernel::{BLOCK, BoolLane, select};
