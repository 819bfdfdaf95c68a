# The fuzz build (setup.sh's check job "fuzz"; README "Check jobs", docs/DESIGN.md section 6), in a
# build directory of its own:
#   -DMT_FUZZ=ON   clang; the top-level CMakeLists.txt then builds only tests/fuzz (the readers'
#                  sources and their libFuzzer targets), every file with AddressSanitizer +
#                  UndefinedBehaviorSanitizer (any report is fatal: -fno-sanitize-recover) and
#                  libFuzzer's coverage (-fsanitize=fuzzer-no-link), at -O1 (the sanitizers'
#                  advice: quick to compile, reports that name the right lines) with line tables.
# Configure it with -DMT_CUDA=OFF (CUDA is not instrumented). Tested by the check job itself
# (setup.sh run_checks) and tests/fuzz/CMakeLists.txt's replay tests.
option(MT_FUZZ "The fuzz build: only tests/fuzz, with clang, libFuzzer, ASan and UBSan" OFF)

if(MT_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "MT_FUZZ needs clang (libFuzzer): configure with -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=all>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-g1> $<$<COMPILE_LANGUAGE:CXX,C>:-O1>)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=fuzzer-no-link>)
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "mt: the fuzz build (tests/fuzz only)")
endif()
