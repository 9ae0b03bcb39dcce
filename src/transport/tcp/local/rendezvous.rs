//! How two ranks agree that a TCP connection between them becomes a local link, without a
//! byte on that connection that MLX's ring would not send.
//!
//! 1. The acceptor, next to each TCP listener, binds a Unix socket in the abstract namespace
//!    named after the listener's address ([`Offers::bind`]). Abstract names belong to a
//!    network namespace of one kernel and vanish with their socket, so only a process on this
//!    machine and in this namespace finds one, and none is ever left behind. MLX's ranks bind
//!    none.
//! 2. The opener, before it connects over TCP, binds its TCP socket (to learn its port) and
//!    connects to the name of the address it is about to connect to ([`propose`]). If that
//!    works, it sends a hello (a magic, its TCP port, the queue size) with the link's memory
//!    file attached (`SCM_RIGHTS`), and only then connects over TCP. So when the acceptor
//!    accepts the TCP connection, the hello for it is already queued on its Unix listener:
//!    what it finds there is final, with no wait and no race.
//! 3. When the acceptor's setup keeps a TCP connection, the acceptor takes the hellos waiting
//!    on its listener ([`Offers::answer`]), keeps the one whose port is its TCP peer's (others
//!    are from attempts the setup dropped), checks that the sender runs as the same user and
//!    that the memory file's size is sealed, maps it, and answers one byte, 1. Then it closes
//!    that Unix listener (its link keeps one connection), which resets every connection
//!    still in its backlog. After its own setup the opener waits for that byte
//!    ([`Proposal::confirm`]), bounded by the setup's deadline: it comes, or the connection
//!    ends, as soon as the acceptor has accepted, whatever the acceptor's other connections
//!    do. The opener, too, takes the name only from a process of its user.
//!
//! Anything unexpected (no name, a full backlog, a malformed hello, another user, strangers'
//! connections ahead of the hello, a reset before the answer) leaves the link on TCP, where it
//! works as before; only an opener whose acceptor neither answered nor closed the connection
//! by the deadline fails, naming the peer.

use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::time::Instant;

use super::linux::{End, LocalLink};
use super::memory::Mapping;
use super::{CAPACITY, MAPPING};

/// The first bytes of a hello: the protocol and its version.
const MAGIC: &[u8; 8] = b"nuvecLL1";

/// A hello: the magic, the opener's TCP port (u16 LE), the queue capacity (u32 LE).
const HELLO: usize = MAGIC.len() + 2 + 4;

/// The abstract name of the Unix socket beside a TCP listener on `addr`.
fn name(addr: SocketAddr) -> String {
    format!("nuvec-distributed/local-link/{addr}")
}

/// The hello of an opener whose TCP socket has `port`.
fn hello(port: u16) -> [u8; HELLO] {
    let mut h = [0u8; HELLO];
    h[..8].copy_from_slice(MAGIC);
    h[8..10].copy_from_slice(&port.to_le_bytes());
    h[10..].copy_from_slice(&(CAPACITY as u32).to_le_bytes());
    h
}

/// The port a hello names, if it is one of this version with this crate's queue size.
fn port_of(h: &[u8]) -> Option<u16> {
    if h.len() != HELLO || &h[..8] != MAGIC || h[10..] != (CAPACITY as u32).to_le_bytes() {
        return None;
    }
    Some(u16::from_le_bytes([h[8], h[9]]))
}

/// The most hellos one answer takes: the opener's own attempts (one per connection the setup
/// tried) are a handful.
const MAX_HELLOS: usize = 64;

/// The acceptor's Unix listeners, one per TCP listener (`None` where none could be bound).
pub(crate) struct Offers {
    listeners: Vec<Option<UnixListener>>,
}

impl Offers {
    /// Binds the name of every TCP listener address in `addrs` (listener c's at index c;
    /// `None`: that listener offers nothing).
    pub(crate) fn bind(addrs: &[Option<SocketAddr>]) -> Self {
        let listeners = addrs
            .iter()
            .map(|&addr| {
                let addr = addr?;
                let unix = UnixAddr::from_abstract_name(name(addr)).ok()?;
                let listener = UnixListener::bind_addr(&unix).ok()?;
                listener.set_nonblocking(true).ok()?;
                Some(listener)
            })
            .collect();
        Self { listeners }
    }

    /// The local link of the TCP connection accepted on listener `link` from `peer`, if its
    /// opener proposed one: takes the hellos waiting there (at most [`MAX_HELLOS`], so that a
    /// process connecting without end cannot hold the setup here), then closes the listener.
    ///
    /// A listener serves the one connection its link keeps, so nothing it could still accept
    /// is wanted: closing it resets every connection left in its backlog (the opener's stale
    /// proposals, a stranger's connections, or the proposal itself when more than
    /// [`MAX_HELLOS`] strangers came first), and each of their openers stays on TCP at once
    /// instead of waiting for the end of this rank's setup.
    pub(crate) fn answer(&mut self, link: usize, peer: SocketAddr) -> Option<LocalLink> {
        let listener = self.listeners.get_mut(link)?.take()?;
        for _ in 0..MAX_HELLOS {
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let Some((port, fd)) = take_hello(&stream) else {
                continue;
            };
            if port != peer.port() {
                continue;
            }
            let Ok(mapping) = Mapping::open(&fd, MAPPING) else {
                continue;
            };
            let Ok(local) = LocalLink::new(mapping, End::Acceptor) else {
                continue;
            };
            // Without SIGPIPE: the opener of a hello may have given up and closed.
            let sent = socket2::SockRef::from(&stream).send_with_flags(&[1], libc::MSG_NOSIGNAL);
            if matches!(sent, Ok(1)) {
                return Some(local);
            }
        }
        None
    }
}

/// The hello waiting on an accepted Unix connection and the memory file with it, if the sender
/// runs as this process's user and the hello is well formed. Never waits: the hello was sent
/// before the TCP connection it names.
fn take_hello(stream: &UnixStream) -> Option<(u16, OwnedFd)> {
    if !same_user(stream) {
        return None;
    }
    let mut buf = [0u8; HELLO + 1];
    let (n, fd) = recv_with_fd(stream, &mut buf).ok()?;
    let port = port_of(&buf[..n])?;
    Some((port, fd?))
}

/// Whether the process at the other end of `stream` runs as this process's user: anyone may
/// bind or connect to an abstract name, and a link's memory must be shared with no one else.
fn same_user(stream: &UnixStream) -> bool {
    // SAFETY: `geteuid` has no preconditions.
    let uid = unsafe { libc::geteuid() };
    peer_uid(stream) == Some(uid)
}

/// The user the process at the other end of `stream` runs as (`SO_PEERCRED`: for a connecting
/// socket, the listener's at the time it listened).
fn peer_uid(stream: &UnixStream) -> Option<libc::uid_t> {
    // SAFETY: an all-zero `ucred` is a valid value of the plain C struct.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are live and writable, `len` holds `cred`'s size, and the
    // descriptor is the open socket `stream` borrows for the call.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

/// The opener's side of one proposed local link: its Unix connection and the memory.
pub(crate) struct Proposal {
    stream: UnixStream,
    mapping: Mapping,
}

impl std::fmt::Debug for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Proposal")
    }
}

/// Proposes a local link to the acceptor listening on `to`, for the TCP connection about to be
/// opened from `port`; `None` if there is no such acceptor on this machine (an MLX rank, a
/// remote host) or anything fails, and the link stays TCP.
pub(crate) fn propose(to: SocketAddr, port: u16) -> Option<Proposal> {
    let stream = connect_now(&name(to))?;
    // A name another user bound first must not get the link's memory.
    if !same_user(&stream) {
        return None;
    }
    let (mapping, fd) = Mapping::create(MAPPING).ok()?;
    send_with_fds(&stream, &hello(port), &[fd.as_fd()]).ok()?;
    Some(Proposal { stream, mapping })
}

/// A connection to the abstract Unix socket `name`, made without waiting: a listener whose
/// backlog is full (strangers can connect to an abstract name) gives none, where a blocking
/// connect would wait for room without end.
fn connect_now(name: &str) -> Option<UnixStream> {
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).ok()?;
    socket.set_nonblocking(true).ok()?;
    // A path that starts with a NUL byte names the abstract namespace.
    let path = std::path::PathBuf::from(format!("\0{name}"));
    socket.connect(&socket2::SockAddr::unix(path).ok()?).ok()?;
    socket.set_nonblocking(false).ok()?;
    socket.set_cloexec(true).ok()?;
    Some(socket.into())
}

impl Proposal {
    /// Waits until `until` for the acceptor's answer: the local link, or `None` if it closed
    /// without one or reset the connection before answering (the link stays TCP). An error if
    /// it neither answered nor closed in time.
    pub(crate) fn confirm(self, until: Instant) -> io::Result<Option<LocalLink>> {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut answer = [0u8; 1];
        loop {
            return match (&self.stream).read(&mut answer) {
                Ok(1) if answer[0] == 1 => LocalLink::new(self.mapping, End::Opener).map(Some),
                Ok(_) => Ok(None),
                // The acceptor closed its listener with this proposal still in the backlog: it
                // never read the hello, so it maps nothing and keeps the link on TCP. (Had it
                // answered, the answer would be read before the reset.)
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    Err(io::ErrorKind::TimedOut.into())
                }
                Err(e) => Err(e),
            };
        }
    }
}

/// The space for one descriptor's control message.
fn cmsg_space() -> usize {
    // SAFETY: `CMSG_SPACE` only computes a size.
    unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize }
}

/// The most descriptors [`send_with_fds`] attaches to one message.
const MAX_SENT_FDS: usize = 4;

/// Sends `bytes` with the descriptors `fds` attached (a hello has one), in one message.
fn send_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.is_empty() || fds.len() > MAX_SENT_FDS {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let mut control = [0u64; 6];
    let data_len = (fds.len() * size_of::<libc::c_int>()) as u32;
    // SAFETY: `CMSG_SPACE` only computes a size.
    let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
    assert!(space <= size_of_val(&control), "control buffer");
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero `msghdr` is a valid value of the plain C struct.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` describes a control buffer of `space` bytes, room for one header and
    // `fds.len()` descriptors; `CMSG_FIRSTHDR` only computes where the first header goes.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if cmsg.is_null() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    // SAFETY: an all-zero `cmsghdr` is a valid value of the plain C struct.
    let mut header: libc::cmsghdr = unsafe { std::mem::zeroed() };
    header.cmsg_level = libc::SOL_SOCKET;
    header.cmsg_type = libc::SCM_RIGHTS;
    // SAFETY: `CMSG_LEN` only computes a size.
    header.cmsg_len = unsafe { libc::CMSG_LEN(data_len) } as _;
    // SAFETY: `cmsg` points into `control`, with room for the header (above).
    unsafe { cmsg.write_unaligned(header) };
    // SAFETY: `CMSG_DATA` only computes where the header's data goes, inside `control`.
    let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<libc::c_int>();
    for (i, fd) in fds.iter().enumerate() {
        // SAFETY: `data` points at room for `fds.len()` descriptors inside `control`
        // (CMSG_SPACE of that many), and `i` is below it.
        unsafe { data.wrapping_add(i).write_unaligned(fd.as_raw_fd()) };
    }
    // SAFETY: `msg` points at `iov` (over `bytes`, which the kernel only reads) and at
    // `control`; every pointer outlives the call.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    match usize::try_from(sent) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(_) => Err(io::ErrorKind::WriteZero.into()),
        Err(_) => Err(io::Error::last_os_error()),
    }
}

/// Receives one message into `buf` without waiting, and the descriptor attached to it.
fn recv_with_fd(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut control = [0u64; 4];
    let space = cmsg_space();
    assert!(space <= size_of_val(&control), "control buffer");
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero `msghdr` is a valid value of the plain C struct.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg`'s buffers are live and writable for the call; `MSG_CMSG_CLOEXEC` makes any
    // received descriptor close-on-exec.
    let n = unsafe {
        libc::recvmsg(
            stream.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    // Every descriptor the kernel put in this process is owned (and so closed) here before
    // anything else is looked at: a message with more descriptors than the control buffer
    // holds has as many installed as fit, with `MSG_CTRUNC` set.
    let fds = owned_fds(&msg, space);
    // A truncated control message (more than one descriptor, say) is not a hello.
    let whole = msg.msg_flags & libc::MSG_CTRUNC == 0;
    match <[OwnedFd; 1]>::try_from(fds) {
        Ok([fd]) if whole => Ok((n, Some(fd))),
        _ => Ok((n, None)),
    }
}

/// The descriptors of the `SCM_RIGHTS` message in `msg`'s control buffer (of `space` bytes,
/// filled by `recvmsg`), as owned values.
fn owned_fds(msg: &libc::msghdr, space: usize) -> Vec<OwnedFd> {
    // SAFETY: `CMSG_FIRSTHDR` reads `msg`'s control fields, which the kernel set, and returns
    // the first header inside the control buffer or null.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    if cmsg.is_null() {
        return Vec::new();
    }
    // SAFETY: a non-null first header lies wholly inside the control buffer, written by the
    // kernel.
    let header = unsafe { cmsg.read_unaligned() };
    if header.cmsg_level != libc::SOL_SOCKET || header.cmsg_type != libc::SCM_RIGHTS {
        return Vec::new();
    }
    // SAFETY: `CMSG_LEN` only computes a size.
    let empty = unsafe { libc::CMSG_LEN(0) } as usize;
    // As many as the header says the kernel installed (it sets the length to what fit), and
    // no more than the buffer has room for.
    let count = (header.cmsg_len as usize).saturating_sub(empty) / size_of::<libc::c_int>();
    let room = space.saturating_sub(empty) / size_of::<libc::c_int>();
    // SAFETY: `CMSG_DATA` only computes where the header's data is, inside the buffer.
    let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<libc::c_int>();
    (0..count.min(room))
        .map(|i| {
            // SAFETY: the header says it carries `count` descriptors at `data`, inside the
            // control buffer, and no more are read than the buffer has room for.
            let raw = unsafe { data.wrapping_add(i).read_unaligned() };
            // SAFETY: a descriptor passed with SCM_RIGHTS is new in this process and owned by
            // no one else.
            unsafe { OwnedFd::from_raw_fd(raw) }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_hello_names_its_port_and_a_malformed_one_names_none() {
        assert_eq!(port_of(&hello(4242)), Some(4242));
        let mut h = hello(1);
        h[0] ^= 1;
        assert_eq!(port_of(&h), None, "magic");
        assert_eq!(port_of(&hello(1)[..HELLO - 1]), None, "short");
        let mut h = hello(1);
        h[12] ^= 1;
        assert_eq!(port_of(&h), None, "another queue size");
    }

    #[test]
    fn a_proposal_the_acceptor_matches_becomes_a_link_and_others_stay_tcp() {
        // A made-up listener address: nothing binds TCP here, only the name.
        let at: SocketAddr = "127.0.0.1:1".parse().expect("address");
        let addr = SocketAddr::new(at.ip(), 40_000 + (std::process::id() % 20_000) as u16);
        let mut offers = Offers::bind(&[Some(addr)]);
        let stale = propose(addr, 1111).expect("a proposal");
        let kept = propose(addr, 2222).expect("another");
        let peer = SocketAddr::new(addr.ip(), 2222);
        let mut acceptor = offers.answer(0, peer).expect("the matching hello");
        let until = Instant::now() + Duration::from_secs(10);
        let mut opener = kept.confirm(until).expect("answered").expect("a link");
        assert!(stale.confirm(until).expect("closed").is_none(), "stays TCP");
        opener.write(b"hi").expect("write");
        let mut got = [0u8; 2];
        assert_eq!(acceptor.read(&mut got).expect("read").0, 2);
        assert_eq!(&got, b"hi");
    }

    /// A listener address of its own for each test (tests run side by side in one process).
    fn address(test: u16) -> SocketAddr {
        let port = 20_000 + (std::process::id() % 20_000) as u16;
        SocketAddr::new(std::net::Ipv4Addr::new(127, 0, 1, test as u8).into(), port)
    }

    #[test]
    fn a_proposal_whose_acceptor_closed_without_taking_it_stays_tcp() {
        let addr = address(1);
        let offers = Offers::bind(&[Some(addr)]);
        let proposal = propose(addr, 3333).expect("a proposal");
        // Closing the listener resets the connections in its backlog.
        drop(offers);
        let until = Instant::now() + Duration::from_secs(10);
        let confirmed = proposal.confirm(until).expect("a reset before any answer");
        assert!(confirmed.is_none(), "stays TCP");
    }

    #[test]
    fn a_hello_behind_a_backlog_of_strangers_leaves_its_link_on_tcp_at_once() {
        // Anyone may connect to an abstract name: these take every hello an answer reads.
        let addr = address(2);
        let mut offers = Offers::bind(&[Some(addr)]);
        let strangers: Vec<UnixStream> = (0..MAX_HELLOS)
            .map(|_| connect_now(&name(addr)).expect("a stranger's connection"))
            .collect();
        let proposal = propose(addr, 4444).expect("a proposal");
        let peer = SocketAddr::new(addr.ip(), 4444);
        assert!(offers.answer(0, peer).is_none(), "the hello is never read");
        // The acceptor keeps its offers for the rest of its setup, and the opener must not
        // wait for it: its answer closed the rest of its backlog.
        let started = Instant::now();
        let until = started + Duration::from_secs(10);
        let confirmed = proposal.confirm(until).expect("a reset before any answer");
        assert!(confirmed.is_none(), "stays TCP");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        drop((strangers, offers));
    }

    /// How many descriptors this process has open on memory files called `name`.
    fn open_memory_files(name: &str) -> usize {
        let target = format!("/memfd:{name} ");
        std::fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|link| link.to_string_lossy().starts_with(&target))
            .count()
    }

    #[test]
    fn a_hello_with_three_descriptors_is_refused_and_leaves_none_of_them_open() {
        let name = format!("nuvec-distributed-test-fds-{}", std::process::id());
        let files: Vec<OwnedFd> = (0..3)
            .map(|_| {
                let c = std::ffi::CString::new(name.clone()).expect("a name");
                // SAFETY: `c` is a NUL-terminated string; the call returns a new descriptor
                // or -1.
                let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
                assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
                // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
                unsafe { OwnedFd::from_raw_fd(fd) }
            })
            .collect();
        let (ours, theirs) = UnixStream::pair().expect("a socket pair");
        let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
        send_with_fds(&theirs, &hello(1), &fds).expect("send");
        drop(files);
        assert_eq!(open_memory_files(&name), 0, "only the message holds them");
        let mut buf = [0u8; HELLO + 1];
        let (n, fd) = recv_with_fd(&ours, &mut buf).expect("receive");
        assert_eq!(n, HELLO);
        assert!(fd.is_none(), "three descriptors are not a hello");
        assert_eq!(
            open_memory_files(&name),
            0,
            "a descriptor received was left open"
        );
    }

    #[test]
    fn a_listener_with_a_full_backlog_gives_no_connection_instead_of_a_wait() {
        use socket2::{Domain, SockAddr, Socket, Type};
        let name = format!("nuvec-distributed/test-backlog/{}", std::process::id());
        let listener = Socket::new(Domain::UNIX, Type::STREAM, None).expect("socket");
        let path = std::path::PathBuf::from(format!("\0{name}"));
        listener
            .bind(&SockAddr::unix(path).expect("address"))
            .expect("bind");
        listener.listen(0).expect("listen");
        // Connections nobody accepts fill the backlog; then the next one must not wait.
        let mut held = Vec::new();
        let started = Instant::now();
        while let Some(stream) = connect_now(&name) {
            held.push(stream);
            assert!(held.len() < 64, "the backlog never filled");
        }
        assert!(!held.is_empty(), "the first connection goes in");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn without_an_acceptor_of_this_crate_there_is_no_proposal() {
        let addr: SocketAddr = "127.0.0.1:9".parse().expect("address");
        assert!(propose(addr, 1234).is_none());
    }
}
