//! The provider's configuration, read from the environment once per process.
//!
//! Every knob is an environment variable because the provider is loaded by `dlopen` into a
//! process that does not know it is talking to a simulation: the launcher that starts the ranks
//! is the only place a test can say what the fabric should look like. A bad value is reported
//! on stderr, naming the variable, and makes `ibv_get_device_list` fail with `EINVAL`, so that a
//! typo cannot silently run a test without the fault it asked for.

use nuvec_verbs_abi::{APPLE_MAX_MR_PER_DEVICE, APPLE_MAX_QP_PER_DEVICE, APPLE_MAX_WR_PER_QUEUE};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The device names listed when `NUVEC_VERBS_EMU_DEVICES` is not set.
pub(crate) const DEFAULT_DEVICE_COUNT: usize = 8;

/// The longest device name accepted (rdma-core's `IBV_SYSFS_NAME_MAX` is 64 with its NUL).
pub(crate) const MAX_DEVICE_NAME: usize = 63;

/// What the environment asked for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Config {
    /// The device names, in listing order (`NUVEC_VERBS_EMU_DEVICES`).
    pub(crate) devices: Vec<String>,
    /// Whether GID index 1 is left empty instead of holding an IPv4-mapped GID
    /// (`NUVEC_VERBS_EMU_NO_IPV4=1`).
    pub(crate) no_ipv4: bool,
    /// Whether `IBV_WR_SEND_WITH_IMM` is refused with `EINVAL` (`NUVEC_VERBS_EMU_NO_IMM=1`).
    pub(crate) no_imm: bool,
    /// The probability that a sent message is lost (`NUVEC_VERBS_EMU_LOSS`).
    pub(crate) loss: f64,
    /// The seed of the loss generator (`NUVEC_VERBS_EMU_SEED`).
    pub(crate) seed: u64,
    /// The work request, counting from 1 over the process, that completes in error
    /// (`NUVEC_VERBS_EMU_FAIL_WR`).
    pub(crate) fail_wr: Option<u64>,
    /// The number of sent messages after which the process kills itself
    /// (`NUVEC_VERBS_EMU_DIE_AFTER`).
    pub(crate) die_after: Option<u64>,
    /// Where `ibv_close_device` appends its accounting line (`NUVEC_VERBS_EMU_LEDGER`).
    pub(crate) ledger: Option<PathBuf>,
    /// Where every queue pair's messages are logged (`NUVEC_VERBS_EMU_TRACE`, see `trace`).
    pub(crate) trace: Option<PathBuf>,
    /// What becomes of a message that finds no receive posted (`NUVEC_VERBS_EMU_UNEXPECTED`).
    pub(crate) unexpected: Unexpected,
    /// How messages travel between processes (`NUVEC_VERBS_EMU_WIRE`).
    pub(crate) wire: WireChoice,
    /// What every device allows, and what `ibv_query_device` reports.
    pub(crate) limits: Limits,
    /// Whether `ibv_dereg_mr` fails with `EBUSY`, leaving the region registered
    /// (`NUVEC_VERBS_EMU_FAIL_DEREG=1`), as a device still using it would.
    pub(crate) fail_dereg: bool,
}

/// What every device of the provider allows (Apple's reported limits unless the environment
/// says otherwise): a Mac behind a hub reports 3 queue pairs (ml-explore/mlx#3205).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Queue pairs per device (`NUVEC_VERBS_EMU_MAX_QP`).
    pub(crate) qps: usize,
    /// Memory regions per device (`NUVEC_VERBS_EMU_MAX_MR`).
    pub(crate) mrs: usize,
    /// Work requests per queue of a queue pair (`NUVEC_VERBS_EMU_MAX_QP_WR`).
    pub(crate) wrs: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            qps: APPLE_MAX_QP_PER_DEVICE,
            mrs: APPLE_MAX_MR_PER_DEVICE,
            wrs: APPLE_MAX_WR_PER_QUEUE,
        }
    }
}

/// The largest limit accepted: what `ibv_device_attr`'s `int` fields can report.
const MAX_LIMIT: u64 = i32::MAX as u64;

/// How messages travel between processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WireChoice {
    /// Abstract Unix sockets (`unix`, the default): every process on one machine and in one
    /// network namespace.
    Unix,
    /// TCP over IPv4 (`tcp`, or `tcp:<address>`), so that ranks in different network
    /// namespaces, behind real network stacks and links, reach each other; the GIDs carry the
    /// address. `None`: the first non-loopback IPv4 address of the process's network namespace
    /// that is up, or 127.0.0.1 when there is none.
    Tcp(Option<Ipv4Addr>),
}

/// What becomes of a message that arrives when its queue pair has no receive posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unexpected {
    /// Held until a receive is posted (`hold`, the default): what Apple's Thunderbolt provider
    /// appears to do, and what MLX's JACCL relies on (its sends are not flow-controlled, so a
    /// rank may send more frames than its peer has receives posted).
    Hold,
    /// Dropped without a word (`drop`), as InfiniBand's UC specifies.
    Drop,
}

impl Config {
    /// Parses the configuration from a variable lookup (the environment, or a table in tests).
    ///
    /// Returns a message naming the first variable whose value is bad.
    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let devices = match get("NUVEC_VERBS_EMU_DEVICES") {
            None => (0..DEFAULT_DEVICE_COUNT)
                .map(|i| format!("rdma_en{i}"))
                .collect(),
            Some(list) => parse_devices(&list)?,
        };
        let no_ipv4 = flag(&get, "NUVEC_VERBS_EMU_NO_IPV4")?;
        let no_imm = flag(&get, "NUVEC_VERBS_EMU_NO_IMM")?;
        let loss = match get("NUVEC_VERBS_EMU_LOSS") {
            None => 0.0,
            Some(text) => match text.trim().parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => p,
                _ => {
                    return Err(format!(
                        "NUVEC_VERBS_EMU_LOSS must be a probability between 0 and 1, not {text:?}"
                    ));
                }
            },
        };
        let seed = match get("NUVEC_VERBS_EMU_SEED") {
            None => 0,
            Some(text) => text.trim().parse::<u64>().map_err(|_| {
                format!("NUVEC_VERBS_EMU_SEED must be an unsigned 64-bit integer, not {text:?}")
            })?,
        };
        let fail_wr = positive(&get, "NUVEC_VERBS_EMU_FAIL_WR")?;
        let die_after = positive(&get, "NUVEC_VERBS_EMU_DIE_AFTER")?;
        let ledger = match get("NUVEC_VERBS_EMU_LEDGER") {
            None => None,
            Some(path) if path.is_empty() => {
                return Err("NUVEC_VERBS_EMU_LEDGER must be a file path, not empty".to_owned());
            }
            Some(path) => Some(PathBuf::from(path)),
        };
        let trace = match get("NUVEC_VERBS_EMU_TRACE") {
            None => None,
            Some(path) if path.is_empty() => {
                return Err("NUVEC_VERBS_EMU_TRACE must be a file path, not empty".to_owned());
            }
            Some(path) => Some(PathBuf::from(path)),
        };
        let unexpected = match get("NUVEC_VERBS_EMU_UNEXPECTED").as_deref() {
            None | Some("") | Some("hold") => Unexpected::Hold,
            Some("drop") => Unexpected::Drop,
            Some(other) => {
                return Err(format!(
                    "NUVEC_VERBS_EMU_UNEXPECTED must be hold or drop, not {other:?}"
                ));
            }
        };
        let wire = match get("NUVEC_VERBS_EMU_WIRE").as_deref().map(str::trim) {
            None | Some("") | Some("unix") => WireChoice::Unix,
            Some("tcp") => WireChoice::Tcp(None),
            Some(other) => match other.strip_prefix("tcp:").map(str::parse::<Ipv4Addr>) {
                Some(Ok(address)) if !address.is_unspecified() && !address.is_broadcast() => {
                    WireChoice::Tcp(Some(address))
                }
                _ => {
                    return Err(format!(
                        "NUVEC_VERBS_EMU_WIRE must be unix, tcp or tcp:<IPv4 address of this \
                         host>, not {other:?}"
                    ));
                }
            },
        };
        let limit = |name: &str, default: u64| -> Result<u64, String> {
            match positive(&get, name)? {
                None => Ok(default),
                Some(n) if n <= MAX_LIMIT => Ok(n),
                Some(n) => Err(format!("{name} must be at most {MAX_LIMIT}, not {n}")),
            }
        };
        let apple = Limits::default();
        let limits = Limits {
            qps: limit("NUVEC_VERBS_EMU_MAX_QP", apple.qps as u64)? as usize,
            mrs: limit("NUVEC_VERBS_EMU_MAX_MR", apple.mrs as u64)? as usize,
            wrs: limit("NUVEC_VERBS_EMU_MAX_QP_WR", u64::from(apple.wrs))? as u32,
        };
        let fail_dereg = flag(&get, "NUVEC_VERBS_EMU_FAIL_DEREG")?;
        Ok(Config {
            limits,
            fail_dereg,
            wire,
            unexpected,
            devices,
            no_ipv4,
            no_imm,
            loss,
            seed,
            fail_wr,
            die_after,
            ledger,
            trace,
        })
    }
}

/// Parses a 0/1 flag (unset or empty is 0).
fn flag(get: &impl Fn(&str) -> Option<String>, name: &str) -> Result<bool, String> {
    match get(name).as_deref() {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!("{name} must be 0 or 1, not {other:?}")),
    }
}

/// Parses a positive count (`k >= 1`) from a variable, if set.
fn positive(get: &impl Fn(&str) -> Option<String>, name: &str) -> Result<Option<u64>, String> {
    match get(name) {
        None => Ok(None),
        Some(text) => match text.trim().parse::<u64>() {
            Ok(k) if k >= 1 => Ok(Some(k)),
            _ => Err(format!(
                "{name} must be a positive integer (counting from 1), not {text:?}"
            )),
        },
    }
}

/// Parses `NUVEC_VERBS_EMU_DEVICES`: comma-separated, unique, non-empty names; an empty
/// value lists no device (a machine without RDMA devices).
fn parse_devices(list: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Vec::new();
    if list.trim().is_empty() {
        return Ok(names);
    }
    for name in list.split(',').map(str::trim) {
        let ok = !name.is_empty()
            && name.len() <= MAX_DEVICE_NAME
            && name.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
        if !ok {
            return Err(format!(
                "NUVEC_VERBS_EMU_DEVICES must be comma-separated device names of 1 to \
                 {MAX_DEVICE_NAME} printable characters without '/', not {list:?}"
            ));
        }
        if names.iter().any(|n| n == name) {
            return Err(format!(
                "NUVEC_VERBS_EMU_DEVICES names {name:?} twice in {list:?}"
            ));
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

/// The process's configuration, read from the environment on first use.
pub(crate) fn get() -> &'static Result<Config, String> {
    static CONFIG: OnceLock<Result<Config, String>> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let parsed = Config::from_lookup(|name| std::env::var(name).ok());
        if let Err(message) = &parsed {
            eprintln!("nuvec-verbs-emu: {message}");
        }
        parsed
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<Config, String> {
        Config::from_lookup(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn a_message_without_a_receive_is_held_unless_drop_is_asked_for() {
        assert_eq!(with(&[]).unwrap().unexpected, Unexpected::Hold);
        assert_eq!(
            with(&[("NUVEC_VERBS_EMU_UNEXPECTED", "drop")])
                .unwrap()
                .unexpected,
            Unexpected::Drop
        );
        let e = with(&[("NUVEC_VERBS_EMU_UNEXPECTED", "lose")]).unwrap_err();
        assert!(e.contains("NUVEC_VERBS_EMU_UNEXPECTED"), "{e}");
    }

    #[test]
    fn without_variables_eight_devices_and_no_faults() {
        let config = with(&[]).unwrap();
        assert_eq!(config.devices.len(), 8);
        assert_eq!(config.devices[0], "rdma_en0");
        assert_eq!(config.devices[7], "rdma_en7");
        assert!(!config.no_ipv4);
        assert!(!config.no_imm);
        assert_eq!(config.loss, 0.0);
        assert_eq!(config.fail_wr, None);
        assert_eq!(config.die_after, None);
        assert_eq!(config.ledger, None);
        assert_eq!(config.trace, None);
        assert_eq!(config.wire, WireChoice::Unix);
    }

    #[test]
    fn the_wire_is_unix_sockets_or_tcp_on_a_chosen_or_found_address() {
        let wire = |v: &str| with(&[("NUVEC_VERBS_EMU_WIRE", v)]).unwrap().wire;
        assert_eq!(wire("unix"), WireChoice::Unix);
        assert_eq!(wire("tcp"), WireChoice::Tcp(None));
        assert_eq!(
            wire("tcp:198.18.0.2"),
            WireChoice::Tcp(Some(Ipv4Addr::new(198, 18, 0, 2)))
        );
    }

    #[test]
    fn every_bad_value_names_its_variable() {
        for (name, value) in [
            ("NUVEC_VERBS_EMU_DEVICES", ","),
            ("NUVEC_VERBS_EMU_DEVICES", "a,,b"),
            ("NUVEC_VERBS_EMU_DEVICES", "a,a"),
            ("NUVEC_VERBS_EMU_NO_IPV4", "yes"),
            ("NUVEC_VERBS_EMU_NO_IMM", "true"),
            ("NUVEC_VERBS_EMU_LOSS", "1.5"),
            ("NUVEC_VERBS_EMU_LOSS", "NaN"),
            ("NUVEC_VERBS_EMU_SEED", "-1"),
            ("NUVEC_VERBS_EMU_FAIL_WR", "0"),
            ("NUVEC_VERBS_EMU_DIE_AFTER", "x"),
            ("NUVEC_VERBS_EMU_LEDGER", ""),
            ("NUVEC_VERBS_EMU_TRACE", ""),
            ("NUVEC_VERBS_EMU_WIRE", "udp"),
            ("NUVEC_VERBS_EMU_WIRE", "tcp:0.0.0.0"),
            ("NUVEC_VERBS_EMU_WIRE", "tcp:198.18.0.300"),
            ("NUVEC_VERBS_EMU_MAX_QP", "0"),
            ("NUVEC_VERBS_EMU_MAX_MR", "many"),
            ("NUVEC_VERBS_EMU_MAX_QP_WR", "4294967296"),
            ("NUVEC_VERBS_EMU_FAIL_DEREG", "yes"),
        ] {
            let message = with(&[(name, value)]).unwrap_err();
            assert!(message.contains(name), "{message}");
        }
    }

    #[test]
    fn good_values_are_taken() {
        let config = with(&[
            ("NUVEC_VERBS_EMU_DEVICES", "rdma_en3, rdma_en5"),
            ("NUVEC_VERBS_EMU_NO_IPV4", "1"),
            ("NUVEC_VERBS_EMU_LOSS", "0.25"),
            ("NUVEC_VERBS_EMU_SEED", "42"),
            ("NUVEC_VERBS_EMU_FAIL_WR", "3"),
            ("NUVEC_VERBS_EMU_DIE_AFTER", "9"),
            ("NUVEC_VERBS_EMU_LEDGER", "ledger.txt"),
            ("NUVEC_VERBS_EMU_TRACE", "trace.txt"),
        ])
        .unwrap();
        assert_eq!(config.devices, ["rdma_en3", "rdma_en5"]);
        assert!(config.no_ipv4);
        assert_eq!(config.loss, 0.25);
        assert_eq!(config.seed, 42);
        assert_eq!(config.fail_wr, Some(3));
        assert_eq!(config.die_after, Some(9));
        assert_eq!(config.ledger, Some(PathBuf::from("ledger.txt")));
        assert_eq!(config.trace, Some(PathBuf::from("trace.txt")));
    }

    #[test]
    fn devices_have_apples_limits_unless_the_environment_sets_them() {
        assert_eq!(with(&[]).unwrap().limits, Limits::default());
        assert_eq!(Limits::default().qps, 10);
        let config = with(&[
            ("NUVEC_VERBS_EMU_MAX_QP", "3"),
            ("NUVEC_VERBS_EMU_MAX_MR", "18"),
            ("NUVEC_VERBS_EMU_MAX_QP_WR", "16"),
            ("NUVEC_VERBS_EMU_FAIL_DEREG", "1"),
        ])
        .unwrap();
        assert_eq!(
            config.limits,
            Limits {
                qps: 3,
                mrs: 18,
                wrs: 16
            }
        );
        assert!(config.fail_dereg);
    }

    #[test]
    fn an_empty_device_list_lists_no_device() {
        let config = with(&[("NUVEC_VERBS_EMU_DEVICES", "")]).unwrap();
        assert!(config.devices.is_empty());
    }
}
