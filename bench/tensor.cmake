# bench/tensor.cmake: CPU kernel benchmarks of the tensor library (bench/tensor_ops.cc).
#   build/bench/bench_tensor_ops           # full sizes, 5 repetitions, medians and ratio table
#   build/bench/bench_tensor_ops --smoke   # tiny sizes (the bench-smoke ctest below)
#   (--help: ours, then Google Benchmark's flags; --benchmark_repetitions, _min_time and
#   _min_warmup_time replace the program's per-benchmark settings when given)
# The ceilings are memcpy and Debian's OpenBLAS SGEMM pinned to one thread; without
# libopenblas-dev the program still builds and says the SGEMM ceiling is not measured.
find_path(RINGTRAIN_OPENBLAS_INCLUDE_DIR cblas.h
          PATH_SUFFIXES openblas-pthread openblas x86_64-linux-gnu/openblas-pthread
          PATHS /usr/include /usr/include/x86_64-linux-gnu NO_DEFAULT_PATH)
find_library(RINGTRAIN_OPENBLAS_LIBRARY NAMES openblas)
mark_as_advanced(RINGTRAIN_OPENBLAS_INCLUDE_DIR RINGTRAIN_OPENBLAS_LIBRARY)

add_executable(bench_tensor_ops ${CMAKE_CURRENT_LIST_DIR}/tensor_ops.cc)
target_link_libraries(bench_tensor_ops PRIVATE ringtrain::tensor benchmark::benchmark)
target_compile_options(bench_tensor_ops PRIVATE -Wall -Wextra -Wno-unused-parameter)
if(RINGTRAIN_OPENBLAS_INCLUDE_DIR AND RINGTRAIN_OPENBLAS_LIBRARY)
  target_include_directories(bench_tensor_ops PRIVATE ${RINGTRAIN_OPENBLAS_INCLUDE_DIR})
  target_link_libraries(bench_tensor_ops PRIVATE ${RINGTRAIN_OPENBLAS_LIBRARY})
  target_compile_definitions(bench_tensor_ops PRIVATE RINGTRAIN_HAVE_OPENBLAS=1)
else()
  message(STATUS "bench_tensor_ops: OpenBLAS not found (install libopenblas-dev); SGEMM ceiling off")
endif()

if(RINGTRAIN_BUILD_TESTS)
  # The top-level CMakeLists.txt calls enable_testing() after add_subdirectory(bench);
  # enabling it here too makes this directory's tests visible to ctest.
  enable_testing()
  add_test(NAME bench_tensor_ops_smoke COMMAND bench_tensor_ops --smoke)
  set_tests_properties(bench_tensor_ops_smoke PROPERTIES LABELS bench-smoke TIMEOUT 120)
  # A filter that matches nothing is an error, not a table of nan.
  ringtrain_bench_expect_error(bench.tensor_ops.filter_matches_nothing
                               EXPECT "bench_tensor_ops: no benchmark ran: --benchmark_filter='no_such_benchmark'"
                               FORBID "wrong elements"
                               COMMAND $<TARGET_FILE:bench_tensor_ops> --smoke --benchmark_filter=no_such_benchmark)
  # Google Benchmark's timing flags do what --help says: the per-benchmark settings used to
  # override them without a word (--benchmark_repetitions=2 ran 1 repetition). The
  # program's own flag is in --help, and a --benchmark_format our table cannot honour is
  # refused (it used to print the console table anyway).
  ringtrain_add_checked_test(bench.tensor_ops.repetitions_flag_honoured EXPECT "memcpy/iterations:2_median"
                             COMMAND $<TARGET_FILE:bench_tensor_ops> --smoke --benchmark_repetitions=2
                                     --benchmark_filter=^memcpy)
  ringtrain_add_checked_test(bench.tensor_ops.help_names_smoke EXPECT "--smoke +tiny sizes"
                             COMMAND $<TARGET_FILE:bench_tensor_ops> --help)
  set_tests_properties(bench.tensor_ops.repetitions_flag_honoured bench.tensor_ops.help_names_smoke
                       PROPERTIES LABELS bench-smoke TIMEOUT 120)
  ringtrain_bench_expect_error(bench.tensor_ops.format_json_refused
                               EXPECT "--benchmark_format=json: the console table is this program's own"
                               FORBID "wrong elements"
                               COMMAND $<TARGET_FILE:bench_tensor_ops> --smoke --benchmark_format=json)
endif()
