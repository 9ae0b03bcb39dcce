//! Running a case and checking it: the inputs every rank gets, what MLX would compute and put
//! on the wire (through `common::mlx_model`), and the run over the simulator with its checks of
//! results, wire bytes, failures and deadlines.

use super::*;

// =============================================================================================
// Inputs
// =============================================================================================

/// `inputs[op][rank]`.
pub(super) fn inputs(case: &Case) -> Vec<Vec<Vec<u8>>> {
    // One seed in four is NaN/inf-heavy.
    let specials = if case.seed.is_multiple_of(4) {
        0.25
    } else {
        1.0 / 32.0
    };
    case.ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            (0..case.ranks)
                .map(|r| {
                    let mut rng = ChaCha8Rng::seed_from_u64(
                        case.seed
                            ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                            ^ (r as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
                    );
                    match *op {
                        Op::Reduce { dtype, n, .. } => typed_values(&mut rng, dtype, n, specials),
                        Op::Gather { n } | Op::SendRecv { n, .. } => {
                            let mut b = vec![0u8; n];
                            rng.fill_bytes(&mut b);
                            b
                        }
                    }
                })
                .collect()
        })
        .collect()
}

// =============================================================================================
// What MLX would do
// =============================================================================================

pub(super) fn neighbours(rank: usize, ranks: usize) -> (usize, usize) {
    ((rank + ranks - 1) % ranks, (rank + 1) % ranks)
}

/// `(dst, src)` of a send/recv op for `rank`.
pub(super) fn send_recv_peers(rank: usize, ranks: usize, leftward: bool) -> (usize, usize) {
    let (left, right) = neighbours(rank, ranks);
    if leftward {
        (left, right)
    } else {
        (right, left)
    }
}

pub(super) struct Expected {
    /// `results[op][rank]`.
    pub(super) results: Vec<Vec<Vec<u8>>>,
    pub(super) wire: Wire,
}

pub(super) fn expected(case: &Case, inputs: &[Vec<Vec<u8>>]) -> Result<Expected, String> {
    let mut wire = Wire::new();
    let mut results = Vec::new();
    for (i, op) in case.ops.iter().enumerate() {
        let label = format!("op {i} ({op})");
        let inp = &inputs[i];
        match *op {
            Op::Reduce { op: red, dtype, .. } => {
                let lockstep =
                    mlx_model::all_reduce_wire(&mut wire, &label, dtype, red, case.links, inp);
                let folded = mlx_model::fold(dtype, red, case.links, inp);
                for (r, got) in lockstep.iter().enumerate() {
                    if *got != folded {
                        return Err(format!(
                            "MODEL BUG: {label}: the lockstep run of rank {r} disagrees with the fold"
                        ));
                    }
                }
                results.push(vec![folded; case.ranks]);
            }
            Op::Gather { .. } => {
                let all = mlx_model::all_gather_wire(&mut wire, &label, case.links, inp);
                results.push(vec![all; case.ranks]);
            }
            Op::SendRecv { leftward, .. } => {
                let mut per_rank = Vec::new();
                for r in 0..case.ranks {
                    let (dst, src) = send_recv_peers(r, case.ranks, leftward);
                    mlx_model::send_wire(
                        &mut wire, &label, case.ranks, case.links, r, dst, &inp[r],
                    );
                    per_rank.push(inp[src].clone());
                }
                results.push(per_rank);
            }
        }
    }
    Ok(Expected { results, wire })
}

// =============================================================================================
// Running a case
// =============================================================================================

/// A fabric that remembers the virtual time at which its last step returned, and forwards
/// (see [`Fabric::forwards`]) only when `forward` says so.
pub(super) struct Clocked {
    pub(super) inner: SimFabric,
    pub(super) clock: Rc<Cell<Duration>>,
    pub(super) forward: bool,
}

impl Fabric for Clocked {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn kind(&self) -> ChannelKind {
        self.inner.kind()
    }
    fn links(&self, peer: usize) -> usize {
        self.inner.links(peer)
    }
    fn now(&self) -> Duration {
        self.inner.now()
    }
    fn forwards(&self) -> bool {
        self.forward && self.inner.forwards()
    }
    fn run(&mut self, step: &mut [Transfer<'_>], deadline: Duration) -> Result<(), FabricError> {
        let result = self.inner.run(step, deadline);
        // A rank keeps the turn from here until its next fabric call, so this is also the time
        // at which the operation returns.
        self.clock.set(self.inner.now());
        result
    }
}

/// One operation on one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct OpRun {
    pub(super) result: Result<Vec<u8>, Error>,
    /// Virtual time when the operation was called and when it returned.
    pub(super) t0: Duration,
    pub(super) t1: Duration,
    /// After a failure: the next operation's result, and the time it returned.
    pub(super) after: Option<(Result<(), Error>, Duration)>,
}

pub(super) fn rank_program(fabric: SimFabric, case: &Case, inputs: &[Vec<Vec<u8>>]) -> Vec<OpRun> {
    let (rank, ranks) = (fabric.rank(), fabric.size());
    let clock = Rc::new(Cell::new(fabric.now()));
    let comm = RingCommunicator::new(
        Clocked {
            inner: fabric,
            clock: Rc::clone(&clock),
            // Both schedules of an all-reduce: by phases with forwards, or a step per segment.
            forward: case.seed.is_multiple_of(2),
        },
        case.links,
        TIMEOUT,
    );
    let mut runs = Vec::new();
    for (i, op) in case.ops.iter().enumerate() {
        let input = &inputs[i][rank];
        let t0 = clock.get();
        let result = match *op {
            Op::Reduce { op, dtype, .. } => {
                let mut data = input.clone();
                comm.try_all_reduce(op, dtype, &mut data).map(|()| data)
            }
            Op::Gather { n } => {
                let mut out = vec![0u8; n * ranks];
                comm.try_all_gather(input, &mut out).map(|()| out)
            }
            Op::SendRecv { leftward, n } => {
                let (dst, src) = send_recv_peers(rank, ranks, leftward);
                let mut got = vec![0u8; n];
                if rank % 2 == 0 {
                    comm.try_send(dst, input)
                        .and_then(|()| comm.try_recv(src, &mut got))
                } else {
                    comm.try_recv(src, &mut got)
                        .and_then(|()| comm.try_send(dst, input))
                }
                .map(|()| got)
            }
        };
        let t1 = clock.get();
        let after = match &result {
            Err(e) if !e.leaves_group_usable() => {
                let r = comm.try_all_reduce(Reduction::Sum, DType::U8, &mut [0u8; 4]);
                Some((r, clock.get()))
            }
            _ => None,
        };
        let failed = result.is_err();
        runs.push(OpRun {
            result,
            t0,
            t1,
            after,
        });
        if failed {
            break;
        }
    }
    runs
}

/// Runs `f` on its own thread; a hang past [`WATCHDOG`] (wall clock) is an error.
pub(super) fn with_watchdog<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(WATCHDOG).map_err(|e| match e {
        std::sync::mpsc::RecvTimeoutError::Timeout => format!(
            "the simulated run did not finish within {WATCHDOG:?} of wall-clock time (a hang, or far too slow)"
        ),
        std::sync::mpsc::RecvTimeoutError::Disconnected => "the simulated run panicked".into(),
    })
}

pub(super) fn sim_of(case: &Case, fault: Option<Fault>) -> Sim {
    let mut sim = Sim::ring(case.ranks, case.links)
        .seed(case.seed)
        .max_fragment(case.frag)
        .window(case.window)
        .latency(
            Duration::from_nanos(case.latency_ns),
            Duration::from_nanos(case.jitter_ns),
        )
        .record_wire(true);
    if let Some(f) = fault {
        sim = sim.fault(f);
    }
    sim
}

pub(super) type Inputs = Arc<Vec<Vec<Vec<u8>>>>;

pub(super) fn simulate(
    case: &Case,
    fault: Option<Fault>,
    inputs: &Inputs,
) -> Result<Report<Vec<OpRun>>, String> {
    let sim = sim_of(case, fault);
    let case = case.clone();
    let inputs = Arc::clone(inputs);
    with_watchdog(move || sim.run(|fabric| rank_program(fabric, &case, &inputs)))
}

/// The simulator's fault for a spec, timed from the fault-free run's `end`.
pub(super) fn sim_fault(case: &Case, spec: &FaultSpec, end: Duration) -> Fault {
    let at = |permille: u64| end * permille as u32 / 1000;
    match *spec {
        FaultSpec::Crash { rank, call } => Fault::Crash { rank, call },
        FaultSpec::CrashAt { rank, permille } => Fault::CrashAt {
            rank,
            at: at(permille),
        },
        FaultSpec::Stall {
            rank,
            permille,
            secs,
        } => Fault::Stall {
            rank,
            at: at(permille),
            duration: Duration::from_secs(secs),
        },
        FaultSpec::Cut {
            rank,
            leftside,
            link,
            permille,
        } => Fault::Cut {
            rank,
            channel: if leftside {
                mlx_model::left(rank, case.ranks, case.links, link)
            } else {
                mlx_model::right(rank, case.ranks, link)
            },
            at: at(permille),
        },
    }
}

/// What a run produced, for determinism checks and verbose replays.
pub(super) struct Ran {
    pub(super) report: Report<Vec<OpRun>>,
    pub(super) fault: Option<Fault>,
}

pub(super) fn hexs(bytes: &[u8]) -> String {
    hex_upto(bytes, 24)
}

pub(super) fn hex_upto(bytes: &[u8], max: usize) -> String {
    let mut s = String::new();
    for b in bytes.iter().take(max) {
        let _ = write!(s, "{b:02x}");
    }
    if bytes.len() > max {
        let _ = write!(s, "… ({} bytes)", bytes.len());
    }
    s
}

/// Runs `case` (with its fault, timed from a fault-free run) and checks everything.
pub(super) fn run_case(case: &Case, verbose: bool) -> Result<Ran, String> {
    let inputs: Inputs = Arc::new(inputs(case));
    let want = expected(case, &inputs)?;
    let fault = match &case.fault {
        None => None,
        Some(spec) => {
            let clean = simulate(case, None, &inputs)?;
            Some(sim_fault(case, spec, clean.end))
        }
    };
    let report = simulate(case, fault.clone(), &inputs)?;
    if verbose {
        println!("case: {case}");
        println!("fault: {fault:?}");
        println!(
            "seed {} trace_hash {:016x} end {:?} streams {}",
            report.seed,
            report.trace_hash,
            report.end,
            report.wire.len()
        );
        for (i, op) in case.ops.iter().enumerate() {
            println!("op {i}: {op}");
            for (r, input) in inputs[i].iter().enumerate() {
                println!("  rank {r} input    {}", hex_upto(input, 2048));
                println!(
                    "  rank {r} expected {}",
                    hex_upto(&want.results[i][r], 2048)
                );
            }
        }
        for (r, o) in report.outcomes.iter().enumerate() {
            match o {
                Outcome::Returned(runs) => {
                    for (i, run) in runs.iter().enumerate() {
                        match &run.result {
                            Ok(v) => println!(
                                "rank {r} op {i}: ok {} [{:?} → {:?}]",
                                hexs(v),
                                run.t0,
                                run.t1
                            ),
                            Err(e) => println!(
                                "rank {r} op {i}: error [{:?} → {:?}]: {e}",
                                run.t0, run.t1
                            ),
                        }
                        if let Some((after, t)) = &run.after {
                            println!("rank {r} next op at {t:?}: {after:?}");
                        }
                    }
                }
                other => println!("rank {r}: {other:?}"),
            }
        }
        for ((r, ch), bytes) in &report.wire {
            let model = want.wire.get(&(*r, *ch)).map_or(0, |s| s.bytes.len());
            println!(
                "wire rank {r} on {ch}: {} bytes recorded, {model} in the model",
                bytes.len()
            );
        }
    }
    if report.seed != case.seed {
        return Err(format!(
            "{SEED_VAR} is set: the simulator used seed {} instead of the case's {}; unset it",
            report.seed, case.seed
        ));
    }
    check(case, &want, &report, fault.as_ref())?;
    Ok(Ran { report, fault })
}

pub(super) fn check(
    case: &Case,
    want: &Expected,
    report: &Report<Vec<OpRun>>,
    fault: Option<&Fault>,
) -> Result<(), String> {
    let crash_rank = match fault {
        Some(Fault::Crash { rank, .. } | Fault::CrashAt { rank, .. }) => Some(*rank),
        _ => None,
    };
    let stall_end = match fault {
        Some(Fault::Stall { rank, at, duration }) => Some((*rank, *at + *duration)),
        _ => None,
    };
    // Every rank's runs.
    let mut runs_of: Vec<Option<&Vec<OpRun>>> = Vec::new();
    for (r, o) in report.outcomes.iter().enumerate() {
        match o {
            Outcome::Returned(runs) => runs_of.push(Some(runs)),
            Outcome::Crashed if crash_rank == Some(r) => runs_of.push(None),
            Outcome::Crashed => return Err(format!("rank {r} crashed, but no fault crashes it")),
            Outcome::Panicked(msg) => return Err(format!("rank {r} panicked: {msg}")),
        }
    }
    for (r, runs) in runs_of.iter().enumerate() {
        let Some(runs) = runs else { continue };
        let (left, right) = neighbours(r, case.ranks);
        let failed = runs.iter().any(|x| x.result.is_err());
        if fault.is_none() && failed {
            let e = runs
                .iter()
                .find_map(|x| x.result.as_ref().err())
                .expect("an error");
            return Err(format!("rank {r} failed without a fault: {e}"));
        }
        if !failed && runs.len() != case.ops.len() {
            return Err(format!(
                "rank {r} ran {} of {} ops",
                runs.len(),
                case.ops.len()
            ));
        }
        for (i, run) in runs.iter().enumerate() {
            match &run.result {
                Ok(got) => {
                    let expect = &want.results[i][r];
                    if got != expect {
                        let at = got
                            .iter()
                            .zip(expect)
                            .position(|(a, b)| a != b)
                            .unwrap_or(0);
                        return Err(format!(
                            "rank {r} op {i} ({}): wrong result ({} bytes, expected {}); first difference at byte {at}: got {} expected {}",
                            case.ops[i],
                            got.len(),
                            expect.len(),
                            hexs(got.get(at..).unwrap_or(&[])),
                            hexs(expect.get(at..).unwrap_or(&[]))
                        ));
                    }
                    if fault.is_none() && run.t1.saturating_sub(run.t0) > TIMEOUT {
                        return Err(format!(
                            "rank {r} op {i} took {:?} of virtual time",
                            run.t1 - run.t0
                        ));
                    }
                }
                Err(e) => {
                    let Error::Transport { source, .. } = e else {
                        return Err(format!("rank {r} op {i}: not a transport error: {e}"));
                    };
                    let peer = source.channel.peer;
                    let text = e.to_string();
                    if (peer != left && peer != right) || !text.contains(&format!("rank {peer} ")) {
                        return Err(format!(
                            "rank {r} op {i}: the error does not name a neighbour ({left} or {right}): {text}"
                        ));
                    }
                    // Every communicator operation has its own deadline: a send/recv op is
                    // two of them, the second starting when the first ends.
                    let operations = match case.ops[i] {
                        Op::SendRecv { .. } => 2,
                        _ => 1,
                    };
                    let mut deadline = run.t0 + TIMEOUT * operations;
                    if let Error::Transport { waited, .. } = e
                        && *waited > TIMEOUT + SLACK
                        && stall_end.is_none_or(|(stalled, _)| stalled != r)
                    {
                        return Err(format!(
                            "rank {r} op {i}: the failing operation ran {waited:?}, past its timeout: {text}"
                        ));
                    }
                    if let Some((stalled, end)) = stall_end
                        && stalled == r
                    {
                        // A stalled rank does not run until its stall ends.
                        deadline = deadline.max(end);
                    }
                    if run.t1 > deadline + SLACK {
                        return Err(format!(
                            "rank {r} op {i} returned its error at {:?}, after its deadline {deadline:?}: {text}",
                            run.t1
                        ));
                    }
                    match &run.after {
                        Some((Err(Error::Failed { first, .. }), t))
                            if **first == *e && *t == run.t1 => {}
                        other => {
                            return Err(format!(
                                "rank {r}: after the failure of op {i} ({text}) the next op gave {other:?}, not Error::Failed at once with the first error"
                            ));
                        }
                    }
                }
            }
        }
    }
    // Ranks that completed an all-reduce hold the same bits.
    for (i, op) in case.ops.iter().enumerate() {
        if let Op::Reduce { .. } = op {
            let oks: Vec<(usize, &Vec<u8>)> = runs_of
                .iter()
                .enumerate()
                .filter_map(|(r, runs)| Some((r, runs.as_ref()?.get(i)?.result.as_ref().ok()?)))
                .collect();
            if let Some((r0, first)) = oks.first() {
                for (r, v) in &oks {
                    if v != first {
                        return Err(format!("op {i}: ranks {r0} and {r} hold different bits"));
                    }
                }
            }
        }
    }
    if let Some(d) = mlx_model::wire_difference(&report.wire, &want.wire, fault.is_some()) {
        return Err(format!("wire differs from MLX's: {d}"));
    }
    Ok(())
}

/// Runs a case as a property: a failure carries the seed and the replay command.
pub(super) fn property(case: &Case) -> Result<(), TestCaseError> {
    let t = std::time::Instant::now();
    let r = run_case(case, false);
    if std::env::var_os("NUVEC_SIM_TIMING").is_some() {
        eprintln!("timing: {:?} {case}", t.elapsed());
    }
    r.map(|_| ()).map_err(|e| failure(case, &e))
}

pub(super) fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Integration tests have no lib.rs for proptest's default location.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/sim_ring.txt",
        ))),
        max_shrink_iters: 64,
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    }
}
