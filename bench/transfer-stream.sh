#!/bin/bash
# transfer-stream.sh: a prefill streamed layer by layer to a decode process, against the prefill's own time.
#
# What: kvhal-xfer --stream with the llama3-8b geometry (32 layers, 8 KV heads x 128, bf16, 16-token pages: 2 MiB a
#   page, 16 MiB a layer, 512 MiB a 4096-token request, scattered on both sides). The prefill process opens a stream
#   into the decode side's grant (kvhal_xfer_stream_open) and hands it each layer as its simulated compute ends
#   (kvhal_xfer_stream_layer): on a GPU (MODE=device) a spin kernel of LAYER_US per layer on the prefill device's
#   default stream (the module's kvhal_gpu_spin, calibrated; compute, no memory traffic), with an event per layer (the
#   agent sends a layer once its event fires, while the next one computes); on the CPU (MODE=busy) a thread that spins LAYER_US per layer and progresses the agent
#   meanwhile, (MODE=sleep) one that sleeps through each layer (nothing progresses meanwhile). Exposed = the stream's
#   completion (every layer acknowledged by the decode side) minus the end of the last layer's compute, measured by
#   the prefill process; prefill = the first layer's start to the last layer's end. ITERS timed requests per run
#   (after 2 warm-up ones; a last one's bytes verified by the decode side), ROUNDS runs per LAYER_US, interleaved.
#   Target (issue): exposed <= 10% of the prefill time on 2 GPUs (IPC path).
# Machine: GPU: two NVIDIA GPUs with peer access in one host, CUDA toolkit, UCX (libucx-dev): SEND=cuda:0
#   RECV=cuda:1 IPC=1 MODE=device (the defaults). Host: SEND=cpu RECV=cpu IPC=0 MODE=busy TRANSPORT="tcp shm".
# Run (repository root): bash bench/transfer-stream.sh
#   B=build dir (default build-bench-xfer), ROUNDS=7, ITERS=10, LAYER_US="1000 3000", TOKENS=4096, OUT=/tmp/kvhal-stream
#   BACKENDS (meson -Dbackends, default cpu,cuda; cpu for the host run).
# Output: $OUT/r/<transport>-<layer_us>-<round>.json (kvhal-xfer --json), $OUT/machine.txt, and $OUT/summary.txt:
#   "<transport> <mode> <layer_us> us/layer prefill <ms> ms exposed <ms> ms (<pct>% of prefill) first layer <ms> ms
#    path <path> rounds <n>" (medians over the rounds of each run's medians).
set -uo pipefail
[ -f .devdeps/env.sh ] && . .devdeps/env.sh   # a GPU machine's toolchain outside the system paths, if carried
B=${B:-build-bench-xfer} ROUNDS=${ROUNDS:-7} ITERS=${ITERS:-10} LAYER_US=${LAYER_US:-1000 3000} TOKENS=${TOKENS:-4096}
OUT=${OUT:-/tmp/kvhal-stream} SEND=${SEND:-cuda:0} RECV=${RECV:-cuda:1} IPC=${IPC:-1} MODE=${MODE:-device}
TRANSPORT=${TRANSPORT:-shm} BACKENDS=${BACKENDS:-cpu,cuda}
mkdir -p "$OUT/r"
if [ ! -f "$B/build.ninja" ]; then
  meson setup "$B" -Dbackends="$BACKENDS" -Dtransfer=ucx -Dbuildtype=release -Dpython=disabled > "$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C "$B" tools/kvhal-xfer >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends
{ nvidia-smi -L; nvidia-smi topo -m; lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$OUT/machine.txt" 2>&1
ipc=; [ "$IPC" = 1 ] && ipc=--ipc
rc=0
for r in $(seq 1 "$ROUNDS"); do
  us_list=$LAYER_US; [ $((r % 2)) = 0 ] && us_list=$(echo "$LAYER_US" | tr ' ' '\n' | tac | tr '\n' ' ')
  for us in $us_list; do
    for t in $TRANSPORT; do
      timeout 600 "$B"/tools/kvhal-xfer --stream $ipc --prefill="$MODE" --layer-us="$us" --tokens="$TOKENS" \
        --layers=32 --heads=8 --dim=128 --block=16 --iters="$ITERS" --send-device="$SEND" --recv-device="$RECV" \
        --transport="$t" --json > "$OUT/r/$t-$us-$r.json" 2> "$OUT/r/$t-$us-$r.err" ||
        { echo "$t $us us round $r failed: $(tail -2 "$OUT/r/$t-$us-$r.err")"; rc=1; }
    done
  done
done
python3 - "$OUT/r" <<'PY' | tee "$OUT/summary.txt"
import collections, glob, json, statistics, sys
runs = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + "/*.json"):
    try:
        js = json.load(open(f))
    except ValueError:
        continue
    for e in js.get("results", []):
        runs[(e["transport"], e["prefill"], e["layer_us"], e["path"])].append(e)
for k in sorted(runs):
    es = runs[k]
    pre = statistics.median(e["prefill_ms_p50"] for e in es)
    exp = statistics.median(e["exposed_ms_p50"] for e in es)
    first = statistics.median(e["first_layer_ms_p50"] for e in es)
    print(f"{k[0]} {k[1]} {k[2]} us/layer prefill {pre:.2f} ms exposed {exp:.3f} ms ({100 * exp / pre:.1f}% of "
          f"prefill) first layer {first:.2f} ms path {k[3]} rounds {len(es)}")
PY
exit $rc
