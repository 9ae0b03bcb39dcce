//! Devices, their one port and their GID tables.
//!
//! Each device name of the configuration is one device, listed in order. A device has one
//! port (port 1), active, LID 0 (Thunderbolt has no subnet manager, so routes are global), a
//! partition key table of one entry and a GID table of two: index 0 a link-local `fe80::` GID,
//! index 1 an IPv4-mapped GID, or nothing with `NUVEC_VERBS_EMU_NO_IPV4=1` (the entry reads as
//! the zero GID, as rdma-core reports unpopulated entries, and an address vector naming it as
//! its source GID is refused).
//!
//! Over Unix sockets (the default wire) a GID is only a label: both GIDs of a (process,
//! device) carry the 24-bit id of that pair's endpoint (see [`crate::transport`]) in their last
//! three bytes (the mapped one reads `::ffff:127.x.y.z`), so a peer reaches the same endpoint
//! whichever of the two it was given. Over TCP the mapped GID is the IPv4 address the endpoint
//! listens on and the link-local one carries the same address; the port is in the queue pair
//! numbers.

use crate::config::{self, WireChoice};
use crate::qp_state::PortView;
use crate::transport::{Endpoint, Place, tcp_id};
use core::ffi::c_int;
use nuvec_verbs_abi::*;
use std::ffi::CString;
use std::net::Ipv4Addr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};

/// The length of every device's GID table.
pub(crate) const GID_TBL_LEN: u8 = 2;

/// The length of every device's partition key table.
pub(crate) const PKEY_TBL_LEN: u16 = 1;

/// The largest MTU of every port.
pub(crate) const PORT_MTU: ibv_mtu = IBV_MTU_4096;

/// The largest message a send may carry (2 GiB, rdma-core's usual `max_msg_sz`).
pub(crate) const MAX_MSG_SZ: u32 = 1 << 31;

/// The middle bytes of the link-local GID's interface id: a locally administered EUI-64
/// (`02:4e:56`, "NV") with the `ff:fe` filler, followed by the endpoint's 24-bit id.
const LINK_LOCAL_TAG: [u8; 5] = [0x02, 0x4e, 0x56, 0xff, 0xfe];

/// The first bytes of a TCP endpoint's link-local interface id ("NV"), followed by its IPv4
/// address and two zero bytes.
const TCP_LINK_LOCAL_TAG: [u8; 2] = [0x4e, 0x56];

/// A device of the listing.
#[derive(Debug)]
pub(crate) struct Device {
    /// Its position in the listing.
    pub(crate) index: usize,
    /// Its name.
    pub(crate) name: CString,
    /// The process's endpoint on this device, bound when it is first opened and kept for the
    /// life of the process.
    endpoint: Mutex<Option<Arc<Endpoint>>>,
    /// How many queue pairs the process has created on this device (the message log's `qp=`).
    pub(crate) qps_created: AtomicUsize,
}

impl Device {
    /// The process's endpoint on this device, bound on first use.
    pub(crate) fn endpoint(&self) -> Result<Arc<Endpoint>, c_int> {
        let mut slot = self.endpoint.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(endpoint) = slot.as_ref() {
            return Ok(Arc::clone(endpoint));
        }
        let endpoint = Endpoint::bind().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        *slot = Some(Arc::clone(&endpoint));
        Ok(endpoint)
    }
}

/// The process's devices, or `EINVAL` when the configuration is bad (the message has been
/// printed).
pub(crate) fn devices() -> Result<&'static [Device], c_int> {
    static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
    let config = config::get().as_ref().map_err(|_| libc::EINVAL)?;
    Ok(DEVICES.get_or_init(|| {
        config
            .devices
            .iter()
            .enumerate()
            .map(|(index, name)| Device {
                index,
                // The configuration refuses names with NUL bytes (only printable ASCII).
                name: CString::new(name.as_bytes()).unwrap_or_default(),
                endpoint: Mutex::new(None),
                qps_created: AtomicUsize::new(0),
            })
            .collect()
    }))
}

/// The device a listing pointer points at.
pub(crate) fn device_at(ptr: *mut ibv_device) -> Option<&'static Device> {
    devices()
        .ok()?
        .iter()
        .find(|d| core::ptr::eq(*d as *const Device as *const ibv_device, ptr))
}

/// The listing pointer of a device.
pub(crate) fn device_ptr(device: &'static Device) -> *mut ibv_device {
    device as *const Device as *mut ibv_device
}

/// Whether GID index 1 is left empty.
fn no_ipv4() -> bool {
    config::get().as_ref().is_ok_and(|c| c.no_ipv4)
}

/// The GID table of a Unix endpoint with 24-bit id `id`.
pub(crate) fn gid_table(id: u32, no_ipv4: bool) -> [ibv_gid; GID_TBL_LEN as usize] {
    let [_, x, y, z] = id.to_be_bytes();
    let mut link_local = [0u8; 16];
    link_local[..2].copy_from_slice(&[0xfe, 0x80]);
    link_local[8..13].copy_from_slice(&LINK_LOCAL_TAG);
    link_local[13..].copy_from_slice(&[x, y, z]);
    let mut mapped = [0u8; 16];
    if !no_ipv4 {
        mapped[10..].copy_from_slice(&[0xff, 0xff, 127, x, y, z]);
    }
    [ibv_gid { raw: link_local }, ibv_gid { raw: mapped }]
}

/// The GID table of a TCP endpoint on `address`: the link-local GID's interface id is
/// `4e:56` ("NV") and the address, and the IPv4-mapped GID is the address itself.
pub(crate) fn tcp_gid_table(address: Ipv4Addr, no_ipv4: bool) -> [ibv_gid; GID_TBL_LEN as usize] {
    let mut link_local = [0u8; 16];
    link_local[..2].copy_from_slice(&[0xfe, 0x80]);
    link_local[8..10].copy_from_slice(&TCP_LINK_LOCAL_TAG);
    link_local[10..14].copy_from_slice(&address.octets());
    let mut mapped = [0u8; 16];
    if !no_ipv4 {
        mapped[10..12].copy_from_slice(&[0xff, 0xff]);
        mapped[12..].copy_from_slice(&address.octets());
    }
    [ibv_gid { raw: link_local }, ibv_gid { raw: mapped }]
}

/// The process's GID table for an endpoint.
pub(crate) fn gids_of(endpoint: &Endpoint) -> [ibv_gid; GID_TBL_LEN as usize] {
    match endpoint.place {
        Place::Unix => gid_table(endpoint.id as u32, no_ipv4()),
        Place::Tcp { address, .. } => tcp_gid_table(address, no_ipv4()),
    }
}

/// The port as the state machine checks modifications against it.
pub(crate) fn port_view() -> PortView {
    PortView {
        active_mtu: PORT_MTU,
        pkey_tbl_len: PKEY_TBL_LEN,
        gid_tbl_len: GID_TBL_LEN,
        gid_populated: if no_ipv4() { 0b01 } else { 0b11 },
    }
}

/// The endpoint a destination GID and queue pair number name, if they are this provider's,
/// on the configured wire.
pub(crate) fn endpoint_of(gid: &ibv_gid, qpn: u32) -> Option<u64> {
    match config::get().as_ref().map(|c| c.wire) {
        Ok(WireChoice::Tcp(_)) => tcp_endpoint_of(gid, qpn),
        _ => unix_endpoint_of(gid),
    }
}

/// The Unix endpoint id a destination GID names, if it is one of this provider's GIDs.
pub(crate) fn unix_endpoint_of(gid: &ibv_gid) -> Option<u64> {
    // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
    let raw = unsafe { gid.raw };
    let id = u32::from_be_bytes([0, raw[13], raw[14], raw[15]]);
    let mapped = raw[..10].iter().all(|&b| b == 0) && raw[10..13] == [0xff, 0xff, 127];
    let link_local = raw[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0] && raw[8..13] == LINK_LOCAL_TAG;
    (mapped || link_local).then_some(u64::from(id))
}

/// The TCP endpoint a destination GID (its address) and QPN (its port, in the high 16 bits)
/// name.
pub(crate) fn tcp_endpoint_of(gid: &ibv_gid, qpn: u32) -> Option<u64> {
    // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
    let raw = unsafe { gid.raw };
    let octets = |at: usize| [raw[at], raw[at + 1], raw[at + 2], raw[at + 3]];
    let mapped = raw[..10].iter().all(|&b| b == 0) && raw[10..12] == [0xff, 0xff];
    let link_local = raw[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0]
        && raw[8..10] == TCP_LINK_LOCAL_TAG
        && raw[14..] == [0, 0];
    let address = if mapped {
        Ipv4Addr::from(octets(12))
    } else if link_local {
        Ipv4Addr::from(octets(10))
    } else {
        return None;
    };
    let port = u16::try_from(qpn >> 8).ok().filter(|p| *p != 0)?;
    (!address.is_unspecified()).then(|| tcp_id(address, port))
}

/// The port's attributes (the whole struct; `ibv_query_port` copies its compatibility part).
pub(crate) fn port_attr() -> ibv_port_attr {
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: PORT_MTU,
        active_mtu: PORT_MTU,
        gid_tbl_len: c_int::from(GID_TBL_LEN),
        port_cap_flags: 0,
        max_msg_sz: MAX_MSG_SZ,
        pkey_tbl_len: PKEY_TBL_LEN,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        active_width: 1,
        active_speed: 1,
        phys_state: 5,
        // IBV_LINK_LAYER_ETHERNET: routes are global, as with RoCE.
        link_layer: 2,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_gids_name_the_same_endpoint() {
        let [link_local, mapped] = gid_table(0xabcdef, false);
        assert_eq!(unix_endpoint_of(&link_local), Some(0xabcdef));
        assert_eq!(unix_endpoint_of(&mapped), Some(0xabcdef));
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        let raw = unsafe { mapped.raw };
        assert_eq!(raw[10..], [0xff, 0xff, 127, 0xab, 0xcd, 0xef]);
    }

    #[test]
    fn without_ipv4_index_one_is_empty_and_names_nothing() {
        let [link_local, empty] = gid_table(0x123456, true);
        assert_eq!(unix_endpoint_of(&link_local), Some(0x123456));
        assert_eq!(unix_endpoint_of(&empty), None);
    }

    #[test]
    fn foreign_gids_name_nothing() {
        let mut raw = [0u8; 16];
        raw[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 1]);
        assert_eq!(unix_endpoint_of(&ibv_gid { raw }), None);
    }

    #[test]
    fn a_tcp_endpoint_is_named_by_its_address_gid_and_the_port_in_its_queue_pair_number() {
        let address = Ipv4Addr::new(198, 18, 0, 3);
        let [link_local, mapped] = tcp_gid_table(address, false);
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        let raw = unsafe { mapped.raw };
        assert_eq!(raw[10..], [0xff, 0xff, 198, 18, 0, 3]);
        let qpn = (40_000 << 8) | 7;
        let id = tcp_id(address, 40_000);
        assert_eq!(tcp_endpoint_of(&mapped, qpn), Some(id));
        assert_eq!(tcp_endpoint_of(&link_local, qpn), Some(id));
        assert_eq!(tcp_endpoint_of(&mapped, 7), None, "port 0");
        let [_, empty] = tcp_gid_table(address, true);
        assert_eq!(tcp_endpoint_of(&empty, qpn), None);
    }
}
