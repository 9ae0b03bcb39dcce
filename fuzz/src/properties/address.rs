//! Target `address`: `hostfile::split_address` of fuzzed text and its re-formatting.

use nuvec_distributed::hostfile;

use super::script::text;

/// `hostfile::split_address` never panics; an accepted `(host, port)` has a non-empty host
/// without whitespace and a port from 1 to 65535, re-formats (an IPv6 host in brackets) to
/// an address that splits to the same pair, and the re-formatted address is the input up to
/// leading zeros of the port.
pub(crate) fn address(data: &[u8]) {
    let text = text(data);
    let Ok((host, port)) = hostfile::split_address(&text) else {
        return;
    };
    assert!(!host.is_empty(), "empty host from {text:?}");
    assert!(port >= 1, "port 0 from {text:?}");
    assert!(
        !host.chars().any(|c| c.is_whitespace() || c.is_control()),
        "host {host:?} from {text:?} has whitespace"
    );
    let is_v6 = host.contains(':');
    if is_v6 {
        assert!(
            host.parse::<std::net::Ipv6Addr>().is_ok(),
            "host {host:?} from {text:?} has a ':' but is not an IPv6 literal"
        );
    }
    let formatted = if is_v6 {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    match hostfile::split_address(&formatted) {
        Ok(back) => assert_eq!(back, (host.clone(), port), "{text:?} via {formatted:?}"),
        Err(e) => panic!("{text:?} re-formatted as {formatted:?} does not split: {e}"),
    }
    let (prefix, digits) = text
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("accepted {text:?} without a ':'"));
    let bare_prefix = if is_v6 { format!("[{host}]") } else { host };
    assert_eq!(prefix, bare_prefix, "the host part of {text:?}");
    assert_eq!(
        digits.trim_start_matches('0'),
        port.to_string(),
        "the port part of {text:?}"
    );
}
