#!/usr/bin/env bash
# Instruction counts of the `dispatch` cases under callgrind: how many
# instructions one iteration (64 commands recorded, then the batch discarded)
# executes through the concrete type, a generic function, a trait object and
# the `AnyQueue` enum (`direct generic dyn enum`: 32 signal + memory_barrier
# pairs), and for 64 `exec`s on whole buffers (`exec`) against the same
# `exec`s through `exec_views` on whole-buffer views made once (`views`);
# `exec_swapped` and `views_swapped` swap the two arguments every `exec`, so
# none shares the last one's stored arguments.
# Instruction counts do not depend on what else the machine is doing.
#
#   bash benches/callgrind.sh        # needs valgrind; uses $CARGO_TARGET_DIR
#
# Built with the `cuda` feature by default (FEATURES=cuda), so that the
# `AnyQueue` enum has two variants, as in a real heterogeneous build; it
# records on CPU queues either way. FEATURES= builds without it.
#
# Each case runs the dispatch bench binary without criterion
# (HWQUEUE_DISPATCH_COUNT=CASE, HWQUEUE_DISPATCH_ITERS=N), collecting only
# inside its timed loop (`dispatch::repeat`), for LOW and HIGH iterations;
# (HIGH count - LOW count) / (HIGH - LOW) is the count per iteration, free
# of one-time costs (the batch's vectors growing on the first iteration).
# It also prints the addresses of `record_direct` and `record_generic`:
# when they are equal, the compiler emitted one body for both.
set -euo pipefail
cd "$(dirname "$0")/.."

LOW=${LOW:-1000}
HIGH=${HIGH:-11000}
CASES=${CASES:-direct generic dyn enum exec views exec_swapped views_swapped}

FEATURES=${FEATURES-cuda}
exe=$(cargo bench --bench dispatch --no-run --features "$FEATURES" --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "dispatch" and m.get("executable"):
        print(m["executable"])')
echo "binary: $exe (features: ${FEATURES:-none})"
nm -C "$exe" | grep -E ' dispatch::record_(direct|generic|dyn)' || true
echo

count() { # CASE ITERS -> instructions collected inside the loop
    HWQUEUE_DISPATCH_COUNT=$1 HWQUEUE_DISPATCH_ITERS=$2 \
        valgrind --tool=callgrind --toggle-collect='dispatch::repeat*' \
        --callgrind-out-file=/dev/null "$exe" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

printf '| case | Ir, %s iterations | Ir, %s iterations | Ir per iteration |\n' "$LOW" "$HIGH"
printf '|---|---:|---:|---:|\n'
for case in $CASES; do
    low=$(count "$case" "$LOW")
    high=$(count "$case" "$HIGH")
    per=$(python3 -c "print(f'{($high - $low) / ($HIGH - $LOW):.1f}')")
    printf '| %s | %s | %s | %s |\n' "$case" "$low" "$high" "$per"
done
