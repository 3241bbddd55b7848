# Helpers shared by every folder's CMakeLists.txt.
#
# ringtrain_add_library(<name> SOURCES ... [CUDA_SOURCES ...] [CPU_ONLY_SOURCES ...]
#                       [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
#   Builds target ringtrain_<name>, alias ringtrain::<name>, exported as ringtrain::<name>.
#   CUDA_SOURCES are compiled when the build has CUDA, CPU_ONLY_SOURCES otherwise
#   (the files that say "this build has no CUDA"). Public headers are the folder's
#   *.h files, installed under include/ringtrain/<name>/ so that includes read
#   "tensor/tensor.h" both in the tree and after install.
function(ringtrain_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;CUDA_SOURCES;CPU_ONLY_SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  set(sources ${ARG_SOURCES})
  if(RINGTRAIN_HAS_CUDA)
    list(APPEND sources ${ARG_CUDA_SOURCES})
  else()
    list(APPEND sources ${ARG_CPU_ONLY_SOURCES})
  endif()
  add_library(ringtrain_${name} ${sources})
  add_library(ringtrain::${name} ALIAS ringtrain_${name})
  set_target_properties(ringtrain_${name} PROPERTIES EXPORT_NAME ${name} OUTPUT_NAME ringtrain_${name})
  target_include_directories(ringtrain_${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/ringtrain>)
  target_compile_features(ringtrain_${name} PUBLIC cxx_std_20)
  target_link_libraries(ringtrain_${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  target_compile_options(ringtrain_${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  if(RINGTRAIN_NATIVE)
    target_compile_options(ringtrain_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
  if(RINGTRAIN_HAS_CUDA)
    target_compile_definitions(ringtrain_${name} PUBLIC RINGTRAIN_WITH_CUDA=1)
    target_compile_options(ringtrain_${name} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wno-unused-parameter>)
  endif()
  install(TARGETS ringtrain_${name} EXPORT ringtrainTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  file(GLOB_RECURSE headers RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/*.h)
  foreach(header ${headers})
    get_filename_component(subdir ${header} DIRECTORY)
    install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ringtrain/${name}/${subdir})
  endforeach()
endfunction()

# ringtrain_add_gtest(<name> SOURCES ... DEPS ... [LABELS unit|cuda|...])
#   One GoogleTest executable; each TEST becomes a CTest test (gtest_discover_tests,
#   discovered before the tests run so the build never executes test binaries).
function(ringtrain_add_gtest name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT 300)
endfunction()

# ringtrain_stretch_timeouts_under_sanitizers(): call at the end of a CMakeLists.txt
# whose tests run whole programs (training examples, benchmarks). A sanitizer build
# runs them 5-40x slower (ThreadSanitizer most), so there every TIMEOUT set in that
# directory is multiplied by 10; a normal build keeps the tight limits, which are
# part of what those tests check.
# It also makes a sanitizer's report in the output fail every test of the directory:
# tests that pass on their output (PASS_REGULAR_EXPRESSION, where CTest ignores the exit
# status) or through a script that expects some ranks to fail (run_workers.sh) would
# otherwise pass with a report in a rank whose non-zero exit was expected anyway.
# (expect_output.cmake checks for reports itself; gtest binaries fail on the exit status.)
# (expect_output.cmake, a separate -P script, spells the same pattern; change both.)
set(RINGTRAIN_SANITIZER_REPORT_REGEX "(ERROR|WARNING): [A-Za-z]*Sanitizer|runtime error: ")
function(ringtrain_stretch_timeouts_under_sanitizers)
  if(NOT RINGTRAIN_SANITIZE)
    return()
  endif()
  get_directory_property(tests TESTS)
  foreach(test IN LISTS tests)
    get_test_property(${test} TIMEOUT timeout)
    if(timeout)
      math(EXPR timeout "${timeout} * 10")
      set_tests_properties(${test} PROPERTIES TIMEOUT ${timeout})
    endif()
    set_tests_properties(${test} PROPERTIES FAIL_REGULAR_EXPRESSION "${RINGTRAIN_SANITIZER_REPORT_REGEX}")
  endforeach()
endfunction()

# ringtrain_add_checked_test(<name> EXPECT <regex> [FORBID <regex>] [ENVIRONMENT <VAR=value>...]
#                            COMMAND <program> <args>...)
#   A test of a whole program that must exit 0 AND print output matching EXPECT (and not
#   FORBID). Use it instead of PASS_REGULAR_EXPRESSION, which makes CTest ignore the exit
#   status, for programs expected to succeed. Exit 77 counts as skipped.
# ringtrain_add_error_test(<name> EXPECT <regex> [FORBID <regex>] [ENVIRONMENT ...] COMMAND ...)
#   The program must exit non-zero (not by a signal) with output matching EXPECT: bad input.
# Both run cmake/expect_output.cmake; set LABELS, TIMEOUT etc. with set_tests_properties.
# The command's arguments and the regexes must not contain ';' (CMake's list separator).
function(ringtrain_add_output_test name mode)
  cmake_parse_arguments(ARG "" "EXPECT;FORBID" "ENVIRONMENT;COMMAND" ${ARGN})
  # An empty EXPECT would match any output, and a mistyped keyword would land among the
  # arguments: both would make a test that cannot fail.
  if(NOT ARG_EXPECT OR NOT ARG_COMMAND OR ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "${name}: needs EXPECT <regex> and COMMAND <program> ... (unparsed: ${ARG_UNPARSED_ARGUMENTS})")
  endif()
  # Quoted, because cmake's -D parser drops trailing blanks ("0=0.05 " would also
  # match "0=0.055") and strips one pair of surrounding single quotes.
  set(defines "-DMODE=${mode}" "-DEXPECT='${ARG_EXPECT}'")
  if(DEFINED ARG_FORBID)
    list(APPEND defines "-DFORBID='${ARG_FORBID}'")
  endif()
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} ${defines} -P ${RINGTRAIN_EXPECT_OUTPUT_SCRIPT} -- ${ARG_COMMAND})
  set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "RINGTRAIN-SKIP: exit 77")
  if(ARG_ENVIRONMENT)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${ARG_ENVIRONMENT}")
  endif()
endfunction()
function(ringtrain_add_checked_test name)
  ringtrain_add_output_test(${name} success ${ARGN})
endfunction()
function(ringtrain_add_error_test name)
  ringtrain_add_output_test(${name} error ${ARGN})
endfunction()
set(RINGTRAIN_EXPECT_OUTPUT_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/expect_output.cmake)
