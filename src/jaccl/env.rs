//! JACCL's launch environment, read through the crate's [`Env`]: the job (`MLX_IBV_DEVICES`,
//! `MLX_RANK`, `MLX_JACCL_COORDINATOR`, `MLX_JACCL_RING` and their `JACCL_*` names, see
//! [`Config::from_vars`]), the fabric that carries its frames (`NUVEC_JACCL_FABRIC`) and its
//! frame rule (`NUVEC_JACCL_FRAMES`).

use super::config::Config;
use super::frames::FrameRule;
use crate::config::env::{Env, JACCL_FABRIC, JACCL_FRAMES, bad_value};
use crate::error::Error;

/// What carries a JACCL group's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JacclFabric {
    /// RDMA queue pairs, as MLX (feature `jaccl`).
    Rdma,
    /// TCP connections, one per cable ([`crate::jaccl::tcp`]): the same algorithms on any
    /// network, for testing; not wire-compatible with MLX.
    Tcp,
}

/// MLX's JACCL configuration ([`Config::from_vars`]), `None` when its variables are unset.
pub(crate) fn job(env: &Env<'_>) -> Result<Option<Config>, Error> {
    Config::from_vars(|name| env.raw(name))
}

/// Which fabric carries JACCL (`NUVEC_JACCL_FABRIC`: `rdma`, the default, or `tcp`) and
/// which frame rule its ranks use (`NUVEC_JACCL_FRAMES`: `small`, the default as on macOS
/// 26.2, or `large` as on macOS 26.3 and later).
pub(crate) fn transport(env: &Env<'_>) -> Result<(JacclFabric, FrameRule), Error> {
    let fabric = match env.text(JACCL_FABRIC)?.as_deref() {
        None | Some("rdma") => JacclFabric::Rdma,
        Some("tcp") => JacclFabric::Tcp,
        Some(other) => {
            return Err(
                bad_value(JACCL_FABRIC, other, "is not a fabric; expected rdma or tcp").into(),
            );
        }
    };
    let rule = match env.text(JACCL_FRAMES)?.as_deref() {
        None | Some("small") => FrameRule::Small,
        Some("large") => FrameRule::Large,
        Some(other) => {
            return Err(bad_value(
                JACCL_FRAMES,
                other,
                "is not a frame rule; expected small (macOS 26.2) or large (macOS 26.3 and later)",
            )
            .into());
        }
    };
    Ok((fabric, rule))
}
