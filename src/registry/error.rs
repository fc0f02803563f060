//! [`RegistryError`]: what the registry refuses when it selects or opens a
//! device, carried by [`Error::Registry`](crate::Error::Registry). The
//! errors of a backend's own open (no driver, no such device, ...) are the
//! crate's ([`Error`](crate::Error)); these are the registry's rules.

/// A selection or an open the registry refused. Each names the spec and
/// ends with what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Selection found no backend it may return.
    #[error(
        "no backend can run work: {reason}; install a driver, enable a backend feature, or \
         allow the fallback to the CPU (`Policy::default()`)"
    )]
    NoUsableBackend {
        /// What selection found.
        reason: String,
    },

    /// No spec of a preference list
    /// ([`Registry::select_from`](crate::Registry::select_from)) opened.
    #[error(
        "none of the preferred devices opened ({tried}); fix the ones that failed as their \
         errors say, or end the list with a device that is always there, such as `cpu`"
    )]
    NoPreferenceOpened {
        /// Each spec tried, in order, and why it did not open.
        tried: String,
    },

    /// A backend's `open` asked the registry for the very spec it opens.
    #[error(
        "opening `{spec}` asked the registry for `{spec}` itself; a device open must not acquire \
         its own spec"
    )]
    ReentrantOpen {
        /// The spec being opened.
        spec: String,
    },

    /// Device opens that acquire each other's specs (an open of `a` asks
    /// for `b`, whose open, on another thread, asks for `a`): each would
    /// wait for the other for good, so the one that would close the cycle
    /// is refused.
    #[error(
        "device opens wait for each other in a cycle ({cycle}): an open must not acquire a spec \
         whose open acquires it in turn; open those devices one after the other instead"
    )]
    OpenCycle {
        /// The specs, from the one refused round to it.
        cycle: String,
    },

    /// A backend's `open` panicked; the spec stays closed, and the next
    /// caller tries again.
    #[error("opening `{spec}` panicked: {message}; this is a bug in the `{backend}` backend")]
    OpenPanicked {
        /// The backend id.
        backend: &'static str,
        /// The spec being opened.
        spec: String,
        /// The panic message.
        message: String,
    },
}
