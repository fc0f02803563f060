//! The pieces of [`Error`]'s messages that are worked out rather than
//! written in the variant's `#[error]` text: memory figures, what the
//! owner of a failed queue can do next, where a run was refused.

use super::Error;

/// The figures of an out-of-memory error: the pool's, and the device's
/// where known.
pub(super) fn memory_figures(
    in_use: usize,
    reserved: usize,
    device_free: Option<u64>,
    device_total: Option<u64>,
) -> String {
    use crate::memory::stats::Bytes;
    let mut figures = format!(
        "the pool had {} in use and {} reserved",
        Bytes(in_use),
        Bytes(reserved)
    );
    if let (Some(free), Some(total)) = (device_free, device_total) {
        figures += &format!(
            "; the device has {} free of {}",
            Bytes(usize::try_from(free).unwrap_or(usize::MAX)),
            Bytes(usize::try_from(total).unwrap_or(usize::MAX))
        );
    }
    figures
}

/// What a queue's owner can do after `cause` failed a batch: go on, unless
/// the device is lost or the queue stalled.
pub(super) fn after_failure(cause: &Error) -> &'static str {
    match cause.root_cause() {
        Error::DeviceLost { .. } => {
            "the queue's device is lost, so the queue is not usable again: drop it and restart \
             the process"
        }
        Error::QueueStalled { .. } => "the queue is not usable again: drop it",
        _ => "the queue is usable again",
    }
}

/// `" at operation `name` (slot `s` bound to ...)"`, for [`Error::RunRefused`].
pub(super) fn refused_at(operation: Option<&str>, bindings: &[String]) -> String {
    let mut text = match operation {
        Some(operation) => format!(" at operation `{operation}`"),
        None => String::new(),
    };
    if !bindings.is_empty() {
        text += &format!(" ({})", bindings.join(", "));
    }
    text
}
