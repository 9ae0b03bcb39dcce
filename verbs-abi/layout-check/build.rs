//! Runs bindgen over the `verbs.h` of ibverbs-sys's vendored rdma-core for what ibverbs-sys's own
//! bindings do not give: `struct ibv_wc` (which ibverbs-sys blocklists and declares by hand) and
//! `struct _compat_ibv_port_attr` (which `verbs.h` only forward-declares; rdma-core defines it in
//! `libibverbs/verbs.c`, from where its definition is taken). The header's own includes resolve
//! as they do for ibverbs-sys's bindgen run.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    // ibverbs-sys (`links = "ibverbs"`) prints `include=<its directory>/vendor/rdma-core/build/include`.
    let include = env::var("DEP_IBVERBS_INCLUDE").expect("ibverbs-sys gives DEP_IBVERBS_INCLUDE");
    let rdma_core = Path::new(&include)
        .ancestors()
        .nth(2)
        .expect("DEP_IBVERBS_INCLUDE ends in vendor/rdma-core/build/include");
    let verbs_h = rdma_core.join("libibverbs/verbs.h");
    let verbs_c = rdma_core.join("libibverbs/verbs.c");
    println!("cargo:rerun-if-changed={}", verbs_h.display());
    println!("cargo:rerun-if-changed={}", verbs_c.display());

    let source = fs::read_to_string(&verbs_c).expect("rdma-core's libibverbs/verbs.c");
    let start = source
        .find("struct _compat_ibv_port_attr {")
        .expect("verbs.c defines struct _compat_ibv_port_attr");
    let end = start + source[start..].find("};").expect("the definition ends") + 2;
    let header = format!(
        "#include \"{}\"\n{}\n",
        verbs_h.display(),
        &source[start..end]
    );

    let bindings = bindgen::Builder::default()
        .header_contents("layout-check.h", &header)
        .allowlist_type("ibv_wc")
        .allowlist_type("_compat_ibv_port_attr")
        .allowlist_function("ibv_.*")
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .generate()
        .expect("bindgen runs over verbs.h");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("rdma_core.rs"))
        .expect("the bindings are written");
}
