//! The nuvec wire in the simulator: its results (the rank-order fold, the same bits on every
//! rank), its hops, and mismatched calls caught on every rank with no data returned.

use std::collections::BTreeMap;
use std::time::Duration;

use nuvec_core::DType;
use nuvec_distributed::fabric::{Channel, Fabric};
use nuvec_distributed::reduce::{Reducer, Reduction};
use nuvec_distributed::ring::relay;
use nuvec_distributed::{Error, RingCommunicator, Wire};
use nuvec_fabric_sim::{Outcome, Sim};
use proptest::prelude::*;

const TIMEOUT: Duration = Duration::from_secs(30);

/// `cases` cases, the regressions kept in `proptest-regressions/sim_wire.txt`.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "proptest-regressions/sim_wire.txt",
            ),
        )),
        ..ProptestConfig::default()
    }
}

/// Rank `rank`'s input of `elements` elements of `dtype`: small values, some negative, so
/// every reduction of every dtype is exact and max/min differ from the sum.
fn input(dtype: DType, elements: usize, rank: usize, salt: usize) -> Vec<u8> {
    let value = |i: usize| ((i * 7 + rank * 13 + salt) % 23) as i64 - 11;
    (0..elements)
        .flat_map(|i| {
            let v = value(i);
            match dtype {
                DType::Bool => vec![u8::from(v > 0)],
                DType::U8 => vec![v.rem_euclid(256) as u8],
                DType::I32 => (v as i32).to_le_bytes().to_vec(),
                DType::I64 => v.to_le_bytes().to_vec(),
                DType::F16 => half::f16::from_f64(v as f64).to_le_bytes().to_vec(),
                DType::BF16 => half::bf16::from_f64(v as f64).to_le_bytes().to_vec(),
                DType::F32 => (v as f32 / 4.0).to_le_bytes().to_vec(),
                DType::F64 => (v as f64 / 8.0).to_le_bytes().to_vec(),
                other => panic!("no input for {other}"),
            }
        })
        .collect()
}

const DTYPES: [DType; 8] = [
    DType::Bool,
    DType::U8,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
];

const OPS: [Reduction; 3] = [Reduction::Sum, Reduction::Max, Reduction::Min];

/// The nuvec wire's all-reduce: every rank's vector folded in rank order.
fn fold(op: Reduction, dtype: DType, inputs: &[Vec<u8>]) -> Vec<u8> {
    let reducer = Reducer::new(op, dtype).expect("a reduction");
    let mut acc = inputs[0].clone();
    for other in &inputs[1..] {
        reducer.apply(&mut acc, other);
    }
    acc
}

/// A ring of `ranks` with `links` per neighbour on the nuvec wire, over a network drawn from
/// `seed`.
fn sim(ranks: usize, links: usize, seed: u64, fragment: usize, window: usize) -> Sim {
    Sim::ring(ranks, links)
        .seed(seed)
        .max_fragment(fragment)
        .window(window)
        .latency(Duration::from_micros(20), Duration::from_micros(15))
}

fn comm(
    fabric: nuvec_fabric_sim::SimFabric,
    links: usize,
) -> RingCommunicator<nuvec_fabric_sim::SimFabric> {
    RingCommunicator::new(fabric, links, TIMEOUT).with_wire(Wire::Nuvec)
}

proptest! {
    #![proptest_config(config(48))]

    /// Below and above the relay's crossover, with fragments and windows of any size: every
    /// rank returns the rank-order fold, bit for bit, then the gathered vectors, then its
    /// neighbour's bytes.
    #[test]
    fn every_rank_gets_the_rank_order_fold_and_the_gather_on_the_nuvec_wire(
        ranks in 2usize..=7,
        links in 1usize..=2,
        dtype in proptest::sample::select(DTYPES.to_vec()),
        op in proptest::sample::select(OPS.to_vec()),
        elements in prop_oneof![0usize..40, 1000usize..3000, 20_000usize..40_000],
        gather in prop_oneof![0usize..64, 60_000usize..70_000],
        seed in any::<u64>(),
        fragment in 1usize..=65_536,
        window in 1024usize..=256 * 1024,
    ) {
        let report = sim(ranks, links, seed, fragment, window).run(|fabric| {
            let rank = fabric.rank();
            let comm = comm(fabric, links);
            let mut data = input(dtype, elements, rank, 0);
            comm.try_all_reduce(op, dtype, &mut data)?;
            let mine = input(DType::U8, gather, rank, 1);
            let mut all = vec![0u8; gather * ranks];
            comm.try_all_gather(&mine, &mut all)?;
            let (right, left) = ((rank + 1) % ranks, (rank + ranks - 1) % ranks);
            let mut got = vec![0u8; 100 + rank];
            let wanted = 100 + left;
            got.truncate(wanted);
            got.resize(wanted, 0);
            let sent = input(DType::U8, 100 + rank, rank, 2);
            if rank.is_multiple_of(2) {
                comm.try_send(right, &sent)?;
                comm.try_recv(left, &mut got)?;
            } else {
                comm.try_recv(left, &mut got)?;
                comm.try_send(right, &sent)?;
            }
            Ok::<_, Error>((data, all, got))
        });
        let inputs: Vec<Vec<u8>> = (0..ranks).map(|r| input(dtype, elements, r, 0)).collect();
        let expect = fold(op, dtype, &inputs);
        let gathered: Vec<u8> = (0..ranks).flat_map(|r| input(DType::U8, gather, r, 1)).collect();
        for (rank, outcome) in report.outcomes.iter().enumerate() {
            let left = (rank + ranks - 1) % ranks;
            match outcome {
                Outcome::Returned(Ok((data, all, got))) => {
                    prop_assert!(data == &expect, "rank {rank}: the fold differs; {}", report.replay());
                    prop_assert!(all == &gathered, "rank {rank}: the gather differs");
                    prop_assert_eq!(got, &input(DType::U8, 100 + left, left, 2));
                }
                other => prop_assert!(false, "rank {rank}: {other:?}; {}", report.replay()),
            }
        }
    }
}

/// The virtual time a 4 KiB float32 all-reduce takes on `ranks` ranks speaking `wire`, with a
/// fixed 100 µs latency a hop and no jitter.
fn small_all_sum_time(ranks: usize, wire: Wire) -> Duration {
    all_sum_time(ranks, wire, 1024)
}

/// The virtual time an all-reduce of `elements` float32 takes on `ranks` ranks speaking
/// `wire`, with a fixed 100 µs latency a hop, no jitter and 10 GB/s links.
fn all_sum_time(ranks: usize, wire: Wire, elements: usize) -> Duration {
    let report = Sim::ring(ranks, 1)
        .seed(1)
        .wire(wire)
        .latency(Duration::from_micros(100), Duration::ZERO)
        .run(|fabric| {
            let clock = fabric.clock();
            let rank = fabric.rank();
            let comm = RingCommunicator::new(fabric, 1, TIMEOUT).with_wire(wire);
            let mut data = input(DType::F32, elements, rank, 0);
            let start = clock.now();
            comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)
                .map(|()| clock.now() - start)
        });
    report
        .outcomes
        .into_iter()
        .map(|o| o.returned().expect("returned").expect("summed"))
        .max()
        .expect("ranks")
}

#[test]
fn a_small_all_sum_on_the_nuvec_wire_takes_half_the_ring_in_hops_where_mlx_takes_twice_the_ring() {
    for ranks in [2usize, 3, 4, 5, 8] {
        let hop = Duration::from_micros(100);
        let nuvec = small_all_sum_time(ranks, Wire::Nuvec);
        let mlx = small_all_sum_time(ranks, Wire::Mlx);
        let hops = |t: Duration| t.as_secs_f64() / hop.as_secs_f64();
        let (relay_hops, ring_hops) = (relay::steps(ranks), 2 * (ranks - 1));
        assert!(
            hops(nuvec) >= relay_hops as f64 && hops(nuvec) < relay_hops as f64 + 0.5,
            "{ranks} ranks: the nuvec wire took {:.2} hops, not {relay_hops}",
            hops(nuvec)
        );
        assert!(
            hops(mlx) >= ring_hops as f64 && hops(mlx) < ring_hops as f64 + 0.5,
            "{ranks} ranks: MLX's wire took {:.2} hops, not {ring_hops}",
            hops(mlx)
        );
    }
}

#[test]
fn an_all_sum_above_the_crossover_takes_mlx_hops_on_the_nuvec_wire_its_headers_riding_the_first_step()
 {
    for ranks in [2usize, 4] {
        let elements = 4 * relay::ALL_REDUCE_CROSSOVER / 4;
        let nuvec = all_sum_time(ranks, Wire::Nuvec, elements);
        let mlx = all_sum_time(ranks, Wire::Mlx, elements);
        assert!(
            nuvec.as_secs_f64() <= mlx.as_secs_f64() * 1.01,
            "{ranks} ranks: {nuvec:?} on the nuvec wire against {mlx:?} on MLX's"
        );
    }
}

/// Every byte each rank wrote on its links during one collective of `bytes` per rank on the
/// nuvec wire (an all_sum of float32 when `reduce`, else an all_gather), per `(sender,
/// sender's channel)`.
fn wire_of(ranks: usize, reduce: bool, bytes: usize) -> BTreeMap<(usize, Channel), Vec<u8>> {
    let report = Sim::ring(ranks, 1)
        .seed(3)
        .wire(Wire::Nuvec)
        .record_wire(true)
        .run(|fabric| {
            let rank = fabric.rank();
            let comm = comm(fabric, 1);
            if reduce {
                let mut data = input(DType::F32, bytes / 4, rank, 0);
                comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)
            } else {
                let mut out = vec![0u8; bytes * ranks];
                comm.try_all_gather(&vec![7u8; bytes], &mut out)
            }
        });
    for (rank, outcome) in report.outcomes.into_iter().enumerate() {
        outcome
            .returned()
            .expect("returned")
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
    report.wire
}

#[test]
fn on_two_ranks_a_collective_that_goes_one_way_goes_rightward_and_writes_nothing_the_other_way() {
    // Above the relay and below 2R × 256 KiB an all_sum moves one way; an all-gather on two
    // ranks never relays, and below 512 KiB per rank moves one way.
    for (reduce, bytes) in [(true, 64 * 1024), (false, 4), (false, 64 * 1024)] {
        let wire = wire_of(2, reduce, bytes);
        for rank in 0..2 {
            let peer = 1 - rank;
            // Link 0 is the one this rank opened to its right neighbour; link 1 the left's.
            let right = &wire[&(rank, Channel::new(peer, 0))];
            assert_eq!(
                &right[..4],
                b"nuvW",
                "reduce {reduce}, {bytes} B: rank {rank}"
            );
            // The header, then MLX's bytes: half the vector twice for an all_sum, the block
            // once for an all_gather.
            assert_eq!(
                right.len(),
                32 + bytes,
                "reduce {reduce}, {bytes} B: rank {rank}"
            );
            let left = wire.get(&(rank, Channel::new(peer, 1)));
            assert!(
                left.is_none_or(Vec::is_empty),
                "reduce {reduce}, {bytes} B: rank {rank} wrote {} bytes leftward",
                left.map_or(0, Vec::len)
            );
        }
    }
    // From 2R × 256 KiB MLX's schedule goes both ways, and so does a header.
    let wire = wire_of(2, true, 1024 * 1024);
    for rank in 0..2 {
        for link in 0..2 {
            assert_eq!(&wire[&(rank, Channel::new(1 - rank, link))][..4], b"nuvW");
        }
    }
}

#[test]
fn on_more_ranks_a_collective_that_goes_one_way_still_sends_its_header_both_ways() {
    // MLX's one way is leftward; rightward each rank writes its header alone, so that a
    // neighbour's send to its left or receive from its right is seen at once (see
    // `src/ring/checked.rs`).
    let wire = wire_of(4, true, 64 * 1024);
    for rank in 0..4 {
        let right = &wire[&(rank, Channel::new((rank + 1) % 4, 0))];
        assert_eq!(
            (&right[..4], right.len()),
            (&b"nuvW"[..], 32),
            "rank {rank}"
        );
    }
}

/// One rank's call in the mismatch property.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Call {
    Reduce(Reduction, DType, usize),
    Gather(usize),
    /// Send this many bytes to the right neighbour.
    SendRight(usize),
    /// Receive this many bytes from the left neighbour.
    RecvLeft(usize),
    /// Send this many bytes to the left neighbour.
    SendLeft(usize),
    /// Receive this many bytes from the right neighbour.
    RecvRight(usize),
}

impl Call {
    fn point_to_point(self) -> bool {
        matches!(
            self,
            Call::SendRight(_) | Call::RecvLeft(_) | Call::SendLeft(_) | Call::RecvRight(_)
        )
    }
}

fn call() -> impl Strategy<Value = Call> {
    let size = prop_oneof![1usize..64, 70_000usize..80_000];
    prop_oneof![
        (
            proptest::sample::select(OPS.to_vec()),
            proptest::sample::select(vec![DType::F32, DType::I32, DType::F64]),
            size.clone()
        )
            .prop_map(|(op, dtype, n)| Call::Reduce(op, dtype, n)),
        size.clone().prop_map(Call::Gather),
        size.clone().prop_map(Call::SendRight),
        size.clone().prop_map(Call::RecvLeft),
        size.clone().prop_map(Call::SendLeft),
        size.prop_map(Call::RecvRight),
    ]
}

proptest! {
    #![proptest_config(config(64))]

    /// Some ranks call something else than the others (another collective, dtype, size, or a
    /// send or receive): no rank returns data, none waits for its deadline, and where every rank
    /// failed some rank names both calls.
    #[test]
    fn a_mismatched_call_fails_every_rank_and_none_returns_data(
        ranks in 2usize..=6,
        links in 1usize..=2,
        common in call(),
        other in call(),
        odd in proptest::collection::vec(any::<bool>(), 6),
        seed in any::<u64>(),
    ) {
        prop_assume!(common != other);
        // A pair of point-to-point calls that happen to match is not a mismatch.
        prop_assume!(!common.point_to_point());
        let odd: Vec<bool> = (0..ranks).map(|r| odd[r]).collect();
        prop_assume!(odd.iter().any(|&o| o) && odd.iter().any(|&o| !o));
        let calls: Vec<Call> = odd.iter().map(|&o| if o { other } else { common }).collect();
        let report = sim(ranks, links, seed, 4096, 64 * 1024).run(|fabric| {
            let rank = fabric.rank();
            let comm = comm(fabric, links);
            let (right, left) = ((rank + 1) % ranks, (rank + ranks - 1) % ranks);
            match calls[rank] {
                Call::Reduce(op, dtype, n) => {
                    let size = match dtype { DType::F64 => 8, _ => 4 };
                    let mut data = vec![1u8; n * size];
                    comm.try_all_reduce(op, dtype, &mut data).map(|()| data)
                }
                Call::Gather(n) => {
                    let mut out = vec![0u8; n * ranks];
                    comm.try_all_gather(&vec![2u8; n], &mut out).map(|()| out)
                }
                Call::SendRight(n) => comm.try_send(right, &vec![3u8; n]).map(|()| Vec::new()),
                Call::RecvLeft(n) => {
                    let mut got = vec![0u8; n];
                    comm.try_recv(left, &mut got).map(|()| got)
                }
                Call::SendLeft(n) => comm.try_send(left, &vec![4u8; n]).map(|()| Vec::new()),
                Call::RecvRight(n) => {
                    let mut got = vec![0u8; n];
                    comm.try_recv(right, &mut got).map(|()| got)
                }
            }
        });
        let (mut named, mut sent) = (0, 0);
        for (rank, outcome) in report.outcomes.iter().enumerate() {
            match outcome {
                Outcome::Returned(Err(e)) => {
                    let text = e.to_string();
                    prop_assert!(!text.contains("timed out"), "rank {rank} waited for its deadline: {text}; calls {calls:?}; {}", report.replay());
                    if text.contains("where this rank called") {
                        named += 1;
                    }
                }
                // A send whose bytes fit in the window completes before its peer looks; it
                // returns no data.
                Outcome::Returned(Ok(data)) if data.is_empty() && matches!(calls[rank], Call::SendRight(_) | Call::SendLeft(_)) => sent += 1,
                other => prop_assert!(false, "rank {rank} ({:?}) returned {other:?}; calls {calls:?}; {}", calls[rank], report.replay()),
            }
        }
        // A rank whose send completed may leave (and close its links) before the header that
        // would have told its neighbour arrives there: that neighbour reports the close.
        prop_assert!(named > 0 || sent > 0, "no rank named the mismatch; calls {calls:?}; {}", report.replay());
    }
}

#[test]
fn ranks_that_call_all_sum_and_all_gather_of_the_same_size_name_both_calls() {
    let report = Sim::ring(2, 1).seed(5).run(|fabric| {
        let rank = fabric.rank();
        let comm = comm(fabric, 1);
        let mut data: Vec<u8> = [3f32, 6.0, 9.0, 12.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        if rank == 0 {
            comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)
                .map(|()| data)
        } else {
            let mut out = vec![0u8; 32];
            comm.try_all_gather(&data, &mut out).map(|()| out)
        }
    });
    let texts: Vec<String> = report
        .outcomes
        .into_iter()
        .map(|o| match o.returned() {
            Some(Err(e)) => e.to_string(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(
        texts[0].contains(
            "rank 1 called all_gather #0 of 16 bytes per rank where this rank called all_sum #0 \
             of 16 bytes (float32)"
        ),
        "{}",
        texts[0]
    );
    assert!(
        texts[1].contains(
            "rank 0 called all_sum #0 of 16 bytes (float32) where this rank called all_gather \
             #0 of 16 bytes per rank"
        ),
        "{}",
        texts[1]
    );
}

proptest! {
    #![proptest_config(config(32))]

    /// On 4 ranks, one rank stalled past the relay's hold while the others' first steps wait
    /// for it, or links so slow that a header takes about the hold to cross, with fragments as
    /// small as a byte: the headers that went ahead land in part or whole, and every rank
    /// still returns the rank-order fold and the gather.
    #[test]
    fn on_four_ranks_a_first_step_held_up_past_the_hold_still_gives_every_rank_the_fold(
        stalled in 0usize..4,
        stall_us in 0u64..3000,
        fragment in 1usize..=48,
        bytes_per_sec in prop_oneof![Just(0u64), 8_000u64..64_000],
        seed in any::<u64>(),
    ) {
        let (ranks, elements, gather) = (4, 24, 40);
        let mut sim = sim(ranks, 1, seed, fragment, 64 * 1024);
        if bytes_per_sec > 0 {
            sim = sim.bandwidth(bytes_per_sec);
        }
        let report = sim
            .fault(nuvec_fabric_sim::Fault::Stall {
                rank: stalled,
                at: Duration::ZERO,
                duration: Duration::from_micros(stall_us),
            })
            .run(|fabric| {
                let rank = fabric.rank();
                let comm = comm(fabric, 1);
                let mut data = input(DType::F32, elements, rank, 0);
                comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)?;
                let mut all = vec![0u8; gather * ranks];
                comm.try_all_gather(&input(DType::U8, gather, rank, 1), &mut all)?;
                Ok::<_, Error>((data, all))
            });
        let inputs: Vec<Vec<u8>> = (0..ranks).map(|r| input(DType::F32, elements, r, 0)).collect();
        let expect = fold(Reduction::Sum, DType::F32, &inputs);
        let gathered: Vec<u8> = (0..ranks).flat_map(|r| input(DType::U8, gather, r, 1)).collect();
        for (rank, outcome) in report.outcomes.iter().enumerate() {
            match outcome {
                Outcome::Returned(Ok((data, all))) => {
                    prop_assert!(data == &expect, "rank {rank}: the fold differs; {}", report.replay());
                    prop_assert!(all == &gathered, "rank {rank}: the gather differs; {}", report.replay());
                }
                other => prop_assert!(false, "rank {rank}: {other:?}; {}", report.replay()),
            }
        }
    }
}

#[test]
fn on_four_ranks_a_neighbour_in_another_call_reads_the_relays_held_header_once_the_pair_waits_past_the_hold()
 {
    // Ranks 1 and 3 gather by the relay's pairs ({0,1}{2,3}, then {0,3}{1,2}); ranks 0 and 2
    // each receive from their left. Each gathering rank's first partner waits on its other
    // link, so its first step never ends: only the header it holds for its second partner
    // (ranks 2 and 0), sent once it has waited the hold, tells those receivers of the
    // mismatch.
    let report = sim(4, 1, 7, 4096, 64 * 1024).run(|fabric| {
        let clock = fabric.clock();
        let rank = fabric.rank();
        let comm = comm(fabric, 1);
        let result = if rank % 2 == 1 {
            let mut out = vec![0u8; 16 * 4];
            comm.try_all_gather(&[2u8; 16], &mut out).map(|()| out)
        } else {
            let mut got = vec![0u8; 16];
            comm.try_recv((rank + 3) % 4, &mut got).map(|()| got)
        };
        (result, clock.now())
    });
    for (rank, outcome) in report.outcomes.into_iter().enumerate() {
        let (result, at) = outcome.returned().expect("every rank returns");
        let text = match result {
            Err(e) => e.to_string(),
            Ok(data) => panic!("rank {rank} returned {data:?}"),
        };
        assert!(at < relay::HOLD * 10, "rank {rank} ended at {at:?}: {text}");
        if rank % 2 == 0 {
            assert!(
                text.contains(
                    "called all_gather #0 of 16 bytes per rank where this rank called recv"
                ),
                "rank {rank}: {text}"
            );
            assert!(
                at >= relay::HOLD,
                "rank {rank} read the header at {at:?}, before the hold"
            );
        }
    }
}

/// A simulated rank's fabric that keeps what every step's transfers ahead moved.
struct Watched {
    inner: nuvec_fabric_sim::SimFabric,
    moved: std::sync::Arc<std::sync::Mutex<Vec<Vec<usize>>>>,
}

impl Fabric for Watched {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn kind(&self) -> nuvec_distributed::fabric::ChannelKind {
        self.inner.kind()
    }
    fn links(&self, peer: usize) -> usize {
        self.inner.links(peer)
    }
    fn now(&self) -> Duration {
        Fabric::now(&self.inner)
    }
    fn run(
        &mut self,
        step: &mut [nuvec_distributed::fabric::Transfer<'_>],
        deadline: Duration,
    ) -> Result<(), nuvec_distributed::fabric::FabricError> {
        self.inner.run(step, deadline)
    }
    fn run_ahead(
        &mut self,
        step: &mut [nuvec_distributed::fabric::Transfer<'_>],
        ahead: nuvec_distributed::fabric::Ahead,
        deadline: Duration,
        moved: &mut [usize],
    ) -> Result<(), nuvec_distributed::fabric::FabricError> {
        let result = self.inner.run_ahead(step, ahead, deadline, moved);
        if let Ok(mut all) = self.moved.lock() {
            all.push(moved.to_vec());
        }
        result
    }
    fn forwards(&self) -> bool {
        self.inner.forwards()
    }
    fn sends_later(&mut self, channels: &[Channel]) {
        self.inner.sends_later(channels)
    }
    fn epoch_us(&self) -> Option<u64> {
        self.inner.epoch_us()
    }
}

#[test]
fn on_four_ranks_whose_calls_agree_the_relays_held_headers_ride_with_the_second_step() {
    // Hops of 20–35 µs end every first step long before the hold: no header goes ahead alone,
    // and every rank still gets the fold and the gather.
    let moved = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let watched = moved.clone();
    let (ranks, elements, gather) = (4, 24, 40);
    let report = sim(ranks, 1, 11, 4096, 64 * 1024).run(move |fabric| {
        let rank = fabric.rank();
        let fabric = Watched {
            inner: fabric,
            moved: watched.clone(),
        };
        let comm = RingCommunicator::new(fabric, 1, TIMEOUT).with_wire(Wire::Nuvec);
        let mut data = input(DType::F32, elements, rank, 0);
        comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data)?;
        let mut all = vec![0u8; gather * ranks];
        comm.try_all_gather(&input(DType::U8, gather, rank, 1), &mut all)?;
        Ok::<_, Error>((data, all))
    });
    let inputs: Vec<Vec<u8>> = (0..ranks)
        .map(|r| input(DType::F32, elements, r, 0))
        .collect();
    let expect = fold(Reduction::Sum, DType::F32, &inputs);
    for (rank, outcome) in report.outcomes.into_iter().enumerate() {
        let (data, _) = outcome.returned().expect("returned").expect("summed");
        assert_eq!(data, expect, "rank {rank}");
    }
    let moved = moved.lock().expect("the steps' record").clone();
    // Two relayed operations on each of 4 ranks, one step with transfers ahead each.
    assert_eq!(moved, vec![vec![0, 0]; 2 * ranks]);
}
