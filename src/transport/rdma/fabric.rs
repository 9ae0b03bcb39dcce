//! [`RdmaFabric`]: the queue pairs of one rank behind the crate's [`Fabric`] trait, as
//! [message channels](ChannelKind::Message), and its step loop; the type's docs state the data
//! path.

use std::fmt;
use std::time::{Duration, Instant};

use super::MAX_FRAME;
use super::queue::{Completed, Completion, Undeliverable};
use super::queue_pair::Qp;
use super::verbs::status_name;
use crate::config::log::Log;
use crate::config::options::Spin;
use crate::fabric::{
    Channel, ChannelKind, Direction, Fabric, FabricError, FailureKind, Patience, Stall, Transfer,
    Watch, blame, most_stuck,
};
use crate::transport::wait::{Next, Waiter};

/// Why transfer `i` of `step` cannot run on a fabric whose channels are `exists`: a channel
/// that does not exist, a message larger than a frame, or what every fabric refuses
/// ([`Transfer::check_in`]: this fabric does not forward).
pub(crate) fn check_transfer(step: &[Transfer<'_>], i: usize, exists: bool) -> Option<String> {
    let transfer = &step[i];
    let channel = transfer.channel();
    if !exists {
        return Some(format!("there is no RDMA queue pair for {channel}"));
    }
    let len = transfer.len();
    if len > MAX_FRAME {
        let what = match transfer.direction() {
            Direction::Send => "a send",
            Direction::Recv => "a receive",
        };
        return Some(format!(
            "{what} of {len} bytes on {channel}: one RDMA message holds at most {MAX_FRAME} bytes \
             (one frame)"
        ));
    }
    Transfer::check_in(step, i, false).err()
}

/// How the fabric waits by default: every poll but the first after a yield.
const POLL: Spin = Spin::Fixed(Duration::ZERO);

/// MLX's RDMA fabric: UC queue pairs as [message channels](ChannelKind::Message), made by
/// `jaccl::rdma::connect` (whose docs give the channel numbering).
///
/// # Bring-up, per queue pair (as MLX)
///
/// Open the device whose name matches exactly; allocate a protection domain; create a
/// completion queue of 64 entries (no completion channel: completions are busy-polled);
/// create a UC queue pair on it (32 send and 32 receive work requests, 1 SGE each way, no
/// inline data, `sq_sig_all` 0); register the frames (local write, remote read, remote write);
/// move to INIT (port 1, pkey index 0, the same access flags); read the LID of port 1 and the
/// first IPv4-mapped GID of its GID table; advertise packet sequence number 7. After the peers'
/// details are known: RTR (MTU 1024, the remote PSN, the remote QP number, the remote LID,
/// port 1, and when the remote GID's interface id is not zero a global route to it with source
/// GID index 1 — MLX hard-codes 1 — and hop limit 1), the receives posted, RTS (send PSN 7).
///
/// # Data path
///
/// Every queue pair owns page-aligned registered frames of [`MAX_FRAME`] bytes (512 KiB,
/// MLX's largest size class, so that any message fits whatever frame size the peers use):
/// [`IN_FLIGHT`](super::IN_FLIGHT) send frames and [`RECV_AHEAD`](super::RECV_AHEAD) receive frames.
///
/// - A send of n bytes (1 ≤ n ≤ [`MAX_FRAME`]) is staged into a free send frame and posted as
///   one signaled `IBV_WR_SEND` of exactly those n bytes; at most [`IN_FLIGHT`](super::IN_FLIGHT) sends are in
///   flight per queue pair (MLX's `NUM_BUFFERS`); it completes with its (local) work
///   completion. A larger send fails with
///   [`FailureKind::Invalid`](crate::fabric::FailureKind::Invalid).
/// - The fabric keeps [`RECV_AHEAD`](super::RECV_AHEAD) receives posted on every queue pair from the moment it is
///   ready to receive, twice MLX's depth of 2, so that a peer that runs ahead of this rank by
///   one step of two messages still finds a receive. A message that completes a receive waits
///   in its frame, in arrival order, until a receive transfer takes it; its frame is posted
///   again once delivered. So a receive takes exactly one message: its completion status must
///   be success (else `FailureKind::Completion` naming the status) and its length must be the
///   receive's (else `FailureKind::MessageSize`); the bytes are handed to the landing at once.
/// - **Difference from MLX: messages are numbered.** Each send is an
///   `IBV_WR_SEND_WITH_IMM` whose immediate data is the queue pair's message count (0, 1, 2 …,
///   big-endian, wrapping), and a received message that carries one must carry the number
///   due, else the receive fails with `FailureKind::Lost`: on UC a lost message is otherwise
///   replaced, without a word, by the next one, and the collective would return wrong data.
///   The bytes and the message count on the wire are MLX's; MLX's peers post the same receives
///   and ignore the immediate data, and a message from them carries none, so it is taken
///   unchecked. A provider that refuses immediate data on the first send (`EINVAL` or
///   `EOPNOTSUPP`) gets plain SENDs from then on.
/// - Transfers of no bytes complete at once and move nothing (no message).
/// - Completions are polled with the core yielded between polls, where MLX polls without
///   end: there is no completion channel to sleep on (MLX's bring-up has none), and a thread
///   that never yields starves whatever else needs the core. Measured with
///   `benches/waits.sh` over the software provider (whose threads carry the messages on the
///   same 2 cores, a stand-in for a busy machine), 2-rank mesh all_sum p50, yielding against
///   polling without end, five runs: 4 KiB 9.1–15.4 µs against 9.3–27 µs, 64 KiB
///   78–154 µs against 88–140 µs, 1 MiB 1.60–1.70 ms against 2.35–2.48 ms, with less CPU.
///   An idle core's yield returns within a microsecond. The adaptive look of the `wait`
///   module, which polls at once for up to 100 µs first, lost to both at 64 KiB
///   (162–186 µs). [`RdmaFabric::with_spin`] polls at once for a fixed time first.
/// - The step's deadline is checked against the fabric's
///   monotonic clock. When it passes, the step fails with `FailureKind::TimedOut` naming the
///   transfer that made the least progress: on UC a dead peer produces no error completion,
///   only silence.
/// - While a step waits without a completion, it consults its [`Watch`] (JACCL's side channel:
///   a peer found gone fails the step at once; and the progress timeout), at most every
///   [`CHECK_EVERY`](crate::fabric::CHECK_EVERY) once silent for
///   [`QUIET`](crate::fabric::QUIET): UC never reports a dead peer by itself.
/// - Transfers on the same channel and direction run in the order given.
/// - `last_heard` is when a message from the peer last completed a receive.
///
/// Dropping the fabric destroys, per queue pair, the queue pair, then the completion queue,
/// deregisters the frames, deallocates the protection domain and closes the device, in that
/// order; failures while releasing are ignored (there is nobody to report them to).
pub struct RdmaFabric {
    rank: usize,
    size: usize,
    start: Instant,
    qps: Vec<Qp>,
    /// `by_peer[peer][link]`: the index of the channel's queue pair in `qps`.
    by_peer: Vec<Vec<usize>>,
    /// Per peer, when a message from it last completed a receive ([`Fabric::last_heard`]).
    heard: Vec<Option<Duration>>,
    /// What a step that waits without a completion consults.
    watch: Watch,
    /// When a step that waits polls at once and when it yields the core between polls.
    waiter: Waiter,
    /// Where the queue pairs report a failed teardown.
    log: Log,
}

impl fmt::Debug for RdmaFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaFabric")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("queue_pairs", &self.qps.len())
            .finish()
    }
}

impl RdmaFabric {
    /// A fabric of rank `rank` of `size` with no queue pair yet.
    pub(crate) fn new(rank: usize, size: usize) -> RdmaFabric {
        RdmaFabric {
            rank,
            size,
            start: Instant::now(),
            qps: Vec::new(),
            by_peer: vec![Vec::new(); size],
            heard: vec![None; size],
            watch: Watch::default(),
            waiter: Waiter::new(POLL),
            log: Log::off(),
        }
    }

    /// Makes every step that waits without a completion wait as `spin` says: a fixed spin
    /// polls at once for that long, then yields between polls; the default (adaptive) yields
    /// between polls from the start (see the type's docs for why).
    pub(crate) fn set_wait(&mut self, spin: Spin) {
        self.waiter = Waiter::new(match spin {
            Spin::Adaptive(_) => POLL,
            fixed @ Spin::Fixed(_) => fixed,
        });
    }

    /// Makes every step that waits without a completion poll at once for exactly `spin`, and
    /// only then yield the core between polls (MLX polls at once forever; `Duration::MAX`
    /// does as MLX). Without it every poll but the first comes after a yield.
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.set_wait(Spin::Fixed(spin));
        self
    }

    /// Makes every step that waits without a completion consult `watch` (see
    /// [`Watch`](crate::fabric::Watch)).
    pub(crate) fn set_watch(&mut self, watch: Watch) {
        self.watch = watch;
    }

    /// The queue pairs, in the order they were added.
    pub(crate) fn queue_pairs_mut(&mut self) -> &mut [Qp] {
        &mut self.qps
    }

    /// Starts the fabric's clock ([`Fabric::now`]): once every queue pair is connected.
    pub(crate) fn start_clock(&mut self) {
        self.start = Instant::now();
    }

    /// Reports the queue pairs' teardown failures (a memory region leaked) to `log`.
    pub(crate) fn set_log(&mut self, log: Log) {
        self.log = log;
        for qp in &mut self.qps {
            qp.log = log;
        }
    }

    /// Adds a queue pair under its channel.
    pub(crate) fn add(&mut self, mut qp: Qp) {
        qp.log = self.log;
        let Channel { peer, link } = qp.channel;
        let links = &mut self.by_peer[peer];
        if links.len() <= link {
            links.resize(link + 1, usize::MAX);
        }
        links[link] = self.qps.len();
        self.qps.push(qp);
    }

    /// The index of `channel`'s queue pair.
    fn qp_of(&self, channel: Channel) -> Option<usize> {
        self.by_peer
            .get(channel.peer)
            .and_then(|links| links.get(channel.link))
            .copied()
            .filter(|i| *i < self.qps.len())
    }
}

/// A failure of a queue pair that no transfer of the step is to blame for.
fn queue_pair_failure(channel: Channel, direction: Direction, kind: FailureKind) -> FabricError {
    FabricError {
        channel,
        direction,
        done: 0,
        total: 0,
        kind,
    }
}

/// A failure of transfer `t` of `step`.
fn failure(step: &[Transfer<'_>], t: usize, done: &[bool], kind: FailureKind) -> FabricError {
    let transfer = &step[t];
    FabricError {
        channel: transfer.channel(),
        direction: transfer.direction(),
        done: if done[t] { transfer.len() } else { 0 },
        total: transfer.len(),
        kind,
    }
}

impl Fabric for RdmaFabric {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn kind(&self) -> ChannelKind {
        ChannelKind::Message
    }

    fn links(&self, peer: usize) -> usize {
        self.by_peer.get(peer).map_or(0, Vec::len)
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn last_heard(&self, peer: usize) -> Option<Duration> {
        self.heard.get(peer).copied().flatten()
    }

    fn set_patience(&mut self, patience: Box<dyn Patience>) {
        self.watch.set_patience(patience);
    }

    fn run(&mut self, step: &mut [Transfer<'_>], deadline: Duration) -> Result<(), FabricError> {
        let result = self.step(step, deadline);
        if result.is_err() {
            self.watch.failed();
        }
        result
    }
}

impl RdmaFabric {
    /// [`Fabric::run`] but for telling the watch that the group failed.
    fn step(&mut self, step: &mut [Transfer<'_>], deadline: Duration) -> Result<(), FabricError> {
        let started = self.now();
        let n = step.len();
        let mut done = vec![false; n];
        let mut owner = Vec::with_capacity(n);
        for (t, transfer) in step.iter().enumerate() {
            let qp = self.qp_of(transfer.channel());
            if let Some(what) = check_transfer(step, t, qp.is_some()) {
                return Err(failure(step, t, &done, FailureKind::Invalid(what)));
            }
            owner.push(qp.unwrap_or(usize::MAX));
        }
        // Per queue pair, the transfers of this step in order; what a failed step left in
        // flight belongs to no transfer of this one.
        for qp in &mut self.qps {
            qp.queue.begin_step();
        }
        let mut remaining = 0usize;
        for (t, transfer) in step.iter().enumerate() {
            if transfer.is_empty() {
                done[t] = true;
                continue;
            }
            remaining += 1;
            self.qps[owner[t]].queue.push(t, transfer.direction());
        }
        let mut wcs: Vec<Completion> = Vec::new();
        // When the step last progressed (or started), for its watch.
        let mut quiet_since = started;
        self.waiter.reset();
        // When the pass under way began: the clock is read once a pass, after it (the waiter
        // is always a fixed spin here, which needs no more precision than that).
        let mut pass = started;
        while remaining > 0 {
            let mut progressed = false;
            for qp in self.qps.iter_mut() {
                if qp.queue.is_idle() {
                    continue;
                }
                // Post the sends in order while a frame is free.
                while let Some((slot, t)) = qp.queue.next_send() {
                    let data: &[u8] = match &step[t] {
                        Transfer::Send { data, .. } => data,
                        // Refused before the step started (`check_transfer`).
                        Transfer::Recv { .. } | Transfer::Forward { .. } => &[],
                    };
                    qp.post_send(slot, data).map_err(|e| {
                        failure(
                            step,
                            t,
                            &done,
                            FailureKind::Transport(format!("{}: {e}", qp.what)),
                        )
                    })?;
                    qp.queue.posted(slot, t);
                    progressed = true;
                }
                // Take the completions.
                if let Err(e) = qp.poll(&mut wcs) {
                    let kind = FailureKind::Transport(format!("{}: {e}", qp.what));
                    return Err(match qp.queue.waiting() {
                        Some(t) => failure(step, t, &done, kind),
                        None => queue_pair_failure(qp.channel, Direction::Send, kind),
                    });
                }
                for wc in &wcs {
                    progressed = true;
                    match qp.queue.on_completion(wc) {
                        Completed::Sent(Some(t)) => {
                            done[t] = true;
                            remaining -= 1;
                        }
                        Completed::Sent(None) => {}
                        Completed::SendFailed {
                            owner,
                            status: (status, vendor),
                        } => {
                            let kind = FailureKind::Completion(format!(
                                "{} (vendor error {vendor:#x}) on {}",
                                status_name(status),
                                qp.what
                            ));
                            return Err(match owner {
                                Some(t) => failure(step, t, &done, kind),
                                None => queue_pair_failure(qp.channel, Direction::Send, kind),
                            });
                        }
                        Completed::Arrived { heard } => {
                            if heard && let Some(last) = self.heard.get_mut(qp.channel.peer) {
                                *last = Some(self.start.elapsed());
                            }
                        }
                        Completed::Unknown(id) => {
                            let kind = FailureKind::Transport(format!(
                                "{}: a work completion with an unknown id {id:#x}",
                                qp.what
                            ));
                            return Err(queue_pair_failure(qp.channel, Direction::Recv, kind));
                        }
                    }
                }
                // Hand arrived messages to the receives, in order.
                while let Some(delivery) = qp.queue.next_delivery(|t| step[t].len()) {
                    progressed = true;
                    let t = delivery.transfer;
                    let len = match delivery.outcome {
                        Ok(len) => len,
                        Err(Undeliverable::Completion(status, vendor)) => {
                            let kind = FailureKind::Completion(format!(
                                "{} (vendor error {vendor:#x}) on {}",
                                status_name(status),
                                qp.what
                            ));
                            return Err(failure(step, t, &done, kind));
                        }
                        Err(Undeliverable::Lost { expected, got }) => {
                            let kind = FailureKind::Lost {
                                expected: u64::from(expected),
                                got: u64::from(got),
                            };
                            return Err(failure(step, t, &done, kind));
                        }
                        Err(Undeliverable::Size { want, got }) => {
                            let kind = FailureKind::MessageSize { want, got };
                            return Err(failure(step, t, &done, kind));
                        }
                    };
                    if let Transfer::Recv { landing, .. } = &mut step[t] {
                        landing.deliver(0, qp.received(delivery.frame, len));
                    }
                    qp.post_recv(delivery.frame).map_err(|e| {
                        failure(
                            step,
                            t,
                            &done,
                            FailureKind::Transport(format!(
                                "{}: re-posting a receive: {e}",
                                qp.what
                            )),
                        )
                    })?;
                    done[t] = true;
                    remaining -= 1;
                }
            }
            if remaining == 0 {
                break;
            }
            let now = self.now();
            if now >= deadline {
                let t = most_stuck(step, |i| if done[i] { step[i].len() } else { 0 });
                let waited = now.saturating_sub(started);
                return Err(match t {
                    Some(t) => failure(step, t, &done, FailureKind::TimedOut { waited }),
                    None => FabricError {
                        channel: Channel::new(self.rank, 0),
                        direction: Direction::Recv,
                        done: 0,
                        total: 0,
                        kind: FailureKind::TimedOut { waited },
                    },
                });
            }
            if progressed {
                quiet_since = now;
                self.waiter.moved(pass);
            } else {
                if self.watch.report_due(now)
                    && let Some(t) = most_stuck(step, |i| if done[i] { step[i].len() } else { 0 })
                {
                    // A message moves whole: nothing of it is done until it is.
                    let c = step[t].channel();
                    let stall = Stall {
                        channel: c,
                        direction: step[t].direction(),
                        done: 0,
                        total: step[t].len(),
                        heard_ago: self.last_heard(c.peer).map(|at| now.saturating_sub(at)),
                        alive: None,
                    };
                    self.watch.report(now, &stall);
                }
                if let Err(stop) = self.watch.waiting(now, quiet_since) {
                    let heard = &self.heard;
                    let t = blame(
                        step,
                        |i| done[i],
                        |p| heard.get(p).copied().flatten(),
                        stop.gone(),
                    );
                    return Err(stop.failure(step, t, 0, self.rank));
                }
                match self.waiter.idle(now) {
                    Next::Look => std::hint::spin_loop(),
                    // No completion channel to sleep on: give the core to whoever wants it
                    // between polls.
                    Next::Park => std::thread::yield_now(),
                }
            }
            pass = now;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::Landing;

    #[test]
    fn steps_the_fabric_cannot_carry_are_refused_with_a_reason() {
        let big = vec![0u8; MAX_FRAME + 1];
        let send = Transfer::Send {
            channel: Channel::new(1, 0),
            data: &big,
        };
        let e = check_transfer(std::slice::from_ref(&send), 0, true).unwrap();
        assert!(
            e.contains("524289 bytes") && e.contains("at most 524288"),
            "{e}"
        );
        let e = check_transfer(std::slice::from_ref(&send), 0, false).unwrap();
        assert!(e.contains("no RDMA queue pair for rank 1 link 0"), "{e}");

        let fits = vec![0u8; MAX_FRAME];
        let send = Transfer::Send {
            channel: Channel::new(1, 0),
            data: &fits,
        };
        assert_eq!(check_transfer(std::slice::from_ref(&send), 0, true), None);

        let mut sink = |_: usize, _: &[u8]| {};
        let recv = Transfer::Recv {
            channel: Channel::new(2, 1),
            landing: Landing::Sink {
                len: 10,
                grain: 4,
                sink: &mut sink,
            },
        };
        let e = check_transfer(std::slice::from_ref(&recv), 0, true).unwrap();
        assert!(e.contains("whole number of grains"), "{e}");

        let mut buf = [0u8; 8];
        let relay = [
            Transfer::Recv {
                channel: Channel::new(2, 0),
                landing: Landing::Into(&mut buf),
            },
            Transfer::Forward {
                channel: Channel::new(1, 0),
                of: 0,
                len: 8,
            },
        ];
        let e = check_transfer(&relay, 1, true).unwrap();
        assert!(e.contains("does not forward"), "{e}");
    }
}
