//! MLX's ring hostfile: the JSON file named by `MLX_HOSTFILE`.
//!
//! The file is a JSON list indexed by rank; each entry is the list of `"host:port"` addresses
//! that rank listens on, one per connection, for example
//! `[["10.0.0.1:5000","10.0.0.1:5001"],["10.0.0.2:5000","10.0.0.2:5001"]]`. Every rank must list
//! the same number of addresses. `mlx.launch` writes the file with `echo`, so a trailing newline
//! (or any surrounding whitespace) is accepted.
//!
//! Differences from MLX, all of them stricter or wider, never incompatible with a file that
//! MLX accepts and can use:
//!
//! - the file is checked as a whole before anything connects, and every mistake is reported
//!   with the file, the rank and the address index (MLX fails with a bare JSON exception or a
//!   socket-count mismatch at connect time);
//! - the port must be a number from 1 to 65535 (MLX's `std::stoi` takes `"5000abc"` as 5000);
//! - a bracketed IPv6 literal such as `[::1]:5000` is accepted (MLX splits at the first `:`, so
//!   IPv6 does not work there).
//!
//! Every error is a [`ConfigError`]: [`ConfigError::Hostfile`] (with a [`HostfileProblem`]
//! naming the rank and address index), [`ConfigError::Unreadable`], [`ConfigError::NotUtf8File`]
//! or [`ConfigError::BadAddress`] (with an [`AddressProblem`]).

use std::net::{Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::Path;

use serde_json::Value;

use crate::config::error::{AddressProblem, ConfigError, FileKind, HostfileProblem};

/// Parses the text of a ring hostfile into one list of addresses per rank.
///
/// `origin` names the file in error messages (usually its path). The text must be a non-empty
/// JSON list whose entries are non-empty lists of `"host:port"` strings (see
/// [`split_address`]), all of the same length. Surrounding whitespace, such as the newline that
/// `mlx.launch` writes, and a leading UTF-8 byte-order mark are ignored.
///
/// # Errors
///
/// [`ConfigError::Hostfile`] naming `origin`, and the rank and address index where it applies, when the
/// text is empty, not JSON, not a list, an empty list, has an entry that is not a list or is
/// empty, an address that is not a string or not a valid `"host:port"`, or ranks with different
/// numbers of addresses.
pub fn parse(text: &str, origin: &str) -> Result<Vec<Vec<String>>, ConfigError> {
    let bad = |problem| ConfigError::Hostfile {
        file: origin.to_owned(),
        problem,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim().is_empty() {
        return Err(bad(HostfileProblem::Empty));
    }
    let value: Value = serde_json::from_str(text).map_err(|e| {
        bad(HostfileProblem::NotJson {
            reason: e.to_string(),
            line: e.line(),
            column: e.column(),
        })
    })?;
    let Value::Array(ranks) = value else {
        return Err(bad(HostfileProblem::NotAList {
            found: json_kind(&value),
        }));
    };
    if ranks.is_empty() {
        return Err(bad(HostfileProblem::NoRanks));
    }
    let mut nodes: Vec<Vec<String>> = Vec::with_capacity(ranks.len());
    for (rank, entry) in ranks.iter().enumerate() {
        let Value::Array(addresses) = entry else {
            return Err(bad(HostfileProblem::EntryNotAList {
                rank,
                found: json_kind(entry),
            }));
        };
        if addresses.is_empty() {
            return Err(bad(HostfileProblem::NoAddresses { rank }));
        }
        let mut checked = Vec::with_capacity(addresses.len());
        for (index, address) in addresses.iter().enumerate() {
            let Value::String(address) = address else {
                return Err(bad(HostfileProblem::AddressNotAString {
                    rank,
                    index,
                    found: json_kind(address),
                }));
            };
            if let Err(problem) = split(address) {
                return Err(bad(HostfileProblem::BadAddress {
                    rank,
                    index,
                    address: address.clone(),
                    problem,
                }));
            }
            checked.push(address.clone());
        }
        if let Some(first) = nodes.first()
            && first.len() != checked.len()
        {
            return Err(bad(HostfileProblem::UnevenRanks {
                rank,
                count: checked.len(),
                first: first.len(),
            }));
        }
        nodes.push(checked);
    }
    Ok(nodes)
}

/// Reads and [`parse`]s the ring hostfile at `path`.
///
/// # Errors
///
/// [`ConfigError::Unreadable`] naming the path and the I/O error when the file cannot be read,
/// [`ConfigError::NotUtf8File`] naming the path when it is not UTF-8, and any error of
/// [`parse`] (with the path as origin).
pub fn read(path: &Path) -> Result<Vec<Vec<String>>, ConfigError> {
    let origin = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| ConfigError::Unreadable {
        kind: FileKind::Hostfile,
        file: origin.clone(),
        io: e.kind(),
        reason: e.to_string(),
    })?;
    let text = String::from_utf8(bytes).map_err(|e| ConfigError::NotUtf8File {
        kind: FileKind::Hostfile,
        file: origin.clone(),
        offset: e.utf8_error().valid_up_to(),
    })?;
    parse(&text, &origin)
}

/// Splits a `"host:port"` address into its host and port.
///
/// The host is an IPv4 literal, a host name, or an IPv6 literal in brackets (`"[::1]:5000"`,
/// returned without the brackets). The port is a decimal number from 1 to 65535.
///
/// # Errors
///
/// [`ConfigError::BadAddress`] naming the address when it is empty, has no port, an empty host, an
/// unbracketed IPv6 literal, a bad bracketed literal, whitespace, or a port that is not a
/// number, 0 or above 65535.
pub fn split_address(addr: &str) -> Result<(String, u16), ConfigError> {
    split(addr)
        .map(|(host, port)| (host.to_owned(), port))
        .map_err(|problem| bad_address(addr, problem))
}

/// Splits and resolves a `"host:port"` address (see [`split_address`]) to socket addresses.
///
/// Host names are resolved by the system (`getaddrinfo`), and every result is returned, IPv4
/// and IPv6, in the system's order. MLX takes the first result only.
///
/// # Errors
///
/// [`ConfigError::BadAddress`] naming the address when it does not split, does not resolve, or resolves
/// to no address.
pub fn resolve(addr: &str) -> Result<Vec<SocketAddr>, ConfigError> {
    let (host, port) = split(addr).map_err(|problem| bad_address(addr, problem))?;
    let resolved: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| {
            bad_address(
                addr,
                AddressProblem::Unresolvable {
                    host: host.to_owned(),
                    reason: e.to_string(),
                },
            )
        })?
        .collect();
    if resolved.is_empty() {
        return Err(bad_address(
            addr,
            AddressProblem::ResolvesToNothing {
                host: host.to_owned(),
            },
        ));
    }
    Ok(resolved)
}

/// Writes a ring hostfile: the compact JSON that [`parse`] reads back unchanged.
///
/// No trailing newline is written. The addresses are not checked.
pub fn write(nodes: &[Vec<String>]) -> String {
    Value::Array(
        nodes
            .iter()
            .map(|rank| Value::Array(rank.iter().cloned().map(Value::String).collect()))
            .collect(),
    )
    .to_string()
}

fn bad_address(addr: &str, problem: AddressProblem) -> ConfigError {
    ConfigError::BadAddress {
        address: addr.to_owned(),
        problem,
    }
}

/// What kind of JSON value `v` is, for messages ("a list", "null" …).
pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Splits `addr` into host (without IPv6 brackets) and port, or says what is wrong.
pub(crate) fn split(addr: &str) -> Result<(&str, u16), AddressProblem> {
    if addr.is_empty() {
        return Err(AddressProblem::Empty);
    }
    if addr.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(AddressProblem::Whitespace);
    }
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let Some((literal, after)) = rest.split_once(']') else {
            return Err(AddressProblem::UnclosedBracket);
        };
        if literal.parse::<Ipv6Addr>().is_err() {
            return Err(AddressProblem::NotIpv6 {
                literal: literal.to_owned(),
            });
        }
        let Some(port) = after.strip_prefix(':') else {
            return Err(AddressProblem::NoPortAfterBracket {
                literal: literal.to_owned(),
            });
        };
        (literal, port)
    } else {
        let Some((host, port)) = addr.split_once(':') else {
            return Err(AddressProblem::NoPort);
        };
        if port.contains(':') {
            return Err(AddressProblem::UnbracketedIpv6);
        }
        if host.is_empty() {
            return Err(AddressProblem::EmptyHost);
        }
        (host, port)
    };
    Ok((host, parse_port(port)?))
}

fn parse_port(port: &str) -> Result<u16, AddressProblem> {
    if port.is_empty() {
        return Err(AddressProblem::EmptyPort);
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AddressProblem::PortNotANumber {
            port: port.to_owned(),
        });
    }
    match port.parse::<u16>() {
        Ok(0) => Err(AddressProblem::PortZero),
        Ok(p) => Ok(p),
        Err(_) => Err(AddressProblem::PortOutOfRange {
            port: port.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_message(e: ConfigError) -> String {
        e.to_string()
    }

    fn strings(nodes: &[&[&str]]) -> Vec<Vec<String>> {
        nodes
            .iter()
            .map(|r| r.iter().map(|a| (*a).to_owned()).collect())
            .collect()
    }

    #[test]
    fn mlx_documented_example_parses_to_two_ranks_of_two_connections() {
        let text = r#"[["10.0.0.1:5000","10.0.0.1:5001"],["10.0.0.2:5000","10.0.0.2:5001"]]"#;
        let nodes = parse(text, "hosts.json").unwrap();
        assert_eq!(
            nodes,
            strings(&[
                &["10.0.0.1:5000", "10.0.0.1:5001"],
                &["10.0.0.2:5000", "10.0.0.2:5001"]
            ])
        );
    }

    #[test]
    fn the_trailing_newline_that_mlx_launch_echoes_is_accepted() {
        let text = "[[\"127.0.0.1:32323\"],[\"127.0.0.1:32324\"]]\n";
        assert_eq!(
            parse(text, "f").unwrap(),
            strings(&[&["127.0.0.1:32323"], &["127.0.0.1:32324"]])
        );
        let spaced = " \n\t[ [ \"a:1\" ] ,\n [ \"b:2\" ] ]\r\n\n";
        assert_eq!(parse(spaced, "f").unwrap(), strings(&[&["a:1"], &["b:2"]]));
    }

    #[test]
    fn a_byte_order_mark_is_ignored() {
        assert_eq!(
            parse("\u{feff}[[\"a:1\"]]", "f").unwrap(),
            strings(&[&["a:1"]])
        );
    }

    #[test]
    fn writing_then_parsing_gives_back_the_same_nodes() {
        let nodes = strings(&[
            &["10.0.0.1:5000", "[fe80::1]:5001", "host-a.local:7"],
            &["10.0.0.2:5000", "[::1]:65535", "b:1"],
            &["c:2", "d:3", "e:4"],
        ]);
        let text = write(&nodes);
        assert_eq!(parse(&text, "written").unwrap(), nodes);
        assert_eq!(parse(&format!("{text}\n"), "echoed").unwrap(), nodes);
    }

    #[test]
    fn writing_matches_mlx_launch_compact_layout() {
        let nodes = strings(&[&["127.0.0.1:32323"], &["127.0.0.1:32324"]]);
        assert_eq!(
            write(&nodes),
            r#"[["127.0.0.1:32323"],["127.0.0.1:32324"]]"#
        );
    }

    #[test]
    fn ipv4_hostname_and_bracketed_ipv6_addresses_split_into_host_and_port() {
        assert_eq!(
            split_address("10.0.0.1:5000").unwrap(),
            ("10.0.0.1".to_owned(), 5000)
        );
        assert_eq!(
            split_address("node-3.cluster:1").unwrap(),
            ("node-3.cluster".to_owned(), 1)
        );
        assert_eq!(
            split_address("[::1]:5000").unwrap(),
            ("::1".to_owned(), 5000)
        );
        assert_eq!(
            split_address("[fe80::1:2]:65535").unwrap(),
            ("fe80::1:2".to_owned(), 65535)
        );
    }

    #[test]
    fn an_unbracketed_ipv6_address_is_refused_with_a_hint() {
        let m = config_message(split_address("::1:5000").unwrap_err());
        assert!(m.contains("\"::1:5000\"") && m.contains("brackets"), "{m}");
    }

    #[test]
    fn a_port_with_a_sign_or_trailing_text_is_not_a_number() {
        for bad in ["h:+5000", "h:5000abc", "h:-1", "h:5e3"] {
            let m = config_message(split_address(bad).unwrap_err());
            assert!(m.contains("is not a number"), "{bad}: {m}");
        }
    }

    #[test]
    fn a_port_with_leading_zeros_is_still_the_number() {
        assert_eq!(split_address("h:05000").unwrap(), ("h".to_owned(), 5000));
    }

    #[test]
    fn localhost_resolves_to_a_loopback_address_with_the_port() {
        let addrs = resolve("localhost:5000").unwrap();
        assert!(!addrs.is_empty());
        assert!(
            addrs
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 5000),
            "{addrs:?}"
        );
    }

    #[test]
    fn ipv4_and_ipv6_literals_resolve_to_themselves() {
        assert_eq!(
            resolve("127.0.0.1:32323").unwrap(),
            vec!["127.0.0.1:32323".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            resolve("[::1]:32323").unwrap(),
            vec!["[::1]:32323".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn ranks_of_one_connection_each_are_fine_even_for_one_rank() {
        assert_eq!(
            parse(r#"[["127.0.0.1:1"]]"#, "f").unwrap(),
            strings(&[&["127.0.0.1:1"]])
        );
    }

    #[test]
    fn the_first_rank_whose_count_differs_is_named() {
        let text = r#"[["a:1","a:2"],["b:1","b:2"],["c:1"],["d:1"]]"#;
        let m = config_message(parse(text, "f.json").unwrap_err());
        assert_eq!(
            m,
            "hostfile f.json: rank 2 lists 1 address but rank 0 lists 2; every rank needs the \
             same number of addresses (one per connection)"
        );
    }

    #[test]
    fn an_address_problem_is_a_value_a_program_can_match() {
        assert_eq!(
            split_address("h:0"),
            Err(ConfigError::BadAddress {
                address: "h:0".into(),
                problem: AddressProblem::PortZero
            })
        );
        let e = parse(r#"[["a:1"],["b"]]"#, "f").unwrap_err();
        assert!(
            matches!(
                &e,
                ConfigError::Hostfile {
                    problem: HostfileProblem::BadAddress {
                        rank: 1,
                        index: 0,
                        problem: AddressProblem::NoPort,
                        ..
                    },
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
