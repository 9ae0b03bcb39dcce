//! Target `hostfile`: `hostfile::parse` of fuzzed text and its round trip through `write`.

use nuvec_distributed::hostfile;

use super::script::text;

/// `hostfile::parse` never panics; when it accepts a text, the nodes are non-empty, every rank
/// lists the same (non-zero) number of addresses, every address passes
/// `hostfile::split_address`, and `parse(write(nodes)) == nodes` (also with `mlx.launch`'s
/// trailing newline and a byte-order mark).
pub(crate) fn hostfile(data: &[u8]) {
    let text = text(data);
    let Ok(nodes) = hostfile::parse(&text, "fuzz") else {
        return;
    };
    assert!(
        !nodes.is_empty(),
        "accepted a hostfile with no ranks: {text:?}"
    );
    let width = nodes[0].len();
    assert!(width > 0, "accepted a rank with no addresses: {text:?}");
    for (rank, addresses) in nodes.iter().enumerate() {
        assert_eq!(
            addresses.len(),
            width,
            "rank {rank} has a different address count: {text:?}"
        );
        for address in addresses {
            if let Err(e) = hostfile::split_address(address) {
                panic!("accepted address {address:?} does not split ({e}): {text:?}");
            }
        }
    }
    let written = hostfile::write(&nodes);
    for again in [
        written.clone(),
        format!("{written}\n"),
        format!("\u{feff}{written}"),
    ] {
        match hostfile::parse(&again, "rewritten") {
            Ok(back) => assert_eq!(back, nodes, "round trip of {text:?} via {again:?}"),
            Err(e) => panic!("the written form {again:?} of {text:?} does not parse: {e}"),
        }
    }
}
