//! The generic kernel: one element type ([`Lane`]) reduced over aligned typed slices (which
//! auto-vectorise) or, unaligned, through decoded blocks; and the lanes of the integers,
//! `float32`, `float64`, `bool` and `complex64`.

use bytemuck::{Pod, Zeroable};
use nuvec_core::Complex64;

use super::Reduction;

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

/// The `OP` const parameter of the kernels.
pub(super) const SUM: u8 = 0;
pub(super) const MAX: u8 = 1;
pub(super) const MIN: u8 = 2;

/// Elements per block: the unaligned fallback's stack buffers and the half types' sum
/// blocks.
pub(super) const BLOCK: usize = 256;

/// One dtype's element: its in-memory representation and its reduction.
pub(super) trait Lane {
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

    /// `local[i] = local[i] ⊕ received[i]` over equal-length little-endian bytes, at least
    /// one of them not aligned for `Self::Bits` (or a big-endian host): by default through
    /// blocks decoded into aligned buffers.
    #[inline(always)]
    fn combine_unaligned<const OP: u8>(local: &mut [u8], received: &[u8]) {
        combine_decoded::<Self, OP>(local, received);
    }
}

/// The kernel for `op` over `T`.
pub(super) fn select<T: Lane>(op: Reduction) -> fn(&mut [u8], &[u8]) {
    match op {
        Reduction::Sum => kernel::<T, SUM>,
        Reduction::Max => kernel::<T, MAX>,
        Reduction::Min => kernel::<T, MIN>,
    }
}

/// The one generic kernel: `local[i] = local[i] ⊕ received[i]` over raw little-endian bytes.
pub(super) fn kernel<T: Lane, const OP: u8>(local: &mut [u8], received: &[u8]) {
    assert_eq!(local.len(), received.len());
    assert_eq!(local.len() % T::SIZE, 0);
    // Typed views need the element's alignment (and a little-endian host).
    let typed = |bytes: &[u8]| {
        cfg!(target_endian = "little") && bytemuck::try_cast_slice::<u8, T::Bits>(bytes).is_ok()
    };
    if typed(local) && typed(received) {
        T::combine_slice::<OP>(
            bytemuck::cast_slice_mut(local),
            bytemuck::cast_slice(received),
        );
    } else {
        T::combine_unaligned::<OP>(local, received);
    }
}

/// `Lane::combine_unaligned`'s default: decodes blocks into aligned stack buffers, reduces
/// them with `combine_slice` and encodes the results back.
#[inline(always)]
pub(super) fn combine_decoded<T: Lane + ?Sized, const OP: u8>(local: &mut [u8], received: &[u8]) {
    if cfg!(target_endian = "little")
        && let Ok(local) = bytemuck::try_cast_slice_mut::<u8, T::Bits>(local)
    {
        // Only `received` is unaligned: decode it a block at a time.
        let mut r = [T::Bits::zeroed(); BLOCK];
        for (lc, rc) in local
            .chunks_mut(BLOCK)
            .zip(received.chunks(BLOCK * T::SIZE))
        {
            let r = &mut r[..lc.len()];
            decode::<T>(rc, r);
            T::combine_slice::<OP>(lc, r);
        }
        return;
    }
    // `local` is unaligned: decode both, reduce, encode back.
    let mut l = [T::Bits::zeroed(); BLOCK];
    let mut r = [T::Bits::zeroed(); BLOCK];
    for (lc, rc) in local
        .chunks_mut(BLOCK * T::SIZE)
        .zip(received.chunks(BLOCK * T::SIZE))
    {
        let n = lc.len() / T::SIZE;
        let (l, r) = (&mut l[..n], &mut r[..n]);
        decode::<T>(lc, l);
        decode::<T>(rc, r);
        T::combine_slice::<OP>(l, r);
        for (&s, d) in l.iter().zip(lc.chunks_exact_mut(T::SIZE)) {
            T::to_le(s, d);
        }
    }
}

/// Decodes little-endian `bytes` into `out` (one element per `T::SIZE` bytes).
#[inline(always)]
pub(super) fn decode<T: Lane + ?Sized>(bytes: &[u8], out: &mut [T::Bits]) {
    for (d, s) in out.iter_mut().zip(bytes.chunks_exact(T::SIZE)) {
        *d = T::from_le(s);
    }
}

/// `std::max(local, received)` given `local < received`.
#[inline(always)]
pub(super) fn std_max<T>(local: T, received: T, local_lt_received: bool) -> T {
    if local_lt_received { received } else { local }
}

/// `std::min(local, received)` given `received < local`.
#[inline(always)]
pub(super) fn std_min<T>(local: T, received: T, received_lt_local: bool) -> T {
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
pub(super) struct BoolLane;

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
