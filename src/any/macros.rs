//! [`backend_set!`](crate::backend_set): the macro behind the `Any*` enums.

/// Generates a backend set: a zero-sized backend type whose associated types
/// are one enum per concept, each variant a backend of the list.
///
/// # Why `macro_rules!`
/// The expansion is a fixed shape repeated per variant, with no need for
/// type information or identifier concatenation that a proc-macro would
/// bring; `macro_rules!` keeps it in this crate (no proc-macro crate, no
/// `syn` in the build), and cfg attributes on variants pass straight through
/// to every generated variant, arm and impl. The entry rule checks the
/// input and hands each concept to an internal rule (`@enum`, `@queue`,
/// `@signal`, `@buffer`, `@program`, `@device`, `@backend`); input of any
/// other form gets a compile error showing the form below.
///
/// # Input
/// The set's name and its enums' names, then one entry per backend: the
/// variant, its `as_*`/`as_*_mut` accessors, the backend type, and its
/// concrete types (checked at compile time to be the backend's own).
///
/// ```
/// use hwqueue::cpu::{Cpu, CpuBuffer, CpuDevice, CpuProgram, CpuQueue, CpuSignal};
///
/// hwqueue::backend_set! {
///     /// The CPU alone, as a set.
///     pub backend CpuOnly {
///         id: "cpu-only",
///         device: CpuOnlyDevice,
///         queue: CpuOnlyQueue,
///         signal: CpuOnlySignal,
///         buffer: CpuOnlyBuffer,
///         program: CpuOnlyProgram,
///     }
///     variants {
///         Cpu(as_cpu, as_cpu_mut): Cpu {
///             device: CpuDevice,
///             queue: CpuQueue,
///             signal: CpuSignal,
///             buffer: CpuBuffer,
///             program: CpuProgram,
///         },
///         // More backends follow, each optionally behind `#[cfg(...)]`.
///     }
/// }
///
/// # fn main() -> hwqueue::Result<()> {
/// use hwqueue::{Backend, Device, HardwareQueue, QueueFactory};
/// let device = CpuOnly::open(0)?;
/// let mut queue: CpuOnlyQueue = device.compute_queue()?;
/// let done: CpuOnlySignal = device.new_signal(0)?;
/// queue.signal(&done, 1).submit()?;
/// queue.synchronize()?;
/// assert_eq!(done.as_cpu().map(hwqueue::TimelineSignal::value), Some(1));
/// # Ok(())
/// # }
/// ```
///
/// # What it expands to
/// For the input above (one variant shown; every item of a cfg-gated variant
/// carries its `#[cfg]`):
/// ```ignore
/// /// The CPU alone, as a set.
/// #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
/// pub struct CpuOnly;
///
/// pub enum CpuOnlyQueue {
///     Cpu(CpuQueue),
/// }
/// // ... and likewise CpuOnlyDevice, CpuOnlySignal, CpuOnlyBuffer,
/// // CpuOnlyProgram; the last three are `Clone`.
///
/// impl CpuOnlyQueue {
///     pub fn backend_id(&self) -> &'static str { match self { Self::Cpu(_) => "cpu" } }
///     pub fn as_cpu(&self) -> Option<&CpuQueue> { /* match */ }
///     pub fn as_cpu_mut(&mut self) -> Option<&mut CpuQueue> { /* match */ }
/// }
/// impl From<CpuQueue> for CpuOnlyQueue { /* Self::Cpu(q) */ }
///
/// impl HardwareQueue for CpuOnlyQueue {
///     type Backend = CpuOnly;
///     fn wait(&mut self, signal: &CpuOnlySignal, value: u64) -> &mut Self {
///         match self {
///             Self::Cpu(q) => match signal {
///                 CpuOnlySignal::Cpu(s) => q.wait(s, value),      // native
///                 other => q.wait_foreign(other, value),          // cross-backend
///             },
///         };
///         self
///     }
///     fn exec(&mut self, program: &CpuOnlyProgram, buffers: &[&CpuOnlyBuffer], ..) -> &mut Self {
///         match self {
///             Self::Cpu(q) => match program.as_cpu() {
///                 None => q.reject(mismatch("cpu", program.backend_id(), ..)),
///                 Some(p) => match with_gathered(buffers.len(), |i| buffers[i].as_cpu(),
///                                                |bufs| q.exec(p, bufs, scalars, params)) {
///                     Ok(_) => q,
///                     Err(i) => q.reject(mismatch("cpu", buffers[i].backend_id(), ..)),
///                 },
///             },
///         };
///         self
///     }
///     // wait_settled: as wait, with wait_foreign_settled across backends;
///     // signal, copy, collective, dealloca: native on a match, rejected (naming both backends) otherwise;
///     // alloca: the backend's, wrapped;
///     // kind, memory_barrier, wait_foreign, wait_foreign_settled, reject, recorded, discard, submit,
///     // synchronize: pass through.
/// }
/// impl TimelineSignal for CpuOnlySignal { /* each method: match self { Self::Cpu(s) => s.method(..) } */ }
/// impl Buffer for CpuOnlyBuffer { type Backend = CpuOnly; /* match; same_as: same variant only */ }
/// impl Program for CpuOnlyProgram { type Backend = CpuOnly; /* match */ }
/// impl QueueFactory for CpuOnlyDevice { /* match, then .into() */ }
/// impl Device for CpuOnlyDevice { type Backend = CpuOnly; /* match, then .into() */ }
///
/// impl Backend for CpuOnly {
///     const ID: &'static str = "cpu-only";
///     // PRECEDENCE 0, DISPATCHES true, REFERENCE_ORACLE false,
///     // associated types the enums above; probe() concatenates every
///     // backend's probe; open(n) opens device n of the set's preferred
///     // present backend (as `Registry::select` picks it, without caching).
/// }
/// impl BackendSet for CpuOnly {
///     fn entries() -> &'static [BackendEntry<CpuOnlyDevice>] { /* one per variant */ }
/// }
/// const _: () = assert_family::<Cpu, CpuDevice, CpuQueue, CpuSignal, CpuBuffer, CpuProgram>();
/// const _: () = check_backend_list(&["cpu"], &[0]); // unique ids, no precedence ties
/// ```
#[macro_export]
macro_rules! backend_set {
    (
        $(#[$set_meta:meta])*
        $vis:vis backend $Set:ident {
            id: $id:literal,
            device: $Device:ident,
            queue: $Queue:ident,
            signal: $Signal:ident,
            buffer: $Buffer:ident,
            program: $Program:ident $(,)?
        }
        variants {
            $(
                $(#[$meta:meta])*
                $V:ident($as_v:ident, $as_v_mut:ident): $B:ty {
                    device: $D:ty,
                    queue: $Q:ty,
                    signal: $S:ty,
                    buffer: $Bu:ty,
                    program: $P:ty $(,)?
                }
            ),+ $(,)?
        }
    ) => {
        $(#[$set_meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
        $vis struct $Set;

        $crate::backend_set!(@enum $vis $Device, Device, "An opened device of any backend of the set.", [], $( $(#[$meta])* $V($as_v, $as_v_mut): $B => $D ),+);
        $crate::backend_set!(@enum $vis $Queue, Queue, "A command queue of any backend of the set.",
            // A tag of its own, not a niche in a variant: matching on it is a
            // byte compare (with three variants, decoding a niche cost the
            // queue enum a tenth more instructions a command).
            [repr(u8)], $( $(#[$meta])* $V($as_v, $as_v_mut): $B => $Q ),+);
        $crate::backend_set!(@enum $vis $Signal, Signal, "A timeline signal of any backend of the set.", [], $( $(#[$meta])* $V($as_v, $as_v_mut): $B => $S ),+);
        $crate::backend_set!(@enum $vis $Buffer, Buffer, "A buffer of any backend of the set.", [], $( $(#[$meta])* $V($as_v, $as_v_mut): $B => $Bu ),+);
        $crate::backend_set!(@enum $vis $Program, Program, "A program of any backend of the set.", [], $( $(#[$meta])* $V($as_v, $as_v_mut): $B => $P ),+);
        $crate::backend_set!(@clone $Signal; $( $(#[$meta])* $V ),+);
        $crate::backend_set!(@clone $Buffer; $( $(#[$meta])* $V ),+);
        $crate::backend_set!(@clone $Program; $( $(#[$meta])* $V ),+);
        $crate::__backend_set_queue!($Set, $Queue, $Signal, $Buffer, $Program; $( $(#[$meta])* $V($as_v): $B ),+);
        $crate::backend_set!(@signal $Signal; $( $(#[$meta])* $V ),+);
        $crate::backend_set!(@buffer $Set, $Buffer; $( $(#[$meta])* $V ),+);
        $crate::backend_set!(@program $Set, $Program; $( $(#[$meta])* $V ),+);
        $crate::backend_set!(@device $Set, $Device, $Queue, $Signal, $Buffer; $( $(#[$meta])* $V ),+);
        $crate::backend_set!(@backend $Set, $id, $Device, $Queue, $Signal, $Buffer, $Program; $( $(#[$meta])* $V: $B => $D, $Q, $S, $Bu, $P ),+);
    };

    // One enum per concept, its `From`s, accessors and `Debug`.
    (@enum $vis:vis $Enum:ident, $Assoc:ident, $doc:literal, [$($enum_attr:meta),*], $( $(#[$meta:meta])* $V:ident($as_v:ident, $as_v_mut:ident): $B:ty => $Inner:ty ),+) => {
        #[doc = $doc]
        #[non_exhaustive]
        $(#[$enum_attr])*
        $vis enum $Enum {
            $(
                #[doc = concat!("A `", stringify!($V), "` ", stringify!($Assoc), ".")]
                $(#[$meta])* $V($Inner),
            )+
        }

        impl $Enum {
            /// The id of the backend this value belongs to.
            #[inline]
            pub fn backend_id(&self) -> &'static str {
                match self { $( $(#[$meta])* Self::$V(_) => <$B as $crate::Backend>::ID, )+ }
            }

            $(
                #[doc = concat!("The `", stringify!($V), "` value, if this is one.")]
                $(#[$meta])*
                #[inline]
                pub fn $as_v(&self) -> ::std::option::Option<&$Inner> {
                    #[allow(unreachable_patterns)]
                    match self { Self::$V(inner) => Some(inner), _ => None }
                }

                #[doc = concat!("The `", stringify!($V), "` value, mutably, if this is one.")]
                $(#[$meta])*
                #[inline]
                pub fn $as_v_mut(&mut self) -> ::std::option::Option<&mut $Inner> {
                    #[allow(unreachable_patterns)]
                    match self { Self::$V(inner) => Some(inner), _ => None }
                }
            )+
        }

        $(
            $(#[$meta])*
            impl ::std::convert::From<$Inner> for $Enum {
                #[inline]
                fn from(inner: $Inner) -> Self {
                    Self::$V(inner)
                }
            }
        )+

        impl ::std::fmt::Debug for $Enum {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                match self {
                    $( $(#[$meta])* Self::$V(_) => f.write_str(concat!(stringify!($Enum), "::", stringify!($V))), )+
                }
            }
        }
    };

    // Handles clone per variant.
    (@clone $Enum:ident; $( $(#[$meta:meta])* $V:ident ),+) => {
        impl ::std::clone::Clone for $Enum {
            fn clone(&self) -> Self {
                match self { $( $(#[$meta])* Self::$V(inner) => Self::$V(inner.clone()), )+ }
            }
        }
    };

    (@signal $Signal:ident; $( $(#[$meta:meta])* $V:ident ),+) => {
        impl $crate::TimelineSignal for $Signal {
            #[inline]
            fn value(&self) -> u64 {
                match self { $( $(#[$meta])* Self::$V(s) => $crate::TimelineSignal::value(s), )+ }
            }

            #[inline]
            fn set(&self, value: u64) {
                match self { $( $(#[$meta])* Self::$V(s) => $crate::TimelineSignal::set(s, value), )+ }
            }

            #[inline]
            fn is_reached(&self, target: u64) -> bool {
                match self { $( $(#[$meta])* Self::$V(s) => $crate::TimelineSignal::is_reached(s, target), )+ }
            }

            #[inline]
            fn wait(&self, target: u64, timeout: impl Into<$crate::Timeout>) -> $crate::Result<()> {
                match self { $( $(#[$meta])* Self::$V(s) => $crate::TimelineSignal::wait(s, target, timeout), )+ }
            }

            fn fail(&self, upto: u64, cause: $crate::Error) {
                match self { $( $(#[$meta])* Self::$V(s) => $crate::TimelineSignal::fail(s, upto, cause), )+ }
            }

            #[inline]
            fn producer(&self) -> &$crate::Producer {
                match self { $( $(#[$meta])* Self::$V(s) => $crate::TimelineSignal::producer(s), )+ }
            }

            fn watch(&self, waker: &$crate::SignalWaker) -> bool {
                match self { $( $(#[$meta])* Self::$V(s) => $crate::TimelineSignal::watch(s, waker), )+ }
            }

            fn unwatch(&self, waker: &$crate::SignalWaker) {
                match self { $( $(#[$meta])* Self::$V(s) => $crate::TimelineSignal::unwatch(s, waker), )+ }
            }

            fn wait_tuning(&self, target: u64) -> ::std::option::Option<&'static $crate::WaitTuning> {
                match self { $( $(#[$meta])* Self::$V(s) => $crate::TimelineSignal::wait_tuning(s, target), )+ }
            }

            /// The variant's own, where every signal of `waits` is of one
            /// variant; else `false`.
            fn wait_native(
                waits: &[(&Self, u64)],
                all: bool,
                timeout: ::std::time::Duration,
            ) -> bool {
                $( $(#[$meta])* {
                    #[allow(unreachable_patterns)]
                    let inner: ::std::option::Option<::std::vec::Vec<_>> = waits
                        .iter()
                        .map(|&(signal, value)| match signal {
                            Self::$V(s) => ::std::option::Option::Some((s, value)),
                            _ => ::std::option::Option::None,
                        })
                        .collect();
                    if let ::std::option::Option::Some(inner) = inner {
                        return $crate::TimelineSignal::wait_native(&inner, all, timeout);
                    }
                } )+
                false
            }
        }
    };

    (@buffer $Set:ident, $Buffer:ident; $( $(#[$meta:meta])* $V:ident ),+) => {
        impl $crate::Buffer for $Buffer {
            type Backend = $Set;

            #[inline]
            fn size(&self) -> usize {
                match self { $( $(#[$meta])* Self::$V(b) => $crate::Buffer::size(b), )+ }
            }

            #[inline]
            fn same_as(&self, other: &Self) -> bool {
                match (self, other) {
                    $( $(#[$meta])* (Self::$V(a), Self::$V(b)) => $crate::Buffer::same_as(a, b), )+
                    #[allow(unreachable_patterns)]
                    _ => false,
                }
            }

            fn write_at<T: $crate::Pod>(&self, offset: usize, data: &[T]) -> $crate::Result<()> {
                match self { $( $(#[$meta])* Self::$V(b) => $crate::Buffer::write_at(b, offset, data), )+ }
            }

            fn read_at<T: $crate::Pod>(&self, offset: usize, data: &mut [T]) -> $crate::Result<()> {
                match self { $( $(#[$meta])* Self::$V(b) => $crate::Buffer::read_at(b, offset, data), )+ }
            }

            fn queue_write_at(&self, offset: usize, bytes: &[u8]) -> $crate::Result<()> {
                match self { $( $(#[$meta])* Self::$V(b) => $crate::Buffer::queue_write_at(b, offset, bytes), )+ }
            }

            fn queue_read_at(&self, offset: usize, bytes: &mut [u8]) -> $crate::Result<()> {
                match self { $( $(#[$meta])* Self::$V(b) => $crate::Buffer::queue_read_at(b, offset, bytes), )+ }
            }

            #[inline]
            fn queue_ordered(&self) -> ::std::option::Option<&$crate::memory::QueueOrdered> {
                match self { $( $(#[$meta])* Self::$V(b) => $crate::Buffer::queue_ordered(b), )+ }
            }

            #[inline]
            fn give_back(&self) {
                match self { $( $(#[$meta])* Self::$V(b) => $crate::Buffer::give_back(b), )+ }
            }
        }
    };

    (@program $Set:ident, $Program:ident; $( $(#[$meta:meta])* $V:ident ),+) => {
        impl $crate::Program for $Program {
            type Backend = $Set;

            #[inline]
            fn signature(&self) -> &$crate::KernelSignature {
                match self { $( $(#[$meta])* Self::$V(p) => $crate::Program::signature(p), )+ }
            }

            #[inline]
            #[allow(unreachable_patterns)]
            fn same_as(&self, other: &Self) -> bool {
                match (self, other) {
                    $( $(#[$meta])* (Self::$V(a), Self::$V(b)) => $crate::Program::same_as(a, b), )+
                    _ => false,
                }
            }
        }
    };

    (@device $Set:ident, $Device:ident, $Queue:ident, $Signal:ident, $Buffer:ident; $( $(#[$meta:meta])* $V:ident ),+) => {
        impl $crate::QueueFactory for $Device {
            type Queue = $Queue;
            type Signal = $Signal;

            fn compute_queue(&self) -> $crate::Result<$Queue> {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::QueueFactory::compute_queue(d).map($Queue::$V), )+ }
            }

            fn copy_queue(&self) -> $crate::Result<::std::option::Option<$Queue>> {
                match self {
                    $( $(#[$meta])* Self::$V(d) => $crate::QueueFactory::copy_queue(d).map(|q| q.map($Queue::$V)), )+
                }
            }

            fn new_signal(&self, initial: u64) -> $crate::Result<$Signal> {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::QueueFactory::new_signal(d, initial).map($Signal::$V), )+ }
            }
        }

        impl $crate::Device for $Device {
            type Backend = $Set;

            fn spec(&self) -> $crate::DeviceSpec {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::spec(d), )+ }
            }

            fn name(&self) -> ::std::string::String {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::name(d), )+ }
            }

            fn limits(&self) -> $crate::Limits {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::limits(d), )+ }
            }

            fn alloc(&self, size: usize) -> $crate::Result<$Buffer> {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::alloc(d, size).map($Buffer::$V), )+ }
            }

            fn alloc_uninit(&self, size: usize) -> $crate::Result<$Buffer> {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::alloc_uninit(d, size).map($Buffer::$V), )+ }
            }

            fn memory_stats(&self) -> $crate::MemoryStats {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::memory_stats(d), )+ }
            }

            fn trim_memory(&self) -> usize {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::trim_memory(d), )+ }
            }

            fn memory_info(&self) -> ::core::option::Option<$crate::memory::DeviceMemory> {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::memory_info(d), )+ }
            }

            fn reset_peak_memory(&self) {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::reset_peak_memory(d), )+ }
            }

            fn set_memory_release_threshold(&self, bytes: usize) {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::set_memory_release_threshold(d, bytes), )+ }
            }

            fn set_memory_limit(&self, limit: ::std::option::Option<usize>) {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::set_memory_limit(d, limit), )+ }
            }

            fn health(&self) -> $crate::Result<()> {
                match self { $( $(#[$meta])* Self::$V(d) => $crate::Device::health(d), )+ }
            }
        }
    };

    // The set as a backend, its registry entries, and the compile-time
    // checks of the list.
    (@backend $Set:ident, $id:literal, $Device:ident, $Queue:ident, $Signal:ident, $Buffer:ident, $Program:ident; $( $(#[$meta:meta])* $V:ident: $B:ty => $D:ty, $Q:ty, $S:ty, $Bu:ty, $P:ty ),+) => {
        impl $crate::Backend for $Set {
            const ID: &'static str = $id;
            const PRECEDENCE: u32 = 0;
            const DISPATCHES: bool = true;
            const REFERENCE_ORACLE: bool = false;

            type Device = $Device;
            type Queue = $Queue;
            type Signal = $Signal;
            type Buffer = $Buffer;
            type Program = $Program;

            fn probe() -> $crate::Result<::std::vec::Vec<$crate::DeviceInfo>> {
                let mut found = ::std::vec::Vec::new();
                $( $(#[$meta])* {
                    if let Ok(devices) = <$B as $crate::Backend>::probe() {
                        found.extend(devices);
                    }
                } )+
                Ok(found)
            }

            fn open(ordinal: u32) -> $crate::Result<$Device> {
                let backend = $crate::preferred::<$Set>($crate::Policy::default())?;
                (backend.open)(ordinal)
            }
        }

        impl $crate::BackendSet for $Set {
            fn entries() -> &'static [$crate::BackendEntry<$Device>] {
                const ENTRIES: &[$crate::BackendEntry<$Device>] = &[
                    $( $(#[$meta])* $crate::BackendEntry {
                        id: <$B as $crate::Backend>::ID,
                        aliases: <$B as $crate::Backend>::ALIASES,
                        precedence: <$B as $crate::Backend>::PRECEDENCE,
                        dispatches: <$B as $crate::Backend>::DISPATCHES,
                        reference_oracle: <$B as $crate::Backend>::REFERENCE_ORACLE,
                        probe: <$B as $crate::Backend>::probe,
                        open: |ordinal| <$B as $crate::Backend>::open(ordinal).map($Device::$V),
                    }, )+
                ];
                ENTRIES
            }
        }

        // The listed types must be the backend's own associated types.
        $( $(#[$meta])* const _: () = $crate::any::assert_family::<$B, $D, $Q, $S, $Bu, $P>(); )+

        const _: () = $crate::any::check_backend_list(
            &[ $( $(#[$meta])* <$B as $crate::Backend>::ID, )+ ],
            &[ $( $(#[$meta])* <$B as $crate::Backend>::PRECEDENCE, )+ ],
        );
    };

    // Anything else: say what the input must look like.
    ($($input:tt)*) => {
        ::std::compile_error!(
            "backend_set!: the input does not have the expected form, which is
    /// docs
    pub backend SetName {
        id: \"set-id\",
        device: DeviceEnum, queue: QueueEnum, signal: SignalEnum,
        buffer: BufferEnum, program: ProgramEnum,
    }
    variants {
        #[cfg(...)]                                   // optional
        Variant(as_variant, as_variant_mut): BackendType {
            device: D, queue: Q, signal: S, buffer: B, program: P,
        },
        ...                                           // at least one
    }
(see the docs of `hwqueue::backend_set`)"
        );
    };
}
