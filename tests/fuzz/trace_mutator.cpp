#include "trace_mutator.h"

#include <limits>
#include <map>
#include <vector>

#include "zt/db/trace_reader.h"
#include "zt/db/trace_writer.h"

namespace zt::fuzz {
namespace {

using namespace zt::db;

void write_base(const std::string& path) {
  std::unique_ptr<TraceWriter> w;
  if (!TraceWriter::create(path, &w)) std::abort();
  constexpr int64_t kMs = 1'000'000, kT0 = 1'000 * kMs, kMiB = 1 << 20;
  std::map<std::string, int64_t> ids;
  auto str = [&](const std::string& t) {
    auto [it, fresh] = ids.emplace(t, int64_t(ids.size()) + 1);
    if (fresh) w->insert(StringRow{it->second, t});
    return it->second;
  };
  w->begin();
  RunRow run;
  run.tool_version = "fuzz";
  run.command_line = "zt train --world-size 2";
  run.config_json = R"({"world_size":2,"zero_optimization":{"stage":3,"offload_optimizer":true}})";
  run.t_start = kT0 - 10 * kMs;
  run.t_end = kT0 + 500 * kMs;
  run.status = RunStatus::Ok;
  run.exit_code = 0;
  w->insert(run);
  int64_t alloc_id = 0, xfer_id = 0, marker_id = 0, id = 0;
  for (int r = 0; r < 2; ++r) {
    w->insert(RankRow{r, 1, 2, r, "host", 100 + r});
    const int64_t gpu = 1 + 2 * r, cpu = 2 + 2 * r;
    w->insert(DeviceRow{gpu, r, DeviceKind::Sim, r, "cuda:" + std::to_string(r), "simulated GPU", 64 * kMiB, true});
    w->insert(DeviceRow{cpu, r, DeviceKind::Cpu, 0, "cpu", "host", std::nullopt, false});
    for (int e = 0; e < 2; ++e) {
      const int64_t e0 = kT0 + e * 200 * kMs;
      MarkerRow em;
      em.id = ++marker_id, em.rank = r, em.kind = MarkerKind::Epoch, em.name_id = str("epoch " + std::to_string(e));
      em.t_start = e0, em.t_end = e0 + 200 * kMs, em.epoch = e;
      w->insert(em);
      for (int s = 0; s < 2; ++s) {
        const int step = 2 * e + s;
        const int64_t t = e0 + s * 100 * kMs;
        MarkerRow m;
        m.id = ++marker_id, m.rank = r, m.kind = MarkerKind::Step, m.name_id = str("step " + std::to_string(step));
        m.t_start = t, m.t_end = t + 100 * kMs, m.step = step, m.epoch = e;
        w->insert(m);
        for (const char* phase : {"forward", "backward", "optimizer"}) {
          MarkerRow p = m;
          p.id = ++marker_id, p.kind = MarkerKind::Phase, p.name_id = str(phase);
          p.t_start = t + 5 * kMs, p.t_end = t + 30 * kMs, p.micro_step = 0;
          w->insert(p);
        }
        AllocationRow seg;
        seg.id = ++alloc_id, seg.rank = r, seg.device_id = gpu, seg.memory_kind = MemoryKind::Device;
        seg.level = AllocLevel::Segment, seg.address = 0x7000000 + uint64_t(seg.id) * 0x100000;
        seg.bytes = seg.requested_bytes = 8 * kMiB, seg.t_alloc = t + kMs, seg.t_free = t + 90 * kMs;
        seg.name_id = str("segment"), seg.stack_id = 2;
        w->insert(seg);
        AllocationRow blk = seg;
        blk.id = ++alloc_id, blk.level = AllocLevel::Block, blk.bytes = blk.requested_bytes = 2 * kMiB;
        blk.t_alloc = t + 2 * kMs, blk.t_free = t + 50 * kMs, blk.name_id = str("block" + std::to_string(s) + ".gathered");
        blk.segment_id = seg.id;
        w->insert(blk);
        AllocationRow host = seg;
        host.id = ++alloc_id, host.device_id = cpu, host.memory_kind = MemoryKind::PinnedHost;
        host.bytes = host.requested_bytes = kMiB, host.t_alloc = t + 3 * kMs, host.t_free = std::nullopt;
        host.name_id = str("offload.buffer[epoch " + std::to_string(e) + "]");
        w->insert(host);
        int k = 0;
        for (TransferKind kind : {TransferKind::H2D, TransferKind::D2H, TransferKind::Collective, TransferKind::D2D}) {
          TransferRow x;
          x.id = ++xfer_id, x.rank = r, x.kind = kind, x.bytes = kMiB << k, x.src_device_id = cpu, x.dst_device_id = gpu;
          x.pinned = true, x.t_start = t + (10 + k) * kMs, x.t_end = t + (12 + k) * kMs;
          x.name_id = str("block" + std::to_string(k) + ".shard");
          if (kind == TransferKind::Collective) x.op_id = str("all_gather"), x.participants = 2;
          w->insert(x);
          ++k;
        }
        KernelRow kr;
        kr.id = ++id, kr.rank = r, kr.device_id = gpu, kr.name_id = str("block_forward");
        kr.t_start = t + 6 * kMs, kr.t_end = t + 20 * kMs, kr.stream = 7, kr.source = Source::Api;
        w->insert(kr);
        PlacementRow pl;
        pl.id = id, pl.rank = r, pl.t = t + 4 * kMs, pl.tensor_id = str("block0.grad[shard]");
        pl.device_id = step == 3 ? gpu : cpu, pl.why = PlacementWhy::Created, pl.bytes = kMiB, pl.allocation_id = host.id;
        w->insert(pl);
        // The aggregates (schema version 3): the step's memory per device.
        for (int64_t dev : {gpu, cpu}) {
          StepMemoryRow sm;
          sm.rank = r, sm.device_id = dev, sm.step = step, sm.epoch = e, sm.t_start = t, sm.t_end = t + 100 * kMs;
          sm.allocated_bytes = dev == gpu ? 0 : kMiB * (step + 1), sm.reserved_bytes = dev == gpu ? 0 : sm.allocated_bytes;
          sm.peak_allocated_bytes = dev == gpu ? 2 * kMiB : sm.allocated_bytes, sm.peak_reserved_bytes = 8 * kMiB;
          sm.host_rss_bytes = 100 * kMiB;
          w->insert(sm);
        }
        for (const char* c : {"allocated", "reserved", "host_rss", "data.steps_planned"}) {
          CounterRow cr;
          cr.id = ++id, cr.rank = r, cr.device_id = gpu, cr.name_id = str(c), cr.t = t + 40 * kMs;
          cr.value = double(4 * kMiB * (step + 1));
          w->insert(cr);
        }
      }
    }
  }
  // The live sets at each epoch's start and end (the leaked offload buffers, one more each epoch),
  // and a detail span that ends inside epoch 1: zt check --leaks reads the aggregates.
  for (int r = 0; r < 2; ++r)
    for (int e = 0; e < 2; ++e)
      for (int at : {0, 1}) {
        EpochLiveRow l;
        l.rank = r, l.epoch = e, l.at = at, l.t = kT0 + e * 200 * kMs + at * 200 * kMs, l.device_id = 2 + 2 * r;
        l.memory_kind = MemoryKind::PinnedHost, l.level = AllocLevel::Segment, l.name_id = str("offload.buffer[epoch 0]");
        l.stack_id = 2, l.bytes = kMiB * (2 * e + at + 1), l.allocations = 2 * e + at + 1;
        w->insert(l);
      }
  DetailSpanRow span;
  span.rank = 0, span.t_start = kT0 - 10 * kMs, span.t_end = kT0 + 250 * kMs, span.end_reason = "the trace reached its size cap";
  w->insert(span);
  // Detail windows (zt/probe/detail_policy.h) and the flight recorder's stretch at the end, and its
  // state in meta: the readers of several stretches (zt db info's list, the steps with detail).
  DetailSpanRow window;
  window.rank = 1, window.t_start = kT0 + 100 * kMs, window.t_end = kT0 + 200 * kMs;
  window.end_reason = "the detail window every:2 closed";
  w->insert(window);
  DetailSpanRow ring;
  ring.rank = 0, ring.t_start = kT0 + 300 * kMs, ring.t_end = kT0 + 400 * kMs;
  ring.end_reason = "flight recorder: the last 2 steps before the end (steps 2-3), written at the crash handler";
  w->insert(ring);
  w->set_meta("flight_recorder", "in memory, not written (steps 2-3, 10 events, 1.02 KiB)");
  w->insert(FrameRow{1, 0x401000, "/usr/bin/python3", 0x1000, "main"});
  w->insert(FrameRow{2, 0x402000, "/usr/bin/python3", 0x2000, "alloc_buffer"});
  w->insert(StackRow{1, 0, 1});
  w->insert(StackRow{2, 1, 2});
  FaultRow f;
  f.id = 1, f.rank = 0, f.t = kT0 + 150 * kMs, f.name = "wrong_device_grad", f.trigger = "step 1", f.step = 1;
  f.details = "left block2's gradient partition on cuda:0";
  w->insert(f);
  ErrorRow er;
  er.id = 1, er.rank = 1, er.t = kT0 + 160 * kMs, er.step = 1, er.kind = "device_mismatch", er.site = "unscale_and_clip_grads";
  er.message = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!";
  er.tensors = R"(["block0.grad[shard]@cuda:1"])", er.device_id = 3;
  w->insert(er);
  DroppedRow d;
  d.id = 1, d.rank = 0, d.thread = 3, d.t = kT0 + 300 * kMs, d.events = 5, d.reason = "ring buffer full";
  w->insert(d);
  w->commit();
  if (!w->finish()) std::abort();
}

std::vector<Table> read_tables(sqlite3* db, const std::vector<std::string>& names) {
  std::vector<Table> out;
  for (const auto& name : names) {
    Table tb{name, {}};
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db, ("PRAGMA table_info(\"" + name + "\")").c_str(), -1, &st, nullptr);
    while (sqlite3_step(st) == SQLITE_ROW) tb.columns.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(st, 1)));
    sqlite3_finalize(st);
    if (!tb.columns.empty()) out.push_back(std::move(tb));
  }
  return out;
}

// Integers near the edges the readers care about.
int64_t edge(uint8_t b) {
  static const int64_t v[] = {0, 1, -1, 2, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                              (int64_t(1) << 31) - 1, int64_t(1) << 31, -(int64_t(1) << 31), int64_t(1) << 32,
                              (int64_t(1) << 53), (int64_t(1) << 53) + 1, int64_t(1) << 62, (int64_t(1) << 62) + 1,
                              (int64_t(1) << 20) - 1, int64_t(1) << 20, 255, 256, 65535, 4000000000000LL};
  return v[b % (sizeof v / sizeof v[0])];
}

void bind_value(sqlite3_stmt* st, int i, Input& in) {
  switch (in.byte() % 8) {
    case 0: sqlite3_bind_int64(st, i, int8_t(in.byte())); break;
    case 1: sqlite3_bind_int64(st, i, int64_t(in.u64())); break;
    case 2: sqlite3_bind_int64(st, i, edge(in.byte())); break;
    case 3: {
      uint64_t bits = in.u64();
      double d;
      std::memcpy(&d, &bits, sizeof d);
      sqlite3_bind_double(st, i, d);
      break;
    }
    case 4: {
      const std::string s = in.text(24);
      sqlite3_bind_text(st, i, s.data(), int(s.size()), SQLITE_TRANSIENT);
      break;
    }
    case 5: sqlite3_bind_null(st, i); break;
    case 6: {
      const std::string s = in.text(16);
      sqlite3_bind_blob(st, i, s.data(), int(s.size()), SQLITE_TRANSIENT);
      break;
    }
    default: {  // wraps
      const uint8_t small = in.byte(), near = in.byte();  // two statements' worth: see fuzz_input.h
      sqlite3_bind_int64(st, i, int64_t(uint64_t(small) + uint64_t(edge(near))));
      break;
    }
  }
}

void run(sqlite3* db, const std::string& sql, Input* in = nullptr, int64_t rowid = 0) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) return;
  int p = 1;
  if (in && sqlite3_bind_parameter_count(st) >= 2) bind_value(st, p++, *in);
  if (sqlite3_bind_parameter_count(st) >= p) sqlite3_bind_int64(st, p, rowid);
  sqlite3_step(st);  // a constraint may refuse it: the file keeps what it had
  sqlite3_finalize(st);
}

int64_t pick_row(sqlite3* db, const std::string& table, uint8_t b) {
  sqlite3_stmt* st = nullptr;
  int64_t rowid = 0;
  const std::string sql = "SELECT rowid FROM " + table + " LIMIT 1 OFFSET (" + std::to_string(b) +
                          " % max(1, (SELECT count(*) FROM " + table + ")))";
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    rowid = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return rowid;
}

}  // namespace

const std::string& base_trace() {
  static const std::string bytes = [] {
    const std::string path = scratch_dir() + "/base.db";
    write_base(path);
    std::string s = read_file(path);
    std::filesystem::remove(path);
    return s;
  }();
  return bytes;
}

std::vector<Table> tables_of(const std::string& db_bytes, std::vector<std::string> names) {
  const std::string path = scratch_dir() + "/tables.db";
  write_file(path, db_bytes);
  sqlite3* db = nullptr;
  std::vector<Table> out;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    if (names.empty()) {
      sqlite3_stmt* st = nullptr;
      sqlite3_prepare_v2(db, "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name", -1, &st, nullptr);
      while (sqlite3_step(st) == SQLITE_ROW) names.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
      sqlite3_finalize(st);
    }
    out = read_tables(db, names);
  }
  sqlite3_close(db);
  std::filesystem::remove(path);
  if (out.empty()) std::abort();  // a base without tables: the target is broken, not the input
  return out;
}

void write_mutated_trace(Input& in, const std::string& path) {
  static const std::vector<Table> tables = [] {
    std::vector<std::string> names = TraceReader::table_names();
    for (auto& t : TraceReader::aggregate_table_names()) names.push_back(t);
    return tables_of(base_trace(), names);
  }();
  write_mutated_db(in, path, base_trace(), tables);
}

void write_mutated_db(Input& in, const std::string& path, const std::string& base, const std::vector<Table>& ts) {
  for (const char* suffix : {"-wal", "-shm", "-journal"}) std::filesystem::remove(path + suffix);
  write_file(path, base);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return;
  }
  sqlite3_exec(db, "PRAGMA journal_mode=MEMORY; BEGIN;", nullptr, nullptr, nullptr);
  std::vector<std::pair<size_t, uint8_t>> flips;
  for (int ops = 0; !in.empty() && ops < 64; ++ops) {
    const uint8_t op = in.byte();
    const Table& t = ts[in.byte() % ts.size()];
    const std::string name = "\"" + t.name + "\"";
    const int64_t row = pick_row(db, name, in.byte());
    switch (op % 8) {
      case 0:
      case 1:
      case 2:
      case 3: {  // a value
        const std::string& c = t.columns[in.byte() % t.columns.size()];
        run(db, "UPDATE " + name + " SET \"" + c + "\" = ?1 WHERE rowid = ?2", &in, row);
        break;
      }
      case 4:
      case 5: {  // a row copied (a new id where the first column is one), then edited by the next ops
        std::string cols;
        for (size_t i = 1; i < t.columns.size(); ++i) cols += (cols.empty() ? "\"" : ",\"") + t.columns[i] + "\"";
        if (t.columns.size() == 1) cols = "\"" + t.columns[0] + "\"";
        run(db, "INSERT INTO " + name + "(" + cols + ") SELECT " + cols + " FROM " + name + " WHERE rowid = ?1",
            nullptr, row);
        break;
      }
      case 6: run(db, "DELETE FROM " + name + " WHERE rowid = ?1", nullptr, row); break;
      default: {
        const size_t at = size_t(in.u64());
        const uint8_t x = in.byte();
        flips.emplace_back(at, x);
        break;
      }
    }
  }
  sqlite3_exec(db, "COMMIT;", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  if (!flips.empty()) {  // bytes of the file itself: SQLite's own checks meet them
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(0, std::ios::end);
    const auto size = size_t(f.tellg());
    for (auto [at, x] : flips) {
      char c;
      f.seekg(std::streamoff(at % size));
      f.get(c);
      f.seekp(std::streamoff(at % size));
      f.put(char(c ^ (x ? x : 1)));
    }
  }
}

}  // namespace zt::fuzz
