//! Helpers of the provider's tests: MLX-style bring-up through the exported functions, bounded
//! polling, and running a test's body in a process of its own (the provider's configuration,
//! fault counters and per-device limits are per process).
#![allow(dead_code)]

use core::ffi::c_int;
use nuvec_verbs_abi::*;
use nuvec_verbs_emu::*;
use std::ffi::CStr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The variable telling a re-executed test binary which test body to run.
pub(crate) const CHILD: &str = "NUVEC_VERBS_EMU_TEST_CHILD";

/// How long any wait of a test may take.
pub(crate) const DEADLINE: Duration = Duration::from_secs(20);

/// The frame size the fabric registers.
pub(crate) const FRAME: usize = 512 * 1024;

/// The attribute mask of MLX's INIT transition.
pub(crate) const INIT_MASK: c_int =
    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
/// The attribute mask of MLX's RTR transition.
pub(crate) const RTR_MASK: c_int =
    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
/// The attribute mask of MLX's RTS transition.
pub(crate) const RTS_MASK: c_int = IBV_QP_STATE | IBV_QP_SQ_PSN;

/// Whether this process is the child running `test`.
pub(crate) fn is_child(test: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(test)
}

/// A command re-running this test binary's test `test` alone, with the provider's variables
/// of this process removed and `env` set.
pub(crate) fn child_command(test: &str, env: &[(&str, &str)]) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command.args([test, "--exact", "--nocapture", "--test-threads=1"]);
    for (name, _) in std::env::vars() {
        if name.starts_with("NUVEC_VERBS_EMU_") {
            command.env_remove(name);
        }
    }
    command.env(CHILD, test).envs(env.iter().copied());
    command
}

/// Runs `command` to its end, or kills it at the deadline; its exit status and output.
pub(crate) fn run_bounded(mut command: Command) -> std::process::Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the test binary starts");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(DEADLINE) {
        Ok(output) => output.expect("the child's output"),
        Err(_) => {
            // SAFETY: `pid` is the child this function started and has not reaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("the child process did not finish within {DEADLINE:?}");
        }
    }
}

/// Runs `body` in a process of its own with `env` set: in the parent, re-runs the test
/// binary for test `test` and checks that it passed.
pub(crate) fn isolated(test: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if is_child(test) {
        body();
        return;
    }
    let output = run_bounded(child_command(test, env));
    assert!(
        output.status.success(),
        "{test} failed in its own process ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The listed devices with their names, the list freed again.
fn listed() -> Result<Vec<(*mut ibv_device, String)>, c_int> {
    let mut n = 0;
    // SAFETY: `n` is a writable int.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: the list holds `n` device pointers before its null terminator.
    let devices = unsafe { core::slice::from_raw_parts(list, n as usize) }.to_vec();
    let mut named = Vec::new();
    for device in devices {
        // SAFETY: a listed device; the provider returns a NUL-terminated name.
        let name = unsafe { ibv_get_device_name(device) };
        // SAFETY: a name the provider returned, valid for the process's life.
        let name = unsafe { CStr::from_ptr(name) };
        named.push((device, name.to_string_lossy().into_owned()));
    }
    // SAFETY: the list came from `ibv_get_device_list` and is freed once; the devices it
    // listed stay valid.
    unsafe { ibv_free_device_list(list) };
    Ok(named)
}

/// The listed device names.
pub(crate) fn device_names() -> Result<Vec<String>, c_int> {
    Ok(listed()?.into_iter().map(|(_, name)| name).collect())
}

/// Opens the device named `name`.
pub(crate) fn open(name: &str) -> *mut ibv_context {
    let devices = listed().expect("a device list");
    let (device, _) = devices
        .iter()
        .find(|(_, listed)| listed == name)
        .unwrap_or_else(|| panic!("device {name} not listed"));
    // SAFETY: a listed device.
    let ctx = unsafe { ibv_open_device(*device) };
    assert!(!ctx.is_null(), "device {name} not opened");
    ctx
}

/// A GID of the port.
pub(crate) fn gid(ctx: &Side, index: c_int) -> Result<ibv_gid, c_int> {
    let mut gid = ibv_gid::default();
    // SAFETY: `gid` is a writable GID.
    let rc = unsafe { ibv_query_gid(ctx.ctx, 1, index, &mut gid) };
    if rc == 0 { Ok(gid) } else { Err(rc) }
}

/// The bytes of a GID.
pub(crate) fn raw(gid: &ibv_gid) -> [u8; 16] {
    // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
    unsafe { gid.raw }
}

/// One side of a connection, brought up the way the fabric does: a context, a protection
/// domain, one completion queue of 64, one UC queue pair (32 and 32 work requests, one SGE,
/// no inline data, not signaling all) and `frames` registered frames of `FRAME` bytes.
pub(crate) struct Side {
    /// The context.
    pub(crate) ctx: *mut ibv_context,
    /// The protection domain.
    pub(crate) pd: *mut ibv_pd,
    /// The completion queue.
    pub(crate) cq: *mut ibv_cq,
    /// The queue pair.
    pub(crate) qp: *mut ibv_qp,
    /// The registered region.
    pub(crate) mr: *mut ibv_mr,
    /// The registered memory.
    pub(crate) buf: Vec<u8>,
}

impl Side {
    /// Brings a side up to RESET with its memory registered, as the fabric does.
    pub(crate) fn new(device: &str, frames: usize) -> Side {
        Side::with(device, frames, 64, 32)
    }

    /// Brings a side up to RESET with a completion queue of `cqe` and queues of `depth`.
    pub(crate) fn with(device: &str, frames: usize, cqe: c_int, depth: u32) -> Side {
        let ctx = open(device);
        // SAFETY: an open context.
        let pd = unsafe { ibv_alloc_pd(ctx) };
        assert!(!pd.is_null());
        // SAFETY: an open context; no completion channel.
        let cq =
            unsafe { ibv_create_cq(ctx, cqe, core::ptr::null_mut(), core::ptr::null_mut(), 0) };
        assert!(!cq.is_null());
        let qp = create_qp(pd, cq, depth, depth).expect("a UC queue pair");
        let mut buf = vec![0u8; frames * FRAME];
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
        // SAFETY: `buf` lives in the returned side, unmoved, until `teardown` deregisters it.
        let mr = unsafe { ibv_reg_mr(pd, buf.as_mut_ptr().cast(), buf.len(), access) };
        assert!(!mr.is_null());
        Side {
            ctx,
            pd,
            cq,
            qp,
            mr,
            buf,
        }
    }

    /// The queue pair's number.
    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: a live queue pair of the provider.
        unsafe { (*self.qp).qp_num }
    }

    /// The queue pair's state as the provider shows it in `ibv_qp`.
    pub(crate) fn state(&self) -> ibv_qp_state {
        // SAFETY: a live queue pair of the provider.
        unsafe { (*self.qp).state }
    }

    /// The region's lkey.
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: a live region of the provider.
        unsafe { (*self.mr).lkey }
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify(&self, attr: &ibv_qp_attr, mask: c_int) -> c_int {
        let mut attr = *attr;
        // SAFETY: a live queue pair; `attr` is a readable attribute struct.
        unsafe { ibv_modify_qp(self.qp, &mut attr, mask) }
    }

    /// MLX's INIT transition.
    pub(crate) fn init(&self) -> c_int {
        self.modify(&init_attr(), INIT_MASK)
    }

    /// MLX's RTR transition toward `gid` and `qpn`.
    pub(crate) fn rtr(&self, gid: ibv_gid, qpn: u32) -> c_int {
        self.modify(&rtr_attr(gid, qpn), RTR_MASK)
    }

    /// MLX's RTS transition.
    pub(crate) fn rts(&self) -> c_int {
        self.modify(&rts_attr(), RTS_MASK)
    }

    /// An SGE of `len` bytes at `offset` of the registered memory.
    pub(crate) fn sge(&self, offset: usize, len: usize) -> ibv_sge {
        ibv_sge {
            addr: self.buf.as_ptr() as u64 + offset as u64,
            length: len as u32,
            lkey: self.lkey(),
        }
    }

    /// Posts one receive of `sge`.
    pub(crate) fn post_recv(&self, wr_id: u64, sge: ibv_sge) -> c_int {
        let mut sge = sge;
        let mut wr = ibv_recv_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            ..Default::default()
        };
        let mut bad = core::ptr::null_mut();
        // SAFETY: a live context of the provider.
        let post = unsafe { (*self.ctx).ops.post_recv }.expect("post_recv");
        // SAFETY: a live queue pair; `wr` and its SGE are readable, `bad` writable.
        unsafe { post(self.qp, &mut wr, &mut bad) }
    }

    /// Posts one signaled SEND of `sge`.
    pub(crate) fn post_send(&self, wr_id: u64, sge: ibv_sge) -> c_int {
        self.post_send_op(wr_id, sge, IBV_WR_SEND, 0)
    }

    /// Posts one signaled send of `sge` with operation `opcode` and immediate data `imm`.
    pub(crate) fn post_send_op(
        &self,
        wr_id: u64,
        sge: ibv_sge,
        opcode: ibv_wr_opcode,
        imm: u32,
    ) -> c_int {
        let mut sge = sge;
        let mut wr = ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode,
            send_flags: IBV_SEND_SIGNALED,
            imm_data: imm,
            ..Default::default()
        };
        let mut bad = core::ptr::null_mut();
        // SAFETY: a live context of the provider.
        let post = unsafe { (*self.ctx).ops.post_send }.expect("post_send");
        // SAFETY: a live queue pair; `wr` and its SGE are readable, `bad` writable.
        unsafe { post(self.qp, &mut wr, &mut bad) }
    }

    /// Polls the completion queue, 16 at a time, until `want` completions came or the
    /// deadline passed; what came (or the negative poll result).
    pub(crate) fn poll(&self, want: usize) -> Result<Vec<ibv_wc>, c_int> {
        poll_cq(self.ctx, self.cq, want, DEADLINE)
    }

    /// Polls for `within`, expecting nothing.
    pub(crate) fn poll_nothing(&self, within: Duration) -> Vec<ibv_wc> {
        poll_cq(self.ctx, self.cq, usize::MAX, within).expect("polls succeed")
    }

    /// The fabric's teardown: destroy_qp, destroy_cq, dereg_mr, dealloc_pd, close_device.
    pub(crate) fn teardown(self) {
        // SAFETY: each object is live and destroyed once, in the fabric's order.
        assert_eq!(unsafe { ibv_destroy_qp(self.qp) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { ibv_destroy_cq(self.cq) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { ibv_dereg_mr(self.mr) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { ibv_dealloc_pd(self.pd) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { ibv_close_device(self.ctx) }, 0);
    }
}

/// Polls `cq` until `want` completions came or `within` passed.
pub(crate) fn poll_cq(
    ctx: *mut ibv_context,
    cq: *mut ibv_cq,
    want: usize,
    within: Duration,
) -> Result<Vec<ibv_wc>, c_int> {
    // SAFETY: a live context of the provider.
    let poll = unsafe { (*ctx).ops.poll_cq }.expect("poll_cq");
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut batch = [ibv_wc::default(); 16];
    while got.len() < want && Instant::now() < deadline {
        // SAFETY: a live completion queue; `batch` has room for 16 completions.
        let n = unsafe { poll(cq, 16, batch.as_mut_ptr()) };
        if n < 0 {
            return Err(n);
        }
        got.extend_from_slice(&batch[..n as usize]);
        std::thread::yield_now();
    }
    Ok(got)
}

/// Creates a UC queue pair on `cq` with the given queue depths.
pub(crate) fn create_qp(
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    send: u32,
    recv: u32,
) -> Result<*mut ibv_qp, c_int> {
    create_qp_of_type(pd, cq, send, recv, IBV_QPT_UC)
}

/// Creates a queue pair of type `qp_type` on `cq`.
pub(crate) fn create_qp_of_type(
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    send: u32,
    recv: u32,
    qp_type: ibv_qp_type,
) -> Result<*mut ibv_qp, c_int> {
    let mut attr = ibv_qp_init_attr {
        send_cq: cq,
        recv_cq: cq,
        cap: ibv_qp_cap {
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type,
        sq_sig_all: 0,
        ..Default::default()
    };
    // SAFETY: `attr` is a readable and writable init attribute struct.
    let qp = unsafe { ibv_create_qp(pd, &mut attr) };
    if qp.is_null() {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(qp)
    }
}

/// MLX's INIT attributes.
pub(crate) fn init_attr() -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        port_num: 1,
        pkey_index: 0,
        qp_access_flags: (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)
            as u32,
        ..Default::default()
    }
}

/// MLX's RTR attributes toward `gid` and `qpn`.
pub(crate) fn rtr_attr(gid: ibv_gid, qpn: u32) -> ibv_qp_attr {
    let mut attr = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        path_mtu: IBV_MTU_1024,
        rq_psn: 7,
        dest_qp_num: qpn,
        ..Default::default()
    };
    attr.ah_attr.dlid = 0;
    attr.ah_attr.sl = 0;
    attr.ah_attr.src_path_bits = 0;
    attr.ah_attr.port_num = 1;
    // SAFETY: every bit pattern of the union is a valid pair of words.
    if unsafe { gid.global.interface_id } != 0 {
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = gid;
        attr.ah_attr.grh.sgid_index = 1;
        attr.ah_attr.grh.hop_limit = 1;
    }
    attr
}

/// MLX's RTS attributes.
pub(crate) fn rts_attr() -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        sq_psn: 7,
        ..Default::default()
    }
}

/// Two sides on two devices, connected and in RTS.
pub(crate) fn pair(a: &str, b: &str, frames: usize) -> (Side, Side) {
    let a = Side::new(a, frames);
    let b = Side::new(b, frames);
    assert_eq!(a.init(), 0);
    assert_eq!(b.init(), 0);
    let (ga, gb) = (gid(&a, 1).unwrap(), gid(&b, 1).unwrap());
    assert_eq!(a.rtr(gb, b.qpn()), 0);
    assert_eq!(b.rtr(ga, a.qpn()), 0);
    assert_eq!(a.rts(), 0);
    assert_eq!(b.rts(), 0);
    (a, b)
}
