//! A bounded fault campaign in simulation: hundreds of seeded scenarios (the ring and JACCL) with
//! crashes, stalls, cut links, lost messages and error completions, every invariant checked (see
//! `nuvec_fabric_sim::campaign`), and the diagnosis `nuvec-launch diagnose` draws from the
//! ranks' flight records for every crash, stall and cut.

#[test]
fn a_bounded_campaign_finds_no_violation() {
    let count = std::env::var("NUVEC_CAMPAIGN_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let violations = nuvec_fabric_sim::campaign::run(0, count, 10);
    assert!(
        violations.is_empty(),
        "{} of {count} scenarios failed:\n{}",
        violations.len(),
        violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// For every seeded scenario with a crash, a stall past the timeout or a cut link in which
/// some rank failed (on a network that loses nothing), every surviving rank's flight record is
/// written as its `rank-R.jsonl` and `nuvec-launch diagnose` merges them, knowing only the
/// files: its first failure must be the crashed or stalled rank, or name both ends of the cut
/// link.
#[test]
fn the_merged_records_of_every_seeded_crash_stall_and_cut_name_the_faulty_rank_or_link() {
    use nuvec_fabric_sim::Fault;
    use nuvec_fabric_sim::campaign::{self, Backend, TIMEOUT};

    let count: u64 = std::env::var("NUVEC_CAMPAIGN_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let launcher = crate::common::launcher::nuvec_launch();
    let root = std::env::temp_dir().join(format!("nuvec-campaign-records-{}", std::process::id()));
    let mut checked = std::collections::BTreeMap::<&str, usize>::new();
    let mut wrong = Vec::new();
    for seed in 0..count {
        let (scenario, records) = campaign::records(seed);
        if scenario.lossy {
            continue;
        }
        let (what, named): (&str, Vec<usize>) = match &scenario.fault {
            Some(Fault::Crash { rank, .. } | Fault::CrashAt { rank, .. }) => ("crash", vec![*rank]),
            Some(Fault::Stall { rank, duration, .. }) if *duration > TIMEOUT => {
                ("stall", vec![*rank])
            }
            Some(Fault::Cut { rank, channel, .. }) => ("cut", vec![*rank, channel.peer]),
            _ => continue,
        };
        let failed = records
            .iter()
            .flatten()
            .any(|r| r.contains("\"state\":\"failed\""));
        if !failed {
            continue;
        }
        let dir = root.join(seed.to_string());
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        for (rank, record) in records.iter().enumerate() {
            if let Some(record) = record {
                std::fs::write(dir.join(format!("rank-{rank}.jsonl")), record)
                    .expect("write a record");
            }
        }
        let out = std::process::Command::new(launcher)
            .args(["diagnose", "--json"])
            .arg(&dir)
            .output()
            .expect("run nuvec-launch diagnose");
        let diagnosis: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("diagnose --json prints JSON");
        let findings: Vec<&str> = diagnosis["findings"]
            .as_array()
            .map(|f| f.iter().filter_map(serde_json::Value::as_str).collect())
            .unwrap_or_default();
        let first = findings
            .iter()
            .find(|f| f.starts_with("the first failure"))
            .copied()
            .unwrap_or("(no first failure)");
        // The rank the finding names first: the cause, or the first to fail.
        let cause = first.split_once("rank ").map(|(_, rest)| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        });
        // A cut on JACCL's UC channels is silent (no closed connection): when every rank
        // then times out waiting on the one before it, no record says which link stopped,
        // and the diagnosis must say so rather than guess.
        let untold = first.starts_with("the first failure cannot be told")
            && scenario.backend != Backend::Ring;
        let right = match what {
            "cut" => untold || named.iter().all(|r| first.contains(&format!("rank {r}"))),
            _ => cause == Some(named[0].to_string()),
        };
        *checked.entry(what).or_default() += 1;
        if untold {
            *checked.entry("cut, untold").or_default() += 1;
        }
        if !right {
            wrong.push(format!(
                "seed {seed} ({what} of {named:?}, {:?}): {findings:#?}",
                scenario.backend
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    assert!(
        ["crash", "stall", "cut"]
            .iter()
            .all(|k| checked.get(k) > Some(&0)),
        "each kind of fault is checked: {checked:?}"
    );
    eprintln!("diagnoses checked: {checked:?}");
    assert!(
        wrong.is_empty(),
        "{} diagnoses of {checked:?} are wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
