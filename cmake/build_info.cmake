# Regenerates core/build_info.h at every build so --version names the commit actually built.
# Called by the mt_build_info target: cmake -DSOURCE_DIR= -DINPUT= -DOUTPUT= -D... -P build_info.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE MT_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT MT_GIT_COMMIT)
  set(MT_GIT_COMMIT "unknown")
endif()
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE MT_GIT_DIRTY OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(MT_GIT_DIRTY)
  string(APPEND MT_GIT_COMMIT "-dirty")
endif()
configure_file(${INPUT} ${OUTPUT}.tmp @ONLY)
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUTPUT}.tmp ${OUTPUT})
file(REMOVE ${OUTPUT}.tmp)
