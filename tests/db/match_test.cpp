// One memory, two records: the trainer's allocator segments and CUPTI's records of the same
// cudaMalloc / cudaHostAlloc are paired when a trace is finished (db/src/match.h), counted
// once by the summary, the Chrome export and the checks, and what CUPTI saw outside the
// trainer's allocators stands out.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "../test_util.h"
#include "zt/db/export.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_writer.h"

using namespace zt::db;

namespace {

constexpr int64_t MiB = 1 << 20;

AllocationRow seg(int64_t id, int64_t rank, int64_t device, MemoryKind kind, uint64_t address, int64_t bytes,
                  int64_t t_alloc, std::optional<int64_t> t_free, Source source) {
  AllocationRow a;
  a.id = id, a.rank = rank, a.device_id = device, a.memory_kind = kind, a.level = AllocLevel::Segment;
  a.address = address, a.bytes = a.requested_bytes = bytes, a.t_alloc = t_alloc, a.t_free = t_free;
  a.source = source;
  return a;
}

struct Fixture {
  zt::test::TempDir dir;
  std::string path = dir.file("t.db");
  std::unique_ptr<TraceReader> reader;

  int64_t n(const std::string& sql) {
    QueryResult q;
    zt::Status s = reader->query(sql, &q);
    EXPECT_TRUE(s.ok()) << s.message();
    return q.rows.empty() || q.rows[0][0] == "NULL" ? -1 : std::stoll(q.rows[0][0]);
  }
};

// `zt train --device cuda --cupti` with two in-process ranks on GPU 0, in miniature.
void write_two_source_trace(const std::string& path) {
  std::unique_ptr<TraceWriter> w;
  ASSERT_TRUE(TraceWriter::create(path, &w).ok());
  w->begin();
  RunRow run;
  run.id = 1, run.command_line = "zt train --device cuda --cupti", run.t_start = 0;
  w->insert(run);
  RunRow other = run;
  other.id = 2, other.command_line = "zt train (another process, merged)";
  w->insert(other);
  w->insert(RankRow{0, 1, 2, 0, "h", 1});
  w->insert(RankRow{1, 1, 2, 1, "h", 1});
  w->insert(RankRow{2, 2, 1, 0, "h", 2});
  w->insert(DeviceRow{1, 0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
  w->insert(DeviceRow{2, 0, DeviceKind::Cuda, 0, "cuda:0", "NVIDIA H100 80GB HBM3 (cuda:0)", 80 * 1024 * MiB, false});
  w->insert(DeviceRow{3, 1, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
  w->insert(DeviceRow{4, 1, DeviceKind::Cuda, 1, "cuda:1", "NVIDIA H100 80GB HBM3 (cuda:0)", 80 * 1024 * MiB, false});
  // CUPTI's own rows for GPU 0 and the host, both rank 0: the same devices as 2 and 1.
  w->insert(DeviceRow{5, 0, DeviceKind::Cuda, 0, "cuda:0", "NVIDIA H100 80GB HBM3", 80 * 1024 * MiB, false});
  w->insert(DeviceRow{6, 0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
  // The other run's GPU (rank 2): not the same device as anything above.
  w->insert(DeviceRow{7, 2, DeviceKind::Cuda, 0, "cuda:0", "NVIDIA H100 80GB HBM3", 80 * 1024 * MiB, false});

  const auto dev = MemoryKind::Device, pin = MemoryKind::PinnedHost;
  // The trainer's segments (api).
  w->insert(seg(10, 0, 2, dev, 0x1000, 20 * MiB, 100, 500, Source::Api));         // A1
  w->insert(seg(11, 1, 4, dev, 0x9000000, 20 * MiB, 110, std::nullopt, Source::Api));  // A2, rank 1
  w->insert(seg(12, 0, 2, dev, 0x1000, 20 * MiB, 600, 900, Source::Api));         // A3: A1's address again
  w->insert(seg(13, 0, 1, pin, 0x5000, 4 * MiB, 120, std::nullopt, Source::Api));    // pinned
  w->insert(seg(14, 0, 2, dev, 0x7000000, 2 * MiB, 700, 800, Source::Api));       // CUPTI never saw it
  AllocationRow block;
  block.id = 15, block.rank = 0, block.device_id = 2, block.level = AllocLevel::Block, block.address = 0x1000;
  block.bytes = block.requested_bytes = 8 * MiB, block.t_alloc = 150, block.t_free = 400, block.segment_id = 10;
  w->insert(block);
  // CUPTI's records, all on its own devices 5 (GPU 0) and 6 (host), rank 0.
  w->insert(seg(20, 0, 5, dev, 0x1000, 20 * MiB, 101, 499, Source::Cupti));        // = A1
  w->insert(seg(21, 0, 5, dev, 0x1000, 20 * MiB, 601, 899, Source::Cupti));        // = A3, not A1
  w->insert(seg(22, 0, 5, dev, 0x9000000, 20 * MiB, 111, std::nullopt, Source::Cupti));  // = A2
  w->insert(seg(23, 0, 5, dev, 0x20000000, 32 * MiB, 105, std::nullopt, Source::Cupti));  // cuBLAS workspace
  w->insert(seg(24, 0, 6, pin, 0x5000, 4 * MiB, 119, std::nullopt, Source::Cupti));  // = the pinned one
  w->insert(seg(25, 0, 5, dev, 0x1000, 10 * MiB, 1000, 1100, Source::Cupti));      // other size: outside
  // The other run, same address as A2, overlapping: another process, so not A2's twin.
  w->insert(seg(26, 2, 7, dev, 0x9000000, 20 * MiB, 111, std::nullopt, Source::Cupti));
  KernelRow k{1, 0, 5, 0, 200, 300, 7, 55, "1,1,1", "32,1,1", Source::Cupti};
  w->insert(k);
  w->commit();
  zt::Status s = w->finish();
  ASSERT_TRUE(s.ok()) << s.message();
}

}  // namespace

TEST(DriverRecords, CuptiSegmentsArePairedWithTheTrainersOnceEach) {
  Fixture f;
  write_two_source_trace(f.path);
  ASSERT_TRUE(TraceReader::open(f.path, &f.reader).ok());
  auto twin = [&](int id) { return f.n("SELECT segment_id FROM allocation WHERE id = " + std::to_string(id)); };
  EXPECT_EQ(twin(20), 10);
  EXPECT_EQ(twin(21), 12);  // closest in time among the overlapping ones: the reuse, not A1
  EXPECT_EQ(twin(22), 11);
  EXPECT_EQ(twin(24), 13);
  EXPECT_EQ(twin(23), -1);  // the workspace: outside the trainer's allocators
  EXPECT_EQ(twin(25), -1);  // same address, other size
  EXPECT_EQ(twin(26), -1);  // another run
  EXPECT_EQ(twin(10), -1);  // the trainer's rows are never changed
  EXPECT_EQ(twin(15), 10);  // a block keeps its segment
  // A paired record takes its twin's rank and device: CUPTI knows the GPU, the trainer whose.
  EXPECT_EQ(f.n("SELECT rank * 100 + device_id FROM allocation WHERE id = 22"), 104);
  EXPECT_EQ(f.n("SELECT device_id FROM allocation WHERE id = 24"), 1);
  // CUPTI's duplicate devices are gone, their rows moved to the trainer's.
  EXPECT_EQ(f.n("SELECT count(*) FROM device"), 5);
  EXPECT_EQ(f.n("SELECT count(*) FROM device WHERE id IN (5, 6)"), 0);
  EXPECT_EQ(f.n("SELECT device_id FROM allocation WHERE id = 23"), 2);
  EXPECT_EQ(f.n("SELECT device_id FROM kernel"), 2);
  EXPECT_EQ(f.n("SELECT device_id FROM allocation WHERE id = 26"), 7);
}

TEST(DriverRecords, SummaryCountsEachMemoryOnceAndShowsWhatIsOutside) {
  Fixture f;
  write_two_source_trace(f.path);
  ASSERT_TRUE(TraceReader::open(f.path, &f.reader).ok());
  TraceSummary sum;
  ASSERT_TRUE(f.reader->summarize(&sum).ok());
  std::map<int64_t, DevicePeak> by_id;
  for (auto& d : sum.devices) by_id[d.device.id] = d;
  // GPU 0 as rank 0: A3 + the 2 MiB one + the workspace at 700..800 (twice as much if CUPTI's
  // twins counted too).
  EXPECT_EQ(by_id[2].peak_reserved, 54 * MiB);
  EXPECT_EQ(by_id[2].peak_allocated, 8 * MiB);
  EXPECT_EQ(by_id[2].reserved_at_end, 32 * MiB);  // segments only: the block was freed
  EXPECT_EQ(by_id[2].allocated_at_end, 0);
  EXPECT_EQ(by_id[4].peak_reserved, 20 * MiB);
  EXPECT_EQ(by_id[1].peak_reserved, 4 * MiB);
  ASSERT_TRUE(sum.driver.has_value());
  EXPECT_EQ(sum.driver->cupti_segments, 7);
  EXPECT_EQ(sum.driver->paired, 4);
  EXPECT_EQ(sum.driver->api_unpaired, 1);
  EXPECT_EQ(sum.driver->outside_count, 3);
  // Per device at the highest: GPU 0 (workspace + the 10 MiB one) and the other run's 20 MiB.
  EXPECT_EQ(sum.driver->outside_peak_bytes, (32 + 10 + 20) * MiB);
  EXPECT_EQ(sum.driver->outside_live_at_end, (32 + 20) * MiB);
}

TEST(DriverRecords, ChromeExportCountsTwinsOnce) {
  Fixture f;
  write_two_source_trace(f.path);
  std::string json = f.dir.file("t.json");
  ASSERT_TRUE(export_chrome(f.path, json).ok());
  std::ifstream in(json);
  auto doc = nlohmann::json::parse(in);
  int64_t reserved = 0;
  for (auto& e : doc["traceEvents"])
    if (e.value("ph", "") == "C" && e.value("name", "") == "memory cuda:0" && e["pid"] == 0)
      reserved = std::max<int64_t>(reserved, e["args"]["reserved"].get<int64_t>());
  EXPECT_EQ(reserved, 54 * MiB);
}

TEST(DriverRecords, TracesWithOneSourceAreLeftAlone) {
  Fixture f;
  {
    std::unique_ptr<TraceWriter> w;
    ASSERT_TRUE(TraceWriter::create(f.path, &w).ok());
    w->begin();
    RunRow run;
    run.id = 1;
    w->insert(run);
    w->insert(RankRow{0, 1, 1, 0, "h", 1});
    // Two trainings in one process into one trace: equal device rows, both the trainer's.
    w->insert(DeviceRow{1, 0, DeviceKind::Cuda, 0, "cuda:0", "sim", 1 << 30, true});
    w->insert(DeviceRow{2, 0, DeviceKind::Cuda, 0, "cuda:0", "sim", 1 << 30, true});
    w->insert(seg(10, 0, 1, MemoryKind::Device, 0x1000, MiB, 1, 2, Source::Api));
    w->insert(seg(11, 0, 2, MemoryKind::Device, 0x1000, MiB, 1, 2, Source::Api));
    w->commit();
    ASSERT_TRUE(w->finish().ok());
  }
  ASSERT_TRUE(TraceReader::open(f.path, &f.reader).ok());
  EXPECT_EQ(f.n("SELECT count(*) FROM device"), 2);
  EXPECT_EQ(f.n("SELECT count(*) FROM allocation WHERE segment_id IS NOT NULL"), 0);
  TraceSummary sum;
  ASSERT_TRUE(f.reader->summarize(&sum).ok());
  EXPECT_FALSE(sum.driver.has_value());
}

// zt db merge finishes the merged trace again: the pairs survive the renumbering (segment_id is
// offset with the ids) and nothing is paired twice.
TEST(DriverRecords, MergeKeepsThePairs) {
  Fixture f;
  write_two_source_trace(f.path);
  std::string merged = f.dir.file("m.db");
  ASSERT_TRUE(merge_traces(merged, {f.path}, false).ok());
  ASSERT_TRUE(TraceReader::open(merged, &f.reader).ok());
  EXPECT_EQ(f.n("SELECT count(*) FROM allocation c JOIN allocation a ON a.id = c.segment_id WHERE c.source = 1 AND "
                "c.level = 1 AND a.source = 0 AND a.address = c.address AND a.bytes = c.bytes"),
            4);
  TraceSummary sum;
  ASSERT_TRUE(f.reader->summarize(&sum).ok());
  ASSERT_TRUE(sum.driver.has_value());
  EXPECT_EQ(sum.driver->paired, 4);
  EXPECT_EQ(sum.driver->outside_count, 3);
}

namespace {
void write_rows(const std::string& path, const std::vector<DeviceRow>& devices, const std::vector<AllocationRow>& rows,
                const std::vector<KernelRow>& kernels = {}) {
  std::unique_ptr<TraceWriter> w;
  ASSERT_TRUE(TraceWriter::create(path, &w).ok());
  w->begin();
  RunRow run;
  run.id = 1;
  w->insert(run);
  w->insert(RankRow{3, 1, 8, 3, "h", 1});
  for (auto& d : devices) w->insert(d);
  for (auto& a : rows) w->insert(a);
  for (auto& k : kernels) w->insert(k);
  w->commit();
  zt::Status s = w->finish();
  ASSERT_TRUE(s.ok()) << s.message();
}
}  // namespace

// Under a launcher the trainer names rank 3's GPU "cuda:3", CUPTI by its visible ordinal "cuda:0":
// one CUDA device with the trainer's allocations and one without, on one rank, are one device.
TEST(DriverRecords, OneRanksGpuUnderTwoNamesIsOneDevice) {
  Fixture f;
  const auto dev = MemoryKind::Device;
  write_rows(f.path,
             {DeviceRow{1, 3, DeviceKind::Cuda, 3, "cuda:3", "H100 (cuda:0)", 80 * 1024 * MiB, false},
              DeviceRow{2, 3, DeviceKind::Cuda, 0, "cuda:0", "H100", 80 * 1024 * MiB, false}},
             {seg(10, 3, 1, dev, 0x1000, MiB, 10, 20, Source::Api), seg(11, 3, 2, dev, 0x1000, MiB, 11, 19, Source::Cupti),
              seg(12, 3, 2, dev, 0x9000, 4 * MiB, 11, std::nullopt, Source::Cupti)},
             {KernelRow{1, 3, 2, 0, 12, 13, 7, 1, "1,1,1", "1,1,1", Source::Cupti}});
  ASSERT_TRUE(TraceReader::open(f.path, &f.reader).ok());
  EXPECT_EQ(f.n("SELECT count(*) FROM device"), 1);
  EXPECT_EQ(f.n("SELECT device_id FROM kernel"), 1);
  EXPECT_EQ(f.n("SELECT device_id FROM allocation WHERE id = 12"), 1);  // outside memory, on the right GPU
  EXPECT_EQ(f.n("SELECT segment_id FROM allocation WHERE id = 11"), 10);
}

// A device row nothing refers to (zt train --cupti adds CUPTI's host device before knowing
// whether CUPTI starts) folds into its equal, in any trace; rows that are used never do.
TEST(DriverRecords, AnUnusedDuplicateDeviceFolds) {
  Fixture f;
  write_rows(f.path,
             {DeviceRow{1, 3, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false},
              DeviceRow{2, 3, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false},
              DeviceRow{3, 3, DeviceKind::Sim, 3, "cuda:3", "simulated GPU", MiB, true}},
             {seg(10, 3, 2, MemoryKind::PinnedHost, 0x1000, MiB, 10, 20, Source::Api)});
  ASSERT_TRUE(TraceReader::open(f.path, &f.reader).ok());
  EXPECT_EQ(f.n("SELECT group_concat(id, '') FROM device"), 23);
  EXPECT_EQ(f.n("SELECT device_id FROM allocation"), 2);
}

// An api segment that already has its second record takes no other (a trace finished twice).
TEST(DriverRecords, ASegmentHasOneSecondRecordAtMost) {
  Fixture f;
  const auto dev = MemoryKind::Device;
  AllocationRow paired = seg(11, 3, 1, dev, 0x1000, MiB, 11, 19, Source::Cupti);
  paired.segment_id = 10;
  write_rows(f.path, {DeviceRow{1, 3, DeviceKind::Cuda, 3, "cuda:3", "H100", 80 * 1024 * MiB, false}},
             {seg(10, 3, 1, dev, 0x1000, MiB, 10, 20, Source::Api), paired,
              seg(12, 3, 1, dev, 0x1000, MiB, 12, 18, Source::Cupti)});
  ASSERT_TRUE(TraceReader::open(f.path, &f.reader).ok());
  EXPECT_EQ(f.n("SELECT segment_id FROM allocation WHERE id = 11"), 10);
  EXPECT_EQ(f.n("SELECT segment_id FROM allocation WHERE id = 12"), -1);
}
