//! Where a connection's traffic leaves from or arrives at: its local address
//! (`getsockname`), the interface owning that address (`getifaddrs`) and the interface's MTU
//! (Linux: `/sys/class/net/NAME/mtu`; elsewhere `ifconfig NAME`, read by
//! [`super::interfaces`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::{Deserialize, Serialize};

/// One end of a measured connection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Endpoint {
    /// The local address and port.
    pub(crate) local: String,
    /// The interface owning the local address, when found.
    pub(crate) interface: Option<String>,
    /// That interface's MTU, when found.
    pub(crate) mtu: Option<u32>,
}

/// The endpoint of a socket whose local address is `local`.
pub(crate) fn endpoint(local: SocketAddr) -> Endpoint {
    let interface = interface_of(local.ip());
    let mtu = interface.as_deref().and_then(mtu_of);
    Endpoint {
        local: local.to_string(),
        interface,
        mtu,
    }
}

/// The name of the interface that has address `ip`, from `getifaddrs`.
fn interface_of(ip: IpAddr) -> Option<String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `getifaddrs` writes a list head into `list`, a valid pointer to a local; it
    // reads nothing of ours.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list `getifaddrs` returned, not freed until
        // `freeifaddrs` below; the kernel's list is well formed whatever a peer does.
        let node = unsafe { &*at };
        at = node.ifa_next;
        if node.ifa_addr.is_null() || node.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points to a `sockaddr` of the list.
        let family = i32::from(unsafe { (*node.ifa_addr).sa_family });
        let addr = if family == libc::AF_INET {
            // SAFETY: a `sockaddr` of family AF_INET is a `sockaddr_in`.
            let sin = unsafe { &*node.ifa_addr.cast::<libc::sockaddr_in>() };
            IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
        } else if family == libc::AF_INET6 {
            // SAFETY: a `sockaddr` of family AF_INET6 is a `sockaddr_in6`.
            let sin6 = unsafe { &*node.ifa_addr.cast::<libc::sockaddr_in6>() };
            IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
        } else {
            continue;
        };
        if addr == ip {
            // SAFETY: `ifa_name` is non-null and a NUL-terminated string of the list.
            let name = unsafe { std::ffi::CStr::from_ptr(node.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: `list` came from a successful `getifaddrs` and is freed once; no reference
    // into it outlives this call (the name was copied).
    unsafe { libc::freeifaddrs(list) };
    found
}

/// The MTU of interface `name`.
fn mtu_of(name: &str) -> Option<u32> {
    if cfg!(target_os = "linux") {
        return std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
            .ok()?
            .trim()
            .parse()
            .ok();
    }
    let out = std::process::Command::new("ifconfig")
        .arg(name)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    super::interfaces::interfaces(&String::from_utf8_lossy(&out.stdout))
        .first()
        .and_then(|i| i.mtu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_address_is_found_on_an_interface_with_an_mtu() {
        let e = endpoint("127.0.0.1:9".parse().expect("an address"));
        assert!(e.interface.is_some(), "{e:?}");
        assert!(e.mtu.is_some_and(|m| m > 0), "{e:?}");
        assert_eq!(e.local, "127.0.0.1:9");
    }
}
