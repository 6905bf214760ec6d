// Checkpoints (issue 5, first part): sharded saves, exact resume, torn and partial checkpoints
// refused by name with a fallback to the newest complete one, the `checkpoint` marker.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "ckpt/checkpoint.h"
#include "traced_run.h"
#include "train/trainer.h"
#include "zt/db/trace_reader.h"

using namespace zt::trainer;
namespace fs = std::filesystem;

namespace {

// Two ranks, ZeRO-3 with optimizer and parameter offload, every module sharded.
TrainConfig base(int64_t steps) {
  TrainConfig c = zt::test::tiny_run(steps);
  c.world_size = 2;
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.zero.offload_param = true;
  c.zero.param_persistence_threshold = 0;
  return c;
}

TrainSummary run(const TrainConfig& c, zt::Status* status = nullptr) {
  TrainSummary s;
  zt::Status st = train(c, nullptr, nullptr, &s);
  if (status) *status = st;
  else EXPECT_TRUE(st.ok()) << st.message();
  return s;
}

// The uninterrupted 6-step run, saving every 2 steps, with a trace: made once for the suite.
struct Reference {
  zt::test::TempDir tmp;
  std::string dir;  // its checkpoints: step000002, step000004, step000006
  zt::test::TracedRun traced;
};
Reference& reference() {
  static Reference* r = [] {
    auto* ref = new Reference;
    ref->dir = ref->tmp.file("ckpt");
    TrainConfig c = base(6);
    c.checkpoint_dir = ref->dir;
    c.save_every = 2;
    ref->traced = zt::test::train_traced(c, ref->tmp.file("ref.db"));
    return ref;
  }();
  return *r;
}

// A copy of the reference checkpoints to damage.
std::string copy_reference(const zt::test::TempDir& into) {
  const std::string dst = into.file("ckpt");
  fs::copy(reference().dir, dst, fs::copy_options::recursive);
  return dst;
}

// Resumes into `dir` for a 6-step run; expects a fallback to the step-4 checkpoint and the
// reference's losses of steps 5 and 6, bit for bit. Returns the notes on what was refused.
std::string resume_expecting_step4(const std::string& dir) {
  TrainConfig c = base(6);
  c.checkpoint_dir = dir;
  c.resume = true;
  zt::Status st;
  TrainSummary s = run(c, &st);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(s.resumed_from_step, 4);
  EXPECT_EQ(s.resumed_from, dir + "/step000004");
  const auto& ref = reference().traced.summary.losses;
  EXPECT_EQ(s.losses, std::vector<double>(ref.begin() + 4, ref.end()));
  EXPECT_NE(s.resume_notes.find("falling back to " + dir + "/step000004"), std::string::npos) << s.resume_notes;
  return s.resume_notes;
}

int64_t file_size(const std::string& path) { return int64_t(fs::file_size(path)); }

}  // namespace

TEST(Checkpoint, UninterruptedRunSavesEveryTwoSteps) {
  Reference& ref = reference();
  ASSERT_TRUE(ref.traced.status.ok()) << ref.traced.status.message();
  ASSERT_EQ(ref.traced.summary.losses.size(), 6u);
  EXPECT_EQ(ref.traced.summary.checkpoints_saved, 3);
  for (const char* tag : {"step000002", "step000004", "step000006"}) {
    ckpt::Manifest m;
    zt::Status s = ckpt::verify_checkpoint(ref.dir, tag, &m);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(m.world_size, 2);
    EXPECT_EQ(m.stage, 3);
    ASSERT_EQ(m.files.size(), 2u);
    EXPECT_EQ(m.files[1].name, "rank00001.zts");
  }
  std::ifstream latest(ref.dir + "/latest");
  std::string tag;
  std::getline(latest, tag);
  EXPECT_EQ(tag, "step000006");
  // Nothing left over from the writes: no temporary directories, no latest.tmp.
  for (const auto& e : fs::directory_iterator(ref.dir)) EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
  EXPECT_FALSE(fs::exists(ref.dir + "/latest.tmp"));
}

TEST(Checkpoint, FilesCarryMagicVersionAndTheManifestTheLayout) {
  const std::string d = reference().dir + "/step000004";
  std::ifstream shard(d + "/rank00001.zts", std::ios::binary);
  char header[32];
  shard.read(header, sizeof header);
  ASSERT_EQ(shard.gcount(), 32);
  EXPECT_EQ(std::string(header, 8), "ZTCKSHRD");
  uint32_t version, header_bytes, rank, world;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&header_bytes, header + 12, 4);
  std::memcpy(&rank, header + 16, 4);
  std::memcpy(&world, header + 20, 4);
  EXPECT_EQ(version, ckpt::kFormatVersion);
  EXPECT_EQ(header_bytes, 128u);
  EXPECT_EQ(rank, 1u);
  EXPECT_EQ(world, 2u);
  std::ifstream mf(d + "/manifest.json");
  auto j = nlohmann::json::parse(mf);
  EXPECT_EQ(j["format"], "zerotrace-checkpoint");
  EXPECT_EQ(j["version"], ckpt::kFormatVersion);
  EXPECT_EQ(j["checksum"], "fnv1a64");
  EXPECT_EQ(j["tag"], "step000004");
  EXPECT_EQ(j["global_step"], 4);
  EXPECT_EQ(j["config"]["model"], "tiny");
  // tiny: embeddings, two blocks, the final LayerNorm; each padded to a multiple of 2 and halved.
  ASSERT_EQ(j["modules"].size(), 4u);
  for (auto& m : j["modules"]) {
    EXPECT_EQ(m["padded"].get<int64_t>() % 2, 0);
    EXPECT_GE(m["padded"].get<int64_t>(), m["numel"].get<int64_t>());
    EXPECT_EQ(m["shard"].get<int64_t>() * 2, m["padded"].get<int64_t>());
  }
  // Each shard holds 3 fp32 arrays of its optimizer range per module, plus header and trailer.
  int64_t opt_floats = 0;
  for (auto& m : j["modules"]) opt_floats += m["shard"].get<int64_t>();
  EXPECT_GT(j["files"][1]["bytes"].get<int64_t>(), 12 * opt_floats + 128 + 16);
  EXPECT_EQ(j["files"][1]["bytes"].get<int64_t>(), file_size(d + "/rank00001.zts"));
  EXPECT_EQ(j["files"][1]["fnv1a64"].get<std::string>().size(), 16u);
}

// Stop after step 4 (a 4-step run), resume for 6: steps 5 and 6 are bit-identical.
TEST(Checkpoint, ResumeAfterAStopIsBitIdentical) {
  zt::test::TempDir tmp;
  TrainConfig first = base(4);
  first.checkpoint_dir = tmp.file("ckpt");
  first.save_every = 2;
  TrainSummary a = run(first);
  const auto& ref = reference().traced.summary.losses;
  ASSERT_EQ(ref.size(), 6u);
  EXPECT_EQ(a.losses, std::vector<double>(ref.begin(), ref.begin() + 4));

  TrainConfig second = base(6);
  second.checkpoint_dir = first.checkpoint_dir;
  second.resume = true;
  TrainSummary b = run(second);
  EXPECT_EQ(b.resumed_from_step, 4);
  EXPECT_TRUE(b.resume_notes.empty()) << b.resume_notes;
  ASSERT_EQ(b.losses.size(), 2u);
  EXPECT_EQ(b.losses[0], ref[4]);  // bit for bit
  EXPECT_EQ(b.losses[1], ref[5]);
  EXPECT_EQ(b.steps, 6);
}

// The other engine paths: optimizer state on the device (staged to the host to save), stage 1's
// all-gather of updated shards on load, fp16 with its dynamic loss scaler and its step counts.
TEST(Checkpoint, ResumeIsBitIdenticalWithDeviceStateAndFp16Scaling) {
  zt::test::TempDir tmp;
  TrainConfig c = base(6);
  c.zero = ZeroSettings{};
  c.zero.stage = 1;
  c.precision = "fp16";
  c.zero.initial_scale_power = 8;
  c.zero.loss_scale_window = 2;  // the scale doubles after every 2 good steps: 3 is mid-window
  auto scales = [](const zt::test::TracedRun& r) {
    zt::db::QueryResult q;
    EXPECT_TRUE(r.reader->query("SELECT value FROM counter_v WHERE rank = 0 AND name = 'loss_scale' ORDER BY t", &q).ok());
    std::vector<std::string> v;
    for (auto& row : q.rows) v.push_back(row[0]);
    return v;
  };
  zt::test::TracedRun whole = zt::test::train_traced(c, tmp.file("whole.db"));
  ASSERT_TRUE(whole.status.ok()) << whole.status.message();
  c.steps = 3;
  c.checkpoint_dir = tmp.file("ckpt");
  c.save_every = 3;
  run(c);
  c.steps = 6;
  c.resume = true;
  zt::test::TracedRun resumed = zt::test::train_traced(c, tmp.file("resumed.db"));
  ASSERT_TRUE(resumed.status.ok()) << resumed.status.message();
  EXPECT_EQ(resumed.summary.resumed_from_step, 3);
  const auto& w = whole.summary.losses;
  EXPECT_EQ(resumed.summary.losses, std::vector<double>(w.begin() + 3, w.end()));
  // The scaler went on where it was: the same scale after each of steps 4-6.
  const auto ws = scales(whole), rs = scales(resumed);
  ASSERT_EQ(ws.size(), 6u);
  EXPECT_EQ(rs, std::vector<std::string>(ws.begin() + 3, ws.end()));
  EXPECT_NE(ws.front(), ws.back());
}

TEST(Checkpoint, TruncatedShardIsRefusedByNameWithFallback) {
  zt::test::TempDir tmp;
  const std::string dir = copy_reference(tmp);
  const std::string bad = dir + "/step000006/rank00001.zts";
  fs::resize_file(bad, fs::file_size(bad) - 100);
  const std::string notes = resume_expecting_step4(dir);
  EXPECT_NE(notes.find(bad + " is "), std::string::npos) << notes;
  EXPECT_NE(notes.find("truncated"), std::string::npos) << notes;
}

TEST(Checkpoint, CorruptedByteIsRefusedByNameWithFallback) {
  zt::test::TempDir tmp;
  const std::string dir = copy_reference(tmp);
  const std::string bad = dir + "/step000006/rank00000.zts";
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    char b = 0;
    f.read(&b, 1);
    b ^= 0x10;
    f.seekp(1000);
    f.write(&b, 1);
  }
  const std::string notes = resume_expecting_step4(dir);
  EXPECT_NE(notes.find(bad + ": checksum fnv1a64"), std::string::npos) << notes;
  EXPECT_NE(notes.find("corrupted"), std::string::npos) << notes;
}

TEST(Checkpoint, MissingManifestIsRefusedByNameWithFallback) {
  zt::test::TempDir tmp;
  const std::string dir = copy_reference(tmp);
  fs::remove(dir + "/step000006/manifest.json");
  const std::string notes = resume_expecting_step4(dir);
  EXPECT_NE(notes.find(dir + "/step000006/manifest.json is missing"), std::string::npos) << notes;
}

TEST(Checkpoint, MissingShardIsRefusedByNameWithFallback) {
  zt::test::TempDir tmp;
  const std::string dir = copy_reference(tmp);
  fs::remove(dir + "/step000006/rank00001.zts");
  const std::string notes = resume_expecting_step4(dir);
  EXPECT_NE(notes.find(dir + "/step000006/rank00001.zts is missing"), std::string::npos) << notes;
}

// A save that died after some of its writes: `latest` names a torn directory.
TEST(Checkpoint, LatestPointingToATornDirectoryFallsBack) {
  zt::test::TempDir tmp;
  const std::string dir = copy_reference(tmp);
  fs::create_directory(dir + "/step000008");
  fs::copy_file(dir + "/step000006/rank00000.zts", dir + "/step000008/rank00000.zts");
  fs::create_directory(dir + "/.tmp-step000010");  // and an interrupted save, ignored
  { std::ofstream(dir + "/latest") << "step000008\n"; }
  TrainConfig c = base(6);
  c.checkpoint_dir = dir;
  c.resume = true;
  TrainSummary s = run(c);
  EXPECT_EQ(s.resumed_from_step, 6);
  EXPECT_TRUE(s.losses.empty());
  EXPECT_NE(s.resume_notes.find("checkpoint " + dir + "/step000008 (latest) refused: " + dir +
                                "/step000008/manifest.json is missing"),
            std::string::npos)
      << s.resume_notes;
  EXPECT_NE(s.resume_notes.find("falling back to " + dir + "/step000006"), std::string::npos) << s.resume_notes;

  std::string text;
  ASSERT_TRUE(ckpt::describe_checkpoints(dir, &text).ok());
  EXPECT_NE(text.find("(latest -> step000008)"), std::string::npos) << text;
  EXPECT_NE(text.find("step000006  complete: step 6"), std::string::npos) << text;
  EXPECT_NE(text.find("step000008  INCOMPLETE: " + dir + "/step000008/manifest.json is missing"), std::string::npos) << text;
  EXPECT_NE(text.find(".tmp-step000010  an interrupted save"), std::string::npos) << text;
}

// A resumed run that saves the tag of a damaged checkpoint again replaces it with a good one.
TEST(Checkpoint, SavingOverADamagedTagReplacesIt) {
  zt::test::TempDir tmp;
  const std::string dir = copy_reference(tmp);
  fs::remove(dir + "/step000006/rank00001.zts");
  TrainConfig c = base(6);
  c.checkpoint_dir = dir;
  c.resume = true;
  c.save_every = 2;
  TrainSummary s = run(c);
  EXPECT_EQ(s.resumed_from_step, 4);
  EXPECT_EQ(s.checkpoints_saved, 1);
  zt::Status v = ckpt::verify_checkpoint(dir, "step000006", nullptr);
  EXPECT_TRUE(v.ok()) << v.message();
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
  // The same bytes as the uninterrupted run's step-6 checkpoint.
  auto bytes = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  for (const char* f : {"rank00000.zts", "rank00001.zts"})
    EXPECT_EQ(bytes(dir + "/step000006/" + f), bytes(reference().dir + "/step000006/" + f)) << f;
}

TEST(Checkpoint, NoCompleteCheckpointIsAnErrorNamingEachFile) {
  zt::test::TempDir tmp;
  const std::string dir = copy_reference(tmp);
  for (const char* t : {"step000002", "step000004", "step000006"}) fs::remove(dir + "/" + t + "/rank00000.zts");
  TrainConfig c = base(6);
  c.checkpoint_dir = dir;
  c.resume = true;
  zt::Status st;
  run(c, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no complete checkpoint"), std::string::npos) << st.message();
  for (const char* t : {"step000002", "step000004", "step000006"})
    EXPECT_NE(st.message().find(dir + "/" + t + "/rank00000.zts is missing"), std::string::npos) << st.message();

  c.checkpoint_dir = tmp.file("nothing-here");
  run(c, &st);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("nothing-here: no such checkpoint directory"), std::string::npos) << st.message();
}

TEST(Checkpoint, ADifferentWorldSizeIsRefusedForNow) {
  TrainConfig c = base(6);
  c.world_size = 4;
  c.checkpoint_dir = reference().dir;
  c.resume = true;
  zt::Status st;
  run(c, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("saved by 2 ranks; this run has --world-size 4"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("run with --world-size 2"), std::string::npos) << st.message();
}

TEST(Checkpoint, SettingsNeedADirectory) {
  TrainConfig c = base(2);
  c.save_every = 1;
  zt::Status st;
  run(c, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--save-every needs --checkpoint-dir"), std::string::npos) << st.message();
}

// Each rank's save is a `checkpoint` phase marker whose value is the bytes it wrote: its shard,
// and on rank 0 also the manifest and the `latest` pointer.
TEST(Checkpoint, EachSaveIsAMarkerWithItsBytes) {
  Reference& ref = reference();
  ASSERT_NE(ref.traced.reader, nullptr);
  zt::db::QueryResult q;
  ASSERT_TRUE(ref.traced.reader
                  ->query("SELECT rank, step, value, kind FROM marker_v WHERE name = 'checkpoint' ORDER BY step, rank", &q)
                  .ok());
  ASSERT_EQ(q.rows.size(), 6u);  // 3 saves x 2 ranks
  for (size_t i = 0; i < q.rows.size(); ++i) {
    const int rank = std::stoi(q.rows[i][0]);
    const int64_t step = std::stoll(q.rows[i][1]);
    EXPECT_EQ(rank, int(i % 2));
    EXPECT_EQ(step, int64_t(i / 2) * 2 + 1);  // saved after steps 1, 3, 5 (0-based): 2, 4, 6 done
    EXPECT_EQ(q.rows[i][3], "phase");
    const std::string d = ref.dir + "/" + ckpt::tag_for_step(step + 1);
    int64_t expected = file_size(d + "/" + (rank == 0 ? "rank00000.zts" : "rank00001.zts"));
    if (rank == 0) expected += file_size(d + "/manifest.json") + int64_t(std::string("step000002\n").size());
    EXPECT_EQ(std::stoll(q.rows[i][2]), expected) << "rank " << rank << " step " << step;
  }
}
