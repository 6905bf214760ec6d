// What the allocators write through the probe, read back with TraceReader and SQL:
// segments and blocks kept apart, every block inside the segment it names and within its
// lifetime, names interned, counters, and the OOM as an error row with the exact text.
#include <gtest/gtest.h>

#include "../../test_util.h"
#include "zt/db/trace_reader.h"
#include "zt/memory/device_allocator.h"
#include "zt/memory/host_allocator.h"
#include "zt/probe/recorder.h"

using namespace zt::memory;
using namespace zt::probe;
using zt::db::QueryResult;
using zt::db::TraceReader;

namespace {
constexpr size_t MiB = 1024 * 1024, GiB = 1024 * MiB;

std::vector<std::vector<std::string>> rows(TraceReader& r, const std::string& sql) {
  QueryResult q;
  zt::Status s = r.query(sql, &q);
  EXPECT_TRUE(s.ok()) << s.message() << "\n" << sql;
  return q.rows;
}
std::string scalar(TraceReader& r, const std::string& sql) {
  auto v = rows(r, sql);
  return v.empty() || v[0].empty() ? "" : v[0][0];
}
}  // namespace

TEST(MemoryTrace, SegmentsAndBlocksAreKeptApart) {
  zt::test::TempDir dir;
  const std::string path = dir.file("mem.db");
  std::string oom_text;
  {
    RecorderOptions ro;
    ro.path = path;
    ro.command_line = "memory_trace_test";
    ro.crash_handlers = false;
    std::unique_ptr<Recorder> rec;
    ASSERT_TRUE(Recorder::open(ro, &rec).ok());
    rec->add_rank(0, 1);
    DeviceId gpu = rec->add_device(0, DeviceKind::Sim, 0, "cuda:0", "simulated GPU", int64_t(1) << 30, true);
    DeviceId cpu = rec->add_device(0, DeviceKind::Cpu, 0, "cpu", "host", std::nullopt, false);

    VirtualSource src(1 * GiB);
    DeviceAllocatorOptions o;
    o.recorder = rec.get();
    o.device = gpu;
    {
      DeviceAllocator a(&src, o);
      DeviceBlock b1 = a.allocate(4096, "block3.gathered");        // small segment S1
      DeviceBlock b2 = a.allocate(8192, "block3.grad");            // same segment
      DeviceBlock b3 = a.allocate(64 * MiB, "block4.gathered");    // large segment S2
      a.free(b1);
      a.free(b3);
      EXPECT_EQ(a.empty_cache(), 64 * MiB);                        // S2 goes back
      try {
        a.allocate(2 * GiB, "lm_head.gathered");
      } catch (const OutOfMemoryError& e) {
        oom_text = e.what();
      }
      a.free(b2);
      // S1 stays cached until the allocator goes: its free is recorded then.
    }
    HostAllocatorOptions ho;
    ho.recorder = rec.get();
    ho.device = cpu;
    ho.backing = HostBacking::Virtual;
    {
      PinnedHostAllocator pinned(ho);
      HostBlock p = pinned.allocate(3 * MiB, "offload.param_buffer");  // 4 MiB region
      pinned.free(p);
      HostBlock q = pinned.allocate(4 * MiB, "offload.param_buffer");  // same region again
      pinned.free(q);
      PageableHostAllocator pageable(ho);
      HostBlock r = pageable.allocate(1000, "dataset.tokens");
      pageable.free(r);
    }
    ASSERT_TRUE(rec->close().ok());
  }
  ASSERT_FALSE(oom_text.empty());

  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(path, &r).ok());
  // Device: two segments, three blocks, each with its name.
  auto by_level = rows(*r,
                       "SELECT level, count(*), sum(bytes) FROM allocation_v WHERE memory_kind='device' "
                       "GROUP BY level ORDER BY level");
  ASSERT_EQ(by_level.size(), 2u);
  EXPECT_EQ(by_level[0], (std::vector<std::string>{"block", "3", std::to_string(4096 + 8192 + 64 * MiB)}));
  EXPECT_EQ(by_level[1], (std::vector<std::string>{"segment", "2", std::to_string(2 * MiB + 64 * MiB)}));
  EXPECT_EQ(scalar(*r,
                   "SELECT group_concat(name, ',') FROM (SELECT name FROM allocation_v WHERE level='block' "
                   "AND memory_kind='device' ORDER BY t_alloc)"),
            "block3.gathered,block3.grad,block4.gathered");
  // A segment is named after the request that made the allocator take it.
  EXPECT_EQ(scalar(*r,
                   "SELECT group_concat(name, ',') FROM (SELECT name FROM allocation_v WHERE level='segment' "
                   "AND memory_kind='device' ORDER BY t_alloc)"),
            "block3.gathered,block4.gathered");
  // Every block names a segment row, lies inside it and lives within its lifetime.
  EXPECT_EQ(scalar(*r,
                   "SELECT count(*) FROM allocation b JOIN allocation s ON s.id = b.segment_id "
                   "WHERE b.level = 0 AND s.level = 1 AND b.address >= s.address "
                   "AND b.address + b.bytes <= s.address + s.bytes AND b.t_alloc >= s.t_alloc "
                   "AND b.t_free IS NOT NULL AND s.t_free IS NOT NULL AND b.t_free <= s.t_free"),
            "6");  // 3 device blocks, 2 pinned blocks, 1 pageable block
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM allocation WHERE level = 0 AND segment_id IS NULL"), "0");
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM allocation WHERE level = 1 AND segment_id IS NOT NULL"), "0");
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM allocation WHERE t_free IS NULL"), "0");
  // Pinned: one region (segment) served two hand-outs (blocks) with the requested sizes.
  EXPECT_EQ(scalar(*r,
                   "SELECT group_concat(level || ':' || bytes || ':' || requested_bytes, ',') FROM "
                   "(SELECT * FROM allocation_v WHERE memory_kind='pinned_host' ORDER BY t_alloc, level DESC)"),
            "segment:4194304:4194304,block:4194304:3145728,block:4194304:4194304");
  EXPECT_EQ(scalar(*r, "SELECT count(DISTINCT segment_id) FROM allocation_v WHERE memory_kind='pinned_host' "
                       "AND level='block'"), "1");
  // Pageable: a segment and a block over it.
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM allocation_v WHERE memory_kind='pageable_host' "
                       "AND name='dataset.tokens'"), "2");
  // Counters: allocated ends at 0, reserved peaked at 66 MiB and ends at 0.
  EXPECT_EQ(scalar(*r, "SELECT value FROM counter_v WHERE name='allocated' AND device='cuda:0' "
                       "ORDER BY t DESC, id DESC LIMIT 1"), "0");
  EXPECT_EQ(scalar(*r, "SELECT max(value) FROM counter_v WHERE name='reserved'"), std::to_string(66 * MiB));
  EXPECT_EQ(scalar(*r, "SELECT max(value) FROM counter_v WHERE name='pinned'"), std::to_string(4 * MiB));
  // The OOM as an error row with the exact text and the tensor.
  auto err = rows(*r, "SELECT kind, message, tensors FROM error");
  ASSERT_EQ(err.size(), 1u);
  EXPECT_EQ(err[0][0], "oom");
  EXPECT_EQ(err[0][1], oom_text);
  EXPECT_EQ(err[0][2], "[\"lm_head.gathered\"]");
}
