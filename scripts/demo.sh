#!/usr/bin/env bash
# The main demo from a fresh clone: installs what is missing, builds, and trains the
# 8x8 handwritten-digits classifier (1797 real samples shipped by Debian's python3-sklearn)
# with DDP on 2 ranks, launched by ringtrain's own launcher. It prints the test accuracy.
# Extra arguments go to the demo program (see `build/examples/digits_ddp --help`).
# The 2 ranks train on the CPU whatever GPUs the machine has (DDP on GPUs needs one
# process per selected GPU, and this demo starts 2): on a machine with 2 or more GPUs,
# `bash scripts/demo.sh --devices 2` trains on two of them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${BUILD_DIR:-build}
devices=(--devices cpu)
for arg in "$@"; do
  [[ $arg == --devices || $arg == --devices=* ]] && devices=()
done
exec "$build/comm/ringrun" --nproc-per-node 2 "$build/examples/digits_ddp" "${devices[@]}" "$@"
