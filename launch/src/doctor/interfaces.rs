//! A host's network interfaces, from `ifconfig` (sans-IO), with the addresses of Linux's
//! `ip -o addr show` added ([`add_ip_addresses`]).
//!
//! An interface starts at a line without leading whitespace (`en2: flags=8863<UP,...> mtu
//! 1500`); its indented lines give its IPv4 addresses (`inet 192.168.0.1 netmask ...`), its
//! IPv6 ones (`inet6 fe80::1%en0 prefixlen 64 ...`), a bridge's members (`member: en2
//! flags=...`) and the link state (`status: active`).

/// One interface as `ifconfig` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Interface {
    /// Its name (`en2`, `bridge0`).
    pub(crate) name: String,
    /// Whether its flags include `UP`.
    pub(crate) up: bool,
    /// Its MTU, when shown.
    pub(crate) mtu: Option<u32>,
    /// Its IPv4 addresses.
    pub(crate) inet: Vec<String>,
    /// Its IPv6 addresses, without their zone (`fe80::1`, not `fe80::1%en0`).
    pub(crate) inet6: Vec<String>,
    /// A bridge's member interfaces.
    pub(crate) members: Vec<String>,
    /// `status:` (`active`, `inactive`), when shown.
    pub(crate) status: Option<String>,
}

/// The interfaces of `ifconfig`'s output, in its order.
pub(crate) fn interfaces(text: &str) -> Vec<Interface> {
    let mut all: Vec<Interface> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(char::is_whitespace) {
            // `eth0:1: flags=...` is Linux's labelled second address, an interface of its own.
            let Some((name, rest)) = line.split_once(": ") else {
                continue;
            };
            let flags = rest
                .split_once('<')
                .and_then(|(_, f)| f.split_once('>'))
                .map_or("", |(f, _)| f);
            let mtu = rest
                .split_whitespace()
                .skip_while(|w| *w != "mtu")
                .nth(1)
                .and_then(|m| m.parse().ok());
            all.push(Interface {
                name: name.to_owned(),
                up: flags.split(',').any(|f| f == "UP"),
                mtu,
                ..Interface::default()
            });
            continue;
        }
        let Some(current) = all.last_mut() else {
            continue;
        };
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("inet"), Some(addr)) => current.inet.push(addr.to_owned()),
            (Some("inet6"), Some(addr)) => {
                current.inet6.push(without_zone(addr).to_owned());
            }
            (Some("member:"), Some(member)) => current.members.push(member.to_owned()),
            (Some("status:"), Some(status)) => current.status = Some(status.to_owned()),
            _ => {}
        }
    }
    all
}

/// An IPv6 address without its zone: `fe80::1` for `fe80::1%en0`. The zone names the
/// interface the address is listed under, so comparing addresses ignores it.
pub(crate) fn without_zone(address: &str) -> &str {
    address.split_once('%').map_or(address, |(a, _)| a)
}

/// Adds to `all` the addresses of `ip -o addr show up`'s output that `ifconfig` did not show:
/// Linux's `ifconfig` shows one IPv4 address an interface (a second one only where it has a
/// label of its own, as a separate `eth0:1`), so a ring address added beside another
/// (`ip addr add`) would seem to be on none of the host's interfaces. A line reads `2: eth0
/// inet 198.18.0.1/24 brd ... scope global eth0\ ...`. The command lists only interfaces
/// that are up, as `ifconfig` does, so one `ifconfig` did not list is added as up.
pub(crate) fn add_ip_addresses(all: &mut Vec<Interface>, text: &str) {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(_index), Some(name), Some(family @ ("inet" | "inet6")), Some(address)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        // `veth0@if5` names a veth's peer after the `@`.
        let name = name.split_once('@').map_or(name, |(n, _)| n);
        let address = address.split_once('/').map_or(address, |(a, _)| a);
        let address = without_zone(address);
        let at = match all.iter().position(|i| i.name == name) {
            Some(at) => at,
            None => {
                all.push(Interface {
                    name: name.to_owned(),
                    up: true,
                    ..Interface::default()
                });
                all.len() - 1
            }
        };
        let list = if family == "inet" {
            &mut all[at].inet
        } else {
            &mut all[at].inet6
        };
        if !list.iter().any(|a| a == address) {
            list.push(address.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_members_mtu_and_state_belong_to_their_interface() {
        let text = "lo0: flags=8049<UP,LOOPBACK,RUNNING,MULTICAST> mtu 16384\n\
            \tinet 127.0.0.1 netmask 0xff000000\n\
            en0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500\n\
            \tether 00:00:00:00:00:01\n\
            \tinet6 fe80::1%en0 prefixlen 64 secured scopeid 0x4\n\
            \tinet 10.0.1.11 netmask 0xffffff00 broadcast 10.0.1.255\n\
            \tstatus: active\n\
            en2: flags=8822<BROADCAST,SMART,SIMPLEX,MULTICAST> mtu 1500\n\
            \tstatus: inactive\n\
            bridge0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500\n\
            \tmember: en2 flags=3<LEARNING,DISCOVER>\n\
            \tmember: en3 flags=3<LEARNING,DISCOVER>\n";
        let all = interfaces(text);
        let names: Vec<&str> = all.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["lo0", "en0", "en2", "bridge0"]);
        assert_eq!(all[1].inet, ["10.0.1.11"]);
        assert_eq!(all[1].inet6, ["fe80::1"]);
        assert_eq!(all[1].mtu, Some(1500));
        assert!(all[1].up && !all[2].up && all[3].up);
        assert_eq!(all[2].status.as_deref(), Some("inactive"));
        assert_eq!(all[3].members, ["en2", "en3"]);
    }

    #[test]
    fn a_secondary_address_linux_ifconfig_leaves_out_is_added_from_ip_addr() {
        let ifconfig = "eth0: flags=4163<UP,BROADCAST,RUNNING,MULTICAST>  mtu 1500\n\
            \tinet 198.18.0.1  netmask 255.255.255.0  broadcast 198.18.0.255\n\
            \tinet6 fe80::1  prefixlen 64  scopeid 0x20<link>\n";
        let ip = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n\
            2: eth0    inet 198.18.0.1/24 brd 198.18.0.255 scope global eth0\\       valid_lft forever\n\
            2: eth0    inet 198.18.1.1/24 scope global secondary eth0\\       valid_lft forever\n\
            2: eth0    inet6 fe80::1/64 scope link \\       valid_lft forever preferred_lft forever\n\
            3: veth1@if7    inet 198.18.2.1/24 scope global veth1\\       valid_lft forever\n\
            4: wlan0    link/ether 00:11:22:33:44:55 brd ff:ff:ff:ff:ff:ff\n";
        let mut all = interfaces(ifconfig);
        add_ip_addresses(&mut all, ip);
        assert_eq!(all[0].name, "eth0");
        assert_eq!(
            all[0].inet,
            ["198.18.0.1", "198.18.1.1"],
            "no address twice"
        );
        assert_eq!(all[0].inet6, ["fe80::1"]);
        let lo = all.iter().find(|i| i.name == "lo").expect("lo added");
        assert_eq!(lo.inet, ["127.0.0.1"]);
        let veth = all
            .iter()
            .find(|i| i.name == "veth1")
            .expect("named without its peer");
        assert_eq!(veth.inet, ["198.18.2.1"]);
        assert!(veth.up);
        assert!(
            all.iter().all(|i| i.name != "wlan0"),
            "a line of another family adds no interface"
        );
        let mut unchanged = interfaces(ifconfig);
        add_ip_addresses(&mut unchanged, "");
        assert_eq!(
            unchanged,
            interfaces(ifconfig),
            "no output (macOS) adds nothing"
        );
    }

    #[test]
    fn a_labelled_second_address_is_an_interface_of_its_own() {
        let text = "eth0: flags=4163<UP,BROADCAST,RUNNING,MULTICAST>  mtu 1500\n\
            \tinet 198.18.0.1  netmask 255.255.255.0\n\
            eth0:1: flags=4163<UP,BROADCAST,RUNNING,MULTICAST>  mtu 1500\n\
            \tinet 198.18.1.1  netmask 255.255.255.0\n";
        let all = interfaces(text);
        assert_eq!(all.len(), 2);
        assert_eq!((all[1].name.as_str(), all[1].up), ("eth0:1", true));
        assert_eq!(all[1].inet, ["198.18.1.1"]);
    }
}
