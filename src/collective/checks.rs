//! The argument checks of every collective, in one place for both backends: found before a
//! byte moves, they return `Error::InvalidArgument` naming the rank and the operation and
//! leave the group usable.

use nuvec_core::DType;

use super::reduce::{Reducer, Reduction, UnsupportedReduction};
use crate::error::Error;

/// The reducer of `op` over `dtype` that `flavour` builds (the ring's [`Reducer::new`] or
/// JACCL's [`Reducer::jaccl`]) for a buffer of `len` bytes; `invalid` makes the error of
/// operation `name`.
pub(crate) fn reducer(
    name: &'static str,
    op: Reduction,
    dtype: DType,
    len: usize,
    flavour: fn(Reduction, DType) -> Result<Reducer, UnsupportedReduction>,
    invalid: impl Fn(&'static str, String) -> Error,
) -> Result<Reducer, Error> {
    let reducer = flavour(op, dtype).map_err(|e| invalid(name, e.to_string()))?;
    if !len.is_multiple_of(reducer.element_size()) {
        return Err(invalid(
            name,
            format!("{len} bytes is not a whole number of {dtype} elements"),
        ));
    }
    Ok(reducer)
}

/// That `whole` is `part` bytes from each of `size` ranks (`what` names `whole`: "the
/// output" of an all-gather, "the input" of a sum-scatter).
pub(crate) fn one_part_per_rank(
    name: &'static str,
    what: &str,
    whole: usize,
    part: usize,
    size: usize,
    invalid: impl Fn(&'static str, String) -> Error,
) -> Result<(), Error> {
    if whole != part * size {
        return Err(invalid(
            name,
            format!("{what} has {whole} bytes, not {part} × {size} ranks"),
        ));
    }
    Ok(())
}

/// The `nuvec_core` [`Communicator`](nuvec_core::distributed::Communicator) of a
/// communicator type whose `try_*` methods do the work: the same seven forwarders for both
/// backends, turning a `nuvec_core` reduction into this crate's and this crate's error into
/// `nuvec_core`'s.
macro_rules! communicator_over_try {
    ($ty:ident) => {
        impl<F: $crate::fabric::Fabric + Send + 'static> nuvec_core::distributed::Communicator
            for $ty<F>
        {
            fn rank(&self) -> usize {
                self.core.rank()
            }

            fn size(&self) -> usize {
                self.size()
            }

            fn all_reduce(
                &self,
                op: nuvec_core::distributed::AllReduce,
                dtype: nuvec_core::DType,
                data: &mut [u8],
            ) -> nuvec_core::Result<()> {
                let op = $crate::collective::reduce::Reduction::try_from(op)
                    .map_err(|e| self.core.invalid("all_reduce", e.to_string()))?;
                Ok(self.try_all_reduce(op, dtype, data)?)
            }

            fn all_gather(&self, input: &[u8], output: &mut [u8]) -> nuvec_core::Result<()> {
                Ok(self.try_all_gather(input, output)?)
            }

            fn send(&self, dst: usize, data: &[u8]) -> nuvec_core::Result<()> {
                Ok(self.try_send(dst, data)?)
            }

            fn recv(&self, src: usize, data: &mut [u8]) -> nuvec_core::Result<()> {
                Ok(self.try_recv(src, data)?)
            }

            fn split(
                &self,
                color: i32,
                key: i32,
            ) -> nuvec_core::Result<std::sync::Arc<dyn nuvec_core::distributed::Communicator>> {
                Ok(self.try_split(color, key)?)
            }
        }
    };
}
pub(crate) use communicator_over_try;

/// The lifecycle methods both communicators offer, forwarded to their [`Core`] field `core`:
/// `timeout`, `set_timeout`, `failure`, `diagnosis`, `health`, `close`; the two private
/// ones their operations use, `invalid` and `operate` (whose scratch is `$scratch`); the
/// splitter of their field `splitter` (`with_splitter`, `splitter`); and `split_with`, the
/// one way both build this group's side of a split (their `try_split` says only how a
/// sub-group's communicator is made of its fabric).
///
/// [`Core`]: super::core::Core
macro_rules! lifecycle_of_core {
    ($scratch:ty) => {
        /// Prints failures to `log`.
        pub(crate) fn with_log(mut self, log: $crate::config::log::Log) -> Self {
            self.core.set_log(log);
            self
        }

        /// Makes `split` build sub-groups' fabrics with `splitter` (how a fabric of another
        /// crate, such as the simulator's, splits).
        #[doc(hidden)]
        pub fn with_splitter(
            mut self,
            splitter: std::sync::Arc<dyn $crate::collective::split::Splitter<F>>,
        ) -> Self {
            self.splitter = Some(splitter);
            self
        }

        /// How its fabric makes a sub-group's, if it can.
        pub(crate) fn splitter(
            &self,
        ) -> Option<&std::sync::Arc<dyn $crate::collective::split::Splitter<F>>> {
            self.splitter.as_ref()
        }

        /// A split of this group ([`split_over`](crate::collective::split::split_over) with
        /// this group as the parent): `child` makes the sub-group's communicator of the
        /// sub-group's fabric, which then logs and splits as the fabric says.
        pub(crate) fn split_with(
            &self,
            color: i32,
            key: i32,
            child: impl FnOnce(F) -> Self,
        ) -> Result<std::sync::Arc<dyn nuvec_core::distributed::Communicator>, $crate::error::Error>
        where
            F: Send + 'static,
        {
            let all_gather =
                |input: &[u8], output: &mut [u8]| self.try_split_exchange(input, output);
            let parent = $crate::collective::split::Parent {
                rank: self.core.rank(),
                size: self.size(),
                all_gather: &all_gather,
                splitter: self.splitter(),
                timeout: self.timeout(),
            };
            $crate::collective::split::split_over(&parent, color, key, |sub| {
                std::sync::Arc::new(
                    child(sub.fabric)
                        .with_log(sub.log)
                        .with_splitter(sub.splitter),
                )
            })
        }

        fn invalid(&self, op: &'static str, what: String) -> $crate::error::Error {
            self.core.invalid(op, what)
        }

        fn operate(
            &self,
            op: &'static str,
            bytes: usize,
            body: impl FnOnce(
                &mut F,
                &mut $scratch,
                std::time::Duration,
                u64,
            ) -> Result<(), $crate::fabric::FabricError>,
        ) -> Result<(), $crate::error::Error> {
            self.operate_call($crate::collective::record::Call::new(op, bytes), body)
        }

        /// [`operate`](Self::operate), with what the flight recorder notes of it.
        fn operate_call(
            &self,
            call: $crate::collective::record::Call,
            body: impl FnOnce(
                &mut F,
                &mut $scratch,
                std::time::Duration,
                u64,
            ) -> Result<(), $crate::fabric::FabricError>,
        ) -> Result<(), $crate::error::Error> {
            self.core.operate(call, body)
        }

        /// The deadline of every operation.
        pub fn timeout(&self) -> std::time::Duration {
            self.core.timeout()
        }

        /// Changes the deadline of the operations that start from now on (an operation in
        /// progress keeps its own): set a longer one before a slow operation and restore it
        /// after.
        pub fn set_timeout(&self, timeout: std::time::Duration) {
            self.core.set_timeout(timeout);
        }

        /// The first failure of this group, if it has failed.
        pub fn failure(&self) -> Option<$crate::error::Error> {
            self.core.failure()
        }

        /// After the group failed: one line per peer saying when it was last heard from and
        /// during which operation, e.g. `rank 2: last heard 29.871s ago, during all_sum #14`
        /// (also printed at the `error` log level). Empty while the group is healthy.
        pub fn diagnosis(&self) -> Vec<String> {
            self.core.diagnosis()
        }

        /// This group's flight record as a rank's `rank-R.jsonl` holds it (see the README's
        /// "When a job fails"), with this group as the job: its header names this group's
        /// rank and size. Read without waiting for an operation in progress. For ranks that
        /// share a process (the simulator), where the dump files cannot be told apart: write
        /// each to `rank-R.jsonl` and `nuvec-launch diagnose` merges them. `None` when the
        /// recorder is off (`NUVEC_DISTRIBUTED_RECORD=0`).
        pub fn flight_record(&self) -> Option<String> {
            self.core.flight_record()
        }

        /// Which peers are unreachable, checked without running a collective (it waits for an
        /// operation in progress, never interleaves with one): `(peer, what)` for each.
        pub fn health(&self) -> Vec<(usize, String)> {
            self.core.health()
        }

        /// Releases the fabric (and with it the connections); later calls fail with
        /// [`Error::Closed`](crate::Error::Closed). Returns the fabric if it was still there.
        pub fn close(&self) -> Option<F> {
            self.core.close()
        }
    };
}
pub(crate) use lifecycle_of_core;
