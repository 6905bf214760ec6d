// Checkpoints (issue 5): sharded saves, exact resume, torn and partial checkpoints refused by
// name with a fallback to the newest complete one, the `checkpoint` marker and the peak of its
// temporary device memory, resuming with another world size, weights-only saves, the
// ckpt.torn_write fault, the settings as YAML keys. (Kill tests: ckpt_kill_test.cpp; the
// consolidated weights' gathers: ckpt_gather_test.cpp; the file format: safetensors_test.cpp.)
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../test_util.h"
#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "model/layout.h"
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
std::string bytes_of(const std::string& path) { return zt::test::read_file(path); }

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
  EXPECT_EQ(j["checksum"], "xxh64");
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
  EXPECT_EQ(j["files"][1]["xxh64"].get<std::string>().size(), 16u);
  EXPECT_EQ(j["model_config"]["width"], 64);
  EXPECT_FALSE(j["save_only_model"].get<bool>());
  EXPECT_FALSE(j.contains("model_files"));  // no consolidated weights asked for
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
  EXPECT_NE(notes.find(bad + ": checksum xxh64"), std::string::npos) << notes;
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

// A fresh run (no --resume) saving into another run's checkpoints is refused before anything is
// written: it would replace some of them and leave the rest, two runs mixed in one directory.
TEST(Checkpoint, AFreshRunDoesNotSaveOverAnotherRunsCheckpoints) {
  zt::test::TempDir tmp;
  const std::string dir = copy_reference(tmp);
  const std::string latest_before = bytes_of(dir + "/latest"), shard_before = bytes_of(dir + "/step000002/rank00000.zts");
  TrainConfig c = base(6);
  c.checkpoint_dir = dir;
  c.save_every = 2;
  c.seed = 7;
  zt::Status st;
  run(c, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--checkpoint-dir " + dir + " already holds checkpoints"), std::string::npos) << st.message();
  EXPECT_EQ(check_inputs(c).message(), st.message());  // refused before the trace is opened too
  EXPECT_EQ(bytes_of(dir + "/latest"), latest_before);
  EXPECT_EQ(bytes_of(dir + "/step000002/rank00000.zts"), shard_before);
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

// ---------------------------------------------------------------- another world size

namespace {

// tiny, stage 3 with both offloads, W ranks of B sequences each.
TrainConfig at_world(int W, int B, int64_t steps) {
  TrainConfig c = base(steps);
  c.world_size = W;
  c.micro_batch = B;
  return c;
}

// The reference's checkpoints with step 4 as the newest (latest -> step000004).
std::string reference_up_to_step4(const zt::test::TempDir& into) {
  const std::string dir = copy_reference(into);
  fs::remove_all(dir + "/step000006");
  { std::ofstream(dir + "/latest") << "step000004\n"; }
  return dir;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << what << ", loss " << i;
}

}  // namespace

// Saved by 2 ranks of 2 sequences, resumed by 4 ranks of 1 and by 1 rank of 4: the global batch
// stays 4 sequences, and the loader splits each step's global batch over the ranks in order,
// so every run trains on the same samples at every step. The runs differ only in the order of
// float additions (each rank's mean, then the mean over ranks), so the losses after the resume
// follow an uninterrupted run at the new world size within fp32 rounding, not bit for bit.
TEST(Checkpoint, ResumeWithAnotherWorldSizeFollowsTheRunAtTheSameGlobalBatch) {
  const auto& saved_run = reference().traced.summary.losses;  // 2 ranks x 2, 6 steps
  for (int W : {4, 1}) {
    zt::test::TempDir tmp;
    const std::string dir = reference_up_to_step4(tmp);
    const TrainSummary whole = run(at_world(W, 4 / W, 6));
    ASSERT_EQ(whole.losses.size(), 6u);
    // The premise: the same samples per step, so 4 ranks of 1 follow 2 ranks of 2.
    expect_close(whole.losses, saved_run, 1e-5, "uninterrupted at world size " + std::to_string(W));

    TrainConfig c = at_world(W, 4 / W, 6);
    c.checkpoint_dir = dir;
    c.resume = true;
    std::ostringstream progress;
    TrainSummary s;
    zt::Status st = train(c, nullptr, &progress, &s);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(s.resumed_from_step, 4);
    EXPECT_NE(progress.str().find("re-splitting the optimizer state of 2 ranks for " + std::to_string(W)), std::string::npos)
        << progress.str();
    EXPECT_EQ(progress.str().find("global batch changes"), std::string::npos) << progress.str();
    expect_close(s.losses, std::vector<double>(whole.losses.begin() + 4, whole.losses.end()), 1e-5,
                 "resumed at world size " + std::to_string(W));
  }
}

// An uneven split: modules padded to a multiple of 2 saved, re-split into thirds (global batch 6).
TEST(Checkpoint, ResumeFromTwoRanksOntoThreeRepadsEveryModule) {
  zt::test::TempDir tmp;
  TrainConfig first = at_world(2, 3, 4);
  first.checkpoint_dir = tmp.file("ckpt");
  first.save_every = 4;
  const TrainSummary a = run(first);
  const TrainSummary whole = run(at_world(3, 2, 6));
  expect_close(a.losses, std::vector<double>(whole.losses.begin(), whole.losses.begin() + 4), 1e-5, "2x3 against 3x2");
  TrainConfig c = at_world(3, 2, 6);
  c.checkpoint_dir = first.checkpoint_dir;
  c.resume = true;
  const TrainSummary s = run(c);
  EXPECT_EQ(s.resumed_from_step, 4);
  expect_close(s.losses, std::vector<double>(whole.losses.begin() + 4, whole.losses.end()), 1e-5, "resumed at 3 ranks");
  // The global batch changing is said, not refused: here 3 ranks x 1 (3) against the saved 6.
  c.micro_batch = 1;
  std::ostringstream progress;
  TrainSummary t;
  ASSERT_TRUE(train(c, nullptr, &progress, &t).ok());
  EXPECT_NE(progress.str().find("the global batch changes from 6 to 3 samples"), std::string::npos) << progress.str();
}

// ---------------------------------------------------------------- weights only, faults, settings

// save_only_model (R4's fix): the consolidated weights, streamed, and nothing else; resuming
// from it is refused with the reason; `zt ckpt consolidate` still reads it.
TEST(Checkpoint, SaveOnlyModelWritesOnlyTheWeightsAndIsNotResumable) {
  zt::test::TempDir tmp;
  TrainConfig c = base(2);
  c.checkpoint_dir = tmp.file("ckpt");
  c.save_every = 2;
  c.save_only_model = true;
  c.checkpoint_gather = "device";  // save_only_model streams whatever this says
  {
    zt::test::TracedRun traced = zt::test::train_traced(c, tmp.file("t.db"));
    ASSERT_TRUE(traced.status.ok()) << traced.status.message();
    // The peak temporary device memory of each rank's save: the largest module (a block),
    // gathered whole in fp32, plus its shard copied from the host (offload_param).
    int64_t largest = 0;
    for (const auto& m : zt::model::module_table(*zt::model::preset("tiny"))) {
      const int64_t padded = (m.numel + 1) / 2 * 2;
      largest = std::max(largest, padded * 4 + padded / 2 * 4);
    }
    zt::db::QueryResult q;
    ASSERT_TRUE(traced.reader
                    ->query("SELECT rank, value FROM counter_v WHERE name = 'checkpoint.peak_temp_device_bytes' ORDER BY rank", &q)
                    .ok());
    ASSERT_EQ(q.rows.size(), 2u);
    for (auto& row : q.rows) EXPECT_EQ(std::stoll(row[1]), largest) << "rank " << row[0];
  }
  const std::string d = c.checkpoint_dir + "/step000002";
  for (const char* f : {"model.safetensors", "config.json", "manifest.json"}) EXPECT_TRUE(fs::exists(d + "/" + f)) << f;
  for (const auto& e : fs::directory_iterator(d)) EXPECT_NE(e.path().extension(), ".zts") << e.path();
  ckpt::Manifest m;
  ASSERT_TRUE(ckpt::verify_checkpoint(c.checkpoint_dir, "step000002", &m).ok());
  EXPECT_TRUE(m.model_only);
  EXPECT_TRUE(m.files.empty());
  std::ifstream mf(d + "/manifest.json");
  EXPECT_EQ(nlohmann::json::parse(mf)["weights"]["gather"], "streamed");
  std::string text;
  ASSERT_TRUE(ckpt::describe_checkpoints(c.checkpoint_dir, &text).ok());
  EXPECT_NE(text.find("step000002  complete: step 2"), std::string::npos) << text;
  EXPECT_NE(text.find("weights only (save_only_model: not resumable)"), std::string::npos) << text;

  TrainConfig r = base(4);
  r.checkpoint_dir = c.checkpoint_dir;
  r.resume = true;
  zt::Status st;
  run(r, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--resume: " + c.checkpoint_dir + ": no complete checkpoint to resume from"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(d + " holds only the model weights (saved with save_only_model: no optimizer state), so "
                                  "training cannot resume from it"),
            std::string::npos)
      << st.message();

  ckpt::ConsolidateReport rep;
  st = ckpt::consolidate(c.checkpoint_dir, "", tmp.file("m.safetensors"), DType::F32, &rep);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(rep.source, "model.safetensors (fp32)");
  ckpt::SafetensorsFile a, b;
  ASSERT_TRUE(ckpt::read_safetensors(d + "/model.safetensors", &a).ok());
  ASSERT_TRUE(ckpt::read_safetensors(tmp.file("m.safetensors"), &b).ok());
  std::vector<float> x, y;
  for (const auto& t : a.tensors) {
    ASSERT_TRUE(ckpt::read_tensor_f32(a, t.name, &x).ok());
    ASSERT_TRUE(ckpt::read_tensor_f32(b, t.name, &y).ok());
    EXPECT_EQ(x, y) << t.name;
  }
}

// ckpt.torn_write: the save stops after the shards, before the manifest; the run fails there,
// the torn directory stays, `latest` still names the previous checkpoint, and a resume uses it.
TEST(Checkpoint, TornWriteFaultLeavesATornSaveThatResumeSkips) {
  zt::test::TempDir tmp;
  TrainConfig c = base(6);
  c.checkpoint_dir = tmp.file("ckpt");
  c.save_every = 2;
  c.faults = {"ckpt.torn_write[step=3]=return"};  // the save after the 4th step
  zt::Status st;
  TrainSummary s = run(c, &st);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("checkpoint save interrupted (fault ckpt.torn_write)"), std::string::npos) << st.message();
  EXPECT_EQ(s.checkpoints_saved, 1);
  const std::string torn = c.checkpoint_dir + "/.tmp-step000004";
  EXPECT_TRUE(fs::exists(torn + "/rank00000.zts"));
  EXPECT_TRUE(fs::exists(torn + "/rank00001.zts"));
  EXPECT_FALSE(fs::exists(torn + "/manifest.json"));
  EXPECT_FALSE(fs::exists(c.checkpoint_dir + "/step000004"));
  std::string text;
  ASSERT_TRUE(ckpt::describe_checkpoints(c.checkpoint_dir, &text).ok());
  EXPECT_NE(text.find("(latest -> step000002)"), std::string::npos) << text;
  EXPECT_NE(text.find(".tmp-step000004  an interrupted save"), std::string::npos) << text;

  c.faults.clear();
  c.resume = true;
  TrainSummary r = run(c);
  EXPECT_EQ(r.resumed_from_step, 2);
  EXPECT_TRUE(r.resume_notes.empty()) << r.resume_notes;
  const auto& ref = reference().traced.summary.losses;
  EXPECT_EQ(r.losses, std::vector<double>(ref.begin() + 2, ref.end()));
  EXPECT_FALSE(fs::exists(torn));  // the next save of that tag removed it
}

TEST(Checkpoint, SettingsAreYamlKeysAndPartOfTheRunConfig) {
  zt::test::TempDir tmp;
  const std::string yaml = tmp.file("run.yaml");
  {
    std::ofstream(yaml) << "checkpoint-dir: ck\nsave_every: 3\nresume: true\ncheckpoint_gather: device\n"
                           "save_only_model: true\nsave_safetensors: true\n";
  }
  TrainConfig c;
  ASSERT_TRUE(load_train_config(yaml, &c).ok());
  EXPECT_EQ(c.checkpoint_dir, "ck");
  EXPECT_EQ(c.save_every, 3);
  EXPECT_TRUE(c.resume);
  EXPECT_EQ(c.checkpoint_gather, "device");
  EXPECT_TRUE(c.save_only_model);
  EXPECT_TRUE(c.save_safetensors);
  const auto j = nlohmann::json::parse(to_json(c));
  EXPECT_EQ(j["checkpoint_dir"], "ck");
  EXPECT_EQ(j["save_every"], 3);
  EXPECT_EQ(j["resume"], true);
  EXPECT_EQ(j["checkpoint_gather"], "device");
  EXPECT_EQ(j["save_only_model"], true);
  EXPECT_EQ(j["save_safetensors"], true);
  EXPECT_EQ(j["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"], false);
  c.checkpoint_gather = "sideways";
  zt::Status s = validate(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(yaml + ": checkpoint_gather 'sideways': use streamed"), std::string::npos) << s.message();
}

// DeepSpeed's stage3_gather_16bit_weights_on_model_save turns the consolidated weights on, as
// --save-safetensors does: each save then holds model.safetensors and config.json too.
TEST(Checkpoint, DeepSpeedGather16bitWeightsWritesTheConsolidatedWeights) {
  zt::test::TempDir tmp;
  const std::string ds = tmp.file("ds.json");
  {
    std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
      "offload_param": {"device": "cpu"}, "stage3_gather_16bit_weights_on_model_save": true}})";
  }
  TrainConfig c = base(2);
  std::vector<std::string> warnings;
  zt::Status s = load_deepspeed_config(ds, &c, &warnings);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_TRUE(c.zero.gather_16bit_weights_on_model_save);
  c.checkpoint_dir = tmp.file("ckpt");
  c.save_every = 2;
  run(c);
  ckpt::Manifest m;
  ASSERT_TRUE(ckpt::verify_checkpoint(c.checkpoint_dir, "step000002", &m).ok());
  ASSERT_EQ(m.model_files.size(), 2u);
  EXPECT_EQ(m.model_files[0].name, "model.safetensors");
  EXPECT_EQ(m.model_files[1].name, "config.json");
  EXPECT_EQ(m.files.size(), 2u);  // and the shards, as always
  ckpt::SafetensorsFile f;
  EXPECT_TRUE(ckpt::read_safetensors(c.checkpoint_dir + "/step000002/model.safetensors", &f).ok());
}
