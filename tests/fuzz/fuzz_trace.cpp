// fuzz_trace: every reader of a trace but the viewer (fuzz_viewer_model has it), on hostile
// traces (trace_mutator.h): TraceReader::open and its typed reads, the summary, `zt db info`,
// `zt db kernels`, `zt check` with every check, the Chrome export and `zt db merge`. Each must
// refuse a bad file with one line or read it; never crash, hang or grow without bound.
#include <filesystem>

#include "commands.h"
#include "trace_mutator.h"
#include "zt/check/check.h"
#include "zt/db/export.h"
#include "zt/db/kernel_summary.h"
#include "zt/db/trace_reader.h"

namespace zt::cli {
// main.cpp's, which this target does not link.
int fail(const std::string& message) {
  std::cerr << "zt: " << message << "\n";
  return 2;
}
}  // namespace zt::cli

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zt;
  fuzz::Input in(data, size);
  // Which reader: one an input, so an input costs one command's time (a million of them run).
  const uint8_t reader = in.byte() % 7;
  const std::string dir = fuzz::scratch_dir();
  const std::string path = dir + "/trace.db";
  fuzz::write_mutated_trace(in, path);
  fuzz::Quiet quiet;
  switch (reader) {
    case 0: {
      std::unique_ptr<db::TraceReader> r;
      if (!db::TraceReader::open(path, &r)) break;
      db::TraceSummary sum;
      (void)r->summarize(&sum);
      std::vector<db::AllocationRow> a;
      (void)r->read(&a);
      std::vector<db::MarkerRow> m;
      (void)r->read(&m);
      std::vector<db::TransferRow> t;
      (void)r->read(&t);
      std::vector<db::KernelRow> k;
      (void)r->read(&k);
      std::vector<db::PlacementRow> p;
      (void)r->read(&p);
      std::vector<db::CounterRow> c;
      (void)r->read(&c);
      std::vector<db::StepMemoryRow> sm;
      (void)r->read(&sm);
      std::vector<db::EpochLiveRow> el;
      (void)r->read(&el);
      std::vector<db::DetailSpanRow> ds;
      (void)r->read(&ds);
      std::vector<std::string> lines;
      for (int64_t id : {int64_t(1), int64_t(2), int64_t(3)}) (void)r->stack_text(id, &lines);
      break;
    }
    case 1: cli::db_info(path); break;
    case 2: {
      db::KernelSummaryOptions ko;
      cli::db_kernels(path, ko, 20);
      ko.first_step = 1, ko.last_step = 2, ko.rank = 1;
      cli::db_kernels(path, ko, 3);
      break;
    }
    case 3: {
      check::Options co;
      check::Report report;
      if (check::run_checks(path, co, &report)) (void)check::format_text(report), (void)check::junit_xml(report);
      co.budget = check::Budget{int64_t(1) << 30, int64_t(1) << 30};
      co.expected_steps = 3;
      co.leaks = co.placement = co.run = true;
      co.leak_threshold = 1;
      (void)check::run_checks(path, co, &report);
      break;
    }
    case 4: (void)db::export_chrome(path, dir + "/trace.json"); break;
    case 5: (void)db::merge_traces(dir + "/merged.db", {path}, true); break;
    default:
      // `zt db sql` reads a trace without the checks: its limits hold whatever the values.
      cli::db_sql(path, "SELECT * FROM allocation_v", true, 1000, 5);
      cli::db_sql(path, "SELECT m.name, count(*) FROM marker_v m JOIN transfer_v t ON t.rank = m.rank GROUP BY 1", false, 1000, 5);
      break;
  }
  return 0;
}
