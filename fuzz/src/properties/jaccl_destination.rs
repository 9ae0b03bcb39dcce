//! Target `jaccl_destination`: MLX's 32-byte `Destination` record decoded and encoded; also
//! [`destination`], shared with `jaccl_side_channel`.

use nuvec_distributed::jaccl::Destination;

use super::jaccl_devices::config_message;
use super::script::Script;

/// A [`Destination`] from 28 script bytes (three `i32`s and a GID).
pub(super) fn destination(s: &mut Script<'_>) -> Destination {
    Destination {
        local_id: s.u32() as i32,
        queue_pair_number: s.u32() as i32,
        packet_sequence_number: s.u32() as i32,
        global_identifier: s.array(),
    }
}

/// MLX's 32-byte `Destination` record: `Destination::decode` never panics, accepts exactly
/// the 32-byte inputs (anything else is a `jaccl:` configuration error giving both lengths),
/// reads the three little-endian `i32`s at 0, 4 and 8 and the GID at 16, and ignores the
/// padding 12–15; `encode` of a decoded record is the input with zero padding, and
/// `decode(encode(d)) == d` for the record made of the input's first 28 bytes, with any
/// padding bytes. The same holds for every 32-byte chunk of the input (a gathered block of
/// records) and every shorter or longer slice is refused.
pub(crate) fn jaccl_destination(data: &[u8]) {
    let check = |bytes: &[u8]| match Destination::decode(bytes) {
        Ok(d) => {
            assert_eq!(bytes.len(), Destination::BYTES, "decoded {bytes:02x?}");
            let le = |at: usize| i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            assert_eq!(d.local_id, le(0));
            assert_eq!(d.queue_pair_number, le(4));
            assert_eq!(d.packet_sequence_number, le(8));
            assert_eq!(d.global_identifier[..], bytes[16..32]);
            let e = d.encode();
            assert_eq!(e[..12], bytes[..12], "encode keeps the fields");
            assert_eq!(e[12..16], [0; 4], "encode pads with zeros");
            assert_eq!(e[16..], bytes[16..], "encode keeps the GID");
            assert_eq!(Destination::decode(&e).ok(), Some(d));
        }
        Err(e) => {
            assert_ne!(bytes.len(), Destination::BYTES, "refused 32 bytes: {e}");
            let message = config_message(Err::<(), _>(e), "decode");
            assert!(
                message.contains("32") && message.contains(&bytes.len().to_string()),
                "{message}"
            );
        }
    };
    check(data);
    for chunk in data.chunks(Destination::BYTES) {
        check(chunk);
    }
    if data.len() > Destination::BYTES {
        check(&data[..Destination::BYTES - 1]);
        check(&data[..Destination::BYTES + 1]);
    }

    let mut s = Script(data);
    let d = destination(&mut s);
    let mut e = d.encode();
    assert_eq!(e[12..16], [0; 4]);
    assert_eq!(Destination::decode(&e).ok(), Some(d), "round trip of {d:?}");
    e[12..16].copy_from_slice(&s.array::<4>());
    assert_eq!(
        Destination::decode(&e).ok(),
        Some(d),
        "the padding {:02x?} changed {d:?}",
        &e[12..16]
    );
    assert_eq!(Destination::default().encode(), [0; Destination::BYTES]);
}
