// Kill tests of checkpoints (issue 5), for real: `zt train` runs as a child process and dies
// inside a save, at every boundary between two of the save's writes (the failpoint
// ckpt.between_writes with `panic`: abort()), and once by SIGKILL from here while it is
// inside a save. Each time, resuming from what it left picks the newest checkpoint that
// `latest` committed (never the torn one) and trains on bit for bit as the uninterrupted run.
// Also `zt ckpt info` and `zt ckpt consolidate`, run the same way.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <thread>

#include "../test_util.h"
#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "traced_run.h"
#include "train/trainer.h"

using namespace zt::trainer;
namespace fs = std::filesystem;

namespace {

// Two ranks, ZeRO-3 with both offloads, consolidated weights at every save: what the child's
// flags below say, as a config.
TrainConfig config(int64_t steps) {
  TrainConfig c = zt::test::tiny_run(steps);
  c.world_size = 2;
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.zero.offload_param = true;
  c.save_safetensors = true;
  c.save_every = 2;
  return c;
}

std::vector<std::string> child_args(const std::string& dir, const std::string& fault) {
  return {ZT_BINARY_DIR "/zt", "train",      "--model",        "tiny",      "--steps",         "4",
          "--micro-batch",     "2",          "--seq-len",      "32",        "--seed",          "3",
          "--world-size",      "2",          "--zero-stage",   "3",         "--offload-optimizer",
          "--offload-param",   "--checkpoint-dir", dir,        "--save-every", "2",           "--save-safetensors",
          "-q",                "--fault",    fault};
}

// fork + exec; the child's output goes to `log`; no core files.
pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    struct rlimit none {};
    setrlimit(RLIMIT_CORE, &none);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for the child, at most `seconds` (then kills it); returns its wait status.
int wait_for(pid_t pid, int seconds = 60) {
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "child " << pid << " did not finish in " << seconds << " s";
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The uninterrupted 6-step run, with every boundary of its saves recorded as a fault row (the
// failpoint set to `yield`, which does nothing else): the reference losses, and the list of
// boundaries each rank passes in each save.
struct Reference {
  std::vector<double> losses;
  // boundaries[rank][save]: the details of each boundary, in order (saves after steps 2, 4, 6)
  std::vector<std::vector<std::vector<std::string>>> boundaries;
};
const Reference& reference() {
  static Reference* r = [] {
    auto* ref = new Reference;
    zt::test::TempDir tmp;
    TrainConfig c = config(6);
    c.checkpoint_dir = tmp.file("ckpt");
    c.faults = {"ckpt.between_writes=yield"};
    zt::test::TracedRun t = zt::test::train_traced(c, tmp.file("ref.db"));
    EXPECT_TRUE(t.status.ok()) << t.status.message();
    ref->losses = t.summary.losses;
    ref->boundaries.assign(2, std::vector<std::vector<std::string>>(3));
    zt::db::QueryResult q;
    EXPECT_TRUE(t.reader
                    ->query("SELECT rank, step, details FROM fault WHERE name = 'ckpt.between_writes' ORDER BY rank, id", &q)
                    .ok());
    for (auto& row : q.rows) {
      const int rank = std::stoi(row[0]), save = (std::stoi(row[1]) - 1) / 2;  // steps 1, 3, 5 (0-based)
      const std::string prefix = "yield: ";  // the row names the action, then the site's details
      EXPECT_EQ(row[2].rfind(prefix, 0), 0u) << row[2];
      ref->boundaries[size_t(rank)][size_t(save)].push_back(row[2].substr(prefix.size()));
    }
    return ref;
  }();
  return *r;
}

// What the directory holds after the child died: resuming picks `expected_step` with nothing
// refused, and trains on exactly as the uninterrupted run.
void expect_resume_from(const std::string& dir, int64_t expected_step, const std::string& what) {
  ckpt::Selected sel;
  zt::Status s = ckpt::select_checkpoint(dir, &sel);
  ASSERT_TRUE(s.ok()) << what << ": " << s.message();
  EXPECT_EQ(sel.manifest.pos.global_step, expected_step) << what;
  EXPECT_TRUE(sel.notes.empty()) << what << ": " << sel.notes;
  TrainConfig c = config(6);
  c.checkpoint_dir = dir;
  c.resume = true;
  TrainSummary sum;
  s = train(c, nullptr, nullptr, &sum);
  ASSERT_TRUE(s.ok()) << what << ": " << s.message();
  EXPECT_EQ(sum.resumed_from, dir + "/" + ckpt::tag_for_step(expected_step)) << what;
  const auto& ref = reference().losses;
  EXPECT_EQ(sum.losses, std::vector<double>(ref.begin() + expected_step, ref.end())) << what;  // bit for bit
  EXPECT_TRUE(ckpt::verify_checkpoint(dir, "step000006", nullptr).ok()) << what;
}

}  // namespace

TEST(CheckpointKill, TheReferenceNamesEveryBoundaryOfASave) {
  const Reference& ref = reference();
  ASSERT_EQ(ref.losses.size(), 6u);
  // Rank 0 writes the weights, its shard, the manifest and `latest`; rank 1 its shard.
  const auto& r0 = ref.boundaries[0][1];
  const std::vector<std::string> expect0 = {
      "after model.safetensors written", "after model.safetensors fsync", "after config.json written",
      "after config.json fsync",         "after rank00000.zts written",   "after rank00000.zts fsync",
      "after manifest.json written",     "after manifest.json fsync"};
  ASSERT_GE(r0.size(), expect0.size() + 6);
  EXPECT_NE(r0.front().find(".tmp-step000004 created"), std::string::npos) << r0.front();
  for (const auto& e : expect0) EXPECT_NE(std::find(r0.begin(), r0.end(), e), r0.end()) << e;
  EXPECT_EQ(r0.back(), "after rename of latest.tmp to latest");
  EXPECT_EQ(ref.boundaries[1][1], (std::vector<std::string>{"after rank00001.zts written", "after rank00001.zts fsync"}));
  for (int rank : {0, 1}) EXPECT_EQ(ref.boundaries[size_t(rank)][0].size(), ref.boundaries[size_t(rank)][1].size());
}

// For each rank and each boundary of its second save (after step 4): a child that panics
// there. Before `latest` moves, the resume takes step 2; after, step 4. The children run a
// few at a time (their time goes mostly to fsync), then each directory is resumed from here.
TEST(CheckpointKill, PanicAtEveryBoundaryOfASaveResumesFromTheCommittedCheckpoint) {
  const Reference& ref = reference();
  struct Child {
    std::unique_ptr<zt::test::TempDir> tmp;
    std::string what;
    int rank = 0;
    size_t call = 0;         // the evaluation of ckpt.between_writes on that rank to panic at
    bool committed = false;  // killed after `latest` moved
    pid_t pid = 0;
  };
  std::vector<Child> children;
  for (int rank : {0, 1}) {
    const auto& first = ref.boundaries[size_t(rank)][0];
    const auto& second = ref.boundaries[size_t(rank)][1];
    for (size_t k = 0; k < second.size(); ++k) {
      Child c;
      c.tmp = std::make_unique<zt::test::TempDir>();
      c.what = "rank " + std::to_string(rank) + " " + second[k];
      c.rank = rank;
      c.call = first.size() + k + 1;
      c.committed = rank == 0 && k + 1 == second.size();
      children.push_back(std::move(c));
    }
  }
  ASSERT_EQ(children.size(), ref.boundaries[0][1].size() + ref.boundaries[1][1].size());
  constexpr size_t kAtOnce = 4;
  for (size_t i = 0; i < children.size(); i += kAtOnce) {
    const size_t end = std::min(children.size(), i + kAtOnce);
    for (size_t j = i; j < end; ++j) {
      Child& c = children[j];
      const std::string fault = "ckpt.between_writes[rank=" + std::to_string(c.rank) + ",call=" + std::to_string(c.call) +
                                "]=panic(kill test)";
      c.pid = spawn(child_args(c.tmp->file("ckpt"), fault), c.tmp->file("child.log"));
    }
    for (size_t j = i; j < end; ++j) {
      Child& c = children[j];
      const int status = wait_for(c.pid);
      const std::string log = slurp(c.tmp->file("child.log"));
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT)
          << c.what << ": the child did not die of the panic (status " << status << "):\n" << log;
      EXPECT_NE(log.find("panic"), std::string::npos) << c.what << ": " << log;
    }
  }
  for (const Child& c : children) {
    const std::string dir = c.tmp->file("ckpt");
    EXPECT_EQ(slurp(dir + "/latest"), c.committed ? "step000004\n" : "step000002\n") << c.what;
    expect_resume_from(dir, c.committed ? 4 : 2, c.what);
  }
}

// SIGKILL from outside while the child is inside a save: held at a boundary (rank 0 after its
// shard's fsync, with `pause`), and once with no failpoint at all, as soon as the save's
// temporary directory appears (racing the writes).
TEST(CheckpointKill, SigkillInsideASaveLeavesTheCommittedCheckpoint) {
  const Reference& ref = reference();
  const auto& first = ref.boundaries[0][0];
  const auto& second = ref.boundaries[0][1];
  const size_t at = size_t(std::find(second.begin(), second.end(), "after rank00000.zts fsync") - second.begin());
  ASSERT_LT(at, second.size());
  for (bool held : {true, false}) {
    zt::test::TempDir tmp;
    const std::string dir = tmp.file("ckpt");
    const std::string fault = held ? "ckpt.between_writes[rank=0,call=" + std::to_string(first.size() + at + 1) + "]=pause"
                                   : "ckpt.between_writes[rank=0,call=1000000]=pause";  // never reached
    const pid_t pid = spawn(child_args(dir, fault), tmp.file("child.log"));
    const std::string watch = held ? dir + "/.tmp-step000004/rank00000.zts" : dir + "/.tmp-step000004";
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(watch) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    ASSERT_TRUE(fs::exists(watch)) << slurp(tmp.file("child.log"));
    if (held) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it reach the pause
    kill(pid, SIGKILL);
    const int status = wait_for(pid);
    if (!held && WIFEXITED(status)) {
      // The save finished before the signal landed (the race went the other way): still valid.
      EXPECT_EQ(WEXITSTATUS(status), 0) << slurp(tmp.file("child.log"));
    } else {
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
    }
    const std::string latest = slurp(dir + "/latest");
    ASSERT_TRUE(latest == "step000002\n" || latest == "step000004\n") << latest;
    if (held) {
      EXPECT_EQ(latest, "step000002\n");
      EXPECT_TRUE(fs::exists(dir + "/.tmp-step000004"));  // the torn save, left behind
      std::string text;
      ASSERT_TRUE(ckpt::describe_checkpoints(dir, &text).ok());
      EXPECT_NE(text.find(".tmp-step000004  an interrupted save"), std::string::npos) << text;
    }
    expect_resume_from(dir, latest == "step000004\n" ? 4 : 2, held ? "SIGKILL held in the save" : "SIGKILL racing the save");
  }
}

// ---------------------------------------------------------------- zt ckpt, offline

namespace {
struct Ran {
  int code = -1;
  std::string out;  // stdout and stderr
};
Ran run_zt(const std::string& args) {
  Ran r;
  FILE* p = popen((std::string(ZT_BINARY_DIR "/zt ") + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}
}  // namespace

// `zt ckpt info` lists what a directory holds; `zt ckpt consolidate` writes one safetensors file
// and config.json without training; bad input exits 2 with "zt: FILE: problem".
TEST(CheckpointCli, InfoAndConsolidate) {
  zt::test::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  TrainConfig c = config(4);
  c.checkpoint_dir = dir;
  TrainSummary s;
  ASSERT_TRUE(train(c, nullptr, nullptr, &s).ok());
  fs::create_directory(dir + "/.tmp-step000006");

  Ran info = run_zt("ckpt info " + dir);
  EXPECT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("checkpoints in " + dir + " (latest -> step000004)"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("step000002  complete: step 2"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("2 shards, model.safetensors"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("step000004  complete: step 4"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("<- latest"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find(".tmp-step000006  an interrupted save"), std::string::npos) << info.out;

  fs::create_directory(tmp.file("hf"));
  Ran co = run_zt("ckpt consolidate " + dir + " --tag step000002 --out " + tmp.file("hf/model.safetensors") + " --dtype bf16");
  EXPECT_EQ(co.code, 0) << co.out;
  EXPECT_NE(co.out.find("consolidated " + dir + "/step000002 (fp32 master weights of 2 shards)"), std::string::npos) << co.out;
  ckpt::SafetensorsFile f;
  zt::Status st = ckpt::read_safetensors(tmp.file("hf/model.safetensors"), &f);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(f.tensors.front().dtype, DType::BF16);
  EXPECT_EQ(f.metadata.at("checkpoint"), "step000002");
  EXPECT_TRUE(fs::exists(tmp.file("hf/config.json")));

  for (const char* sub : {"ckpt info --help", "ckpt consolidate --help", "ckpt --help"}) {
    Ran h = run_zt(sub);
    EXPECT_EQ(h.code, 0) << sub;
    EXPECT_NE(h.out.find("Example: zt ckpt"), std::string::npos) << sub << ": " << h.out;
  }
  Ran missing = run_zt("ckpt info " + tmp.file("nothing"));
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.out.find("zt: " + tmp.file("nothing") + ": no such checkpoint directory"), std::string::npos) << missing.out;
  Ran bad_tag = run_zt("ckpt consolidate " + dir + " --tag step000003 --out " + tmp.file("x.safetensors"));
  EXPECT_EQ(bad_tag.code, 2);
  EXPECT_NE(bad_tag.out.find("zt: " + dir + "/step000003: no such checkpoint directory"), std::string::npos) << bad_tag.out;
  fs::remove(dir + "/step000004/rank00001.zts");
  Ran torn = run_zt("ckpt consolidate " + dir + " --tag step000004 --out " + tmp.file("x.safetensors"));
  EXPECT_EQ(torn.code, 2);
  EXPECT_NE(torn.out.find("zt: " + dir + "/step000004/rank00001.zts is missing"), std::string::npos) << torn.out;
  EXPECT_FALSE(fs::exists(tmp.file("x.safetensors")));
  EXPECT_EQ(run_zt("ckpt consolidate " + dir + " --out x --dtype fp8").code, 2);
  Ran a_file = run_zt("ckpt info " + tmp.file("hf/config.json"));
  EXPECT_EQ(a_file.code, 2);
  EXPECT_EQ(a_file.out, "zt: " + tmp.file("hf/config.json") + ": not a directory (a checkpoint directory is expected)\n");

  // config.json goes beside the weights: --out naming it is refused (its weights were replaced by
  // the config, exit 0), and a config.json that cannot be written fails before the weights already
  // there are replaced.
  fs::create_directory(tmp.file("o1"));
  Ran config_out = run_zt("ckpt consolidate " + dir + " --tag step000002 --out " + tmp.file("o1/config.json"));
  EXPECT_EQ(config_out.code, 2) << config_out.out;
  EXPECT_NE(config_out.out.find(tmp.file("o1/config.json") + ": that is where the Hugging Face config.json"),
            std::string::npos) << config_out.out;
  EXPECT_TRUE(fs::is_empty(tmp.file("o1")));
  fs::create_directories(tmp.file("o2/config.json"));
  std::ofstream(tmp.file("o2/model.safetensors")) << "KEEP";
  Ran config_dir = run_zt("ckpt consolidate " + dir + " --tag step000002 --out " + tmp.file("o2/model.safetensors"));
  EXPECT_EQ(config_dir.code, 2) << config_dir.out;
  EXPECT_NE(config_dir.out.find(tmp.file("o2/config.json") + ": is a directory"), std::string::npos) << config_dir.out;
  EXPECT_EQ(zt::test::read_file(tmp.file("o2/model.safetensors")), "KEEP");
  EXPECT_FALSE(fs::exists(tmp.file("o2/model.safetensors.tmp")));
}
