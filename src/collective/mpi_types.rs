//! hwqueue's element types and reductions as MPI's: datatype and operation
//! handles for `mpi.rs`'s calls (MPI's predefined ones).

use ::mpi::ffi;

use super::{Element, Reduction};

/// `MPI_UINT64_T`, the description exchange's words.
pub(super) fn u64_type() -> ffi::MPI_Datatype {
    // SAFETY: reading one of MPI's predefined handles, set at load.
    unsafe { ffi::RSMPI_UINT64_T }
}

/// The MPI datatype `element` moves as.
pub(super) fn datatype(element: Element) -> ffi::MPI_Datatype {
    // SAFETY: as in `u64_type`.
    unsafe {
        match element {
            Element::F32 => ffi::RSMPI_FLOAT,
            Element::F64 => ffi::RSMPI_DOUBLE,
            Element::I32 => ffi::RSMPI_INT32_T,
            Element::U32 => ffi::RSMPI_UINT32_T,
        }
    }
}

/// The MPI operation that reduces by `reduction`.
pub(super) fn op(reduction: Reduction) -> ffi::MPI_Op {
    // SAFETY: as in `u64_type`.
    unsafe {
        match reduction {
            Reduction::Sum => ffi::RSMPI_SUM,
            Reduction::Product => ffi::RSMPI_PROD,
            Reduction::Min => ffi::RSMPI_MIN,
            Reduction::Max => ffi::RSMPI_MAX,
        }
    }
}
