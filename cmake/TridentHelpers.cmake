# Helpers shared by every CMakeLists in the tree.

# Warning flags for our own code (third-party headers come in as SYSTEM includes).
set(TRIDENT_WARNINGS -Wall -Wextra -Wshadow -Wno-unknown-pragmas)
if(TRIDENT_WERROR)
  list(APPEND TRIDENT_WARNINGS -Werror)
endif()

# Global sanitizer / fuzzing instrumentation (called once from the top CMakeLists, before any
# target): TRIDENT_SANITIZE adds -fsanitize=<list> to every compile and link, with every report
# fatal. TRIDENT_BUILD_FUZZ only checks the compiler here: libFuzzer's coverage instrumentation
# (-fsanitize=fuzzer-no-link, so that the fuzz targets see the edges of the libraries they call) is
# added by src/trident/CMakeLists.txt for the libraries the readers live in, not for the kernels
# or the GoogleTest binaries, whose sanitized runs it would only slow down.
# Line tables are all a report's stack needs (file:line per frame) and cost a fraction of full
# debug information to compile (-gline-tables-only with clang, -g1 with gcc).
macro(trident_sanitizer_flags)
  if(TRIDENT_SANITIZE)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      set(trident_sanitizer_debug -gline-tables-only)
    else()
      set(trident_sanitizer_debug -g1)
    endif()
    add_compile_options(-fsanitize=${TRIDENT_SANITIZE} -fno-sanitize-recover=all
                        -fno-omit-frame-pointer ${trident_sanitizer_debug})
    add_link_options(-fsanitize=${TRIDENT_SANITIZE})
  endif()
  if(TRIDENT_BUILD_FUZZ)
    if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      message(FATAL_ERROR "TRIDENT_BUILD_FUZZ needs clang (libFuzzer): configure with "
                          "-DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14")
    endif()
  endif()
endmacro()

# Modules whose loops the tests spend their time in. The sanitizer build compiles everything else
# at -O0 (a third of -O1's compile time for this template-heavy code) and these with
# TRIDENT_HOT_MODULE_FLAGS (-O1), so that its tests do not crawl (scripts/test-sanitizers).
set(TRIDENT_HOT_MODULE_FLAGS "" CACHE STRING
    "Extra compile flags for the modules in TRIDENT_HOT_MODULES (the sanitizer build: -O1)")
set(TRIDENT_HOT_MODULES "kernels;comm;data;train;plan" CACHE STRING
    "Modules that get TRIDENT_HOT_MODULE_FLAGS (core, kernels, comm, ...)")
separate_arguments(TRIDENT_HOT_MODULE_FLAG_LIST UNIX_COMMAND "${TRIDENT_HOT_MODULE_FLAGS}")

function(trident_target_defaults target)
  target_compile_options(${target} PRIVATE ${TRIDENT_WARNINGS})
  if(TRIDENT_NATIVE)
    target_compile_options(${target} PRIVATE -march=native)
  endif()
  # Open MPI's deprecated C++ bindings warn under -Wextra; we only use the C API.
  target_compile_definitions(${target} PRIVATE OMPI_SKIP_MPICXX=1)
endfunction()

# trident_add_module(NAME SOURCES ... DEPS ...): one static library per module of src/trident.
# A module may depend only on modules to its left in
# core -> kernels -> comm -> parallel -> model -> optim -> data -> ckpt -> train -> plan.
function(trident_add_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(trident_${name} STATIC ${ARG_SOURCES})
  target_include_directories(trident_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(trident_${name} PUBLIC ${ARG_DEPS})
  trident_target_defaults(trident_${name})
  if(name IN_LIST TRIDENT_HOT_MODULES)
    target_compile_options(trident_${name} PRIVATE ${TRIDENT_HOT_MODULE_FLAG_LIST})
  endif()
endfunction()

# trident_add_test(NAME SOURCES ... DEPS ... LABELS ...): a GoogleTest binary registered with CTest.
function(trident_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_SOURCES)
    return()  # the folder has no tests yet
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  trident_target_defaults(${name})
  gtest_discover_tests(${name} PROPERTIES LABELS "${ARG_LABELS}"
                       WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60)
endfunction()

# trident_add_mpi_test(TARGET NPROCS [ARGS...]): run an MPI GoogleTest binary under mpirun.
function(trident_add_mpi_test target nprocs)
  add_test(NAME ${target}_np${nprocs}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${nprocs}
                   --allow-run-as-root --oversubscribe ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${ARGN})
  set_tests_properties(${target}_np${nprocs} PROPERTIES LABELS "dist-mpi" TIMEOUT 600
                       ENVIRONMENT "OMPI_MCA_mpi_yield_when_idle=1;OMP_NUM_THREADS=1"
                       WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
endfunction()
