# bench/mlp.cmake: the MLP training step, ringtrain beside PyTorch (bench/mlp_step_torch.py).
#   build/bench/mlp_step            # both, same run; needs /usr/bin/python3 with python3-torch
#   build/bench/mlp_step --no-torch # ours only
if(TARGET ringtrain_nn)
  add_executable(mlp_step ${CMAKE_CURRENT_LIST_DIR}/mlp_step.cc)
  target_link_libraries(mlp_step PRIVATE ringtrain::nn CLI11::CLI11 nlohmann_json::nlohmann_json)
  target_compile_definitions(mlp_step PRIVATE RINGTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_compile_options(mlp_step PRIVATE -Wall -Wextra -Wno-unused-parameter)
endif()

# bench-smoke: a small MLP, ours only, and (when /usr/bin/python3 has torch) beside PyTorch,
# where any loss mismatch (#wrong) makes mlp_step exit 2.
if(TARGET mlp_step)
  add_test(NAME bench_mlp_step_smoke
           COMMAND mlp_step --no-torch --in-features 32 --width 64 --batch 8 --warmup 1 --steps 2 --rounds 2)
  set_tests_properties(bench_mlp_step_smoke PROPERTIES LABELS bench-smoke TIMEOUT 120)
  execute_process(COMMAND /usr/bin/python3 -c "import torch" RESULT_VARIABLE ringtrain_no_torch
                  OUTPUT_QUIET ERROR_QUIET)
  if(ringtrain_no_torch EQUAL 0)
    add_test(NAME bench_mlp_step_vs_torch_smoke
             COMMAND mlp_step --in-features 32 --width 64 --batch 8 --warmup 1 --steps 2 --rounds 2)
    set_tests_properties(bench_mlp_step_vs_torch_smoke PROPERTIES LABELS bench-smoke TIMEOUT 120
                         PASS_REGULAR_EXPRESSION ", 0 wrong")  # not "10 wrong": ctest ignores the exit code here
  endif()
endif()
