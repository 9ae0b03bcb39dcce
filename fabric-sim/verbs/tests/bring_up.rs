//! The provider's control path through its exported functions: device listing and its
//! environment, the GID table in both modes, the UC state machine's EINVALs and an MLX-style
//! bring-up, Apple's limits, EBUSY on early destruction, and the ledger of `ibv_close_device`.
#![cfg(target_os = "linux")]

mod common;

use common::*;
use nuvec_verbs_abi::*;
use nuvec_verbs_emu::*;

#[test]
fn eight_devices_are_listed_by_default() {
    isolated("eight_devices_are_listed_by_default", &[], || {
        let names = device_names().unwrap();
        let expected: Vec<String> = (0..8).map(|i| format!("rdma_en{i}")).collect();
        assert_eq!(names, expected);
    });
}

#[test]
fn the_environment_names_other_devices_in_order() {
    isolated(
        "the_environment_names_other_devices_in_order",
        &[("NUVEC_VERBS_EMU_DEVICES", "rdma_en3,rdma_en5")],
        || assert_eq!(device_names().unwrap(), ["rdma_en3", "rdma_en5"]),
    );
}

#[test]
fn an_empty_device_variable_lists_no_device() {
    isolated(
        "an_empty_device_variable_lists_no_device",
        &[("NUVEC_VERBS_EMU_DEVICES", "")],
        || assert_eq!(device_names().unwrap(), Vec::<String>::new()),
    );
}

#[test]
fn a_bad_variable_fails_the_listing_with_einval_and_names_itself() {
    for (name, value) in [
        ("NUVEC_VERBS_EMU_LOSS", "2"),
        ("NUVEC_VERBS_EMU_DEVICES", ",,"),
        ("NUVEC_VERBS_EMU_FAIL_WR", "first"),
    ] {
        let test = "the_listing_fails_with_einval";
        let output = run_bounded(child_command(test, &[(name, value)]));
        assert!(output.status.success(), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(name), "{stderr}");
    }
}

#[test]
fn the_listing_fails_with_einval() {
    if is_child("the_listing_fails_with_einval") {
        assert_eq!(device_names(), Err(libc::EINVAL));
    }
}

#[test]
fn the_port_is_active_with_lid_zero_and_index_one_is_an_ipv4_mapped_gid() {
    isolated(
        "the_port_is_active_with_lid_zero_and_index_one_is_an_ipv4_mapped_gid",
        &[],
        || {
            let a = Side::new("rdma_en0", 1);
            let b = Side::new("rdma_en1", 1);
            let mut port = ibv_port_attr {
                port_cap_flags2: 0xAAAA,
                active_speed_ex: 0xAAAA_AAAA,
                ..Default::default()
            };
            // SAFETY: an open context; `port` is a writable port attribute struct.
            assert_eq!(unsafe { ibv_query_port(a.ctx, 1, &mut port) }, 0);
            // Only the compatibility layout is written, as the exported symbol does.
            assert_eq!(
                (port.port_cap_flags2, port.active_speed_ex),
                (0xAAAA, 0xAAAA_AAAA)
            );
            assert_eq!(port.state, IBV_PORT_ACTIVE);
            assert_eq!(port.lid, 0);
            assert_eq!(port.max_mtu, IBV_MTU_4096);
            assert_eq!(port.gid_tbl_len, 2);
            // SAFETY: as above; port 2 does not exist.
            assert_eq!(unsafe { ibv_query_port(a.ctx, 2, &mut port) }, libc::EINVAL);
            let (a0, a1) = (raw(&gid(&a, 0).unwrap()), raw(&gid(&a, 1).unwrap()));
            let b1 = raw(&gid(&b, 1).unwrap());
            assert_eq!(a0[..8], [0xfe, 0x80, 0, 0, 0, 0, 0, 0]);
            assert_eq!(a1[..13], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127]);
            assert_eq!(a0[13..], a1[13..], "both GIDs name the same endpoint");
            assert_ne!(a1, b1, "each device has its own GIDs");
            assert_eq!(gid(&a, 2).unwrap_err(), libc::EINVAL);
            assert_eq!(gid(&a, -1).unwrap_err(), libc::EINVAL);
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn without_ipv4_only_a_link_local_gid_and_index_one_cannot_be_the_source() {
    isolated(
        "without_ipv4_only_a_link_local_gid_and_index_one_cannot_be_the_source",
        &[("NUVEC_VERBS_EMU_NO_IPV4", "1")],
        || {
            let a = Side::new("rdma_en0", 1);
            let b = Side::new("rdma_en1", 1);
            assert_eq!(raw(&gid(&a, 0).unwrap())[..2], [0xfe, 0x80]);
            assert_eq!(raw(&gid(&a, 1).unwrap()), [0; 16], "index 1 is empty");
            assert_eq!(a.init(), 0);
            let link_local = gid(&b, 0).unwrap();
            // MLX's RTR names GID index 1 as its source: refused where it is empty.
            assert_eq!(a.rtr(link_local, b.qpn()), libc::EINVAL);
            let mut attr = rtr_attr(link_local, b.qpn());
            attr.ah_attr.grh.sgid_index = 0;
            assert_eq!(a.modify(&attr, RTR_MASK), 0);
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn an_mlx_style_bring_up_reaches_rts_and_every_missing_or_extra_bit_is_einval() {
    isolated(
        "an_mlx_style_bring_up_reaches_rts_and_every_missing_or_extra_bit_is_einval",
        &[],
        || {
            let a = Side::new("rdma_en0", 1);
            let b = Side::new("rdma_en1", 1);
            let (gb, qb) = (gid(&b, 1).unwrap(), b.qpn());
            // Each transition: every required bit left out, then a bit it does not allow.
            for bit in [
                IBV_QP_PKEY_INDEX,
                IBV_QP_PORT,
                IBV_QP_ACCESS_FLAGS,
                IBV_QP_STATE,
            ] {
                assert_eq!(a.modify(&init_attr(), INIT_MASK & !bit), libc::EINVAL);
            }
            assert_eq!(
                a.modify(&init_attr(), INIT_MASK | IBV_QP_QKEY),
                libc::EINVAL
            );
            let mut bad_port = init_attr();
            bad_port.port_num = 2;
            assert_eq!(a.modify(&bad_port, INIT_MASK), libc::EINVAL);
            assert_eq!(a.rtr(gb, qb), libc::EINVAL, "RESET to RTR skips INIT");
            assert_eq!(a.state(), IBV_QPS_RESET);
            assert_eq!(a.init(), 0);
            assert_eq!(a.state(), IBV_QPS_INIT);
            let rtr = rtr_attr(gb, qb);
            for bit in [IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN] {
                assert_eq!(a.modify(&rtr, RTR_MASK & !bit), libc::EINVAL);
            }
            assert_eq!(a.modify(&rtr, RTR_MASK | IBV_QP_SQ_PSN), libc::EINVAL);
            assert_eq!(a.modify(&rtr, RTR_MASK | IBV_QP_TIMEOUT), libc::EINVAL);
            let mut no_grh = rtr;
            no_grh.ah_attr.is_global = 0;
            assert_eq!(
                a.modify(&no_grh, RTR_MASK),
                libc::EINVAL,
                "LID 0 routes nowhere"
            );
            let mut big_qpn = rtr;
            big_qpn.dest_qp_num = 1 << 24;
            assert_eq!(a.modify(&big_qpn, RTR_MASK), libc::EINVAL);
            let mut big_mtu = rtr;
            big_mtu.path_mtu = 6;
            assert_eq!(a.modify(&big_mtu, RTR_MASK), libc::EINVAL);
            assert_eq!(a.rts(), libc::EINVAL, "INIT to RTS skips RTR");
            assert_eq!(a.rtr(gb, qb), 0);
            assert_eq!(a.state(), IBV_QPS_RTR);
            assert_eq!(a.modify(&rts_attr(), IBV_QP_STATE), libc::EINVAL);
            assert_eq!(a.modify(&rts_attr(), RTS_MASK | IBV_QP_AV), libc::EINVAL);
            assert_eq!(a.rts(), 0);
            assert_eq!(a.state(), IBV_QPS_RTS);
            // Any state goes to ERR and RESET with the state alone, and nothing else.
            let err = ibv_qp_attr {
                qp_state: IBV_QPS_ERR,
                ..Default::default()
            };
            assert_eq!(a.modify(&err, IBV_QP_STATE | IBV_QP_PORT), libc::EINVAL);
            assert_eq!(a.modify(&err, IBV_QP_STATE), 0);
            assert_eq!(a.state(), IBV_QPS_ERR);
            let reset = ibv_qp_attr::default();
            assert_eq!(a.modify(&reset, IBV_QP_STATE), 0);
            assert_eq!(a.state(), IBV_QPS_RESET);
            assert_eq!(a.init(), 0, "a reset queue pair comes up again");
            a.teardown();
            b.teardown();
        },
    );
}

#[test]
fn only_uc_queue_pairs_within_apples_limits_are_created() {
    isolated(
        "only_uc_queue_pairs_within_apples_limits_are_created",
        &[],
        || {
            let ctx = open("rdma_en2");
            // SAFETY: an open context.
            let pd = unsafe { ibv_alloc_pd(ctx) };
            // SAFETY: an open context; no completion channel.
            let cq =
                unsafe { ibv_create_cq(ctx, 64, core::ptr::null_mut(), core::ptr::null_mut(), 0) };
            assert_eq!(
                create_qp_of_type(pd, cq, 32, 32, IBV_QPT_RC),
                Err(libc::EOPNOTSUPP)
            );
            assert_eq!(create_qp(pd, cq, 64, 32), Err(libc::EINVAL), "64 send WRs");
            assert_eq!(
                create_qp(pd, cq, 32, 64),
                Err(libc::EINVAL),
                "64 receive WRs"
            );
            let qps: Vec<_> = (0..10)
                .map(|_| create_qp(pd, cq, 63, 63).unwrap())
                .collect();
            assert_eq!(
                create_qp(pd, cq, 1, 1),
                Err(libc::ENOMEM),
                "the 11th queue pair"
            );
            // The limit is the device's: a second context on it shares it.
            let again = open("rdma_en2");
            // SAFETY: an open context.
            let pd2 = unsafe { ibv_alloc_pd(again) };
            // SAFETY: an open context; no completion channel.
            let cq2 =
                unsafe { ibv_create_cq(again, 8, core::ptr::null_mut(), core::ptr::null_mut(), 0) };
            assert_eq!(create_qp(pd2, cq2, 1, 1), Err(libc::ENOMEM));
            // SAFETY: a live queue pair, destroyed once.
            assert_eq!(unsafe { ibv_destroy_qp(qps[0]) }, 0);
            let freed = create_qp(pd2, cq2, 1, 1).expect("room again");
            // SAFETY: a live queue pair, destroyed once.
            assert_eq!(unsafe { ibv_destroy_qp(freed) }, 0);
            // SAFETY: the completion queue still has queue pairs.
            assert_eq!(unsafe { ibv_destroy_cq(cq) }, libc::EBUSY);
            // SAFETY: the protection domain still has queue pairs.
            assert_eq!(unsafe { ibv_dealloc_pd(pd) }, libc::EBUSY);
            for &qp in &qps[1..] {
                // SAFETY: live queue pairs, each destroyed once.
                assert_eq!(unsafe { ibv_destroy_qp(qp) }, 0);
            }
            // SAFETY: a destroyed queue pair is unknown to the provider.
            assert_eq!(unsafe { ibv_destroy_qp(qps[0]) }, libc::EINVAL);
            // SAFETY: live objects, destroyed once.
            assert_eq!(unsafe { ibv_destroy_cq(cq) }, 0);
            // SAFETY: as above.
            assert_eq!(unsafe { ibv_dealloc_pd(pd) }, 0);
            // SAFETY: as above.
            assert_eq!(unsafe { ibv_close_device(ctx) }, 0);
            // SAFETY: as above.
            assert_eq!(unsafe { ibv_close_device(again) }, 0);
        },
    );
}

#[test]
fn the_101st_memory_region_of_a_device_is_enomem_and_regions_are_checked() {
    isolated(
        "the_101st_memory_region_of_a_device_is_enomem_and_regions_are_checked",
        &[],
        || {
            let ctx = open("rdma_en4");
            // SAFETY: an open context.
            let pd = unsafe { ibv_alloc_pd(ctx) };
            let mut memory = vec![0u8; 101 * 4096];
            let base = memory.as_mut_ptr();
            let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
            let mut mrs = Vec::new();
            for i in 0..100 {
                // SAFETY: `memory` outlives the regions (deregistered below).
                let mr =
                    unsafe { ibv_reg_mr(pd, base.wrapping_add(i * 4096).cast(), 4096, access) };
                assert!(!mr.is_null(), "region {i}");
                mrs.push(mr);
            }
            // SAFETY: as above.
            let extra =
                unsafe { ibv_reg_mr(pd, base.wrapping_add(100 * 4096).cast(), 4096, access) };
            assert!(extra.is_null());
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::ENOMEM)
            );
            // SAFETY: the protection domain still has regions.
            assert_eq!(unsafe { ibv_dealloc_pd(pd) }, libc::EBUSY);
            for mr in mrs {
                // SAFETY: live regions, each deregistered once.
                assert_eq!(unsafe { ibv_dereg_mr(mr) }, 0);
            }
            // SAFETY: zero bytes are refused before anything is touched.
            let empty = unsafe { ibv_reg_mr(pd, base.cast(), 0, access) };
            assert!(empty.is_null());
            // SAFETY: remote write without local write is refused before anything is touched.
            let bad = unsafe { ibv_reg_mr(pd, base.cast(), 4096, IBV_ACCESS_REMOTE_WRITE) };
            assert!(bad.is_null());
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EINVAL)
            );
            // SAFETY: live objects, destroyed once.
            assert_eq!(unsafe { ibv_dealloc_pd(pd) }, 0);
            // SAFETY: as above.
            assert_eq!(unsafe { ibv_close_device(ctx) }, 0);
        },
    );
}

#[test]
fn every_close_appends_a_ledger_line_counting_what_was_left() {
    let path = std::env::temp_dir().join(format!("nuvec-verbs-emu-ledger-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let test = "a_clean_and_a_leaky_close";
    let output = run_bounded(child_command(
        test,
        &[("NUVEC_VERBS_EMU_LEDGER", path.to_str().unwrap())],
    ));
    assert!(output.status.success(), "{output:?}");
    let ledger = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let lines: Vec<&str> = ledger.lines().collect();
    assert_eq!(lines.len(), 2, "{ledger}");
    for line in &lines {
        let pid = line
            .strip_prefix("close pid=")
            .and_then(|rest| rest.split(' ').next());
        assert!(pid.is_some_and(|p| p.parse::<u32>().is_ok()), "{ledger}");
    }
    assert!(
        lines[0].ends_with(" device=rdma_en0 qps=0 cqs=0 mrs=0 pds=0"),
        "{ledger}"
    );
    assert!(
        lines[1].ends_with(" device=rdma_en1 qps=1 cqs=1 mrs=1 pds=1"),
        "{ledger}"
    );
}

#[test]
fn a_clean_and_a_leaky_close() {
    if is_child("a_clean_and_a_leaky_close") {
        Side::new("rdma_en0", 1).teardown();
        let leaky = Side::new("rdma_en1", 1);
        // SAFETY: an open context; its objects are freed with it.
        assert_eq!(unsafe { ibv_close_device(leaky.ctx) }, 0);
        drop(leaky);
    }
}

#[test]
fn the_built_library_resolves_every_symbol_the_fabric_loads_and_lists_devices() {
    isolated(
        "the_built_library_resolves_every_symbol_the_fabric_loads_and_lists_devices",
        &[],
        || {
            // `cargo test` builds the library beside the test binaries, in target/<profile>/deps
            // (`cargo build` also copies it one level up).
            let exe = std::env::current_exe().unwrap();
            let path = exe.parent().unwrap().join("libnuvec_verbs_emu.so");
            let path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
            // SAFETY: loading the provider runs no initialisers of its own.
            let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            assert!(!lib.is_null(), "{path:?} does not load");
            let mut resolved = Vec::new();
            for name in SYMBOLS {
                let symbol = std::ffi::CString::new(name).unwrap();
                // SAFETY: `lib` is a loaded library and `symbol` a NUL-terminated name.
                let address = unsafe { libc::dlsym(lib, symbol.as_ptr()) };
                assert!(!address.is_null(), "{name} is not exported");
                resolved.push(address);
            }
            // SAFETY: the first symbol is `ibv_get_device_list`, of exactly this type (the
            // library checks its exports against the ABI crate's function types).
            let list: GetDeviceList = unsafe { std::mem::transmute(resolved[0]) };
            let mut n = 0;
            // SAFETY: `n` is a writable int.
            let devices = unsafe { list(&mut n) };
            assert!(!devices.is_null());
            assert_eq!(n, 8);
        },
    );
}
