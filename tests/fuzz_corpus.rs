//! Every fuzz corpus and artifact file replays without a failure.
//!
//! The cargo-fuzz targets (`fuzz/fuzz_targets/`, run with `fuzz/run.sh`) need nightly and
//! cargo-fuzz; their properties live in `fuzz/src/properties/` (one file per target), whose
//! `mod.rs` this test includes too, so on stable every committed seed
//! (`fuzz/corpus/<target>/`) and every committed crash, leak or timeout input
//! (`fuzz/artifacts/<target>/`) goes through exactly the checks the fuzzer made. A crash found by fuzzing becomes a regression test by committing its file.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

#[path = "../fuzz/src/properties/mod.rs"]
mod properties;

/// The regular files in `dir`, sorted; none if it does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.is_file())
        .filter(|p| {
            // libFuzzer's temporary files and editor leftovers are not inputs.
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.')
        })
        .collect();
    files.sort();
    files
}

/// Replays every input of `target` through `property`: the inputs and the failures (each
/// naming its file).
fn replay(target: &str, property: properties::Property) -> (usize, Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let corpus = files(&root.join("corpus").join(target));
    let artifacts = files(&root.join("artifacts").join(target));
    let mut failures = Vec::new();
    if corpus.is_empty() {
        failures.push(format!("fuzz/corpus/{target}/ has no seed inputs"));
    }
    for path in corpus.iter().chain(&artifacts) {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| property(&data))) {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic".into());
            failures.push(format!("{target}: {}: {what}", path.display()));
        }
    }
    (corpus.len() + artifacts.len(), failures)
}

#[test]
fn every_corpus_and_artifact_file_replays() {
    let mut inputs = 0;
    let mut failures = Vec::new();
    for &(target, property) in properties::TARGETS {
        let (n, failed) = replay(target, property);
        inputs += n;
        failures.extend(failed);
    }
    assert!(
        failures.is_empty(),
        "{} of {inputs} fuzz inputs fail (reproduce one with `cargo +nightly fuzz run <target> \
         <file>` in fuzz/, or fuzz/run.sh):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_fuzz_target_has_a_property() {
    let listed: Vec<&str> = properties::TARGETS.iter().map(|(n, _)| *n).collect();
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/Cargo.toml"))
            .expect("fuzz/Cargo.toml");
    let mut bins: Vec<&str> = Vec::new();
    let mut in_bin = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(name) = line.strip_prefix("name = ") {
            bins.push(name.trim_matches('"'));
        }
    }
    assert_eq!(
        bins, listed,
        "fuzz/Cargo.toml's [[bin]] targets and properties::TARGETS differ"
    );
}
