//! The all_sum sweep of the whole job (pure): what the doctor measures after the links, so
//! that the one number a job cares about, how fast the ring reduces, is read beside the link
//! that bounds it.
//!
//! The sweep runs float32 all_sum over [`SIZES`] (4 KiB to 64 MiB) on the ring of this crate,
//! or for a JACCL job on JACCL's mesh or ring of this crate (over RDMA, or TCP cables with
//! `NUVEC_JACCL_FABRIC=tcp`), one rank per rank of the job (`sweep_rank.rs`). Rank 0 paces it ([`Pacer`]): per size one
//! warm-up, then up to [`TIMED`] timed iterations, while the whole sweep stays within its
//! budget (`--sweep-seconds`); an iteration is started only when the time it is predicted to
//! take (the median of its size so far, or the previous size's scaled by the bytes) still fits, so
//! the budget is overrun by at most one misjudged iteration, and the sizes left when it is
//! spent are skipped and named. An iteration's time is the slowest rank's; a size's is the
//! median of its iterations.
//!
//! busbw is nccl-tests' bus bandwidth, 2(R−1)/R × bytes / time ([`busbw`]): what each rank
//! puts on the wire in a ring all-reduce, per second, so that it reads against a link's
//! rate whatever the job's size. MLX's ring sends each half of the data the other way round
//! the ring, so on full-duplex links busbw may exceed the slowest one-way link direction; on
//! a 2-core machine it stays near it. [`Sweep::verdict`] compares the largest size's busbw
//! with the slowest link direction the doctor measured ([`slowest`]): the ring goes at its
//! slowest link's pace, so that direction is named. For a JACCL job the links measured are
//! its ranks' TCP connections to the coordinator, not its cables: over RDMA the comparison
//! says how far the cables outrun (or trail) that network; over TCP cables, which leave from
//! the addresses the ranks reach the coordinator from, it reads as for the ring. The cables
//! themselves are measured by the sweep's group before it sums ([`cables`]), and reported
//! here ([`Sweep::cables`]).
//!
//! The ranks report in one JSON line each (`{"swept": Swept}`, [`Swept`]); [`combine`] turns
//! them (or why a rank has none) into the report's [`Sweep`].

use serde::{Deserialize, Serialize};

use super::cables::{self, Cable};
use super::report::{Row, rate};

/// The sizes swept, in bytes: 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB.
pub(crate) const SIZES: [u64; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
/// Timed iterations per size, at most (after one warm-up).
pub(crate) const TIMED: usize = 5;

/// nccl-tests' bus bandwidth of an all-reduce of `bytes` over `ranks` ranks taking `seconds`,
/// in bits per second; `None` for no time or fewer than 2 ranks.
pub(crate) fn busbw(bytes: u64, ranks: usize, seconds: f64) -> Option<f64> {
    if ranks < 2 || seconds <= 0.0 || !seconds.is_finite() {
        return None;
    }
    let r = ranks as f64;
    Some(2.0 * (r - 1.0) / r * bytes as f64 * 8.0 / seconds)
}

/// `4 KiB`, `64 MiB`.
pub(crate) fn size_name(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// `310 µs`, `12.4 ms`, `1.02 s`.
fn duration_name(seconds: f64) -> String {
    if seconds < 1e-3 {
        format!("{:.0} µs", seconds * 1e6)
    } else if seconds < 1.0 {
        format!("{:.1} ms", seconds * 1e3)
    } else {
        format!("{seconds:.2} s")
    }
}

/// One iteration, as rank 0 decides it and every rank runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    /// The index of its size in [`SIZES`].
    pub(crate) size: usize,
    /// Timed, or the size's warm-up.
    pub(crate) timed: bool,
}

impl Step {
    /// The byte rank 0 sends every rank: 0 for the end, else the step.
    pub(crate) fn encode(step: Option<Step>) -> u8 {
        match step {
            None => 0,
            Some(s) => 1 + 2 * s.size as u8 + u8::from(s.timed),
        }
    }

    /// The step of a byte from [`Step::encode`]; `None` is the end (as is a byte out of range).
    pub(crate) fn decode(byte: u8) -> Option<Step> {
        let v = usize::from(byte.checked_sub(1)?);
        (v / 2 < SIZES.len()).then_some(Step {
            size: v / 2,
            timed: v % 2 == 1,
        })
    }
}

/// Rank 0's pacing of the sweep within its budget, fed the time since the sweep started and
/// each iteration's time.
#[derive(Clone, Debug)]
pub(crate) struct Pacer {
    budget: f64,
    size: usize,
    warmed: Option<f64>,
    times: Vec<f64>,
    /// Seconds per byte of the last size that ran.
    pace: Option<f64>,
}

impl Pacer {
    /// A sweep of at most `budget` seconds.
    pub(crate) fn new(budget: f64) -> Pacer {
        Pacer {
            budget,
            size: 0,
            warmed: None,
            times: Vec::new(),
            pace: None,
        }
    }

    /// How long an iteration of the current size is expected to take: the median of its
    /// iterations so far (one slow iteration on a shared machine does not end the sweep),
    /// else its warm-up, else the previous size's pace times its bytes.
    fn predicted(&self) -> f64 {
        if let Some(t) = median(self.times.clone()) {
            return t;
        }
        if let Some(t) = self.warmed {
            return t;
        }
        self.pace.map_or(0.0, |p| p * SIZES[self.size] as f64)
    }

    /// The next iteration at `elapsed` seconds into the sweep, or `None`: the sweep is over.
    pub(crate) fn next(&mut self, elapsed: f64) -> Option<Step> {
        while self.size < SIZES.len() {
            let p = self.predicted();
            if self.warmed.is_none() {
                // A warm-up only with room for a timed iteration after it; a larger size
                // would take longer still, so the sweep ends here.
                return (elapsed + 2.0 * p <= self.budget).then_some(Step {
                    size: self.size,
                    timed: false,
                });
            }
            if self.times.len() < TIMED && elapsed + p <= self.budget {
                return Some(Step {
                    size: self.size,
                    timed: true,
                });
            }
            if let Some(t) = median(self.times.clone()).or(self.warmed) {
                self.pace = Some(t / SIZES[self.size] as f64);
            }
            self.size += 1;
            self.warmed = None;
            self.times.clear();
        }
        None
    }

    /// Files the time of the iteration [`Pacer::next`] returned last: all it took, the
    /// rank's own work around the operation included, since that is spent from the budget too.
    pub(crate) fn record(&mut self, step: Step, seconds: f64) {
        if step.size != self.size {
            return;
        }
        if step.timed {
            self.times.push(seconds);
        } else {
            self.warmed = Some(seconds);
        }
    }
}

/// The median of `v` (`None` when empty).
pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// One size of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct SizeRow {
    /// Bytes per rank.
    pub(crate) bytes: u64,
    /// Timed iterations.
    pub(crate) iterations: usize,
    /// The median over the iterations of the slowest rank's time, seconds.
    pub(crate) seconds: f64,
    /// busbw, bits per second.
    pub(crate) busbw_bps: f64,
}

impl SizeRow {
    /// The row of `bytes` from the slowest rank's time of each iteration, for `ranks` ranks.
    pub(crate) fn of(bytes: u64, ranks: usize, times: &[f64]) -> Option<SizeRow> {
        let seconds = median(times.to_vec())?;
        Some(SizeRow {
            bytes,
            iterations: times.len(),
            seconds,
            busbw_bps: busbw(bytes, ranks, seconds)?,
        })
    }
}

/// What one rank of the sweep says when it is done (its JSON line, `{"swept": ...}`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Swept {
    /// The rank.
    pub(crate) rank: usize,
    /// The job's size.
    pub(crate) ranks: usize,
    /// The wire the ranks agreed on, when they connected.
    #[serde(default)]
    pub(crate) wire: Option<String>,
    /// Rank 0: every size measured (the other ranks: none).
    #[serde(default)]
    pub(crate) rows: Vec<SizeRow>,
    /// Rank 0: the sizes the budget left out, in bytes.
    #[serde(default)]
    pub(crate) skipped: Vec<u64>,
    /// A sum that was wrong on this rank, in words.
    #[serde(default)]
    pub(crate) wrong: Option<String>,
    /// Why the sweep stopped on this rank (the library's error).
    #[serde(default)]
    pub(crate) error: Option<String>,
    /// A JACCL job: the cables this rank measured (those to higher ranks).
    #[serde(default)]
    pub(crate) cables: Vec<Cable>,
}

/// The slowest direction of the links the doctor measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Slowest {
    /// The link (`2→3`, `0→1 #1`).
    pub(crate) link: String,
    /// `forward` (from the connecting rank) or `back`.
    pub(crate) direction: String,
    /// The rank the bytes left.
    pub(crate) from: usize,
    /// The rank they reached.
    pub(crate) to: usize,
    /// Bits per second.
    pub(crate) bps: f64,
}

/// The slowest direction of `rows` (forward: from the connecting rank; back: to it).
pub(crate) fn slowest(rows: &[Row]) -> Option<Slowest> {
    rows.iter()
        .flat_map(|row| {
            let (f, b) = row.rates();
            [
                f.map(|v| (row, "forward", row.from, row.to, v)),
                b.map(|v| (row, "back", row.to, row.from, v)),
            ]
        })
        .flatten()
        .filter(|(.., v)| *v > 0.0)
        .min_by(|a, b| a.4.total_cmp(&b.4))
        .map(|(row, direction, from, to, bps)| Slowest {
            link: row.name(),
            direction: direction.to_owned(),
            from,
            to,
            bps,
        })
}

/// The sweep in the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Sweep {
    /// The job's backend: `ring`, `jaccl` or `jaccl-ring` (empty: the ring).
    pub(crate) backend: String,
    /// The job's size.
    pub(crate) ranks: usize,
    /// The budget, seconds.
    pub(crate) budget_seconds: f64,
    /// The wire the ranks agreed on.
    pub(crate) wire: Option<String>,
    /// Each size measured (rank 0's report).
    pub(crate) rows: Vec<SizeRow>,
    /// The sizes the budget left out, bytes.
    pub(crate) skipped: Vec<u64>,
    /// The slowest link direction measured, which bounds the ring.
    pub(crate) slowest: Option<Slowest>,
    /// The largest size's busbw over the slowest direction's rate.
    pub(crate) of_slowest: Option<f64>,
    /// Why the sweep did not run (`--no-sweep` aside): a job of one rank, or probes that
    /// could not be started.
    pub(crate) not_run: Option<String>,
    /// What went wrong, per rank, in words: each is a problem.
    pub(crate) problems: Vec<String>,
    /// A JACCL job: its cables, measured one at a time before the sweep ([`cables`]), with
    /// their flags.
    pub(crate) cables: Vec<Row>,
    /// The median of the cables' directions, bits per second.
    pub(crate) cables_median_bps: Option<f64>,
}

/// The report's sweep from every rank's outcome (`Err`: why the doctor has no line from it),
/// with `links` measured before it.
/// `hosts` name the ranks' hosts, for the cables' findings.
pub(crate) fn combine(
    outcomes: Vec<Result<Swept, String>>,
    budget: f64,
    links: &[Row],
    hosts: &[String],
) -> Sweep {
    let mut sweep = Sweep {
        ranks: outcomes.len(),
        budget_seconds: budget,
        slowest: slowest(links),
        ..Sweep::default()
    };
    let mut measured: Vec<Cable> = Vec::new();
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Err(why) => sweep
                .problems
                .push(format!("the all_sum sweep on rank {rank}: {why}")),
            Ok(s) => {
                if let Some(e) = s.error {
                    sweep
                        .problems
                        .push(format!("the all_sum sweep on rank {rank}: {e}"));
                }
                if let Some(w) = s.wrong {
                    sweep.problems.push(format!(
                        "the all_sum sweep on rank {rank} got a wrong sum: {w}"
                    ));
                }
                measured.extend(s.cables);
                if rank == 0 {
                    sweep.wire = s.wire;
                    sweep.rows = s.rows;
                    sweep.skipped = s.skipped;
                }
            }
        }
    }
    measured.sort_by_key(|c| (c.from, c.to));
    sweep.cables = cables::rows(&measured, hosts);
    let (problems, median) = super::report::findings(&mut sweep.cables);
    sweep.problems.extend(problems);
    sweep.cables_median_bps = median;
    sweep.of_slowest = match (sweep.rows.last(), &sweep.slowest) {
        (Some(row), Some(s)) if s.bps > 0.0 => Some(row.busbw_bps / s.bps),
        _ => None,
    };
    sweep
}

impl Sweep {
    /// The sweep's last word: the largest size's busbw against the slowest link direction,
    /// `all_sum 64 MiB: 790 Mbit/s busbw, 84 % of the slowest link direction (2→3 back: rank 3
    /// → rank 2, 940 Mbit/s)`; `None` when no size was measured.
    pub(crate) fn verdict(&self) -> Option<String> {
        let row = self.rows.last()?;
        let head = format!(
            "all_sum {}: {} busbw",
            size_name(row.bytes),
            rate(row.busbw_bps)
        );
        Some(match (&self.slowest, self.of_slowest) {
            (Some(s), Some(f)) => {
                format!(
                    "{head}, {:.0} % of the slowest link direction ({} {}: rank {} → rank {}, \
                     {})",
                    f * 100.0,
                    s.link,
                    s.direction,
                    s.from,
                    s.to,
                    rate(s.bps)
                )
            }
            _ => format!("{head} (no link measured to compare with)"),
        })
    }

    /// The lines for people: a header, a row per size, the sizes skipped, the verdict.
    pub(crate) fn lines(&self) -> Vec<String> {
        if let Some(why) = &self.not_run {
            return vec![format!("all_sum sweep: not run ({why})")];
        }
        let on = if matches!(self.backend.as_str(), "" | "ring") {
            " on the ring"
        } else {
            ""
        };
        let wire = self
            .wire
            .as_deref()
            .map_or(String::new(), |w| format!(", {w}"));
        let mut out = Vec::new();
        if !self.cables.is_empty() {
            out.push(format!(
                "JACCL's cables, one at a time through the sweep's group ({} round trips of 8 \
                 bytes; {} each way, the fastest of {}):",
                cables::PINGS,
                size_name(cables::BYTES as u64),
                cables::TRANSFERS
            ));
            out.extend(cables::table(&self.cables).iter().map(|l| format!("  {l}")));
        }
        out.push(format!(
            "all_sum sweep (float32, {} ranks{on}{wire}; the slowest rank's time, median of up \
             to {TIMED} after a warm-up; {} s at most):",
            self.ranks, self.budget_seconds
        ));
        let mut cells = vec![[
            "size".to_owned(),
            "iterations".to_owned(),
            "time".to_owned(),
            "busbw".to_owned(),
        ]];
        for r in &self.rows {
            cells.push([
                size_name(r.bytes),
                r.iterations.to_string(),
                duration_name(r.seconds),
                rate(r.busbw_bps),
            ]);
        }
        if !self.rows.is_empty() {
            out.extend(
                crate::table::aligned(&cells)
                    .iter()
                    .map(|l| format!("  {l}")),
            );
        }
        if !self.skipped.is_empty() {
            let names: Vec<String> = self.skipped.iter().map(|b| size_name(*b)).collect();
            out.push(format!(
                "  skipped: {} (the budget of {} s was spent; --sweep-seconds)",
                names.join(", "),
                self.budget_seconds
            ));
        }
        if let Some(v) = self.verdict() {
            out.push(v);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::measure::{Measurement, Transfer};

    fn link(from: usize, to: usize, connection: usize, fwd_mbit: f64, back_mbit: f64) -> Row {
        let t = |mbit: f64| Transfer {
            bytes: (mbit * 1e6 / 8.0) as u64,
            seconds: 1.0,
        };
        Row {
            from,
            to,
            connection,
            measurement: Some(Measurement {
                forward: Some(t(fwd_mbit)),
                back: Some(t(back_mbit)),
                ..Measurement::default()
            }),
            ..Row::default()
        }
    }

    #[test]
    fn busbw_is_two_r_minus_one_over_r_of_the_bytes_per_second_as_in_nccl_tests() {
        // 4 ranks, 64 MiB in 1 s: 1.5 × 64 MiB × 8 bits.
        let v = busbw(64 << 20, 4, 1.0).expect("a rate");
        assert!((v - 1.5 * 67_108_864.0 * 8.0).abs() < 1e-3, "{v}");
        // 2 ranks: the bytes themselves.
        assert_eq!(busbw(1000, 2, 0.5), Some(16_000.0));
        assert_eq!(busbw(1000, 1, 1.0), None);
        assert_eq!(busbw(1000, 4, 0.0), None);
        assert_eq!(busbw(1000, 4, f64::NAN), None);
    }

    #[test]
    fn sizes_are_named_in_kib_and_mib() {
        let names: Vec<String> = SIZES.iter().map(|b| size_name(*b)).collect();
        assert_eq!(names, ["4 KiB", "64 KiB", "1 MiB", "16 MiB", "64 MiB"]);
        assert_eq!(size_name(1000), "1000 B");
        assert_eq!(duration_name(310e-6), "310 µs");
        assert_eq!(duration_name(0.0124), "12.4 ms");
        assert_eq!(duration_name(1.024), "1.02 s");
    }

    #[test]
    fn every_step_survives_the_byte_rank_0_sends() {
        assert_eq!(Step::decode(Step::encode(None)), None);
        for size in 0..SIZES.len() {
            for timed in [false, true] {
                let s = Some(Step { size, timed });
                assert_eq!(Step::decode(Step::encode(s)), s);
            }
        }
        assert_eq!(Step::decode(255), None);
    }

    /// Runs a pacer whose iterations take `time(size)` seconds; returns the timed iterations
    /// per size and the seconds spent.
    fn pace(budget: f64, time: impl Fn(u64) -> f64) -> (Vec<usize>, f64) {
        let mut p = Pacer::new(budget);
        let mut clock = 0.0;
        let mut timed = vec![0; SIZES.len()];
        while let Some(step) = p.next(clock) {
            let t = time(SIZES[step.size]);
            clock += t;
            p.record(step, t);
            if step.timed {
                timed[step.size] += 1;
            }
        }
        (timed, clock)
    }

    #[test]
    fn a_fast_ring_runs_every_size_to_its_full_count() {
        // 1 Gbit/s and 100 µs per operation: about 0.9 s per 64 MiB.
        let (timed, spent) = pace(10.0, |b| 1e-4 + b as f64 * 8.0 / 1e9 * 1.5);
        assert_eq!(timed, [TIMED; 5]);
        assert!(spent < 10.0, "{spent}");
    }

    #[test]
    fn a_spent_budget_skips_the_larger_sizes_and_overruns_by_no_whole_iteration() {
        // 100 Mbit/s: 64 MiB takes 8 s an iteration, 16 MiB 2 s.
        let (timed, spent) = pace(3.0, |b| 1e-4 + b as f64 * 8.0 / 1e8 * 1.5);
        assert_eq!(&timed[..3], [TIMED; 3]);
        assert_eq!(timed[3..], [0, 0], "{timed:?}");
        assert!(spent <= 3.0, "{spent}");
        // A size measured at least once, when its iterations fit only partly.
        let (timed, spent) = pace(6.0, |b| 1e-4 + b as f64 * 8.0 / 1e8 * 1.5);
        assert_eq!(timed[3], 1, "{timed:?}");
        assert!(spent <= 6.0, "{spent}");
    }

    #[test]
    fn a_size_row_takes_the_median_of_its_iterations() {
        let r = SizeRow::of(1 << 20, 2, &[0.3, 0.1, 0.2]).expect("a row");
        assert_eq!((r.iterations, r.seconds), (3, 0.2));
        assert!((r.busbw_bps - 8.0 * 1_048_576.0 / 0.2).abs() < 1e-6);
        assert_eq!(SizeRow::of(1 << 20, 2, &[]), None);
    }

    #[test]
    fn the_slowest_direction_is_named_with_the_ranks_the_bytes_go_between() {
        let rows = [
            link(0, 1, 0, 940.0, 935.0),
            link(1, 2, 0, 930.0, 941.0),
            link(2, 3, 0, 938.0, 94.0),
            link(3, 0, 0, 940.0, 940.0),
        ];
        let s = slowest(&rows).expect("a direction");
        assert_eq!(
            (s.link.as_str(), s.direction.as_str(), s.from, s.to),
            ("2→3", "back", 3, 2)
        );
        assert!((s.bps - 94e6).abs() < 1.0);
        assert_eq!(slowest(&[]), None);
    }

    #[test]
    fn the_verdict_compares_the_largest_size_with_the_slowest_link() {
        let rows = [link(0, 1, 0, 960.0, 950.0), link(1, 0, 0, 955.0, 970.0)];
        let line = |bytes: u64, mbit: f64| {
            serde_json::json!({"swept": {
                "rank": 0, "ranks": 2, "wire": "the nuvec wire",
                "rows": [{"bytes": bytes, "iterations": 5, "seconds": 0.5,
                          "busbw_bps": mbit * 1e6}],
                "skipped": [67108864u64]
            }})
            .to_string()
        };
        // The lines as the doctor reads them.
        let parse = |text: &str| -> Swept {
            let v: serde_json::Value = serde_json::from_str(text).expect("JSON");
            serde_json::from_value(v["swept"].clone()).expect("a swept line")
        };
        let rank1 = parse(r#"{"swept": {"rank": 1, "ranks": 2}}"#);
        let sweep = combine(
            vec![Ok(parse(&line(16 << 20, 836.0))), Ok(rank1)],
            2.0,
            &rows,
            &[],
        );
        assert!(sweep.problems.is_empty(), "{:?}", sweep.problems);
        assert_eq!(
            sweep.verdict().as_deref(),
            Some(
                "all_sum 16 MiB: 836 Mbit/s busbw, 88 % of the slowest link direction \
                 (0→1 back: rank 1 → rank 0, 950 Mbit/s)"
            )
        );
        let lines = sweep.lines();
        assert!(
            lines[0].starts_with("all_sum sweep (float32, 2 ranks on the ring, the nuvec wire;")
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>()[..2],
            ["size", "iterations"]
        );
        assert!(
            lines[2].starts_with("  16 MiB  5") && lines[2].ends_with("500.0 ms  836 Mbit/s"),
            "{lines:#?}"
        );
        assert!(lines[3].starts_with("  skipped: 64 MiB (the budget of 2 s was spent"));
        assert_eq!(lines.len(), 5);
    }

    #[test]
    fn a_ring_that_cannot_connect_is_a_problem_per_rank_with_the_librarys_words() {
        let failed = Swept {
            rank: 1,
            ranks: 2,
            error: Some("rank 1 could not connect to rank 0 at 10.0.0.1:32325".into()),
            ..Swept::default()
        };
        let sweep = combine(
            vec![Err("no answer from the probe in time".into()), Ok(failed)],
            10.0,
            &[],
            &[],
        );
        assert_eq!(
            sweep.problems,
            [
                "the all_sum sweep on rank 0: no answer from the probe in time",
                "the all_sum sweep on rank 1: rank 1 could not connect to rank 0 at 10.0.0.1:32325"
            ]
        );
        assert_eq!(sweep.verdict(), None);
        assert_eq!(sweep.lines().len(), 1);
    }
}
