//! Opt-in authentication of ring connections with a pre-shared key: a mutual HMAC-SHA256
//! challenge-response that binds both ranks and fresh nonces, before any data.
//!
//! MLX's ring accepts any connection on its ports, so any process that can reach them can take
//! a rank's place. With a key ([`Options::key`](crate::Options::key), or
//! `NUVEC_DISTRIBUTED_KEY` for [`init`](crate::init)), every connection starts with:
//!
//! 1. opener → acceptor: `hello` = magic `nuvecPSK`, version 1, the opener's rank and the
//!    rank it means to reach (u32 LE each), the link index (u32 LE) and a 32-byte nonce N₀;
//! 2. acceptor → opener: a 32-byte nonce N₁ and
//!    `HMAC(K, "acceptor" ‖ hello ‖ N₁)`;
//! 3. opener → acceptor: `HMAC(K, "opener" ‖ hello ‖ N₁)`.
//!
//! K is SHA-256 of a domain tag and the secret. Each side checks the other's proof over both
//! nonces, so a recorded handshake replays nowhere (the other side's nonce is fresh), a
//! stranger without the key is rejected before it can send or read a byte of data, and a
//! connection from the wrong rank or to the wrong link is refused. Without a key no byte is
//! added and the wire stays MLX's. The traffic itself is **not encrypted**: run the group over
//! a trusted network or a VPN.
//!
//! This module is the protocol without I/O; [`crate::transport::tcp`] runs it over the sockets.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The first bytes an authenticating opener sends.
pub const MAGIC: &[u8; 8] = b"nuvecPSK";
/// The protocol version.
pub const VERSION: u8 = 1;
/// The length of a nonce and of a proof.
pub const NONCE: usize = 32;
/// The length of the opener's hello.
pub const HELLO: usize = 8 + 1 + 4 + 4 + 4 + NONCE;
pub use crate::config::key::{Key, MIN_SECRET};

type HmacSha256 = Hmac<Sha256>;

impl Key {
    fn proof(&self, role: &[u8], hello: &[u8; HELLO], nonce: &[u8; NONCE]) -> [u8; NONCE] {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(role);
        mac.update(hello);
        mac.update(nonce);
        mac.finalize().into_bytes().into()
    }

    fn check(&self, role: &[u8], hello: &[u8; HELLO], nonce: &[u8; NONCE], proof: &[u8]) -> bool {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(role);
        mac.update(hello);
        mac.update(nonce);
        mac.verify_slice(proof).is_ok()
    }
}

/// Why a handshake failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The peer does not speak this protocol (no key on its side, or not a ring rank).
    #[error("the peer did not authenticate (no key on its side, or not a rank of this ring)")]
    NotAuthenticating,
    /// The peer's protocol version differs.
    #[error("the peer speaks authentication version {0}, this rank {VERSION}")]
    Version(u8),
    /// The opener is not the rank this connection should come from.
    #[error(
        "the connection claims to come from rank {claimed} for rank {target}, link {link}; expected rank {expected} for rank {me}, link {want_link}"
    )]
    WrongRank {
        /// The rank the peer says it is.
        claimed: u32,
        /// The rank it says it wants.
        target: u32,
        /// The link index it says it opens.
        link: u32,
        /// The rank expected.
        expected: u32,
        /// This rank.
        me: u32,
        /// The link expected.
        want_link: u32,
    },
    /// The peer's proof is wrong: it does not hold the key (or replays an old handshake).
    #[error("the peer's proof is wrong: it does not hold the same key")]
    BadProof,
}

fn nonce() -> [u8; NONCE] {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).expect("the operating system's random source");
    n
}

/// The opener's side: it sends [`Opener::hello`], reads the acceptor's reply and sends
/// [`Opener::finish`]'s proof.
#[derive(Debug)]
pub struct Opener {
    key: Key,
    hello: [u8; HELLO],
}

impl Opener {
    /// The opener `rank` connecting to `target` as its link `link`, with a fresh nonce.
    pub fn new(key: &Key, rank: u32, target: u32, link: u32) -> Self {
        Self::with_nonce(key, rank, target, link, nonce())
    }

    /// As [`Opener::new`] with a given nonce (for tests).
    pub fn with_nonce(key: &Key, rank: u32, target: u32, link: u32, nonce: [u8; NONCE]) -> Self {
        let mut hello = [0u8; HELLO];
        hello[..8].copy_from_slice(MAGIC);
        hello[8] = VERSION;
        hello[9..13].copy_from_slice(&rank.to_le_bytes());
        hello[13..17].copy_from_slice(&target.to_le_bytes());
        hello[17..21].copy_from_slice(&link.to_le_bytes());
        hello[21..].copy_from_slice(&nonce);
        Self {
            key: key.clone(),
            hello,
        }
    }

    /// The first message.
    pub fn hello(&self) -> &[u8; HELLO] {
        &self.hello
    }

    /// Checks the acceptor's reply (its nonce and proof, `2 × NONCE` bytes) and returns the
    /// opener's proof to send.
    pub fn finish(&self, reply: &[u8; 2 * NONCE]) -> Result<[u8; NONCE], AuthError> {
        let nonce: [u8; NONCE] = reply[..NONCE].try_into().expect("a nonce");
        if !self
            .key
            .check(b"acceptor", &self.hello, &nonce, &reply[NONCE..])
        {
            return Err(AuthError::BadProof);
        }
        Ok(self.key.proof(b"opener", &self.hello, &nonce))
    }
}

/// The acceptor's side: it checks the hello, replies, and checks the opener's proof.
#[derive(Debug)]
pub struct Acceptor {
    key: Key,
    hello: [u8; HELLO],
    nonce: [u8; NONCE],
}

impl Acceptor {
    /// Checks `hello` from a connection that should come from `expected` to this rank `me` on
    /// `link`; returns the acceptor state and the reply to send.
    pub fn new(
        key: &Key,
        me: u32,
        expected: u32,
        link: u32,
        hello: &[u8; HELLO],
    ) -> Result<(Self, [u8; 2 * NONCE]), AuthError> {
        Self::with_nonce(key, me, expected, link, hello, nonce())
    }

    /// As [`Acceptor::new`] with a given nonce (for tests).
    pub fn with_nonce(
        key: &Key,
        me: u32,
        expected: u32,
        link: u32,
        hello: &[u8; HELLO],
        nonce: [u8; NONCE],
    ) -> Result<(Self, [u8; 2 * NONCE]), AuthError> {
        if &hello[..8] != MAGIC {
            return Err(AuthError::NotAuthenticating);
        }
        if hello[8] != VERSION {
            return Err(AuthError::Version(hello[8]));
        }
        let word = |at: usize| u32::from_le_bytes(hello[at..at + 4].try_into().expect("4 bytes"));
        let (claimed, target, their_link) = (word(9), word(13), word(17));
        if (claimed, target, their_link) != (expected, me, link) {
            return Err(AuthError::WrongRank {
                claimed,
                target,
                link: their_link,
                expected,
                me,
                want_link: link,
            });
        }
        let mut reply = [0u8; 2 * NONCE];
        reply[..NONCE].copy_from_slice(&nonce);
        reply[NONCE..].copy_from_slice(&key.proof(b"acceptor", hello, &nonce));
        Ok((
            Self {
                key: key.clone(),
                hello: *hello,
                nonce,
            },
            reply,
        ))
    }

    /// Checks the opener's proof.
    pub fn finish(&self, proof: &[u8; NONCE]) -> Result<(), AuthError> {
        if self.key.check(b"opener", &self.hello, &self.nonce, proof) {
            Ok(())
        } else {
            Err(AuthError::BadProof)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Key {
        Key::from_secret(s.as_bytes()).expect("long enough")
    }

    #[test]
    fn both_sides_with_the_same_key_agree() {
        let k = key("a shared secret of the ring");
        let opener = Opener::new(&k, 3, 4, 1);
        let (acceptor, reply) = Acceptor::new(&k, 4, 3, 1, opener.hello()).expect("hello");
        let proof = opener.finish(&reply).expect("acceptor proof");
        acceptor.finish(&proof).expect("opener proof");
    }

    #[test]
    fn a_wrong_key_is_rejected_on_both_sides() {
        let opener = Opener::new(&key("the key of rank three"), 3, 4, 0);
        let (_, reply) =
            Acceptor::new(&key("another key entirely"), 4, 3, 0, opener.hello()).expect("hello");
        assert_eq!(opener.finish(&reply), Err(AuthError::BadProof));
        let k = key("the key of rank three");
        let (acceptor, _) = Acceptor::new(&k, 4, 3, 0, opener.hello()).expect("hello");
        let forged = Opener::new(&key("another key entirely"), 3, 4, 0);
        let (_, reply2) =
            Acceptor::new(&key("another key entirely"), 4, 3, 0, forged.hello()).expect("hello");
        let proof = forged.finish(&reply2).expect("its own key agrees");
        assert_eq!(acceptor.finish(&proof), Err(AuthError::BadProof));
    }

    #[test]
    fn a_replayed_handshake_fails_against_a_fresh_nonce() {
        let k = key("a shared secret of the ring");
        let opener = Opener::new(&k, 0, 1, 0);
        let (_, reply) = Acceptor::new(&k, 1, 0, 0, opener.hello()).expect("hello");
        let recorded = opener.finish(&reply).expect("proof");
        // The recorded hello and proof, replayed to a new acceptor (new nonce).
        let (fresh, _) = Acceptor::new(&k, 1, 0, 0, opener.hello()).expect("hello");
        assert_eq!(fresh.finish(&recorded), Err(AuthError::BadProof));
    }

    #[test]
    fn a_connection_from_the_wrong_rank_or_link_is_refused() {
        let k = key("a shared secret of the ring");
        let opener = Opener::new(&k, 2, 1, 0);
        assert!(matches!(
            Acceptor::new(&k, 1, 0, 0, opener.hello()),
            Err(AuthError::WrongRank { claimed: 2, .. })
        ));
        let opener = Opener::new(&k, 0, 1, 1);
        assert!(matches!(
            Acceptor::new(&k, 1, 0, 0, opener.hello()),
            Err(AuthError::WrongRank { link: 1, .. })
        ));
    }

    #[test]
    fn bytes_that_are_not_a_hello_are_not_authenticating() {
        let k = key("a shared secret of the ring");
        let garbage = [7u8; HELLO];
        assert_eq!(
            Acceptor::new(&k, 1, 0, 0, &garbage).map(|_| ()),
            Err(AuthError::NotAuthenticating)
        );
    }

    #[test]
    fn short_secrets_are_refused_and_keys_never_print() {
        assert!(Key::from_secret(b"too short").is_none());
        assert_eq!(
            format!("{:?}", key("a shared secret of the ring")),
            "Key(..)"
        );
    }
}
