//! The crate's layers, checked: every `crate::…` path in the code of `src/` names a module of
//! its own layer or of one below it, so the folder tree is the layer diagram of
//! `ARCHITECTURE.md` and no import cycle can form between layers.

use std::path::{Path, PathBuf};

/// The layers, lowest first: each entry is a layer's top-level modules of `src/`.
const LAYERS: [&[&str]; 9] = [
    &["fabric", "limits", "sync"],
    &["config"],
    &["error"],
    &["transport"],
    &["collective"],
    &["ring"],
    &["jaccl"],
    &["backend"],
    &["lib"],
];

/// Files of `src/` that are not part of the library's layers: none (the launcher is the crate
/// `launch/`, which uses only this one's public API, for the doctor's sweep).
const OUTSIDE: [&str; 0] = [];

/// The layer of a top-level module name; names that are no module (the crate's re-exports and
/// functions, `crate::init`, `crate::Options` …) belong to the top.
fn layer_of(module: &str) -> usize {
    LAYERS
        .iter()
        .position(|layer| layer.contains(&module))
        .unwrap_or(LAYERS.len() - 1)
}

/// Every `.rs` file below `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/jaccl/mesh.rs` → `jaccl`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_owned()
}

/// The top-level modules that the code (not the comments) of `text` names as `crate::X`.
fn uses(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((n + 1, name));
            }
            rest = after;
        }
    }
    found
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        if OUTSIDE.contains(&module.as_str()) {
            continue;
        }
        let own = layer_of(&module);
        let text = std::fs::read_to_string(file).expect("read a source file");
        for (line, used) in uses(&text) {
            if layer_of(&used) > own {
                wrong.push(format!(
                    "{}:{line}: `{module}` (layer {own}) uses `crate::{used}` (layer {})",
                    file.strip_prefix(&src).unwrap_or(file).display(),
                    layer_of(&used)
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "uses of a higher layer:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_top_level_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut names: Vec<String> = std::fs::read_dir(&src)
        .expect("read src")
        .map(|e| {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            name.trim_end_matches(".rs").to_owned()
        })
        .filter(|n| !OUTSIDE.contains(&n.as_str()))
        .collect();
    names.sort();
    for name in names {
        assert!(
            LAYERS.iter().any(|layer| layer.contains(&name.as_str())),
            "src/{name} is in no layer of tests/layers.rs"
        );
    }
}

#[test]
fn the_checker_sees_a_use_in_code_and_not_in_comments() {
    let text = "use crate::jaccl::Config;\n/// [`x`](crate::backend)\nlet a = crate::ring::x; // crate::lib\n";
    assert_eq!(
        uses(text),
        vec![(1, "jaccl".to_owned()), (3, "ring".to_owned())]
    );
}
