//! Free loopback addresses for test rings.

/// `ranks` entries of `conns` free loopback addresses each, as MLX's hostfile lists them
/// (`nuvec_local::free_nodes`). The ports are found by binding port 0 and releasing it, so
/// another process could take one in between; tests retry nothing, so a collision shows as a
/// setup error naming the address.
pub fn free_nodes(ranks: usize, conns: usize) -> Vec<Vec<String>> {
    nuvec_local::free_nodes(ranks, conns).expect("free loopback addresses")
}

/// `n` consecutive free loopback ports, for `nuvec-launch --starting-port` (which gives rank
/// r the port `start + r`): the first is the system's choice, the next ones are checked free
/// (all released before returning; another process could take one meanwhile).
pub fn consecutive(n: u16) -> u16 {
    for _ in 0..100 {
        let first = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let base = first.local_addr().expect("address").port();
        if u32::from(base) + u32::from(n) > 65535 {
            continue;
        }
        let rest: Result<Vec<std::net::TcpListener>, _> = (1..n)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)))
            .collect();
        if rest.is_ok() {
            return base;
        }
    }
    panic!("no {n} consecutive free loopback ports");
}
