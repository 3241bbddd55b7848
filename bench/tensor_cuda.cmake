# GPU kernel benchmarks of the tensor library (GEMM TFLOP/s vs a direct cuBLAS call, elementwise
# and reduction GB/s vs cudaMemcpy device-to-device). Built only when the build has CUDA; without
# a usable GPU the program prints why and exits 0.
if(RINGTRAIN_HAS_CUDA)
  add_executable(bench_tensor_cuda ${CMAKE_CURRENT_LIST_DIR}/tensor_cuda.cc)
  target_link_libraries(bench_tensor_cuda PRIVATE ringtrain::tensor benchmark::benchmark CLI11::CLI11 CUDA::cudart
                        CUDA::cublas)
endif()
