//! The deterministic input pattern shared by the Rust interop tests and the
//! Python MLX rank (`tests/interop/mlx_rank.py`, function `pattern`).
//!
//! Both sides must produce the same bytes; `tests/sim/pattern_golden.rs` checks this
//! against `tests/interop/pattern_golden.txt`, written by
//! `tests/interop/pattern_check.py`.
//!
//! Definition, for element `i` of rank `rank`:
//!
//! ```text
//! x = splitmix64(seed ^ rank·0x9E3779B97F4A7C15 ^ i·0xD1B54A32D192ED03)   (wrapping u64)
//! bool              x & 1
//! integers          the low bits of x (truncation), little-endian
//! float32 / 64      ((x % 2001) as i64 - 1000) / 8, except, only when bit 63 of
//!                   seed is set, if x >> 60 == 15 one of [NaN, +inf, -inf, -0.0]
//!                   chosen by (x >> 58) & 3 (NaN = 0x7FC00000 / 0x7FF8000000000000)
//! float16           the float32 value rounded to nearest even (NaN -> 0x7E00)
//! bfloat16          the float32 bits b -> (b + 0x7FFF + ((b >> 16) & 1)) >> 16
//! complex64         re = float32(x), im = float32(splitmix64(x))
//! ```
//!
//! Only std is used: the definition is the one in the Python rank, nothing more.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
const ELEM_MUL: u64 = 0xD1B5_4A32_D192_ED03;

/// The splitmix64 finaliser applied to `v` (one step of the generator whose state is `v`).
pub fn splitmix64(v: u64) -> u64 {
    let mut z = v.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The raw 64-bit value behind element `i` of `rank`'s input.
pub fn raw(seed: u64, rank: usize, i: usize) -> u64 {
    splitmix64(seed ^ (rank as u64).wrapping_mul(GOLDEN) ^ (i as u64).wrapping_mul(ELEM_MUL))
}

/// Size in bytes of one element of `dtype` (nuvec / MLX dtype name), or `None` if unknown.
pub fn dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "bool" | "uint8" | "int8" => 1,
        "uint16" | "int16" | "float16" | "bfloat16" => 2,
        "uint32" | "int32" | "float32" => 4,
        "uint64" | "int64" | "float64" | "complex64" => 8,
        _ => return None,
    })
}

/// All dtype names understood by [`pattern`].
pub const DTYPES: [&str; 14] = [
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
];

/// The float pattern value of `x` as f32 bits.
pub fn f32_bits(x: u64, specials: bool) -> u32 {
    if specials && (x >> 60) == 15 {
        return [0x7FC0_0000, 0x7F80_0000, 0xFF80_0000, 0x8000_0000][((x >> 58) & 3) as usize];
    }
    (((x % 2001) as i64 - 1000) as f32 / 8.0).to_bits()
}

/// The float pattern value of `x` as f64 bits.
pub fn f64_bits(x: u64, specials: bool) -> u64 {
    if specials && (x >> 60) == 15 {
        return [
            0x7FF8_0000_0000_0000,
            0x7FF0_0000_0000_0000,
            0xFFF0_0000_0000_0000,
            0x8000_0000_0000_0000,
        ][((x >> 58) & 3) as usize];
    }
    (((x % 2001) as i64 - 1000) as f64 / 8.0).to_bits()
}

/// f32 -> IEEE binary16, round to nearest even; NaN keeps its top payload bits
/// and stays quiet/non-zero exactly as numpy's `astype(float16)` does.
pub fn f32_to_f16_bits(bits: u32) -> u16 {
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xFF) as i32;
    let man = bits & 0x007F_FFFF;
    if exp == 0xFF {
        if man == 0 {
            return sign | 0x7C00;
        }
        let mut h = 0x7C00 | (man >> 13) as u16;
        if h == 0x7C00 {
            h += 1;
        }
        return sign | h;
    }
    let e = exp - 127 + 15;
    if e >= 0x1F {
        return sign | 0x7C00;
    }
    if e <= 0 {
        // Subnormal (or zero) in f16: value = full · 2^(exp-150) = q · 2^-24.
        if e < -10 {
            return sign;
        }
        let full = man | 0x0080_0000;
        let shift = (14 - e) as u32;
        let mut q = full >> shift;
        let rem = full & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        if rem > half || (rem == half && q & 1 == 1) {
            q += 1;
        }
        return sign | q as u16;
    }
    let mut q = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1FFF;
    if rem > 0x1000 || (rem == 0x1000 && q & 1 == 1) {
        q += 1; // may carry into the exponent, up to infinity: correct
    }
    sign | q as u16
}

/// f32 -> bfloat16 with MLX's round-to-nearest-even integer trick (NaN 0x7FC00000 -> 0x7FC0).
pub fn f32_to_bf16_bits(bits: u32) -> u16 {
    (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16
}

/// Little-endian raw bytes of `n` elements of `dtype` for `rank`'s input under `seed`.
///
/// Panics on an unknown dtype name.
pub fn pattern(dtype: &str, seed: u64, rank: usize, n: usize) -> Vec<u8> {
    let size = dtype_size(dtype).unwrap_or_else(|| panic!("unknown dtype {dtype:?}"));
    let specials = seed >> 63 == 1;
    let mut out = Vec::with_capacity(n * size);
    for i in 0..n {
        let x = raw(seed, rank, i);
        match dtype {
            "bool" => out.push((x & 1) as u8),
            "uint8" | "int8" | "uint16" | "int16" | "uint32" | "int32" | "uint64" | "int64" => {
                out.extend_from_slice(&x.to_le_bytes()[..size]);
            }
            "float32" => out.extend_from_slice(&f32_bits(x, specials).to_le_bytes()),
            "float64" => out.extend_from_slice(&f64_bits(x, specials).to_le_bytes()),
            "float16" => {
                out.extend_from_slice(&f32_to_f16_bits(f32_bits(x, specials)).to_le_bytes());
            }
            "bfloat16" => {
                out.extend_from_slice(&f32_to_bf16_bits(f32_bits(x, specials)).to_le_bytes());
            }
            "complex64" => {
                out.extend_from_slice(&f32_bits(x, specials).to_le_bytes());
                out.extend_from_slice(&f32_bits(splitmix64(x), specials).to_le_bytes());
            }
            _ => unreachable!(),
        }
    }
    out
}
