//! MLX's JACCL configuration: the device matrix, this process's rank, the coordinator, and the
//! choice between a mesh and a ring (reference §3.2), as MLX's `jaccl::Config`.
//!
//! | Variable (the first wins) | Meaning |
//! | --- | --- |
//! | `JACCL_RANK` / `MLX_RANK` | this process's rank, a non-negative integer below the matrix size |
//! | `JACCL_IBV_DEVICES` / `MLX_IBV_DEVICES` | the **path** of the device file ([`parse_devices`]) |
//! | `JACCL_COORDINATOR` / `MLX_JACCL_COORDINATOR` | `"ip:port"` where rank 0 listens for the side channel |
//! | `JACCL_RING` / `MLX_JACCL_RING` | present (any value, even empty): prefer the ring topology |
//!
//! `mlx.launch --backend jaccl` (or `jaccl-ring`) writes the `MLX_*` names; MLX's standalone
//! JACCL library reads the `JACCL_*` ones first. Differences from MLX, all of them stricter,
//! never rejecting a configuration MLX can run:
//!
//! - every value is checked and a wrong one is an [`Error::Config`] ([`ConfigError`]) naming the variable or the
//!   file and the entry (MLX reads the rank with `atoi`, so `"x"` is rank 0);
//! - an empty device name is refused (MLX would open no device for it);
//! - a ring needs at least one device per neighbour (MLX counts a matrix whose neighbour
//!   entries are all empty as a ring of zero cables, which cannot carry anything).
//!
//! A mesh entry may list several devices, one per cable, as `mlx.distributed_config` 0.32.4
//! writes when every pair has two or more: the mesh then has as many wires as the least
//! number of devices of an entry over all pairs ([`Topology::Mesh`]), and MLX's validity rule is
//! unchanged (non-empty entries off the diagonal, empty ones on it).

use std::ffi::OsString;
use std::path::Path;

use serde_json::Value;

use crate::config::hostfile;
use crate::config::{AddressProblem, ConfigError, FileKind};
use crate::error::Error;

/// The largest mesh MLX supports, in ranks (MLX's `MESH_MAX_PEERS`).
pub const MESH_MAX_PEERS: usize = 8;

/// The most connections (cables) per direction a ring supports (MLX's `RING_MAX_CONNS`).
pub const RING_MAX_CONNS: usize = 4;

/// The rank variables, the first set one wins.
const RANK_VARS: [&str; 2] = ["JACCL_RANK", "MLX_RANK"];
/// The device-file variables, the first set one wins.
const DEVICES_VARS: [&str; 2] = ["JACCL_IBV_DEVICES", "MLX_IBV_DEVICES"];
/// The coordinator variables, the first set one wins.
pub(crate) const COORDINATOR_VARS: [&str; 2] = ["JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR"];
/// The ring-preference variables; either one present prefers the ring.
const RING_VARS: [&str; 2] = ["JACCL_RING", "MLX_JACCL_RING"];

/// How the ranks are cabled, as MLX chooses it ([`Config::topology`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Topology {
    /// Every pair of ranks is cabled (MLX's `MeshGroup`).
    Mesh {
        /// Queue pairs (cables) to every peer: the least number of devices of an entry over
        /// every pair of ranks (MLX 0.32.4's `n_wires_`); wire w uses the w-th device of each
        /// entry, the first `wires` devices of every entry being used.
        wires: usize,
    },
    /// Every rank is cabled to its left and right neighbours (MLX's `RingGroup`).
    Ring {
        /// Connections (cables, QPs) per direction: the number of devices of entry `[0][1]`.
        wires: usize,
    },
}

/// A JACCL configuration, as MLX's `jaccl::Config`: this process's rank, the device matrix
/// (`devices[i][j]`: the RDMA devices on rank i cabled to rank j), the coordinator address and
/// whether the ring is preferred.
///
/// The builder does not check anything; [`validate`](Config::validate) and
/// [`topology`](Config::topology) do.
///
/// ```
/// use nuvec_distributed::jaccl::{Config, Topology, parse_devices};
/// let devices = parse_devices(
///     r#"[[null, "rdma_en5", "rdma_en4"],
///         ["rdma_en5", null, "rdma_en3"],
///         ["rdma_en4", "rdma_en3", null]]"#,
///     "devices.json",
/// )?;
/// let config = Config::new(1, devices).coordinator("10.0.0.1:32323");
/// config.validate()?;
/// assert_eq!(config.topology()?, Topology::Mesh { wires: 1 });
/// # Ok::<(), nuvec_distributed::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    rank: usize,
    devices: Vec<Vec<Vec<String>>>,
    coordinator: Option<String>,
    prefer_ring: bool,
}

impl Config {
    /// A configuration for `rank` over the device matrix `devices` (one row per rank, one
    /// entry per rank in each row), with no coordinator and the ring not preferred.
    pub fn new(rank: usize, devices: Vec<Vec<Vec<String>>>) -> Self {
        Config {
            rank,
            devices,
            coordinator: None,
            prefer_ring: false,
        }
    }

    /// Sets the `"ip:port"` address where rank 0 listens for the side channel and the other
    /// ranks connect (checked by [`validate`](Config::validate)).
    pub fn coordinator(mut self, addr: &str) -> Self {
        self.coordinator = Some(addr.to_owned());
        self
    }

    /// Prefers the ring topology when the matrix is a valid ring (MLX's `prefer_ring`, set by
    /// `JACCL_RING` / `MLX_JACCL_RING`).
    pub fn prefer_ring(mut self, prefer: bool) -> Self {
        self.prefer_ring = prefer;
        self
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks: the number of rows of the device matrix.
    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// The device matrix: `devices()[i][j]` lists the devices on rank i cabled to rank j.
    pub fn devices(&self) -> &[Vec<Vec<String>>] {
        &self.devices
    }

    /// The coordinator address, if set.
    pub fn coordinator_address(&self) -> Option<&str> {
        self.coordinator.as_deref()
    }

    /// Whether the ring topology is preferred.
    pub fn prefers_ring(&self) -> bool {
        self.prefer_ring
    }

    /// The configuration from the process environment, as `mlx.launch --backend jaccl` writes
    /// it (see the [module docs](self) for the variables); `Ok(None)` when neither
    /// `JACCL_IBV_DEVICES` nor `MLX_IBV_DEVICES` is set.
    ///
    /// The device file is read and parsed. The coordinator may be unset (then
    /// [`validate`](Config::validate) fails); everything else must be well formed.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the variable (and the file and entry for the device file) when
    /// the device path is empty or unreadable, the device file is malformed, the rank is
    /// missing, not a non-negative integer or not below the matrix size, or the coordinator is
    /// not `"host:port"`.
    pub fn from_env() -> Result<Option<Config>, Error> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// [`from_env`](Config::from_env) with the variables read through `lookup` (a variable is
    /// unset when it returns `None`), so that tests need not touch the process environment.
    ///
    /// # Errors
    ///
    /// As [`from_env`](Config::from_env).
    pub fn from_vars(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Option<Config>, Error> {
        let first = |names: [&'static str; 2]| {
            names
                .into_iter()
                .find_map(|name| lookup(name).map(|v| (name, v)))
        };
        let Some((devices_var, path)) = first(DEVICES_VARS) else {
            return Ok(None);
        };
        if path.is_empty() {
            return Err(jaccl(ConfigError::EmptyVariable {
                var: devices_var.into(),
                expected: "the path of the JACCL device file (a JSON matrix of RDMA device names)"
                    .into(),
            }));
        }
        let path_shown = Path::new(&path).display().to_string();
        let Some((rank_var, rank)) = first(RANK_VARS) else {
            return Err(jaccl(ConfigError::MissingVariable {
                set: devices_var.into(),
                shown: path_shown,
                missing: RANK_VARS.map(String::from).to_vec(),
                hint: "set one to this process's rank (from 0)".into(),
            }));
        };
        let rank = parse_rank(rank_var, &rank)?;
        let coordinator = match first(COORDINATOR_VARS) {
            None => None,
            Some((var, value)) => {
                let Some(value) = value.to_str() else {
                    return Err(jaccl(ConfigError::NotUtf8 {
                        var: var.into(),
                        value,
                        expected: Some("\"ip:port\"".into()),
                    }));
                };
                if let Err(what) = check_address(value) {
                    return Err(jaccl(crate::config::env::bad_value(
                        var,
                        value,
                        &format!("is not the \"ip:port\" where rank 0 listens: {what}"),
                    )));
                }
                Some(value.to_owned())
            }
        };
        let prefer_ring = first(RING_VARS).is_some();
        let origin = format!("{path_shown} ({devices_var})");
        let bytes = std::fs::read(&path).map_err(|e| {
            jaccl(ConfigError::Unreadable {
                kind: FileKind::DeviceFile,
                file: origin.clone(),
                io: e.kind(),
                reason: e.to_string(),
            })
        })?;
        let text = String::from_utf8(bytes).map_err(|e| {
            jaccl(ConfigError::NotUtf8File {
                kind: FileKind::DeviceFile,
                file: origin.clone(),
                offset: e.utf8_error().valid_up_to(),
            })
        })?;
        let devices = parse_devices(&text, &origin)?;
        if rank >= devices.len() {
            return Err(jaccl(ConfigError::RankOutOfRange {
                var: rank_var.into(),
                rank,
                size: devices.len(),
                kind: FileKind::DeviceFile,
                file: origin,
            }));
        }
        Ok(Some(Config {
            rank,
            devices,
            coordinator,
            prefer_ring,
        }))
    }

    /// Whether the matrix is a valid mesh, as MLX's `is_valid_mesh`: at least 2 ranks, every
    /// diagonal entry empty and every other entry non-empty (a non-square matrix is neither a
    /// mesh nor a ring).
    pub fn is_valid_mesh(&self) -> bool {
        self.mesh_problem().is_none()
    }

    /// Whether the matrix is a valid ring, as MLX's `is_valid_ring`: at least 2 ranks, and for
    /// every rank the entries for its left and right neighbours hold as many devices as entry
    /// `[0][1]`, which must not be empty. Other entries are not looked at, so a full mesh is a
    /// ring too.
    pub fn is_valid_ring(&self) -> bool {
        self.ring_problem().is_none()
    }

    /// Checks the configuration as MLX does before connecting: the rank is below the size, a
    /// coordinator `"host:port"` is set, and the matrix gives a [`topology`](Config::topology)
    /// (a valid mesh or ring within MLX's limits).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] saying which of these fails and why.
    pub fn validate(&self) -> Result<(), Error> {
        if let Some(what) = self.shape_problem() {
            return Err(config(format!("the device matrix is not square: {what}")));
        }
        let size = self.size();
        if self.rank >= size {
            return Err(config(format!(
                "rank {} is out of range: the device matrix has {size} row{}{}",
                self.rank,
                if size == 1 { "" } else { "s" },
                match size {
                    0 => String::new(),
                    1 => ", so the only valid rank is 0".to_owned(),
                    n => format!(", so valid ranks are 0 to {}", n - 1),
                }
            )));
        }
        let Some(coordinator) = &self.coordinator else {
            return Err(jaccl(ConfigError::NoCoordinator {
                vars: COORDINATOR_VARS.map(String::from).to_vec(),
            }));
        };
        if let Err(problem) = check_address(coordinator) {
            return Err(jaccl(ConfigError::BadCoordinator {
                address: coordinator.clone(),
                problem,
            }));
        }
        self.topology().map(|_| ())
    }

    /// The topology MLX would build: the ring if it is preferred and the matrix is a valid
    /// ring, else the mesh if the matrix is a valid mesh, else the ring if it is a valid ring.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the matrix is neither ("should define a valid mesh or a valid
    /// ring", with the first reason for each), when the chosen mesh has more than
    /// [`MESH_MAX_PEERS`] ranks, or the chosen ring more than [`RING_MAX_CONNS`] connections
    /// per direction.
    pub fn topology(&self) -> Result<Topology, Error> {
        let ring = self.ring_problem();
        if self.prefer_ring && ring.is_none() {
            return self.ring_topology();
        }
        let mesh = self.mesh_problem();
        match (mesh, ring) {
            (None, _) => {
                if self.size() > MESH_MAX_PEERS {
                    return Err(config(format!(
                        "the device matrix is a mesh of {} ranks, but a JACCL mesh has at most \
                         {MESH_MAX_PEERS} (MLX's MESH_MAX_PEERS); cable the ranks as a ring and \
                         set {} or {} to prefer it",
                        self.size(),
                        RING_VARS[0],
                        RING_VARS[1]
                    )));
                }
                Ok(Topology::Mesh {
                    wires: self.mesh_wires(),
                })
            }
            (Some(_), None) => self.ring_topology(),
            (Some(mesh), Some(ring)) => Err(config(format!(
                "the device matrix should define a valid mesh or a valid ring; it is not a \
                 mesh because {mesh}, and not a ring because {ring}"
            ))),
        }
    }

    /// This rank's devices of wire 0 of a mesh, as MLX 0.32.1's `get_mesh_connectivity`: for
    /// every rank the first device cabled to it, `None` for this rank itself (wire 0 of
    /// [`mesh_wire_devices`](Config::mesh_wire_devices)).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the rank is out of range or the matrix is not a valid mesh.
    pub fn mesh_devices(&self) -> Result<Vec<Option<&str>>, Error> {
        let mut wires = self.mesh_wire_devices()?;
        Ok(wires.swap_remove(0))
    }

    /// This rank's devices of every wire of a mesh, as MLX 0.32.4's `get_mesh_connectivity`:
    /// `devices[w][j]` is the w-th device cabled to rank j (`None` for this rank itself), for
    /// w below [`Topology::Mesh`]'s `wires`, the least number of devices of an entry.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the rank is out of range or the matrix is not a valid mesh.
    pub fn mesh_wire_devices(&self) -> Result<Vec<Vec<Option<&str>>>, Error> {
        if let Some(what) = self.mesh_problem() {
            return Err(config(format!(
                "the device matrix is not a valid mesh: {what}"
            )));
        }
        let row = self.row()?;
        Ok((0..self.mesh_wires())
            .map(|w| {
                row.iter()
                    .enumerate()
                    .map(|(j, entry)| (j != self.rank).then(|| entry[w].as_str()))
                    .collect()
            })
            .collect())
    }

    /// The wires of a valid mesh: the least number of devices of an entry off the diagonal,
    /// over the whole matrix (so that every rank finds the same number).
    fn mesh_wires(&self) -> usize {
        self.devices
            .iter()
            .enumerate()
            .flat_map(|(i, row)| {
                row.iter()
                    .enumerate()
                    .filter(move |(j, _)| *j != i)
                    .map(|(_, entry)| entry.len())
            })
            .min()
            .unwrap_or(1)
            .max(1)
    }

    /// This rank's devices of a ring, as MLX's `get_ring_connectivity`: the devices cabled to
    /// its left neighbour (rank − 1) and to its right neighbour (rank + 1), cable c of each
    /// being the c-th device (with 2 ranks both are the same neighbour).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the rank is out of range or the matrix is not a valid ring.
    pub fn ring_devices(&self) -> Result<(&[String], &[String]), Error> {
        if let Some(what) = self.ring_problem() {
            return Err(config(format!(
                "the device matrix is not a valid ring: {what}"
            )));
        }
        let row = self.row()?;
        let size = self.size();
        let left = (self.rank + size - 1) % size;
        let right = (self.rank + 1) % size;
        Ok((&row[left], &row[right]))
    }

    /// This rank's row of the matrix.
    fn row(&self) -> Result<&[Vec<String>], Error> {
        self.devices
            .get(self.rank)
            .map(Vec::as_slice)
            .ok_or_else(|| {
                config(format!(
                    "rank {} is out of range: the device matrix has {} rows",
                    self.rank,
                    self.size()
                ))
            })
    }

    fn ring_topology(&self) -> Result<Topology, Error> {
        let wires = self.devices[0][1].len();
        if wires > RING_MAX_CONNS {
            return Err(config(format!(
                "the ring has {wires} connections per direction (entry [0][1] lists {wires} \
                 devices), but a JACCL ring has at most {RING_MAX_CONNS} (MLX's RING_MAX_CONNS)"
            )));
        }
        Ok(Topology::Ring { wires })
    }

    /// Why the matrix is not square, if it is not.
    fn shape_problem(&self) -> Option<String> {
        let size = self.size();
        self.devices.iter().enumerate().find_map(|(r, row)| {
            (row.len() != size).then(|| {
                format!(
                    "row {r} has {} entr{} but there are {size} rows",
                    row.len(),
                    if row.len() == 1 { "y" } else { "ies" }
                )
            })
        })
    }

    /// Why the matrix is not a valid mesh, if it is not.
    fn mesh_problem(&self) -> Option<String> {
        if let Some(what) = self.shape_problem() {
            return Some(what);
        }
        let size = self.size();
        if size < 2 {
            return Some(format!(
                "it has {size} rank{}, not at least 2",
                plural(size)
            ));
        }
        for (i, row) in self.devices.iter().enumerate() {
            for (j, entry) in row.iter().enumerate() {
                if i == j && !entry.is_empty() {
                    return Some(format!(
                        "entry [{i}][{i}] names {entry:?} but the diagonal must be null (a rank \
                         has no cable to itself)"
                    ));
                }
                if i != j && entry.is_empty() {
                    return Some(format!(
                        "entry [{i}][{j}] is empty (rank {i} has no device cabled to rank {j})"
                    ));
                }
            }
        }
        None
    }

    /// Why the matrix is not a valid ring, if it is not.
    fn ring_problem(&self) -> Option<String> {
        if let Some(what) = self.shape_problem() {
            return Some(what);
        }
        let size = self.size();
        if size < 2 {
            return Some(format!(
                "it has {size} rank{}, not at least 2",
                plural(size)
            ));
        }
        let wires = self.devices[0][1].len();
        if wires == 0 {
            return Some(
                "entry [0][1] is empty (rank 0 has no device cabled to its right neighbour)"
                    .to_owned(),
            );
        }
        for (src, row) in self.devices.iter().enumerate() {
            let left = (src + size - 1) % size;
            let right = (src + 1) % size;
            for dst in [left, right] {
                let n = row[dst].len();
                if n != wires {
                    return Some(format!(
                        "entry [{src}][{dst}] holds {n} device{} but entry [0][1] holds {wires} \
                         (every rank needs as many cables to each neighbour)",
                        plural(n)
                    ));
                }
            }
        }
        None
    }
}

/// Parses MLX's JACCL device file (the file `MLX_IBV_DEVICES` names) into the device matrix.
///
/// The text is a JSON list of R rows, each a list of R entries; entry `[i][j]` names the RDMA
/// device(s) on rank i cabled to rank j: `null` (none, always on the diagonal; an empty list),
/// a device name such as `"rdma_en3"`, or a list of names (several cables, the c-th name on
/// both ends being the same cable). Surrounding whitespace (`mlx.launch` writes the file with
/// `echo`) and a leading byte-order mark are ignored. `origin` names the file in errors.
///
/// # Errors
///
/// [`Error::Config`] naming `origin`, and the row and entry where it applies, when the text is
/// empty, not JSON, not a list of rows, has no rows, has a row that is not a list or not of R
/// entries, or an entry that is not null, a non-empty string or a list of non-empty strings.
pub fn parse_devices(text: &str, origin: &str) -> Result<Vec<Vec<Vec<String>>>, Error> {
    const EXPECTED: &str = "a JSON list with one row per rank, each a list with one entry per \
                            rank: null, a device name or a list of device names";
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let file = |problem: String| {
        jaccl(ConfigError::DeviceFile {
            file: origin.to_owned(),
            problem,
        })
    };
    if text.trim().is_empty() {
        return Err(file(format!("the file is empty; expected {EXPECTED}")));
    }
    let value: Value =
        serde_json::from_str(text).map_err(|e| file(format!("not valid JSON: {e}")))?;
    let Value::Array(rows) = value else {
        return Err(file(format!("expected {EXPECTED}, found {}", kind(&value))));
    };
    if rows.is_empty() {
        return Err(file(format!(
            "the list of rows is empty; expected {EXPECTED}"
        )));
    }
    let size = rows.len();
    let mut matrix = Vec::with_capacity(size);
    for (r, row) in rows.iter().enumerate() {
        let Value::Array(entries) = row else {
            return Err(file(format!(
                "row {r}: expected a list of {size} entr{} (one per rank), found {}",
                if size == 1 { "y" } else { "ies" },
                kind(row)
            )));
        };
        if entries.len() != size {
            return Err(file(format!(
                "row {r} has {} entr{} but the file has {size} rows; every row needs one entry \
                 per rank (null where there is no cable)",
                entries.len(),
                if entries.len() == 1 { "y" } else { "ies" }
            )));
        }
        let mut parsed = Vec::with_capacity(size);
        for (e, entry) in entries.iter().enumerate() {
            let at = format!("row {r}, entry {e}");
            let names = match entry {
                Value::Null => Vec::new(),
                Value::String(name) => vec![device_name(name, &at).map_err(file)?],
                Value::Array(names) => names
                    .iter()
                    .enumerate()
                    .map(|(k, name)| match name {
                        Value::String(name) => {
                            device_name(name, &format!("{at}, device {k}")).map_err(file)
                        }
                        other => Err(file(format!(
                            "{at}, device {k}: expected a device name (a string), found {}",
                            kind(other)
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
                other => {
                    return Err(file(format!(
                        "{at}: expected null, a device name or a list of device names, found {}",
                        kind(other)
                    )));
                }
            };
            parsed.push(names);
        }
        matrix.push(parsed);
    }
    Ok(matrix)
}

/// A device name, refused when empty (saying so, with `at`, where it is in the file).
fn device_name(name: &str, at: &str) -> Result<String, String> {
    if name.is_empty() {
        return Err(format!(
            "{at}: the device name is empty; use null for no cable"
        ));
    }
    Ok(name.to_owned())
}

/// What is wrong with a `"host:port"` address, if anything (the ring hostfile's rules).
fn check_address(addr: &str) -> Result<(), AddressProblem> {
    hostfile::split(addr).map(|_| ())
}

/// A rank from `var`: a non-negative decimal integer (the crate's one rule).
fn parse_rank(var: &str, raw: &OsString) -> Result<usize, Error> {
    crate::config::env::rank_of(var, raw).map_err(jaccl)
}

/// A configuration error of the device matrix; every JACCL message starts with `jaccl:`.
fn config(what: String) -> Error {
    jaccl(ConfigError::DeviceMatrix { problem: what })
}

/// A configuration error of JACCL (its message starts with `jaccl:`).
fn jaccl(e: ConfigError) -> Error {
    Error::Config(e.jaccl())
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// What kind of JSON value `v` is, for messages.
fn kind(v: &Value) -> &'static str {
    crate::config::hostfile::json_kind(v)
}

#[cfg(test)]
mod tests;
