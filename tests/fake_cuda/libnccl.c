/*
 * A fake NCCL (`libnccl.so`) for tests/cuda_fake_driver.rs, beside the fake
 * driver (libcuda.c), whose device pointers are host pointers.
 *
 * cudarc dlopens `libnccl.so` by name and resolves each `nccl*` symbol on
 * its first call (a missing one panics then, not at load), so this exports
 * what hwqueue calls: communicator creation and destruction, the
 * collectives, point-to-point, and groups.
 *
 * The model: one rank. A communicator is rank 0 of 1 on one device;
 * ncclCommInitRank with more ranks answers ncclInvalidUsage, and
 * ncclCommSplit gives, for a color, the split's only rank (rank 0 of 1,
 * whatever the key: no other process gives a color) on the parent's
 * device, and for NCCL_SPLIT_NOCOLOR (-1) no communicator (NULL).
 * ncclCommCount and ncclCommUserRank report a communicator's size and
 * rank. Every
 * collective of one rank copies its send buffer to its receive buffer
 * (memmove: in place is allowed), at once, whatever the stream; a send to
 * rank 0 is kept until the matching recv copies it. Groups nest; ops are
 * not deferred to ncclGroupEnd, but each logs the group depth it was
 * called at.
 *
 * Environment (read at each call):
 *   HWQUEUE_FAKE_CALLS        the call log libcuda.c writes too: each entry
 *                             point appends a line, the collectives as
 *                             `ncclAllReduce stream=0x... group=1 count=4`
 *   HWQUEUE_FAKE_NCCL_FAIL    the name of an entry point that fails, each
 *                             call, with HWQUEUE_FAKE_NCCL_RESULT and no
 *                             other effect. Unset: none
 *   HWQUEUE_FAKE_NCCL_RESULT  that failure's ncclResult_t (default 3,
 *   HWQUEUE_FAKE_NCCL_FAIL_LATE  1: a blocking ncclCommSplit that fails
 *                             (HWQUEUE_FAKE_NCCL_FAIL) still gives out the
 *                             new communicator, as NCCL's does when the
 *                             split's init job fails. Unset: it gives none
 *                             ncclInternalError)
 *   HWQUEUE_FAKE_NCCL_HANG    the name of a collective (ncclAllReduce, ...)
 *                             that never completes, as one whose peer died:
 *                             it moves no data and stalls its stream (the
 *                             fake driver's "Stalls": events recorded after
 *                             it are not complete) until ncclCommAbort of
 *                             its communicator, which makes NCCL's kernels
 *                             exit. A safety valve ends the stall after
 *                             HWQUEUE_FAKE_NCCL_HANG_S seconds (default 30)
 *                             all the same, so code that never aborts fails
 *                             its test instead of hanging it. Unset: none
 *   HWQUEUE_FAKE_NCCL_BLOCK_HOST  NAME:N[,NAME:N...]: the Nth call of NAME blocks the
 *                             calling thread for HWQUEUE_FAKE_NCCL_BLOCK_S
 *                             seconds (default 30) (a blocking ncclGroupEnd waiting for
 *                             a peer to connect). Unset: none
 *   HWQUEUE_FAKE_NCCL_BLOCK_RELEASE  1: such a block ends early, once the file
 *                             HWQUEUE_FAKE_CALLS names, with `.release` added,
 *                             exists (a test's gate). Unset: it lasts its seconds
 *   HWQUEUE_FAKE_NCCL_ASYNC_ERROR  an ncclResult_t that ncclCommGetAsyncError
 *                             reports for a communicator with a collective
 *                             stalled as above (an asynchronous error of a
 *                             hung collective, as a peer's failure is).
 *                             Unset: ncclSuccess. ncclCommGetAsyncError is
 *                             not logged: a watchdog polls it
 *   HWQUEUE_FAKE_NCCL_IDLE_ERROR  an ncclResult_t that ncclCommGetAsyncError
 *                             reports for every communicator, a collective
 *                             in flight or not (a peer that failed after
 *                             the last collective). ncclCommDestroy then
 *                             does what NCCL's does: returns it from
 *                             inside the group it opened, which it never
 *                             closes (logged: `ncclCommDestroy left its
 *                             group open`), and frees nothing. Unset: none
 *   HWQUEUE_FAKE_NCCL_DESTROY_RAISES  an ncclResult_t that ncclCommDestroy
 *                             finds raised (a peer failing just after the
 *                             caller's ncclCommGetAsyncError said none),
 *                             handled as under HWQUEUE_FAKE_NCCL_IDLE_ERROR.
 *                             Unset: none
 *   HWQUEUE_FAKE_NCCL_INIT_SETTLED  1: a non-blocking creation has settled
 *                             by the time it returns, and answers
 *                             ncclSuccess (NCCL's thread finished before
 *                             ncclCommInitRankConfig's last look). Unset:
 *                             it answers ncclInProgress
 *   HWQUEUE_FAKE_NCCL_SETTLE_POLLS  how many polls a non-blocking call takes
 *                             to settle (default 2: it says ncclInProgress
 *                             once). A poll from a thread other than the
 *                             one that started the call, while it is in
 *                             progress, is logged: `ncclCommGetAsyncError
 *                             from another thread while a call is in
 *                             progress` (two pollers can finish one call
 *                             twice in NCCL 2.26+)
 *   NCCL_COMM_BLOCKING        NCCL's own: 0 or 1 makes every creation
 *                             (ncclCommInitRank and ncclCommInitAll too)
 *                             non-blocking or blocking, whatever its
 *                             config asked, as NCCL's envConfigOverride
 *                             does; ncclCommInitRank still creates at once
 *                             (NCCL's runs outside a group) and answers
 *                             ncclSuccess. Unset: as asked
 *   HWQUEUE_FAKE_NCCL_VERSION what ncclGetVersion answers (default 22703:
 *                             2.27.3)
 *   HWQUEUE_FAKE_NCCL_PENDING the name of a call on a non-blocking
 *                             communicator (ncclCommInitRankConfig,
 *                             ncclCommSplit, ncclGroupEnd) that never
 *                             settles, as one waiting for a peer that died:
 *                             ncclCommGetAsyncError reports ncclInProgress
 *                             until ncclCommAbort. Unset: each settles on
 *                             the second poll
 *
 * Non-blocking communicators, as NCCL (2.27 and newer) has them: one made
 * by ncclCommInitRankConfig with a config whose `blocking` is 0 (the
 * config is logged: `ncclCommInitRankConfig blocking=0 version=21800
 * size=48`). Its creation, a split of it, and the end of a group of its
 * collectives go on after the call (the creation and a group's end answer
 * ncclInProgress, a split ncclSuccess, as NCCL's do); its
 * ncclCommGetAsyncError says ncclInProgress until the call settled (the
 * first poll) and ncclSuccess from the second on; meanwhile a collective
 * or a split on it answers ncclInvalidUsage (logged as `<call> busy`). As
 * in NCCL, a split takes its blocking mode from the parent, and writes the
 * new communicator to `*newcomm` only once it settled (NULL until then),
 * or when ncclCommAbort of the parent ends it.
 */

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_common.h"

typedef enum {
    ncclSuccess = 0,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclInProgress = 7,
} ncclResult_t;

/* The head of NCCL's ncclConfig_t, the same in every version. */
struct fake_config {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
};

#define NCCL_API_MAGIC 0xcafebeefu

typedef enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,
} ncclDataType_t;

typedef int ncclRedOp_t;
typedef void *cudaStream_t;

typedef struct {
    char internal[128];
} ncclUniqueId;

struct ncclComm {
    int device;
    int rank;
    int nranks;
    /* The stall of its hung collective (HWQUEUE_FAKE_NCCL_HANG), or NULL:
     * a deadline the fake driver reads (see "Stalls" in libcuda.c), 0 once
     * aborted. Never freed: events recorded behind it still point to it
     * after the communicator is gone (a few bytes per hang, in a test). */
    _Atomic long long *stall;
    /* Non-blocking (see the header): made with `blocking` 0, or split
     * from such a one. */
    int nonblocking;
    /* Polls of ncclCommGetAsyncError left before its pending call
     * settles; 0: none pending; -1: never (HWQUEUE_FAKE_NCCL_PENDING). */
    _Atomic int pending;
    /* The thread that started the pending call: NCCL 2.26+ finishes (joins)
     * the call in the ncclCommGetAsyncError that sees it done, so two
     * threads polling one communicator can finish it twice; the fake logs
     * a poll from another thread while a call is pending (see
     * ncclCommGetAsyncError). */
    pthread_t pending_thread;
    /* A pending split's new communicator, and where it goes once the
     * split settles. */
    struct ncclComm *child;
    struct ncclComm **child_out;
};

#define NCCL_SPLIT_NOCOLOR (-1)
typedef struct ncclComm *ncclComm_t;

static __thread int group_depth;
/* The communicator of the current group's last collective. */
static __thread struct ncclComm *group_comm;
static __thread const void *pending_send;
static __thread size_t pending_bytes;

/* The failure HWQUEUE_FAKE_NCCL_FAIL asks of `symbol`, or ncclSuccess. */
static ncclResult_t injected(const char *symbol) {
    const char *fail = getenv("HWQUEUE_FAKE_NCCL_FAIL");
    if (fail == NULL || strcmp(fail, symbol) != 0) {
        return ncclSuccess;
    }
    const char *code = getenv("HWQUEUE_FAKE_NCCL_RESULT");
    return code != NULL && *code != '\0' ? (ncclResult_t)atoi(code) : (ncclResult_t)3;
}

/* Logs `symbol` with its stream, the group depth and the count. */
static void log_op(const char *symbol, cudaStream_t stream, size_t count) {
    char line[160];
    snprintf(line, sizeof line, "%s stream=%p group=%d count=%zu", symbol, stream, group_depth, count);
    log_call(line);
}

static size_t element_bytes(ncclDataType_t type) {
    switch (type) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    }
    return 0;
}

/* Whether HWQUEUE_FAKE_NCCL_HANG names `symbol`. */
static int hangs(const char *symbol) {
    const char *hang = getenv("HWQUEUE_FAKE_NCCL_HANG");
    return hang != NULL && strcmp(hang, symbol) == 0;
}

/* Starts a non-blocking call on `comm` named `symbol`: it settles on
 * the second poll, or never where HWQUEUE_FAKE_NCCL_PENDING names it. */
static ncclResult_t start_pending(ncclComm_t comm, const char *symbol) {
    const char *never = getenv("HWQUEUE_FAKE_NCCL_PENDING");
    const char *polls = getenv("HWQUEUE_FAKE_NCCL_SETTLE_POLLS");
    int settle_after = polls != NULL && *polls != '\0' ? atoi(polls) : 2;
    comm->pending_thread = pthread_self();
    atomic_store(&comm->pending, never != NULL && strcmp(never, symbol) == 0 ? -1 : settle_after);
    return ncclInProgress;
}

/* Whether `comm` has a call that has not settled: NCCL refuses another
 * call on it then ("Attempt to use communicator before the previous
 * operation returned ncclSuccess"), as the fake does, with `symbol`'s
 * log line marked ` busy`. */
static int busy(ncclComm_t comm, const char *symbol) {
    if (comm == NULL || atomic_load(&comm->pending) == 0) {
        return 0;
    }
    char line[96];
    snprintf(line, sizeof line, "%s busy", symbol);
    log_call(line);
    return 1;
}

/* Ends `comm`'s pending call: a split's new communicator is written out. */
static void settle(ncclComm_t comm) {
    atomic_store(&comm->pending, 0);
    if (comm->child_out != NULL) {
        *comm->child_out = comm->child;
        comm->child_out = NULL;
        comm->child = NULL;
    }
}

/* Stalls `stream` behind `comm`'s hung collective, through the fake
 * driver's `hwqueue_fake_stall` (the driver is loaded: hwqueue enqueues
 * on its streams). */
static ncclResult_t stall(ncclComm_t comm, cudaStream_t stream) {
    void *driver = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
    void (*stall_stream)(cudaStream_t, _Atomic long long *) =
        driver == NULL ? NULL : (void (*)(cudaStream_t, _Atomic long long *))dlsym(driver, "hwqueue_fake_stall");
    if (stall_stream == NULL) {
        fprintf(stderr, "fake libnccl: no fake driver's hwqueue_fake_stall to hang a collective with\n");
        abort();
    }
    if (comm->stall == NULL) {
        comm->stall = malloc(sizeof *comm->stall);
        if (comm->stall == NULL) {
            return (ncclResult_t)2;
        }
        const char *limit = getenv("HWQUEUE_FAKE_NCCL_HANG_S");
        long long seconds = limit != NULL && *limit != '\0' ? atoll(limit) : 30;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        atomic_store(comm->stall, (now.tv_sec + seconds) * 1000000000LL + now.tv_nsec);
    }
    stall_stream(stream, comm->stall);
    dlclose(driver);
    return ncclSuccess;
}

/* One rank's collective: `count` elements from `send` to `recv`. */
static ncclResult_t copy_op(const char *symbol, const void *send, void *recv, size_t count, ncclDataType_t type,
                            ncclComm_t comm, cudaStream_t stream) {
    log_op(symbol, stream, count);
    ncclResult_t result = injected(symbol);
    if (result != ncclSuccess) {
        return result;
    }
    size_t bytes = element_bytes(type);
    if (comm == NULL || bytes == 0 || (count > 0 && (send == NULL || recv == NULL))) {
        return ncclInvalidArgument;
    }
    if (busy(comm, symbol)) {
        return ncclInvalidUsage;
    }
    group_comm = comm;
    if (hangs(symbol)) {
        return stall(comm, stream);
    }
    if (count > 0 && send != recv) {
        memmove(recv, send, count * bytes);
    }
    return ncclSuccess;
}

ncclResult_t ncclGetVersion(int *version) {
    log_call(__func__);
    const char *asked = getenv("HWQUEUE_FAKE_NCCL_VERSION");
    *version = asked != NULL && *asked != '\0' ? atoi(asked) : 22703;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    log_call(__func__);
    ncclResult_t result = injected(__func__);
    if (result == ncclSuccess) {
        memset(id, 0, sizeof *id);
        strcpy(id->internal, "fake-nccl-id");
    }
    return result;
}

static ncclResult_t new_comm(ncclComm_t *comm, int device) {
    struct ncclComm *made = calloc(1, sizeof *made);
    if (made == NULL) {
        return (ncclResult_t)2;
    }
    made->device = device;
    made->rank = 0;
    made->nranks = 1;
    *comm = made;
    return ncclSuccess;
}

/* The mode a creation asked for (1: blocking), as NCCL's environment
 * overrides it: NCCL_COMM_BLOCKING=0 or 1 sets every communicator's (its
 * splits' too, NCCL's copyCommConfig), whatever the config said. */
static int blocking_mode(int asked) {
    const char *env = getenv("NCCL_COMM_BLOCKING");
    if (env != NULL && (strcmp(env, "0") == 0 || strcmp(env, "1") == 0)) {
        return env[0] == '1';
    }
    return asked;
}

/* A creation's end: a communicator that is non-blocking (after
 * NCCL_COMM_BLOCKING) settles later. */
static ncclResult_t created(ncclComm_t comm, int asked_blocking, const char *symbol) {
    if (blocking_mode(asked_blocking)) {
        return ncclSuccess;
    }
    comm->nonblocking = 1;
    /* NCCL's thread may finish before the call's last look. */
    const char *settled = getenv("HWQUEUE_FAKE_NCCL_INIT_SETTLED");
    if (settled != NULL && *settled == '1') {
        return ncclSuccess;
    }
    return start_pending(comm, symbol);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    log_call(__func__);
    ncclResult_t result = injected(__func__);
    if (result != ncclSuccess) {
        return result;
    }
    if (ndev != 1) {
        return ncclInvalidUsage;
    }
    result = new_comm(&comms[0], devlist == NULL ? 0 : devlist[0]);
    return result != ncclSuccess ? result : created(comms[0], 1, __func__);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    log_call(__func__);
    ncclResult_t result = injected(__func__);
    if (result != ncclSuccess) {
        return result;
    }
    if (strcmp(id.internal, "fake-nccl-id") != 0) {
        return ncclInvalidArgument;
    }
    if (nranks != 1 || rank != 0) {
        return ncclInvalidUsage;
    }
    result = new_comm(comm, 0);
    /* NCCL's creates on the calling thread, outside a group: done when it
     * returns, whatever NCCL_COMM_BLOCKING made the communicator (which
     * its later calls follow). */
    if (result == ncclSuccess && !blocking_mode(1)) {
        (*comm)->nonblocking = 1;
    }
    return result;
}

/* As ncclCommInitRank; a config whose `blocking` is 0 makes a
 * non-blocking communicator, whose creation settles later. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *config) {
    const struct fake_config *asked = config;
    char line[128];
    if (asked != NULL) {
        snprintf(line, sizeof line, "%s blocking=%d version=%u size=%zu%s", __func__, asked->blocking, asked->version,
                 asked->size, asked->magic == NCCL_API_MAGIC ? "" : " magic=bad");
    } else {
        snprintf(line, sizeof line, "%s config=NULL", __func__);
    }
    log_call(line);
    ncclResult_t result = injected(__func__);
    if (result != ncclSuccess) {
        return result;
    }
    if (asked != NULL && asked->magic != NCCL_API_MAGIC) {
        return ncclInvalidArgument;
    }
    if (strcmp(id.internal, "fake-nccl-id") != 0) {
        return ncclInvalidArgument;
    }
    if (nranks != 1 || rank != 0) {
        return ncclInvalidUsage;
    }
    result = new_comm(comm, 0);
    return result != ncclSuccess ? result : created(*comm, asked == NULL || asked->blocking != 0, __func__);
}

/* HWQUEUE_FAKE_NCCL_IDLE_ERROR, or ncclSuccess. */
static ncclResult_t idle_error(void) {
    const char *code = getenv("HWQUEUE_FAKE_NCCL_IDLE_ERROR");
    return code != NULL && *code != '\0' ? (ncclResult_t)atoi(code) : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    log_call(__func__);
    /* NCCL's: ncclGroupStartInternal, then ncclCommEnsureReady's error
     * returned without ncclGroupEndInternal. */
    ncclResult_t held = idle_error();
    if (held == ncclSuccess) {
        /* An error raised after the caller's last look. */
        const char *raised = getenv("HWQUEUE_FAKE_NCCL_DESTROY_RAISES");
        held = raised != NULL && *raised != '\0' ? (ncclResult_t)atoi(raised) : ncclSuccess;
    }
    if (held != ncclSuccess) {
        group_depth++;
        log_call("ncclCommDestroy left its group open");
        return held;
    }
    free(comm);
    return ncclSuccess;
}

/* Ends the stall of its hung collective (NCCL's kernels exit), then
 * frees it. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    log_call(__func__);
    if (comm != NULL && comm->stall != NULL) {
        atomic_store(comm->stall, 0);
    }
    /* NCCL joins the call in flight first: a split's new communicator is
     * written out, to be aborted by its owner. */
    if (comm != NULL) {
        settle(comm);
    }
    free(comm);
    return ncclSuccess;
}

/* The split's only rank: this process is the one rank of the fake, so
 * the ranks giving `color` are this one. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, void *config) {
    char line[96];
    const struct fake_config *asked = config;
    snprintf(line, sizeof line, "%s color=%d key=%d%s", __func__, color, key,
             asked != NULL && asked->blocking == 0 ? " blocking=0" : "");
    log_call(line);
    ncclResult_t result = injected(__func__);
    if (result != ncclSuccess) {
        /* NCCL's init job failing: the new communicator is given out all
         * the same (ncclCommInitRankFunc's exit), linked to the parent. */
        const char *late = getenv("HWQUEUE_FAKE_NCCL_FAIL_LATE");
        if (late != NULL && *late == '1' && newcomm != NULL && comm != NULL && !comm->nonblocking) {
            new_comm(newcomm, comm->device);
        }
        return result;
    }
    if (comm == NULL || newcomm == NULL || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) {
        return ncclInvalidArgument;
    }
    if (busy(comm, __func__)) {
        return ncclInvalidUsage;
    }
    if (!comm->nonblocking) {
        if (color == NCCL_SPLIT_NOCOLOR) {
            *newcomm = NULL;
            return ncclSuccess;
        }
        return new_comm(newcomm, comm->device);
    }
    /* Non-blocking (the parent's mode): the result comes when it settles. */
    *newcomm = NULL;
    struct ncclComm *child = NULL;
    if (color != NCCL_SPLIT_NOCOLOR) {
        result = new_comm(&child, comm->device);
        if (result != ncclSuccess) {
            return result;
        }
        child->nonblocking = 1;
    }
    comm->child = child;
    comm->child_out = newcomm;
    /* NCCL's split swallows its group's ncclInProgress: the state says it. */
    start_pending(comm, __func__);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    log_call(__func__);
    if (comm == NULL || count == NULL) {
        return ncclInvalidArgument;
    }
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    log_call(__func__);
    if (comm == NULL || rank == NULL) {
        return ncclInvalidArgument;
    }
    *rank = comm->rank;
    return ncclSuccess;
}

/* Not logged: a watchdog polls it. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
    if (comm == NULL || async_error == NULL) {
        return ncclInvalidArgument;
    }
    /* One poll moves a pending call one step; the poll that takes it to
     * 0 settles it (alone: hwqueue polls from one thread at a time, and
     * the compare-and-swap keeps the fake sound even if it did not). */
    int pending = atomic_load(&comm->pending);
    if (pending != 0 && !pthread_equal(pthread_self(), comm->pending_thread)) {
        log_call("ncclCommGetAsyncError from another thread while a call is in progress");
    }
    while (pending > 0 && !atomic_compare_exchange_weak(&comm->pending, &pending, pending - 1)) {
    }
    if (pending == 1) {
        settle(comm);
    } else if (pending != 0) {
        *async_error = ncclInProgress;
        return ncclSuccess;
    }
    const char *code = getenv("HWQUEUE_FAKE_NCCL_ASYNC_ERROR");
    int stalled = comm->stall != NULL && atomic_load(comm->stall) != 0;
    *async_error = stalled && code != NULL && *code != '\0' ? (ncclResult_t)atoi(code) : ncclSuccess;
    if (*async_error == ncclSuccess) {
        *async_error = idle_error();
    }
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    log_call(__func__);
    ncclResult_t result = injected(__func__);
    if (result == ncclSuccess) {
        group_depth++;
    }
    return result;
}

/* HWQUEUE_FAKE_NCCL_BLOCK_HOST=NAME:N[,NAME:N...]: the Nth call of NAME
 * (the process's) blocks its thread for HWQUEUE_FAKE_NCCL_BLOCK_S seconds
 * (default 30), as a blocking communicator's ncclGroupEnd does while it
 * connects to a peer that never comes; logged `NAME blocks the host`,
 * then `NAME released`. */
static void block_host(const char *symbol) {
    static atomic_int seen;
    const char *spec = getenv("HWQUEUE_FAKE_NCCL_BLOCK_HOST");
    size_t len = strlen(symbol);
    if (spec == NULL) {
        return;
    }
    int call = atomic_fetch_add(&seen, 1) + 1;
    /* A comma-separated list of NAME:N. */
    int blocks = 0;
    for (const char *entry = spec; entry != NULL && *entry != '\0';) {
        if (strncmp(entry, symbol, len) == 0 && entry[len] == ':' && atoi(entry + len + 1) == call) {
            blocks = 1;
        }
        entry = strchr(entry, ',');
        entry = entry != NULL ? entry + 1 : NULL;
    }
    if (!blocks) {
        return;
    }
    char line[96];
    snprintf(line, sizeof line, "%s blocks the host", symbol);
    log_call(line);
    const char *limit = getenv("HWQUEUE_FAKE_NCCL_BLOCK_S");
    int seconds = limit != NULL && *limit != '\0' ? atoi(limit) : 30;
    const char *release = getenv("HWQUEUE_FAKE_NCCL_BLOCK_RELEASE");
    if (release != NULL && *release == '1' && calls_path != NULL) {
        char gate[4096];
        snprintf(gate, sizeof gate, "%s.release", calls_path);
        struct timespec step = {0, 10 * 1000 * 1000};
        for (int looks = 0; looks < seconds * 100 && access(gate, F_OK) != 0; looks++) {
            nanosleep(&step, NULL);
        }
    } else {
        sleep((unsigned)seconds);
    }
    snprintf(line, sizeof line, "%s released", symbol);
    log_call(line);
}

ncclResult_t ncclGroupEnd(void) {
    log_call(__func__);
    block_host(__func__);
    if (group_depth == 0) {
        return ncclInvalidUsage;
    }
    group_depth--;
    ncclResult_t result = injected(__func__);
    if (group_depth > 0) {
        return result;
    }
    struct ncclComm *comm = group_comm;
    group_comm = NULL;
    if (result != ncclSuccess) {
        return result;
    }
    /* A group of a non-blocking communicator's collectives settles later. */
    return comm != NULL && comm->nonblocking ? start_pending(comm, __func__) : ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    (void)op;
    return copy_op(__func__, send, recv, count, type, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
    return copy_op(__func__, send, recv, count, type, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    (void)op;
    return copy_op(__func__, send, recv, count, type, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    if (root != 0) {
        log_op(__func__, stream, count);
        return ncclInvalidArgument;
    }
    return copy_op(__func__, send, recv, count, type, comm, stream);
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    log_op(__func__, stream, count);
    ncclResult_t result = injected(__func__);
    if (result != ncclSuccess) {
        return result;
    }
    if (peer != 0 || comm == NULL || pending_send != NULL) {
        return ncclInvalidUsage;
    }
    group_comm = comm;
    pending_send = send;
    pending_bytes = count * element_bytes(type);
    return ncclSuccess;
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    log_op(__func__, stream, count);
    ncclResult_t result = injected(__func__);
    if (result != ncclSuccess) {
        return result;
    }
    size_t bytes = count * element_bytes(type);
    if (peer != 0 || comm == NULL || pending_send == NULL || bytes != pending_bytes) {
        return ncclInvalidUsage;
    }
    group_comm = comm;
    memmove(recv, pending_send, bytes);
    pending_send = NULL;
    return ncclSuccess;
}
