//! hwqueue's element types and reductions as MPI's: datatype and operation
//! handles for `mpi.rs`'s calls.
//!
//! MPI's predefined types and operations cover `f32`, `f64`, `i32` and
//! `u32`. MPI has no 16-bit float type (nor do OpenMPI's and MPICH's
//! predefined operations reduce one), so `half::f16` and `half::bf16` (the
//! `half` feature) move as `MPI_UINT16_T`: bits, which is all a gather, a
//! broadcast or a send needs. Reductions of them use operations of our own,
//! made with `MPI_Op_create` (commutative): each combines element-wise in
//! `f32` and rounds back (`small.rs`'s `combine`, as collectives of up to
//! 1 KiB are reduced on the host), never with MPI's integer `MPI_SUM` over
//! the bits.
//!
//! The eight operations (two types, four reductions) are made once per
//! process, by `Mpi::init` once MPI is initialised ([`make_ops`]), and
//! kept in a `OnceLock`. They are never freed: `MPI_Finalize` releases
//! them with everything else, no collective runs after it (`mpi.rs`'s
//! `Life`), and MPI cannot be initialised again in a process, so no
//! handle is used after the MPI that made it is gone.

use std::ffi::c_int;
#[cfg(feature = "half")]
use std::ffi::c_void;
#[cfg(feature = "half")]
use std::sync::OnceLock;

use ::mpi::ffi;

use super::{CollectiveError, Element, Reduction};
use crate::error::{Error, Result};

#[cfg(feature = "half")]
use super::small::{Combine, combine};

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
            // Two bytes of bits: reductions use `op`'s own operations.
            #[cfg(feature = "half")]
            Element::F16 | Element::BF16 => ffi::RSMPI_UINT16_T,
        }
    }
}

/// Makes the operations that reduce 16-bit floats, if not made yet (a
/// no-op without the `half` feature). `Mpi::init` calls it once MPI is
/// initialised, so a failure fails `init` on every rank, not a collective
/// on one.
///
/// # Errors
/// [`CollectiveError::Mpi`](super::CollectiveError::Mpi) from
/// `MPI_Op_create`.
pub(super) fn make_ops() -> Result<()> {
    #[cfg(feature = "half")]
    half_ops(usize::MAX)?;
    Ok(())
}

/// The MPI operation that reduces `element`s by `reduction`: MPI's
/// predefined one, or for 16-bit floats ours (made by `Mpi::init`, or
/// here if not yet: MPI must be live, which a running collective
/// guarantees).
///
/// # Errors
/// [`CollectiveError::Mpi`](super::CollectiveError::Mpi) when
/// `MPI_Op_create` failed (which `Mpi::init` reports first).
pub(super) fn op(
    #[cfg_attr(not(feature = "half"), allow(unused_variables))] rank: usize,
    element: Element,
    reduction: Reduction,
) -> Result<ffi::MPI_Op> {
    match element {
        Element::F32 | Element::F64 | Element::I32 | Element::U32 => Ok(predefined(reduction)),
        #[cfg(feature = "half")]
        Element::F16 => half_ops(rank).map(|ops| ops.f16[index(reduction)]),
        #[cfg(feature = "half")]
        Element::BF16 => half_ops(rank).map(|ops| ops.bf16[index(reduction)]),
    }
}

fn predefined(reduction: Reduction) -> ffi::MPI_Op {
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

/// A reduction's place in [`HalfOps`]' rows and in [`HALF_FUNCTIONS`]'.
#[cfg(feature = "half")]
const fn index(reduction: Reduction) -> usize {
    match reduction {
        Reduction::Sum => 0,
        Reduction::Product => 1,
        Reduction::Min => 2,
        Reduction::Max => 3,
    }
}

/// The reduction at `index` (the inverse of [`index`]).
#[cfg(feature = "half")]
const fn reduction_at(index: u8) -> Reduction {
    match index {
        0 => Reduction::Sum,
        1 => Reduction::Product,
        2 => Reduction::Min,
        _ => Reduction::Max,
    }
}

/// The operations reducing 16-bit floats, by [`index`] of the reduction.
#[cfg(feature = "half")]
struct HalfOps {
    f16: [ffi::MPI_Op; 4],
    bf16: [ffi::MPI_Op; 4],
}

// SAFETY: `MPI_Op` handles are MPI's to use from any thread under
// `MPI_THREAD_MULTIPLE`, which `Mpi::init` requires; these are only read
// after `OnceLock` published them, and never freed (see the module docs).
#[cfg(feature = "half")]
unsafe impl Send for HalfOps {}
// SAFETY: as for `Send`: shared reads of thread-safe handles.
#[cfg(feature = "half")]
unsafe impl Sync for HalfOps {}

/// The user functions behind [`HalfOps`], in the same order.
#[cfg(feature = "half")]
const HALF_FUNCTIONS: [[ffi::MPI_User_function; 4]; 2] = [
    [
        Some(combine_halves::<half::f16, 0>),
        Some(combine_halves::<half::f16, 1>),
        Some(combine_halves::<half::f16, 2>),
        Some(combine_halves::<half::f16, 3>),
    ],
    [
        Some(combine_halves::<half::bf16, 0>),
        Some(combine_halves::<half::bf16, 1>),
        Some(combine_halves::<half::bf16, 2>),
        Some(combine_halves::<half::bf16, 3>),
    ],
];

/// The 16-bit operations, made by the first caller (`Mpi::init`, MPI
/// initialised), or the `MPI_Op_create` failure, which every caller then
/// reports.
#[cfg(feature = "half")]
fn half_ops(rank: usize) -> Result<&'static HalfOps> {
    static OPS: OnceLock<std::result::Result<HalfOps, c_int>> = OnceLock::new();
    let made = OPS.get_or_init(|| {
        let mut ops = HalfOps {
            // Overwritten below, or never read (an error is kept instead).
            f16: [predefined(Reduction::Sum); 4],
            bf16: [predefined(Reduction::Sum); 4],
        };
        for (row, functions) in [&mut ops.f16, &mut ops.bf16]
            .into_iter()
            .zip(HALF_FUNCTIONS)
        {
            for (slot, function) in row.iter_mut().zip(functions) {
                // SAFETY: MPI is initialised and not finalised (the
                // caller, `Mpi::init` or a collective, holds its life);
                // `function` is a C-ABI user function that never unwinds
                // (`combine_halves`); `slot` is written before MPI
                // returns. Commutative (1): MPI may combine in any order.
                let code = unsafe { ffi::MPI_Op_create(function, 1, slot) };
                if code != ffi::MPI_SUCCESS as c_int {
                    return Err(code);
                }
            }
        }
        Ok(ops)
    });
    match made {
        Ok(ops) => Ok(ops),
        Err(code) => Err(mpi_error(rank, "MPI_Op_create", *code)),
    }
}

/// The MPI user function reducing 16-bit floats `T` by the reduction at
/// `REDUCTION` ([`reduction_at`]): `inoutvec[i] = invec[i] op
/// inoutvec[i]` for `i < *len`, each in `f32`, rounded back
/// ([`combine`]). Called by MPI, from C: it must not unwind, so nothing in
/// it panics (no indexing, no unwrap; [`Combine`]'s 16-bit methods are
/// plain arithmetic and bit conversions).
///
/// # Safety
/// MPI's contract for a user function, and hwqueue's use of it: `invec`
/// and `inoutvec` each hold `*len` elements of the datatype the operation
/// was called with, which is always `MPI_UINT16_T` (2 bytes, the size of
/// `T`; the operations are private to this module and `op` hands them out
/// only for `F16` and `BF16`, whose datatype that is); `inoutvec` is
/// writable and does not overlap `invec`.
#[cfg(feature = "half")]
unsafe extern "C" fn combine_halves<T: Combine, const REDUCTION: u8>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut ffi::MPI_Datatype,
) {
    const { assert!(size_of::<T>() == 2) };
    if invec.is_null() || inoutvec.is_null() || len.is_null() {
        return;
    }
    // SAFETY: `len` is MPI's count, non-null (checked), valid to read.
    let count = usize::try_from(unsafe { len.read() }).unwrap_or(0);
    let reduction = reduction_at(REDUCTION);
    let (theirs, ours) = (invec.cast_const().cast::<T>(), inoutvec.cast::<T>());
    for i in 0..count {
        // SAFETY: `i < count`, and each vector holds `count` elements of
        // `T`'s size (the function's contract); MPI promises no alignment
        // beyond the datatype's, so unaligned reads and writes.
        unsafe {
            let earlier = theirs.add(i).read_unaligned();
            let slot = ours.add(i);
            slot.write_unaligned(combine(reduction, earlier, slot.read_unaligned()));
        }
    }
}

/// `code` as a result: MPI's text for it when it is not `MPI_SUCCESS`.
pub(super) fn check(rank: usize, call: &'static str, code: c_int) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    Err(mpi_error(rank, call, code))
}

/// The error of `call`, which returned `code` (not `MPI_SUCCESS`), with
/// MPI's text for it.
pub(super) fn mpi_error(rank: usize, call: &'static str, code: c_int) -> Error {
    let mut text = vec![0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: `text` has room for MPI_MAX_ERROR_STRING (256 in OpenMPI and
    // MPICH) characters; `len` receives how many were written.
    unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr().cast(), &mut len) };
    text.truncate(usize::try_from(len).unwrap_or(0).min(512));
    Error::from(CollectiveError::Mpi {
        rank,
        call,
        code,
        message: String::from_utf8_lossy(&text).into_owned(),
    })
}
