/*
 * What the fake NVIDIA libraries (libcuda.c, libnvrtc.c) share: the call
 * log that tests/cuda_fake_driver.rs reads.
 */

#ifndef HWQUEUE_FAKE_COMMON_H
#define HWQUEUE_FAKE_COMMON_H

#include <stdio.h>
#include <stdlib.h>

/* HWQUEUE_FAKE_CALLS, read once when the library loads: the tests set the
 * fakes' variables before the process starts and nothing changes them, and
 * an entry point then costs a few instructions, not a scan of the
 * environment (benches/callgrind.sh counts the caller's instructions). */
static const char *calls_path;

__attribute__((constructor)) static void read_calls_path(void) {
    calls_path = getenv("HWQUEUE_FAKE_CALLS");
}

/* Appends `symbol` to the HWQUEUE_FAKE_CALLS file, if one is named. Each
 * line is one small append, so threads calling at once do not mix lines. */
static void log_call(const char *symbol) {
    const char *path = calls_path;
    if (path == NULL || *path == '\0') {
        return;
    }
    FILE *file = fopen(path, "a");
    if (file != NULL) {
        fprintf(file, "%s\n", symbol);
        fclose(file);
    }
}

#endif
