# FindCUDNN: cuDNN from the CUDA toolkit or a system install. Defines CUDNN::cudnn.
find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/include)
find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR)
if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES IMPORTED_LOCATION ${CUDNN_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${CUDNN_INCLUDE_DIR})
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
