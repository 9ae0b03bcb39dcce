//! One all-gather of the side channel without I/O: the messages of one rank in MLX's order.
//!
//! Pure: no socket, no clock. Invariants: rank 0 reads the blocks of ranks 1, 2, … in turn and
//! then sends the R·n gathered bytes to ranks 1, 2, …; any other rank sends its n bytes and then
//! reads the R·n; [`Gather::settle`] skips every finished or empty message, so a gather is never
//! left waiting on zero bytes; `out` is R·n bytes long from the start.

/// Where one all-gather stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// Rank 0 reads rank `peer`'s block.
    ReadBlock { peer: usize, done: usize },
    /// Rank 0 sends the gathered blocks to rank `peer`.
    SendAll { peer: usize, done: usize },
    /// Another rank sends its block to rank 0.
    SendMine { done: usize },
    /// Another rank reads the gathered blocks from rank 0.
    ReadAll { done: usize },
    /// Every byte has moved.
    Complete,
}

/// One all-gather of n bytes per rank.
#[derive(Debug)]
pub(super) struct Gather {
    pub(super) seq: u64,
    pub(super) n: usize,
    /// This rank's block (another rank's, to check rank 0's echo).
    pub(super) mine: Vec<u8>,
    /// The R·n gathered bytes.
    pub(super) out: Vec<u8>,
    pub(super) stage: Stage,
}

impl Gather {
    /// Rank `rank` of `size` starts all-gather `seq` of `mine` (`n · size` checked by the
    /// caller).
    pub(super) fn new(rank: usize, size: usize, seq: u64, mine: Vec<u8>, total: usize) -> Gather {
        let n = mine.len();
        let mut out = vec![0u8; total];
        let stage = if size == 1 {
            out.copy_from_slice(&mine);
            Stage::Complete
        } else if rank == 0 {
            out[..n].copy_from_slice(&mine);
            Stage::ReadBlock { peer: 1, done: 0 }
        } else {
            Stage::SendMine { done: 0 }
        };
        let mut g = Gather {
            seq,
            n,
            mine,
            out,
            stage,
        };
        g.settle(size);
        g
    }

    /// The length of the current message.
    pub(super) fn len(&self) -> usize {
        match self.stage {
            Stage::ReadBlock { .. } | Stage::SendMine { .. } => self.n,
            Stage::SendAll { .. } | Stage::ReadAll { .. } => self.out.len(),
            Stage::Complete => 0,
        }
    }

    /// Moves past finished (and empty) messages.
    pub(super) fn settle(&mut self, size: usize) {
        loop {
            let len = self.len();
            self.stage = match self.stage {
                Stage::ReadBlock { peer, done } if done == len => {
                    if peer + 1 < size {
                        Stage::ReadBlock {
                            peer: peer + 1,
                            done: 0,
                        }
                    } else {
                        Stage::SendAll { peer: 1, done: 0 }
                    }
                }
                Stage::SendAll { peer, done } if done == len => {
                    if peer + 1 < size {
                        Stage::SendAll {
                            peer: peer + 1,
                            done: 0,
                        }
                    } else {
                        Stage::Complete
                    }
                }
                Stage::SendMine { done } if done == len => Stage::ReadAll { done: 0 },
                Stage::ReadAll { done } if done == len => Stage::Complete,
                _ => return,
            };
        }
    }

    /// The current message's peer, what it is, and the bytes moved of it.
    pub(super) fn doing(&self) -> (String, usize) {
        match self.stage {
            Stage::ReadBlock { peer, done } => (format!("reading rank {peer}'s block"), done),
            Stage::SendAll { peer, done } => {
                (format!("sending the gathered blocks to rank {peer}"), done)
            }
            Stage::SendMine { done } => ("sending this rank's block to rank 0".to_owned(), done),
            Stage::ReadAll { done } => ("reading the gathered blocks from rank 0".to_owned(), done),
            Stage::Complete => ("finishing".to_owned(), 0),
        }
    }
}
