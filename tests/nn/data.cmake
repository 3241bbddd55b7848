# Data and checkpoint tests (nn/data, nn/checkpoint): every data_*_test.cc and
# checkpoint_*_test.cc here is one GoogleTest binary, label `unit` (`cuda` for
# data_cuda_*_test.cc: they skip with a reason when no GPU is usable). Included from
# tests/nn/CMakeLists.txt (whose own glob must leave these two patterns out).
# data_files_test writes .gz fixtures itself, hence zlib.
find_package(ZLIB REQUIRED)
file(GLOB ringtrain_data_tests ${CMAKE_CURRENT_LIST_DIR}/data_*_test.cc
                               ${CMAKE_CURRENT_LIST_DIR}/checkpoint_*_test.cc)
foreach(src ${ringtrain_data_tests})
  get_filename_component(name ${src} NAME_WE)
  if(name MATCHES "^data_cuda_")
    set(labels cuda)
  else()
    set(labels unit)
  endif()
  ringtrain_add_gtest(nn_${name} SOURCES ${src} DEPS ringtrain::nn ZLIB::ZLIB LABELS ${labels})
endforeach()

# The digits example, end to end (needs python3-sklearn's digits.csv.gz): >= 95% test
# accuracy for both models within the time limit, and stop + resume == one run, bitwise.
if(TARGET digits_train AND EXISTS /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz)
  foreach(model mlp cnn)
    ringtrain_add_checked_test(example_digits_train_${model} EXPECT "final test accuracy: (9[5-9]|100)\\."
                               COMMAND $<TARGET_FILE:digits_train> --model ${model} --quiet)
    set_tests_properties(example_digits_train_${model} PROPERTIES LABELS unit TIMEOUT 60)
    add_test(NAME example_digits_resume_${model}
             COMMAND ${CMAKE_COMMAND} -DDIGITS_TRAIN=$<TARGET_FILE:digits_train>
                     -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/digits_resume_${model} -DMODEL=${model}
                     -P ${CMAKE_CURRENT_LIST_DIR}/digits_resume_check.cmake)
    set_tests_properties(example_digits_resume_${model} PROPERTIES LABELS unit TIMEOUT 120)
  endforeach()
endif()
