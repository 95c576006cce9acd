#!/usr/bin/env bash
# Run on the device machine, from the repository root (benchmarks/gpu_kit/README.md).
#   on_device.sh stage K            keep the carried .gpu_stage/K on the (warm) machine
#   on_device.sh PLAN SECONDS       install, assemble the data, run PLAN within SECONDS; results under $OUT
# PLAN: perf (issue 20: the compiled program's cohort-sized copies, streamed / deferred cohorts of 10^4, % of peak),
#       vgg_t6 (issue 17: Table 6's VGG16 compression-only row to 300 rounds, alone, resumable),
#       vgg_t4 (issue 17: a Table 4 cell, CUAG-PFL paper mode, mu $KIT_MU (0.1), VGG16, CIFAR-100 ACID3, resumable),
#       side_by_side (issue 92 item 7: workload W's CNN at C = 100 / 1,000 / 10,000, fedjax_dp against
#         torch on CUDA, each case in its own process with its device peak memory, all within SECONDS),
#       dry (a one-round CPU-sized run of the vgg_t6 command with cnn_pfl, to test the kit anywhere).
set -uo pipefail
KEEP=${KIT_KEEP:-/tmp/fedjax_stage}   # survives between calls while the machine stays warm
RUNS=${KIT_RUNS:-/tmp/fedjax_runs}
OUT=${OUT:-$PWD/benchmarks/out/gpu_kit}
mkdir -p "$KEEP" "$RUNS" "$OUT"
export PYTHONUNBUFFERED=1

stage() { cp -r ".gpu_stage/$1/." "$KEEP/" && echo "staged .gpu_stage/$1: $(du -sm "$KEEP" | cut -f1) MiB kept"; }

setup() {
  if [ -z "${KIT_NO_WHEELS:-}" ] && [ -d "$KEEP/whl" ] && [ ! -d /tmp/site/dp_accounting ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$KEEP"/whl/*.whl || exit 1
  fi
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  if ls "$KEEP"/data.tar.part* > /dev/null 2>&1 && [ ! -e "$KEEP/data/.done" ]; then
    mkdir -p "$KEEP/data" && cat "$KEEP"/data.tar.part* | tar -x -C "$KEEP/data" && touch "$KEEP/data/.done" || exit 1
  fi
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
}

# seed004_tables.py with a time limit; a second call on the warm machine continues it (--resume).
tables() {
  local name=$1 seconds=$2; shift 2
  local resume=; [ -d "$RUNS/$name" ] && resume=--resume
  timeout --signal=TERM $((seconds - 25)) python3 experiments/seed004_tables.py "$@" --out "$RUNS/$name" $resume
  echo "tables rc=$?"
  local n=0
  for f in "$RUNS/$name"/rows.json "$RUNS/$name"/table.md "$RUNS/$name"/*/metrics.jsonl "$RUNS/$name"/*/summary.json; do
    [ -f "$f" ] || continue
    n=$((n + 1)); cp "$f" "$OUT/$name.$n.$(basename "$f")"
  done
}

plan=${1:?usage: on_device.sh stage K | on_device.sh PLAN SECONDS}
case "$plan" in
  stage) stage "${2:?part}" ;;
  perf)
    setup
    seconds=${2:?seconds}
    timeout $((seconds / 3)) python3 benchmarks/program_hlo.py cnn:1000:auto cnn:10000:auto --out "$OUT/hlo" \
      > "$OUT/hlo.log" 2>&1 &
    timeout $((seconds - 20)) python3 benchmarks/gpu_side_by_side.py --peers "$KEEP/peers" --timeout 100 --rounds 3 \
      --out "$OUT/gpu.json" --only jax:cnn:1000:auto jax:cnn:10000:auto@1000 jax:cnn:10000:auto \
      torch:cnn:1000:vmap:256 torch:cnn:10000:vmap:256 jax:cnn:1000:chunked:256:1:xla:bf16
    wait; tail -n 40 "$OUT/hlo.log" ;;
  side_by_side)
    setup
    seconds=${2:?seconds}
    # smallest cohorts first: a run cut short keeps what it measured (gpu.jsonl, a row a case)
    cases=${KIT_CASES:-"jax:cnn:100:auto torch:cnn:100:vmap:100 torch:cnn:100:loop jax:cnn:1000:auto
      torch:cnn:1000:vmap:256 jax:cnn:10000:auto torch:cnn:10000:vmap:256"}
    # shellcheck disable=SC2086
    python3 benchmarks/gpu_side_by_side.py --peers "$KEEP/peers" --rounds 3 --timeout 150 \
      --budget $((seconds - 15)) --peak-size "${KIT_PEAK_SIZE:-8192}" --out "$OUT/gpu.json" --only $cases ;;
  vgg_t6)
    setup
    tables vgg_t6 "${2:?seconds}" --table 6 --rounds 300 --eval-every 50 --checkpoint-every 25 \
      --only "dynamic [0.2, 0.5]" --data-dir "$KEEP/data/cifar10" \
      --set model.name=vgg16 engine.unroll=1 client.learning_rate=0.01 cuag.mode=none ;;
  vgg_t4)
    setup
    mu=${KIT_MU:-0.1}   # Table 4: the six mu of Table 3 with VGG16; one cell a call
    tables "vgg_t4_mu$mu" "${2:?seconds}" --table 3 --source cifar100 --mus "$mu" --only "paper mode, mu $mu" \
      --rounds 300 --eval-every 50 --checkpoint-every 25 --data-dir "$KEEP/data/cifar100" \
      --set model.name=vgg16 engine.unroll=1 client.learning_rate=0.01 ;;
  dry)
    setup
    tables dry "${2:-300}" --table 6 --rounds 1 --eval-every 1 --only "dynamic [0.2, 0.5]" \
      --data-dir "$KEEP/data/cifar10" --set cuag.mode=none ;;
  *) echo "on_device.sh: unknown plan $plan" >&2; exit 2 ;;
esac
