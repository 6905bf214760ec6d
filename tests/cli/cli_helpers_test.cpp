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

// Help text wrapped by the columns it takes: the first line starts at the indent, the later lines
// are indented; explicit line breaks and a paragraph's leading spaces (an aligned example) stay.
TEST(TextWidth, WrapsAtSpacesUnderAnIndent) {
  EXPECT_EQ(wrap_text("one two three four", 13, 4), "one two\n    three\n    four");
  EXPECT_EQ(wrap_text("one two three four", 100, 4), "one two three four");
  // A word wider than the room stays whole, alone on its line.
  EXPECT_EQ(wrap_text("a unbreakable-word b", 10, 2), "a\n  unbreakable-word\n  b");
  // Line breaks kept, each paragraph wrapped alone; an example keeps its own indent.
  EXPECT_EQ(wrap_text("Example: zt a\n         zt b c d", 16, 0), "Example: zt a\n         zt b c\n         d");
  EXPECT_EQ(wrap_text("x\n\ny", 10, 3), "x\n\n   y");
  // The spaces between two words on one line stay as written (a note set apart); a break drops them.
  EXPECT_EQ(wrap_text("zt demo   (a note)", 40, 0), "zt demo   (a note)");
  EXPECT_EQ(wrap_text("zt demo   (a note)", 11, 0), "zt demo\n(a note)");
  // Widths are columns: "µs" is two columns, three bytes.
  EXPECT_EQ(wrap_text("12 \xC2\xB5s 34", 7, 0), "12 \xC2\xB5s\n34");
  // No line is wider than the width unless it is one word.
  const std::string text = "the quick brown fox jumps over the lazy dog and keeps running far away";
  for (size_t w = 12; w < 40; ++w) {
    const std::string out = wrap_text(text, w, 5);
    bool first = true;
    for (size_t from = 0, nl; from <= out.size(); from = nl + 1, first = false) {
      nl = out.find('\n', from);
      if (nl == std::string::npos) nl = out.size();
      EXPECT_LE(display_width(out.substr(from, nl - from)) + (first ? 5 : 0), w) << out;
    }
  }
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
