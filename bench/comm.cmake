# Collective benchmarks (comm/). Included by bench/CMakeLists.txt.
add_executable(comm_sweep ${CMAKE_CURRENT_LIST_DIR}/comm_sweep.cc)
target_link_libraries(comm_sweep PRIVATE ringtrain::comm CLI11::CLI11)
target_compile_options(comm_sweep PRIVATE -Wall -Wextra)

if(RINGTRAIN_BUILD_TESTS)
  # bench-smoke: tiny sizes, both launchers; any #wrong makes comm_sweep exit 1.
  add_test(NAME bench.comm_sweep.smoke_mpirun_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root -np 2
                   $<TARGET_FILE:comm_sweep> --max-bytes 256K --warmup 1 --iters 3)
  add_test(NAME bench.comm_sweep.smoke_ringrun_np2
           COMMAND $<TARGET_FILE:ringrun> --nproc-per-node 2 --master-port 39410
                   $<TARGET_FILE:comm_sweep> --max-bytes 64K --warmup 1 --iters 3)
  set_tests_properties(bench.comm_sweep.smoke_mpirun_np2 bench.comm_sweep.smoke_ringrun_np2
                       PROPERTIES LABELS bench-smoke TIMEOUT 120
                       PASS_REGULAR_EXPRESSION "# total #wrong: 0")
endif()
