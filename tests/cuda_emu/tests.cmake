# The emulator's own tests (included by tests/CMakeLists.txt in the emulated build): every rule
# it enforces shown by a deliberately broken kernel it must catch, and the CUDA semantics it must
# keep. cuemu_test.cu is CUDA source, rewritten like the project's kernels.
trident_cuemu_sources(cuemu_test_sources tests/cuda_emu ${CMAKE_CURRENT_LIST_DIR}/cuemu_test.cu)
add_executable(trident_cuemu_test ${cuemu_test_sources})
target_link_libraries(trident_cuemu_test PRIVATE cuemu GTest::gtest GTest::gtest_main)
trident_target_defaults(trident_cuemu_test)
target_compile_options(trident_cuemu_test PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-restrict>)
gtest_discover_tests(trident_cuemu_test TEST_PREFIX "emulated/"
                     TEST_FILTER "-EmuTwoDevices.*:EmuStrictHost.*"
                     PROPERTIES LABELS cuda ENVIRONMENT "CUEMU_QUIET=1"
                                FAIL_REGULAR_EXPRESSION "SKIPPED ]"
                     DISCOVERY_TIMEOUT 60)
add_test(NAME emulated/EmuTwoDevices.MemoryOfAnotherDeviceIsRefused
         COMMAND trident_cuemu_test --gtest_filter=EmuTwoDevices.*)
set_tests_properties(emulated/EmuTwoDevices.MemoryOfAnotherDeviceIsRefused PROPERTIES
                     LABELS cuda ENVIRONMENT "CUEMU_QUIET=1;CUEMU_DEVICE_COUNT=2")
add_test(NAME emulated/EmuStrictHost.HostCodeTouchingDeviceMemoryIsNamed
         COMMAND trident_cuemu_test --gtest_filter=EmuStrictHost.*)
set_tests_properties(emulated/EmuStrictHost.HostCodeTouchingDeviceMemoryIsNamed PROPERTIES
                     LABELS cuda ENVIRONMENT "CUEMU_QUIET=1;CUEMU_STRICT_HOST=1")
# The same rules with a block's threads as OS threads (the mode ThreadSanitizer runs in). The
# missing-barrier kernel is a real race there, whose result depends on the schedule (as on a GPU):
# scripts/test-tsan runs it under ThreadSanitizer, which must report it.
add_test(NAME emulated/cuemu-thread-mode
         COMMAND trident_cuemu_test
                 --gtest_filter=Emu.*:-Emu.LaunchLimits*:Emu.AMissingBarrier*)
set_tests_properties(emulated/cuemu-thread-mode PROPERTIES
                     LABELS cuda ENVIRONMENT "CUEMU_QUIET=1;CUEMU_THREADS=1")
