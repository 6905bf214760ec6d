// Chrome export parsed back against row counts; merge of four rank files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sqlite3.h>
#include <unistd.h>

#include "../test_util.h"
#include "zt/db/export.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_writer.h"
#include "zt/probe/recorder.h"
#include "zt/probe/synthetic.h"

using namespace zt::db;
using namespace zt::probe;

namespace {

// One rank's trace, as a per-rank process of a multi-process run would write it.
std::string rank_trace(const zt::test::TempDir& dir, int rank, int world) {
  RecorderOptions o;
  o.path = dir.file("rank" + std::to_string(rank) + ".db");
  o.command_line = "rank " + std::to_string(rank);
  o.crash_handlers = false;
  std::unique_ptr<Recorder> rec;
  EXPECT_TRUE(Recorder::open(o, &rec).ok());
  rec->add_rank(rank, world, rank);
  DeviceId gpu = rec->add_device(rank, DeviceKind::Sim, rank, "cuda:" + std::to_string(rank), "sim", 1 << 30, true);
  NameId shared = rec->intern("block0.gathered");  // the same name in every file
  NameId own = rec->intern("only.on.rank" + std::to_string(rank));
  for (int i = 0; i <= rank; ++i) {
    AllocEvent a;
    a.rank = rank;
    a.device = gpu;
    a.bytes = 1000 * (rank + 1);
    a.name = i == 0 ? shared : own;
    AllocId id = rec->alloc(a);
    if (i == 0) rec->free(id);
  }
  TransferEvent t;
  t.rank = rank;
  t.kind = TransferKind::Collective;
  t.bytes = 4096;
  t.src = t.dst = gpu;
  t.op = rec->intern("all_gather");
  t.name = shared;
  rec->transfer(t);
  MarkerId m = rec->marker_begin({rank, MarkerKind::Step, rec->intern("step 0"), 0, -1, 0, 0});
  rec->marker_end(m);
  rec->counter(rank, gpu, rec->intern("allocated"), 1000.0 * (rank + 1));
  zt::db::FaultRow f;
  f.rank = rank;
  f.name = "demo.fault";
  rec->fault(f);
  EXPECT_TRUE(rec->close().ok());
  return o.path;
}

// A process of a probed run that is not a rank (a launcher or a helper), as the probe writes it:
// key 0, its role and job rank, one allocation of `bytes` on its cpu device.
std::string process_trace(const zt::test::TempDir& dir, const std::string& name, RankRole role,
                          std::optional<int> job_rank, int64_t bytes, int world = 2) {
  RecorderOptions o;
  o.path = dir.file(name + ".db");
  o.command_line = name;
  o.crash_handlers = false;
  std::unique_ptr<Recorder> rec;
  EXPECT_TRUE(Recorder::open(o, &rec).ok());
  rec->add_rank(0, world, std::nullopt, role, job_rank);
  DeviceId cpu = rec->add_device(0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false);
  AllocEvent a;
  a.device = cpu;
  a.memory_kind = MemoryKind::PageableHost;
  a.bytes = bytes;
  rec->alloc(a);
  rec->counter(0, cpu, rec->intern("host_rss"), double(bytes));
  EXPECT_TRUE(rec->close().ok());
  return o.path;
}

std::string rank_table(const std::string& path) {
  std::unique_ptr<TraceReader> r;
  EXPECT_TRUE(TraceReader::open(path, &r).ok());
  std::vector<RankRow> ranks;
  EXPECT_TRUE(r->read(&ranks).ok());
  std::string s;
  for (auto& k : ranks)
    s += (s.empty() ? "" : " ") + std::to_string(k.rank) + ":" + std::string(to_string(k.role)) + ":" +
         (k.job_rank ? std::to_string(*k.job_rank) : "-");
  return s;
}

int64_t count(TraceReader& r, const std::string& table) {
  int64_t n = 0;
  EXPECT_TRUE(r.row_count(table, &n).ok());
  return n;
}

}  // namespace

TEST(ChromeExport, ParsesBackAndMatchesRowCounts) {
  zt::test::TempDir dir;
  RecorderOptions o;
  o.path = dir.file("s.db");
  o.crash_handlers = false;
  std::unique_ptr<Recorder> rec;
  ASSERT_TRUE(Recorder::open(o, &rec).ok());
  SyntheticOptions so;
  so.leak_bytes_per_epoch = 1 << 20;
  record_synthetic(*rec, so);
  zt::db::ErrorRow e;
  e.message = "Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cpu!";
  e.rank = 1;
  rec->error(e);
  zt::db::FaultRow f;
  f.name = "zero.norm_on_device";
  rec->fault(f);
  // A loss that diverged: JSON has no number for these, so they are left out (and the file parses).
  rec->counter(0, 0, rec->intern("loss"), INFINITY);
  rec->counter(0, 0, rec->intern("loss"), std::nan(""));
  ASSERT_TRUE(rec->close().ok());

  ExportStats st;
  zt::Status s = export_chrome(o.path, dir.file("s.json"), &st);
  ASSERT_TRUE(s.ok()) << s.message();
  std::ifstream in(dir.file("s.json"));
  nlohmann::json j = nlohmann::json::parse(in);  // throws (test fails) if not valid JSON
  ASSERT_TRUE(j.contains("traceEvents"));
  std::map<std::string, int64_t> by_ph, by_cat;
  int64_t alive = 0, negative = 0;
  for (auto& ev : j["traceEvents"]) {
    by_ph[ev["ph"].get<std::string>()]++;
    if (ev.contains("cat")) by_cat[ev["cat"].get<std::string>()]++;
    if (ev.contains("ts") && ev["ts"].get<double>() < 0) ++negative;
    if (ev["ph"] == "b" && ev["args"]["alive_at_end"].get<bool>()) ++alive;
  }
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(o.path, &r).ok());
  int64_t allocations = count(*r, "allocation"), transfers = count(*r, "transfer"), markers = count(*r, "marker"),
          counters = count(*r, "counter");
  int64_t frees = 0;
  {
    QueryResult q;
    ASSERT_TRUE(r->query("SELECT count(*) FROM allocation WHERE t_free IS NOT NULL", &q).ok());
    frees = std::stoll(q.rows[0][0]);
  }
  EXPECT_EQ(by_ph["b"], allocations);
  EXPECT_EQ(by_ph["e"], allocations);
  EXPECT_EQ(by_cat["transfer"], transfers);
  EXPECT_EQ(by_cat["marker"], markers);
  EXPECT_EQ(by_ph["X"], transfers + markers);
  EXPECT_EQ(by_ph["C"], counters - 2 + allocations + frees);  // counter rows but the two + live-bytes sweep
  EXPECT_EQ(by_cat["fault"], 1);
  EXPECT_EQ(by_cat["error"], 1);
  EXPECT_EQ(alive, 4);  // 2 ranks x 2 epochs of leaked buffers
  EXPECT_EQ(negative, 0);
  EXPECT_EQ(st.events, static_cast<int64_t>(j["traceEvents"].size()));
}

TEST(Merge, FourRankFilesBecomeOneTrace) {
  zt::test::TempDir dir;
  std::vector<std::string> inputs;
  for (int r = 0; r < 4; ++r) inputs.push_back(rank_trace(dir, r, 4));
  std::string out = dir.file("merged.db");
  zt::Status s = merge_traces(out, inputs, false);
  ASSERT_TRUE(s.ok()) << s.message();

  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(out, &r).ok());
  EXPECT_EQ(count(*r, "run"), 4);
  EXPECT_EQ(count(*r, "rank"), 4);
  EXPECT_EQ(count(*r, "device"), 4);
  EXPECT_EQ(count(*r, "allocation"), 1 + 2 + 3 + 4);
  EXPECT_EQ(count(*r, "transfer"), 4);
  EXPECT_EQ(count(*r, "marker"), 4);
  EXPECT_EQ(count(*r, "counter"), 4);
  EXPECT_EQ(count(*r, "fault"), 4);

  // Strings are interned once, and every reference still names the right text.
  QueryResult q;
  ASSERT_TRUE(r->query("SELECT count(*) FROM string WHERE text = 'block0.gathered'", &q).ok());
  EXPECT_EQ(q.rows[0][0], "1");
  ASSERT_TRUE(r->query("SELECT a.rank, d.label, d.rank, a.name, a.t_free IS NULL, a.bytes FROM allocation_v a"
                       " JOIN device d ON d.label = a.device ORDER BY a.rank, a.id",
                       &q)
                  .ok());
  ASSERT_EQ(q.rows.size(), 10u);
  for (auto& row : q.rows) {
    EXPECT_EQ(row[1], "cuda:" + row[0]);  // each allocation still on its own rank's device
    EXPECT_EQ(row[2], row[0]);
    EXPECT_EQ(row[5], std::to_string(1000 * (std::stoi(row[0]) + 1)));
    if (row[4] == "0") EXPECT_EQ(row[3], "block0.gathered");
    else EXPECT_EQ(row[3], "only.on.rank" + row[0]);
  }
  ASSERT_TRUE(r->query("SELECT rank, op, name FROM transfer_v ORDER BY rank", &q).ok());
  for (auto& row : q.rows) {
    EXPECT_EQ(row[1], "all_gather");
    EXPECT_EQ(row[2], "block0.gathered");
  }
  // Clocks kept: each rank's marker times are exactly those of its own file.
  for (int k = 0; k < 4; ++k) {
    std::unique_ptr<TraceReader> one;
    ASSERT_TRUE(TraceReader::open(inputs[k], &one).ok());
    std::vector<MarkerRow> a, b;
    ASSERT_TRUE(one->read(&a).ok());
    ASSERT_TRUE(r->read(&b).ok());
    auto it = std::find_if(b.begin(), b.end(), [&](const MarkerRow& m) { return m.rank == k; });
    ASSERT_NE(it, b.end());
    EXPECT_EQ(it->t_start, a[0].t_start);
    EXPECT_EQ(it->t_end, a[0].t_end);
  }
  std::vector<RunRow> runs;
  ASSERT_TRUE(r->read(&runs).ok());
  EXPECT_EQ(runs[2].source_file, inputs[2]);
}

// Ranks whose processes ran one after another (each file was written and closed before the next
// began): in the merged trace's export, what a process never freed leaves its memory counter when
// that process ended, not at the end of the whole trace. The last process's stays to the end.
TEST(ChromeExport, AMergedProcessesMemoryEndsWithIt) {
  zt::test::TempDir dir;
  std::vector<std::string> inputs;
  for (int r = 0; r < 3; ++r) inputs.push_back(rank_trace(dir, r, 3));
  const std::string merged = dir.file("merged.db");
  ASSERT_TRUE(merge_traces(merged, inputs, false).ok());
  ASSERT_TRUE(export_chrome(merged, dir.file("m.json")).ok());
  std::ifstream in(dir.file("m.json"));
  const nlohmann::json j = nlohmann::json::parse(in);
  std::map<int, int64_t> last_allocated;  // rank -> its memory counter's last value
  std::map<int, double> last_ts;
  for (const auto& ev : j["traceEvents"])
    if (ev["ph"] == "C" && ev["name"].get<std::string>().rfind("memory ", 0) == 0) {
      const int pid = ev["pid"].get<int>();
      if (!last_ts.count(pid) || ev["ts"].get<double>() >= last_ts[pid]) {
        last_ts[pid] = ev["ts"].get<double>();
        last_allocated[pid] = ev["args"]["allocated"].get<int64_t>();
      }
    }
  EXPECT_EQ(last_allocated[1], 0) << "rank 1 never freed 2000 bytes, and its process ended before rank 2's began";
  EXPECT_EQ(last_allocated[2], 3000 * 2) << "the last process's memory stays to the end of the trace";
  EXPECT_LT(last_ts[1], last_ts[2]);
}

TEST(Merge, SameRankTwiceIsRefused) {
  zt::test::TempDir dir;
  std::string a = rank_trace(dir, 0, 2);
  std::string b = dir.file("copy.db");
  std::filesystem::copy_file(a, b);
  zt::Status s = merge_traces(dir.file("m.db"), {a, b}, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("merge: rank 0 is in both " + a + " (pid "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("a job has one process per rank"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.db")));
}

TEST(Merge, ExistingOutputNeedsForce) {
  zt::test::TempDir dir;
  std::string a = rank_trace(dir, 0, 1);
  std::ofstream(dir.file("m.db")) << "keep";
  zt::Status s = merge_traces(dir.file("m.db"), {a}, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("already exists"), std::string::npos);
  std::ifstream f(dir.file("m.db"));
  std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "keep");
}

// Launchers and helpers are not ranks: their keys come after every rank and world size of the
// inputs, in input order, and everything they recorded moves with them. The ranks keep theirs.
TEST(Merge, LaunchersAndHelpersGetKeysAfterTheRanksInInputOrder) {
  zt::test::TempDir dir;
  const std::string launcher = process_trace(dir, "launcher", RankRole::Launcher, std::nullopt, 3000);
  const std::string helper = process_trace(dir, "helper", RankRole::Helper, 1, 5000);
  const std::string r1 = rank_trace(dir, 1, 2), r0 = rank_trace(dir, 0, 2);
  EXPECT_EQ(rank_table(launcher), "0:launcher:-");
  const std::string out = dir.file("m.db");
  zt::Status s = merge_traces(out, {launcher, r1, helper, r0}, false);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(rank_table(out), "0:rank:- 1:rank:- 2:launcher:- 3:helper:1");
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(out, &r).ok());
  QueryResult q;
  ASSERT_TRUE(r->query("SELECT a.rank, d.rank, a.bytes FROM allocation a JOIN device d ON d.id = a.device_id "
                       "WHERE a.bytes IN (3000, 5000) ORDER BY a.rank",
                       &q)
                  .ok());
  ASSERT_EQ(q.rows.size(), 2u);
  EXPECT_EQ(q.rows[0], (std::vector<std::string>{"2", "2", "3000"}));
  EXPECT_EQ(q.rows[1], (std::vector<std::string>{"3", "3", "5000"}));
  ASSERT_TRUE(r->query("SELECT group_concat(rank) FROM (SELECT rank FROM counter_v WHERE name = 'host_rss' ORDER BY rank)", &q).ok());
  EXPECT_EQ(q.rows[0][0], "2,3");
  // The Chrome export names them as processes, not ranks.
  ASSERT_TRUE(export_chrome(out, dir.file("m.json")).ok());
  std::ifstream in(dir.file("m.json"));
  const nlohmann::json j = nlohmann::json::parse(in);
  std::map<int, std::string> names;
  for (const auto& ev : j["traceEvents"])
    if (ev["ph"] == "M" && ev["name"] == "process_name") names[ev["pid"].get<int>()] = ev["args"]["name"];
  const std::string pid = std::to_string(::getpid());
  EXPECT_EQ(names[0], "rank 0");
  EXPECT_EQ(names[2], "launcher process " + pid);
  EXPECT_EQ(names[3], "helper process " + pid + " of rank 1");
  // Merged again with another launcher: the processes move on; ranks stay.
  const std::string other = process_trace(dir, "other", RankRole::Launcher, std::nullopt, 7000);
  const std::string out2 = dir.file("m2.db");
  ASSERT_TRUE(merge_traces(out2, {other, out}, false).ok());
  EXPECT_EQ(rank_table(out2), "0:rank:- 1:rank:- 2:launcher:- 3:launcher:- 4:helper:1");
  // Two launchers alone (no ranks at all): keys from 0 on.
  const std::string out3 = dir.file("m3.db");
  ASSERT_TRUE(merge_traces(out3, {launcher, other}, false).ok());
  EXPECT_EQ(rank_table(out3), "0:launcher:- 1:launcher:-");
}

// A forked worker (role 3) is a process of its rank after the merge, as a helper is: a key after
// the ranks, its job rank kept. A file written before role 3 existed gets the code in its enum
// table when rows are added to it.
TEST(Merge, AForkedWorkerStaysAProcessOfItsRank) {
  zt::test::TempDir dir;
  const std::string worker = process_trace(dir, "worker", RankRole::Worker, 1, 5000);
  const std::string r1 = rank_trace(dir, 1, 2), r0 = rank_trace(dir, 0, 2);
  EXPECT_EQ(rank_table(worker), "0:worker:1");
  const std::string out = dir.file("m.db");
  zt::Status s = merge_traces(out, {r0, worker, r1}, false);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(rank_table(out), "0:rank:- 1:rank:- 2:worker:1");

  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(r0.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DELETE FROM enum_rank_role WHERE code = 3", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  std::unique_ptr<TraceWriter> w;
  ASSERT_TRUE(TraceWriter::append(r0, &w).ok());
  w.reset();
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(r0, &r).ok());
  QueryResult q;
  ASSERT_TRUE(r->query("SELECT name FROM enum_rank_role WHERE code = 3", &q).ok());
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0][0], "worker");
}

// A trace written before rank roles (no rank.role, rank.job_rank): every row reads as a rank, and
// it merges with a new one.
TEST(Merge, AFileWithoutRankRolesReadsAsRanksAndMerges) {
  zt::test::TempDir dir;
  const std::string old = rank_trace(dir, 1, 2);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(old.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "ALTER TABLE rank DROP COLUMN role; ALTER TABLE rank DROP COLUMN job_rank; "
                             "DROP TABLE enum_rank_role;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  EXPECT_EQ(rank_table(old), "1:rank:-");
  const std::string helper = process_trace(dir, "helper", RankRole::Helper, 1, 5000);
  const std::string out = dir.file("m.db");
  zt::Status s = merge_traces(out, {old, helper}, false);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(rank_table(out), "1:rank:- 2:helper:1");
}

// Files zt probe did not number (it was killed with the job): every process under key 0, with the
// role and job rank it recorded. The merge gives each rank its job rank, and the run's first
// process, which named none, is the launcher, as zt probe would have made it.
TEST(Merge, ProbedFilesZtProbeDidNotNumberTakeTheirJobRanks) {
  zt::test::TempDir dir;
  const std::string root = process_trace(dir, "root", RankRole::Rank, std::nullopt, 3000, 1);
  const std::string r1 = process_trace(dir, "r1", RankRole::Rank, 1, 1000);
  const std::string r0 = process_trace(dir, "r0", RankRole::Rank, 0, 2000);
  const std::string helper = process_trace(dir, "helper", RankRole::Helper, 1, 5000);
  EXPECT_EQ(rank_table(r1), "0:rank:1");
  const std::string out = dir.file("m.db");
  zt::Status s = merge_traces(out, {root, r1, r0, helper}, false);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(rank_table(out), "0:rank:0 1:rank:1 2:launcher:- 3:helper:1");
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(out, &r).ok());
  QueryResult q;
  ASSERT_TRUE(r->query("SELECT group_concat(rank || '=' || bytes, ' ') FROM (SELECT * FROM allocation ORDER BY rank)", &q).ok());
  EXPECT_EQ(q.rows[0][0], "0=2000 1=1000 2=3000 3=5000");
  // Without any named rank the lone root stays rank 0.
  const std::string out2 = dir.file("m2.db");
  ASSERT_TRUE(merge_traces(out2, {root, helper}, false).ok());
  EXPECT_EQ(rank_table(out2), "0:rank:- 1:helper:1");
}
