//! Unreliable Connected queue pairs: posting, delivery and the error state.
//!
//! UC semantics as the fabric relies on them, and as a real UC queue pair gives them:
//!
//! - a SEND lands in the peer queue pair's next posted receive, in order; with none posted it
//!   is held until one is posted (at most [`MAX_HELD`] messages), as Apple's Thunderbolt
//!   provider appears to do and MLX's JACCL relies on, or with `NUVEC_VERBS_EMU_UNEXPECTED=drop`
//!   dropped silently, as InfiniBand's UC specifies; larger than the posted receive, it completes there with
//!   `IBV_WC_LOC_LEN_ERR` and the receiving queue pair enters the error state;
//! - nothing is acknowledged or retried: a send completes (`IBV_WC_SEND`, success) once its
//!   bytes are handed to the transport, whether or not anyone receives them;
//! - every SGE must lie inside a memory region of the queue pair's protection domain, named
//!   by its lkey (and, for receives, registered with local write access); otherwise the work
//!   request completes with `IBV_WC_LOC_PROT_ERR` and the queue pair enters the error state,
//!   where every pending and later work request completes with `IBV_WC_WR_FLUSH_ERR`.
//!   Receive SGEs are checked when posted and again when a message lands (the region may have
//!   been deregistered in between);
//! - `post_send` is allowed in RTS (and flushes in ERR/SQE), `post_recv` from INIT on (and
//!   flushes in ERR); otherwise `EINVAL`. More work requests outstanding than the queue pair
//!   was created with is `ENOMEM`.
//!
//! Modelled strictly, where hardware might be lenient: a message is delivered only when its
//! source endpoint and QPN are the ones the receiving queue pair was connected to at RTR, and
//! only when the sender's path MTU is not above the receiver's (hardware drops such packets);
//! anything else is dropped, so crossed addresses show as silence here too.
//!
//! Opcodes: `IBV_WR_SEND` and `IBV_WR_SEND_WITH_IMM` (the receive completion then carries
//! `IBV_WC_WITH_IMM` and the immediate data as posted); with `NUVEC_VERBS_EMU_NO_IMM=1` the
//! latter is refused with `EINVAL`, as a provider without immediate data on UC would, so that
//! a fabric's fallback to plain sends can be exercised. Not modelled: PSNs (a UC responder
//! resynchronises on the first packet of each message anyway), RDMA writes, inline data,
//! solicited events, SQD draining.

use crate::config::{self, Unexpected};
use crate::cq::{Cq, Entry, Outstanding};
use crate::device::{self, MAX_MSG_SZ};
use crate::faults;
use crate::qp_state::check_modify;
use crate::trace;
use crate::transport::Endpoint;
use core::ffi::c_int;
use nuvec_verbs_abi::*;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A registered memory region, as SGEs are checked against it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    /// Its first byte.
    pub(crate) addr: u64,
    /// Its length.
    pub(crate) len: u64,
    /// Its access flags.
    pub(crate) access: c_int,
}

/// A protection domain: the regions its queue pairs may name, by lkey.
#[derive(Debug)]
pub(crate) struct Pd {
    /// The address of its `ibv_pd`.
    pub(crate) ptr: usize,
    /// The address of its context's `ibv_context`.
    pub(crate) ctx: usize,
    /// Its memory regions by lkey.
    pub(crate) regions: Mutex<HashMap<u32, Region>>,
}

impl Pd {
    /// Its regions, locked.
    fn regions(&self) -> MutexGuard<'_, HashMap<u32, Region>> {
        self.regions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether `sge` lies inside the region its lkey names (with local write access if asked).
pub(crate) fn region_holds(regions: &HashMap<u32, Region>, sge: &ibv_sge, write: bool) -> bool {
    let Some(region) = regions.get(&sge.lkey) else {
        return false;
    };
    let end = sge.addr.checked_add(u64::from(sge.length));
    let inside = sge.addr >= region.addr && end.is_some_and(|e| e <= region.addr + region.len);
    inside && (!write || region.access & IBV_ACCESS_LOCAL_WRITE != 0)
}

/// Where a connected queue pair sends, and whom it accepts messages from.
#[derive(Clone, Copy, Debug)]
struct Route {
    /// The peer's endpoint, or `None` when the destination GID is not one of this provider's
    /// (everything sent is then lost).
    endpoint: Option<u64>,
    /// The peer queue pair.
    qpn: u32,
}

/// A posted receive.
#[derive(Debug)]
struct RecvWr {
    /// The caller's id.
    wr_id: u64,
    /// Where the message goes.
    sges: Vec<ibv_sge>,
}

/// The locked part of a queue pair.
#[derive(Debug)]
struct Inner {
    /// Its state.
    state: ibv_qp_state,
    /// Set by `ibv_destroy_qp`: the `ibv_qp` is gone and nothing may touch it.
    destroyed: bool,
    /// The peer, from RTR on.
    route: Option<Route>,
    /// The path MTU, from RTR on.
    mtu: ibv_mtu,
    /// Posted receives, oldest first.
    recvs: VecDeque<RecvWr>,
    /// Messages that arrived with no receive posted, held for the next ones (the default,
    /// [`Unexpected::Hold`]), oldest first.
    held: VecDeque<(Origin, Vec<u8>)>,
}

/// The most messages a queue pair holds for receives not yet posted; past it they are
/// dropped, as UC does. A peer that runs this far ahead is a fabric bug that a test should
/// see as a loss, not as memory growing without bound.
pub(crate) const MAX_HELD: usize = 4096;

/// The header fields a message carries besides its destination QPN.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Origin {
    /// The sender's endpoint.
    pub(crate) endpoint: u64,
    /// The sender's queue pair.
    pub(crate) qpn: u32,
    /// The sender's path MTU.
    pub(crate) mtu: ibv_mtu,
    /// The immediate data of a `IBV_WR_SEND_WITH_IMM`, in network order as posted.
    pub(crate) imm: Option<u32>,
}

/// A queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    /// The address of its `ibv_qp`.
    pub(crate) ptr: usize,
    /// The address of its context's `ibv_context`.
    pub(crate) ctx: usize,
    /// Its number.
    pub(crate) qpn: u32,
    /// Its protection domain.
    pub(crate) pd: Arc<Pd>,
    /// Its send completion queue.
    pub(crate) send_cq: Arc<Cq>,
    /// Its receive completion queue.
    pub(crate) recv_cq: Arc<Cq>,
    /// The endpoint it sends from and receives at.
    pub(crate) endpoint: Arc<Endpoint>,
    /// Its capacities.
    pub(crate) cap: ibv_qp_cap,
    /// Whether every send is signaled.
    pub(crate) sig_all: bool,
    /// Its state and receive queue.
    inner: Mutex<Inner>,
    /// Its work requests not yet retired.
    outstanding: Arc<Outstanding>,
    /// Unsignaled sends since the last signaled one.
    unsignaled: AtomicU32,
    /// Its name in the message log (`trace`).
    label: String,
}

impl Qp {
    /// A queue pair in the RESET state.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        ptr: usize,
        ctx: usize,
        qpn: u32,
        pd: Arc<Pd>,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        endpoint: Arc<Endpoint>,
        cap: ibv_qp_cap,
        sig_all: bool,
        label: String,
    ) -> Qp {
        Qp {
            ptr,
            ctx,
            qpn,
            pd,
            send_cq,
            recv_cq,
            endpoint,
            cap,
            sig_all,
            inner: Mutex::new(Inner {
                state: IBV_QPS_RESET,
                destroyed: false,
                route: None,
                mtu: IBV_MTU_256,
                recvs: VecDeque::new(),
                held: VecDeque::new(),
            }),
            outstanding: Arc::new(Outstanding::default()),
            unsignaled: AtomicU32::new(0),
            label,
        }
    }

    /// Its state, locked.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the state, in `inner` and in the `ibv_qp` the caller reads.
    fn set_state(&self, inner: &mut Inner, state: ibv_qp_state) {
        inner.state = state;
        if !inner.destroyed {
            // SAFETY: `ptr` is the live `ibv_qp` this provider allocated for the queue pair:
            // `destroyed` is false, and `ibv_destroy_qp` sets it under this lock before it
            // frees the struct.
            unsafe { (*(self.ptr as *mut ibv_qp)).state = state };
        }
    }

    /// Marks the queue pair destroyed: from now on nothing touches its `ibv_qp`.
    pub(crate) fn mark_destroyed(&self) {
        let mut inner = self.lock();
        inner.destroyed = true;
        inner.recvs.clear();
        inner.held.clear();
    }

    /// Adds a send completion retiring it and the unsignaled sends before it.
    fn complete_send(&self, wr_id: u64, status: ibv_wc_status, byte_len: u32) {
        let sends = 1 + self.unsignaled.swap(0, Ordering::Relaxed);
        self.send_cq.push(Entry {
            wc: ibv_wc {
                wr_id,
                status,
                opcode: IBV_WC_SEND,
                byte_len,
                qp_num: self.qpn,
                ..Default::default()
            },
            owner: Arc::clone(&self.outstanding),
            sends,
            recvs: 0,
        });
    }

    /// Adds a receive completion.
    fn complete_recv(&self, wr_id: u64, status: ibv_wc_status, byte_len: u32, src_qp: u32) {
        self.recv_cq.push(Entry {
            wc: ibv_wc {
                wr_id,
                status,
                opcode: IBV_WC_RECV,
                byte_len,
                qp_num: self.qpn,
                src_qp,
                ..Default::default()
            },
            owner: Arc::clone(&self.outstanding),
            sends: 0,
            recvs: 1,
        });
    }

    /// Enters the error state, flushing every posted receive.
    fn enter_error(&self, inner: &mut Inner) {
        self.set_state(inner, IBV_QPS_ERR);
        for wr in std::mem::take(&mut inner.recvs) {
            self.complete_recv(wr.wr_id, IBV_WC_WR_FLUSH_ERR, 0, 0);
        }
        inner.held.clear();
    }

    /// `ibv_modify_qp`: checks the transition and applies it.
    pub(crate) fn modify(&self, attr: &ibv_qp_attr, mask: c_int) -> Result<(), c_int> {
        let mut inner = self.lock();
        if inner.destroyed {
            return Err(libc::EINVAL);
        }
        let next = check_modify(inner.state, attr, mask, &device::port_view())?;
        if mask & IBV_QP_PATH_MTU != 0 {
            inner.mtu = attr.path_mtu;
        }
        if mask & IBV_QP_AV != 0 {
            inner.route = Some(Route {
                endpoint: device::endpoint_of(&attr.ah_attr.grh.dgid, attr.dest_qp_num),
                qpn: attr.dest_qp_num,
            });
        }
        match next {
            IBV_QPS_RESET => {
                inner.recvs.clear();
                inner.held.clear();
                inner.route = None;
                self.outstanding.send.store(0, Ordering::Relaxed);
                self.outstanding.recv.store(0, Ordering::Relaxed);
                self.unsignaled.store(0, Ordering::Relaxed);
                self.send_cq.clean(self.qpn);
                self.recv_cq.clean(self.qpn);
                self.set_state(&mut inner, next);
            }
            IBV_QPS_ERR => self.enter_error(&mut inner),
            _ => self.set_state(&mut inner, next),
        }
        Ok(())
    }

    /// Takes a slot of a work queue: `ENOMEM` when all `max` are outstanding.
    fn take_slot(counter: &AtomicU32, max: u32) -> Result<(), c_int> {
        if counter.load(Ordering::Relaxed) >= max {
            return Err(libc::ENOMEM);
        }
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Posts one send work request whose SGEs are `sges`.
    pub(crate) fn post_send(&self, wr: &ibv_send_wr, sges: &[ibv_sge]) -> Result<(), c_int> {
        let faults = faults::get();
        let mut inner = self.lock();
        let flushing = match inner.state {
            _ if inner.destroyed => return Err(libc::EINVAL),
            IBV_QPS_RTS => false,
            IBV_QPS_ERR | IBV_QPS_SQE => true,
            _ => return Err(libc::EINVAL),
        };
        let with_imm = wr.opcode == IBV_WR_SEND_WITH_IMM && !faults::immediate_refused();
        if (wr.opcode != IBV_WR_SEND && !with_imm)
            || wr.send_flags & IBV_SEND_INLINE != 0
            || sges.len() > self.cap.max_send_sge as usize
        {
            return Err(libc::EINVAL);
        }
        Self::take_slot(&self.outstanding.send, self.cap.max_send_wr)?;
        let fails = faults.posted_fails();
        if flushing {
            self.complete_send(wr.wr_id, IBV_WC_WR_FLUSH_ERR, 0);
            return Ok(());
        }
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        let status = if fails {
            IBV_WC_GENERAL_ERR
        } else if !sges
            .iter()
            .all(|s| region_holds(&self.pd.regions(), s, false))
        {
            IBV_WC_LOC_PROT_ERR
        } else if total > u64::from(MAX_MSG_SZ) {
            IBV_WC_LOC_LEN_ERR
        } else {
            IBV_WC_SUCCESS
        };
        if status != IBV_WC_SUCCESS {
            self.complete_send(wr.wr_id, status, 0);
            self.enter_error(&mut inner);
            return Ok(());
        }
        let route = inner.route;
        let mtu = inner.mtu;
        // Never hold the queue pair's lock across the transport: a peer blocked writing to
        // us would otherwise wait on our receiver thread, which waits on this lock.
        drop(inner);
        if !faults.lose()
            && let Some(Route {
                endpoint: Some(dest),
                qpn,
            }) = route
        {
            let parts: Vec<&[u8]> = sges
                .iter()
                .map(|s| {
                    // SAFETY: the SGE lies inside a memory region registered in this queue
                    // pair's protection domain (checked above), which the caller keeps mapped
                    // and readable while it is registered and the send is outstanding.
                    unsafe {
                        std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                    }
                })
                .collect();
            let origin = Origin {
                endpoint: self.endpoint.id,
                qpn: self.qpn,
                mtu,
                imm: with_imm.then_some(wr.imm_data),
            };
            trace::record(trace::Event::Send, &self.label, total as usize);
            self.endpoint.send(dest, qpn, origin, &parts);
        }
        faults.sent();
        if self.sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0 {
            self.complete_send(wr.wr_id, IBV_WC_SUCCESS, total as u32);
        } else {
            self.unsignaled.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Posts one receive work request whose SGEs are `sges`.
    pub(crate) fn post_recv(&self, wr_id: u64, sges: &[ibv_sge]) -> Result<(), c_int> {
        let mut inner = self.lock();
        if inner.destroyed
            || inner.state == IBV_QPS_RESET
            || sges.len() > self.cap.max_recv_sge as usize
        {
            return Err(libc::EINVAL);
        }
        Self::take_slot(&self.outstanding.recv, self.cap.max_recv_wr)?;
        let fails = faults::get().posted_fails();
        if inner.state == IBV_QPS_ERR {
            self.complete_recv(wr_id, IBV_WC_WR_FLUSH_ERR, 0, 0);
            return Ok(());
        }
        let status = if fails {
            IBV_WC_GENERAL_ERR
        } else if !sges
            .iter()
            .all(|s| region_holds(&self.pd.regions(), s, true))
        {
            IBV_WC_LOC_PROT_ERR
        } else {
            IBV_WC_SUCCESS
        };
        if status != IBV_WC_SUCCESS {
            self.complete_recv(wr_id, status, 0, 0);
            self.enter_error(&mut inner);
            return Ok(());
        }
        inner.recvs.push_back(RecvWr {
            wr_id,
            sges: sges.to_vec(),
        });
        // A message held for want of a receive takes this one.
        if let Some((origin, payload)) = inner.held.pop_front() {
            self.land(&mut inner, origin, &payload);
        }
        Ok(())
    }

    /// A message from `origin` arrived for this queue pair (called by the receiver threads).
    pub(crate) fn deliver(&self, origin: Origin, payload: &[u8]) {
        let mut inner = self.lock();
        let receiving = matches!(
            inner.state,
            IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_SQD | IBV_QPS_SQE
        );
        let connected = inner
            .route
            .is_some_and(|r| r.endpoint == Some(origin.endpoint) && r.qpn == origin.qpn);
        if inner.destroyed || !receiving || !connected || origin.mtu > inner.mtu {
            return;
        }
        if inner.recvs.is_empty() {
            // No receive posted: InfiniBand's UC drops the message and nobody is told; Apple's
            // provider appears to hold it until one is posted (the default here).
            let hold = config::get()
                .as_ref()
                .is_ok_and(|c| c.unexpected == Unexpected::Hold);
            if hold && inner.held.len() < MAX_HELD {
                inner.held.push_back((origin, payload.to_vec()));
            }
            return;
        }
        self.land(&mut inner, origin, payload);
    }

    /// Puts a message from `origin` into the oldest posted receive (there is one).
    fn land(&self, inner: &mut MutexGuard<'_, Inner>, origin: Origin, payload: &[u8]) {
        let Some(wr) = inner.recvs.pop_front() else {
            return;
        };
        let capacity: u64 = wr.sges.iter().map(|s| u64::from(s.length)).sum();
        if payload.len() as u64 > capacity {
            self.complete_recv(wr.wr_id, IBV_WC_LOC_LEN_ERR, 0, origin.qpn);
            self.enter_error(inner);
            return;
        }
        let regions = self.pd.regions();
        if !wr.sges.iter().all(|s| region_holds(&regions, s, true)) {
            drop(regions);
            self.complete_recv(wr.wr_id, IBV_WC_LOC_PROT_ERR, 0, origin.qpn);
            self.enter_error(inner);
            return;
        }
        let mut rest = payload;
        for sge in &wr.sges {
            let n = rest.len().min(sge.length as usize);
            // SAFETY: the SGE lies inside a memory region of this protection domain registered
            // with local write access (checked just above, and the regions stay locked until
            // the copy is done, so it cannot be deregistered meanwhile); `n` bytes fit in it,
            // and the payload buffer is the receiver thread's own, so they do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(rest.as_ptr(), sge.addr as usize as *mut u8, n)
            };
            rest = &rest[n..];
        }
        drop(regions);
        trace::record(trace::Event::Recv, &self.label, payload.len());
        self.recv_cq.push(Entry {
            wc: ibv_wc {
                wr_id: wr.wr_id,
                status: IBV_WC_SUCCESS,
                opcode: IBV_WC_RECV,
                byte_len: payload.len() as u32,
                imm_data: origin.imm.unwrap_or(0),
                qp_num: self.qpn,
                src_qp: origin.qpn,
                wc_flags: if origin.imm.is_some() {
                    IBV_WC_WITH_IMM
                } else {
                    0
                },
                ..Default::default()
            },
            owner: Arc::clone(&self.outstanding),
            sends: 0,
            recvs: 1,
        });
    }
}
