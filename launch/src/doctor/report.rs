//! What the doctor concludes from the links it measured (pure): the flags of each link
//! ([`findings`]: a port that does not answer or is taken, a link that failed, a link far
//! slower than its siblings, asymmetric directions, different MTUs at its ends, a host whose
//! links leave from several interfaces), the table for people ([`table`]) and the JSON for
//! scripts ([`Report`]), which also carries the all_sum sweep (`sweep.rs`).
//!
//! The thresholds: a direction slower than [`SLOW`] times the median of every direction of
//! the job's links is slow; a link whose slower direction is below [`ASYMMETRIC`] times its
//! faster one is asymmetric.

use serde::Serialize;

use super::measure::Measurement;
use super::sweep::Sweep;

/// A direction below this fraction of the median of all directions is slow.
pub(crate) const SLOW: f64 = 0.5;
/// A link whose slower direction is below this fraction of the faster one is asymmetric.
pub(crate) const ASYMMETRIC: f64 = 0.7;

/// One link of the job and what was measured on it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Row {
    /// The rank that connects (in the job as in the probe).
    pub(crate) from: usize,
    /// The rank it connects to.
    pub(crate) to: usize,
    /// `from`'s host (its ssh name).
    pub(crate) from_host: String,
    /// `to`'s host.
    pub(crate) to_host: String,
    /// The connection (address index in `to`'s host file entry).
    pub(crate) connection: usize,
    /// The job's address of the link (`to`'s `ip:port`).
    pub(crate) address: String,
    /// What was measured, when the probe answered.
    pub(crate) measurement: Option<Measurement>,
    /// Why there is no measurement.
    pub(crate) failure: Option<String>,
    /// The link's flags (set by [`findings`]).
    pub(crate) flags: Vec<String>,
}

impl Row {
    /// `0→1` or `0→1 #2` for connection 2.
    pub(crate) fn name(&self) -> String {
        if self.connection == 0 {
            format!("{}→{}", self.from, self.to)
        } else {
            format!("{}→{} #{}", self.from, self.to, self.connection)
        }
    }

    /// Bits per second forward and back.
    pub(crate) fn rates(&self) -> (Option<f64>, Option<f64>) {
        let m = self.measurement.as_ref();
        (
            m.and_then(|m| m.forward.as_ref()).map(|t| t.bps()),
            m.and_then(|m| m.back.as_ref()).map(|t| t.bps()),
        )
    }

    fn port(&self) -> &str {
        self.address.rsplit_once(':').map_or("?", |(_, p)| p)
    }
}

/// The whole report, as `--json` prints it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Report {
    /// The backend.
    pub(crate) backend: String,
    /// Each rank's host checks.
    pub(crate) ranks: Vec<RankReport>,
    /// Each link, with its flags.
    pub(crate) links: Vec<Row>,
    /// The links' problems, in words.
    pub(crate) link_problems: Vec<String>,
    /// The median of every direction's rate, bits per second.
    pub(crate) median_bps: Option<f64>,
    /// The all_sum sweep of the whole job, when it was run (or said why not).
    pub(crate) sweep: Option<Sweep>,
}

/// One rank's host checks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct RankReport {
    /// The rank.
    pub(crate) rank: usize,
    /// Its host.
    pub(crate) host: String,
    /// What was seen.
    pub(crate) seen: Vec<String>,
    /// What is wrong.
    pub(crate) problems: Vec<String>,
}

impl Report {
    /// How many problems, host checks and links together.
    pub(crate) fn problems(&self) -> usize {
        self.ranks.iter().map(|r| r.problems.len()).sum::<usize>()
            + self.link_problems.len()
            + self.sweep.as_ref().map_or(0, |s| s.problems.len())
    }
}

/// A rate for people: `941 Mbit/s`, `2.35 Gbit/s`.
pub(crate) fn rate(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else {
        format!("{:.0} Mbit/s", bps / 1e6)
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
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

/// Sets every row's flags and returns the problems in words, with the median rate.
pub(crate) fn findings(rows: &mut [Row]) -> (Vec<String>, Option<f64>) {
    let mut problems = Vec::new();
    let all: Vec<f64> = rows
        .iter()
        .flat_map(|r| {
            let (f, b) = r.rates();
            [f, b]
        })
        .flatten()
        .filter(|v| *v > 0.0)
        .collect();
    let med = median(all);
    let mut slow_ranks: Vec<Vec<usize>> = Vec::new();
    for row in rows.iter_mut() {
        let name = row.name();
        let (port, to_host) = (row.port().to_owned(), row.to_host.clone());
        let mut flags = Vec::new();
        if let Some(why) = &row.failure {
            flags.push("failed".to_owned());
            problems.push(format!("link {name} ({}): {why}", row.address));
        }
        let Some(m) = &row.measurement else {
            row.flags = flags;
            continue;
        };
        if let Some(p) = &m.job_port {
            match p.outcome.as_str() {
                "timeout" => {
                    flags.push(format!("port {port} dropped"));
                    problems.push(format!(
                        "port {port} on host {to_host} does not answer: a firewall dropping it? \
                         (link {name}: rank {} listens on {} in the job, rank {} connects; a \
                         connect there got no answer within {:.0} ms, where a port nobody \
                         listens on is refused at once)",
                        row.to, row.address, row.from, p.ms
                    ));
                }
                "open" => {
                    flags.push(format!("port {port} taken"));
                    problems.push(format!(
                        "port {port} on host {to_host} is already taken (another job?): the \
                         job's rank {} could not listen on {} (link {name})",
                        row.to, row.address
                    ));
                }
                "error" => {
                    flags.push(format!("port {port} unreachable"));
                    problems.push(format!(
                        "port {port} on host {to_host}: {} (link {name}, {})",
                        p.detail.as_deref().unwrap_or("error"),
                        row.address
                    ));
                }
                _ => {}
            }
        }
        if let Some(why) = &m.error {
            flags.push("failed".to_owned());
            problems.push(format!("link {name} ({}): {why}", row.address));
        }
        let (fwd, back) = row.rates();
        let via = m
            .from
            .as_ref()
            .map(|e| {
                format!(
                    ", leaving rank {} from {} {}",
                    row.from,
                    e.interface.as_deref().unwrap_or("?"),
                    e.local
                )
            })
            .unwrap_or_default();
        if let Some(med) = med {
            let mut slow = false;
            for (dir, v) in [("forward", fwd), ("back", back)] {
                if let Some(v) = v.filter(|v| *v < SLOW * med) {
                    flags.push(format!("slow {dir}"));
                    problems.push(format!(
                        "link {name} ({}) is slow {dir}: {} is {:.2}x the median {} of the \
                         job's links{via}",
                        row.address,
                        rate(v),
                        v / med,
                        rate(med)
                    ));
                    slow = true;
                }
            }
            if slow {
                slow_ranks.push(vec![row.from, row.to]);
            }
        }
        if let (Some(f), Some(b)) = (fwd, back) {
            let (lo, hi) = (f.min(b), f.max(b));
            if hi > 0.0 && lo < ASYMMETRIC * hi {
                flags.push("asymmetric".to_owned());
                problems.push(format!(
                    "link {name} ({}) is asymmetric: forward {}, back {} ({:.2}x)",
                    row.address,
                    rate(f),
                    rate(b),
                    lo / hi
                ));
            }
        }
        if let (Some(a), Some(b)) = (
            m.from.as_ref().and_then(|e| e.mtu),
            m.to.as_ref().and_then(|e| e.mtu),
        ) && a != b
        {
            flags.push("MTU".to_owned());
            problems.push(format!(
                "link {name} ({}): the MTU is {a} at rank {} and {b} at rank {}",
                row.address, row.from, row.to
            ));
        }
        row.flags = flags;
    }
    // A rank on every slow link (of two or more) is the likely culprit.
    if slow_ranks.len() > 1 {
        let first = slow_ranks[0].clone();
        for r in first {
            if slow_ranks.iter().all(|s| s.contains(&r)) {
                let host = rows
                    .iter()
                    .find_map(|row| {
                        (row.from == r)
                            .then(|| row.from_host.clone())
                            .or_else(|| (row.to == r).then(|| row.to_host.clone()))
                    })
                    .unwrap_or_default();
                problems.push(format!(
                    "rank {r} (host {host}) is on every slow link: its network interface or \
                     cable is the likely cause"
                ));
            }
        }
    }
    problems.extend(interfaces(rows));
    (problems, med)
}

/// The hosts whose links leave from or arrive at more than one interface while one of their
/// links is slow: the interfaces say where to look. Several interfaces alone are no problem: a
/// ring of Macs cabled by Thunderbolt takes every cable on its own interface (a rank accepts
/// from its left neighbour on one cable and connects to its right one on another), and two
/// cables between two Macs are two interfaces by design.
fn interfaces(rows: &mut [Row]) -> Vec<String> {
    use std::collections::BTreeMap;
    // rank -> interface -> (address, links)
    let mut seen: BTreeMap<usize, BTreeMap<String, (String, Vec<String>)>> = BTreeMap::new();
    let mut hosts: BTreeMap<usize, String> = BTreeMap::new();
    for row in rows.iter() {
        let Some(m) = &row.measurement else { continue };
        for (rank, host, end) in [
            (row.from, &row.from_host, &m.from),
            (row.to, &row.to_host, &m.to),
        ] {
            let Some(e) = end else { continue };
            let Some(name) = &e.interface else { continue };
            let ip = e
                .local
                .rsplit_once(':')
                .map_or(e.local.as_str(), |(ip, _)| ip)
                .to_owned();
            hosts.insert(rank, host.clone());
            seen.entry(rank)
                .or_default()
                .entry(name.clone())
                .or_insert_with(|| (ip, Vec::new()))
                .1
                .push(row.name());
        }
    }
    let mut problems = Vec::new();
    for (rank, by_interface) in seen {
        let on_a_slow_link = rows.iter().any(|row| {
            (row.from == rank || row.to == rank) && row.flags.iter().any(|f| f.starts_with("slow"))
        });
        if by_interface.len() < 2 || !on_a_slow_link {
            continue;
        }
        let list: Vec<String> = by_interface
            .iter()
            .map(|(name, (ip, links))| format!("{name} ({ip}) for {}", links.join(", ")))
            .collect();
        problems.push(format!(
            "rank {rank} (host {}) sends and receives on {} interfaces: {}; the job's traffic \
             there is split across them and goes at the slower one's pace (is one of the host \
             file's addresses on another network, Wi-Fi or a bridge?)",
            hosts.get(&rank).map_or("", String::as_str),
            by_interface.len(),
            list.join("; ")
        ));
        for row in rows.iter_mut() {
            if (row.from == rank || row.to == rank) && !row.flags.iter().any(|f| f == "interfaces")
            {
                row.flags.push("interfaces".to_owned());
            }
        }
    }
    problems
}

/// The table for people: one row per link.
pub(crate) fn table(rows: &[Row]) -> String {
    let header = [
        "link",
        "address",
        "from (interface address)",
        "to",
        "MTU",
        "connect",
        "rtt p50/p99",
        "forward",
        "back",
        "flags",
    ];
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| (*s).to_owned()).collect()];
    for row in rows {
        let m = row.measurement.as_ref();
        let ip = |e: &super::endpoint::Endpoint| {
            e.local
                .rsplit_once(':')
                .map_or(e.local.clone(), |(ip, _)| ip.to_owned())
        };
        let from = m.and_then(|m| m.from.as_ref()).map_or("-".to_owned(), |e| {
            format!("{} {}", e.interface.as_deref().unwrap_or("?"), ip(e))
        });
        let to = m.and_then(|m| m.to.as_ref()).map_or("-".to_owned(), |e| {
            e.interface.clone().unwrap_or("?".into())
        });
        let mtu = m
            .map(|m| {
                let a = m.from.as_ref().and_then(|e| e.mtu);
                let b = m.to.as_ref().and_then(|e| e.mtu);
                match (a, b) {
                    (Some(a), Some(b)) if a == b => a.to_string(),
                    (a, b) => format!(
                        "{}/{}",
                        a.map_or("?".into(), |v| v.to_string()),
                        b.map_or("?".into(), |v| v.to_string())
                    ),
                }
            })
            .unwrap_or_else(|| "-".into());
        let connect = m
            .and_then(|m| m.connect_ms)
            .map_or("-".to_owned(), |ms| format!("{ms:.2} ms"));
        let rtt = m.and_then(|m| m.rtt.as_ref()).map_or("-".to_owned(), |r| {
            format!("{:.0}/{:.0} µs", r.p50_us, r.p99_us)
        });
        let (f, b) = row.rates();
        cells.push(vec![
            row.name(),
            row.address.clone(),
            from,
            to,
            mtu,
            connect,
            rtt,
            f.map_or("-".to_owned(), rate),
            b.map_or("-".to_owned(), rate),
            row.flags.join(", "),
        ]);
    }
    let mut out = String::new();
    for line in crate::table::aligned(&cells) {
        out += &line;
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::endpoint::Endpoint;
    use crate::doctor::measure::{PortCheck, Rtt, Transfer};

    /// A ring link `from→to` measured at `fwd` and `back` Mbit/s, leaving from `iface`.
    fn link(from: usize, to: usize, fwd: f64, back: f64, iface: (&str, &str)) -> Row {
        let t = |mbit: f64| Transfer {
            bytes: (mbit * 1e6 / 8.0) as u64,
            seconds: 1.0,
        };
        Row {
            from,
            to,
            from_host: format!("host{from}"),
            to_host: format!("host{to}"),
            connection: 0,
            address: format!("198.18.0.{}:32323", to + 1),
            measurement: Some(Measurement {
                job_port: Some(PortCheck {
                    outcome: "refused".into(),
                    ms: 0.1,
                    detail: None,
                }),
                connect_ms: Some(0.2),
                from: Some(Endpoint {
                    local: format!("{}:40000", iface.1),
                    interface: Some(iface.0.into()),
                    mtu: Some(1500),
                }),
                to: Some(Endpoint {
                    local: format!("198.18.0.{}:32327", to + 1),
                    interface: Some(format!("eth{to}")),
                    mtu: Some(1500),
                }),
                rtt: Some(Rtt {
                    p50_us: 50.0,
                    p99_us: 120.0,
                    count: 200,
                }),
                forward: Some(t(fwd)),
                back: Some(t(back)),
                error: None,
            }),
            ..Row::default()
        }
    }

    fn ring(rates: &[(f64, f64)]) -> Vec<Row> {
        let n = rates.len();
        rates
            .iter()
            .enumerate()
            .map(|(r, &(f, b))| {
                let ip = format!("198.18.0.{}", r + 1);
                link(r, (r + 1) % n, f, b, (&format!("eth{r}"), &ip))
            })
            .collect()
    }

    #[test]
    fn a_clean_ring_has_no_flag_and_a_table_row_per_link() {
        let mut rows = ring(&[
            (940.0, 941.0),
            (939.0, 940.0),
            (942.0, 938.0),
            (940.0, 940.0),
        ]);
        let (problems, med) = findings(&mut rows);
        assert_eq!(problems, Vec::<String>::new());
        assert!(med.is_some_and(|m| (m - 940e6).abs() < 2e6));
        let t = table(&rows);
        assert_eq!(t.lines().count(), 5, "{t}");
        assert!(
            t.lines()
                .nth(1)
                .is_some_and(|l| l.starts_with("0→1   198.18.0.2:32323")
                    && l.contains("eth0 198.18.0.1")
                    && l.contains("1500")
                    && l.contains("50/120 µs")
                    && l.contains("940 Mbit/s")),
            "{t}"
        );
    }

    #[test]
    fn a_host_at_a_tenth_makes_both_its_links_slow_and_is_named() {
        // Host 3 at a tenth: links 2→3 and 3→0 go at its pace both ways.
        let mut rows = ring(&[(940.0, 940.0), (940.0, 940.0), (94.0, 94.0), (94.0, 94.0)]);
        let (problems, _) = findings(&mut rows);
        assert_eq!(rows[2].flags, ["slow forward", "slow back"]);
        assert_eq!(rows[3].flags, ["slow forward", "slow back"]);
        assert!(rows[0].flags.is_empty() && rows[1].flags.is_empty());
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("rank 3 (host host3) is on every slow link")),
            "{problems:#?}"
        );
        assert!(problems[0].contains("is slow forward: 94 Mbit/s is 0.18x the median"));
    }

    #[test]
    fn asymmetric_directions_a_dropped_port_and_a_failure_are_flagged() {
        let mut rows = ring(&[(940.0, 500.0), (940.0, 940.0), (940.0, 940.0)]);
        if let Some(m) = rows[1].measurement.as_mut() {
            m.job_port = Some(PortCheck {
                outcome: "timeout".into(),
                ms: 2000.0,
                detail: Some("no answer within 2s".into()),
            });
        }
        rows[2].measurement = None;
        rows[2].failure = Some("the probe on rank 2 did not start".into());
        let (problems, _) = findings(&mut rows);
        assert_eq!(rows[0].flags, ["asymmetric"]);
        assert_eq!(rows[1].flags, ["port 32323 dropped"]);
        assert_eq!(rows[2].flags, ["failed"]);
        assert!(
            problems.iter().any(|p| p.starts_with(
                "port 32323 on host host2 does not answer: a firewall dropping it? (link 1→2"
            )),
            "{problems:#?}"
        );
    }

    #[test]
    fn a_host_whose_links_use_two_interfaces_is_named_with_both() {
        let mut rows = ring(&[(940.0, 940.0), (94.0, 94.0), (940.0, 940.0), (940.0, 940.0)]);
        // Link 1→2 arrives at rank 2 on its second interface.
        if let Some(to) = rows[1].measurement.as_mut().and_then(|m| m.to.as_mut()) {
            to.interface = Some("wlan2".into());
            to.local = "198.19.0.3:32327".into();
        }
        let (problems, _) = findings(&mut rows);
        let p = problems
            .iter()
            .find(|p| p.starts_with("rank 2 (host host2) sends and receives on 2 interfaces"))
            .unwrap_or_else(|| panic!("{problems:#?}"));
        assert!(
            p.contains("eth2 (198.18.0.3) for 2→3; wlan2 (198.19.0.3) for 1→2"),
            "{p}"
        );
        assert!(rows[1].flags.contains(&"interfaces".to_owned()));
        assert!(rows[1].flags.contains(&"slow forward".to_owned()));
    }

    #[test]
    fn a_cabled_ring_whose_hosts_take_each_cable_on_its_own_interface_is_no_problem() {
        // Rank r accepts from r−1 on one cable and connects to r+1 on another, at full rate.
        let mut rows = ring(&[(940.0, 940.0), (940.0, 940.0), (940.0, 940.0)]);
        for row in rows.iter_mut() {
            if let Some(to) = row.measurement.as_mut().and_then(|m| m.to.as_mut()) {
                to.interface = Some(format!("en{}", row.to + 10));
            }
        }
        let (problems, _) = findings(&mut rows);
        assert!(problems.is_empty(), "{problems:#?}");
        assert!(rows.iter().all(|r| r.flags.is_empty()), "{rows:#?}");
    }

    #[test]
    fn the_json_report_has_every_link_with_its_flags() {
        let mut rows = ring(&[(940.0, 940.0), (940.0, 940.0)]);
        let (link_problems, median_bps) = findings(&mut rows);
        let report = Report {
            backend: "ring".into(),
            links: rows,
            link_problems,
            median_bps,
            ..Report::default()
        };
        let v: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&report).expect("JSON")).expect("JSON");
        assert_eq!(v["links"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["links"][0]["measurement"]["rtt"]["p99_us"], 120.0);
        assert_eq!(v["links"][1]["from"], 1);
        assert_eq!(report.problems(), 0);
    }
}
