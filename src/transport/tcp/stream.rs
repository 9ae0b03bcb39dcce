//! Reassembly of a stream receive: bytes arrive in pieces of any size, and are handed on in
//! pieces that are whole elements.
//!
//! A TCP socket returns whatever the kernel has, so a read may end in the middle of an
//! element; a reduction must never see half an element. [`Reassembly`] keeps the tail of a
//! partial element at the front of a scratch buffer until the rest arrives, and never lets a
//! read go past the end of the receive (the next bytes belong to the next operation). It does
//! no I/O, so it is fuzzed with scripted fragment boundaries.

/// The state of one receive of `len` bytes delivered in multiples of `grain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reassembly {
    len: usize,
    grain: usize,
    done: usize,
    pending: usize,
}

impl Reassembly {
    /// A receive of `len` bytes (a multiple of `grain`) in pieces of whole `grain`s.
    pub fn new(len: usize, grain: usize) -> Self {
        Self {
            len,
            grain: grain.max(1),
            done: 0,
            pending: 0,
        }
    }

    /// Bytes delivered so far.
    pub fn done(&self) -> usize {
        self.done
    }

    /// Whether every byte has been delivered.
    pub fn is_complete(&self) -> bool {
        self.done >= self.len
    }

    /// Where the next read goes in a scratch buffer of `scratch_len` bytes: the range after the
    /// pending partial element, no longer than what is left of the receive.
    pub fn next_read(&self, scratch_len: usize) -> std::ops::Range<usize> {
        let room = scratch_len
            .saturating_sub(self.pending)
            .min(self.len - self.done - self.pending);
        self.pending..self.pending + room
    }

    /// Delivers whole elements straight from `bytes`, the next bytes of the stream, when no
    /// partial element is pending (a source that can lend its bytes in place, as a local
    /// link's queue, needs no scratch): at most what is left of the receive, whole elements
    /// only. Returns how many bytes it took; the rest (a partial element, or everything while
    /// one is pending) goes through [`absorb`](Self::absorb).
    pub fn absorb_in_place(
        &mut self,
        bytes: &[u8],
        mut deliver: impl FnMut(usize, &[u8]),
    ) -> usize {
        if self.pending != 0 {
            return 0;
        }
        let n = bytes.len().min(self.len - self.done);
        let whole = n - n % self.grain;
        if whole > 0 {
            deliver(self.done, &bytes[..whole]);
            self.done += whole;
        }
        whole
    }

    /// Takes `read` bytes just written into `scratch` at [`next_read`](Self::next_read): hands
    /// every whole element to `deliver(offset, bytes)` and keeps the partial tail at the front
    /// of `scratch`.
    ///
    /// # Panics
    /// If `read` is more than the range [`next_read`](Self::next_read) offered.
    pub fn absorb(
        &mut self,
        scratch: &mut [u8],
        read: usize,
        mut deliver: impl FnMut(usize, &[u8]),
    ) {
        assert!(
            read <= self.next_read(scratch.len()).len(),
            "stream: read past the offered range"
        );
        let have = self.pending + read;
        let whole = have - have % self.grain;
        if whole > 0 {
            deliver(self.done, &scratch[..whole]);
            self.done += whole;
        }
        scratch.copy_within(whole..have, 0);
        self.pending = have - whole;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_element_waits_for_its_rest() {
        let stream: Vec<u8> = (0..12).collect();
        let mut r = Reassembly::new(12, 4);
        let mut scratch = [0u8; 8];
        let mut got = Vec::new();
        for piece in [3usize, 2, 7] {
            let at = r.next_read(scratch.len());
            let n = piece.min(at.len());
            let from = r.done() + at.start;
            scratch[at.start..at.start + n].copy_from_slice(&stream[from..from + n]);
            r.absorb(&mut scratch, n, |off, b| {
                assert_eq!(b.len() % 4, 0);
                got.push((off, b.to_vec()));
            });
        }
        assert!(r.is_complete());
        let joined: Vec<u8> = got.iter().flat_map(|(_, b)| b.clone()).collect();
        assert_eq!(joined, stream);
        assert_eq!(got[0].0, 0);
    }

    #[test]
    fn bytes_lent_in_place_are_delivered_whole_and_a_partial_tail_is_left_for_the_scratch() {
        let stream: Vec<u8> = (0..12).collect();
        let mut r = Reassembly::new(12, 4);
        let mut got = Vec::new();
        let took = r.absorb_in_place(&stream[..6], |off, b| got.push((off, b.to_vec())));
        assert_eq!(took, 4, "one whole element of the six bytes");
        // The partial element goes through the scratch; while it is pending nothing is lent.
        let mut scratch = [0u8; 8];
        let at = r.next_read(scratch.len());
        scratch[at.start..at.start + 2].copy_from_slice(&stream[4..6]);
        r.absorb(&mut scratch, 2, |off, b| got.push((off, b.to_vec())));
        assert_eq!(
            r.absorb_in_place(&stream[6..], |_, _| panic!("lent while pending")),
            0
        );
        let at = r.next_read(scratch.len());
        scratch[at.start..at.start + 2].copy_from_slice(&stream[6..8]);
        r.absorb(&mut scratch, 2, |off, b| got.push((off, b.to_vec())));
        assert_eq!(
            r.absorb_in_place(&stream[8..], |off, b| got.push((off, b.to_vec()))),
            4
        );
        assert!(r.is_complete());
        let joined: Vec<u8> = got.iter().flat_map(|(_, b)| b.clone()).collect();
        assert_eq!(joined, stream);
        assert_eq!(r.absorb_in_place(&[9; 4], |_, _| panic!("past the end")), 0);
    }

    #[test]
    fn a_read_never_passes_the_end_of_the_receive() {
        let r = Reassembly::new(10, 2);
        assert_eq!(r.next_read(64), 0..10);
    }
}
