// The launcher variables (torchrun, mpirun/OpenMPI, Slurm srun), the rendezvous plan and the
// rendezvous-file protocol of trainer/zero/launcher_env.h. Plain C++: runs on any machine.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../test_util.h"
#include "zero/launcher_env.h"

using namespace zt::trainer;
using Vars = std::map<std::string, std::string>;

namespace {

LaunchInfo read(const Vars& v) { return read_launch_info(environment_from(v)); }

// The LaunchError's message, or "" when none was thrown.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "";
}
std::string read_error(const Vars& v) {
  return error_of([&] { read(v); });
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(seed + 37 * i);
  return b;
}

}  // namespace

// ---- launcher variables ------------------------------------------------------------------------

TEST(LaunchInfo, NoLauncherIsOneProcess) {
  LaunchInfo i = read({});
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.world_size, 1);
  EXPECT_EQ(i.local_rank, 0);
  EXPECT_EQ(i.launcher, "none");
  EXPECT_TRUE(has(i.describe(), "one process")) << i.describe();
}

TEST(LaunchInfo, Torchrun) {
  LaunchInfo i = read({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                       {"TORCHELASTIC_RUN_ID", "job42"}});
  EXPECT_EQ(i.launcher, "torchrun");
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.world_size, 8);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.local_world_size, 4);
  EXPECT_EQ(i.job_id, "job42");
  EXPECT_EQ(i.describe(), "rank 5 of 8 (local rank 1) from torchrun (RANK=5 WORLD_SIZE=8 LOCAL_RANK=1 LOCAL_WORLD_SIZE=4)");
  // torchrun's default rdzv id "none" is the same in every job: no identity.
  EXPECT_EQ(read({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"TORCHELASTIC_RUN_ID", "none"}}).job_id, "");
}

TEST(LaunchInfo, OpenMpi) {
  LaunchInfo i = read({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"PMIX_NAMESPACE", "prterun-host-123@1"}});
  EXPECT_EQ(i.launcher, "mpirun");
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.world_size, 4);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.local_world_size, 2);
  EXPECT_EQ(i.job_id, "prterun-host-123@1");
}

TEST(LaunchInfo, Slurm) {
  LaunchInfo i = read({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "2"}, {"SLURM_JOB_ID", "9001"},
                       {"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(i.launcher, "srun");
  EXPECT_EQ(i.rank, 6);
  EXPECT_EQ(i.world_size, 16);
  EXPECT_EQ(i.local_rank, 2);
  EXPECT_EQ(i.job_id, "9001.0");
  // ZT_RUN_ID overrides the launcher's job id.
  EXPECT_EQ(read({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_ID", "9001"},
                  {"ZT_RUN_ID", "mine"}})
                .job_id,
            "mine");
}

TEST(LaunchInfo, SallocShellWithoutProcIdIsOneProcess) {
  // salloc/sbatch export SLURM_NTASKS to the shell, which is not a task: not a launch.
  LaunchInfo i = read({{"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "77"}});
  EXPECT_EQ(i.launcher, "none");
  EXPECT_EQ(i.world_size, 1);
}

TEST(LaunchInfo, PartialSetNamesTheMissingVariable) {
  std::string e = read_error({{"RANK", "1"}, {"WORLD_SIZE", "4"}});
  EXPECT_TRUE(has(e, "torchrun's variables are incomplete")) << e;
  EXPECT_TRUE(has(e, "RANK=1 WORLD_SIZE=4 set, but LOCAL_RANK not")) << e;
  e = read_error({{"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(e, "mpirun's variables are incomplete")) << e;
  EXPECT_TRUE(has(e, "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_LOCAL_RANK not")) << e;
  e = read_error({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}});
  EXPECT_TRUE(has(e, "srun's variables are incomplete")) << e;
  EXPECT_TRUE(has(e, "SLURM_NTASKS not")) << e;
}

TEST(LaunchInfo, NonNumericValues) {
  std::string e = read_error({{"RANK", "abc"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}});
  EXPECT_TRUE(has(e, "RANK='abc' is not a decimal integer >= 0 (torchrun's variable)")) << e;
  e = read_error({{"RANK", "0"}, {"WORLD_SIZE", "-2"}, {"LOCAL_RANK", "0"}});
  EXPECT_TRUE(has(e, "WORLD_SIZE='-2' is not a decimal integer")) << e;
  e = read_error({{"RANK", "0"}, {"WORLD_SIZE", "4 "}, {"LOCAL_RANK", "0"}});
  EXPECT_TRUE(has(e, "WORLD_SIZE='4 '")) << e;
  e = read_error({{"SLURM_PROCID", ""}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}});
  EXPECT_TRUE(has(e, "SLURM_PROCID is set but empty")) << e;
  e = read_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "99999999999"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  EXPECT_TRUE(has(e, "OMPI_COMM_WORLD_SIZE='99999999999' is too large")) << e;
}

TEST(LaunchInfo, OutOfRangeValues) {
  std::string e = read_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}});
  EXPECT_TRUE(has(e, "RANK=4 is not below WORLD_SIZE=4: ranks run from 0 to 3")) << e;
  e = read_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}, {"SLURM_LOCALID", "0"}});
  EXPECT_TRUE(has(e, "SLURM_NTASKS=0: the world size must be at least 1")) << e;
  e = read_error({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_TRUE(has(e, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2")) << e;
  e = read_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}});
  EXPECT_TRUE(has(e, "LOCAL_WORLD_SIZE=8 is larger than WORLD_SIZE=2")) << e;
  e = read_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "5"}});
  EXPECT_TRUE(has(e, "OMPI_COMM_WORLD_LOCAL_RANK=5 is not below OMPI_COMM_WORLD_SIZE=2")) << e;
}

TEST(LaunchInfo, TwoLaunchersThatAgreeAreFine) {
  LaunchInfo i = read({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"SLURM_PROCID", "1"},
                       {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(i.launcher, "torchrun");
  EXPECT_EQ(i.rank, 1);
}

TEST(LaunchInfo, TwoLaunchersThatDisagreeAreRefusedUntilOneIsChosen) {
  // srun starting one torchrun per node: SLURM_PROCID is the node, RANK the process.
  Vars v{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
         {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}};
  std::string e = read_error(v);
  EXPECT_TRUE(has(e, "launcher variables disagree")) << e;
  EXPECT_TRUE(has(e, "torchrun says rank 5 of 8, local rank 1 (RANK=5 WORLD_SIZE=8 LOCAL_RANK=1)")) << e;
  EXPECT_TRUE(has(e, "srun says rank 1 of 2, local rank 0 (SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=0)")) << e;
  EXPECT_TRUE(has(e, "ZT_LAUNCHER=torchrun or ZT_LAUNCHER=srun")) << e;

  v["ZT_LAUNCHER"] = "torchrun";
  EXPECT_EQ(read(v).rank, 5);
  v["ZT_LAUNCHER"] = "srun";
  EXPECT_EQ(read(v).rank, 1);
  EXPECT_EQ(read(v).world_size, 2);
  v["ZT_LAUNCHER"] = "none";
  EXPECT_EQ(read(v).world_size, 1);
  v["ZT_LAUNCHER"] = "deepspeed";
  EXPECT_TRUE(has(read_error(v), "ZT_LAUNCHER='deepspeed': use torchrun, mpirun, srun or none")) << read_error(v);
  v["ZT_LAUNCHER"] = "mpirun";
  EXPECT_TRUE(has(read_error(v), "ZT_LAUNCHER=mpirun but OMPI_COMM_WORLD_RANK is not set")) << read_error(v);
}

// ---- rendezvous plan ---------------------------------------------------------------------------

// ---- the job's rank of a probed process (read_job_rank) -----------------------------------------

namespace {
JobRank job(const Vars& v) { return read_job_rank(environment_from(v)); }
std::string notes_of(const JobRank& j) {
  std::string s;
  for (auto& n : j.notes) s += n + "\n";
  return s;
}
}  // namespace

TEST(JobRank, NoVariablesIsNoRank) {
  JobRank j = job({});
  EXPECT_FALSE(j.has_rank);
  EXPECT_EQ(j.describe(), "no rank variables");
  EXPECT_TRUE(j.notes.empty());
  // salloc's and sbatch's shells export SLURM_NTASKS without SLURM_PROCID: still no rank.
  EXPECT_FALSE(job({{"SLURM_NTASKS", "4"}, {"WORLD_SIZE", "2"}}).has_rank);
}

// Each launcher's variables, as it sets them for a worker.
TEST(JobRank, EachLaunchersVariables) {
  struct Case {
    Vars vars;
    std::string launcher;
    int rank, world;
    std::optional<int> local;
  };
  const Case cases[] = {
      // torchrun / python -m torch.distributed.run (the elastic agent sets these, and GROUP_RANK, ...)
      {{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"}},
       "torchrun", 3, 4, 1},
      // DeepSpeed's launch.py: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK
      {{{"RANK", "5"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_SIZE", "4"}, {"CROSS_RANK", "1"}},
       "torchrun", 5, 8, 1},
      {{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}},
       "mpirun", 2, 3, 0},
      {{{"MV2_COMM_WORLD_RANK", "1"}, {"MV2_COMM_WORLD_SIZE", "2"}, {"MV2_COMM_WORLD_LOCAL_RANK", "1"}},
       "mvapich", 1, 2, 1},
      {{{"PMI_RANK", "6"}, {"PMI_SIZE", "7"}, {"MPI_LOCALRANKID", "2"}}, "mpich", 6, 7, 2},
      {{{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"}, {"SLURM_JOB_ID", "77"}}, "srun", 9, 16, 1},
      // A one-node launcher that sets only LOCAL_RANK (and the local world size).
      {{{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}, "local", 1, 2, 1},
      {{{"LOCAL_RANK", "0"}, {"LOCAL_SIZE", "4"}}, "local", 0, 4, 0},
  };
  for (const Case& c : cases) {
    JobRank j = job(c.vars);
    ASSERT_TRUE(j.has_rank) << c.launcher;
    EXPECT_EQ(j.launcher, c.launcher);
    EXPECT_EQ(j.rank, c.rank) << c.launcher;
    EXPECT_EQ(j.world_size, c.world) << c.launcher;
    EXPECT_EQ(j.local_rank, c.local) << c.launcher;
    EXPECT_TRUE(j.notes.empty()) << c.launcher << ": " << notes_of(j);
  }
  EXPECT_EQ(job(cases[0].vars).describe(), "rank 3 of 4 (local rank 1) from torchrun (RANK=3 WORLD_SIZE=4 LOCAL_RANK=1)");
}

// The innermost launcher first: RANK over OMPI_COMM_WORLD_RANK over MV2 over PMI_RANK over
// SLURM_PROCID over LOCAL_RANK alone; the sets passed over are named where they say otherwise.
TEST(JobRank, PrecedenceIsInnermostLauncherFirst) {
  const Vars all{{"RANK", "1"},         {"WORLD_SIZE", "8"},          {"LOCAL_RANK", "1"},
                 {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"MV2_COMM_WORLD_RANK", "3"},
                 {"MV2_COMM_WORLD_SIZE", "4"},  {"PMI_RANK", "0"},             {"PMI_SIZE", "4"},
                 {"SLURM_PROCID", "0"},         {"SLURM_NTASKS", "2"}};
  JobRank j = job(all);
  EXPECT_EQ(j.launcher, "torchrun");
  EXPECT_EQ(j.rank, 1);
  EXPECT_EQ(j.world_size, 8);
  const std::string n = notes_of(j);
  EXPECT_TRUE(has(n, "OMPI_COMM_WORLD_RANK=2 ignored: RANK (torchrun) comes first")) << n;
  EXPECT_TRUE(has(n, "SLURM_PROCID=0 ignored: RANK (torchrun) comes first")) << n;
  // Each step down the list.
  const char* order[][2] = {{"RANK", "torchrun"}, {"OMPI_COMM_WORLD_RANK", "mpirun"}, {"MV2_COMM_WORLD_RANK", "mvapich"},
                            {"PMI_RANK", "mpich"}, {"SLURM_PROCID", "srun"}};
  Vars v = all;
  for (auto& [var, launcher] : order) {
    EXPECT_EQ(job(v).launcher, launcher) << var;
    v.erase(var);
  }
  // With RANK gone, LOCAL_RANK alone is below every launcher's set.
  EXPECT_EQ(job({{"LOCAL_RANK", "1"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}}).launcher, "srun");
  EXPECT_EQ(job({{"LOCAL_RANK", "1"}}).launcher, "local");
  // Sets that agree are not noted (srun starting MPI ranks with PMI: the same rank twice).
  EXPECT_TRUE(job({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}}).notes.empty());
}

TEST(JobRank, ZtLauncherChoosesOneSetOrNone) {
  const Vars v{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}};
  Vars srun = v;
  srun["ZT_LAUNCHER"] = "srun";
  EXPECT_EQ(job(srun).rank, 3);
  EXPECT_EQ(job(srun).world_size, 4);
  Vars none = v;
  none["ZT_LAUNCHER"] = "none";
  EXPECT_FALSE(job(none).has_rank);
  Vars missing = v;
  missing["ZT_LAUNCHER"] = "mpich";
  EXPECT_FALSE(job(missing).has_rank);
  EXPECT_TRUE(has(notes_of(job(missing)), "ZT_LAUNCHER=mpich but PMI_RANK is not set")) << notes_of(job(missing));
  Vars bad = v;
  bad["ZT_LAUNCHER"] = "pbs";
  EXPECT_EQ(job(bad).launcher, "torchrun");
  EXPECT_TRUE(has(notes_of(job(bad)), "ZT_LAUNCHER='pbs' is not one of")) << notes_of(job(bad));
}

// Never an error: what cannot be read is left unknown, with a note.
TEST(JobRank, OddValuesAreNotedNotFatal) {
  JobRank j = job({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(j.launcher, "srun");  // the unreadable set is skipped
  EXPECT_EQ(j.rank, 1);
  EXPECT_TRUE(has(notes_of(j), "RANK='x' is not a decimal integer >= 0: torchrun's variables were ignored"))
      << notes_of(j);
  j = job({{"RANK", "2"}});
  EXPECT_TRUE(j.has_rank);
  EXPECT_EQ(j.rank, 2);
  EXPECT_EQ(j.world_size, 0);
  EXPECT_FALSE(j.local_rank.has_value());
  EXPECT_EQ(j.describe(), "rank 2 from torchrun (RANK=2)");
  EXPECT_TRUE(has(notes_of(j), "WORLD_SIZE is not set: the world size is not known")) << notes_of(j);
  j = job({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(j.rank, 4);
  EXPECT_EQ(j.world_size, 0);
  EXPECT_TRUE(has(notes_of(j), "RANK=4 is not below WORLD_SIZE=4")) << notes_of(j);
  EXPECT_EQ(job({{"RANK", "1"}, {"WORLD_SIZE", "0"}}).world_size, 0);
  EXPECT_EQ(job({{"RANK", "99999999999"}}).has_rank, false);
}

TEST(JobRank, SameClaimIsLauncherRankAndWorld) {
  const Vars v{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}};
  EXPECT_TRUE(job(v).same_claim(job(v)));
  EXPECT_FALSE(job(v).same_claim(job({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}})));
  EXPECT_FALSE(job(v).same_claim(job({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}})));
  EXPECT_FALSE(job(v).same_claim(job({})));
  EXPECT_TRUE(job({}).same_claim(job({})));
}

TEST(RendezvousPlan, OneProcessNeedsNothing) {
  RendezvousPlan p = plan_rendezvous(environment_from({}), LaunchInfo{});
  EXPECT_EQ(p.method, RendezvousMethod::Single);
}

TEST(RendezvousPlan, SeveralProcessesNeedCommIdOrFile) {
  LaunchInfo i = read({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}});
  std::string e = error_of([&] { plan_rendezvous(environment_from({}), i); });
  EXPECT_TRUE(has(e, "world size 4")) << e;
  EXPECT_TRUE(has(e, "NCCL_COMM_ID=<rank 0's host>:<free port>")) << e;
  EXPECT_TRUE(has(e, "ZT_NCCL_ID_FILE=")) << e;

  RendezvousPlan p = plan_rendezvous(environment_from({{"NCCL_COMM_ID", "node-0.cluster:29500"}}), i);
  EXPECT_EQ(p.method, RendezvousMethod::NcclCommId);
  EXPECT_EQ(p.comm_id, "node-0.cluster:29500");
  EXPECT_EQ(plan_rendezvous(environment_from({{"NCCL_COMM_ID", "[fe80::1]:1234"}}), i).method,
            RendezvousMethod::NcclCommId);
  EXPECT_EQ(plan_rendezvous(environment_from({{"NCCL_COMM_ID", "10.0.0.1:65535"}}), i).method,
            RendezvousMethod::NcclCommId);

  p = plan_rendezvous(environment_from({{"ZT_NCCL_ID_FILE", "/shared/job.id"}, {"ZT_RENDEZVOUS_TIMEOUT", "2.5"}}), i);
  EXPECT_EQ(p.method, RendezvousMethod::File);
  EXPECT_EQ(p.file, "/shared/job.id");
  EXPECT_EQ(p.timeout.count(), 2500);
  EXPECT_EQ(p.describe(), "file /shared/job.id (ZT_NCCL_ID_FILE), timeout 2 s");
  EXPECT_EQ(plan_rendezvous(environment_from({{"ZT_NCCL_ID_FILE", "/x"}}), i).timeout.count(), 300000);
}

TEST(RendezvousPlan, InconsistentOrBadSettings) {
  LaunchInfo i = read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}});
  auto plan_error = [&](const Vars& v) { return error_of([&] { plan_rendezvous(environment_from(v), i); }); };
  std::string e = plan_error({{"NCCL_COMM_ID", "h:1"}, {"ZT_NCCL_ID_FILE", "/x"}});
  EXPECT_TRUE(has(e, "both NCCL_COMM_ID=h:1 and ZT_NCCL_ID_FILE=/x are set")) << e;
  for (const char* bad : {"host", "host:", ":29500", "host:0", "host:65536", "host:29x", "a:b:29500", "[fe80::1:29500"}) {
    e = plan_error({{"NCCL_COMM_ID", bad}});
    EXPECT_TRUE(has(e, std::string("NCCL_COMM_ID='") + bad + "' is not <host>:<port>")) << bad << ": " << e;
  }
  e = plan_error({{"ZT_NCCL_ID_FILE", " "}});
  EXPECT_TRUE(has(e, "ZT_NCCL_ID_FILE is set but empty")) << e;
  for (const char* bad : {"", "abc", "0", "-3", "10s"}) {
    e = plan_error({{"ZT_NCCL_ID_FILE", "/x"}, {"ZT_RENDEZVOUS_TIMEOUT", bad}});
    EXPECT_TRUE(has(e, std::string("ZT_RENDEZVOUS_TIMEOUT='") + bad + "'")) << bad << ": " << e;
  }
}

// ---- the rendezvous file -----------------------------------------------------------------------

TEST(RendezvousFile, LineRoundTripsAndRejectsDamage) {
  for (size_t n : {16u, 100u, 128u}) {
    std::vector<uint8_t> b = pattern(n, uint8_t(n));
    std::string line = format_rendezvous_line(b.data(), n, 8, "job 7");
    EXPECT_EQ(line.rfind("zerotrace-rendezvous v1 world=8 job=job_7 bytes=" + std::to_string(n) + " data=", 0), 0u)
        << line;
    auto c = parse_rendezvous_line(line);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->world_size, 8);
    EXPECT_EQ(c->job_id, "job_7");
    EXPECT_EQ(c->blob, b);
    // Torn or damaged: never parsed as valid.
    EXPECT_FALSE(parse_rendezvous_line(line.substr(0, line.size() - 1)));      // no newline
    EXPECT_FALSE(parse_rendezvous_line(line.substr(0, line.size() - 3) + "\n"));  // short data
    std::string bad = line;
    bad[bad.size() - 2] = 'G';
    EXPECT_FALSE(parse_rendezvous_line(bad));
    EXPECT_FALSE(parse_rendezvous_line(line + line));
  }
  std::vector<uint8_t> b = pattern(16, 1);
  EXPECT_EQ(parse_rendezvous_line(format_rendezvous_line(b.data(), 16, 2, ""))->job_id, "");
  EXPECT_FALSE(parse_rendezvous_line("hello\n"));
}

TEST(RendezvousFile, TwoThreadsExchangeBlobs) {
  zt::test::TempDir dir;
  for (size_t n : {16u, 64u, 128u}) {
    RendezvousFile f;
    f.path = dir.file("nccl-" + std::to_string(n) + ".id");
    f.origin = "ZT_NCCL_ID_FILE";
    f.world_size = 2;
    f.job_id = "j1";
    f.timeout = std::chrono::milliseconds(10000);
    f.poll = std::chrono::milliseconds(5);
    const std::vector<uint8_t> blob = pattern(n, 9);
    std::vector<uint8_t> got;
    std::thread reader([&] { got = wait_for_rendezvous(f, n, 1); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the reader polls a missing file first
    publish_rendezvous(f, blob.data(), n);
    reader.join();
    EXPECT_EQ(got, blob);
    // Only the file itself is left in the directory (the temporary was renamed).
    size_t entries = 0;
    for (auto& e : std::filesystem::directory_iterator(dir.path())) {
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
      ++entries;
    }
    EXPECT_EQ(entries, 1u);
    remove_rendezvous(f);
    EXPECT_FALSE(std::filesystem::exists(f.path));
  }
}

TEST(RendezvousFile, TwoProcessesExchangeTheNcclIdSizedBlob) {
  zt::test::TempDir dir;
  RendezvousFile f;
  f.path = dir.file("nccl.id");
  f.world_size = 2;
  f.job_id = "proc";
  f.timeout = std::chrono::milliseconds(10000);
  f.poll = std::chrono::milliseconds(5);
  const std::vector<uint8_t> blob = pattern(128, 200);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // rank 1: wait for the id, exit 0 when it is rank 0's
    int code = 3;
    try {
      code = wait_for_rendezvous(f, 128, 1) == blob ? 0 : 1;
    } catch (...) {
      code = 2;
    }
    _exit(code);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  publish_rendezvous(f, blob.data(), blob.size());
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: wrong blob, 2: the child threw";
}

TEST(RendezvousFile, TimeoutSaysTheFileNeverAppeared) {
  zt::test::TempDir dir;
  RendezvousFile f;
  f.path = dir.file("missing.id");
  f.origin = "ZT_NCCL_ID_FILE";
  f.world_size = 4;
  f.timeout = std::chrono::milliseconds(120);
  f.poll = std::chrono::milliseconds(10);
  const auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] { wait_for_rendezvous(f, 128, 3); });
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 120);
  EXPECT_LT(ms, 5000);
  EXPECT_TRUE(has(e, "rank 3: waited ")) << e;
  EXPECT_TRUE(has(e, " ms for rank 0 to write the NCCL id to " + f.path + " (ZT_NCCL_ID_FILE): the file never appeared"))
      << e;
  EXPECT_TRUE(has(e, "ZT_RENDEZVOUS_TIMEOUT")) << e;
}

TEST(RendezvousFile, StaleFileFromAnotherJobIsNotTaken) {
  zt::test::TempDir dir;
  RendezvousFile old;
  old.path = dir.file("nccl.id");
  old.world_size = 4;
  old.job_id = "old";
  const std::vector<uint8_t> stale = pattern(128, 1), fresh = pattern(128, 2);
  publish_rendezvous(old, stale.data(), stale.size());

  RendezvousFile now = old;
  now.job_id = "new";
  now.timeout = std::chrono::milliseconds(100);
  now.poll = std::chrono::milliseconds(5);
  std::string e = error_of([&] { wait_for_rendezvous(now, 128, 2); });
  EXPECT_TRUE(has(e, "it holds a file for world size 4, job old, 128 bytes, while this job has world size 4, job new"))
      << e;
  EXPECT_TRUE(has(e, "stale file")) << e;

  // Rank 0 of the new job replaces it while rank 2 waits: rank 2 gets the new id.
  now.timeout = std::chrono::milliseconds(10000);
  std::vector<uint8_t> got;
  std::thread reader([&] { got = wait_for_rendezvous(now, 128, 2); });
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  publish_rendezvous(now, fresh.data(), fresh.size());
  reader.join();
  EXPECT_EQ(got, fresh);
}

TEST(RendezvousFile, ForeignFileIsAnErrorAtOnce) {
  zt::test::TempDir dir;
  RendezvousFile f;
  f.path = dir.file("notes.txt");
  f.origin = "ZT_NCCL_ID_FILE";
  f.timeout = std::chrono::milliseconds(60000);
  std::ofstream(f.path) << "my lab notes\n";
  const auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] { wait_for_rendezvous(f, 128, 1); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(has(e, f.path + " (ZT_NCCL_ID_FILE) exists but is not a zerotrace rendezvous file (it starts with 'my lab notes')"))
      << e;
}

TEST(RendezvousFile, PublishErrorsNameTheFile) {
  RendezvousFile f;
  f.path = "/nonexistent-zt-dir/sub/nccl.id";
  f.origin = "ZT_NCCL_ID_FILE";
  std::vector<uint8_t> b = pattern(128, 0);
  std::string e = error_of([&] { publish_rendezvous(f, b.data(), b.size()); });
  EXPECT_TRUE(has(e, "cannot write the rendezvous file /nonexistent-zt-dir/sub/nccl.id (ZT_NCCL_ID_FILE)")) << e;
  EXPECT_TRUE(has(e, "No such file or directory")) << e;
  EXPECT_TRUE(has(e, "does the directory /nonexistent-zt-dir/sub exist")) << e;
  e = error_of([&] { publish_rendezvous(f, b.data(), 0); });
  EXPECT_TRUE(has(e, "0 bytes")) << e;
}

TEST(RendezvousFile, ReadersNeverSeeAPartialFile) {
  // The writer replaces the file again and again; every read parses or finds the previous file.
  zt::test::TempDir dir;
  RendezvousFile f;
  f.path = dir.file("hammer.id");
  f.world_size = 2;
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, bad{0};
  std::thread reader([&] {
    while (!done) {
      std::ifstream in(f.path, std::ios::binary);
      if (!in) continue;
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      ++reads;
      if (!parse_rendezvous_line(text)) ++bad;
    }
  });
  for (int i = 0; i < 200; ++i) {
    std::vector<uint8_t> b = pattern(16 + size_t(i % 113), uint8_t(i));
    publish_rendezvous(f, b.data(), b.size());
  }
  done = true;
  reader.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(bad.load(), 0);
}
