//! The flight recorder's files, read back: every rank's `rank-R.jsonl` merged into one table
//! and a diagnosis (`nuvec-launch diagnose DIR`, the failure summary, the hang report).
//!
//! The files are the contract between the ranks and the launcher (a rank writes them when
//! its group fails, when the launcher asks by writing `request`, and as it exits); their
//! format, by line:
//!
//! - a header, `{"record":1,"rank":R,"size":N,"host":..,"pid":..,"reason":"failure"|"request"|"exit",
//!   "request":ID|null,"at_us":T,"capacity":C,"dropped":D}`;
//! - then one line per operation, oldest first: `{"group","group_rank","group_size","seq",
//!   "op","dtype","bytes","peers","start_us","end_us","state","waiting_on","moved","error"}`,
//!   `state` one of `running`, `done`, `failed`, `end_us` null while running, `dtype` null
//!   for an operation without one (all_gather, send, recv, split).
//!
//! and `rank-R.progress`, `{"rank":R,"completed":C,"last_end_us":T}`, which the hang report
//! watches. Unknown fields are ignored (a newer rank may add some); a missing one is an error
//! naming the file and line. Everything is drawn from the files alone, so it works the same
//! for jobs launched by `mlx.launch`.
//!
//! What the diagnosis says ([`diagnose`]), where the records allow it:
//! - ranks in different operations at the same sequence number of a group ("rank 1 is in
//!   all_gather #3, ranks 0, 2, 3 in all_sum #3"), or in the same one with different types or
//!   sizes;
//! - a rank behind the others ("rank 2 is at all_sum #5, the others at #6: rank 2 has not
//!   joined all_sum #6");
//! - a rank that is gone: no file, or (known to the launcher only) its process has exited;
//! - a rank that was not running: it stayed in one operation longer than the others waited
//!   before they timed out (a stopped or stalled process, a host asleep), see [`not_running`];
//! - the first failure by time: the earliest `end_us` of a failed operation, with its error;
//!   but when that error is a consequence (a closed connection, a timeout) it is not the cause:
//!   the cause is then a rank that was not running; else a rank the consequences name that
//!   recorded no error of its own (a killed rank writes no record, one whose panic ended its
//!   program one without an error), with how it ended when the launcher saw it; else the
//!   rank the blame leads to among failures at the same time ([`follow_blame`]): two ranks
//!   blaming each other are the two ends of a link (a cut cable), and a longer cycle of ranks
//!   each timing out on the next is said to be untold rather than guessed; where the programs
//!   disagree at a step, the first failure is called that disagreement's consequence;
//! - ranks that returned from a step where the programs disagree (on MLX's wire, which
//!   carries no call to check): what they returned is wrong.
//!
//! The fault campaign of the simulator checks these against thousands of seeded crashes,
//! stalls and cuts (`tests/sim/campaign.rs`).
//!
//! Times: a running operation's wait is counted up to its record's `at_us` (when the rank
//! wrote it), not to the moment the diagnosis is read, so that a record read hours later
//! still says how long the rank had waited.
//!
//! Parsing and the diagnosis are pure (text in, table out) and unit-tested against files
//! written by hand to the contract; [`read_dir`] is the one function that reads the disk.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::failure::{self, ranks_text};

/// A record's header line.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub(crate) struct Header {
    /// The format's version (1).
    pub(crate) record: u32,
    /// The rank in the job's world group.
    pub(crate) rank: usize,
    /// The world group's size.
    pub(crate) size: usize,
    /// The host it ran on.
    pub(crate) host: String,
    /// Its process id.
    pub(crate) pid: u32,
    /// `failure` or `request`.
    pub(crate) reason: String,
    /// The request id it answered, for a `request` dump.
    pub(crate) request: Option<u64>,
    /// When it wrote the record, unix time in µs.
    pub(crate) at_us: u64,
    /// How many operations its ring buffer holds.
    pub(crate) capacity: usize,
    /// How many older operations the buffer no longer held.
    pub(crate) dropped: u64,
}

/// One operation of a record.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub(crate) struct Op {
    /// `world` or a sub-group's id.
    pub(crate) group: String,
    /// The rank within the group.
    pub(crate) group_rank: usize,
    /// The group's size.
    pub(crate) group_size: usize,
    /// The operation's sequence number in the group (per peer for send and recv).
    pub(crate) seq: u64,
    /// `all_sum`, `all_max`, `all_min`, `all_gather`, `send`, `recv`, `split`.
    pub(crate) op: String,
    /// MLX's name of the element type; `None` (null) for an operation without one
    /// (all_gather, send, recv, split).
    pub(crate) dtype: Option<String>,
    /// Bytes per rank.
    pub(crate) bytes: u64,
    /// The group ranks it exchanges with.
    pub(crate) peers: Vec<usize>,
    /// When it started, unix µs.
    pub(crate) start_us: u64,
    /// When it ended, unix µs; `None` while running.
    pub(crate) end_us: Option<u64>,
    /// `running`, `done` or `failed`.
    pub(crate) state: String,
    /// While running, the peers of the step it waits in.
    pub(crate) waiting_on: Vec<usize>,
    /// Bytes moved per peer, `[peer, bytes]`.
    pub(crate) moved: Vec<(usize, u64)>,
    /// The error, when failed.
    pub(crate) error: Option<String>,
}

impl Op {
    /// Whether it is a collective (numbered per group, not per peer).
    fn collective(&self) -> bool {
        self.op != "send" && self.op != "recv"
    }
}

/// A rank's record: its header and operations, oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// The header.
    pub(crate) header: Header,
    /// The operations.
    pub(crate) ops: Vec<Op>,
}

/// A rank's `rank-R.progress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub(crate) struct Progress {
    /// The rank.
    pub(crate) rank: usize,
    /// Operations completed so far.
    pub(crate) completed: u64,
    /// When the last one ended, unix µs (0 if none).
    pub(crate) last_end_us: u64,
}

/// Parses a record's text; `file` names it in errors.
///
/// # Errors
///
/// The file, the line and serde's message for a line that is not the contract's (an empty
/// file, a header or an operation with a missing or mistyped field).
pub(crate) fn parse(text: &str, file: &str) -> Result<Record, String> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, first) = lines
        .next()
        .ok_or_else(|| format!("{file}: empty, no header line"))?;
    let header: Header =
        serde_json::from_str(first).map_err(|e| format!("{file}: line 1 (the header): {e}"))?;
    let ops = lines
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("{file}: line {}: {e}", i + 1)))
        .collect::<Result<Vec<Op>, String>>()?;
    Ok(Record { header, ops })
}

/// Parses a `rank-R.progress` file's text.
pub(crate) fn parse_progress(text: &str) -> Option<Progress> {
    serde_json::from_str(text.trim()).ok()
}

/// Reads every `rank-R.jsonl` in `dir`: the records, and the problems met (a file that
/// cannot be read or parsed), in rank order.
///
/// # Errors
///
/// The directory and the system's message when it cannot be listed.
pub(crate) fn read_dir(dir: &Path) -> Result<(Vec<Record>, Vec<String>), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rank-") && n.ends_with(".jsonl"))
        .collect();
    names.sort_by_key(|n| rank_of(n).unwrap_or(usize::MAX));
    let mut records = Vec::new();
    let mut problems = Vec::new();
    for name in names {
        let path = dir.join(&name);
        match std::fs::read_to_string(&path) {
            Ok(text) => match parse(&text, &name) {
                Ok(r) => records.push(r),
                Err(e) => problems.push(e),
            },
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    Ok((records, problems))
}

/// The rank a `rank-R.jsonl` or `rank-R.progress` file name is for.
pub(crate) fn rank_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("rank-")?;
    let digits = rest.split('.').next()?;
    digits.parse().ok()
}

/// One row of the table: a rank and the operation it is in, or last did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Row {
    /// The rank.
    pub(crate) rank: usize,
    /// Its host.
    pub(crate) host: String,
    /// Why it wrote its record (`failure`, `request`, `exit`).
    pub(crate) reason: String,
    /// The operation, when it had done any.
    pub(crate) op: Option<Op>,
    /// How long it waited in it, µs: up to the record's time when running, else its
    /// duration.
    pub(crate) waited_us: Option<u64>,
}

/// The merged records: a row per rank and what can be concluded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Diagnosis {
    /// The job's size (the largest the records or the launcher know).
    pub(crate) size: usize,
    /// A row per rank that has a record, in rank order.
    pub(crate) rows: Vec<Row>,
    /// Ranks without a record.
    pub(crate) missing: Vec<usize>,
    /// The conclusions, most telling first.
    pub(crate) findings: Vec<String>,
    /// Files that could not be read.
    pub(crate) problems: Vec<String>,
    /// Whether the ranks' programs disagree at some step: different operations, types or
    /// sizes at one sequence number of a group.
    #[serde(skip)]
    pub(crate) disagree: bool,
}

/// The operation a rank is in (its newest running one) or, when none runs, its last.
fn current(record: &Record) -> Option<&Op> {
    record
        .ops
        .iter()
        .rev()
        .find(|o| o.state == "running")
        .or_else(|| record.ops.last())
}

/// "all_sum #3", with the group when it is not the world.
fn op_name(op: &Op) -> String {
    if op.group == "world" {
        format!("{} #{}", op.op, op.seq)
    } else {
        format!("{} #{} of group {}", op.op, op.seq, op.group)
    }
}

/// A duration in µs, readably.
fn duration(us: u64) -> String {
    if us >= 1_000_000 {
        format!("{:.1} s", us as f64 / 1e6)
    } else if us >= 1_000 {
        format!("{:.1} ms", us as f64 / 1e3)
    } else {
        format!("{us} µs")
    }
}

/// Merges `records` (any order) into the table and the diagnosis. `size` is the job's size
/// when the caller knows it (the launcher), `gone` the ranks whose process is known to have
/// exited, `ended` how the ranks known to have failed on their own ended (`exit code 101`,
/// for the first failure's finding), `problems` the files that could not be read.
pub(crate) fn diagnose(
    records: &[Record],
    size: Option<usize>,
    gone: &[usize],
    ended: &[(usize, String)],
    problems: Vec<String>,
) -> Diagnosis {
    let mut by_rank: BTreeMap<usize, &Record> = BTreeMap::new();
    for r in records {
        by_rank.insert(r.header.rank, r);
    }
    let size = records
        .iter()
        .map(|r| r.header.size)
        .chain(size)
        .chain(by_rank.keys().map(|r| r + 1))
        .max()
        .unwrap_or(0);
    let rows: Vec<Row> = by_rank
        .values()
        .map(|r| {
            let op = current(r).cloned();
            let waited_us = op.as_ref().map(|o| {
                o.end_us
                    .unwrap_or(r.header.at_us)
                    .saturating_sub(o.start_us)
            });
            Row {
                rank: r.header.rank,
                host: r.header.host.clone(),
                reason: r.header.reason.clone(),
                op,
                waited_us,
            }
        })
        .collect();
    let missing: Vec<usize> = (0..size).filter(|r| !by_rank.contains_key(r)).collect();
    let mut findings = Vec::new();
    let disagree = mismatches(&collectives(&by_rank), &mut findings);
    behind(&rows, &mut findings);
    for &r in gone {
        findings.push(format!("rank {r} is gone: its process has exited"));
    }
    for &r in missing.iter().filter(|r| !gone.contains(r)) {
        findings.push(format!(
            "rank {r} left no record (no rank-{r}.jsonl): it is gone, stuck before it could \
             answer, or does not record"
        ));
    }
    let late = not_running(records);
    for l in &late {
        findings.push(format!(
            "rank {} was not running: its {} lasted {}, where the others timed out after {} \
             (its process stopped or stalled, or its host slept)",
            l.rank,
            op_name(l.op),
            duration(l.lasted_us),
            duration(l.timeout_us)
        ));
    }
    let disagree = disagree.first().map(|&(group, seq)| {
        if group == "world" {
            format!("#{seq}")
        } else {
            format!("#{seq} of group {group}")
        }
    });
    if let Some(f) = first_failure(records, ended, &late, disagree.as_deref()) {
        findings.push(f);
    }
    Diagnosis {
        size,
        rows,
        missing,
        findings,
        problems,
        disagree: disagree.is_some(),
    }
}

/// The ranks of one operation by element type and size.
type Shapes = BTreeMap<(Option<String>, u64), Vec<usize>>;

/// The collectives every rank recorded, with its rank: all of them, not only the one it is
/// in, so that ranks that went on (on MLX's wire a mismatched collective can return wrong
/// numbers without an error) still meet the others at the step where they parted.
///
/// A sub-group is named by the order in which each process made it (`group-1`, ...), so
/// disjoint groups (a split into {0, 1} and {2, 3}) can share a name: a sub-group's name under
/// which two ranks claim the same group rank is left out rather than compared across groups
/// (`world`, every process's first group, is the job's).
fn collectives<'a>(records: &BTreeMap<usize, &'a Record>) -> Vec<(usize, &'a Op)> {
    let all: Vec<(usize, &Op)> = records
        .iter()
        .flat_map(|(&rank, r)| {
            r.ops
                .iter()
                .filter(|o| o.collective())
                .map(move |o| (rank, o))
        })
        .collect();
    let mut members: BTreeMap<&str, BTreeMap<usize, BTreeSet<usize>>> = BTreeMap::new();
    for &(rank, op) in &all {
        members
            .entry(op.group.as_str())
            .or_default()
            .entry(op.group_rank)
            .or_default()
            .insert(rank);
    }
    let shared: BTreeSet<&str> = members
        .iter()
        .filter(|&(&name, by_rank)| {
            name != "world" && by_rank.values().any(|ranks| ranks.len() > 1)
        })
        .map(|(&name, _)| name)
        .collect();
    all.into_iter()
        .filter(|(_, op)| !shared.contains(op.group.as_str()))
        .collect()
}

/// Ranks in different operations (or types, or sizes) at the same sequence number of a
/// group; returns those steps (group, sequence number), earliest first.
fn mismatches<'a>(ops: &[(usize, &'a Op)], findings: &mut Vec<String>) -> Vec<(&'a str, u64)> {
    let mut steps = Vec::new();
    let mut at: BTreeMap<(&str, u64), BTreeMap<String, Vec<usize>>> = BTreeMap::new();
    for &(rank, op) in ops {
        at.entry((op.group.as_str(), op.seq))
            .or_default()
            .entry(op.op.clone())
            .or_default()
            .push(rank);
    }
    for ((group, seq), ops) in &at {
        if ops.len() > 1 {
            let mut parts: Vec<(&String, &Vec<usize>)> = ops.iter().collect();
            parts.sort_by_key(|(name, ranks)| (ranks.len(), (*name).clone()));
            let text: Vec<String> = parts
                .iter()
                .enumerate()
                .map(|(i, (name, ranks))| {
                    let verb = match (i, ranks.len()) {
                        (0, 1) => " is",
                        (0, _) => " are",
                        _ => "",
                    };
                    format!("{}{verb} in {name} #{seq}", ranks_text(ranks))
                })
                .collect();
            steps.push((*group, *seq));
            let group = if *group == "world" {
                String::new()
            } else {
                format!(" (group {group})")
            };
            findings.push(format!(
                "different operations at the same step{group}: {}",
                text.join(", ")
            ));
        }
    }
    // The same operation with different element types or sizes.
    let mut kinds: BTreeMap<(&str, u64, &str), Shapes> = BTreeMap::new();
    for &(rank, op) in ops {
        kinds
            .entry((op.group.as_str(), op.seq, op.op.as_str()))
            .or_default()
            .entry((op.dtype.clone(), op.bytes))
            .or_default()
            .push(rank);
    }
    for ((group, seq, name), shapes) in &kinds {
        if shapes.len() > 1 {
            let text: Vec<String> = shapes
                .iter()
                .map(|((dtype, bytes), ranks)| match dtype {
                    Some(dtype) => format!("{} with {dtype}, {bytes} bytes", ranks_text(ranks)),
                    None => format!("{} with {bytes} bytes", ranks_text(ranks)),
                })
                .collect();
            findings.push(format!(
                "ranks disagree on {name} #{seq}: {}",
                text.join("; ")
            ));
            steps.push((*group, *seq));
        }
    }
    steps.sort_by_key(|&(group, seq)| (seq, group));
    steps.dedup();
    // A rank that completed such a step returned something: on MLX's wire, which carries no
    // call to check, numbers computed from another operation's bytes.
    for &(group, seq) in &steps {
        let mut done: Vec<usize> = ops
            .iter()
            .filter(|(_, o)| o.group == group && o.seq == seq && o.state == "done")
            .map(|&(rank, _)| rank)
            .collect();
        done.sort_unstable();
        done.dedup();
        if !done.is_empty() {
            let group = if group == "world" {
                String::new()
            } else {
                format!(" of group {group}")
            };
            findings.push(format!(
                "{} returned from step #{seq}{group} without an error although the programs \
                 disagree there (MLX's wire carries no call to check): what {} returned is wrong",
                ranks_text(&done),
                if done.len() == 1 { "it" } else { "they" }
            ));
        }
    }
    steps
}

/// Ranks behind the others in a group's collectives, while the others wait.
fn behind(rows: &[Row], findings: &mut Vec<String>) {
    let mut groups: BTreeMap<&str, Vec<(&Row, &Op)>> = BTreeMap::new();
    for row in rows {
        if let Some(op) = row.op.as_ref().filter(|o| o.collective()) {
            groups.entry(op.group.as_str()).or_default().push((row, op));
        }
    }
    for (group, members) in groups {
        let Some(ahead) = members.iter().map(|(_, o)| o.seq).max() else {
            continue;
        };
        let waiting = members
            .iter()
            .any(|(_, o)| o.seq == ahead && o.state == "running");
        let late: Vec<&(&Row, &Op)> = members.iter().filter(|(_, o)| o.seq < ahead).collect();
        if !waiting || late.is_empty() {
            continue;
        }
        let ahead_op = members
            .iter()
            .find(|(_, o)| o.seq == ahead)
            .map(|(_, o)| o.op.clone())
            .unwrap_or_default();
        let group = if group == "world" {
            String::new()
        } else {
            format!(" of group {group}")
        };
        for (row, op) in late {
            findings.push(format!(
                "rank {} is at {} #{} ({}), the others at #{ahead}: rank {} has not joined \
                 {ahead_op} #{ahead}{group}",
                row.rank, op.op, op.seq, op.state, row.rank
            ));
        }
    }
}

/// A rank that stayed in one operation longer than its peers waited before they timed out.
struct Late<'a> {
    rank: usize,
    op: &'a Op,
    /// How long the operation lasted (to the record's time if still running), µs.
    lasted_us: u64,
    /// The longest wait of the others that ended in a timeout, µs.
    timeout_us: u64,
}

/// Ranks that were not running while the others timed out waiting ([`Late`]). A rank in an
/// operation has a deadline as every rank has (the job's timeout): it cannot stay in one past
/// the others' timeouts unless it did not run (a stopped or stalled process, a host asleep),
/// and then the others' timeouts, whichever peer each names, follow from it. A timeout is an
/// error that says `timed out after D` having waited most of its operation (a rank that wakes
/// past its deadline fails at once saying `timed out after 0ns`). Only operations that started
/// before the first timeout count, and only those outlasting the longest timeout by more than
/// 2 % and 50 ms.
fn not_running(records: &[Record]) -> Vec<Late<'_>> {
    let lasted = |r: &Record, o: &Op| {
        o.end_us
            .unwrap_or(r.header.at_us)
            .saturating_sub(o.start_us)
    };
    let timeouts: Vec<(u64, u64)> = records
        .iter()
        .flat_map(|r| r.ops.iter().map(move |o| (r, o)))
        .filter(|(_, o)| o.state == "failed")
        .filter_map(|(r, o)| {
            let waited = timed_out_after_us(o.error.as_deref()?)?;
            let end = o.end_us?;
            (waited.saturating_mul(2) >= lasted(r, o)).then_some((end, waited))
        })
        .collect();
    let Some(first) = timeouts.iter().map(|&(end, _)| end).min() else {
        return Vec::new();
    };
    let longest = timeouts.iter().map(|&(_, w)| w).max().unwrap_or(0);
    let bound = longest + (longest / 50).max(50_000);
    let mut late: Vec<Late<'_>> = records
        .iter()
        .filter_map(|r| {
            r.ops
                .iter()
                .filter(|o| o.start_us < first)
                .map(|o| (o, lasted(r, o)))
                .filter(|&(_, us)| us > bound)
                .max_by_key(|&(_, us)| us)
                .map(|(op, lasted_us)| Late {
                    rank: r.header.rank,
                    op,
                    lasted_us,
                    timeout_us: longest,
                })
        })
        .collect();
    late.sort_by_key(|l| (l.op.start_us, l.rank));
    late
}

/// The wait of an error that says `timed out after D` (D as Rust prints a duration: `30s`,
/// `29.99988223s`, `1.5ms`, `250µs`, `0ns`), in µs.
fn timed_out_after_us(error: &str) -> Option<u64> {
    let at = error.find("timed out after ")? + "timed out after ".len();
    let rest = &error[at..];
    let number: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let value: f64 = number.parse().ok()?;
    let unit = &rest[number.len()..];
    let scale = if unit.starts_with("ns") {
        1e-3
    } else if unit.starts_with("µs") || unit.starts_with("us") {
        1.0
    } else if unit.starts_with("ms") {
        1e3
    } else if unit.starts_with('s') {
        1e6
    } else {
        return None;
    };
    Some((value * scale) as u64)
}

/// The first failure: the earliest failed operation by `end_us`, unless the errors are
/// consequences ([`failure::blames_a_peer`]: a closed connection, a silent link, the group
/// failed earlier) naming a rank (`rank P link L`) that recorded no error of its own. Such a
/// rank is the cause: a rank that was killed writes no record, one whose panic ended its
/// program writes one with no error as it exits, so its neighbours' errors are the only
/// failures on file and the earliest of them names a victim.
/// `ended` says how ranks the launcher saw fail on their own ended ("exit code 101"). Where
/// the programs disagree (`disagree`: the earliest such step) such errors are that
/// disagreement's consequence, and are said to be.
fn first_failure(
    records: &[Record],
    ended: &[(usize, String)],
    late: &[Late<'_>],
    disagree: Option<&str>,
) -> Option<String> {
    let mut failed: Vec<(u64, usize, &Op)> = records
        .iter()
        .flat_map(|r| r.ops.iter().map(move |o| (r.header.rank, o)))
        .filter(|(_, o)| o.state == "failed")
        .filter_map(|(r, o)| Some((o.end_us?, r, o)))
        .collect();
    failed.sort_by_key(|(end, r, _)| (*end, *r));
    // Where the programs disagree, a failure that blames a peer (a connection closed by a
    // rank that went on, a timeout on one that waits elsewhere) is the disagreement's doing,
    // whoever it names.
    if let (Some(step), Some(&(_, rank, op))) = (disagree, failed.first())
        && op
            .error
            .as_deref()
            .is_some_and(|e| failure::blames_a_peer(&[e.to_owned()]))
    {
        return Some(format!(
            "the first failure by time, a consequence of the disagreement at step {step}: \
             rank {rank}, {}: {}",
            op_name(op),
            op.error.as_deref().unwrap_or("(no error text)")
        ));
    }
    // A rank that was not running while the others timed out is the cause of their
    // failures, whichever peer each names: the earliest to stop running.
    if let (Some(l), Some(&(_, first, op))) = (late.first(), failed.first())
        && op
            .error
            .as_deref()
            .is_some_and(|e| failure::blames_a_peer(&[e.to_owned()]))
    {
        let mut ranks: Vec<usize> = failed
            .iter()
            .map(|(_, r, _)| *r)
            .filter(|&r| r != l.rank)
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        if ranks.is_empty() {
            return None;
        }
        return Some(format!(
            "the first failure: rank {}, which was not running ({} lasted {}); {} failed in \
             consequence (first rank {first}, {}: {})",
            l.rank,
            op_name(l.op),
            duration(l.lasted_us),
            ranks_text(&ranks),
            op_name(op),
            op.error.as_deref().unwrap_or_default()
        ));
    }
    let erred: BTreeSet<usize> = failed.iter().map(|(_, r, _)| *r).collect();
    // Only while the failures, earliest first, are all consequences: a rank that failed on its
    // own before them (a mismatch, its own deadline) is the first failure, whoever went
    // silent after it (a rank the launcher then stopped leaves no record either).
    let cause = failed
        .iter()
        .take_while(|(_, _, op)| {
            op.error
                .as_deref()
                .is_some_and(|e| failure::blames_a_peer(&[e.to_owned()]))
        })
        .find_map(|&(_, rank, op)| {
            let peer = blamed_peer(op.error.as_deref()?)?;
            (peer != rank && !erred.contains(&peer)).then_some(peer)
        });
    if let Some(peer) = cause {
        let blaming: Vec<(usize, &Op)> = failed
            .iter()
            .filter(|(_, _, o)| {
                o.error
                    .as_deref()
                    .is_some_and(|e| names_peer(e, peer) && failure::blames_a_peer(&[e.to_owned()]))
            })
            .map(|&(_, r, o)| (r, o))
            .collect();
        let mut ranks: Vec<usize> = blaming.iter().map(|(r, _)| *r).collect();
        ranks.sort_unstable();
        ranks.dedup();
        let recorded = records.iter().any(|r| r.header.rank == peer);
        let how = ended.iter().find(|(r, _)| *r == peer).map(|(_, how)| how);
        let what = match (how, recorded) {
            (Some(how), false) => format!("ended with {how} and left no record"),
            (Some(how), true) => format!("ended with {how}, its record showing no error"),
            (None, false) => "left no record".to_owned(),
            (None, true) => "recorded no error".to_owned(),
        };
        let (first, op) = blaming.first()?;
        return Some(format!(
            "the first failure: rank {peer}, which {what}; {} failed in consequence, naming it \
             (first rank {first}, {}: {})",
            ranks_text(&ranks),
            op_name(op),
            op.error.as_deref().unwrap_or_default()
        ));
    }
    let &(end, rank, op) = failed.first()?;
    // The earliest failure by the clocks may itself blame a peer that failed at the same
    // time (clocks tick in µs, hosts' clocks differ): a rank whose link was cut closes its
    // other links when it fails, and its other neighbour may stamp its own failure first. Follow
    // such blame to the rank it ends at.
    let (chain, cycle) = follow_blame(&failed, end, rank, op);
    if let Some(at) = cycle {
        let ring: Vec<usize> = chain[at..].iter().map(|(r, _)| *r).collect();
        let (cause, cause_op) = chain[at];
        let error = cause_op.error.as_deref().unwrap_or("(no error text)");
        if let [a, b] = ring[..] {
            // Two ranks that failed blaming each other: the link between them.
            let (a, b) = (a.min(b), a.max(b));
            return Some(format!(
                "the first failure: the link between rank {a} and rank {b}, each failing at the \
                 same time blaming the other (rank {cause}, {}: {error})",
                op_name(cause_op)
            ));
        }
        let mut sorted = ring.clone();
        sorted.sort_unstable();
        return Some(format!(
            "the first failure cannot be told: {} failed at the same time each blaming the next \
             in a cycle ({}), so the records do not say which of their links stopped first \
             (rank {cause}, {}: {error})",
            ranks_text(&sorted),
            ring.iter()
                .chain(ring.first())
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(" → "),
            op_name(cause_op)
        ));
    }
    if let Some(&(cause, cause_op)) = chain.last()
        && chain.len() > 1
    {
        let mut before: Vec<usize> = chain[..chain.len() - 1].iter().map(|(r, _)| *r).collect();
        before.sort_unstable();
        before.dedup();
        return Some(format!(
            "the first failure: rank {cause}, {}: {}; {} failed at the same time in \
             consequence, blaming it",
            op_name(cause_op),
            cause_op.error.as_deref().unwrap_or("(no error text)"),
            ranks_text(&before)
        ));
    }
    Some(format!(
        "the first failure by time: rank {rank}, {}: {}",
        op_name(op),
        op.error.as_deref().unwrap_or("(no error text)")
    ))
}

/// How far apart two failures may be stamped and still be "at the same time": a failure that
/// closes its links is seen by the peers within a round trip, and hosts' clocks differ by a
/// few milliseconds.
const SAME_TIME_US: u64 = 250_000;

/// From the failure of `rank` (`op`, ended at `end`), the chain of failures each blaming the
/// next one's rank as a consequence (a closed connection, a timeout naming `rank P link L`),
/// while the blamed rank failed no later than [`SAME_TIME_US`] after its blamer and was not
/// seen before: the first element is `rank`, the last the rank the blame ends at. When the
/// last one blames a rank of the chain, the index of that rank: the chain closes in a cycle
/// from there.
fn follow_blame<'a>(
    failed: &[(u64, usize, &'a Op)],
    end: u64,
    rank: usize,
    op: &'a Op,
) -> (Vec<(usize, &'a Op)>, Option<usize>) {
    let mut chain = vec![(rank, op)];
    let (mut end, mut op) = (end, op);
    while let Some(error) = op.error.as_deref() {
        if !failure::blames_a_peer(&[error.to_owned()]) {
            break;
        }
        let Some(peer) = blamed_peer(error) else {
            break;
        };
        if let Some(at) = chain.iter().position(|(r, _)| *r == peer) {
            return (chain, Some(at));
        }
        // The blamed rank's earliest failure.
        let Some(&(peer_end, _, peer_op)) = failed.iter().find(|(_, r, _)| *r == peer) else {
            break;
        };
        if peer_end > end.saturating_add(SAME_TIME_US) {
            break;
        }
        chain.push((peer, peer_op));
        (end, op) = (peer_end, peer_op);
    }
    (chain, None)
}

/// The peer an error blames: the rank that told it it failed (`rank P failed and left the
/// group`, nuvec-distributed's notice on the nuvec wire, where the transfer named is only the
/// one the rank waited on), else the other end of its failed transfer (`rank P link L`, as
/// nuvec-distributed's errors name a transfer's channel), the first one when it names
/// several.
fn blamed_peer(error: &str) -> Option<usize> {
    let teller = error
        .match_indices(" failed and left the group")
        .find_map(|(at, _)| {
            let before = &error[..at];
            let digits = before.len() - before.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            let rank = &before[before.len() - digits..];
            (digits > 0 && before[..before.len() - digits].ends_with("rank "))
                .then(|| rank.parse().ok())?
        });
    teller.or_else(|| {
        error.match_indices("rank ").find_map(|(at, _)| {
            let rest = &error[at + "rank ".len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let after = &rest[digits.len()..];
            (!digits.is_empty() && after.starts_with(" link ")).then(|| digits.parse().ok())?
        })
    })
}

/// Whether `error` names rank `peer` as the cause of its failure: the rank it blames (see
/// [`blamed_peer`]), or one that closed a link the operation still needed while it waited on
/// another rank (`the connection was closed by rank 1 on link 0`).
fn names_peer(error: &str, peer: usize) -> bool {
    blamed_peer(error) == Some(peer) || error.contains(&format!("closed by rank {peer} on link"))
}

/// The table and the findings, as printed.
pub(crate) fn render(d: &Diagnosis) -> String {
    let mut table = vec![
        [
            "rank",
            "host",
            "operation",
            "group",
            "state",
            "waited",
            "waiting on",
            "record",
        ]
        .map(str::to_owned),
    ];
    for row in &d.rows {
        let (name, group, state, waiting) = match &row.op {
            Some(op) => (
                format!("{} #{}", op.op, op.seq),
                op.group.clone(),
                op.state.clone(),
                if op.waiting_on.is_empty() {
                    "-".to_owned()
                } else {
                    ranks_text(&op.waiting_on)
                },
            ),
            None => ("(none yet)".to_owned(), "-".into(), "-".into(), "-".into()),
        };
        table.push([
            row.rank.to_string(),
            row.host.clone(),
            name,
            group,
            state,
            row.waited_us.map_or("-".to_owned(), duration),
            waiting,
            row.reason.clone(),
        ]);
    }
    for &r in &d.missing {
        let mut cells: [String; 8] = Default::default();
        cells[0] = r.to_string();
        cells[2] = "(no record)".to_owned();
        table.push(cells);
    }
    let mut out = String::new();
    for line in crate::table::aligned(&table) {
        out += &line;
        out.push('\n');
    }
    for f in &d.findings {
        out += &format!("- {f}\n");
    }
    for p in &d.problems {
        out += &format!("! {p}\n");
    }
    out
}

/// The ranks whose `rank-R.jsonl` carries request `id` (answered a dump request).
pub(crate) fn answered(records: &[Record], id: u64) -> BTreeSet<usize> {
    records
        .iter()
        .filter(|r| r.header.request == Some(id))
        .map(|r| r.header.rank)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_764_760_000_000_000;

    fn header(rank: usize, reason: &str) -> String {
        format!(
            r#"{{"record":1,"rank":{rank},"size":4,"host":"mac-{rank}","pid":{},"reason":"{reason}","request":null,"at_us":{},"capacity":256,"dropped":0}}"#,
            1000 + rank,
            T + 5_000_000
        )
    }

    fn op(seq: u64, name: &str, state: &str, end: Option<u64>, waiting: &[usize]) -> String {
        format!(
            r#"{{"group":"world","group_rank":0,"group_size":4,"seq":{seq},"op":"{name}","dtype":"float32","bytes":4096,"peers":[3,1],"start_us":{},"end_us":{},"state":"{state}","waiting_on":{waiting:?},"moved":[[3,4096],[1,4096]],"error":{}}}"#,
            T + seq * 1000,
            end.map_or("null".to_owned(), |e| e.to_string()),
            if state == "failed" {
                format!("\"rank {seq}: the connection was closed by the peer\"")
            } else {
                "null".to_owned()
            }
        )
    }

    fn record(rank: usize, lines: &[String]) -> Record {
        let mut text = header(rank, "request");
        for l in lines {
            text += "\n";
            text += l;
        }
        parse(&text, &format!("rank-{rank}.jsonl")).expect("a record")
    }

    fn done(seq: u64, name: &str) -> String {
        op(seq, name, "done", Some(T + seq * 1000 + 120), &[])
    }

    #[test]
    fn an_error_told_by_a_failed_rank_blames_the_teller_not_the_rank_it_waited_on() {
        let told = "distributed: rank 0: all_sum #0 (16 bytes) failed after 500.762ms: \
                    receiving from rank 1 link 0 (0 of 32 bytes): rank 12 failed and left the \
                    group (it said so before it closed its links; its own error says why)";
        assert_eq!(blamed_peer(told), Some(12));
        assert!(failure::blames_a_peer(&[told.to_owned()]));
        let closed = "receiving from rank 3 link 1 (0 of 8 bytes): the connection was closed \
                      by the peer";
        assert_eq!(blamed_peer(closed), Some(3));
    }

    #[test]
    fn an_error_whose_wait_a_neighbour_ended_blames_the_rank_waited_on_and_names_the_neighbour() {
        let error = "distributed: rank 0: all_sum #1 (16777216 bytes) failed after 2.999s: \
                     receiving from rank 2 link 0 (0 of 8 bytes): the connection was closed by \
                     rank 1 on link 0, which this operation still sends on (it failed or its \
                     program ended; its own error, if it has one, says why)";
        assert_eq!(blamed_peer(error), Some(2));
        assert!(names_peer(error, 2) && names_peer(error, 1) && !names_peer(error, 0));
        assert!(failure::blames_a_peer(&[error.to_owned()]));
    }

    #[test]
    fn a_record_is_read_by_the_contract_and_a_bad_line_is_named() {
        let r = record(
            2,
            &[done(0, "all_sum"), op(1, "all_sum", "running", None, &[1])],
        );
        assert_eq!(r.header.rank, 2);
        assert_eq!(r.header.host, "mac-2");
        assert_eq!(r.ops.len(), 2);
        assert_eq!(r.ops[1].end_us, None);
        assert_eq!(r.ops[0].moved, [(3, 4096), (1, 4096)]);
        let bad = format!("{}\n{{\"group\":\"world\"}}", header(0, "failure"));
        let e = parse(&bad, "rank-0.jsonl").expect_err("a missing field");
        assert!(e.starts_with("rank-0.jsonl: line 2: missing field"), "{e}");
        assert!(parse("", "rank-0.jsonl").is_err());
        assert_eq!(rank_of("rank-12.jsonl"), Some(12));
        assert_eq!(rank_of("rank-3.progress"), Some(3));
        assert_eq!(
            parse_progress(r#"{"rank":1,"completed":7,"last_end_us":12}"#),
            Some(Progress {
                rank: 1,
                completed: 7,
                last_end_us: 12
            })
        );
    }

    #[test]
    fn an_operation_without_an_element_type_is_read_and_compared() {
        // all_gather, send, recv and split have no dtype: the recorder writes null.
        let gather = op(1, "all_gather", "failed", Some(T + 2000), &[])
            .replace("\"dtype\":\"float32\"", "\"dtype\":null");
        let records = [
            record(
                0,
                &[
                    done(0, "all_sum"),
                    op(1, "all_sum", "failed", Some(T + 2100), &[]),
                ],
            ),
            record(1, &[done(0, "all_sum"), gather]),
        ];
        assert_eq!(records[1].ops[1].dtype, None);
        let d = diagnose(&records, Some(2), &[], &[], Vec::new());
        assert_eq!(
            d.findings[0],
            "different operations at the same step: rank 1 is in all_gather #1, rank 0 in \
             all_sum #1"
        );
    }

    #[test]
    fn ranks_in_different_operations_at_one_step_are_named() {
        let records: Vec<Record> = (0..4)
            .map(|r| {
                let name = if r == 1 { "all_gather" } else { "all_sum" };
                record(
                    r,
                    &[
                        done(2, "all_sum"),
                        op(3, name, "running", None, &[(r + 1) % 4]),
                    ],
                )
            })
            .collect();
        let d = diagnose(&records, None, &[], &[], Vec::new());
        assert_eq!(
            d.findings,
            [
                "different operations at the same step: rank 1 is in all_gather #3, ranks 0, 2, 3 \
              in all_sum #3"
            ]
        );
        assert_eq!(d.rows[1].waited_us, Some(5_000_000 - 3000));
        let text = render(&d);
        assert!(text.contains("all_gather #3"), "{text}");
        assert!(
            text.lines()
                .next()
                .unwrap_or_default()
                .starts_with("rank  host"),
            "{text}"
        );
    }

    #[test]
    fn a_rank_behind_the_others_has_not_joined() {
        let mut records: Vec<Record> = [0, 1, 3]
            .map(|r| {
                record(
                    r,
                    &[done(5, "all_sum"), op(6, "all_sum", "running", None, &[2])],
                )
            })
            .into();
        records.push(record(2, &[done(4, "all_sum"), done(5, "all_sum")]));
        let d = diagnose(&records, None, &[], &[], Vec::new());
        assert_eq!(
            d.findings,
            ["rank 2 is at all_sum #5 (done), the others at #6: rank 2 has not joined all_sum #6"]
        );
    }

    #[test]
    fn a_rank_without_a_record_or_whose_process_exited_is_gone() {
        let records: Vec<Record> = [0, 1, 2]
            .map(|r| record(r, &[op(0, "all_sum", "running", None, &[3])]))
            .into();
        let d = diagnose(&records, None, &[], &[], Vec::new());
        assert_eq!(d.missing, [3]);
        assert_eq!(d.findings.len(), 1);
        assert!(
            d.findings[0].starts_with("rank 3 left no record"),
            "{:?}",
            d.findings
        );
        let d = diagnose(&records, None, &[3], &[], Vec::new());
        assert_eq!(d.findings, ["rank 3 is gone: its process has exited"]);
        assert!(render(&d).contains("(no record)"));
    }

    #[test]
    fn the_first_failure_by_time_is_the_earliest_failed_end() {
        let records = [
            record(0, &[op(1, "all_sum", "failed", Some(T + 9_000), &[])]),
            record(1, &[op(1, "all_sum", "failed", Some(T + 7_000), &[])]),
            record(2, &[op(1, "all_sum", "failed", Some(T + 8_000), &[])]),
            record(3, &[done(1, "all_sum")]),
        ];
        let d = diagnose(&records, Some(4), &[], &[], Vec::new());
        assert_eq!(
            d.findings,
            [
                "the first failure by time: rank 1, all_sum #1: rank 1: the connection was closed \
              by the peer"
            ]
        );
        // As JSON for scripts: the rows, the findings.
        let json = serde_json::to_value(&d).expect("json");
        assert_eq!(json["rows"][1]["op"]["state"], "failed");
        assert_eq!(json["size"], 4);
    }

    /// Rank `rank`'s all_sum #1, failed at `T + end` with `error`.
    fn failed_with(rank: usize, end: u64, error: &str) -> Record {
        let line = op(1, "all_sum", "failed", Some(T + end), &[]).replace(
            "\"rank 1: the connection was closed by the peer\"",
            &serde_json::to_string(error).expect("json"),
        );
        record(rank, &[done(0, "all_sum"), line])
    }

    /// Rank `rank`'s error for a connection to `peer` that closed.
    fn closed_by(rank: usize, peer: usize) -> String {
        format!(
            "distributed: rank {rank}: all_sum #1 (4 bytes) failed after 1.067ms: receiving from \
             rank {peer} link 0 (0 of 32 bytes): the connection was closed by the peer"
        )
    }

    #[test]
    fn a_rank_that_left_no_record_is_the_cause_when_the_earliest_errors_blame_it() {
        // Rank 1 panicked (no record); ranks 0 and 2 lost their connections to it, rank 3
        // its connection to rank 2, later.
        let records = [
            failed_with(0, 7_000, &closed_by(0, 1)),
            failed_with(2, 7_500, &closed_by(2, 1)),
            failed_with(3, 8_000, &closed_by(3, 2)),
        ];
        let ended = [
            (1, "exit code 101".to_owned()),
            (0, "exit code 3".to_owned()),
        ];
        let d = diagnose(&records, Some(4), &[], &ended, Vec::new());
        assert_eq!(
            d.findings.last().map(String::as_str),
            Some(
                format!(
                    "the first failure: rank 1, which ended with exit code 101 and left no \
                     record; ranks 0, 2 failed in consequence, naming it (first rank 0, all_sum \
                     #1: {})",
                    closed_by(0, 1)
                )
                .as_str()
            ),
            "{:?}",
            d.findings
        );
        // From the files alone (`diagnose DIR`), and when its record shows no error.
        let d = diagnose(&records, Some(4), &[], &[], Vec::new());
        let last = d.findings.last().cloned().unwrap_or_default();
        assert!(
            last.starts_with("the first failure: rank 1, which left no record; ranks 0, 2"),
            "{last}"
        );
        let mut quiet = records.to_vec();
        quiet.push(record(1, &[done(0, "all_sum")]));
        let d = diagnose(&quiet, Some(4), &[], &[], Vec::new());
        let last = d.findings.last().cloned().unwrap_or_default();
        assert!(
            last.starts_with("the first failure: rank 1, which recorded no error; "),
            "{last}"
        );
        // A rank that recorded an error of its own at the same time (its clock may stamp it
        // after the errors of the peers it closed) is where the blame ends: its own error.
        let mut own = records.to_vec();
        own.push(failed_with(1, 9_000, "distributed: rank 1: out of memory"));
        let d = diagnose(&own, Some(4), &[], &[], Vec::new());
        let last = d.findings.last().cloned().unwrap_or_default();
        assert_eq!(
            last,
            "the first failure: rank 1, all_sum #1: distributed: rank 1: out of memory; rank 0 \
             failed at the same time in consequence, blaming it"
        );
        // Much later, it is not inferred: the earliest stands.
        let mut later = records.to_vec();
        later.push(failed_with(
            1,
            7_000 + 2 * SAME_TIME_US,
            "distributed: rank 1: out of memory",
        ));
        let d = diagnose(&later, Some(4), &[], &[], Vec::new());
        let last = d.findings.last().cloned().unwrap_or_default();
        assert!(
            last.starts_with("the first failure by time: rank 0, all_sum #1: "),
            "{last}"
        );
    }

    /// Rank `rank`'s all_sum #1, started at `T + start` and failed at `T + end` with `error`.
    fn failed_between(rank: usize, start: u64, end: u64, error: &str) -> Record {
        let mut r = failed_with(rank, end, error);
        if let Some(op) = r.ops.last_mut() {
            op.start_us = T + start;
        }
        r
    }

    /// Rank `rank`'s error for a wait on `peer` that timed out after `after` (as Rust prints
    /// a duration).
    fn timed_out(rank: usize, peer: usize, after: &str) -> String {
        format!(
            "distributed: rank {rank}: all_sum #1 (4 bytes) failed after 30.000s: receiving from \
             rank {peer} link 0 (0 of 32 bytes): timed out after {after}"
        )
    }

    #[test]
    fn a_rank_in_one_operation_longer_than_the_others_waited_before_timing_out_is_the_cause() {
        // Rank 2 stopped for 54 s inside all_sum #1; ranks 0, 1, 3 timed out after 30 s,
        // rank 0 waiting on rank 3 (itself waiting on rank 2), and rank 2 failed when it woke.
        let records = [
            failed_between(0, 1_000, 30_001_000, &timed_out(0, 3, "29.99988223s")),
            failed_between(1, 1_000, 30_001_100, &closed_by(1, 0)),
            failed_between(2, 1_000, 54_001_000, &timed_out(2, 3, "0ns")),
            failed_between(3, 1_000, 30_001_050, &timed_out(3, 2, "30s")),
        ];
        let d = diagnose(&records, Some(4), &[], &[], Vec::new());
        assert!(
            d.findings.iter().any(|f| f
                == "rank 2 was not running: its all_sum #1 lasted 54.0 s, where the others timed \
                    out after 30.0 s (its process stopped or stalled, or its host slept)"),
            "{:?}",
            d.findings
        );
        let last = d.findings.last().cloned().unwrap_or_default();
        assert!(
            last.starts_with(
                "the first failure: rank 2, which was not running (all_sum #1 lasted 54.0 s); \
                 ranks 0, 1, 3 failed in consequence (first rank 0, all_sum #1: "
            ),
            "{last}"
        );
        // Within the others' timeouts (2 % and 50 ms over), nobody is said not to have run.
        let records = [
            failed_between(0, 1_000, 30_001_000, &timed_out(0, 1, "30s")),
            failed_between(1, 1_000, 30_500_000, &closed_by(1, 0)),
        ];
        let d = diagnose(&records, Some(2), &[], &[], Vec::new());
        assert!(
            !d.findings.iter().any(|f| f.contains("not running")),
            "{:?}",
            d.findings
        );
    }

    #[test]
    fn two_ranks_failing_at_once_blaming_each_other_name_their_link_and_a_longer_cycle_is_untold() {
        // A cut between ranks 3 and 4: each end lost the other; rank 0, whose connection
        // rank 4 then closed, stamped its failure first.
        let records = [
            failed_with(0, 7_000, &closed_by(0, 4)),
            failed_with(3, 7_000, &closed_by(3, 4)),
            failed_with(4, 7_001, &closed_by(4, 3)),
        ];
        let d = diagnose(&records, Some(5), &[], &[], Vec::new());
        let last = d.findings.last().cloned().unwrap_or_default();
        assert!(
            last.starts_with(
                "the first failure: the link between rank 3 and rank 4, each failing at the \
                 same time blaming the other (rank 4, all_sum #1: "
            ),
            "{last}"
        );
        // Every rank timed out on the one before it: no record tells which link stopped.
        let records = [
            failed_with(0, 7_000, &timed_out(0, 2, "30s")),
            failed_with(1, 7_000, &timed_out(1, 0, "30s")),
            failed_with(2, 7_000, &timed_out(2, 1, "30s")),
        ];
        let d = diagnose(&records, Some(3), &[], &[], Vec::new());
        let last = d.findings.last().cloned().unwrap_or_default();
        assert!(
            last.starts_with(
                "the first failure cannot be told: ranks 0, 1, 2 failed at the same time each \
                 blaming the next in a cycle (0 → 2 → 1 → 0)"
            ),
            "{last}"
        );
    }

    #[test]
    fn a_timeouts_wait_is_read_as_rust_prints_a_duration() {
        let cases = [
            ("timed out after 30s", Some(30_000_000)),
            ("timed out after 29.99988223s", Some(29_999_882)),
            ("timed out after 1.5ms", Some(1_500)),
            ("timed out after 250µs", Some(250)),
            ("timed out after 0ns", Some(0)),
            ("timed out after soon", None),
            ("the connection was closed by the peer", None),
        ];
        for (text, want) in cases {
            assert_eq!(timed_out_after_us(text), want, "{text}");
        }
    }

    #[test]
    fn a_rank_that_failed_on_its_own_first_stays_first_when_a_rank_stopped_after_it_left_no_record()
    {
        // Rank 0 failed on its own; the launcher then stopped the others: rank 2 left no
        // record, and rank 3 recorded losing its connection to rank 2 before it was stopped.
        let records = [
            failed_with(0, 7_000, "distributed: rank 0: all_sum #1: out of memory"),
            failed_with(3, 9_000, &closed_by(3, 2)),
        ];
        let d = diagnose(&records, Some(4), &[], &[], Vec::new());
        let last = d.findings.last().cloned().unwrap_or_default();
        assert!(
            last.starts_with("the first failure by time: rank 0, all_sum #1: "),
            "{last}"
        );
    }

    #[test]
    fn a_rank_cut_off_without_a_record_is_named_when_its_neighbours_timed_out_waiting_for_it() {
        let timed_out = |rank: usize| {
            format!(
                "distributed: rank {rank}: all_sum #1 (4096 bytes) failed after 5.001s: \
                 receiving from rank 2 link 0 (0 of 2048 bytes): timed out after 5s"
            )
        };
        let records = [
            failed_with(0, 5_001_000, &timed_out(0)),
            failed_with(1, 5_002_000, &timed_out(1)),
        ];
        let d = diagnose(&records, Some(3), &[], &[], Vec::new());
        let last = d.findings.last().cloned().unwrap_or_default();
        assert!(
            last.starts_with(
                "the first failure: rank 2, which left no record; ranks 0, 1 failed in \
                 consequence, naming it (first rank 0, all_sum #1: "
            ),
            "{last}"
        );
    }

    #[test]
    fn the_same_operation_with_different_sizes_is_a_disagreement() {
        let mut odd = op(0, "all_sum", "running", None, &[0]);
        odd = odd.replace("\"bytes\":4096", "\"bytes\":2048");
        let records = [
            record(0, &[op(0, "all_sum", "running", None, &[1])]),
            record(1, &[odd]),
        ];
        let d = diagnose(&records, Some(2), &[], &[], Vec::new());
        // The headers say 4 ranks: 2 and 3 left no record.
        assert_eq!(
            d.findings[..1],
            [
                "ranks disagree on all_sum #0: rank 1 with float32, 2048 bytes; rank 0 with \
              float32, 4096 bytes"
            ]
        );
    }

    #[test]
    fn the_ranks_that_answered_a_request_are_those_whose_header_carries_its_id() {
        let mut a = record(0, &[]);
        a.header.request = Some(7);
        let mut b = record(1, &[]);
        b.header.request = Some(6);
        assert_eq!(answered(&[a, b], 7), BTreeSet::from([0]));
    }

    #[test]
    fn ranks_that_went_on_past_a_disagreement_are_met_at_it_and_their_results_called_wrong() {
        // MLX's wire: ranks 0, 2, 3 completed all_sum #1 and went on to #2 (their records
        // written as they exited), rank 1's all_gather #1 failed on a connection rank 2 closed.
        let gather = op(1, "all_gather", "failed", Some(T + 3000), &[]).replace(
            "rank 1: the connection",
            "receiving from rank 2 link 0: the connection",
        );
        let mut records = vec![record(1, &[done(0, "all_sum"), gather])];
        for r in [0, 2, 3] {
            records.push(record(
                r,
                &[done(0, "all_sum"), done(1, "all_sum"), done(2, "all_max")],
            ));
        }
        let d = diagnose(&records, Some(4), &[], &[], Vec::new());
        assert_eq!(
            d.findings,
            [
                "different operations at the same step: rank 1 is in all_gather #1, ranks 0, 2, \
                 3 in all_sum #1",
                "ranks 0, 2, 3 returned from step #1 without an error although the programs \
                 disagree there (MLX's wire carries no call to check): what they returned is \
                 wrong",
                "the first failure by time, a consequence of the disagreement at step #1: rank \
                 1, all_gather #1: receiving from rank 2 link 0: the connection was closed by \
                 the peer",
            ]
        );
    }

    #[test]
    fn disjoint_groups_that_share_a_name_are_not_compared() {
        // A split into {0, 1} and {2, 3}: each process calls its group `group-1`; the two
        // groups run different collectives, which is no disagreement.
        let mut records = Vec::new();
        for (rank, name) in [
            (0, "all_sum"),
            (1, "all_sum"),
            (2, "all_gather"),
            (3, "all_gather"),
        ] {
            let line = done(0, name)
                .replace("\"group\":\"world\"", "\"group\":\"group-1\"")
                .replace("\"group_rank\":0", &format!("\"group_rank\":{}", rank % 2))
                .replace("\"group_size\":4", "\"group_size\":2");
            records.push(record(rank, &[line]));
        }
        let d = diagnose(&records, Some(4), &[], &[], Vec::new());
        assert_eq!(d.findings, Vec::<String>::new());
    }
}
