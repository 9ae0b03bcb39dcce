//! The flight recorder: every group keeps its last operations (sequence number, operation,
//! dtype, bytes, peers, start and end times, what a waiting step waits for, the outcome), so
//! that when a job fails or hangs each rank can say where it was, and the launcher can set
//! the ranks' accounts side by side (`nuvec-launch diagnose`).
//!
//! # Cost
//!
//! A fixed ring buffer per group ([`capacity`]: `NUVEC_DISTRIBUTED_RECORD`, default 256
//! operations, `0` turns it off), allocated when the group is made; an operation writes one
//! slot of atomics at its start and at its end. Nothing is allocated per operation, and the
//! clock is not read for the record: its times are the fabric's, the start the one the
//! communicator core reads anyway, the end the fabric's latest reading
//! ([`Fabric::recent`](crate::fabric::Fabric::recent): the TCP fabric reads its clock at every
//! pass of a step, so the end is at most one pass early), turned into Unix time by one reading
//! of the wall clock per group (at its first operation); a group counts its completed
//! operations itself (no locked add on a counter the process shares) and Unix µs are worked
//! out in u64. Measured on the 2-core VM that runs CI, twice, each time
//! `what_an_operation_costs_the_recorder` (in release) then a 4 KiB all_sum of two ranks over
//! local links (`cargo bench --bench allreduce -- --ranks 2 --sizes 4K`, p50): 26.9 ns against
//! 3.1 µs (0.87 %), 19.6 ns against 2.7 µs (0.73 %). One more clock read for the end, as
//! before, made it 47–55 ns (1.7 %). The times follow the fabric's monotonic clock (in the
//! simulator, virtual time, from a fixed epoch), so a wall clock set back or forward during
//! the job does not reorder a rank's operations.
//!
//! # Reading never blocks a collective
//!
//! Only the group's operation writes its slots (under the communicator's lock, so one writer
//! at a time); a reader (a dump, from any thread) never takes that lock. Each slot is a
//! sequence lock made of atomics: the writer makes its version odd, writes the fields, makes
//! it even again; a reader copies the fields between two reads of the version and tries again
//! (a few times, then leaves the slot out) if they differ or are odd. No `unsafe`: torn reads
//! are seen and dropped, never used.
//!
//! # Files
//!
//! With `NUVEC_DISTRIBUTED_RECORD_DIR` set (`nuvec-launch` sets it; set it by hand under
//! `mlx.launch`), a rank writes its record as JSON lines to `rank-<R>.jsonl` there (R: the rank
//! of the job, `MLX_RANK`) when one of its groups fails, as it exits (unless the file already
//! holds its last operation: see [`dump_at_exit`]), and when asked: a file `request` in
//! that directory whose content (a number) changed since the rank last answered. A thread of
//! the recorder looks for it every 100 ms; a library must not take a signal from its program,
//! so there is no signal to ask with. The same thread keeps `rank-<R>.progress` current (the
//! operations completed and when the last one ended), for a launcher that watches for a hang.
//! Every file is written to a temporary name and renamed, so a reader never sees half of one.
//! The format (one header line, then one line per operation, oldest first) is in the README's
//! "When a job fails".

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::sync::{Arc, OnceLock, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nuvec_core::DType;

use crate::collective::reduce::DTYPES;
use crate::config::env::{self, Env};
use crate::fabric::{Patience, Stall};

/// The most peers a slot names (a JACCL mesh has at most 7, a ring 2).
const PEERS: usize = 8;
/// "No peer" in a slot.
const NONE: u64 = u64::MAX;
/// How often the recorder's thread looks for a request.
const LOOK_EVERY: Duration = Duration::from_millis(100);
/// How often, at most, the progress file is rewritten.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);
/// How often a waiting operation's slot notes what it waits for.
const NOTE_EVERY: Duration = Duration::from_millis(500);
/// How many failed operations' error texts a group keeps.
const ERRORS: usize = 8;

/// The operations a record names, in the order of their codes.
const OPS: [&str; 8] = [
    "all_sum",
    "all_max",
    "all_min",
    "all_gather",
    "send",
    "recv",
    "split",
    "other",
];

/// What an operation is, as its communicator calls it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    /// Its name (`all_sum`, `send`, ...).
    pub(crate) op: &'static str,
    /// Its element type, when it has one.
    pub(crate) dtype: Option<DType>,
    /// Bytes per rank.
    pub(crate) bytes: usize,
    /// For a send or a receive: the peer.
    pub(crate) peer: Option<usize>,
}

impl Call {
    /// Operation `op` of `bytes`, no dtype, no peer.
    pub(crate) fn new(op: &'static str, bytes: usize) -> Self {
        Self {
            op,
            dtype: None,
            bytes,
            peer: None,
        }
    }
}

/// The state of a recorded operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running = 1,
    Done = 2,
    Failed = 3,
}

/// One slot of the ring buffer: a sequence lock over atomics.
#[derive(Default)]
struct Slot {
    /// Odd while being written; 0: never written.
    version: AtomicU64,
    /// The operation's index among those of the group (from 0).
    index: AtomicU64,
    seq: AtomicU64,
    /// op code | dtype index << 8 | state << 16.
    kind: AtomicU64,
    bytes: AtomicU64,
    start_us: AtomicU64,
    end_us: AtomicU64,
    /// The peer a waiting step waits on longest, [`NONE`] if none.
    waiting_on: AtomicU64,
    /// The bytes that transfer moved so far.
    waiting_done: AtomicU64,
    peers: [AtomicU64; PEERS],
}

/// A copy of one slot, read consistently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    index: u64,
    seq: u64,
    op: &'static str,
    dtype: Option<DType>,
    state: State,
    bytes: u64,
    start_us: u64,
    end_us: u64,
    waiting_on: Option<u64>,
    waiting_done: u64,
    peers: Vec<u64>,
}

impl Slot {
    /// Copies the slot if a consistent copy can be had in a few tries.
    fn read(&self) -> Option<Entry> {
        for _ in 0..8 {
            let before = self.version.load(Ordering::Acquire);
            if before == 0 {
                return None;
            }
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let kind = self.kind.load(Ordering::Relaxed);
            let entry = Entry {
                index: self.index.load(Ordering::Relaxed),
                seq: self.seq.load(Ordering::Relaxed),
                op: OPS[(kind & 0xff) as usize % OPS.len()],
                dtype: DTYPES.get(((kind >> 8) & 0xff) as usize).copied(),
                state: match (kind >> 16) & 0xff {
                    2 => State::Done,
                    3 => State::Failed,
                    _ => State::Running,
                },
                bytes: self.bytes.load(Ordering::Relaxed),
                start_us: self.start_us.load(Ordering::Relaxed),
                end_us: self.end_us.load(Ordering::Relaxed),
                waiting_on: Some(self.waiting_on.load(Ordering::Relaxed)).filter(|&p| p != NONE),
                waiting_done: self.waiting_done.load(Ordering::Relaxed),
                peers: self
                    .peers
                    .iter()
                    .map(|p| p.load(Ordering::Relaxed))
                    .filter(|&p| p != NONE)
                    .collect(),
            };
            fence(Ordering::Acquire);
            if self.version.load(Ordering::Relaxed) == before {
                return Some(entry);
            }
        }
        None
    }

    /// Runs `write` on the slot as its one writer, inside the sequence lock.
    fn write(&self, write: impl FnOnce(&Slot)) {
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        write(self);
        self.version.store((v | 1) + 1, Ordering::Release);
    }
}

/// The recorded operations of one group, shared by its communicator (the writer) and the
/// registry of records (the readers).
struct Ring {
    /// `world` for the first group of the process, `group-<n>` for the n-th after it.
    group: String,
    rank: usize,
    size: usize,
    slots: Box<[Slot]>,
    /// Operations started so far.
    started: AtomicU64,
    /// Error texts of failed operations, by operation index (the latest [`ERRORS`]).
    errors: std::sync::Mutex<Vec<(u64, String)>>,
    /// The slot of the operation running, plus one (0: none).
    running: AtomicU64,
    /// When, on the fabric's clock in nanoseconds, the running operation's wait is next
    /// noted ([`u64::MAX`]: no operation runs).
    due: AtomicU64,
    /// Whether the fabric fixes its clock's epoch (the simulator): the wall clock then says
    /// nothing of the record's times.
    fixed_epoch: bool,
    /// Operations completed (its one writer adds with a load and a store, no locked add; the
    /// progress file sums the groups').
    completed: AtomicU64,
}

/// The writer's side of a group's record, held by its communicator core.
pub(crate) struct Record {
    ring: Arc<Ring>,
    /// Unix time in µs and the fabric's clock at the group's first operation: the record's
    /// times are the fabric's from there.
    base: Option<(u64, Duration)>,
}

/// The process's records, for dumps; the completed operations and when the last ended, for
/// the progress file.
struct Registry {
    rings: std::sync::Mutex<Vec<Weak<Ring>>>,
    /// The records of groups that failed, kept alive (the last [`KEPT_FAILED`]): a group
    /// dropped after its failure (a sub-group whose `?` returned from `main`) must still be in
    /// the dump its process writes as it exits, or that dump would replace the failure's with
    /// a record that shows no error.
    failed: std::sync::Mutex<Vec<Arc<Ring>>>,
    groups: AtomicU64,
    /// Operations completed by the groups that are gone.
    completed: AtomicU64,
    last_end_us: AtomicU64,
    /// The groups' [`stamp`] when the record was last written to the record directory
    /// (`u64::MAX`: never).
    written: AtomicU64,
}

impl Registry {
    /// Operations completed by the process's groups, live and gone.
    fn completed(&self) -> u64 {
        let rings = self.rings.lock().unwrap_or_else(PoisonError::into_inner);
        let live: u64 = rings
            .iter()
            .filter_map(Weak::upgrade)
            .map(|r| r.completed.load(Ordering::Relaxed))
            .sum();
        self.completed.load(Ordering::Relaxed) + live
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Its count stays in the process's total.
        registry()
            .completed
            .fetch_add(self.completed.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        rings: std::sync::Mutex::new(Vec::new()),
        failed: std::sync::Mutex::new(Vec::new()),
        groups: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        last_end_us: AtomicU64::new(0),
        written: AtomicU64::new(u64::MAX),
    })
}

/// What has happened in the process's live groups: their operations begun and completed. A
/// record written at one stamp holds everything up to it.
fn stamp() -> u64 {
    registry()
        .rings
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(Weak::upgrade)
        .map(|r| {
            r.started
                .load(Ordering::Relaxed)
                .wrapping_add(r.completed.load(Ordering::Relaxed))
        })
        .fold(0, u64::wrapping_add)
}

/// The recorder's settings, read once from the environment (`init` has checked them).
struct Settings {
    capacity: usize,
    dir: Option<PathBuf>,
    rank: Option<usize>,
}

fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(|| {
        let env = Env::process();
        let capacity = env.record().ok().flatten().unwrap_or(env::DEFAULT_RECORD);
        Settings {
            capacity,
            // `None` for a recorder that keeps nothing (it writes nothing), or for a directory
            // `init` would have refused.
            dir: env.record_dir().ok().flatten(),
            rank: launch_rank(&env),
        }
    })
}

/// The rank as the launch gives it, for the record's file name: on a JACCL launch by JACCL's
/// rule (`JACCL_RANK` first, then `MLX_RANK`), else `MLX_RANK`; `None` if unset or not a
/// number.
fn launch_rank(env: &Env<'_>) -> Option<usize> {
    let names: &[&str] = if env.jaccl_launch() {
        &["JACCL_RANK", env::MLX_RANK]
    } else {
        &[env::MLX_RANK]
    };
    names
        .iter()
        .find_map(|name| env.raw(name))
        .and_then(|r| r.to_str().and_then(|r| r.trim().parse().ok()))
}

/// How many operations a group keeps (`NUVEC_DISTRIBUTED_RECORD`; 0: none).
pub(crate) fn capacity() -> usize {
    settings().capacity
}

/// Microseconds since the Unix epoch, now.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Record {
    /// The record of a group in which this process is `rank` of `size`, keeping `capacity`
    /// operations (`None` if 0), registered for dumps. `epoch_us`: the Unix time of the
    /// fabric clock's zero when the fabric fixes it ([`Fabric::epoch_us`]).
    ///
    /// [`Fabric::epoch_us`]: crate::fabric::Fabric::epoch_us
    pub(crate) fn new(
        rank: usize,
        size: usize,
        capacity: usize,
        epoch_us: Option<u64>,
    ) -> Option<Self> {
        if capacity == 0 {
            return None;
        }
        let registry = registry();
        let n = registry.groups.fetch_add(1, Ordering::Relaxed);
        let group = if n == 0 {
            "world".to_owned()
        } else {
            format!("group-{n}")
        };
        let ring = Arc::new(Ring {
            group,
            rank,
            size,
            slots: (0..capacity).map(|_| Slot::default()).collect(),
            started: AtomicU64::new(0),
            errors: std::sync::Mutex::new(Vec::new()),
            running: AtomicU64::new(0),
            due: AtomicU64::new(u64::MAX),
            fixed_epoch: epoch_us.is_some(),
            completed: AtomicU64::new(0),
        });
        let mut rings = registry
            .rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        rings.retain(|w| w.strong_count() > 0);
        rings.push(Arc::downgrade(&ring));
        drop(rings);
        watch();
        Some(Self {
            ring,
            base: epoch_us.map(|e| (e, Duration::ZERO)),
        })
    }

    /// A reader of this record that never waits for its writer.
    pub(crate) fn reader(&self) -> Reader {
        Reader(self.ring.clone())
    }

    /// What the fabric tells of a long wait, to note in this record.
    pub(crate) fn patience(&self) -> Box<dyn Patience> {
        Box::new(Noting(self.ring.clone()))
    }

    /// `at` on the fabric's clock as Unix time in µs (the first call reads the wall clock).
    fn unix_us(&mut self, at: Duration) -> u64 {
        let (unix, base) = *self.base.get_or_insert_with(|| (now_us(), at));
        // In u64 arithmetic: `as_micros` divides a u128, twice an operation.
        let since = at.saturating_sub(base);
        let since = since
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(since.subsec_micros()));
        unix.saturating_add(since)
    }

    /// Operation `call` starts at `start` on the fabric's clock, exchanging with `peers` (group
    /// ranks).
    pub(crate) fn begin(
        &mut self,
        call: &Call,
        seq: u64,
        peers: impl Iterator<Item = usize>,
        start: Duration,
    ) {
        let start_us = self.unix_us(start);
        // This record is the ring's one writer: a load and a store, no locked add.
        let index = self.ring.started.load(Ordering::Relaxed);
        self.ring.started.store(index + 1, Ordering::Relaxed);
        let at = (index % self.ring.slots.len() as u64) as usize;
        let op = OPS
            .iter()
            .position(|&o| o == call.op)
            .unwrap_or(OPS.len() - 1) as u64;
        let dtype = call
            .dtype
            .and_then(|d| DTYPES.iter().position(|&x| x == d))
            .map_or(0xff, |i| i as u64);
        let mut named = [NONE; PEERS];
        let peers = call
            .peer
            .into_iter()
            .chain(peers.filter(|_| call.peer.is_none()));
        for (slot, peer) in named.iter_mut().zip(peers) {
            *slot = peer as u64;
        }
        self.ring.slots[at].write(|s| {
            s.index.store(index, Ordering::Relaxed);
            s.seq.store(seq, Ordering::Relaxed);
            s.kind.store(
                op | dtype << 8 | (State::Running as u64) << 16,
                Ordering::Relaxed,
            );
            s.bytes.store(call.bytes as u64, Ordering::Relaxed);
            s.start_us.store(start_us, Ordering::Relaxed);
            s.end_us.store(0, Ordering::Relaxed);
            s.waiting_on.store(NONE, Ordering::Relaxed);
            s.waiting_done.store(0, Ordering::Relaxed);
            for (p, n) in s.peers.iter().zip(named) {
                p.store(n, Ordering::Relaxed);
            }
        });
        self.ring.running.store(at as u64 + 1, Ordering::Relaxed);
        self.ring
            .due
            .store(nanos(start.saturating_add(NOTE_EVERY)), Ordering::Relaxed);
    }

    /// The running operation ended at `now` on the fabric's clock, with `error` if it failed.
    pub(crate) fn end(&mut self, error: Option<&dyn std::fmt::Display>, now: Duration) {
        self.ring.due.store(u64::MAX, Ordering::Relaxed);
        let Some(at) = (self.ring.running.swap(0, Ordering::Relaxed) as usize).checked_sub(1)
        else {
            return;
        };
        let end = self.unix_us(now);
        let state = if error.is_some() {
            State::Failed
        } else {
            State::Done
        };
        let slot = &self.ring.slots[at];
        slot.write(|s| {
            let kind = s.kind.load(Ordering::Relaxed) & 0xffff;
            s.kind.store(kind | (state as u64) << 16, Ordering::Relaxed);
            s.end_us.store(end, Ordering::Relaxed);
            s.waiting_on.store(NONE, Ordering::Relaxed);
        });
        if let Some(error) = error {
            let index = slot.index.load(Ordering::Relaxed);
            let mut errors = self
                .ring
                .errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if errors.len() == ERRORS {
                errors.remove(0);
            }
            errors.push((index, error.to_string()));
        } else {
            let registry = registry();
            let completed = &self.ring.completed;
            completed.store(completed.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            registry.last_end_us.store(end, Ordering::Relaxed);
        }
    }
}

/// `d` in nanoseconds, saturated.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1)
}

/// The [`Patience`] that notes in a record what a waiting operation waits for, every
/// [`NOTE_EVERY`]. It runs on the fabric's thread, inside the operation: the slot's one writer
/// still.
struct Noting(Arc<Ring>);

impl Patience for Noting {
    fn due(&self) -> Option<Duration> {
        let due = self.0.due.load(Ordering::Relaxed);
        (due != u64::MAX).then(|| Duration::from_nanos(due))
    }

    fn report(&mut self, now: Duration, stall: &Stall) {
        let Some(at) = (self.0.running.load(Ordering::Relaxed) as usize).checked_sub(1) else {
            return;
        };
        self.0.slots[at].write(|s| {
            s.waiting_on
                .store(stall.channel.peer as u64, Ordering::Relaxed);
            s.waiting_done.store(stall.done as u64, Ordering::Relaxed);
        });
        self.0
            .due
            .store(nanos(now.saturating_add(NOTE_EVERY)), Ordering::Relaxed);
    }
}

impl Ring {
    /// The recorded operations, oldest first, and how many older ones were overwritten.
    fn entries(&self) -> (Vec<Entry>, u64) {
        let mut entries: Vec<Entry> = self.slots.iter().filter_map(Slot::read).collect();
        entries.sort_by_key(|e| e.index);
        let started = self.started.load(Ordering::Relaxed);
        let dropped = started.saturating_sub(self.slots.len() as u64);
        (entries, dropped)
    }

    /// One JSON line per recorded operation, appended to `out`.
    fn lines(&self, out: &mut String) -> u64 {
        self.lines_as(out, &self.group)
    }

    /// [`lines`](Self::lines), naming the group `group`.
    fn lines_as(&self, out: &mut String, group: &str) -> u64 {
        let (entries, dropped) = self.entries();
        let errors = self
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for e in entries {
            let error = errors
                .iter()
                .find(|(i, _)| *i == e.index)
                .map(|(_, text)| text.as_str());
            let moved: Vec<[u64; 2]> = e
                .waiting_on
                .map(|p| [p, e.waiting_done])
                .into_iter()
                .collect();
            let line = serde_json::json!({
                "group": group,
                "group_rank": self.rank,
                "group_size": self.size,
                "seq": e.seq,
                "op": e.op,
                "dtype": e.dtype.map(DType::name),
                "bytes": e.bytes,
                "peers": e.peers,
                "start_us": e.start_us,
                "end_us": (e.state != State::Running).then_some(e.end_us),
                "state": match e.state {
                    State::Running => "running",
                    State::Done => "done",
                    State::Failed => "failed",
                },
                "waiting_on": e.waiting_on.into_iter().collect::<Vec<_>>(),
                "moved": moved,
                "error": error,
            });
            let _ = writeln!(out, "{line}");
        }
        dropped
    }
}

/// One group's record, read from any thread without waiting for its operations.
pub(crate) struct Reader(Arc<Ring>);

impl Reader {
    /// The group's record as a rank's file holds it (a header, then its operations), with the
    /// group as the job: the header names its rank and size, its operations the group
    /// `world`. For ranks that share a process (the simulator), whose process-wide dumps
    /// cannot be told apart.
    pub(crate) fn text(&self) -> String {
        let ring = &self.0;
        let mut body = String::new();
        let dropped = ring.lines_as(&mut body, "world");
        // On a fixed clock (virtual time) the record is as of its last event.
        let at_us = if ring.fixed_epoch {
            ring.entries()
                .0
                .iter()
                .map(|e| e.end_us.max(e.start_us))
                .max()
                .unwrap_or(0)
        } else {
            now_us()
        };
        let header = serde_json::json!({
            "record": 1,
            "rank": ring.rank,
            "size": ring.size,
            "host": hostname(),
            "pid": std::process::id(),
            "reason": "request",
            "request": null,
            "at_us": at_us,
            "capacity": ring.slots.len(),
            "dropped": dropped,
        });
        format!("{header}\n{body}")
    }
}

/// The process's record as JSON lines: a header, then every group's operations.
pub(crate) fn dump_text(reason: &str, request: Option<u64>) -> String {
    let rings: Vec<Arc<Ring>> = registry()
        .rings
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let mut body = String::new();
    let mut dropped = 0;
    for ring in &rings {
        dropped += ring.lines(&mut body);
    }
    let world = rings.iter().find(|r| r.group == "world");
    let header = serde_json::json!({
        "record": 1,
        "rank": settings().rank.or(world.map(|w| w.rank)),
        "size": world.map(|w| w.size),
        "host": hostname(),
        "pid": std::process::id(),
        "reason": reason,
        "request": request,
        "at_us": now_us(),
        "capacity": settings().capacity,
        "dropped": dropped,
    });
    format!("{header}\n{body}")
}

/// This host's name (for the record's header), `None` if it cannot be read.
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// The file name of this rank's record in the record directory.
fn file_stem() -> String {
    let rank = settings()
        .rank
        .map_or_else(|| format!("pid-{}", std::process::id()), |r| r.to_string());
    format!("rank-{rank}")
}

/// Writes `text` to `path` through a temporary file and a rename. Each write has its own
/// temporary file: the recorder's thread and an exiting or failing operation may write the
/// same file at once.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("{n}.tmp"));
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        // A full disk fails every try: none may leave its temporary file behind.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// How many failed groups' records a process keeps alive after the groups are gone.
const KEPT_FAILED: usize = 16;

impl Record {
    /// Keeps this group's record for the life of the process (see `Registry::failed`): called
    /// when the group fails.
    pub(crate) fn keep(&self) {
        let mut failed = registry()
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !failed.iter().any(|r| Arc::ptr_eq(r, &self.ring)) {
            if failed.len() == KEPT_FAILED {
                failed.remove(0);
            }
            failed.push(Arc::clone(&self.ring));
        }
    }
}

/// Writes the process's record to the record directory, if one is set: after a failure.
pub(crate) fn dump_on_failure() {
    if let Some(dir) = &settings().dir {
        let _ = dump_to(dir, "failure", None);
    }
}

/// Writes the process's record to the record directory, if one is set and the file there
/// (if any) is older than the groups' last operation: as the process exits (from `main` or
/// `std::process::exit`, a panic that ends `main` included; not on a signal). The ranks of a
/// job that returned without an error, wrong numbers included (a mismatch on MLX's wire, which
/// cannot see it), are then in the merged records beside the ones that failed.
fn dump_at_exit() {
    EXITING.store(true, Ordering::Relaxed);
    if let Some(dir) = &settings().dir
        && registry().written.load(Ordering::Relaxed) != stamp()
    {
        let _ = dump_to(dir, "exit", None);
    }
}

/// Set as the process exits: from then on no request is answered, so that an answer cannot be
/// written over the exit's dump. (A failure's dump still is: an operation that fails while
/// the process exits has news the exit's dump may lack, and the dumps read their text one at
/// a time, so a later dump is never older.)
static EXITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes the process's record to `dir`, as `rank-<R>.jsonl`, one dump at a time (the
/// recorder's thread answering a request, a failing operation and the exit may dump at once;
/// each reads the text and renames it into place before the next begins). Once the process
/// exits, requests are no longer answered.
fn dump_to(dir: &Path, reason: &str, request: Option<u64>) -> std::io::Result<PathBuf> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    if reason == "request" && EXITING.load(Ordering::Relaxed) {
        return Err(std::io::Error::other("the process is exiting"));
    }
    let path = dir.join(format!("{}.jsonl", file_stem()));
    // Before the text is read: an operation that begins meanwhile makes the stamp stale.
    let stamp = stamp();
    write_atomically(&path, &dump_text(reason, request))?;
    registry().written.store(stamp, Ordering::Relaxed);
    Ok(path)
}

/// Registers [`dump_at_exit`] with the C library's `atexit`, which runs it as the process
/// exits normally. No other hook sees `std::process::exit`: Rust runs no destructors there.
#[cfg(any(target_os = "linux", target_vendor = "apple"))]
fn dump_at_exit_registered() {
    extern "C" fn at_exit() {
        // Unwinding out of an `extern "C"` function aborts: a panic stays here.
        let _ = std::panic::catch_unwind(dump_at_exit);
    }
    // SAFETY: `atexit` only stores the pointer to `at_exit`, a function with the C ABI and
    // no arguments that lives as long as the process (it is not in a library that could be
    // unloaded: it is linked into the program) and never unwinds; called once per process
    // (under `watch`'s `OnceLock`), far below the C library's limit of 32 registrations.
    let _ = unsafe { libc::atexit(at_exit) };
}

/// Elsewhere no record is written at exit.
#[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
fn dump_at_exit_registered() {}

/// Starts the recorder's thread once per process, if a record directory is set: it answers
/// requests and keeps the progress file current.
fn watch() {
    static STARTED: OnceLock<()> = OnceLock::new();
    let Some(dir) = settings().dir.clone() else {
        return;
    };
    STARTED.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("nuvec-record".into())
            .spawn(move || watch_loop(&dir));
        dump_at_exit_registered();
    });
}

/// The recorder's thread: forever, every [`LOOK_EVERY`].
fn watch_loop(dir: &Path) {
    let mut look = Look::default();
    loop {
        look.at(dir);
        std::thread::sleep(LOOK_EVERY);
    }
}

/// What the recorder's thread remembers between two looks.
#[derive(Default)]
struct Look {
    /// The last request answered.
    answered: Option<u64>,
    /// The completed operations the progress file says, and when it was written.
    written: Option<(u64, std::time::Instant)>,
}

impl Look {
    /// One look at `dir`: answers a new request, rewrites the progress file if due.
    fn at(&mut self, dir: &Path) {
        if let Some(id) = std::fs::read_to_string(dir.join("request"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            && self.answered != Some(id)
            && dump_to(dir, "request", Some(id)).is_ok()
        {
            self.answered = Some(id);
        }
        let registry = registry();
        let completed = registry.completed();
        let due = match self.written {
            None => true,
            Some((n, at)) => n != completed && at.elapsed() >= PROGRESS_EVERY,
        };
        if due {
            let text = serde_json::json!({
                "rank": settings().rank,
                "completed": completed,
                "last_end_us": registry.last_end_us.load(Ordering::Relaxed),
            })
            .to_string();
            let progress = dir.join(format!("{}.progress", file_stem()));
            if write_atomically(&progress, &text).is_ok() {
                self.written = Some((completed, std::time::Instant::now()));
            }
        }
    }
}

#[cfg(test)]
mod tests;
