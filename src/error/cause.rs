//! Following a chain of wrapped errors to the failure that started it.

use super::Error;

impl Error {
    /// The deepest cause of a chain of wrapped errors (`SignalFailed`,
    /// `QueueFailed`, …): the failure that started it.
    pub fn root_cause(&self) -> &Error {
        let mut error = self;
        loop {
            match error {
                Error::SignalFailed { cause, .. }
                | Error::EarlierBatchFailed { cause }
                | Error::RanBehindAbandoned { cause }
                | Error::QueueFailed { cause }
                | Error::BatchRejected { cause }
                | Error::OperationFailed { cause, .. }
                | Error::RunRefused { cause, .. } => error = cause,
                _ => return error,
            }
        }
    }
}
