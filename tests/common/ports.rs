//! Free loopback addresses for test rings.

/// `ranks` entries of `conns` free loopback addresses each, as MLX's hostfile lists them
/// (`nuvec_local::free_nodes`). The ports are found by binding port 0 and releasing it, so
/// another process could take one in between; tests retry nothing, so a collision shows as a
/// setup error naming the address.
pub fn free_nodes(ranks: usize, conns: usize) -> Vec<Vec<String>> {
    nuvec_local::free_nodes(ranks, conns).expect("free loopback addresses")
}
