# bench/ddp.cmake: the DDP step benchmark (bench/ddp_step.cc) and its PyTorch twin
# (bench/ddp_step_torch.py); bench/run_ddp_bench.sh runs both side by side.
if(TARGET ringtrain_ddp)
  add_executable(ddp_step ${CMAKE_CURRENT_LIST_DIR}/ddp_step.cc)
  target_link_libraries(ddp_step PRIVATE ringtrain::ddp CLI11::CLI11 nlohmann_json::nlohmann_json)
  target_compile_options(ddp_step PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(RINGTRAIN_BUILD_TESTS)
    # bench-smoke: a tiny model; it exits 1 if t_local's model (which used to go
    # unchecked) did not move as its steps replayed alone move, the replicas differ, a DDP
    # gradient is not the global batch's or an allreduce timed alone (t_comm, unchecked
    # before too) is not the average, and the test requires exit 0 as well as the output:
    # the per-cap h reported, then the checks (one expression: several would pass on any
    # one of them). 7 local steps: 1 warm-up, then 2 rounds of 1 + 2.
    ringtrain_add_checked_test(bench_ddp_step_smoke_mpirun_np2
        EXPECT "best h over the cap sweep: -?[0-9.]+ at [0-9.]+ MiB.*t_local's model equal to its 7 steps replayed alone. replicas identical.*t_comm's allreduces equal to the average, every configuration: #wrong = 0"
        COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2
                $<TARGET_FILE:ddp_step> --in-features 32 --width 64 --hidden 2 --batch 8
                --warmup 1 --rounds 2 --steps 2 --sweep-mb 0.01 1)
    set_tests_properties(bench_ddp_step_smoke_mpirun_np2 PROPERTIES LABELS bench-smoke TIMEOUT 120)
    # The torch twin, small, when /usr/bin/python3 has torch: the same checks (its local
    # model's replay included), exit 1 on any of them.
    execute_process(COMMAND /usr/bin/python3 -c "import torch" RESULT_VARIABLE ringtrain_ddp_no_torch
                    OUTPUT_QUIET ERROR_QUIET)
    if(ringtrain_ddp_no_torch EQUAL 0 AND TARGET ringrun)
      ringtrain_add_checked_test(bench_ddp_step_torch_smoke_ringrun_np2
          EXPECT "local model equal to its 7 steps replayed alone, replicas identical, DDP gradients equal to the global batch's: #wrong = 0"
          COMMAND $<TARGET_FILE:ringrun> --nproc-per-node 2 --master-port 29467
                  /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/ddp_step_torch.py --in-features 32 --width 64 --hidden 2
                  --batch 8 --warmup 1 --rounds 2 --steps 2)
      set_tests_properties(bench_ddp_step_torch_smoke_ringrun_np2 PROPERTIES LABELS bench-smoke TIMEOUT 120)
    endif()
    # Bad input, one rank (no launcher): errors that name the option, not std::terminate,
    # a crash, or a table of zeros and -nan%.
    set(ddp_small --in-features 8 --width 8 --hidden 1 --batch 4 --warmup 1 --rounds 1 --steps 1 --sweep-mb 1)
    ringtrain_bench_expect_range_errors(bench.ddp_step
        CASES width:0:1 hidden:-1:0 rounds:0:1 steps:0:1 warmup:-1:0
        COMMAND $<TARGET_FILE:ddp_step> --in-features 8 --batch 4 --sweep-mb 1)
    foreach(cap 0 -1)  # -1 MiB used to become a size_t near 2^64
      ringtrain_bench_expect_error(bench.ddp_step.sweep_mb_${cap}
                                   EXPECT "--sweep-mb: '${cap}' is not a bucket cap in MiB"
                                   COMMAND $<TARGET_FILE:ddp_step> --in-features 8 --batch 4 --sweep-mb ${cap})
    endforeach()
    ringtrain_bench_expect_error(bench.ddp_step.unknown_backend EXPECT "--backend: foo not in"
                                 COMMAND $<TARGET_FILE:ddp_step> --backend foo)
    ringtrain_bench_expect_error(bench.ddp_step.bad_master_port
                                 EXPECT "ddp_step: environment variable MASTER_PORT='abc' is not an integer"
                                 ENVIRONMENT MASTER_ADDR=127.0.0.1 MASTER_PORT=abc WORLD_SIZE=1 RANK=0
                                 COMMAND $<TARGET_FILE:ddp_step> ${ddp_small})
    # Unwritable outputs stop the run before it starts (the trace used to abort after it).
    foreach(output trace json)
      ringtrain_bench_expect_error(bench.ddp_step.${output}_unwritable
                                   EXPECT "ddp_step: cannot write --${output} ${CMAKE_CURRENT_BINARY_DIR}/no-such-dir/x.json: No such file or directory"
                                   FORBID "#wrong"
                                   COMMAND $<TARGET_FILE:ddp_step> ${ddp_small}
                                           --${output} ${CMAKE_CURRENT_BINARY_DIR}/no-such-dir/x.json)
    endforeach()
  endif()
endif()
