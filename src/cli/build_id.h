// Which gnmr this is: the version and the git commit it was built from, for `gnmr version`, the
// first line of a run's log, its metrics header and bench's JSON (TrainOptions and BenchOptions
// carry it there): a result names the code that made it.
#pragma once

namespace gnmr {

// "0.1.0 (git 2c45cf1a2b3c)"; "-dirty" after the commit where the tree had uncommitted
// changes, "git unknown" where the source tree was not a git checkout.
const char* gnmr_build_id();

}  // namespace gnmr
