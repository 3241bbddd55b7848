# Data and checkpoint tests (nn/data, nn/checkpoint): every data_*_test.cc and
# checkpoint_*_test.cc here is one GoogleTest binary, label `unit`. Included from
# tests/nn/CMakeLists.txt (whose own glob must leave these two patterns out).
# data_files_test writes .gz fixtures itself, hence zlib.
find_package(ZLIB REQUIRED)
file(GLOB ringtrain_data_tests ${CMAKE_CURRENT_LIST_DIR}/data_*_test.cc
                               ${CMAKE_CURRENT_LIST_DIR}/checkpoint_*_test.cc)
foreach(src ${ringtrain_data_tests})
  get_filename_component(name ${src} NAME_WE)
  ringtrain_add_gtest(nn_${name} SOURCES ${src} DEPS ringtrain::nn ZLIB::ZLIB LABELS unit)
endforeach()
