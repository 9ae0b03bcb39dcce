//! The provider's data path through its exported functions: a 512 KiB round trip between two
//! devices, UC's silent drop without a posted receive, LOC_LEN_ERR at the receiver,
//! registration checks (LOC_PROT_ERR, then flushing), posting in the wrong state, the work
//! request limit, completion queue overrun, and the faults of the environment (loss, a failing
//! work request, a process that dies after its n-th message, across processes).
#![cfg(target_os = "linux")]

mod common;

use common::*;
use nuvec_verbs_abi::*;
use rand::{RngExt, SeedableRng};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::Duration;

/// How long a test watches for something that must not come.
const QUIET: Duration = Duration::from_millis(200);

/// A recognisable byte at position `i` of message `seed`.
fn pattern(seed: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed)
}

#[test]
fn a_512_kib_message_round_trips_between_two_devices() {
    isolated(
        "a_512_kib_message_round_trips_between_two_devices",
        &[],
        || {
            let (mut a, mut b) = pair("rdma_en0", "rdma_en1", 2);
            assert_eq!(a.post_recv(10, a.sge(FRAME, FRAME)), 0);
            assert_eq!(b.post_recv(20, b.sge(FRAME, FRAME)), 0);
            for (i, byte) in a.buf[..FRAME].iter_mut().enumerate() {
                *byte = pattern(1, i);
            }
            assert_eq!(a.post_send(11, a.sge(0, FRAME)), 0);
            let at_b = b.poll(1).unwrap();
            assert_eq!(at_b.len(), 1);
            let wc = at_b[0];
            assert_eq!(
                (wc.status, wc.opcode, wc.wr_id),
                (IBV_WC_SUCCESS, IBV_WC_RECV, 20)
            );
            assert_eq!((wc.byte_len as usize, wc.qp_num), (FRAME, b.qpn()));
            let (sent, echoed) = b.buf.split_at_mut(FRAME);
            sent.copy_from_slice(echoed);
            assert_eq!(b.post_send(21, b.sge(0, FRAME)), 0);
            let at_a = a.poll(2).unwrap();
            let statuses: Vec<_> = at_a.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect();
            assert_eq!(
                statuses,
                [
                    (11, IBV_WC_SEND, IBV_WC_SUCCESS),
                    (10, IBV_WC_RECV, IBV_WC_SUCCESS)
                ]
            );
            assert_eq!(at_a[1].byte_len as usize, FRAME);
            assert!(
                a.buf[FRAME..]
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| x == pattern(1, i))
            );
            let at_b = b.poll(1).unwrap();
            assert_eq!((at_b[0].wr_id, at_b[0].opcode), (21, IBV_WC_SEND));
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn immediate_data_arrives_flagged_and_rdma_writes_are_einval() {
    isolated(
        "immediate_data_arrives_flagged_and_rdma_writes_are_einval",
        &[],
        || {
            let (a, b) = pair("rdma_en0", "rdma_en1", 1);
            assert_eq!(b.post_recv(1, b.sge(0, 64)), 0);
            assert_eq!(b.post_recv(2, b.sge(0, 64)), 0);
            let imm = 41u32.to_be();
            assert_eq!(a.post_send_op(3, a.sge(0, 8), IBV_WR_SEND_WITH_IMM, imm), 0);
            assert_eq!(a.post_send(4, a.sge(0, 8)), 0);
            let got = b.poll(2).unwrap();
            assert_eq!((got[0].wc_flags, got[0].imm_data), (IBV_WC_WITH_IMM, imm));
            assert_eq!((got[1].wc_flags, got[1].byte_len), (0, 8));
            assert_eq!(
                a.post_send_op(5, a.sge(0, 8), IBV_WR_RDMA_WRITE, 0),
                libc::EINVAL
            );
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn with_no_imm_a_send_with_immediate_data_is_einval() {
    isolated(
        "with_no_imm_a_send_with_immediate_data_is_einval",
        &[("NUVEC_VERBS_EMU_NO_IMM", "1")],
        || {
            let (a, b) = pair("rdma_en0", "rdma_en1", 1);
            let imm = 1u32.to_be();
            assert_eq!(
                a.post_send_op(1, a.sge(0, 8), IBV_WR_SEND_WITH_IMM, imm),
                libc::EINVAL
            );
            assert_eq!(a.post_send(2, a.sge(0, 8)), 0, "a plain send still goes");
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn a_send_with_no_receive_posted_waits_for_one_by_default() {
    isolated(
        "a_send_with_no_receive_posted_waits_for_one_by_default",
        &[],
        || {
            let (mut a, b) = pair("rdma_en0", "rdma_en1", 1);
            for (k, word) in [b"held", b"next"].into_iter().enumerate() {
                a.buf[k * 4..k * 4 + 4].copy_from_slice(word);
                assert_eq!(a.post_send(k as u64 + 1, a.sge(k * 4, 4)), 0);
            }
            assert_eq!(
                a.poll(2).unwrap().len(),
                2,
                "UC has no ack: both sends complete"
            );
            assert!(
                b.poll_nothing(QUIET).is_empty(),
                "nothing lands without a receive"
            );
            // Each receive posted takes the oldest held message, in order.
            assert_eq!(b.post_recv(7, b.sge(0, 64)), 0);
            let got = b.poll(1).unwrap();
            assert_eq!((got[0].wr_id, got[0].byte_len), (7, 4));
            assert_eq!(&b.buf[..4], b"held");
            assert_eq!(b.post_recv(8, b.sge(0, 64)), 0);
            let got = b.poll(1).unwrap();
            assert_eq!((got[0].wr_id, got[0].byte_len), (8, 4));
            assert_eq!(&b.buf[..4], b"next");
            for side in [a, b] {
                side.teardown();
            }
        },
    );
}

#[test]
fn with_unexpected_drop_a_send_with_no_receive_posted_is_dropped_silently() {
    isolated(
        "with_unexpected_drop_a_send_with_no_receive_posted_is_dropped_silently",
        &[("NUVEC_VERBS_EMU_UNEXPECTED", "drop")],
        || {
            // Two pairs between the same two devices share one stream, which keeps order: when
            // the second pair's message has landed, the first pair's has been handled.
            let (mut a, b) = pair("rdma_en0", "rdma_en1", 1);
            let (a2, b2) = pair("rdma_en0", "rdma_en1", 1);
            a.buf[..4].copy_from_slice(b"lost");
            assert_eq!(a.post_send(1, a.sge(0, 4)), 0);
            assert_eq!(b2.post_recv(2, b2.sge(0, 64)), 0);
            assert_eq!(a2.post_send(3, a2.sge(0, 4)), 0);
            assert_eq!(b2.poll(1).unwrap()[0].status, IBV_WC_SUCCESS);
            let sent = a.poll(1).unwrap();
            assert_eq!(
                (sent[0].wr_id, sent[0].status),
                (1, IBV_WC_SUCCESS),
                "UC has no ack"
            );
            assert_eq!(b.post_recv(4, b.sge(0, 64)), 0);
            assert!(
                b.poll_nothing(QUIET).is_empty(),
                "the first message was dropped"
            );
            a.buf[..4].copy_from_slice(b"next");
            assert_eq!(a.post_send(5, a.sge(0, 4)), 0);
            let got = b.poll(1).unwrap();
            assert_eq!((got[0].wr_id, got[0].byte_len), (4, 4));
            assert_eq!(&b.buf[..4], b"next");
            for side in [a, b, a2, b2] {
                side.teardown();
            }
        },
    );
}

#[test]
fn a_message_larger_than_the_posted_receive_is_loc_len_err_at_the_receiver() {
    isolated(
        "a_message_larger_than_the_posted_receive_is_loc_len_err_at_the_receiver",
        &[],
        || {
            let (a, b) = pair("rdma_en2", "rdma_en3", 1);
            assert_eq!(b.post_recv(1, b.sge(0, 1000)), 0);
            assert_eq!(b.post_recv(2, b.sge(0, 1000)), 0);
            assert_eq!(a.post_send(3, a.sge(0, 2000)), 0);
            assert_eq!(a.poll(1).unwrap()[0].status, IBV_WC_SUCCESS);
            let got = b.poll(2).unwrap();
            let statuses: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
            assert_eq!(
                statuses,
                [(1, IBV_WC_LOC_LEN_ERR), (2, IBV_WC_WR_FLUSH_ERR)]
            );
            assert_eq!(b.state(), IBV_QPS_ERR);
            assert_eq!(b.post_recv(4, b.sge(0, 1000)), 0);
            assert_eq!(b.poll(1).unwrap()[0].status, IBV_WC_WR_FLUSH_ERR);
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn a_wrong_lkey_or_an_sge_outside_its_region_is_loc_prot_err_then_flush() {
    isolated(
        "a_wrong_lkey_or_an_sge_outside_its_region_is_loc_prot_err_then_flush",
        &[],
        || {
            let (a, b) = pair("rdma_en0", "rdma_en1", 1);
            let mut wrong_key = a.sge(0, 100);
            wrong_key.lkey ^= 1;
            assert_eq!(a.post_send(1, wrong_key), 0);
            assert_eq!(a.post_send(2, a.sge(0, 100)), 0);
            let got = a.poll(2).unwrap();
            let statuses: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
            assert_eq!(
                statuses,
                [(1, IBV_WC_LOC_PROT_ERR), (2, IBV_WC_WR_FLUSH_ERR)]
            );
            assert_eq!(a.state(), IBV_QPS_ERR);
            // Past the region's end, on a receive: refused when posted, the rest flushed.
            assert_eq!(b.post_recv(3, b.sge(FRAME - 10, 100)), 0);
            assert_eq!(b.post_recv(4, b.sge(0, 100)), 0);
            let got = b.poll(2).unwrap();
            let statuses: Vec<_> = got.iter().map(|w| (w.wr_id, w.status)).collect();
            assert_eq!(
                statuses,
                [(3, IBV_WC_LOC_PROT_ERR), (4, IBV_WC_WR_FLUSH_ERR)]
            );
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn posting_in_the_wrong_state_is_einval() {
    isolated("posting_in_the_wrong_state_is_einval", &[], || {
        let a = Side::new("rdma_en0", 1);
        let b = Side::new("rdma_en1", 1);
        assert_eq!(
            a.post_recv(1, a.sge(0, 64)),
            libc::EINVAL,
            "receive in RESET"
        );
        assert_eq!(a.init(), 0);
        assert_eq!(a.post_send(2, a.sge(0, 64)), libc::EINVAL, "send in INIT");
        assert_eq!(a.post_recv(3, a.sge(0, 64)), 0, "receive in INIT");
        assert_eq!(a.rtr(gid(&b, 1).unwrap(), b.qpn()), 0);
        assert_eq!(a.post_send(4, a.sge(0, 64)), libc::EINVAL, "send in RTR");
        assert_eq!(a.rts(), 0);
        assert_eq!(a.post_send(5, a.sge(0, 64)), 0, "send in RTS");
        a.teardown();
        b.teardown();
    });
}

#[test]
fn the_64th_outstanding_work_request_of_a_63_deep_queue_pair_is_enomem() {
    isolated(
        "the_64th_outstanding_work_request_of_a_63_deep_queue_pair_is_enomem",
        &[],
        || {
            let a = Side::with("rdma_en0", 1, 256, 63);
            let b = Side::new("rdma_en1", 1);
            assert_eq!(a.init(), 0);
            for i in 0..63 {
                assert_eq!(a.post_recv(i, a.sge(0, 64)), 0, "receive {i}");
            }
            assert_eq!(a.post_recv(63, a.sge(0, 64)), libc::ENOMEM);
            assert_eq!(a.rtr(gid(&b, 1).unwrap(), b.qpn()), 0);
            assert_eq!(a.rts(), 0);
            for i in 0..63 {
                assert_eq!(a.post_send(100 + i, a.sge(0, 64)), 0, "send {i}");
            }
            assert_eq!(a.post_send(163, a.sge(0, 64)), libc::ENOMEM);
            // Polling the completions frees the slots.
            assert_eq!(a.poll(63).unwrap().len(), 63);
            assert_eq!(a.post_send(164, a.sge(0, 64)), 0);
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn more_completions_than_the_queue_holds_is_an_overrun_later_polls_report() {
    isolated(
        "more_completions_than_the_queue_holds_is_an_overrun_later_polls_report",
        &[],
        || {
            let a = Side::with("rdma_en0", 1, 2, 8);
            assert_eq!(a.init(), 0);
            assert_eq!(a.rtr(gid(&a, 1).unwrap(), a.qpn()), 0);
            assert_eq!(a.rts(), 0);
            for i in 0..3 {
                assert_eq!(a.post_send(i, a.sge(0, 64)), 0);
            }
            assert!(a.poll(1).unwrap_err() < 0);
            assert!(a.poll(1).unwrap_err() < 0, "the overrun stays");
        },
    );
}

/// How many of `count` messages survive loss `p` with seed `seed`: the provider draws one
/// number per message from the same generator.
fn survivors(seed: u64, p: f64, count: usize) -> usize {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..count).filter(|_| rng.random::<f64>() >= p).count()
}

#[test]
fn lost_messages_are_the_seeded_draws_and_their_sends_still_succeed() {
    isolated(
        "lost_messages_are_the_seeded_draws_and_their_sends_still_succeed",
        &[
            ("NUVEC_VERBS_EMU_LOSS", "0.5"),
            ("NUVEC_VERBS_EMU_SEED", "11"),
        ],
        || {
            let (a, b) = pair("rdma_en0", "rdma_en1", 1);
            for i in 0..30 {
                assert_eq!(b.post_recv(i, b.sge(0, 64)), 0);
            }
            for i in 0..30 {
                assert_eq!(a.post_send(100 + i, a.sge(0, 64)), 0);
            }
            let sent = a.poll(30).unwrap();
            assert!(sent.iter().all(|w| w.status == IBV_WC_SUCCESS));
            let expected = survivors(11, 0.5, 30);
            assert!(expected > 0 && expected < 30);
            let got = b.poll(expected).unwrap();
            assert_eq!(got.len(), expected);
            assert!(b.poll_nothing(QUIET).is_empty());
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn with_loss_one_nothing_arrives() {
    isolated(
        "with_loss_one_nothing_arrives",
        &[("NUVEC_VERBS_EMU_LOSS", "1")],
        || {
            let (a, b) = pair("rdma_en0", "rdma_en1", 1);
            assert_eq!(b.post_recv(1, b.sge(0, 64)), 0);
            assert_eq!(a.post_send(2, a.sge(0, 64)), 0);
            assert_eq!(a.poll(1).unwrap()[0].status, IBV_WC_SUCCESS);
            assert!(b.poll_nothing(QUIET).is_empty());
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn the_kth_posted_work_request_completes_with_general_err() {
    isolated(
        "the_kth_posted_work_request_completes_with_general_err",
        &[("NUVEC_VERBS_EMU_FAIL_WR", "3")],
        || {
            let (a, b) = pair("rdma_en0", "rdma_en1", 1);
            assert_eq!(b.post_recv(1, b.sge(0, 64)), 0);
            assert_eq!(b.post_recv(2, b.sge(0, 64)), 0);
            assert_eq!(a.post_send(3, a.sge(0, 64)), 0, "the third work request");
            let got = a.poll(1).unwrap();
            assert_eq!((got[0].wr_id, got[0].status), (3, IBV_WC_GENERAL_ERR));
            assert_eq!(a.state(), IBV_QPS_ERR);
            assert!(b.poll_nothing(QUIET).is_empty(), "nothing was sent");
            a.teardown();
            b.teardown();
        },
    );
}

/// What the dying peer prints before its address.
const ADDRESS: &str = "peer-address: ";

/// The hexadecimal form of a GID.
fn hex(gid: &ibv_gid) -> String {
    raw(gid).iter().map(|b| format!("{b:02x}")).collect()
}

/// A GID from its hexadecimal form.
fn unhex(text: &str) -> ibv_gid {
    let mut bytes = [0u8; 16];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap();
    }
    ibv_gid { raw: bytes }
}

#[test]
fn a_peer_that_dies_after_its_first_message_leaves_only_silence() {
    isolated(
        "a_peer_that_dies_after_its_first_message_leaves_only_silence",
        &[],
        || {
            let a = Side::new("rdma_en0", 1);
            assert_eq!(a.init(), 0);
            assert_eq!(a.post_recv(1, a.sge(0, FRAME)), 0);
            let me = format!("{} {}", hex(&gid(&a, 1).unwrap()), a.qpn());
            let mut command = child_command(
                "dying_peer",
                &[("NUVEC_VERBS_EMU_DIE_AFTER", "1"), ("PEER", me.as_str())],
            );
            let mut child = command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let stdout = child.stdout.take().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    // libtest may print the test's name on the same line first.
                    if let Some(at) = line.find(ADDRESS) {
                        let _ = tx.send(line[at + ADDRESS.len()..].to_owned());
                    }
                }
            });
            let peer = rx.recv_timeout(DEADLINE).expect("the peer's address");
            let (peer_gid, peer_qpn) = peer.split_once(' ').unwrap();
            assert_eq!(a.rtr(unhex(peer_gid), peer_qpn.parse().unwrap()), 0);
            assert_eq!(a.rts(), 0);
            assert_eq!(a.post_send(2, a.sge(0, 64)), 0);
            child.stdin.take().unwrap().write_all(b"go\n").unwrap();
            let got = a.poll(2).unwrap();
            let seen: Vec<_> = got
                .iter()
                .map(|w| (w.wr_id, w.status, w.byte_len))
                .collect();
            assert_eq!(
                seen,
                [(2, IBV_WC_SUCCESS, 64), (1, IBV_WC_SUCCESS, FRAME as u32)]
            );
            assert!(a.buf.iter().enumerate().all(|(i, &x)| x == pattern(7, i)));
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || tx.send(child.wait()));
            let status = rx.recv_timeout(DEADLINE).expect("the peer ends").unwrap();
            assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
            // The dead peer's stream is broken, then nobody listens: both are silence.
            for wr_id in [3, 4, 5] {
                assert_eq!(a.post_send(wr_id, a.sge(0, 64)), 0);
                let got = a.poll(1).unwrap();
                assert_eq!((got[0].wr_id, got[0].status), (wr_id, IBV_WC_SUCCESS));
            }
            a.teardown();
        },
    );
}

#[test]
fn dying_peer() {
    if !is_child("dying_peer") {
        return;
    }
    let mut b = Side::new("rdma_en1", 1);
    assert_eq!(b.init(), 0);
    assert_eq!(b.post_recv(1, b.sge(0, FRAME)), 0);
    let peer = std::env::var("PEER").unwrap();
    let (peer_gid, peer_qpn) = peer.split_once(' ').unwrap();
    assert_eq!(b.rtr(unhex(peer_gid), peer_qpn.parse().unwrap()), 0);
    assert_eq!(b.rts(), 0);
    println!("{ADDRESS}{} {}", hex(&gid(&b, 1).unwrap()), b.qpn());
    std::io::stdout().flush().unwrap();
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    let got = b.poll(1).unwrap();
    assert_eq!((got[0].status, got[0].byte_len), (IBV_WC_SUCCESS, 64));
    for (i, byte) in b.buf.iter_mut().enumerate() {
        *byte = pattern(7, i);
    }
    let _ = b.post_send(2, b.sge(0, FRAME));
    panic!("still alive after the message it was to die after");
}
