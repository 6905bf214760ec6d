// cli/output_paths.h and cli/text_width.h: the helpers the commands share.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "output_paths.h"
#include "text_width.h"

namespace fs = std::filesystem;
using namespace zt::cli;

TEST(TextWidth, CountsCodePointsNotBytes) {
  const std::string us = "251.81 \xC2\xB5s";  // "251.81 µs"
  EXPECT_EQ(us.size(), 10u);
  EXPECT_EQ(display_width(us), 9u);
  EXPECT_EQ(display_width(""), 0u);
  EXPECT_EQ(display_width("43.01 ms"), 8u);
  EXPECT_EQ(display_width("\xC3\x97\xE2\x80\xA6"), 2u);  // "×…": two and three bytes
  EXPECT_EQ(pad_left(us, 11), "  " + us);
  EXPECT_EQ(pad_left("43.01 ms", 11), "   43.01 ms");
  EXPECT_EQ(display_width(pad_left(us, 11)), display_width(pad_left("43.01 ms", 11)));
  EXPECT_EQ(pad_right(us, 11), us + "  ");
  EXPECT_EQ(pad_left(us, 5), us);  // already wider: unchanged
  EXPECT_EQ(pad_right(us, 9), us);
}

class OutputPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    old_ = fs::current_path();
    fs::current_path(dir_.path());
    std::ofstream("a.db") << "trace";
    std::ofstream("b.db") << "other";
    fs::create_directory("sub");
  }
  void TearDown() override { fs::current_path(old_); }
  zt::test::TempDir dir_;
  fs::path old_;
};

TEST_F(OutputPaths, SameFileMatchesEverySpelling) {
  EXPECT_TRUE(same_file("a.db", "a.db"));
  EXPECT_TRUE(same_file("./a.db", "a.db"));
  EXPECT_TRUE(same_file("sub/../a.db", dir_.file("a.db")));
  fs::create_hard_link("a.db", "hard.db");
  EXPECT_TRUE(same_file("hard.db", "a.db"));
  fs::create_symlink("a.db", "sym.db");
  EXPECT_TRUE(same_file("sym.db", "a.db"));
  EXPECT_FALSE(same_file("b.db", "a.db"));
  EXPECT_TRUE(same_file("./new.db", "new.db"));  // neither exists: the same path
  EXPECT_FALSE(same_file("new.db", "a.db"));
}

TEST_F(OutputPaths, InsideDirectory) {
  EXPECT_TRUE(inside_directory("sub/x/y.zts", "sub"));
  EXPECT_TRUE(inside_directory("./sub/x", "sub/"));
  EXPECT_TRUE(inside_directory("sub", "sub"));
  EXPECT_TRUE(inside_directory(dir_.file("sub/latest"), "sub"));
  EXPECT_FALSE(inside_directory("subway/x", "sub"));
  EXPECT_FALSE(inside_directory("a.db", "sub"));
  EXPECT_FALSE(inside_directory("out/model.safetensors", "sub"));
}

TEST_F(OutputPaths, CheckOutputPathSaysWhy) {
  EXPECT_TRUE(check_output_path("out.json", {"a.db"}).ok());
  EXPECT_TRUE(check_output_path("sub/out.json", {"a.db", "b.db"}).ok());
  EXPECT_EQ(check_output_path("a.db", {"a.db"}).message(), "a.db: the output is the input trace (choose another file)");
  EXPECT_EQ(check_output_path("./a.db", {"b.db", "a.db"}, "scenario").message(),
            "./a.db: the output is the input scenario a.db (choose another file)");
  EXPECT_EQ(check_output_path("nodir/x.json", {"a.db"}).message(), "nodir/x.json: directory nodir does not exist");
  EXPECT_EQ(check_output_path("a.db/x.json", {}).message(), "a.db/x.json: a.db is not a directory");
  EXPECT_EQ(check_output_path("sub", {}).message(), "sub: is a directory; name a file to write");
  EXPECT_FALSE(check_output_path("", {}).ok());
  EXPECT_TRUE(check_output_if_given("", {"a.db"}).ok());
  EXPECT_FALSE(check_output_if_given("a.db", {"a.db"}).ok());
}
