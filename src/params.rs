//! Work sizes of a kernel launch, and the limits a backend puts on them.

use std::fmt;

use crate::error::{Error, Result};

/// Global and local work sizes in one to three dimensions.
///
/// The grid is `global / local` work-groups per dimension, each of `local`
/// work-items (CUDA: grid = global / local, block = local). **Rule:** every
/// size is at least 1, and each global size is a whole multiple of its local
/// size. Construction never fails or panics; the sizes are checked against
/// this rule and the backend's [`Limits`] when the `exec` is recorded, and a
/// violation fails the batch at `submit` with [`Error::InvalidExecParams`].
///
/// A work-group may also ask for dynamic shared memory
/// ([`with_shared_memory`](Self::with_shared_memory)): CUDA's `extern
/// __shared__` array, up to the device's [`Limits::max_shared_memory`].
#[derive(Debug, Clone, Copy, Eq, bytemuck::NoUninit)]
#[repr(C)]
pub struct ExecParams {
    global: [u32; 3],
    local: [u32; 3],
    shared_memory: u32,
    /// 1 to 3, in a `u32`: with no padding in the struct, equality is one
    /// comparison of its 32 bytes.
    dims: u32,
}

/// Byte for byte (the fields, since there is no padding): an `exec` compares
/// its work sizes with the last one's when it is recorded and again when it
/// is launched, and a field-by-field comparison was a tenth of hwqueue's own
/// cost of a repeated CUDA `exec`.
impl PartialEq for ExecParams {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        bytemuck::bytes_of(self) == bytemuck::bytes_of(other)
    }
}

/// By the same bytes as equality.
impl std::hash::Hash for ExecParams {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        bytemuck::bytes_of(self).hash(state);
    }
}

impl ExecParams {
    /// One dimension: `global` work-items in groups of `local`.
    pub const fn new_1d(global: u32, local: u32) -> Self {
        Self {
            global: [global, 1, 1],
            local: [local, 1, 1],
            dims: 1,
            shared_memory: 0,
        }
    }

    /// Two dimensions (x, y).
    pub const fn new_2d(global: [u32; 2], local: [u32; 2]) -> Self {
        Self {
            global: [global[0], global[1], 1],
            local: [local[0], local[1], 1],
            dims: 2,
            shared_memory: 0,
        }
    }

    /// Three dimensions (x, y, z).
    pub const fn new_3d(global: [u32; 3], local: [u32; 3]) -> Self {
        Self {
            global,
            local,
            dims: 3,
            shared_memory: 0,
        }
    }

    /// The same sizes, with `bytes` of dynamic shared memory per work-group
    /// (CUDA: the launch's `sharedMemBytes`, the kernel's `extern
    /// __shared__` array). Checked against [`Limits::max_shared_memory`]
    /// (and, on CUDA, what the kernel's own static shared memory leaves) at
    /// `submit`.
    #[must_use]
    pub const fn with_shared_memory(mut self, bytes: u32) -> Self {
        self.shared_memory = bytes;
        self
    }

    /// Bytes of dynamic shared memory per work-group (0 unless
    /// [`with_shared_memory`](Self::with_shared_memory) set them).
    pub const fn shared_memory(&self) -> u32 {
        self.shared_memory
    }

    /// How many dimensions were given (1 to 3).
    pub const fn dims(&self) -> u8 {
        // Only the constructors set it, to 1, 2 or 3.
        self.dims as u8
    }

    /// Global sizes; unused dimensions are 1.
    pub const fn global(&self) -> [u32; 3] {
        self.global
    }

    /// Local (work-group) sizes; unused dimensions are 1.
    pub const fn local(&self) -> [u32; 3] {
        self.local
    }

    /// Work-groups per dimension (`global / local`). Meaningful once
    /// [`validate`](Self::validate) passed.
    pub const fn groups(&self) -> [u32; 3] {
        [
            div_or_zero(self.global[0], self.local[0]),
            div_or_zero(self.global[1], self.local[1]),
            div_or_zero(self.global[2], self.local[2]),
        ]
    }

    /// Total work-groups, saturating at `u64::MAX` (which
    /// [`validate`](Self::validate) rejects, so a validated count is exact).
    pub const fn group_count(&self) -> u64 {
        let g = self.groups();
        (g[0] as u64)
            .saturating_mul(g[1] as u64)
            .saturating_mul(g[2] as u64)
    }

    /// Work-items in one work-group.
    pub const fn local_count(&self) -> u64 {
        (self.local[0] as u64)
            .saturating_mul(self.local[1] as u64)
            .saturating_mul(self.local[2] as u64)
    }

    /// Checks the rule above and `limits`.
    ///
    /// # Errors
    /// [`Error::InvalidExecParams`] naming the first violation and the fix.
    pub fn validate(&self, limits: &Limits) -> Result<()> {
        let fail = |reason: String| {
            Err(Error::InvalidExecParams {
                params: self.to_string(),
                reason,
            })
        };
        for d in 0..3 {
            let axis = ["x", "y", "z"][d];
            let (global, local) = (self.global[d], self.local[d]);
            if global == 0 || local == 0 {
                return fail(format!(
                    "{axis} size is zero; every global and local size must be at least 1"
                ));
            }
            if global % local != 0 {
                // In u64: rounding up a global size near u32::MAX overflows.
                let up = u64::from(global).div_ceil(u64::from(local)) * u64::from(local);
                let fix = if up <= u64::from(u32::MAX) {
                    format!("round global up to {up} and guard the tail in the kernel")
                } else {
                    format!("round global down to {}", global / local * local)
                };
                return fail(format!(
                    "global {axis} size {global} is not a multiple of local {axis} size {local}; \
                     {fix}"
                ));
            }
            if local > limits.max_local_size[d] {
                return fail(format!(
                    "local {axis} size {local} exceeds this device's limit of {}",
                    limits.max_local_size[d]
                ));
            }
            let groups = global / local;
            if groups > limits.max_groups[d] {
                return fail(format!(
                    "{groups} work-groups along {axis} exceed this device's limit of {}; use \
                     larger work-groups",
                    limits.max_groups[d]
                ));
            }
        }
        let [gx, gy, gz] = self.groups().map(u128::from);
        let groups = gx * gy * gz;
        if groups >= u128::from(u64::MAX) {
            return fail(format!(
                "{groups} work-groups in all overflow a 64-bit count; use larger work-groups, or \
                 split the launch"
            ));
        }
        if self.shared_memory > limits.max_shared_memory {
            let fix = if limits.max_shared_memory == 0 {
                "this backend has no shared memory: give the kernel a scratch buffer instead"
            } else {
                "use less per work-group (smaller work-groups, or tiles)"
            };
            return fail(format!(
                "{} bytes of dynamic shared memory per work-group exceed this device's limit of \
                 {} bytes; {fix}",
                self.shared_memory, limits.max_shared_memory
            ));
        }
        if self.local_count() > u64::from(limits.max_local_count) {
            return fail(format!(
                "a work-group of {} work-items exceeds this device's limit of {}; use smaller local \
                 sizes",
                self.local_count(),
                limits.max_local_count
            ));
        }
        Ok(())
    }
}

const fn div_or_zero(a: u32, b: u32) -> u32 {
    match a.checked_div(b) {
        Some(quotient) => quotient,
        None => 0,
    }
}

impl fmt::Display for ExecParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.dims.clamp(1, 3) as usize;
        write!(
            f,
            "global {:?} local {:?}",
            &self.global[..d],
            &self.local[..d]
        )?;
        if self.shared_memory > 0 {
            write!(f, " shared memory {} bytes", self.shared_memory)?;
        }
        Ok(())
    }
}

/// What a device allows in one `exec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest local size per dimension.
    pub max_local_size: [u32; 3],
    /// Largest work-items per work-group.
    pub max_local_count: u32,
    /// Largest work-group count per dimension.
    pub max_groups: [u32; 3],
    /// Largest number of buffer arguments to one kernel.
    pub max_buffers: usize,
    /// Largest dynamic shared memory per work-group, in bytes (CUDA: the
    /// device's opt-in maximum; 0 where the backend has none, as the CPU).
    pub max_shared_memory: u32,
    /// The byte offset of a [`View`](crate::View) passed to `exec` must be
    /// a multiple of this (a power of two): a kernel reads its elements,
    /// vectors included, at their alignment from the view's start. Copies,
    /// fills and transfers take views at any offset (a fill: a multiple of
    /// its pattern's width).
    pub view_alignment: usize,
}
