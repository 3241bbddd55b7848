#!/usr/bin/env bash
# Installs the Debian packages ringtrain needs (only those missing), then configures
# and builds it in ./build. Safe to re-run. Used by scripts/demo.sh and scripts/test.sh.
#
#   BUILD_DIR=build       where to build
#   RINGTRAIN_CUDA=AUTO   AUTO builds the CUDA parts when nvcc (/usr/local/cuda/bin or PATH), cuDNN and NCCL are found
#   JOBS=$(nproc)         parallel compile jobs
#   SETUP_BUILD=0         install the packages only (scripts/sanitize.sh builds its own folder)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
RINGTRAIN_CUDA=${RINGTRAIN_CUDA:-AUTO}
JOBS=${JOBS:-$(nproc)}

packages=(
  build-essential cmake ninja-build pkg-config      # compilers and build tools
  libeigen3-dev libopenblas-dev                     # CPU kernels; OpenBLAS is the GEMM reference in bench/
  libopenmpi-dev openmpi-bin                        # the mpi backend, mpirun for multi-rank tests
  libgtest-dev libgmock-dev libbenchmark-dev        # tests and benchmarks
  libcli11-dev nlohmann-json3-dev zlib1g-dev        # command lines, JSON, gzip'd data sets
  python3-sklearn                                   # ships the 8x8 handwritten digits data set
  python3-torch                                     # the PyTorch side of the benchmarks and their smoke tests
  iproute2                                          # ip(8): the vanished-host test's network namespace
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

[ "${SETUP_BUILD:-1}" = 0 ] && exit 0
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGTRAIN_CUDA="$RINGTRAIN_CUDA"
cmake --build "$BUILD_DIR" -j "$JOBS"
