//! The shell text `mlx.launch` sends through `ssh` for a remote rank, byte for byte: the
//! launch script ([`launch_script`]: PID file, `cd`, exports, the generated file, `exec`),
//! the `ssh` command, and the kill script that stops a remote rank through its PID file;
//! with Python's `shlex.quote` and `shlex.join` ([`shell_quote`], [`shell_join`]) that they
//! are made of.
//!
//! One difference from `mlx.launch`: ssh runs with `LogLevel=ERROR` rather than `QUIET`, so
//! that its own errors are seen ([`ssh_command`]). Two safety fixes over `mlx.launch`: the PID file is only taken from a line that is a plain
//! `mktemp` path ([`pidfile_path`]: a login banner printed before it is output, never a path
//! to remove), and the kill script quotes the path. And one addition: the kill script sends
//! SIGKILL after a grace to a rank that outlives its SIGTERM ([`kill_script`]).

use std::time::Duration;

use crate::plan::Plan;

/// The bash script `mlx.launch` runs for a rank (`RemoteProcess.make_launch_script`), byte for
/// byte for the exports `plan` keeps: `stty -echo` (remote), the PID file it prints first,
/// `cd`, the exports, the generated file (a `mktemp` file on the rank's host), `MLX_RANK`,
/// then `exec` of the command. `launcher_cwd` is the directory it changes to without `--cwd`.
pub(crate) fn launch_script(
    plan: &Plan,
    rank: usize,
    launcher_cwd: &str,
    is_local: bool,
) -> String {
    let mut script = String::new();
    if !is_local {
        script += "stty -echo; ";
    }
    script += "pidfile=$(mktemp); ";
    script += "echo $$ > $pidfile; ";
    script += "printf \"%s\\n\" $pidfile; ";
    let dir = match plan.cwd.as_deref() {
        Some(c) if !c.is_empty() => c,
        _ => launcher_cwd,
    };
    let qd = shell_quote(dir);
    script += &format!("if [[ -d {qd} ]]; then ");
    script += &format!("  cd {qd}; ");
    if plan.cwd.is_some() {
        script += "else ";
        script += &format!(" echo 'Failed to change directory to' {qd} >&2; ");
    }
    script += "fi; ";
    for e in &plan.exports {
        let value = e.value.as_deref().map(shell_quote).unwrap_or_default();
        script += &format!("export {}={value}; ", e.key);
    }
    script += "fname=$(mktemp); ";
    script += &format!("echo {} >$fname; ", shell_quote(&plan.file_content));
    script += &format!("export {}=$fname; ", plan.file_var);
    script += &format!("export MLX_RANK={rank}; ");
    let command: Vec<String> = plan.command.iter().map(|c| shell_quote(c)).collect();
    script += &format!("cmd=({}); ", command.join(" "));
    script += "exec \"${cmd[@]}\"";
    script
}

/// The command that starts a remote rank: `ssh -tt -o LogLevel=ERROR HOST SCRIPT`.
///
/// `mlx.launch` passes `LogLevel=QUIET`, which also silences ssh's fatal errors: a host that
/// does not resolve, refuses the connection or the key then ends as "exited with code 255"
/// and nothing else. `ERROR` prints those ("ssh: Could not resolve hostname ...") and still
/// silences ssh's informational lines (`Connection to HOST closed.` after every `-tt`
/// session, `Warning: Permanently added ...`), as `QUIET` does.
pub(crate) fn ssh_command(host: &str, script: &str) -> Vec<String> {
    ["ssh", "-tt", "-o", "LogLevel=ERROR", host, script]
        .map(str::to_owned)
        .to_vec()
}

/// The PID file named by a line a remote rank printed, if the line is one: [`launch_script`]
/// prints the path `mktemp` made before anything else, but a login banner (conda, nvm) may
/// come first, and whatever is taken for the path ends up in [`kill_script`]. So only an
/// absolute path of plain components (`[A-Za-z0-9_.+-]`, no `.` or `..`, at most 4096
/// bytes) whose file name is `mktemp`'s (`tmp.` and letters or digits) is accepted.
pub(crate) fn pidfile_path(line: &str) -> Option<&str> {
    let path = line.trim();
    let rest = path.strip_prefix('/')?;
    if path.len() > 4096 {
        return None;
    }
    let parts: Vec<&str> = rest.split('/').collect();
    let plain = |c: &&str| {
        !c.is_empty()
            && *c != "."
            && *c != ".."
            && c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b))
    };
    let name = parts.last()?.strip_prefix("tmp.")?;
    let mktemp = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric());
    (mktemp && parts.iter().all(plain)).then_some(path)
}

/// The script that kills a remote rank through its PID file: `mlx.launch`'s
/// (`make_kill_script`, with the path quoted: SIGTERM, then it prints 1 when the process was
/// still running, else 0, and removes the PID file), and then what `mlx.launch` does not do:
/// a SIGKILL `grace` later if the process is still there, as a local rank gets. A rank that
/// ignores SIGTERM and the SIGHUP of its ssh session's end would otherwise run on after its
/// job, holding its port and memory. The wait runs in the background on the rank's host, its
/// output closed, so that the script's ssh session ends at once and the kill comes even after
/// the launcher has exited. The process is killed only while it is the one the script found
/// under that PID (its start time unchanged), not a process that took the PID once it ended;
/// its children are left to the SIGHUP of its session's end. Where `sleep` takes no fraction
/// of a second the wait counts whole seconds.
pub(crate) fn kill_script(pidfile: &str, grace: Duration) -> String {
    let pidfile = shell_quote(pidfile);
    let tenths = grace.as_millis().div_ceil(100);
    format!(
        "pid=$(cat {pidfile}); if ps -p $pid >/dev/null; then     \
         start=$(ps -o lstart= -p $pid);     kill $pid;     echo 1;     \
         ( n=0; while [ $n -lt {tenths} ] && kill -0 $pid 2>/dev/null; do sleep 0.1 \
         2>/dev/null || {{ sleep 1; n=$((n+9)); }}; n=$((n+1)); done; if [ -n \"$start\" ] && [ \"$(ps -o lstart= -p $pid)\" = \"$start\" ]; \
         then kill -9 $pid; fi ) </dev/null >/dev/null 2>&1 & \
         else     echo 0; fi; rm {pidfile}"
    )
}

/// The command that runs [`kill_script`] on `host`: `ssh HOST SCRIPT`.
pub(crate) fn kill_command(host: &str, pidfile: &str, grace: Duration) -> Vec<String> {
    vec![
        "ssh".to_owned(),
        host.to_owned(),
        kill_script(pidfile, grace),
    ]
}

/// Python's `shlex.quote`: the word unchanged when it only has `[A-Za-z0-9_@%+=:,./-]`,
/// else in single quotes (a `'` becomes `'"'"'`); `''` for the empty word.
pub(crate) fn shell_quote(word: &str) -> String {
    if word.is_empty() {
        return "''".to_owned();
    }
    let safe = word
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if safe {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\"'\"'"))
    }
}

/// Python's `shlex.join`.
pub(crate) fn shell_join(words: &[String]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::HostList;
    use crate::plan::plan;

    fn run(argv: &[&str]) -> crate::args::Args {
        let full = std::iter::once("nuvec-launch").chain(argv.iter().copied());
        crate::args::parse(full).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn plan_with(argv: &[&str], hostfile: &str) -> Result<Plan, crate::args::UsageError> {
        plan(&run(argv), HostList::parse(hostfile, "h.json")?, (0, 0))
    }

    #[test]
    fn only_a_plain_mktemp_path_is_taken_for_a_remote_ranks_pid_file() {
        for ok in [
            "/tmp/tmp.Ab12cD",
            "/var/folders/x_/a-b+c/T/tmp.XyZ09",
            " /tmp/tmp.q \r\n",
        ] {
            assert_eq!(pidfile_path(ok), Some(ok.trim()), "{ok:?}");
        }
        for bad in [
            "conda: /tmp/victim activated",
            "Welcome to Ubuntu",
            "tmp/tmp.abc",
            "/etc/motd",
            "/tmp/tmp.",
            "/tmp/tmp.a b",
            "/tmp/../etc/tmp.abc",
            "/tmp//tmp.abc",
            "/tmp/tmp.abc;rm",
            "/tmp/$(x)/tmp.abc",
            "",
        ] {
            assert_eq!(pidfile_path(bad), None, "{bad:?}");
        }
        assert_eq!(pidfile_path(&format!("/{}/tmp.a", "d".repeat(5000))), None);
        // A path that needs quoting would be quoted in the kill script.
        assert!(kill_script("/tmp/a b", Duration::from_secs(5)).contains("rm '/tmp/a b'"));
    }

    #[test]
    fn shell_quoting_is_pythons_shlex() {
        assert_eq!(shell_quote(""), "''");
        assert_eq!(
            shell_quote("a-b_c/d.e:f,g=h+i@j%k"),
            "a-b_c/d.e:f,g=h+i@j%k"
        );
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\"'\"'s'");
        assert_eq!(shell_quote("é"), "'é'");
        assert_eq!(
            shell_join(&strings(&["sh", "-c", "echo $X"])),
            "sh -c 'echo $X'"
        );
    }

    /// The expected strings were produced by `mlx.launch` 0.32.4's own
    /// `RemoteProcess.make_launch_script` (run from `/tmp`) and `shlex.quote`.
    #[test]
    fn the_remote_script_and_ssh_command_are_mlx_launchs() {
        let args = run(&[
            "--env",
            "FOO=bar",
            "--env",
            "A=it's",
            "--env",
            "bad-key=1",
            "--env",
            "EMPTY",
            "--env",
            "COLUMNS=80",
            "-n",
            "2",
            "--",
            "python3",
            "train.py",
            "--lr",
            "1e-3",
            "a b",
            "",
        ]);
        let mut p = plan(
            &args,
            HostList::from_list("10.0.0.1,10.0.0.2", 1).unwrap(),
            (0, 0),
        )
        .unwrap();
        p.file_content = r#"[["10.0.0.1:32323"], ["10.0.0.2:32324"]]"#.to_owned();
        let script = launch_script(&p, 2, "/tmp", false);
        assert_eq!(
            script,
            "stty -echo; pidfile=$(mktemp); echo $$ > $pidfile; printf \"%s\\n\" $pidfile; \
             if [[ -d /tmp ]]; then   cd /tmp; fi; export FOO=bar; export A='it'\"'\"'s'; \
             export EMPTY=; export COLUMNS=80; fname=$(mktemp); \
             echo '[[\"10.0.0.1:32323\"], [\"10.0.0.2:32324\"]]' >$fname; \
             export MLX_HOSTFILE=$fname; export MLX_RANK=2; \
             cmd=(python3 train.py --lr 1e-3 'a b' ''); exec \"${cmd[@]}\""
        );
        let ssh = ssh_command("mac-2.local", &script);
        assert_eq!(
            ssh[..5],
            strings(&["ssh", "-tt", "-o", "LogLevel=ERROR", "mac-2.local"])
        );
        assert_eq!(ssh[5], script);
        assert_eq!(
            shell_join(&ssh),
            r#"ssh -tt -o LogLevel=ERROR mac-2.local 'stty -echo; pidfile=$(mktemp); echo $$ > $pidfile; printf "%s\n" $pidfile; if [[ -d /tmp ]]; then   cd /tmp; fi; export FOO=bar; export A='"'"'it'"'"'"'"'"'"'"'"'s'"'"'; export EMPTY=; export COLUMNS=80; fname=$(mktemp); echo '"'"'[["10.0.0.1:32323"], ["10.0.0.2:32324"]]'"'"' >$fname; export MLX_HOSTFILE=$fname; export MLX_RANK=2; cmd=(python3 train.py --lr 1e-3 '"'"'a b'"'"' '"'"''"'"'); exec "${cmd[@]}"'"#
        );
    }

    #[test]
    fn the_jaccl_remote_script_with_cwd_and_python_is_mlx_launchs() {
        let hf = r#"[{"ssh": "m1", "ips": ["10.0.0.1"], "rdma": [null, "rdma_en2"]},
                     {"ssh": "m2", "ips": ["10.0.0.2"], "rdma": ["rdma_en2", null]}]"#;
        let p = plan_with(
            &[
                "--backend",
                "jaccl-ring",
                "--cwd",
                "/Users/me/my proj",
                "--python",
                "/usr/bin/python3",
                "train.py",
            ],
            hf,
        )
        .unwrap();
        assert_eq!(
            launch_script(&p, 0, "/ignored", false),
            "stty -echo; pidfile=$(mktemp); echo $$ > $pidfile; printf \"%s\\n\" $pidfile; \
             if [[ -d '/Users/me/my proj' ]]; then   cd '/Users/me/my proj'; else  echo \
             'Failed to change directory to' '/Users/me/my proj' >&2; fi; \
             export MLX_JACCL_COORDINATOR=10.0.0.1:32323; export MLX_JACCL_RING=1; \
             fname=$(mktemp); echo '[[null, \"rdma_en2\"], [\"rdma_en2\", null]]' >$fname; \
             export MLX_IBV_DEVICES=$fname; export MLX_RANK=0; \
             cmd=(/usr/bin/python3 train.py); exec \"${cmd[@]}\""
        );
        let local = launch_script(&p, 1, "/x", true);
        assert!(local.starts_with("pidfile=$(mktemp); "), "{local}");
    }

    #[test]
    fn the_kill_script_is_mlx_launchs_with_a_sigkill_after_the_grace() {
        let script = kill_script("/tmp/tmp.abc", Duration::from_secs(5));
        assert_eq!(
            script,
            "pid=$(cat /tmp/tmp.abc); if ps -p $pid >/dev/null; then     \
             start=$(ps -o lstart= -p $pid);     kill $pid;     echo 1;     \
             ( n=0; while [ $n -lt 50 ] && kill -0 $pid 2>/dev/null; do sleep 0.1 \
             2>/dev/null || { sleep 1; n=$((n+9)); }; n=$((n+1)); done; if [ -n \"$start\" ] && [ \"$(ps -o lstart= -p $pid)\" = \"$start\" ]; \
             then kill -9 $pid; fi ) </dev/null >/dev/null 2>&1 & \
             else     echo 0; fi; rm /tmp/tmp.abc"
        );
        // mlx.launch's script, its SIGTERM, answer and removal in the same words.
        for part in [
            "pid=$(cat /tmp/tmp.abc); if ps -p $pid >/dev/null; then",
            "kill $pid;     echo 1;",
            "else     echo 0; fi; rm /tmp/tmp.abc",
        ] {
            assert!(script.contains(part), "{part}");
        }
        assert_eq!(
            kill_command("h", "/p", Duration::from_secs(5))[..2],
            strings(&["ssh", "h"])
        );
    }

    #[test]
    fn the_kill_script_kills_a_process_that_ignores_sigterm_and_leaves_one_that_exits() {
        let dir = std::env::temp_dir().join(format!("nuvec-kill-script-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let run = |pid: u32| {
            let pidfile = dir.join("pid");
            std::fs::write(&pidfile, format!("{pid}\n")).expect("the PID file");
            let script = kill_script(&pidfile.display().to_string(), Duration::from_millis(300));
            let out = std::process::Command::new("sh")
                .args(["-c", &script])
                .output()
                .expect("sh runs the script");
            assert!(!pidfile.exists(), "the PID file is removed");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        // Ignores SIGTERM (an ignored signal stays ignored across exec), once it says so.
        let mut stubborn = std::process::Command::new("sh")
            .args(["-c", "trap '' TERM HUP; echo ready; exec sleep 30"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sleep runs");
        let mut ready = String::new();
        let said = stubborn
            .stdout
            .take()
            .map(|out| std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut ready));
        assert!(
            matches!(said, Some(Ok(_))) && ready.trim() == "ready",
            "{said:?} {ready:?}"
        );
        assert_eq!(run(stubborn.id()), "1");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = stubborn.try_wait().expect("wait") {
                break Some(status);
            }
            if std::time::Instant::now() >= deadline {
                break None;
            }
            // Nothing to wake on but the child's end, which `try_wait` polls.
            std::thread::sleep(Duration::from_millis(20));
        };
        let Some(status) = status else {
            let _ = stubborn.kill();
            let _ = stubborn.wait();
            panic!("a process that ignores SIGTERM outlived the grace by 10 s");
        };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status:?}");
        // A process already gone: 0, and nothing is killed.
        let mut gone = std::process::Command::new("true")
            .spawn()
            .expect("true runs");
        let pid = gone.id();
        gone.wait().expect("true exits");
        assert_eq!(run(pid), "0");
        std::fs::remove_dir_all(&dir).expect("cleaned up");
    }
}
