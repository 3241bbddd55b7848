# bench/ddp.cmake: the DDP step benchmark (bench/ddp_step.cc) and its PyTorch twin
# (bench/ddp_step_torch.py); bench/run_ddp_bench.sh runs both side by side.
if(TARGET ringtrain_ddp)
  add_executable(ddp_step ${CMAKE_CURRENT_LIST_DIR}/ddp_step.cc)
  target_link_libraries(ddp_step PRIVATE ringtrain::ddp CLI11::CLI11 nlohmann_json::nlohmann_json)
  target_compile_options(ddp_step PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(RINGTRAIN_BUILD_TESTS)
    # bench-smoke: a tiny model; exits 1 if the replicas ever differ.
    add_test(NAME bench_ddp_step_smoke_mpirun_np2
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2
                     $<TARGET_FILE:ddp_step> --in-features 32 --width 64 --hidden 2 --batch 8
                     --warmup 1 --rounds 2 --steps 2 --sweep-mb 0.01 1)
    set_tests_properties(bench_ddp_step_smoke_mpirun_np2 PROPERTIES LABELS bench-smoke TIMEOUT 120
                         PASS_REGULAR_EXPRESSION "#wrong = 0")
  endif()
endif()
