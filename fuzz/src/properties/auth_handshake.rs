//! Target `auth_handshake`: the HMAC handshake fed fuzzed peer messages.

use nuvec_distributed::internals::auth::{self, Acceptor, AuthError, Key, Opener};

use super::script::Script;

/// The fuzz ring's key when the fuzzed secret is too short.
const FALLBACK_SECRET: &[u8] = b"the fuzz ring's pre-shared secret";

/// The authentication handshake (`auth`, HMAC-SHA256 over a pre-shared key) fed fuzzed peer
/// messages. The script: a secret (a key exists exactly when it has at least `MIN_SECRET`
/// bytes), a hello (raw, or with the magic and version set, or honest, in which case the
/// acceptor expects exactly its ranks and link, or honest with one expected value off), the
/// acceptor's nonce, then forged replies and proofs.
///
/// Properties: `Acceptor` refuses a hello without the magic (`NotAuthenticating`), of another
/// version (`Version`), or from another rank, to another rank or on another link
/// (`WrongRank`, echoing the claimed and expected values), and accepts every other hello,
/// replying its nonce, its wire byte and a proof the honest `Opener` of that hello (which
/// rebuilds the same 54 bytes) accepts; a hello whose wire byte is neither 0 nor 1 is refused
/// (`Wire`); the opener's proof is accepted by the acceptor; a fuzzed proof is accepted
/// exactly when it equals the correct one, and a correct one with any single bit flipped is
/// refused (`BadProof`); a fuzzed reply is accepted by the opener exactly when it equals the
/// honest reply for its nonce; a proof for another nonce (a replay) or made with another key
/// is refused, on both sides. Nothing panics.
pub(crate) fn auth_handshake(data: &[u8]) {
    let mut s = Script(data);
    let secret_len = usize::from(s.byte() % 48);
    let secret = s.bytes(secret_len);
    let key = Key::from_secret(&secret);
    assert_eq!(
        key.is_some(),
        secret.len() >= auth::MIN_SECRET,
        "a key from a secret of {} bytes",
        secret.len()
    );
    let (key, secret) = match key {
        Some(k) => (k, secret),
        None => (
            Key::from_secret(FALLBACK_SECRET).unwrap(),
            FALLBACK_SECRET.to_vec(),
        ),
    };

    let mode = s.byte();
    let mut hello: [u8; auth::HELLO] = s.array();
    if mode % 4 != 0 {
        hello[..8].copy_from_slice(auth::MAGIC);
        hello[8] = auth::VERSION;
        hello[auth::HELLO - 1] &= 1;
    }
    let word = |at: usize| u32::from_le_bytes(hello[at..at + 4].try_into().unwrap());
    let (claimed, target, link) = (word(9), word(13), word(17));
    let (mut me, mut expected, mut want_link) = (s.u32(), s.u32(), s.u32());
    if mode % 4 >= 2 {
        (me, expected, want_link) = (target, claimed, link);
        if mode % 4 == 3 {
            let by = s.u32() | 1;
            match s.byte() % 3 {
                0 => me ^= by,
                1 => expected ^= by,
                _ => want_link ^= by,
            }
        }
    }
    let nonce: [u8; auth::NONCE] = s.array();

    let accepted = Acceptor::with_nonce(&key, me, expected, want_link, &hello, nonce);
    let model = if hello[..8] != auth::MAGIC[..] {
        Err(AuthError::NotAuthenticating)
    } else if hello[8] != auth::VERSION {
        Err(AuthError::Version(hello[8]))
    } else if hello[auth::HELLO - 1] > 1 {
        Err(AuthError::Wire(hello[auth::HELLO - 1]))
    } else if (claimed, target, link) != (expected, me, want_link) {
        Err(AuthError::WrongRank {
            claimed,
            target,
            link,
            expected,
            me,
            want_link,
        })
    } else {
        Ok(())
    };
    let (acceptor, reply) = match (accepted, model) {
        (Ok(accepted), Ok(())) => accepted,
        (Err(got), Err(want)) => {
            assert_eq!(got, want, "the refusal of hello {hello:02x?}");
            return;
        }
        (got, want) => panic!(
            "hello {hello:02x?} for rank {me} from {expected}, link {want_link}: got {:?}, \
             expected {want:?}",
            got.map(|_| ())
        ),
    };
    assert_eq!(
        reply[..auth::NONCE],
        nonce,
        "the reply starts with the nonce"
    );

    // The honest opener of this hello.
    let hello_nonce: [u8; auth::NONCE] = hello[21..21 + auth::NONCE].try_into().unwrap();
    let opener = Opener::with_nonce(&key, claimed, target, link, hello_nonce)
        .speaking(hello[auth::HELLO - 1] == 1);
    assert_eq!(opener.hello(), &hello, "the opener rebuilds the hello");
    let proof = opener
        .finish(&reply)
        .unwrap_or_else(|e| panic!("the honest reply is refused: {e}"));
    assert_eq!(
        acceptor.finish(&proof),
        Ok(()),
        "the honest proof is refused"
    );

    // Forged proofs.
    let forged: [u8; auth::NONCE] = s.array();
    assert_eq!(
        acceptor.finish(&forged).is_ok(),
        forged == proof,
        "a fuzzed proof {forged:02x?}"
    );
    let bit = usize::from(s.byte());
    let mut flipped = proof;
    flipped[bit / 8 % auth::NONCE] ^= 1 << (bit % 8);
    assert_eq!(acceptor.finish(&flipped), Err(AuthError::BadProof));

    // Forged replies: checked against the honest reply for the forged nonce.
    let forged_reply: [u8; auth::REPLY] = s.array();
    let other_nonce: [u8; auth::NONCE] = forged_reply[..auth::NONCE].try_into().unwrap();
    let (other_acceptor, honest_other) =
        Acceptor::with_nonce(&key, me, expected, want_link, &hello, other_nonce)
            .expect("the same hello");
    let opened = opener.finish(&forged_reply);
    assert_eq!(
        opened.is_ok(),
        forged_reply == honest_other,
        "a fuzzed reply {forged_reply:02x?}: {opened:?}"
    );
    if let Err(e) = opened {
        assert_eq!(e, AuthError::BadProof);
    }
    let mut flipped_reply = reply;
    let bit = usize::from(s.byte()) * 2 + usize::from(s.byte() & 1);
    flipped_reply[bit / 8 % auth::REPLY] ^= 1 << (bit % 8);
    assert_eq!(opener.finish(&flipped_reply), Err(AuthError::BadProof));

    // A replay: the proof made for one nonce, shown to an acceptor that chose another.
    let other_proof = opener.finish(&honest_other).expect("the honest reply");
    assert_eq!(other_acceptor.finish(&other_proof), Ok(()));
    assert_eq!(
        acceptor.finish(&other_proof).is_ok(),
        other_nonce == nonce,
        "a proof for nonce {other_nonce:02x?} replayed against {nonce:02x?}"
    );

    // Another key, on either side.
    let mut other_secret = secret.clone();
    other_secret.push(s.byte());
    let other_key = Key::from_secret(&other_secret).unwrap();
    assert_ne!(other_key, key, "two secrets give one key");
    let (stranger, stranger_reply) =
        Acceptor::with_nonce(&other_key, me, expected, want_link, &hello, nonce)
            .expect("the hello does not depend on the key");
    assert_eq!(opener.finish(&stranger_reply), Err(AuthError::BadProof));
    assert_eq!(stranger.finish(&proof), Err(AuthError::BadProof));
    let impostor = Opener::with_nonce(&other_key, claimed, target, link, hello_nonce)
        .speaking(hello[auth::HELLO - 1] == 1);
    assert_eq!(impostor.finish(&reply), Err(AuthError::BadProof));
}
