// The recording path: events land as rows, closing halves find their rows, stacks are
// interned, commits happen while a run is live, and overflow is counted, never silent.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdlib>
#include <thread>

#include "../test_util.h"
#include "zt/db/trace_reader.h"
#include "zt/probe/recorder.h"

using namespace zt::probe;
using namespace zt::db;

namespace {

std::unique_ptr<Recorder> open_recorder(const std::string& path, size_t ring = 1 << 15,
                                        OverflowPolicy policy = OverflowPolicy::Block) {
  RecorderOptions o;
  o.path = path;
  o.command_line = "recorder_test";
  o.seed = 7;
  o.ring_events = ring;
  o.overflow = policy;
  o.crash_handlers = false;
  std::unique_ptr<Recorder> rec;
  zt::Status s = Recorder::open(o, &rec);
  EXPECT_TRUE(s.ok()) << s.message();
  return rec;
}

std::unique_ptr<TraceReader> open_reader(const std::string& path) {
  std::unique_ptr<TraceReader> r;
  zt::Status s = TraceReader::open(path, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

std::string scalar(TraceReader& r, const std::string& sql) {
  QueryResult q;
  zt::Status s = r.query(sql, &q);
  EXPECT_TRUE(s.ok()) << s.message();
  return q.rows.empty() ? "" : q.rows[0][0];
}

}  // namespace

// External linkage, so that dladdr can name them (the test links with -rdynamic).
__attribute__((noinline)) StackId leaky_function_for_stack_test(Recorder& rec) {
  StackId id = rec.capture_stack(0, 16);
  asm volatile("" ::: "memory");  // keep the frame: no tail call
  return id;
}
__attribute__((noinline)) StackId other_function_for_stack_test(Recorder& rec) {
  StackId id = rec.capture_stack(0, 16);
  asm volatile("" ::: "memory");
  return id;
}

// Python frames (tokens of python_frame_token) beside native ips: one row per (function, line),
// written complete with file, function and line, left alone by the symbolization at close.
TEST(Recorder, PythonFramesAreInternedBesideNativeOnes) {
  zt::test::TempDir dir;
  const std::string path = dir.file("py.db");
  auto rec = open_recorder(path);
  const uint64_t grow = rec->python_function("/w/leak.py", "grow");
  const uint64_t train = rec->python_function("/w/leak.py", "Trainer.train");
  EXPECT_EQ(rec->python_function("/w/leak.py", "grow"), grow);
  EXPECT_NE(train, grow);
  const uint64_t native = reinterpret_cast<uint64_t>(&leaky_function_for_stack_test) + 1;
  const uint64_t a[] = {native, Recorder::python_frame_token(grow, 12), Recorder::python_frame_token(train, 20)};
  const uint64_t b[] = {native, Recorder::python_frame_token(grow, 13), Recorder::python_frame_token(train, 20)};
  const StackId sa = rec->intern_stack(a, 3), sb = rec->intern_stack(b, 3);
  EXPECT_EQ(rec->intern_stack(a, 3), sa);
  EXPECT_NE(sa, sb);
  ASSERT_TRUE(rec->close().ok());
  auto r = open_reader(path);
  std::vector<std::string> lines;
  ASSERT_TRUE(r->stack_text(sa, &lines).ok());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find("leaky_function_for_stack_test"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1], "grow (/w/leak.py:12)");
  EXPECT_EQ(lines[2], "Trainer.train (/w/leak.py:20)");
  // grow:12, grow:13 and train:20 are three rows; the caller's node is shared.
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM frame WHERE ip = 0"), "3");
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM stack WHERE parent_id IS NULL"), "1");
}

TEST(Recorder, EveryEventTypeBecomesARow) {
  zt::test::TempDir dir;
  auto rec = open_recorder(dir.file("t.db"));
  rec->add_rank(0, 2, 0);
  DeviceId gpu = rec->add_device(0, DeviceKind::Sim, 0, "cuda:0", "simulated GPU", int64_t(80) << 30, true);
  DeviceId cpu = rec->add_device(0, DeviceKind::Cpu, 0, "cpu", "host", std::nullopt, false);
  NameId shard = rec->intern("block0.shard");
  EXPECT_EQ(rec->intern("block0.shard"), shard);
  AllocEvent a;
  a.device = gpu;
  a.bytes = 1 << 20;
  a.requested_bytes = 1000000;
  a.name = shard;
  a.address = 0xabc000;
  AllocId id = rec->alloc(a);
  rec->placement(0, shard, gpu, PlacementWhy::Created, 1 << 20, id);
  TransferEvent t;
  t.kind = TransferKind::H2D;
  t.bytes = 1 << 20;
  t.src = cpu;
  t.dst = gpu;
  t.pinned = 1;
  t.name = shard;
  rec->transfer(t);
  KernelEvent k;
  k.device = gpu;
  k.name = rec->intern("gemm");
  k.grid[0] = 128;
  k.block[0] = 256;
  rec->kernel(k);
  MarkerId m = rec->marker_begin({0, MarkerKind::Phase, rec->intern("checkpoint"), 3, -1, 1, 0});
  rec->counter(0, gpu, rec->intern("allocated"), double(1 << 20));
  rec->marker_end(m, 123456);
  rec->free(id);
  AllocEvent h;
  h.device = cpu;
  h.memory_kind = MemoryKind::PinnedHost;
  h.level = AllocLevel::Segment;
  h.address = 0x5000;
  h.bytes = 4096;
  h.free_by_address = true;
  h.source = Source::HostHook;
  rec->alloc(h);
  rec->free_address(cpu, 0x5000);
  FaultRow f;
  f.name = "zero.norm_on_device";
  f.step = 3;
  rec->fault(f);
  ErrorRow e;
  e.message = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!";
  rec->error(e);
  ASSERT_TRUE(rec->close(RunStatus::Failed, 1, "device mismatch").ok());

  auto r = open_reader(dir.file("t.db"));
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM allocation WHERE t_free IS NOT NULL"), "2");
  EXPECT_EQ(scalar(*r, "SELECT name || ' ' || device || ' ' || bytes || ' ' || requested_bytes FROM allocation_v"
                       " WHERE memory_kind = 'device'"),
            "block0.shard cuda:0 1048576 1000000");
  EXPECT_EQ(scalar(*r, "SELECT kind || ' ' || src_device || '->' || dst_device || ' ' || pinned FROM transfer_v"),
            "H2D cpu->cuda:0 1");
  EXPECT_EQ(scalar(*r, "SELECT s.text || ' ' || grid || ' ' || block FROM kernel k JOIN string s ON s.id = k.name_id"),
            "gemm 128,0,0 256,0,0");
  EXPECT_EQ(scalar(*r, "SELECT kind || ' ' || name || ' ' || step || ' ' || epoch || ' ' || value ||"
                       " ' ' || (t_end >= t_start) FROM marker_v"),
            "phase checkpoint 3 1 123456 1");
  EXPECT_EQ(scalar(*r, "SELECT name || '=' || value FROM counter_v"), "allocated=1048576");
  EXPECT_EQ(scalar(*r, "SELECT tensor || ' ' || device || ' ' || why FROM placement_v"), "block0.shard cuda:0 created");
  EXPECT_EQ(scalar(*r, "SELECT name || ' ' || step FROM fault"), "zero.norm_on_device 3");
  EXPECT_EQ(scalar(*r, "SELECT message FROM error"), e.message);
  EXPECT_EQ(scalar(*r, "SELECT status || ' ' || exit_code || ' ' || exit_detail || ' ' || seed FROM run"),
            "2 1 device mismatch 7");
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM dropped"), "0");
  // Indexes were built at close.
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'allocation_by_device_time'"),
            "1");
}

TEST(Recorder, FreeRecordedOnAnotherThreadClosesTheAllocation) {
  zt::test::TempDir dir;
  auto rec = open_recorder(dir.file("t.db"));
  DeviceId gpu = rec->add_device(0, DeviceKind::Sim, 0, "cuda:0", "", std::nullopt, true);
  std::vector<AllocId> ids;
  std::thread producer([&] {
    for (int i = 0; i < 1000; ++i) {
      AllocEvent a;
      a.device = gpu;
      a.bytes = 64;
      ids.push_back(rec->alloc(a));
    }
  });
  producer.join();  // that thread's ring is retired but must still be drained
  for (AllocId id : ids) rec->free(id);
  ASSERT_TRUE(rec->close().ok());
  auto r = open_reader(dir.file("t.db"));
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM allocation WHERE t_free IS NOT NULL AND t_free >= t_alloc"), "1000");
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM dropped"), "0");
}

TEST(Recorder, StacksAreInternedAndSymbolized) {
  zt::test::TempDir dir;
  auto rec = open_recorder(dir.file("t.db"));
  StackId ids[2] = {0, 0};
  volatile int n = 2;  // an unknown count: one call site, not an unrolled pair
  for (int i = 0; i < n; ++i) ids[i] = leaky_function_for_stack_test(*rec);
  StackId a1 = ids[0], a2 = ids[1];
  StackId b = other_function_for_stack_test(*rec);
  EXPECT_NE(a1, 0);
  EXPECT_EQ(a1, a2);  // the same call site twice: one id
  EXPECT_NE(a1, b);
  uint64_t ips1[] = {0x10, 0x20, 0x30}, ips2[] = {0x11, 0x20, 0x30};
  StackId s1 = rec->intern_stack(ips1, 3), s2 = rec->intern_stack(ips2, 3);
  EXPECT_NE(s1, s2);
  ASSERT_TRUE(rec->close().ok());
  auto r = open_reader(dir.file("t.db"));
  // ips2 shares its two callers with ips1: one new frame, one new node.
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM frame WHERE ip IN (16, 17, 32, 48)"), "4");
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM stack s JOIN frame f ON f.id = s.frame_id WHERE f.ip IN (16, 17, 32, 48)"),
            "4");
  std::vector<std::string> lines;
  ASSERT_TRUE(r->stack_text(a1, &lines).ok());
  ASSERT_FALSE(lines.empty());
  std::string all;
  for (auto& l : lines) all += l + "\n";
  EXPECT_NE(lines[0].find("leaky_function_for_stack_test"), std::string::npos) << all;
  ASSERT_TRUE(r->stack_text(s1, &lines).ok());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "0x10");
}

TEST(Recorder, CommitsWhileTheRunIsLive) {
  zt::test::TempDir dir;
  auto rec = open_recorder(dir.file("t.db"));
  DeviceId gpu = rec->add_device(0, DeviceKind::Sim, 0, "cuda:0", "", std::nullopt, true);
  AllocEvent a;
  a.device = gpu;
  a.bytes = 1;
  rec->alloc(a);
  // No flush: the writer commits on its own within its interval (50 ms).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  {
    auto r = open_reader(dir.file("t.db"));
    EXPECT_EQ(scalar(*r, "SELECT count(*) FROM allocation"), "1");
    EXPECT_EQ(scalar(*r, "SELECT status FROM run"), "0");  // running
  }
  rec->alloc(a);
  rec->flush();
  {
    auto r = open_reader(dir.file("t.db"));
    EXPECT_EQ(scalar(*r, "SELECT count(*) FROM allocation"), "2");
  }
  ASSERT_TRUE(rec->close().ok());
}

TEST(Recorder, DropPolicyCountsEveryLostEvent) {
  zt::test::TempDir dir;
  auto rec = open_recorder(dir.file("t.db"), 64, OverflowPolicy::Drop);
  NameId n = rec->intern("c");
  const int kEvents = 200000;
  for (int i = 0; i < kEvents; ++i) rec->counter(0, 0, n, 1.0);
  uint64_t dropped = rec->events_dropped();
  ASSERT_TRUE(rec->close().ok());
  EXPECT_GT(dropped, 0u) << "a 64-event ring must overflow under 200k events";
  auto r = open_reader(dir.file("t.db"));
  int64_t rows = std::stoll(scalar(*r, "SELECT count(*) FROM counter"));
  int64_t lost = std::stoll(scalar(*r, "SELECT coalesce(sum(events), 0) FROM dropped"));
  EXPECT_EQ(rows + lost, kEvents);
  EXPECT_EQ(static_cast<uint64_t>(lost), dropped);
}

TEST(Recorder, BlockPolicyLosesNothingWithATinyRing) {
  zt::test::TempDir dir;
  auto rec = open_recorder(dir.file("t.db"), 64, OverflowPolicy::Block);
  NameId n = rec->intern("c");
  const int kEvents = 100000;
  for (int i = 0; i < kEvents; ++i) rec->counter(0, 0, n, double(i));
  ASSERT_TRUE(rec->close().ok());
  auto r = open_reader(dir.file("t.db"));
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM counter"), std::to_string(kEvents));
  EXPECT_EQ(scalar(*r, "SELECT sum(value) FROM counter"), std::to_string(int64_t(kEvents) * (kEvents - 1) / 2));
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM dropped"), "0");
}

// SQLite stores no NaN: a counter that went NaN (a diverged loss) is a NULL value, read back as NaN,
// and it does not stop the writer (it once failed the NOT NULL constraint and lost the trace's end).
TEST(Recorder, ANaNCounterIsRecordedAndReadBackAsNaN) {
  zt::test::TempDir dir;
  const std::string path = dir.file("nan.db");
  auto rec = open_recorder(path);
  rec->add_rank(0, 1);
  const NameId loss = rec->intern("loss");
  rec->counter(0, 0, loss, 4.5, 10);
  rec->counter(0, 0, loss, std::nan(""), 20);
  rec->counter(0, 0, loss, INFINITY, 30);
  ASSERT_TRUE(rec->close().ok());
  auto r = open_reader(path);
  std::vector<CounterRow> rows;
  ASSERT_TRUE(r->read(&rows).ok());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].value, 4.5);
  EXPECT_TRUE(std::isnan(rows[1].value));
  EXPECT_TRUE(std::isinf(rows[2].value));
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM counter WHERE value IS NULL"), "1");
  EXPECT_EQ(scalar(*r, "SELECT status FROM run"), "1");  // ok: the writer reached the end
}

namespace {
// In a child process (EXPECT_EXIT forks): exits 0 when close() reported the writer's failure,
// naming the trace, and the recorder then went without std::terminate.
[[noreturn]] void write_past_the_file_size_limit(const std::string& path) {
  ::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of a signal
  auto rec = open_recorder(path);
  rlimit lim{};
  lim.rlim_cur = lim.rlim_max = 256 << 10;
  ::setrlimit(RLIMIT_FSIZE, &lim);
  rec->add_rank(0, 1);
  const NameId n = rec->intern("value");
  for (int i = 0; i < 200000; ++i) rec->counter(0, 0, n, double(i), i + 1);
  rec->flush();
  zt::Status s = rec->close();
  const bool named = !s.ok() && s.message().find(path + ": writing the trace failed") == 0;
  rec.reset();  // nothing left to join
  std::_Exit(named ? 0 : 3);
}
}  // namespace

// The writer thread fails (here: the file size limit, as a full disk would): close() reports it
// instead of destroying a joinable thread (std::terminate), and the caller's program goes on.
TEST(Recorder, AWriterThatFailsIsReportedByClose) {
  zt::test::TempDir dir;
  EXPECT_EXIT(write_past_the_file_size_limit(dir.file("full.db")), ::testing::ExitedWithCode(0), "");
}

// Issue 40, a silent loss: an address free waited for the drain while a new allocation at the
// same address took the address table at once; drained in one cycle, the free closed the new
// row (before it was made) and the old one stayed open, and the reader refused the whole file.
TEST(Recorder, AnAddressFreeClosesTheAllocationLiveAtItsTime) {
  zt::test::TempDir dir;
  RecorderOptions o;
  o.path = dir.file("t.db");
  o.command_line = "recorder_test";
  o.crash_handlers = false;
  o.commit_interval_ms = 60000;  // one drain, at close: the three events meet in one cycle
  std::unique_ptr<Recorder> rec;
  ASSERT_TRUE(Recorder::open(o, &rec).ok());
  rec->add_rank(0, 1);
  DeviceId cpu = rec->add_device(0, DeviceKind::Cpu, 0, "cpu", "host", std::nullopt, false);
  auto host_alloc = [&](int64_t t) {
    AllocEvent a;
    a.device = cpu;
    a.memory_kind = MemoryKind::PinnedHost;
    a.level = AllocLevel::Segment;
    a.address = 0x7000;
    a.bytes = 4096;
    a.free_by_address = true;
    a.t = t;
    return rec->alloc(a);
  };
  const AllocId first = host_alloc(1000);
  rec->free_address(cpu, 0x7000, 2000);
  const AllocId second = host_alloc(3000);
  // A free from another thread's ring, in the same cycle, of a later allocation there.
  const AllocId third = host_alloc(5000);
  std::thread([&] { rec->free_address(cpu, 0x7000, 6000); }).join();
  ASSERT_TRUE(rec->close().ok());
  auto r = open_reader(o.path);  // refused before: "t_free ... is before t_alloc"
  ASSERT_TRUE(r);
  EXPECT_EQ(scalar(*r, "SELECT t_free FROM allocation WHERE id = " + std::to_string(first)), "2000");
  EXPECT_EQ(scalar(*r, "SELECT t_free FROM allocation WHERE id = " + std::to_string(third)), "6000");
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM allocation WHERE t_free IS NULL"), "1");
  EXPECT_EQ(scalar(*r, "SELECT t_free IS NULL FROM allocation WHERE id = " + std::to_string(second)), "1");
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM allocation WHERE t_free < t_alloc"), "0");
  EXPECT_EQ(scalar(*r, "SELECT count(*) FROM dropped"), "0");
}

// Issue 40: the ring narrowed ranks to 16 bits; db/SCHEMA.md allows 2^20 - 1.
TEST(Recorder, RanksPast16BitsArriveWhole) {
  zt::test::TempDir dir;
  auto rec = open_recorder(dir.file("t.db"));
  const int rank = (1 << 20) - 1;
  rec->add_rank(rank, 1 << 20);
  DeviceId gpu = rec->add_device(rank, DeviceKind::Sim, 0, "cuda:0", "", std::nullopt, true);
  AllocEvent a;
  a.rank = rank;
  a.device = gpu;
  a.bytes = 64;
  rec->alloc(a);
  rec->counter(70000, gpu, rec->intern("allocated"), 64.0);
  MarkerId m = rec->marker_begin({65536, MarkerKind::Phase, rec->intern("step"), 1, -1, -1, 0});
  rec->marker_end(m);
  ASSERT_TRUE(rec->close().ok());
  auto r = open_reader(dir.file("t.db"));
  ASSERT_TRUE(r);
  EXPECT_EQ(scalar(*r, "SELECT rank FROM allocation"), std::to_string(rank));
  EXPECT_EQ(scalar(*r, "SELECT rank FROM counter"), "70000");
  EXPECT_EQ(scalar(*r, "SELECT rank FROM marker"), "65536");
}

// Issue 40: error() gives up on the slow path's lock after 500 ms (a thread stopped or dying
// inside the recorder holds it); the row it gave up was lost without a trace. It is counted now.
TEST(Recorder, AnErrorGivenUpOnTheLockIsCounted) {
  zt::test::TempDir dir;
  auto rec = open_recorder(dir.file("t.db"));
  rec->add_rank(0, 1);
  {
    auto held = rec->hold_slow_path_lock_for_testing();
    std::thread([&] {
      ErrorRow e;
      e.message = "recorded while the lock was held";
      rec->error(e);
    }).join();
  }
  ErrorRow e;
  e.message = "recorded after";
  rec->error(e);
  ASSERT_TRUE(rec->close().ok());
  auto r = open_reader(dir.file("t.db"));
  ASSERT_TRUE(r);
  EXPECT_EQ(scalar(*r, "SELECT group_concat(message) FROM error"), "recorded after");
  EXPECT_EQ(scalar(*r, "SELECT sum(events) FROM dropped WHERE reason LIKE 'error rows not recorded%'"), "1");
}
