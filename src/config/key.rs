//! The pre-shared key of an authenticated group ([`Options::key`](crate::Options::key),
//! `NUVEC_DISTRIBUTED_KEY`): derived once from the secret, never shown. The handshake that uses
//! it is the TCP transport's (`transport::tcp::auth`).

use sha2::{Digest, Sha256};

/// The shortest secret accepted.
pub const MIN_SECRET: usize = 16;

/// A pre-shared key, derived from a secret; its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(pub(crate) [u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// The key of `secret`, which must be at least [`MIN_SECRET`] bytes (else `None`).
    pub fn from_secret(secret: &[u8]) -> Option<Self> {
        if secret.len() < MIN_SECRET {
            return None;
        }
        let mut h = Sha256::new();
        h.update(b"nuvec-distributed ring key v1\0");
        h.update(secret);
        Some(Self(h.finalize().into()))
    }
}
