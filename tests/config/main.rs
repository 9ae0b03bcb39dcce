//! What is read and exchanged before a collective moves a byte, in this process: malformed
//! hostfiles, addresses and variables ([`bad_input`]), JACCL's configuration
//! ([`jaccl_config`]), the ring's authentication over loopback ([`auth`]) and JACCL's TCP side
//! channel against scripted MLX peers and between threads ([`jaccl_side_channel`]).

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod bad_input;
mod jaccl_config;
mod jaccl_side_channel;
