# bench/mlp.cmake: the MLP training step, ringtrain beside PyTorch (bench/mlp_step_torch.py).
#   build/bench/mlp_step            # both, same run; needs /usr/bin/python3 with python3-torch
#   build/bench/mlp_step --no-torch # ours only, checked against plain double-precision loops
if(TARGET ringtrain_nn)
  add_executable(mlp_step ${CMAKE_CURRENT_LIST_DIR}/mlp_step.cc)
  target_link_libraries(mlp_step PRIVATE ringtrain::nn CLI11::CLI11 nlohmann_json::nlohmann_json)
  target_compile_definitions(mlp_step PRIVATE RINGTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_compile_options(mlp_step PRIVATE -Wall -Wextra -Wno-unused-parameter)
endif()

# bench-smoke: a small MLP, ours only (its losses checked against the double-precision
# reference in mlp_step.cc: the first steps, and, replayed after the timing, the end of
# every timed round, which --no-torch used to leave unchecked) and (when /usr/bin/python3
# has torch) beside PyTorch; any loss mismatch (#wrong) makes mlp_step exit 2.
if(TARGET mlp_step)
  ringtrain_add_checked_test(bench_mlp_step_smoke
      EXPECT "double-precision reference .*every step replayed: .* at the end of each of 2 timed rounds and of the phase split, 0 wrong"
      COMMAND $<TARGET_FILE:mlp_step> --no-torch --in-features 32 --width 64 --batch 8 --warmup 1 --steps 2 --rounds 2)
  set_tests_properties(bench_mlp_step_smoke PROPERTIES LABELS bench-smoke TIMEOUT 120)
  # No warm-up is a valid request (it used to fail on an undefined loss).
  add_test(NAME bench.mlp_step.no_warmup
           COMMAND mlp_step --no-torch --in-features 8 --width 8 --hidden 1 --batch 4 --warmup 0 --steps 1 --rounds 1)
  set_tests_properties(bench.mlp_step.no_warmup PROPERTIES LABELS bench-smoke TIMEOUT 60)
  # Bad input: errors that name the option, not a crash on empty medians.
  if(RINGTRAIN_BUILD_TESTS)
    set(mlp_small --no-torch --in-features 8 --width 8 --hidden 1 --batch 4 --warmup 1 --rounds 1 --steps 1
                  --check-steps 1)
    ringtrain_bench_expect_range_errors(bench.mlp_step
        CASES rounds:0:1 steps:0:1 width:0:1 hidden:-1:0 warmup:-1:0
        COMMAND $<TARGET_FILE:mlp_step> --no-torch --in-features 8 --batch 4 --check-steps 1)
    # a learning rate that cannot train (NaN, inf, <= 0) names the option; NaN used to run
    # and end in "wrong" losses (exit 2)
    foreach(bad_lr nan inf 0)
      ringtrain_bench_expect_error(bench.mlp_step.lr_${bad_lr}_refused
                                   EXPECT "--lr: must be > 0, got ${bad_lr}"
                                   FORBID "median ms/step"
                                   COMMAND $<TARGET_FILE:mlp_step> ${mlp_small} --lr ${bad_lr})
    endforeach()
    ringtrain_bench_expect_error(bench.mlp_step.json_unwritable
                                 EXPECT "mlp_step: cannot write --json ${CMAKE_CURRENT_BINARY_DIR}/no-such-dir/x.json: No such file or directory"
                                 FORBID "median ms/step"
                                 COMMAND $<TARGET_FILE:mlp_step> ${mlp_small}
                                         --json ${CMAKE_CURRENT_BINARY_DIR}/no-such-dir/x.json)
    # A PyTorch side that ends without answering (no torch in that python, a wrong
    # --python) is an error naming how it ended; it used to kill mlp_step with SIGPIPE
    # (exit 141) and no message of its own.
    ringtrain_bench_expect_error(bench.mlp_step.torch_side_exits
                                 EXPECT "mlp_step: the PyTorch side \\(/bin/false .*\\) ended without an answer: it exited with status 1 .*--no-torch"
                                 COMMAND $<TARGET_FILE:mlp_step> --in-features 8 --width 8 --hidden 1 --batch 4
                                         --warmup 1 --rounds 1 --steps 1 --check-steps 1 --python /bin/false)
    ringtrain_bench_expect_error(bench.mlp_step.torch_side_not_found
                                 EXPECT "cannot exec /no/such/python.*mlp_step: the PyTorch side .* it exited with status 127 \\(could not start it\\)"
                                 COMMAND $<TARGET_FILE:mlp_step> --in-features 8 --width 8 --hidden 1 --batch 4
                                         --warmup 1 --rounds 1 --steps 1 --check-steps 1 --python /no/such/python)
  endif()
  execute_process(COMMAND /usr/bin/python3 -c "import torch" RESULT_VARIABLE ringtrain_no_torch
                  OUTPUT_QUIET ERROR_QUIET)
  if(ringtrain_no_torch EQUAL 0)
    # (the phase split's loss checked too; "(" before 0: not "10 wrong")
    ringtrain_add_checked_test(bench_mlp_step_vs_torch_smoke EXPECT "end of each round and of the phase split[)], 0 wrong"
        COMMAND $<TARGET_FILE:mlp_step> --in-features 32 --width 64 --batch 8 --warmup 1 --steps 2 --rounds 2)
    set_tests_properties(bench_mlp_step_vs_torch_smoke PROPERTIES LABELS bench-smoke TIMEOUT 120)
  endif()
endif()
