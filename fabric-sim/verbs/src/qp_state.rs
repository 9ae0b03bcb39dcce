//! The queue-pair state machine of an Unreliable Connected queue pair, as a pure function.
//!
//! Real providers refuse an `ibv_modify_qp` whose attribute mask lacks a bit the transition
//! requires, names a bit the transition does not allow, or carries a value outside what the port
//! offers, and they say so only with `EINVAL` ("RTR failed with errno 22"). The table here is the
//! one of the InfiniBand specification (volume 1, "QP state transition properties") for the UC
//! transport, as Linux's `ib_modify_qp_is_ok` encodes it, so that such a bug in the fabric fails
//! here, on any machine, instead of on the first pair of Macs it meets.
//!
//! Modelled: every UC transition (RESET, INIT, RTR, RTS, SQD, SQE, ERR), `IBV_QP_CUR_STATE` as
//! an assertion of the current state, the values of the port, partition key index, path MTU,
//! destination QPN (24 bits), path migration state, access flags and address vector (port 1,
//! a populated source GID, no route by LID since the port's LID is 0). Not modelled: the
//! alternate path is checked like the primary one but never used; PSNs are taken modulo 2^24
//! as hardware does; rate limits, timeouts and retry counts belong to other transports and are
//! refused by the mask check.

use core::ffi::{c_int, c_uint};
use nuvec_verbs_abi::*;

/// What the port offers, as far as a modification is checked against it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PortView {
    /// The largest path MTU a queue pair may use.
    pub(crate) active_mtu: ibv_mtu,
    /// The length of the partition key table.
    pub(crate) pkey_tbl_len: u16,
    /// The length of the GID table.
    pub(crate) gid_tbl_len: u8,
    /// Bit `i` is set when GID index `i` holds a GID.
    pub(crate) gid_populated: u64,
}

/// The only port of every device.
pub(crate) const PORT_NUM: u8 = 1;

/// The largest queue pair number (24 bits).
pub(crate) const MAX_QPN: u32 = 0x00FF_FFFF;

/// Every attribute mask bit `verbs.h` defines up to the rate limit.
const KNOWN_BITS: c_int = ((1 << 21) - 1) | IBV_QP_RATE_LIMIT;

/// The access flags a queue pair may carry (local write, remote write/read/atomic, memory
/// window bind).
const QP_ACCESS_BITS: c_uint = 0x1F;

/// The required and the optional attribute bits (besides `IBV_QP_STATE`) of the UC transition
/// from `cur` to `next`, or `None` when the transition does not exist.
pub(crate) fn uc_transition(cur: ibv_qp_state, next: ibv_qp_state) -> Option<(c_int, c_int)> {
    const PKEY: c_int = IBV_QP_PKEY_INDEX;
    const ACCESS: c_int = IBV_QP_ACCESS_FLAGS;
    const MIG: c_int = IBV_QP_PATH_MIG_STATE;
    if next == IBV_QPS_RESET || next == IBV_QPS_ERR {
        return (cur <= IBV_QPS_ERR).then_some((0, 0));
    }
    Some(match (cur, next) {
        (IBV_QPS_RESET, IBV_QPS_INIT) => (PKEY | IBV_QP_PORT | ACCESS, 0),
        (IBV_QPS_INIT, IBV_QPS_INIT) => (0, PKEY | IBV_QP_PORT | ACCESS),
        (IBV_QPS_INIT, IBV_QPS_RTR) => (
            IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
            IBV_QP_ALT_PATH | ACCESS | PKEY,
        ),
        (IBV_QPS_RTR, IBV_QPS_RTS) => (
            IBV_QP_SQ_PSN,
            IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | ACCESS | MIG,
        ),
        (IBV_QPS_RTS, IBV_QPS_RTS) | (IBV_QPS_SQD, IBV_QPS_RTS) => {
            (0, IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | ACCESS | MIG)
        }
        (IBV_QPS_RTS, IBV_QPS_SQD) => (0, IBV_QP_EN_SQD_ASYNC_NOTIFY),
        (IBV_QPS_SQD, IBV_QPS_SQD) => (0, IBV_QP_ALT_PATH | ACCESS | PKEY | MIG),
        (IBV_QPS_SQE, IBV_QPS_RTS) => (0, IBV_QP_CUR_STATE | ACCESS),
        _ => return None,
    })
}

/// Checks an address vector against the port: port 1, and a global route from a populated
/// source GID (the port's LID is 0, so a route by LID reaches nobody).
fn check_av(ah: &ibv_ah_attr, port: &PortView) -> Result<(), c_int> {
    if ah.port_num != PORT_NUM {
        return Err(libc::EINVAL);
    }
    if ah.is_global == 0 {
        // LID 0 is not a routable LID, and the port has no subnet manager: without a global
        // route header the address names no one. Real RoCE providers refuse it the same way.
        return Err(libc::EINVAL);
    }
    let index = ah.grh.sgid_index;
    if index >= port.gid_tbl_len || port.gid_populated & (1 << index) == 0 {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// Checks `ibv_modify_qp(qp, attr, mask)` on a UC queue pair in state `cur` and returns the
/// state it moves to, or the errno a real provider returns (`EINVAL`).
pub(crate) fn check_modify(
    cur: ibv_qp_state,
    attr: &ibv_qp_attr,
    mask: c_int,
    port: &PortView,
) -> Result<ibv_qp_state, c_int> {
    let einval = Err(libc::EINVAL);
    if mask & !KNOWN_BITS != 0 || cur > IBV_QPS_ERR {
        return einval;
    }
    let next = if mask & IBV_QP_STATE != 0 {
        attr.qp_state
    } else {
        cur
    };
    let Some((required, optional)) = uc_transition(cur, next) else {
        return einval;
    };
    let given = mask & !IBV_QP_STATE;
    if given & required != required || given & !(required | optional) != 0 {
        return einval;
    }
    if mask & IBV_QP_CUR_STATE != 0 && attr.cur_qp_state != cur {
        return einval;
    }
    if mask & IBV_QP_PORT != 0 && attr.port_num != PORT_NUM {
        return einval;
    }
    if mask & IBV_QP_PKEY_INDEX != 0 && attr.pkey_index >= port.pkey_tbl_len {
        return einval;
    }
    if mask & IBV_QP_ACCESS_FLAGS != 0 && attr.qp_access_flags & !QP_ACCESS_BITS != 0 {
        return einval;
    }
    if mask & IBV_QP_PATH_MTU != 0 && !(IBV_MTU_256..=port.active_mtu).contains(&attr.path_mtu) {
        return einval;
    }
    if mask & IBV_QP_DEST_QPN != 0 && attr.dest_qp_num > MAX_QPN {
        return einval;
    }
    if mask & IBV_QP_PATH_MIG_STATE != 0 && attr.path_mig_state > 2 {
        return einval;
    }
    if mask & IBV_QP_AV != 0 {
        check_av(&attr.ah_attr, port)?;
    }
    if mask & IBV_QP_ALT_PATH != 0 {
        if attr.alt_port_num != PORT_NUM || attr.alt_pkey_index >= port.pkey_tbl_len {
            return einval;
        }
        check_av(&attr.alt_ah_attr, port)?;
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORT: PortView = PortView {
        active_mtu: IBV_MTU_4096,
        pkey_tbl_len: 1,
        gid_tbl_len: 2,
        gid_populated: 0b11,
    };

    fn init_attr() -> ibv_qp_attr {
        ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            port_num: 1,
            pkey_index: 0,
            qp_access_flags: (IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_READ
                | IBV_ACCESS_REMOTE_WRITE) as c_uint,
            ..Default::default()
        }
    }

    fn rtr_attr() -> ibv_qp_attr {
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: IBV_MTU_1024,
            dest_qp_num: 0x1234,
            rq_psn: 7,
            ..Default::default()
        };
        attr.ah_attr.port_num = 1;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.sgid_index = 1;
        attr.ah_attr.grh.hop_limit = 1;
        attr
    }

    const INIT_MASK: c_int = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    const RTR_MASK: c_int =
        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    const RTS_MASK: c_int = IBV_QP_STATE | IBV_QP_SQ_PSN;

    #[test]
    fn mlx_bring_up_passes_every_transition() {
        assert_eq!(
            check_modify(IBV_QPS_RESET, &init_attr(), INIT_MASK, &PORT),
            Ok(IBV_QPS_INIT)
        );
        assert_eq!(
            check_modify(IBV_QPS_INIT, &rtr_attr(), RTR_MASK, &PORT),
            Ok(IBV_QPS_RTR)
        );
        let rts = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            sq_psn: 7,
            ..Default::default()
        };
        assert_eq!(
            check_modify(IBV_QPS_RTR, &rts, RTS_MASK, &PORT),
            Ok(IBV_QPS_RTS)
        );
    }

    #[test]
    fn each_missing_required_bit_is_einval() {
        for (cur, attr, mask) in [
            (IBV_QPS_RESET, init_attr(), INIT_MASK),
            (IBV_QPS_INIT, rtr_attr(), RTR_MASK),
            (
                IBV_QPS_RTR,
                ibv_qp_attr {
                    qp_state: IBV_QPS_RTS,
                    ..Default::default()
                },
                RTS_MASK,
            ),
        ] {
            for bit in 1..31 {
                let bit = 1 << bit;
                if mask & bit != 0 {
                    assert_eq!(
                        check_modify(cur, &attr, mask & !bit, &PORT),
                        Err(libc::EINVAL),
                        "state {cur}, bit {bit:#x} missing"
                    );
                }
            }
        }
    }

    #[test]
    fn each_bit_outside_a_transition_is_einval() {
        for (cur, attr, mask) in [
            (IBV_QPS_RESET, init_attr(), INIT_MASK),
            (IBV_QPS_INIT, rtr_attr(), RTR_MASK),
            (
                IBV_QPS_RTR,
                ibv_qp_attr {
                    qp_state: IBV_QPS_RTS,
                    ..Default::default()
                },
                RTS_MASK,
            ),
        ] {
            let (required, optional) = uc_transition(cur, attr.qp_state).unwrap();
            for bit in 1..26 {
                let bit = 1 << bit;
                if (required | optional) & bit == 0 {
                    assert_eq!(
                        check_modify(cur, &attr, mask | bit, &PORT),
                        Err(libc::EINVAL),
                        "state {cur}, bit {bit:#x} added"
                    );
                }
            }
        }
    }

    #[test]
    fn optional_bits_are_accepted() {
        let mut attr = rtr_attr();
        attr.alt_port_num = 1;
        attr.alt_ah_attr = attr.ah_attr;
        let mask = RTR_MASK | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
        assert_eq!(
            check_modify(IBV_QPS_INIT, &attr, mask, &PORT),
            Ok(IBV_QPS_RTR)
        );
        let rts = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            cur_qp_state: IBV_QPS_RTR,
            ..Default::default()
        };
        assert_eq!(
            check_modify(IBV_QPS_RTR, &rts, RTS_MASK | IBV_QP_CUR_STATE, &PORT),
            Ok(IBV_QPS_RTS)
        );
    }

    #[test]
    fn reset_and_error_are_reached_from_anywhere_with_the_state_alone() {
        for cur in IBV_QPS_RESET..=IBV_QPS_ERR {
            for next in [IBV_QPS_RESET, IBV_QPS_ERR] {
                let attr = ibv_qp_attr {
                    qp_state: next,
                    ..Default::default()
                };
                assert_eq!(check_modify(cur, &attr, IBV_QP_STATE, &PORT), Ok(next));
                assert_eq!(
                    check_modify(cur, &attr, IBV_QP_STATE | IBV_QP_PORT, &PORT),
                    Err(libc::EINVAL)
                );
            }
        }
    }

    #[test]
    fn transitions_that_skip_a_state_are_einval() {
        let mut attr = rtr_attr();
        assert_eq!(
            check_modify(IBV_QPS_RESET, &attr, RTR_MASK, &PORT),
            Err(libc::EINVAL)
        );
        attr.qp_state = IBV_QPS_RTS;
        assert_eq!(
            check_modify(IBV_QPS_INIT, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN, &PORT),
            Err(libc::EINVAL)
        );
        attr.qp_state = IBV_QPS_RTR;
        assert_eq!(
            check_modify(IBV_QPS_RTR, &attr, RTR_MASK, &PORT),
            Err(libc::EINVAL)
        );
        attr.qp_state = 9;
        assert_eq!(
            check_modify(IBV_QPS_INIT, &attr, RTR_MASK, &PORT),
            Err(libc::EINVAL)
        );
    }

    #[test]
    fn bad_values_are_einval() {
        let mut bad_port = init_attr();
        bad_port.port_num = 2;
        let mut bad_pkey = init_attr();
        bad_pkey.pkey_index = 1;
        for attr in [bad_port, bad_pkey] {
            assert_eq!(
                check_modify(IBV_QPS_RESET, &attr, INIT_MASK, &PORT),
                Err(libc::EINVAL)
            );
        }
        let mut bad = Vec::new();
        let mut a = rtr_attr();
        a.path_mtu = 6;
        bad.push(a);
        let mut a = rtr_attr();
        a.path_mtu = 0;
        bad.push(a);
        let mut a = rtr_attr();
        a.dest_qp_num = 1 << 24;
        bad.push(a);
        let mut a = rtr_attr();
        a.ah_attr.port_num = 0;
        bad.push(a);
        let mut a = rtr_attr();
        a.ah_attr.grh.sgid_index = 2;
        bad.push(a);
        let mut a = rtr_attr();
        a.ah_attr.is_global = 0;
        bad.push(a);
        for attr in bad {
            assert_eq!(
                check_modify(IBV_QPS_INIT, &attr, RTR_MASK, &PORT),
                Err(libc::EINVAL),
                "{attr:?}"
            );
        }
        let small = PortView {
            active_mtu: IBV_MTU_512,
            ..PORT
        };
        assert_eq!(
            check_modify(IBV_QPS_INIT, &rtr_attr(), RTR_MASK, &small),
            Err(libc::EINVAL)
        );
        let no_ipv4 = PortView {
            gid_populated: 0b01,
            ..PORT
        };
        assert_eq!(
            check_modify(IBV_QPS_INIT, &rtr_attr(), RTR_MASK, &no_ipv4),
            Err(libc::EINVAL)
        );
    }

    #[test]
    fn a_wrong_current_state_is_einval() {
        let rts = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            cur_qp_state: IBV_QPS_INIT,
            ..Default::default()
        };
        assert_eq!(
            check_modify(IBV_QPS_RTR, &rts, RTS_MASK | IBV_QP_CUR_STATE, &PORT),
            Err(libc::EINVAL)
        );
    }
}
