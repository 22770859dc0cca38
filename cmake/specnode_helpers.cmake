# specnode_library(NAME name SRCS ... [HDRS ...] [DEPS ...] [COPTS ...])
#   One static library per concern, named specnode_<name>, alias specnode::<name>.
#   Include paths are rooted at the repository, so code includes "model/gguf/gguf_reader.h".
function(specnode_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;HDRS;DEPS;COPTS" ${ARGN})
  set(target specnode_${ARG_NAME})
  add_library(${target} STATIC ${ARG_SRCS} ${ARG_HDRS})
  add_library(specnode::${ARG_NAME} ALIAS ${target})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${target} PUBLIC ${ARG_DEPS})
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter ${ARG_COPTS})
endfunction()

# specnode_test(NAME name SRCS ... [DEPS ...] [LABELS ...] [TIMEOUT s])
#   A GoogleTest binary registered with ctest (gtest_discover_tests).
function(specnode_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  set(target ${ARG_NAME})
  add_executable(${target} ${ARG_SRCS})
  target_link_libraries(${target} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  include(GoogleTest)
  gtest_discover_tests(${target}
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
    DISCOVERY_TIMEOUT 60)
endfunction()
