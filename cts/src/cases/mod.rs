//! The cases, one generic function each, grouped by what they check. Each
//! takes a [`Cx`](crate::Cx) and panics, naming the rule it found broken,
//! when the backend breaks the contract.

mod commands;
mod flow;
mod queue;
mod signal;

pub use commands::*;
pub use flow::*;
pub use queue::*;
pub use signal::*;
