//! The MLX venv (`mlx[cpu]==0.32.4`, made by `.ci/setup-venv`): `.venv` at the repository's
//! root, or the directory `NUVEC_MLX_VENV` names. A test that needs it and does not find it
//! says why and skips, except under CI (`CI=true`), where a missing venv fails the test.

use std::path::PathBuf;

/// The venv's `bin/` when it holds `program` (`python`, `mlx.launch`), or `None` with the
/// reason printed; under `CI=true` a missing venv panics instead. `what` names what is
/// skipped.
pub fn bin_with(program: &str, what: &str) -> Option<PathBuf> {
    let venv = std::env::var_os("NUVEC_MLX_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    let bin = venv.join("bin");
    if bin.join(program).exists() {
        return Some(bin);
    }
    let reason = format!(
        "no MLX venv with {program} at {} (make it with .ci/setup-venv); skipping {what}",
        venv.display()
    );
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{reason}, but CI=true requires it"
    );
    eprintln!("{reason}");
    None
}

/// The venv's Python interpreter (see [`bin_with`]).
pub fn python(what: &str) -> Option<PathBuf> {
    bin_with("python", what).map(|bin| bin.join("python"))
}

/// The venv's `mlx.launch` (see [`bin_with`]).
pub fn mlx_launch(what: &str) -> Option<PathBuf> {
    bin_with("mlx.launch", what).map(|bin| bin.join("mlx.launch"))
}
