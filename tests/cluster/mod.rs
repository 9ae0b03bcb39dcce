//! A cluster of hosts on one machine, for tests: one network namespace per host, one veth NIC
//! each on a bridge of its own (the switch), an address per host in `198.18.0.0/15` (RFC 2544's
//! benchmarking range), each NIC shaped in both directions with `tbf`, and an `sshd` per host
//! listening on its own address only.
//!
//! Nothing here touches the machine's own network or ssh setup:
//!
//! - the bridge has no address and no route leads to it, so no packet can leave the cluster
//!   (the hosts reach each other and nothing else);
//! - every name carries this process's id (`ncl<pid>b` for the bridge, `ncl<pid>o<i>` and
//!   `ncl<pid>i<i>` for host `i`'s veth ends, `nuvec-cl-<pid>-<i>` for its namespace), so runs in
//!   parallel do not clash, and a run killed before it could clean up is cleaned by the next
//!   one (its process id no longer exists);
//! - each `sshd` runs with a configuration, host key, `authorized_keys` and privilege
//!   separation directory in the cluster's temporary directory. Debian's `sshd` insists on
//!   `/run/sshd`, so every process of a host runs in a private mount namespace (the one
//!   `ip netns exec` makes) where the temporary `run/` directory is bind-mounted over `/run`
//!   and the cluster's `hosts` file over `/etc/hosts` (the host names `host0`, `host1`, …
//!   resolve there, through `getaddrinfo`, as the crate resolves hostfile names);
//! - the client side: `ssh` as the launchers run it is found on `PATH`, so [`Cluster::path`]
//!   puts a wrapper first on `PATH` that runs the system's `ssh -F <the cluster's config>`
//!   (its identity, known hosts with the hosts' keys, `BatchMode`). `~/.ssh` is never read or
//!   written (ssh finds it through the password database, not `HOME`, so pointing `HOME`
//!   elsewhere would not be enough).
//!
//! Everything is removed when the [`Cluster`] is dropped, also when a test panics: every
//! process in a host's namespace is killed, the namespaces and the bridge are deleted (a veth
//! pair goes with its namespace) and the directory is removed.
//!
//! Faults: [`Cluster::pull`] sets the switch side of a host's cable down (the host sees no
//! carrier: no FIN, no RST, only silence), [`Cluster::plug`] sets it up again,
//! [`Cluster::set_rate`] reshapes a host's NIC in both directions, [`Cluster::second_network`]
//! gives every host a second NIC on a second bridge (`ncl<pid>w`, addresses `198.19.0.<i+1>`,
//! still RFC 2544's range; a Wi-Fi beside the Thunderbolt network) at a rate of its own, and
//! [`Cluster::drop_port`] makes a host's firewall drop a TCP port (an `nftables` table in the
//! host's namespace, which goes with it).
//!
//! [`make`] needs root, `ip`, `tc`, `sshd`, `ssh` and `ssh-keygen` (and `nft` for
//! [`Cluster::drop_port`]); without them it returns `None` after printing why, except under
//! `CI=true`, where it panics.
#![allow(dead_code, unreachable_pub)]

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The port every host's sshd listens on (on the host's own address).
pub const SSH_PORT: u16 = 22;

/// A host's rate and the shaper's bucket and queue: a burst of 128 KiB (a millisecond at
/// 1 Gbit/s; smaller buckets than two offloaded 64 KiB packets cost a fifth of the rate here,
/// larger ones let a short transfer after an idle moment run faster than the link) and at most
/// 20 ms of queue (a switch's buffer, about 2.5 MB at 1 Gbit/s).
fn tbf_args(rate: &str) -> Vec<String> {
    [
        "rate", rate, "burst", "128kb", "latency", "20ms", "mpu", "64",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// One host of a cluster.
pub struct Host {
    /// Its network namespace.
    pub ns: String,
    /// Its address.
    pub addr: Ipv4Addr,
    /// Its name in the cluster's `/etc/hosts`.
    pub name: String,
    /// The switch side of its cable (in the machine's namespace).
    outer: String,
    /// Its NIC (in its namespace).
    inner: String,
    sshd: Option<Child>,
}

/// A cluster of hosts; dropped, it removes everything it made.
pub struct Cluster {
    /// The temporary directory with the ssh files, the hosts file and the wrapper.
    pub dir: PathBuf,
    bridge: String,
    /// The hosts, by index.
    pub hosts: Vec<Host>,
    /// The second network's bridge and each host's `(switch side, NIC)`, once made.
    second: Option<(String, Vec<(String, String)>)>,
}

/// Runs a command of the cluster's setup, returning its error output on failure.
fn sh(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// As [`sh`], panicking with the error.
fn must(program: &str, args: &[&str]) {
    if let Err(e) = sh(program, args) {
        panic!("cluster: {e}");
    }
}

fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Why a cluster cannot be made here, if it cannot.
fn missing() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        == Some("0");
    if !root {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    for (tool, package) in [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("/usr/sbin/sshd", "openssh-server"),
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
    ] {
        let found = Command::new(tool)
            .arg("-V")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("no {tool} (Debian package {package})"));
        }
    }
    None
}

/// Makes a cluster of `n` hosts whose NICs run at `rate` (`tc`'s syntax: `1gbit`, `100mbit`),
/// with an sshd on each, ready for logins. `None` (after printing why) where a cluster cannot
/// be made, unless `CI=true`, where that panics.
pub fn make(n: usize, rate: &str) -> Option<Cluster> {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    if let Some(why) = missing() {
        assert!(!ci, "cannot make a cluster, and CI=true requires it: {why}");
        eprintln!("skipped: cannot make a cluster here: {why}");
        return None;
    }
    clean_stale();
    match Cluster::build(n, rate) {
        Ok(cluster) => Some(cluster),
        Err(why) => {
            assert!(!ci, "cannot make a cluster, and CI=true requires it: {why}");
            eprintln!("skipped: cannot make a cluster here: {why}");
            None
        }
    }
}

/// Removes what runs of this harness left when they were killed before cleaning up: the
/// namespaces and bridges named after a process that no longer exists.
fn clean_stale() {
    let dead = |pid: &str| !Path::new(&format!("/proc/{pid}")).exists();
    for line in output("ip", &["netns", "list"]).lines() {
        let ns = line.split_whitespace().next().unwrap_or_default();
        if let Some(rest) = ns.strip_prefix("nuvec-cl-")
            && let Some((pid, _)) = rest.split_once('-')
            && dead(pid)
        {
            kill_namespace(ns);
            let _ = sh("ip", &["netns", "del", ns]);
        }
    }
    for line in output("ip", &["-o", "link", "show", "type", "bridge"]).lines() {
        let Some(name) = line.split(": ").nth(1) else {
            continue;
        };
        if let Some(pid) = name
            .strip_prefix("ncl")
            .and_then(|r| r.strip_suffix('b').or_else(|| r.strip_suffix('w')))
            && pid.bytes().all(|b| b.is_ascii_digit())
            && dead(pid)
        {
            let _ = sh("ip", &["link", "del", name]);
        }
    }
}

/// The path of `program` on `PATH` (the system's, before the cluster's wrapper is on it).
fn which(program: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("no {program} on PATH"))
}

/// Kills every process in namespace `ns`.
fn kill_namespace(ns: &str) {
    let pids = output("ip", &["netns", "pids", ns]);
    let pids: Vec<&str> = pids.split_whitespace().collect();
    if !pids.is_empty() {
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(&pids)
            .stderr(Stdio::null())
            .status();
    }
}

/// Shapes the veth pair `outer` (machine side) / `inner` (in namespace `ns`) at `rate` both
/// ways.
fn shape_pair(ns: &str, outer: &str, inner: &str, rate: &str, verb: &str) -> Result<(), String> {
    let tbf = tbf_args(rate);
    let tbf: Vec<&str> = tbf.iter().map(String::as_str).collect();
    let mut o = vec!["qdisc", verb, "dev", outer, "root", "tbf"];
    o.extend(&tbf);
    sh("tc", &o)?;
    let mut i = vec!["-n", ns, "qdisc", verb, "dev", inner, "root", "tbf"];
    i.extend(&tbf);
    sh("tc", &i)
}

impl Cluster {
    /// Gives host `i`'s NIC `addr` (a `/24`) beside its own, as `ip addr add` does: a
    /// secondary address, which Linux's `ifconfig` does not show. Goes with the namespace.
    pub fn add_address(&self, i: usize, addr: Ipv4Addr) {
        let host = &self.hosts[i];
        must(
            "ip",
            &[
                "-n",
                &host.ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &host.inner,
            ],
        );
    }

    fn build(n: usize, rate: &str) -> Result<Cluster, String> {
        assert!((1..=200).contains(&n), "1 to 200 hosts");
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("nuvec-cluster-{pid}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("run/sshd"))
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        std::fs::create_dir_all(dir.join("bin"))
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        let mut cluster = Cluster {
            dir,
            bridge: format!("ncl{pid}b"),
            hosts: (0..n)
                .map(|i| Host {
                    ns: format!("nuvec-cl-{pid}-{i}"),
                    addr: Ipv4Addr::new(198, 18, 0, 1 + i as u8),
                    name: format!("host{i}"),
                    outer: format!("ncl{pid}o{i}"),
                    inner: format!("ncl{pid}i{i}"),
                    sshd: None,
                })
                .collect(),
            second: None,
        };
        // From here on, a failure drops the cluster, which removes what was made.
        cluster.network(rate)?;
        cluster.ssh_files()?;
        for i in 0..n {
            cluster.start_sshd(i)?;
        }
        cluster.wait_for_sshd()?;
        Ok(cluster)
    }

    fn network(&mut self, rate: &str) -> Result<(), String> {
        let b = self.bridge.clone();
        sh("ip", &["link", "add", &b, "type", "bridge"])?;
        sh("ip", &["link", "set", &b, "up"])?;
        for h in &self.hosts {
            sh("ip", &["netns", "add", &h.ns])?;
            sh(
                "ip",
                &[
                    "link", "add", &h.outer, "type", "veth", "peer", "name", &h.inner, "netns",
                    &h.ns,
                ],
            )?;
            sh("ip", &["link", "set", &h.outer, "master", &b, "up"])?;
            let addr = format!("{}/24", h.addr);
            let e = |args: &[&str]| {
                let mut full = vec!["netns", "exec", &h.ns];
                full.extend(args);
                sh("ip", &full)
            };
            e(&["ip", "link", "set", "lo", "up"])?;
            e(&["ip", "addr", "add", &addr, "dev", &h.inner])?;
            e(&["ip", "link", "set", &h.inner, "up"])?;
        }
        for i in 0..self.hosts.len() {
            self.shape(i, rate, "add")?;
        }
        Ok(())
    }

    /// Shapes host `i`'s NIC at `rate` both ways: its sending on its side of the cable, its
    /// receiving on the switch's side. A rate of `none` leaves the NIC unshaped (a veth's own
    /// speed: the CPU is the limit).
    fn shape(&self, i: usize, rate: &str, verb: &str) -> Result<(), String> {
        if rate == "none" {
            return Ok(());
        }
        let h = &self.hosts[i];
        shape_pair(&h.ns, &h.outer, &h.inner, rate, verb)
    }

    fn ssh_files(&self) -> Result<(), String> {
        let d = &self.dir;
        let keygen = |path: &Path| {
            sh(
                "ssh-keygen",
                &[
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "nuvec-cluster",
                    "-f",
                    &path.display().to_string(),
                ],
            )
        };
        keygen(&d.join("id"))?;
        let read = |p: PathBuf| std::fs::read_to_string(&p).map_err(|e| format!("{e}"));
        std::fs::write(d.join("authorized_keys"), read(d.join("id.pub"))?)
            .map_err(|e| e.to_string())?;
        let mut known = String::new();
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for (i, h) in self.hosts.iter().enumerate() {
            let key = d.join(format!("host{i}_key"));
            keygen(&key)?;
            let public = read(key.with_extension("pub"))?;
            let mut words = public.split_whitespace();
            let (kind, body) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            known += &format!("{},{} {kind} {body}\n", h.addr, h.name);
            hosts += &format!("{} {}\n", h.addr, h.name);
            let config = format!(
                "ListenAddress {}:{SSH_PORT}\nHostKey {}\nAuthorizedKeysFile {}\nPidFile none\n\
                 UsePAM no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nStrictModes no\nPrintMotd no\nPrintLastLog no\n\
                 UseDNS no\nMaxStartups 100:30:200\nMaxSessions 100\nLogLevel ERROR\n",
                h.addr,
                key.display(),
                d.join("authorized_keys").display(),
            );
            std::fs::write(d.join(format!("sshd{i}.conf")), config).map_err(|e| e.to_string())?;
        }
        std::fs::write(d.join("known_hosts"), known).map_err(|e| e.to_string())?;
        std::fs::write(d.join("hosts"), hosts).map_err(|e| e.to_string())?;
        let config = format!(
            "Host *\n  User root\n  Port {SSH_PORT}\n  IdentityFile {}\n  IdentitiesOnly yes\n  \
             UserKnownHostsFile {}\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  \
             BatchMode yes\n  ConnectTimeout 10\n  ServerAliveInterval 5\n  LogLevel ERROR\n",
            d.join("id").display(),
            d.join("known_hosts").display(),
        );
        std::fs::write(d.join("ssh_config"), config).map_err(|e| e.to_string())?;
        let wrapper = d.join("bin/ssh");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\n# The system's ssh with the cluster's configuration only.\nexec {} -F {} \"$@\"\n",
                which("ssh")?.display(),
                d.join("ssh_config").display()
            ),
        )
        .map_err(|e| e.to_string())?;
        // `on I COMMAND...` runs a command on host I, as [`Cluster::on`] does (for scripts).
        let on = d.join("bin/on");
        std::fs::write(
            &on,
            format!(
                "#!/bin/sh\n# on HOST COMMAND...: runs COMMAND on host HOST (0, 1, ...) of the cluster.\n\
                 h=$1; shift\n\
                 exec ip netns exec \"nuvec-cl-{}-$h\" sh -c {} \"host$h\" {} {} \"$@\"\n",
                std::process::id(),
                r#"'mount --bind "$1" /etc/hosts && mount --bind "$2" /run && shift 2 && exec "$@"'"#,
                d.join("hosts").display(),
                d.join("run").display(),
            ),
        )
        .map_err(|e| e.to_string())?;
        use std::os::unix::fs::PermissionsExt;
        for script in [&wrapper, &on] {
            std::fs::set_permissions(script, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| e.to_string())?;
        }
        std::fs::set_permissions(d.join("id"), std::fs::Permissions::from_mode(0o600))
            .map_err(|e| e.to_string())
    }

    fn start_sshd(&mut self, i: usize) -> Result<(), String> {
        let config = self.dir.join(format!("sshd{i}.conf"));
        let log = std::fs::File::create(self.dir.join(format!("sshd{i}.log")))
            .map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new("/usr/sbin/sshd");
        cmd.args(["-D", "-e", "-f"]).arg(&config);
        let child = self
            .on(i, cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("start sshd on host {i}: {e}"))?;
        self.hosts[i].sshd = Some(child);
        Ok(())
    }

    /// Waits (bounded) until every sshd accepts a login and runs a command.
    fn wait_for_sshd(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..self.hosts.len() {
            loop {
                if let Some(Ok(Some(status))) = self.hosts[i].sshd.as_mut().map(Child::try_wait) {
                    let log = std::fs::read_to_string(self.dir.join(format!("sshd{i}.log")))
                        .unwrap_or_default();
                    return Err(format!("sshd of host {i} exited ({status}): {log}"));
                }
                let addr = self.hosts[i].addr.to_string();
                let mut ssh = self.ssh(0, &addr, "true");
                let ok = ssh
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "sshd of host {i} does not accept logins within 30 s"
                    ));
                }
                // Polling for the daemon to listen, bounded by the deadline above.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// `cmd` run on host `i`: in its network namespace, with the cluster's `/etc/hosts` and
    /// `/run` (see the module docs); program, arguments, environment and working directory
    /// carried over.
    pub fn on(&self, i: usize, cmd: Command) -> Command {
        let mut wrapped = Command::new("ip");
        wrapped.args(["netns", "exec", &self.hosts[i].ns, "sh", "-c"]);
        wrapped.arg(
            "mount --bind \"$1\" /etc/hosts && mount --bind \"$2\" /run && shift 2 && exec \"$@\"",
        );
        wrapped
            .arg(format!("host{i}"))
            .arg(self.dir.join("hosts"))
            .arg(self.dir.join("run"));
        wrapped.arg(cmd.get_program()).args(cmd.get_args());
        for (key, value) in cmd.get_envs() {
            match value {
                Some(v) => wrapped.env(key, v),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(cwd) = cmd.get_current_dir() {
            wrapped.current_dir(cwd);
        }
        wrapped
    }

    /// `PATH` with the cluster's `ssh` wrapper first.
    pub fn path(&self) -> String {
        format!(
            "{}:{}",
            self.dir.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    /// `ssh TARGET SCRIPT` from host `from` with the cluster's configuration.
    pub fn ssh(&self, from: usize, target: &str, script: &str) -> Command {
        let mut cmd = Command::new("ssh");
        cmd.arg("-F")
            .arg(self.dir.join("ssh_config"))
            .args([target, script]);
        self.on(from, cmd)
    }

    /// The addresses of the hosts, comma-separated, as `--hosts` takes them.
    pub fn host_list(&self, hosts: &[usize]) -> String {
        hosts
            .iter()
            .map(|&i| self.hosts[i].addr.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Pulls host `i`'s cable: the switch side goes down, the host sees no carrier.
    pub fn pull(&self, i: usize) {
        must("ip", &["link", "set", &self.hosts[i].outer, "down"]);
    }

    /// Plugs host `i`'s cable back in.
    pub fn plug(&self, i: usize) {
        must("ip", &["link", "set", &self.hosts[i].outer, "up"]);
    }

    /// Sets the sysctl `key` (a per-namespace one, such as `net.ipv4.tcp_rto_max_ms`) to
    /// `value` on every host.
    pub fn sysctl(&self, key: &str, value: &str) {
        for h in &self.hosts {
            must(
                "ip",
                &[
                    "netns",
                    "exec",
                    &h.ns,
                    "sysctl",
                    "-qw",
                    &format!("{key}={value}"),
                ],
            );
        }
    }

    /// Reshapes host `i`'s NIC to `rate` in both directions.
    pub fn set_rate(&self, i: usize, rate: &str) {
        if let Err(e) = self.shape(i, rate, "change") {
            panic!("cluster: {e}");
        }
    }
}

impl Cluster {
    /// Gives every host a second NIC on a second bridge at `rate`, host `i`'s at
    /// `198.19.0.<i+1>/24` (a second network beside the first: a host's traffic to a
    /// `198.19.0.x` address goes over it); returns the NICs' names, by host.
    pub fn second_network(&mut self, rate: &str) -> Vec<String> {
        assert!(self.second.is_none(), "one second network");
        let pid = std::process::id();
        let bridge = format!("ncl{pid}w");
        must("ip", &["link", "add", &bridge, "type", "bridge"]);
        // From here on, Drop removes the bridge and the pairs made so far.
        self.second = Some((bridge.clone(), Vec::new()));
        must("ip", &["link", "set", &bridge, "up"]);
        let mut names = Vec::new();
        for i in 0..self.hosts.len() {
            let (outer, inner) = (format!("ncl{pid}q{i}"), format!("ncl{pid}w{i}"));
            let ns = self.hosts[i].ns.clone();
            must(
                "ip",
                &[
                    "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &ns,
                ],
            );
            if let Some((_, pairs)) = &mut self.second {
                pairs.push((outer.clone(), inner.clone()));
            }
            must("ip", &["link", "set", &outer, "master", &bridge, "up"]);
            let addr = format!("198.19.0.{}/24", i + 1);
            must("ip", &["-n", &ns, "addr", "add", &addr, "dev", &inner]);
            must("ip", &["-n", &ns, "link", "set", &inner, "up"]);
            if let Err(e) = shape_pair(&ns, &outer, &inner, rate, "add") {
                panic!("cluster: {e}");
            }
            names.push(inner);
        }
        names
    }

    /// Makes host `i`'s firewall drop every TCP segment to `port` (an `nftables` rule in its
    /// namespace): a connect there gets no answer at all.
    pub fn drop_port(&self, i: usize, port: u16) {
        let rules = format!(
            "table inet nuvec_cluster {{\n  chain input {{\n    type filter hook input priority 0; \
             policy accept;\n    tcp dport {port} drop\n  }}\n}}\n"
        );
        let path = self.dir.join(format!("nft{i}.conf"));
        if let Err(e) = std::fs::write(&path, rules) {
            panic!("cluster: {e}");
        }
        must(
            "ip",
            &[
                "netns",
                "exec",
                &self.hosts[i].ns,
                "nft",
                "-f",
                &path.display().to_string(),
            ],
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The second network first: its pairs go with the namespaces too, but later.
        if let Some((bridge, pairs)) = self.second.take() {
            for (outer, _) in pairs {
                let _ = sh("ip", &["link", "del", &outer]);
            }
            let _ = sh("ip", &["link", "del", &bridge]);
        }
        for h in &mut self.hosts {
            if let Some(mut sshd) = h.sshd.take() {
                let _ = sshd.kill();
                let _ = sshd.wait();
            }
        }
        for h in &self.hosts {
            kill_namespace(&h.ns);
            // Deleting one end removes the pair at once; a namespace's own cleanup runs later,
            // in the kernel's time, and would leave the names taken meanwhile.
            let _ = sh("ip", &["link", "del", &h.outer]);
            let _ = sh("ip", &["netns", "del", &h.ns]);
        }
        let _ = sh("ip", &["link", "del", &self.bridge]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
