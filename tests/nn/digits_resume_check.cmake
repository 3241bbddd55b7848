# cmake -DDIGITS_TRAIN=<exe> -DWORK_DIR=<dir> -DMODEL=mlp|cnn -P digits_resume_check.cmake
#
# End-to-end resume check of examples/digits_train: a run stopped after 4 epochs
# and resumed from its checkpoint must end with the same weights fingerprint
# (bitwise-equal parameters) as an uninterrupted run, and reach >= 95% accuracy.
set(args --model ${MODEL} --epochs 10 --quiet)
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${DIGITS_TRAIN} ${args} OUTPUT_VARIABLE straight RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "straight run failed (${rc}): ${straight}")
endif()
execute_process(COMMAND ${DIGITS_TRAIN} ${args} --checkpoint-dir ${WORK_DIR} --stop-after 4
                OUTPUT_VARIABLE first RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT first MATCHES "stopped early")
  message(FATAL_ERROR "first half failed (${rc}): ${first}")
endif()
execute_process(COMMAND ${DIGITS_TRAIN} ${args} --checkpoint-dir ${WORK_DIR} --resume
                OUTPUT_VARIABLE second RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT second MATCHES "resumed from .*epoch 4")
  message(FATAL_ERROR "resumed run failed (${rc}): ${second}")
endif()
string(REGEX MATCH "weights fingerprint: ([0-9a-f]+)" _ "${straight}")
set(fp_straight ${CMAKE_MATCH_1})
string(REGEX MATCH "weights fingerprint: ([0-9a-f]+)" _ "${second}")
set(fp_resumed ${CMAKE_MATCH_1})
if(fp_straight STREQUAL "" OR NOT fp_straight STREQUAL fp_resumed)
  message(FATAL_ERROR "resumed weights differ from the uninterrupted run:\n${straight}\n---\n${second}")
endif()
# A resumed run that never reports its accuracy fails too: without a match, LESS
# compares an empty (or the fingerprint's) CMAKE_MATCH_1, which is false, and passed.
set(accuracy "")
if(second MATCHES "final test accuracy: ([0-9]+(\\.[0-9]+)?)%")
  set(accuracy ${CMAKE_MATCH_1})
endif()
if(accuracy STREQUAL "")
  message(FATAL_ERROR "the resumed run printed no \"final test accuracy: N%\" line:\n${second}")
endif()
if(accuracy LESS 95)
  message(FATAL_ERROR "test accuracy ${accuracy}% < 95%:\n${second}")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "${MODEL}: resumed == uninterrupted (fingerprint ${fp_resumed}), accuracy ${accuracy}%")
