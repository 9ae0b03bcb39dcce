//! Data-parallel training: every rank holds the same model and a shard of the data; the
//! gradients are averaged with `all_sum` each step, so the parameters stay identical on every
//! rank. The plain data-parallel run packs the gradients and the loss into one bucket and
//! reduces it with a single `all_sum` per step (as MLX's `nn.average_gradients`), and rank 0
//! prints the time per step and the share of it spent in that `all_sum`.
//!
//! `cargo run --release --ignore-rust-version --example data_parallel -- -n 4` starts 4 local
//! ranks over TCP; rank 0 prints the loss. Under `mlx.launch` or `nuvec-launch` the binary runs
//! as one rank. The model is a linear regression y = x·w + b on synthetic data whose true
//! weights are known, so the loss must fall towards the noise level.
//!
//! With `--tensor-parallel T` (T divides the ranks and the 8 features), the ranks form a grid
//! of T-rank tensor-parallel groups × R/T data-parallel groups, made with `Group::split`: each
//! rank of a tensor-parallel group holds T-th of the weights (its features' rows) and the
//! group's partial predictions are summed over it; the ranks holding the same slice of the
//! weights but different data average their gradients over their data-parallel group. Both
//! kinds of group are used every step, in the same order on every rank.
//! `cargo run --release --ignore-rust-version --example data_parallel -- -n 4 --tensor-parallel 2`
//!
//! The local ranks are started by this workspace's `nuvec-local` (a dev-dependency, not
//! published): in a program of your own, run it under `nuvec-launch -n 4` instead.

use nuvec_core::distributed::Group;
use nuvec_core::{Array, DType, distributed, ops, random, value_and_grad};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const FEATURES: usize = 8;
const SAMPLES_PER_RANK: usize = 256;
const STEPS: usize = 60;
const LEARNING_RATE: f32 = 0.1;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut ranks = 4usize;
    let mut tensor_parallel = 1usize;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-n" | "--ranks" => ranks = args.next().ok_or("-n needs a number")?.parse()?,
            "--tensor-parallel" => {
                tensor_parallel = args
                    .next()
                    .ok_or("--tensor-parallel needs a number")?
                    .parse()?;
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?} (usage: -n RANKS [--tensor-parallel T])"
                )
                .into());
            }
        }
    }
    if std::env::var_os("MLX_RANK").is_some() {
        return match tensor_parallel {
            1 => rank(),
            t => tensor_parallel_rank(t),
        };
    }
    // Free loopback ports in a hostfile, MLX_HOSTFILE and MLX_RANK on every rank, rank 0's
    // output shown, the wait bounded: what `nuvec-launch -n 4 -- <this example>` does.
    nuvec_local::Job::this_program("data-parallel", ranks.max(1))?
        .ring(1)?
        .run_ok()?;
    Ok(())
}

/// This rank's shard: inputs x and targets y = x·w_true + b_true + noise.
fn shard(rank: usize) -> (Array, Array) {
    let key = random::key(1000 + rank as u64);
    let x = random::normal(
        [SAMPLES_PER_RANK, FEATURES],
        DType::F32,
        0.0,
        1.0,
        Some(&key),
    );
    let w_true = Array::from_slice(
        &(0..FEATURES)
            .map(|i| i as f32 * 0.5 - 1.0)
            .collect::<Vec<_>>(),
        [FEATURES, 1],
    );
    let noise_key = random::key(2000 + rank as u64);
    let noise = random::normal(
        [SAMPLES_PER_RANK, 1],
        DType::F32,
        0.0,
        0.1,
        Some(&noise_key),
    );
    let y = x.matmul(&w_true).add(0.3f32).add(noise);
    (x, y)
}

fn rank() -> Result<()> {
    let group = nuvec_distributed::init(true)?;
    let (r, n) = (group.rank(), group.size());
    let (x, y) = shard(r);
    // Every rank starts from the same parameters.
    let mut params = (
        Array::from_slice(&[0.0f32; FEATURES], [FEATURES, 1]),
        Array::from_slice(&[0.0f32], [1]),
    );
    let loss = |(w, b): &(Array, Array)| {
        let error = x.matmul(w).add(b).subtract(&y);
        error.multiply(&error).mean(..)
    };
    let step = value_and_grad(loss);
    let started = std::time::Instant::now();
    let mut in_collectives = std::time::Duration::ZERO;
    for i in 0..STEPS {
        let (value, (gw, gb)) = step(&params)?;
        // Average the gradients (and the loss, for printing) over the ranks with one all_sum
        // of one bucket, as MLX's `nn.average_gradients` does: one collective per step
        // instead of one per tensor. The local part is evaluated first, so the time of the
        // all_sum alone can be measured.
        let bucket = ops::concatenate(
            &[gw.reshape([FEATURES]), gb.reshape([1]), value.reshape([1])],
            0,
        );
        nuvec_core::eval(&bucket)?;
        let waited = std::time::Instant::now();
        let bucket = distributed::all_sum(&bucket, None).divide(n as f32);
        nuvec_core::eval(&bucket)?;
        in_collectives += waited.elapsed();
        let gw = bucket.i(0..FEATURES as i32).reshape([FEATURES, 1]);
        let gb = bucket.i(FEATURES as i32..FEATURES as i32 + 1);
        let value = bucket.i(FEATURES as i32 + 1);
        params = (
            params.0.subtract(gw.multiply(LEARNING_RATE)),
            params.1.subtract(gb.multiply(LEARNING_RATE)),
        );
        // Every rank evaluates the same collectives in the same order: the loss too, though only
        // rank 0 prints it (a collective evaluated on one rank only would hang the others).
        nuvec_core::eval(&(params.0.clone(), params.1.clone(), value.clone()))?;
        if r == 0 && (i % 10 == 0 || i + 1 == STEPS) {
            println!("step {i:>3}: loss {:.5}", value.item::<f32>()?);
        }
    }
    let total = started.elapsed();
    if r == 0 {
        println!(
            "{:.3} ms per step, {:.0}% of it in the one all_sum per step",
            total.as_secs_f64() * 1e3 / STEPS as f64,
            100.0 * in_collectives.as_secs_f64() / total.as_secs_f64().max(1e-9)
        );
    }
    // The parameters must be bit-identical on every rank.
    let mine = params.0.reshape([FEATURES]).to_vec::<f32>()?;
    let all = distributed::all_gather(&params.0.reshape([FEATURES]), None).to_vec::<f32>()?;
    for (q, theirs) in all.chunks(FEATURES).enumerate() {
        let same = theirs
            .iter()
            .zip(&mine)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        if !same {
            return Err(format!("rank {q}'s parameters differ from rank {r}'s").into());
        }
    }
    if r == 0 {
        println!("w = {mine:.3?}");
        println!("b = {:.3}", params.1.item::<f32>()?);
        println!("parameters identical on all {n} ranks");
    }
    Ok(())
}

/// One rank of the grid: T ranks of a tensor-parallel group split the weights by features and
/// share a data shard; the R/T ranks of a data-parallel group hold the same weights' slice and
/// different data.
fn tensor_parallel_rank(t: usize) -> Result<()> {
    let group = nuvec_distributed::init(true)?;
    let (r, n) = (group.rank(), group.size());
    if t == 0 || !n.is_multiple_of(t) || !FEATURES.is_multiple_of(t) {
        return Err(format!(
            "--tensor-parallel {t} must divide the {n} ranks and the {FEATURES} features"
        )
        .into());
    }
    // Ranks t·k .. t·k+t−1 form tensor-parallel group k; ranks with the same r mod t form a
    // data-parallel group. Both are collectives on the whole group, called by every rank.
    let tensor: Group = group.split((r / t) as i32, -1)?;
    let data: Group = group.split((r % t) as i32, -1)?;
    let (slice, replica) = (tensor.rank(), data.rank());
    let width = FEATURES / t;
    // The data shard of this data-parallel rank, and this rank's features of it.
    let (x, y) = shard(replica);
    let features: Vec<i32> = (slice * width..(slice + 1) * width)
        .map(|f| f as i32)
        .collect();
    let x = ops::take(&x, &Array::from_slice(&features, [width]), 1);
    let mut params = (
        Array::from_slice(&vec![0.0f32; width], [width, 1]),
        Array::from_slice(&[0.0f32], [1]),
    );
    let dp = data.size() as f32;
    for i in 0..STEPS {
        // Forward: the partial predictions of every slice, summed over the tensor-parallel
        // group; what the other slices add does not depend on this rank's weights.
        let partial = x.matmul(&params.0);
        let others = distributed::all_sum(&partial, Some(&tensor)).subtract(&partial);
        nuvec_core::eval(&others)?;
        let loss = |(w, b): &(Array, Array)| {
            let error = x.matmul(w).add(&others).add(b).subtract(&y);
            error.multiply(&error).mean(..)
        };
        let (value, (gw, gb)) = value_and_grad(loss)(&params)?;
        // Backward: the slice's gradient averaged over the data-parallel group (the same slice,
        // other data); the bias, which every rank holds, over every rank.
        let gw = distributed::all_sum(&gw, Some(&data)).divide(dp);
        let gb = distributed::all_sum(&gb, None).divide(n as f32);
        let value = distributed::all_sum(&value, Some(&data)).divide(dp);
        params = (
            params.0.subtract(gw.multiply(LEARNING_RATE)),
            params.1.subtract(gb.multiply(LEARNING_RATE)),
        );
        nuvec_core::eval(&(params.0.clone(), params.1.clone(), value.clone()))?;
        if r == 0 && (i % 10 == 0 || i + 1 == STEPS) {
            println!("step {i:>3}: loss {:.5}", value.item::<f32>()?);
        }
    }
    // The whole weights, gathered over the tensor-parallel group, and the bias must be
    // bit-identical on every rank of the job.
    let w = distributed::all_gather(&params.0.reshape([width]), Some(&tensor));
    let mine = w.to_vec::<f32>()?;
    let all = distributed::all_gather(&w, None).to_vec::<f32>()?;
    for (q, theirs) in all.chunks(FEATURES).enumerate() {
        if theirs
            .iter()
            .zip(&mine)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Err(format!("rank {q}'s weights differ from rank {r}'s").into());
        }
    }
    let b = params.1.item::<f32>()?;
    let biases = distributed::all_gather(&params.1, None).to_vec::<f32>()?;
    if let Some(q) = biases.iter().position(|c| c.to_bits() != b.to_bits()) {
        return Err(format!("rank {q}'s bias differs from rank {r}'s").into());
    }
    if r == 0 {
        println!("w = {mine:.3?}");
        println!("b = {b:.3}");
        println!(
            "parameters identical on all {n} ranks ({t}-way tensor parallel × {}-way data parallel)",
            n / t
        );
    }
    Ok(())
}
