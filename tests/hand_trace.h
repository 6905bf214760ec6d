// tests/hand_trace.h: a trace written row by row by a test (the reader's, the viewer's and the
// CLI's tests of what a trace says, without a run to make it).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "zt/db/trace_writer.h"

namespace zt::test {

// The writer of a new trace at `path`, begun, with its run row (`command`) and rank 0's row
// (null when the file cannot be created).
inline std::unique_ptr<db::TraceWriter> hand_written_trace(const std::string& path, const std::string& command) {
  std::unique_ptr<db::TraceWriter> w;
  if (!db::TraceWriter::create(path, &w).ok()) return nullptr;
  w->begin();
  db::RunRow run;
  run.id = 1, run.command_line = command, run.t_start = 0;
  w->insert(run);
  db::RankRow rank;
  rank.rank = 0, rank.run_id = 1, rank.world_size = 1, rank.local_rank = 0, rank.hostname = "h", rank.pid = 1;
  w->insert(rank);
  return w;
}

// A probed Python program that leaks, as `zt probe` records one (host allocations with stacks of
// native and Python frames) with epoch markers: 4 epochs of 100 ns on rank 0's cpu device. Each
// epoch `grow` keeps 4 MiB (/w/leak.py:12, called from train at line 20), `train` makes an 8 MiB
// temporary freed within the epoch (/w/leak.py:21), and a native function with no Python frame
// (make_table in /usr/lib/libtable.so, under malloc) made 2 MiB before epoch 0, kept.
inline bool write_python_leak_trace(const std::string& path) {
  auto w = hand_written_trace(path, "python3 /w/leak.py");
  if (!w) return false;
  constexpr int64_t MiB = 1 << 20;
  w->insert(db::DeviceRow{1, 0, db::DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
  w->insert(db::StringRow{1, "epoch"});
  // Frames: native ones symbolized, Python ones as the probe writes them (ip 0, file, function, line).
  w->insert(db::FrameRow{1, 0x7f0000001000, "/lib/x86_64-linux-gnu/libc.so.6", 0x1000, "malloc", std::nullopt});
  w->insert(db::FrameRow{2, 0x501000, "/usr/bin/python3", 0x101000, "PyByteArray_Resize", std::nullopt});
  w->insert(db::FrameRow{3, 0, "/w/leak.py", std::nullopt, "grow", 12});
  w->insert(db::FrameRow{4, 0, "/w/leak.py", std::nullopt, "train", 20});
  w->insert(db::FrameRow{5, 0, "/w/leak.py", std::nullopt, "train", 21});
  w->insert(db::FrameRow{6, 0, "/w/leak.py", std::nullopt, "<module>", 30});
  w->insert(db::FrameRow{7, 0x502000, "/usr/bin/python3", 0x102000, "Py_RunMain", std::nullopt});
  w->insert(db::FrameRow{8, 0x7f0000002000, "/usr/lib/libtable.so", 0x2000, "make_table", std::nullopt});
  // Stacks (a node names its innermost frame; parent = the caller's node).
  w->insert(db::StackRow{1, 0, 7});  // Py_RunMain
  w->insert(db::StackRow{2, 1, 6});  // <module>:30
  w->insert(db::StackRow{3, 2, 4});  // train:20
  w->insert(db::StackRow{4, 3, 3});  // grow:12
  w->insert(db::StackRow{5, 4, 2});  // PyByteArray_Resize      <- grow's allocations
  w->insert(db::StackRow{6, 2, 5});  // train:21
  w->insert(db::StackRow{7, 6, 2});  // PyByteArray_Resize      <- train's temporaries
  w->insert(db::StackRow{8, 0, 8});  // make_table
  w->insert(db::StackRow{9, 8, 1});  // malloc                  <- the native table
  int64_t id = 0;
  auto alloc = [&](int64_t bytes, int64_t t_alloc, std::optional<int64_t> t_free, int64_t stack) {
    db::AllocationRow a;
    a.id = ++id, a.rank = 0, a.device_id = 1, a.memory_kind = db::MemoryKind::PageableHost;
    a.level = db::AllocLevel::Segment, a.address = 0x10000000 + uint64_t(id) * 0x1000000;
    a.bytes = a.requested_bytes = bytes, a.t_alloc = t_alloc, a.t_free = t_free, a.stack_id = stack;
    a.source = db::Source::HostHook;
    w->insert(a);
  };
  alloc(2 * MiB, 5, std::nullopt, 9);
  for (int e = 0; e < 4; ++e) {
    const int64_t t0 = 10 + 100 * e;
    db::MarkerRow m;
    m.id = e + 1, m.rank = 0, m.kind = db::MarkerKind::Epoch, m.name_id = 1, m.t_start = t0, m.t_end = t0 + 90;
    m.epoch = e;
    w->insert(m);
    alloc(8 * MiB, t0 + 10, t0 + 30, 7);
    alloc(4 * MiB, t0 + 50, std::nullopt, 5);
  }
  w->set_run_end(1, 500, db::RunStatus::Ok, 0, "");
  w->commit();
  return w->finish().ok();
}

// A probed job's stacks through libraries: numpy's Python and compiled code, the standard library,
// frozen importlib, zerotrace's own package; sampled rows among them (allocation.weight_bytes). No
// epochs; nothing is freed. Sites: compute_loss (/w/hf_job.py:36) via numpy ones holds 2 sampled
// rows of 512 KiB standing for 0.75 MiB each; compute_loss (/w/hf_job.py:36) a sampled 64 KiB row
// standing for 512 KiB and an exact 64 KiB row, through two native paths; 2 MiB exact each at
// step (/w/job.py:9) via numpy PyArray_Empty, JSONEncoder.encode (json), epoch (zerotrace's, under exec()'d code).
inline bool write_library_trace(const std::string& path) {
  auto w = hand_written_trace(path, "python3 /w/hf_job.py");
  if (!w) return false;
  w->insert(db::DeviceRow{1, 0, db::DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
  const std::string np = "/usr/lib/python3/dist-packages/numpy/core/";
  w->insert(db::FrameRow{1, 0x7f0000001000, "/lib/x86_64-linux-gnu/libc.so.6", 0x1000, "malloc", std::nullopt});
  w->insert(db::FrameRow{2, 0x7f0000003000, np + "_multiarray_umath.cpython-311-x86_64-linux-gnu.so", 0x3000,
                     "PyArray_Empty", std::nullopt});
  w->insert(db::FrameRow{3, 0, np + "numeric.py", std::nullopt, "ones", 205});
  w->insert(db::FrameRow{4, 0, "/w/hf_job.py", std::nullopt, "compute_loss", 36});
  w->insert(db::FrameRow{5, 0, "/usr/lib/python3/dist-packages/transformers/trainer.py", std::nullopt, "Trainer.training_step", 3000});
  w->insert(db::FrameRow{6, 0, "/w/hf_job.py", std::nullopt, "<module>", 50});
  w->insert(db::FrameRow{7, 0, "/w/job.py", std::nullopt, "step", 9});
  w->insert(db::FrameRow{8, 0, "/usr/lib/python3.11/json/encoder.py", std::nullopt, "JSONEncoder.encode", 200});
  w->insert(db::FrameRow{9, 0, "<frozen importlib._bootstrap>", std::nullopt, "_load", 1});
  w->insert(db::FrameRow{10, 0, "/opt/zt/share/zerotrace/python/zerotrace/__init__.py", std::nullopt, "epoch", 40});
  w->insert(db::FrameRow{11, 0, "<string>", std::nullopt, "<module>", 1});
  w->insert(db::FrameRow{12, 0x501000, "/usr/bin/python3", 0x101000, "PyByteArray_Resize", std::nullopt});
  w->insert(db::FrameRow{13, 0x502000, "/usr/bin/python3", 0x102000, "PyBytes_FromStringAndSize", std::nullopt});
  // numpy's ones from the user's compute_loss, under the HF Trainer: 1 < 2 < 3 < 4 < 5 < 6.
  w->insert(db::StackRow{1, 0, 6}), w->insert(db::StackRow{2, 1, 5}), w->insert(db::StackRow{3, 2, 4});
  w->insert(db::StackRow{4, 3, 3}), w->insert(db::StackRow{5, 4, 2}), w->insert(db::StackRow{6, 5, 1});
  // The same line through a different native path (bytearray): the same user line, no library call.
  w->insert(db::StackRow{7, 3, 12}), w->insert(db::StackRow{8, 7, 1});
  w->insert(db::StackRow{18, 3, 13}), w->insert(db::StackRow{19, 18, 1});  // another native path, same line
  // numpy's compiled code called straight from the user's step.
  w->insert(db::StackRow{9, 0, 7}), w->insert(db::StackRow{10, 9, 2}), w->insert(db::StackRow{11, 10, 1});
  // Only library code: json under frozen importlib.
  w->insert(db::StackRow{12, 0, 9}), w->insert(db::StackRow{13, 12, 8}), w->insert(db::StackRow{14, 13, 1});
  // zerotrace's package from exec()'d code.
  w->insert(db::StackRow{15, 0, 11}), w->insert(db::StackRow{16, 15, 10}), w->insert(db::StackRow{17, 16, 1});
  constexpr int64_t MiB = 1 << 20;
  int64_t id = 0;
  auto alloc = [&](int64_t bytes, std::optional<int64_t> weight, int64_t stack) {
    db::AllocationRow a;
    a.id = ++id, a.rank = 0, a.device_id = 1, a.memory_kind = db::MemoryKind::PageableHost;
    a.level = db::AllocLevel::Segment, a.address = 0x10000000 + uint64_t(id) * 0x100000;
    a.bytes = a.requested_bytes = bytes, a.t_alloc = 10 + id, a.stack_id = stack;
    a.source = db::Source::HostHook, a.weight_bytes = weight;
    w->insert(a);
  };
  alloc(MiB / 2, 3 * MiB / 4, 6);  // two sampled 512 KiB arrays at compute_loss, via numpy
  alloc(MiB / 2, 3 * MiB / 4, 6);
  alloc(64 << 10, 512 << 10, 8);   // a sampled bytearray at the same line
  alloc(64 << 10, std::nullopt, 19);  // and one recorded one by one, through other native frames
  alloc(2 * MiB, std::nullopt, 11);
  alloc(2 * MiB, std::nullopt, 14);
  alloc(2 * MiB, std::nullopt, 17);
  w->set_run_end(1, 1000, db::RunStatus::Ok, 0, "");
  w->commit();
  return w->finish().ok();
}

}  // namespace zt::test
