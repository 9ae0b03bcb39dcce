//! [`RdmaFabric`]: the queue pairs of one rank behind the crate's [`Fabric`] trait, as
//! [message channels](ChannelKind::Message). See the [module docs](super) for the data path.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use super::queue_pair::{Arrival, Completion, Qp, Slot, WR_RECV, WR_SEND};
use super::verbs::status_name;
use super::{IN_FLIGHT, MAX_FRAME, RECV_AHEAD};
use crate::fabric::{
    Channel, ChannelKind, Direction, Fabric, FabricError, FailureKind, Landing, Transfer,
    most_stuck,
};

/// Why `transfer` cannot run on a fabric whose channels are `exists`: a channel that does not
/// exist, a message larger than a frame, a sink whose length is not a whole number of grains.
pub(crate) fn check_transfer(transfer: &Transfer<'_>, exists: bool) -> Option<String> {
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
    if let Transfer::Recv {
        landing: landing @ Landing::Sink { .. },
        ..
    } = transfer
    {
        let grain = landing.grain();
        if !len.is_multiple_of(grain) {
            return Some(format!(
                "a receive of {len} bytes on {channel} into a sink of {grain}-byte grains: the \
                 length must be a whole number of grains"
            ));
        }
    }
    None
}

/// MLX's RDMA fabric: UC queue pairs as [message channels](ChannelKind::Message). See the
/// [module docs](self) for the bring-up, the channel numbering and the data path.
pub struct RdmaFabric {
    rank: usize,
    size: usize,
    start: Instant,
    qps: Vec<Qp>,
    /// `by_peer[peer][link]`: the index of the channel's queue pair in `qps`.
    by_peer: Vec<Vec<usize>>,
    /// Per peer, when a message from it last completed a receive ([`Fabric::last_heard`]).
    heard: Vec<Option<Duration>>,
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
        }
    }

    /// The queue pairs, in the order they were added.
    pub(crate) fn queue_pairs_mut(&mut self) -> &mut [Qp] {
        &mut self.qps
    }

    /// Starts the fabric's clock ([`Fabric::now`]): once every queue pair is connected.
    pub(crate) fn start_clock(&mut self) {
        self.start = Instant::now();
    }

    /// Adds a queue pair under its channel.
    pub(crate) fn add(&mut self, qp: Qp) {
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

    fn run(&mut self, step: &mut [Transfer<'_>], deadline: Duration) -> Result<(), FabricError> {
        let started = self.now();
        let n = step.len();
        let mut done = vec![false; n];
        let mut owner = Vec::with_capacity(n);
        for (t, transfer) in step.iter().enumerate() {
            let qp = self.qp_of(transfer.channel());
            if let Some(what) = check_transfer(transfer, qp.is_some()) {
                return Err(failure(step, t, &done, FailureKind::Invalid(what)));
            }
            owner.push(qp.unwrap_or(usize::MAX));
        }
        // Per queue pair, the transfers of this step in order.
        let mut sends: Vec<VecDeque<usize>> = vec![VecDeque::new(); self.qps.len()];
        let mut recvs: Vec<VecDeque<usize>> = vec![VecDeque::new(); self.qps.len()];
        let mut remaining = 0usize;
        for (t, transfer) in step.iter().enumerate() {
            if transfer.is_empty() {
                done[t] = true;
                continue;
            }
            remaining += 1;
            match transfer.direction() {
                Direction::Send => sends[owner[t]].push_back(t),
                Direction::Recv => recvs[owner[t]].push_back(t),
            }
        }
        // Sends left in flight by an earlier, failed step belong to no transfer of this one.
        for qp in &mut self.qps {
            for slot in &mut qp.slots {
                if let Slot::Busy(owner) = slot {
                    *owner = None;
                }
            }
        }
        let mut wcs: Vec<Completion> = Vec::new();
        while remaining > 0 {
            let mut progressed = false;
            for (q, qp) in self.qps.iter_mut().enumerate() {
                let busy = qp.slots.iter().any(|s| *s != Slot::Free);
                if sends[q].is_empty() && recvs[q].is_empty() && !busy {
                    continue;
                }
                // Post the sends in order while a frame is free.
                while let Some(&t) = sends[q].front() {
                    let Some(slot) = qp.slots.iter().position(|s| *s == Slot::Free) else {
                        break;
                    };
                    let data: &[u8] = match &step[t] {
                        Transfer::Send { data, .. } => data,
                        Transfer::Recv { .. } => &[],
                    };
                    qp.post_send(slot, data).map_err(|e| {
                        failure(
                            step,
                            t,
                            &done,
                            FailureKind::Transport(format!("{}: {e}", qp.what)),
                        )
                    })?;
                    qp.slots[slot] = Slot::Busy(Some(t));
                    sends[q].pop_front();
                    progressed = true;
                }
                // Take the completions.
                qp.poll(&mut wcs).map_err(|e| {
                    let t = recvs[q].front().or(sends[q].front()).copied();
                    match t {
                        Some(t) => failure(
                            step,
                            t,
                            &done,
                            FailureKind::Transport(format!("{}: {e}", qp.what)),
                        ),
                        None => FabricError {
                            channel: qp.channel,
                            direction: Direction::Send,
                            done: 0,
                            total: 0,
                            kind: FailureKind::Transport(format!("{}: {e}", qp.what)),
                        },
                    }
                })?;
                for wc in &wcs {
                    progressed = true;
                    let id = wc.id;
                    let index = (id & 0xffff_ffff) as usize;
                    match id >> 32 {
                        WR_SEND if index < IN_FLIGHT => {
                            let owner = match qp.slots[index] {
                                Slot::Busy(owner) => owner,
                                Slot::Free => None,
                            };
                            qp.slots[index] = Slot::Free;
                            if let Some((status, vendor)) = wc.error {
                                let kind = FailureKind::Completion(format!(
                                    "{} (vendor error {vendor:#x}) on {}",
                                    status_name(status),
                                    qp.what
                                ));
                                return Err(match owner {
                                    Some(t) => failure(step, t, &done, kind),
                                    None => FabricError {
                                        channel: qp.channel,
                                        direction: Direction::Send,
                                        done: 0,
                                        total: 0,
                                        kind,
                                    },
                                });
                            }
                            if let Some(t) = owner {
                                done[t] = true;
                                remaining -= 1;
                            }
                        }
                        WR_RECV if index < RECV_AHEAD => {
                            qp.arrived.push_back(Arrival {
                                frame: index,
                                error: wc.error,
                                len: wc.len,
                                seq: wc.seq,
                            });
                            if wc.error.is_none()
                                && let Some(heard) = self.heard.get_mut(qp.channel.peer)
                            {
                                *heard = Some(self.start.elapsed());
                            }
                        }
                        _ => {
                            let kind = FailureKind::Transport(format!(
                                "{}: a work completion with an unknown id {id:#x}",
                                qp.what
                            ));
                            return Err(FabricError {
                                channel: qp.channel,
                                direction: Direction::Recv,
                                done: 0,
                                total: 0,
                                kind,
                            });
                        }
                    }
                }
                // Hand arrived messages to the receives, in order.
                while let (Some(&t), Some(&arrival)) = (recvs[q].front(), qp.arrived.front()) {
                    qp.arrived.pop_front();
                    recvs[q].pop_front();
                    progressed = true;
                    if let Some((status, vendor)) = arrival.error {
                        let kind = FailureKind::Completion(format!(
                            "{} (vendor error {vendor:#x}) on {}",
                            status_name(status),
                            qp.what
                        ));
                        return Err(failure(step, t, &done, kind));
                    }
                    if let Err((expected, got)) = qp.take_in_order(arrival.seq) {
                        let kind = FailureKind::Lost {
                            expected: u64::from(expected),
                            got: u64::from(got),
                        };
                        return Err(failure(step, t, &done, kind));
                    }
                    let want = step[t].len();
                    if arrival.len != want {
                        let kind = FailureKind::MessageSize {
                            want,
                            got: arrival.len,
                        };
                        return Err(failure(step, t, &done, kind));
                    }
                    if let Transfer::Recv { landing, .. } = &mut step[t] {
                        landing.deliver(0, qp.received(arrival.frame, want));
                    }
                    qp.post_recv(arrival.frame).map_err(|e| {
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
            if !progressed {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_the_fabric_cannot_carry_are_refused_with_a_reason() {
        let big = vec![0u8; MAX_FRAME + 1];
        let send = Transfer::Send {
            channel: Channel::new(1, 0),
            data: &big,
        };
        let e = check_transfer(&send, true).unwrap();
        assert!(
            e.contains("524289 bytes") && e.contains("at most 524288"),
            "{e}"
        );
        let e = check_transfer(&send, false).unwrap();
        assert!(e.contains("no RDMA queue pair for rank 1 link 0"), "{e}");

        let fits = vec![0u8; MAX_FRAME];
        let send = Transfer::Send {
            channel: Channel::new(1, 0),
            data: &fits,
        };
        assert_eq!(check_transfer(&send, true), None);

        let mut sink = |_: usize, _: &[u8]| {};
        let recv = Transfer::Recv {
            channel: Channel::new(2, 1),
            landing: Landing::Sink {
                len: 10,
                grain: 4,
                sink: &mut sink,
            },
        };
        let e = check_transfer(&recv, true).unwrap();
        assert!(e.contains("whole number of grains"), "{e}");
    }
}
