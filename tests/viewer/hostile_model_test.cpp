// Issue 29: the viewer's model takes a trace from anywhere. Each of the issue's files (a string id
// of -5 or 4e12, a device on rank 2^31-1, an allocation at INT64_MIN) and a bad value in a table the
// model streams itself is refused with a Status naming the file, the table, the row and the value;
// nothing is sized by a value from the file: sparse string ids are renumbered, and tracks are made
// for the ranks the trace has, not for every number below the highest.
#include <gtest/gtest.h>

#include <filesystem>

#include "hand_trace.h"
#include "hostile_traces.h"
#include "known_trace.h"
#include "model/trace_model.h"
#include "test_util.h"

using namespace zt;
using namespace zt::viewer;

namespace {

std::string known(const test::TempDir& dir) {
  std::string err;
  const std::string path = dir.file("known.db");
  EXPECT_TRUE(test::write_known_trace(path, &err)) << err;
  return path;
}

}  // namespace

TEST(HostileModel, TheIssuesTracesAndBadStreamedRowsAreRefusedNamingTheValue) {
  struct Case {
    const char* sql;
    const char* expected;
  } cases[] = {
      {test::kIssueTraceEdits[0].sql, test::kIssueTraceEdits[0].refusal},
      {test::kIssueTraceEdits[1].sql, test::kIssueTraceEdits[1].refusal},
      {test::kIssueTraceEdits[2].sql, test::kIssueTraceEdits[2].refusal},
      {test::kIssueTraceEdits[3].sql, test::kIssueTraceEdits[3].refusal},
      {test::kIssueTraceEdits[4].sql, test::kIssueTraceEdits[4].refusal},
      {"UPDATE transfer SET kind=77 WHERE id=2", "transfer row 2: kind is 77"},
      {"UPDATE kernel SET t_end=0", ""},  // no kernel rows in this trace: nothing to refuse
      {"UPDATE placement SET tensor_id=0 WHERE id=1", ""},  // read when the placement view opens
      {"UPDATE allocation SET bytes=9007199254740993 WHERE id=2", "allocation row 2: bytes is 9007199254740993"},
  };
  for (const Case& c : cases) {
    test::TempDir dir;
    const std::string path = known(dir);
    test::edit_trace(path, c.sql);
    std::unique_ptr<TraceModel> m;
    Status s = TraceModel::load(path, &m);
    if (!*c.expected) {
      EXPECT_TRUE(s.ok()) << c.sql << ": " << s.message();
      continue;
    }
    ASSERT_FALSE(s.ok()) << c.sql;
    EXPECT_EQ(s.message().rfind(path + ": ", 0), 0u) << s.message();
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << c.sql << "\n" << s.message();
  }
  // Placements are checked when they are read.
  test::TempDir dir;
  const std::string path = known(dir);
  test::edit_trace(path, "UPDATE placement SET t=-3 WHERE id=2");
  std::unique_ptr<TraceModel> m;
  ASSERT_TRUE(TraceModel::load(path, &m));
  Status s = m->load_placements();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("placement row 2: t is -3"), std::string::npos) << s.message();
  EXPECT_EQ(m->place.size(), 0u);
}

// String ids up to 2^31 - 1 are valid, and need not be dense: a file whose ids are sparse loads
// with its names, and no vector is sized by the largest id.
TEST(HostileModel, SparseStringIdsAreRenumberedNotUsedAsSizes) {
  test::TempDir dir;
  const std::string path = known(dir);
  test::edit_trace(path,
       "UPDATE allocation SET name_id = name_id + 2000000000; UPDATE marker SET name_id = name_id + 2000000000;"
       "UPDATE transfer SET name_id = name_id + 2000000000, op_id = op_id + 2000000000;"
       "UPDATE placement SET tensor_id = tensor_id + 2000000000; UPDATE string SET id = id + 2000000000;");
  std::unique_ptr<TraceModel> m;
  Status s = TraceModel::load(path, &m);
  ASSERT_TRUE(s.ok()) << s.message();
  bool leak_named = false;
  for (size_t i = 0; i < m->alloc.size(); ++i) leak_named = leak_named || m->str(m->alloc.name[i]) == "offload.buffer[epoch 0]";
  EXPECT_TRUE(leak_named);
  EXPECT_EQ(m->str(m->xfer.op[1]), "all_gather");
  EXPECT_GT(m->intern_lookup("forward"), 0);
  ASSERT_TRUE(m->load_placements());
  EXPECT_EQ(m->str(m->place.tensor[0]), "block0.grad[shard]");
}

// The highest rank a trace may name is 2^20 - 1: tracks are made for the ranks it has.
TEST(HostileModel, TracksAreForTheRanksTheTraceHas) {
  test::TempDir dir;
  const std::string path = known(dir);
  test::edit_trace(path, "UPDATE rank SET rank = 1048575; UPDATE device SET rank = 1048575; UPDATE marker SET rank = 1048575;"
             "UPDATE transfer SET rank = 1048575; UPDATE allocation SET rank = 1048575");
  std::unique_ptr<TraceModel> m;
  Status s = TraceModel::load(path, &m);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_FALSE(m->tracks.empty());
  for (const Track& t : m->tracks) EXPECT_EQ(t.rank, 1048575) << t.title;
  EXPECT_LT(m->tracks.size(), 12u);
  EXPECT_EQ(m->tracks.front().title, "rank 1048575 · epochs, steps, phases");
}
