//! MLX's JACCL `Destination` record (reference §3.3): the 32 bytes a rank sends for each of its
//! queue pairs, and [`RingDestinations`], the ring's pairing of them.
//!
//! Pure: no I/O, no clock, no allocation beyond the decoded records. It may use only
//! [`Error`]. Invariants: [`Destination::encode`] writes MLX's arm64
//! layout with zero padding; decoding ignores the padding, so `decode(encode(d)) == d`; nothing
//! here panics on bytes from a peer.

use crate::config::ConfigError;
use crate::error::Error;

/// The details another rank needs to connect a queue pair to one of this rank's, as MLX's
/// `Destination`: 32 bytes on the wire (see [`encode`](Destination::encode)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Destination {
    /// The port's LID (`ibv_query_port`); MLX sends −1 for a rank's own placeholder entry.
    pub local_id: i32,
    /// The queue pair number.
    pub queue_pair_number: i32,
    /// The packet sequence number the queue pair starts at (MLX: always 7).
    pub packet_sequence_number: i32,
    /// The GID (`ibv_gid`, 16 raw bytes; MLX advertises the first IPv4-mapped one).
    pub global_identifier: [u8; 16],
}

impl Destination {
    /// The size of the encoding: MLX's `sizeof(Destination)` with an 8-byte aligned `ibv_gid`.
    pub const BYTES: usize = 32;

    /// MLX's native layout on arm64: `local_id`, `queue_pair_number`, `packet_sequence_number`
    /// as little-endian `i32`s (bytes 0–11), 4 padding bytes (12–15, zero here), then the 16
    /// GID bytes (16–31).
    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[0..4].copy_from_slice(&self.local_id.to_le_bytes());
        out[4..8].copy_from_slice(&self.queue_pair_number.to_le_bytes());
        out[8..12].copy_from_slice(&self.packet_sequence_number.to_le_bytes());
        out[16..32].copy_from_slice(&self.global_identifier);
        out
    }

    /// Decodes [`encode`](Destination::encode)'s layout; the padding bytes 12–15 are ignored
    /// (MLX sends whatever its stack held there).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when `bytes` is not exactly [`BYTES`](Destination::BYTES) long.
    pub fn decode(bytes: &[u8]) -> Result<Destination, Error> {
        let Ok(bytes) = <&[u8; Self::BYTES]>::try_from(bytes) else {
            return Err(Error::Config(
                ConfigError::RecordLength {
                    expected: Self::BYTES,
                    got: bytes.len(),
                }
                .jaccl(),
            ));
        };
        Ok(Destination::from_record(bytes))
    }

    /// Decodes one record of exactly [`BYTES`](Destination::BYTES) bytes.
    fn from_record(bytes: &[u8; Self::BYTES]) -> Destination {
        let i32_at = |at: usize| {
            i32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut global_identifier = [0u8; 16];
        global_identifier.copy_from_slice(&bytes[16..32]);
        Destination {
            local_id: i32_at(0),
            queue_pair_number: i32_at(4),
            packet_sequence_number: i32_at(8),
            global_identifier,
        }
    }

    /// Decodes back to back records; trailing bytes short of a record are ignored (callers
    /// pass whole blocks of records).
    pub(crate) fn decode_all(mut bytes: &[u8]) -> Vec<Destination> {
        let mut out = Vec::with_capacity(bytes.len() / Self::BYTES);
        while let Some((record, rest)) = bytes.split_first_chunk::<{ Self::BYTES }>() {
            out.push(Destination::from_record(record));
            bytes = rest;
        }
        out
    }
}

/// Every rank's ring [`Destination`]s, from
/// [`SideChannel::exchange_ring`](super::SideChannel::exchange_ring): `left[r]` are rank r's QPs
/// towards its left neighbour (one per wire), `right[r]` towards its right one.
///
/// As in MLX, wire w of my left QPs pairs with wire w of my left neighbour's right QPs, and my
/// right QPs with my right neighbour's left QPs ([`remote_for_left`](Self::remote_for_left),
/// [`remote_for_right`](Self::remote_for_right)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingDestinations {
    /// Per rank, its left QPs' details.
    pub left: Vec<Vec<Destination>>,
    /// Per rank, its right QPs' details.
    pub right: Vec<Vec<Destination>>,
}

impl RingDestinations {
    /// The remote ends of `rank`'s left QPs: its left neighbour's right QPs.
    ///
    /// # Panics
    ///
    /// When `rank` is not below the number of ranks.
    pub fn remote_for_left(&self, rank: usize) -> &[Destination] {
        let size = self.right.len();
        assert!(rank < size, "rank {rank} of {size}");
        &self.right[(rank + size - 1) % size]
    }

    /// The remote ends of `rank`'s right QPs: its right neighbour's left QPs.
    ///
    /// # Panics
    ///
    /// When `rank` is not below the number of ranks.
    pub fn remote_for_right(&self, rank: usize) -> &[Destination] {
        let size = self.left.len();
        assert!(rank < size, "rank {rank} of {size}");
        &self.left[(rank + 1) % size]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seed: u8) -> Destination {
        Destination {
            local_id: -1 - i32::from(seed),
            queue_pair_number: 0x0102_0304 + i32::from(seed),
            packet_sequence_number: 7,
            global_identifier: std::array::from_fn(|i| seed.wrapping_mul(31).wrapping_add(i as u8)),
        }
    }

    #[test]
    fn a_destination_encodes_as_mlx_native_layout_with_zero_padding() {
        let d = Destination {
            local_id: 1,
            queue_pair_number: 0x0a0b_0c0d,
            packet_sequence_number: 7,
            global_identifier: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 2],
        };
        let expected: [u8; 32] = [
            1, 0, 0, 0, 0x0d, 0x0c, 0x0b, 0x0a, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0xff, 0xff, 192, 168, 1, 2,
        ];
        assert_eq!(d.encode(), expected);
        assert_eq!(Destination::BYTES, 32);
    }

    #[test]
    fn a_negative_local_id_is_twos_complement_little_endian() {
        let d = Destination {
            local_id: -1,
            ..Destination::default()
        };
        assert_eq!(d.encode()[..4], [0xff; 4]);
    }

    #[test]
    fn decoding_an_encoding_gives_back_the_destination() {
        for seed in [0, 1, 77, 255] {
            let d = sample(seed);
            assert_eq!(Destination::decode(&d.encode()).unwrap(), d);
        }
    }

    #[test]
    fn decoding_ignores_the_padding_bytes() {
        let d = sample(9);
        let mut bytes = d.encode();
        bytes[12..16].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(Destination::decode(&bytes).unwrap(), d);
    }

    #[test]
    fn decoding_back_to_back_records_gives_each_one() {
        let (a, b) = (sample(1), sample(2));
        let mut bytes: Vec<u8> = [a, b].iter().flat_map(Destination::encode).collect();
        assert_eq!(Destination::decode_all(&bytes), vec![a, b]);
        bytes.push(0);
        assert_eq!(Destination::decode_all(&bytes), vec![a, b]);
        assert!(Destination::decode_all(&[]).is_empty());
    }

    #[test]
    fn decoding_anything_but_32_bytes_is_an_error_naming_the_length() {
        for len in [0, 31, 33, 64] {
            let e = Destination::decode(&vec![0; len]).unwrap_err();
            let m = e.to_string();
            assert!(
                m.contains("exactly 32 bytes") && m.contains(&format!("got {len}")),
                "{m}"
            );
        }
    }

    #[test]
    fn ring_destinations_pair_each_side_with_the_neighbours_other_side() {
        let d = |r: u8, side: u8| sample(r * 10 + side);
        let ring = RingDestinations {
            left: (0..3).map(|r| vec![d(r, 0)]).collect(),
            right: (0..3).map(|r| vec![d(r, 1)]).collect(),
        };
        // Rank 0's left neighbour is rank 2; its right neighbour is rank 1.
        assert_eq!(ring.remote_for_left(0), &[d(2, 1)]);
        assert_eq!(ring.remote_for_right(0), &[d(1, 0)]);
        assert_eq!(ring.remote_for_left(1), &[d(0, 1)]);
        assert_eq!(ring.remote_for_right(2), &[d(0, 0)]);
    }
}
