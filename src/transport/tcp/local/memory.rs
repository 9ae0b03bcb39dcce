//! The memory of a local link: an anonymous file (`memfd_create`) mapped shared into both
//! ranks, made by the rank that opened the TCP connection and handed to the other over a Unix
//! socket (see `rendezvous`).
//!
//! The file has no name in any file system, so nothing is left behind when a rank dies: the
//! kernel frees it when the last mapping and descriptor go.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// The seals of a link's memory file: its size is fixed for good (neither end can shrink it
/// under the other's mapping) and no seal can be added or removed.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A shared mapping of a whole memory file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    at: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; what may touch it concurrently (the
// peer process, another thread through a shared reference) is the queue's atomics and the
// byte ranges they hand over, which `queue` governs.
unsafe impl Send for Mapping {}

impl Mapping {
    /// A new memory file of `len` bytes (zeroed) and its mapping.
    pub(crate) fn create(len: usize) -> io::Result<(Self, OwnedFd)> {
        // SAFETY: the name is a NUL-terminated literal; the call returns a new descriptor or -1.
        let fd = unsafe {
            libc::memfd_create(
                c"nuvec-distributed local link".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: `fd` is an open memory file.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is an open memory file made with MFD_ALLOW_SEALING; the seals are flags.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((Self::map(&fd, len)?, fd))
    }

    /// Maps the memory file `fd` a peer handed over, which must be exactly `len` bytes long (a
    /// shorter one would fault on access past its end), with its size sealed ([`SEALS`]): a
    /// peer that could shrink it later would make this rank's next access past the new end
    /// fault.
    pub(crate) fn open(fd: &OwnedFd, len: usize) -> io::Result<Self> {
        // SAFETY: `fd` is an open descriptor; F_GET_SEALS only reads its seals (an error for
        // anything but a sealable memory file).
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & SEALS != SEALS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer's memory file is not a memory file sealed against resizing",
            ));
        }
        // SAFETY: an all-zero `stat` is a valid value of the plain C struct `fstat` fills.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` is a live, writable `stat`.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if usize::try_from(st.st_size).ok() != Some(len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the peer's memory file has {} bytes, not {len}", st.st_size),
            ));
        }
        Self::map(fd, len)
    }

    fn map(fd: &OwnedFd, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of an open file of at least `len` bytes, at an address
        // the kernel picks; it overlaps nothing of this process's.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let at = NonNull::new(at.cast::<u8>()).ok_or(io::ErrorKind::AddrNotAvailable)?;
        Ok(Self { at, len })
    }

    /// The first byte (page-aligned).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.at.as_ptr()
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `at..at + len` is this value's own mapping, and nothing borrows it any more
        // (the queues that point into it borrow the link that owns this value).
        unsafe { libc::munmap(self.at.as_ptr().cast(), self.len) };
    }
}
