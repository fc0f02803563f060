//! What hwqueue makes of failures it did not raise itself: a caught
//! panic's payload ([`panic_message`]), and a backend's own error kept as
//! the source of [`Error::Backend`] ([`BackendSource`]). Public for engines
//! written outside the crate.

use std::fmt;
use std::sync::Arc;

use super::Error;

/// The message of a caught panic (a kernel's, a backend open's), and the
/// end of its payload.
///
/// The payload is the one `dyn` that `catch_unwind` hands back. Dropping it
/// runs its `Drop`, which is arbitrary code and may panic in turn: that
/// second panic is caught too, and its own payload is dropped only if it is
/// a message (`&str` or `String`, the payload of every `panic!` with text,
/// whose drop cannot panic); any other is leaked rather than dropped (it
/// could panic again). So no payload can unwind out of here and kill the
/// thread that caught the first panic. Public for engines written outside
/// the crate, which catch their kernels' panics the same way.
pub fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let message = if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "it panicked with a non-string payload".to_owned()
    };
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
    if let Err(second) = dropped
        && !(second.is::<&'static str>() || second.is::<String>())
    {
        std::mem::forget(second);
    }
    message
}

/// A backend's own error, in [`Error::Backend`]: shared, so that `Error`
/// stays `Clone`, and handed out by `source()` as that error itself (not
/// as the `Arc` around it), so a caller walking the chain can downcast it
/// to the backend's type. Derefs to the error.
#[derive(Clone)]
pub struct BackendSource(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl std::ops::Deref for BackendSource {
    type Target = dyn std::error::Error + Send + Sync + 'static;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Display for BackendSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl fmt::Debug for BackendSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Error {
    /// [`Error::Backend`]: backend `backend` failed at `what` with its own
    /// error `source`.
    pub fn backend(
        backend: &'static str,
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Backend {
            backend,
            what: what.into(),
            source: BackendSource(Arc::new(source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    /// A backend outside the crate keeps its own error as the source: the
    /// message names the backend and the step, and the chain reaches the
    /// original error, typed.
    #[test]
    fn a_backend_error_keeps_its_source() {
        let io = std::io::Error::new(std::io::ErrorKind::OutOfMemory, "the arena is full");
        let error = Error::backend("sim", "mapping the arena", io);
        assert_eq!(
            error.to_string(),
            "sim: mapping the arena failed: the arena is full"
        );
        let source = std::error::Error::source(&error).expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the backend's own error type");
        assert_eq!(io.kind(), std::io::ErrorKind::OutOfMemory);
    }
}
