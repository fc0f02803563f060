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
 *
 * Every CUresult this file returns must be one the `CUDA_ERRORS` table below
 * lists: cudarc reads CUresult as a Rust enum, so a number that enum lacks
 * would be undefined behaviour on the Rust side. An unlisted
 * HWQUEUE_FAKE_CUINIT therefore aborts the process with a message.
 *
 * Growing it: only the entry points hwqueue reaches on the probe path exist
 * (initialisation, version, error names, device queries). Contexts,
 * streams, modules and functions are meant to be added the same way: one
 * function per `cu*` symbol, its result chosen by a HWQUEUE_FAKE_* variable
 * read through `env_int`, `log_call` first, and every returned code listed in
 * `CUDA_ERRORS`. A symbol that is missing makes cudarc panic "Missing symbol
 * cuX" when hwqueue first calls it, which is how to find the next one to add.
 *
 * Not thread-safe beyond what the tests need: each scenario runs in a child
 * process with one test thread.
 */

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The types of cuda.h this file needs, with cuda.h's ABI (all `int` or
 * `size_t` sized). */
typedef int CUresult;
typedef int CUdevice;
typedef int CUdevice_attribute;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101

/* cuda.h's CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT. */
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16

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
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
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

/* Appends `symbol` to the HWQUEUE_FAKE_CALLS file, if one is named. */
static void log_call(const char *symbol) {
    const char *path = getenv("HWQUEUE_FAKE_CALLS");
    if (path == NULL || *path == '\0') {
        return;
    }
    FILE *file = fopen(path, "a");
    if (file != NULL) {
        fprintf(file, "%s\n", symbol);
        fclose(file);
    }
}

/* Whether cuInit succeeded: the device queries fail before it, as the real
 * driver's do. */
static int initialised = 0;

/* ---- Initialisation and version ---------------------------------------- */

CUresult cuInit(unsigned int flags) {
    log_call("cuInit");
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult result = env_int("HWQUEUE_FAKE_CUINIT", CUDA_SUCCESS);
    if (error_index(result) < 0) {
        fprintf(stderr,
                "fake libcuda: HWQUEUE_FAKE_CUINIT=%d is not in CUDA_ERRORS (tests/fake_cuda/libcuda.c); "
                "add it there (it must be a CUresult cudarc knows)\n",
                result);
        abort();
    }
    initialised = result == CUDA_SUCCESS;
    return result;
}

CUresult cuDriverGetVersion(int *version) {
    log_call("cuDriverGetVersion");
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
    log_call("cuGetErrorName");
    if (name == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    int index = error_index(error);
    *name = index < 0 ? NULL : CUDA_ERRORS[index].name;
    return index < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **description) {
    log_call("cuGetErrorString");
    if (description == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    int index = error_index(error);
    *description = index < 0 ? NULL : CUDA_ERRORS[index].description;
    return index < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- Devices (what Cuda::probe asks of each) ------------------------------ */

/* Device `ordinal` exists: CUDA_SUCCESS, else the driver's error for it. */
static CUresult check_device(CUdevice device) {
    if (!initialised) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (device < 0 || device >= env_int("HWQUEUE_FAKE_DEVICE_COUNT", 0)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    log_call("cuDeviceGetCount");
    if (!initialised) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (count == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *count = env_int("HWQUEUE_FAKE_DEVICE_COUNT", 0);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    log_call("cuDeviceGet");
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
    log_call("cuDeviceGetName");
    CUresult result = check_device(device);
    if (result == CUDA_SUCCESS && (name == NULL || length <= 0)) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    if (result == CUDA_SUCCESS) {
        snprintf(name, (size_t)length, "hwqueue fake GPU %d", device);
    }
    return result;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    log_call("cuDeviceTotalMem_v2");
    CUresult result = check_device(device);
    if (result == CUDA_SUCCESS && bytes == NULL) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    if (result == CUDA_SUCCESS) {
        *bytes = (size_t)1 << 30; /* 1 GiB */
    }
    return result;
}

/* Only the multiprocessor count is known; any other attribute is
 * CUDA_ERROR_INVALID_VALUE, which shows up in a test as a call to add. */
CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device) {
    log_call("cuDeviceGetAttribute");
    CUresult result = check_device(device);
    if (result == CUDA_SUCCESS && (value == NULL || attribute != CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)) {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    if (result == CUDA_SUCCESS) {
        *value = 4;
    }
    return result;
}
