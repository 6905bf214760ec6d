// fuzz_nsys: an Nsight Systems SQLite export from elsewhere (`zt import report.sqlite`), edited
// value by value as trace_mutator.h edits traces: is_nsys_export, then import_nsys_export into a
// trace, which a reader must then open with every value check; then that trace out as a PyTorch
// snapshot (`zt export --torch-snapshot`), which the snapshot reader must take back. The base export is the one the
// import tests use (tests/db/torch_fixtures.py nsys, written once by python3 at the first input).
// A bad export is one line and nothing at the output path; never a crash, a hang or an
// allocation sized by a value from the file.
#include <cstdlib>
#include <filesystem>

#include "trace_mutator.h"
#include "zt/db/nsys_import.h"
#include "zt/db/torch_snapshot.h"
#include "zt/db/trace_reader.h"

namespace {

const std::string& base_export() {
  static const std::string bytes = [] {
    const std::string path = zt::fuzz::scratch_dir() + "/nsys-base.sqlite";
    const std::string cmd = std::string(ZT_PYTHON3) + " " + ZT_SOURCE_DIR + "/tests/db/torch_fixtures.py nsys " + path;
    if (std::system(cmd.c_str()) != 0) std::abort();  // the target cannot run without its base
    std::string s = zt::fuzz::read_file(path);
    std::filesystem::remove(path);
    return s;
  }();
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zt;
  static const std::vector<fuzz::Table> tables = fuzz::tables_of(base_export());
  fuzz::Input in(data, size);
  const std::string dir = fuzz::scratch_dir();
  const std::string path = dir + "/export.sqlite", out = dir + "/imported.db";
  fuzz::write_mutated_db(in, path, base_export(), tables);
  std::filesystem::remove(out);
  fuzz::Quiet quiet;
  (void)db::is_nsys_export(path);
  db::NsysImportStats st;
  const Status s = db::import_nsys_export(path, out, &st);
  if (!s) {
    if (s.message().empty() || s.message().find('\n') != std::string::npos) std::abort();  // one line
    if (std::filesystem::exists(out)) std::abort();  // and nothing written
    return 0;
  }
  std::unique_ptr<db::TraceReader> r;
  if (!db::TraceReader::open(out, &r)) std::abort();  // what the import wrote, a reader takes
  r.reset();
  const std::string pickle = dir + "/exported.pickle";
  std::filesystem::remove(pickle);
  if (!db::export_torch_snapshot(out, pickle)) return 0;  // e.g. no device memory to export
  if (!db::check_torch_snapshot(fuzz::read_file(pickle))) std::abort();  // what zt exports, zt imports
  return 0;
}
