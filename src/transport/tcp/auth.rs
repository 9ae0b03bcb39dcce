//! Opt-in authentication of ring connections with a pre-shared key: a mutual HMAC-SHA256
//! challenge-response that binds both ranks and fresh nonces, before any data.
//!
//! MLX's ring accepts any connection on its ports, so any process that can reach them can take
//! a rank's place. With a key ([`Options::key`](crate::Options::key), or
//! `NUVEC_DISTRIBUTED_KEY` for [`init`](crate::init)), every connection starts with:
//!
//! 1. opener → acceptor: `hello` = magic `nuvecPSK`, version 2, the opener's rank and the
//!    rank it means to reach (u32 LE each), the link index (u32 LE), a 32-byte nonce N₀ and
//!    the opener's wire byte W₀ (54 bytes);
//! 2. acceptor → opener: a 32-byte nonce N₁, the acceptor's wire byte W₁ and
//!    `HMAC(K, "acceptor" ‖ hello ‖ N₁ ‖ W₁)` (65 bytes);
//! 3. opener → acceptor: `HMAC(K, "opener" ‖ hello ‖ N₁ ‖ W₁)`.
//!
//! A wire byte is 1 when its side may speak the nuvec wire, 0 when it was asked for MLX's
//! (`NUVEC_DISTRIBUTED_WIRE=mlx`): both ends of a keyed connection are ranks of this crate, so
//! the handshake, not the probe (`probe`), says whether the connection is native (both bytes
//! 1), and the MACs cover both bytes. Version 1 (nuvec-distributed 0.5) had neither byte; the
//! two versions refuse each other's hello, naming the version.
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
pub const VERSION: u8 = 2;
/// The length of a nonce and of a proof.
pub const NONCE: usize = 32;
/// The length of the opener's hello.
pub const HELLO: usize = 8 + 1 + 4 + 4 + 4 + NONCE + 1;
/// The length of the acceptor's reply: its nonce, its wire byte and its proof.
pub const REPLY: usize = NONCE + 1 + NONCE;
pub use crate::config::key::{Key, MIN_SECRET};

type HmacSha256 = Hmac<Sha256>;

impl Key {
    fn mac(&self, role: &[u8], hello: &[u8; HELLO], nonce: &[u8; NONCE], wire: u8) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(role);
        mac.update(hello);
        mac.update(nonce);
        mac.update(&[wire]);
        mac
    }

    fn proof(
        &self,
        role: &[u8],
        hello: &[u8; HELLO],
        nonce: &[u8; NONCE],
        wire: u8,
    ) -> [u8; NONCE] {
        self.mac(role, hello, nonce, wire)
            .finalize()
            .into_bytes()
            .into()
    }

    fn check(
        &self,
        role: &[u8],
        hello: &[u8; HELLO],
        nonce: &[u8; NONCE],
        wire: u8,
        proof: &[u8],
    ) -> bool {
        self.mac(role, hello, nonce, wire)
            .verify_slice(proof)
            .is_ok()
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
    /// The peer's hello has a wire byte that is neither 0 nor 1.
    #[error("the peer's hello names wire {0}, neither 0 (MLX's) nor 1 (the nuvec wire)")]
    Wire(u8),
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
        hello[21..21 + NONCE].copy_from_slice(&nonce);
        hello[HELLO - 1] = 1;
        Self {
            key: key.clone(),
            hello,
        }
    }

    /// Says in the hello whether this side may speak the nuvec wire (the default) or was asked
    /// for MLX's.
    pub fn speaking(mut self, nuvec: bool) -> Self {
        self.hello[HELLO - 1] = u8::from(nuvec);
        self
    }

    /// The first message.
    pub fn hello(&self) -> &[u8; HELLO] {
        &self.hello
    }

    /// Checks the acceptor's reply (its nonce, wire byte and proof, [`REPLY`] bytes) and
    /// returns the opener's proof to send.
    pub fn finish(&self, reply: &[u8; REPLY]) -> Result<[u8; NONCE], AuthError> {
        let nonce: [u8; NONCE] = reply[..NONCE].try_into().expect("a nonce");
        let wire = reply[NONCE];
        if !self
            .key
            .check(b"acceptor", &self.hello, &nonce, wire, &reply[NONCE + 1..])
        {
            return Err(AuthError::BadProof);
        }
        Ok(self.key.proof(b"opener", &self.hello, &nonce, wire))
    }

    /// Whether the acceptor of `reply` may speak the nuvec wire: its wire byte is 1. Only
    /// worth asking once [`finish`](Opener::finish) accepted the reply (the MAC covers it).
    pub fn acceptor_speaks_nuvec(reply: &[u8; REPLY]) -> bool {
        reply[NONCE] == 1
    }
}

/// The acceptor's side: it checks the hello, replies, and checks the opener's proof.
#[derive(Debug)]
pub struct Acceptor {
    key: Key,
    hello: [u8; HELLO],
    nonce: [u8; NONCE],
    /// This side's wire byte, as sent in the reply.
    wire: u8,
}

impl Acceptor {
    /// Checks `hello` from a connection that should come from `expected` to this rank `me` on
    /// `link`; returns the acceptor state and the reply to send, saying this side may speak
    /// the nuvec wire.
    pub fn new(
        key: &Key,
        me: u32,
        expected: u32,
        link: u32,
        hello: &[u8; HELLO],
    ) -> Result<(Self, [u8; REPLY]), AuthError> {
        Self::speaking(key, me, expected, link, hello, true)
    }

    /// As [`Acceptor::new`], saying whether this side may speak the nuvec wire (`nuvec`) or
    /// was asked for MLX's.
    pub fn speaking(
        key: &Key,
        me: u32,
        expected: u32,
        link: u32,
        hello: &[u8; HELLO],
        nuvec: bool,
    ) -> Result<(Self, [u8; REPLY]), AuthError> {
        Self::answer(key, [me, expected, link], hello, nonce(), nuvec)
    }

    /// As [`Acceptor::new`] with a given nonce (for tests).
    pub fn with_nonce(
        key: &Key,
        me: u32,
        expected: u32,
        link: u32,
        hello: &[u8; HELLO],
        nonce: [u8; NONCE],
    ) -> Result<(Self, [u8; REPLY]), AuthError> {
        Self::answer(key, [me, expected, link], hello, nonce, true)
    }

    fn answer(
        key: &Key,
        [me, expected, link]: [u32; 3],
        hello: &[u8; HELLO],
        nonce: [u8; NONCE],
        nuvec: bool,
    ) -> Result<(Self, [u8; REPLY]), AuthError> {
        if &hello[..8] != MAGIC {
            return Err(AuthError::NotAuthenticating);
        }
        if hello[8] != VERSION {
            return Err(AuthError::Version(hello[8]));
        }
        if hello[HELLO - 1] > 1 {
            return Err(AuthError::Wire(hello[HELLO - 1]));
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
        let wire = u8::from(nuvec);
        let mut reply = [0u8; REPLY];
        reply[..NONCE].copy_from_slice(&nonce);
        reply[NONCE] = wire;
        reply[NONCE + 1..].copy_from_slice(&key.proof(b"acceptor", hello, &nonce, wire));
        Ok((
            Self {
                key: key.clone(),
                hello: *hello,
                nonce,
                wire,
            },
            reply,
        ))
    }

    /// Checks the opener's proof.
    pub fn finish(&self, proof: &[u8; NONCE]) -> Result<(), AuthError> {
        if self
            .key
            .check(b"opener", &self.hello, &self.nonce, self.wire, proof)
        {
            Ok(())
        } else {
            Err(AuthError::BadProof)
        }
    }

    /// Whether the opener may speak the nuvec wire: its hello's wire byte is 1. Only worth
    /// asking once [`finish`](Acceptor::finish) accepted its proof (the MAC covers the hello).
    pub fn opener_speaks_nuvec(&self) -> bool {
        self.hello[HELLO - 1] == 1
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
    fn each_side_learns_the_others_wire_and_a_flipped_wire_byte_fails_the_proof() {
        let k = key("a shared secret of the ring");
        for (opener_nuvec, acceptor_nuvec) in [(true, true), (true, false), (false, true)] {
            let opener = Opener::new(&k, 0, 1, 0).speaking(opener_nuvec);
            let (acceptor, reply) =
                Acceptor::speaking(&k, 1, 0, 0, opener.hello(), acceptor_nuvec).expect("hello");
            let proof = opener.finish(&reply).expect("acceptor proof");
            acceptor.finish(&proof).expect("opener proof");
            assert_eq!(Opener::acceptor_speaks_nuvec(&reply), acceptor_nuvec);
            assert_eq!(acceptor.opener_speaks_nuvec(), opener_nuvec);
            let mut flipped = reply;
            flipped[NONCE] ^= 1;
            assert_eq!(opener.finish(&flipped), Err(AuthError::BadProof));
        }
        let mut hello = *Opener::new(&k, 0, 1, 0).hello();
        hello[HELLO - 1] = 2;
        assert_eq!(
            Acceptor::new(&k, 1, 0, 0, &hello).map(|_| ()),
            Err(AuthError::Wire(2))
        );
        let mut old = hello;
        old[8] = 1;
        assert_eq!(
            Acceptor::new(&k, 1, 0, 0, &old).map(|_| ()),
            Err(AuthError::Version(1))
        );
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
