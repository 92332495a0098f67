// metrics.jsonl on resume (train/metrics.h): the lines of steps after the checkpoint are
// dropped, a torn last line goes, and every other line is kept as it was written; each line
// written gets its "time".
#include <gtest/gtest.h>
#include <sys/stat.h>

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
    writer.write_line(R"({"kind":"train","loss":8.7,"step":3})");
  }
  EXPECT_EQ(gnmr::read_file(path), R"({"kind":"train","step":1,"loss":9.5}
{"kind":"train","step":2,"loss":9.1}
{"kind":"note","step":"two"}
{"kind":"summary"}
[1,2]
{"kind":"train","loss":8.7,"step":3}
)");
}

// The usual resume (the lines after the checkpoint are the file's last) cuts the file in place:
// a reader following it (`tail -f`, a dashboard holding it open) sees it shrink and reads on,
// where a new file renamed over it was never read again.
TEST(MetricsWriter, ResumeCutsTheFileInPlaceWhenTheDroppedLinesAreItsLast) {
  const std::string path = gnmr_test::scratch_dir("metrics_cut") + "/metrics.jsonl";
  std::ofstream(path, std::ios::trunc) << R"({"kind":"run","step":0}
{"kind":"train","step":1}
{"kind":"train","step":2}
{"kind":"train","step":3}
{"kind":"train",)";
  auto inode = [&path] {
    struct stat st {};
    EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
    return st.st_ino;
  };
  const ino_t before = inode();
  {
    gnmr::MetricsWriter writer;
    writer.open(path, /*keep_through_step=*/1);
    writer.write({{"kind", "train"}, {"step", 2}});
  }
  EXPECT_EQ(inode(), before);
  const std::string text = gnmr::read_file(path);
  EXPECT_EQ(text.rfind(R"({"kind":"run","step":0}
{"kind":"train","step":1}
{"kind":"train","step":2,"time":)",
                       0),
            0u)
      << text;
}
