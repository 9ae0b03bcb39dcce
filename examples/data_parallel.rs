//! Data-parallel training: every rank holds the same model (a small MLP of nuvec-nn's
//! `Linear` layers, trained with nuvec-nn's Adam) and a shard of the data; the gradients are
//! averaged over the ranks every step, so the parameters stay identical on every rank.
//!
//! The gradients are averaged as MLX's `nn.average_gradients` does: flattened into buckets of
//! at least `--bucket-bytes` (32 MiB by default, MLX's `all_reduce_size`; this model's
//! gradients fit in one), each bucket reduced with one `all_sum` and divided by the number of
//! ranks, then put back in the model's shape. The loss rides in the same bucket, so a step
//! costs one `all_sum`. The local work is evaluated before the `all_sum`, so the time inside
//! it is measured, not estimated: rank 0 prints the time per step and that share of it.
//!
//! The task is seeded and synthetic (no download): 16 features drawn from a normal
//! distribution, labelled by the argmax of a fixed random linear map into 4 classes; each rank
//! draws its own shard, and step `s` takes the same rows of it in every run.
//!
//! Checkpoints: with `--checkpoint PATH`, rank 0 alone writes the model and the optimizer's
//! state (its step, learning rate and moments) to PATH as safetensors, every `--save-every`
//! steps and at the end, through a temporary file renamed into place. `--resume` reads PATH
//! on rank 0, hands its values to every rank (an `all_gather` of each leaf, rank 0's row
//! kept, so every bit arrives unchanged) and continues from its step: N steps in one run and
//! N/2 steps, then a resumed run to N, end with the same bits. At the end every rank checks
//! that all ranks hold identical parameters (an `all_max` and an `all_min` of a checksum of
//! their bits must agree) and rank 0 prints the checksum.
//!
//! `cargo run --release --ignore-rust-version --example data_parallel -- -n 4` starts 4 local
//! ranks over TCP; under `nuvec-launch` or `mlx.launch` the binary runs as one rank;
//! `--simulate` runs the ranks as threads in the deterministic simulator. Rank 0 prints the
//! wire the job agreed on (`wire: nuvec` or `wire: mlx`, `nuvec_distributed::wire()`).
//!
//! Flags: `-n RANKS`, `--steps N` (60, the step to stop at), `--checkpoint PATH`,
//! `--save-every K` (0: only at the end), `--resume`, `--bucket-bytes B`, `--simulate`.
//!
//! With `--tensor-parallel T` (T divides the ranks and the 8 features), the ranks form a grid
//! of T-rank tensor-parallel groups × R/T data-parallel groups, made with `Group::split`, on a
//! linear regression: each rank of a tensor-parallel group holds T-th of the weights (its
//! features' rows) and the group's partial predictions are summed over it; the ranks holding
//! the same slice of the weights but different data average their gradients over their
//! data-parallel group. Both kinds of group are used every step, in the same order on every
//! rank. `cargo run --release --ignore-rust-version --example data_parallel -- -n 4
//! --tensor-parallel 2`
//!
//! The local ranks are started by this workspace's `nuvec-local` (a dev-dependency, not
//! published): in a program of your own, run it under `nuvec-launch -n 4` instead.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nuvec_core::distributed::{self, Group};
use nuvec_core::{Array, DType, Tree, ops, random, value_and_grad};
use nuvec_distributed::Wire;
use nuvec_nn::optim::{Adam, Optimizer};
use nuvec_nn::{Linear, Module, losses, relu};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const INPUTS: i32 = 16;
const HIDDEN: i32 = 64;
const CLASSES: i32 = 4;
/// Samples in each rank's shard.
const SHARD: i32 = 1024;
/// Samples per rank per step.
const BATCH: i32 = 64;
const LEARNING_RATE: f32 = 0.01;
/// MLX's `average_gradients(all_reduce_size=32 * 1024**2)`.
const BUCKET_BYTES: usize = 32 << 20;

/// The command line.
#[derive(Clone, Debug)]
struct Config {
    ranks: usize,
    steps: u64,
    checkpoint: Option<PathBuf>,
    save_every: u64,
    resume: bool,
    bucket_bytes: usize,
    simulate: bool,
}

fn main() -> Result<()> {
    let mut config = Config {
        ranks: 4,
        steps: 60,
        checkpoint: None,
        save_every: 0,
        resume: false,
        bucket_bytes: BUCKET_BYTES,
        simulate: false,
    };
    let mut tensor_parallel = 1usize;
    // The flags the grid (`--tensor-parallel`) has no use for: it trains a fixed model.
    let mut grid_ignores: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if !matches!(arg.as_str(), "-n" | "--ranks" | "--tensor-parallel") {
            grid_ignores.push(arg.clone());
        }
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "-n" | "--ranks" => config.ranks = value()?.parse()?,
            "--steps" => config.steps = value()?.parse()?,
            "--checkpoint" => config.checkpoint = Some(value()?.into()),
            "--save-every" => config.save_every = value()?.parse()?,
            "--resume" => config.resume = true,
            "--bucket-bytes" => config.bucket_bytes = value()?.parse()?,
            "--simulate" => config.simulate = true,
            "--tensor-parallel" => tensor_parallel = value()?.parse()?,
            other => {
                return Err(format!(
                    "unknown argument {other:?} (usage: -n RANKS [--steps N] [--checkpoint PATH \
                     [--save-every K] [--resume]] [--bucket-bytes B] [--simulate] \
                     [--tensor-parallel T])"
                )
                .into());
            }
        }
    }
    if config.resume && config.checkpoint.is_none() {
        return Err("--resume needs --checkpoint PATH".into());
    }
    if tensor_parallel != 1 && !grid_ignores.is_empty() {
        return Err(format!(
            "--tensor-parallel trains its own grid ({} steps of a fixed model, over processes) \
             and takes none of {}",
            grid::STEPS,
            grid_ignores.join(" ")
        )
        .into());
    }
    if config.simulate {
        return simulate(&config);
    }
    if std::env::var_os("MLX_RANK").is_some() {
        return match tensor_parallel {
            1 => {
                let group = nuvec_distributed::init(true)?;
                train(&group, &config, nuvec_distributed::wire())
            }
            t => grid::rank(t),
        };
    }
    // Free loopback ports in a hostfile, MLX_HOSTFILE and MLX_RANK on every rank, rank 0's
    // output shown, the wait bounded: what `nuvec-launch -n 4 -- <this example>` does.
    nuvec_local::Job::this_program("data-parallel", config.ranks.max(1))?
        .ring(1)?
        .run_ok()?;
    Ok(())
}

/// The same ranks in the deterministic simulator, one thread per rank, each with its own
/// `&Group` (the default group is process-wide: code that takes `None` fails there). Times
/// are wall-clock times of threads sharing this machine, not a network's.
fn simulate(config: &Config) -> Result<()> {
    let sim = nuvec_fabric_sim::Sim::ring(config.ranks.max(1), 1).seed(1);
    let wire = sim.ring_wire();
    let report = sim.run_ring(Duration::from_secs(120), |group| {
        train(&group, config, Some(wire)).map_err(|e| e.to_string())
    });
    for (rank, outcome) in report.outcomes.iter().enumerate() {
        match outcome {
            nuvec_fabric_sim::Outcome::Returned(Ok(())) => {}
            other => return Err(format!("simulated rank {rank}: {other:?}").into()),
        }
    }
    println!(
        "simulated: {} ranks, trace hash {:016x}",
        config.ranks, report.trace_hash
    );
    Ok(())
}

/// A two-layer perceptron, as nuvec-nn's documentation writes one.
#[derive(Clone, Module)]
#[module(crate = "nuvec_core")]
struct Mlp {
    hidden: Linear,
    out: Linear,
}

impl Mlp {
    fn forward(&self, x: &Array) -> Array {
        self.out.forward(&relu(&self.hidden.forward(x)))
    }
}

/// Serialises the seeded initialisation between ranks that share a process (the simulator):
/// `random::seed` and unkeyed draws are process-wide.
static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The model every rank starts from: the same seed, the same draws.
fn initial_model() -> Result<Mlp> {
    let _turn = SEEDED
        .lock()
        .map_err(|_| "a rank panicked while drawing the initial weights")?;
    random::seed(0);
    let model = Mlp {
        hidden: Linear::new(INPUTS, HIDDEN),
        out: Linear::new(HIDDEN, CLASSES),
    };
    nuvec_core::eval(&model)?;
    Ok(model)
}

/// Rank `rank`'s shard: inputs and their labels, from keyed draws (independent of any
/// process-wide seed).
fn shard(rank: usize) -> Result<(Array, Array)> {
    let x = random::normal(
        [SHARD, INPUTS],
        DType::F32,
        0.0,
        1.0,
        Some(&random::key(1000 + rank as u64)),
    );
    let teacher = random::normal(
        [INPUTS, CLASSES],
        DType::F32,
        0.0,
        1.0,
        Some(&random::key(7)),
    );
    let y = x.matmul(&teacher).argmax(-1);
    nuvec_core::eval(&(x.clone(), y.clone()))?;
    Ok((x, y))
}

/// The rows of the shard that step `step` trains on: the same in every run.
fn batch(x: &Array, y: &Array, step: u64) -> (Array, Array) {
    let start = (step as i64 * i64::from(BATCH)) % i64::from(SHARD);
    let rows: Vec<i32> = (0..i64::from(BATCH))
        .map(|i| ((start + i) % i64::from(SHARD)) as i32)
        .collect();
    let rows = Array::from_slice(&rows, [BATCH]);
    (ops::take(x, &rows, 0), ops::take(y, &rows, 0))
}

/// One rank's training over `group`; `wire` is what the job speaks, for the report.
fn train(group: &Group, config: &Config, wire: Option<Wire>) -> Result<()> {
    let (rank, size) = (group.rank(), group.size());
    let (x, y) = shard(rank)?;
    let mut model = initial_model()?;
    let mut opt = Adam::new(LEARNING_RATE);
    // The optimizer's state exists from the start, so a checkpoint can be loaded into it.
    opt.init(&model);
    let mut first = steps_taken(&opt)?;
    if config.resume
        && let Some(path) = &config.checkpoint
    {
        (model, opt) = resume(path, (model, opt), group)?;
        first = steps_taken(&opt)?;
        if rank == 0 {
            println!("resumed from {} at step {first}", path.display());
        }
    }
    if rank == 0 {
        let wire = match wire {
            Some(Wire::Nuvec) => "nuvec",
            Some(Wire::Mlx) => "mlx",
            None => "none",
        };
        println!(
            "{size} ranks, {} parameters, steps {first}..{}; wire: {wire}",
            model.num_params(),
            config.steps
        );
    }
    let loss = |m: &Mlp, x: &Array, y: &Array| {
        losses::cross_entropy(&m.forward(x), y, losses::Reduction::Mean)
    };
    let mut step_times = Vec::new();
    let mut in_collectives = Duration::ZERO;
    let mut all_sums = 0;
    for step in first..config.steps {
        let started = Instant::now();
        let (bx, by) = batch(&x, &y, step);
        let (value, grads) = value_and_grad(|m: &Mlp| loss(m, &bx, &by))(&model)?;
        // The loss rides in the gradients' bucket: one all_sum averages both.
        let (averaged, waited, calls) =
            average_gradients(&(grads, value), group, config.bucket_bytes)?;
        let (grads, value) = averaged;
        in_collectives += waited;
        all_sums = calls;
        opt.update(&mut model, &grads)?;
        nuvec_core::eval(&(model.clone(), value.clone()))?;
        step_times.push(started.elapsed());
        let done = step + 1;
        if let Some(path) = &config.checkpoint
            && rank == 0
            && (done == config.steps || (config.save_every > 0 && done % config.save_every == 0))
        {
            save(path, &model, &opt)?;
        }
        if rank == 0 && (step == first || done % 10 == 0 || done == config.steps) {
            println!("step {done:>4}: loss {:.5}", value.item::<f32>()?);
        }
    }
    // Identical bits on every rank: the largest and the smallest checksum must agree.
    let sum = checksum(&model)?;
    let mine = Array::from_slice(&[sum], [1]);
    let largest = distributed::all_max(&mine, Some(group)).item::<u64>()?;
    let smallest = distributed::all_min(&mine, Some(group)).item::<u64>()?;
    if largest != smallest {
        return Err(format!(
            "rank {rank}: the ranks' parameters differ (checksums from {smallest:016x} to \
             {largest:016x}, this rank's {sum:016x})"
        )
        .into());
    }
    if rank == 0 {
        if !step_times.is_empty() {
            let total: Duration = step_times.iter().sum();
            let mut sorted = step_times.clone();
            sorted.sort();
            println!(
                "{:.3} ms per step (p50 {:.3} ms), {:.0}% of it inside {all_sums} all_sum(s) \
                 per step (measured: {:.3} ms per step)",
                total.as_secs_f64() * 1e3 / step_times.len() as f64,
                sorted[sorted.len() / 2].as_secs_f64() * 1e3,
                100.0 * in_collectives.as_secs_f64() / total.as_secs_f64().max(1e-9),
                in_collectives.as_secs_f64() * 1e3 / step_times.len() as f64,
            );
        }
        if let Some(path) = &config.checkpoint {
            println!("checkpoint: {} (step {})", path.display(), config.steps);
        }
        println!("parameters identical on all {size} ranks (checksum {sum:016x})");
    }
    Ok(())
}

/// Averages the leaves of `tree` over `group` as MLX's `nn.average_gradients`: leaves are
/// packed, in order, into buckets of at least `bucket_bytes` (a bucket holds one dtype: MLX
/// averages leaf by leaf when the dtypes are mixed), each bucket is summed with one
/// `all_sum`, divided by the group's size and cut back into the leaves' shapes. Returns the
/// averaged tree, the time spent inside the `all_sum`s and their number.
fn average_gradients<T: Tree>(
    tree: &T,
    group: &Group,
    bucket_bytes: usize,
) -> Result<(T, Duration, usize)> {
    let size = group.size();
    if size == 1 {
        return Ok((tree.clone(), Duration::ZERO, 0));
    }
    let leaves = tree.leaves();
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for (i, leaf) in leaves.iter().enumerate() {
        let same_dtype = buckets
            .last()
            .and_then(|b| b.first())
            .is_some_and(|&j| leaves[j].dtype() == leaf.dtype());
        match buckets.last_mut() {
            Some(bucket) if same_dtype && bytes < bucket_bytes => bucket.push(i),
            _ => {
                buckets.push(vec![i]);
                bytes = 0;
            }
        }
        bytes += leaf.size() * leaf.dtype().size();
    }
    let mut averaged = leaves.clone();
    let mut waited = Duration::ZERO;
    for bucket in &buckets {
        let flat: Vec<Array> = bucket.iter().map(|&i| leaves[i].reshape([-1])).collect();
        let flat = ops::concatenate(&flat, 0);
        // The local work first, so that the clock times the all_sum alone.
        nuvec_core::eval(&flat)?;
        let started = Instant::now();
        let sum = distributed::all_sum(&flat, Some(group));
        nuvec_core::eval(&sum)?;
        waited += started.elapsed();
        let mean = sum.divide(size as f32);
        let mut at = 0;
        for &i in bucket {
            let n = i32::try_from(leaves[i].size())?;
            averaged[i] = mean.i(at..at + n).reshape(leaves[i].shape());
            at += n;
        }
    }
    Ok((tree.unflatten(averaged)?, waited, buckets.len()))
}

/// The optimizer's step counter (a 0-D uint64 leaf of its state).
fn steps_taken(opt: &Adam) -> Result<u64> {
    let (_, step) = opt
        .flatten()
        .into_iter()
        .find(|(path, a)| a.ndim() == 0 && (path == "step" || path.ends_with(".step")))
        .ok_or("the optimizer's state has no step")?;
    Ok(step.item::<u64>()?)
}

/// Writes the model and the optimizer's state to `path` (rank 0 only), through a temporary
/// file renamed into place, so a crash mid-write leaves the previous checkpoint whole.
fn save(path: &Path, model: &Mlp, opt: &Adam) -> Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    (model.clone(), opt.clone())
        .save_weights(&partial)
        .map_err(|e| format!("writing the checkpoint {}: {e}", partial.display()))?;
    std::fs::rename(&partial, path)
        .map_err(|e| format!("renaming {} to {}: {e}", partial.display(), path.display()))?;
    Ok(())
}

/// Continues from the checkpoint at `path`: rank 0 reads it, every rank learns whether it
/// could, then takes rank 0's values (its file may exist on its machine only).
fn resume(path: &Path, mut state: (Mlp, Adam), group: &Group) -> Result<(Mlp, Adam)> {
    let read = if group.rank() == 0 {
        state.load_weights(path).map_err(|e| {
            format!(
                "rank 0: cannot resume from the checkpoint {}: {e}",
                path.display()
            )
        })
    } else {
        Ok(())
    };
    let failed = u32::from(read.is_err());
    let failed = distributed::all_sum(&Array::from_slice(&[failed], [1]), Some(group));
    if failed.item::<u32>()? != 0 {
        read?;
        return Err(format!(
            "rank {}: rank 0 could not read the checkpoint {}",
            group.rank(),
            path.display()
        )
        .into());
    }
    from_rank_0(&state, group)
}

/// Every leaf of `tree` as rank 0 holds it: an `all_gather` per leaf, rank 0's row kept (a
/// sum with zeros would turn -0.0 into 0.0; a gather moves the bits unchanged).
fn from_rank_0<T: Tree>(tree: &T, group: &Group) -> Result<T> {
    let mut leaves = Vec::new();
    for leaf in tree.leaves() {
        let rows = distributed::all_gather(&leaf.reshape([1, -1]), Some(group));
        let mine = rows.i(0).reshape(leaf.shape());
        // One leaf at a time, in the same order on every rank.
        nuvec_core::eval(&mine)?;
        leaves.push(mine);
    }
    Ok(tree.unflatten(leaves)?)
}

/// FNV-1a over the bits of every parameter, in order.
fn checksum(model: &Mlp) -> Result<u64> {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for leaf in model.leaves() {
        for value in leaf.to_vec::<f32>()? {
            for byte in value.to_bits().to_le_bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    Ok(hash)
}

/// The tensor-parallel × data-parallel grid, on a linear regression y = x·w + b whose true
/// weights are known.
mod grid {
    use nuvec_core::distributed::Group;
    use nuvec_core::{Array, DType, distributed, ops, random, value_and_grad};

    use super::Result;

    const FEATURES: usize = 8;
    const SAMPLES_PER_RANK: usize = 256;
    pub(super) const STEPS: usize = 60;
    const LEARNING_RATE: f32 = 0.1;

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

    /// One rank of the grid: T ranks of a tensor-parallel group split the weights by features
    /// and share a data shard; the R/T ranks of a data-parallel group hold the same weights'
    /// slice and different data.
    pub(super) fn rank(t: usize) -> Result<()> {
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
            // Backward: the slice's gradient averaged over the data-parallel group (the same
            // slice, other data); the bias, which every rank holds, over every rank.
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
                "parameters identical on all {n} ranks ({t}-way tensor parallel × {}-way data \
                 parallel)",
                n / t
            );
        }
        Ok(())
    }
}
