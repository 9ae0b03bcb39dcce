//! The per-queue-pair message log (`NUVEC_VERBS_EMU_TRACE=<path>`): one line per message a
//! queue pair sends (when the send is handed to the wire) and per message that lands in one of
//! its posted receives, appended to the file by every process of a job.
//!
//! Why: two jobs of the same shape, one whose ranks all run one implementation of JACCL and
//! one that mixes in another, must put the same messages on every queue pair, in the same
//! order and of the same sizes. Queue-pair numbers and endpoints differ from run to run, so a
//! line names its queue pair by what is stable across jobs of one shape: the rank
//! (`MLX_RANK`, else `JACCL_RANK`, else `?`), the device and the queue pair's place among
//! those the process created on that device (0 for the first):
//!
//! ```text
//! send rank=0 device=rdma_en1 qp=0 bytes=4096
//! recv rank=1 device=rdma_en2 qp=0 bytes=4096
//! ```
//!
//! Lines of one queue pair are written in the order its messages were posted or landed;
//! lines of different queue pairs interleave as they happen. Each line is one `write` to a
//! file opened for appending, so lines of different processes never mix.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::config;

/// What happened to a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A send was handed to the wire.
    Send,
    /// A message landed in a posted receive.
    Recv,
}

/// The name of a queue pair in the log: `rank=… device=… qp=…`.
pub(crate) fn label(rank: &str, device: &str, ordinal: usize) -> String {
    format!("rank={rank} device={device} qp={ordinal}")
}

/// This process's rank as the launcher's environment gives it.
pub(crate) fn rank() -> String {
    std::env::var("MLX_RANK")
        .or_else(|_| std::env::var("JACCL_RANK"))
        .unwrap_or_else(|_| "?".to_owned())
}

/// One line of the log.
pub(crate) fn line(event: Event, label: &str, bytes: usize) -> String {
    let kind = match event {
        Event::Send => "send",
        Event::Recv => "recv",
    };
    format!("{kind} {label} bytes={bytes}\n")
}

/// An open log.
#[derive(Debug)]
pub(crate) struct Log(Mutex<File>);

impl Log {
    /// Opens `path` for appending (creating it).
    pub(crate) fn open(path: &Path) -> std::io::Result<Log> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Log(Mutex::new(file)))
    }

    /// Appends the line of `event` on the queue pair `label`.
    pub(crate) fn record(&self, event: Event, label: &str, bytes: usize) {
        let text = line(event, label, bytes);
        let mut file = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = file.write_all(text.as_bytes()) {
            eprintln!("nuvec-verbs-emu: cannot append to NUVEC_VERBS_EMU_TRACE: {e}");
        }
    }
}

/// The process's log, when `NUVEC_VERBS_EMU_TRACE` asks for one (opened on first use).
pub(crate) fn get() -> Option<&'static Log> {
    static LOG: OnceLock<Option<Log>> = OnceLock::new();
    LOG.get_or_init(|| {
        let path = config::get().as_ref().ok()?.trace.as_ref()?;
        Log::open(path)
            .map_err(|e| {
                eprintln!(
                    "nuvec-verbs-emu: cannot open NUVEC_VERBS_EMU_TRACE={}: {e}",
                    path.display()
                );
            })
            .ok()
    })
    .as_ref()
}

/// Records `event` on the queue pair `label` when the log is on.
pub(crate) fn record(event: Event, label: &str, bytes: usize) {
    if let Some(log) = get() {
        log.record(event, label, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_the_event_the_queue_pair_and_the_size() {
        let label = label("2", "rdma_en3", 1);
        assert_eq!(label, "rank=2 device=rdma_en3 qp=1");
        assert_eq!(
            line(Event::Send, &label, 4096),
            "send rank=2 device=rdma_en3 qp=1 bytes=4096\n"
        );
        assert_eq!(
            line(Event::Recv, &label, 0),
            "recv rank=2 device=rdma_en3 qp=1 bytes=0\n"
        );
    }

    #[test]
    fn records_are_appended_one_line_each_in_order() {
        let path =
            std::env::temp_dir().join(format!("nuvec-verbs-emu-trace-test-{}", std::process::id()));
        std::fs::write(&path, "earlier\n").expect("write");
        let log = Log::open(&path).expect("open");
        log.record(Event::Send, "rank=0 device=d qp=0", 8);
        log.record(Event::Recv, "rank=0 device=d qp=1", 16);
        let text = std::fs::read_to_string(&path).expect("read");
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            text,
            "earlier\nsend rank=0 device=d qp=0 bytes=8\nrecv rank=0 device=d qp=1 bytes=16\n"
        );
    }
}
