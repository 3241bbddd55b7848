# expect_output.cmake: runs a program and checks its exit status and its output (stdout and
# stderr together). CTest's PASS_REGULAR_EXPRESSION alone ignores the exit status: a program
# that printed its table and then exited 1 for a wrong result, or a rank that crashed after
# rank 0 printed its last line, would pass.
#   cmake -DMODE=success|error -DEXPECT=<regex> [-DFORBID=<regex>] -P expect_output.cmake -- <program> <args>...
# MODE success: passes when the program exits 0 and its output matches EXPECT (and not
#   FORBID). Exit 77 (the program's "cannot run here") prints "RINGTRAIN-SKIP: exit 77",
#   which the tests declare as their SKIP_REGULAR_EXPRESSION.
# MODE error: passes when the program exits with a non-zero code (ended by a signal, such
#   as SIGSEGV or std::terminate's SIGABRT, it fails), its output matches EXPECT, and, with
#   FORBID, does not match FORBID (e.g. a table that says it ran although the error should
#   have stopped it first). Used for bad arguments and environments.
# Added by ringtrain_add_checked_test / ringtrain_add_error_test (RingtrainHelpers.cmake).
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
if(NOT command OR NOT DEFINED EXPECT OR NOT MODE MATCHES "^(success|error)$")
  message(FATAL_ERROR "usage: cmake -DMODE=success|error -DEXPECT=<regex> [-DFORBID=<regex>] -P expect_output.cmake -- <program> <args>...")
endif()

# No time limit here: the test's TIMEOUT (stretched under sanitizers) bounds it.
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
# A sanitizer's report fails the test in either mode: its non-zero exit would
# otherwise pass an error test whose expected message another rank printed. (The same
# pattern as RINGTRAIN_SANITIZER_REPORT_REGEX in RingtrainHelpers.cmake; change both.)
if(out MATCHES "(ERROR|WARNING): [A-Za-z]*Sanitizer|runtime error: ")
  message(FATAL_ERROR "a sanitizer reported an error (above); exit code ${rc}")
endif()
if(MODE STREQUAL "success")
  if(rc STREQUAL "77")
    message("RINGTRAIN-SKIP: exit 77")
    return()
  elseif(NOT rc STREQUAL "0")
    message(FATAL_ERROR "expected exit 0, got: ${rc}")
  endif()
elseif(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "expected an error exit, but the program did not exit normally: ${rc}")
elseif(rc EQUAL 0)
  message(FATAL_ERROR "expected an error exit, but the program exited 0")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "exit code ${rc}, but the output does not match: ${EXPECT}")
elseif(DEFINED FORBID AND out MATCHES "${FORBID}")
  message(FATAL_ERROR "the output matches what it must not: ${FORBID}")
endif()
