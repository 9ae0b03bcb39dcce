//! The side channel's state machine, driven by hand: what it asks to send, what it takes, and
//! the errors it makes of a peer's bad bytes.

use super::*;

const T: Duration = Duration::from_secs(7);

/// Drives `p` as a rank ≥ 1 whose rank 0 sends `reply` (then closes): what the rank sent and
/// the result.
fn drive(p: &mut Protocol, reply: &[u8]) -> (Vec<u8>, Result<Output, Error>) {
    let mut sent = Vec::new();
    let mut at = 0;
    loop {
        match p.poll() {
            Next::Done(result) => return (sent, result),
            Next::Send { peer, bytes, .. } => {
                assert_eq!(peer, 0);
                sent.extend_from_slice(bytes);
                let k = bytes.len();
                p.on_sent(k);
            }
            Next::Receive { peer, len, .. } => {
                assert_eq!(peer, 0);
                if at == reply.len() {
                    return (sent, Err(p.stalled(Stall::Closed)));
                }
                // One byte short of what it asks, to exercise partial messages.
                let end = reply.len().min(at + len.max(2) - 1);
                let took = p.on_received(&reply[at..end]);
                assert!(took <= len);
                at += took;
            }
        }
    }
}

fn le(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn another_rank_sends_its_block_then_takes_exactly_the_gathered_blocks() {
    let mut p = Protocol::new(1, 2, T).unwrap();
    p.start(Operation::AllGather(b"ab".to_vec())).unwrap();
    match p.poll() {
        Next::Send {
            peer: 0,
            bytes,
            gather: 0,
        } => assert_eq!(bytes, b"ab"),
        other => panic!("{other:?}"),
    }
    p.on_sent(1);
    match p.poll() {
        Next::Send { bytes, .. } => assert_eq!(bytes, b"b"),
        other => panic!("{other:?}"),
    }
    p.on_sent(1);
    assert!(matches!(
        p.poll(),
        Next::Receive {
            peer: 0,
            len: 4,
            gather: 0
        }
    ));
    // Bytes past the message belong to the next one: they are not taken.
    assert_eq!(p.on_received(b"xyabNEXT"), 4);
    match p.poll() {
        Next::Done(Ok(Output::Bytes(b))) => assert_eq!(b, b"xyab"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn rank_zero_reads_every_block_in_rank_order_then_sends_the_concatenation_to_each() {
    let mut p = Protocol::new(0, 3, T).unwrap();
    p.start(Operation::AllGather(b"0".to_vec())).unwrap();
    for peer in [1, 2] {
        match p.poll() {
            Next::Receive { peer: got, len, .. } => assert_eq!((got, len), (peer, 1)),
            other => panic!("{other:?}"),
        }
        assert_eq!(p.on_received(format!("{peer}").as_bytes()), 1);
    }
    for peer in [1, 2] {
        match p.poll() {
            Next::Send {
                peer: got, bytes, ..
            } => assert_eq!((got, bytes), (peer, &b"012"[..])),
            other => panic!("{other:?}"),
        }
        p.on_sent(3);
    }
    assert!(matches!(p.poll(), Next::Done(Ok(Output::Bytes(b))) if b == b"012"));
}

#[test]
fn a_group_of_one_finishes_every_operation_without_moving_a_byte() {
    let mut p = Protocol::new(0, 1, T).unwrap();
    p.start(Operation::Barrier).unwrap();
    assert!(matches!(p.poll(), Next::Done(Ok(Output::Done))));
    let d = Destination {
        local_id: -1,
        ..Destination::default()
    };
    p.start(Operation::ExchangeMesh(vec![d])).unwrap();
    assert!(matches!(p.poll(), Next::Done(Ok(Output::Mesh(m))) if m == vec![vec![d]]));
}

#[test]
fn a_short_peer_message_fails_naming_the_gather_the_peer_and_the_bytes_moved() {
    let mut p = Protocol::new(1, 2, T).unwrap();
    p.start(Operation::AllGather(vec![1, 2, 3, 4])).unwrap();
    let (sent, result) = drive(&mut p, &[9, 9, 9]);
    assert_eq!(sent, [1, 2, 3, 4]);
    let m = result.unwrap_err().to_string();
    assert!(
        m.contains("all_gather #0 (4 bytes per rank)")
            && m.contains("reading the gathered blocks from rank 0")
            && m.contains("closed after 3 of 8 bytes")
            && m.contains("timeout 7s"),
        "{m}"
    );
    // The stream is no longer aligned: every later operation is refused.
    let e = p.start(Operation::Barrier).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Failed {
                op: "all_gather",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_garbled_echo_of_this_ranks_block_is_a_connect_error() {
    let mut p = Protocol::new(1, 2, T).unwrap();
    p.start(Operation::AllGather(vec![5, 6])).unwrap();
    let (_, result) = drive(&mut p, &[0, 0, 5, 7]);
    let e = result.unwrap_err();
    assert!(
        matches!(&e, Error::Connect { rank: 1, what } if what.contains("sent back a different block")),
        "{e}"
    );
}

#[test]
fn a_negative_or_oversized_count_in_a_vector_all_gather_is_refused_before_the_records_move() {
    for (other, says) in [
        (-3, "a negative count"),
        (i32::MAX, "more than the side channel"),
    ] {
        let mut p = Protocol::new(1, 2, T).unwrap();
        p.start(Operation::AllGatherVec {
            records: vec![1, 2],
            record_len: 2,
        })
        .unwrap();
        let (sent, result) = drive(&mut p, &le(&[other, 1]));
        assert_eq!(sent, le(&[1]), "only the count went out");
        let m = result.unwrap_err().to_string();
        assert!(m.contains("rank 0 announced") && m.contains(says), "{m}");
    }
}

#[test]
fn a_vector_all_gather_pads_to_the_longest_and_returns_the_records_unpadded() {
    let mut p = Protocol::new(1, 2, T).unwrap();
    p.start(Operation::AllGatherVec {
        records: vec![7],
        record_len: 1,
    })
    .unwrap();
    let reply = [le(&[2, 1]), vec![3, 4, 7, 0]].concat();
    let (sent, result) = drive(&mut p, &reply);
    assert_eq!(sent, [le(&[1]), vec![7, 0]].concat());
    assert_eq!(result.unwrap(), Output::Records(vec![vec![3, 4], vec![7]]));
}

#[test]
fn a_barrier_that_gathers_anything_but_zero_fails_naming_the_rank() {
    let mut p = Protocol::new(2, 3, T).unwrap();
    p.start(Operation::Barrier).unwrap();
    let reply = [le(&[0, 0, 0]), le(&[0, 4, 0])].concat();
    let (sent, result) = drive(&mut p, &reply);
    assert_eq!(sent, le(&[0, 0]));
    let m = result.unwrap_err().to_string();
    assert!(m.contains("barrier: rank 1 sent 4 instead of 0"), "{m}");
}

#[test]
fn a_ring_exchange_gathers_left_counts_and_records_then_right_ones() {
    let d = |q: i32| Destination {
        queue_pair_number: q,
        ..Destination::default()
    };
    let mut p = Protocol::new(1, 2, T).unwrap();
    p.start(Operation::ExchangeRing {
        left: vec![d(10)],
        right: vec![d(11)],
    })
    .unwrap();
    let reply = [
        le(&[1, 1]),
        d(0).encode().to_vec(),
        d(10).encode().to_vec(),
        le(&[1, 1]),
        d(1).encode().to_vec(),
        d(11).encode().to_vec(),
    ]
    .concat();
    let (sent, result) = drive(&mut p, &reply);
    let expected_sent = [
        le(&[1]),
        d(10).encode().to_vec(),
        le(&[1]),
        d(11).encode().to_vec(),
    ]
    .concat();
    assert_eq!(sent, expected_sent);
    assert_eq!(
        result.unwrap(),
        Output::Ring(RingDestinations {
            left: vec![vec![d(0)], vec![d(10)]],
            right: vec![vec![d(1)], vec![d(11)]],
        })
    );
}

#[test]
fn a_peer_announcing_another_number_of_destinations_fails_the_exchange() {
    let mut p = Protocol::new(1, 2, T).unwrap();
    p.start(Operation::ExchangeMesh(vec![Destination::default(); 2]))
        .unwrap();
    let (_, result) = drive(&mut p, &le(&[3, 2]));
    let m = result.unwrap_err().to_string();
    assert!(
        m.contains("exchange mesh: rank 0 sent 3 destinations but this rank sent 2"),
        "{m}"
    );
}

#[test]
fn argument_errors_move_no_byte_and_leave_the_protocol_usable() {
    let mut p = Protocol::new(1, 2, T).unwrap();
    for op in [
        Operation::AllGatherVec {
            records: vec![1, 2, 3],
            record_len: 2,
        },
        Operation::AllGatherVec {
            records: vec![],
            record_len: 0,
        },
        Operation::ExchangeMesh(vec![Destination::default()]),
        Operation::ExchangeMesh(vec![Destination::default(); 3]),
        Operation::ExchangeMesh(vec![]),
        Operation::ExchangeRing {
            left: vec![Destination::default()],
            right: vec![],
        },
    ] {
        let e = p.start(op).unwrap_err();
        assert!(e.leaves_group_usable(), "{e}");
        assert!(matches!(
            p.poll(),
            Next::Done(Err(Error::InvalidArgument { .. }))
        ));
    }
    p.start(Operation::Barrier).unwrap();
    let (_, result) = drive(&mut p, &le(&[0, 0, 0, 0]));
    assert_eq!(result.unwrap(), Output::Done);
}

#[test]
fn bad_groups_are_argument_errors() {
    for (rank, size) in [(0, 0), (2, 2), (5, 3)] {
        let e = Protocol::new(rank, size, T).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }
}

#[test]
fn the_hello_is_the_rank_as_a_little_endian_i32() {
    assert_eq!(hello(3).unwrap(), [3, 0, 0, 0]);
    assert!(hello(1 << 40).unwrap_err().contains("does not fit"));
}

#[test]
fn a_hello_reader_never_takes_a_byte_past_the_hello() {
    let mut h = HelloReader::default();
    assert_eq!(h.on_received(&[2, 0]), 2);
    assert_eq!(h.hello(), None);
    assert_eq!(h.wants(), 2);
    assert_eq!(h.on_received(&[0, 0, 0xaa, 0xbb]), 2);
    assert_eq!(h.hello(), Some([2, 0, 0, 0]));
    assert_eq!(h.on_received(&[1]), 0);
}

#[test]
fn a_wrong_rank_in_the_hello_is_refused_naming_the_connection() {
    let mut roster = Roster::new(3);
    for bad in [5, 0, -1, 3] {
        let m = roster
            .admit(i32::to_le_bytes(bad), "10.0.0.9:4000", "c:1")
            .unwrap_err();
        assert!(
            m.contains(&format!("from 10.0.0.9:4000 said it is rank {bad}"))
                && m.contains("are 1 to 2"),
            "{m}"
        );
    }
    assert_eq!(roster.admit([2, 0, 0, 0], "a:1", "c:1"), Ok(2));
    let m = roster.admit([2, 0, 0, 0], "b:2", "c:1").unwrap_err();
    assert!(
        m.contains("rank 2 connected twice to the coordinator c:1, from a:1 and from b:2"),
        "{m}"
    );
    assert_eq!(roster.missing(), vec![1]);
    assert!(!roster.is_complete());
    assert_eq!(roster.admit([1, 0, 0, 0], "d:3", "c:1"), Ok(1));
    assert!(roster.is_complete());
}
