//! The hosts of a job: `--hosts`/`-n`, or MLX's JSON host file (`--hostfile`).
//!
//! One [`Host`] per rank, in rank order, with the host file's backend and environment. The
//! host file is read as `mlx.launch`'s `Hostfile` reads it, a little stricter: a field of the
//! wrong type is an error here rather than a failure later.

use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;

use serde_json::Value;

use crate::args::{UsageError, usage_error};

/// The most ranks a job may have: every ring rank listens on at least one port of its own.
pub(crate) const MAX_RANKS: usize = 65535;

/// One host of the job: one rank.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Host {
    /// The name `ssh` connects to (`"ssh"` in the host file).
    pub(crate) ssh: String,
    /// The addresses the ring listens on (`"ips"`).
    pub(crate) ips: Vec<String>,
    /// The RDMA device(s) towards each rank (`"rdma"`): `null`, a string or a list of strings.
    pub(crate) rdma: Vec<Value>,
    /// The keys of its host file entry that a host file does not have (ignored, as MLX
    /// ignores them, but named when the backend then lacks what it needs).
    pub(crate) unknown: Vec<String>,
}

/// The hosts of a job, with the host file's backend and environment.
#[derive(Clone, Debug, PartialEq, Default)]
pub(crate) struct HostList {
    /// One host per rank, in rank order.
    pub(crate) hosts: Vec<Host>,
    /// The host file's `"backend"` (empty when absent).
    pub(crate) backend: String,
    /// The host file's `"envs"` (`KEY=VALUE` strings).
    pub(crate) envs: Vec<String>,
    /// What the launcher warns about before it plans: each unknown key of the host file,
    /// with its file and entry.
    pub(crate) warnings: Vec<String>,
}

/// Whether `host` is an IP address literal (Python's `ipaddress.ip_address`; an IPv6 zone
/// such as `%en0` is allowed).
fn is_ip(host: &str) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        return true;
    }
    match host.split_once('%') {
        Some((addr, zone)) => !zone.is_empty() && addr.parse::<Ipv6Addr>().is_ok(),
        None => false,
    }
}

impl HostList {
    /// The hosts of `--hosts a,b,c` with `-n repeats`: each host `repeats` times in a row; a
    /// host that is an IP address listens on it (`ips = [host]`).
    ///
    /// # Errors
    ///
    /// A [`UsageError`] when an entry is empty. Spaces around an entry are dropped
    /// (`--hosts "10.0.0.1, 10.0.0.2"`), where `mlx.launch` would take " 10.0.0.2" for a host
    /// name.
    pub(crate) fn from_list(list: &str, repeats: usize) -> Result<HostList, UsageError> {
        let names: Vec<&str> = list.split(',').map(str::trim).collect();
        if names.iter().any(|h| h.is_empty()) {
            return Err(usage_error("Hostname cannot be empty"));
        }
        // Checked before a host is built: `-n 100000000000` must be an error, not a loop.
        if names
            .len()
            .checked_mul(repeats)
            .is_none_or(|ranks| ranks > MAX_RANKS)
        {
            return Err(usage_error(format!(
                "argument -n: {repeats} rank(s) on each of {} host(s) is more than {MAX_RANKS} \
                 ranks (a ring rank listens on a port of its own)",
                names.len()
            )));
        }
        let mut hosts = Vec::with_capacity(names.len() * repeats);
        for h in names {
            let ips = if is_ip(h) {
                vec![h.to_owned()]
            } else {
                Vec::new()
            };
            for _ in 0..repeats {
                hosts.push(Host {
                    ssh: h.to_owned(),
                    ips: ips.clone(),
                    rdma: Vec::new(),
                    unknown: Vec::new(),
                });
            }
        }
        Ok(HostList {
            hosts,
            ..HostList::default()
        })
    }

    /// Reads MLX's JSON host file at `path` (see [`HostList::parse`]).
    ///
    /// # Errors
    ///
    /// A [`UsageError`] when the file does not exist, cannot be read or does not parse.
    pub(crate) fn from_file(path: &Path) -> Result<HostList, UsageError> {
        let shown = path.display();
        if !path.exists() {
            return Err(usage_error(format!("Hostfile {shown} doesn't exist")));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage_error(format!("Failed to parse hostfile {shown} ({e})")))?;
        HostList::parse(&text, &shown.to_string())
    }

    /// Parses the text of MLX's JSON host file: a list of hosts, or an object with `"hosts"`
    /// and optionally `"backend"` and `"envs"`; each host is `{"ssh": name, "ips": [...],
    /// "rdma": [...]}` with `"ips"` and `"rdma"` optional. `origin` names the file in errors.
    ///
    /// # Errors
    ///
    /// A [`UsageError`] `Failed to parse hostfile ORIGIN (what)` when the text is not JSON,
    /// the top level is neither a list nor an object, `"hosts"` is missing, a host has no
    /// `"ssh"` string, or a field has the wrong type (stricter than MLX, which only fails on
    /// a missing key).
    pub(crate) fn parse(text: &str, origin: &str) -> Result<HostList, UsageError> {
        let fail =
            |what: String| usage_error(format!("Failed to parse hostfile {origin} ({what})"));
        let data: Value = serde_json::from_str(text).map_err(|e| fail(e.to_string()))?;
        let mut list = HostList::default();
        let hosts = match &data {
            Value::Object(map) => {
                for key in map.keys().filter(|k| !FILE_KEYS.contains(&k.as_str())) {
                    list.warnings.push(format!(
                        "hostfile {origin}: unknown key {key:?} is ignored (a host file has {})",
                        quoted(&FILE_KEYS)
                    ));
                }
                match map.get("backend") {
                    None | Some(Value::Null) => {}
                    Some(Value::String(b)) => list.backend = b.clone(),
                    Some(_) => return Err(fail("\"backend\" must be a string".into())),
                }
                match map.get("envs") {
                    None | Some(Value::Null) => {}
                    Some(v) => {
                        list.envs = strings(v).ok_or_else(|| {
                            fail("\"envs\" must be a list of \"KEY=VALUE\" strings".into())
                        })?
                    }
                }
                map.get("hosts").ok_or_else(|| fail("'hosts'".into()))?
            }
            Value::Array(_) => &data,
            _ => {
                return Err(fail(
                    "expected a list of hosts or an object with \"hosts\"".into(),
                ));
            }
        };
        let Value::Array(hosts) = hosts else {
            return Err(fail("\"hosts\" must be a list".into()));
        };
        for (i, h) in hosts.iter().enumerate() {
            let Value::Object(h) = h else {
                return Err(fail(format!("host {i}: expected an object with \"ssh\"")));
            };
            let ssh = match h.get("ssh") {
                Some(Value::String(s)) => s.clone(),
                Some(_) => return Err(fail(format!("host {i}: \"ssh\" must be a string"))),
                None => return Err(fail("'ssh'".into())),
            };
            // MLX reads the keys it knows and ignores the others: so does this, but it names
            // them, since a misspelt key ("ip" for "ips") would otherwise only show as what
            // the backend then lacks.
            let unknown: Vec<String> = h
                .keys()
                .filter(|k| !HOST_KEYS.contains(&k.as_str()))
                .cloned()
                .collect();
            for key in &unknown {
                list.warnings.push(format!(
                    "hostfile {origin}: host {i} (ssh {ssh:?}): unknown key {key:?} is ignored \
                     (a host has {})",
                    quoted(&HOST_KEYS)
                ));
            }
            let ips = match h.get("ips") {
                None => Vec::new(),
                Some(v) => strings(v)
                    .ok_or_else(|| fail(format!("host {i}: \"ips\" must be a list of strings")))?,
            };
            let rdma = match h.get("rdma") {
                None => Vec::new(),
                Some(Value::Array(entries)) => {
                    for (j, e) in entries.iter().enumerate() {
                        let ok = match e {
                            Value::Null | Value::String(_) => true,
                            Value::Array(_) => strings(e).is_some(),
                            _ => false,
                        };
                        if !ok {
                            return Err(fail(format!(
                                "host {i}: \"rdma\"[{j}] must be null, a device name or a list \
                                 of device names"
                            )));
                        }
                    }
                    entries.clone()
                }
                Some(_) => return Err(fail(format!("host {i}: \"rdma\" must be a list"))),
            };
            list.hosts.push(Host {
                ssh,
                ips,
                rdma,
                unknown,
            });
        }
        Ok(list)
    }
}

/// The keys of a host file object (`mlx.launch`'s `Hostfile.from_file`).
const FILE_KEYS: [&str; 3] = ["hosts", "backend", "envs"];

/// The hosts of `config`'s and `doctor`'s command lines: `--hostfile` when given, else
/// `--hosts` (one rank per host); a host name starting with `-` is refused, since `ssh` would
/// take it as an option (MLX does not check).
///
/// # Errors
///
/// The host file's or list's [`UsageError`], or the name starting with `-`.
pub(crate) fn hosts_of(hostfile: Option<&Path>, hosts: &str) -> Result<HostList, UsageError> {
    let list = match hostfile {
        Some(path) => HostList::from_file(path)?,
        None => HostList::from_list(hosts, 1)?,
    };
    if let Some(h) = list.hosts.iter().find(|h| h.ssh.starts_with('-')) {
        return Err(UsageError(format!(
            "The host name {:?} starts with '-', which ssh would take as an option",
            h.ssh
        )));
    }
    Ok(list)
}

/// The keys of a host entry.
pub(crate) const HOST_KEYS: [&str; 3] = ["ssh", "ips", "rdma"];

/// `keys` quoted and joined: `"a", "b" and "c"`.
pub(crate) fn quoted(keys: &[&str]) -> String {
    let quoted: Vec<String> = keys.iter().map(|k| format!("{k:?}")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => quoted.concat(),
    }
}

/// A JSON list of strings.
fn strings(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn hosts_expand_in_order_with_repeats_and_ips_only_for_addresses() {
        let l = HostList::from_list("10.0.0.1,mac-b,::1", 2).unwrap();
        let got: Vec<(&str, Vec<String>)> = l
            .hosts
            .iter()
            .map(|h| (h.ssh.as_str(), h.ips.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("10.0.0.1", strings(&["10.0.0.1"])),
                ("10.0.0.1", strings(&["10.0.0.1"])),
                ("mac-b", vec![]),
                ("mac-b", vec![]),
                ("::1", strings(&["::1"])),
                ("::1", strings(&["::1"])),
            ]
        );
        assert!(is_ip("fe80::1%en0") && !is_ip("localhost") && !is_ip("1.2.3"));
        assert_eq!(
            HostList::from_list("a,,b", 1).unwrap_err().0,
            "Hostname cannot be empty"
        );
        assert_eq!(
            HostList::from_list("", 1).unwrap_err().0,
            "Hostname cannot be empty"
        );
        let spaced = HostList::from_list("10.0.0.1, 10.0.0.2 ", 1).unwrap();
        assert_eq!(spaced.hosts[1].ssh, "10.0.0.2");
        assert_eq!(spaced.hosts[1].ips, strings(&["10.0.0.2"]));
        assert_eq!(
            HostList::from_list("a, ,b", 1).unwrap_err().0,
            "Hostname cannot be empty"
        );
    }

    #[test]
    fn host_files_that_mlx_would_misread_are_refused() {
        let e = |t: &str| HostList::parse(t, "h.json").unwrap_err().0;
        assert!(e("{").starts_with("Failed to parse hostfile h.json ("));
        assert_eq!(
            e(r#"{"backend": "ring"}"#),
            "Failed to parse hostfile h.json ('hosts')"
        );
        assert_eq!(
            e(r#"[{"ips": []}]"#),
            "Failed to parse hostfile h.json ('ssh')"
        );
        assert!(e(r#"[{"ssh": "a", "ips": "1.2.3.4"}]"#).contains("\"ips\" must be a list"));
        assert!(e(r#"[{"ssh": "a", "rdma": [1]}]"#).contains("\"rdma\"[0]"));
        assert!(e(r#"{"envs": "A=1", "hosts": []}"#).contains("\"envs\""));
        assert!(e("3").contains("expected a list of hosts"));
        assert_eq!(
            HostList::from_file(Path::new("/nonexistent/h.json"))
                .unwrap_err()
                .0,
            "Hostfile /nonexistent/h.json doesn't exist"
        );
    }

    #[test]
    fn an_unknown_key_is_named_with_its_entry_and_ignored_as_mlx_ignores_it() {
        let l = HostList::parse(
            r#"{"env": ["A=1"], "hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ip": ["10.0.0.2"]}]}"#,
            "h.json",
        )
        .expect("unknown keys are not errors");
        assert_eq!(l.hosts[1].ips, Vec::<String>::new());
        assert_eq!(l.hosts[1].unknown, vec!["ip".to_owned()]);
        assert!(l.hosts[0].unknown.is_empty());
        assert_eq!(l.warnings.len(), 2, "{:?}", l.warnings);
        assert!(
            l.warnings[0].contains("h.json") && l.warnings[0].contains("unknown key \"env\""),
            "{:?}",
            l.warnings
        );
        assert!(
            l.warnings[1].contains("host 1 (ssh \"b\")")
                && l.warnings[1].contains("unknown key \"ip\"")
                && l.warnings[1].contains("\"ips\""),
            "{:?}",
            l.warnings
        );
    }
}
