//! Faults asked for by the environment: lost messages, a failing work request, a process that
//! dies in silence.
//!
//! They exist so that tests of the fabric can show each failure ends in an error by the
//! deadline rather than in a hang or wrong data. Counting is per process, across all devices,
//! because a launcher sets the variables per process:
//!
//! - `NUVEC_VERBS_EMU_LOSS=<p>`: each message handed to the transport is dropped with
//!   probability `p`, drawn from a ChaCha8 generator seeded by `NUVEC_VERBS_EMU_SEED` (default
//!   0), so a run is repeatable. The send still completes successfully (UC has no
//!   acknowledgement).
//! - `NUVEC_VERBS_EMU_FAIL_WR=<k>`: the k-th work request posted in the process (sends and
//!   receives together, counting from 1) completes at once with `IBV_WC_GENERAL_ERR`, and its
//!   queue pair enters the error state, as after any error completion.
//! - `NUVEC_VERBS_EMU_DIE_AFTER=<n>`: right after the n-th message is handed to the transport
//!   (lost ones count), the process sends itself `SIGKILL`: no teardown, no goodbye, its
//!   sockets vanish and its peers see only silence.

use crate::config::{self, Config};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// The process's fault state.
#[derive(Debug)]
pub(crate) struct Faults {
    /// The loss probability.
    loss: f64,
    /// The loss generator.
    rng: Mutex<ChaCha8Rng>,
    /// The work request that fails, counting from 1.
    fail_wr: Option<u64>,
    /// The message count after which the process dies.
    die_after: Option<u64>,
    /// Work requests posted so far.
    posted: AtomicU64,
    /// Messages sent so far.
    sent: AtomicU64,
}

impl Faults {
    /// The fault state a configuration asks for.
    pub(crate) fn new(config: &Config) -> Faults {
        Faults {
            loss: config.loss,
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(config.seed)),
            fail_wr: config.fail_wr,
            die_after: config.die_after,
            posted: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }

    /// Counts a posted work request; true when it is the one that fails.
    pub(crate) fn posted_fails(&self) -> bool {
        let n = self.posted.fetch_add(1, Ordering::Relaxed) + 1;
        self.fail_wr == Some(n)
    }

    /// Whether the next message is lost.
    pub(crate) fn lose(&self) -> bool {
        if self.loss <= 0.0 {
            return false;
        }
        let draw: f64 = self
            .rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .random();
        draw < self.loss
    }

    /// Counts a message handed to the transport, and dies after the configured one.
    pub(crate) fn sent(&self) {
        let n = self.sent.fetch_add(1, Ordering::Relaxed) + 1;
        if self.die_after == Some(n) {
            die();
        }
    }
}

/// Ends the process at once, without unwinding, flushing or closing anything.
fn die() -> ! {
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: `kill` has no memory-safety preconditions; SIGKILL to ourselves ends the process.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    // Not reached: a signal a process sends itself is delivered before `kill` returns.
    std::process::abort()
}

/// Whether the configuration refuses `IBV_WR_SEND_WITH_IMM` (`NUVEC_VERBS_EMU_NO_IMM=1`).
pub(crate) fn immediate_refused() -> bool {
    config::get().as_ref().is_ok_and(|c| c.no_imm)
}

/// The process's fault state (no faults when the configuration is bad; nothing can be opened
/// then anyway).
pub(crate) fn get() -> &'static Faults {
    static FAULTS: OnceLock<Faults> = OnceLock::new();
    FAULTS.get_or_init(|| match config::get() {
        Ok(config) => Faults::new(config),
        Err(_) => Faults {
            loss: 0.0,
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(0)),
            fail_wr: None,
            die_after: None,
            posted: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Config {
        Config::from_lookup(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
        .unwrap()
    }

    #[test]
    fn only_the_kth_work_request_fails() {
        let faults = Faults::new(&config(&[("NUVEC_VERBS_EMU_FAIL_WR", "3")]));
        let fails: Vec<bool> = (0..5).map(|_| faults.posted_fails()).collect();
        assert_eq!(fails, [false, false, true, false, false]);
    }

    #[test]
    fn loss_is_repeatable_and_near_its_probability() {
        let draws = |seed: &str| {
            let faults = Faults::new(&config(&[
                ("NUVEC_VERBS_EMU_LOSS", "0.3"),
                ("NUVEC_VERBS_EMU_SEED", seed),
            ]));
            (0..2000).map(|_| faults.lose()).collect::<Vec<_>>()
        };
        let a = draws("5");
        assert_eq!(a, draws("5"));
        assert_ne!(a, draws("6"));
        let lost = a.iter().filter(|&&l| l).count();
        assert!((500..700).contains(&lost), "{lost} of 2000 lost");
    }

    #[test]
    fn no_loss_without_the_variable() {
        let faults = Faults::new(&config(&[]));
        assert!((0..1000).all(|_| !faults.lose()));
    }
}
