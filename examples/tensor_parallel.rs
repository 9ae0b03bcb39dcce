//! Tensor-parallel decoding: a small decoder (transformer blocks with nuvec-nn's sharded linear
//! layers) split over the ranks, attention by heads and the MLP by hidden units, as mlx-lm's
//! sharded generation does. Every rank holds `1/size` of every block's weights; each block costs
//! two `all_sum`s per token (one after attention, one after the MLP).
//!
//! `cargo run --release --ignore-rust-version --example tensor_parallel -- -n 2` starts 2 local
//! ranks over TCP; under `mlx.launch` or `nuvec-launch` the binary runs as one rank. The weights
//! are seeded (no download), so every rank builds the same full model and keeps its slice; rank 0
//! also runs the whole model in one process and checks that the greedy tokens are the same.
//! Rank 0 prints the per-token latency (p50, p99), tokens/s, the share of each token spent
//! inside the collectives and the wire the job agreed on (`wire: nuvec` or `wire: mlx`, from
//! `nuvec_distributed::wire()`; `NUVEC_DISTRIBUTED_WIRE` only asks).
//!
//! The share is measured: each `ShardedToAllLinear` is applied in two evaluated stages (this
//! rank's partial product, then the `all_sum` and the bias, the same operations as its
//! `forward`, so the same bits), and the clock runs around the `all_sum`'s evaluation alone.
//!
//! Flags: `-n RANKS`, `--tokens N` (default 16), `--layers L` (2), `--dims D` (128),
//! `--heads H` (8; a multiple of the ranks).

use std::time::{Duration, Instant};

use nuvec_core::distributed::{self, Group};
use nuvec_core::fast::{self, AttentionOptions};
use nuvec_core::{Array, random};
use nuvec_distributed::Wire;
use nuvec_nn::sharded::{AllToShardedLinear, Shard, ShardedToAllLinear};
use nuvec_nn::{Embedding, Linear};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const VOCAB: i32 = 256;
const PROMPT: [i32; 4] = [1, 7, 42, 3];

/// The command line.
#[derive(Clone, Copy)]
struct Config {
    ranks: usize,
    tokens: usize,
    layers: usize,
    dims: i32,
    heads: i32,
    simulate: bool,
}

fn main() -> Result<()> {
    let mut config = Config {
        ranks: 2,
        tokens: 16,
        layers: 2,
        dims: 128,
        heads: 8,
        simulate: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || -> Result<usize> {
            Ok(args
                .next()
                .ok_or(format!("{arg} needs a number"))?
                .parse()?)
        };
        match arg.as_str() {
            "-n" | "--ranks" => config.ranks = value()?,
            "--tokens" => config.tokens = value()?,
            "--layers" => config.layers = value()?,
            "--dims" => config.dims = i32::try_from(value()?)?,
            "--heads" => config.heads = i32::try_from(value()?)?,
            "--simulate" => config.simulate = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?} (usage: -n RANKS [--tokens N] [--layers L] \
                     [--dims D] [--heads H] [--simulate])"
                )
                .into());
            }
        }
    }
    if config.simulate {
        return simulate(config);
    }
    if std::env::var_os("MLX_RANK").is_some() {
        let group = nuvec_distributed::init(true)?;
        return run(&group, config, nuvec_distributed::wire());
    }
    nuvec_local::Job::this_program("tensor-parallel", config.ranks.max(1))?
        .ring(1)?
        .run_ok()?;
    Ok(())
}

/// Serialises drawing the seeded weights between ranks that share a process.
static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The same ranks in the deterministic simulator: one thread per rank, each with its own
/// `&Group` (the default group is process-wide, so code that takes `None` would run as one rank).
/// Times are wall-clock time of threads sharing this machine, not a network's.
fn simulate(config: Config) -> Result<()> {
    let sim = nuvec_fabric_sim::Sim::ring(config.ranks.max(1), 1).seed(1);
    let wire = sim.ring_wire();
    let report = sim.run_ring(Duration::from_secs(120), |group| {
        run(&group, config, Some(wire)).map_err(|e| e.to_string())
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

/// One transformer block, split over `group`.
struct Block {
    q: AllToShardedLinear,
    k: AllToShardedLinear,
    v: AllToShardedLinear,
    o: ShardedToAllLinear,
    up: AllToShardedLinear,
    down: ShardedToAllLinear,
    /// This rank's heads.
    heads: i32,
    head_dim: i32,
}

/// The decoder: an embedding table and an output head (both replicated: they are small next to
/// the blocks, and an untied head keeps greedy decoding from repeating the last token) and the
/// blocks.
struct Decoder {
    embedding: Embedding,
    head: Linear,
    blocks: Vec<Block>,
}

impl Decoder {
    /// The full model from a fixed seed (the same on every rank), keeping this rank's slice.
    fn new(config: Config, group: &Group) -> Result<Self> {
        let size = i32::try_from(group.size())?;
        if config.heads % size != 0 || config.dims % config.heads != 0 {
            return Err(format!(
                "{} heads of {} dims do not split over {size} ranks",
                config.heads, config.dims
            )
            .into());
        }
        // The seed and the draws are process-wide: ranks running as threads (the simulator)
        // take turns, so each draws the same weights.
        let _turn = SEEDED
            .lock()
            .map_err(|_| "a rank panicked while drawing weights")?;
        random::seed(7);
        let d = config.dims;
        let embedding = Embedding::new(VOCAB, d);
        let mut blocks = Vec::new();
        for _ in 0..config.layers {
            let (q, k, v, o) = (
                Linear::new(d, d),
                Linear::new(d, d),
                Linear::new(d, d),
                Linear::new(d, d),
            );
            let (up, down) = (Linear::new(d, 4 * d), Linear::new(4 * d, d));
            blocks.push(Block {
                q: AllToShardedLinear::from_linear(&q, group)?,
                k: AllToShardedLinear::from_linear(&k, group)?,
                v: AllToShardedLinear::from_linear(&v, group)?,
                o: ShardedToAllLinear::from_linear(&o, group)?,
                up: AllToShardedLinear::from_linear(&up, group)?,
                down: ShardedToAllLinear::from_linear(&down, group)?,
                heads: config.heads / size,
                head_dim: d / config.heads,
            });
        }
        let head = Linear::new(d, VOCAB);
        Ok(Self {
            embedding,
            head,
            blocks,
        })
    }

    /// The logits of the token after `tokens` (the whole sequence is recomputed: no cache),
    /// adding the time spent inside the `all_sum`s to `in_collectives`.
    fn next_logits(&self, tokens: &[i32], in_collectives: &mut Duration) -> Result<Array> {
        let len = tokens.len() as i32;
        let ids = Array::from_slice(tokens, [1, len]);
        let mut h = self.embedding.forward(&ids);
        for b in &self.blocks {
            let x = fast::rms_norm(&h, None, 1e-5);
            let split = |a: Array| {
                a.reshape([1, len, b.heads, b.head_dim])
                    .transpose([0, 2, 1, 3])
            };
            let (q, k, v) = (
                split(b.q.forward(&x)),
                split(b.k.forward(&x)),
                split(b.v.forward(&x)),
            );
            let scale = 1.0 / (b.head_dim as f32).sqrt();
            let a =
                fast::scaled_dot_product_attention(&q, &k, &v, scale, &AttentionOptions::causal())
                    .transpose([0, 2, 1, 3])
                    .reshape([1, len, b.heads * b.head_dim]);
            h = h.add(sharded_to_all(&b.o, &a, in_collectives)?);
            let x = fast::rms_norm(&h, None, 1e-5);
            let up = b.up.forward(&x);
            h = h.add(sharded_to_all(
                &b.down,
                &up.multiply(up.sigmoid()),
                in_collectives,
            )?);
        }
        let last = fast::rms_norm(&h, None, 1e-5).reshape([len, -1]);
        Ok(self.head.forward(&last.i(len - 1..len)))
    }

    /// Greedy decoding of `n` tokens after the prompt, with each token's wall time and the
    /// time it spent inside the collectives.
    fn generate(&self, n: usize) -> Result<(Vec<i32>, Vec<Duration>, Duration)> {
        let mut tokens = PROMPT.to_vec();
        let mut times = Vec::with_capacity(n);
        let mut in_collectives = Duration::ZERO;
        for _ in 0..n {
            let start = Instant::now();
            let next = self
                .next_logits(&tokens, &mut in_collectives)?
                .argmax(-1)
                .item::<u32>()?;
            times.push(start.elapsed());
            tokens.push(i32::try_from(next)?);
        }
        Ok((tokens[PROMPT.len()..].to_vec(), times, in_collectives))
    }
}

/// `layer.forward(x)` in two evaluated stages, timing the second: this rank's partial
/// product (`x` times its columns of the weight), then its `all_sum` over the layer's group,
/// then the bias, the operations of nuvec-nn's `ShardedToAllLinear::forward` in its order
/// (so the same bits). The clock runs around the `all_sum`'s evaluation only: its inputs are
/// ready, so it measures the collective, not the computation it waits for.
fn sharded_to_all(
    layer: &ShardedToAllLinear,
    x: &Array,
    in_collectives: &mut Duration,
) -> Result<Array> {
    let partial = match &layer.shard {
        Shard::Linear(l) => l.forward(x),
        Shard::Quantized(q) => q.forward(x),
    };
    nuvec_core::eval(&partial)?;
    let start = Instant::now();
    let y = distributed::all_sum(&partial, Some(&layer.group));
    nuvec_core::eval(&y)?;
    *in_collectives += start.elapsed();
    Ok(match &layer.bias {
        Some(b) => y.add(b),
        None => y,
    })
}

/// One rank: decode over `group`, then (rank 0) decode in one process and compare; `wire` is
/// what the job speaks, for the report.
fn run(group: &Group, config: Config, wire: Option<Wire>) -> Result<()> {
    let model = Decoder::new(config, group)?;
    // One warm-up token: the first evaluation pays for allocations on every rank.
    model.generate(1)?;
    if config.tokens == 0 {
        return Err("--tokens must be at least 1".into());
    }
    let (tokens, times, in_collectives) = model.generate(config.tokens)?;
    // Every rank must have decoded the same tokens (they take the same all_sum bits).
    let mine = Array::from_slice(&tokens, [tokens.len()]);
    let all = distributed::all_gather(&mine, Some(group)).to_vec::<i32>()?;
    if let Some(q) = all.chunks(tokens.len()).position(|t| t != tokens) {
        return Err(format!("rank {q} decoded other tokens than rank {}", group.rank()).into());
    }
    // The split model's last logits, on every rank (its all_sums need all of them).
    let mut sequence = PROMPT.to_vec();
    sequence.extend(&tokens);
    let mut untimed = Duration::ZERO;
    let split = model
        .next_logits(&sequence, &mut untimed)?
        .to_vec::<f32>()?;
    if group.rank() != 0 {
        return Ok(());
    }
    let single = Decoder::new(config, &Group::single())?;
    let (expected, single_times, _) = single.generate(config.tokens)?;
    if expected != tokens {
        return Err(format!(
            "{} ranks decoded {tokens:?}, one process {expected:?}",
            group.size()
        )
        .into());
    }
    let wire = match wire {
        Some(Wire::Nuvec) => "nuvec",
        Some(Wire::Mlx) => "mlx",
        None => "none",
    };
    let (p50, p99, rate) = figures(&times);
    let (s50, _, srate) = figures(&single_times);
    println!(
        "{} ranks, {} layers, {} dims, {} heads, {} tokens; wire: {wire}",
        group.size(),
        config.layers,
        config.dims,
        config.heads,
        config.tokens
    );
    // Greedy tokens of an untrained model settle quickly on one token; the logits check the
    // arithmetic, not only the argmax.
    let whole = single
        .next_logits(&sequence, &mut untimed)?
        .to_vec::<f32>()?;
    let gap = split
        .iter()
        .zip(&whole)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    if gap > 1e-3 {
        return Err(format!("the split logits differ from one process's by {gap}").into());
    }
    println!("tokens: {tokens:?}; logits within {gap:.1e} of one process's");
    let total: Duration = times.iter().sum();
    println!(
        "per token: p50 {:.2} ms, p99 {:.2} ms; {rate:.1} tokens/s; collectives {:.0}% of a \
         token (measured: {:.2} ms per token inside {} all_sums)",
        ms(p50),
        ms(p99),
        100.0 * in_collectives.as_secs_f64() / total.as_secs_f64().max(1e-9),
        ms(in_collectives) / times.len() as f64,
        2 * config.layers
    );
    println!("one process: p50 {:.2} ms; {srate:.1} tokens/s", ms(s50));
    println!(
        "tokens identical to the single-process model's on all {} ranks",
        group.size()
    );
    Ok(())
}

/// p50, p99 and tokens/s of a run.
fn figures(times: &[Duration]) -> (Duration, Duration, f64) {
    let mut sorted = times.to_vec();
    sorted.sort();
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    let total: Duration = times.iter().sum();
    (
        at(0.5),
        at(0.99),
        times.len() as f64 / total.as_secs_f64().max(1e-9),
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
