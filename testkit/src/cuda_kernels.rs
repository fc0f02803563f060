//! Every CUDA C kernel the crate ships (the demo's, the tests', the
//! benches', the conformance suite's), each with the signature its callers declare: the tests and
//! benches load them from here, and `tests/nvrtc.rs` compiles each with a
//! real NVRTC for several architectures and checks its PTX parameters
//! against that signature, so a kernel and its declaration cannot drift.

#[path = "../../examples/demo/kernels.rs"]
pub mod demo;

/// One kernel: where it is used, its source, its entry point, and the
/// buffers and scalars it is declared with.
#[derive(Debug, Clone)]
pub struct CudaKernel {
    /// The file that loads it.
    pub origin: &'static str,
    /// Its CUDA C (which may hold other kernels too).
    pub source: String,
    /// Its `extern "C"` entry point.
    pub entry: &'static str,
    /// The buffers it is declared with.
    pub buffers: usize,
    /// The scalars it is declared with, after the buffers.
    pub scalars: usize,
}

/// The kernels of `tests/cuda.rs`.
pub const TESTS: &str = r#"
extern "C" __global__ void add(const float *a, const float *b, float *c, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}

extern "C" __global__ void increment(const unsigned int *src, unsigned int *dst) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    dst[i] = src[i] + 1;
}

extern "C" __global__ void fill(unsigned int *out, unsigned int value) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = value;
}

extern "C" __global__ void spin(unsigned long long cycles) {
    long long start = clock64();
    while ((unsigned long long)(clock64() - start) < cycles) {
    }
}

// Spins, then writes `value` to `mark[0]`: a witness of which kernel ran.
extern "C" __global__ void spin_and_mark(unsigned int *mark, unsigned long long cycles,
                                         unsigned int value) {
    long long start = clock64();
    while ((unsigned long long)(clock64() - start) < cycles) {
    }
    mark[0] = value;
}

// atomicAdd on double needs sm_60: compiles only when NVRTC targets the GPU.
extern "C" __global__ void sum_f64(double *total, double value) {
    atomicAdd(total, value);
}

// Fills 64 KiB of dynamic shared memory (above the 48 KiB default), then
// sums it into out[0].
extern "C" __global__ void shared_sum(unsigned int *out) {
    extern __shared__ unsigned int scratch[];
    const unsigned int n = 16384;
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) {
        scratch[i] = i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int sum = 0;
        for (unsigned int i = 0; i < n; i++) {
            sum += scratch[i];
        }
        out[0] = sum;
    }
}
"#;

/// The entry points of [`TESTS`] with their declared buffers and scalars.
pub const TEST_SIGNATURES: &[(&str, usize, usize)] = &[
    ("add", 3, 1),
    ("increment", 2, 0),
    ("fill", 1, 1),
    ("spin", 0, 1),
    ("spin_and_mark", 1, 2),
    ("sum_f64", 1, 1),
    ("shared_sum", 1, 0),
];

/// The declared `(buffers, scalars)` of test kernel `entry`.
///
/// # Panics
/// If [`TEST_SIGNATURES`] has no such entry.
pub fn test_signature(entry: &str) -> (usize, usize) {
    TEST_SIGNATURES
        .iter()
        .find(|(name, _, _)| *name == entry)
        .map(|(_, buffers, scalars)| (*buffers, *scalars))
        .unwrap_or_else(|| panic!("no test kernel `{entry}` in TEST_SIGNATURES"))
}

/// `tests/cuda_fault.rs`'s kernel: writes through a wild pointer.
pub const FAULT: &str = r#"
extern "C" __global__ void write_through(unsigned int *out) {
    // An address no allocation holds: an illegal-address fault.
    unsigned int *wild = (unsigned int *)0x10;
    wild[threadIdx.x] = 1;
    out[0] = 1;
}
"#;

/// `benches/cuda.rs`'s kernel: does nothing, to time a launch.
pub const EMPTY: &str = r#"extern "C" __global__ void empty() {}"#;

/// Every kernel the crate ships.
pub fn shipped() -> Vec<CudaKernel> {
    let mut kernels: Vec<CudaKernel> = demo::cuda_kernels()
        .into_iter()
        .map(|(entry, source)| CudaKernel {
            origin: "examples/demo",
            source,
            entry,
            buffers: demo::buffers(entry),
            scalars: 0,
        })
        .collect();
    kernels.extend(
        TEST_SIGNATURES
            .iter()
            .map(|&(entry, buffers, scalars)| CudaKernel {
                origin: "tests/cuda.rs",
                source: TESTS.to_owned(),
                entry,
                buffers,
                scalars,
            }),
    );
    kernels.push(CudaKernel {
        origin: "tests/cuda_fault.rs",
        source: FAULT.to_owned(),
        entry: "write_through",
        buffers: 1,
        scalars: 0,
    });
    kernels.push(CudaKernel {
        origin: "benches/cuda.rs",
        source: EMPTY.to_owned(),
        entry: "empty",
        buffers: 0,
        scalars: 0,
    });
    kernels.push(CudaKernel {
        origin: "tests/cts.rs (hwqueue_cts::ADD_CUDA_C)",
        source: hwqueue_cts::ADD_CUDA_C.to_owned(),
        entry: "add",
        buffers: 1,
        scalars: 1,
    });
    kernels
}
