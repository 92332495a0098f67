# Run at build time (cmake -P, src/util/CMakeLists.txt): writes OUT, the header that names the
# git commit the build was made from, and rewrites it only when the commit changed, so that a
# build recompiles build_id.cpp alone, and only after a commit or an edit.
#   cmake -DSOURCE_DIR=... -DOUT=... -P git_commit.cmake
execute_process(COMMAND git -C "${SOURCE_DIR}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE commit RESULT_VARIABLE status OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET)
if(NOT status EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")  # a source tree without .git (a bundle), or no git
endif()
set(text "// Written by src/util/git_commit.cmake at build time.\n#define GNMR_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
