//! The process CPU clock the benches report per operation, one implementation for the
//! crate's bench (`benches/allreduce/`) and the 0.5.0 bench (`benches/upstream/`, its own
//! workspace), which include this file by path.

/// The CPU time this process has run, in seconds: every thread's, those that have exited
/// included (`CLOCK_PROCESS_CPUTIME_ID`, nanosecond resolution); NaN if the clock cannot be
/// read. Summing the live threads' times instead (`/proc/self/task/*`) misses the threads an
/// operation starts and ends, such as nuvec-distributed 0.5.0's per-step sender threads.
pub(crate) fn cpu_time() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable `timespec` for the duration of the call, which writes
    // nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    if rc != 0 {
        return f64::NAN;
    }
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
