#!/usr/bin/env bash
# The main demo from a fresh clone: installs what is missing, builds, and trains the
# 8x8 handwritten-digits classifier (1797 real samples shipped by Debian's python3-sklearn).
# Extra arguments go to the demo program (see `build/examples/digits_train --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${BUILD_DIR:-build}/examples/digits_train" "$@"
