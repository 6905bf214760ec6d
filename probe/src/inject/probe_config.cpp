// ZT_PROBE_* environment parsing (see zt/probe/probe_config.h for the contract).
#include "zt/probe/probe_config.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string_view>

#include "zt/common/units.h"
#include "zt/db/trace_values.h"

namespace zt::probe {
namespace {
Status parse_bool(const char* name, const char* v, bool* out) {
  std::string_view s(v);
  if (s == "1" || s == "true" || s == "yes" || s == "on") *out = true;
  else if (s == "0" || s == "false" || s == "no" || s == "off") *out = false;
  else return Status::Error(std::string(name) + "=" + v + ": expected 0 or 1");
  return Status::Ok();
}
Status parse_int(const char* name, const char* v, int lo, int hi, int* out) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (!*v || *end || x < lo || x > hi)
    return Status::Error(std::string(name) + "=" + v + ": expected a whole number from " + std::to_string(lo) +
                         " to " + std::to_string(hi));
  *out = static_cast<int>(x);
  return Status::Ok();
}
}  // namespace

std::optional<int64_t> parse_max_trace(const std::string& text) {
  if (text == "none") return 0;
  auto b = parse_bytes(text);
  if (!b || *b > uint64_t(db::kMaxTraceBytes)) return std::nullopt;
  return int64_t(*b);
}

Status probe_config_from_env(const std::function<const char*(const char*)>& getenv, ProbeConfig* out) {
  ProbeConfig c;
  if (const char* v = getenv(kEnvOutput); v && *v) c.output = v;
  if (const char* v = getenv(kEnvHostThreshold); v && *v) {
    auto b = parse_bytes(v);
    if (!b) return Status::Error(std::string(kEnvHostThreshold) + "=" + v + ": not a size (examples: 1MiB, 65536)");
    c.host_threshold = *b == 0 ? 1 : *b;  // 0 would record every allocation; 1 says the same without a special case
  }
  if (const char* v = getenv(kEnvSampleInterval); v && *v) {
    auto b = parse_bytes(v);
    if (!b || *b > (1ull << 40))
      return Status::Error(std::string(kEnvSampleInterval) + "=" + v +
                           ": not a size up to 1TiB (examples: 512KiB, 65536; 0 = off)");
    c.sample_interval = *b;
  }
  if (const char* v = getenv(kEnvMaxTrace); v && *v) {
    auto b = parse_max_trace(v);
    if (!b) return Status::Error(std::string(kEnvMaxTrace) + "=" + v + ": not a size (examples: 512MiB, 2GiB; 0 or none = no cap)");
    c.max_trace = *b;
  }
  if (const char* v = getenv(kEnvDetail); v && *v)
    if (Status s = parse_detail_policy(v, &c.detail); !s) return Status::Error(std::string(kEnvDetail) + "=" + s.message());
  if (const char* v = getenv(kEnvFlightRecorder); v && *v)
    if (Status s = parse_flight_recorder(v, &c.flight); !s)
      return Status::Error(std::string(kEnvFlightRecorder) + "=" + s.message());
  if (const char* v = getenv(kEnvFlightMemory); v && *v)
    if (Status s = parse_flight_memory(v, machine_memory_bytes(), &c.flight.max_bytes); !s)
      return Status::Error(std::string(kEnvFlightMemory) + "=" + s.message());
  if (const char* v = getenv(kEnvSampleSeed); v && *v) {
    char* end = nullptr;
    errno = 0;
    unsigned long long x = std::strtoull(v, &end, 10);
    if (*end || errno || *v == '-')
      return Status::Error(std::string(kEnvSampleSeed) + "=" + v + ": expected a whole number (0 = random)");
    c.sample_seed = x;
  }
  if (const char* v = getenv(kEnvStacks); v && *v)
    if (Status s = parse_bool(kEnvStacks, v, &c.stacks); !s) return s;
  if (const char* v = getenv(kEnvStackDepth); v && *v)
    if (Status s = parse_int(kEnvStackDepth, v, 1, 128, &c.stack_depth); !s) return s;
  if (const char* v = getenv(kEnvPython); v && *v) {
    const std::string_view p(v);
    if (p == "gil") {
      c.python = PythonFrames::Gil;
    } else {
      bool on = true;
      if (Status s = parse_bool(kEnvPython, v, &on); !s)
        return Status::Error(std::string(kEnvPython) + "=" + v + ": expected 1, gil or 0");
      c.python = on ? PythonFrames::Own : PythonFrames::Off;
    }
  }
  if (const char* v = getenv(kEnvHost); v && *v)
    if (Status s = parse_bool(kEnvHost, v, &c.host); !s) return s;
  if (const char* v = getenv(kEnvCuda); v && *v)
    if (Status s = parse_bool(kEnvCuda, v, &c.cuda); !s) return s;
  if (const char* v = getenv(kEnvRssMs); v && *v)
    if (Status s = parse_int(kEnvRssMs, v, 0, 3600000, &c.rss_interval_ms); !s) return s;
  if (const char* v = getenv(kEnvQuiet); v && *v)
    if (Status s = parse_bool(kEnvQuiet, v, &c.quiet); !s) return s;
  if (const char* v = getenv(kEnvForks); v && *v)
    if (Status s = parse_bool(kEnvForks, v, &c.forks); !s) return s;
  if (const char* v = getenv(kEnvCommand); v && *v) c.command_line = v;
  if (const char* v = getenv(kEnvRunId); v && *v) {
    std::string_view id(v);
    bool ok = id.size() <= 64;
    for (char ch : id)
      ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                  ch == '_' || ch == '-');
    if (!ok) return Status::Error(std::string(kEnvRunId) + "=" + v + ": expected up to 64 of A-Z a-z 0-9 . _ -");
    c.run_id = v;
  }
  *out = std::move(c);
  return Status::Ok();
}

std::string trace_stem(const std::string& main) {
  std::string stem = main;
  if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".db") == 0) stem.resize(stem.size() - 3);
  return stem;
}

std::string torch_history_path(const std::string& main, int64_t pid) {
  return trace_stem(main) + ".torch.pid" + std::to_string(pid) + ".pickle";
}

std::string per_process_trace_path(const std::string& main, int pid) {
  return trace_stem(main) + ".pid" + std::to_string(pid) + ".db";
}

std::string shell_quote(const std::string& word) {
  bool plain = !word.empty();
  for (unsigned char ch : word)
    plain = plain && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                      std::string_view("_@%+=:,./-").find(char(ch)) != std::string_view::npos);
  if (plain) return word;
  std::string out = "'";
  for (char ch : word) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string shell_quote_command(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out += ' ';
    out += shell_quote(w);
  }
  return out;
}

std::string format_rank_owner(const RankOwner& o) {
  const RankClaim& c = o.claim;
  return (o.host.empty() ? std::string("-") : o.host) + " " + std::to_string(o.pid) + " " +
         (c.has_rank ? c.launcher : std::string("-")) + " " + std::to_string(c.has_rank ? c.rank : 0) + " " +
         std::to_string(c.has_rank ? c.world_size : 0);
}

std::optional<RankOwner> parse_rank_owner(const std::string& text) {
  std::vector<std::string> words;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find(' ', at), text.size());
    words.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  if (words.size() != 5) return std::nullopt;
  auto number = [](const std::string& w) -> std::optional<int64_t> {
    if (w.empty() || w.size() > 10) return std::nullopt;
    int64_t v = 0;
    for (char c : w) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    return v;
  };
  const auto pid = number(words[1]), rank = number(words[3]), world = number(words[4]);
  if (words[0].empty() || !pid || *pid < 1 || words[2].empty() || !rank || !world || *rank > INT32_MAX ||
      *world > INT32_MAX)
    return std::nullopt;
  RankOwner o;
  o.host = words[0] == "-" ? "" : words[0];
  o.pid = *pid;
  o.claim.has_rank = words[2] != "-";
  if (o.claim.has_rank) {
    o.claim.launcher = words[2];
    o.claim.rank = int(*rank);
    o.claim.world_size = int(*world);
  }
  return o;
}

ProcessRole decide_process_role(const RankClaim& self, bool root, const std::optional<RankOwner>& owner,
                                bool owner_here, bool owner_is_self, bool owner_is_ancestor) {
  ProcessRole r;
  if (self.has_rank) {
    r.job_rank = self.rank;
    if (owner && !owner_is_self && owner_is_ancestor && owner->claim.same(self)) {
      r.role = db::RankRole::Helper;  // it inherited its rank's variables
      return r;
    }
    r.role = db::RankRole::Rank;
    r.owns = true;
    if (owner && owner_here && !owner_is_self) r.launched_by = owner->pid;
    return r;
  }
  if (root || (owner && owner_is_self)) {
    r.role = db::RankRole::Rank;  // the one process of a run without a launcher, so far
    r.owns = true;
    return r;
  }
  r.role = db::RankRole::Helper;
  if (owner && owner->claim.has_rank) r.job_rank = owner->claim.rank;
  return r;
}

}  // namespace zt::probe
