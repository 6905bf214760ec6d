// Issue 41's corpus manifest (inject/scenarios/corpus.tsv), read the same way by the tests that
// replay it: one line per public report, its scenario's verdicts as shipped.
#pragma once

#include <string>
#include <vector>

#include "zt/repro/corpus_manifest.h"

namespace zt::test {

using repro::CorpusEntry;
using repro::read_corpus;

inline std::string corpus_path() { return std::string(ZT_SOURCE_DIR) + "/inject/scenarios/corpus.tsv"; }

inline std::vector<std::string> corpus_names() {
  std::string error;
  std::vector<std::string> names;
  for (auto& e : read_corpus(corpus_path(), &error)) names.push_back(e.name);
  return names;
}

}  // namespace zt::test
