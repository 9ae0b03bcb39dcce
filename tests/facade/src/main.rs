//! Runs an all_sum through the `nuvec` facade with this repository's nuvec-distributed patched
//! in: `cargo run --ignore-rust-version --manifest-path tests/facade/Cargo.toml`.

fn main() -> nuvec::Result<()> {
    use nuvec::{array, distributed};
    let options = distributed::Options::default();
    let _ = options.timeout;
    let group = distributed::init(false)?;
    let x = array![1.0, 2.0];
    let total = distributed::all_sum(&x, None);
    println!(
        "rank {} of {}: {:?}",
        group.rank(),
        group.size(),
        total.to_vec::<f32>()?
    );
    Ok(())
}
