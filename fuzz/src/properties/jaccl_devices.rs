//! Target `jaccl_devices`: MLX's JACCL device file parsed, written back and checked against
//! MLX's mesh and ring rules; also [`check_config`] and [`config_message`], shared with
//! `jaccl_env` and `jaccl_destination`.

use nuvec_distributed::hostfile;
use nuvec_distributed::jaccl::{Config, MESH_MAX_PEERS, RING_MAX_CONNS, Topology, parse_devices};
use nuvec_distributed::{ConfigError, Error};

use super::script::text;

/// A JACCL device matrix: `m[i][j]` lists the devices on rank i cabled to rank j.
type Matrix = Vec<Vec<Vec<String>>>;

/// The message of a configuration error; panics on any other error (every JACCL configuration
/// error is an [`Error::Config`] holding a [`ConfigError::Jaccl`], whose message starts with
/// `jaccl:`).
pub(super) fn config_message<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) -> String {
    match result {
        Err(Error::Config(e)) => {
            assert!(
                matches!(e, ConfigError::Jaccl(_)),
                "{what}: not one of JACCL's: {e:?}"
            );
            let m = e.to_string();
            assert!(m.starts_with("jaccl: "), "{what}: message {m:?}");
            m
        }
        other => panic!("{what}: expected a configuration error, got {other:?}"),
    }
}

/// `s` as a JSON string literal, escaped by hand (nothing here depends on a JSON crate).
fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The device file of `m` as MLX writes it (`null`, a name, or a list of names), or with
/// `lists` every entry as a list (`[]` for none), which means the same.
fn write_devices(m: &Matrix, lists: bool) -> String {
    let mut out = String::from("[");
    for (i, row) in m.iter().enumerate() {
        out.push_str(if i == 0 { "[" } else { ",\n [" });
        for (j, entry) in row.iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            match entry.as_slice() {
                [] if !lists => out.push_str("null"),
                [name] if !lists => json_string(name, &mut out),
                names => {
                    out.push('[');
                    for (k, name) in names.iter().enumerate() {
                        if k > 0 {
                            out.push(',');
                        }
                        json_string(name, &mut out);
                    }
                    out.push(']');
                }
            }
        }
        out.push(']');
    }
    out.push(']');
    out
}

/// Checks every query of a JACCL [`Config`] against MLX's rules restated here: no panic for any
/// matrix (square or not) and rank; `is_valid_mesh` (at least 2 ranks, square, the diagonal and
/// only it empty) and `is_valid_ring` (at least 2 ranks, square, entry `[0][1]` non-empty and
/// every rank's left and right entries as long); `topology` picks the preferred ring, else the
/// mesh, else the ring, within `MESH_MAX_PEERS` and `RING_MAX_CONNS`; `mesh_devices` and
/// `ring_devices` succeed exactly for a valid mesh or ring and a rank in range, and give this
/// rank's first device towards every other rank, and its left and right entries; `validate`
/// succeeds exactly when the matrix is square, the rank in range, the coordinator a
/// `host:port` and the topology defined. Every failure is a `jaccl:` configuration error.
pub(super) fn check_config(c: &Config) {
    let m = c.devices();
    let size = m.len();
    let rank = c.rank();
    assert_eq!(c.size(), size);
    let square = m.iter().all(|row| row.len() == size);
    let mesh = square
        && size >= 2
        && m.iter().enumerate().all(|(i, row)| {
            row.iter()
                .enumerate()
                .all(|(j, entry)| (i == j) == entry.is_empty())
        });
    let wires = if square && size >= 2 {
        m[0][1].len()
    } else {
        0
    };
    let ring = square
        && size >= 2
        && wires > 0
        && (0..size).all(|i| {
            m[i][(i + size - 1) % size].len() == wires && m[i][(i + 1) % size].len() == wires
        });
    assert_eq!(c.is_valid_mesh(), mesh, "is_valid_mesh of {m:?}");
    assert_eq!(c.is_valid_ring(), ring, "is_valid_ring of {m:?}");

    let chosen = if c.prefers_ring() && ring {
        Some(Topology::Ring { wires })
    } else if mesh {
        let wires = (0..size)
            .flat_map(|i| (0..size).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| m[i][j].len())
            .min()
            .unwrap_or(1);
        Some(Topology::Mesh { wires })
    } else if ring {
        Some(Topology::Ring { wires })
    } else {
        None
    };
    let expected = chosen.filter(|t| match t {
        Topology::Mesh { .. } => size <= MESH_MAX_PEERS,
        Topology::Ring { wires } => *wires <= RING_MAX_CONNS,
    });
    let topology = c.topology();
    match expected {
        Some(t) => assert_eq!(topology.ok(), Some(t), "topology of {c:?}"),
        None => {
            config_message(topology, "topology");
        }
    }

    let in_range = rank < size;
    match c.mesh_devices() {
        Ok(row) => {
            assert!(mesh && in_range, "mesh_devices of {c:?}");
            assert_eq!(row.len(), size);
            for (j, device) in row.iter().enumerate() {
                let want = (j != rank).then(|| m[rank][j][0].as_str());
                assert_eq!(*device, want, "mesh device towards {j} of {c:?}");
            }
        }
        Err(e) => assert!(
            !(mesh && in_range),
            "mesh_devices of a valid mesh: {e} for {c:?}"
        ),
    }
    match c.ring_devices() {
        Ok((left, right)) => {
            assert!(ring && in_range, "ring_devices of {c:?}");
            assert_eq!(left, m[rank][(rank + size - 1) % size].as_slice());
            assert_eq!(right, m[rank][(rank + 1) % size].as_slice());
            assert_eq!((left.len(), right.len()), (wires, wires));
        }
        Err(e) => assert!(
            !(ring && in_range),
            "ring_devices of a valid ring: {e} for {c:?}"
        ),
    }

    let coordinator_ok = c
        .coordinator_address()
        .is_some_and(|a| hostfile::split_address(a).is_ok());
    let valid = square && in_range && coordinator_ok && expected.is_some();
    let validated = c.validate();
    if valid {
        assert!(validated.is_ok(), "validate of {c:?}: {validated:?}");
    } else {
        config_message(validated, "validate");
    }
}

/// Checks `m` under a few ranks, coordinators and preferences, and reshaped to non-square.
fn check_matrix(m: &Matrix, pick: u8) {
    let size = m.len();
    let ranks = [
        0,
        size.saturating_sub(1),
        size,
        usize::from(pick) % (size + 2),
    ];
    for rank in ranks {
        for prefer in [false, true] {
            let base = Config::new(rank, m.clone()).prefer_ring(prefer);
            check_config(&base);
            check_config(&base.clone().coordinator("10.0.0.1:32323"));
            check_config(&base.coordinator("10.0.0.1"));
        }
    }
    // Not square: a short last row, an extra row, an extra entry.
    let mut short = m.clone();
    if let Some(row) = short.last_mut() {
        row.pop();
    }
    let mut tall = m.clone();
    tall.push(vec![Vec::new(); size]);
    let mut wide = m.clone();
    if let Some(row) = wide.first_mut() {
        row.push(vec!["rdma_extra".to_owned()]);
    }
    for odd in [short, tall, wide] {
        let c = Config::new(usize::from(pick) % 3, odd)
            .coordinator("h:1")
            .prefer_ring(pick & 1 == 1);
        check_config(&c);
    }
}

/// MLX's JACCL device file (`MLX_IBV_DEVICES`'s JSON matrix): `jaccl::parse_devices` never
/// panics and refuses with a `jaccl:` configuration error naming the file; an accepted matrix
/// is square with at least one row and no empty device name, and parses back unchanged from
/// its written form (`null`/name/list, with a byte-order mark and `echo`'s newline) and from the
/// all-lists form. Every accepted matrix, and non-square variants of it, then goes through
/// [`check_config`]: `validate`, `topology`, `mesh_devices` and `ring_devices` agree with MLX's
/// rules and never panic.
pub(crate) fn jaccl_devices(data: &[u8]) {
    let text = text(data);
    let m = match parse_devices(&text, "fuzz.json") {
        Ok(m) => m,
        Err(e) => {
            let message = config_message(Err::<(), _>(e), "parse_devices");
            assert!(
                message.contains("fuzz.json"),
                "the error does not name the file: {message}"
            );
            return;
        }
    };
    let size = m.len();
    assert!(size > 0, "accepted a matrix with no rows: {text:?}");
    for (i, row) in m.iter().enumerate() {
        assert_eq!(row.len(), size, "row {i} of an accepted {text:?}");
        for entry in row {
            assert!(
                entry.iter().all(|name| !name.is_empty()),
                "an empty device name accepted from {text:?}"
            );
        }
    }
    let written = write_devices(&m, false);
    for again in [
        written.clone(),
        format!("{written}\n"),
        format!("\u{feff}{written}"),
        write_devices(&m, true),
    ] {
        match parse_devices(&again, "rewritten") {
            Ok(back) => assert_eq!(back, m, "round trip of {text:?} via {again:?}"),
            Err(e) => panic!("the written form {again:?} of {text:?} does not parse: {e}"),
        }
    }
    check_matrix(&m, data.last().copied().unwrap_or(0));
}
