//! What one RDMA device allows, read from the device at bring-up.
//!
//! MLX hard-codes nothing and queries nothing: its bring-up fails at the first refused
//! `ibv_create_qp` or `ibv_reg_mr`. Apple's provider is reported to allow 10 queue pairs,
//! about 100 memory regions and 63 work requests per queue, but devices differ: users report
//! `max_qp` = 11 on M3 Ultra and M5 Max, and 3 on a Mac behind a 6-port hub
//! (ml-explore/mlx#3205). So each device this rank will open is asked (`ibv_query_device`:
//! `max_qp`, `max_mr`, `max_qp_wr`) before any queue pair exists, and a configuration is
//! budgeted against what it says (`jaccl::budget`). When the library has no
//! `ibv_query_device`, the device cannot be opened or the query fails, Apple's reported
//! limits are the fallback (a device that is missing is then reported by the bring-up itself,
//! naming the peer it was needed for).

use std::fmt;

use nuvec_verbs_abi::{
    self as abi, APPLE_MAX_MR_PER_DEVICE, APPLE_MAX_QP_PER_DEVICE, APPLE_MAX_WR_PER_QUEUE,
};

use super::verbs::{DeviceList, Verbs, verbs};

/// What one RDMA device allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Queue pairs on the device at most (`max_qp`).
    pub queue_pairs: usize,
    /// Memory regions on the device at most (`max_mr`).
    pub regions: usize,
    /// Work requests per queue of a queue pair at most (`max_qp_wr`).
    pub work_requests: u32,
    /// Where the numbers come from.
    pub source: LimitSource,
}

/// Where a device's limits come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitSource {
    /// The device said so (`ibv_query_device`).
    Queried,
    /// Apple's reported limits, because the device could not be asked: why.
    Apple(String),
}

impl DeviceLimits {
    /// Apple's reported limits for a Thunderbolt device (`nuvec_verbs_abi::APPLE_MAX_*`),
    /// taken because the device could not be asked (`why`).
    pub fn apple(why: impl Into<String>) -> DeviceLimits {
        DeviceLimits {
            queue_pairs: APPLE_MAX_QP_PER_DEVICE,
            regions: APPLE_MAX_MR_PER_DEVICE,
            work_requests: APPLE_MAX_WR_PER_QUEUE,
            source: LimitSource::Apple(why.into()),
        }
    }

    /// The limits a device reported: non-positive numbers count as 0 (nothing fits).
    pub(crate) fn queried(attr: &abi::ibv_device_attr) -> DeviceLimits {
        let count = |n: i32| usize::try_from(n).unwrap_or(0);
        DeviceLimits {
            queue_pairs: count(attr.max_qp),
            regions: count(attr.max_mr),
            work_requests: u32::try_from(attr.max_qp_wr).unwrap_or(0),
            source: LimitSource::Queried,
        }
    }
}

impl fmt::Display for LimitSource {
    /// Who allows the numbers, after "the N": "a Thunderbolt device allows", "it reports".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitSource::Queried => write!(f, "it reports (ibv_query_device)"),
            LimitSource::Apple(_) => write!(f, "a Thunderbolt device allows"),
        }
    }
}

/// The limits of the device named exactly `name`: asked of the device, or Apple's when it
/// cannot be (see the module docs).
pub(crate) fn of_device(name: &str) -> DeviceLimits {
    match verbs() {
        Ok(verbs) => query(verbs, name).unwrap_or_else(DeviceLimits::apple),
        Err(e) => DeviceLimits::apple(e.to_string()),
    }
}

/// Asks device `name` for its limits: opens it, queries it, closes it.
fn query(verbs: &'static Verbs, name: &str) -> Result<DeviceLimits, String> {
    let query_device = verbs
        .query_device
        .ok_or_else(|| format!("{} has no ibv_query_device", verbs.library))?;
    let list = DeviceList::get(verbs).map_err(|e| format!("ibv_get_device_list failed: {e}"))?;
    let device = (0..list.len())
        .filter_map(|i| list.device(i))
        .find(|(_, found)| found == name)
        .map(|(device, _)| device)
        .ok_or_else(|| format!("no RDMA device named {name}"))?;
    // SAFETY: `device` is a device of the live list.
    let ctx = unsafe { (verbs.open_device)(device) };
    if ctx.is_null() {
        return Err(format!(
            "ibv_open_device failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut attr = abi::ibv_device_attr::default();
    // SAFETY: `ctx` is an open device context and `attr` a whole `ibv_device_attr`.
    let rc = unsafe { query_device(ctx, &mut attr) };
    // SAFETY: `ctx` was opened above, nothing was created on it, and it is closed only here.
    unsafe { (verbs.close_device)(ctx) };
    if rc != 0 {
        return Err(format!(
            "ibv_query_device failed: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok(DeviceLimits::queried(&attr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_reports_its_own_limits_and_nonsense_counts_as_nothing() {
        let attr = abi::ibv_device_attr {
            max_qp: 11,
            max_mr: 100,
            max_qp_wr: 63,
            ..Default::default()
        };
        assert_eq!(
            DeviceLimits::queried(&attr),
            DeviceLimits {
                queue_pairs: 11,
                regions: 100,
                work_requests: 63,
                source: LimitSource::Queried
            }
        );
        let negative = abi::ibv_device_attr {
            max_qp: -1,
            ..Default::default()
        };
        assert_eq!(DeviceLimits::queried(&negative).queue_pairs, 0);
        assert_eq!(DeviceLimits::apple("x").queue_pairs, 10);
    }
}
