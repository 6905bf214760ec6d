// 8 threads x 200k events each: none lost, counts and sums match.
#include <gtest/gtest.h>

#include <thread>

#include "../test_util.h"
#include "zt/db/trace_reader.h"
#include "zt/probe/recorder.h"

using namespace zt::probe;
using namespace zt::db;

TEST(Threads, EightThreadsTwoHundredThousandEventsEachNoneLost) {
  zt::test::TempDir dir;
  RecorderOptions o;
  o.path = dir.file("threads.db");
  o.crash_handlers = false;
  std::unique_ptr<Recorder> rec;
  ASSERT_TRUE(Recorder::open(o, &rec).ok());
  constexpr int kThreads = 8, kEvents = 200000;  // per thread, in groups of 4 events
  std::vector<DeviceId> devices;
  for (int t = 0; t < kThreads; ++t)
    devices.push_back(rec->add_device(t, DeviceKind::Sim, t, "cuda:" + std::to_string(t), "", std::nullopt, true));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      NameId name = rec->intern("thread" + std::to_string(t) + ".buf");
      NameId cname = rec->intern("allocated");
      for (int i = 0; i < kEvents / 4; ++i) {
        AllocEvent a;
        a.rank = t;
        a.device = devices[t];
        a.bytes = i + 1;
        a.name = name;
        AllocId id = rec->alloc(a);
        TransferEvent x;
        x.rank = t;
        x.bytes = 2 * i;
        x.src = x.dst = devices[t];
        rec->transfer(x);
        rec->counter(t, devices[t], cname, double(i));
        if (i % 2 == 0) rec->free(id);
        else rec->placement(t, name, devices[t], PlacementWhy::Moved, i);
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(rec->close().ok());
  EXPECT_EQ(rec->events_dropped(), 0u);

  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(o.path, &r).ok());
  auto q = [&](const std::string& sql) {
    QueryResult res;
    zt::Status s = r->query(sql, &res);
    EXPECT_TRUE(s.ok()) << s.message();
    return res.rows.at(0).at(0);
  };
  const int64_t n = kEvents / 4;
  const int64_t per_thread_bytes = n * (n + 1) / 2;
  EXPECT_EQ(q("SELECT count(*) FROM allocation"), std::to_string(kThreads * n));
  EXPECT_EQ(q("SELECT count(DISTINCT id) FROM allocation"), std::to_string(kThreads * n));
  EXPECT_EQ(q("SELECT sum(bytes) FROM allocation"), std::to_string(kThreads * per_thread_bytes));
  EXPECT_EQ(q("SELECT count(*) FROM allocation WHERE t_free IS NOT NULL"), std::to_string(kThreads * n / 2));
  EXPECT_EQ(q("SELECT count(*) FROM transfer"), std::to_string(kThreads * n));
  EXPECT_EQ(q("SELECT sum(bytes) FROM transfer"), std::to_string(kThreads * n * (n - 1)));
  EXPECT_EQ(q("SELECT count(*) FROM counter"), std::to_string(kThreads * n));
  EXPECT_EQ(q("SELECT sum(value) FROM counter"), std::to_string(kThreads * n * (n - 1) / 2));
  EXPECT_EQ(q("SELECT count(*) FROM placement"), std::to_string(kThreads * n / 2));
  EXPECT_EQ(q("SELECT count(*) FROM dropped"), "0");
  // Each thread's rows carry its own rank and device.
  EXPECT_EQ(q("SELECT count(*) FROM allocation a JOIN device d ON d.id = a.device_id WHERE d.rank != a.rank"), "0");
}
