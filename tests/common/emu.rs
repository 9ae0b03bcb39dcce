//! The software RDMA provider (`fabric-sim/verbs/`, crate `nuvec-verbs-emu`) for tests: built
//! once per test process, with the rest of the workspace (see `built`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The path of the provider's shared library, built (or brought up to date) on first use.
pub fn library() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| super::built::artifact("libnuvec_verbs_emu.so"))
}

/// Every device name in a JACCL device file (`MLX_IBV_DEVICES`' JSON), comma-separated, as
/// `NUVEC_VERBS_EMU_DEVICES` takes them.
pub fn device_names(device_file: &str) -> String {
    fn collect(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) if !out.contains(s) => out.push(s.clone()),
            serde_json::Value::Array(items) => items.iter().for_each(|i| collect(i, out)),
            _ => {}
        }
    }
    let value: serde_json::Value = serde_json::from_str(device_file).expect("a device file");
    let mut names = Vec::new();
    collect(&value, &mut names);
    names.join(",")
}

/// Makes `cmd`'s RDMA fabric load the provider with the devices of `device_file`, its
/// ledger written to `ledger`.
pub fn configure(cmd: &mut Command, device_file: &str, ledger: &Path) {
    cmd.env("NUVEC_JACCL_FABRIC", "rdma")
        .env("NUVEC_JACCL_VERBS", library())
        .env("NUVEC_VERBS_EMU_DEVICES", device_names(device_file))
        .env("NUVEC_VERBS_EMU_LEDGER", ledger);
}

/// The ledger's `close` lines that still had objects alive (none means nothing was left).
pub fn leaks(ledger: &Path) -> Vec<String> {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.starts_with("close ")
                && !(l.contains("qps=0")
                    && l.contains("cqs=0")
                    && l.contains("mrs=0")
                    && l.contains("pds=0"))
        })
        .map(str::to_owned)
        .collect()
}

/// How many devices the ledger saw closed.
pub fn closes(ledger: &Path) -> usize {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("close "))
        .count()
}
