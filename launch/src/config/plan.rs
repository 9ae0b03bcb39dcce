//! The plan: links, addresses, rings, the backend and the hostfile, from the discovered
//! ports alone (sans-IO), as `mlx.distributed_config` (MLX 0.32.4) makes them.
//!
//! * **Links.** A port is linked when the domain UUID at the other end of its cable is a port
//!   of one of the hosts. The link-count matrix counts, for each host, its linked ports per
//!   peer host.
//! * **Addresses.** Each cable gets its own /30, in the order hosts and then their ports
//!   (sorted by interface) are visited, skipping a cable already given one from its other
//!   end: `192.168.A.B+1` on this end, `192.168.A.B+2` on the other, `B` stepping by 4 and
//!   `A` by one when `B` passes 255. So a pair's cables are listed in the same order on both
//!   ends.
//! * **Rings.** Every cycle of the matrix, found by depth-first search from each host in
//!   turn (neighbours in host order), one per set of hosts (the first found), sorted longest
//!   first (stably); a ring's cable count is the fewest cables between two neighbours of it.
//!   A two-host cycle is a ring.
//! * **Backend**, when none is asked for: `jaccl` for a full mesh with RDMA on every host,
//!   `jaccl-ring` for a full ring with RDMA, `ring` for a full ring without.
//! * **Hostfiles.** `jaccl`: rank = host order, `rdma[j]` = `rdma_<iface>` of the first
//!   `count` cables to host `j` (`count` = the fewest cables between any two hosts; a string
//!   for one cable, a list for more), `null` on the diagonal, `ips` = the host's `en0` (else
//!   `en1`) address after those it had. `jaccl-ring`: rank = position on the ring, devices
//!   only towards the two ring neighbours. `ring`: rank = position on the ring, `ips` = the
//!   host's addresses on the cables to its left neighbour (one per cable of the ring's
//!   count), which that neighbour connects to. `--over ethernet`: `ips` as for `jaccl`, no
//!   backend and empty `rdma`.
//!
//! Quirks kept for byte-compatibility: a host given as an address keeps it as its first
//! `ips` entry before its `en0` address (so the same address may appear twice); a ring is one
//! per set of hosts, so of two Hamiltonian cycles of one mesh the first found is the one used.
//! The cycle search is exhaustive, as MLX's: fine for the handful of Macs Thunderbolt cabling
//! allows (a Mac has at most six ports).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::discover::ThunderboltHost;

/// The netmask of every link's /30.
pub(crate) const NETMASK: &str = "255.255.255.252";

/// The discovered ports of every host, in host order, with the index from a port's domain
/// UUID to its host and position.
#[derive(Clone, Debug, Default)]
pub(crate) struct Topology {
    /// Each host's ports, sorted by interface.
    pub(crate) hosts: Vec<ThunderboltHost>,
    /// Domain UUID to (host, port index); a UUID seen twice maps to its last port.
    index: HashMap<String, (usize, usize)>,
}

impl Topology {
    /// The topology of `hosts` (in host order).
    pub(crate) fn new(hosts: Vec<ThunderboltHost>) -> Topology {
        let mut index = HashMap::new();
        for (i, h) in hosts.iter().enumerate() {
            for (j, p) in h.ports.iter().enumerate() {
                index.insert(p.uuid.clone(), (i, j));
            }
        }
        Topology { hosts, index }
    }

    /// The (host, port index) at the other end of port `port` of host `host`, when it is a
    /// port of one of the hosts.
    fn peer(&self, host: usize, port: usize) -> Option<(usize, usize)> {
        let to = self.hosts[host].ports[port].connected_to.as_ref()?;
        self.index.get(to).copied()
    }

    /// The link-count matrix: `m[i][j]` = how many of host `i`'s ports are cabled to host `j`.
    pub(crate) fn connectivity(&self) -> Vec<Vec<usize>> {
        let n = self.hosts.len();
        (0..n)
            .map(|i| {
                let mut row = vec![0; n];
                for p in 0..self.hosts[i].ports.len() {
                    if let Some((j, _)) = self.peer(i, p) {
                        row[j] += 1;
                    }
                }
                row
            })
            .collect()
    }

    /// The Graphviz graph `--dot` prints: a node per host (labelled with `names`, its ssh
    /// name), an edge per cable labelled `iface/peer_iface`, drawn from the lower host.
    pub(crate) fn dot(&self, names: &[String]) -> String {
        let id = |mut j: usize| {
            let mut n = String::new();
            loop {
                n.push(char::from(b'a' + (j % 26) as u8));
                j /= 26;
                if j == 0 {
                    return n;
                }
            }
        };
        let mut out = String::from("graph G {\n  node [shape=rectangle];\n");
        for (i, name) in names.iter().enumerate() {
            out += &format!("  {} [label=\"{name}\"];\n", id(i));
        }
        for (i, h) in self.hosts.iter().enumerate() {
            for (p, port) in h.ports.iter().enumerate() {
                let Some((dst, dport)) = self.peer(i, p) else {
                    continue;
                };
                if dst < i {
                    continue;
                }
                out += &format!(
                    "  {} -- {} [label=\"{}/{}\"]\n",
                    id(i),
                    id(dst),
                    port.iface,
                    self.hosts[dst].ports[dport].iface
                );
            }
        }
        out += "}\n";
        out
    }
}

/// One end of a cable: the local interface and its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct End {
    /// The interface (`en2`).
    pub(crate) iface: String,
    /// Its address (`192.168.0.1`).
    pub(crate) ip: String,
}

/// Every cable's /30: `ends[(i, j)]` lists host `i`'s ends of its cables to host `j`, in the
/// same cable order as `ends[(j, i)]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Addresses {
    /// Host `i`'s ends of its cables to host `j`.
    pub(crate) ends: BTreeMap<(usize, usize), Vec<End>>,
}

/// More cables than the 192.168.0.0/16 holds /30s for (16384).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OutOfAddresses;

impl Addresses {
    /// Gives each cable of `topology` its /30.
    ///
    /// # Errors
    ///
    /// [`OutOfAddresses`] when the 16384th cable is given one (MLX's `Ran out of available
    /// local IPs`).
    pub(crate) fn plan(topology: &Topology) -> Result<Addresses, OutOfAddresses> {
        let mut assigned = BTreeSet::new();
        let mut ends: BTreeMap<(usize, usize), Vec<End>> = BTreeMap::new();
        let (mut a, mut b) = (0u32, 0u32);
        for (src, h) in topology.hosts.iter().enumerate() {
            for (sport, port) in h.ports.iter().enumerate() {
                let Some((dst, dport)) = topology.peer(src, sport) else {
                    continue;
                };
                if assigned.contains(&(src, sport)) {
                    continue;
                }
                ends.entry((src, dst)).or_default().push(End {
                    iface: port.iface.clone(),
                    ip: format!("192.168.{a}.{}", b + 1),
                });
                ends.entry((dst, src)).or_default().push(End {
                    iface: topology.hosts[dst].ports[dport].iface.clone(),
                    ip: format!("192.168.{a}.{}", b + 2),
                });
                assigned.insert((src, sport));
                assigned.insert((dst, dport));
                b += 4;
                if b > 255 {
                    a += 1;
                    b = 0;
                }
                if a > 255 {
                    return Err(OutOfAddresses);
                }
            }
        }
        Ok(Addresses { ends })
    }

    /// Host `i`'s ends of its cables to `j` (none when they are not cabled).
    pub(crate) fn between(&self, i: usize, j: usize) -> &[End] {
        self.ends.get(&(i, j)).map_or(&[], Vec::as_slice)
    }

    /// The shell commands that configure host `i` of `n` (one per line, ending with a
    /// newline): the Thunderbolt bridge down, then for each peer in host order and each
    /// cable, its address and the route to the other end.
    pub(crate) fn setup_commands(&self, i: usize, n: usize) -> String {
        let mut command = String::from("sudo ifconfig bridge0 down\n");
        for j in 0..n {
            if i == j {
                continue;
            }
            for (end, peer) in self.between(i, j).iter().zip(self.between(j, i)) {
                command += &format!(
                    "sudo ifconfig {} inet {} netmask {NETMASK}\n",
                    end.iface, end.ip
                );
                command += &format!("sudo route change {} -interface {}\n", peer.ip, end.iface);
            }
        }
        command
    }
}

/// A ring: its hosts in ring order, and the fewest cables between two neighbours of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ring {
    /// The hosts in ring order (rank order of the hostfile).
    pub(crate) hosts: Vec<usize>,
    /// The cables usable between every pair of neighbours.
    pub(crate) cables: usize,
}

/// Every ring of `connectivity`, one per set of hosts, longest first.
pub(crate) fn rings(connectivity: &[Vec<usize>]) -> Vec<Ring> {
    fn dfs(
        m: &[Vec<usize>],
        start: usize,
        node: usize,
        path: &mut Vec<usize>,
        visited: &mut Vec<bool>,
        found: &mut Vec<Vec<usize>>,
    ) {
        path.push(node);
        visited[node] = true;
        for j in 0..m.len() {
            if m[node][j] == 0 {
                continue;
            }
            if j == start {
                found.push(path.clone());
            }
            if !visited[j] {
                dfs(m, start, j, path, visited, found);
            }
        }
        path.pop();
        visited[node] = false;
    }

    let n = connectivity.len();
    let mut rings = Vec::new();
    let mut seen = BTreeSet::new();
    for start in 0..n {
        let mut found = Vec::new();
        dfs(
            connectivity,
            start,
            start,
            &mut Vec::new(),
            &mut vec![false; n],
            &mut found,
        );
        for r in found {
            let cables = (0..r.len())
                .map(|i| connectivity[r[i]][r[(i + 1) % r.len()]])
                .min()
                .unwrap_or(0);
            let mut key = r.clone();
            key.sort_unstable();
            if seen.insert(key) {
                rings.push(Ring { hosts: r, cables });
            }
        }
    }
    rings.sort_by_key(|r| std::cmp::Reverse(r.hosts.len()));
    rings
}

/// The first pair of distinct hosts with no cable between them (`None` for a full mesh).
pub(crate) fn mesh_gap(connectivity: &[Vec<usize>]) -> Option<(usize, usize)> {
    let n = connectivity.len();
    (0..n)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .find(|&(i, j)| i != j && connectivity[i][j] == 0)
}

/// Whether the longest of `rings` goes through all `n` hosts.
pub(crate) fn has_full_ring(rings: &[Ring], n: usize) -> bool {
    rings.first().is_some_and(|r| r.hosts.len() == n)
}

/// The backends a hostfile is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// MLX's TCP ring over the Thunderbolt addresses.
    Ring,
    /// JACCL over a full mesh.
    Jaccl,
    /// JACCL's ring algorithms over a ring of cables.
    JacclRing,
}

impl Backend {
    /// The name in the hostfile and on the command line.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::Jaccl => "jaccl",
            Backend::JacclRing => "jaccl-ring",
        }
    }
}

/// Why no backend fits the cabling when none was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoBackend {
    /// No full mesh and no full ring.
    NeitherMeshNorRing,
    /// A full mesh but no full ring, and no RDMA.
    NoRdmaNoRing,
}

/// The backend `mlx.distributed_config` picks without `--backend`.
///
/// # Errors
///
/// [`NoBackend`] when neither a full mesh with RDMA nor a full ring exists.
pub(crate) fn choose_backend(mesh: bool, ring: bool, rdma: bool) -> Result<Backend, NoBackend> {
    match (mesh, ring, rdma) {
        (false, false, _) => Err(NoBackend::NeitherMeshNorRing),
        (true, _, true) => Ok(Backend::Jaccl),
        (_, true, true) => Ok(Backend::JacclRing),
        (_, true, false) => Ok(Backend::Ring),
        (true, false, false) => Err(NoBackend::NoRdmaNoRing),
    }
}

/// A host's RDMA device(s) towards one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Devices {
    /// `null`: itself, or not a neighbour.
    None,
    /// One cable: `"rdma_en2"`.
    One(String),
    /// Several cables: `["rdma_en2", "rdma_en3"]`.
    Many(Vec<String>),
}

impl Devices {
    fn of(mut names: Vec<String>) -> Devices {
        if names.len() == 1 {
            Devices::One(names.remove(0))
        } else {
            Devices::Many(names)
        }
    }
}

/// One host entry of MLX's hostfile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostEntry {
    /// The ssh name.
    pub(crate) ssh: String,
    /// The addresses (`"ips"`).
    pub(crate) ips: Vec<String>,
    /// The RDMA devices towards each rank (`"rdma"`).
    pub(crate) rdma: Vec<Devices>,
}

/// MLX's hostfile: `{"backend", "envs", "hosts"}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hostfile {
    /// The backend's name (empty for `--over ethernet`).
    pub(crate) backend: String,
    /// `--env` entries.
    pub(crate) envs: Vec<String>,
    /// One entry per rank.
    pub(crate) hosts: Vec<HostEntry>,
}

/// A host as the hostfile needs it: its ssh name and its `ips` (the ones it came with, then
/// its `en0`/`en1` address when one was found).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Named {
    /// The ssh name.
    pub(crate) ssh: String,
    /// Its addresses.
    pub(crate) ips: Vec<String>,
}

/// The `ring` hostfile: rank = position on `ring`, each host's addresses on its cables to its
/// left neighbour.
pub(crate) fn ring_hostfile(
    hosts: &[Named],
    addresses: &Addresses,
    ring: &Ring,
    envs: &[String],
) -> Hostfile {
    let r = &ring.hosts;
    let entries = (0..r.len())
        .map(|i| {
            let (node, left) = (r[i], r[(i + r.len() - 1) % r.len()]);
            HostEntry {
                ssh: hosts[node].ssh.clone(),
                ips: addresses
                    .between(node, left)
                    .iter()
                    .take(ring.cables)
                    .map(|e| e.ip.clone())
                    .collect(),
                rdma: Vec::new(),
            }
        })
        .collect();
    Hostfile {
        backend: Backend::Ring.name().into(),
        envs: envs.to_vec(),
        hosts: entries,
    }
}

/// The `jaccl` hostfile for a full mesh: rank = host order.
pub(crate) fn jaccl_hostfile(hosts: &[Named], addresses: &Addresses, envs: &[String]) -> Hostfile {
    let n = hosts.len();
    let count = (0..n)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .filter(|&(i, j)| i != j)
        .map(|(i, j)| addresses.between(i, j).len())
        .min()
        .unwrap_or(0);
    let entries = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| HostEntry {
            ssh: h.ssh.clone(),
            ips: h.ips.clone(),
            rdma: (0..n)
                .map(|j| {
                    if i == j {
                        Devices::None
                    } else {
                        Devices::of(devices(addresses.between(i, j), count))
                    }
                })
                .collect(),
        })
        .collect();
    Hostfile {
        backend: Backend::Jaccl.name().into(),
        envs: envs.to_vec(),
        hosts: entries,
    }
}

/// The `jaccl-ring` hostfile: rank = position on `ring`, devices towards the two ring
/// neighbours only.
pub(crate) fn jaccl_ring_hostfile(
    hosts: &[Named],
    addresses: &Addresses,
    ring: &Ring,
    envs: &[String],
) -> Hostfile {
    let r = &ring.hosts;
    let n = r.len();
    let entries = (0..n)
        .map(|i| {
            let node = r[i];
            let (left, right) = (r[(i + n - 1) % n], r[(i + 1) % n]);
            HostEntry {
                ssh: hosts[node].ssh.clone(),
                ips: hosts[node].ips.clone(),
                rdma: r
                    .iter()
                    .map(|&other| {
                        if other != left && other != right {
                            Devices::None
                        } else {
                            Devices::of(devices(addresses.between(node, other), ring.cables))
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    Hostfile {
        backend: Backend::JacclRing.name().into(),
        envs: envs.to_vec(),
        hosts: entries,
    }
}

/// The `--over ethernet` hostfile: every host with its addresses, no backend, no devices.
pub(crate) fn ethernet_hostfile(hosts: &[Named], envs: &[String]) -> Hostfile {
    Hostfile {
        backend: String::new(),
        envs: envs.to_vec(),
        hosts: hosts
            .iter()
            .map(|h| HostEntry {
                ssh: h.ssh.clone(),
                ips: h.ips.clone(),
                rdma: Vec::new(),
            })
            .collect(),
    }
}

/// `rdma_<iface>` of the first `count` cables.
fn devices(ends: &[End], count: usize) -> Vec<String> {
    ends.iter()
        .take(count)
        .map(|e| format!("rdma_{}", e.iface))
        .collect()
}
