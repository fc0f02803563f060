#!/usr/bin/env bash
# Instruction counts of the `dispatch` cases under callgrind: how many
# instructions one iteration (64 commands recorded, then the batch discarded)
# executes through the concrete type, a generic function, a trait object and
# the `AnyQueue` enum (`direct generic dyn enum`: 32 signal + memory_barrier
# pairs), and for 64 `exec`s on whole buffers (`exec`) against the same
# `exec`s through `exec_views` on whole-buffer views made once (`views`);
# `exec_swapped` and `views_swapped` swap the two arguments every `exec`, so
# none shares the last one's stored arguments; `vulkan_direct` and
# `vulkan_enum` are the signal + memory_barrier pairs on a Vulkan queue.
# Instruction counts do not depend on what else the machine is doing.
#
#   bash benches/callgrind.sh        # needs valgrind; uses $CARGO_TARGET_DIR
#   BENCH=memory bash benches/callgrind.sh
#
# BENCH=memory counts the `alloc_free_small` cases of the memory bench
# instead (one iteration is 10,000 cycles of allocate, touch, free over
# sizes of 64 B-4 KiB; LOW=2 HIGH=12 by default): `pooled_uninit`,
# `pooled_zeroed` against glibc's `malloc` (`system_uninit`) and the
# pre-pool path (`device_alloc`), divided by 10,000 for a cycle.
#
# Built with the `cuda` feature by default (FEATURES=cuda), so that the
# `AnyQueue` enum has three variants (Cpu, Cuda and the default Vulkan), as
# in a real heterogeneous build; the first cases record on CPU queues,
# `vulkan_direct` and `vulkan_enum` on a Vulkan queue (lavapipe here; left
# out without a Vulkan driver). FEATURES= builds without CUDA.
#
# BENCH=cuda counts the CUDA bench's cases on the fake driver
# (tests/fake_cuda/libcuda.c, compiled here with cc; no GPU needed):
# `plan_replay` and `plan_plain`, one `Plan::run` + wait of a 64-kernel
# chain with replay on and off (LOW=10 HIGH=110 runs by default), then the
# line `callgrind: plan_replay replay=<Ir> plain=<Ir> ratio=<r>` (issue
# 45's proxy target: ratio <= 0.05); `exec_hwqueue` and `exec_cudarc`,
# 1,000 `exec`s of an empty kernel and a `submit` against 1,000 cudarc
# launches (event tracking off), printed per launch as `callgrind:
# cuda_exec hwqueue=<Ir> cudarc=<Ir> ratio=<r>` (issue 47: <= 1.10); and
# `signal_hwqueue` and `signal_cudarc`, `signal` + `submit` polled until
# reached against one `cuEventRecord` through cudarc polled until complete
# (`callgrind: cuda_signal ...`, issue 47: <= 1.5). The counts include the
# fake driver's own work, which stands in for the real driver's.
#
# BENCH=nccl (built with FEATURES=nccl) counts benches/nccl.rs's cases on
# the fake driver and the fake NCCL (tests/fake_cuda/libnccl.c): one 1 KiB
# all-reduce issued through a CUDA queue over a blocking communicator
# (`all_reduce_hwqueue`), over a non-blocking one
# (`all_reduce_hwqueue_nonblocking`), and through cudarc's `Comm`
# (`all_reduce_cudarc`), on the calling thread; printed as `callgrind:
# nccl_all_reduce hwqueue=<Ir> cudarc=<Ir> ratio=<r>`. The fake NCCL does
# next to nothing where the real one launches a kernel, so the difference
# (hwqueue's own host work per collective) is the figure to read, not the
# ratio.
#
# Each case runs the dispatch bench binary without criterion
# (HWQUEUE_DISPATCH_COUNT=CASE, HWQUEUE_DISPATCH_ITERS=N), collecting only
# inside its timed loop (`support::repeat`), for LOW and HIGH iterations;
# (HIGH count - LOW count) / (HIGH - LOW) is the count per iteration, free
# of one-time costs (the batch's vectors growing on the first iteration).
# It also prints the addresses of `record_direct` and `record_generic`:
# when they are equal, the compiler emitted one body for both.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH=${BENCH:-dispatch}
if [ "$BENCH" = cuda ] || [ "$BENCH" = nccl ]; then
    LOW=${LOW:-10}
    HIGH=${HIGH:-110}
    if [ "$BENCH" = cuda ]; then
        CASES=${CASES:-plan_replay plan_plain exec_hwqueue exec_cudarc signal_hwqueue signal_cudarc}
    else
        CASES=${CASES:-all_reduce_hwqueue all_reduce_hwqueue_nonblocking all_reduce_cudarc}
    fi
    PER=1
    fake=$(mktemp -d)
    cc -shared -fPIC -O2 -o "$fake/libcuda.so" tests/fake_cuda/libcuda.c
    cp "$fake/libcuda.so" "$fake/libcuda.so.1"
    # The fake NCCL (BENCH=nccl), under the name cudarc opens.
    cc -shared -fPIC -O2 -o "$fake/libnccl.so" tests/fake_cuda/libnccl.c
    export LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export HWQUEUE_FAKE_DEVICE_COUNT=1 HWQUEUE_FAKE_DRIVER_VERSION=12020 HWQUEUE_FAKE_MAX_PTX_ISA=82
    unset HWQUEUE_FAKE_LAUNCHES HWQUEUE_FAKE_CALLS HWQUEUE_FAKE_NCCL_FAIL HWQUEUE_FAKE_NCCL_HANG \
        HWQUEUE_FAKE_NCCL_PENDING HWQUEUE_FAKE_NCCL_ASYNC_ERROR
elif [ "$BENCH" = memory ]; then
    LOW=${LOW:-2}
    HIGH=${HIGH:-12}
    CASES=${CASES:-pooled_uninit pooled_zeroed system_uninit device_alloc}
    PER=10000 # cycles an iteration
else
    LOW=${LOW:-1000}
    HIGH=${HIGH:-11000}
    CASES=${CASES:-direct generic dyn enum exec views exec_swapped views_swapped vulkan_direct vulkan_enum}
    PER=1
fi
VAR=HWQUEUE_$(echo "$BENCH" | tr '[:lower:]' '[:upper:]')

if [ "$BENCH" = nccl ]; then
    FEATURES=${FEATURES-nccl}
else
    FEATURES=${FEATURES-cuda}
fi
exe=$(cargo bench --bench "$BENCH" --no-run --features "$FEATURES" --message-format=json 2>/dev/null |
    BENCH=$BENCH python3 -c 'import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == os.environ["BENCH"] and m.get("executable"):
        print(m["executable"])')
echo "binary: $exe (features: ${FEATURES:-none})"
if [ "$BENCH" = dispatch ]; then
    nm -C "$exe" | grep -E ' dispatch::record_(direct|generic|dyn)' || true
fi
echo

count() { # CASE ITERS -> instructions collected inside the loop
    env "${VAR}_COUNT=$1" "${VAR}_ITERS=$2" \
        valgrind --tool=callgrind --toggle-collect="$BENCH::support::repeat*" \
        --callgrind-out-file=/dev/null "$exe" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

printf '| case | Ir, %s iterations | Ir, %s iterations | Ir per iteration |\n' "$LOW" "$HIGH"
printf '|---|---:|---:|---:|\n'
declare -A per_case
for case in $CASES; do
    low=$(count "$case" "$LOW")
    high=$(count "$case" "$HIGH")
    per=$(python3 -c "print(f'{($high - $low) / ($HIGH - $LOW) / $PER:.1f}')")
    per_case[$case]=$per
    printf '| %s | %s | %s | %s |\n' "$case" "$low" "$high" "$per"
done
# line NAME A-CASE B-CASE A-LABEL B-LABEL DIVISOR: `callgrind: NAME A=.. B=.. ratio=A/B`
line() {
    local a=${per_case[$2]:-} b=${per_case[$3]:-}
    [ -n "$a" ] && [ -n "$b" ] || return 0
    python3 -c "a, b = $a / $6, $b / $6
print(f'callgrind: $1 $4={a:.0f} $5={b:.0f} ratio={a / b:.3f}')"
}
if [ "$BENCH" = cuda ]; then
    echo
    line plan_replay plan_replay plan_plain replay plain 1
    line cuda_exec exec_hwqueue exec_cudarc hwqueue cudarc 1000
    line cuda_signal signal_hwqueue signal_cudarc hwqueue cudarc 1
fi
if [ "$BENCH" = nccl ]; then
    echo
    line nccl_all_reduce all_reduce_hwqueue all_reduce_cudarc hwqueue cudarc 1
    line nccl_all_reduce_nonblocking all_reduce_hwqueue_nonblocking all_reduce_cudarc hwqueue cudarc 1
fi
