/*
 * A fake NVRTC (`libnvrtc.so`) for tests/cuda_fake_driver.rs, beside the
 * fake driver (libcuda.c, whose header explains the set-up).
 *
 * hwqueue asks NVRTC its version when the driver refuses PTX (the error
 * names both), so a scenario that makes the driver refuse PTX needs one.
 * The test puts this library on the child's LD_LIBRARY_PATH only when the
 * scenario sets HWQUEUE_FAKE_NVRTC_VERSION:
 *   HWQUEUE_FAKE_NVRTC_VERSION  what nvrtcVersion reports, as "MAJOR.MINOR"
 *                               (e.g. "12.9")
 *   HWQUEUE_FAKE_CALLS          as for the fake driver: each entry point
 *                               appends its name to this file
 *
 * Only nvrtcVersion exists: compiling is not faked (a missing symbol makes
 * cudarc panic "Missing symbol nvrtcX", naming the next one to add).
 */

#include <stdio.h>
#include <stdlib.h>

#include "fake_common.h"

/* nvrtc.h's nvrtcResult values this file returns. */
typedef int nvrtcResult;
#define NVRTC_SUCCESS 0
#define NVRTC_ERROR_INVALID_INPUT 3

nvrtcResult nvrtcVersion(int *major, int *minor) {
    log_call("nvrtcVersion");
    const char *version = getenv("HWQUEUE_FAKE_NVRTC_VERSION");
    if (major == NULL || minor == NULL || version == NULL || sscanf(version, "%d.%d", major, minor) != 2) {
        return NVRTC_ERROR_INVALID_INPUT;
    }
    return NVRTC_SUCCESS;
}
