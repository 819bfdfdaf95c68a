# The fuzz build (setup.sh's check job "fuzz"; README "Check jobs", docs/DESIGN.md section 6), in a
# build directory of its own:
#   -DMT_FUZZ=ON   clang; the top-level CMakeLists.txt then builds only tests/fuzz (the readers'
#                  sources and their libFuzzer targets), every file with AddressSanitizer +
#                  UndefinedBehaviorSanitizer (any report is fatal: -fno-sanitize-recover) and
#                  libFuzzer's coverage (-fsanitize=fuzzer-no-link), at -O1 (the sanitizers'
#                  advice: quick to compile, reports that name the right lines) with line tables,
#                  the checkout's path mapped to "." in them (-fdebug-prefix-map: ccache then hashes
#                  the same build directory in any clone, so a clean clone's build hits the cache).
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
                      $<$<COMPILE_LANGUAGE:CXX,C>:-g1> $<$<COMPILE_LANGUAGE:CXX,C>:-O1>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fdebug-prefix-map=${CMAKE_SOURCE_DIR}=.>)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=fuzzer-no-link>)
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "mt: the fuzz build (tests/fuzz only)")
endif()

# The sanitizer builds (setup.sh's check jobs "asan" and "tsan"), each in a build directory of
# its own, with the project's compiler (GCC):
#   -DMT_SANITIZE=address  AddressSanitizer + UndefinedBehaviorSanitizer, any report fatal.
#   -DMT_SANITIZE=thread   ThreadSanitizer (tests/sanitizers/tsan.supp names what it may ignore).
# Both at -O1 with line tables; -fdebug-prefix-map turns the checkout's path into "." so that
# ccache hashes the same build directory in any clone and a clean clone's build hits the cache.
set(MT_SANITIZE "" CACHE STRING "A sanitizer build: address (ASan + UBSan) or thread (TSan); empty for none")
set_property(CACHE MT_SANITIZE PROPERTY STRINGS "" address thread)
if(MT_SANITIZE STREQUAL "address")
  set(mt_sanitizer_flags -fsanitize=address,undefined -fno-sanitize-recover=all)
elseif(MT_SANITIZE STREQUAL "thread")
  set(mt_sanitizer_flags -fsanitize=thread)
elseif(NOT MT_SANITIZE STREQUAL "")
  message(FATAL_ERROR "MT_SANITIZE is '${MT_SANITIZE}': give address, thread or nothing")
endif()
if(mt_sanitizer_flags)
  foreach(flag ${mt_sanitizer_flags} -fno-omit-frame-pointer -g1 -O1 -fdebug-prefix-map=${CMAKE_SOURCE_DIR}=.)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:${flag}>)
  endforeach()
  add_link_options(${mt_sanitizer_flags})
  message(STATUS "mt: the ${MT_SANITIZE} sanitizer build")
endif()
