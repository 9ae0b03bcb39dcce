//! Random element values for the simulator tests: ordinary numbers whose sums round
//! differently in different orders, mixed with NaNs (with payloads, signalling), infinities,
//! signed zeros, subnormals and extremes at a chosen rate.

use nuvec_core::DType;
use rand::{Rng, RngExt};
use rand_chacha::ChaCha8Rng;

use nuvec_distributed::reduce::Reduction;

use super::mlx_model::Lane;

/// Every nuvec dtype MLX's ring and JACCL reduce.
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

/// Every reduction.
pub const OPS: [Reduction; 3] = [Reduction::Sum, Reduction::Max, Reduction::Min];

pub fn f32_value(rng: &mut ChaCha8Rng, specials: f64) -> f32 {
    const SPECIAL: [u32; 10] = [
        0x7FC0_0000, // NaN
        0xFFC0_0000, // -NaN
        0x7FC1_2345, // NaN with a payload
        0x7F80_0001, // signalling NaN
        0x7F80_0000, // +inf
        0xFF80_0000, // -inf
        0x8000_0000, // -0.0
        0x0000_0000, // +0.0
        0x7F7F_FFFF, // MAX
        0x0000_0001, // smallest subnormal
    ];
    if rng.random_bool(specials) {
        f32::from_bits(SPECIAL[rng.random_range(0..SPECIAL.len())])
    } else if rng.random_bool(0.1) {
        f32::from_bits(rng.next_u32())
    } else {
        // Values whose sums round differently in different orders.
        (rng.random_range(-(1i32 << 24)..(1 << 24)) as f32) * 2f32.powi(rng.random_range(-30..-8))
    }
}

pub fn f64_value(rng: &mut ChaCha8Rng, specials: f64) -> f64 {
    const SPECIAL: [u64; 10] = [
        0x7FF8_0000_0000_0000,
        0xFFF8_0000_0000_0000,
        0x7FF8_0000_0012_3456,
        0x7FF0_0000_0000_0001,
        0x7FF0_0000_0000_0000,
        0xFFF0_0000_0000_0000,
        0x8000_0000_0000_0000,
        0,
        0x7FEF_FFFF_FFFF_FFFF,
        1,
    ];
    if rng.random_bool(specials) {
        f64::from_bits(SPECIAL[rng.random_range(0..SPECIAL.len())])
    } else if rng.random_bool(0.1) {
        f64::from_bits(rng.next_u64())
    } else {
        (rng.random_range(-(1i64 << 53)..(1 << 53)) as f64) * 2f64.powi(rng.random_range(-70..-30))
    }
}

pub fn half_bits(rng: &mut ChaCha8Rng, specials: f64, bf: bool) -> u16 {
    const F16: [u16; 10] = [
        0x7E00, 0xFE00, 0x7C01, 0x7D55, 0x7C00, 0xFC00, 0x8000, 0, 0x7BFF, 1,
    ];
    const BF16: [u16; 10] = [
        0x7FC0, 0xFFC0, 0x7F81, 0x7FA5, 0x7F80, 0xFF80, 0x8000, 0, 0x7F7F, 1,
    ];
    if rng.random_bool(specials) {
        let table = if bf { &BF16 } else { &F16 };
        table[rng.random_range(0..table.len())]
    } else if rng.random_bool(0.1) {
        rng.next_u32() as u16
    } else {
        let x = (rng.random_range(-2048i32..2048) as f32) * 2f32.powi(rng.random_range(-12..-2));
        if bf {
            (x.to_bits() >> 16) as u16
        } else {
            half::f16::from_f32(x).to_bits()
        }
    }
}

/// `n` elements of `dtype`, with NaN, ±inf, ±0.0 and friends at rate `specials` for floats.
pub fn typed_values(rng: &mut ChaCha8Rng, dtype: DType, n: usize, specials: f64) -> Vec<u8> {
    let lane = Lane::of(dtype);
    let mut out = Vec::with_capacity(n * lane.size());
    for _ in 0..n {
        match lane {
            Lane::Bool => out.push(match rng.random_range(0..16) {
                0..=7 => 0,
                8..=14 => 1,
                _ => rng.next_u32() as u8, // not canonical: any nonzero byte is true
            }),
            Lane::F32 => out.extend_from_slice(&f32_value(rng, specials).to_le_bytes()),
            Lane::F64 => out.extend_from_slice(&f64_value(rng, specials).to_le_bytes()),
            Lane::F16 => out.extend_from_slice(&half_bits(rng, specials, false).to_le_bytes()),
            Lane::Bf16 => out.extend_from_slice(&half_bits(rng, specials, true).to_le_bytes()),
            Lane::C64 => {
                // Equal real parts now and then, so the lexicographic order looks at `im`.
                let re = if rng.random_bool(0.25) {
                    rng.random_range(-2i32..=2) as f32
                } else {
                    f32_value(rng, specials)
                };
                out.extend_from_slice(&re.to_le_bytes());
                out.extend_from_slice(&f32_value(rng, specials).to_le_bytes());
            }
            _ => {
                let s = lane.size();
                let mut b = [0u8; 8];
                if rng.random_bool(0.3) {
                    // Small values: ties and carries.
                    b[..s].copy_from_slice(&(rng.random_range(-3i64..=3)).to_le_bytes()[..s]);
                } else {
                    rng.fill_bytes(&mut b[..s]);
                }
                out.extend_from_slice(&b[..s]);
            }
        }
    }
    out
}
