// metrics.jsonl on resume (train/metrics.h): the lines of steps after the checkpoint are
// dropped, a torn last line goes, and every other line is kept as it was written.
#include <gtest/gtest.h>

#include <fstream>

#include "test_paths.h"
#include "train/metrics.h"
#include "util/atomic_file.h"

TEST(MetricsWriter, ResumeDropsLaterStepsAndATornLineAndKeepsEveryOtherLine) {
  const std::string path = gnmr_test::scratch_dir("metrics_resume") + "/metrics.jsonl";
  // A "step" that is not a number, or one past int64's range, is compared as JSON: the first
  // threw json's type_error out of the resume, the second was converted to int64 (undefined
  // behaviour).
  std::ofstream(path, std::ios::trunc) << R"({"kind":"train","step":1,"loss":9.5}
{"kind":"train","step":2,"loss":9.1}
{"kind":"note","step":"two"}
{"kind":"train","step":3,"loss":8.8}
{"kind":"eval","step":1e300}
{"kind":"summary"}
[1,2]
{"kind":"train","st)";
  {
    gnmr::MetricsWriter writer;
    writer.open(path, /*keep_through_step=*/2);
    writer.write({{"kind", "train"}, {"step", 3}, {"loss", 8.7}});
  }
  EXPECT_EQ(gnmr::read_file(path), R"({"kind":"train","step":1,"loss":9.5}
{"kind":"train","step":2,"loss":9.1}
{"kind":"note","step":"two"}
{"kind":"summary"}
[1,2]
{"kind":"train","loss":8.7,"step":3}
)");
}
