//! Discovery: what each Mac's commands print, read as `mlx.distributed_config` reads it.
//!
//! Pure functions of the text of three commands, run on every host:
//!
//! * `system_profiler SPThunderboltDataType -json`: every entry of `SPThunderboltDataType`
//!   that has a `domain_uuid_key` is one of the host's Thunderbolt ports (a bus of its own);
//!   its receptacle number is `receptacle_1_tag.receptacle_id_key`, and the port is cabled to
//!   another Mac when one of its direct `_items` has a `domain_uuid_key` (the first such item
//!   is the peer's port). A hub, a dock or a display is an item without one, so a Mac behind a
//!   hub is not seen as linked (MLX looks no deeper either).
//! * `networksetup -listallhardwareports`: the hardware port `Thunderbolt N` is the network
//!   interface (`enX`) of receptacle `N`.
//! * `ibv_devices`: RDMA is enabled when it names a device starting `rdma_`.
//!
//! A host's ports are sorted by interface name (as strings: `en10` before `en2`), which fixes
//! the order of cables, and so of addresses and RDMA device lists, as MLX's.
//!
//! Differences from MLX: an entry without `device_name_key` or a receptacle number, or a
//! receptacle without its `Thunderbolt N` hardware port, is an error naming the host and the
//! entry (MLX stops with a Python `KeyError`).

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

/// One Thunderbolt port of a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Port {
    /// Its network interface (`en2`).
    pub(crate) iface: String,
    /// Its own domain UUID.
    pub(crate) uuid: String,
    /// The domain UUID of the port at the other end of its cable, when a Mac is there.
    pub(crate) connected_to: Option<String>,
}

/// A host's Thunderbolt ports, sorted by interface.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) struct ThunderboltHost {
    /// The `device_name_key` of its last port (MLX keeps it; nothing uses it).
    pub(crate) name: String,
    /// Its ports, sorted by interface name.
    pub(crate) ports: Vec<Port>,
}

/// What a host's command printed that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DiscoveryError {
    /// The host (its ssh name).
    pub(crate) host: String,
    /// The command whose output it is.
    pub(crate) command: &'static str,
    /// What is wrong.
    pub(crate) what: String,
}

impl fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: `{}`: {}", self.host, self.command, self.what)
    }
}

impl std::error::Error for DiscoveryError {}

/// The command that lists the Thunderbolt ports.
pub(crate) const THUNDERBOLT: &str = "system_profiler SPThunderboltDataType -json";
/// The command that names the interface of each hardware port.
pub(crate) const HARDWARE_PORTS: &str = "networksetup -listallhardwareports";
/// The command that lists the RDMA devices.
pub(crate) const IBV_DEVICES: &str = "ibv_devices";
/// The command that prints a Linux host's TCP congestion control: `grep -s`, which is on every
/// host's default path and says nothing where the file is missing (macOS: it fails quietly).
pub(crate) const CONGESTION: &str = "grep -s . /proc/sys/net/ipv4/tcp_congestion_control";
/// The command that lists the addresses of a Linux host's interfaces that are up, one line
/// each: `ip -o addr show up`, which shows the secondary IPv4 addresses Linux's `ifconfig`
/// leaves out. Only interfaces that are up, as `ifconfig` lists them. macOS has no `ip`
/// (there `ifconfig` shows every address): run on another host, the command's errors go to
/// `/dev/null` ([`IP_ADDRESSES_REMOTE`]).
pub(crate) const IP_ADDRESSES: [&str; 5] = ["ip", "-o", "addr", "show", "up"];

/// [`IP_ADDRESSES`] as the shell command ssh runs on another host, quiet where `ip` is
/// missing; also what a replay answers with `ip-addr.txt`.
pub(crate) const IP_ADDRESSES_REMOTE: &str = "ip -o addr show up 2>/dev/null";

/// `networksetup -listallhardwareports`: hardware port name to device, e.g.
/// `"Thunderbolt 1" -> "en2"`. A `Device:` line belongs to the `Hardware Port:` line before
/// it; lines are trimmed and the labels cut off at their length, as MLX does.
pub(crate) fn hardware_ports(text: &str) -> HashMap<String, String> {
    let mut ports = HashMap::new();
    let mut name: Option<String> = None;
    for line in text.split('\n') {
        if line.starts_with("Hardware Port:") {
            name = Some(line.trim().chars().skip(15).collect());
        } else if line.starts_with("Device:") {
            let device: String = line.trim().chars().skip(8).collect();
            // MLX files a device seen before any port under `None`; no port name reads it.
            if let Some(n) = name.take() {
                ports.insert(n, device);
            }
        }
    }
    ports
}

/// `ibv_devices`: the words starting `rdma_`.
pub(crate) fn rdma_devices(text: &str) -> Vec<String> {
    text.split_whitespace()
        .filter(|w| w.starts_with("rdma_"))
        .map(str::to_owned)
        .collect()
}

/// The Thunderbolt ports of `host` from its `system_profiler SPThunderboltDataType -json`
/// output and its hardware ports ([`hardware_ports`]).
///
/// # Errors
///
/// A [`DiscoveryError`] when the text is not JSON or has no `SPThunderboltDataType` list, or a
/// port lacks `device_name_key`, `receptacle_1_tag.receptacle_id_key` or the hardware port
/// `Thunderbolt N` of its receptacle.
pub(crate) fn thunderbolt_host(
    host: &str,
    profile: &str,
    iface_map: &HashMap<String, String>,
) -> Result<ThunderboltHost, DiscoveryError> {
    let fail = |what: String| DiscoveryError {
        host: host.to_owned(),
        command: THUNDERBOLT,
        what,
    };
    let data: Value = serde_json::from_str(profile)
        .map_err(|e| fail(format!("the output is not JSON ({e}); is this host a Mac?")))?;
    let Some(Value::Array(entries)) = data.get("SPThunderboltDataType") else {
        return Err(fail("no \"SPThunderboltDataType\" list".into()));
    };
    let mut name = String::new();
    let mut ports = Vec::new();
    for (i, t) in entries.iter().enumerate() {
        let Some(uuid) = t.get("domain_uuid_key").filter(|u| !u.is_null()) else {
            continue;
        };
        let uuid = text_of(uuid);
        name = match t.get("device_name_key") {
            Some(v) => text_of(v),
            None => {
                return Err(fail(format!(
                    "entry {i} ({uuid}) has no \"device_name_key\""
                )));
            }
        };
        let tag = match t
            .get("receptacle_1_tag")
            .and_then(|r| r.get("receptacle_id_key"))
        {
            Some(v) => text_of(v),
            None => {
                return Err(fail(format!(
                    "entry {i} ({uuid}) has no \"receptacle_1_tag\".\"receptacle_id_key\""
                )));
            }
        };
        let connected_to = t
            .get("_items")
            .and_then(Value::as_array)
            .and_then(|items| items.iter().find_map(|item| item.get("domain_uuid_key")))
            .filter(|u| !u.is_null())
            .map(text_of);
        let port_name = format!("Thunderbolt {tag}");
        let Some(iface) = iface_map.get(&port_name) else {
            return Err(DiscoveryError {
                host: host.to_owned(),
                command: HARDWARE_PORTS,
                what: format!(
                    "no hardware port {port_name:?} (receptacle {tag} of {THUNDERBOLT}, entry {i})"
                ),
            });
        };
        ports.push(Port {
            iface: iface.clone(),
            uuid,
            connected_to,
        });
    }
    ports.sort_by(|a, b| a.iface.cmp(&b.iface));
    Ok(ThunderboltHost { name, ports })
}

/// A JSON value as Python's f-string shows a string or a number.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORTS: &str = "\nHardware Port: Ethernet\nDevice: en0\nEthernet Address: 00:00:00:00:00:01\n\n\
        Hardware Port: Thunderbolt Bridge\nDevice: bridge0\nEthernet Address: N/A\n\n\
        Hardware Port: Thunderbolt 1\nDevice: en2\nEthernet Address: 00:00:00:00:00:02\n\n\
        Hardware Port: Thunderbolt 2\nDevice: en10\nEthernet Address: 00:00:00:00:00:03\n\n\
        VLAN Configurations\n===================\n";

    #[test]
    fn hardware_ports_map_each_port_name_to_its_device() {
        let m = hardware_ports(PORTS);
        assert_eq!(m["Ethernet"], "en0");
        assert_eq!(m["Thunderbolt Bridge"], "bridge0");
        assert_eq!(m["Thunderbolt 1"], "en2");
        assert_eq!(m["Thunderbolt 2"], "en10");
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn only_words_starting_rdma_are_rdma_devices() {
        let text = "    device                 node GUID\n    ------              ----------------\n    rdma_en2            0000000000000000\n    rdma_en3            0000000000000000\n";
        assert_eq!(rdma_devices(text), ["rdma_en2", "rdma_en3"]);
        assert!(rdma_devices("").is_empty());
    }

    #[test]
    fn ports_are_the_entries_with_a_domain_sorted_by_interface_and_a_hub_links_nothing() {
        let profile = r#"{"SPThunderboltDataType": [
            {"_name": "thunderboltusb4_bus_1", "device_name_key": "Mac Studio", "domain_uuid_key": "U2",
             "receptacle_1_tag": {"receptacle_id_key": "2"},
             "_items": [{"_name": "TS4", "vendor_name_key": "CalDigit",
                         "_items": [{"domain_uuid_key": "BEHIND-HUB"}]}]},
            {"_name": "thunderboltusb4_bus_0", "device_name_key": "Mac Studio", "domain_uuid_key": "U1",
             "receptacle_1_tag": {"receptacle_id_key": "1"},
             "_items": [{"_name": "display"}, {"_name": "Mac", "domain_uuid_key": "PEER"}]},
            {"_name": "no domain", "receptacle_1_tag": {"receptacle_id_key": "3"}}
        ]}"#;
        let h = thunderbolt_host("a", profile, &hardware_ports(PORTS)).unwrap();
        assert_eq!(h.name, "Mac Studio");
        let got: Vec<(&str, &str, Option<&str>)> = h
            .ports
            .iter()
            .map(|p| (p.iface.as_str(), p.uuid.as_str(), p.connected_to.as_deref()))
            .collect();
        assert_eq!(got, [("en10", "U2", None), ("en2", "U1", Some("PEER"))]);
    }

    #[test]
    fn unreadable_outputs_name_the_host_the_command_and_the_entry() {
        let m = hardware_ports(PORTS);
        let e = thunderbolt_host("mac-b", "zsh: command not found", &m).unwrap_err();
        assert_eq!((e.host.as_str(), e.command), ("mac-b", THUNDERBOLT));
        let e = thunderbolt_host(
            "mac-b",
            r#"{"SPThunderboltDataType": [{"device_name_key": "M", "domain_uuid_key": "U", "receptacle_1_tag": {"receptacle_id_key": 7}}]}"#,
            &m,
        )
        .unwrap_err();
        assert_eq!(e.command, HARDWARE_PORTS);
        assert!(e.to_string().contains("\"Thunderbolt 7\""), "{e}");
    }
}
