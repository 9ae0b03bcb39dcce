//! The shared readers of fuzzer inputs: [`Script`] (small numbers, then zeros once the input
//! runs out) and [`text`] (the input as text).
//!
//! Pure; uses only `std`. Invariant: reading never fails, so every input is a valid script.

/// The input as text: itself when it is UTF-8, else with invalid bytes replaced (so binary
/// inputs still reach the parser).
pub(super) fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// Reads a fuzzer input as a script of small numbers, then zeros once it runs out.
pub(super) struct Script<'a>(pub(super) &'a [u8]);

impl Script<'_> {
    pub(super) fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    pub(super) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    pub(super) fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }

    pub(super) fn array<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.byte())
    }
}
