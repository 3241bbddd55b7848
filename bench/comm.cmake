# Collective benchmarks (comm/). Included by bench/CMakeLists.txt.
add_executable(comm_sweep ${CMAKE_CURRENT_LIST_DIR}/comm_sweep.cc)
target_link_libraries(comm_sweep PRIVATE ringtrain::comm CLI11::CLI11)
target_compile_options(comm_sweep PRIVATE -Wall -Wextra)

# The two-core probe: the roof of the shared-memory transport (see the file's essay).
add_executable(core_to_core ${CMAKE_CURRENT_LIST_DIR}/core_to_core.cc)
target_link_libraries(core_to_core PRIVATE ringtrain::comm CLI11::CLI11 Threads::Threads)
target_compile_options(core_to_core PRIVATE -Wall -Wextra)

# Their smoke runs are registered in tests/comm/CMakeLists.txt; their bad-input tests here.
if(RINGTRAIN_BUILD_TESTS)
  set(bench_no_dir ${CMAKE_CURRENT_BINARY_DIR}/no-such-dir)
  # Counts out of range are CLI11 errors naming the option (they used to crash on empty medians).
  ringtrain_bench_expect_error(bench.comm_sweep.zero_iters EXPECT "--iters: Value 0 not in range 1 to"
                               COMMAND $<TARGET_FILE:comm_sweep> --max-bytes 64 --iters 0)
  ringtrain_bench_expect_error(bench.comm_sweep.negative_warmup EXPECT "--warmup: Value -3 not in range 0 to"
                               COMMAND $<TARGET_FILE:comm_sweep> --max-bytes 64 --warmup -3)
  # Configuration and environment errors are messages, not std::terminate.
  ringtrain_bench_expect_error(bench.comm_sweep.unknown_backend EXPECT "--backend: foo not in"
                               COMMAND $<TARGET_FILE:comm_sweep> --backend foo)
  ringtrain_bench_expect_error(bench.comm_sweep.bad_master_port
                               EXPECT "comm_sweep: environment variable MASTER_PORT='abc' is not an integer"
                               ENVIRONMENT MASTER_ADDR=127.0.0.1 MASTER_PORT=abc WORLD_SIZE=1 RANK=0
                               COMMAND $<TARGET_FILE:comm_sweep> --max-bytes 64)
  # Sizes: one strict parser (bench/bench_cli.h); no more "1.5K" = 1024 or "-1" = 2^64 - 1.
  foreach(size abc 1.5K -1)
    ringtrain_bench_expect_error(bench.comm_sweep.size_${size}
                                 EXPECT "--max-bytes: '${size}' is not a byte count. expected digits with an optional K, M or G"
                                 COMMAND $<TARGET_FILE:comm_sweep> --max-bytes ${size})
  endforeach()
  ringtrain_bench_expect_error(bench.comm_sweep.size_above_4G EXPECT "--max-bytes: '8G' is not in \\[4 - 4G\\]"
                               COMMAND $<TARGET_FILE:comm_sweep> --max-bytes 8G)
  # An unwritable --json stops the run before the sweep, not silently after it.
  ringtrain_bench_expect_error(bench.comm_sweep.json_unwritable
                               EXPECT "comm_sweep: cannot write --json ${bench_no_dir}/x.json: No such file or directory"
                               FORBID "total #wrong"
                               COMMAND $<TARGET_FILE:comm_sweep> --max-bytes 64 --json ${bench_no_dir}/x.json)

  # core_to_core: sizes through the same parser ("4k" was 4 bytes, "1G" 1 byte), the ring
  # bounded as the transport bounds it, and a ring too large for memory an error, not a SIGSEGV.
  ringtrain_add_checked_test(bench.core_to_core.lower_case_unit EXPECT "message 4096 B through"
                             COMMAND $<TARGET_FILE:core_to_core> --message 4k --reps 2)
  set_tests_properties(bench.core_to_core.lower_case_unit PROPERTIES LABELS bench-smoke TIMEOUT 60)
  # Every timed result checked: the messages, and the 64 MiB copy too (it went unread).
  ringtrain_add_checked_test(bench.core_to_core.memcpy_checked
                             EXPECT "messages wrong 0 [|] memcpy 64 MiB on CPU [0-9]+ [0-9.]+ GB/s, copy wrong 0 [|] #wrong 0"
                             COMMAND $<TARGET_FILE:core_to_core> --message 64K --reps 2)
  set_tests_properties(bench.core_to_core.memcpy_checked PROPERTIES LABELS bench-smoke TIMEOUT 60)
  ringtrain_bench_expect_error(bench.core_to_core.size_abc EXPECT "--message: 'abc' is not a byte count"
                               COMMAND $<TARGET_FILE:core_to_core> --message abc)
  ringtrain_bench_expect_error(bench.core_to_core.slot_bytes_wrap
                               EXPECT "--slot-bytes: '18446744073709551552' is not in \\[64 - 1G\\]"
                               COMMAND $<TARGET_FILE:core_to_core> --slot-bytes 18446744073709551552)
  ringtrain_bench_expect_error(bench.core_to_core.slot_bytes_not_multiple_of_64
                               EXPECT "--slot-bytes: 100 bytes is not a multiple of 64"
                               COMMAND $<TARGET_FILE:core_to_core> --slot-bytes 100)
  # The CPUs it may run on are the affinity mask's, not the CPUs online: in a container
  # limited to one CPU of two (a cgroup cpuset) it used to die in std::terminate ("cannot
  # pin a thread to CPU 1", SIGABRT). taskset narrows the mask the same way; one CPU in
  # it is a skip (exit 77), said as such.
  find_program(RINGTRAIN_TASKSET taskset)
  if(RINGTRAIN_TASKSET)
    ringtrain_bench_expect_error(bench.core_to_core.one_cpu_in_affinity_mask_skips
                                 EXPECT "SKIP: core_to_core needs two CPUs this process may run on. its affinity mask is [{]0[}]"
                                 COMMAND ${RINGTRAIN_TASKSET} -c 0 $<TARGET_FILE:core_to_core> --message 4K --reps 2)
  endif()
  # The memcpy roof's copies are checked too (they went unread), before and after the sweep.
  ringtrain_add_checked_test(bench.comm_sweep.memcpy_checked
      EXPECT "memcpy bandwidth .rank 0, 64 MiB, same run.: [0-9.]+ GB/s, copies #wrong 0.*after the sweep: [0-9.]+ GB/s .before: [0-9.]+.. copies #wrong 0 .both..*total #wrong: 0"
      COMMAND $<TARGET_FILE:comm_sweep> --max-bytes 64 --warmup 0 --iters 1)
  set_tests_properties(bench.comm_sweep.memcpy_checked PROPERTIES LABELS bench-smoke TIMEOUT 60)
  # Above 16 MiB fewer repetitions, never more than --iters (--iters 2 used to run 5 there);
  # each row's JSON says how many.
  set(sweep_reps_json ${CMAKE_CURRENT_BINARY_DIR}/comm_sweep_reps.json)
  ringtrain_add_checked_test(bench.comm_sweep.large_sizes_take_no_more_than_iters
      EXPECT "reps.: 2,,[ ]*.reps.: 2,"
      COMMAND sh -c "$<TARGET_FILE:comm_sweep> --min-bytes 16M --max-bytes 32M --iters 2 --warmup 0 --json ${sweep_reps_json} >/dev/null && grep reps ${sweep_reps_json} | paste -sd,")
  set_tests_properties(bench.comm_sweep.large_sizes_take_no_more_than_iters PROPERTIES LABELS bench-smoke TIMEOUT 60)
  # One rank beside MPI: its busbw is 0, and the ratio column used to print -nan.
  if(MPIEXEC_EXECUTABLE)
    ringtrain_add_checked_test(bench.comm_sweep.one_rank_ratio_is_a_number
        EXPECT "  64 +16 +float +sum [|].*[|] +[0-9]+[.][0-9][0-9]\n" FORBID "nan"
        COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 1 $<TARGET_FILE:comm_sweep>
                --max-bytes 64 --warmup 0 --iters 2)
    set_tests_properties(bench.comm_sweep.one_rank_ratio_is_a_number PROPERTIES LABELS bench-smoke TIMEOUT 60)
  endif()
  # The plot's legend names the MPI library of the run it draws (it said "Open MPI 4.1.4"
  # whatever had run): the labels from made-up sweeps, then from a real sweep's JSON.
  add_test(NAME bench.plot_allreduce.legend_names_each_runs_mpi
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/plot_allreduce_test.py)
  set_tests_properties(bench.plot_allreduce.legend_names_each_runs_mpi PROPERTIES LABELS bench-smoke TIMEOUT 60)
  if(MPIEXEC_EXECUTABLE)
    set(sweep_json ${CMAKE_CURRENT_BINARY_DIR}/comm_sweep_mpi_library.json)
    ringtrain_add_checked_test(bench.comm_sweep.json_names_the_mpi_library
        EXPECT "# MPI reference: MPI_Allreduce of Open MPI v[0-9.]+.*label: MPI_Allreduce [(]Open MPI v[0-9.]+[)], same run"
        COMMAND sh -c "${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:comm_sweep> --max-bytes 64 --warmup 0 --iters 1 --json ${sweep_json} && /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/plot_allreduce.py --labels ${sweep_json}")
    set_tests_properties(bench.comm_sweep.json_names_the_mpi_library PROPERTIES LABELS bench-smoke TIMEOUT 120)
  endif()
  ringtrain_bench_expect_error(bench.core_to_core.ring_too_large
                               EXPECT "core_to_core: --message 64 \\(twice\\) with --slots 1024 x --slot-bytes 1G needs at least"
                               COMMAND $<TARGET_FILE:core_to_core> --message 64 --slot-bytes 1G --slots 1024 --reps 1)
endif()
