//! How a line a rank printed is shown: prefixed with `[rank R] `, as every line of the job.
//!
//! nuvec-distributed's log (`NUVEC_DISTRIBUTED_LOG`) starts its lines with `[ring] [rank R] `
//! so that they say which rank wrote them under `mlx.launch`, which prefixes nothing; here that
//! rank is already in the launcher's prefix, so the line's own `[rank R] ` is dropped rather
//! than shown twice (`[rank 2] [ring] [rank 2] …`).

/// The log tag of nuvec-distributed's lines (and MLX's ring's).
const LOG_TAG: &[u8] = b"[ring] ";

/// The line `line` of rank `rank` as printed: `[rank R] ` and the line, ending in a newline;
/// a log line's own `[rank R] ` after its `[ring] ` tag, for this same rank, is dropped.
pub(crate) fn prefixed(rank: usize, line: &[u8]) -> Vec<u8> {
    let prefix = format!("[rank {rank}] ");
    let line = match line
        .strip_prefix(LOG_TAG)
        .and_then(|rest| rest.strip_prefix(prefix.as_bytes()))
    {
        Some(message) => [LOG_TAG, message].concat(),
        None => line.to_vec(),
    };
    let mut text = Vec::with_capacity(prefix.len() + line.len() + 1);
    text.extend_from_slice(prefix.as_bytes());
    text.extend_from_slice(&line);
    if !line.ends_with(b"\n") {
        text.push(b'\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_gets_its_rank_and_one_newline() {
        assert_eq!(prefixed(3, b"hello"), b"[rank 3] hello\n");
        assert_eq!(prefixed(0, b"done\n"), b"[rank 0] done\n");
    }

    #[test]
    fn a_library_log_line_that_names_its_rank_is_not_given_the_rank_twice() {
        // nuvec-distributed's log (NUVEC_DISTRIBUTED_LOG) starts its lines `[ring] [rank R] `,
        // so that they are attributed under mlx.launch, which prefixes nothing.
        assert_eq!(
            prefixed(
                2,
                b"[ring] [rank 2] distributed: rank 2: all_sum #3: timed out\n"
            ),
            b"[rank 2] [ring] distributed: rank 2: all_sum #3: timed out\n"
        );
        // Another rank's number is kept: it is not this rank's prefix.
        assert_eq!(
            prefixed(2, b"[ring] [rank 3] x"),
            b"[rank 2] [ring] [rank 3] x\n"
        );
    }
}
