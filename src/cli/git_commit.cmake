# Run at build time (cmake -P, src/cli/CMakeLists.txt): writes OUT, the header that names the
# git commit the build was made from, and rewrites it only when the answer changed, so that a
# build recompiles build_id.cpp alone, and only after a commit or a first edit.
#   cmake -DSOURCE_DIR=... -DOUT=... -P git_commit.cmake
# The commit is SOURCE_DIR's own: a source tree without .git inside another repository is
# "unknown", not that repository's commit. 12 hex digits whatever the tags; "-dirty" where a
# tracked file differs from the commit. --no-optional-locks: the status takes no index lock
# in a checkout someone else is working in.
set(commit "unknown")  # a source tree without .git (a bundle), or no git
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --show-toplevel
                OUTPUT_VARIABLE top RESULT_VARIABLE status OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET)
if(status EQUAL 0)
  file(REAL_PATH "${SOURCE_DIR}" source_real)
  file(REAL_PATH "${top}" top_real)
  if(source_real STREQUAL top_real)
    execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
                    OUTPUT_VARIABLE head RESULT_VARIABLE status OUTPUT_STRIP_TRAILING_WHITESPACE
                    ERROR_QUIET)
    if(status EQUAL 0 AND NOT head STREQUAL "")
      set(commit "${head}")
      execute_process(COMMAND git --no-optional-locks -C "${SOURCE_DIR}" status --porcelain
                              --untracked-files=no
                      OUTPUT_VARIABLE changes RESULT_VARIABLE status ERROR_QUIET)
      if(NOT status EQUAL 0 OR NOT changes STREQUAL "")
        string(APPEND commit "-dirty")
      endif()
    endif()
  endif()
endif()
set(text "// Written by src/cli/git_commit.cmake at build time.\n#define GNMR_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
