# expect_error.cmake: runs a benchmark with a bad argument; it must fail with a message.
#   cmake -DEXPECT=<regex> [-DFORBID=<regex>] -P expect_error.cmake -- <program> <args>...
# Passes when the program exits with a non-zero code (ended by a signal, such as
# SIGSEGV or std::terminate's SIGABRT, it fails), its output (stdout and stderr)
# matches EXPECT, and, with FORBID, does not match FORBID (e.g. a table that says the
# benchmark ran although the error should have stopped it first).
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
  message(FATAL_ERROR "usage: cmake -DEXPECT=<regex> [-DFORBID=<regex>] -P expect_error.cmake -- <program> <args>...")
endif()

execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 100)
message("${out}")
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "expected an error exit, but the program did not exit normally: ${rc}")
elseif(rc EQUAL 0)
  message(FATAL_ERROR "expected an error exit, but the program exited 0")
elseif(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "exit code ${rc}, but the output does not match: ${EXPECT}")
elseif(DEFINED FORBID AND out MATCHES "${FORBID}")
  message(FATAL_ERROR "the output matches what it must not: ${FORBID}")
endif()
