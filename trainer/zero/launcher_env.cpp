// trainer/zero/launcher_env.cpp: see launcher_env.h.
#include "zero/launcher_env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

namespace zt::trainer {

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup environment_from(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

namespace {

struct LauncherVars {
  const char* name;        // "torchrun"
  const char* rank;        // "RANK"
  const char* world;       // "WORLD_SIZE"
  const char* local_rank;  // "LOCAL_RANK"
  const char* local_size;  // optional, may be null
  bool present_by_rank_only;
};

// In the order a single present launcher is reported; ZT_LAUNCHER names them the same way.
constexpr LauncherVars kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", false},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", false},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, true},
};

// A decimal integer >= 0 that fits an int; surrounding spaces are not accepted either, since a
// launcher never writes them and a hand-written "4 " is more likely a quoting mistake.
int parse_count(const std::string& var, const std::string& value, const char* launcher) {
  const std::string who = std::string(" (") + launcher + "'s variable)";
  if (value.empty()) throw LaunchError(var + " is set but empty" + who + ": it must be a decimal integer >= 0");
  long long v = 0;
  for (char c : value) {
    if (c < '0' || c > '9')
      throw LaunchError(var + "='" + value + "' is not a decimal integer >= 0" + who);
    v = v * 10 + (c - '0');
    if (v > std::numeric_limits<int>::max()) throw LaunchError(var + "='" + value + "' is too large" + who);
  }
  return int(v);
}

std::optional<std::string> job_id_for(const EnvLookup& env, const std::string& launcher) {
  if (auto v = env("ZT_RUN_ID"); v && !v->empty()) return v;
  if (launcher == "srun") {
    auto job = env("SLURM_JOB_ID");
    if (!job || job->empty()) return std::nullopt;
    auto step = env("SLURM_STEP_ID");
    return step && !step->empty() ? *job + "." + *step : *job;
  }
  if (launcher == "mpirun") {
    if (auto v = env("PMIX_NAMESPACE"); v && !v->empty()) return v;
    if (auto v = env("OMPI_MCA_ess_base_jobid"); v && !v->empty()) return v;
    return std::nullopt;
  }
  if (launcher == "torchrun") {
    // torchrun's default rdzv_id is "none": the same string in every job, so no identity.
    if (auto v = env("TORCHELASTIC_RUN_ID"); v && !v->empty() && *v != "none") return v;
  }
  return std::nullopt;
}

// The set of one launcher, or nullopt when absent. Throws for a partial or invalid set.
std::optional<LaunchInfo> read_set(const EnvLookup& env, const LauncherVars& l) {
  const auto rank = env(l.rank), world = env(l.world), local = env(l.local_rank);
  const bool present = l.present_by_rank_only ? rank.has_value() : (rank || world || local);
  if (!present) return std::nullopt;

  std::string set_text, missing;
  auto note = [&](const char* var, const std::optional<std::string>& v) {
    if (v) {
      set_text += (set_text.empty() ? "" : " ") + std::string(var) + "=" + *v;
    } else {
      missing += (missing.empty() ? "" : " and ") + std::string(var);
    }
  };
  note(l.rank, rank);
  note(l.world, world);
  note(l.local_rank, local);
  if (!missing.empty())
    throw LaunchError(std::string(l.name) + "'s variables are incomplete: " + set_text + " set, but " + missing +
                      " not. Start every process with the launcher (" + l.name +
                      "), or unset the stray variables; ZT_LAUNCHER=none ignores them all.");

  LaunchInfo info;
  info.launcher = l.name;
  info.rank = parse_count(l.rank, *rank, l.name);
  info.world_size = parse_count(l.world, *world, l.name);
  info.local_rank = parse_count(l.local_rank, *local, l.name);
  info.variables = set_text;
  if (l.local_size) {
    if (auto ls = env(l.local_size)) {
      info.local_world_size = parse_count(l.local_size, *ls, l.name);
      info.variables += std::string(" ") + l.local_size + "=" + *ls;
    }
  }
  const std::string w = std::string(l.world) + "=" + std::to_string(info.world_size);
  if (info.world_size < 1) throw LaunchError(w + ": the world size must be at least 1 (" + l.name + ")");
  if (info.rank >= info.world_size)
    throw LaunchError(std::string(l.rank) + "=" + std::to_string(info.rank) + " is not below " + w +
                      ": ranks run from 0 to " + std::to_string(info.world_size - 1) + " (" + l.name + ")");
  if (info.local_rank >= info.world_size)
    throw LaunchError(std::string(l.local_rank) + "=" + std::to_string(info.local_rank) + " is not below " + w +
                      " (" + l.name + ")");
  if (l.local_size && info.local_world_size > 0) {
    const std::string lw = std::string(l.local_size) + "=" + std::to_string(info.local_world_size);
    if (info.local_rank >= info.local_world_size)
      throw LaunchError(std::string(l.local_rank) + "=" + std::to_string(info.local_rank) + " is not below " + lw +
                        " (" + l.name + ")");
    if (info.local_world_size > info.world_size)
      throw LaunchError(lw + " is larger than " + w + " (" + l.name + ")");
  }
  if (l.local_size && env(l.local_size) && info.local_world_size == 0)
    throw LaunchError(std::string(l.local_size) + "=0: a node runs at least one process (" + l.name + ")");
  info.job_id = job_id_for(env, l.name).value_or("");
  return info;
}

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, s.find_first_not_of(ws));
  s.erase(s.find_last_not_of(ws) + 1);
  return s;
}

}  // namespace

std::string LaunchInfo::describe() const {
  std::string s = "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local rank " +
                  std::to_string(local_rank) + ")";
  if (launcher == "none") return s + ", no launcher variables (one process)";
  return s + " from " + launcher + " (" + variables + ")";
}

LaunchInfo read_launch_info(const EnvLookup& env) {
  if (auto chosen = env("ZT_LAUNCHER")) {
    const std::string c = trim(*chosen);
    if (c == "none") return LaunchInfo{};
    for (const LauncherVars& l : kLaunchers) {
      if (c != l.name) continue;
      std::optional<LaunchInfo> info = read_set(env, l);
      if (!info)
        throw LaunchError("ZT_LAUNCHER=" + c + " but " + l.rank + " is not set: this process was not started by " +
                          c);
      return *info;
    }
    throw LaunchError("ZT_LAUNCHER='" + *chosen + "': use torchrun, mpirun, srun or none");
  }
  std::vector<LaunchInfo> found;
  for (const LauncherVars& l : kLaunchers)
    if (std::optional<LaunchInfo> info = read_set(env, l)) found.push_back(*info);
  if (found.empty()) return LaunchInfo{};
  for (size_t i = 1; i < found.size(); ++i) {
    const LaunchInfo& a = found[0];
    const LaunchInfo& b = found[i];
    if (a.rank != b.rank || a.world_size != b.world_size || a.local_rank != b.local_rank)
      throw LaunchError("launcher variables disagree: " + a.launcher + " says rank " + std::to_string(a.rank) +
                        " of " + std::to_string(a.world_size) + ", local rank " + std::to_string(a.local_rank) + " (" +
                        a.variables + "), but " + b.launcher + " says rank " + std::to_string(b.rank) + " of " +
                        std::to_string(b.world_size) + ", local rank " + std::to_string(b.local_rank) + " (" +
                        b.variables + "). Set ZT_LAUNCHER=" + a.launcher + " or ZT_LAUNCHER=" + b.launcher +
                        " to say which launcher started this process.");
  }
  return found[0];
}

// ---- the job's rank of a probed process ----------------------------------------------------

namespace {

struct JobRankVars {
  const char* name;        // "torchrun"
  const char* rank;        // "RANK"
  const char* world;       // "WORLD_SIZE"
  const char* local_rank;  // "LOCAL_RANK" (may be null)
  const char* alt_world;   // a second world-size variable, read when `world` is unset (may be null)
};

// In precedence order (launcher_env.h).
constexpr JobRankVars kJobRankSets[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", nullptr},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", nullptr},
    {"mvapich", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", nullptr},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", nullptr},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
    {"local", "LOCAL_RANK", "LOCAL_WORLD_SIZE", nullptr, "LOCAL_SIZE"},
};

// A decimal integer >= 0 that fits an int, or nullopt.
std::optional<int> count_of(const std::string& v) {
  if (v.empty() || v.size() > 10) return std::nullopt;
  long long n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  if (n > std::numeric_limits<int>::max()) return std::nullopt;
  return int(n);
}

// One set, or nullopt where its rank variable is unset or unreadable (a note says which).
std::optional<JobRank> read_job_set(const EnvLookup& env, const JobRankVars& l, std::vector<std::string>* notes) {
  const auto rank = env(l.rank);
  if (!rank) return std::nullopt;
  if (std::string(l.name) == "local" && env("RANK")) return std::nullopt;  // LOCAL_RANK belongs to torchrun's set
  const auto r = count_of(*rank);
  if (!r) {
    notes->push_back(std::string(l.rank) + "='" + *rank + "' is not a decimal integer >= 0: " + l.name +
                     "'s variables were ignored");
    return std::nullopt;
  }
  JobRank j;
  j.has_rank = true;
  j.launcher = l.name;
  j.rank = *r;
  j.variables = std::string(l.rank) + "=" + *rank;
  const char* world_var = l.world;
  auto world = env(l.world);
  if (!world && l.alt_world && (world = env(l.alt_world))) world_var = l.alt_world;
  if (world) {
    j.variables += std::string(" ") + world_var + "=" + *world;
    const auto w = count_of(*world);
    if (!w || *w < 1)
      notes->push_back(std::string(world_var) + "='" + *world + "' is not a world size (an integer >= 1): not known");
    else if (*r >= *w)
      notes->push_back(std::string(l.rank) + "=" + *rank + " is not below " + world_var + "=" + *world +
                       ": the world size is not known");
    else
      j.world_size = *w;
  } else {
    notes->push_back(std::string(l.world) + " is not set: the world size is not known");
  }
  if (l.local_rank) {
    if (auto lr = env(l.local_rank)) {
      j.variables += std::string(" ") + l.local_rank + "=" + *lr;
      j.local_rank = count_of(*lr);
      if (!j.local_rank) notes->push_back(std::string(l.local_rank) + "='" + *lr + "' is not a local rank: not known");
    }
  } else {
    j.local_rank = j.rank;  // "local": the rank is the local rank
  }
  return j;
}

}  // namespace

std::string JobRank::describe() const {
  if (!has_rank) return "no rank variables";
  std::string s = "rank " + std::to_string(rank) + (world_size > 0 ? " of " + std::to_string(world_size) : "");
  if (local_rank) s += " (local rank " + std::to_string(*local_rank) + ")";
  return s + " from " + launcher + " (" + variables + ")";
}

JobRank read_job_rank(const EnvLookup& env) {
  JobRank out;
  std::vector<std::string> notes;
  if (auto chosen = env("ZT_LAUNCHER")) {
    const std::string c = trim(*chosen);
    if (c == "none") return out;
    for (const JobRankVars& l : kJobRankSets) {
      if (c != l.name) continue;
      if (std::optional<JobRank> j = read_job_set(env, l, &notes)) out = *j;
      else notes.push_back("ZT_LAUNCHER=" + c + " but " + l.rank + " is not set (or not a rank)");
      out.notes.insert(out.notes.begin(), notes.begin(), notes.end());
      return out;
    }
    notes.push_back("ZT_LAUNCHER='" + *chosen +
                    "' is not one of torchrun, mpirun, mvapich, mpich, srun, local or none: ignored");
  }
  bool chose = false;
  const char* chosen_var = "";
  for (const JobRankVars& l : kJobRankSets) {
    std::vector<std::string> set_notes;
    std::optional<JobRank> j = read_job_set(env, l, &set_notes);
    if (!chose) {
      notes.insert(notes.end(), set_notes.begin(), set_notes.end());
      if (j) {
        out = *j;
        chose = true;
        chosen_var = l.rank;
      }
    } else if (j && j->rank != out.rank) {
      notes.push_back(std::string(l.rank) + "=" + std::to_string(j->rank) + " ignored: " + chosen_var + " (" +
                      out.launcher + ") comes first");
    }
  }
  out.notes = notes;
  return out;
}

// ---- rendezvous plan ------------------------------------------------------------------------

namespace {

// host:port or [ipv6]:port, port 1..65535: what NCCL's ncclSocketGetAddrFromString accepts, checked
// here so the error comes before NCCL's WARN line.
bool valid_comm_id(const std::string& v) {
  size_t colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= v.size()) return false;
  const std::string host = v.substr(0, colon), port = v.substr(colon + 1);
  if (host.front() == '[' ? (host.back() != ']' || host.size() < 3) : host.find(':') != std::string::npos) return false;
  if (port.size() > 5) return false;
  long p = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    p = p * 10 + (c - '0');
  }
  return p >= 1 && p <= 65535;
}

}  // namespace

std::string RendezvousPlan::describe() const {
  const std::string t = ", timeout " + std::to_string(timeout.count() / 1000) + " s";
  switch (method) {
    case RendezvousMethod::Single: return "none (one process)";
    case RendezvousMethod::NcclCommId: return "NCCL_COMM_ID=" + comm_id + t;
    case RendezvousMethod::File: return "file " + file + " (" + origin + ")" + t;
  }
  return "?";
}

RendezvousPlan plan_rendezvous(const EnvLookup& env, const LaunchInfo& info) {
  RendezvousPlan plan;
  if (auto t = env("ZT_RENDEZVOUS_TIMEOUT")) {
    char* end = nullptr;
    errno = 0;
    const double s = std::strtod(t->c_str(), &end);
    if (t->empty() || end != t->c_str() + t->size() || errno != 0 || !(s > 0) || s > 1e7)
      throw LaunchError("ZT_RENDEZVOUS_TIMEOUT='" + *t + "': give the rendezvous timeout in seconds, a number > 0");
    plan.timeout = std::chrono::milliseconds(int64_t(s * 1000.0 + 0.5));
    if (plan.timeout.count() == 0) plan.timeout = std::chrono::milliseconds(1);
  }
  const auto comm_id = env("NCCL_COMM_ID");
  const auto file = env("ZT_NCCL_ID_FILE");
  if (comm_id && file)
    throw LaunchError("both NCCL_COMM_ID=" + *comm_id + " and ZT_NCCL_ID_FILE=" + *file +
                      " are set: NCCL uses NCCL_COMM_ID whenever it is set, so the file would be ignored; unset one");
  if (comm_id) {
    if (!valid_comm_id(*comm_id))
      throw LaunchError("NCCL_COMM_ID='" + *comm_id +
                        "' is not <host>:<port> or [<ipv6>]:<port> (rank 0's host and a free port, the same on every rank)");
    plan.method = RendezvousMethod::NcclCommId;
    plan.comm_id = *comm_id;
    return plan;
  }
  if (file) {
    if (trim(*file).empty()) throw LaunchError("ZT_NCCL_ID_FILE is set but empty: give a path every rank can read");
    plan.method = RendezvousMethod::File;
    plan.file = *file;
    plan.origin = "ZT_NCCL_ID_FILE";
    return plan;
  }
  if (info.world_size > 1)
    throw LaunchError("world size " + std::to_string(info.world_size) + " (" + info.describe() +
                      ") needs a rendezvous for NCCL: set NCCL_COMM_ID=<rank 0's host>:<free port> on every rank, "
                      "or ZT_NCCL_ID_FILE=<a path on a file system every rank sees>");
  return plan;
}

// ---- the rendezvous file ------------------------------------------------------------------------

namespace {

constexpr const char* kMagic = "zerotrace-rendezvous";
constexpr size_t kMaxBlob = 4096;

std::string where(const RendezvousFile& f) {
  return f.path + (f.origin.empty() ? "" : " (" + f.origin + ")");
}

std::string job_text(const std::string& job) {
  if (job.empty()) return "-";
  std::string s = job;
  for (char& c : s)
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '=') c = '_';
  return s;
}

std::string errno_text(int e) { return std::strerror(e); }

std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Reads the whole file; nullopt when it does not exist. Throws for other errors.
std::optional<std::string> read_file(const RendezvousFile& f) {
  int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw LaunchError("cannot read the rendezvous file " + where(f) + ": " + errno_text(errno));
  }
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      throw LaunchError("cannot read the rendezvous file " + where(f) + ": " + errno_text(e));
    }
    if (n == 0) break;
    text.append(buf, size_t(n));
    if (text.size() > 4 * kMaxBlob) break;  // not ours; parse rejects it
  }
  ::close(fd);
  return text;
}

}  // namespace

std::string format_rendezvous_line(const void* blob, size_t bytes, int world_size, const std::string& job_id) {
  static const char* hex = "0123456789abcdef";
  std::string line = std::string(kMagic) + " v1 world=" + std::to_string(world_size) + " job=" + job_text(job_id) +
                     " bytes=" + std::to_string(bytes) + " data=";
  const auto* p = static_cast<const uint8_t*>(blob);
  for (size_t i = 0; i < bytes; ++i) {
    line += hex[p[i] >> 4];
    line += hex[p[i] & 15];
  }
  return line + "\n";
}

std::optional<RendezvousContents> parse_rendezvous_line(std::string_view text) {
  // Exactly one line, ending in '\n'.
  if (text.empty() || text.back() != '\n' || text.find('\n') != text.size() - 1) return std::nullopt;
  text.remove_suffix(1);
  std::vector<std::string_view> fields;
  while (!text.empty()) {
    size_t sp = text.find(' ');
    fields.push_back(text.substr(0, sp));
    if (sp == std::string_view::npos) break;
    text.remove_prefix(sp + 1);
  }
  if (fields.size() != 6 || fields[0] != kMagic || fields[1] != "v1") return std::nullopt;
  auto value = [&](size_t i, std::string_view key) -> std::optional<std::string_view> {
    if (fields[i].substr(0, key.size()) != key) return std::nullopt;
    return fields[i].substr(key.size());
  };
  auto number = [](std::string_view s) -> std::optional<long> {
    if (s.empty() || s.size() > 9) return std::nullopt;
    long v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    return v;
  };
  auto world = value(2, "world="), job = value(3, "job="), bytes = value(4, "bytes="), data = value(5, "data=");
  if (!world || !job || !bytes || !data || job->empty()) return std::nullopt;
  auto w = number(*world), n = number(*bytes);
  if (!w || !n || *w < 1 || *n < 1 || size_t(*n) > kMaxBlob || data->size() != size_t(*n) * 2) return std::nullopt;
  RendezvousContents c;
  c.world_size = int(*w);
  c.job_id = *job == "-" ? std::string() : std::string(*job);
  c.blob.resize(size_t(*n));
  auto nibble = [](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < c.blob.size(); ++i) {
    int hi = nibble((*data)[2 * i]), lo = nibble((*data)[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    c.blob[i] = uint8_t(hi << 4 | lo);
  }
  return c;
}

void publish_rendezvous(const RendezvousFile& f, const void* blob, size_t bytes) {
  if (bytes < 1 || bytes > kMaxBlob)
    throw LaunchError("rendezvous: a blob of " + std::to_string(bytes) + " bytes (1 to 4096 allowed)");
  if (f.path.empty()) throw LaunchError("rendezvous: no file given");
  const std::string line = format_rendezvous_line(blob, bytes, f.world_size, f.job_id);
  const std::string dir = dir_of(f.path);
  const std::string base = f.path.substr(f.path.rfind('/') == std::string::npos ? 0 : f.path.rfind('/') + 1);
  std::random_device rd;
  const std::string tmp = (dir == "/" ? "" : dir) + "/." + base + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(rd() % 1000000);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw LaunchError("cannot write the rendezvous file " + where(f) + ": creating " + tmp + ": " + errno_text(errno) +
                      (errno == ENOENT ? " (does the directory " + dir + " exist on this node?)" : ""));
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw LaunchError("cannot write the rendezvous file " + where(f) + ": writing " + tmp + ": " + errno_text(e));
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw LaunchError("cannot write the rendezvous file " + where(f) + ": fsync " + tmp + ": " + errno_text(e));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), f.path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw LaunchError("cannot write the rendezvous file " + where(f) + ": renaming " + tmp + ": " + errno_text(e));
  }
  // The rename itself durable; a failure here loses nothing the readers need, so it is not fatal.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

std::vector<uint8_t> wait_for_rendezvous(const RendezvousFile& f, size_t bytes, int rank) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  std::string last_seen;  // what a file from another job held, for the timeout message
  for (;;) {
    if (std::optional<std::string> text = read_file(f)) {
      std::optional<RendezvousContents> c = parse_rendezvous_line(*text);
      if (!c) {
        // A foreign file: say so at once, rather than wait out the timeout.
        if (text->compare(0, std::strlen(kMagic), kMagic) != 0) {
          std::string head = text->substr(0, std::min<size_t>(text->find('\n'), 40));
          throw LaunchError("rank " + std::to_string(rank) + ": " + where(f) +
                            " exists but is not a zerotrace rendezvous file (it starts with '" + head +
                            "'); point ZT_NCCL_ID_FILE at a path of its own, or remove the file");
        }
        last_seen = "a malformed rendezvous file";
      } else if (c->world_size == f.world_size && c->job_id == f.job_id && c->blob.size() == bytes) {
        return c->blob;
      } else {
        last_seen = "a file for world size " + std::to_string(c->world_size) + ", job " + job_text(c->job_id) +
                    ", " + std::to_string(c->blob.size()) + " bytes";
      }
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - t0);
    if (waited >= f.timeout) {
      std::string what = last_seen.empty()
                             ? "the file never appeared"
                             : "it holds " + last_seen + ", while this job has world size " +
                                   std::to_string(f.world_size) + ", job " + job_text(f.job_id) + ", " +
                                   std::to_string(bytes) + " bytes (a stale file from another run?)";
      throw LaunchError("rank " + std::to_string(rank) + ": waited " + std::to_string(waited.count()) +
                        " ms for rank 0 to write the NCCL id to " + where(f) + ": " + what +
                        ". Is rank 0 running, and is the path on a file system every rank sees? "
                        "(ZT_RENDEZVOUS_TIMEOUT sets the wait in seconds)");
    }
    std::this_thread::sleep_for(std::min(f.poll, f.timeout - waited));
  }
}

void remove_rendezvous(const RendezvousFile& f) {
  if (!f.path.empty()) (void)::unlink(f.path.c_str());
}

}  // namespace zt::trainer
