//! MLX's ring over the simulator: results, wire bytes, faults and determinism, property-tested.
//!
//! Every case runs whole rings of `RingCommunicator`s over `nuvec-fabric-sim` and checks them
//! against `tests/common/mlx_model.rs`, an independent model of MLX's `ring.cpp` (its own
//! split arithmetic, element reductions and socket choice; nothing from `src/ring` or
//! `src/collective/reduce/`):
//!
//! - **results**: every rank's all-reduce equals the model's fold in MLX's association order,
//!   bit for bit (NaN bits included, with the NaN rules `src/collective/reduce/` documents), and all
//!   ranks are bitwise equal; all-gather is the rank-order concatenation; send/recv deliver
//!   exactly;
//! - **wire**: with `record_wire(true)`, every `(sender, sender's channel)` stream equals,
//!   byte for byte, what MLX's C++ would write on that socket direction (for sequences of ops,
//!   the concatenation);
//! - **faults** (a crash at a fabric call, a stall longer than the timeout, a cut link): every
//!   live rank either returns a correct result or an `Error::Transport` naming a neighbour
//!   ("rank N"), by its deadline (virtual time), and its next operation fails at once with
//!   `Error::Failed` carrying the first error; the bytes that did go out are a prefix of MLX's;
//! - **determinism**: the same case and seed give the same trace hash, end time, outcomes and
//!   wire; another seed gives another trace hash;
//! - **both schedules**: cases of even seeds run the all-reduce as the simulator allows, a
//!   step per phase whose forwards send each segment on as it lands (`Transfer::Forward`);
//!   odd seeds as over a fabric that does not forward, a step per segment. Both must give the
//!   same results and the same bytes on every wire.
//!
//! The simulator's fragment size (1 B..=64 KiB), window (64 B..=1 MiB), latency and jitter
//! (0..=50 µs each) are drawn per case from its seed, so fragmentation and cross-channel
//! reordering vary. Floors keep each run to at most ~2048 fragments and ~64 windows per rank's
//! buffer (the simulator switches threads per fragment), and threshold-sized runs use
//! fragments ≥ 4 KiB and windows ≥ 256 KiB.
//!
//! **Replay.** Every case has a one-line text form; a failing property prints it with a
//! command that reruns exactly that case with full output:
//!
//! ```text
//! NUVEC_SIM_CASE='ranks=4 links=2 seed=123 frag=17 window=4096 latency=5000 jitter=3000 ops=all_sum:float32:1000 fault=none' \
//!   cargo test --ignore-rust-version --test sim ring::replays_a_case_from_the_environment -- --nocapture
//! ```
//!
//! The text is `ranks= links= seed= frag= window= latency= jitter= ops= fault=`: `seed` seeds
//! both the simulator and the inputs; `ops` is a comma-separated list of
//! `all_sum|all_max|all_min:<dtype>:<elements>`, `all_gather:<bytes>` and
//! `send_recv:right|left:<bytes>`; `fault` is `none`, `crash:<rank>:<fabric call>`,
//! `crash_at:<rank>:<‰>`, `stall:<rank>:<‰>:<seconds>` or
//! `cut:<rank>:left|right:<link>:<‰>`, where ‰ is thousandths of the fault-free run's virtual
//! duration. (`NUVEC_SIM_SEED`, the simulator's own override, replaces every case's seed: do
//! not set it while running this file. `NUVEC_SIM_TIMING=1` prints each case's wall time.)
//!
//! **Case counts** (chosen so the file runs in well under a minute in debug on 2 cores):
//! small all-reduces 256, threshold-sized all-reduces and all-gathers 6, all-gathers 48,
//! send/recv 48, sequences 32, faults 40, determinism 12 (each run three times), model
//! self-checks 96, case-text round trips 64; plus fixed tests. About 20 s of test time on this
//! machine. Two tests are ignored, each naming its reason: an all-reduce of zero elements (an
//! open interop question) and `Fault::CrashAt` (the simulator hangs).
//!
//! Layout: `case.rs` (a case, its text form, its generators), `check.rs` (inputs, what MLX
//! would do, running and checking a case); here, the properties and the fixed tests.

use crate::common::mlx_model;
use crate::common::values;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::rc::Rc;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::fabric::{Channel, ChannelKind, Fabric, FabricError, Transfer};
use nuvec_distributed::reduce::Reduction;
use nuvec_distributed::{Error, RingCommunicator};
use nuvec_fabric_sim::{Fault, Outcome, Report, SEED_VAR, Sim, SimFabric};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence, TestCaseError};
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use mlx_model::{Lane, Wire};
use values::{DTYPES, OPS, typed_values};

/// The timeout of every operation.
const TIMEOUT: Duration = Duration::from_secs(30);
/// How late after its deadline (virtual time) a rank may return.
const SLACK: Duration = Duration::from_millis(1);
/// Wall-clock limit of one simulated run: a hang becomes a failure with a replay line.
const WATCHDOG: Duration = Duration::from_secs(120);

mod case;
mod check;

use case::*;
use check::*;

// =============================================================================================
// Properties
// =============================================================================================

proptest! {
    #![proptest_config(config(256))]
    /// Requirement 1 and 2 for small sizes: 1..=9 ranks, 1..=3 links, every dtype and op,
    /// E ∈ {0, 1, < R, = R, not a multiple of R, up to 3000}.
    #[test]
    fn every_rank_all_reduces_to_mlx_fold_and_the_wire_carries_mlx_bytes(case in small_reduce_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(6))]
    /// Sizes at MLX's split thresholds (R·256 KiB, 2·R·256 KiB, 2C·R·256 KiB for all-reduces;
    /// 256 KiB multiples for all-gathers), one element below, at and above; f32, u8, f64.
    #[test]
    fn threshold_sized_collectives_split_like_mlx(case in big_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(48))]
    #[test]
    fn all_gather_concatenates_in_rank_order_with_mlx_bytes(case in gather_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(48))]
    /// R = 2 covers both directions over one pair (rank 0 → 1 and 1 → 0 at once).
    #[test]
    fn neighbours_send_and_receive_exactly_with_mlx_bytes(case in send_recv_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(32))]
    #[test]
    fn sequences_of_operations_put_the_concatenation_on_the_wire(case in sequence_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(40))]
    /// Requirement 3 with `Fault::Crash` (at a fabric call), `Fault::Stall` (31–90 s, past the
    /// 30 s timeout) and `Fault::Cut`, at a time drawn within the fault-free run.
    #[test]
    fn a_crash_stall_or_cut_fails_every_live_rank_by_its_deadline(case in fault_case()) {
        property(&case)?;
    }
}

proptest! {
    #![proptest_config(config(12))]
    /// Requirement 4: the case is run twice with its seed and compared on trace hash, end time,
    /// every outcome (result bytes, error text, times) and every wire stream; then once with
    /// the next seed, which must give another trace hash.
    #[test]
    fn the_same_seed_gives_the_same_trace_and_outputs(case in prop_oneof![sequence_case(), fault_case()]) {
        let first = run_case(&case, false).map_err(|e| failure(&case, &e))?;
        let second = run_case(&case, false).map_err(|e| failure(&case, &e))?;
        let (a, b) = (&first.report, &second.report);
        prop_assert_eq!(first.fault, second.fault);
        if a.trace_hash != b.trace_hash || a.end != b.end || a.outcomes != b.outcomes || a.wire != b.wire {
            return Err(failure(&case, &format!(
                "two runs with seed {} differ: trace {:016x} vs {:016x}, end {:?} vs {:?}, outcomes equal: {}, wire equal: {}",
                case.seed, a.trace_hash, b.trace_hash, a.end, b.end, a.outcomes == b.outcomes, a.wire == b.wire
            )));
        }
        let mut other = case.clone();
        other.seed = case.seed.wrapping_add(1);
        let third = run_case(&other, false).map_err(|e| failure(&other, &e))?;
        prop_assert_ne!(third.report.trace_hash, a.trace_hash, "seeds {} and {} gave the same trace hash", case.seed, other.seed);
    }
}

proptest! {
    #![proptest_config(config(96))]
    /// The model checks itself: the lockstep run of MLX's loops ends, on every rank, with the
    /// fold in MLX's association order (for R up to 9 and every dtype and op, no simulator).
    #[test]
    fn the_model_lockstep_run_ends_with_the_fold(case in small_reduce_case()) {
        let inputs = inputs(&case);
        expected(&case, &inputs).map_err(|e| failure(&case, &e))?;
    }
}

proptest! {
    #![proptest_config(config(64))]
    #[test]
    fn the_case_text_round_trips(case in prop_oneof![small_reduce_case(), big_case(), sequence_case(), fault_case()]) {
        let text = case.to_string();
        prop_assert_eq!(text.parse::<Case>(), Ok(case));
    }
}

// =============================================================================================
// Fixed tests
// =============================================================================================

/// Runs the case in `NUVEC_SIM_CASE` (as printed by a failing property) with full output.
#[test]
fn replays_a_case_from_the_environment() {
    let Ok(text) = std::env::var("NUVEC_SIM_CASE") else {
        println!(
            "NUVEC_SIM_CASE is not set: nothing to replay (a failing property prints the command)"
        );
        return;
    };
    let case: Case = text
        .parse()
        .unwrap_or_else(|e| panic!("NUVEC_SIM_CASE: {e}"));
    if let Err(e) = run_case(&case, true) {
        panic!("{e}\n  case: {case}\n  {}", replay_line(&case));
    }
    println!("the case passes");
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Reference §2.6.4, worked examples A, B and C, against the model.
#[test]
fn the_model_reproduces_mlx_worked_examples() {
    // A: float32, N = 8 MiB, R = 4, C = 2: four sub-reduces of 2 MiB, even ones leftward.
    let a = mlx_model::reduce_plan(2_097_152, 4, 4, 2);
    assert_eq!(a.padded, None);
    let layout: Vec<_> = a
        .subs
        .iter()
        .map(|s| (s.start, s.len, s.direction, s.pair))
        .collect();
    assert_eq!(
        layout,
        [
            (0, 524_288, 1, 0),
            (524_288, 524_288, -1, 0),
            (1_048_576, 524_288, 1, 1),
            (1_572_864, 524_288, -1, 1)
        ]
    );
    // B: float32, E = 10, R = 4, C = 1: rank 0 sends 12, 12, 12, 4, 12, 12 bytes on left[0].
    let inputs: Vec<Vec<u8>> = (0..4).map(|r| f32s(&[r as f32; 10])).collect();
    let mut wire = Wire::new();
    mlx_model::all_reduce_wire(&mut wire, "B", DType::F32, Reduction::Sum, 1, &inputs);
    let rank0 = &wire[&(0, Channel::new(3, 0))];
    let sizes: Vec<usize> = rank0.spans.iter().map(|s| s.len).collect();
    assert_eq!(sizes, [12, 12, 12, 4, 12, 12]);
    assert_eq!(wire.len(), 4, "only left[0] of every rank carries bytes");
    // C: float32, E = 3, R = 4: padded, rightward on right[0], six steps of 4 bytes.
    let inputs: Vec<Vec<u8>> = (0..4).map(|r| f32s(&[r as f32; 3])).collect();
    let mut wire = Wire::new();
    mlx_model::all_reduce_wire(&mut wire, "C", DType::F32, Reduction::Sum, 2, &inputs);
    let rank0 = &wire[&(0, Channel::new(1, 0))];
    assert_eq!(
        rank0.spans.iter().map(|s| s.len).collect::<Vec<_>>(),
        [4; 6]
    );
    // R = 2: left[c] is link C + c.
    assert_eq!(mlx_model::left(0, 2, 3, 1), Channel::new(1, 4));
    assert_eq!(mlx_model::left(0, 4, 3, 1), Channel::new(3, 1));
}

/// The reference reduction keeps MLX's operand rules (reference §2.6.5, src/collective/reduce docs).
#[test]
fn the_reference_reduction_keeps_mlx_operand_rules() {
    let c = |lane: Lane, op: Reduction, l: &[u8], r: &[u8]| {
        let mut out = [0u8; 8];
        mlx_model::combine_element(lane, op, l, r, &mut out);
        out[..lane.size()].to_vec()
    };
    let f = |x: f32| x.to_le_bytes();
    let nan = f32::from_bits(0x7FC0_0001);
    // std::max keeps local unless local < received: a NaN on either side keeps local.
    assert_eq!(c(Lane::F32, Reduction::Max, &f(nan), &f(1.0)), f(nan));
    assert_eq!(c(Lane::F32, Reduction::Max, &f(1.0), &f(nan)), f(1.0));
    assert_eq!(c(Lane::F32, Reduction::Min, &f(nan), &f(1.0)), f(nan));
    assert_eq!(c(Lane::F32, Reduction::Min, &f(1.0), &f(nan)), f(1.0));
    assert_eq!(c(Lane::F32, Reduction::Max, &f(-0.0), &f(0.0)), f(-0.0));
    assert_eq!(c(Lane::F32, Reduction::Min, &f(0.0), &f(-0.0)), f(0.0));
    // float32 sums: received's NaN (quieted) wins, then local's.
    let sn = f32::from_bits(0x7F80_0001);
    assert_eq!(
        c(Lane::F32, Reduction::Sum, &f(nan), &f(sn)),
        0x7FC0_0001u32.to_le_bytes()
    );
    assert_eq!(
        c(Lane::F32, Reduction::Sum, &f(sn), &f(2.0)),
        0x7FC0_0001u32.to_le_bytes()
    );
    // Half types: NaN sums get MLX's patterns.
    let h = |x: u16| x.to_le_bytes();
    assert_eq!(
        c(Lane::Bf16, Reduction::Sum, &h(0xFFC1), &h(0x3F80)),
        h(0x7FC0)
    );
    // float16 NaN sums: the sign of received's NaN, else local's, else the default NaN's.
    assert_eq!(
        c(Lane::F16, Reduction::Sum, &h(0xFE01), &h(0x7E00)),
        h(0x7D00)
    );
    assert_eq!(
        c(Lane::F16, Reduction::Sum, &h(0xFE01), &h(0x3C00)),
        h(0xFD00)
    );
    assert_eq!(
        c(Lane::F16, Reduction::Sum, &h(0x3C00), &h(0x7E00)),
        h(0x7D00)
    );
    assert_eq!(
        c(Lane::F16, Reduction::Max, &h(0x8000), &h(0x0000)),
        h(0x8000)
    );
    // 1 + 2^-11 in f16 is a tie, rounded to even (1.0); bf16 1 + 2^-8 likewise.
    assert_eq!(
        c(Lane::F16, Reduction::Sum, &h(0x3C00), &h(0x1000)),
        h(0x3C00)
    );
    assert_eq!(
        c(Lane::Bf16, Reduction::Sum, &h(0x3F80), &h(0x3B80)),
        h(0x3F80)
    );
    // bool: sum and max are or, min is and; the result is 0 or 1.
    assert_eq!(c(Lane::Bool, Reduction::Sum, &[2], &[0]), [1]);
    assert_eq!(c(Lane::Bool, Reduction::Min, &[2], &[7]), [1]);
    assert_eq!(c(Lane::Bool, Reduction::Min, &[2], &[0]), [0]);
    // Integers wrap.
    assert_eq!(c(Lane::I8, Reduction::Sum, &[127], &[1]), [0x80]);
    // complex64: lexicographic.
    let z = |re: f32, im: f32| [re.to_le_bytes(), im.to_le_bytes()].concat();
    assert_eq!(
        c(Lane::C64, Reduction::Max, &z(1.0, 5.0), &z(1.0, 6.0)),
        z(1.0, 6.0)
    );
    assert_eq!(
        c(Lane::C64, Reduction::Max, &z(2.0, 0.0), &z(1.0, 9.0)),
        z(2.0, 0.0)
    );
    assert_eq!(
        c(Lane::C64, Reduction::Min, &z(1.0, 5.0), &z(1.0, 5.0)),
        z(1.0, 5.0)
    );
    // The fold puts the new rank's own value on the left: with max over ±0.0, d = +1, R = 3,
    // segment 0 is x1 ⊕ (x2 ⊕ x0); x2 = -0.0 is local against x0 = +0.0 and is kept, then
    // x1 = +0.0 is local against -0.0 and is kept: +0.0. The other association would give -0.0.
    let xs: [&[u8]; 3] = [&f(0.0), &f(0.0), &f(-0.0)];
    let mut out = [0u8; 4];
    mlx_model::fold_element(Lane::F32, Reduction::Max, &xs, 0, 1, &mut out);
    assert_eq!(out, f(0.0));
    let xs: [&[u8]; 3] = [&f(0.0), &f(-0.0), &f(0.0)];
    mlx_model::fold_element(Lane::F32, Reduction::Max, &xs, 0, 1, &mut out);
    assert_eq!(out, f(-0.0));
}

/// MLX's ring.cpp sends 2(R−1) zero elements on `right[0]` for an all-reduce of zero elements
/// (`size < size_` takes the small path); so must we (a mixed job with stock MLX hangs
/// otherwise).
#[test]
fn an_empty_all_reduce_puts_what_a_literal_mlx_puts_on_the_wire() {
    let case = case_with(
        3,
        1,
        7,
        ANY,
        vec![Op::Reduce {
            op: Reduction::Sum,
            dtype: DType::F32,
            n: 0,
        }],
    );
    let inputs: Inputs = Arc::new(inputs(&case));
    let plan = mlx_model::reduce_plan_literal(0, 4, 3, 1);
    let mut want = Wire::new();
    mlx_model::all_reduce_wire_with(
        &mut want,
        "empty",
        DType::F32,
        Reduction::Sum,
        1,
        &inputs[0],
        &plan,
    );
    let report = simulate(&case, None, &inputs).expect("run");
    if let Some(d) = mlx_model::wire_difference(&report.wire, &want, false) {
        panic!("{d}\n  {}", replay_line(&case));
    }
}

/// `Fault::CrashAt`: a rank crashed at a virtual time while blocked in the fabric.
///
/// A crashed rank's thread gets a last turn to learn of the crash, so `Sim::run` returns (it
/// once hung here; the watchdog would turn such a hang into a failure).
#[test]
fn a_crash_at_a_virtual_time_fails_every_live_rank_by_its_deadline() {
    for (ranks, seed) in [(4, 1u64), (2, 2), (5, 3)] {
        let mut case = case_with(
            ranks,
            1,
            seed,
            BIG,
            vec![Op::Reduce {
                op: Reduction::Sum,
                dtype: DType::F32,
                n: 100_000,
            }],
        );
        case.fault = Some(FaultSpec::CrashAt {
            rank: 1,
            permille: 300,
        });
        if let Err(e) = run_case(&case, false) {
            panic!("{e}\n  case: {case}\n  {}", replay_line(&case));
        }
    }
}
