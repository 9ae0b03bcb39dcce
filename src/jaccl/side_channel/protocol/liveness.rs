//! The side channel after bring-up, without I/O: who watches whom, and what one look at a
//! connection means.
//!
//! Once the queue pairs are connected, nothing more is sent on the side channel, by MLX or by
//! this crate; its connections stay open for the life of the group. Rank 0 watches every
//! other rank's connection and every other rank watches its one connection to rank 0, as MLX's
//! PR #4530 does. A look ([`Look`]) reads nothing and writes nothing: the driver peeks at one
//! byte without taking it and reads the socket's pending error. End of stream, a reset or a
//! socket error means the process at the other end is gone (the kernel closes a killed
//! process's sockets); nothing pending, or a byte, means it is there (a byte is left where
//! it is: nobody sends one).
//!
//! A rank whose group fails closes its side-channel connections, which sends no byte, only
//! TCP's end of stream. Rank 0 that finds a rank gone therefore tells every other rank in one
//! more hop (they see rank 0 close), and a rank whose operation failed on its own tells rank 0,
//! which tells the others: a death reaches every rank in two hops. A rank that sees rank 0
//! close cannot tell whether rank 0 died or is passing a death on ([`Gone::itself`] is false
//! then). A stopped (SIGSTOP) rank keeps its sockets open and is not found: its peers fail at
//! their deadline.

use crate::fabric::Gone;

/// The ranks that `rank` of `size` watches: every other rank for rank 0, rank 0 for the others.
pub fn watched(rank: usize, size: usize) -> Vec<usize> {
    match (rank, size) {
        (_, 0 | 1) => Vec::new(),
        (0, _) => (1..size).collect(),
        _ => vec![0],
    }
}

/// What one look at a side-channel connection saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Look {
    /// Nothing to read: the peer is there.
    Nothing,
    /// At least one byte is waiting (left unread): the peer is there.
    Bytes,
    /// End of stream: the peer closed its end.
    Closed,
    /// The socket reported an error (a reset, say).
    Failed(String),
}

/// What `rank` concludes from one look at each watched connection, `(peer, look)`: `None`
/// while every peer is there, else who is gone (every closed peer is named; the first is the
/// one [`Gone::peer`] gives).
pub fn verdict(rank: usize, looks: &[(usize, Look)]) -> Option<Gone> {
    let gone: Vec<(usize, String)> = looks
        .iter()
        .filter_map(|(peer, look)| match look {
            Look::Nothing | Look::Bytes => None,
            Look::Closed => Some((*peer, "closed".to_owned())),
            Look::Failed(e) => Some((*peer, format!("failed ({e})"))),
        })
        .collect();
    let (peer, why) = gone.first().cloned()?;
    Some(if rank != 0 {
        Gone {
            peer,
            itself: false,
            what: format!(
                "rank {peer} is gone, or saw another rank go: its side-channel connection {why}"
            ),
        }
    } else if gone.len() == 1 {
        Gone {
            peer,
            itself: true,
            what: format!(
                "rank {peer} is gone: its side-channel connection to rank 0 {why} (it died, \
                 exited, or its group failed)"
            ),
        }
    } else {
        let ranks: Vec<String> = gone.iter().map(|(p, _)| p.to_string()).collect();
        Gone {
            peer,
            itself: true,
            what: format!(
                "ranks {} are gone: their side-channel connections to rank 0 closed (each \
                 died, exited, or its group failed)",
                ranks.join(", ")
            ),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_zero_watches_every_rank_and_the_others_watch_rank_zero() {
        assert_eq!(watched(0, 4), vec![1, 2, 3]);
        assert_eq!(watched(2, 4), vec![0]);
        assert_eq!(watched(0, 1), Vec::<usize>::new());
        assert_eq!(watched(1, 2), vec![0]);
    }

    #[test]
    fn only_an_end_of_stream_or_an_error_means_gone() {
        assert_eq!(verdict(0, &[(1, Look::Nothing), (3, Look::Bytes)]), None);
        let g = verdict(0, &[(1, Look::Nothing), (3, Look::Closed)]).unwrap();
        assert!(
            g.itself && g.peer == 3 && g.what.starts_with("rank 3 is gone"),
            "{g:?}"
        );
        let g = verdict(2, &[(0, Look::Failed("reset".into()))]).unwrap();
        assert!(!g.itself && g.peer == 0, "{g:?}");
        assert!(
            g.what.contains("rank 0") && g.what.contains("reset"),
            "{g:?}"
        );
    }

    #[test]
    fn rank_zero_names_every_closed_rank() {
        let looks = [(1, Look::Closed), (2, Look::Nothing), (3, Look::Closed)];
        let g = verdict(0, &looks).unwrap();
        assert_eq!(g.peer, 1);
        assert!(g.what.starts_with("ranks 1, 3 are gone"), "{g:?}");
    }
}
