// --placement: tensors on a device the run's config does not allow, and device_mismatch
// errors. The rules and their reasons are in inject/check/README.md.
#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "trace_data.h"
#include "zt/common/units.h"

namespace zt::check::detail {

namespace {

struct Expect {
  bool config = false;  // the run row carried a readable config
  bool offload_optimizer = false;
  bool offload_param = false;
  // offload_optimizer.ratio (ZeRO-Offload++): below 1 the first int((1 - ratio) * modules) modules
  // keep their optimizer state on the accelerator.
  double offload_ratio = 1.0;
  int64_t sub_groups = 0;  // the modules counted, as our config says (zero_optimization.sub_groups); 0: unknown
  bool lm_head = false;    // a custom shape with untied embeddings: an lm_head module after final_ln
};

// DeepSpeed spells an offload either as a flag (our resolved config) or as a block
// {"device": "cpu"|"nvme"|"none", ...} (a DeepSpeed JSON as written).
bool offload_on(const nlohmann::json& z, const char* key) {
  if (!z.is_object() || !z.contains(key)) return false;
  const auto& v = z[key];
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_object() && v.contains("device") && v["device"].is_string()) return v["device"].get<std::string>() != "none";
  return false;
}

Expect expect_of(const db::RunRow* run) {
  Expect e;
  if (!run || run->config_json.empty()) return e;
  auto j = nlohmann::json::parse(run->config_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return e;
  e.config = true;
  if (j.contains("shape") && j["shape"].is_object() && j["shape"].contains("tied_embeddings") &&
      j["shape"]["tied_embeddings"].is_boolean())
    e.lm_head = !j["shape"]["tied_embeddings"].get<bool>();
  if (j.contains("zero_optimization")) {
    const auto& z = j["zero_optimization"];
    e.offload_optimizer = offload_on(z, "offload_optimizer");
    e.offload_param = offload_on(z, "offload_param");
    // Ours spells it zero_optimization.offload_ratio; DeepSpeed's JSON offload_optimizer.ratio.
    const nlohmann::json* ratio = nullptr;
    if (z.is_object() && z.contains("offload_ratio")) ratio = &z["offload_ratio"];
    else if (z.is_object() && z.contains("offload_optimizer") && z["offload_optimizer"].is_object() &&
             z["offload_optimizer"].contains("ratio"))
      ratio = &z["offload_optimizer"]["ratio"];
    // DeepSpeed applies a ratio at stage 3 only.
    const bool stage3 = !z.contains("stage") || !z["stage"].is_number_integer() || z["stage"].get<int64_t>() == 3;
    if (ratio && ratio->is_number() && stage3) e.offload_ratio = std::clamp(ratio->get<double>(), 0.0, 1.0);
    if (z.is_object() && z.contains("sub_groups") && z["sub_groups"].is_number_integer())
      e.sub_groups = z["sub_groups"].get<int64_t>();
  }
  return e;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Optimizer states under offload_optimizer: fp32 partitions (and their .grad), Adam moments.
bool optimizer_state(const std::string& n) {
  return starts_with(n, "fp32_partitioned_groups_flat[") || starts_with(n, "adam.m[") || starts_with(n, "adam.v[");
}
// The module an optimizer state belongs to, by its name: fp32_partitioned_groups_flat[i] (and its
// .grad) is module i; adam.m[NAME] / adam.v[NAME] the module NAME: embeddings 0, blockK K + 1, then
// final_ln and an untied lm_head after the `blocks` blocks. -1 when the name says none.
int64_t module_index(const std::string& n, int64_t blocks) {
  auto number_after = [&](size_t at) -> int64_t {
    size_t end = at;
    while (end < n.size() && std::isdigit(static_cast<unsigned char>(n[end]))) ++end;
    return end > at && end - at < 10 ? std::stoll(n.substr(at, end - at)) : -1;
  };
  if (starts_with(n, "fp32_partitioned_groups_flat[")) return number_after(sizeof("fp32_partitioned_groups_flat[") - 1);
  if (!starts_with(n, "adam.m[") && !starts_with(n, "adam.v[")) return -1;
  const std::string module = n.substr(7, n.size() > 8 ? n.size() - 8 : 0);
  if (module == "embeddings") return 0;
  if (module == "final_ln") return blocks + 1;
  if (module == "lm_head") return blocks + 2;
  if (starts_with(module, "block")) {
    const int64_t k = number_after(7 + 5);
    return k < 0 ? -1 : k + 1;
  }
  return -1;
}

// Parameter shards under offload_param.
bool param_shard(const std::string& n) { return ends_with(n, ".shard"); }

struct Misplaced {
  std::set<std::string> names;
  int64_t first_t = kNever;
  int64_t first_rank = 0;
  std::map<std::string, int64_t> bytes;  // per name, the largest seen
};

std::string tensors_text(const std::string& json) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return json;
  std::string out;
  for (auto& x : j) out += (out.empty() ? "" : ", ") + (x.is_string() ? x.get<std::string>() : x.dump());
  return out;
}

}  // namespace

Status check_placement(TraceData& d, const Options&, CheckResult* out) {
  CheckResult& r = *out;
  r.name = "placement";

  std::map<int64_t, Expect> expect;  // per rank
  auto expect_for = [&](int64_t rank) -> const Expect& {
    auto it = expect.find(rank);
    if (it == expect.end()) it = expect.emplace(rank, expect_of(d.run_of(rank))).first;
    return it->second;
  };
  // Under a partial offload: the modules, as the config counts them; else (a config without the
  // count) per rank its blocks (the highest blockK named by an optimizer state, plus one) and whether
  // it has an untied lm_head, from the trace (too few where the run died while placing its states).
  std::map<int64_t, std::pair<int64_t, bool>> shape;  // rank -> (blocks, lm_head)
  for (const Alloc& a : d.allocs) {
    if (!a.name_id) continue;
    const std::string& n = d.str(a.name_id);
    if (!starts_with(n, "adam.m[")) continue;
    auto& [blocks, head] = shape[a.rank];
    if (n == "adam.m[lm_head]") head = true;
    if (const int64_t i = module_index(n, 0); starts_with(n, "adam.m[block") && i > 0) blocks = std::max(blocks, i);
  }
  // An optimizer state allowed on an accelerator: its module is one the ratio keeps there.
  auto kept_on_device = [&](int64_t rank, const std::string& n) {
    const Expect& e = expect_for(rank);
    if (e.offload_ratio >= 1) return false;
    auto [blocks, head] = shape[rank];
    int64_t modules = blocks + 2 + (head ? 1 : 0);
    if (e.sub_groups > 0) {
      modules = e.sub_groups;
      blocks = modules - 2 - (e.lm_head ? 1 : 0);
    }
    const int64_t i = module_index(n, blocks);
    return i >= 0 && i < int64_t((1.0 - e.offload_ratio) * double(modules));
  };
  bool any_config = false, any_opt = false, any_param = false;
  for (auto& run : d.runs) {
    Expect e = expect_of(&run);
    any_config |= e.config;
    any_opt |= e.offload_optimizer;
    any_param |= e.offload_param;
  }

  // A parameter shard on the accelerator is its resident copy (misplaced) when it lives across
  // a step boundary, outlives the trace, or lives on a rank without steps; a copy freed before the
  // next step begins is staged:
  // inside a fetch (H2D, then all-gathered and freed) that is how offload_param works, and between
  // steps it is the checkpoint's gather of the 16-bit weights (stage3_gather_16bit_weights_on_model_save).
  auto resident = [&](const Alloc& a) {
    if (a.t_free == kNever) return true;
    auto it = d.steps.find(a.rank);
    if (it == d.steps.end() || it->second.empty()) return true;  // no step to be staged for (died in setup)
    const auto& v = it->second;
    auto p = std::lower_bound(v.begin(), v.end(), a.t_alloc, [](const Span& s, int64_t t) { return s.t_start < t; });
    return p != v.end() && p->t_start < a.t_free;  // alive when a later step began
  };
  // Segments are the caching allocator's reserve (named after the first block carved from them),
  // not tensors: where a device has block rows, only blocks say where a tensor lived.
  std::set<std::pair<int64_t, int64_t>> has_blocks;  // (rank, device)
  for (const Alloc& a : d.allocs)
    if (a.level == db::AllocLevel::Block) has_blocks.insert({a.rank, a.device_id});
  auto inside_step = [&](int64_t rank, int64_t t) {
    auto it = d.steps.find(rank);
    if (it == d.steps.end()) return false;
    const auto& v = it->second;
    auto p = std::upper_bound(v.begin(), v.end(), t, [](int64_t x, const Span& s) { return x < s.t_start; });
    return p != v.begin() && t < std::prev(p)->t_end;
  };

  // key: (rank, rule, pattern, device)
  std::map<std::tuple<int64_t, int, std::string, int64_t>, Misplaced> found;
  std::set<std::pair<int64_t, std::string>> checked;  // (rank, name) under a rule
  auto note = [&](int64_t rank, int rule, const std::string& name, int64_t device_id, int64_t t, int64_t bytes) {
    Misplaced& m = found[{rank, rule, group_name(name), device_id}];
    m.names.insert(name);
    if (t < m.first_t) {
      m.first_t = t;
      m.first_rank = rank;
    }
    m.bytes[name] = std::max(m.bytes[name], bytes);
  };
  // The shard allocations on accelerators, by (rank, name, device): a placement row without an
  // allocation id (a copy into a tensor: "moved") is judged by the allocation it landed in.
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<const Alloc*>> shard_allocs;
  for (const Alloc& a : d.allocs)
    if (a.name_id && a.level == db::AllocLevel::Block && d.is_accelerator(a.device_id) && param_shard(d.str(a.name_id)))
      shard_allocs[{a.rank, a.name_id, a.device_id}].push_back(&a);
  auto in_allocation = [&](const db::PlacementRow& p) {
    auto it = shard_allocs.find({p.rank, p.tensor_id, p.device_id});
    if (it == shard_allocs.end()) return false;
    for (const Alloc* a : it->second)
      if (a->alive_at(p.t)) return true;
    return false;
  };
  for (const Alloc& a : d.allocs) {
    if (!a.name_id) continue;
    if (a.level == db::AllocLevel::Segment && has_blocks.count({a.rank, a.device_id})) continue;
    const Expect& e = expect_for(a.rank);
    if (!e.offload_optimizer && !e.offload_param) continue;
    const std::string& n = d.str(a.name_id);
    const bool opt = e.offload_optimizer && optimizer_state(n) && !kept_on_device(a.rank, n),
               par = e.offload_param && param_shard(n);
    if (!opt && !par) continue;
    checked.insert({a.rank, n});
    if (!d.is_accelerator(a.device_id)) continue;
    if (opt) note(a.rank, 0, n, a.device_id, a.t_alloc, a.bytes);
    else if (resident(a)) note(a.rank, 1, n, a.device_id, a.t_alloc, a.bytes);
  }
  // Placement rows: the same rules for moves (a copy_to onto the device), and for traces that
  // record placements without allocation rows.
  {
    std::vector<db::PlacementRow> rows;
    if (Status s = d.reader().read(&rows); !s) return s;
    for (auto& p : rows) {
      if (p.why == db::PlacementWhy::Freed || !p.tensor_id) continue;
      const Expect& e = expect_for(p.rank);
      if (!e.offload_optimizer && !e.offload_param) continue;
      const std::string& n = d.str(p.tensor_id);
      const bool opt = e.offload_optimizer && optimizer_state(n) && !kept_on_device(p.rank, n),
                 par = e.offload_param && param_shard(n);
      if (!opt && !par) continue;
      checked.insert({p.rank, n});
      if (!d.is_accelerator(p.device_id)) continue;
      if (opt) note(p.rank, 0, n, p.device_id, p.t, p.bytes.value_or(0));
      // A shard with an allocation row (its own, or the one it was copied into) was judged above
      // by its lifetime.
      else if (!p.allocation_id && !in_allocation(p) && !inside_step(p.rank, p.t))
        note(p.rank, 1, n, p.device_id, p.t, p.bytes.value_or(0));
    }
  }
  for (auto& [key, m] : found) {
    auto& [rank, rule, pattern, device_id] = key;
    int64_t total = 0;
    for (auto& [n, b] : m.bytes) total += b;
    std::string names;
    int shown = 0;
    for (auto& n : m.names) {
      if (shown == 3) {
        names += ", ...";
        break;
      }
      names += (shown++ ? ", " : "") + n;
    }
    std::string line = "rank " + std::to_string(rank) + ": " + pattern + " on " + d.device_label(device_id) +
                       ", expected on the host (zero_optimization." +
                       (rule == 0 ? "offload_optimizer" : "offload_param") + "): " + std::to_string(m.names.size()) +
                       " tensor" + (m.names.size() == 1 ? "" : "s") + " (" + names + "), " + format_bytes(double(total));
    if (auto st = d.step_at(m.first_rank, m.first_t)) line += ", first at step " + std::to_string(*st);
    else line += ", first before any step";
    r.findings.push_back(std::move(line));
  }

  int mismatches = 0;
  for (auto& e : d.errors) {
    if (e.kind != "device_mismatch") continue;
    ++mismatches;
    std::string line = "rank " + std::to_string(e.rank);
    line += e.step ? " step " + std::to_string(*e.step) : std::string(" (no step)");
    if (!e.site.empty()) line += " in " + e.site;
    line += ": device_mismatch: " + e.message;
    if (!e.tensors.empty()) line += " (tensors: " + tensors_text(e.tensors) + ")";
    if (e.device_id) line += " [device " + d.device_label(e.device_id) + "]";
    r.findings.push_back(std::move(line));
  }

  std::string rules;
  if (any_opt) rules += "offload_optimizer";
  if (any_param) rules += std::string(rules.empty() ? "" : ", ") + "offload_param";
  if (!r.findings.empty()) {
    r.outcome = Outcome::Fail;
    r.summary = std::to_string(r.findings.size() - size_t(mismatches)) + " misplaced tensor group" +
                (r.findings.size() - size_t(mismatches) == 1 ? "" : "s") + ", " + std::to_string(mismatches) +
                " device_mismatch error" + (mismatches == 1 ? "" : "s");
    return Status::Ok();
  }
  bool partial = false;
  for (auto& run : d.runs) partial |= expect_of(&run).offload_ratio < 1;
  if (!rules.empty())
    r.summary = std::to_string(checked.size()) + " tensors (per rank) checked against zero_optimization (" + rules +
                "): all on the host" +
                (partial ? " (but the optimizer states of the modules offload_ratio keeps on the accelerator)" : "") +
                "; no device_mismatch errors";
  else if (any_config)
    r.summary = "the run's config offloads nothing (no placement rule applies); no device_mismatch errors";
  else
    r.summary = "the trace carries no run config (no placement rule applies); no device_mismatch errors";
  return Status::Ok();
}

}  // namespace zt::check::detail
