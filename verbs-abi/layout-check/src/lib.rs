//! nuvec-verbs-abi against rdma-core's `verbs.h`: the size, alignment and every field offset of
//! each struct it declares, and the value of each constant, compared with bindgen's output for
//! the header (ibverbs-sys's bindings, and build.rs's for `ibv_wc` and the compatibility port
//! attributes). The structs the crate declares without fields (the objects only passed back to
//! the library) are left out; every other `pub struct`, `pub union` and `pub const` of
//! nuvec-verbs-abi must be checked here, which a test holds to.
#![cfg(test)]

use core::mem::{align_of, offset_of, size_of};
use ibverbs_sys as sys;
use nuvec_verbs_abi as abi;

/// build.rs's bindings: `ibv_wc`, `_compat_ibv_port_attr` and the `ibv_*` functions.
#[allow(
    dead_code,
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    unnecessary_transmutes,
    clippy::all
)]
mod rdma {
    include!(concat!(env!("OUT_DIR"), "/rdma_core.rs"));
}

/// The structs nuvec-verbs-abi declares without fields, deliberately not compared.
const OPAQUE: [&str; 5] = [
    "ibv_device",
    "ibv_comp_channel",
    "ibv_srq",
    "ibv_ah",
    "ibv_mw",
];

/// The size of the field a projection names.
fn size_of_field<T, F>(_: fn(*const T) -> *const F) -> usize {
    size_of::<F>()
}

/// Compares one field of `abi::$ours` with the bindgen field of the same name, or the one after
/// `:`, or the span of bindgen fields from that one to the one after `..` (to the end without).
macro_rules! field {
    ($errors:ident, $ours:ident, $theirs:ty; $field:ident) => {
        field!($errors, $ours, $theirs; $field: $field)
    };
    ($errors:ident, $ours:ident, $theirs:ty; $field:ident: $their_field:ident) => {
        field!(@compare $errors, $ours, $theirs, $field, $their_field, size_of_field(
            // SAFETY: never called; only the projection's type is used.
            |p: *const $theirs| unsafe { &raw const (*p).$their_field },
        ))
    };
    ($errors:ident, $ours:ident, $theirs:ty; $field:ident: $their_field:ident ..) => {
        field!(@compare $errors, $ours, $theirs, $field, $their_field,
            size_of::<$theirs>() - offset_of!($theirs, $their_field))
    };
    ($errors:ident, $ours:ident, $theirs:ty; $field:ident: $their_field:ident .. $end:ident) => {
        field!(@compare $errors, $ours, $theirs, $field, $their_field,
            offset_of!($theirs, $end) - offset_of!($theirs, $their_field))
    };
    (@compare $errors:ident, $ours:ident, $theirs:ty, $field:ident, $their_field:ident,
        $their_size:expr) => {{
        let name = concat!(stringify!($ours), ".", stringify!($field));
        let (ours, theirs) = (offset_of!(abi::$ours, $field), offset_of!($theirs, $their_field));
        if ours != theirs {
            $errors.push(format!("{name}: offset {ours}, rdma-core's {theirs}"));
        }
        let ours = size_of_field(
            // SAFETY: never called; only the projection's type is used.
            |p: *const abi::$ours| unsafe { &raw const (*p).$field },
        );
        let theirs: usize = $their_size;
        if ours != theirs {
            $errors.push(format!("{name}: size {ours}, rdma-core's {theirs}"));
        }
    }};
}

/// Compares `abi::$ours` with the bindgen type `$theirs`: size, alignment, and for each field
/// listed its offset and size against the bindgen field of the same name (or the one after
/// `:`). A field written `name: first ..next` stands for the bindgen fields from `first` up to
/// `next` (to the end without `next`), and its size is their span. For a `struct`, a field of
/// ours missing from the list does not compile. Mismatches are pushed to `$errors`, the name
/// to `$checked`.
macro_rules! layout {
    ($errors:ident, $checked:ident, $kind:tt $ours:ident = $theirs:ty {
        $($field:ident $(: $their_field:ident)? $(.. $($end:ident)?)?),* $(,)?
    }) => {{
        $checked.push(stringify!($ours));
        let name = stringify!($ours);
        let (ours, theirs) = (size_of::<abi::$ours>(), size_of::<$theirs>());
        if ours != theirs {
            $errors.push(format!("{name}: size {ours}, rdma-core's {theirs}"));
        }
        let (ours, theirs) = (align_of::<abi::$ours>(), align_of::<$theirs>());
        if ours != theirs {
            $errors.push(format!("{name}: alignment {ours}, rdma-core's {theirs}"));
        }
        $(field!($errors, $ours, $theirs; $field $(: $their_field)? $(.. $($end)?)?);)*
        layout!(@all $kind $ours { $($field),* });
    }};
    (@all struct $ours:ident { $($field:ident),* }) => {
        let _every_field_is_listed = |value: abi::$ours| {
            let abi::$ours { $($field: _),* } = value;
        };
    };
    (@all union $ours:ident { $($field:ident),* }) => {};
}

/// Compares each struct of nuvec-verbs-abi with rdma-core's: the mismatches, and the names of
/// the structs compared.
fn struct_mismatches() -> (Vec<String>, Vec<&'static str>) {
    let mut errors = Vec::new();
    let mut checked = Vec::new();
    layout!(errors, checked, struct pthread_mutex_t = sys::pthread_mutex_t { opaque: __size .. });
    layout!(errors, checked, struct pthread_cond_t = sys::pthread_cond_t { opaque: __size .. });
    layout!(errors, checked, struct ibv_gid_global = sys::ibv_gid__bindgen_ty_1 {
        subnet_prefix, interface_id,
    });
    layout!(errors, checked, union ibv_gid = sys::ibv_gid { raw, global });
    layout!(errors, checked, struct ibv_context_ops = sys::ibv_context_ops {
        reserved_0: _compat_query_device ..poll_cq,
        poll_cq,
        reserved_12: req_notify_cq ..post_send,
        post_send,
        post_recv,
        reserved_27: _compat_create_ah ..,
    });
    layout!(errors, checked, struct ibv_context = sys::ibv_context {
        device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat,
    });
    layout!(errors, checked, struct ibv_pd = sys::ibv_pd { context, handle });
    layout!(errors, checked, struct ibv_mr = sys::ibv_mr {
        context, pd, addr, length, handle, lkey, rkey,
    });
    layout!(errors, checked, struct ibv_cq = sys::ibv_cq {
        context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
        async_events_completed,
    });
    layout!(errors, checked, struct ibv_qp = sys::ibv_qp {
        context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex,
        cond, events_completed,
    });
    layout!(errors, checked, struct ibv_qp_cap = sys::ibv_qp_cap {
        max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data,
    });
    layout!(errors, checked, struct ibv_qp_init_attr = sys::ibv_qp_init_attr {
        qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all,
    });
    layout!(errors, checked, struct ibv_global_route = sys::ibv_global_route {
        dgid, flow_label, sgid_index, hop_limit, traffic_class,
    });
    layout!(errors, checked, struct ibv_ah_attr = sys::ibv_ah_attr {
        grh, dlid, sl, src_path_bits, static_rate, is_global, port_num,
    });
    layout!(errors, checked, struct ibv_qp_attr = sys::ibv_qp_attr {
        qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
        qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
        en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
        port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit,
    });
    layout!(errors, checked, struct ibv_sge = sys::ibv_sge { addr, length, lkey });
    layout!(errors, checked, struct ibv_send_wr = sys::ibv_send_wr {
        wr_id, next, sg_list, num_sge, opcode, send_flags,
        imm_data: __bindgen_anon_1,
        wr,
        qp_type,
        bind_mw: __bindgen_anon_2,
    });
    layout!(errors, checked, struct ibv_recv_wr = sys::ibv_recv_wr {
        wr_id, next, sg_list, num_sge,
    });
    layout!(errors, checked, struct ibv_wc = rdma::ibv_wc {
        wr_id, status, opcode, vendor_err, byte_len,
        imm_data: __bindgen_anon_1,
        qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits,
    });
    layout!(errors, checked, struct ibv_port_attr = sys::ibv_port_attr {
        state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
        qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
        init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
        port_cap_flags2, active_speed_ex,
    });
    layout!(errors, checked, struct ibv_device_attr = sys::ibv_device_attr {
        fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
        vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
        max_cq, max_cqe, max_mr, max_pd,
        other_limits: max_qp_rd_atom .. max_pkeys,
        max_pkeys, local_ca_ack_delay, phys_port_cnt,
    });
    (errors, checked)
}

/// Compares constants of nuvec-verbs-abi with rdma-core's, as numbers: `enum m: …` with the
/// constants of bindgen's module `m`, `flags t: …` with the bitfield type `t`'s, `values: …`
/// with the crate's top-level ones.
macro_rules! values {
    (@one $errors:ident, $checked:ident, $name:ident, $theirs:expr) => {{
        $checked.push(stringify!($name));
        let (ours, theirs) = (abi::$name as i64, $theirs as i64);
        if ours != theirs {
            $errors.push(format!("{}: {ours}, rdma-core's {theirs}", stringify!($name)));
        }
    }};
    ($errors:ident, $checked:ident, enum $module:ident: $($name:ident),* $(,)?) => {
        $(values!(@one $errors, $checked, $name, sys::$module::$name);)*
    };
    ($errors:ident, $checked:ident, flags $type:ident: $($name:ident),* $(,)?) => {
        $(values!(@one $errors, $checked, $name, sys::$type::$name.0);)*
    };
    ($errors:ident, $checked:ident, values: $($name:ident),* $(,)?) => {
        $(values!(@one $errors, $checked, $name, sys::$name);)*
    };
}

/// Compares each constant of nuvec-verbs-abi with rdma-core's: the mismatches, and the names of
/// the constants compared.
fn constant_mismatches() -> (Vec<String>, Vec<&'static str>) {
    let mut errors = Vec::new();
    let mut checked = Vec::new();
    values!(errors, checked, enum ibv_qp_state:
        IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE,
        IBV_QPS_ERR,
    );
    values!(errors, checked, enum ibv_qp_type: IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD);
    values!(errors, checked, values:
        IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096,
    );
    values!(errors, checked, flags ibv_qp_attr_mask:
        IBV_QP_STATE, IBV_QP_CUR_STATE, IBV_QP_EN_SQD_ASYNC_NOTIFY, IBV_QP_ACCESS_FLAGS,
        IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_QKEY, IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_TIMEOUT,
        IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN, IBV_QP_MAX_QP_RD_ATOMIC,
        IBV_QP_ALT_PATH, IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_PATH_MIG_STATE, IBV_QP_CAP, IBV_QP_DEST_QPN, IBV_QP_RATE_LIMIT,
    );
    values!(errors, checked, flags ibv_access_flags:
        IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_ATOMIC,
    );
    values!(errors, checked, enum ibv_wr_opcode:
        IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ,
    );
    values!(errors, checked, flags ibv_send_flags:
        IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED, IBV_SEND_INLINE,
    );
    values!(errors, checked, enum ibv_wc_status:
        IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_QP_OP_ERR, IBV_WC_LOC_EEC_OP_ERR,
        IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR, IBV_WC_MW_BIND_ERR, IBV_WC_BAD_RESP_ERR,
        IBV_WC_LOC_ACCESS_ERR, IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_OP_ERR,
        IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_LOC_RDD_VIOL_ERR,
        IBV_WC_REM_INV_RD_REQ_ERR, IBV_WC_REM_ABORT_ERR, IBV_WC_INV_EECN_ERR,
        IBV_WC_INV_EEC_STATE_ERR, IBV_WC_FATAL_ERR, IBV_WC_RESP_TIMEOUT_ERR, IBV_WC_GENERAL_ERR,
    );
    values!(errors, checked, enum ibv_wc_opcode: IBV_WC_SEND, IBV_WC_RECV);
    values!(errors, checked, flags ibv_wc_flags: IBV_WC_GRH, IBV_WC_WITH_IMM);
    values!(errors, checked, enum ibv_port_state: IBV_PORT_ACTIVE);
    values!(@one errors, checked, COMPAT_PORT_ATTR_BYTES, size_of::<rdma::_compat_ibv_port_attr>());
    (errors, checked)
}

/// The names nuvec-verbs-abi declares with `pub <keyword> <name>` at the start of a line.
fn declared(keyword: &str) -> Vec<&'static str> {
    let prefix = format!("pub {keyword} ");
    include_str!("../../src/lib.rs")
        .lines()
        .filter_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|rest| rest.split([' ', ':', '<', '{', '(']).next().unwrap_or(rest))
        .collect()
}

#[test]
fn every_struct_has_rdma_cores_size_alignment_and_field_offsets() {
    let (errors, _) = struct_mismatches();
    assert!(
        errors.is_empty(),
        "layouts that differ from verbs.h:\n{}",
        errors.join("\n")
    );
}

#[test]
fn every_constant_has_rdma_cores_value() {
    let (errors, _) = constant_mismatches();
    assert!(
        errors.is_empty(),
        "values that differ from verbs.h:\n{}",
        errors.join("\n")
    );
}

#[test]
fn the_compatibility_port_attributes_are_the_fields_up_to_flags_at_the_same_offsets() {
    macro_rules! same_offsets {
        ($($field:ident),*) => {
            $(assert_eq!(
                offset_of!(abi::ibv_port_attr, $field),
                offset_of!(rdma::_compat_ibv_port_attr, $field),
                stringify!($field),
            );)*
        };
    }
    same_offsets!(
        state,
        max_mtu,
        active_mtu,
        gid_tbl_len,
        port_cap_flags,
        max_msg_sz,
        bad_pkey_cntr,
        qkey_viol_cntr,
        pkey_tbl_len,
        lid,
        sm_lid,
        lmc,
        max_vl_num,
        sm_sl,
        subnet_timeout,
        init_type_reply,
        active_width,
        active_speed,
        phys_state,
        link_layer,
        flags
    );
    let end = offset_of!(abi::ibv_port_attr, flags) + 1;
    assert_eq!(
        abi::COMPAT_PORT_ATTR_BYTES,
        end.next_multiple_of(align_of::<abi::ibv_port_attr>())
    );
    assert!(abi::COMPAT_PORT_ATTR_BYTES <= offset_of!(abi::ibv_port_attr, port_cap_flags2));
}

#[test]
fn every_symbol_the_fabric_resolves_is_a_function_of_verbs_h() {
    let bindings = include_str!(concat!(env!("OUT_DIR"), "/rdma_core.rs"));
    for symbol in abi::SYMBOLS.into_iter().chain([abi::QUERY_DEVICE]) {
        assert!(
            bindings.contains(&format!("pub fn {symbol}(")),
            "{symbol} is not in verbs.h"
        );
    }
}

/// The crate's constants that are not in `verbs.h`, so nothing here compares them: the list of
/// functions the fabric resolves (checked against the bindings on its own, above) and Apple's
/// limits on a Thunderbolt device, which users report and no header states.
const NOT_IN_VERBS_H: [&str; 5] = [
    "SYMBOLS",
    "QUERY_DEVICE",
    "APPLE_MAX_QP_PER_DEVICE",
    "APPLE_MAX_MR_PER_DEVICE",
    "APPLE_MAX_WR_PER_QUEUE",
];

#[test]
fn every_struct_and_constant_of_the_crate_is_compared_here() {
    let (_, structs) = struct_mismatches();
    let mut compared: Vec<&str> = structs.into_iter().chain(OPAQUE).collect();
    let mut declared_types: Vec<&str> = declared("struct")
        .into_iter()
        .chain(declared("union"))
        .collect();
    compared.sort_unstable();
    declared_types.sort_unstable();
    assert_eq!(declared_types, compared, "structs and unions");

    let (_, constants) = constant_mismatches();
    let mut compared: Vec<&str> = constants.into_iter().chain(NOT_IN_VERBS_H).collect();
    let mut declared_constants = declared("const");
    compared.sort_unstable();
    declared_constants.sort_unstable();
    assert_eq!(declared_constants, compared, "constants");
}
