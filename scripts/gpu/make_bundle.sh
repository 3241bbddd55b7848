#!/usr/bin/env bash
# Packs what a GPU machine needs to run ringtrain's CUDA tests and GPU benchmarks when
# that machine has the CUDA driver and libraries but none of our build dependencies
# (Eigen, Open MPI, CLI11, GoogleTest...): the test lists and executables of the build tree, as one
# xz archive (the CUDA fat binaries in every executable are nearly identical, so the
# 25 MB executables pack into about 17 MB), the Open MPI shared libraries the
# executables load, our libcudart, and the digits dataset the demo trains on.
#
#   bash scripts/gpu/make_bundle.sh [build-dir]      -> .gpu/ (ignored by git)
#   then, on the GPU machine, from the repository root:  bash scripts/gpu/validate.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
out=.gpu
rm -rf "$out" && mkdir -p "$out/lib"
# The build tree's test lists (CTestTestfile.cmake and the GoogleTest lists) and the
# executables the GPU checks run. Test scripts and CTestTestfile.cmake name absolute
# paths under $PWD; validate.sh links that path to wherever the repository lands.
# GoogleTest lists are discovered when ctest first reads them after a build
# (DISCOVERY_MODE PRE_TEST) with this machine's CMake modules: do that here, so the
# lists that travel are newer than their executables and the GPU machine reuses them.
ctest --test-dir "$build" -N > /dev/null
# Every executable a `cuda`-labelled test runs (from CTest's own list, so a new CUDA test
# binary travels without being named here; one left behind would turn into a label-less
# *_NOT_BUILT test on the GPU machine and never run), and what the benchmarks and the demo run.
mapfile -t cuda_test_executables < <(ctest --test-dir "$build" -L cuda --show-only=json-v1 | python3 -c '
import json, os, sys
build = os.path.abspath(sys.argv[1]) + "/"
found = set()
for test in json.load(sys.stdin)["tests"]:
    for arg in test.get("command") or []:
        if arg.startswith(build) and os.path.isfile(arg) and os.access(arg, os.X_OK):
            found.add(arg[len(build):])
print("\n".join(sorted(found)))' "$build")
(( ${#cuda_test_executables[@]} > 0 )) || { echo "no executables found for the cuda label in $build" >&2; exit 1; }
executables=("${cuda_test_executables[@]}" comm/ringrun bench/ddp_step bench/comm_sweep
             bench/bench_tensor_cuda examples/digits_ddp)
{
  find "$build" -path '*/consumer-work' -prune -o \( -name CTestTestfile.cmake -o -name '*_include.cmake' \
       -o -name '*_tests.cmake' \) -print
  for exe in "${executables[@]}"; do echo "$build/$exe"; done | sort -u
} > "$out/files"
tar -cf - -T "$out/files" | xz -6 -T1 > "$out/build.tar.xz"
echo "$PWD" > "$out/source_dir"
echo "$build" > "$out/build_dir"
# Shared libraries that a CUDA image usually lacks: Google Benchmark, Open MPI and its
# helpers (every comm executable links libmpi, even when it never calls MPI_Init) and
# the CUDA runtime this build was linked against. cuBLAS, cuDNN and NCCL are too large to
# carry; validate.sh finds the GPU machine's own.
for exe in "$build/tests/comm/comm_collectives_test" "$build/examples/digits_ddp" "$build/bench/bench_tensor_cuda"; do
  ldd "$exe" | awk '/=> \// {print $3}' | grep -E 'libmpi|libopen-|libhwloc|libevent|libudev|libz\.|libcudart|libbenchmark' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$out/lib/"; done
cp /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz "$out/"  # python3-sklearn
# The latency probe (scripts/gpu/latency_probe.cu), for validate.sh's probe step.
/usr/local/cuda/bin/nvcc -O2 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
    -o "$out/latency_probe" scripts/gpu/latency_probe.cu
git rev-parse --short HEAD > "$out/commit"
du -sh "$out"; ls -la "$out" "$out/lib"
