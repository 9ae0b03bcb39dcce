//! JACCL's configuration through the public API: MLX's device file, the launch variables, the validity rules, the topology choice and its limits, with a table of malformed device files and environment values, one test per row.
//!
//! The environment is read with `Config::from_vars`, so no test touches the process
//! environment; device files are written to the system's temporary directory.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use nuvec_distributed::Error;
use nuvec_distributed::jaccl::{Config, MESH_MAX_PEERS, RING_MAX_CONNS, Topology, parse_devices};

/// The text of a configuration error.
fn config_message<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Err(Error::Config(m)) => m.to_string(),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

/// A device file in the temporary directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(bytes: &[u8]) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "nuvec-jaccl-config-{}-{}.json",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, bytes).expect("write a temporary device file");
        TempFile(path)
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Reads the configuration from `vars`, with `@` in a value standing for the path of a device
/// file holding `file` (when given).
fn read_env(file: Option<&[u8]>, vars: &[(&str, &str)]) -> Result<Option<Config>, Error> {
    let file = file.map(TempFile::new);
    let path = file.as_ref().map(TempFile::path).unwrap_or_default();
    let vars: Vec<(String, OsString)> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), OsString::from(v.replace('@', &path))))
        .collect();
    Config::from_vars(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
}

const MESH3: &str =
    r#"[[null,"rdma_en5","rdma_en4"],["rdma_en5",null,"rdma_en3"],["rdma_en4","rdma_en3",null]]"#;

/// The matrix of `text`, which must parse.
fn devices(text: &str) -> Vec<Vec<Vec<String>>> {
    parse_devices(text, "test").expect("a valid device file")
}

// ---------------------------------------------------------------------------------------------
// Device files

#[test]
fn mlx_launch_device_file_with_its_trailing_newline_parses() {
    let m = parse_devices(&format!("{MESH3}\n"), "devices.json").unwrap();
    assert_eq!(m.len(), 3);
    assert!(m[1][1].is_empty());
    assert_eq!(m[1][2], ["rdma_en3"]);
}

#[test]
fn a_ring_file_with_cable_lists_keeps_the_cable_order() {
    let text = r#"[[null,["rdma_en3","rdma_en4"],null,["rdma_en5","rdma_en6"]],
                   [["rdma_en4","rdma_en3"],null,["rdma_en5","rdma_en6"],null],
                   [null,["rdma_en6","rdma_en5"],null,["rdma_en3","rdma_en4"]],
                   [["rdma_en6","rdma_en5"],null,["rdma_en4","rdma_en3"],null]]"#;
    let m = parse_devices(text, "ring.json").unwrap();
    assert_eq!(m[0][1], ["rdma_en3", "rdma_en4"]);
    assert_eq!(m[1][0], ["rdma_en4", "rdma_en3"]);
    assert!(m[0][2].is_empty());
    let c = Config::new(0, m).coordinator("10.0.0.1:32323");
    assert!(c.is_valid_ring() && !c.is_valid_mesh());
    assert_eq!(c.topology().unwrap(), Topology::Ring { wires: 2 });
}

#[test]
fn null_and_an_empty_list_both_mean_no_device() {
    let m = parse_devices(r#"[[[],"a"],["b",null]]"#, "f").unwrap();
    assert!(m[0][0].is_empty() && m[1][1].is_empty());
}

/// One test per row: a malformed device file and the fragments its error must contain, after
/// the `jaccl: device file devices.json` prefix.
macro_rules! bad_device_file {
    ($($name:ident: $text:expr => [$($frag:expr),+ $(,)?];)+) => {$(
        #[test]
        fn $name() {
            let m = config_message(parse_devices($text, "devices.json"));
            assert!(m.starts_with("jaccl: device file devices.json: "), "{m}");
            $(assert!(m.contains($frag), "missing {:?} in {m:?}", $frag);)+
        }
    )+};
}

bad_device_file! {
    device_file_empty: "" => ["the file is empty", "one row per rank"];
    device_file_only_whitespace: " \n\t" => ["the file is empty"];
    device_file_not_json: "[[null," => ["not valid JSON"];
    device_file_trailing_garbage: "[[null]] x" => ["not valid JSON"];
    device_file_an_object: r#"{"hosts": []}"# => ["found an object"];
    device_file_a_string: r#""rdma_en3""# => ["found a string"];
    device_file_null: "null" => ["found null"];
    device_file_no_rows: "[]" => ["the list of rows is empty"];
    device_file_row_null: "[null]" => ["row 0: expected a list of 1 entry (one per rank), found null"];
    device_file_row_a_string: r#"[[null,"a"],"b"]"# => ["row 1: expected a list of 2 entries", "found a string"];
    device_file_row_too_short: r#"[[null,"a"],[null]]"# => ["row 1 has 1 entry but the file has 2 rows", "null where there is no cable"];
    device_file_row_too_long: r#"[[null,"a",null],["a",null]]"# => ["row 0 has 3 entries but the file has 2 rows"];
    device_file_entry_a_number: r#"[[null,5],["a",null]]"# => ["row 0, entry 1: expected null, a device name or a list of device names, found a number"];
    device_file_entry_a_boolean: r#"[[null,"a"],[false,null]]"# => ["row 1, entry 0:", "found a boolean"];
    device_file_entry_an_object: r#"[[null,{"dev":"a"}],["a",null]]"# => ["row 0, entry 1:", "found an object"];
    device_file_entry_an_empty_name: r#"[[null,""],["a",null]]"# => ["row 0, entry 1: the device name is empty; use null for no cable"];
    device_file_list_with_a_number: r#"[[null,["a",3]],["a",null]]"# => ["row 0, entry 1, device 1: expected a device name (a string), found a number"];
    device_file_list_with_null: r#"[[null,[null]],["a",null]]"# => ["row 0, entry 1, device 0:", "found null"];
    device_file_list_with_a_list: r#"[[null,[["a"]]],["a",null]]"# => ["row 0, entry 1, device 0:", "found a list"];
    device_file_list_with_an_empty_name: r#"[[null,["a",""]],["a",null]]"# => ["row 0, entry 1, device 1: the device name is empty"];
}

// ---------------------------------------------------------------------------------------------
// Validity and topology

/// One test per row: a device matrix, whether the ring is preferred, and the expected
/// `(is_valid_mesh, is_valid_ring, topology)`; `Err(fragment)` for a refused topology.
macro_rules! topology {
    ($($name:ident: $text:expr, prefer_ring $prefer:expr => ($mesh:expr, $ring:expr, $topo:expr);)+) => {$(
        #[test]
        fn $name() {
            let c = Config::new(0, devices($text)).coordinator("127.0.0.1:32323").prefer_ring($prefer);
            assert_eq!(c.is_valid_mesh(), $mesh, "is_valid_mesh");
            assert_eq!(c.is_valid_ring(), $ring, "is_valid_ring");
            let expected: Result<Topology, &str> = $topo;
            match expected {
                Ok(t) => {
                    assert_eq!(c.topology().unwrap(), t);
                    c.validate().unwrap();
                }
                Err(fragment) => {
                    let m = config_message(c.topology());
                    assert!(m.contains(fragment), "missing {fragment:?} in {m:?}");
                    assert_eq!(config_message(c.validate()), m);
                }
            }
        }
    )+};
}

topology! {
    a_two_rank_mesh_is_a_mesh: r#"[[null,"a"],["b",null]]"#, prefer_ring false
        => (true, true, Ok(Topology::Mesh { wires: 1 }));
    a_two_rank_mesh_preferred_as_ring_is_a_ring: r#"[[null,"a"],["b",null]]"#, prefer_ring true
        => (true, true, Ok(Topology::Ring { wires: 1 }));
    a_three_rank_mesh_is_a_mesh: MESH3, prefer_ring false
        => (true, true, Ok(Topology::Mesh { wires: 1 }));
    a_mesh_with_two_cables_preferred_as_ring_has_two_wires: r#"[[null,["a","b"]],[["c","d"],null]]"#, prefer_ring true
        => (true, true, Ok(Topology::Ring { wires: 2 }));
    a_four_rank_ring_is_a_ring_without_preference: r#"[[null,"a",null,"b"],["a",null,"b",null],[null,"a",null,"b"],["a",null,"b",null]]"#, prefer_ring false
        => (false, true, Ok(Topology::Ring { wires: 1 }));
    a_preferred_ring_with_uneven_cables_falls_back_to_the_mesh: r#"[[null,["a","b"],"c"],["a",null,"c"],["a","b",null]]"#, prefer_ring true
        => (true, false, Ok(Topology::Mesh { wires: 1 }));
    a_mesh_with_two_cables_per_pair_has_two_wires: r#"[[null,["a","b"]],[["c","d"],null]]"#, prefer_ring false
        => (true, true, Ok(Topology::Mesh { wires: 2 }));
    a_mesh_has_as_many_wires_as_its_least_cabled_pair: r#"[[null,["a","b","c"],["d","e"]],[["a","b","c"],null,["f","g","h"]],[["d","e"],["f","g","h"],null]]"#, prefer_ring false
        => (true, false, Ok(Topology::Mesh { wires: 2 }));
    one_single_cable_makes_a_one_wire_mesh: r#"[[null,["a","b"],["c","d"]],[["a","b"],null,"e"],[["c","d"],["e","f"],null]]"#, prefer_ring false
        => (true, false, Ok(Topology::Mesh { wires: 1 }));
    a_single_rank_is_neither: "[[null]]", prefer_ring false
        => (false, false, Err("should define a valid mesh or a valid ring"));
    a_device_on_the_diagonal_of_a_two_rank_matrix_is_only_a_ring: r#"[["x","a"],["b",null]]"#, prefer_ring false
        => (false, true, Ok(Topology::Ring { wires: 1 }));
    a_broken_ring_and_mesh_is_neither: r#"[[null,"a",null,"b"],["a",null,null,null],[null,"a",null,"b"],["a",null,"b",null]]"#, prefer_ring false
        => (false, false, Err("not a mesh because entry [0][2] is empty"));
    an_all_null_matrix_is_neither: "[[null,null],[null,null]]", prefer_ring true
        => (false, false, Err("not a ring because entry [0][1] is empty"));
    a_ring_of_five_cables_is_over_the_limit: r#"[[null,["a","b","c","d","e"],null,["a","b","c","d","e"]],[["a","b","c","d","e"],null,["a","b","c","d","e"],null],[null,["a","b","c","d","e"],null,["a","b","c","d","e"]],[["a","b","c","d","e"],null,["a","b","c","d","e"],null]]"#, prefer_ring false
        => (false, true, Err("at most 4 (MLX's RING_MAX_CONNS)"));
}

/// A full mesh of `n` ranks with one device per pair, as JSON.
fn mesh_json(n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| {
            let entries: Vec<String> = (0..n)
                .map(|j| {
                    if i == j {
                        "null".to_owned()
                    } else {
                        format!("\"rdma_en{j}\"")
                    }
                })
                .collect();
            format!("[{}]", entries.join(","))
        })
        .collect();
    format!("[{}]", rows.join(","))
}

#[test]
fn the_mesh_limit_is_mlx_eight_ranks() {
    assert_eq!(MESH_MAX_PEERS, 8);
    assert_eq!(RING_MAX_CONNS, 4);
    let eight = Config::new(7, devices(&mesh_json(8))).coordinator("h:1");
    assert_eq!(eight.topology().unwrap(), Topology::Mesh { wires: 1 });
    let nine = Config::new(0, devices(&mesh_json(9))).coordinator("h:1");
    let m = config_message(nine.topology());
    assert!(
        m.contains("a mesh of 9 ranks, but a JACCL mesh has at most 8"),
        "{m}"
    );
    assert_eq!(
        nine.prefer_ring(true).topology().unwrap(),
        Topology::Ring { wires: 1 }
    );
}

#[test]
fn mesh_devices_give_the_first_device_towards_each_rank() {
    let c = Config::new(2, devices(MESH3));
    assert_eq!(
        c.mesh_devices().unwrap(),
        vec![Some("rdma_en4"), Some("rdma_en3"), None]
    );
}

#[test]
fn mesh_wire_devices_give_the_w_th_device_towards_each_rank_on_wire_w() {
    // mlx.distributed_config's form when every pair has two cables; rank 2 lists a third
    // cable to rank 0, which no wire uses (the least count over all pairs is 2).
    let text = r#"[[null,["en1","en2"],["en3","en4"]],
                   [["en1","en2"],null,["en5","en6"]],
                   [["en3","en4","en9"],["en5","en6"],null]]"#;
    let c = Config::new(2, devices(text));
    assert_eq!(
        c.mesh_wire_devices().unwrap(),
        vec![
            vec![Some("en3"), Some("en5"), None],
            vec![Some("en4"), Some("en6"), None]
        ]
    );
    assert_eq!(
        c.mesh_devices().unwrap(),
        vec![Some("en3"), Some("en5"), None]
    );
}

#[test]
fn ring_devices_give_the_left_and_right_neighbours_cables() {
    let text =
        r#"[[null,"a",null,"b"],["c",null,"d",null],[null,"e",null,"f"],["g",null,"h",null]]"#;
    let c = Config::new(1, devices(text));
    let (left, right) = c.ring_devices().unwrap();
    assert_eq!(
        (left, right),
        (&["c".to_owned()][..], &["d".to_owned()][..])
    );
    let c = Config::new(0, devices(text));
    let (left, right) = c.ring_devices().unwrap();
    assert_eq!(
        (left, right),
        (&["b".to_owned()][..], &["a".to_owned()][..])
    );
}

#[test]
fn validate_checks_the_rank_and_the_coordinator() {
    let m = config_message(Config::new(3, devices(MESH3)).coordinator("h:1").validate());
    assert!(m.contains("rank 3 is out of range"), "{m}");
    let m = config_message(Config::new(0, devices(MESH3)).validate());
    assert!(m.contains("no coordinator"), "{m}");
    let m = config_message(
        Config::new(0, devices(MESH3))
            .coordinator("[::1]5000")
            .validate(),
    );
    assert!(m.contains("coordinator \"[::1]5000\""), "{m}");
    Config::new(0, devices(MESH3))
        .coordinator("[::1]:5000")
        .validate()
        .unwrap();
}

#[test]
fn configuration_errors_display_with_the_crate_and_backend_prefix() {
    let e = parse_devices("[]", "d.json").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("distributed: jaccl: device file d.json: "),
        "{e}"
    );
    let core: nuvec_core::Error = e.into();
    assert!(matches!(core, nuvec_core::Error::InvalidArgument(_)));
}

// ---------------------------------------------------------------------------------------------
// The environment

#[test]
fn mlx_launch_jaccl_ring_environment_gives_a_ring_config() {
    let ring =
        r#"[[null,"a",null,"b"],["c",null,"d",null],[null,"e",null,"f"],["g",null,"h",null]]"#;
    let c = read_env(
        Some(format!("{ring}\n").as_bytes()),
        &[
            ("MLX_RANK", "2"),
            ("MLX_IBV_DEVICES", "@"),
            ("MLX_JACCL_COORDINATOR", "192.168.0.1:32323"),
            ("MLX_JACCL_RING", "1"),
        ],
    )
    .unwrap()
    .expect("a configuration");
    assert_eq!(c.rank(), 2);
    assert_eq!(c.size(), 4);
    assert_eq!(c.coordinator_address(), Some("192.168.0.1:32323"));
    assert!(c.prefers_ring());
    c.validate().unwrap();
    assert_eq!(c.topology().unwrap(), Topology::Ring { wires: 1 });
}

#[test]
fn the_standalone_library_names_win_over_mlx_names() {
    let c = read_env(
        Some(MESH3.as_bytes()),
        &[
            ("JACCL_RANK", "2"),
            ("MLX_RANK", "0"),
            ("JACCL_IBV_DEVICES", "@"),
            ("MLX_IBV_DEVICES", "/nonexistent"),
            ("JACCL_COORDINATOR", "10.0.0.1:1"),
            ("MLX_JACCL_COORDINATOR", "10.0.0.2:2"),
            ("JACCL_RING", ""),
        ],
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        c,
        Config::new(2, devices(MESH3))
            .coordinator("10.0.0.1:1")
            .prefer_ring(true)
    );
}

#[test]
fn no_device_variable_means_no_jaccl_even_with_the_others_set() {
    let r = read_env(
        None,
        &[
            ("MLX_RANK", "0"),
            ("MLX_JACCL_COORDINATOR", "h:1"),
            ("MLX_JACCL_RING", "1"),
        ],
    );
    assert_eq!(r.unwrap(), None);
}

#[test]
fn from_env_reads_nothing_when_the_device_variables_are_unset() {
    if std::env::var_os("JACCL_IBV_DEVICES").is_some()
        || std::env::var_os("MLX_IBV_DEVICES").is_some()
    {
        eprintln!("skipped: a JACCL device variable is set in this process");
        return;
    }
    assert_eq!(Config::from_env().unwrap(), None);
}

/// One test per row: a device file (`None`: none written), the variables (`@` is the file's
/// path) and the fragments the error must contain.
macro_rules! bad_env {
    ($($name:ident: $file:expr, [$(($k:expr, $v:expr)),* $(,)?] => [$($frag:expr),+ $(,)?];)+) => {$(
        #[test]
        fn $name() {
            let file: Option<&str> = $file;
            let m = config_message(read_env(file.map(str::as_bytes), &[$(($k, $v)),*]));
            assert!(m.starts_with("jaccl: "), "{m}");
            $(assert!(m.contains($frag), "missing {:?} in {m:?}", $frag);)+
        }
    )+};
}

bad_env! {
    env_rank_not_an_integer: Some(MESH3), [("MLX_RANK", "abc"), ("MLX_IBV_DEVICES", "@")]
        => ["MLX_RANK=\"abc\" is not a non-negative integer"];
    env_rank_negative: Some(MESH3), [("JACCL_RANK", "-1"), ("JACCL_IBV_DEVICES", "@")]
        => ["JACCL_RANK=\"-1\" is negative"];
    env_rank_empty: Some(MESH3), [("MLX_RANK", ""), ("MLX_IBV_DEVICES", "@")]
        => ["MLX_RANK=\"\" is empty"];
    env_rank_with_a_sign: Some(MESH3), [("MLX_RANK", "+1"), ("MLX_IBV_DEVICES", "@")]
        => ["MLX_RANK=\"+1\" is not a non-negative integer"];
    env_rank_with_trailing_text: Some(MESH3), [("MLX_RANK", "1x"), ("MLX_IBV_DEVICES", "@")]
        => ["MLX_RANK=\"1x\" is not a non-negative integer"];
    env_rank_too_large: Some(MESH3), [("MLX_RANK", "184467440737095516160"), ("MLX_IBV_DEVICES", "@")]
        => ["is too large for a rank"];
    env_jaccl_rank_bad_with_mlx_rank_good: Some(MESH3), [("JACCL_RANK", "x"), ("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@")]
        => ["JACCL_RANK=\"x\""];
    env_rank_missing: Some(MESH3), [("MLX_IBV_DEVICES", "@"), ("MLX_JACCL_COORDINATOR", "h:1")]
        => ["MLX_IBV_DEVICES is set", "neither JACCL_RANK nor MLX_RANK is"];
    env_rank_out_of_range: Some(MESH3), [("MLX_RANK", "3"), ("MLX_IBV_DEVICES", "@")]
        => ["MLX_RANK=3 is out of range", "(MLX_IBV_DEVICES) has 3 rows, so valid ranks are 0 to 2"];
    env_coordinator_without_port: Some(MESH3), [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@"), ("MLX_JACCL_COORDINATOR", "10.0.0.1")]
        => ["MLX_JACCL_COORDINATOR=\"10.0.0.1\" is not the \"ip:port\" where rank 0 listens", "no port"];
    env_coordinator_port_not_a_number: Some(MESH3), [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@"), ("JACCL_COORDINATOR", "10.0.0.1:port")]
        => ["JACCL_COORDINATOR=\"10.0.0.1:port\"", "the port \"port\" is not a number"];
    env_coordinator_port_zero: Some(MESH3), [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@"), ("MLX_JACCL_COORDINATOR", "10.0.0.1:0")]
        => ["port 0 is not allowed"];
    env_coordinator_port_too_large: Some(MESH3), [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@"), ("MLX_JACCL_COORDINATOR", "10.0.0.1:70000")]
        => ["port 70000 is out of range"];
    env_coordinator_unbracketed_ipv6: Some(MESH3), [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@"), ("MLX_JACCL_COORDINATOR", "fe80::1:5000")]
        => ["more than one ':'"];
    env_coordinator_empty: Some(MESH3), [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@"), ("MLX_JACCL_COORDINATOR", "")]
        => ["MLX_JACCL_COORDINATOR=\"\"", "the address is empty"];
    env_coordinator_no_host: Some(MESH3), [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@"), ("MLX_JACCL_COORDINATOR", ":32323")]
        => ["the host before the ':' is empty"];
    env_devices_path_empty: None, [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "")]
        => ["MLX_IBV_DEVICES is set but empty"];
    env_devices_file_missing: None, [("MLX_RANK", "0"), ("JACCL_IBV_DEVICES", "/nonexistent/nuvec/d.json")]
        => ["device file /nonexistent/nuvec/d.json (JACCL_IBV_DEVICES): cannot read the file"];
    env_devices_file_a_directory: None, [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "/")]
        => ["device file / (MLX_IBV_DEVICES): cannot read the file"];
    env_devices_file_empty: Some(""), [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@")]
        => ["(MLX_IBV_DEVICES): the file is empty"];
    env_devices_file_malformed_entry: Some(r#"[[null,7],["a",null]]"#), [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@")]
        => ["(MLX_IBV_DEVICES): row 0, entry 1", "found a number"];
    env_devices_file_not_square: Some(r#"[[null,"a"],["a"]]"#), [("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@")]
        => ["row 1 has 1 entry but the file has 2 rows"];
}

#[test]
fn a_device_file_that_is_not_utf8_names_the_byte_offset() {
    let m = config_message(read_env(
        Some(b"[[null,\"a\xc3\"]]"),
        &[("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@")],
    ));
    assert!(
        m.contains("(MLX_IBV_DEVICES): the file is not UTF-8 text (invalid byte at offset 9)"),
        "{m}"
    );
}
