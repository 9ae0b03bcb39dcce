//! JACCL's TCP side channel: the exact bytes against scripted MLX peers, real multi-rank exchanges over loopback, failures that name the rank within the timeout, and ranks joining MLX's rank 0 with its backlog of 0.
//!
//! The scripted peers are an independent byte-level model of MLX's `SideChannel` and
//! `TCPSocket` (reference §3.3): raw `std::net::TcpStream`s that assert every byte our side
//! sends and answer with the bytes a C++ peer would send. Records are built here from MLX's
//! struct layout, not with `Destination::encode`. Only loopback addresses are used.
//!
//! About 1100 lines because the scripted peers (the independent model of MLX's side) are
//! shared by every test here: the record codec, the gathers, the barrier and bad peers all
//! drive the same model.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use nuvec_distributed::Error;
use nuvec_distributed::jaccl::{Destination, SideChannel};

use crate::common::ports;

/// The timeout of runs expected to succeed.
const LONG: Duration = Duration::from_secs(20);
/// The timeout of runs expected to fail by timing out.
const SHORT: Duration = Duration::from_millis(800);
/// The timeout of rank 0 when a rank is missing: the other ranks must connect well within it.
const MISSING: Duration = Duration::from_secs(2);
/// How long a stalling scripted peer keeps its connection open past the timeout.
const LINGER: Duration = Duration::from_secs(2);
/// How much later than its timeout a failure may be reported (a loaded machine).
const SLACK: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// The byte-level model

/// An `i32` as MLX sends it on arm64: 4 little-endian bytes.
fn le(v: i32) -> [u8; 4] {
    [v as u8, (v >> 8) as u8, (v >> 16) as u8, (v >> 24) as u8]
}

/// MLX's `Destination` as it sits in memory: three `int`s, 4 padding bytes, the 16-byte GID.
fn record(lid: i32, qpn: i32, psn: i32, padding: [u8; 4], gid: [u8; 16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend(le(lid));
    out.extend(le(qpn));
    out.extend(le(psn));
    out.extend(padding);
    out.extend(gid);
    out
}

/// A GID for (rank, peer): `::ffff:10.0.rank.peer`, as the IPv4-mapped GIDs MLX advertises.
fn gid(rank: usize, peer: usize) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12] = 10;
    g[14] = rank as u8;
    g[15] = peer as u8;
    g
}

/// Rank `rank`'s QP details towards `peer` (the placeholder with LID −1 for itself, as MLX).
fn dest(rank: usize, peer: usize) -> Destination {
    Destination {
        local_id: if rank == peer { -1 } else { 100 + rank as i32 },
        queue_pair_number: (1000 * rank + peer) as i32,
        packet_sequence_number: 7,
        global_identifier: gid(rank, peer),
    }
}

/// The bytes of `dest(rank, peer)` with `padding` in the padding slot.
fn dest_bytes(rank: usize, peer: usize, padding: [u8; 4]) -> Vec<u8> {
    let d = dest(rank, peer);
    record(d.local_id, d.queue_pair_number, 7, padding, gid(rank, peer))
}

/// Wire `wire` of rank `rank`'s ring QPs, `side` 0 for left and 1 for right.
fn ring_dest(rank: usize, side: usize, wire: usize) -> Destination {
    Destination {
        local_id: (10 * rank + side) as i32,
        queue_pair_number: (100 * rank + 10 * side + wire) as i32,
        packet_sequence_number: 7,
        global_identifier: gid(rank, 200 + 10 * side + wire),
    }
}

fn ring_dest_bytes(rank: usize, side: usize, wire: usize, padding: [u8; 4]) -> Vec<u8> {
    let d = ring_dest(rank, side, wire);
    record(
        d.local_id,
        d.queue_pair_number,
        7,
        padding,
        d.global_identifier,
    )
}

/// Reads exactly `n` bytes (10 s at most).
fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf)
        .unwrap_or_else(|e| panic!("reading {n} bytes: {e}"));
    buf
}

/// Asserts that the next bytes on `s` are exactly `expected`.
fn expect(s: &mut TcpStream, expected: &[u8], what: &str) {
    let got = read_n(s, expected.len());
    assert_eq!(got, expected, "{what}: the bytes differ");
}

/// Asserts that the peer closed `s` without sending anything more.
fn expect_closed(s: &mut TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("{n} unexpected bytes after the exchange: {:?}", &buf[..n]),
        Err(e) => panic!("waiting for the close: {e}"),
    }
}

/// A listener for a scripted rank 0, and its address.
fn scripted_coordinator() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

/// A free loopback address, held until a rank binds it (see `common::ports`): a port bound
/// and released at once can be taken by another test before rank 0 listens on it.
fn free_addr() -> String {
    ports::free_nodes(1, 1)[0][0].clone()
}

/// Connects to `addr`, retrying for 10 s while nobody listens.
fn connect_retry(addr: &str) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("cannot connect to {addr}: {e}"),
        }
    }
}

/// The message of a side-channel failure of `rank`, checked to be an `Error::Connect`.
fn connect_error(e: Error, rank: usize) -> String {
    match &e {
        Error::Connect { rank: r, what } => {
            assert_eq!(*r, rank, "the error names the wrong rank: {e}");
            assert!(what.starts_with("jaccl: side channel: "), "{what}");
            let shown = e.to_string();
            assert!(
                shown.starts_with(&format!("distributed: rank {rank}: jaccl: side channel: ")),
                "{shown}"
            );
            what.clone()
        }
        other => panic!("expected a side-channel connection error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// (a) Exact bytes against scripted MLX peers

#[test]
fn rank_one_speaks_mlx_mesh_exchange_and_barrier_byte_for_byte() {
    let (listener, addr) = scripted_coordinator();
    let ours = thread::spawn(move || {
        let mut c = SideChannel::connect(&addr, 1, 3, LONG)?;
        let mine: Vec<Destination> = (0..3).map(|j| dest(1, j)).collect();
        let all = c.exchange_mesh(&mine)?;
        c.barrier()?;
        Ok::<_, Error>(all)
    });
    let (mut s, _) = listener.accept().unwrap();
    expect(&mut s, &le(1), "the rank hello");
    // all_gather<int>(3): 4 bytes up, 12 bytes down.
    expect(&mut s, &le(3), "the destination count");
    s.write_all(&[le(3), le(3), le(3)].concat()).unwrap();
    // all_gather of 3 × 32 bytes: this rank's records with zero padding.
    let ours_bytes: Vec<u8> = (0..3).flat_map(|j| dest_bytes(1, j, [0; 4])).collect();
    expect(&mut s, &ours_bytes, "the mesh destinations");
    // A C++ rank 0 echoes everything; the other ranks' padding holds stack garbage.
    let mut reply: Vec<u8> = (0..3).flat_map(|j| dest_bytes(0, j, [0xaa; 4])).collect();
    reply.extend(&ours_bytes);
    reply.extend((0..3).flat_map(|j| dest_bytes(2, j, [0xde, 0xad, 0xbe, 0xef])));
    s.write_all(&reply).unwrap();
    // The barrier: two all_gather<int>(0).
    for round in 0..2 {
        expect(&mut s, &le(0), &format!("barrier round {round}"));
        s.write_all(&[0u8; 12]).unwrap();
    }
    let all = ours.join().unwrap().unwrap();
    for (j, row) in all.iter().enumerate() {
        for (k, d) in row.iter().enumerate() {
            assert_eq!(*d, dest(j, k), "all[{j}][{k}]");
        }
    }
    expect_closed(&mut s);
}

#[test]
fn rank_zero_orders_out_of_order_ranks_and_speaks_mlx_ring_exchange_byte_for_byte() {
    const R: usize = 4;
    const C: usize = 2;
    let addr = free_addr();
    let ours = {
        let addr = addr.clone();
        thread::spawn(move || {
            let mut c = SideChannel::connect(&addr, 0, R, LONG)?;
            let left: Vec<Destination> = (0..C).map(|w| ring_dest(0, 0, w)).collect();
            let right: Vec<Destination> = (0..C).map(|w| ring_dest(0, 1, w)).collect();
            let ring = c.exchange_ring(&left, &right)?;
            c.barrier()?;
            Ok::<_, Error>(ring)
        })
    };
    // The ranks connect in the order 3, 1, 2; rank 2 sends its hello in two pieces.
    let mut s3 = connect_retry(&addr);
    s3.write_all(&le(3)).unwrap();
    let mut s1 = connect_retry(&addr);
    s1.write_all(&le(1)).unwrap();
    let mut s2 = connect_retry(&addr);
    s2.write_all(&le(2)[..2]).unwrap();
    thread::sleep(Duration::from_millis(50));
    s2.write_all(&le(2)[2..]).unwrap();
    let mut peers = [(3usize, s3), (1, s1), (2, s2)];
    let padding = |r: usize| [r as u8; 4];
    for side in 0..2 {
        // The count: every rank sends C, rank 0 answers with R counts.
        for (_, s) in peers.iter_mut() {
            s.write_all(&le(C as i32)).unwrap();
        }
        let counts: Vec<u8> = (0..R).flat_map(|_| le(C as i32)).collect();
        for (r, s) in peers.iter_mut() {
            expect(s, &counts, &format!("rank {r}'s counts, side {side}"));
        }
        // The records: rank 0 answers with every rank's block in rank order, its own first
        // with zero padding, the others exactly as they sent them.
        for (r, s) in peers.iter_mut() {
            let block: Vec<u8> = (0..C)
                .flat_map(|w| ring_dest_bytes(*r, side, w, padding(*r)))
                .collect();
            s.write_all(&block).unwrap();
        }
        let gathered: Vec<u8> = (0..R)
            .flat_map(|r| {
                let pad = if r == 0 { [0; 4] } else { padding(r) };
                (0..C).flat_map(move |w| ring_dest_bytes(r, side, w, pad))
            })
            .collect();
        for (r, s) in peers.iter_mut() {
            expect(
                s,
                &gathered,
                &format!("rank {r}'s gathered records, side {side}"),
            );
        }
    }
    for round in 0..2 {
        for (_, s) in peers.iter_mut() {
            s.write_all(&le(0)).unwrap();
        }
        for (r, s) in peers.iter_mut() {
            expect(s, &[0u8; 16], &format!("rank {r}'s barrier round {round}"));
        }
    }
    let ring = ours.join().unwrap().unwrap();
    for r in 0..R {
        for w in 0..C {
            assert_eq!(ring.left[r][w], ring_dest(r, 0, w), "left[{r}][{w}]");
            assert_eq!(ring.right[r][w], ring_dest(r, 1, w), "right[{r}][{w}]");
        }
    }
    // Rank 0's left QPs pair with rank 3's right ones, its right QPs with rank 1's left ones.
    assert_eq!(ring.remote_for_left(0), &ring.right[3][..]);
    assert_eq!(ring.remote_for_right(0), &ring.left[1][..]);
    for (_, s) in peers.iter_mut() {
        expect_closed(s);
    }
}

#[test]
fn a_vector_gather_pads_to_the_longest_with_zeros_as_mlx() {
    let (listener, addr) = scripted_coordinator();
    let ours = thread::spawn(move || {
        let mut c = SideChannel::connect(&addr, 1, 3, LONG)?;
        c.all_gather_vec(&[1, 2, 3, 4, 5, 6, 7, 8], 8)
    });
    let (mut s, _) = listener.accept().unwrap();
    expect(&mut s, &le(1), "hello");
    expect(&mut s, &le(1), "the record count");
    s.write_all(&[le(3), le(1), le(0)].concat()).unwrap();
    // max_len = 3 records of 8 bytes: this rank's one record, then two records of zeros.
    let mut padded = vec![1, 2, 3, 4, 5, 6, 7, 8];
    padded.extend([0u8; 16]);
    expect(&mut s, &padded, "the padded records");
    let rank0: Vec<u8> = (100..124).collect();
    let rank2 = [0x55u8; 24]; // padding only: rank 2 has no record
    s.write_all(&[&rank0[..], &padded, &rank2].concat())
        .unwrap();
    let got = ours.join().unwrap().unwrap();
    assert_eq!(got, vec![rank0, vec![1, 2, 3, 4, 5, 6, 7, 8], vec![]]);
}

#[test]
fn an_i32_all_gather_is_four_bytes_up_and_four_per_rank_down() {
    let (listener, addr) = scripted_coordinator();
    let ours = thread::spawn(move || {
        let mut c = SideChannel::connect(&addr, 2, 3, LONG)?;
        c.all_gather_i32(-2)
    });
    let (mut s, _) = listener.accept().unwrap();
    expect(&mut s, &le(2), "hello");
    expect(&mut s, &[0xfe, 0xff, 0xff, 0xff], "-2 as little-endian i32");
    s.write_all(&[le(i32::MIN), le(i32::MAX), le(-2)].concat())
        .unwrap();
    assert_eq!(ours.join().unwrap().unwrap(), vec![i32::MIN, i32::MAX, -2]);
}

// ---------------------------------------------------------------------------------------------
// (b) Real multi-rank runs over loopback

/// Runs `body` on ranks 0..size as threads, each with its own side channel on one coordinator.
fn ranks<T: Send>(
    size: usize,
    body: impl Fn(usize, &mut SideChannel) -> Result<T, Error> + Sync,
) -> Vec<T> {
    let addr = free_addr();
    thread::scope(|scope| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let (addr, body) = (&addr, &body);
                scope.spawn(move || {
                    let mut c = SideChannel::connect(addr, rank, size, LONG)?;
                    assert_eq!((c.rank(), c.size()), (rank, size));
                    body(rank, &mut c)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("rank {rank}: {e}"))
            })
            .collect()
    })
}

fn mesh_run(size: usize) {
    mesh_run_of_wires(size, 1);
}

/// A mesh exchange of `wires` queue pairs per peer, wire-major as MLX 0.32.4: entry
/// `w·R + j` is the queue pair towards rank j on wire w.
fn mesh_run_of_wires(size: usize, wires: usize) {
    let of = |rank: usize, at: usize| {
        let (w, j) = (at / size, at % size);
        let mut d = dest(rank, j);
        d.queue_pair_number += 100_000 * w as i32;
        d
    };
    let results = ranks(size, |rank, c| {
        let mine: Vec<Destination> = (0..wires * size).map(|at| of(rank, at)).collect();
        let all = c.exchange_mesh(&mine)?;
        c.barrier()?;
        Ok(all)
    });
    for (rank, all) in results.iter().enumerate() {
        assert_eq!(all.len(), size);
        for (j, row) in all.iter().enumerate() {
            let expected: Vec<Destination> = (0..wires * size).map(|at| of(j, at)).collect();
            assert_eq!(
                *row, expected,
                "rank {rank} got rank {j}'s destinations wrong"
            );
            for w in 0..wires {
                // What this rank's queue pair towards j on wire w connects to.
                assert_eq!(row[w * size + rank], of(j, w * size + rank));
            }
        }
    }
}

#[test]
fn three_ranks_exchange_a_mesh_of_three_wires_wire_major() {
    mesh_run_of_wires(3, 3);
}

#[test]
fn two_ranks_exchange_a_mesh_of_two_wires_wire_major() {
    mesh_run_of_wires(2, 2);
}

fn ring_run(size: usize, wires: usize) {
    let results = ranks(size, |rank, c| {
        let left: Vec<Destination> = (0..wires).map(|w| ring_dest(rank, 0, w)).collect();
        let right: Vec<Destination> = (0..wires).map(|w| ring_dest(rank, 1, w)).collect();
        let ring = c.exchange_ring(&left, &right)?;
        c.barrier()?;
        Ok(ring)
    });
    for (rank, ring) in results.iter().enumerate() {
        for r in 0..size {
            let left: Vec<Destination> = (0..wires).map(|w| ring_dest(r, 0, w)).collect();
            let right: Vec<Destination> = (0..wires).map(|w| ring_dest(r, 1, w)).collect();
            assert_eq!(ring.left[r], left, "rank {rank}: left of rank {r}");
            assert_eq!(ring.right[r], right, "rank {rank}: right of rank {r}");
        }
        let l = (rank + size - 1) % size;
        let rt = (rank + 1) % size;
        let expect_left: Vec<Destination> = (0..wires).map(|w| ring_dest(l, 1, w)).collect();
        let expect_right: Vec<Destination> = (0..wires).map(|w| ring_dest(rt, 0, w)).collect();
        assert_eq!(ring.remote_for_left(rank), &expect_left[..]);
        assert_eq!(ring.remote_for_right(rank), &expect_right[..]);
    }
}

#[test]
fn two_ranks_exchange_a_mesh() {
    mesh_run(2);
}

#[test]
fn three_ranks_exchange_a_mesh() {
    mesh_run(3);
}

#[test]
fn five_ranks_exchange_a_mesh() {
    mesh_run(5);
}

#[test]
fn two_ranks_exchange_a_ring_of_four_wires() {
    ring_run(2, 4);
}

#[test]
fn three_ranks_exchange_a_ring_of_one_wire() {
    ring_run(3, 1);
}

#[test]
fn five_ranks_exchange_a_ring_of_two_wires() {
    ring_run(5, 2);
}

#[test]
fn a_sequence_of_gathers_of_every_size_stays_aligned() {
    let size = 3;
    let block = |rank: usize, n: usize, seq: usize| -> Vec<u8> {
        (0..n).map(|i| (i * 7 + rank * 31 + seq) as u8).collect()
    };
    let sizes = [0usize, 1, 4, 4096, 1 << 20, 3];
    ranks(size, |rank, c| {
        for (seq, &n) in sizes.iter().enumerate() {
            let all = c.all_gather(&block(rank, n, seq))?;
            let expected: Vec<u8> = (0..size).flat_map(|r| block(r, n, seq)).collect();
            assert!(
                all == expected,
                "rank {rank}: gather #{seq} of {n} bytes differs"
            );
        }
        let counts = c.all_gather_i32(rank as i32 * 10 - 5)?;
        assert_eq!(counts, vec![-5, 5, 15]);
        // Different lengths per rank: rank r sends r records of 3 bytes.
        let mine: Vec<u8> = (0..rank * 3).map(|i| (rank * 16 + i) as u8).collect();
        let all = c.all_gather_vec(&mine, 3)?;
        for (r, got) in all.iter().enumerate() {
            let theirs: Vec<u8> = (0..r * 3).map(|i| (r * 16 + i) as u8).collect();
            assert_eq!(*got, theirs, "rank {rank}: rank {r}'s records");
        }
        let none = c.all_gather_vec(&[], 5)?;
        assert_eq!(none, vec![Vec::<u8>::new(); size]);
        c.barrier()?;
        Ok(())
    });
}

#[test]
fn a_silent_stranger_on_the_coordinator_does_not_block_the_ranks() {
    let addr = free_addr();
    thread::scope(|scope| {
        let addr = &addr;
        let gather = move |rank: usize| {
            let mut c = SideChannel::connect(addr, rank, 3, LONG)?;
            c.all_gather_i32(rank as i32)
        };
        let rank0 = scope.spawn(move || gather(0));
        // The stranger connects before any rank and says nothing.
        let mut stranger = connect_retry(addr);
        thread::sleep(Duration::from_millis(100));
        let others: Vec<_> = (1..3).map(|r| scope.spawn(move || gather(r))).collect();
        assert_eq!(rank0.join().unwrap().unwrap(), vec![0, 1, 2]);
        for h in others {
            assert_eq!(h.join().unwrap().unwrap(), vec![0, 1, 2]);
        }
        // Once every rank has said hello, rank 0 closes the stranger's connection.
        expect_closed(&mut stranger);
    });
}

#[test]
fn a_stranger_that_closes_without_a_hello_is_dropped_and_the_ranks_connect() {
    let addr = free_addr();
    let ours = {
        let addr = addr.clone();
        thread::spawn(move || {
            let mut c = SideChannel::connect(&addr, 0, 2, LONG)?;
            c.all_gather_i32(40)
        })
    };
    let mut stranger = connect_retry(&addr);
    stranger.write_all(&[9, 9]).unwrap();
    drop(stranger);
    thread::sleep(Duration::from_millis(50));
    let mut s1 = connect_retry(&addr);
    s1.write_all(&le(1)).unwrap();
    s1.write_all(&le(41)).unwrap();
    expect(&mut s1, &[le(40), le(41)].concat(), "the gathered values");
    assert_eq!(ours.join().unwrap().unwrap(), vec![40, 41]);
}

// ---------------------------------------------------------------------------------------------
// (c) Failures name the rank within the timeout

/// Runs our rank 0 of `size` with `timeout` in a thread and `script` as the other ranks.
fn rank_zero_against<T: Send + 'static>(
    size: usize,
    timeout: Duration,
    body: impl FnOnce(&mut SideChannel) -> Result<T, Error> + Send + 'static,
    script: impl FnOnce(&str),
) -> (Result<T, Error>, Duration) {
    let addr = free_addr();
    let ours = {
        let addr = addr.clone();
        thread::spawn(move || {
            let start = Instant::now();
            let r = SideChannel::connect(&addr, 0, size, timeout).and_then(|mut c| body(&mut c));
            (r, start.elapsed())
        })
    };
    script(&addr);
    ours.join().unwrap()
}

#[test]
fn a_hello_with_a_rank_out_of_range_is_refused_at_once() {
    let (r, took) = rank_zero_against(
        3,
        LONG,
        |_| Ok(()),
        |addr| {
            let mut s = connect_retry(addr);
            s.write_all(&le(7)).unwrap();
            thread::sleep(Duration::from_millis(300));
        },
    );
    let m = connect_error(r.unwrap_err(), 0);
    assert!(
        m.contains("said it is rank 7 (bytes [07, 00, 00, 00])")
            && m.contains("the other ranks of a group of 3 are 1 to 2"),
        "{m}"
    );
    assert!(took < LONG / 2, "took {took:?}");
}

#[test]
fn a_hello_claiming_rank_zero_or_a_negative_rank_is_refused() {
    for claimed in [0, -1] {
        let (r, _) = rank_zero_against(
            2,
            LONG,
            |_| Ok(()),
            |addr| {
                let mut s = connect_retry(addr);
                s.write_all(&le(claimed)).unwrap();
                thread::sleep(Duration::from_millis(300));
            },
        );
        let m = connect_error(r.unwrap_err(), 0);
        assert!(m.contains(&format!("said it is rank {claimed} ")), "{m}");
    }
}

#[test]
fn a_rank_that_connects_twice_is_refused() {
    let (r, _) = rank_zero_against(
        3,
        LONG,
        |_| Ok(()),
        |addr| {
            let mut a = connect_retry(addr);
            a.write_all(&le(1)).unwrap();
            let mut b = connect_retry(addr);
            b.write_all(&le(1)).unwrap();
            thread::sleep(Duration::from_millis(300));
        },
    );
    let m = connect_error(r.unwrap_err(), 0);
    assert!(
        m.contains("rank 1 connected twice to the coordinator"),
        "{m}"
    );
}

#[test]
fn a_rank_that_never_connects_is_named_after_the_timeout() {
    let (r, took) = rank_zero_against(
        3,
        MISSING,
        |_| Ok(()),
        |addr| {
            let mut s = connect_retry(addr);
            s.write_all(&le(1)).unwrap();
            thread::sleep(MISSING + LINGER);
        },
    );
    let m = connect_error(r.unwrap_err(), 0);
    assert!(
        m.contains("rank 2 did not connect to the coordinator")
            && m.contains("and send its rank within 2s"),
        "{m}"
    );
    assert!(took >= MISSING && took < MISSING + SLACK, "took {took:?}");
}

#[test]
fn a_silent_stranger_is_reported_when_a_rank_is_missing() {
    let (r, took) = rank_zero_against(
        2,
        MISSING,
        |_| Ok(()),
        |addr| {
            let mut s = connect_retry(addr);
            s.write_all(&[1, 0]).unwrap(); // half a hello, then nothing
            thread::sleep(MISSING + LINGER);
        },
    );
    let m = connect_error(r.unwrap_err(), 0);
    assert!(
        m.contains("rank 1 did not connect")
            && m.contains("1 connection sent no complete rank hello: 127.0.0.1:")
            && m.contains("(2 of 4 bytes)"),
        "{m}"
    );
    assert!(took < MISSING + SLACK, "took {took:?}");
}

#[test]
fn a_rank_that_sends_a_short_message_and_stalls_is_named_after_the_timeout() {
    let (r, took) = rank_zero_against(
        2,
        SHORT,
        |c| c.exchange_mesh(&[dest(0, 0), dest(0, 1)]),
        |addr| {
            let mut s = connect_retry(addr);
            s.write_all(&le(1)).unwrap();
            s.write_all(&le(2)).unwrap();
            expect(&mut s, &[le(2), le(2)].concat(), "counts");
            s.write_all(&[0u8; 20]).unwrap(); // 20 of the 64 bytes
            thread::sleep(SHORT + LINGER);
        },
    );
    let m = connect_error(r.unwrap_err(), 0);
    assert!(
        m.contains(
            "all_gather #1 (64 bytes per rank): reading rank 1's block: timed out with \
                    20 of 64 bytes moved"
        ),
        "{m}"
    );
    assert!(took < 2 * SHORT + SLACK, "took {took:?}");
}

#[test]
fn a_rank_that_closes_mid_message_is_named_at_once() {
    let (r, took) = rank_zero_against(
        2,
        LONG,
        |c| c.exchange_mesh(&[dest(0, 0), dest(0, 1)]),
        |addr| {
            let mut s = connect_retry(addr);
            s.write_all(&le(1)).unwrap();
            s.write_all(&le(2)).unwrap();
            expect(&mut s, &[le(2), le(2)].concat(), "counts");
            s.write_all(&[0u8; 20]).unwrap();
        },
    );
    let m = connect_error(r.unwrap_err(), 0);
    assert!(
        m.contains("reading rank 1's block: the connection was closed after 20 of 64 bytes"),
        "{m}"
    );
    assert!(took < LONG / 2, "took {took:?}");
}

#[test]
fn a_rank_announcing_another_number_of_destinations_is_refused() {
    let (r, _) = rank_zero_against(
        3,
        LONG,
        |c| c.exchange_mesh(&[dest(0, 0), dest(0, 1), dest(0, 2)]),
        |addr| {
            let mut s1 = connect_retry(addr);
            s1.write_all(&le(1)).unwrap();
            let mut s2 = connect_retry(addr);
            s2.write_all(&le(2)).unwrap();
            s1.write_all(&le(3)).unwrap();
            s2.write_all(&le(2)).unwrap(); // rank 2 thinks the group has 2 ranks
            let counts = [le(3), le(3), le(2)].concat();
            expect(&mut s1, &counts, "counts to rank 1");
            expect(&mut s2, &counts, "counts to rank 2");
        },
    );
    let m = connect_error(r.unwrap_err(), 0);
    assert!(
        m.contains("exchange mesh: rank 2 sent 2 destinations but this rank sent 3"),
        "{m}"
    );
}

/// Runs our rank `rank` of `size` against a scripted rank 0.
fn against_rank_zero<T: Send + 'static>(
    rank: usize,
    size: usize,
    timeout: Duration,
    body: impl FnOnce(&mut SideChannel) -> Result<T, Error> + Send + 'static,
    script: impl FnOnce(&mut TcpStream),
) -> (Result<T, Error>, Duration, Option<Error>) {
    let (listener, addr) = scripted_coordinator();
    let ours = thread::spawn(move || {
        let start = Instant::now();
        let mut c = SideChannel::connect(&addr, rank, size, timeout)?;
        let r = body(&mut c);
        let took = start.elapsed();
        // A second call after a failure must refuse at once.
        let after = r.is_err().then(|| c.all_gather_i32(0).unwrap_err());
        Ok::<_, Error>((r, took, after))
    });
    let (mut s, _) = listener.accept().unwrap();
    expect(&mut s, &le(rank as i32), "hello");
    script(&mut s);
    ours.join().unwrap().unwrap()
}

#[test]
fn a_coordinator_reporting_a_mismatched_count_fails_the_exchange_and_later_calls() {
    let (r, _, after) = against_rank_zero(
        1,
        3,
        LONG,
        |c| c.exchange_mesh(&(0..3).map(|j| dest(1, j)).collect::<Vec<_>>()),
        |s| {
            expect(s, &le(3), "count");
            s.write_all(&[le(3), le(3), le(2)].concat()).unwrap();
        },
    );
    let first = connect_error(r.unwrap_err(), 1);
    assert!(
        first.contains("rank 2 sent 2 destinations but this rank sent 3"),
        "{first}"
    );
    match after.expect("a second call") {
        Error::Failed {
            rank: 1, first: f, ..
        } => {
            assert!(f.to_string().contains("rank 2 sent 2 destinations"), "{f}")
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[test]
fn a_coordinator_that_garbles_this_ranks_block_is_detected() {
    let (r, _, _) = against_rank_zero(
        1,
        2,
        LONG,
        |c| c.all_gather(b"mine"),
        |s| {
            expect(s, b"mine", "block");
            s.write_all(b"theiMINE").unwrap();
        },
    );
    let m = connect_error(r.unwrap_err(), 1);
    assert!(
        m.contains("all_gather #0 (4 bytes per rank): rank 0 sent back a different block"),
        "{m}"
    );
}

#[test]
fn a_negative_record_count_is_refused() {
    let (r, _, _) = against_rank_zero(
        1,
        2,
        LONG,
        |c| c.all_gather_vec(&[1, 2], 2),
        |s| {
            expect(s, &le(1), "count");
            s.write_all(&[le(-1), le(1)].concat()).unwrap();
        },
    );
    let m = connect_error(r.unwrap_err(), 1);
    assert!(
        m.contains("rank 0 announced -1 records, a negative count"),
        "{m}"
    );
}

#[test]
fn a_huge_record_count_is_refused_before_allocating() {
    let (r, _, _) = against_rank_zero(
        1,
        2,
        LONG,
        |c| c.all_gather_vec(&[1, 2], 2),
        |s| {
            expect(s, &le(1), "count");
            s.write_all(&[le(i32::MAX), le(1)].concat()).unwrap();
        },
    );
    let m = connect_error(r.unwrap_err(), 1);
    assert!(
        m.contains(
            "rank 0 announced 2147483647 records of 2 bytes, more than the side channel moves"
        ),
        "{m}"
    );
}

#[test]
fn a_barrier_value_other_than_zero_means_the_ranks_are_out_of_step() {
    let (r, _, _) = against_rank_zero(
        2,
        3,
        LONG,
        |c| c.barrier(),
        |s| {
            expect(s, &le(0), "barrier");
            s.write_all(&[le(0), le(5), le(0)].concat()).unwrap();
        },
    );
    let m = connect_error(r.unwrap_err(), 2);
    assert!(m.contains("barrier: rank 1 sent 5 instead of 0"), "{m}");
}

#[test]
fn a_coordinator_that_stops_answering_is_named_after_the_timeout() {
    let (r, took, _) = against_rank_zero(
        1,
        2,
        SHORT,
        |c| c.all_gather_i32(3),
        |s| {
            expect(s, &le(3), "value");
            s.write_all(&le(3)[..1]).unwrap();
            thread::sleep(SHORT + LINGER);
        },
    );
    let m = connect_error(r.unwrap_err(), 1);
    assert!(
        m.contains("reading the gathered blocks from rank 0: timed out with 1 of 8 bytes moved"),
        "{m}"
    );
    assert!(took >= SHORT && took < SHORT + SLACK, "took {took:?}");
}

#[test]
fn a_coordinator_that_closes_is_named() {
    let (r, _, _) = against_rank_zero(
        1,
        2,
        LONG,
        |c| c.barrier(),
        |s| {
            expect(s, &le(0), "barrier");
            s.shutdown(std::net::Shutdown::Both).unwrap();
        },
    );
    let m = connect_error(r.unwrap_err(), 1);
    assert!(
        m.contains(
            "reading the gathered blocks from rank 0: the connection was closed after 0 of 8 bytes"
        ),
        "{m}"
    );
}

#[test]
fn a_rank_with_no_coordinator_listening_gives_up_within_the_timeout() {
    let addr = free_addr();
    let start = Instant::now();
    let e = SideChannel::connect(&addr, 2, 3, SHORT).unwrap_err();
    let took = start.elapsed();
    let m = connect_error(e, 2);
    assert!(
        m.contains(&format!(
            "cannot reach the coordinator {addr} (rank 0) after"
        )) && m.contains("in 800ms"),
        "{m}"
    );
    assert!(took < SHORT + SLACK, "took {took:?}");
}

#[test]
fn rank_zero_cannot_listen_on_an_address_in_use() {
    let (held, addr) = scripted_coordinator();
    let e = SideChannel::connect(&addr, 0, 2, SHORT).unwrap_err();
    let m = connect_error(e, 0);
    assert!(
        m.contains(&format!("rank 0 cannot listen on the coordinator {addr}")),
        "{m}"
    );
    drop(held);
}

/// A 2-rank JACCL mesh's device matrix (each rank cabled to the other).
fn two_rank_mesh() -> Vec<Vec<Vec<String>>> {
    vec![
        vec![vec![], vec!["rdma_en5".to_owned()]],
        vec![vec!["rdma_en5".to_owned()], vec![]],
    ]
}

#[test]
fn a_timeout_too_large_for_a_deadline_connects_the_side_channel_and_the_tcp_cables() {
    // `Duration::MAX` is the natural "no timeout"; neither the side channel's setup, its
    // gathers nor JACCL over TCP's cable setup may overflow adding it to now.
    let addr = free_addr();
    let gathered: Vec<Vec<u8>> = thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let addr = &addr;
                scope.spawn(move || {
                    let mut side = SideChannel::connect(addr, rank, 2, Duration::MAX)?;
                    let got = side.all_gather(&[rank as u8; 3])?;
                    let config = nuvec_distributed::jaccl::Config::new(rank, two_rank_mesh())
                        .coordinator(addr);
                    let (fabric, _) =
                        nuvec_distributed::jaccl::tcp::connect(&config, &mut side, Duration::MAX)?;
                    drop(fabric);
                    Ok::<_, Error>(got)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank").expect("connect"))
            .collect()
    });
    for got in gathered {
        assert_eq!(got, vec![0, 0, 0, 1, 1, 1]);
    }
}

#[test]
fn strangers_on_a_jaccl_tcp_listener_do_not_hold_up_the_real_cable() {
    // Rank 1 of a 2-rank mesh over TCP accepts rank 0's cable. Rank 0 and the coordinator are
    // scripted here: the coordinator learns rank 1's listen address from the all-gather, then
    // a silent stranger and one that sends part of a hello connect first, and only then
    // rank 0's real cable.
    use nuvec_distributed::jaccl::tcp::{ADDRESS, decode_address, encode_address};
    let (listener, addr) = scripted_coordinator();
    let timeout = Duration::from_secs(20);
    let rank_one = {
        let addr = addr.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let mut side = SideChannel::connect(&addr, 1, 2, timeout)?;
            let config =
                nuvec_distributed::jaccl::Config::new(1, two_rank_mesh()).coordinator(&addr);
            let fabric = nuvec_distributed::jaccl::tcp::connect(&config, &mut side, timeout);
            Ok::<_, Error>((fabric.map(|_| ()), started.elapsed()))
        })
    };
    let (mut one, _) = listener.accept().expect("rank 1 connects");
    expect(&mut one, &le(1), "rank 1's hello");
    let gathered = read_n(&mut one, ADDRESS);
    let cable_to = decode_address(&gathered);
    let ours = encode_address("127.0.0.1:9".parse().expect("an address"));
    one.write_all(&[ours.as_slice(), gathered.as_slice()].concat())
        .expect("the gathered addresses");
    let silent = TcpStream::connect(cable_to).expect("a silent stranger");
    let mut partial = TcpStream::connect(cable_to).expect("a stranger with part of a hello");
    partial.write_all(b"NJT1\0").expect("five bytes");
    let mut cable = TcpStream::connect(cable_to).expect("rank 0's cable");
    let mut hello = b"NJT1".to_vec();
    hello.extend_from_slice(&0u32.to_le_bytes());
    hello.extend_from_slice(&0u32.to_le_bytes());
    cable.write_all(&hello).expect("rank 0's hello");
    let (connected, took) = rank_one
        .join()
        .expect("rank 1")
        .expect("rank 1's side channel");
    drop((silent, partial));
    connected.unwrap_or_else(|e| panic!("rank 1 after {took:?}: {e}"));
    assert!(took < Duration::from_secs(5), "rank 1 took {took:?}");
}

// ---------------------------------------------------------------------------------------------
// (d) MLX's rank 0 listens with a backlog of 0

/// MLX's rank 0 as it listens and accepts: `SO_REUSEADDR`, a backlog of 0, then R − 1
/// connections each read for its hello in turn, then one 4-byte all-gather. Returns what it
/// gathered, and its address.
fn mlx_backlog_zero_coordinator(size: usize) -> (thread::JoinHandle<Vec<i32>>, String) {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket.set_reuse_address(true).unwrap();
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&any.into()).unwrap();
    socket.listen(0).unwrap();
    let listener: TcpListener = socket.into();
    let addr = listener.local_addr().unwrap().to_string();
    let coordinator = thread::spawn(move || {
        let mut slots: Vec<Option<TcpStream>> = (1..size).map(|_| None).collect();
        for _ in 1..size {
            let (mut s, _) = listener.accept().unwrap();
            let hello = read_n(&mut s, 4);
            let r = i32::from_le_bytes(hello.try_into().unwrap());
            slots[r as usize - 1] = Some(s);
        }
        let mut streams: Vec<TcpStream> = slots.into_iter().map(Option::unwrap).collect();
        let mut all = le(0).to_vec();
        for s in &mut streams {
            all.extend(read_n(s, 4));
        }
        for s in &mut streams {
            s.write_all(&all).unwrap();
        }
        all.chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    });
    (coordinator, addr)
}

/// Ranks that connect to MLX's rank 0 at once, and start their first all-gather at once, all
/// get through: with a backlog of 0 the kernel answers with SYN cookies and drops what comes
/// while the accept queue is full, and a rank that sent its first block after its hello was
/// reset when the block reached the listener first. A rank's connect now ends only once
/// rank 0 has acknowledged its hello. Thirty jobs of four ranks (before, the fault showed in
/// 3 of 30).
#[test]
fn ranks_starting_at_once_all_join_mlx_rank_zero_and_its_backlog_of_zero() {
    let size = 4;
    for job in 0..30 {
        let (coordinator, addr) = mlx_backlog_zero_coordinator(size);
        let results: Vec<_> = thread::scope(|scope| {
            let ranks: Vec<_> = (1..size)
                .map(|rank| {
                    let addr = &addr;
                    scope.spawn(move || {
                        let mut c = SideChannel::connect(addr, rank, size, LONG)?;
                        c.all_gather_i32(10 * rank as i32)
                    })
                })
                .collect();
            ranks.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let expected: Vec<i32> = (0..size as i32).map(|r| 10 * r).collect();
        for (i, r) in results.into_iter().enumerate() {
            // On a failure the coordinator thread is left waiting in `accept`; the test ends.
            let got = r.unwrap_or_else(|e| panic!("job {job}, rank {}: {e}", i + 1));
            assert_eq!(got, expected, "job {job}, rank {}", i + 1);
        }
        assert_eq!(coordinator.join().unwrap(), expected, "job {job}: rank 0");
    }
}
