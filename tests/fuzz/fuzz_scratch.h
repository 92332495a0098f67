// Shared by the fuzz targets: a private scratch directory for parsers that read files, and
// the check that a parser failed the documented way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "util/error.h"

namespace gnmr_fuzz {

// A directory of this process's own under $TMPDIR, made on first use, removed at exit.
const std::string& scratch_dir();

// Writes SIZE bytes to PATH (replacing it); aborts when it cannot.
void write_bytes(const std::string& path, const uint8_t* data, size_t size);

// A parser's input failed with an Error: it must be of kind EXPECTED (the README's exit
// code for that input) and name something; anything else aborts, which libFuzzer reports.
void check_error(const gnmr::Error& e, gnmr::ErrorKind expected);

}  // namespace gnmr_fuzz
