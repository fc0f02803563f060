//! The demo's kernels, generated as a compiler would: C for the CPU backend,
//! CUDA C for a CUDA GPU, WGSL for Vulkan, the model's shapes baked in. A module of its own so
//! that the NVRTC test (`tests/nvrtc.rs`, through testkit's
//! `cuda_kernels`) compiles exactly these.

/// The model's input features.
pub const INPUT: usize = 256;
/// Its hidden units.
pub const HIDDEN: usize = 512;
/// Its output classes.
pub const OUTPUT: usize = 16;

/// How many buffers kernel `name` takes (none takes scalars).
pub fn buffers(name: &str) -> usize {
    match name {
        "bias_relu" => 2,
        _ => 3,
    }
}

/// The C a compiler's CPU backend would emit for this model: one function
/// per kernel, shapes baked in, called once per work-group.
pub fn c_kernels() -> [(&'static str, String); 4] {
    let matmul = |name: &str, k: usize, n: usize| {
        format!(
            r#"
HWQ_KERNEL({name}) {{
    const float *a = buffers[0], *b = buffers[1];
    float *c = buffers[2];
    size_t col0 = hwq_global_start(group, 0), row0 = hwq_global_start(group, 1);
    size_t cols = group->local[0], rows = group->local[1];
    for (size_t r = row0; r < row0 + rows; r++) {{
        float *out = c + r * {n} + col0;
        for (size_t j = 0; j < cols; j++) out[j] = 0.0f;
        for (size_t k = 0; k < {k}; k++) {{
            float av = a[r * {k} + k];
            const float *brow = b + k * {n} + col0;
            for (size_t j = 0; j < cols; j++) out[j] += av * brow[j];
        }}
    }}
}}"#
        )
    };
    let bias_relu = format!(
        r#"
HWQ_KERNEL(bias_relu) {{
    float *h = buffers[0];
    const float *bias = buffers[1];
    size_t col0 = hwq_global_start(group, 0), row0 = hwq_global_start(group, 1);
    for (size_t r = row0; r < row0 + group->local[1]; r++)
        for (size_t j = col0; j < col0 + group->local[0]; j++) {{
            float v = h[r * {HIDDEN} + j] + bias[j];
            h[r * {HIDDEN} + j] = v > 0.0f ? v : 0.0f;
        }}
}}"#
    );
    let bias_softmax = format!(
        r#"
#include <math.h>
HWQ_KERNEL(bias_softmax) {{
    const float *logits = buffers[0], *bias = buffers[1];
    float *probs = buffers[2];
    size_t row0 = hwq_global_start(group, 0);
    for (size_t r = row0; r < row0 + group->local[0]; r++) {{
        float *p = probs + r * {OUTPUT};
        float max = -INFINITY;
        for (size_t j = 0; j < {OUTPUT}; j++) {{
            p[j] = logits[r * {OUTPUT} + j] + bias[j];
            if (p[j] > max) max = p[j];
        }}
        float sum = 0.0f;
        for (size_t j = 0; j < {OUTPUT}; j++) {{ p[j] = expf(p[j] - max); sum += p[j]; }}
        for (size_t j = 0; j < {OUTPUT}; j++) p[j] /= sum;
    }}
}}"#
    );
    [
        ("matmul1", matmul("matmul1", INPUT, HIDDEN)),
        ("bias_relu", bias_relu),
        ("matmul2", matmul("matmul2", HIDDEN, OUTPUT)),
        ("bias_softmax", bias_softmax),
    ]
}

/// The same kernels as CUDA C: one thread per output element (per row for
/// the softmax).
pub fn cuda_kernels() -> [(&'static str, String); 4] {
    let matmul = |name: &str, k: usize, n: usize| {
        format!(
            r#"extern "C" __global__ void {name}(const float *a, const float *b, float *c) {{
    unsigned j = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y * blockDim.y + threadIdx.y;
    float acc = 0.0f;
    for (unsigned k = 0; k < {k}; k++) acc += a[r * {k} + k] * b[k * {n} + j];
    c[r * {n} + j] = acc;
}}"#
        )
    };
    [
        ("matmul1", matmul("matmul1", INPUT, HIDDEN)),
        (
            "bias_relu",
            format!(
                r#"extern "C" __global__ void bias_relu(float *h, const float *bias) {{
    unsigned j = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y * blockDim.y + threadIdx.y;
    float v = h[r * {HIDDEN} + j] + bias[j];
    h[r * {HIDDEN} + j] = v > 0.0f ? v : 0.0f;
}}"#
            ),
        ),
        ("matmul2", matmul("matmul2", HIDDEN, OUTPUT)),
        (
            "bias_softmax",
            format!(
                r#"extern "C" __global__ void bias_softmax(const float *logits, const float *bias, float *probs) {{
    unsigned r = blockIdx.x * blockDim.x + threadIdx.x;
    float *p = probs + r * {OUTPUT};
    // -infinity from its bits: NVRTC defines no INFINITY without headers.
    float max = __int_as_float(0xff800000);
    for (unsigned j = 0; j < {OUTPUT}; j++) {{ p[j] = logits[r * {OUTPUT} + j] + bias[j]; max = fmaxf(max, p[j]); }}
    float sum = 0.0f;
    for (unsigned j = 0; j < {OUTPUT}; j++) {{ p[j] = expf(p[j] - max); sum += p[j]; }}
    for (unsigned j = 0; j < {OUTPUT}; j++) p[j] /= sum;
}}"#
            ),
        ),
    ]
}

/// The same kernels as WGSL for the Vulkan backend (naga compiles them to
/// SPIR-V): one invocation per output element (per row for the softmax),
/// the work-group size taken from each exec (`override`s).
pub fn wgsl_kernels() -> [(&'static str, String); 4] {
    const HEADER: &str = "override local_x: u32 = 64;
override local_y: u32 = 1;
override local_z: u32 = 1;
";
    let matmul = |name: &str, k: usize, n: usize| {
        format!(
            r#"{HEADER}
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(local_x, local_y, local_z)
fn {name}(@builtin(global_invocation_id) id: vec3<u32>) {{
    let j = id.x;
    let r = id.y;
    var acc = 0.0;
    for (var k = 0u; k < {k}u; k++) {{
        acc += a[r * {k}u + k] * b[k * {n}u + j];
    }}
    c[r * {n}u + j] = acc;
}}"#
        )
    };
    [
        ("matmul1", matmul("matmul1", INPUT, HIDDEN)),
        (
            "bias_relu",
            format!(
                r#"{HEADER}
@group(0) @binding(0) var<storage, read_write> h: array<f32>;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@compute @workgroup_size(local_x, local_y, local_z)
fn bias_relu(@builtin(global_invocation_id) id: vec3<u32>) {{
    let i = id.y * {HIDDEN}u + id.x;
    h[i] = max(h[i] + bias[id.x], 0.0);
}}"#
            ),
        ),
        ("matmul2", matmul("matmul2", HIDDEN, OUTPUT)),
        (
            "bias_softmax",
            format!(
                r#"{HEADER}
@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@group(0) @binding(2) var<storage, read_write> probs: array<f32>;
@compute @workgroup_size(local_x, local_y, local_z)
fn bias_softmax(@builtin(global_invocation_id) id: vec3<u32>) {{
    let row = id.x * {OUTPUT}u;
    var top = bitcast<f32>(0xff800000u);
    for (var j = 0u; j < {OUTPUT}u; j++) {{
        probs[row + j] = logits[row + j] + bias[j];
        top = max(top, probs[row + j]);
    }}
    var sum = 0.0;
    for (var j = 0u; j < {OUTPUT}u; j++) {{
        probs[row + j] = exp(probs[row + j] - top);
        sum += probs[row + j];
    }}
    for (var j = 0u; j < {OUTPUT}u; j++) {{
        probs[row + j] = probs[row + j] / sum;
    }}
}}"#
            ),
        ),
    ]
}
