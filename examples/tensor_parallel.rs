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
//! waiting in collectives and the wire the job took (`NUVEC_DISTRIBUTED_WIRE`).
//!
//! Flags: `-n RANKS`, `--tokens N` (default 16), `--layers L` (2), `--dims D` (128),
//! `--heads H` (8; a multiple of the ranks).

use std::time::{Duration, Instant};

use nuvec_core::distributed::{self, Group};
use nuvec_core::fast::{self, AttentionOptions};
use nuvec_core::{Array, random};
use nuvec_nn::sharded::{AllToShardedLinear, ShardedToAllLinear};
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
        return run(&group, config);
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
    let report = nuvec_fabric_sim::Sim::ring(config.ranks.max(1), 1)
        .seed(1)
        .run_ring(Duration::from_secs(120), |group| {
            run(&group, config).map_err(|e| e.to_string())
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

    /// The logits of the token after `tokens` (the whole sequence is recomputed: no cache).
    fn next_logits(&self, tokens: &[i32]) -> Array {
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
            h = h.add(b.o.forward(&a));
            let x = fast::rms_norm(&h, None, 1e-5);
            let up = b.up.forward(&x);
            h = h.add(b.down.forward(&up.multiply(up.sigmoid())));
        }
        let last = fast::rms_norm(&h, None, 1e-5).reshape([len, -1]);
        self.head.forward(&last.i(len - 1..len))
    }

    /// Greedy decoding of `n` tokens after the prompt, with each token's wall time.
    fn generate(&self, n: usize) -> Result<(Vec<i32>, Vec<Duration>)> {
        let mut tokens = PROMPT.to_vec();
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            let next = self.next_logits(&tokens).argmax(-1).item::<u32>()?;
            times.push(start.elapsed());
            tokens.push(i32::try_from(next)?);
        }
        Ok((tokens[PROMPT.len()..].to_vec(), times))
    }
}

/// One rank: decode over `group`, then (rank 0) decode in one process and compare.
fn run(group: &Group, config: Config) -> Result<()> {
    let model = Decoder::new(config, group)?;
    // One warm-up token: the first evaluation pays for allocations on every rank.
    model.generate(1)?;
    if config.tokens == 0 {
        return Err("--tokens must be at least 1".into());
    }
    let (tokens, times) = model.generate(config.tokens)?;
    // Every rank must have decoded the same tokens (they take the same all_sum bits).
    let mine = Array::from_slice(&tokens, [tokens.len()]);
    let all = distributed::all_gather(&mine, Some(group)).to_vec::<i32>()?;
    if let Some(q) = all.chunks(tokens.len()).position(|t| t != tokens) {
        return Err(format!("rank {q} decoded other tokens than rank {}", group.rank()).into());
    }
    // The time one token spends in its 2 × layers all_sums, from an all_sum of an activation's
    // size timed alone (the decoder's own collectives are evaluated lazily inside the graph).
    let per_token = collective_time(group, config)?;
    // The split model's last logits, on every rank (its all_sums need all of them).
    let mut sequence = PROMPT.to_vec();
    sequence.extend(&tokens);
    let split = model.next_logits(&sequence).to_vec::<f32>()?;
    if group.rank() != 0 {
        return Ok(());
    }
    let single = Decoder::new(config, &Group::single())?;
    let (expected, single_times) = single.generate(config.tokens)?;
    if expected != tokens {
        return Err(format!(
            "{} ranks decoded {tokens:?}, one process {expected:?}",
            group.size()
        )
        .into());
    }
    let wire = std::env::var("NUVEC_DISTRIBUTED_WIRE").unwrap_or_else(|_| "default".into());
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
    let whole = single.next_logits(&sequence).to_vec::<f32>()?;
    let gap = split
        .iter()
        .zip(&whole)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    if gap > 1e-3 {
        return Err(format!("the split logits differ from one process's by {gap}").into());
    }
    println!("tokens: {tokens:?}; logits within {gap:.1e} of one process's");
    println!(
        "per token: p50 {:.2} ms, p99 {:.2} ms; {rate:.1} tokens/s; collectives ~{:.0}% of a token",
        ms(p50),
        ms(p99),
        100.0 * per_token.as_secs_f64() / p50.as_secs_f64().max(1e-9)
    );
    println!("one process: p50 {:.2} ms; {srate:.1} tokens/s", ms(s50));
    println!(
        "tokens identical to the single-process model's on all {} ranks",
        group.size()
    );
    Ok(())
}

/// The median time of the all_sums one token does (2 per block, on `[1, len, dims]`).
fn collective_time(group: &Group, config: Config) -> Result<Duration> {
    let len = (PROMPT.len() + config.tokens) as i32;
    let x = random::normal(
        [1, len, config.dims],
        nuvec_core::DType::F32,
        0.0,
        1.0,
        None,
    );
    nuvec_core::eval(&x)?;
    let mut times = Vec::new();
    for _ in 0..9 {
        let start = Instant::now();
        for _ in 0..2 * config.layers {
            nuvec_core::eval(&distributed::all_sum(&x, Some(group)))?;
        }
        times.push(start.elapsed());
    }
    times.sort();
    Ok(times[times.len() / 2])
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
