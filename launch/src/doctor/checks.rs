//! What the doctor checks on each host, without measuring (sans-IO): the mistakes users make
//! before a job's first byte, found in the host's `ifconfig`, `networksetup
//! -listallhardwareports` and `ibv_devices` outputs against its host file entry.
//!
//! * **ring**: every address of `ips` must be on one of the host's interfaces (the rank
//!   listens on it); on Wi-Fi while a Thunderbolt interface has an address, the ring goes over
//!   Wi-Fi (exo #2295: several times slower); on the Thunderbolt Bridge (`bridge0`), every
//!   cable shares one bridge.
//! * **jaccl / jaccl-ring**: rank 0's first address (the coordinator) must be on one of its
//!   interfaces (Wi-Fi is fine: it carries only the side channel, and MLX's config writes
//!   `en0`'s address); every RDMA device named must be listed by `ibv_devices` (RDMA enabled), its
//!   interface (`rdma_en2` → `en2`) must have an IPv4 address (without one the port publishes
//!   no IPv4-mapped GID and JACCL cannot connect, ml-explore/mlx #3467) and its cable must be
//!   plugged (`status: active`).
//! * **any backend**: the Thunderbolt Bridge up with an interface the job uses as a member.
//!
//! For the ring it also says a Linux host's TCP congestion control, with advice where it is
//! BBR, on which the ring was measured slower at several sizes than on Reno or CUBIC (README,
//! "TCP congestion control"): a choice of the host's, so not a problem.

use std::collections::HashMap;

use serde_json::Value;

use super::interfaces::{self, Interface};

/// What one host has, as its commands printed it.
#[derive(Clone, Debug, Default)]
pub(crate) struct HostState {
    /// Its interfaces (`ifconfig`).
    pub(crate) interfaces: Vec<Interface>,
    /// Hardware port name per device (`networksetup -listallhardwareports`, inverted):
    /// `en2 -> "Thunderbolt 1"`.
    pub(crate) ports: HashMap<String, String>,
    /// Its RDMA devices (`ibv_devices`), when they were asked for.
    pub(crate) rdma: Option<Vec<String>>,
    /// Its TCP congestion control (`/proc/sys/net/ipv4/tcp_congestion_control`: Linux), when it
    /// was asked for and could be read.
    pub(crate) congestion: Option<String>,
}

/// The findings for one host: what was seen, and what is wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Findings {
    /// What the job uses and where it is (`192.168.0.1 is on en2 (Thunderbolt 1, MTU 1500)`).
    pub(crate) seen: Vec<String>,
    /// The problems.
    pub(crate) problems: Vec<String>,
}

impl HostState {
    /// The interface that holds `ip` (IPv4 or IPv6, compared as addresses: `fe80::1` is
    /// `fe80:0::1`; a zone or brackets around it are dropped).
    fn holding(&self, ip: &str) -> Option<&Interface> {
        let bare = ip.trim_start_matches('[').trim_end_matches(']');
        let bare = interfaces::without_zone(bare);
        let wanted: Option<std::net::IpAddr> = bare.parse().ok();
        let same = |a: &String| match (wanted, a.parse::<std::net::IpAddr>()) {
            (Some(w), Ok(a)) => w == a,
            _ => a == ip,
        };
        self.interfaces
            .iter()
            .find(|i| i.inet.iter().chain(&i.inet6).any(same))
    }

    fn interface(&self, name: &str) -> Option<&Interface> {
        self.interfaces.iter().find(|i| i.name == name)
    }

    /// `en2 (Thunderbolt 1, MTU 1500)`.
    fn describe(&self, i: &Interface) -> String {
        let port = self
            .ports
            .get(&i.name)
            .map_or("no hardware port", String::as_str);
        match i.mtu {
            Some(mtu) => format!("{} ({port}, MTU {mtu})", i.name),
            None => format!("{} ({port})", i.name),
        }
    }

    fn is_wifi(&self, name: &str) -> bool {
        self.ports.get(name).is_some_and(|p| p == "Wi-Fi")
    }

    fn is_thunderbolt(&self, name: &str) -> bool {
        self.ports
            .get(name)
            .is_some_and(|p| p.starts_with("Thunderbolt ") && p != "Thunderbolt Bridge")
    }

    /// The Thunderbolt interfaces with an IPv4 address, as `en2 (192.168.0.1)`.
    fn thunderbolt_addresses(&self) -> Vec<String> {
        self.interfaces
            .iter()
            .filter(|i| self.is_thunderbolt(&i.name) && !i.inet.is_empty())
            .map(|i| format!("{} ({})", i.name, i.inet.join(", ")))
            .collect()
    }
}

/// The RDMA device names of one `rdma` entry (`null`, a name or a list of names).
fn device_names(entry: &Value) -> Vec<&str> {
    match entry {
        Value::String(s) => vec![s.as_str()],
        Value::Array(v) => v.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Checks rank `rank` (`ips`, `rdma` from its host file entry) of a job on `backend` (`ring`,
/// `jaccl`, `jaccl-ring`) against what its host has.
pub(crate) fn check(
    rank: usize,
    backend: &str,
    ips: &[String],
    rdma: &[Value],
    host: &HostState,
) -> Findings {
    let mut f = Findings::default();
    let mut used = Vec::new();
    let addresses: &[String] = match backend {
        "ring" => ips,
        _ if rank == 0 => &ips[..ips.len().min(1)],
        _ => &[],
    };
    let role = if backend == "ring" {
        "the ring listens on it"
    } else {
        "JACCL's coordinator listens on it"
    };
    for ip in addresses {
        let Some(i) = host.holding(ip) else {
            f.problems.push(format!(
                "{ip} is on none of this host's interfaces, but {role}"
            ));
            continue;
        };
        used.push(i.name.clone());
        f.seen.push(format!("{ip} is on {}", host.describe(i)));
        // JACCL's coordinator carries only the side channel: MLX's config puts it on `en0`.
        if backend != "ring" {
            continue;
        }
        if host.is_wifi(&i.name) {
            let tb = host.thunderbolt_addresses();
            if !tb.is_empty() {
                f.problems.push(format!(
                    "{ip} is on Wi-Fi ({}) while Thunderbolt has addresses ({}): the job's \
                     traffic would go over Wi-Fi, several times slower; list the Thunderbolt \
                     addresses (nuvec-launch config writes them)",
                    i.name,
                    tb.join(", ")
                ));
            }
        }
        if i.name.starts_with("bridge") {
            f.problems.push(format!(
                "{ip} is on the Thunderbolt Bridge ({}): every cable shares one bridge; turn it \
                 off and give each cable its own /30 (nuvec-launch config)",
                i.name
            ));
        }
    }
    if backend != "ring" {
        for entry in rdma {
            for dev in device_names(entry) {
                let iface = dev.strip_prefix("rdma_").unwrap_or(dev);
                used.push(iface.to_owned());
                if let Some(listed) = host.rdma.as_ref().filter(|l| !l.iter().any(|d| d == dev)) {
                    f.problems.push(format!(
                        "{dev} is not an RDMA device of this host (ibv_devices lists {}): is RDMA \
                         enabled (rdma_ctl enable, in recoveryOS)?",
                        if listed.is_empty() {
                            "none".to_owned()
                        } else {
                            listed.join(", ")
                        }
                    ));
                }
                match host.interface(iface) {
                    None => f
                        .problems
                        .push(format!("{dev}: this host has no interface {iface}")),
                    Some(i) => {
                        if i.inet.is_empty() {
                            f.problems.push(format!(
                                "{dev}: {iface} has no IPv4 address, so the RDMA port publishes \
                                 no IPv4-mapped GID and JACCL cannot connect over it (give each \
                                 cable a /30: nuvec-launch config)"
                            ));
                        }
                        if i.status.as_deref() == Some("inactive") {
                            f.problems.push(format!(
                                "{dev}: {iface} is inactive (is its cable plugged in?)"
                            ));
                        }
                        f.seen.push(format!(
                            "{dev} is on {}{}",
                            host.describe(i),
                            if i.inet.is_empty() {
                                String::new()
                            } else {
                                format!(", {}", i.inet.join(", "))
                            }
                        ));
                    }
                }
            }
        }
    }
    if backend == "ring"
        && let Some(name) = &host.congestion
    {
        f.seen.push(congestion_seen(name));
    }
    for bridge in host
        .interfaces
        .iter()
        .filter(|i| i.up && !i.members.is_empty())
    {
        let shared: Vec<&str> = bridge
            .members
            .iter()
            .filter(|m| used.contains(m))
            .map(String::as_str)
            .collect();
        if !shared.is_empty() {
            f.problems.push(format!(
                "the Thunderbolt Bridge ({}) is up with {} as member(s), which the job uses: \
                 turn it off (sudo ifconfig {} down; nuvec-launch config does)",
                bridge.name,
                shared.join(", "),
                bridge.name
            ));
        }
    }
    f
}

/// What the report says of a host's TCP congestion control `name`.
fn congestion_seen(name: &str) -> String {
    let advice = if name == "bbr" {
        ": the ring was slower on BBR at several sizes (README, TCP congestion control); \
         try NUVEC_DISTRIBUTED_TCP_CONGESTION=reno (nuvec-launch --env), which every process \
         may choose"
    } else {
        ""
    };
    format!("TCP congestion control {name} (net.ipv4.tcp_congestion_control){advice}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::interfaces::interfaces;

    fn host(ifconfig: &str, rdma: Option<&[&str]>) -> HostState {
        let ports = [
            ("en0", "Wi-Fi"),
            ("en2", "Thunderbolt 1"),
            ("en3", "Thunderbolt 2"),
        ]
        .iter()
        .map(|(d, p)| ((*d).to_owned(), (*p).to_owned()))
        .collect();
        HostState {
            interfaces: interfaces(ifconfig),
            ports,
            rdma: rdma.map(|r| r.iter().map(|d| (*d).to_owned()).collect()),
            congestion: None,
        }
    }

    #[test]
    fn a_ring_hosts_congestion_control_is_said_with_advice_for_bbr_and_never_a_problem() {
        let ips = strings(&["192.168.0.1"]);
        let mut h = host(SET_UP, None);
        h.congestion = Some("bbr".to_owned());
        let f = check(0, "ring", &ips, &[], &h);
        assert!(f.problems.is_empty(), "{:?}", f.problems);
        let said = f.seen.last().expect("a line");
        assert!(
            said.starts_with("TCP congestion control bbr")
                && said.contains("NUVEC_DISTRIBUTED_TCP_CONGESTION=reno"),
            "{said}"
        );
        h.congestion = Some("cubic".to_owned());
        let f = check(0, "ring", &ips, &[], &h);
        assert_eq!(
            f.seen.last().map(String::as_str),
            Some("TCP congestion control cubic (net.ipv4.tcp_congestion_control)")
        );
        let f = check(0, "jaccl", &ips, &[], &h);
        assert!(
            !f.seen.iter().any(|s| s.contains("congestion")),
            "{:?}",
            f.seen
        );
    }

    const SET_UP: &str = "en0: flags=8863<UP,RUNNING> mtu 1500\n\tinet 10.0.1.11 netmask 0xffffff00\n\tstatus: active\n\
        en2: flags=8863<UP,RUNNING> mtu 1500\n\tinet 192.168.0.1 netmask 0xfffffffc\n\tstatus: active\n\
        en3: flags=8863<UP,RUNNING> mtu 1500\n\tstatus: inactive\n\
        bridge0: flags=8822<BROADCAST> mtu 1500\n\tmember: en2 flags=3<LEARNING,DISCOVER>\n";

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_ring_address_on_thunderbolt_is_fine_and_one_on_wifi_is_named() {
        let h = host(SET_UP, None);
        let ok = check(0, "ring", &strings(&["192.168.0.1"]), &[], &h);
        assert_eq!(ok.problems, Vec::<String>::new());
        assert_eq!(ok.seen, ["192.168.0.1 is on en2 (Thunderbolt 1, MTU 1500)"]);
        let wifi = check(0, "ring", &strings(&["10.0.1.11"]), &[], &h);
        assert_eq!(wifi.problems.len(), 1, "{wifi:?}");
        assert!(
            wifi.problems[0]
                .contains("on Wi-Fi (en0) while Thunderbolt has addresses (en2 (192.168.0.1))")
        );
        let none = check(0, "ring", &strings(&["10.9.9.9"]), &[], &h);
        assert!(none.problems[0].contains("on none of this host's interfaces"));
    }

    #[test]
    fn an_ipv6_ring_address_is_found_on_its_interface_however_it_is_written() {
        let text = "en2: flags=8863<UP,RUNNING> mtu 1500\n\tinet6 fd00:0:0:1::1 prefixlen 64\n\
            \tinet6 fe80::1%en2 prefixlen 64 scopeid 0x4\n\tstatus: active\n";
        let h = host(text, None);
        for ip in [
            "fd00:0:0:1::1",
            "fd00::1:0:0:0:1",
            "fe80::1%en2",
            "[fe80::1]",
        ] {
            let f = check(0, "ring", &strings(&[ip]), &[], &h);
            assert_eq!(f.problems, Vec::<String>::new(), "{ip}");
            assert_eq!(
                f.seen,
                [format!("{ip} is on en2 (Thunderbolt 1, MTU 1500)")]
            );
        }
        let f = check(0, "ring", &strings(&["fd00::2"]), &[], &h);
        assert!(f.problems[0].contains("on none of this host's interfaces"));
    }

    #[test]
    fn an_rdma_device_missing_without_an_address_or_unplugged_is_named() {
        let h = host(SET_UP, Some(&["rdma_en2"]));
        let rdma = vec![Value::Null, Value::String("rdma_en2".into())];
        let ok = check(1, "jaccl", &strings(&["10.0.1.12"]), &rdma, &h);
        assert_eq!(ok.problems, Vec::<String>::new());
        let rdma = vec![Value::Null, serde_json::json!(["rdma_en2", "rdma_en3"])];
        let bad = check(1, "jaccl", &[], &rdma, &h);
        assert_eq!(bad.problems.len(), 3, "{bad:?}");
        assert!(bad.problems[0].starts_with(
            "rdma_en3 is not an RDMA device of this host (ibv_devices lists rdma_en2)"
        ));
        assert!(bad.problems[1].starts_with("rdma_en3: en3 has no IPv4 address"));
        assert!(bad.problems[2].starts_with("rdma_en3: en3 is inactive"));
    }

    #[test]
    fn a_bridge_that_is_up_over_a_used_interface_is_named() {
        let up = SET_UP.replace(
            "bridge0: flags=8822<BROADCAST>",
            "bridge0: flags=8863<UP,RUNNING>",
        );
        let h = host(&up, None);
        let f = check(0, "ring", &strings(&["192.168.0.1"]), &[], &h);
        assert_eq!(f.problems.len(), 1, "{f:?}");
        assert!(f.problems[0].starts_with("the Thunderbolt Bridge (bridge0) is up with en2"));
        // Down (as in SET_UP), it is not a problem.
        assert!(
            check(
                0,
                "ring",
                &strings(&["192.168.0.1"]),
                &[],
                &host(SET_UP, None)
            )
            .problems
            .is_empty()
        );
    }
}
