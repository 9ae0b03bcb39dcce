//! `nuvec-launch doctor` on a recorded pair of Macs (`tests/fixtures/doctor/`): a ring whose
//! hostfile lists a Wi-Fi address and an address on the Thunderbolt Bridge, a JACCL mesh whose
//! RDMA interface has no IPv4 address and sits in a bridge that is up, and a clean ring; each
//! run must print its expected report (`expected/*.txt`) and exit 1 on a problem, 0 without.

use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn the_doctor_names_each_mistake_of_a_recorded_cluster_and_passes_a_clean_one() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor/wifi-bridge-rdma");
    for (hostfile, code) in [("ring", 1), ("jaccl", 1), ("ring-ok", 0)] {
        // The replay reads files only: the run cannot wait on anything.
        let out = Command::new(env!("CARGO_BIN_EXE_nuvec-launch"))
            .args(["doctor", "--replay", ".", "--hostfile"])
            .arg(format!("{hostfile}.json"))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .expect("nuvec-launch runs");
        let expected = std::fs::read_to_string(dir.join(format!("expected/{hostfile}.txt")))
            .expect("the expected report");
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "{hostfile}");
        assert_eq!(out.status.code(), Some(code), "{hostfile}");
    }
}
