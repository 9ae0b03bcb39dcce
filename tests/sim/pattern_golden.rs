//! The interop input pattern: Rust and Python produce the same bytes.
//!
//! `tests/interop/pattern_golden.txt` is written by
//! `tests/interop/pattern_check.py --write` from the Python implementation in
//! `tests/interop/mlx_rank.py`; every line is `dtype seed rank n hex`.

use crate::common::pattern;

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        write!(s, "{b:02x}").unwrap();
    }
    s
}

#[test]
fn rust_and_python_patterns_agree() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/interop/pattern_golden.txt"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let mut checked = 0;
    let mut dtypes_seen = std::collections::BTreeSet::new();
    for (lineno, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 5, "line {}: malformed", lineno + 1);
        let dtype = fields[0];
        let seed: u64 = fields[1].parse().expect("seed");
        let rank: usize = fields[2].parse().expect("rank");
        let n: usize = fields[3].parse().expect("n");
        let want = if fields[4] == "-" { "" } else { fields[4] };
        let got = pattern::pattern(dtype, seed, rank, n);
        assert_eq!(
            got.len(),
            n * pattern::dtype_size(dtype).expect("known dtype"),
            "line {}: length",
            lineno + 1
        );
        assert_eq!(
            hex(&got),
            want,
            "line {}: {dtype} seed={seed} rank={rank} n={n}",
            lineno + 1
        );
        dtypes_seen.insert(dtype.to_owned());
        checked += 1;
    }
    assert!(checked > 0, "no cases in {path}");
    for dtype in pattern::DTYPES {
        assert!(dtypes_seen.contains(dtype), "no golden case for {dtype}");
    }
}

#[test]
fn f16_conversion_rounds_to_nearest_even() {
    use pattern::f32_to_f16_bits as h;
    assert_eq!(h(1.0f32.to_bits()), 0x3C00);
    assert_eq!(h((-0.0f32).to_bits()), 0x8000);
    assert_eq!(h(f32::INFINITY.to_bits()), 0x7C00);
    assert_eq!(h(f32::NEG_INFINITY.to_bits()), 0xFC00);
    assert_eq!(h(0x7FC0_0000), 0x7E00);
    assert_eq!(h(65504.0f32.to_bits()), 0x7BFF);
    assert_eq!(h(65520.0f32.to_bits()), 0x7C00); // halfway to the next binade: rounds to inf
    // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
    assert_eq!(h((1.0f32 + 2f32.powi(-11)).to_bits()), 0x3C00);
    assert_eq!(h((1.0f32 + 3.0 * 2f32.powi(-11)).to_bits()), 0x3C02);
    // Smallest subnormal 2^-24, and half of it (tie to even: zero).
    assert_eq!(h(2f32.powi(-24).to_bits()), 0x0001);
    assert_eq!(h(2f32.powi(-25).to_bits()), 0x0000);
    assert_eq!(h((1.5 * 2f32.powi(-24)).to_bits()), 0x0002);
    assert_eq!(h(2f32.powi(-14).to_bits()), 0x0400);
}
