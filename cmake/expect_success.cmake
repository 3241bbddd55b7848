# expect_success.cmake: runs a program that must succeed AND print what shows it checked
# its work (a demo's accuracy, a benchmark's "#wrong = 0").
#   cmake -DEXPECT=<regex> [-DFORBID=<regex>] -P expect_success.cmake -- <program> <args>...
# Passes when the program exits 0 and its output (stdout and stderr) matches EXPECT (and,
# with FORBID, does not match it). CTest's PASS_REGULAR_EXPRESSION alone ignores the exit
# status: a program that printed its table and then exited 1 for a wrong result, or a rank
# that crashed after rank 0 printed its last line, would pass. Exit 77 (the program's "cannot
# run here") prints "RINGTRAIN-SKIP: exit 77", which ringtrain_add_checked_test() declares as
# the test's SKIP_REGULAR_EXPRESSION.
set(command "")
set(after_dashes FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(after_dashes)
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif("${CMAKE_ARGV${i}}" STREQUAL "--")
    set(after_dashes TRUE)
  endif()
endforeach()
if(NOT command OR NOT DEFINED EXPECT)
  message(FATAL_ERROR "usage: cmake -DEXPECT=<regex> [-DFORBID=<regex>] -P expect_success.cmake -- <program> <args>...")
endif()

execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(rc STREQUAL "77")
  message("RINGTRAIN-SKIP: exit 77")
elseif(NOT rc STREQUAL "0")
  message(FATAL_ERROR "expected exit 0, got: ${rc}")
elseif(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "exit 0, but the output does not match: ${EXPECT}")
elseif(DEFINED FORBID AND out MATCHES "${FORBID}")
  message(FATAL_ERROR "the output matches what it must not: ${FORBID}")
endif()
