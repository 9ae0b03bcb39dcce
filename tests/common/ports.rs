//! Free loopback addresses for test rings.
#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;

/// `ranks` entries of `conns` free loopback addresses each, as MLX's hostfile lists them.
/// The ports are found by binding port 0 and releasing it, so another process could take one
/// in between; tests retry nothing, so a collision shows as a setup error naming the address.
pub fn free_nodes(ranks: usize, conns: usize) -> Vec<Vec<String>> {
    let listeners: Vec<Vec<TcpListener>> = (0..ranks)
        .map(|_| {
            (0..conns)
                .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
                .collect()
        })
        .collect();
    listeners
        .iter()
        .map(|row| {
            row.iter()
                .map(|l| l.local_addr().expect("local address").to_string())
                .collect()
        })
        .collect()
}
