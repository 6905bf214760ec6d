// zt/repro/corpus_manifest.h: issue 41's corpus manifest (inject/scenarios/corpus.tsv): one line per
// public report, its scenario's verdicts as shipped, tab-separated, '#' comments. Read by
// bench/report_corpus and by the tests that replay the corpus.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace zt::repro {

struct CorpusEntry {
  std::string name;
  std::string full_verdict, full_fix;    // at full size: REPRODUCED ..., CURED / NOT CURED / INCONCLUSIVE
  std::string small_verdict, small_fix;  // the small variant's
  std::string why;                       // what keeps it from reproducing, or "-"
  int line = 0;
};

// Empty with `error` set when the file cannot be read or a line lacks a field.
inline std::vector<CorpusEntry> read_corpus(const std::string& path, std::string* error) {
  std::vector<CorpusEntry> out;
  std::ifstream in(path);
  if (!in) {
    *error = path + ": cannot be read";
    return {};
  }
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, '\t');) f.push_back(x);
    if (f.size() != 6) {
      *error = path + ":" + std::to_string(n) + ": " + std::to_string(f.size()) + " fields, expected 6 separated by tabs";
      return {};
    }
    out.push_back({f[0], f[1], f[2], f[3], f[4], f[5], n});
  }
  return out;
}

}  // namespace zt::repro
