// Every command in README.md and docs/*.md runs, and the output a page shows is what it prints.
//
// How a page is read (one test case per page; its commands run in order, each in its own bash, in one
// scratch folder per page that links the checkout's examples/, inject/ and tests/; zt is on PATH):
// - A ```sh block: each command (a line, with its `\` continuations) must exit 0, or N where its
//   comment says `# exit N`.
// - A ```console block: `$ ` lines are commands, the lines under one are what it prints (stdout and
//   stderr). Each shown line must be one of its lines, in order; lines may be left out between them;
//   `...` in a shown line stands for any text.
// - `<!-- file: NAME -->` on the line before a block writes the block into the scratch folder as NAME.
// - `<!-- not run: WHY -->` on the line before a block: it is not run (a GPU, PyTorch, the user's own
//   program, a command that installs packages); WHY must be said.
// - Relative links ([text](path)) must name files that exist.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <iostream>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "../test_util.h"

namespace fs = std::filesystem;

namespace {

struct Block {
  std::string lang;     // sh, console, python, ...
  std::string marker;   // the HTML comment before it, without <!-- -->
  int line = 0;         // the fence's line number (1-based)
  std::vector<std::string> lines;
};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string rtrim(const std::string& s) {
  size_t e = s.find_last_not_of(" \t\r");
  return e == std::string::npos ? "" : s.substr(0, e + 1);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<Block> blocks_of(const std::vector<std::string>& page) {
  std::vector<Block> blocks;
  for (size_t i = 0; i < page.size(); ++i) {
    if (page[i].rfind("```", 0) != 0) continue;
    Block b;
    b.lang = trim(page[i].substr(3));
    b.line = int(i) + 1;
    if (i > 0) {
      const std::string prev = trim(page[i - 1]);
      if (prev.rfind("<!--", 0) == 0 && prev.size() >= 7 && prev.substr(prev.size() - 3) == "-->")
        b.marker = trim(prev.substr(4, prev.size() - 7));
    }
    for (++i; i < page.size() && page[i].rfind("```", 0) != 0; ++i) b.lines.push_back(page[i]);
    blocks.push_back(b);
  }
  return blocks;
}

// A shown line against a printed one: `...` stands for any text.
bool matches(const std::string& shown, const std::string& printed) {
  std::vector<std::string> pieces;
  for (size_t at = 0;;) {
    size_t dots = shown.find("...", at);
    pieces.push_back(shown.substr(at, dots == std::string::npos ? std::string::npos : dots - at));
    if (dots == std::string::npos) break;
    at = dots + 3;
  }
  if (pieces.size() == 1) return shown == printed;
  if (printed.rfind(pieces.front(), 0) != 0) return false;
  size_t pos = pieces.front().size();
  for (size_t k = 1; k + 1 < pieces.size(); ++k) {
    pos = printed.find(pieces[k], pos);
    if (pos == std::string::npos) return false;
    pos += pieces[k].size();
  }
  const std::string& last = pieces.back();
  return printed.size() >= pos + last.size() && printed.compare(printed.size() - last.size(), last.size(), last) == 0;
}

struct Command {
  std::string text;                // as bash reads it
  std::vector<std::string> shown;  // console: the lines shown under it
  int line = 0;
};

// `# exit N` in a command's comment: the exit code it must have (default 0).
int expected_exit(const std::string& command) {
  static const std::regex exit_re("#.*\\bexit ([0-9]+)");
  std::smatch m;
  return std::regex_search(command, m, exit_re) ? std::stoi(m[1]) : 0;
}

std::vector<Command> commands_of(const Block& b) {
  std::vector<Command> out;
  bool continued = false;
  for (size_t k = 0; k < b.lines.size(); ++k) {
    std::string l = b.lines[k];
    const int line = b.line + 1 + int(k);
    if (b.lang == "console") {
      if (continued) {
        out.back().text += "\n" + l;
      } else if (l.rfind("$ ", 0) == 0) {
        out.push_back({l.substr(2), {}, line});
      } else {
        if (!out.empty() && !trim(l).empty() && trim(l) != "...") out.back().shown.push_back(l);
        continue;
      }
    } else {
      if (continued) {
        out.back().text += "\n" + l;
      } else {
        if (trim(l).empty() || trim(l)[0] == '#') continue;
        out.push_back({l, {}, line});
      }
    }
    continued = !l.empty() && l.back() == '\\';
  }
  return out;
}

bool have(const std::string& program) { return std::system(("command -v " + program + " >/dev/null 2>&1").c_str()) == 0; }

std::vector<std::string> pages() {
  std::vector<std::string> out{"README.md"};
  std::vector<std::string> docs;
  for (const auto& e : fs::directory_iterator(std::string(ZT_SOURCE_DIR) + "/docs"))
    if (e.path().extension() == ".md") docs.push_back("docs/" + e.path().filename().string());
  std::sort(docs.begin(), docs.end());
  out.insert(out.end(), docs.begin(), docs.end());
  return out;
}

class DocsCommands : public ::testing::TestWithParam<std::string> {};

TEST_P(DocsCommands, EachCommandRunsAndPrintsWhatThePageShows) {
  const std::string page_path = GetParam();
  const std::string source = ZT_SOURCE_DIR;
  const std::vector<std::string> page = lines_of(zt::test::read_file(source + "/" + page_path));
  ASSERT_FALSE(page.empty()) << page_path;
  zt::test::TempDir dir;
  for (const char* link : {"examples", "inject", "tests"})
    fs::create_directory_symlink(source + "/" + link, dir.file(link));
  const std::string bin = fs::path(ZT_EXE).parent_path().string();
  int ran = 0;
  for (const Block& b : blocks_of(page)) {
    const std::string where = page_path + ":" + std::to_string(b.line);
    if (b.marker.rfind("not run", 0) == 0) {
      EXPECT_GT(trim(b.marker.substr(7)).size(), 2u) << where << ": say why the block is not run";
      continue;
    }
    if (b.marker.rfind("file:", 0) == 0) {
      std::ofstream f(dir.file(trim(b.marker.substr(5))));
      for (const auto& l : b.lines) f << l << "\n";
      continue;
    }
    if (b.lang != "sh" && b.lang != "console") continue;
    for (const Command& c : commands_of(b)) {
      const std::string at = page_path + ":" + std::to_string(c.line) + ": " + c.text;
      if (c.text.rfind("xvfb-run", 0) == 0 && !have("xvfb-run")) continue;
      {
        std::ofstream f(dir.file(".command.sh"));
        f << c.text << "\n";
      }
      const auto started = std::chrono::steady_clock::now();
      zt::test::CommandResult r = zt::test::run_command(
          "cd " + dir.path() + " && PATH=" + bin + ":$PATH COLUMNS=100 timeout 300 bash .command.sh 2>&1");
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (took > 10) std::cout << at << ": took " << took << " s (a page's example should take seconds)\n";
      ++ran;
      EXPECT_EQ(r.code, expected_exit(c.text)) << at << "\n" << r.out;
      const std::vector<std::string> printed = lines_of(r.out);
      size_t from = 0;
      for (const std::string& shown : c.shown) {
        size_t k = from;
        while (k < printed.size() && !matches(rtrim(shown), rtrim(printed[k]))) ++k;
        if (k == printed.size()) {
          ADD_FAILURE() << at << "\nthe page shows a line it does not print (or not in this order):\n  " << shown
                        << "\nit printed:\n" << r.out;
          break;
        }
        from = k + 1;
      }
    }
  }
  RecordProperty("commands", ran);
}

// A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens.
std::string anchor_of(const std::string& heading) {
  std::string a;
  for (unsigned char c : heading) {
    if (std::isalnum(c) || c == '-' || c == '_') a += char(std::tolower(c));
    else if (c == ' ') a += '-';
    else if (c >= 0x80) a += char(c);
  }
  return a;
}

// Relative links name files that exist, and their anchors headings of those files (web addresses are
// not checked).
TEST_P(DocsCommands, RelativeLinksNameFilesAndHeadingsThatExist) {
  const std::string page_path = GetParam();
  const std::string source = ZT_SOURCE_DIR;
  const std::string text = zt::test::read_file(source + "/" + page_path);
  static const std::regex link_re("\\]\\(([^)#\\s]*)(#[^)\\s]*)?\\)");
  const fs::path base = fs::path(source + "/" + page_path).parent_path();
  for (auto it = std::sregex_iterator(text.begin(), text.end(), link_re); it != std::sregex_iterator(); ++it) {
    const std::string target = (*it)[1], anchor = (*it)[2];
    if (target.find("://") != std::string::npos || target.rfind("mailto:", 0) == 0) continue;
    const fs::path file = target.empty() ? fs::path(source + "/" + page_path) : base / target;
    if (!fs::exists(file)) {
      ADD_FAILURE() << page_path << ": link to " << target << ", which does not exist";
      continue;
    }
    if (anchor.empty()) continue;
    bool found = false;
    bool in_code = false;
    for (const std::string& l : lines_of(zt::test::read_file(file.string()))) {
      if (l.rfind("```", 0) == 0) in_code = !in_code;
      if (in_code || l.rfind("#", 0) != 0) continue;
      if (anchor_of(trim(l.substr(l.find_first_not_of('#')))) == anchor.substr(1)) found = true;
    }
    EXPECT_TRUE(found) << page_path << ": link to " << target << anchor << ": no such heading there";
  }
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param.substr(0, info.param.size() - 3);  // README, docs_train, docs_db_top
  for (char& ch : n)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Pages, DocsCommands, ::testing::ValuesIn(pages()), test_name);

// The page format itself: `...` matching, the markers and the exit comment.
TEST(DocsFormat, ShownLinesMatchWithEllipses) {
  EXPECT_TRUE(matches("a ... c", "a b c"));
  EXPECT_TRUE(matches("step ...", "step 3 | loss 2.1"));
  EXPECT_TRUE(matches("... KiB", "12.00 KiB"));
  EXPECT_FALSE(matches("a ... c", "a b d"));
  EXPECT_FALSE(matches("abc", "abcd"));
  EXPECT_TRUE(matches("x...x", "xx"));
  EXPECT_FALSE(matches("x...x", "x"));
  EXPECT_EQ(expected_exit("zt check a.db --leaks   # exit 1: the leak"), 1);
  EXPECT_EQ(expected_exit("zt db info a.db"), 0);
  Block b = blocks_of({"<!-- not run: needs a GPU -->", "```sh", "zt train --device cuda", "```"})[0];
  EXPECT_EQ(b.marker, "not run: needs a GPU");
  Block c = blocks_of({"```console", "$ zt a \\", "  --b", "out 1", "...", "out 2", "$ zt c", "```"})[0];
  auto cs = commands_of(c);
  ASSERT_EQ(cs.size(), 2u);
  EXPECT_EQ(cs[0].text, "zt a \\\n  --b");
  EXPECT_EQ(cs[0].shown, (std::vector<std::string>{"out 1", "out 2"}));
  EXPECT_TRUE(cs[1].shown.empty());
  EXPECT_EQ(anchor_of("R4: DeepSeek-Coder-V2 236B on 48 GPUs, out of memory"), "r4-deepseek-coder-v2-236b-on-48-gpus-out-of-memory");
  EXPECT_EQ(anchor_of("PyTorch's allocator"), "pytorchs-allocator");
  EXPECT_EQ(anchor_of("The memory model (issue 33)"), "the-memory-model-issue-33");
  EXPECT_EQ(anchor_of("zt probe on `train.py`"), "zt-probe-on-trainpy");
}

}  // namespace
