# bench/mlp.cmake: the MLP training step, ringtrain beside PyTorch (bench/mlp_step_torch.py).
#   build/bench/mlp_step            # both, same run; needs /usr/bin/python3 with python3-torch
#   build/bench/mlp_step --no-torch # ours only
if(TARGET ringtrain_nn)
  add_executable(mlp_step ${CMAKE_CURRENT_LIST_DIR}/mlp_step.cc)
  target_link_libraries(mlp_step PRIVATE ringtrain::nn CLI11::CLI11 nlohmann_json::nlohmann_json)
  target_compile_definitions(mlp_step PRIVATE RINGTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_compile_options(mlp_step PRIVATE -Wall -Wextra -Wno-unused-parameter)
endif()
