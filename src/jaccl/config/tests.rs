//! The JACCL configuration's tests: the device file's every shape and error, the variables,
//! the validity rules of MLX's `Config` and the topology choice.

use super::*;

/// A matrix from rows of entries, each entry a list of device names.
fn matrix(rows: &[&[&[&str]]]) -> Vec<Vec<Vec<String>>> {
    rows.iter()
        .map(|row| {
            row.iter()
                .map(|entry| entry.iter().map(|d| (*d).to_owned()).collect())
                .collect()
        })
        .collect()
}

/// A full mesh of `n` ranks with `wires` devices per entry.
fn mesh(n: usize, wires: usize) -> Vec<Vec<Vec<String>>> {
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    if i == j {
                        Vec::new()
                    } else {
                        (0..wires).map(|w| format!("rdma_{i}_{j}_{w}")).collect()
                    }
                })
                .collect()
        })
        .collect()
}

/// A ring of `n` ranks with `wires` devices to each neighbour and nothing else.
fn ring(n: usize, wires: usize) -> Vec<Vec<Vec<String>>> {
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    if j != i && (j == (i + 1) % n || j == (i + n - 1) % n) {
                        (0..wires).map(|w| format!("rdma_{i}_{j}_{w}")).collect()
                    } else {
                        Vec::new()
                    }
                })
                .collect()
        })
        .collect()
}

fn message(r: Result<impl std::fmt::Debug, Error>) -> String {
    match r {
        Err(Error::Config(m)) => m.to_string(),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

fn valid(rank: usize, devices: Vec<Vec<Vec<String>>>) -> Config {
    Config::new(rank, devices).coordinator("127.0.0.1:32323")
}

#[test]
fn mlx_documented_four_node_mesh_parses_with_null_diagonal() {
    let text = r#"[[null,"rdma_en5","rdma_en4","rdma_en3"],
                   ["rdma_en5",null,"rdma_en3","rdma_en4"],
                   ["rdma_en4","rdma_en3",null,"rdma_en5"],
                   ["rdma_en3","rdma_en4","rdma_en5",null]]"#;
    let m = parse_devices(text, "d.json").unwrap();
    assert_eq!(m.len(), 4);
    assert_eq!(m[0][0], Vec::<String>::new());
    assert_eq!(m[0][1], vec!["rdma_en5".to_owned()]);
    assert_eq!(m[3][2], vec!["rdma_en5".to_owned()]);
    assert!(Config::new(0, m).is_valid_mesh());
}

#[test]
fn an_entry_may_be_a_list_of_cables_in_order() {
    let text = "\u{feff}[[null,[\"rdma_en3\",\"rdma_en4\"]],[[\"rdma_en5\",\"rdma_en6\"],[]]]\n";
    let m = parse_devices(text, "d").unwrap();
    assert_eq!(
        m,
        matrix(&[
            &[&[], &["rdma_en3", "rdma_en4"]],
            &[&["rdma_en5", "rdma_en6"], &[]]
        ])
    );
}

#[test]
fn parse_errors_name_the_file_the_row_and_the_entry() {
    let m = message(parse_devices(r#"[[null,1],[null,null]]"#, "f.json"));
    assert_eq!(
        m,
        "jaccl: device file f.json: row 0, entry 1: expected null, a device name or a list \
         of device names, found a number"
    );
    let m = message(parse_devices(r#"[[null,["a",2]],[null,null]]"#, "f.json"));
    assert!(
        m.contains("row 0, entry 1, device 1: expected a device name"),
        "{m}"
    );
    let m = message(parse_devices(r#"[[null,"a"],[null]]"#, "f.json"));
    assert!(
        m.contains("row 1 has 1 entry but the file has 2 rows"),
        "{m}"
    );
}

#[test]
fn a_full_mesh_of_two_ranks_is_a_valid_mesh_and_a_valid_ring() {
    let c = valid(0, mesh(2, 1));
    assert!(c.is_valid_mesh());
    assert!(c.is_valid_ring());
    assert_eq!(c.topology().unwrap(), Topology::Mesh { wires: 1 });
}

#[test]
fn one_rank_is_neither_a_mesh_nor_a_ring() {
    let c = valid(0, matrix(&[&[&[]]]));
    assert!(!c.is_valid_mesh());
    assert!(!c.is_valid_ring());
    let m = message(c.topology());
    assert!(m.contains("it has 1 rank, not at least 2"), "{m}");
}

#[test]
fn a_device_on_the_diagonal_is_not_a_mesh() {
    let mut d = mesh(3, 1);
    d[1][1] = vec!["rdma_en9".to_owned()];
    let c = valid(0, d);
    assert!(!c.is_valid_mesh());
    assert!(c.mesh_problem().unwrap().contains("entry [1][1] names"));
}

#[test]
fn an_empty_entry_off_the_diagonal_is_not_a_mesh() {
    let mut d = mesh(3, 1);
    d[2][0].clear();
    let c = valid(0, d);
    assert!(!c.is_valid_mesh());
    assert_eq!(
        c.mesh_problem().unwrap(),
        "entry [2][0] is empty (rank 2 has no device cabled to rank 0)"
    );
}

#[test]
fn a_mesh_with_several_devices_per_entry_uses_only_the_first() {
    let c = valid(1, mesh(3, 2));
    assert!(c.is_valid_mesh());
    assert_eq!(
        c.mesh_devices().unwrap(),
        vec![Some("rdma_1_0_0"), None, Some("rdma_1_2_0")]
    );
}

#[test]
fn a_non_square_matrix_is_neither_a_mesh_nor_a_ring() {
    let d = matrix(&[&[&[], &["a"]], &[&["b"]]]);
    let c = valid(0, d);
    assert!(!c.is_valid_mesh());
    assert!(!c.is_valid_ring());
    let m = message(c.validate());
    assert!(
        m.contains("not square: row 1 has 1 entry but there are 2 rows"),
        "{m}"
    );
}

#[test]
fn a_ring_cabled_only_to_neighbours_is_a_ring_but_not_a_mesh() {
    let c = valid(0, ring(4, 2));
    assert!(c.is_valid_ring());
    assert!(!c.is_valid_mesh());
    assert_eq!(c.topology().unwrap(), Topology::Ring { wires: 2 });
}

#[test]
fn a_full_mesh_is_also_a_valid_ring() {
    assert!(valid(0, mesh(5, 1)).is_valid_ring());
}

#[test]
fn a_neighbour_entry_with_another_device_count_than_entry_0_1_is_not_a_ring() {
    let mut d = ring(4, 2);
    d[2][3].pop();
    let c = valid(0, d);
    assert!(!c.is_valid_ring());
    assert_eq!(
        c.ring_problem().unwrap(),
        "entry [2][3] holds 1 device but entry [0][1] holds 2 (every rank needs as many \
         cables to each neighbour)"
    );
}

#[test]
fn entries_between_non_neighbours_are_not_looked_at_for_a_ring() {
    let mut d = ring(4, 1);
    d[0][2] = vec!["x".to_owned(), "y".to_owned(), "z".to_owned()];
    d[1][1] = vec!["on_the_diagonal".to_owned()];
    assert!(valid(0, d).is_valid_ring());
}

#[test]
fn with_two_ranks_both_neighbour_entries_are_the_other_rank() {
    let d = matrix(&[&[&[], &["a", "b"]], &[&["c"], &[]]]);
    assert!(!valid(0, d).is_valid_ring());
    let d = matrix(&[&[&[], &["a", "b"]], &[&["c", "d"], &[]]]);
    let c = valid(1, d);
    assert!(c.is_valid_ring());
    let (left, right) = c.ring_devices().unwrap();
    assert_eq!(left, ["c", "d"]);
    assert_eq!(right, ["c", "d"]);
}

#[test]
fn a_ring_with_no_device_between_neighbours_is_not_a_ring() {
    let c = valid(0, ring(3, 0));
    assert!(!c.is_valid_ring());
    assert!(c.ring_problem().unwrap().contains("entry [0][1] is empty"));
}

#[test]
fn ring_devices_are_the_left_then_the_right_neighbours_entries() {
    let c = valid(0, ring(3, 2));
    let (left, right) = c.ring_devices().unwrap();
    assert_eq!(left, ["rdma_0_2_0", "rdma_0_2_1"]);
    assert_eq!(right, ["rdma_0_1_0", "rdma_0_1_1"]);
    let m = message(valid(0, ring(4, 1)).mesh_devices());
    assert!(m.contains("not a valid mesh"), "{m}");
}

#[test]
fn the_mesh_wins_over_the_ring_unless_the_ring_is_preferred() {
    // Two cables per pair: MLX 0.32.4's mesh runs both, one wire each.
    let c = valid(0, mesh(3, 2));
    assert_eq!(c.topology().unwrap(), Topology::Mesh { wires: 2 });
    let c = c.prefer_ring(true);
    assert_eq!(c.topology().unwrap(), Topology::Ring { wires: 2 });
}

#[test]
fn a_preferred_ring_that_is_not_valid_falls_back_to_the_mesh() {
    let mut d = mesh(3, 1);
    d[0][1].push("second".to_owned());
    let c = valid(0, d).prefer_ring(true);
    assert!(!c.is_valid_ring());
    assert_eq!(c.topology().unwrap(), Topology::Mesh { wires: 1 });
}

#[test]
fn a_valid_ring_is_chosen_without_preference_when_there_is_no_mesh() {
    assert_eq!(
        valid(0, ring(5, 1)).topology().unwrap(),
        Topology::Ring { wires: 1 }
    );
}

#[test]
fn neither_a_mesh_nor_a_ring_is_an_error_giving_both_reasons() {
    let mut d = ring(4, 1);
    d[1][2].clear();
    let m = message(valid(0, d).topology());
    assert_eq!(
        m,
        "jaccl: the device matrix should define a valid mesh or a valid ring; it is not a \
         mesh because entry [0][2] is empty (rank 0 has no device cabled to rank 2), and \
         not a ring because entry [1][2] holds 0 devices but entry [0][1] holds 1 (every \
         rank needs as many cables to each neighbour)"
    );
}

#[test]
fn a_mesh_of_eight_ranks_is_accepted_and_of_nine_refused() {
    assert_eq!(MESH_MAX_PEERS, 8);
    assert_eq!(
        valid(0, mesh(8, 1)).topology().unwrap(),
        Topology::Mesh { wires: 1 }
    );
    let m = message(valid(0, mesh(9, 1)).topology());
    assert!(
        m.contains("mesh of 9 ranks") && m.contains("at most 8") && m.contains("JACCL_RING"),
        "{m}"
    );
    // The same cabling preferred as a ring is fine.
    assert_eq!(
        valid(0, mesh(9, 1)).prefer_ring(true).topology().unwrap(),
        Topology::Ring { wires: 1 }
    );
}

#[test]
fn a_ring_of_four_wires_is_accepted_and_of_five_refused() {
    assert_eq!(RING_MAX_CONNS, 4);
    assert_eq!(
        valid(0, ring(4, 4)).topology().unwrap(),
        Topology::Ring { wires: 4 }
    );
    let m = message(valid(0, ring(4, 5)).topology());
    assert!(
        m.contains("5 connections per direction") && m.contains("at most 4"),
        "{m}"
    );
}

#[test]
fn a_valid_configuration_validates() {
    valid(2, mesh(3, 1)).validate().unwrap();
    valid(3, ring(4, 2)).validate().unwrap();
}

#[test]
fn a_rank_not_below_the_size_is_refused_by_validate() {
    let m = message(valid(3, mesh(3, 1)).validate());
    assert_eq!(
        m,
        "jaccl: rank 3 is out of range: the device matrix has 3 rows, so valid ranks are 0 \
         to 2"
    );
}

#[test]
fn a_missing_coordinator_is_refused_naming_both_variables() {
    let m = message(Config::new(0, mesh(2, 1)).validate());
    assert!(
        m.contains("no coordinator")
            && m.contains("JACCL_COORDINATOR")
            && m.contains("MLX_JACCL_COORDINATOR"),
        "{m}"
    );
}

#[test]
fn a_coordinator_without_a_port_is_refused() {
    let m = message(
        Config::new(0, mesh(2, 1))
            .coordinator("10.0.0.1")
            .validate(),
    );
    assert!(
        m.contains("coordinator \"10.0.0.1\"") && m.contains("no port"),
        "{m}"
    );
}

#[test]
fn validate_also_checks_the_topology() {
    let m = message(valid(0, mesh(9, 1)).validate());
    assert!(m.contains("at most 8"), "{m}");
}

#[test]
fn the_builder_and_getters_round_trip() {
    let c = Config::new(1, mesh(2, 1))
        .coordinator("h:1")
        .prefer_ring(true);
    assert_eq!(c.rank(), 1);
    assert_eq!(c.size(), 2);
    assert_eq!(c.devices(), mesh(2, 1).as_slice());
    assert_eq!(c.coordinator_address(), Some("h:1"));
    assert!(c.prefers_ring());
    let c = c.prefer_ring(false);
    assert!(!c.prefers_ring());
    assert_eq!(Config::new(0, Vec::new()).coordinator_address(), None);
}

/// The environment: a device file with `text` (if any) and `vars`, the device path
/// standing for `@` in values.
struct EnvCase {
    vars: Vec<(String, OsString)>,
    _file: Option<TempFile>,
}

struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn env_case(file: Option<&[u8]>, vars: &[(&str, &str)]) -> EnvCase {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let file = file.map(|bytes| {
        let path = std::env::temp_dir().join(format!(
            "nuvec-jaccl-unit-{}-{}.json",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, bytes).unwrap();
        TempFile(path)
    });
    let path = file
        .as_ref()
        .map(|f| f.0.display().to_string())
        .unwrap_or_default();
    EnvCase {
        vars: vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v.replace('@', &path))))
            .collect(),
        _file: file,
    }
}

impl EnvCase {
    fn read(&self) -> Result<Option<Config>, Error> {
        Config::from_vars(|name| {
            self.vars
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }
}

const MESH2: &[u8] = b"[[null,\"rdma_en3\"],[\"rdma_en3\",null]]\n";

#[test]
fn without_a_device_variable_there_is_no_jaccl_configuration() {
    let e = env_case(None, &[("MLX_RANK", "0"), ("MLX_JACCL_COORDINATOR", "h:1")]);
    assert_eq!(e.read().unwrap(), None);
}

#[test]
fn the_variables_as_mlx_launch_writes_them_are_read() {
    let e = env_case(
        Some(MESH2),
        &[
            ("MLX_RANK", "1"),
            ("MLX_IBV_DEVICES", "@"),
            ("MLX_JACCL_COORDINATOR", "192.168.1.2:32323"),
        ],
    );
    let c = e.read().unwrap().unwrap();
    assert_eq!(
        c,
        Config::new(1, matrix(&[&[&[], &["rdma_en3"]], &[&["rdma_en3"], &[]]]))
            .coordinator("192.168.1.2:32323")
    );
    c.validate().unwrap();
}

#[test]
fn the_jaccl_names_win_over_the_mlx_names() {
    let e = env_case(
        Some(MESH2),
        &[
            ("JACCL_RANK", "1"),
            ("MLX_RANK", "0"),
            ("JACCL_IBV_DEVICES", "@"),
            ("MLX_IBV_DEVICES", "/nonexistent/devices.json"),
            ("JACCL_COORDINATOR", "a:1"),
            ("MLX_JACCL_COORDINATOR", "b:2"),
        ],
    );
    let c = e.read().unwrap().unwrap();
    assert_eq!(c.rank(), 1);
    assert_eq!(c.coordinator_address(), Some("a:1"));
}

#[test]
fn a_jaccl_name_with_a_bad_value_does_not_fall_back_to_the_mlx_name() {
    let e = env_case(
        Some(MESH2),
        &[
            ("JACCL_RANK", "one"),
            ("MLX_RANK", "1"),
            ("MLX_IBV_DEVICES", "@"),
        ],
    );
    let m = message(e.read());
    assert!(m.contains("JACCL_RANK=\"one\""), "{m}");
}

#[test]
fn either_ring_variable_present_even_empty_prefers_the_ring() {
    for var in ["JACCL_RING", "MLX_JACCL_RING"] {
        for value in ["1", "0", ""] {
            let e = env_case(
                Some(MESH2),
                &[("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@"), (var, value)],
            );
            assert!(e.read().unwrap().unwrap().prefers_ring(), "{var}={value:?}");
        }
    }
    let e = env_case(Some(MESH2), &[("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@")]);
    assert!(!e.read().unwrap().unwrap().prefers_ring());
}

#[test]
fn an_unset_coordinator_is_read_and_refused_by_validate() {
    let e = env_case(Some(MESH2), &[("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@")]);
    let c = e.read().unwrap().unwrap();
    assert_eq!(c.coordinator_address(), None);
    assert!(message(c.validate()).contains("no coordinator"));
}

#[test]
fn a_device_file_without_a_rank_is_an_error_naming_both_rank_variables() {
    let e = env_case(Some(MESH2), &[("MLX_IBV_DEVICES", "@")]);
    let m = message(e.read());
    assert!(
        m.contains("MLX_IBV_DEVICES is set") && m.contains("JACCL_RANK nor MLX_RANK"),
        "{m}"
    );
}

#[test]
fn a_rank_beyond_the_device_file_names_the_variable_and_the_file() {
    let e = env_case(Some(MESH2), &[("MLX_RANK", "2"), ("MLX_IBV_DEVICES", "@")]);
    let m = message(e.read());
    assert!(
        m.starts_with("jaccl: MLX_RANK=2 is out of range: the device file ")
            && m.contains("(MLX_IBV_DEVICES) has 2 rows, so valid ranks are 0 to 1"),
        "{m}"
    );
}

#[test]
fn a_malformed_device_file_names_the_file_and_the_variable() {
    let e = env_case(
        Some(b"[[null,true],[null,null]]"),
        &[("JACCL_RANK", "0"), ("JACCL_IBV_DEVICES", "@")],
    );
    let m = message(e.read());
    assert!(
        m.contains("(JACCL_IBV_DEVICES): row 0, entry 1") && m.contains("found a boolean"),
        "{m}"
    );
}

#[test]
fn an_unreadable_device_file_names_the_path_and_the_variable() {
    let e = env_case(
        None,
        &[
            ("MLX_RANK", "0"),
            ("MLX_IBV_DEVICES", "/nonexistent/nuvec/devices.json"),
        ],
    );
    let m = message(e.read());
    assert!(
        m.contains("/nonexistent/nuvec/devices.json (MLX_IBV_DEVICES): cannot read"),
        "{m}"
    );
}

#[test]
fn a_device_file_that_is_not_utf8_is_refused() {
    let e = env_case(
        Some(b"[[null,\"\xff\"]]"),
        &[("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "@")],
    );
    let m = message(e.read());
    assert!(
        m.contains("not UTF-8 text (invalid byte at offset 8)"),
        "{m}"
    );
}

#[test]
fn malformed_ranks_are_refused_naming_the_variable() {
    for (value, what) in [
        ("", "is empty"),
        ("-1", "is negative"),
        ("1.0", "is not a non-negative integer"),
        (" 1", "is not a non-negative integer"),
        ("99999999999999999999999", "is too large"),
    ] {
        let e = env_case(
            Some(MESH2),
            &[("MLX_RANK", value), ("MLX_IBV_DEVICES", "@")],
        );
        let m = message(e.read());
        assert!(
            m.contains(&format!("MLX_RANK={value:?} {what}")),
            "{value:?}: {m}"
        );
    }
}

#[test]
fn malformed_coordinators_are_refused_naming_the_variable() {
    for (value, what) in [
        ("10.0.0.1", "no port"),
        ("10.0.0.1:", "the port after the ':' is empty"),
        ("10.0.0.1:http", "is not a number"),
        ("10.0.0.1:0", "port 0 is not allowed"),
        (":5000", "the host before the ':' is empty"),
        ("", "the address is empty"),
    ] {
        let e = env_case(
            Some(MESH2),
            &[
                ("MLX_RANK", "0"),
                ("MLX_IBV_DEVICES", "@"),
                ("MLX_JACCL_COORDINATOR", value),
            ],
        );
        let m = message(e.read());
        assert!(
            m.contains(&format!(
                "MLX_JACCL_COORDINATOR={value:?} is not the \"ip:port\""
            )) && m.contains(what),
            "{value:?}: {m}"
        );
    }
}

#[test]
fn an_empty_device_path_is_refused() {
    let e = env_case(None, &[("MLX_RANK", "0"), ("MLX_IBV_DEVICES", "")]);
    let m = message(e.read());
    assert!(m.contains("MLX_IBV_DEVICES is set but empty"), "{m}");
}

#[cfg(unix)]
#[test]
fn non_utf8_rank_or_coordinator_values_are_refused() {
    use std::os::unix::ffi::OsStringExt;
    let e = env_case(Some(MESH2), &[("MLX_IBV_DEVICES", "@")]);
    let devices = e.vars[0].1.clone();
    let bad = OsString::from_vec(b"\xff".to_vec());
    for name in ["MLX_RANK", "MLX_JACCL_COORDINATOR"] {
        let m = message(Config::from_vars(|n| match n {
            "MLX_IBV_DEVICES" => Some(devices.clone()),
            "MLX_RANK" if name == "MLX_RANK" => Some(bad.clone()),
            "MLX_RANK" => Some("0".into()),
            n if n == name => Some(bad.clone()),
            _ => None,
        }));
        assert!(m.contains(name) && m.contains("not valid UTF-8"), "{m}");
    }
}
