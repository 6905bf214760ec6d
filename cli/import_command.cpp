// zt import FILE -o trace.db: a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's pickle)
// or an Nsight Systems SQLite export (nsys export --type sqlite) as a trace. The file's first bytes
// say which it is; anything else is refused with one line, exit 2, and nothing is written at -o.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "output_paths.h"
#include "zt/common/files.h"
#include "zt/common/units.h"
#include "zt/db/nsys_import.h"
#include "zt/db/schema.h"
#include "zt/db/torch_snapshot.h"
#include "zt/db/trace_file.h"

namespace zt::cli {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A pickle of protocol 2 or later starts with PROTO (0x80). Protocols 0 and 1 (which PyTorch never
// writes) start with a container's opcode; they and any file named as a pickle go to the pickle
// reader too, so the one line says what in them is not read, not only that the file is foreign.
bool looks_like_a_pickle(const std::string& path, unsigned char first) {
  return first == 0x80 || first == '(' || first == '}' || first == ']' || first == ')' || ends_with(path, ".pickle") ||
         ends_with(path, ".pkl");
}

int run_import(const std::string& in, const std::string& out) {
  if (Status s = check_input_file(in, "file to import"); !s) return fail(s.message());
  if (Status s = check_output_path(out, {in}, "file"); !s) return fail(s.message());
  std::ifstream f(in, std::ios::binary);
  char head[16] = {};
  f.read(head, sizeof head);
  const std::streamsize got = f.gcount();
  if (got == 0) return fail(in + ": empty file (0 bytes): not a PyTorch memory snapshot or an Nsight Systems export");
  if (looks_like_a_pickle(in, static_cast<unsigned char>(head[0]))) {
    db::TorchImportStats st;
    if (Status s = db::import_torch_snapshot(in, out, &st); !s) return fail(s.message());
    std::cout << "imported a PyTorch memory snapshot into " << out << ": " << st.devices << " device"
              << (st.devices == 1 ? "" : "s") << ", " << st.events << " history entries, " << st.segments
              << " segments, " << st.blocks << " blocks (" << st.blocks_alive_at_end << " alive at the end";
    if (st.before_history) std::cout << ", " << st.before_history << " from before the history began";
    std::cout << ")";
    if (st.ooms) std::cout << ", " << st.ooms << " out-of-memory error" << (st.ooms == 1 ? "" : "s");
    std::cout << "\n";
    if (!st.has_history)
      std::cout << "note: the snapshot has no allocator history (recorded without _record_memory_history): the "
                   "trace holds its segments and blocks at one moment\n";
    if (st.size_mismatches)
      std::cout << "note: " << st.size_mismatches
                << " blocks alive at the end had another size in the snapshot than the replayed allocator gave; "
                   "the snapshot's sizes are kept\n";
    return kExitOk;
  }
  if (got >= 16 && std::string(head, 16) == std::string("SQLite format 3\0", 16)) {
    db::TraceFileInfo info;
    if (db::inspect_trace_file(in, &info) && info.application_id == db::kApplicationId)
      return fail(in + ": already a zerotrace trace (zt db info, zt view and zt check read it as it is)");
    db::NsysImportStats st;
    if (Status s = db::import_nsys_export(in, out, &st); !s) return fail(s.message());
    std::cout << "imported an Nsight Systems export into " << out << ": " << st.processes << " process"
              << (st.processes == 1 ? "" : "es") << ", " << st.devices << " GPU" << (st.devices == 1 ? "" : "s") << ", "
              << st.allocations << " allocations, " << st.transfers << " copies, " << st.kernels << " kernels, "
              << st.memsets << " memsets, " << st.ranges << " NVTX ranges, " << st.marks << " NVTX marks\n";
    if (st.frees_unmatched)
      std::cout << "note: " << st.frees_unmatched
                << " deallocations had no allocation in the capture (counted in the trace's dropped table)\n";
    if (st.allocations == 0)
      std::cout << "note: no memory events: nsys records them only with --cuda-memory-usage=true\n";
    return kExitOk;
  }
  if (ends_with(in, ".nsys-rep") || ends_with(in, ".qdrep"))
    return fail(in + ": an Nsight Systems report; export it first: nsys export --type sqlite " + in);
  return fail(in + ": neither a PyTorch memory snapshot (a pickle) nor an Nsight Systems SQLite export");
}

}  // namespace

void add_import_command(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand(
      "import",
      "Read a PyTorch memory snapshot or an Nsight Systems SQLite export into a trace\n"
      "Example: zt import snapshot.pickle -o before.db   (torch.cuda.memory._dump_snapshot's file)\n"
      "         zt import report.sqlite -o run.db        (nsys export --type sqlite report.nsys-rep)");
  auto in = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  sub->add_option("FILE", *in, "the snapshot (.pickle) or the export (.sqlite)")->required();
  sub->add_option("-o,--output", *out, "trace to write (an existing trace there is replaced)")->required();
  sub->callback([&action, in, out] { action = [in, out] { return run_import(*in, *out); }; });
}

}  // namespace zt::cli
