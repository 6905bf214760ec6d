// The NCCL communicator (trainer/cuda/nccl_communicator.h): world 1 on one GPU (every collective,
// device and host buffers, the transfer rows), the file rendezvous end to end, and with two GPUs
// two processes of this binary. Label gpu: the GPU tests skip, saying why, without a usable GPU;
// the settings errors are checked everywhere (they come before any GPU is touched).
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "../test_util.h"
#include "cuda/nccl_communicator.h"
#include "cuda_test_util.h"
#include "zt/db/trace_reader.h"

extern char** environ;

using namespace zt::cuda;
using zt::trainer::environment_from;
using zt::trainer::LaunchError;
using zt::trainer::LaunchInfo;
using zt::trainer::RendezvousPlan;

namespace {

std::string launch_error(const std::map<std::string, std::string>& env) {
  try {
    NcclCommunicator::from_environment(NcclOptions{}, environment_from(env));
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(NcclSettings, MissingOrInconsistentSettingsFailBeforeTheGpu) {
  std::string e = launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}});
  EXPECT_NE(e.find("needs a rendezvous for NCCL"), std::string::npos) << e;
  e = launch_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"NCCL_COMM_ID", "h:1"}});
  EXPECT_NE(e.find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos) << e;
  e = launch_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                    {"NCCL_COMM_ID", "h:1"}, {"ZT_NCCL_ID_FILE", "/tmp/x"}});
  EXPECT_NE(e.find("both NCCL_COMM_ID=h:1 and ZT_NCCL_ID_FILE=/tmp/x are set"), std::string::npos) << e;
}

TEST(NcclSettings, WithoutAGpuTheErrorSaysWhy) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is here: this checks the message without one";
  try {
    NcclCommunicator c(LaunchInfo{}, RendezvousPlan{}, NcclOptions{});
    FAIL() << "a communicator without a GPU";
  } catch (const LaunchError& e) {
    std::string why;
    cuda_available(&why);
    EXPECT_EQ(std::string(e.what()), "NCCL communicator: no usable GPU: " + why);
  }
}

TEST(NcclWorld1, EveryCollectiveOnDeviceAndHostBuffersIsRecorded) {
  ZT_REQUIRE_GPU();
  zt::test::TempDir dir;
  std::unique_ptr<zt::probe::Recorder> rec;
  zt::probe::RecorderOptions ro;
  ro.path = dir.file("nccl.db");
  ro.crash_handlers = false;
  ASSERT_TRUE(zt::probe::Recorder::open(ro, &rec).ok());
  rec->add_rank(0, 1, 0);
  NcclOptions o;
  o.recorder = rec.get();
  o.trace_device = rec->add_device(0, zt::probe::DeviceKind::Cuda, 0, "cuda:0", describe_device(0), std::nullopt, false);
  {
    NcclCommunicator comm(LaunchInfo{}, RendezvousPlan{}, o);
    EXPECT_EQ(comm.rank(), 0);
    EXPECT_EQ(comm.world_size(), 1);
    EXPECT_NE(comm.describe().find("NCCL 2."), std::string::npos) << comm.describe();

    const size_t n = 1000;
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), 1.0f);
    // Device buffer, scaled after the sum.
    DeviceBuffer d = DeviceBuffer::from(v);
    comm.all_reduce(d.as<float>(), n, 0.5f, "grad.bucket0");
    std::vector<float> got = d.to_vector<float>(n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], v[i] * 0.5f) << i;
    // Host buffers (staged).
    std::vector<float> h = v;
    comm.all_reduce(h.data(), n, 1.0f, "host.floats");
    EXPECT_EQ(h, v);
    std::vector<double> norm = {3.25, -1.0};
    comm.all_reduce(norm.data(), 2, "global_grad_norm");
    EXPECT_EQ(norm, (std::vector<double>{3.25, -1.0}));
    std::vector<float> gathered(n, 0.0f);
    comm.all_gather(v.data(), gathered.data(), n * 4, "block0.gathered");
    EXPECT_EQ(gathered, v);
    DeviceBuffer dg(n * 4);
    comm.all_gather(d.get(), dg.get(), n * 4, "block1.gathered");
    EXPECT_EQ(dg.to_vector<float>(n), got);
    std::vector<float> part(n, 0.0f);
    comm.reduce_scatter(v.data(), part.data(), n, 0.25f, "grad.bucket1");
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(part[i], v[i] * 0.25f) << i;
    std::vector<float> b = v;
    comm.broadcast(b.data(), n * 4, 0, "init.params");
    EXPECT_EQ(b, v);
    EXPECT_THROW(comm.broadcast(b.data(), n * 4, 1, "bad root"), std::invalid_argument);
    comm.barrier();

    comm.abort("test over");
    EXPECT_THROW(comm.barrier(), zt::trainer::CommAborted);
  }
  ASSERT_TRUE(rec->close().ok());
  std::unique_ptr<zt::db::TraceReader> r;
  ASSERT_TRUE(zt::db::TraceReader::open(dir.file("nccl.db"), &r).ok());
  zt::db::QueryResult q;
  ASSERT_TRUE(r->query("SELECT op, name, bytes, participants, src_device, dst_device FROM transfer_v "
                       "WHERE kind = 'collective' ORDER BY id",
                       &q)
                  .ok());
  const std::vector<std::vector<std::string>> want = {
      {"all_reduce", "grad.bucket0", "4000", "1", "cuda:0", "cuda:0"},
      {"all_reduce", "host.floats", "4000", "1", "cuda:0", "cuda:0"},
      {"all_reduce", "global_grad_norm", "16", "1", "cuda:0", "cuda:0"},
      {"all_gather", "block0.gathered", "4000", "1", "cuda:0", "cuda:0"},
      {"all_gather", "block1.gathered", "4000", "1", "cuda:0", "cuda:0"},
      {"reduce_scatter", "grad.bucket1", "4000", "1", "cuda:0", "cuda:0"},
      {"broadcast", "init.params", "4000", "1", "cuda:0", "cuda:0"},
  };
  EXPECT_EQ(q.rows, want);
}

TEST(NcclWorld1, FileRendezvousFromTheEnvironment) {
  ZT_REQUIRE_GPU();
  zt::test::TempDir dir;
  const std::string file = dir.file("nccl.id");
  auto comm = NcclCommunicator::from_environment(
      NcclOptions{}, environment_from({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"ZT_NCCL_ID_FILE", file}}));
  EXPECT_EQ(comm->launch().launcher, "torchrun");
  // Rank 0 wrote the id, every rank joined, so rank 0 removed it.
  EXPECT_FALSE(std::filesystem::exists(file));
  std::vector<float> v = {1, 2, 3};
  comm->all_reduce(v.data(), 3, 2.0f, "x");
  EXPECT_EQ(v, (std::vector<float>{2, 4, 6}));
}

// ---- two processes, two GPUs -------------------------------------------------------------------

// Run by NcclTwoProcesses below as a child process (skipped otherwise): rank RANK of 2.
TEST(NcclChild, RankOfTwo) {
  if (!std::getenv("ZT_NCCL_TEST_CHILD")) GTEST_SKIP() << "runs only as a child of NcclTwoProcesses";
  ZT_REQUIRE_GPU();
  auto comm = NcclCommunicator::from_environment(NcclOptions{});
  const int r = comm->rank();
  ASSERT_EQ(comm->world_size(), 2);
  std::vector<float> v(256, float(r + 1));
  comm->all_reduce(v.data(), v.size(), 1.0f, "sum");
  for (float x : v) ASSERT_EQ(x, 3.0f);
  std::vector<float> mine(4, float(r)), all(8);
  comm->all_gather(mine.data(), all.data(), 16, "gather");
  EXPECT_EQ(all, (std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1}));
  std::vector<float> send(8);
  std::iota(send.begin(), send.end(), float(10 * r));  // rank 0: 0..7, rank 1: 10..17
  std::vector<float> part(4);
  comm->reduce_scatter(send.data(), part.data(), 4, 0.5f, "scatter");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(part[i], 0.5f * float(2 * (4 * r + i) + 10)) << i;
  std::vector<double> b = {r == 1 ? 42.0 : 0.0};
  comm->broadcast(b.data(), 8, 1, "bcast");
  EXPECT_EQ(b[0], 42.0);
  comm->barrier();
}

TEST(NcclTwoProcesses, CollectivesAcrossTwoGpus) {
  ZT_REQUIRE_GPU();
  if (device_count() < 2) GTEST_SKIP() << "needs two GPUs (NCCL refuses two ranks on one GPU); this machine has " << device_count();
  zt::test::TempDir dir;
  const std::string id_file = dir.file("nccl.id");
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (kv.rfind("NCCL_COMM_ID=", 0) == 0 || kv.rfind("RANK=", 0) == 0 || kv.rfind("WORLD_SIZE=", 0) == 0 ||
          kv.rfind("LOCAL_RANK=", 0) == 0)
        continue;
      env_s.push_back(kv);
    }
    env_s.push_back("ZT_NCCL_TEST_CHILD=1");
    env_s.push_back("RANK=" + std::to_string(rank));
    env_s.push_back("WORLD_SIZE=2");
    env_s.push_back("LOCAL_RANK=" + std::to_string(rank));
    env_s.push_back("ZT_NCCL_ID_FILE=" + id_file);
    env_s.push_back("ZT_RENDEZVOUS_TIMEOUT=60");
    std::vector<char*> envp;
    for (std::string& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
    std::string filter = "--gtest_filter=NcclChild.RankOfTwo";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[i], &status, 0), pids[i]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << i << " failed (status " << status << ")";
  }
  EXPECT_FALSE(std::filesystem::exists(id_file));
}
