//! JACCL's cables, one at a time (pure): which pairs of ranks a JACCL job cables, what is
//! measured on each, and how the measurements join the report.
//!
//! A JACCL job's cables carry RDMA, not TCP, so the doctor's probes cannot measure them as
//! they measure a ring's links. The sweep's ranks can: they have connected this crate's JACCL
//! over the job's devices (`sweep_rank.rs`), and a send or receive between two neighbours
//! goes over the cable between them. Before the all_sum sweep, the ranks take the cables one
//! at a time ([`pairs`]: every pair of a mesh, each neighbour pair of a ring), all ranks
//! between two cables in a one-byte all_sum (the barrier), and on each the lower rank
//! measures, through the job's arrays (`nuvec_core::distributed::send`/`recv`), as a job
//! moves its bytes:
//! - round trips of 8 bytes ([`PINGS`] after [`WARM`] warm-ups), p50/p99;
//! - [`BYTES`] each way, [`TRANSFERS`] times after one warm-up (the buffers' first touch,
//!   their registration), the fastest kept: forward (lower → higher),
//!   timed on the lower rank from the send to the higher rank's one-byte answer, and back,
//!   timed from the lower rank's one-byte go to the last byte received. Each includes one
//!   small message's latency, a few µs on RDMA against ms for the bytes.
//!
//! The cables become link rows of the report ([`rows`]) and the findings of the links
//! (`report::findings`: a direction below half the median of the cables, a cable asymmetric
//! below 0.7x, a rank on every slow cable) apply to them as to the ring's links, with their
//! own median: RDMA's rates are not TCP's.

use serde::{Deserialize, Serialize};

use super::measure::{Measurement, Rtt, Transfer};
use super::report::{self, Row};

/// Bytes each way per transfer.
pub(crate) const BYTES: usize = 8 << 20;
/// Round trips of 8 bytes per cable, after [`WARM`].
pub(crate) const PINGS: usize = 50;
/// Round trips not counted.
pub(crate) const WARM: usize = 3;
/// Transfers each way; the fastest is kept.
pub(crate) const TRANSFERS: usize = 3;

/// One cable as its lower rank measured it (its part of `{"swept": ...}`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Cable {
    /// The lower rank.
    pub(crate) from: usize,
    /// The higher rank.
    pub(crate) to: usize,
    /// `from`'s devices to `to`, as the device file names them (several: several cables
    /// that JACCL drives together).
    pub(crate) devices: Vec<String>,
    /// Round trips of 8 bytes.
    pub(crate) rtt: Option<Rtt>,
    /// [`BYTES`] from `from` to `to`, the fastest of [`TRANSFERS`].
    pub(crate) forward: Option<Transfer>,
    /// [`BYTES`] from `to` to `from`.
    pub(crate) back: Option<Transfer>,
    /// Why the measurement stopped (the library's error).
    pub(crate) error: Option<String>,
}

/// The cabled pairs `(lower, higher)` of a JACCL job of `ranks` ranks, in the order they are
/// measured: every pair of a mesh; each neighbour pair of a ring (`(0, 1)`, `(1, 2)`, ...,
/// `(0, R-1)`).
pub(crate) fn pairs(ranks: usize, ring: bool) -> Vec<(usize, usize)> {
    if ring {
        let mut out: Vec<(usize, usize)> = (0..ranks)
            .filter(|_| ranks > 1)
            .map(|i| {
                let j = (i + 1) % ranks;
                (i.min(j), i.max(j))
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    } else {
        (0..ranks)
            .flat_map(|i| (i + 1..ranks).map(move |j| (i, j)))
            .collect()
    }
}

/// The cables as the report's link rows (`0→1`, address `RDMA <devices>`), hosts from
/// `hosts` (by rank; empty where unknown).
pub(crate) fn rows(cables: &[Cable], hosts: &[String]) -> Vec<Row> {
    let host = |r: usize| hosts.get(r).cloned().unwrap_or_default();
    cables
        .iter()
        .map(|c| Row {
            from: c.from,
            to: c.to,
            from_host: host(c.from),
            to_host: host(c.to),
            connection: 0,
            address: format!("RDMA {}", c.devices.join("+")),
            measurement: Some(Measurement {
                rtt: c.rtt.clone(),
                forward: c.forward.clone(),
                back: c.back.clone(),
                error: c.error.clone(),
                ..Measurement::default()
            }),
            failure: None,
            flags: Vec::new(),
        })
        .collect()
}

/// The cables' table for people: a line per cable (`0↔1`), its devices, round trips,
/// each direction's rate and its flags.
pub(crate) fn table(rows: &[Row]) -> Vec<String> {
    let mut cells = vec![
        [
            "cable",
            "devices",
            "rtt p50/p99",
            "forward",
            "back",
            "flags",
        ]
        .map(str::to_owned),
    ];
    for row in rows {
        let m = row.measurement.as_ref();
        let (forward, back) = row.rates();
        let rate = |v: Option<f64>| v.map_or("-".to_owned(), report::rate);
        cells.push([
            format!("{}↔{}", row.from, row.to),
            row.address
                .strip_prefix("RDMA ")
                .unwrap_or(&row.address)
                .to_owned(),
            m.and_then(|m| m.rtt.as_ref()).map_or("-".to_owned(), |r| {
                format!("{:.0}/{:.0} µs", r.p50_us, r.p99_us)
            }),
            rate(forward),
            rate(back),
            if row.flags.is_empty() {
                "-".to_owned()
            } else {
                row.flags.join(", ")
            },
        ]);
    }
    crate::table::aligned(&cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mesh_cables_every_pair_and_a_ring_its_neighbours() {
        assert_eq!(pairs(2, false), [(0, 1)]);
        assert_eq!(pairs(2, true), [(0, 1)]);
        assert_eq!(pairs(3, false), [(0, 1), (0, 2), (1, 2)]);
        assert_eq!(pairs(4, true), [(0, 1), (0, 3), (1, 2), (2, 3)]);
        assert_eq!(pairs(1, true), Vec::<(usize, usize)>::new());
        assert_eq!(pairs(1, false), Vec::<(usize, usize)>::new());
    }

    #[test]
    fn a_slow_cable_is_flagged_against_the_median_of_the_cables() {
        let fast = Transfer {
            bytes: BYTES as u64,
            seconds: 0.001,
        };
        let slow = Transfer {
            bytes: BYTES as u64,
            seconds: 0.01,
        };
        let cable = |from, to, back: &Transfer| Cable {
            from,
            to,
            devices: vec![format!("rdma_en{to}")],
            forward: Some(fast.clone()),
            back: Some(back.clone()),
            ..Cable::default()
        };
        let cables = [cable(0, 1, &fast), cable(0, 2, &fast), cable(1, 2, &slow)];
        let hosts: Vec<String> = ["a", "b", "c"].map(str::to_owned).to_vec();
        let mut rows = rows(&cables, &hosts);
        let (problems, median) = super::super::report::findings(&mut rows);
        assert_eq!(median, Some(fast.bps()));
        assert_eq!(rows[2].address, "RDMA rdma_en2");
        assert_eq!(rows[2].flags, ["slow back", "asymmetric"]);
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("link 1→2 (RDMA rdma_en2) is slow back: ")),
            "{problems:?}"
        );
    }
}
