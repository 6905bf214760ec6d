// Every record type written by TraceWriter reads back identical through TraceReader.
#include <gtest/gtest.h>

#include "../hand_trace.h"
#include "../hostile_traces.h"
#include "../test_util.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_writer.h"

using namespace zt::db;

namespace {

template <typename Row>
std::vector<Row> read_all(TraceReader& r) {
  std::vector<Row> rows;
  zt::Status s = r.read(&rows);
  EXPECT_TRUE(s.ok()) << s.message();
  return rows;
}

}  // namespace

TEST(RoundTrip, EveryRecordTypeReadsBackIdentical) {
  zt::test::TempDir dir;
  std::string path = dir.file("t.db");
  std::unique_ptr<TraceWriter> w;
  ASSERT_TRUE(TraceWriter::create(path, &w).ok());
  w->begin();
  RunRow run;
  run.tool_version = "0.1.0";
  run.command_line = "zt train --steps 3";
  run.config_json = "{\"a\":1}";
  run.seed = 42;
  run.hostname = "node7";
  run.pid = 1234;
  run.t_start = 1000;
  run.wall_start_unix_ns = 1700000000000000000;
  w->insert(run);
  RankRow rank{3, 1, 8, 3, "node7", 1234};
  w->insert(rank);
  DeviceRow dev{1, 3, DeviceKind::Sim, 3, "cuda:3", "simulated GPU", int64_t(80) << 30, true};
  DeviceRow cpu{2, 3, DeviceKind::Cpu, 0, "cpu", "host", std::nullopt, false};
  w->insert(dev);
  w->insert(cpu);
  w->insert(StringRow{1, "block0.shard"});
  w->insert(StringRow{2, "all_gather"});
  w->insert(StringRow{3, "it's \"quoted\", with ünïcode"});
  w->insert(FrameRow{1, 0x401000, "/bin/x", 0x1000, "main", std::nullopt});
  w->insert(FrameRow{2, 0x402000, "", std::nullopt, "", std::nullopt});
  w->insert(StackRow{1, 0, 1});
  w->insert(StackRow{2, 1, 2});
  AllocationRow seg{10, 3, 1, MemoryKind::Device, AllocLevel::Segment, 0x7f0000000000, 1 << 30, 1 << 30, 1100,
                    std::nullopt, 0, 0, Source::Api, 0, std::nullopt};
  AllocationRow blk{11, 3, 1, MemoryKind::Device, AllocLevel::Block, 0x7f0000000200, 4096, 4000, 1200, 1900, 1, 2,
                    Source::Cupti, 10, 7};
  AllocationRow pin{12, 3, 2, MemoryKind::PinnedHost, AllocLevel::Segment, 0x1000, 1 << 20, 1 << 20, 1300,
                    std::nullopt, 3, 0, Source::HostHook, 0, std::nullopt};
  w->insert(seg);
  w->insert(blk);
  w->insert(pin);
  TransferRow tr{5, 3, TransferKind::Collective, 1 << 20, 1, 1, std::nullopt, 1400, 1500, 3, 1, 2, 8, 99, Source::Api};
  TransferRow h2d{6, 3, TransferKind::H2D, 4096, 2, 1, true, 1410, 1420, 1, 1, 0, std::nullopt, std::nullopt,
                  Source::Cupti};
  w->insert(tr);
  w->insert(h2d);
  KernelRow k{7, 3, 1, 1, 1500, 1600, 7, 123, "1,2,3", "128,1,1", Source::Cupti};
  w->insert(k);
  PlacementRow p{8, 3, 1200, 1, 1, PlacementWhy::Moved, 4096, 11};
  w->insert(p);
  MarkerRow m{20, 3, MarkerKind::Step, 1, 1000, 2000, 5, 1, 0, 777};
  MarkerRow open_marker{21, 3, MarkerKind::Phase, 3, 1500, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                        std::nullopt};
  w->insert(m);
  w->insert(open_marker);
  CounterRow c1{30, 3, 1, 1, 1250, 4096.0};
  CounterRow c2{31, 3, 0, 2, 1260, 3.25};
  w->insert(c1);
  w->insert(c2);
  FaultRow f{40, 3, 1700, "zero.norm_on_device", "step=5", 5, "norm left on cuda:3"};
  w->insert(f);
  ErrorRow e{41, 3, 1800, 5, "device_mismatch", "unscale_and_clip_grads",
             "Expected all tensors to be on the same device, but found at least two devices, cuda:3 and cpu!",
             "[\"grad\",\"combined_scale\"]", 1};
  w->insert(e);
  DroppedRow d{50, 3, 999, 1850, 17, "ring buffer full"};
  w->insert(d);
  w->commit();
  w->begin();
  w->set_run_end(1, 2500, RunStatus::Failed, 1, "device mismatch");
  w->commit();
  ASSERT_TRUE(w->finish().ok());
  w.reset();

  std::unique_ptr<TraceReader> r;
  zt::Status s = TraceReader::open(path, &r);
  ASSERT_TRUE(s.ok()) << s.message();

  auto runs = read_all<RunRow>(*r);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].command_line, run.command_line);
  EXPECT_EQ(runs[0].config_json, run.config_json);
  EXPECT_EQ(runs[0].seed, 42);
  EXPECT_EQ(runs[0].hostname, "node7");
  EXPECT_EQ(runs[0].t_end, 2500);
  EXPECT_EQ(runs[0].status, RunStatus::Failed);
  EXPECT_EQ(runs[0].exit_code, 1);
  EXPECT_EQ(runs[0].exit_detail, "device mismatch");
  EXPECT_EQ(runs[0].wall_start_unix_ns, run.wall_start_unix_ns);

  auto ranks = read_all<RankRow>(*r);
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].rank, 3);
  EXPECT_EQ(ranks[0].world_size, 8);
  EXPECT_EQ(ranks[0].local_rank, 3);

  auto devs = read_all<DeviceRow>(*r);
  ASSERT_EQ(devs.size(), 2u);
  EXPECT_EQ(devs[0].label, "cuda:3");
  EXPECT_EQ(devs[0].kind, DeviceKind::Sim);
  EXPECT_TRUE(devs[0].simulated);
  EXPECT_EQ(devs[0].capacity_bytes, int64_t(80) << 30);
  EXPECT_FALSE(devs[1].capacity_bytes.has_value());

  std::unordered_map<int64_t, std::string> strings;
  ASSERT_TRUE(r->strings(&strings).ok());
  EXPECT_EQ(strings.at(3), "it's \"quoted\", with ünïcode");

  auto allocs = read_all<AllocationRow>(*r);
  ASSERT_EQ(allocs.size(), 3u);
  const AllocationRow& b = allocs[1];
  EXPECT_EQ(b.id, 11);
  EXPECT_EQ(b.level, AllocLevel::Block);
  EXPECT_EQ(b.address, 0x7f0000000200u);
  EXPECT_EQ(b.bytes, 4096);
  EXPECT_EQ(b.requested_bytes, 4000);
  EXPECT_EQ(b.t_free, 1900);
  EXPECT_EQ(b.name_id, 1);
  EXPECT_EQ(b.stack_id, 2);
  EXPECT_EQ(b.source, Source::Cupti);
  EXPECT_EQ(b.segment_id, 10);
  EXPECT_EQ(b.stream, 7);
  EXPECT_FALSE(allocs[0].t_free.has_value());
  EXPECT_EQ(allocs[2].memory_kind, MemoryKind::PinnedHost);

  auto trs = read_all<TransferRow>(*r);
  ASSERT_EQ(trs.size(), 2u);
  EXPECT_EQ(trs[0].kind, TransferKind::Collective);
  EXPECT_EQ(trs[0].op_id, 2);
  EXPECT_EQ(trs[0].participants, 8);
  EXPECT_EQ(trs[0].correlation_id, 99);
  EXPECT_FALSE(trs[0].pinned.has_value());
  EXPECT_EQ(trs[1].pinned, true);
  EXPECT_EQ(trs[1].kind, TransferKind::H2D);

  auto ks = read_all<KernelRow>(*r);
  ASSERT_EQ(ks.size(), 1u);
  EXPECT_EQ(ks[0].grid, "1,2,3");
  EXPECT_EQ(ks[0].correlation_id, 123);

  auto ps = read_all<PlacementRow>(*r);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].why, PlacementWhy::Moved);
  EXPECT_EQ(ps[0].allocation_id, 11);

  auto ms = read_all<MarkerRow>(*r);
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[0].kind, MarkerKind::Step);
  EXPECT_EQ(ms[0].step, 5);
  EXPECT_EQ(ms[0].value, 777);
  EXPECT_FALSE(ms[1].t_end.has_value());

  auto cs = read_all<CounterRow>(*r);
  ASSERT_EQ(cs.size(), 2u);
  EXPECT_DOUBLE_EQ(cs[0].value, 4096.0);
  EXPECT_DOUBLE_EQ(cs[1].value, 3.25);
  EXPECT_EQ(cs[1].device_id, 0);

  auto fs = read_all<FaultRow>(*r);
  ASSERT_EQ(fs.size(), 1u);
  EXPECT_EQ(fs[0].name, "zero.norm_on_device");
  EXPECT_EQ(fs[0].step, 5);

  auto es = read_all<ErrorRow>(*r);
  ASSERT_EQ(es.size(), 1u);
  EXPECT_EQ(es[0].message, e.message);
  EXPECT_EQ(es[0].tensors, e.tensors);
  EXPECT_EQ(es[0].site, "unscale_and_clip_grads");

  auto ds = read_all<DroppedRow>(*r);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].events, 17);

  std::vector<std::string> stack;
  ASSERT_TRUE(r->stack_text(2, &stack).ok());
  ASSERT_EQ(stack.size(), 2u);
  EXPECT_EQ(stack[0], "0x402000");      // innermost first, unsymbolized
  EXPECT_EQ(stack[1], "main (/bin/x+0x1000)");

  TraceSummary sum;
  ASSERT_TRUE(r->summarize(&sum).ok());
  EXPECT_EQ(sum.t_first, 1000);
  EXPECT_EQ(sum.t_last, 2000);
  EXPECT_EQ(sum.steps, 1);
  EXPECT_EQ(sum.dropped_events, 17);
  ASSERT_EQ(sum.devices.size(), 2u);
  EXPECT_EQ(sum.devices[0].peak_reserved, 1 << 30);
  EXPECT_EQ(sum.devices[0].peak_allocated, 4096);
  // The segment is still reserved at the end; its block was freed (blocks and segments counted apart).
  EXPECT_EQ(sum.devices[0].reserved_at_end, 1 << 30);
  EXPECT_EQ(sum.devices[0].allocated_at_end, 0);
}

TEST(RoundTrip, SummaryPeakCountsFreesBeforeAllocsAtEqualTimes) {
  zt::test::TempDir dir;
  std::string path = dir.file("peak.db");
  std::unique_ptr<TraceWriter> w;
  ASSERT_TRUE(TraceWriter::create(path, &w).ok());
  w->begin();
  RunRow run;
  run.tool_version = "t";
  run.command_line = "x";
  w->insert(run);
  w->insert(DeviceRow{1, 0, DeviceKind::Sim, 0, "cuda:0", "", std::nullopt, true});
  // Three 100-byte blocks: [0,10), [10,20) handed over at t=10, and [5,15).
  auto block = [](int64_t id, int64_t t0, int64_t t1) {
    AllocationRow a;
    a.id = id;
    a.device_id = 1;
    a.bytes = 100;
    a.requested_bytes = 100;
    a.t_alloc = t0;
    a.t_free = t1;
    return a;
  };
  w->insert(block(1, 0, 10));
  w->insert(block(2, 10, 20));
  w->insert(block(3, 5, 15));
  w->commit();
  ASSERT_TRUE(w->finish().ok());
  w.reset();
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(path, &r).ok());
  TraceSummary sum;
  ASSERT_TRUE(r->summarize(&sum).ok());
  ASSERT_EQ(sum.devices.size(), 1u);
  EXPECT_EQ(sum.devices[0].peak_allocated, 200);
  EXPECT_EQ(sum.devices[0].allocated_at_end, 0);
  EXPECT_EQ(sum.devices[0].reserved_at_end, 0);
}

TEST(RoundTrip, SqlQueryIsReadOnly) {
  zt::test::TempDir dir;
  std::string path = dir.file("ro.db");
  std::unique_ptr<TraceWriter> w;
  ASSERT_TRUE(TraceWriter::create(path, &w).ok());
  w->begin();
  w->insert(StringRow{1, "x"});
  w->commit();
  ASSERT_TRUE(w->finish().ok());
  w.reset();
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(path, &r).ok());
  QueryResult q;
  ASSERT_TRUE(r->query("SELECT id, text FROM string", &q).ok());
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0][1], "x");
  EXPECT_TRUE(q.numeric[0]);
  EXPECT_FALSE(q.numeric[1]);
  zt::Status s = r->query("DELETE FROM string", &q);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ro.db"), std::string::npos) << s.message();
  ASSERT_TRUE(r->query("SELECT count(*) FROM string", &q).ok());
  EXPECT_EQ(q.rows[0][0], "1");
  s = r->query("SELEC nonsense", &q);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("syntax error"), std::string::npos) << s.message();
}

// The step and epoch counts read only the step and epoch markers, through the marker_by_time index
// (a day's trace: 86k of 11.5M markers); a trace without the index (a killed run's, indexed at its
// end) is counted by one scan. Both give the same counts: steps that ended on some rank, a step
// begun and never ended on any, epochs begun, over ranks the rank table does not list.
TEST(RoundTrip, StepAndEpochCountsReadTheStepMarkersWithOrWithoutTheIndex) {
  zt::test::TempDir dir;
  const std::string path = dir.file("t.db");
  {
    auto w = zt::test::hand_written_trace(path, "zt train --steps 3");
    ASSERT_TRUE(w);
    w->insert(StringRow{1, "step"});
    int64_t id = 0;
    auto marker = [&](int64_t rank, MarkerKind kind, int64_t t, std::optional<int64_t> end, std::optional<int64_t> step,
                      std::optional<int64_t> epoch) {
      MarkerRow m;
      m.id = ++id, m.rank = rank, m.kind = kind, m.name_id = 1, m.t_start = t, m.t_end = end, m.step = step;
      m.epoch = epoch;
      w->insert(m);
    };
    for (int64_t rank : {0, 3, 7}) {
      for (int64_t s = 0; s < 3; ++s) {
        marker(rank, MarkerKind::Step, 100 * s, 100 * s + 90, s, 0);
        for (int k = 0; k < 5; ++k) marker(rank, MarkerKind::Range, 100 * s + k, 100 * s + k + 1, s, 0);
      }
      if (rank == 0) marker(rank, MarkerKind::Epoch, 0, 290, std::nullopt, 0);
      if (rank == 7) marker(rank, MarkerKind::Epoch, 300, std::nullopt, std::nullopt, 1);
    }
    marker(3, MarkerKind::Step, 300, std::nullopt, 3, 1);  // never ended
    marker(7, MarkerKind::Step, 300, std::nullopt, 2, 1);  // ended on other ranks: not unfinished
    w->set_run_end(1, 1000, RunStatus::Ok, 0, "");
    w->commit();
    ASSERT_TRUE(w->finish());
  }
  for (bool indexed : {true, false}) {
    if (!indexed) zt::test::edit_trace(path, "DROP INDEX marker_by_time");
    std::unique_ptr<TraceReader> r;
    ASSERT_TRUE(TraceReader::open(path, &r));
    TraceSummary sum;
    ASSERT_TRUE(r->summarize(&sum));
    EXPECT_EQ(sum.steps, 3) << indexed;
    EXPECT_EQ(sum.steps_unfinished, 1) << indexed;
    EXPECT_EQ(sum.epochs, 2) << indexed;
    ASSERT_EQ(sum.step_traffic.size(), 3u) << indexed;
    EXPECT_EQ(sum.step_traffic[1].rank, 3) << indexed;
    EXPECT_EQ(sum.step_traffic[1].steps, 3) << indexed;
  }
}
