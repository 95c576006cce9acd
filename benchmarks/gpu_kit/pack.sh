#!/usr/bin/env bash
# Prepare, on this machine, what a GPU session's device calls carry (benchmarks/gpu_kit/README.md):
#   .gpu_stage/1/   wheels the device image lacks + the peer harness + the first data chunk
#   .gpu_stage/K/   further data chunks, each small enough for one call (the tree travels too: 64 MiB a call)
# usage: benchmarks/gpu_kit/pack.sh [DATASET ...]     e.g. pack.sh cifar10   (none: the perf plan, no data)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
SHARED=${SHARED:-../shared}
CHUNK_MB=${CHUNK_MB:-50}
STAGE=.gpu_stage
mkdir -p .git/info
grep -qx "/$STAGE/" .git/info/exclude 2>/dev/null || echo "/$STAGE/" >> .git/info/exclude
[ -d "$STAGE" ] && chmod -R u+w "$STAGE"; rm -rf "$STAGE"
mkdir -p "$STAGE/1"
# Not in the device image (KINDS.md's package list): dp-accounting and what it needs that is missing, ml_collections.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$STAGE/1/whl" dp-accounting==0.6.0 ml_collections==1.1.0 dm-tree==0.1.10
cp -r "$SHARED/bench/peers" "$STAGE/1/peers" && chmod -R u+w "$STAGE/1/peers"
if [ "$#" -gt 0 ]; then
  for name in "$@"; do [ -d "$SHARED/data/$name" ] || { echo "pack.sh: no $SHARED/data/$name" >&2; exit 2; }; done
  tmp=$(mktemp -d)
  tar -C "$SHARED/data" -cf "$tmp/data.tar" "$@"     # the .npy.xz files are compressed already
  split -b "${CHUNK_MB}M" -d -a 2 "$tmp/data.tar" "$tmp/data.tar.part"
  k=1
  for part in "$tmp"/data.tar.part*; do
    mkdir -p "$STAGE/$k"; mv "$part" "$STAGE/$k/"; k=$((k + 1))
  done
  rm -rf "$tmp"
fi
tree_mb=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
for d in "$STAGE"/*/; do
  echo "$d: $(du -sm "$d" | cut -f1) MiB (+ $((tree_mb / 1048576)) MiB of tracked tree a call)"
done
calls=$(ls -d "$STAGE"/*/ | wc -l)
echo "device calls: stage 1..$((calls - 1)) then the plan with carry [\".gpu_stage/$calls\"]; see benchmarks/gpu_kit/README.md"
