//! Target `jaccl_env`: `Config::from_vars` over a fuzzed environment and device file.

use std::ffi::OsString;
use std::sync::atomic::{AtomicUsize, Ordering};

use nuvec_distributed::hostfile;
use nuvec_distributed::jaccl::{Config, parse_devices};

use super::jaccl_devices::{check_config, config_message};

/// The variables `Config::from_vars` may read.
const JACCL_VARS: [&str; 8] = [
    "JACCL_RANK",
    "MLX_RANK",
    "JACCL_IBV_DEVICES",
    "MLX_IBV_DEVICES",
    "JACCL_COORDINATOR",
    "MLX_JACCL_COORDINATOR",
    "JACCL_RING",
    "MLX_JACCL_RING",
];

/// Raw bytes as an environment value (on Unix any bytes but NUL; elsewhere lossy UTF-8).
fn os_value(bytes: Vec<u8>) -> OsString {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        OsString::from_vec(bytes)
    }
    #[cfg(not(unix))]
    {
        OsString::from(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Whether `message` names the variable `var` (not only as the tail of a longer name, as
/// `JACCL_COORDINATOR` is of `MLX_JACCL_COORDINATOR`).
fn names_var(message: &str, var: &str) -> bool {
    message.match_indices(var).any(|(at, _)| {
        !message[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// A file removed when dropped.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `Config::from_vars` over a fuzzed environment and device file. The input is text lines
/// `NAME=VALUE` (the first line of a name wins; a line without `=` sets the name to the empty
/// value), then optionally a line `--` after which the rest of the input is the device file's
/// bytes, written to a temporary file of this process. In a device variable every `@` stands
/// for that file's path; any other non-empty value becomes a path in a directory that does not
/// exist, so the fuzzer never makes the library read an arbitrary file.
///
/// Properties: only the eight JACCL and MLX variables are looked up; the result is exactly
/// what the documented rules give, restated here: no device variable is `Ok(None)`; an empty
/// device path, a missing rank, a rank that is not a decimal `usize`, a coordinator that is
/// not UTF-8 `host:port`, an unreadable, non-UTF-8 or malformed device file, or a rank not
/// below its row count is a `jaccl:` configuration error naming the responsible variable;
/// otherwise the configuration has the rank, `parse_devices` of the file, the coordinator and
/// the ring preference (either ring variable present) given. An accepted configuration then
/// goes through [`check_config`].
pub(crate) fn jaccl_env(data: &[u8]) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir();
    let tag = format!(
        "nuvec-fuzz-jaccl-env-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let file_path = dir.join(format!("{tag}.json"));
    let absent_dir = dir.join(format!("{tag}.absent"));

    let mut vars: Vec<(String, Vec<u8>)> = Vec::new();
    let mut file: Option<&[u8]> = None;
    let mut rest = data;
    while !rest.is_empty() {
        let (line, next) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        if line == b"--" {
            file = Some(next);
            break;
        }
        let (name, value) = match line.iter().position(|&b| b == b'=') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line, &line[line.len()..]),
        };
        vars.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
        rest = next;
    }
    let _file = file.map(|bytes| {
        std::fs::write(&file_path, bytes).expect("writing the device file");
        TempFile(file_path.clone())
    });
    let path_bytes = file_path.as_os_str().as_encoded_bytes().to_vec();
    let absent_bytes = absent_dir.as_os_str().as_encoded_bytes().to_vec();
    let env: Vec<(String, OsString)> = vars
        .into_iter()
        .map(|(name, value)| {
            let value = if !name.ends_with("_IBV_DEVICES") || value.is_empty() {
                value
            } else if value.contains(&b'@') {
                let mut v = Vec::new();
                for &b in &value {
                    if b == b'@' {
                        v.extend_from_slice(&path_bytes);
                    } else {
                        v.push(b);
                    }
                }
                v
            } else {
                let mut v = absent_bytes.clone();
                v.push(b'/');
                v.extend_from_slice(&value);
                v
            };
            (name, os_value(value))
        })
        .collect();
    let lookup = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());

    let asked = std::cell::RefCell::new(Vec::<String>::new());
    let result = Config::from_vars(|name| {
        asked.borrow_mut().push(name.to_owned());
        lookup(name)
    });
    for name in asked.borrow().iter() {
        assert!(
            JACCL_VARS.contains(&name.as_str()),
            "from_vars looked up {name:?}"
        );
    }

    // The rules, restated.
    let first =
        |names: [&'static str; 2]| names.into_iter().find_map(|n| lookup(n).map(|v| (n, v)));
    let expected: Result<Option<Config>, &'static str> = (|| {
        let Some((devices_var, path)) = first(["JACCL_IBV_DEVICES", "MLX_IBV_DEVICES"]) else {
            return Ok(None);
        };
        if path.is_empty() {
            return Err(devices_var);
        }
        let Some((rank_var, rank)) = first(["JACCL_RANK", "MLX_RANK"]) else {
            return Err(devices_var);
        };
        let rank = rank
            .to_str()
            .filter(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|r| r.parse::<usize>().ok())
            .ok_or(rank_var)?;
        let coordinator = match first(["JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR"]) {
            None => None,
            Some((var, value)) => {
                let value = value.to_str().ok_or(var)?;
                hostfile::split_address(value).map_err(|_| var)?;
                Some(value.to_owned())
            }
        };
        let prefer = first(["JACCL_RING", "MLX_JACCL_RING"]).is_some();
        let bytes = std::fs::read(&path).map_err(|_| devices_var)?;
        let text = String::from_utf8(bytes).map_err(|_| devices_var)?;
        let devices = parse_devices(&text, "the model").map_err(|_| devices_var)?;
        if rank >= devices.len() {
            return Err(rank_var);
        }
        let mut c = Config::new(rank, devices).prefer_ring(prefer);
        if let Some(a) = coordinator {
            c = c.coordinator(&a);
        }
        Ok(Some(c))
    })();

    match expected {
        Ok(want) => match result {
            Ok(got) => {
                assert_eq!(got, want, "from_vars of {env:?}");
                if let Some(c) = got {
                    check_config(&c);
                }
            }
            Err(e) => panic!("from_vars refused {env:?}: {e}"),
        },
        Err(var) => {
            let message = config_message(result, "from_vars");
            assert!(
                names_var(&message, var),
                "the error does not name {var}: {message} (environment {env:?})"
            );
        }
    }
}
