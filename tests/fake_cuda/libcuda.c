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
 *                                ...): once it has been called, the device has
 *                                faulted (see "Faults" below). Unset: never
 *   HWQUEUE_FAKE_FAULT           the fault's CUresult (default 700,
 *                                CUDA_ERROR_ILLEGAL_ADDRESS)
 *   HWQUEUE_FAKE_FAULT_SEEN_BY   a comma-separated list of the entry points
 *                                that report the fault; unset: all that can
 *
 * The model:
 *   - One process, devices 0 .. HWQUEUE_FAKE_DEVICE_COUNT - 1, each with a
 *     primary context (a static object, reference-counted). The current
 *     context is per thread, as in the driver; the calls that create
 *     something in "the current context" (streams, events, memory, modules)
 *     answer CUDA_ERROR_INVALID_CONTEXT on a thread that has none, so a
 *     caller that forgets to bind its context on a thread fails here too.
 *   - Device pointers are host pointers: cuMemAlloc & co. are aligned
 *     malloc, and copies and fills are memcpy/memset, done at once.
 *     Page-locked memory (cuMemHostAlloc) is plain malloc too.
 *   - Work completes as soon as it is enqueued: every event is complete,
 *     every synchronisation returns at once, a stream callback is called
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
 *     a sticky error is returned by a faulted context's calls. Destroying
 *     handles and freeing memory still succeed. A stream callback is called
 *     with the fault as its status. The fault is the whole fake's (one
 *     device is all the tests fault).
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
 * beside the test's): the shared state is atomics; the current context is
 * thread-local; each handle is used by one caller at a time.
 */

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_PTX 218
#define CUDA_ERROR_UNSUPPORTED_PTX_VERSION 222
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_ILLEGAL_ADDRESS 700

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
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility was attempted on non supported HW"},
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

/* Whether cuInit succeeded: the device queries fail before it, as the real
 * driver's do. */
static atomic_int initialised = 0;

/* ---- Faults --------------------------------------------------------------- */

/* Set once HWQUEUE_FAKE_FAULT_AFTER's entry point ran. */
static atomic_int faulted = 0;

/* Called by each entry point that enqueues work, after it did: the device
 * faults if `symbol` is HWQUEUE_FAKE_FAULT_AFTER's. Entry points name
 * themselves with `__func__` (here, to `device_fault` and to `log_call`),
 * so the symbol a fault scenario names can never be mistyped. */
static void after_work(const char *symbol) {
    const char *after = getenv("HWQUEUE_FAKE_FAULT_AFTER");
    if (after != NULL && strcmp(after, symbol) == 0) {
        atomic_store(&faulted, 1);
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
    return env_code("HWQUEUE_FAKE_FAULT", CUDA_ERROR_ILLEGAL_ADDRESS);
}

/* ---- Initialisation and version ---------------------------------------- */

CUresult cuInit(unsigned int flags) {
    log_call(__func__);
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult result = env_code("HWQUEUE_FAKE_CUINIT", CUDA_SUCCESS);
    atomic_store(&initialised, result == CUDA_SUCCESS);
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

CUresult cuCtxGetCurrent(CUcontext *context) {
    log_call(__func__);
    if (!atomic_load(&initialised)) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (context == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *context = current_context;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext context) {
    log_call(__func__);
    if (!atomic_load(&initialised)) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    current_context = context;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    log_call(__func__);
    CUresult result = check_context();
    return result != CUDA_SUCCESS ? result : device_fault(__func__);
}

/* ---- Streams --------------------------------------------------------------- */

/* Work on a stream is done when enqueued, and recorded work is done, so
 * an event is complete from its record on: streams and events are only
 * handles, made in the current context. */
struct fake_handle {
    unsigned int flags;
};

static CUresult new_handle(struct fake_handle **handle, unsigned int flags) {
    CUresult result = check_context();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (handle == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *handle = malloc(sizeof **handle);
    if (*handle == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*handle)->flags = flags;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
    log_call(__func__);
    return new_handle(stream, flags);
}

CUresult cuStreamDestroy_v2(CUstream stream) {
    log_call(__func__);
    free(stream);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream stream) {
    log_call(__func__);
    (void)stream;
    return device_fault(__func__);
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
    log_call(__func__);
    (void)stream;
    if (event == NULL || flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return device_fault(__func__);
}

/* The driver calls a stream callback on a thread of its own once the work
 * before it is done, with the stream's status; here that is at once, on the
 * caller's thread (the work is done). */
CUresult cuStreamAddCallback(CUstream stream, CUstreamCallback callback, void *user_data, unsigned int flags) {
    log_call(__func__);
    if (callback == NULL || flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult refused = device_fault(__func__);
    if (refused != CUDA_SUCCESS) {
        return refused;
    }
    CUresult status = atomic_load(&faulted) ? env_code("HWQUEUE_FAKE_FAULT", CUDA_ERROR_ILLEGAL_ADDRESS) : CUDA_SUCCESS;
    callback(stream, status, user_data);
    return CUDA_SUCCESS;
}

/* ---- Events -------------------------------------------------------------- */

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

CUresult cuEventRecord(CUevent event, CUstream stream) {
    log_call(__func__);
    (void)stream;
    if (event == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return device_fault(__func__);
}

CUresult cuEventQuery(CUevent event) {
    log_call(__func__);
    if (event == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return device_fault(__func__);
}

CUresult cuEventSynchronize(CUevent event) {
    log_call(__func__);
    if (event == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return device_fault(__func__);
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
    return result != CUDA_SUCCESS ? result : device_alloc(pointer, bytes);
}

CUresult cuMemFree_v2(CUdeviceptr pointer) {
    log_call(__func__);
    free(host(pointer));
    return CUDA_SUCCESS;
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

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *pointer, size_t bytes, CUmemoryPool pool, CUstream stream) {
    log_call(__func__);
    (void)stream;
    CUresult result = check_context();
    if (result == CUDA_SUCCESS && pool == NULL) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    if (result == CUDA_SUCCESS) {
        result = device_fault(__func__);
    }
    return result != CUDA_SUCCESS ? result : device_alloc(pointer, bytes);
}

CUresult cuMemFreeAsync(CUdeviceptr pointer, CUstream stream) {
    log_call(__func__);
    (void)stream;
    free(host(pointer));
    return CUDA_SUCCESS;
}

/* ---- Copies and fills: done at once, device pointers being host ones ---- */

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
    log_call(__func__);
    (void)stream;
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS) {
        memcpy(host(dst), src, bytes);
        after_work(__func__);
    }
    return result;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    log_call(__func__);
    (void)stream;
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS) {
        memcpy(dst, host(src), bytes);
        after_work(__func__);
    }
    return result;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    log_call(__func__);
    (void)stream;
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS) {
        memmove(host(dst), host(src), bytes);
        after_work(__func__);
    }
    return result;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
    log_call(__func__);
    (void)stream;
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS) {
        memset(host(dst), value, count);
        after_work(__func__);
    }
    return result;
}

CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, CUstream stream) {
    log_call(__func__);
    (void)stream;
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS) {
        unsigned short *out = host(dst);
        for (size_t i = 0; i < count; i++) {
            out[i] = value;
        }
        after_work(__func__);
    }
    return result;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
    log_call(__func__);
    (void)stream;
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS) {
        unsigned int *out = host(dst);
        for (size_t i = 0; i < count; i++) {
            out[i] = value;
        }
        after_work(__func__);
    }
    return result;
}

/* ---- Modules and kernels ----------------------------------------------------- */

/* A loaded module: its PTX text, and the functions taken from it (freed
 * with it). */
struct fake_function {
    struct fake_function *next;
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
            if (found == NULL) {
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
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

/* A kernel does nothing; a launch after the fault reports it. */
CUresult cuLaunchKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                        unsigned int block_x, unsigned int block_y, unsigned int block_z, unsigned int shared_bytes,
                        CUstream stream, void **params, void **extra) {
    log_call(__func__);
    (void)shared_bytes;
    (void)stream;
    (void)params;
    (void)extra;
    if (function == NULL || grid_x == 0 || grid_y == 0 || grid_z == 0 || block_x == 0 || block_y == 0 ||
        block_z == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult result = device_fault(__func__);
    if (result == CUDA_SUCCESS) {
        after_work(__func__);
    }
    return result;
}

/* Not here, on purpose: cuFuncGetParamInfo (CUDA 12.4), which the 12.2
 * driver this fake reports lacks (issue 24, defect 5). */
