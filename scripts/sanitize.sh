#!/usr/bin/env bash
# Builds ringtrain with sanitizers in its own folder and runs the test suite there.
#
#   bash scripts/sanitize.sh address          # AddressSanitizer + UndefinedBehaviorSanitizer (+ leaks)
#   bash scripts/sanitize.sh thread           # ThreadSanitizer
#   bash scripts/sanitize.sh address -R comm  # extra arguments go to ctest
#
# CPU-only builds (RINGTRAIN_CUDA=OFF): the CUDA runtime does not run under these
# sanitizers here, and the GPU tests skip on a machine without a GPU anyway.
# Default labels: unit, mpi and bench-smoke (the slurm label starts a cluster and runs
# the same library code under srun; add `-L slurm` to include it). Any report fails the
# test that produced it: the programs stop at the first error (-fno-sanitize-recover, and
# halt_on_error below) with a non-zero exit code, and ctest shows the report.
#
#   BUILD_DIR=build-<kind>   where to build
#   JOBS=$(nproc)            parallel compile jobs
#   CTEST_JOBS=2             parallel tests
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
kind=${1:-address}
shift || true
case $kind in
  address) sanitize=address,undefined ;;
  thread) sanitize=thread ;;
  *) echo "usage: $0 address|thread [ctest arguments]" >&2; exit 2 ;;
esac
BUILD_DIR=${BUILD_DIR:-build-$kind}
JOBS=${JOBS:-$(nproc)}

SETUP_BUILD=0 bash scripts/setup.sh  # the packages only; this script builds its own folder
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRINGTRAIN_CUDA=OFF \
      -DRINGTRAIN_SANITIZE="$sanitize"
cmake --build "$BUILD_DIR" -j "$JOBS"

supp=$repo/scripts/sanitizers
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's own allocations are never freed before exit and its shared-memory transport
# races by design (it orders with its own barriers): those reports are suppressed by
# library name in scripts/sanitizers/*.supp; ours are not. Suppressions match any frame of a
# stack, and Open MPI has no frame pointers, so stacks are taken with the slow unwinder
# (fast_unwind_on_malloc=0): else an MPI_Init leak shows one frame, in an unnamed module.
export ASAN_OPTIONS=halt_on_error=1:fast_unwind_on_malloc=0:abort_on_error=0:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp
[[ $# -gt 0 ]] || set -- -L "unit|mpi|bench-smoke"
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900 -j "${CTEST_JOBS:-2}" "$@"
