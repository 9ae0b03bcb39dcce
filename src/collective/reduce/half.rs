//! `float16` and `bfloat16`: branch-free exact widening and round-to-nearest-even narrowing
//! that vectorise with baseline SSE2, MLX's NaN rules, and their kernel over the bytes in
//! place, two at a time.

use super::kernel::*;

// --- float16 and bfloat16 --------------------------------------------------------------------

/// float16 and bfloat16, stored as `u16` bits; both are sign-magnitude with the exponent
/// field all ones for infinities and NaNs.
pub(super) trait HalfLane {
    /// The bits of `+inf` (the exponent mask).
    const INF: u16;
    /// MLX's NaN for a NaN sum whose `float32` NaN has sign bit `sign` (`0` or `0x8000`).
    fn nan(sign: u16) -> u16;
    /// The value as `float32` (exact; NaNs stay NaNs).
    fn widen(bits: u16) -> f32;
    /// `widen` for finite values (infinities and NaNs give anything).
    #[inline(always)]
    fn widen_finite(bits: u16) -> f32 {
        Self::widen(bits)
    }
    /// `float32` rounded to nearest-even, for finite and infinite inputs (NaNs give anything).
    fn narrow(value: f32) -> u16;
}

/// The sign bit (as half bits) of the host's default NaN, which `inf + -inf` produces:
/// x86's "real indefinite" `0xFFC00000` is negative, ARM's and RISC-V's `0x7FC00000` positive.
pub(super) const DEFAULT_NAN_SIGN: u16 = if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
    0x8000
} else {
    0
};

/// All ones if `b`, else zero.
#[inline(always)]
pub(super) fn mask(b: bool) -> u16 {
    0u16.wrapping_sub(u16::from(b))
}

/// `if m { a } else { b }` for a mask `m` of all ones or zero (branch-free, vectorises).
#[inline(always)]
pub(super) fn blend(m: u16, a: u16, b: u16) -> u16 {
    (a & m) | (b & !m)
}

/// The bits of `local + received` given `sum`, the rounded `float32` sum of the widened
/// operands (meaningless when an operand is infinite or NaN): infinities and NaNs follow
/// IEEE 754 and MLX's NaN patterns.
#[inline(always)]
pub(super) fn half_sum<H: HalfLane>(sum: u16, l: u16, r: u16) -> u16 {
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
pub(super) fn half_key(bits: u16) -> i16 {
    let magnitude = (bits & 0x7FFF) as i16;
    let negative = (bits as i16) >> 15; // all ones if negative
    (magnitude ^ negative).wrapping_sub(negative)
}

/// `local < received` for half types as MLX computes it (through `float32`): false if
/// either is NaN.
#[inline(always)]
pub(super) fn half_lt<H: HalfLane>(a: u16, b: u16) -> bool {
    (a & 0x7FFF) <= H::INF && (b & 0x7FFF) <= H::INF && half_key(a) < half_key(b)
}

/// float16 (as MLX's `_MLX_Float16`).
pub(super) struct F16Lane;

impl HalfLane for F16Lane {
    const INF: u16 = 0x7C00;

    #[inline(always)]
    fn nan(sign: u16) -> u16 {
        sign | 0x7D00 // __MLX_HALF_NAN__
    }

    #[inline(always)]
    fn widen(bits: u16) -> f32 {
        f16_to_f32(bits)
    }

    #[inline(always)]
    fn widen_finite(bits: u16) -> f32 {
        f16_finite_to_f32(bits)
    }

    #[inline(always)]
    fn narrow(value: f32) -> u16 {
        f32_to_f16(value)
    }
}

// The float16 conversions are branch-free integer and float arithmetic that LLVM vectorises
// with baseline SSE2 (or NEON), 8 elements at a time: `half`'s F16C / NEON routines are only
// reachable through run-time detection and non-inlined calls, which cost more than they save
// on 256-element blocks. The 16-bit steps map to single SSE2 instructions on 8 lanes
// (`psubusw`, `pmaxsw`, `pminsw`, `packssdw`). For float16 inputs, and for sums of two float16
// values (multiples of 2^-24), no operation below sees or makes a subnormal `float32`, so
// they run at full speed and flush-to-zero or denormals-are-zero modes set by other code in
// the process would not change the results.

/// A finite float16 as `float32`, exactly. An infinity or NaN gives some finite value.
///
/// Every finite float16 is `n * 2^(e - 25)` for an integer `n` below 2^11: with `e` the
/// exponent field, `n = 1024 + mantissa` for normal numbers (`e >= 1`) and `n = mantissa`
/// for zeros and subnormals, taking `e = 1` for them. Both factors and their product are
/// exact `float32` values (the power of two is built from its bits), and the product carries
/// the sign of the power of two, so `-0` stays `-0`.
#[inline(always)]
pub(super) fn f16_finite_to_f32(bits: u16) -> f32 {
    let magnitude = bits & 0x7FFF;
    // `e - 1`, and 0 for zeros and subnormals (SSE2's saturating `psubusw`).
    let exponent = (magnitude >> 10).saturating_sub(1);
    let significand = magnitude - (exponent << 10);
    // The upper half of the bits of ±2^(e - 25): biased exponent `e + 102`.
    let scale = ((exponent + 103) << 7) | (bits & 0x8000);
    f32::from(significand) * f32::from_bits(u32::from(scale) << 16)
}

/// float16 bits as `float32`, exactly, for every input: zeros keep their sign, subnormals
/// become normal `float32` values, infinities stay infinite, and NaNs keep their sign and
/// payload (shifted up 13 bits) and come out quiet, as `half::f16::to_f32` makes them.
#[inline(always)]
pub(super) fn f16_to_f32(bits: u16) -> f32 {
    let magnitude = u32::from(bits & 0x7FFF);
    // Exponent field 31 becomes 255, the mantissa moves up 13 bits, NaNs get the quiet bit.
    let quiet = mask32(magnitude > 0x7C00) & 0x0040_0000;
    let special = (u32::from(bits & 0x8000) << 16) | 0x7F80_0000 | ((magnitude & 0x03FF) << 13);
    let finite = f16_finite_to_f32(bits).to_bits();
    f32::from_bits(blend32(
        mask32(magnitude >= 0x7C00),
        special | quiet,
        finite,
    ))
}

/// `float32` rounded to the nearest float16, ties to even: the bits `half::f16::from_f32`
/// gives for every finite or infinite input (magnitudes from 65520 on round to infinity).
/// NaNs give an infinity (the sum kernel replaces NaN results anyway).
///
/// Two candidates are computed for the magnitude `a`, and the smaller one is the result:
/// - for `a >= 2^-14` (a normal float16 or an overflow), the `float32` bits rebiased from
///   127 to 15 and rounded to 10 mantissa bits by adding `0xFFF` plus the lowest kept bit and
///   truncating 13 bits (a carry out of the mantissa increments the exponent, up to infinity
///   at 65520), clamped to `[0x0400, 0x7C00]`;
/// - for `a < 2^-14` (zero or a subnormal float16), the low bits of `a + 0.5`: there the
///   `float32` spacing is 2^-24, float16's subnormal spacing, so the hardware's addition
///   rounds to nearest-even (2^-14 itself, `0x0400`, if it rounds up).
///
/// Below 2^-14 the first candidate is `0x0400`, at least the second; from 2^-14 on the
/// second, `round(a * 2^24)` (saturated to `i16::MAX`), is at least the first, since a
/// float16's bits never exceed its value in units of 2^-24 (they are equal below 2^-13).
/// Saturating to 16 bits, clamping and the minimum are single SSE2 instructions on 8 lanes.
#[inline(always)]
pub(super) fn f32_to_f16(value: f32) -> u16 {
    /// `x` saturated to the `i16` range (SSE2's `packssdw`).
    #[inline(always)]
    fn saturate(x: i32) -> i16 {
        x.clamp(i32::from(i16::MIN), i32::from(i16::MAX)) as i16
    }
    let bits = value.to_bits();
    let magnitude = bits & 0x7FFF_FFFF;
    let subnormal = (f32::from_bits(magnitude) + 0.5)
        .to_bits()
        .wrapping_sub(0x3F00_0000) as i32;
    // Below 2^-15 this is negative (no wrap-around: `magnitude` is below 2^31), and the clamp
    // takes it to 0x0400.
    let normal = (magnitude
        .wrapping_add(0x0FFF_u32.wrapping_sub(112 << 23))
        .wrapping_add((magnitude >> 13) & 1) as i32)
        >> 13;
    let rounded = saturate(normal)
        .clamp(0x0400, 0x7C00)
        .min(saturate(subnormal));
    rounded as u16 | ((bits >> 16) as u16 & 0x8000)
}

/// All ones if `b`, else zero (32 bits).
#[inline(always)]
pub(super) fn mask32(b: bool) -> u32 {
    0u32.wrapping_sub(u32::from(b))
}

/// `if m { a } else { b }` for a mask `m` of all ones or zero (32 bits).
#[inline(always)]
pub(super) fn blend32(m: u32, a: u32, b: u32) -> u32 {
    (a & m) | (b & !m)
}

/// bfloat16 (as MLX's `_MLX_BFloat16`).
pub(super) struct Bf16Lane;

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
/// through `float32` 256 elements at a time; max and min compare integer keys) that also
/// serves unaligned buffers, read as byte pairs.
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
                half_combine_slice::<Self, OP, u16>(local, received);
            }

            #[inline(always)]
            fn combine_unaligned<const OP: u8>(local: &mut [u8], received: &[u8]) {
                // Unaligned loads cost nothing extra: the same kernel over byte pairs.
                half_combine_slice::<Self, OP, [u8; 2]>(
                    bytemuck::cast_slice_mut(local),
                    bytemuck::cast_slice(received),
                );
            }
        }
    )*};
}

half_lanes!(F16Lane, Bf16Lane);

/// A float16 or bfloat16 element as the half kernel reads and writes it: a `u16` of an
/// aligned typed slice, or two little-endian bytes at any alignment.
pub(super) trait HalfBits: Copy {
    /// The element's bits.
    fn get(self) -> u16;
    /// The element with bits `bits`.
    fn put(bits: u16) -> Self;
}

impl HalfBits for u16 {
    #[inline(always)]
    fn get(self) -> u16 {
        self
    }

    #[inline(always)]
    fn put(bits: u16) -> u16 {
        bits
    }
}

impl HalfBits for [u8; 2] {
    #[inline(always)]
    fn get(self) -> u16 {
        u16::from_le_bytes(self)
    }

    #[inline(always)]
    fn put(bits: u16) -> [u8; 2] {
        bits.to_le_bytes()
    }
}

/// `local[i] = local[i] ⊕ received[i]` for a half type.
#[inline(always)]
pub(super) fn half_combine_slice<H: HalfLane, const OP: u8, E: HalfBits>(
    local: &mut [E],
    received: &[E],
) {
    match OP {
        SUM => {
            // A block at a time: one loop stores the rounded sums (meaningless where an
            // operand is infinite or NaN), keeps a copy of `local` and finds the largest
            // magnitude of the operands; only blocks holding an infinity or a NaN then take
            // `half_sum`'s fix-ups. After such a block, the next one is expected to hold
            // some too and is summed and fixed up in one loop.
            let mut saved = [0u16; BLOCK];
            let mut special = false;
            for (lc, rc) in local.chunks_mut(BLOCK).zip(received.chunks(BLOCK)) {
                if special {
                    // The previous block held an infinity or a NaN: sum and fix up at once.
                    let mut largest = 0i16;
                    for (l, r) in lc.iter_mut().zip(rc) {
                        let (a, b) = (l.get(), r.get());
                        let sum = H::narrow(H::widen_finite(a) + H::widen_finite(b));
                        *l = E::put(half_sum::<H>(sum, a, b));
                        largest = largest.max((a & 0x7FFF) as i16).max((b & 0x7FFF) as i16);
                    }
                    special = largest >= H::INF as i16;
                    continue;
                }
                let saved = &mut saved[..lc.len()];
                // Signed (SSE2's `pmaxsw`): the magnitudes are below 2^15.
                let mut largest = 0i16;
                for ((l, r), saved) in lc.iter_mut().zip(rc).zip(saved.iter_mut()) {
                    let (a, b) = (l.get(), r.get());
                    *saved = a;
                    *l = E::put(H::narrow(H::widen_finite(a) + H::widen_finite(b)));
                    largest = largest.max((a & 0x7FFF) as i16).max((b & 0x7FFF) as i16);
                }
                // If every operand is finite, the rounded sums are the result (overflow rounds
                // to inf); otherwise the block is fixed up.
                special = largest >= H::INF as i16;
                if special {
                    for ((l, r), &a) in lc.iter_mut().zip(rc).zip(&*saved) {
                        *l = E::put(half_sum::<H>(l.get(), a, r.get()));
                    }
                }
            }
        }
        MAX => {
            for (l, r) in local.iter_mut().zip(received) {
                let (a, b) = (l.get(), r.get());
                *l = E::put(blend(mask(half_lt::<H>(a, b)), b, a));
            }
        }
        _ => {
            for (l, r) in local.iter_mut().zip(received) {
                let (a, b) = (l.get(), r.get());
                *l = E::put(blend(mask(half_lt::<H>(b, a)), b, a));
            }
        }
    }
}
