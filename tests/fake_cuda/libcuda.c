/*
 * A fake NVIDIA driver library (`libcuda.so`) for tests/cuda_fake_driver.rs.
 *
 * The test compiles this file with `cc -shared -fPIC`, puts the result first
 * on LD_LIBRARY_PATH of a child process, and cudarc (which dlopens
 * `libcuda.so` by name and resolves each `cu*` symbol on its first call)
 * loads it instead of the real driver. That lets a machine without a GPU
 * reproduce driver failures that otherwise need broken hardware or a broken
 * installation, e.g. `cuInit` answering CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE.
 *
 * Behaviour is chosen by environment variables, read on every call:
 *   HWQUEUE_FAKE_CUINIT          what cuInit returns (a CUresult number;
 *                                default 0, CUDA_SUCCESS)
 *   HWQUEUE_FAKE_DRIVER_VERSION  what cuDriverGetVersion reports (default
 *                                12020, CUDA 12.2)
 *   HWQUEUE_FAKE_DEVICE_COUNT    devices after a successful cuInit (default 0)
 *   HWQUEUE_FAKE_CALLS           if set, a file each entry point appends its
 *                                name to (one a line): proof the fake was the
 *                                library loaded, and the list of symbols a
 *                                path needs
 *   HWQUEUE_FAKE_MAX_PTX_ISA     the newest PTX ISA the JIT accepts, as
 *                                10 * major + minor (82: ISA 8.2, what a
 *                                CUDA 12.2 driver reads); a module of a newer
 *                                `.version` is CUDA_ERROR_UNSUPPORTED_PTX_VERSION.
 *                                Unset: every version loads
 *   HWQUEUE_FAKE_FAULT_AFTER     the name of an entry point that puts work on
 *                                a stream (cuMemcpyHtoDAsync_v2, cuLaunchKernel,
 *                                cuEventRecord, ...): once it has been called
 *                                (successfully), the device has
 *                                faulted (see "Faults" below). Unset: never
 *   HWQUEUE_FAKE_FAULT           the fault's CUresult (default 700,
 *                                CUDA_ERROR_ILLEGAL_ADDRESS)
 *   HWQUEUE_FAKE_FAULT_SEEN_BY   a comma-separated list of the entry points
 *                                that report the fault; unset: all that can
 *   HWQUEUE_FAKE_FAULT_TIMES     if set, how many calls report the fault (the
 *                                first ones after it, all listed entry points
 *                                together); the later ones succeed, as a
 *                                driver whose error was not sticky may go
 *                                on answering. Unset: every one
 *   HWQUEUE_FAKE_LAUNCHES        if set, a file each kernel run (a launch on a
 *                                stream, or a kernel node of a graph launch)
 *                                and each graph launch appends a line to (see
 *                                "Graphs" below): what the tests count
 *   HWQUEUE_FAKE_REFUSE          a comma-separated list of capture and graph
 *                                entry points (cuGraphInstantiateWithFlags,
 *                                cuGraphLaunch, ...) that fail, each call, with
 *                                HWQUEUE_FAKE_REFUSAL and no other effect, as
 *                                a driver out of resources for them does.
 *                                Unset: none
 *   HWQUEUE_FAKE_REFUSAL         that failure's CUresult (default 2,
 *                                CUDA_ERROR_OUT_OF_MEMORY)
 *   HWQUEUE_FAKE_REFUSE_TIMES    if set, how many of those calls fail (the
 *                                first ones, all listed entry points
 *                                together); the later ones succeed, as once
 *                                a driver's memory came back
 *   HWQUEUE_FAKE_EVENT_DELAY_US  microseconds (0 to 10,000,000) after its
 *                                cuEventRecord that an event completes (see
 *                                "Event delay" below); unset or 0: at once
 *
 * The model:
 *   - One process, devices 0 .. HWQUEUE_FAKE_DEVICE_COUNT - 1, each with a
 *     primary context (a static object, reference-counted). The current
 *     context is per thread, as in the driver; the calls that create
 *     something in "the current context" (streams, events, memory, modules)
 *     answer CUDA_ERROR_INVALID_CONTEXT on a thread that has none, so a
 *     caller that forgets to bind its context on a thread fails here too;
 *     so does cuLaunchKernel on a stream created in another context than
 *     the thread's current one.
 *   - Device pointers are host pointers: cuMemAlloc & co. are aligned
 *     malloc, and copies and fills are memcpy/memset, done at once.
 *     Page-locked memory (cuMemHostAlloc) is plain malloc too.
 *   - Work completes as soon as it is enqueued: every event is complete
 *     (but see "Event delay"), every synchronisation returns at once, a stream callback is called
 *     before cuStreamAddCallback returns. Kernels do nothing.
 *   - Modules keep their PTX text; cuModuleGetFunction finds `.entry NAME`
 *     in it. Kernel parameters are deliberately NOT reported:
 *     `cuFuncGetParamInfo` (CUDA 12.4) is not exported, as on the 12.2
 *     driver this fake reports by default, and a caller reaching it makes
 *     cudarc panic "Missing symbol cuFuncGetParamInfo".
 *   - Faults: after HWQUEUE_FAKE_FAULT_AFTER's entry point ran (successfully:
 *     a fault on the GPU is asynchronous), each entry point that enqueues
 *     work on, waits for or queries the device and is listed in
 *     HWQUEUE_FAKE_FAULT_SEEN_BY returns HWQUEUE_FAKE_FAULT from then on, as
 *     a sticky error is returned by a faulted context's calls (a code that
 *     is not sticky, e.g. 400, stands for a driver that keeps answering it
 *     to those calls while the device runs on). cuCtxGetCurrent and
 *     cuCtxSetCurrent report it only where the list names them (a driver
 *     shutting down, or one whose context calls fail, answers there:
 *     what a caller does with a handle it meant to let go then). Destroying
 *     handles and freeing memory still succeed. A stream callback is called
 *     with the fault as its status. The fault is the whole fake's (one
 *     device is all the tests fault).
 *   - Stream capture (cuStreamBeginCapture_v2 .. cuStreamEndCapture): work
 *     put on a capturing stream (kernels, copies, fills, external event
 *     records and waits) becomes a node of the capture's graph, in order,
 *     instead of running; a graph is that list of nodes, each depending on
 *     the one before. As in the driver, a plain cuEventRecord in capture
 *     adds no node (the event becomes a captured event, which only the same
 *     capture may wait on, with no node either), and what capture forbids
 *     fails and invalidates the capture: synchronising or adding a callback
 *     to a capturing stream (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), waiting
 *     on an event recorded outside it (..._ISOLATION) or in another capture
 *     (..._MERGE), querying a captured event (CUDA_ERROR_CAPTURED_EVENT),
 *     work on the legacy stream while a blocking stream captures
 *     (..._IMPLICIT), and cuMemAlloc_v2 / cuMemFree_v2 where the capture mode
 *     forbids them; cuStreamEndCapture then answers
 *     CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. One stream per capture: a
 *     second stream joining it (waiting on a captured event) is not
 *     modelled, nor are graph launches or stream-ordered allocation in
 *     capture; reaching one aborts the process with a message saying so,
 *     rather than answering what no driver would.
 *   - Graphs: cuGraphInstantiateWithFlags copies the nodes (kernel
 *     parameters by value, as the driver does), so
 *     cuGraphExecKernelNodeSetParams_v2 and cuGraphExecUpdate_v2 change the
 *     executable graph only. cuGraphLaunch runs the nodes in order at once:
 *     copies and fills really copy and fill, kernels do nothing, events
 *     complete. Captured work runs only there: for HWQUEUE_FAKE_FAULT_AFTER,
 *     a capture is not work, and cuGraphLaunch is.
 *   - Event delay: with HWQUEUE_FAKE_EVENT_DELAY_US, an event recorded by
 *     cuEventRecord(WithFlags) outside capture completes that long after
 *     the record (CLOCK_MONOTONIC), as if the work before it ran that
 *     long: cuEventQuery answers CUDA_ERROR_NOT_READY until then, and
 *     cuEventSynchronize sleeps until then (clock_nanosleep: really
 *     sleeps, so a test can tell a waiter that sleeps from one that spins
 *     by its thread's CPU time). cuStreamSynchronize waits for the last
 *     event recorded on its stream (the stream's work ends then); nothing
 *     else is delayed: graph launches still complete at once, and a
 *     recording in a graph completes when the graph runs.
 *   - Stalls (for the fake NCCL, libnccl.c, whose collective that "never
 *     completes" stalls its stream; see HWQUEUE_FAKE_NCCL_HANG there): the
 *     one exception to "work is done when enqueued". `hwqueue_fake_stall`,
 *     exported for libnccl.c (not a driver symbol), marks a stream stalled
 *     until a deadline that libnccl.c clears (to 0) when the communicator
 *     is aborted. While it is not cleared and not passed, an event
 *     recorded on the stream after the stall is not complete
 *     (cuEventQuery: CUDA_ERROR_NOT_READY; cuEventSynchronize and
 *     cuStreamSynchronize sleep in 1 ms steps until it is), and a stream
 *     that waits on such an event stalls on the same deadline. A stream
 *     callback behind a stall is not modelled (the process aborts saying
 *     so). The deadline is libnccl.c's safety valve: a stall nobody
 *     clears ends by itself, so a test of code that never aborts fails
 *     instead of hanging.
 *
 * Every CUresult this file returns must be one the `CUDA_ERRORS` table below
 * lists: cudarc reads CUresult as a Rust enum, so a number that enum lacks
 * would be undefined behaviour on the Rust side. An unlisted
 * HWQUEUE_FAKE_CUINIT or HWQUEUE_FAKE_FAULT therefore aborts the process
 * with a message.
 *
 * Growing it: one function per `cu*` symbol, its result chosen by a
 * HWQUEUE_FAKE_* variable read through `env_int`, `log_call` first, and
 * every returned code listed in `CUDA_ERRORS`. A symbol that is missing
 * makes cudarc panic "Missing symbol cuX" when hwqueue first calls it, which
 * is how to find the next one to add. Only what the tests reach exists.
 *
 * Thread-safe where hwqueue needs it (a queue's worker thread calls in
 * beside the test's): the shared state is atomics, and the list of
 * captures in progress has a lock; the current context is thread-local;
 * each handle (graphs too) is used by one caller at a time.
 */

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_common.h"

/* The types of cuda.h this file needs, with cuda.h's ABI (handles are
 * pointers to opaque structs, the rest `int`, `unsigned` or `size_t`). */
typedef int CUresult;
typedef int CUdevice;
typedef int CUdevice_attribute;
typedef int CUfunction_attribute;
typedef int CUmemPool_attribute;
typedef int CUjit_option;
typedef unsigned long long CUdeviceptr;
typedef struct fake_context *CUcontext;
typedef struct fake_handle *CUstream;
typedef struct fake_handle *CUevent;
typedef struct fake_module *CUmodule;
typedef struct fake_function *CUfunction;
typedef struct fake_pool *CUmemoryPool;
typedef void (*CUstreamCallback)(CUstream stream, CUresult status, void *user_data);
typedef int CUstreamCaptureMode;
typedef int CUstreamCaptureStatus;
typedef int CUgraphNodeType;
typedef int CUgraphExecUpdateResult;
typedef struct fake_graph *CUgraph;
typedef struct fake_node *CUgraphNode;
typedef struct fake_exec *CUgraphExec;
typedef struct fake_kernel *CUkernel;

/* cuda.h's CUgraphNodeType values of the nodes capture makes here. */
#define CU_GRAPH_NODE_TYPE_KERNEL 0
#define CU_GRAPH_NODE_TYPE_MEMCPY 1
#define CU_GRAPH_NODE_TYPE_MEMSET 2
#define CU_GRAPH_NODE_TYPE_WAIT_EVENT 6
#define CU_GRAPH_NODE_TYPE_EVENT_RECORD 7

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_PTX 218
#define CUDA_ERROR_UNSUPPORTED_PTX_VERSION 222
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUDA_ERROR_STREAM_CAPTURE_MERGE 902
#define CUDA_ERROR_STREAM_CAPTURE_ISOLATION 905
#define CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906
#define CUDA_ERROR_CAPTURED_EVENT 907
#define CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD 908
#define CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE 910

/* cuda.h's CUjit_option values for the JIT's error log. */
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6

/* cuda.h's CUfunction_attribute values hwqueue reads. */
#define CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK 0
#define CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES 1

/* cuda.h's CUmemPool_attribute values hwqueue uses. */
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7

/* The codes this fake may return, with cuda.h's names and the driver's own
 * descriptions (what cuGetErrorName / cuGetErrorString answer). */
static const struct {
    CUresult code;
    const char *name;
    const char *description;
} CUDA_ERRORS[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {102, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device doesn't have valid Grid license"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility was attempted on non supported HW"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {907, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
     "the graph update was not performed because it included changes which violated constraints specific to "
     "instantiated graph update"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

#define CUDA_ERROR_COUNT (sizeof CUDA_ERRORS / sizeof CUDA_ERRORS[0])

/* The table entry of `code`, or -1. */
static int error_index(CUresult code) {
    for (size_t i = 0; i < CUDA_ERROR_COUNT; i++) {
        if (CUDA_ERRORS[i].code == code) {
            return (int)i;
        }
    }
    return -1;
}

/* The integer in environment variable `name`, or `fallback` when unset. */
static int env_int(const char *name, int fallback) {
    const char *value = getenv(name);
    return value != NULL && *value != '\0' ? atoi(value) : fallback;
}

/* A CUresult from environment variable `name` (or `fallback`), which must
 * be in CUDA_ERRORS: anything else aborts, saying where to add it. */
static CUresult env_code(const char *name, CUresult fallback) {
    CUresult code = env_int(name, fallback);
    if (error_index(code) < 0) {
        fprintf(stderr,
                "fake libcuda: %s=%d is not in CUDA_ERRORS (tests/fake_cuda/libcuda.c); "
                "add it there (it must be a CUresult cudarc knows)\n",
                name, code);
        abort();
    }
    return code;
}

/* Whether `symbol` is an item of the comma-separated `list`. */
static int in_list(const char *list, const char *symbol) {
    size_t length = strlen(symbol);
    for (const char *item = list; item != NULL && *item != '\0';) {
        const char *end = strchr(item, ',');
        size_t item_length = end == NULL ? strlen(item) : (size_t)(end - item);
        if (item_length == length && strncmp(item, symbol, length) == 0) {
            return 1;
        }
        item = end == NULL ? NULL : end + 1;
    }
    return 0;
}

/* Whether cuInit succeeded (0: not; 1: it did; 2: it did, and a fault
 * is armed that HWQUEUE_FAKE_FAULT_SEEN_BY has the context entry points
 * report): the device queries fail before it, as the real driver's do.
 * The context entry points, which every call of hwqueue and cudarc makes,
 * test the one word, as they did before they could fault:
 * benches/callgrind.sh counts the fake's instructions too. */
static atomic_int initialised = 0;
/* Whether HWQUEUE_FAKE_FAULT_SEEN_BY names cuCtxGetCurrent or
 * cuCtxSetCurrent (read once, at load). */
static int context_faults = 0;

/* ---- Faults --------------------------------------------------------------- */

/* Set once HWQUEUE_FAKE_FAULT_AFTER's entry point ran. */
static atomic_int faulted = 0;

/* Called by each entry point that enqueues work, after it did: the device
 * faults if `symbol` is HWQUEUE_FAKE_FAULT_AFTER's. Entry points name
 * themselves with `__func__` (here, to `device_fault` and to `log_call`),
 * so the symbol a fault scenario names can never be mistyped. */
/* The variables an entry point reads on every call, read once when the
 * library loads (as HWQUEUE_FAKE_CALLS is: see fake_common.h). */
static const char *fault_after, *refuse_list, *launches_path;
/* HWQUEUE_FAKE_EVENT_DELAY_US, in nanoseconds (0: none). */
static long long event_delay_ns = 0;

__attribute__((constructor)) static void read_per_call_env(void) {
    fault_after = getenv("HWQUEUE_FAKE_FAULT_AFTER");
    refuse_list = getenv("HWQUEUE_FAKE_REFUSE");
    launches_path = getenv("HWQUEUE_FAKE_LAUNCHES");
    const char *seen_by = getenv("HWQUEUE_FAKE_FAULT_SEEN_BY");
    context_faults = seen_by != NULL
        && (in_list(seen_by, "cuCtxGetCurrent") || in_list(seen_by, "cuCtxSetCurrent"));
    int delay_us = env_int("HWQUEUE_FAKE_EVENT_DELAY_US", 0);
    if (delay_us < 0 || delay_us > 10000000) {
        fprintf(stderr, "fake libcuda: HWQUEUE_FAKE_EVENT_DELAY_US=%d is not in 0..=10000000\n", delay_us);
        abort();
    }
    event_delay_ns = 1000LL * delay_us;
}

static void after_work(const char *symbol) {
    const char *after = fault_after;
    if (after != NULL && strcmp(after, symbol) == 0) {
        atomic_store(&faulted, 1);
        if (context_faults) {
            int was = 1;
            atomic_compare_exchange_strong(&initialised, &was, 2);
        }
    }
}

/* The fault as entry point `symbol` reports it: CUDA_SUCCESS before the
 * fault, or where HWQUEUE_FAKE_FAULT_SEEN_BY leaves `symbol` out. */
static CUresult device_fault(const char *symbol) {
    if (!atomic_load(&faulted)) {
        return CUDA_SUCCESS;
    }
    const char *seen_by = getenv("HWQUEUE_FAKE_FAULT_SEEN_BY");
    if (seen_by != NULL && !in_list(seen_by, symbol)) {
        return CUDA_SUCCESS;
    }
    static atomic_int reported = 0;
    int times = env_int("HWQUEUE_FAKE_FAULT_TIMES", -1);
    if (times >= 0 && atomic_fetch_add(&reported, 1) >= times) {
        return CUDA_SUCCESS;
    }
    return env_code("HWQUEUE_FAKE_FAULT", CUDA_ERROR_ILLEGAL_ADDRESS);
}

/* HWQUEUE_FAKE_REFUSAL if entry point `symbol` is in HWQUEUE_FAKE_REFUSE,
 * else CUDA_SUCCESS: what each capture and graph entry point returns at
 * once when it is not CUDA_SUCCESS. */
static CUresult refusal(const char *symbol) {
    static atomic_long refused;
    const char *refuse = refuse_list;
    if (refuse == NULL || !in_list(refuse, symbol)) {
        return CUDA_SUCCESS;
    }
    const char *times = getenv("HWQUEUE_FAKE_REFUSE_TIMES");
    if (times != NULL && atomic_fetch_add(&refused, 1) >= atol(times)) {
        return CUDA_SUCCESS;
    }
    return env_code("HWQUEUE_FAKE_REFUSAL", CUDA_ERROR_OUT_OF_MEMORY);
}

/* ---- Initialisation and version ---------------------------------------- */

CUresult cuInit(unsigned int flags) {
    log_call(__func__);
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult result = env_code("HWQUEUE_FAKE_CUINIT", CUDA_SUCCESS);
    int state = result != CUDA_SUCCESS ? 0 : atomic_load(&faulted) && context_faults ? 2 : 1;
    atomic_store(&initialised, state);
    return result;
}

CUresult cuDriverGetVersion(int *version) {
    log_call(__func__);
    if (version == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *version = env_int("HWQUEUE_FAKE_DRIVER_VERSION", 12020);
    return CUDA_SUCCESS;
}

/* ---- Error names --------------------------------------------------------- */

/* Like the driver: CUDA_ERROR_INVALID_VALUE and NULL for a code it does not
 * know. Both work before cuInit. */
CUresult cuGetErrorName(CUresult error, const char **name) {
    log_call(__func__);
    if (name == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    int index = error_index(error);
    *name = index < 0 ? NULL : CUDA_ERRORS[index].name;
    return index < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **description) {
    log_call(__func__);
    if (description == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    int index = error_index(error);
    *description = index < 0 ? NULL : CUDA_ERRORS[index].description;
    return index < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- Devices (what Cuda::probe and CudaDevice::open ask of each) ---------- */

/* Device `ordinal` exists: CUDA_SUCCESS, else the driver's error for it. */
static CUresult check_device(CUdevice device) {
    if (!atomic_load(&initialised)) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (device < 0 || device >= env_int("HWQUEUE_FAKE_DEVICE_COUNT", 0)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    log_call(__func__);
    if (!atomic_load(&initialised)) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (count == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *count = env_int("HWQUEUE_FAKE_DEVICE_COUNT", 0);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    log_call(__func__);
    CUresult result = check_device(ordinal);
    if (result == CUDA_SUCCESS && device == NULL) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    if (result == CUDA_SUCCESS) {
        *device = ordinal;
    }
    return result;
}

CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    log_call(__func__);
    CUresult result = check_device(device);
    if (result == CUDA_SUCCESS && (name == NULL || length <= 0)) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    if (result == CUDA_SUCCESS) {
        snprintf(name, (size_t)length, "hwqueue fake GPU %d", device);
    }
    return result;
}

/* What every fake device has. */
#define FAKE_MEMORY ((size_t)1 << 30) /* 1 GiB */

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    log_call(__func__);
    CUresult result = check_device(device);
    if (result == CUDA_SUCCESS && bytes == NULL) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    if (result == CUDA_SUCCESS) {
        *bytes = FAKE_MEMORY;
    }
    return result;
}

/* The attributes a V100-like device (compute capability 7.0) reports, of
 * those hwqueue and cudarc read; any other is CUDA_ERROR_INVALID_VALUE,
 * which shows up in a test as an attribute to add. */
static const struct {
    CUdevice_attribute attribute;
    int value;
} DEVICE_ATTRIBUTES[] = {
    {1, 1024},       /* MAX_THREADS_PER_BLOCK */
    {2, 1024},       /* MAX_BLOCK_DIM_X */
    {3, 1024},       /* MAX_BLOCK_DIM_Y */
    {4, 64},         /* MAX_BLOCK_DIM_Z */
    {5, 2147483647}, /* MAX_GRID_DIM_X */
    {6, 65535},      /* MAX_GRID_DIM_Y */
    {7, 65535},      /* MAX_GRID_DIM_Z */
    {16, 4},         /* MULTIPROCESSOR_COUNT */
    {75, 7},         /* COMPUTE_CAPABILITY_MAJOR */
    {76, 0},         /* COMPUTE_CAPABILITY_MINOR */
    {97, 98304},     /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN (96 KiB) */
    {115, 1},        /* MEMORY_POOLS_SUPPORTED */
};

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device) {
    log_call(__func__);
    CUresult result = check_device(device);
    if (result != CUDA_SUCCESS || value == NULL) {
        return result != CUDA_SUCCESS ? result : CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < sizeof DEVICE_ATTRIBUTES / sizeof DEVICE_ATTRIBUTES[0]; i++) {
        if (DEVICE_ATTRIBUTES[i].attribute == attribute) {
            *value = DEVICE_ATTRIBUTES[i].value;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- Contexts ---------------------------------------------------------------- */

#define MAX_DEVICES 8

/* A device's primary context: retained and released, never destroyed. */
struct fake_context {
    atomic_int references;
};

static struct fake_context primary_contexts[MAX_DEVICES];

/* The calling thread's current context, as in the driver. */
static _Thread_local CUcontext current_context = NULL;

/* CUDA_SUCCESS if the calling thread has a current context. */
static CUresult check_context(void) {
    if (!atomic_load(&initialised)) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    return current_context == NULL ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    log_call(__func__);
    CUresult result = check_device(device);
    if (result == CUDA_SUCCESS && (context == NULL || device >= MAX_DEVICES)) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    if (result == CUDA_SUCCESS) {
        atomic_fetch_add(&primary_contexts[device].references, 1);
        *context = &primary_contexts[device];
    }
    return result;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    log_call(__func__);
    CUresult result = check_device(device);
    if (result == CUDA_SUCCESS && (device >= MAX_DEVICES || atomic_load(&primary_contexts[device].references) <= 0)) {
        result = CUDA_ERROR_INVALID_CONTEXT;
    }
    if (result == CUDA_SUCCESS) {
        atomic_fetch_sub(&primary_contexts[device].references, 1);
    }
    return result;
}

/* The fault as the context entry points report it: only where
 * HWQUEUE_FAKE_FAULT_SEEN_BY names `symbol` (every other fault scenario
 * leaves them working). Called only once such a fault is armed
 * (`initialised` 2): a getenv on every call read 480 instructions more a
 * call in benches/callgrind.sh. Cold and out of line, named by a literal
 * (not `__func__`, whose address the caller would then keep in a saved
 * register), so that the entry points' common path is what it was. */
__attribute__((noinline, cold)) static CUresult context_fault(const char *symbol) {
    const char *seen_by = getenv("HWQUEUE_FAKE_FAULT_SEEN_BY");
    if (seen_by == NULL || !in_list(seen_by, symbol)) {
        return CUDA_SUCCESS;
    }
    return device_fault(symbol);
}

CUresult cuCtxGetCurrent(CUcontext *context) {
    log_call(__func__);
    int state = atomic_load(&initialised);
    if (state != 1) {
        if (state == 0) {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        CUresult fault = context_fault("cuCtxGetCurrent");
        if (fault != CUDA_SUCCESS) {
            return fault;
        }
    }
    if (context == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *context = current_context;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext context) {
    log_call(__func__);
    int state = atomic_load(&initialised);
    if (state != 1) {
        if (state == 0) {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        CUresult fault = context_fault("cuCtxSetCurrent");
        if (fault != CUDA_SUCCESS) {
            return fault;
        }
    }
    current_context = context;
    return CUDA_SUCCESS;
}

/* ---- Stream capture: the state ------------------------------------------- */

/* cuda.h's special stream handles, CUstreamCaptureMode and
 * CUstreamCaptureStatus values, and the flags this file reads. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_RECORD_EXTERNAL 0x1
#define CU_EVENT_WAIT_EXTERNAL 0x1
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define CU_STREAM_CAPTURE_MODE_RELAXED 2
#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define CU_STREAM_CAPTURE_STATUS_INVALIDATED 2

/* A capture in progress: the graph its stream's work goes to. */
struct capture {
    struct capture *next; /* in `captures` */
    unsigned long long id;
    struct fake_graph *graph;
    CUstream stream;
    CUcontext context;
    CUstreamCaptureMode mode;
    const void *thread; /* the `thread_identity` of the thread that began it */
    atomic_int invalidated;
};

/* The captures in progress, guarded by `capture_lock`: a call that capture
 * forbids checks other threads' captures too. */
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static struct capture *captures = NULL;
static unsigned long long last_capture_id = 0;

/* Its address tells the calling thread from the others. */
static _Thread_local char thread_identity;

/* The calling thread's capture interaction mode, which says which
 * captures forbid it potentially unsafe calls (cuThreadExchangeStreamCaptureMode). */
static _Thread_local CUstreamCaptureMode thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* A stream or an event. Work on a stream is done when enqueued, and
 * recorded work is done, so an event is complete from its record on: both
 * are handles, made in the current context. A stream may be capturing; an
 * event may have been recorded last in a capture (which may have ended
 * since: its id, not a pointer). */
struct fake_handle {
    unsigned int flags;
    /* An event's completion time (CLOCK_MONOTONIC, ns) under
     * HWQUEUE_FAKE_EVENT_DELAY_US; 0: complete. Written by a record, read
     * by queries and synchronisations on other threads. A stream's: that
     * of the last event recorded on it, which cuStreamSynchronize waits
     * for. */
    _Atomic long long ready_at_ns;
    struct capture *capture;         /* a stream's, while it captures */
    CUcontext context;               /* current when it was created */
    unsigned long long captured_in;  /* an event's last record's capture, or 0 */
    /* The stall (see "Stalls") a stream's work is behind, or an event's
     * last record was: a deadline (CLOCK_MONOTONIC, ns) that libnccl.c
     * owns and clears to 0 on abort; NULL: none. Written by the thread
     * that enqueues, read by queries on others. */
    _Atomic(_Atomic long long *) stall;
};

static int stalled(_Atomic(_Atomic long long *) *slot);
static void sleep_while_stalled(_Atomic(_Atomic long long *) *slot);
static long long monotonic_ns(void);

/* Sleeps (never spins) until `ready_at` (CLOCK_MONOTONIC, ns; 0: at once). */
static void sleep_until_ns(long long ready_at) {
    if (ready_at <= 0) {
        return;
    }
    struct timespec until = {.tv_sec = ready_at / 1000000000LL, .tv_nsec = ready_at % 1000000000LL};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
        /* A signal handler ran: sleep on to the same instant. */
    }
}

/* Aborts on what this fake leaves out, rather than answering what no
 * driver would. */
static void unmodelled(const char *what) {
    fprintf(stderr, "fake libcuda: %s is not modelled; add it to tests/fake_cuda/libcuda.c\n", what);
    abort();
}

/* Whether `stream` is one of cuStreamCreate's, rather than the legacy
 * stream (NULL or CU_STREAM_LEGACY) or the per-thread one (0x2), which
 * this fake never captures. */
static int created_stream(CUstream stream) {
    return (uintptr_t)stream > 2;
}

/* The capture in progress of id `id`, or NULL. Called under capture_lock. */
static struct capture *find_capture(unsigned long long id) {
    for (struct capture *capture = captures; capture != NULL; capture = capture->next) {
        if (capture->id == id) {
            return capture;
        }
    }
    return NULL;
}

/* Work on the legacy stream waits for the context's blocking streams: while
 * one captures, that is CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, and its capture
 * is invalidated (`invalidate` 0: only reported, as cuStreamIsCapturing
 * does). */
static CUresult legacy_stream_check(int invalidate) {
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&capture_lock);
    for (struct capture *capture = captures; capture != NULL; capture = capture->next) {
        if (capture->context == current_context && !(capture->stream->flags & CU_STREAM_NON_BLOCKING)) {
            if (invalidate) {
                atomic_store(&capture->invalidated, 1);
            }
            result = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
    }
    pthread_mutex_unlock(&capture_lock);
    return result;
}

/* A call that capture forbids on `stream` (synchronising it, a callback):
 * `code`, and the capture invalidated, if the stream captures. */
static CUresult forbidden_in_capture(CUstream stream, CUresult code) {
    if (!created_stream(stream) || stream->capture == NULL) {
        return CUDA_SUCCESS;
    }
    atomic_store(&stream->capture->invalidated, 1);
    return code;
}

/* A potentially unsafe call (cuMemAlloc_v2, cuMemFree_v2) while captures
 * are in progress. Unless the calling thread's mode is relaxed, its own
 * captures not begun relaxed forbid it, and in global mode so do other
 * threads' captures begun global: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
 * and those captures are invalidated. */
static CUresult unsafe_call(void) {
    if (thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) {
        return CUDA_SUCCESS;
    }
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&capture_lock);
    for (struct capture *capture = captures; capture != NULL; capture = capture->next) {
        int own = capture->thread == &thread_identity;
        if ((own && capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!own && thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
             capture->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            atomic_store(&capture->invalidated, 1);
            result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&capture_lock);
    return result;
}

/* What each entry point that puts work on `stream` does first: the
 * device's fault, then capture's rules. CUDA_SUCCESS with `*graph` set:
 * the work becomes a node of that capture's graph instead of running;
 * with `*graph` NULL: it runs. */
static CUresult begin_work(CUstream stream, const char *symbol, struct fake_graph **graph) {
    *graph = NULL;
    CUresult result = device_fault(symbol);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (stream == NULL || stream == CU_STREAM_LEGACY) {
        return legacy_stream_check(1);
    }
    if (!created_stream(stream) || stream->capture == NULL) {
        return CUDA_SUCCESS;
    }
    if (atomic_load(&stream->capture->invalidated)) {
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *graph = stream->capture->graph;
    return CUDA_SUCCESS;
}

/* CUDA_ERROR_CAPTURED_EVENT if `event` was last recorded in a capture (the
 * capture, still in progress, is invalidated): the driver cannot say when
 * such an event completes. */
static CUresult captured_event_check(CUevent event) {
    unsigned long long id = event->captured_in;
    if (id == 0) {
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&capture_lock);
    struct capture *capture = find_capture(id);
    if (capture != NULL) {
        atomic_store(&capture->invalidated, 1);
    }
    pthread_mutex_unlock(&capture_lock);
    return CUDA_ERROR_CAPTURED_EVENT;
}

/* Synchronising the context synchronises its capturing streams too. */
CUresult cuCtxSynchronize(void) {
    log_call(__func__);
    CUresult result = check_context();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&capture_lock);
    for (struct capture *capture = captures; capture != NULL; capture = capture->next) {
        if (capture->context == current_context) {
            atomic_store(&capture->invalidated, 1);
            result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&capture_lock);
    return result != CUDA_SUCCESS ? result : device_fault(__func__);
}

/* ---- Streams --------------------------------------------------------------- */

static CUresult new_handle(struct fake_handle **handle, unsigned int flags) {
    CUresult result = check_context();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (handle == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *handle = calloc(1, sizeof **handle);
    if (*handle == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*handle)->flags = flags;
    (*handle)->context = current_context;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
    log_call(__func__);
    return new_handle(stream, flags);
}

static void end_capture(CUstream stream);
static void destroy_graph(struct fake_graph *graph);

/* A stream destroyed mid-capture takes its capture (and graph) with it. */
CUresult cuStreamDestroy_v2(CUstream stream) {
    log_call(__func__);
    if (created_stream(stream) && stream->capture != NULL) {
        struct fake_graph *graph = stream->capture->graph;
        end_capture(stream);
        destroy_graph(graph);
    }
    free(stream);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream stream) {
    log_call(__func__);
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS && (stream == NULL || stream == CU_STREAM_LEGACY)) {
        result = legacy_stream_check(1);
    }
    if (result == CUDA_SUCCESS) {
        result = forbidden_in_capture(stream, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    if (result == CUDA_SUCCESS && created_stream(stream)) {
        /* The events recorded on it are its work's end (event delay). */
        sleep_until_ns(atomic_load(&stream->ready_at_ns));
        sleep_while_stalled(&stream->stall);
    }
    return result;
}

/* Whether the stream's work completed: not while its last delayed event
 * (its work's end) is ahead, or a stall holds it. */
CUresult cuStreamQuery(CUstream stream) {
    log_call(__func__);
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS && (stream == NULL || stream == CU_STREAM_LEGACY)) {
        result = legacy_stream_check(1);
    }
    if (result == CUDA_SUCCESS && created_stream(stream)
        && (monotonic_ns() < atomic_load(&stream->ready_at_ns) || stalled(&stream->stall))) {
        result = CUDA_ERROR_NOT_READY;
    }
    return result;
}

static CUresult add_event_node(struct fake_graph *graph, CUgraphNodeType type, CUevent event);

/* In capture: a wait on an event of the same capture orders nothing more
 * (the graph is in stream order already) and adds no node; with
 * CU_EVENT_WAIT_EXTERNAL it is a wait node; on an event recorded outside
 * the capture or in another it is an error. Outside capture, on an event
 * captured by a capture in progress, the stream would join that capture,
 * which is not modelled. */
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
    log_call(__func__);
    if (event == NULL || (flags != 0 && flags != CU_EVENT_WAIT_EXTERNAL)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fake_graph *graph;
    CUresult result = begin_work(stream, __func__, &graph);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (graph != NULL && flags == CU_EVENT_WAIT_EXTERNAL) {
        return add_event_node(graph, CU_GRAPH_NODE_TYPE_WAIT_EVENT, event);
    }
    pthread_mutex_lock(&capture_lock);
    struct capture *recorded_in = event->captured_in == 0 ? NULL : find_capture(event->captured_in);
    pthread_mutex_unlock(&capture_lock);
    if (graph == NULL) {
        if (recorded_in != NULL) {
            unmodelled("a stream joining a capture (waiting on an event another stream captured)");
        }
        if (created_stream(stream) && stalled(&event->stall)) {
            atomic_store(&stream->stall, atomic_load(&event->stall));
        }
        return CUDA_SUCCESS;
    }
    if (recorded_in == stream->capture) {
        return CUDA_SUCCESS;
    }
    atomic_store(&stream->capture->invalidated, 1);
    return recorded_in != NULL ? CUDA_ERROR_STREAM_CAPTURE_MERGE : CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
}

/* The driver calls a stream callback on a thread of its own once the work
 * before it is done, with the stream's status; here that is at once, on the
 * caller's thread (the work is done). Capture has no callbacks (graphs have
 * host nodes, from cuLaunchHostFunc). */
CUresult cuStreamAddCallback(CUstream stream, CUstreamCallback callback, void *user_data, unsigned int flags) {
    log_call(__func__);
    if (callback == NULL || flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult refused = device_fault(__func__);
    if (refused == CUDA_SUCCESS) {
        refused = forbidden_in_capture(stream, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    if (refused != CUDA_SUCCESS) {
        return refused;
    }
    if (created_stream(stream) && stalled(&stream->stall)) {
        unmodelled("a stream callback behind a stalled NCCL collective");
    }
    CUresult status = atomic_load(&faulted) ? env_code("HWQUEUE_FAKE_FAULT", CUDA_ERROR_ILLEGAL_ADDRESS) : CUDA_SUCCESS;
    callback(stream, status, user_data);
    return CUDA_SUCCESS;
}

/* ---- Events -------------------------------------------------------------- */

/* CLOCK_MONOTONIC now, in nanoseconds. */
static long long monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* Whether the stall `slot` names is still on (see "Stalls"). */
static int stalled(_Atomic(_Atomic long long *) *slot) {
    _Atomic long long *stall = atomic_load(slot);
    if (stall == NULL) {
        return 0;
    }
    long long until = atomic_load(stall);
    return until != 0 && monotonic_ns() < until;
}

/* Sleeps in 1 ms steps while the stall `slot` names is on. */
static void sleep_while_stalled(_Atomic(_Atomic long long *) *slot) {
    while (stalled(slot)) {
        struct timespec step = {.tv_sec = 0, .tv_nsec = 1000000};
        nanosleep(&step, NULL);
    }
}

/* Exported for libnccl.c (found there with dlsym): work put on `stream`
 * from now on is behind `stall` (see "Stalls"). */
__attribute__((visibility("default"))) void hwqueue_fake_stall(CUstream stream, _Atomic long long *stall) {
    log_call(__func__);
    if (!created_stream(stream)) {
        unmodelled("a stall of the legacy or per-thread stream");
    }
    atomic_store(&stream->stall, stall);
}

CUresult cuEventCreate(CUevent *event, unsigned int flags) {
    log_call(__func__);
    return new_handle(event, flags);
}

CUresult cuEventDestroy_v2(CUevent event) {
    log_call(__func__);
    if (event == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    free(event);
    return CUDA_SUCCESS;
}

/* A record on a capturing stream makes `event` a captured event and adds no
 * node, unless `flags` is CU_EVENT_RECORD_EXTERNAL: then it is a record
 * node, which records the event each time the graph runs. */
static CUresult record_event(const char *symbol, CUevent event, CUstream stream, unsigned int flags) {
    if (event == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (flags != 0 && flags != CU_EVENT_RECORD_EXTERNAL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fake_graph *graph;
    CUresult result = begin_work(stream, symbol, &graph);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (graph != NULL && flags == CU_EVENT_RECORD_EXTERNAL) {
        return add_event_node(graph, CU_GRAPH_NODE_TYPE_EVENT_RECORD, event);
    }
    event->captured_in = graph != NULL ? stream->capture->id : 0;
    atomic_store(&event->stall, graph == NULL && created_stream(stream) ? atomic_load(&stream->stall) : NULL);
    long long ready_at = graph == NULL && event_delay_ns > 0 ? monotonic_ns() + event_delay_ns : 0;
    atomic_store(&event->ready_at_ns, ready_at);
    if (ready_at > 0 && created_stream(stream)) {
        /* Later records are later: the stream's work is done by then. */
        atomic_store(&stream->ready_at_ns, ready_at);
    }
    after_work(symbol);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
    log_call(__func__);
    return record_event(__func__, event, stream, 0);
}

CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags) {
    log_call(__func__);
    return record_event(__func__, event, stream, flags);
}

CUresult cuEventQuery(CUevent event) {
    log_call(__func__);
    if (event == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS) {
        result = captured_event_check(event);
    }
    if (result == CUDA_SUCCESS && monotonic_ns() < atomic_load(&event->ready_at_ns)) {
        result = CUDA_ERROR_NOT_READY;
    }
    if (result == CUDA_SUCCESS && stalled(&event->stall)) {
        result = CUDA_ERROR_NOT_READY;
    }
    return result;
}

/* Sleeps (never spins) until a delayed event completes. */
CUresult cuEventSynchronize(CUevent event) {
    log_call(__func__);
    if (event == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS) {
        result = captured_event_check(event);
    }
    if (result == CUDA_SUCCESS) {
        sleep_until_ns(atomic_load(&event->ready_at_ns));
        sleep_while_stalled(&event->stall);
    }
    return result;
}

/* ---- Memory ------------------------------------------------------------------ */

/* Device memory is host memory, aligned as cuMemAlloc's is. */
static CUresult device_alloc(CUdeviceptr *pointer, size_t bytes) {
    if (pointer == NULL || bytes == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    void *memory = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (memory == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pointer = (CUdeviceptr)(uintptr_t)memory;
    return CUDA_SUCCESS;
}

static void *host(CUdeviceptr pointer) {
    return (void *)(uintptr_t)pointer;
}

CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    log_call(__func__);
    CUresult result = check_context();
    if (result == CUDA_SUCCESS) {
        result = unsafe_call();
    }
    return result != CUDA_SUCCESS ? result : device_alloc(pointer, bytes);
}

CUresult cuMemFree_v2(CUdeviceptr pointer) {
    log_call(__func__);
    CUresult result = unsafe_call();
    if (result == CUDA_SUCCESS) {
        free(host(pointer));
    }
    return result;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    log_call(__func__);
    CUresult result = check_context();
    if (result == CUDA_SUCCESS && (free_bytes == NULL || total_bytes == NULL)) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    if (result == CUDA_SUCCESS) {
        *free_bytes = FAKE_MEMORY;
        *total_bytes = FAKE_MEMORY;
    }
    return result;
}

/* Page-locked host memory: malloc. */
CUresult cuMemHostAlloc(void **pointer, size_t bytes, unsigned int flags) {
    log_call(__func__);
    (void)flags;
    CUresult result = check_context();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (pointer == NULL || bytes == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pointer = malloc(bytes);
    return *pointer == NULL ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *pointer) {
    log_call(__func__);
    free(pointer);
    return CUDA_SUCCESS;
}

/* The device's memory pool (stream-ordered allocation): the same aligned
 * malloc, with only the release threshold remembered; it reports no use. */
struct fake_pool {
    _Atomic unsigned long long release_threshold;
};

static struct fake_pool default_pools[MAX_DEVICES];

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice device) {
    log_call(__func__);
    CUresult result = check_device(device);
    if (result == CUDA_SUCCESS && (pool == NULL || device >= MAX_DEVICES)) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    if (result == CUDA_SUCCESS) {
        *pool = &default_pools[device];
    }
    return result;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attribute, void *value) {
    log_call(__func__);
    if (pool == NULL || value == NULL || attribute != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    atomic_store(&pool->release_threshold, *(unsigned long long *)value);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attribute, void *value) {
    log_call(__func__);
    if (pool == NULL || value == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (attribute) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(unsigned long long *)value = atomic_load(&pool->release_threshold);
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(unsigned long long *)value = 0;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    log_call(__func__);
    (void)keep;
    return pool == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* Stream-ordered allocation in capture (memory alloc and free nodes) is
 * not modelled. */
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *pointer, size_t bytes, CUmemoryPool pool, CUstream stream) {
    log_call(__func__);
    CUresult result = check_context();
    if (result == CUDA_SUCCESS && pool == NULL) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    struct fake_graph *graph = NULL;
    if (result == CUDA_SUCCESS) {
        result = begin_work(stream, __func__, &graph);
    }
    if (graph != NULL) {
        unmodelled("capturing cuMemAllocFromPoolAsync (a memory alloc node)");
    }
    return result != CUDA_SUCCESS ? result : device_alloc(pointer, bytes);
}

/* From the device's default pool: cudarc's own stream allocations (its
 * `CudaStream::alloc`, where the device reports memory pools). */
CUresult cuMemAllocAsync(CUdeviceptr *pointer, size_t bytes, CUstream stream) {
    log_call(__func__);
    CUresult result = check_context();
    struct fake_graph *graph = NULL;
    if (result == CUDA_SUCCESS) {
        result = begin_work(stream, __func__, &graph);
    }
    if (graph != NULL) {
        unmodelled("capturing cuMemAllocAsync (a memory alloc node)");
    }
    return result != CUDA_SUCCESS ? result : device_alloc(pointer, bytes);
}

CUresult cuMemFreeAsync(CUdeviceptr pointer, CUstream stream) {
    log_call(__func__);
    if (created_stream(stream) && stream->capture != NULL) {
        unmodelled("capturing cuMemFreeAsync (a memory free node)");
    }
    free(host(pointer));
    return CUDA_SUCCESS;
}

/* ---- Copies and fills: done at once, device pointers being host ones ---- */

/* A copy's direction, as a memcpy node keeps it: a graph update may change
 * a copy's addresses, not the kinds of memory it copies between. */
enum copy_direction { HOST_TO_DEVICE = 1, DEVICE_TO_HOST, DEVICE_TO_DEVICE };

static CUresult add_copy_node(struct fake_graph *graph, enum copy_direction direction, void *dst, const void *src,
                              size_t bytes);
static CUresult add_fill_node(struct fake_graph *graph, CUdeviceptr dst, unsigned int value, unsigned int element_bytes,
                              size_t count);

/* Fills `count` elements of `element_bytes` (1, 2 or 4) at `dst`. */
static void fill(CUdeviceptr dst, unsigned int value, unsigned int element_bytes, size_t count) {
    if (element_bytes == 1) {
        memset(host(dst), (int)value, count);
    } else if (element_bytes == 2) {
        unsigned short *out = host(dst);
        for (size_t i = 0; i < count; i++) {
            out[i] = (unsigned short)value;
        }
    } else {
        unsigned int *out = host(dst);
        for (size_t i = 0; i < count; i++) {
            out[i] = value;
        }
    }
}

/* A copy on `stream`: at once, or a node of its capture. */
static CUresult copy(const char *symbol, enum copy_direction direction, void *dst, const void *src, size_t bytes,
                     CUstream stream) {
    struct fake_graph *graph;
    CUresult result = begin_work(stream, symbol, &graph);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (graph != NULL) {
        return add_copy_node(graph, direction, dst, src, bytes);
    }
    memmove(dst, src, bytes);
    after_work(symbol);
    return CUDA_SUCCESS;
}

/* A fill on `stream`: at once, or a node of its capture. */
static CUresult fill_on(const char *symbol, CUdeviceptr dst, unsigned int value, unsigned int element_bytes,
                        size_t count, CUstream stream) {
    struct fake_graph *graph;
    CUresult result = begin_work(stream, symbol, &graph);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (graph != NULL) {
        return add_fill_node(graph, dst, value, element_bytes, count);
    }
    fill(dst, value, element_bytes, count);
    after_work(symbol);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
    log_call(__func__);
    return copy(__func__, HOST_TO_DEVICE, host(dst), src, bytes, stream);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    log_call(__func__);
    return copy(__func__, DEVICE_TO_HOST, dst, host(src), bytes, stream);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    log_call(__func__);
    return copy(__func__, DEVICE_TO_DEVICE, host(dst), host(src), bytes, stream);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
    log_call(__func__);
    return fill_on(__func__, dst, value, 1, count, stream);
}

CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, CUstream stream) {
    log_call(__func__);
    return fill_on(__func__, dst, value, 2, count, stream);
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
    log_call(__func__);
    return fill_on(__func__, dst, value, 4, count, stream);
}

/* ---- Modules and kernels ----------------------------------------------------- */

/* The most parameters of a kernel this fake reads from PTX. */
#define MAX_PARAMS 64

/* A loaded module: its PTX text, and the functions taken from it (freed
 * with it). A function knows its name and, from its `.entry`'s parameter
 * list, the size of each parameter, as the driver does: captured launches
 * copy the values (param_count is -1 where the list could not be read). */
struct fake_function {
    struct fake_function *next;
    char *name;
    int param_count;
    size_t param_sizes[MAX_PARAMS];
};

struct fake_module {
    char *ptx;
    struct fake_function *functions;
};

/* Writes a JIT error log line, if the caller gave a buffer. */
static void jit_log(char *log, size_t size, const char *message) {
    if (log != NULL && size > 0) {
        snprintf(log, size, "ptxas application ptx input, line 1; fatal   : %s", message);
    }
}

/* Loads a PTX image: checks its `.version` against HWQUEUE_FAKE_MAX_PTX_ISA,
 * as the driver's JIT does, and keeps the text. */
static CUresult load_module(CUmodule *module, const void *image, char *log, size_t log_size) {
    CUresult result = check_context();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (module == NULL || image == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    const char *ptx = image;
    const char *version = strstr(ptx, ".version");
    int major = 0, minor = 0;
    if (version == NULL || sscanf(version, ".version %d.%d", &major, &minor) != 2) {
        jit_log(log, log_size, "Missing .version directive at start of file");
        return CUDA_ERROR_INVALID_PTX;
    }
    int newest = env_int("HWQUEUE_FAKE_MAX_PTX_ISA", -1);
    if (newest >= 0 && major * 10 + minor > newest) {
        char message[128];
        snprintf(message, sizeof message, "Unsupported .version %d.%d; current version is '%d.%d'", major, minor,
                 newest / 10, newest % 10);
        jit_log(log, log_size, message);
        return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    }
    struct fake_module *loaded = calloc(1, sizeof *loaded);
    size_t length = strlen(ptx);
    if (loaded == NULL || (loaded->ptx = malloc(length + 1)) == NULL) {
        free(loaded);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(loaded->ptx, ptx, length + 1);
    *module = loaded;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    log_call(__func__);
    return load_module(module, image, NULL, 0);
}

/* Only the error-log options are read; others are accepted and ignored. */
CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int count, CUjit_option *options,
                            void **values) {
    log_call(__func__);
    char *log = NULL;
    size_t log_size = 0;
    for (unsigned int i = 0; options != NULL && values != NULL && i < count; i++) {
        if (options[i] == CU_JIT_ERROR_LOG_BUFFER) {
            log = values[i];
        } else if (options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) {
            /* The value is the size itself, cast to a pointer. */
            log_size = (size_t)(uintptr_t)values[i];
        }
    }
    return load_module(module, image, log, log_size);
}

CUresult cuModuleUnload(CUmodule module) {
    log_call(__func__);
    if (module == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    while (module->functions != NULL) {
        struct fake_function *next = module->functions->next;
        free(module->functions->name);
        free(module->functions);
        module->functions = next;
    }
    free(module->ptx);
    free(module);
    return CUDA_SUCCESS;
}

/* Whether `c` may continue a PTX identifier. */
static int identifier_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
}

/* The size of one `.param` declaration, `[start, end)` of the PTX: its
 * type's width (`.u64`, `.b8`, `.f32`, ...) times its array length, if it
 * has one (`name[24]`); 0 if it has no such type. */
static size_t param_size(const char *start, const char *end) {
    size_t width = 0;
    for (const char *at = start; at + 2 < end && width == 0; at++) {
        if (at[0] == '.' && strchr("bsuf", at[1]) != NULL && at[2] >= '1' && at[2] <= '9') {
            char *after;
            unsigned long bits = strtoul(at + 2, &after, 10);
            if (after <= end && !identifier_char(*after) && (bits == 8 || bits == 16 || bits == 32 || bits == 64)) {
                width = bits / 8;
            }
        }
    }
    const char *bracket = memchr(start, '[', (size_t)(end - start));
    return bracket == NULL ? width : width * strtoul(bracket + 1, NULL, 10);
}

/* Reads the parameter list that follows an `.entry`'s name at `at` into
 * `function`: none without a `(`, -1 where a declaration has no size. */
static void read_params(struct fake_function *function, const char *at) {
    function->param_count = 0;
    while (*at == ' ' || *at == '\t' || *at == '\n' || *at == '\r') {
        at++;
    }
    if (*at != '(') {
        return;
    }
    const char *close = strchr(at, ')');
    for (const char *param = strstr(at, ".param"); param != NULL && close != NULL && param < close;
         param = strstr(param + 1, ".param")) {
        const char *comma = strchr(param, ',');
        const char *end = comma != NULL && comma < close ? comma : close;
        size_t size = param_size(param + strlen(".param"), end);
        if (size == 0 || function->param_count == MAX_PARAMS) {
            function->param_count = -1;
            return;
        }
        function->param_sizes[function->param_count++] = size;
    }
}

/* CUDA_ERROR_NOT_FOUND unless the module's PTX has `.entry NAME`. */
CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    log_call(__func__);
    if (function == NULL || module == NULL || name == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t length = strlen(name);
    for (const char *at = strstr(module->ptx, ".entry"); at != NULL; at = strstr(at + 1, ".entry")) {
        const char *entry = at + strlen(".entry");
        while (*entry == ' ' || *entry == '\t' || *entry == '\n' || *entry == '\r') {
            entry++;
        }
        if (strncmp(entry, name, length) == 0 && !identifier_char(entry[length])) {
            struct fake_function *found = calloc(1, sizeof *found);
            if (found == NULL || (found->name = malloc(length + 1)) == NULL) {
                free(found);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            memcpy(found->name, name, length + 1);
            read_params(found, entry + length);
            found->next = module->functions;
            module->functions = found;
            *function = found;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

/* A kernel's limits: the device's block size, no static shared memory. */
CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attribute, CUfunction function) {
    log_call(__func__);
    if (value == NULL || function == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *value = 1024;
        return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
        *value = 0;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* Appends `line` to the HWQUEUE_FAKE_LAUNCHES file, if one is named, in one
 * write, as log_call does. */
static void log_launch(const char *line) {
    const char *path = launches_path;
    if (path == NULL || *path == '\0') {
        return;
    }
    FILE *file = fopen(path, "a");
    if (file != NULL) {
        fprintf(file, "%s\n", line);
        fclose(file);
    }
}

/* Logs a kernel run, `via` a stream or a graph, as
 * `kernel NAME via=VIA grid=X,Y,Z block=X,Y,Z shared=N params=P,...`: each
 * parameter of 1, 2, 4 or 8 bytes as an unsigned number, any other as hex
 * bytes; `params=?` where they are not known (the PTX's list unread, or
 * passed in `extra`). */
static void log_kernel(const char *via, CUfunction function, const unsigned int grid[3], const unsigned int block[3],
                       unsigned int shared_bytes, void *const *params) {
    const char *path = launches_path;
    if (path == NULL || *path == '\0') {
        return; /* not formatted either: a callgrind count is of the caller */
    }
    char line[4096];
    size_t used = (size_t)snprintf(line, sizeof line, "kernel %s via=%s grid=%u,%u,%u block=%u,%u,%u shared=%u params=",
                                   function->name, via, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                   shared_bytes);
    if ((params == NULL || function->param_count < 0) && used < sizeof line) {
        snprintf(line + used, sizeof line - used, "?");
    }
    for (int i = 0; params != NULL && i < function->param_count && used < sizeof line; i++) {
        size_t size = function->param_sizes[i];
        const char *separator = i == 0 ? "" : ",";
        if (size == 1 || size == 2 || size == 4 || size == 8) {
            unsigned long long value = 0; /* little-endian, as the host is */
            memcpy(&value, params[i], size);
            used += (size_t)snprintf(line + used, sizeof line - used, "%s%llu", separator, value);
            continue;
        }
        used += (size_t)snprintf(line + used, sizeof line - used, "%s0x", separator);
        for (size_t byte = 0; byte < size && used < sizeof line; byte++) {
            used += (size_t)snprintf(line + used, sizeof line - used, "%02x", ((const unsigned char *)params[i])[byte]);
        }
    }
    log_launch(line);
}

static CUresult add_kernel_node(struct fake_graph *graph, CUfunction function, const unsigned int grid[3],
                                const unsigned int block[3], unsigned int shared_bytes, void *const *params);

/* A kernel does nothing but show in the HWQUEUE_FAKE_LAUNCHES log; a launch
 * after the fault reports it; a launch in capture is a kernel node. */
CUresult cuLaunchKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                        unsigned int block_x, unsigned int block_y, unsigned int block_z, unsigned int shared_bytes,
                        CUstream stream, void **params, void **extra) {
    log_call(__func__);
    if (function == NULL || grid_x == 0 || grid_y == 0 || grid_z == 0 || block_x == 0 || block_y == 0 ||
        block_z == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* As the driver: a launch on a stream of a context that is not the
     * thread's current one is refused. */
    if (created_stream(stream) && stream->context != current_context) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    struct fake_graph *graph;
    CUresult result = begin_work(stream, __func__, &graph);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    const unsigned int grid[3] = {grid_x, grid_y, grid_z};
    const unsigned int block[3] = {block_x, block_y, block_z};
    if (graph != NULL) {
        if (extra != NULL) {
            unmodelled("capturing a kernel launch with `extra`");
        }
        return add_kernel_node(graph, function, grid, block, shared_bytes, params);
    }
    log_kernel("stream", function, grid, block, shared_bytes, extra == NULL ? params : NULL);
    after_work(__func__);
    return CUDA_SUCCESS;
}

/* Not here, on purpose: cuFuncGetParamInfo (CUDA 12.4), which the 12.2
 * driver this fake reports lacks (issue 24, defect 5). */

/* ---- Graphs ---------------------------------------------------------------- */

/* cuda.h's CUgraphInstantiate_flags (cuGraphInstantiateWithFlags takes
 * these three) and CUgraphExecUpdateResult values. */
#define CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH 1
#define CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH 4
#define CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY 8
#define CU_GRAPH_EXEC_UPDATE_SUCCESS 0
#define CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED 2
#define CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED 3
#define CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED 5

/* cuda.h's kernel node parameters: CUDA_KERNEL_NODE_PARAMS_v1, which the
 * unversioned entry points take, and _v2 (cuda.h's CUDA_KERNEL_NODE_PARAMS
 * since 12.0), which the `_v2` ones take: v1's fields, then two more. */
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;

typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;

typedef struct {
    CUgraphExecUpdateResult result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

/* A kernel node's launch, with its own copy of the parameters' values. */
struct kernel_node {
    CUfunction function;
    unsigned int grid[3], block[3], shared_bytes;
    CUcontext context;
    void **params;         /* one pointer a parameter, into `values` */
    unsigned char *values;
};

struct fake_node {
    CUgraphNodeType type;
    union {
        struct kernel_node kernel;
        struct {
            enum copy_direction direction;
            void *dst;
            const void *src;
            size_t bytes;
        } copy;
        struct {
            CUdeviceptr dst;
            unsigned int value, element_bytes;
            size_t count;
        } fill;
        CUevent event;
    } as;
};

/* A graph: its nodes in the order they were added, each depending on the
 * one before (all that one capturing stream makes). */
struct fake_graph {
    struct fake_node **nodes;
    size_t count, capacity;
};

/* An executable graph: copies of a graph's nodes, and the node of that
 * graph each copies (how cuGraphExec*SetParams name them). */
struct fake_exec {
    struct fake_node *nodes;
    CUgraphNode *origins;
    size_t count;
};

/* Copies the values of `function`'s parameters from `params` (a pointer a
 * parameter, as cuLaunchKernel takes them) into `kernel`. */
static CUresult copy_params(struct kernel_node *kernel, CUfunction function, void *const *params) {
    if (function->param_count < 0) {
        unmodelled("a kernel whose PTX parameter list the fake cannot read, in a graph,");
    }
    size_t total = 0;
    for (int i = 0; i < function->param_count; i++) {
        total += function->param_sizes[i];
    }
    if (function->param_count > 0 && params == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    void **pointers = calloc((size_t)function->param_count + 1, sizeof *pointers);
    unsigned char *values = malloc(total + 1);
    if (pointers == NULL || values == NULL) {
        free(pointers);
        free(values);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t offset = 0;
    for (int i = 0; i < function->param_count; i++) {
        memcpy(values + offset, params[i], function->param_sizes[i]);
        pointers[i] = values + offset;
        offset += function->param_sizes[i];
    }
    kernel->params = pointers;
    kernel->values = values;
    return CUDA_SUCCESS;
}

static void free_node(struct fake_node *node) {
    if (node->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        free(node->as.kernel.params);
        free(node->as.kernel.values);
    }
}

/* `*to` made a copy of `*from`, kernel parameters included. */
static CUresult copy_node(struct fake_node *to, const struct fake_node *from) {
    *to = *from;
    if (from->type != CU_GRAPH_NODE_TYPE_KERNEL) {
        return CUDA_SUCCESS;
    }
    return copy_params(&to->as.kernel, from->as.kernel.function, from->as.kernel.params);
}

/* Appends `node` to `graph`, which takes over its parameters, or frees
 * them on failure. */
static CUresult append(struct fake_graph *graph, struct fake_node *node) {
    if (graph->count == graph->capacity) {
        size_t capacity = graph->capacity == 0 ? 8 : graph->capacity * 2;
        struct fake_node **nodes = realloc(graph->nodes, capacity * sizeof *nodes);
        if (nodes == NULL) {
            free_node(node);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        graph->nodes = nodes;
        graph->capacity = capacity;
    }
    struct fake_node *added = malloc(sizeof *added);
    if (added == NULL) {
        free_node(node);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *added = *node;
    graph->nodes[graph->count++] = added;
    return CUDA_SUCCESS;
}

static CUresult add_kernel_node(struct fake_graph *graph, CUfunction function, const unsigned int grid[3],
                                const unsigned int block[3], unsigned int shared_bytes, void *const *params) {
    struct fake_node node = {.type = CU_GRAPH_NODE_TYPE_KERNEL};
    node.as.kernel.function = function;
    memcpy(node.as.kernel.grid, grid, sizeof node.as.kernel.grid);
    memcpy(node.as.kernel.block, block, sizeof node.as.kernel.block);
    node.as.kernel.shared_bytes = shared_bytes;
    node.as.kernel.context = current_context;
    CUresult result = copy_params(&node.as.kernel, function, params);
    return result != CUDA_SUCCESS ? result : append(graph, &node);
}

static CUresult add_copy_node(struct fake_graph *graph, enum copy_direction direction, void *dst, const void *src,
                              size_t bytes) {
    struct fake_node node = {.type = CU_GRAPH_NODE_TYPE_MEMCPY};
    node.as.copy.direction = direction;
    node.as.copy.dst = dst;
    node.as.copy.src = src;
    node.as.copy.bytes = bytes;
    return append(graph, &node);
}

static CUresult add_fill_node(struct fake_graph *graph, CUdeviceptr dst, unsigned int value, unsigned int element_bytes,
                              size_t count) {
    struct fake_node node = {.type = CU_GRAPH_NODE_TYPE_MEMSET};
    node.as.fill.dst = dst;
    node.as.fill.value = value;
    node.as.fill.element_bytes = element_bytes;
    node.as.fill.count = count;
    return append(graph, &node);
}

static CUresult add_event_node(struct fake_graph *graph, CUgraphNodeType type, CUevent event) {
    struct fake_node node = {.type = type};
    node.as.event = event;
    return append(graph, &node);
}

static void destroy_graph(struct fake_graph *graph) {
    for (size_t i = 0; i < graph->count; i++) {
        free_node(graph->nodes[i]);
        free(graph->nodes[i]);
    }
    free(graph->nodes);
    free(graph);
}

static void destroy_exec(struct fake_exec *exec) {
    for (size_t i = 0; i < exec->count; i++) {
        free_node(&exec->nodes[i]);
    }
    free(exec->nodes);
    free(exec->origins);
    free(exec);
}

/* Runs one node of a launched graph. */
static void run_node(const struct fake_node *node) {
    switch (node->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        log_kernel("graph", node->as.kernel.function, node->as.kernel.grid, node->as.kernel.block,
                   node->as.kernel.shared_bytes, node->as.kernel.params);
        break;
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        memmove(node->as.copy.dst, node->as.copy.src, node->as.copy.bytes);
        break;
    case CU_GRAPH_NODE_TYPE_MEMSET:
        fill(node->as.fill.dst, node->as.fill.value, node->as.fill.element_bytes, node->as.fill.count);
        break;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
        node->as.event->captured_in = 0;
        break;
    default: /* a wait: every event is complete */
        break;
    }
}

/* ---- Stream capture ------------------------------------------------------- */

/* The legacy stream cannot be captured; a stream captures once at a time. */
CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
    log_call(__func__);
    CUresult result = refusal(__func__);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (stream == NULL || stream == CU_STREAM_LEGACY) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (!created_stream(stream)) {
        unmodelled("capturing the per-thread default stream");
    }
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (stream->capture != NULL) {
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    result = check_context();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    struct capture *capture = calloc(1, sizeof *capture);
    struct fake_graph *graph = calloc(1, sizeof *graph);
    if (capture == NULL || graph == NULL) {
        free(capture);
        free(graph);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    capture->graph = graph;
    capture->stream = stream;
    capture->context = current_context;
    capture->mode = mode;
    capture->thread = &thread_identity;
    pthread_mutex_lock(&capture_lock);
    capture->id = ++last_capture_id;
    capture->next = captures;
    captures = capture;
    pthread_mutex_unlock(&capture_lock);
    stream->capture = capture;
    return CUDA_SUCCESS;
}

/* Takes `stream`'s capture off the list and frees it (not its graph). */
static void end_capture(CUstream stream) {
    struct capture *capture = stream->capture;
    pthread_mutex_lock(&capture_lock);
    for (struct capture **at = &captures; *at != NULL; at = &(*at)->next) {
        if (*at == capture) {
            *at = capture->next;
            break;
        }
    }
    pthread_mutex_unlock(&capture_lock);
    stream->capture = NULL;
    free(capture);
}

/* The graph, or NULL and CUDA_ERROR_STREAM_CAPTURE_INVALIDATED for an
 * invalidated capture; both end it. A capture not begun relaxed ends on
 * the thread that began it. */
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph) {
    log_call(__func__);
    CUresult result = refusal(__func__);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (graph == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!created_stream(stream) || stream->capture == NULL) {
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    struct capture *capture = stream->capture;
    if (capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED && capture->thread != &thread_identity) {
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    struct fake_graph *captured = capture->graph;
    int invalidated = atomic_load(&capture->invalidated);
    end_capture(stream);
    if (invalidated) {
        destroy_graph(captured);
        *graph = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *graph = captured;
    return CUDA_SUCCESS;
}

/* On the legacy stream: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while a blocking
 * stream captures, else none. */
CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status) {
    log_call(__func__);
    CUresult result = refusal(__func__);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (status == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (stream == NULL || stream == CU_STREAM_LEGACY) {
        result = legacy_stream_check(0);
    }
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!created_stream(stream) || stream->capture == NULL) {
        *status = CU_STREAM_CAPTURE_STATUS_NONE;
    } else if (atomic_load(&stream->capture->invalidated)) {
        *status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    } else {
        *status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    }
    return CUDA_SUCCESS;
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    log_call(__func__);
    if (mode == NULL || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUstreamCaptureMode previous = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = previous;
    return CUDA_SUCCESS;
}

/* ---- Graph entry points ------------------------------------------------------ */

CUresult cuGraphCreate(CUgraph *graph, unsigned int flags) {
    log_call(__func__);
    CUresult result = refusal(__func__);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (graph == NULL || flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *graph = calloc(1, sizeof **graph);
    return *graph == NULL ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph graph) {
    log_call(__func__);
    if (graph == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    destroy_graph(graph);
    return CUDA_SUCCESS;
}

/* Nodes in the order they were added; with `nodes` NULL, only how many. */
CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count) {
    log_call(__func__);
    CUresult result = refusal(__func__);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (graph == NULL || count == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (nodes != NULL) {
        for (size_t i = 0; i < *count; i++) {
            nodes[i] = i < graph->count ? graph->nodes[i] : NULL;
        }
        if (*count < graph->count) {
            return CUDA_SUCCESS;
        }
    }
    *count = graph->count;
    return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type) {
    log_call(__func__);
    CUresult result = refusal(__func__);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (node == NULL || type == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *type = node->type;
    return CUDA_SUCCESS;
}

/* `kernelParams` points into the node's own copy, as the driver's does.
 * Both versions' entry points, named `symbol`. */
static CUresult get_kernel_params(const char *symbol, CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v2 *params) {
    log_call(symbol);
    CUresult result = refusal(symbol);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (node == NULL || params == NULL || node->type != CU_GRAPH_NODE_TYPE_KERNEL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    const struct kernel_node *kernel = &node->as.kernel;
    params->func = kernel->function;
    params->gridDimX = kernel->grid[0];
    params->gridDimY = kernel->grid[1];
    params->gridDimZ = kernel->grid[2];
    params->blockDimX = kernel->block[0];
    params->blockDimY = kernel->block[1];
    params->blockDimZ = kernel->block[2];
    params->sharedMemBytes = kernel->shared_bytes;
    params->kernelParams = kernel->params;
    params->extra = NULL;
    params->kern = NULL;
    params->ctx = kernel->context;
    return CUDA_SUCCESS;
}

CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v2 *params) {
    return get_kernel_params(__func__, node, params);
}

CUresult cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v1 *params) {
    CUDA_KERNEL_NODE_PARAMS_v2 all;
    CUresult result = get_kernel_params(__func__, node, params == NULL ? NULL : &all);
    if (result == CUDA_SUCCESS) {
        memcpy(params, &all, sizeof *params);
    }
    return result;
}

/* Adds a kernel node after `count` nodes of `graph` (the fake runs a
 * graph's nodes in the order they were added, which a chain of nodes each
 * after the one before keeps). Both versions' entry points, named `symbol`. */
static CUresult add_kernel(const char *symbol, CUgraphNode *node, CUgraph graph, const CUgraphNode *dependencies,
                           size_t count, const CUDA_KERNEL_NODE_PARAMS_v2 *params) {
    log_call(symbol);
    CUresult result = refusal(symbol);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (node == NULL || graph == NULL || params == NULL || (count > 0 && dependencies == NULL)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < count; i++) {
        size_t at = 0;
        while (at < graph->count && graph->nodes[at] != dependencies[i]) {
            at++;
        }
        if (at == graph->count) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (params->func == NULL && params->kern != NULL) {
        unmodelled("a kernel node launching a CUkernel");
    }
    if (params->extra != NULL) {
        unmodelled("kernel node parameters in `extra`");
    }
    if (params->func == NULL || params->gridDimX == 0 || params->gridDimY == 0 || params->gridDimZ == 0 ||
        params->blockDimX == 0 || params->blockDimY == 0 || params->blockDimZ == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    result = check_context();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    const unsigned int grid[3] = {params->gridDimX, params->gridDimY, params->gridDimZ};
    const unsigned int block[3] = {params->blockDimX, params->blockDimY, params->blockDimZ};
    result = add_kernel_node(graph, params->func, grid, block, params->sharedMemBytes,
                             params->kernelParams);
    if (result == CUDA_SUCCESS) {
        *node = graph->nodes[graph->count - 1];
    }
    return result;
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *dependencies, size_t count,
                                 const CUDA_KERNEL_NODE_PARAMS_v2 *params) {
    return add_kernel(__func__, node, graph, dependencies, count, params);
}

CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *dependencies, size_t count,
                              const CUDA_KERNEL_NODE_PARAMS_v1 *params) {
    CUDA_KERNEL_NODE_PARAMS_v2 all = {0};
    if (params != NULL) {
        memcpy(&all, params, sizeof *params);
    }
    return add_kernel(__func__, node, graph, dependencies, count, params == NULL ? NULL : &all);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    log_call(__func__);
    CUresult result = refusal(__func__);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if (exec == NULL || graph == NULL || (flags & ~known) != 0 ||
        ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) &&
         (flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH))) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    result = check_context();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    struct fake_exec *made = calloc(1, sizeof *made);
    if (made == NULL || (made->nodes = calloc(graph->count + 1, sizeof *made->nodes)) == NULL ||
        (made->origins = calloc(graph->count + 1, sizeof *made->origins)) == NULL) {
        if (made != NULL) {
            free(made->nodes);
        }
        free(made);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (; made->count < graph->count; made->count++) {
        result = copy_node(&made->nodes[made->count], graph->nodes[made->count]);
        if (result != CUDA_SUCCESS) {
            destroy_exec(made);
            return result;
        }
        made->origins[made->count] = graph->nodes[made->count];
    }
    *exec = made;
    return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
    log_call(__func__);
    if (exec == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    destroy_exec(exec);
    return CUDA_SUCCESS;
}

/* Runs the nodes in order at once, logging `graph nodes=N` first. Capturing
 * a graph launch (a child graph node) is not modelled. */
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    log_call(__func__);
    CUresult result = refusal(__func__);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (exec == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fake_graph *graph;
    result = begin_work(stream, __func__, &graph);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (graph != NULL) {
        unmodelled("capturing cuGraphLaunch (a child graph node)");
    }
    if (launches_path != NULL && *launches_path != '\0') {
        char line[64];
        snprintf(line, sizeof line, "graph nodes=%zu", exec->count);
        log_launch(line);
    }
    for (size_t i = 0; i < exec->count; i++) {
        run_node(&exec->nodes[i]);
    }
    after_work(__func__);
    return CUDA_SUCCESS;
}

CUresult cuGraphUpload(CUgraphExec exec, CUstream stream) {
    log_call(__func__);
    CUresult result = refusal(__func__);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (exec == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fake_graph *graph;
    result = begin_work(stream, __func__, &graph);
    if (graph != NULL) {
        unmodelled("capturing cuGraphUpload");
    }
    return result;
}

/* Sets the parameters of the copy of `node` in `exec` (not of `node`):
 * the function may change, not the node's context. Launches through a
 * CUkernel (`kern`) are not modelled, nor is `extra`. Both versions' entry
 * points, named `symbol`. */
static CUresult set_exec_kernel_params(const char *symbol, CUgraphExec exec, CUgraphNode node,
                                       const CUDA_KERNEL_NODE_PARAMS_v2 *params) {
    log_call(symbol);
    CUresult result = refusal(symbol);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (exec == NULL || node == NULL || params == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t at = 0;
    while (at < exec->count && exec->origins[at] != node) {
        at++;
    }
    if (at == exec->count || exec->nodes[at].type != CU_GRAPH_NODE_TYPE_KERNEL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (params->func == NULL && params->kern != NULL) {
        unmodelled("a kernel node launching a CUkernel");
    }
    if (params->extra != NULL) {
        unmodelled("kernel node parameters in `extra`");
    }
    if (params->func == NULL || params->gridDimX == 0 || params->gridDimY == 0 || params->gridDimZ == 0 ||
        params->blockDimX == 0 || params->blockDimY == 0 || params->blockDimZ == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct kernel_node *kernel = &exec->nodes[at].as.kernel;
    struct kernel_node updated = {
        .function = params->func,
        .grid = {params->gridDimX, params->gridDimY, params->gridDimZ},
        .block = {params->blockDimX, params->blockDimY, params->blockDimZ},
        .shared_bytes = params->sharedMemBytes,
        .context = kernel->context,
    };
    result = copy_params(&updated, params->func, params->kernelParams);
    if (result == CUDA_SUCCESS) {
        free(kernel->params);
        free(kernel->values);
        *kernel = updated;
    }
    return result;
}

CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                           const CUDA_KERNEL_NODE_PARAMS_v2 *params) {
    return set_exec_kernel_params(__func__, exec, node, params);
}

CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *params) {
    CUDA_KERNEL_NODE_PARAMS_v2 all = {0};
    if (params != NULL) {
        memcpy(&all, params, sizeof *params);
    }
    return set_exec_kernel_params(__func__, exec, node, params == NULL ? NULL : &all);
}

/* Gives `exec` the parameters of `graph`'s nodes, which must be as many, of
 * the same types, in the same order, each copy between the same kinds of
 * memory; else CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, `info` saying why,
 * and `exec` unchanged. Its nodes are still named by the nodes of the graph
 * it was instantiated from. Both versions' entry points, named `symbol`. */
static CUresult exec_update(const char *symbol, CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info) {
    log_call(symbol);
    CUresult result = refusal(symbol);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (exec == NULL || graph == NULL || info == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    info->errorNode = NULL;
    info->errorFromNode = NULL;
    if (graph->count != exec->count) {
        info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
        return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    for (size_t i = 0; i < graph->count; i++) {
        const struct fake_node *to = graph->nodes[i];
        const struct fake_node *from = &exec->nodes[i];
        if (to->type != from->type) {
            info->result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
        } else if (to->type == CU_GRAPH_NODE_TYPE_MEMCPY && to->as.copy.direction != from->as.copy.direction) {
            info->result = CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED;
        }
        if (info->result != CU_GRAPH_EXEC_UPDATE_SUCCESS) {
            info->errorNode = graph->nodes[i];
            info->errorFromNode = exec->origins[i];
            return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
        }
    }
    struct fake_node *nodes = calloc(graph->count + 1, sizeof *nodes);
    if (nodes == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < graph->count; i++) {
        result = copy_node(&nodes[i], graph->nodes[i]);
        if (result != CUDA_SUCCESS) {
            while (i-- > 0) {
                free_node(&nodes[i]);
            }
            free(nodes);
            return result;
        }
    }
    for (size_t i = 0; i < exec->count; i++) {
        free_node(&exec->nodes[i]);
    }
    free(exec->nodes);
    exec->nodes = nodes;
    return CUDA_SUCCESS;
}

CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info) {
    return exec_update(__func__, exec, graph, info);
}

CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node, CUgraphExecUpdateResult *outcome) {
    CUgraphExecUpdateResultInfo info;
    CUresult result = exec_update(__func__, exec, graph, error_node == NULL || outcome == NULL ? NULL : &info);
    if (result == CUDA_SUCCESS || result == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) {
        *error_node = info.errorNode;
        *outcome = info.result;
    }
    return result;
}
