//! One UC queue pair and everything it owns, brought up as MLX does (reference §3.4), and its
//! data-path calls: post a send, post a receive, poll completions.

use std::io;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use nuvec_verbs_abi as abi;

use super::memory::Region;
use super::queue::{Completion, Queue, recv_id, send_id};
use super::verbs::{DeviceList, Verbs, no_device_hint};
use super::{IN_FLIGHT, MAX_FRAME, RECV_AHEAD, WORK_REQUESTS as MAX_WR};
use crate::config::log::Log;
use crate::fabric::Channel;

/// The port every queue pair uses (MLX: 1).
const PORT: u8 = 1;

/// The packet sequence number both directions start at (MLX: 7).
pub(crate) const PSN: u32 = 7;

/// Entries of each completion queue (MLX: `MAX_SEND_WR` + `MAX_RECV_WR`).
const CQ_ENTRIES: c_int = 64;

/// The source GID index of a global route (MLX hard-codes 1, whatever GID it advertised).
const SGID_INDEX: u8 = 1;

/// The hop limit of a global route (MLX: 1).
const HOP_LIMIT: u8 = 1;

/// Work completions taken per poll.
const POLL_BATCH: usize = 16;

/// Whether `gid` is IPv4-mapped (`::ffff:a.b.c.d`): bytes 0–9 zero, bytes 10–11 `0xff`.
pub(crate) fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// The interface id of a GID: its last 8 bytes, big-endian.
fn interface_id(gid: &[u8; 16]) -> u64 {
    u64::from_be_bytes([
        gid[8], gid[9], gid[10], gid[11], gid[12], gid[13], gid[14], gid[15],
    ])
}

/// A peer's queue pair as RTR needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Remote {
    pub(crate) lid: u16,
    /// A 24-bit queue pair number.
    pub(crate) qpn: u32,
    /// A 24-bit packet sequence number.
    pub(crate) psn: u32,
    /// The GID to route to, when its interface id is not zero (MLX's test).
    pub(crate) gid: Option<[u8; 16]>,
}

impl Remote {
    /// The peer queue pair `lid`/`qpn`/`psn` with GID `gid`, routed to globally when the
    /// GID's interface id is not zero (MLX's test: a subnet prefix alone does not count).
    pub(crate) fn new(lid: u16, qpn: u32, psn: u32, gid: [u8; 16]) -> Remote {
        let gid = (interface_id(&gid) != 0).then_some(gid);
        Remote { lid, qpn, psn, gid }
    }
}

/// This queue pair's details for its peer: what JACCL's side channel carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Local {
    pub(crate) lid: u16,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) gid: [u8; 16],
}

/// Memory regions this process leaked: the device refused to deregister them, so their
/// memory is never freed (see [`Qp`]'s drop).
static LEAKED_REGIONS: AtomicUsize = AtomicUsize::new(0);

/// How many memory regions this process has leaked because `ibv_dereg_mr` failed: their
/// memory stays allocated for the life of the process, since the device may still write
/// into it.
pub fn leaked_regions() -> usize {
    LEAKED_REGIONS.load(Ordering::Relaxed)
}

/// A registered frame: the memory and its memory region (deregistered by [`Qp`]'s drop,
/// before the memory is freed; a region the device will not deregister keeps its memory for
/// the life of the process).
pub(crate) struct Frame {
    mem: Region,
    mr: *mut abi::ibv_mr,
    lkey: u32,
}

/// The data-path entries of a device context's operation table (the inline `ibv_post_send`,
/// `ibv_post_recv` and `ibv_poll_cq` of `verbs.h` call through them).
#[derive(Clone, Copy)]
struct Ops {
    post_send: abi::PostSend,
    post_recv: abi::PostRecv,
    poll_cq: abi::PollCq,
}

/// What a work completion says, for the queue's bookkeeping.
fn completion_of(wc: &abi::ibv_wc) -> Completion {
    Completion {
        id: wc.wr_id,
        error: (wc.status != abi::IBV_WC_SUCCESS).then_some((wc.status, wc.vendor_err)),
        len: wc.byte_len as usize,
        seq: (wc.wc_flags & abi::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data)),
    }
}
/// One queue pair with everything it owns: the device context, protection domain, completion
/// queue and frames. The pointers are null until created; drop releases what exists in MLX's
/// order, except that a frame whose memory region the device refuses to deregister is leaked,
/// counted ([`leaked_regions`]) and logged, never freed: the device could still write into it.
pub(crate) struct Qp {
    verbs: &'static Verbs,
    /// "device rdma_en3 (queue pair to rank 2, link 0)", for messages.
    pub(crate) what: String,
    pub(crate) channel: Channel,
    ctx: *mut abi::ibv_context,
    pd: *mut abi::ibv_pd,
    cq: *mut abi::ibv_cq,
    qp: *mut abi::ibv_qp,
    ops: Option<Ops>,
    send: Vec<Frame>,
    recv: Vec<Frame>,
    /// This queue pair's details for the peer.
    pub(crate) local: Local,
    /// Whether sends carry their sequence number as immediate data (until the provider
    /// refuses `IBV_WR_SEND_WITH_IMM`).
    numbered: bool,
    /// Messages posted so far, wrapping: the next send's sequence number.
    sent: u32,
    /// The step bookkeeping of its frames and messages.
    pub(crate) queue: Queue,
    /// Where a failure of its teardown is reported.
    pub(crate) log: Log,
}

// SAFETY: the verbs objects behind the pointers are not tied to the thread that created them
// (libibverbs is thread-safe), and `Qp` owns them exclusively: moving it to another thread
// moves that ownership. It is not `Sync` (nothing here is shared).
unsafe impl Send for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        // Return codes are ignored: there is nobody to report them to, and what follows must
        // still be released.
        if !self.qp.is_null() {
            // SAFETY: `qp` was created by `ibv_create_qp` and is destroyed only here.
            unsafe { (self.verbs.destroy_qp)(self.qp) };
        }
        if !self.cq.is_null() {
            // SAFETY: `cq` was created by `ibv_create_cq`; its queue pair is gone.
            unsafe { (self.verbs.destroy_cq)(self.cq) };
        }
        let frames = std::mem::take(&mut self.send)
            .into_iter()
            .chain(std::mem::take(&mut self.recv));
        for Frame { mem, mr, .. } in frames {
            if mr.is_null() {
                continue;
            }
            // SAFETY: `mr` was registered by `ibv_reg_mr` and is deregistered only here; the
            // queue pair that could use it is destroyed, and its memory `mem` is freed only
            // once this succeeds.
            let rc = unsafe { (self.verbs.dereg_mr)(mr) };
            if rc != 0 {
                // The device still holds the region and may write into it: its memory is
                // never freed (and never reused), whatever it costs.
                std::mem::forget(mem);
                let leaked = LEAKED_REGIONS.fetch_add(1, Ordering::Relaxed) + 1;
                self.log.error(format_args!(
                    "{}: ibv_dereg_mr of a {MAX_FRAME}-byte frame failed ({}): its memory is \
                     leaked rather than freed while the device may still write into it \
                     ({leaked} regions leaked in this process)",
                    self.what,
                    io::Error::from_raw_os_error(rc)
                ));
            }
        }
        if !self.pd.is_null() {
            // SAFETY: `pd` was allocated by `ibv_alloc_pd`; its queue pair and memory regions
            // are gone.
            unsafe { (self.verbs.dealloc_pd)(self.pd) };
        }
        if !self.ctx.is_null() {
            // SAFETY: `ctx` was opened by `ibv_open_device`; everything created on it is gone.
            unsafe { (self.verbs.close_device)(self.ctx) };
        }
    }
}
/// The last OS error, for a verbs call that returned null.
fn os_error() -> io::Error {
    io::Error::last_os_error()
}

impl Qp {
    /// MLX's bring-up up to INIT on the device named exactly `device`, and the local details
    /// (LID, first IPv4-mapped GID, PSN 7); `what` names the queue pair in messages.
    pub(crate) fn open(
        verbs: &'static Verbs,
        device: &str,
        channel: Channel,
        what: String,
    ) -> Result<Qp, String> {
        let mut qp = Qp {
            verbs,
            what,
            channel,
            ctx: ptr::null_mut(),
            pd: ptr::null_mut(),
            cq: ptr::null_mut(),
            qp: ptr::null_mut(),
            ops: None,
            send: Vec::new(),
            recv: Vec::new(),
            local: Local::default(),
            numbered: true,
            sent: 0,
            queue: Queue::default(),
            log: Log::off(),
        };
        qp.ctx = open_device(verbs, device)?;
        qp.ops = Some(qp.read_ops()?);

        // SAFETY: `ctx` is an open device context.
        qp.pd = unsafe { (verbs.alloc_pd)(qp.ctx) };
        if qp.pd.is_null() {
            return Err(format!("ibv_alloc_pd failed: {}", os_error()));
        }
        // SAFETY: `ctx` is an open device context; no completion channel, vector 0, as MLX.
        qp.cq =
            unsafe { (verbs.create_cq)(qp.ctx, CQ_ENTRIES, ptr::null_mut(), ptr::null_mut(), 0) };
        if qp.cq.is_null() {
            return Err(format!(
                "ibv_create_cq of {CQ_ENTRIES} entries failed: {}",
                os_error()
            ));
        }
        let mut init = abi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: qp.cq,
            recv_cq: qp.cq,
            srq: ptr::null_mut(),
            cap: abi::ibv_qp_cap {
                max_send_wr: MAX_WR,
                max_recv_wr: MAX_WR,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: abi::IBV_QPT_UC,
            sq_sig_all: 0,
        };
        // SAFETY: `pd` is a live protection domain and `init` a valid attribute block whose
        // completion queues are live.
        qp.qp = unsafe { (verbs.create_qp)(qp.pd, &mut init) };
        if qp.qp.is_null() {
            return Err(format!(
                "ibv_create_qp (UC, {MAX_WR} send and {MAX_WR} receive work requests, 1 SGE) \
                 failed: {}",
                os_error()
            ));
        }

        for _ in 0..IN_FLIGHT {
            let frame = qp.register()?;
            qp.send.push(frame);
        }
        for _ in 0..RECV_AHEAD {
            let frame = qp.register()?;
            qp.recv.push(frame);
        }

        let mut attr = abi::ibv_qp_attr {
            qp_state: abi::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: PORT,
            qp_access_flags: ACCESS as u32,
            ..Default::default()
        };
        let mask = abi::IBV_QP_STATE
            | abi::IBV_QP_PKEY_INDEX
            | abi::IBV_QP_PORT
            | abi::IBV_QP_ACCESS_FLAGS;
        qp.modify(&mut attr, mask, "INIT")?;

        let (lid, gid_table_len) = qp.query_port()?;
        let gid = qp.first_ipv4_mapped_gid(device, gid_table_len)?;
        // SAFETY: `qp` is a live queue pair.
        let qpn = unsafe { (*qp.qp).qp_num };
        qp.local = Local {
            lid,
            qpn,
            psn: PSN,
            gid,
        };
        Ok(qp)
    }

    /// The data-path entries of the context's operation table.
    fn read_ops(&self) -> Result<Ops, String> {
        // SAFETY: `ctx` is an open device context; its operation table is read, not kept.
        let ops = unsafe { &(*self.ctx).ops };
        match (ops.post_send, ops.post_recv, ops.poll_cq) {
            (Some(post_send), Some(post_recv), Some(poll_cq)) => Ok(Ops {
                post_send,
                post_recv,
                poll_cq,
            }),
            _ => Err(
                "the device's provider has no post_send, post_recv or poll_cq operation".to_owned(),
            ),
        }
    }

    /// Allocates and registers one frame of [`MAX_FRAME`] bytes.
    fn register(&mut self) -> Result<Frame, String> {
        let mem = Region::new(MAX_FRAME)
            .ok_or_else(|| format!("allocating a {MAX_FRAME}-byte frame: out of memory"))?;
        // SAFETY: `pd` is a live protection domain and `mem` a live block of `len` bytes that
        // outlives the registration (Qp's drop deregisters before the memory is freed).
        let mr = unsafe {
            (self.verbs.reg_mr)(self.pd, mem.as_ptr().cast::<c_void>(), mem.len(), ACCESS)
        };
        if mr.is_null() {
            return Err(format!(
                "ibv_reg_mr of a {MAX_FRAME}-byte frame failed: {}",
                os_error()
            ));
        }
        // SAFETY: `mr` is the live memory region just registered.
        let lkey = unsafe { (*mr).lkey };
        Ok(Frame { mem, mr, lkey })
    }

    /// `ibv_modify_qp` to `state`.
    fn modify(
        &mut self,
        attr: &mut abi::ibv_qp_attr,
        mask: abi::ibv_qp_attr_mask,
        state: &str,
    ) -> Result<(), String> {
        // SAFETY: `qp` is a live queue pair and `attr` a valid attribute block for `mask`.
        let rc = unsafe { (self.verbs.modify_qp)(self.qp, attr, mask) };
        if rc != 0 {
            return Err(format!(
                "ibv_modify_qp to {state} failed: {}",
                io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(())
    }

    /// The LID and GID table length of port 1.
    fn query_port(&self) -> Result<(u16, i32), String> {
        let mut attr = abi::ibv_port_attr::default();
        // SAFETY: `ctx` is an open device context; `attr` is a full `ibv_port_attr`, at least
        // as large as the compatibility layout the exported symbol fills.
        let rc = unsafe { (self.verbs.query_port)(self.ctx, PORT, &raw mut attr) };
        if rc != 0 {
            return Err(format!(
                "ibv_query_port of port {PORT} failed: {}",
                io::Error::from_raw_os_error(rc)
            ));
        }
        Ok((attr.lid, attr.gid_tbl_len))
    }

    /// The first IPv4-mapped GID of port 1 (MLX's scan).
    fn first_ipv4_mapped_gid(&self, device: &str, len: i32) -> Result<[u8; 16], String> {
        for index in 0..len.max(0) {
            let mut gid = abi::ibv_gid::default();
            // SAFETY: `ctx` is an open device context and `gid` a valid place for one GID.
            let rc = unsafe { (self.verbs.query_gid)(self.ctx, PORT, index, &mut gid) };
            if rc != 0 {
                continue;
            }
            // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
            let raw = unsafe { gid.raw };
            if is_ipv4_mapped(&raw) {
                return Ok(raw);
            }
        }
        Err(format!(
            "no IPv4-mapped GID on port {PORT} of {device} (of {len} GID entries): the \
             Thunderbolt interface of this device needs an IPv4 address; assign a link-local \
             address, e.g. `ifconfig <interface> inet 169.254.0.1 netmask 255.255.0.0 alias`"
        ))
    }

    /// RTR to `remote`, the receives posted, RTS.
    pub(crate) fn connect(&mut self, remote: &Remote) -> Result<(), String> {
        let mut attr = abi::ibv_qp_attr {
            qp_state: abi::IBV_QPS_RTR,
            path_mtu: abi::IBV_MTU_1024,
            rq_psn: remote.psn,
            dest_qp_num: remote.qpn,
            ..Default::default()
        };
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = PORT;
        if let Some(gid) = remote.gid {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = abi::ibv_gid { raw: gid };
            attr.ah_attr.grh.sgid_index = SGID_INDEX;
            attr.ah_attr.grh.hop_limit = HOP_LIMIT;
        }
        let mask = abi::IBV_QP_STATE
            | abi::IBV_QP_AV
            | abi::IBV_QP_PATH_MTU
            | abi::IBV_QP_DEST_QPN
            | abi::IBV_QP_RQ_PSN;
        self.modify(&mut attr, mask, "RTR")?;

        for frame in 0..self.recv.len() {
            self.post_recv(frame)?;
        }

        let mut attr = abi::ibv_qp_attr {
            qp_state: abi::IBV_QPS_RTS,
            sq_psn: PSN,
            ..Default::default()
        };
        let mask = abi::IBV_QP_STATE | abi::IBV_QP_SQ_PSN;
        self.modify(&mut attr, mask, "RTS")
    }

    fn ops(&self) -> Result<Ops, String> {
        self.ops
            .ok_or_else(|| "the queue pair is not open".to_owned())
    }

    /// The first `len` bytes of receive frame `frame`, which holds a message that completed.
    pub(crate) fn received(&self, frame: usize, len: usize) -> &[u8] {
        &self.recv[frame].mem.bytes()[..len]
    }

    /// Posts receive frame `frame` (its whole length).
    pub(crate) fn post_recv(&mut self, frame: usize) -> Result<(), String> {
        let ops = self.ops()?;
        let f = &self.recv[frame];
        let mut sge = abi::ibv_sge {
            addr: f.mem.as_ptr() as u64,
            length: MAX_FRAME as u32,
            lkey: f.lkey,
        };
        let mut wr = abi::ibv_recv_wr {
            wr_id: recv_id(frame),
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: `qp` is a live queue pair of the context whose table `post_recv` came from;
        // `wr` and `sge` are valid for the call, and the frame stays registered and untouched
        // until its completion is polled.
        let rc = unsafe { (ops.post_recv)(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(format!(
                "ibv_post_recv failed: {}",
                io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(())
    }

    /// Stages `data` into free send slot `slot` and posts it as one signaled SEND carrying
    /// its sequence number as immediate data (a plain SEND once the provider refused that).
    pub(crate) fn post_send(&mut self, slot: usize, data: &[u8]) -> Result<(), String> {
        let ops = self.ops()?;
        let f = &mut self.send[slot];
        f.mem.bytes_mut()[..data.len()].copy_from_slice(data);
        let mut sge = abi::ibv_sge {
            addr: f.mem.as_ptr() as u64,
            length: data.len() as u32,
            lkey: f.lkey,
        };
        let mut rc;
        loop {
            let (opcode, imm_data) = if self.numbered {
                (abi::IBV_WR_SEND_WITH_IMM, self.sent.to_be())
            } else {
                (abi::IBV_WR_SEND, 0)
            };
            let mut wr = abi::ibv_send_wr {
                wr_id: send_id(slot),
                next: ptr::null_mut(),
                sg_list: &mut sge,
                num_sge: 1,
                opcode,
                send_flags: abi::IBV_SEND_SIGNALED,
                imm_data,
                ..Default::default()
            };
            let mut bad = ptr::null_mut();
            // SAFETY: `qp` is a live queue pair of the context whose table `post_send` came
            // from; `wr` and `sge` are valid for the call, and the frame stays registered and
            // is not written until its completion is polled.
            rc = unsafe { (ops.post_send)(self.qp, &mut wr, &mut bad) };
            // A provider without immediate data on UC refuses the first numbered send: from
            // then on this queue pair sends plain SENDs, as MLX, and its peer checks nothing.
            if rc != 0 && self.numbered && self.sent == 0 && refuses_immediate(rc) {
                self.numbered = false;
                continue;
            }
            break;
        }
        if rc == 0 {
            self.sent = self.sent.wrapping_add(1);
        }
        if rc != 0 {
            return Err(format!(
                "ibv_post_send of {} bytes failed: {}",
                data.len(),
                io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(())
    }

    /// Polls the completion queue: up to [`POLL_BATCH`] completions replace `out`'s contents.
    pub(crate) fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), String> {
        let ops = self.ops()?;
        let mut wcs = [abi::ibv_wc::default(); POLL_BATCH];
        // SAFETY: `cq` is a live completion queue of the context whose table `poll_cq` came
        // from, and `wcs` has room for `POLL_BATCH` completions.
        let n = unsafe { (ops.poll_cq)(self.cq, POLL_BATCH as c_int, wcs.as_mut_ptr()) };
        let n = usize::try_from(n)
            .ok()
            .filter(|n| *n <= POLL_BATCH)
            .ok_or_else(|| format!("ibv_poll_cq failed (returned {n})"))?;
        out.clear();
        out.extend(wcs[..n].iter().map(completion_of));
        Ok(())
    }
}

/// Whether `post_send`'s error `rc` says that the operation is not supported (`EINVAL`,
/// `EOPNOTSUPP` or `ENOTSUP`), rather than that the queue is full or the queue pair broken.
fn refuses_immediate(rc: c_int) -> bool {
    /// `EINVAL`.
    const EINVAL: c_int = 22;
    /// `EOPNOTSUPP` and `ENOTSUP` (one number on Linux).
    #[cfg(target_os = "linux")]
    const UNSUPPORTED: [c_int; 2] = [95, 95];
    /// `EOPNOTSUPP` and `ENOTSUP`.
    #[cfg(not(target_os = "linux"))]
    const UNSUPPORTED: [c_int; 2] = [102, 45];
    rc == EINVAL || UNSUPPORTED.contains(&rc)
}

/// The access flags of MLX's memory regions and queue pairs.
const ACCESS: abi::ibv_access_flags =
    abi::IBV_ACCESS_LOCAL_WRITE | abi::IBV_ACCESS_REMOTE_READ | abi::IBV_ACCESS_REMOTE_WRITE;
/// Opens the device named exactly `name`.
fn open_device(verbs: &'static Verbs, name: &str) -> Result<*mut abi::ibv_context, String> {
    let list = DeviceList::get(verbs).map_err(|e| {
        format!(
            "no RDMA device is available: ibv_get_device_list failed: {e}{}",
            no_device_hint(&e)
        )
    })?;
    let mut names = Vec::new();
    for i in 0..list.len() {
        let Some((device, found)) = list.device(i) else {
            continue;
        };
        if found == name {
            // SAFETY: `device` is a device of the live list.
            let ctx = unsafe { (verbs.open_device)(device) };
            if ctx.is_null() {
                return Err(format!("ibv_open_device failed: {}", os_error()));
            }
            return Ok(ctx);
        }
        names.push(found);
    }
    Err(if names.is_empty() {
        format!(
            "no RDMA device named {name}: this machine lists no RDMA device at all (on a Mac, \
             enable RDMA with `rdma_ctl enable` in recoveryOS and reboot)"
        )
    } else {
        format!(
            "no RDMA device named {name}; this machine has {} (check the device file)",
            names.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_gids_of_the_form_ffff_ipv4_are_ipv4_mapped() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[169, 254, 0, 1]);
        assert!(is_ipv4_mapped(&gid));
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        link_local[15] = 1;
        assert!(!is_ipv4_mapped(&link_local));
        let mut half = gid;
        half[11] = 0;
        assert!(!is_ipv4_mapped(&half));
    }

    #[test]
    fn only_a_refused_operation_turns_numbering_off() {
        assert!(refuses_immediate(22));
        assert!(!refuses_immediate(12), "ENOMEM: the queue is full");
        assert!(!refuses_immediate(0));
    }

    #[test]
    fn a_subnet_prefix_alone_is_not_routed_to() {
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        assert_eq!(Remote::new(0, 1, 7, gid).gid, None);
        gid[15] = 1;
        assert_eq!(Remote::new(0, 1, 7, gid).gid, Some(gid));
    }
}
