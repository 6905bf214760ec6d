// trainer/zero/launcher_env.h: who this process is in a multi-process job, and how its ranks
// agree on one NCCL id. Plain C++ (no CUDA): the NCCL communicator (trainer/cuda/) calls it, and
// the unit tests run it on any machine.
//
// Owns: reading the launcher's variables (torchrun, mpirun/OpenMPI, Slurm srun) into a rank,
// world size and local rank (read_launch_info, strict: the trainer's communicator; read_job_rank,
// lenient and with more launchers: the probe's rank of a recorded process); choosing the rendezvous (NCCL_COMM_ID, a shared file, or none for
// one process); the rendezvous-file protocol.
// May call: the C library and POSIX files. Called by: trainer/cuda/nccl_communicator.cpp, the probe
// (probe/src/inject/probe_main.cpp), tests.
//
// Launcher variables (each set is complete or absent; every value a decimal integer >= 0):
//   torchrun          RANK, WORLD_SIZE, LOCAL_RANK              (+ LOCAL_WORLD_SIZE, optional)
//   mpirun (OpenMPI)  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//                                                               (+ OMPI_COMM_WORLD_LOCAL_SIZE, optional)
//   srun (Slurm)      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
// A set is present when any of its three variables is set, except Slurm's, which is present only
// when SLURM_PROCID is set: salloc and sbatch shells export SLURM_NTASKS to processes that are not
// tasks. When two sets are present (srun starting torchrun, say) they must agree on rank, world
// size and local rank; otherwise the error names both, and ZT_LAUNCHER=torchrun|mpirun|srun|none
// says which one to read (none: one process, every launcher variable ignored). No set: one process
// (rank 0 of 1).
//
// Rendezvous (ncclUniqueId, 128 bytes):
//   NCCL_COMM_ID=host:port   every rank calls ncclGetUniqueId, which reads it; rank 0's
//                            ncclCommInitRank listens there. Nothing is exchanged by us.
//   ZT_NCCL_ID_FILE=PATH     rank 0 writes the id to PATH; the others poll for it (below).
//   neither, world size 1    nothing to exchange.
// Both set is refused (NCCL would use NCCL_COMM_ID whatever we did with the file); neither with a
// world size above 1 is refused with what to set. ZT_RENDEZVOUS_TIMEOUT (seconds, default 300)
// bounds the wait. ZT_RUN_ID, or else the launcher's job id (SLURM_JOB_ID[.SLURM_STEP_ID],
// PMIX_NAMESPACE / OMPI_MCA_ess_base_jobid, TORCHELASTIC_RUN_ID unless "none"), tags the file so a
// stale one from another job is not taken for this job's.
//
// The rendezvous file: one line of text,
//   zerotrace-rendezvous v1 world=<N> job=<id or -> bytes=<n> data=<2n lowercase hex digits>\n
// Rank 0 writes it to a temporary file in the same directory, fsyncs it, renames it over PATH and
// fsyncs the directory, so a reader sees either no file, an older file, or the whole new one.
// Readers poll every `poll` until a file with this world size, job id and length appears, or the
// timeout passes (the error says what was there, if anything). A file that is not a rendezvous
// file at all is an error at once. The NCCL communicator's rank 0 removes the file once
// ncclCommInitRank has returned (every rank has then joined, so every rank has read it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace zt::trainer {

// Missing or inconsistent launch settings, a bad rendezvous file, a rendezvous timeout. The
// message names the variable or file and says what to do.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One environment variable's value, or nullopt when unset. Tests pass a map instead of the
// process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();
EnvLookup environment_from(std::map<std::string, std::string> vars);

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 0;      // 0: not told by the launcher
  std::string launcher = "none";  // "torchrun", "mpirun", "srun" or "none"
  std::string variables;         // what was read: "RANK=1 WORLD_SIZE=4 LOCAL_RANK=1"
  std::string job_id;            // "" when not known
  // "rank 1 of 4 (local rank 1) from torchrun (RANK=1 WORLD_SIZE=4 LOCAL_RANK=1)"
  std::string describe() const;
};

// Throws LaunchError for a partial set, a non-numeric or out-of-range value, launchers that
// disagree, or an unknown ZT_LAUNCHER.
LaunchInfo read_launch_info(const EnvLookup& env);

// ---- the job's rank of a probed process (zt probe) ------------------------------------------
// Under `zt probe` every process of a job is recorded: the launcher, its ranks, the helpers they
// start. read_job_rank says which rank of the job this process's launcher variables name. Unlike
// read_launch_info it never throws (a probe records whatever it is given) and it reads more
// launchers. When several sets are present the first of this list wins, innermost launcher first
// (torchrun and DeepSpeed start their workers inside an srun or mpirun allocation, never the other
// way round, so the variables a process was given last come first):
//   1. torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE: torchrun and
//                 python -m torch.distributed.run (the elastic agent), accelerate launch (torchrun
//                 underneath), DeepSpeed's launcher (deepspeed.launcher.launch: RANK, LOCAL_RANK,
//                 WORLD_SIZE, and LOCAL_SIZE instead of LOCAL_WORLD_SIZE)
//   2. mpirun     OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK (OpenMPI,
//                 DeepSpeed's OpenMPI runner)
//   3. mvapich    MV2_COMM_WORLD_RANK, MV2_COMM_WORLD_SIZE, MV2_COMM_WORLD_LOCAL_RANK (MVAPICH2,
//                 DeepSpeed's MVAPICH runner)
//   4. mpich      PMI_RANK, PMI_SIZE, MPI_LOCALRANKID (MPICH's and Intel MPI's Hydra, srun --mpi=pmi2,
//                 DeepSpeed's MPICH runner)
//   5. srun       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (also sbatch's batch shell, which runs as
//                 task 0 of the job)
//   6. local      LOCAL_RANK alone, without RANK (a one-node launcher): the rank is the local rank,
//                 the world LOCAL_WORLD_SIZE
// A set is present when its rank variable is set. A rank that is not a decimal integer >= 0 skips
// its set (the next one is read) and says so in `notes`; a world size that is missing or unreadable
// is 0 (unknown); a rank not below its world size makes the world size unknown too. Every set
// present but not chosen is named in `notes` when it names another rank ("SLURM_PROCID=0 ignored:
// RANK comes first"). ZT_LAUNCHER=torchrun|mpirun|mvapich|mpich|srun|local reads only that set;
// ZT_LAUNCHER=none says this process is no rank (every launcher variable ignored).
struct JobRank {
  bool has_rank = false;  // false: no launcher variable names a rank of this process
  int rank = 0;
  int world_size = 0;             // 0: not known
  std::optional<int> local_rank;  // when the launcher said
  std::string launcher;           // "torchrun", "mpirun", "mvapich", "mpich", "srun", "local"; "" without a rank
  std::string variables;          // what was read: "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1"
  std::vector<std::string> notes;  // what was odd or ignored, one sentence each
  // The same claim: launcher, rank and world size (what a child that inherited the variables has).
  bool same_claim(const JobRank& o) const {
    return has_rank == o.has_rank && launcher == o.launcher && rank == o.rank && world_size == o.world_size;
  }
  // "rank 1 of 2 (local rank 1) from torchrun (RANK=1 WORLD_SIZE=2 LOCAL_RANK=1)", "no rank variables"
  std::string describe() const;
};
JobRank read_job_rank(const EnvLookup& env);

enum class RendezvousMethod { Single, NcclCommId, File };

struct RendezvousPlan {
  RendezvousMethod method = RendezvousMethod::Single;
  std::string comm_id;  // NcclCommId: the value of NCCL_COMM_ID
  std::string file;     // File: the path
  std::string origin;   // where the file's path came from, for messages: "ZT_NCCL_ID_FILE"
  std::chrono::milliseconds timeout{300000};
  std::string describe() const;  // "file /shared/nccl.id (ZT_NCCL_ID_FILE), timeout 300 s"
};

// Throws LaunchError: both NCCL_COMM_ID and ZT_NCCL_ID_FILE set; NCCL_COMM_ID not host:port;
// an empty ZT_NCCL_ID_FILE; a bad ZT_RENDEZVOUS_TIMEOUT; world size > 1 with neither.
RendezvousPlan plan_rendezvous(const EnvLookup& env, const LaunchInfo& info);

// The rendezvous file of one job.
struct RendezvousFile {
  std::string path;
  std::string origin;  // for messages ("ZT_NCCL_ID_FILE"); may be empty
  int world_size = 1;
  std::string job_id;  // "" matches only a file written with no job id
  std::chrono::milliseconds timeout{300000};
  std::chrono::milliseconds poll{20};
};

// Rank 0: writes `blob` (1..4096 bytes) atomically. Throws LaunchError naming the file and the
// system error when it cannot.
void publish_rendezvous(const RendezvousFile& f, const void* blob, size_t bytes);
// The others: the blob rank 0 published for this job, exactly `bytes` long. Throws LaunchError
// on timeout (saying whether the file was missing or held another job's id) or when the file is
// not a rendezvous file.
std::vector<uint8_t> wait_for_rendezvous(const RendezvousFile& f, size_t bytes, int rank);
// Best effort; a missing file is fine.
void remove_rendezvous(const RendezvousFile& f);

// The file's line for `blob`, and its parse (nullopt when `text` is not a complete, well-formed
// rendezvous line); exposed for tests.
std::string format_rendezvous_line(const void* blob, size_t bytes, int world_size, const std::string& job_id);
struct RendezvousContents {
  int world_size = 0;
  std::string job_id;
  std::vector<uint8_t> blob;
};
std::optional<RendezvousContents> parse_rendezvous_line(std::string_view text);

}  // namespace zt::trainer
