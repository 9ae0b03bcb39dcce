//! Target `stream_reassembly`: `stream::Reassembly` driven as the TCP fabric drives it, with
//! scripted read sizes.

use nuvec_distributed::internals::stream::Reassembly;

use super::script::Script;

/// The byte at `i` of a scripted stream: no short period, so a piece delivered at the wrong
/// offset shows.
fn stream_byte(i: usize) -> u8 {
    let x = (i as u32).wrapping_mul(0x9E37_79B9) ^ (i as u32 >> 7);
    (x >> 24) as u8
}

/// Drives [`Reassembly`] as the TCP fabric does (`src/transport/tcp/mod.rs`, `advance`): each read goes
/// into the range [`Reassembly::next_read`] offers and is at most what the scripted socket
/// returns. The script: grain `1 + b % 16`; length `grain × (u16 % 1024)`; scratch size `b % 80`
/// (it may be smaller than a grain); then one read size per byte, where 0 is a read that
/// found nothing (`absorb(0)` must be harmless); once the script ends, the socket returns all
/// it is offered.
///
/// Properties: no offered range goes past the scratch buffer or the end of the receive; the
/// pending tail is less than a grain; the pieces are contiguous from offset 0, non-empty
/// multiples of the grain, and together equal the stream; the receive completes. With a
/// scratch buffer of at least one grain, an incomplete receive always offers room (the TCP
/// fabric takes an empty read for a closed peer); with a smaller one it may stall, but only
/// without delivering anything wrong.
pub(crate) fn stream_reassembly(data: &[u8]) {
    let mut script = Script(data);
    let grain = 1 + usize::from(script.byte() % 16);
    let len = grain * usize::from(script.u16() % 1024);
    let scratch_len = usize::from(script.byte() % 80);
    let stream: Vec<u8> = (0..len).map(stream_byte).collect();
    let mut scratch = vec![0xAAu8; scratch_len];
    let mut r = Reassembly::new(len, grain);
    let mut delivered: Vec<u8> = Vec::with_capacity(len);
    // Every read after the script ends takes at least one byte, so this bounds the loop.
    while !r.is_complete() {
        let at = r.next_read(scratch_len);
        assert!(
            at.end <= scratch_len,
            "offered {at:?} past a scratch of {scratch_len}"
        );
        assert!(
            at.start < grain,
            "a pending tail of {} ≥ grain {grain}",
            at.start
        );
        let base = r.done();
        assert!(
            base + at.end <= len,
            "offered stream bytes {}..{} past the end {len}",
            base + at.start,
            base + at.end
        );
        if at.is_empty() {
            assert!(
                scratch_len < grain,
                "an incomplete receive (done {base} of {len}, grain {grain}, scratch \
                 {scratch_len}) offers no room: the TCP fabric would read 0 bytes and report \
                 a closed peer"
            );
            return;
        }
        let want = if script.is_empty() {
            at.len()
        } else {
            usize::from(script.byte())
        };
        let n = want.min(at.len());
        let from = base + at.start;
        scratch[at.start..at.start + n].copy_from_slice(&stream[from..from + n]);
        let before = r.done();
        r.absorb(&mut scratch, n, |offset, bytes| {
            assert_eq!(offset, delivered.len(), "a piece not contiguous");
            assert!(!bytes.is_empty(), "an empty piece at {offset}");
            assert_eq!(
                bytes.len() % grain,
                0,
                "a piece of {} bytes, grain {grain}",
                bytes.len()
            );
            assert!(offset + bytes.len() <= len, "a piece past the end");
            assert_eq!(
                bytes,
                &stream[offset..offset + bytes.len()],
                "wrong bytes at {offset}"
            );
            delivered.extend_from_slice(bytes);
        });
        assert_eq!(
            r.done(),
            delivered.len(),
            "done() disagrees with the pieces"
        );
        assert!(r.done() >= before, "done() went backwards");
    }
    assert_eq!(r.done(), len);
    assert_eq!(delivered, stream, "the pieces do not make the stream");
    assert!(
        r.next_read(scratch_len).is_empty(),
        "a complete receive offers more room"
    );
}
