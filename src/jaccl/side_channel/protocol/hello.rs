//! The rank hello of MLX's side channel without I/O: what a rank other than 0 sends first, and
//! rank 0's reading and admission of it.
//!
//! Pure: no socket, no clock. Invariants: a [`HelloReader`] never takes a byte past the 4 of
//! the hello (what follows belongs to the first all-gather); a [`Roster`] admits each rank 1 to
//! R − 1 once and refuses any other claim with a message naming the connection.

/// The 4-byte hello a rank other than 0 sends first: its rank as a little-endian `i32`.
///
/// # Errors
///
/// The message when `rank` does not fit an `i32`.
pub fn hello(rank: usize) -> Result<[u8; 4], String> {
    i32::try_from(rank)
        .map(i32::to_le_bytes)
        .map_err(|_| format!("rank {rank} does not fit MLX's i32 hello"))
}

/// Rank 0's reading of one connection's hello: never more than its 4 bytes, as what follows
/// belongs to the first all-gather.
#[derive(Clone, Debug, Default)]
pub struct HelloReader {
    bytes: [u8; 4],
    got: usize,
}

impl HelloReader {
    /// How many hello bytes are still to come.
    pub fn wants(&self) -> usize {
        4 - self.got
    }

    /// How many hello bytes have come.
    pub fn got(&self) -> usize {
        self.got
    }

    /// Takes the front of `bytes` up to the end of the hello; how many it took.
    pub fn on_received(&mut self, bytes: &[u8]) -> usize {
        let k = bytes.len().min(self.wants());
        self.bytes[self.got..self.got + k].copy_from_slice(&bytes[..k]);
        self.got += k;
        k
    }

    /// The hello's bytes, once all 4 have come.
    pub fn hello(&self) -> Option<[u8; 4]> {
        (self.got == 4).then_some(self.bytes)
    }
}

/// Rank 0's record of which ranks have said hello, and from where.
#[derive(Clone, Debug)]
pub struct Roster {
    /// Rank k's peer at index k − 1.
    peers: Vec<Option<String>>,
}

impl Roster {
    /// No rank of `size` but rank 0 has said hello yet.
    pub fn new(size: usize) -> Roster {
        Roster {
            peers: vec![None; size.saturating_sub(1)],
        }
    }

    /// Admits the connection from `peer` that sent `hello`: the rank it is.
    ///
    /// # Errors
    ///
    /// The message when the rank is out of range (the others are 1 to R − 1) or has already
    /// said hello (naming both connections, and `coordinator`).
    pub fn admit(
        &mut self,
        hello: [u8; 4],
        peer: &str,
        coordinator: &str,
    ) -> Result<usize, String> {
        let size = self.peers.len() + 1;
        let claimed = i32::from_le_bytes(hello);
        let Some(r) = usize::try_from(claimed)
            .ok()
            .filter(|r| (1..size).contains(r))
        else {
            return Err(format!(
                "the connection from {peer} said it is rank {claimed} (bytes {hello:02x?}), \
                 but the other ranks of a group of {size} are 1 to {}",
                size - 1
            ));
        };
        let slot = &mut self.peers[r - 1];
        if let Some(first) = slot {
            return Err(format!(
                "rank {r} connected twice to the coordinator {coordinator}, from {first} and \
                 from {peer}; is another job using the same coordinator?"
            ));
        }
        *slot = Some(peer.to_owned());
        Ok(r)
    }

    /// Whether every rank but 0 has said hello.
    pub fn is_complete(&self) -> bool {
        self.peers.iter().all(Option::is_some)
    }

    /// The ranks that have not said hello, in order.
    pub fn missing(&self) -> Vec<usize> {
        (1..=self.peers.len())
            .filter(|r| self.peers[r - 1].is_none())
            .collect()
    }
}
