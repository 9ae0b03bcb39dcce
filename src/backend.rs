//! Backend selection and the group cache, as MLX's `distributed::init` and `get_backends`.
//!
//! `init_backend(strict, backend)` returns the group a backend initialised before, if any
//! (`Any`: the first one initialised), else reads that backend's launch environment, connects,
//! caches the group under its backend and makes it the default group of
//! `nuvec_core::distributed`. Without the environment it fails if `strict`, else returns the
//! group of this process alone.

use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use nuvec_core::distributed::{self, Group};

use crate::collective::split::Splitter;
use crate::config::ConfigError;
use crate::config::env::Env;
use crate::config::hostfile;
use crate::config::log::Log;
use crate::config::options::{Options, Wire, WireChoice};
use crate::error::Error;
use crate::fabric::{Fabric, Liveness, Watch};
use crate::jaccl::split::TcpCables;
use crate::jaccl::{self, FrameRule, JacclCommunicator, JacclFabric, SideChannel};
use crate::ring::RingTopology;
use crate::ring::agree;
use crate::ring::communicator::RingCommunicator;
use crate::ring::schedule::Side;
use crate::ring::split::TcpRing;
use crate::transport::tcp::TcpFabric;

/// A distributed backend, by MLX's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// The first backend whose launch environment is set: the ring, then JACCL.
    Any,
    /// MLX's TCP ring (`MLX_HOSTFILE`, `MLX_RANK`).
    Ring,
    /// MLX's JACCL, RDMA over Thunderbolt 5 (feature `jaccl`).
    Jaccl,
}

impl Backend {
    /// MLX's name of the backend.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Any => "any",
            Backend::Ring => "ring",
            Backend::Jaccl => "jaccl",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = Error;

    /// MLX's backend names: `any`, `ring`, `jaccl`; `mpi` and `nccl` are MLX backends this
    /// crate does not provide.
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "any" => Ok(Backend::Any),
            "ring" => Ok(Backend::Ring),
            "jaccl" => Ok(Backend::Jaccl),
            "mpi" | "nccl" => Err(ConfigError::BackendNotProvided { name: s.to_owned() }.into()),
            other => Err(ConfigError::UnknownBackend {
                name: other.to_owned(),
            }
            .into()),
        }
    }
}

/// A connected ring group: the `nuvec_core` group, and this crate's handle on its transport.
#[derive(Clone, Debug)]
pub struct RingGroup {
    group: Group,
    comm: Option<Arc<RingCommunicator<TcpFabric>>>,
}

impl RingGroup {
    /// The group of this process alone.
    fn single() -> Self {
        Self {
            group: Group::single(),
            comm: None,
        }
    }

    /// The `nuvec_core` group, for `nuvec_core::distributed`'s collectives.
    pub fn group(&self) -> Group {
        self.group.clone()
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.group.size()
    }

    /// The first failure of the group, if it has failed.
    pub fn failure(&self) -> Option<Error> {
        self.comm.as_ref().and_then(|c| c.failure())
    }

    /// Which peers are unreachable, checked without running a collective: `(peer, what)`.
    pub fn health(&self) -> Vec<(usize, String)> {
        self.comm.as_ref().map(|c| c.health()).unwrap_or_default()
    }

    /// Closes the group: its connections are released, and every later operation fails with
    /// "the group is closed". A new group can then be formed in the same processes.
    pub fn close(&self) {
        if let Some(comm) = &self.comm {
            drop(comm.close());
        }
    }

    /// The transport, for direct use of the ring's operations on raw bytes.
    pub fn communicator(&self) -> Option<&RingCommunicator<TcpFabric>> {
        self.comm.as_deref()
    }
}

/// Groups initialised so far, by backend, in order (MLX's `get_backends`), each with the wire
/// its job agreed on.
static GROUPS: Mutex<Vec<(Backend, Group, Wire)>> = Mutex::new(Vec::new());

/// The wire the job of the default group (the group [`init`](crate::init) connected last)
/// speaks: `Some(Wire::Nuvec)` or `Some(Wire::Mlx)` for a ring, as its ranks agreed during
/// setup (what `NUVEC_DISTRIBUTED_WIRE` asked for is only a request: `auto` may end as
/// either), always `Some(Wire::Mlx)` for JACCL (which has no other); `None` before `init` has
/// connected a job of two or more ranks.
///
/// A `nuvec_core` group cannot be asked (its communicator is not reachable through it), so
/// the answer is kept when `init` connects. Sub-groups made by `Group::split` speak their
/// parent's wire. A group made by [`connect_ring`] says its own:
/// `ring.communicator().map(|c| c.wire())`.
pub fn wire() -> Option<Wire> {
    GROUPS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .last()
        .map(|(_, _, wire)| *wire)
}

/// Whether `backend` can be used in this build on this machine: the ring always; JACCL when
/// built in (feature `jaccl`), the verbs library loads with every function it needs, and it
/// lists a device (`jaccl::rdma::unavailable` says which
/// is missing).
pub fn is_available(backend: Backend) -> bool {
    match backend {
        Backend::Any | Backend::Ring => true,
        #[cfg(feature = "jaccl")]
        Backend::Jaccl => crate::jaccl::rdma::available(),
        #[cfg(not(feature = "jaccl"))]
        Backend::Jaccl => false,
    }
}

/// Connects this process's rank of the JACCL job `config` over `fabric`, every rank with the
/// frame rule `rule`, and returns its group, not made the default.
pub fn connect_jaccl(
    config: &jaccl::Config,
    fabric: JacclFabric,
    rule: FrameRule,
    options: &Options,
) -> Result<Group, Error> {
    config.validate()?;
    let topology = config.topology()?;
    let (rank, size) = (config.rank(), config.size());
    let coordinator = config.coordinator_address().ok_or_else(|| {
        ConfigError::NoCoordinator {
            vars: jaccl::config::COORDINATOR_VARS.map(String::from).to_vec(),
        }
        .jaccl()
    })?;
    let log = Log::new(options.log, rank).with_slow_after(options.warn_after);
    // As MLX's `is_available`, before any connection: a machine without the verbs library,
    // one of its functions or a device fails at once, saying which, instead of after the
    // side channel has waited for the other ranks.
    #[cfg(feature = "jaccl")]
    if fabric == JacclFabric::Rdma
        && let Some(why) = jaccl::rdma::unavailable()
    {
        return Err(ConfigError::Rdma {
            problem: format!(
                "rank {rank}: the RDMA fabric cannot run on this machine: {why} (or set \
                 NUVEC_JACCL_FABRIC=tcp to run JACCL's algorithms over TCP)"
            ),
        }
        .jaccl()
        .into());
    }
    // Bring-up has a deadline of its own, even without an operation timeout.
    let setup = options.setup_timeout();
    let mut side = SideChannel::connect(coordinator, rank, size, setup)?;
    // After bring-up the side channel watches the peers while operations wait (see
    // `jaccl::side_channel::protocol::liveness`).
    let watch = |side: SideChannel| -> Result<Watch, Error> {
        let watcher: Box<dyn Liveness> = Box::new(side.into_watcher(options.link_timeout)?);
        Ok(Watch::new(Some(watcher), options.progress))
    };
    match fabric {
        JacclFabric::Tcp => {
            let (tcp, topology) = jaccl::tcp::connect(config, &mut side, setup)?;
            let ip = side
                .local_ip()
                .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
            let tcp = tcp
                .with_wait(options.spin)
                .with_watch(watch(side)?)
                .with_link_timeout(options.link_timeout)
                .map_err(|e| Error::Connect {
                    rank,
                    what: format!("jaccl: cannot set the cables' link timeout: {e}"),
                })?;
            let splitter = Arc::new(
                TcpCables::new(topology, size, ip, log, options.spin)
                    .with_links(options.link_timeout, options.progress),
            );
            Ok(jaccl_group(
                tcp,
                topology,
                rule,
                options.timeout,
                log,
                splitter,
            ))
        }
        #[cfg(feature = "jaccl")]
        JacclFabric::Rdma => {
            let mut rdma = jaccl::rdma::connect(config, &mut side, setup)?;
            rdma.set_watch(watch(side)?);
            rdma.set_wait(options.spin);
            rdma.set_log(log);
            // Sub-groups get new queue pairs on the same devices: this rank's devices toward
            // every job rank (a ring's toward its neighbours only).
            let devices: Vec<Vec<String>> = config.devices().get(rank).cloned().unwrap_or_default();
            let splitter = Arc::new(
                jaccl::split_rdma::RdmaCables::new(topology, devices, log)
                    .with_waits(options.spin, options.progress),
            );
            Ok(jaccl_group(
                rdma,
                topology,
                rule,
                options.timeout,
                log,
                splitter,
            ))
        }
        #[cfg(not(feature = "jaccl"))]
        JacclFabric::Rdma => {
            let _ = topology;
            Err(ConfigError::Rdma {
                problem: "this build has no RDMA fabric (build with the cargo feature jaccl), or \
                          set NUVEC_JACCL_FABRIC=tcp to run JACCL's algorithms over TCP"
                    .into(),
            }
            .jaccl()
            .into())
        }
    }
}

fn jaccl_group<F: Fabric + Send + 'static>(
    fabric: F,
    topology: jaccl::Topology,
    rule: FrameRule,
    timeout: std::time::Duration,
    log: Log,
    splitter: Arc<dyn Splitter<F>>,
) -> Group {
    let comm = match topology {
        jaccl::Topology::Mesh { .. } => JacclCommunicator::mesh(fabric, rule, timeout),
        jaccl::Topology::Ring { wires } => JacclCommunicator::ring(fabric, wires, rule, timeout),
    };
    Group::new(Arc::new(comm.with_log(log).with_splitter(splitter)))
}

/// Connects rank `rank` of MLX's ring over `nodes` (per rank its `host:port` addresses, all
/// ranks with the same count) and returns its group, without making it the default. One node
/// is the group of this process alone.
pub fn connect_ring(
    nodes: &[Vec<String>],
    rank: usize,
    options: &Options,
) -> Result<RingGroup, Error> {
    let size = nodes.len();
    if size <= 1 {
        return Ok(RingGroup::single());
    }
    if rank >= size {
        return Err(ConfigError::RankOutsideRing { rank, size }.into());
    }
    let conns = nodes[0].len();
    if conns == 0 {
        return Err(ConfigError::NoAddress { rank: 0 }.into());
    }
    if let Some((r, entry)) = nodes.iter().enumerate().find(|(_, e)| e.len() != conns) {
        return Err(ConfigError::UnevenRing {
            rank: r,
            count: entry.len(),
            first: conns,
        }
        .into());
    }
    let log = Log::new(options.log, rank).with_slow_after(options.warn_after);
    let started = std::time::Instant::now();
    let mut fabric = TcpFabric::connect_ring(
        nodes,
        rank,
        options.setup_timeout(),
        options.key.as_ref(),
        options.local_links,
        options.wire,
        &log,
    )?
    .with_wait(options.spin)
    .with_link_timeout(options.link_timeout)
    .map_err(|e| Error::Connect {
        rank,
        what: format!("cannot set the ring's link timeout: {e}"),
    })?
    .with_congestion(options.congestion.as_deref(), &log)?;
    let wire = agree_on_wire(&mut fabric, nodes, rank, options, &log)?;
    log.info(format_args!("setup took {:?}", started.elapsed()));
    let splitter = TcpRing::new(
        nodes[rank][0].clone(),
        conns,
        options.key.clone(),
        log,
        options.spin,
        options.local_links,
    )
    .with_links(options.link_timeout, options.congestion.clone());
    let comm = Arc::new(
        RingCommunicator::new(fabric, conns, options.timeout)
            .with_wire(wire)
            .with_log(log)
            .with_splitter(Arc::new(splitter)),
    );
    Ok(RingGroup {
        group: Group::new(comm.clone()),
        comm: Some(comm),
    })
}

/// Runs the agreement on a wire (`ring::agree`) over the connections `fabric` was set up
/// with, and checks it against what this rank was asked for: a rank asked for the nuvec wire
/// in a job that cannot have it fails, naming a connection that cannot speak it.
fn agree_on_wire(
    fabric: &mut TcpFabric,
    nodes: &[Vec<String>],
    rank: usize,
    options: &Options,
    log: &Log,
) -> Result<Wire, Error> {
    let (size, conns) = (nodes.len(), nodes[0].len());
    let ring = RingTopology::new(rank, size, conns);
    let right: Vec<_> = (0..conns)
        .map(|c| fabric.not_native(ring.channel(Side::Right, c)))
        .collect();
    let left: Vec<_> = (0..conns)
        .map(|c| fabric.not_native(ring.channel(Side::Left, c)))
        .collect();
    let known = |side: Side, c: usize| match side {
        Side::Right => right.get(c).copied().flatten(),
        Side::Left => left.get(c).copied().flatten(),
    };
    let started = std::time::Instant::now();
    let agreed = agree::agree(fabric, ring, options.wire, &known, options.setup_timeout())?;
    let took = started.elapsed();
    let unfit = agreed.unfit.map(|u| {
        let acceptor = u.acceptor(size);
        let address = nodes
            .get(acceptor)
            .and_then(|a| a.get(u.link))
            .map_or("?", String::as_str);
        u.why.describe(u.opener, acceptor, u.link, address)
    });
    if options.wire == WireChoice::Nuvec && agreed.wire != Wire::Nuvec {
        return Err(Error::Connect {
            rank,
            what: format!(
                "the nuvec wire was asked for (NUVEC_DISTRIBUTED_WIRE=nuvec) but the job cannot \
                 speak it: {}",
                unfit.unwrap_or_else(|| "no connection is native".into())
            ),
        });
    }
    match (agreed.wire, unfit) {
        (Wire::Mlx, Some(why)) if options.wire != WireChoice::Mlx => {
            log.info(format_args!(
                "the job speaks MLX's wire (agreed in {took:?}): {why}"
            ));
        }
        (wire, _) => log.info(format_args!("the job speaks {wire} (agreed in {took:?})")),
    }
    Ok(agreed.wire)
}

fn cached(backend: Backend) -> Option<Group> {
    let groups = GROUPS.lock().unwrap_or_else(PoisonError::into_inner);
    match backend {
        Backend::Any => groups.first().map(|(_, g, _)| g.clone()),
        b => groups
            .iter()
            .find(|(k, _, _)| *k == b)
            .map(|(_, g, _)| g.clone()),
    }
}

/// The options every backend reads from the environment: the timeout, the link timeout, the
/// warning interval, the log level, the spin before parking, JACCL's progress timeout, whether
/// links may be local and which wire the ring may speak (JACCL speaks MLX's and ignores it).
fn options_from(env: &Env<'_>) -> Result<Options, Error> {
    let mut options = Options::default();
    if let Some(timeout) = env.timeout()? {
        options = options.timeout(timeout);
    }
    if let Some(limit) = env.link_timeout()? {
        options = options.link_timeout(limit);
    }
    if let Some(after) = env.warn_after()? {
        options.warn_after = after;
    }
    options.log = env.log_level()?;
    if let Some(spin) = env.spin()? {
        options = options.spin(spin);
    }
    options.progress = env.jaccl_progress_timeout()?;
    if let Some(on) = env.local_links()? {
        options.local_links = on;
    }
    if let Some(wire) = env.wire()? {
        options.wire = wire;
    }
    if let Some(name) = env.tcp_congestion()? {
        options.congestion = Some(name);
    }
    // The flight recorder reads its variables itself, once per process (it serves every group
    // of it); checked here so that a wrong value fails `init` rather than being ignored. With
    // the recorder off (`NUVEC_DISTRIBUTED_RECORD=0`) `record_dir` neither checks nor makes the
    // directory.
    env.record()?;
    env.record_dir()?;
    Ok(options)
}

/// [`init_backend`](crate::init_backend) with this crate's error and an explicit environment.
pub(crate) fn init_from(env: &Env<'_>, strict: bool, backend: Backend) -> Result<Group, Error> {
    if let Some(group) = cached(backend) {
        return Ok(group);
    }
    let mut missing = Vec::new();
    // A JACCL launch sets MLX_RANK without MLX_HOSTFILE: `any` goes on to JACCL.
    let ring_skipped = backend == Backend::Any && env.jaccl_launch() && !env.ring_launch();
    if matches!(backend, Backend::Any | Backend::Ring) && !ring_skipped {
        match env.ring()? {
            Some(ring) => {
                let nodes = hostfile::read(&ring.hostfile)?;
                crate::config::env::check_rank(ring.rank, nodes.len(), &ring.hostfile)?;
                let mut options = options_from(env)?;
                if let Some(secret) = env.key()? {
                    // The variable's own rule is the key's: name it, as the option has no name.
                    options = options.key(secret).map_err(|e| match e {
                        ConfigError::KeyTooShort { bytes, min, .. } => ConfigError::KeyTooShort {
                            var: Some(crate::config::env::KEY.into()),
                            bytes,
                            min,
                        },
                        other => other,
                    })?;
                }
                if ring.verbose {
                    options = options.verbose(true);
                }
                let connected = connect_ring(&nodes, ring.rank, &options)?;
                let group = connected.group();
                // A one-rank hostfile connects nothing: there is no group worth keeping.
                if let Some(comm) = connected.communicator() {
                    remember(Backend::Ring, &group, comm.wire());
                }
                return Ok(group);
            }
            None => missing.push("MLX_HOSTFILE and MLX_RANK (ring)"),
        }
    }
    if matches!(backend, Backend::Any | Backend::Jaccl) {
        // The key authenticates the ring's connections; JACCL's (its side channel, its TCP
        // cables, its queue pairs) have no handshake to carry it. A job that set one expects
        // authentication: refused rather than run without it.
        if env.jaccl_launch() && env.raw(crate::config::env::KEY).is_some() {
            return Err(crate::config::env::bad_value(
                crate::config::env::KEY,
                "(set; not shown)",
                "authenticates the ring's connections only: JACCL's side channel and cables \
                 are not authenticated, so a JACCL job with a key would run without it; unset \
                 it for JACCL (and keep the job's network private)",
            )
            .into());
        }
        match jaccl::env::job(env)? {
            Some(config) => {
                let options = options_from(env)?;
                let (fabric, rule) = jaccl::env::transport(env)?;
                let group = connect_jaccl(&config, fabric, rule, &options)?;
                if group.size() > 1 {
                    // JACCL speaks MLX's wire only.
                    remember(Backend::Jaccl, &group, Wire::Mlx);
                }
                return Ok(group);
            }
            None => missing.push(
                "MLX_IBV_DEVICES, MLX_RANK and MLX_JACCL_COORDINATOR (jaccl, or their JACCL_* names)",
            ),
        }
    }
    if strict {
        return Err(ConfigError::NoBackend {
            backend: backend.name().to_owned(),
            missing: missing.into_iter().map(String::from).collect(),
        }
        .into());
    }
    Ok(Group::single())
}

/// Caches `group` under `backend`, with the wire its job speaks, and makes it the default
/// group.
fn remember(backend: Backend, group: &Group, wire: Wire) {
    GROUPS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((backend, group.clone(), wire));
    distributed::set_default_group(group.clone());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn none(_: &str) -> Option<OsString> {
        None
    }

    #[test]
    fn without_the_environment_strict_init_names_the_missing_variables() {
        let env = Env::from_fn(&none);
        let err = init_from(&env, true, Backend::Ring).expect_err("strict");
        let text = err.to_string();
        assert!(
            text.contains("MLX_HOSTFILE") && text.contains("MLX_RANK"),
            "{text}"
        );
        let err = init_from(&env, true, Backend::Jaccl).expect_err("strict");
        assert!(err.to_string().contains("jaccl"), "{err}");
    }

    #[test]
    fn strict_init_of_any_backend_without_a_launch_environment_says_how_to_start_a_job() {
        let env = Env::from_fn(&none);
        let text = init_from(&env, true, Backend::Any)
            .expect_err("strict")
            .to_string();
        assert!(!text.contains("no any backend"), "{text}");
        assert!(
            text.contains("distributed: no backend could be initialised"),
            "{text}"
        );
        assert!(
            text.contains("nuvec-launch -n 4 -- ./prog") && text.contains("mlx.launch"),
            "{text}"
        );
        let ring = init_from(&env, true, Backend::Ring)
            .expect_err("strict")
            .to_string();
        assert!(
            ring.contains("distributed: no ring backend could be initialised"),
            "{ring}"
        );
    }

    #[test]
    fn a_record_directory_is_made_by_init_only_while_the_recorder_is_on() {
        let base =
            std::env::temp_dir().join(format!("nuvec-backend-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("records");
        let options = |record: &str| {
            let dir = dir.clone().into_os_string();
            let record = OsString::from(record);
            let lookup = move |name: &str| match name {
                "NUVEC_DISTRIBUTED_RECORD_DIR" => Some(dir.clone()),
                "NUVEC_DISTRIBUTED_RECORD" => Some(record.clone()),
                _ => None,
            };
            options_from(&Env::from_fn(&lookup)).map(|_| ())
        };
        options("0").expect("the recorder off");
        assert!(
            !dir.exists(),
            "no directory is made for a recorder that is off"
        );
        options("lots").expect_err("a number of operations that is not a number");
        options("64").expect("the recorder on");
        assert!(
            dir.is_dir(),
            "the directory is made for a recorder that is on"
        );
        std::fs::remove_dir_all(&base).expect("cleaned up");
    }

    #[test]
    fn without_the_environment_init_is_this_process_alone() {
        let env = Env::from_fn(&none);
        let group = init_from(&env, false, Backend::Any).expect("not strict");
        assert_eq!((group.rank(), group.size()), (0, 1));
    }

    #[test]
    fn a_hostfile_of_one_rank_is_this_process_alone() {
        let dir = std::env::temp_dir().join(format!("nuvec-backend-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("one.json");
        std::fs::write(&path, "[[\"127.0.0.1:1\"]]\n").expect("hostfile");
        let path_text = path.clone().into_os_string();
        let lookup = move |name: &str| match name {
            "MLX_HOSTFILE" => Some(path_text.clone()),
            "MLX_RANK" => Some("0".into()),
            _ => None,
        };
        let group = init_from(&Env::from_fn(&lookup), true, Backend::Ring).expect("one rank");
        assert_eq!(group.size(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_environment_sets_the_backstop_the_link_timeout_and_the_warnings_and_setup_keeps_a_deadline()
     {
        use std::time::Duration;
        let defaults = options_from(&Env::from_fn(&none)).expect("defaults");
        assert_eq!(defaults.timeout, Duration::from_secs(600));
        assert_eq!(defaults.setup_timeout(), Duration::from_secs(30));
        assert_eq!(defaults.link_timeout, Duration::from_secs(15));
        assert_eq!(defaults.warn_after, Some(Duration::from_secs(30)));
        let lookup = |name: &str| match name {
            "NUVEC_DISTRIBUTED_TIMEOUT" => Some(OsString::from("0")),
            "NUVEC_DISTRIBUTED_LINK_TIMEOUT" => Some(OsString::from("4")),
            "NUVEC_DISTRIBUTED_WARN_AFTER" => Some(OsString::from("0")),
            _ => None,
        };
        let options = options_from(&Env::from_fn(&lookup)).expect("options");
        assert_eq!(options.timeout, Duration::ZERO, "no operation timeout");
        assert_eq!(options.setup_timeout(), Duration::from_secs(30));
        assert_eq!(options.link_timeout, Duration::from_secs(4));
        assert_eq!(options.warn_after, None);
        let lookup = |name: &str| match name {
            "NUVEC_DISTRIBUTED_TIMEOUT" => Some(OsString::from("45")),
            "NUVEC_DISTRIBUTED_WARN_AFTER" => Some(OsString::from("2.5")),
            _ => None,
        };
        let options = options_from(&Env::from_fn(&lookup)).expect("options");
        assert_eq!(options.timeout, Duration::from_secs(45));
        assert_eq!(options.setup_timeout(), Duration::from_secs(45));
        assert_eq!(options.warn_after, Some(Duration::from_millis(2500)));
        let lookup = |name: &str| match name {
            "NUVEC_DISTRIBUTED_LINK_TIMEOUT" => Some(OsString::from("soon")),
            _ => None,
        };
        let e = options_from(&Env::from_fn(&lookup)).expect_err("not seconds");
        assert!(
            e.to_string().contains("NUVEC_DISTRIBUTED_LINK_TIMEOUT"),
            "{e}"
        );
    }

    #[test]
    fn a_timeout_from_the_environment_too_large_for_a_deadline_forms_a_group() {
        // 1e19 s is a value `NUVEC_DISTRIBUTED_TIMEOUT` accepts; added to now it overflows an
        // `Instant`.
        let lookup = |name: &str| match name {
            "NUVEC_DISTRIBUTED_TIMEOUT" => Some(OsString::from("1e19")),
            _ => None,
        };
        let options = options_from(&Env::from_fn(&lookup)).expect("options");
        assert!(
            options.timeout > std::time::Duration::from_secs(1 << 62),
            "{:?}",
            options.timeout
        );
        let nodes: Vec<Vec<String>> = (0..2)
            .map(|_| {
                let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                vec![l.local_addr().expect("address").to_string()]
            })
            .collect();
        let sums: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|rank| {
                    let (nodes, options) = (&nodes, &options);
                    s.spawn(move || {
                        let group = connect_ring(nodes, rank, options).expect("connect");
                        let mut data = vec![rank as u8 + 1; 100];
                        group
                            .communicator()
                            .expect("a ring")
                            .try_all_reduce(
                                crate::collective::reduce::Reduction::Sum,
                                nuvec_core::DType::U8,
                                &mut data,
                            )
                            .expect("all_sum");
                        group.close();
                        data
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank"))
                .collect()
        });
        assert!(sums.iter().all(|d| d.iter().all(|&b| b == 3)));
    }

    #[test]
    fn a_jaccl_launch_with_a_key_is_refused_naming_the_variable_without_its_value() {
        let lookup = |name: &str| match name {
            "MLX_RANK" => Some(OsString::from("0")),
            "MLX_IBV_DEVICES" => Some(OsString::from("/nonexistent/devices.json")),
            "MLX_JACCL_COORDINATOR" => Some(OsString::from("127.0.0.1:1")),
            "NUVEC_DISTRIBUTED_KEY" => Some(OsString::from("a secret of sixteen bytes")),
            _ => None,
        };
        let e = init_from(&Env::from_fn(&lookup), true, Backend::Jaccl)
            .map(|_| ())
            .expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains("NUVEC_DISTRIBUTED_KEY") && text.contains("JACCL"),
            "{text}"
        );
        assert!(!text.contains("sixteen"), "the secret shown: {text}");
        // A key too short for the ring is refused for JACCL all the same, not as too short.
        let short = |name: &str| match name {
            "NUVEC_DISTRIBUTED_KEY" => Some(OsString::from("abc")),
            other => lookup(other),
        };
        let text = init_from(&Env::from_fn(&short), true, Backend::Jaccl)
            .map(|_| ())
            .expect_err("refused")
            .to_string();
        assert!(
            text.contains("JACCL") && !text.contains("too short"),
            "{text}"
        );
    }

    #[test]
    fn backends_parse_by_mlx_names() {
        assert_eq!("any".parse::<Backend>().expect("any"), Backend::Any);
        assert_eq!("ring".parse::<Backend>().expect("ring"), Backend::Ring);
        assert_eq!("jaccl".parse::<Backend>().expect("jaccl"), Backend::Jaccl);
        let err = "mpi".parse::<Backend>().expect_err("not provided");
        assert!(err.to_string().contains("mpi"), "{err}");
        assert!("tcp".parse::<Backend>().is_err());
        assert!(is_available(Backend::Ring));
    }
}
