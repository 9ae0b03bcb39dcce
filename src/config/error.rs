//! What can be wrong with a job's configuration, as values: [`ConfigError`] and the reasons it
//! carries ([`RankProblem`], [`AddressProblem`], [`HostfileProblem`]).
//!
//! Each variant holds what a user needs to act on it, as fields a program can `match` on: the
//! variable and the value seen, the file and the rank, row or address index in it, and what
//! was expected. The messages (`Display`) say the same in a sentence; the crate's
//! [`Error::Config`](crate::Error::Config) prefixes them with `distributed: `. The key's value is
//! never held, so no message can show it.
//!
//! This is the lowest layer of the crate's errors: it names no fabric, transport or backend
//! type, so `crate::error` can wrap it.

use std::ffi::OsString;

/// A configuration error: a launch variable, a file, an address or an option is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A variable that must be text is not UTF-8.
    #[error("{var}={value:?} is not valid UTF-8{}", Expected(expected))]
    NotUtf8 {
        /// The variable.
        var: String,
        /// Its value, as read.
        value: OsString,
        /// What it must be, when the message says it.
        expected: Option<String>,
    },
    /// A variable is set, but one it needs beside it is not (`MLX_HOSTFILE` without
    /// `MLX_RANK`, a JACCL device file without a rank …).
    #[error("{set} is set (to {shown}) but {}; {hint}", Missing(missing))]
    MissingVariable {
        /// The variable that is set.
        set: String,
        /// Its value as shown (a path, or the quoted value).
        shown: String,
        /// The variables of which one is needed and none is set.
        missing: Vec<String>,
        /// What to set it to.
        hint: String,
    },
    /// A variable that names a file is set but empty.
    #[error("{var} is set but empty; it must be {expected}")]
    EmptyVariable {
        /// The variable.
        var: String,
        /// What it must hold.
        expected: String,
    },
    /// A variable's value is not one it may take.
    #[error("{var}={value:?} {problem}")]
    BadValue {
        /// The variable.
        var: String,
        /// The value seen.
        value: String,
        /// What is wrong with it, and what was expected.
        problem: String,
    },
    /// A rank variable (`MLX_RANK`, `JACCL_RANK`) is not a non-negative decimal integer.
    #[error("{var}={value:?} {problem}")]
    BadRank {
        /// The variable.
        var: String,
        /// The value seen.
        value: OsString,
        /// What is wrong with it.
        problem: RankProblem,
    },
    /// A rank is not below the number of ranks the file lists.
    #[error("{}", RankOutOfRange(self))]
    RankOutOfRange {
        /// The variable that gave the rank.
        var: String,
        /// The rank.
        rank: usize,
        /// The number of ranks (hostfile entries, device-file rows).
        size: usize,
        /// Which kind of file.
        kind: FileKind,
        /// The file, as named in messages.
        file: String,
    },
    /// A file cannot be read.
    #[error("{kind} {file}: cannot read the file: {reason}")]
    Unreadable {
        /// Which kind of file.
        kind: FileKind,
        /// The file, as named in messages.
        file: String,
        /// The kind of the I/O error.
        io: std::io::ErrorKind,
        /// The I/O error's message.
        reason: String,
    },
    /// A file is not UTF-8 text.
    #[error("{kind} {file}: the file is not UTF-8 text (invalid byte at offset {offset})")]
    NotUtf8File {
        /// Which kind of file.
        kind: FileKind,
        /// The file, as named in messages.
        file: String,
        /// The offset of the first invalid byte.
        offset: usize,
    },
    /// The ring hostfile's content is wrong.
    #[error("hostfile {file}: {problem}")]
    Hostfile {
        /// The file, as named in messages (its path).
        file: String,
        /// What is wrong, and where.
        problem: HostfileProblem,
    },
    /// An address is not a valid `"host:port"`, or does not resolve.
    #[error("address {address:?}: {problem}")]
    BadAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        problem: AddressProblem,
    },
    /// The key variable is not UTF-8 (the value is never held).
    #[error("{var} is not valid UTF-8 (the value is not shown)")]
    KeyNotUtf8 {
        /// The variable.
        var: String,
    },
    /// The pre-shared key is too short (the value is never held).
    #[error("{}", KeyTooShort(self))]
    KeyTooShort {
        /// The variable it came from, if any ([`Options::key`](crate::Options::key) has none).
        var: Option<String>,
        /// Its length.
        bytes: usize,
        /// The shortest key accepted.
        min: usize,
    },
    /// No backend of that name.
    #[error("no backend {name:?} (any, ring or jaccl)")]
    UnknownBackend {
        /// The name asked for.
        name: String,
    },
    /// A backend of MLX that this crate does not provide (`mpi`, `nccl`).
    #[error("the {name} backend of MLX is not provided by nuvec (backends: any, ring or jaccl)")]
    BackendNotProvided {
        /// The name asked for.
        name: String,
    },
    /// A strict initialisation found no backend's launch environment: the variables a
    /// launcher sets are missing, so the message says how to start a job.
    #[error(
        "no {}backend could be initialised: {} not set; start every rank through a launcher, \
         e.g. `nuvec-launch -n 4 -- ./prog` or `mlx.launch -n 4 ./prog`, which sets them",
        if backend == "any" { String::new() } else { format!("{backend} ") },
        missing.join(", ")
    )]
    NoBackend {
        /// The backend asked for (MLX's name).
        backend: String,
        /// Each backend's variables, none of which is set.
        missing: Vec<String>,
    },
    /// A ring's rank is not below its size.
    #[error("rank {rank} is out of range for a ring of {size} ranks")]
    RankOutsideRing {
        /// The rank.
        rank: usize,
        /// The number of ranks.
        size: usize,
    },
    /// A ring's rank lists no address.
    #[error("rank {rank} has no address")]
    NoAddress {
        /// The rank.
        rank: usize,
    },
    /// A ring's ranks list different numbers of addresses.
    #[error(
        "rank {rank} lists {count} addresses but rank 0 lists {first}: every rank needs the same number"
    )]
    UnevenRing {
        /// The first rank whose count differs.
        rank: usize,
        /// Its number of addresses.
        count: usize,
        /// Rank 0's.
        first: usize,
    },
    /// JACCL's configuration: the error within, prefixed `jaccl: `.
    #[error("jaccl: {0}")]
    Jaccl(Box<ConfigError>),
    /// JACCL's device file's content is wrong (row and entry are in the problem).
    #[error("device file {file}: {problem}")]
    DeviceFile {
        /// The file, as named in messages (path and variable).
        file: String,
        /// What is wrong, and where.
        problem: String,
    },
    /// JACCL's device matrix cannot make the job: not square, neither mesh nor ring, too large.
    #[error("{problem}")]
    DeviceMatrix {
        /// What is wrong.
        problem: String,
    },
    /// JACCL has no coordinator address.
    #[error(
        "no coordinator: set {} to the \"ip:port\" where rank 0 listens for the side channel",
        vars.join(" or ")
    )]
    NoCoordinator {
        /// The variables that would give it.
        vars: Vec<String>,
    },
    /// JACCL's coordinator address is not a valid `"host:port"`.
    #[error("coordinator {address:?} is not the \"ip:port\" where rank 0 listens: {problem}")]
    BadCoordinator {
        /// The address.
        address: String,
        /// What is wrong with it.
        problem: AddressProblem,
    },
    /// The side channel's coordinator cannot be used: the error within.
    #[error("side channel coordinator: {0}")]
    Coordinator(Box<ConfigError>),
    /// A JACCL `Destination` record of the wrong length.
    #[error("a Destination record is exactly {expected} bytes (MLX's struct layout), got {got}")]
    RecordLength {
        /// The record's size.
        expected: usize,
        /// The bytes given.
        got: usize,
    },
    /// A rank's queue pairs would pass one of Apple's limits on a Thunderbolt device (queue
    /// pairs or memory regions per device, work requests per queue); found before any queue
    /// pair is created.
    #[error("rdma: rank {rank}: {problem}, before any queue pair was created")]
    AppleLimit {
        /// The rank whose configuration passes the limit.
        rank: usize,
        /// Which limit, by how much, and what would fit.
        problem: String,
    },
    /// The RDMA fabric cannot run here: no verbs library, a function or a device missing.
    #[error("{problem}")]
    Rdma {
        /// Why, and what to do instead.
        problem: String,
    },
}

/// What is wrong with a rank's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RankProblem {
    /// Not UTF-8.
    #[error("is not valid UTF-8; it must be a non-negative integer")]
    NotUtf8,
    /// Empty.
    #[error("is empty; it must be a non-negative integer (the rank, from 0)")]
    Empty,
    /// A negative integer.
    #[error("is negative; ranks count from 0")]
    Negative,
    /// Not a decimal integer (a sign, spaces, a fraction, text).
    #[error("is not a non-negative integer (the rank, from 0)")]
    NotAnInteger,
    /// Beyond `usize`.
    #[error("is too large for a rank")]
    TooLarge,
}

/// What is wrong with a `"host:port"` address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressProblem {
    /// The address is empty.
    #[error("the address is empty; expected \"host:port\", e.g. \"10.0.0.1:5000\"")]
    Empty,
    /// It holds whitespace or a control character.
    #[error("the address contains whitespace or a control character")]
    Whitespace,
    /// A `[` without its `]`.
    #[error("'[' without a closing ']'; write an IPv6 address as \"[::1]:5000\"")]
    UnclosedBracket,
    /// Brackets around something that is not an IPv6 address.
    #[error("[{literal}] is not an IPv6 address (brackets are only for IPv6 literals)")]
    NotIpv6 {
        /// What the brackets hold.
        literal: String,
    },
    /// No `:port` after a bracketed literal.
    #[error("no port after [{literal}]; expected \"[{literal}]:port\"")]
    NoPortAfterBracket {
        /// The IPv6 literal.
        literal: String,
    },
    /// No `:` at all.
    #[error("no port; expected \"host:port\", e.g. \"10.0.0.1:5000\"")]
    NoPort,
    /// More than one `:` (an IPv6 literal without brackets).
    #[error("more than one ':'; write an IPv6 address in brackets, e.g. \"[::1]:5000\"")]
    UnbracketedIpv6,
    /// Nothing before the `:`.
    #[error("the host before the ':' is empty")]
    EmptyHost,
    /// Nothing after the `:`.
    #[error("the port after the ':' is empty")]
    EmptyPort,
    /// The port is not decimal digits.
    #[error("the port {port:?} is not a number")]
    PortNotANumber {
        /// The port as given.
        port: String,
    },
    /// Port 0.
    #[error("port 0 is not allowed; the ring needs a fixed port from 1 to 65535")]
    PortZero,
    /// A port above 65535.
    #[error("port {port} is out of range (1 to 65535)")]
    PortOutOfRange {
        /// The port as given.
        port: String,
    },
    /// The system cannot resolve the host.
    #[error("cannot resolve the host {host:?}: {reason}")]
    Unresolvable {
        /// The host.
        host: String,
        /// The resolver's message.
        reason: String,
    },
    /// The host resolves to no address.
    #[error("the host {host:?} resolves to no address")]
    ResolvesToNothing {
        /// The host.
        host: String,
    },
}

/// What is wrong with a ring hostfile's content, and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostfileProblem {
    /// The file is empty (or whitespace).
    #[error(
        "the file is empty; expected a JSON list with one entry per rank, each a list of \
         \"host:port\" strings (mlx.launch writes an empty hostfile when there is only one host)"
    )]
    Empty,
    /// Not JSON.
    #[error("not valid JSON: {reason}")]
    NotJson {
        /// The parser's message (with the line and column).
        reason: String,
        /// The line of the error, from 1.
        line: usize,
        /// The column of the error, from 1.
        column: usize,
    },
    /// JSON, but not a list.
    #[error(
        "expected a JSON list with one entry per rank, each a list of \"host:port\" strings, \
         found {found}"
    )]
    NotAList {
        /// What was found ("an object", "null" …).
        found: &'static str,
    },
    /// An empty list.
    #[error(
        "the list of ranks is empty; it needs one entry per rank, each a list of \"host:port\" \
         strings"
    )]
    NoRanks,
    /// A rank's entry is not a list.
    #[error("rank {rank}: expected a list of \"host:port\" strings, found {found}")]
    EntryNotAList {
        /// The rank.
        rank: usize,
        /// What was found.
        found: &'static str,
    },
    /// A rank lists no address.
    #[error(
        "rank {rank}: the list of addresses is empty; every rank needs at least one \"host:port\""
    )]
    NoAddresses {
        /// The rank.
        rank: usize,
    },
    /// An address is not a string.
    #[error("rank {rank}, address {index}: expected a \"host:port\" string, found {found}")]
    AddressNotAString {
        /// The rank.
        rank: usize,
        /// The address's index in the rank's list (its connection).
        index: usize,
        /// What was found.
        found: &'static str,
    },
    /// An address is not a valid `"host:port"`.
    #[error("rank {rank}, address {index} {address:?}: {problem}")]
    BadAddress {
        /// The rank.
        rank: usize,
        /// The address's index in the rank's list (its connection).
        index: usize,
        /// The address.
        address: String,
        /// What is wrong with it.
        problem: AddressProblem,
    },
    /// A rank lists a different number of addresses than rank 0.
    #[error(
        "rank {rank} lists {count} address{} but rank 0 lists {first}; every rank needs the same \
         number of addresses (one per connection)",
        if *count == 1 { "" } else { "es" }
    )]
    UnevenRanks {
        /// The first rank whose count differs.
        rank: usize,
        /// Its number of addresses.
        count: usize,
        /// Rank 0's.
        first: usize,
    },
}

/// Which configuration file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FileKind {
    /// MLX's ring hostfile (`MLX_HOSTFILE`).
    Hostfile,
    /// JACCL's device file (`MLX_IBV_DEVICES`, `JACCL_IBV_DEVICES`).
    DeviceFile,
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileKind::Hostfile => "hostfile",
            FileKind::DeviceFile => "device file",
        })
    }
}

/// "; it must be …", when there is something to say.
struct Expected<'a>(&'a Option<String>);

impl std::fmt::Display for Expected<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(expected) => write!(f, "; it must be {expected}"),
            None => Ok(()),
        }
    }
}

/// "`A` is not" or "neither `A` nor `B` is".
struct Missing<'a>(&'a [String]);

impl std::fmt::Display for Missing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            [one] => write!(f, "{one} is not"),
            [first, rest @ ..] => {
                write!(f, "neither {first}")?;
                for other in rest {
                    write!(f, " nor {other}")?;
                }
                f.write_str(" is")
            }
            [] => f.write_str("another variable is not"),
        }
    }
}

/// The message of [`ConfigError::RankOutOfRange`].
struct RankOutOfRange<'a>(&'a ConfigError);

impl std::fmt::Display for RankOutOfRange<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ConfigError::RankOutOfRange {
            var,
            rank,
            size,
            kind,
            file,
        } = self.0
        else {
            return Ok(());
        };
        write!(f, "{var}={rank} is out of range: ")?;
        let valid = match size {
            0 => "no rank is valid".to_owned(),
            1 => "the only valid rank is 0".to_owned(),
            n => format!("valid ranks are 0 to {}", n - 1),
        };
        match kind {
            FileKind::Hostfile => write!(
                f,
                "the hostfile {file} lists {size} rank{}, so {valid}",
                if *size == 1 { "" } else { "s" }
            ),
            FileKind::DeviceFile => write!(
                f,
                "the device file {file} has {size} row{}, so {valid}",
                if *size == 1 { "" } else { "s" }
            ),
        }
    }
}

/// The message of [`ConfigError::KeyTooShort`].
struct KeyTooShort<'a>(&'a ConfigError);

impl std::fmt::Display for KeyTooShort<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ConfigError::KeyTooShort { var, bytes, min } = self.0 else {
            return Ok(());
        };
        let s = if *bytes == 1 { "" } else { "s" };
        match var {
            Some(var) => write!(
                f,
                "{var} is too short: {bytes} byte{s}, it needs at least {min} (the value is not \
                 shown)"
            ),
            None => write!(
                f,
                "the key is {bytes} byte{s}; it needs at least {min} (the value is not shown)"
            ),
        }
    }
}

impl ConfigError {
    /// This error as one of JACCL's configuration (its message prefixed `jaccl: `).
    pub(crate) fn jaccl(self) -> ConfigError {
        ConfigError::Jaccl(Box::new(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_variable_names_each_alternative() {
        let e = ConfigError::MissingVariable {
            set: "A".into(),
            shown: "x".into(),
            missing: vec!["B".into(), "C".into()],
            hint: "set one".into(),
        };
        assert_eq!(
            e.to_string(),
            "A is set (to x) but neither B nor C is; set one"
        );
    }

    #[test]
    fn a_rank_beyond_a_device_file_of_one_row_says_only_zero_is_valid() {
        let e = ConfigError::RankOutOfRange {
            var: "MLX_RANK".into(),
            rank: 3,
            size: 1,
            kind: FileKind::DeviceFile,
            file: "d.json".into(),
        };
        assert_eq!(
            e.to_string(),
            "MLX_RANK=3 is out of range: the device file d.json has 1 row, so the only valid \
             rank is 0"
        );
    }
}
