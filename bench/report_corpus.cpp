// report_corpus: issue 41's corpus of public reports (inject/scenarios/corpus.tsv), each replayed at
// full size (the report's own model and cluster, virtual mode) and small (real compute). One line per
// report: its verdict at full size, where the bug run failed, the fix run's outcome, the small
// variant's verdict, and each of the report's figures (expect.figures) predicted against reported
// with the relative error. The last line counts the reports reproduced and cured at full size (every
// check of the expectation held, mechanism and figures included, and the fix run completed) and the
// median of the figures' absolute relative errors over the figures the bug run predicted (the GPU's
// capacity, an input of the scenario, left out; a figure of a run that did not fail as expected is
// listed and counted as not predicted).
//   report_corpus [--no-small]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "bench_util.h"
#include "zt/common/units.h"
#include "zt/repro/corpus_manifest.h"
#include "zt/repro/runner.h"

using namespace zt;
namespace fs = std::filesystem;

namespace {

// Where the bug run failed, in words: setup, or the step and the innermost phases.
std::string where(const repro::Evidence& e) {
  if (!e.has_error) return "no error (" + std::to_string(e.steps_completed) + " steps)";
  std::string s = e.error_kind + " ";
  if (e.before_first_step) {
    s += "setup";
    if (!e.phases.empty()) s += " > " + e.phases.back();
    return s;
  }
  s += "step " + std::to_string(e.step.value_or(-1));
  const size_t n = e.phases.size();
  if (n) s += " " + e.phases[n > 1 ? n - 2 : 0] + (n > 1 ? " > " + e.phases[n - 1] : "");
  return s;
}

bool run(const std::string& file, repro::Variant v, const std::string& keep, repro::ReproResult* r,
         repro::Scenario* loaded = nullptr) {
  repro::Scenario local;
  repro::Scenario& s = loaded ? *loaded : local;
  Status st = repro::load_scenario(file, &s);
  if (st) {
    repro::RunOptions o;
    o.variant = v;
    o.keep_dir = keep;
    o.crash_handlers = false;
    st = repro::run_scenario(s, o, r);
  }
  if (!st) std::printf("  %s: %s\n", file.c_str(), st.message().c_str());
  return bool(st);
}

}  // namespace

int main(int argc, char** argv) {
  zt::bench::Options opt(argc, argv, "report_corpus [--no-small]");
  const bool small = !opt.flag("--no-small");
  opt.done();
  const fs::path scen = fs::path(__FILE__).parent_path().parent_path() / "inject" / "scenarios";
  const fs::path dir = fs::temp_directory_path() / ("zt_report_corpus_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string error;
  const std::vector<repro::CorpusEntry> corpus = repro::read_corpus((scen / "corpus.tsv").string(), &error);
  if (!error.empty()) {
    std::fprintf(stderr, "report_corpus: %s\n", error.c_str());
    return 2;
  }
  std::printf("report_corpus: %zu public reports (inject/scenarios/corpus.tsv), full size (virtual) and small\n",
              corpus.size());
  int ok = 0, differs = 0, unpredicted = 0;
  std::vector<double> errors;
  for (const repro::CorpusEntry& c : corpus) {
    const std::string file = (scen / (c.name + ".yaml")).string();
    repro::ReproResult full;
    repro::Scenario scenario;
    if (!run(file, repro::Variant::Full, (dir / (c.name + "-full")).string(), &full, &scenario)) continue;
    const std::string cure = repro::cure_word(full.cured);
    std::string line = full.verdict + (full.exit_code() == 0 ? "" : ", fix " + cure);
    if (full.exit_code() == 0) ++ok;
    if (full.verdict != c.full_verdict || cure != c.full_fix) {
      ++differs;
      line += "  (shipped as " + c.full_verdict + ", fix " + c.full_fix + "!)";
    }
    std::string small_word = "-";
    if (small) {
      repro::ReproResult s;
      if (run(file, repro::Variant::Small, (dir / (c.name + "-small")).string(), &s))
        small_word = s.verdict + (s.exit_code() == 0 ? "" : ", fix " + repro::cure_word(s.cured));
    }
    std::printf("%-52s %s | at %s | small: %s\n", c.name.c_str(), line.c_str(),
                where(full.bug.judgement.evidence).c_str(), small_word.c_str());
    // The report's figures: judged when the run failed with the expected error, else listed unpredicted.
    const std::vector<repro::FigureCheck>& judged = full.bug.judgement.figures;
    for (const repro::Figure& want : repro::expectation(scenario, repro::Variant::Full).figures) {
      const repro::FigureCheck* f = nullptr;
      for (auto& j : judged)
        if (j.name == want.name) f = &j;
      if (!f || !f->predicted) {
        ++unpredicted;
        std::printf("    %-18s reported %s, predicted: none (%s)\n", want.name.c_str(), format_bytes(want.bytes).c_str(),
                    f ? "not in the trace" : "the run did not fail with the expected error");
        continue;
      }
      const double rel = f->relative_error.value_or(0);
      // The GPU's capacity is the scenario's own input (cluster.gpu_memory), not a prediction.
      if (f->name != "capacity") errors.push_back(std::fabs(rel));
      std::printf("    %-18s predicted %s, reported %s: %+.1f%% (%s)\n", f->name.c_str(),
                  format_bytes(*f->predicted).c_str(), format_bytes(f->reported).c_str(), rel * 100,
                  f->depends_on.empty() ? ("tolerance " + std::to_string(int(f->tolerance * 100 + 0.5)) + "%").c_str()
                                        : ("not judged: depends on " + f->depends_on).c_str());
    }
    fs::remove_all(dir / (c.name + "-full"));
    fs::remove_all(dir / (c.name + "-small"));
  }
  fs::remove_all(dir);
  std::sort(errors.begin(), errors.end());
  double median = 0;
  if (!errors.empty())
    median = errors.size() % 2 ? errors[errors.size() / 2] : (errors[errors.size() / 2 - 1] + errors[errors.size() / 2]) / 2;
  if (differs) std::printf("%d verdicts differ from corpus.tsv\n", differs);
  std::printf("figures: %zu predicted (capacity, an input, left out of the median), %d not predicted\n", errors.size(),
              unpredicted);
  std::printf("%d of %zu reproduced and cured for their reason; median figure error %.1f%%\n", ok, corpus.size(),
              median * 100);
  return 0;
}
