# Collective benchmarks (comm/). Included by bench/CMakeLists.txt.
add_executable(comm_sweep ${CMAKE_CURRENT_LIST_DIR}/comm_sweep.cc)
target_link_libraries(comm_sweep PRIVATE ringtrain::comm CLI11::CLI11)
target_compile_options(comm_sweep PRIVATE -Wall -Wextra)

# The two-core probe: the roof of the shared-memory transport (see the file's essay).
add_executable(core_to_core ${CMAKE_CURRENT_LIST_DIR}/core_to_core.cc)
target_link_libraries(core_to_core PRIVATE ringtrain::comm CLI11::CLI11 Threads::Threads)
target_compile_options(core_to_core PRIVATE -Wall -Wextra)

# Its bench-smoke tests are registered in tests/comm/CMakeLists.txt (after enable_testing()).
