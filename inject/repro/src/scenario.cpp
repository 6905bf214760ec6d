// Scenario files: YAML in, checked line by line; TrainConfigs out.
#include "zt/repro/scenario.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>

#include "pattern.h"
#include <regex>
#include <tuple>

#include "train/hf_config.h"
#include "train/run_args.h"
#include "train/model_shape.h"
#include "train/outside_memory.h"
#include "zero/ds_memory.h"
#include "zero/optimizer_memory.h"
#include "zt/common/files.h"
#include "zt/common/units.h"
#include "zt/common/yaml_keys.h"
#include "zt/fail/catalog.h"
#include "zt/fail/failpoint.h"

namespace zt::repro {

const std::vector<std::string>& figure_names() {
  static const std::vector<std::string> names = {"tried_to_allocate", "already_allocated", "reserved", "capacity",
                                                 "free", "host_rss"};
  return names;
}

namespace {

using nlohmann::json;

// Thrown inside the parser, caught once in load_scenario: the message is complete.
struct BadScenario {
  std::string message;
};

int line_of(const YAML::Node& n) { return n.Mark().line >= 0 ? n.Mark().line + 1 : 0; }

// A pattern in a message: its first 60 characters (one of 20,000 parentheses is enough to see).
std::string quote_pattern(const std::string& re) { return re.size() > 60 ? re.substr(0, 60) + "..." : re; }

std::string normalize(std::string key) {
  for (auto& c : key)
    if (c == '-') c = '_';
  return key;
}

struct Reader {
  std::string path;

  [[noreturn]] void fail(int line, const std::string& what) const {
    throw BadScenario{path + (line > 0 ? ":" + std::to_string(line) : std::string()) + ": " + what};
  }
  [[noreturn]] void fail(const YAML::Node& n, const std::string& what) const { fail(line_of(n), what); }

  // Iterates a mapping, refusing keys outside `known` (named with the section and the list).
  void each(const YAML::Node& map, const std::string& section, const std::vector<std::string>& known,
            const std::function<void(const std::string&, const YAML::Node&, const YAML::Node&)>& f) const {
    if (!map.IsMap()) fail(map, section + " must be a mapping (key: value)");
    for (const auto& kv : map) {
      const std::string key = normalize(kv.first.Scalar());
      bool ok = false;
      for (const auto& k : known) ok = ok || k == key;
      if (!ok) {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        fail(kv.first, "unknown key '" + kv.first.Scalar() + "' in " + section + " (known: " + list + ")");
      }
      f(key, kv.first, kv.second);
    }
  }
  std::string str(const YAML::Node& n, const std::string& what) const {
    if (!n.IsScalar()) fail(n, what + " must be a single value");
    return n.Scalar();
  }
  int64_t integer(const YAML::Node& n, const std::string& what) const {
    const std::string s = str(n, what);
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end || errno) fail(n, what + ": '" + s + "' is not an integer");
    return v;
  }
  double number(const YAML::Node& n, const std::string& what) const {
    const std::string s = str(n, what);
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end || !std::isfinite(v)) fail(n, what + ": '" + s + "' is not a number");
    return v;
  }
  bool boolean(const YAML::Node& n, const std::string& what) const {
    const std::string s = str(n, what);
    if (s == "true" || s == "True" || s == "yes") return true;
    if (s == "false" || s == "False" || s == "no") return false;
    fail(n, what + ": '" + s + "' is not true or false");
  }
  uint64_t size(const YAML::Node& n, const std::string& what) const {
    const std::string s = str(n, what);
    if (!s.empty() && s[0] == '-') fail(n, what + ": '" + s + "' is negative; a size is at least 0 bytes");
    std::string why;
    auto b = parse_bytes(s, &why);
    if (!b) fail(n, what + ": '" + s + "' " + why + " (try 79.32GiB, 1TiB)");
    return *b;
  }
  std::vector<std::string> strings(const YAML::Node& n, const std::string& what) const {
    std::vector<std::string> out;
    if (n.IsNull()) return out;
    if (n.IsScalar()) return {n.Scalar()};
    if (!n.IsSequence()) fail(n, what + " must be a list");
    for (const auto& x : n) out.push_back(str(x, what));
    return out;
  }
  // Fault specs: parsed now, so an unknown site or bad syntax names this line.
  std::vector<std::string> faults(const YAML::Node& n, const std::string& what) const {
    std::vector<std::string> out;
    if (!n.IsNull() && !n.IsScalar() && !n.IsSequence()) fail(n, what + " must be a list of failpoint specs");
    auto one = [&](const YAML::Node& x) {
      const std::string spec = str(x, what);
      std::vector<fail::Spec> parsed;
      if (Status s = fail::parse_specs(spec, &parsed); !s) fail(x, what + ": " + s.message());
      out.push_back(spec);
    };
    if (n.IsScalar()) one(n);
    if (n.IsSequence())
      for (const auto& x : n) one(x);
    return out;
  }
  std::string fault_name(const YAML::Node& n, const std::string& what) const {
    const std::string name = str(n, what);
    if (!fail::find_fault(name)) fail(n, what + ": unknown fault '" + name + "' (zt faults lists the catalog)");
    return name;
  }
};

// YAML to JSON for the inline DeepSpeed block: plain scalars are typed as JSON would read
// them (true/false, null, numbers such as 1e9), quoted ones stay strings ("auto").
json yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) o[kv.first.Scalar()] = yaml_to_json(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& x : n) a.push_back(yaml_to_json(x));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = n.Scalar();
      if (n.Tag() == "!") return s;  // quoted
      if (s == "true" || s == "True") return true;
      if (s == "false" || s == "False") return false;
      if (s == "null" || s == "~") return nullptr;
      errno = 0;
      char* end = nullptr;
      long long i = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && !*end && !errno) return i;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && !*end && std::isfinite(d)) {
        // DeepSpeed reads 1e9 as an integer where it wants one; keep integral values integral.
        if (d == std::floor(d) && std::fabs(d) < 9e18) return int64_t(d);
        return d;
      }
      return s;
    }
    default:
      return nullptr;
  }
}

// ---- train settings: one table, applied in order (later settings win) ----

template <typename C>
bool set_save_only_model(C& c, bool v) {
  if constexpr (requires { c.save_only_model; }) {
    c.save_only_model = v;
    return true;
  } else {
    return false;
  }
}

const std::vector<std::string>& train_keys() {
  static const std::vector<std::string> keys = {
      "precision", "micro_batch",    "grad_accum",        "seq_len",         "steps",
      "epochs",    "seed",           "lr",                "weight_decay",    "beta1",
      "beta2",     "eps",            "grad_clip",         "activation_checkpointing",
      "data_samples", "virtual_grad_norm", "virtual_fast_forward", "save_every",  "save_only_model", "synthetic_bytes",
      "max_doc_tokens", "comm_timeout_ms",
      // issue 30: model loading, what trains, evaluation
      "from_pretrained", "load_dtype", "load_copies", "zero_init", "zero3_init_flag", "finetuning", "lora_rank", "lora_targets",
      "trainable_layers", "eval_steps", "eval_samples", "eval_batch", "eval_accumulation_steps", "eval_keep_logits",
      // issue 41: the optimizer and the attention as the job runs them
      "optimizer", "attention", "attn_implementation", "attention_dropout"};
  return keys;
}

// Applies one setting; throws BadScenario naming the line on a bad value.
void apply_setting(const Reader& r, const Setting& s, trainer::TrainConfig& c) {
  const std::string what = "train." + s.key;
  YAML::Node n(s.value);
  auto bad = [&](const std::string& why) { r.fail(s.line, what + ": " + why); };
  auto integer = [&]() {
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.value.c_str(), &end, 10);
    if (s.value.empty() || *end || errno) bad("'" + s.value + "' is not an integer");
    return int64_t(v);
  };
  auto number = [&]() {
    char* end = nullptr;
    double v = std::strtod(s.value.c_str(), &end);
    if (s.value.empty() || *end || !std::isfinite(v)) bad("'" + s.value + "' is not a number");
    return v;
  };
  auto boolean = [&]() {
    if (s.value == "true" || s.value == "True" || s.value == "yes") return true;
    if (s.value == "false" || s.value == "False" || s.value == "no") return false;
    bad("'" + s.value + "' is not true or false");
    return false;
  };
  auto at_least = [&](int64_t v, int64_t lo) {
    if (v < lo) bad(std::to_string(v) + " must be at least " + std::to_string(lo));
    return v;
  };
  const std::string& k = s.key;
  if (k == "precision") {
    if (s.value != "fp32" && s.value != "bf16" && s.value != "fp16") bad("'" + s.value + "': use fp32, bf16 or fp16");
    c.precision = s.value;
  } else if (k == "micro_batch") c.micro_batch = at_least(integer(), 1);
  else if (k == "grad_accum") c.grad_accum = at_least(integer(), 1);
  else if (k == "seq_len") c.seq_len = at_least(integer(), 1);
  else if (k == "steps") c.steps = at_least(integer(), 0);
  else if (k == "epochs") c.epochs = at_least(integer(), 0);
  else if (k == "seed") c.seed = uint64_t(at_least(integer(), 0));
  else if (k == "lr") c.lr = number();
  else if (k == "weight_decay") c.weight_decay = number();
  else if (k == "beta1") c.beta1 = number();
  else if (k == "beta2") c.beta2 = number();
  else if (k == "eps") c.eps = number();
  else if (k == "grad_clip") c.grad_clip = number();
  else if (k == "activation_checkpointing") c.activation_checkpointing = boolean();
  else if (k == "data_samples") c.data_samples = at_least(integer(), 1);
  else if (k == "virtual_grad_norm") c.virtual_grad_norm = number();
  else if (k == "virtual_fast_forward") c.virtual_fast_forward = boolean();
  else if (k == "save_every") c.save_every = at_least(integer(), 0);
  else if (k == "save_only_model") {
    if (!set_save_only_model(c, boolean())) bad("this build's trainer has no save_only_model yet");
  } else if (k == "synthetic_bytes") c.synthetic_bytes = at_least(integer(), 1);
  else if (k == "max_doc_tokens") c.max_doc_tokens = at_least(integer(), 0);
  else if (k == "comm_timeout_ms") {
    if constexpr (requires { c.comm_timeout_ms; }) c.comm_timeout_ms = at_least(integer(), 1);
    else bad("this build's trainer has no comm_timeout_ms");
  } else if (k == "from_pretrained") c.from_pretrained = boolean();
  else if (k == "load_dtype") {
    if (s.value != "fp32" && s.value != "bf16" && s.value != "fp16") bad("'" + s.value + "': use fp32, bf16 or fp16");
    c.load_dtype = s.value;
  } else if (k == "load_copies") {
    c.load_copies = at_least(integer(), 1);
    if (c.load_copies > 4) bad("at most 4 copies of the weights");
  } else if (k == "zero_init" || k == "zero3_init_flag") c.zero_init = boolean();
  else if (k == "finetuning") {
    if (s.value != "full" && s.value != "lora" && s.value != "freeze") bad("'" + s.value + "': use full, lora or freeze");
    c.finetuning = s.value;
  } else if (k == "lora_rank") c.lora_rank = at_least(integer(), 1);
  else if (k == "lora_targets") {
    if (s.value != "qv" && s.value != "attention" && s.value != "all") bad("'" + s.value + "': use qv, attention or all");
    c.lora_targets = s.value;
  } else if (k == "trainable_layers") c.trainable_layers = at_least(integer(), 1);
  else if (k == "eval_steps") c.eval_steps = at_least(integer(), 0);
  else if (k == "eval_samples") c.eval_samples = at_least(integer(), 1);
  else if (k == "eval_batch") c.eval_batch = at_least(integer(), 1);
  else if (k == "eval_accumulation_steps") c.eval_accumulation_steps = at_least(integer(), 0);
  else if (k == "eval_keep_logits") c.eval_keep_logits = boolean();
  else if (k == "optimizer") {
    if (!trainer::parse_optimizer(s.value, false))
      bad("'" + s.value + "' is not an optimizer zerotrace knows (" + trainer::optimizer_names() + ")");
    c.optimizer = s.value;
  } else if (k == "attention" || k == "attn_implementation") {
    if (model::Attention a; !model::parse_attention(s.value, &a))
      bad("'" + s.value + "': use eager, sdpa or flash_attention_2 (Hugging Face's attn_implementation), or materialized, flash");
    c.attention = s.value;
  } else if (k == "attention_dropout") {
    c.attention_dropout = number();
    if (!(c.attention_dropout >= 0 && c.attention_dropout < 1)) bad("'" + s.value + "' must lie in [0, 1)");
  } else bad("unknown setting");
}

std::vector<Setting> read_settings(const Reader& r, const YAML::Node& n, const std::string& section) {
  std::vector<Setting> out;
  r.each(n, section, train_keys(), [&](const std::string& key, const YAML::Node&, const YAML::Node& v) {
    Setting s{key, r.str(v, section + "." + key), line_of(v)};
    trainer::TrainConfig probe;
    apply_setting(r, s, probe);  // checks the value now
    out.push_back(s);
  });
  return out;
}

json read_deepspeed(const Reader& r, const YAML::Node& n, const std::string& section) {
  if (n.IsNull()) return json::object();
  if (!n.IsMap()) r.fail(n, section + " must be a mapping: the DeepSpeed JSON config written as YAML (or as JSON)");
  return yaml_to_json(n);
}

// The error rows' kinds a run of zt repro can record (db/SCHEMA.md, table error), as the trainer
// writes them: the device allocator's oom, the host allocator's host_oom (pinned or pageable),
// the device guard's device_mismatch, the collectives' watchdog_timeout, the node memory watchdog's memory_watchdog. expect.error must name
// one of them, or no trace could ever match it.
const std::vector<std::string>& run_error_kinds() {
  static const std::vector<std::string> kinds = {"oom", "host_oom", "device_mismatch", "watchdog_timeout",
                                                  "memory_watchdog"};
  return kinds;
}
// Kinds the probe records that no zt repro run can end with: the crash handler's (the process
// dies, and zt repro with it), CUDA's and CUDA tracing's (the runs are on simulated GPUs).
bool probe_only_kind(const std::string& k) {
  return k == "uncaught_exception" || k == "cuda_error" || k == "cuda_tracing_off" || k == "cuda_tracing_partial";
}
std::string error_kind_list() {
  std::string list;
  const auto& kinds = run_error_kinds();
  for (size_t i = 0; i < kinds.size(); ++i)
    list += std::string(i == 0 ? "" : i + 1 == kinds.size() ? " or " : ", ") + kinds[i];
  return list;
}

// memory_watchdog: {tool: ray|kubernetes|systemd-oomd|slurm, kill_at: 0.95}; or none.
std::pair<std::string, double> read_watchdog(const Reader& r, const YAML::Node& n, const std::string& what) {
  if (n.IsScalar() && n.Scalar() == "none") return {"", 0.0};
  std::pair<std::string, double> w{"ray", 0.95};
  r.each(n, what, {"tool", "kill_at"}, [&](const std::string& k, const YAML::Node&, const YAML::Node& x) {
    if (k == "tool") {
      w.first = r.str(x, what + ".tool");
      if (w.first != "ray" && w.first != "kubernetes" && w.first != "systemd-oomd" && w.first != "slurm")
        r.fail(x, what + ".tool: '" + w.first + "': use ray, kubernetes, systemd-oomd or slurm");
    } else {
      w.second = r.number(x, what + ".kill_at");
      if (!(w.second > 0 && w.second <= 1)) r.fail(x, what + ".kill_at: a share of the node's memory, in (0, 1]");
    }
  });
  return w;
}

std::vector<std::string> fault_names(const Reader& r, const YAML::Node& v, const std::string& what) {
  std::vector<std::string> out;
  if (v.IsScalar()) out.push_back(r.fault_name(v, what));
  else if (v.IsSequence())
    for (const auto& x : v) out.push_back(r.fault_name(x, what));
  else if (!v.IsNull()) r.fail(v, what + " must be a list of fault names");
  return out;
}

// A figure's tolerance: a percentage ("10%", "2.5%"), above 0.
double read_tolerance(const Reader& r, const YAML::Node& n, const std::string& what) {
  const std::string s = r.str(n, what);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end == s.c_str() || std::string(end) != "%" || !std::isfinite(v) || v <= 0 || v > 1000)
    r.fail(n, what + ": '" + s + "' is not a percentage above 0 (write 10% or 2.5%)");
  return v / 100;
}

// expect.figures: {name: SIZE} or {name: {size: SIZE, tolerance: N%}}, in figure_names() order.
std::vector<Figure> read_figures(const Reader& r, const YAML::Node& n, const std::string& section) {
  std::map<std::string, Figure> by_name;
  r.each(n, section, figure_names(), [&](const std::string& key, const YAML::Node& k, const YAML::Node& v) {
    const std::string w = section + "." + key;
    Figure f;
    f.name = key;
    f.line = line_of(k);
    auto size = [&](const YAML::Node& x, const std::string& what) {
      const std::string text = r.str(x, what);
      // A bare number is bytes to parse_bytes; a report's figure always has its unit.
      size_t i = 0;
      while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' || text[i] == ' ')) ++i;
      if (!text.empty() && i == text.size())
        r.fail(x, what + ": '" + text + "' has no unit: write the report's figure with it (7.32GiB, 230GB)");
      f.bytes = r.size(x, what);
      f.text = text;
    };
    if (v.IsMap()) {
      bool have_size = false;
      r.each(v, w, {"size", "tolerance", "depends_on"}, [&](const std::string& fk, const YAML::Node&, const YAML::Node& fv) {
        if (fk == "size") {
          size(fv, w + ".size");
          have_size = true;
        } else if (fk == "depends_on") {
          f.depends_on = r.str(fv, w + ".depends_on");
          if (key != "free")
            r.fail(fv, w + ".depends_on: only free depends on memory outside PyTorch's allocator (the CUDA context, "
                           "other processes); every other figure is judged");
          if (f.depends_on.find_first_not_of(" \t") == std::string::npos)
            r.fail(fv, w + ".depends_on: say what the figure depends on that no source gives");
        } else {
          f.tolerance = read_tolerance(r, fv, w + ".tolerance");
        }
      });
      if (!have_size) r.fail(v, w + ": give the report's figure as size: (7.32GiB)");
    } else {
      size(v, w);
    }
    by_name[key] = f;
  });
  std::vector<Figure> out;
  for (const auto& name : figure_names())
    if (by_name.count(name)) out.push_back(by_name[name]);
  return out;
}

Expectation read_expect(const Reader& r, const YAML::Node& n, const std::string& section, const Expectation* base) {
  Expectation e = base ? *base : Expectation{};
  e.line = line_of(n);
  bool set_error = false, set_lost = false;
  r.each(n, section, {"error", "site", "message", "tensors", "steps_lost", "when", "faults_fired", "mechanism", "figures"},
         [&](const std::string& key, const YAML::Node&, const YAML::Node& v) {
           auto regex_ok = [&](const std::string& re) {
             if (std::string why = pattern_problem(re); !why.empty())
               r.fail(v, section + "." + key + ": '" + quote_pattern(re) + "' " + why);
             return re;
           };
           if (key == "error") {
             e.error = r.str(v, section + ".error");
             bool known = false;
             for (const auto& k : run_error_kinds()) known = known || e.error == k;
             if (!known && probe_only_kind(e.error))
               r.fail(v, section + ".error: '" + e.error + "' is recorded by the probe (a crashed process, CUDA or its "
                         "tracing), never by a zt repro run; use " + error_kind_list());
             if (!known)
               r.fail(v, section + ".error: '" + e.error + "' is not an error kind a run records; use " + error_kind_list() +
                         " (db/SCHEMA.md, table error)");
             set_error = true;
             e.steps_lost = false;
           } else if (key == "site") e.site = regex_ok(r.str(v, section + ".site"));
           else if (key == "message") e.message = regex_ok(r.str(v, section + ".message"));
           else if (key == "tensors") {
             e.tensors.clear();
             for (auto& t : r.strings(v, section + ".tensors")) e.tensors.push_back(regex_ok(t));
           } else if (key == "steps_lost") {
             e.steps_lost = r.boolean(v, section + ".steps_lost");
             set_lost = true;
             if (e.steps_lost) e.error.clear();
           } else if (key == "faults_fired") {
             e.faults_fired = fault_names(r, v, section + ".faults_fired");
           } else if (key == "figures") {
             // The report's numbers are about the report's cluster: the full-size run's alone.
             if (base)
               r.fail(v, section + ".figures: the report's figures are checked against the full-size run only; give "
                         "them in the scenario's expect:");
             e.figures = read_figures(r, v, section + ".figures");
           } else if (key == "mechanism") {
             // What must have caused it: replaces the base's mechanism as a whole.
             e.mechanism_phase.clear();
             e.mechanism_alive.clear();
             r.each(v, section + ".mechanism", {"phase", "alive", "faults_fired"},
                    [&](const std::string& mk, const YAML::Node&, const YAML::Node& mv) {
                      const std::string w = section + ".mechanism." + mk;
                      auto re = [&](const std::string& x) {
                        try {
                          std::regex check(x);
                        } catch (const std::regex_error& err) {
                          r.fail(mv, w + ": '" + x + "' is not a regular expression (" + err.what() + ")");
                        }
                        return x;
                      };
                      if (mk == "phase") e.mechanism_phase = re(r.str(mv, w));
                      else if (mk == "alive")
                        for (auto& t : r.strings(mv, w)) e.mechanism_alive.push_back(re(t));
                      else
                        for (auto& f : fault_names(r, mv, w))
                          if (std::find(e.faults_fired.begin(), e.faults_fired.end(), f) == e.faults_fired.end())
                            e.faults_fired.push_back(f);
                    });
           } else if (key == "when") {
             e.epoch.reset();
             e.step.reset();
             e.step_in_epoch.reset();
             e.micro_step.reset();
             e.phase.clear();
             r.each(v, section + ".when", {"epoch", "step", "step_in_epoch", "micro_step", "phase"},
                    [&](const std::string& wk, const YAML::Node&, const YAML::Node& wv) {
                      const std::string w = section + ".when." + wk;
                      if (wk == "phase") {
                        e.phase = r.str(wv, w);
                        if (std::string why = pattern_problem(e.phase); !why.empty())
                          r.fail(wv, w + ": '" + quote_pattern(e.phase) + "' " + why);
                        return;
                      }
                      if (wk == "micro_step" && wv.IsScalar() && wv.Scalar() == "last") {
                        e.micro_step = -2;
                        return;
                      }
                      int64_t x = r.integer(wv, w);
                      if (x < 0) r.fail(wv, w + ": " + std::to_string(x) + " must be at least 0");
                      if (wk == "epoch") e.epoch = x;
                      else if (wk == "step") e.step = x;
                      else if (wk == "step_in_epoch") e.step_in_epoch = x;
                      else e.micro_step = x;
                    });
           }
         });
  if (set_error && set_lost && e.steps_lost)
    r.fail(n, section + ": give error: KIND or steps_lost: true, not both");
  if (e.error.empty() && !e.steps_lost)
    r.fail(n, section + ": say what the trace must show: error: KIND (" + error_kind_list() + ") or steps_lost: true");
  if (e.steps_lost && !e.figures.empty())
    r.fail(n, section + ".figures: the figures are the error's numbers; steps_lost: true has no error");
  return e;
}

FixSpec read_fix(const Reader& r, const YAML::Node& n, const std::string& section, bool small) {
  FixSpec f;
  f.line = line_of(n);
  std::vector<std::string> keys = {"description", "quote", "train", "deepspeed", "faults", "remove_faults"};
  for (const char* k : small ? std::vector<const char*>{"world_size", "nodes", "gpu_memory", "host_memory", "memory_watchdog"}
                             : std::vector<const char*>{"cluster"})
    keys.push_back(k);
  r.each(n, section, keys, [&](const std::string& key, const YAML::Node&, const YAML::Node& v) {
           auto at_least_1 = [&](const YAML::Node& x, const std::string& w) {
             const int64_t val = r.integer(x, w);
             if (val < 1) r.fail(x, w + ": must be at least 1");
             return val;
           };
           if (key == "cluster") {
             r.each(v, section + ".cluster", {"nodes", "gpus_per_node", "gpu_memory", "host_memory", "memory_watchdog"},
                    [&](const std::string& k, const YAML::Node&, const YAML::Node& x) {
                      const std::string w = section + ".cluster." + k;
                      if (k == "memory_watchdog") f.watchdog = read_watchdog(r, x, w);
                      else if (k == "nodes") f.nodes = at_least_1(x, w);
                      else if (k == "gpus_per_node") f.gpus_per_node = at_least_1(x, w);
                      else if (k == "gpu_memory") f.gpu_memory = r.size(x, w);
                      else f.host_memory = r.size(x, w);
                    });
           } else if (key == "memory_watchdog") f.watchdog = read_watchdog(r, v, section + ".memory_watchdog");
           else if (key == "world_size") f.world_size = at_least_1(v, section + ".world_size");
           else if (key == "nodes") f.nodes = at_least_1(v, section + ".nodes");
           else if (key == "gpu_memory") f.gpu_memory = r.size(v, section + ".gpu_memory");
           else if (key == "host_memory") f.host_memory = r.size(v, section + ".host_memory");
           else if (key == "description") f.description = r.str(v, section + ".description");
           else if (key == "quote") f.quote = r.str(v, section + ".quote");
           else if (key == "train") f.train = read_settings(r, v, section + ".train");
           else if (key == "deepspeed") f.deepspeed = read_deepspeed(r, v, section + ".deepspeed");
           else if (key == "faults") f.faults = r.faults(v, section + ".faults");
           else if (key == "remove_faults") {
             if (v.IsScalar()) f.remove_faults.push_back(r.fault_name(v, section + ".remove_faults"));
             else if (v.IsSequence())
               for (const auto& x : v) f.remove_faults.push_back(r.fault_name(x, section + ".remove_faults"));
             else if (!v.IsNull()) r.fail(v, section + ".remove_faults must be a list of fault names");
           }
         });
  return f;
}

// ---- model shapes: bounds that keep the trainer's int64 arithmetic exact ----

// Real models are far inside these (widths to ~25k, ~130 layers, FFNs to ~100k, vocabularies to
// ~256k, contexts to ~10M tokens, 256 experts); past them a scenario's sizes would wrap in the
// trainer's int64 products (parameters, bytes) and its verdict would be about another model.
constexpr int64_t kMaxWidth = int64_t(1) << 20;
constexpr int64_t kMaxLayers = trainer::kMaxShapeLayers;
constexpr int64_t kMaxFfn = int64_t(1) << 24;
constexpr int64_t kMaxVocab = int64_t(1) << 24;
constexpr int64_t kMaxContext = int64_t(1) << 24;  // the trainer's own limit on seq_len
constexpr int64_t kMaxExperts = int64_t(1) << 16;
constexpr int64_t kMaxParams = trainer::kMaxShapeParams;
// One micro-batch's activations, bytes (the full-size run's terms, trainer/zero/ds_memory.h).
constexpr int64_t kMaxActivationBytes = int64_t(1) << 60;

struct ShapeLimit {
  const char* key;
  int64_t value, limit;
};
std::vector<ShapeLimit> shape_limits(const trainer::ModelShape& m) {
  return {{"width", m.width, kMaxWidth},           {"layers", m.layers, kMaxLayers},
          {"heads", m.heads, kMaxWidth},           {"kv_heads", m.kv_heads, kMaxWidth},
          {"ffn", m.ffn, kMaxFfn},                 {"vocab", m.vocab, kMaxVocab},
          {"context", m.context, kMaxContext},     {"experts", m.experts, kMaxExperts},
          {"shared_experts", m.shared_experts, kMaxExperts}, {"expert_ffn", m.expert_ffn, kMaxFfn},
          {"dense_layers", m.dense_layers, kMaxLayers},    {"head_dim", m.head_dim, kMaxWidth},
          {"positions", m.positions, kMaxContext},         {"final_norms", m.final_norms, 16},
          {"shared_expert_ffn", m.shared_expert_ffn, kMaxFfn}, {"moe_every", m.moe_every, kMaxLayers},
          {"q_lora_rank", m.q_lora_rank, kMaxWidth},       {"kv_lora_rank", m.kv_lora_rank, kMaxWidth},
          {"qk_nope_head_dim", m.qk_nope_head_dim, kMaxWidth}, {"qk_rope_head_dim", m.qk_rope_head_dim, kMaxWidth},
          {"v_head_dim", m.v_head_dim, kMaxWidth},         {"encoder_layers", m.encoder_layers, kMaxLayers},
          {"relative_attention_buckets", m.relative_attention_buckets, kMaxVocab},
          {"decoder_seq_len", m.decoder_seq_len, kMaxContext}};
}
std::string limit_note(int64_t limit) {
  int p = 0;
  while ((int64_t(1) << p) < limit) ++p;
  return "2^" + std::to_string(p) + ": larger sizes would overflow the trainer's 64-bit arithmetic";
}

void check_shape(const Reader& r, const YAML::Node& n, const trainer::ModelShape& m, const std::map<std::string, int>& lines,
                 const std::string& prefix = "model") {
  auto at = [&](const std::string& key) {
    auto it = lines.find(key);
    return it == lines.end() ? line_of(n) : it->second;
  };
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) r.fail(at(key), prefix + "." + key + ": " + std::to_string(v) + " is impossible; it must be at least 1");
  };
  positive("width", m.width);
  positive("layers", m.layers);
  positive("heads", m.heads);
  positive("kv_heads", m.kv_heads);
  positive("ffn", m.ffn);
  positive("vocab", m.vocab);
  positive("context", m.context);
  // Each size bounded, then the parameter count (computed in long double), so no product the
  // trainer forms from the shape overflows int64 (a wrapped count reads as a tiny model).
  for (const auto& [key, v, limit] : shape_limits(m))
    if (v > limit)
      r.fail(at(key), prefix + "." + key + ": " + std::to_string(v) + " is above the limit of " + std::to_string(limit) +
                          " (" + limit_note(limit) + ")");
  if (m.head_dim == 0 && m.kv_lora_rank == 0 && m.width % m.heads != 0)
    r.fail(at("heads"), prefix + ".heads: " + std::to_string(m.heads) + " heads do not divide the width " +
                            std::to_string(m.width) + " (head size would be " + std::to_string(double(m.width) / double(m.heads)) + ")");
  if (m.heads % m.kv_heads != 0)
    r.fail(at("kv_heads"), prefix + ".kv_heads: " + std::to_string(m.kv_heads) + " key/value heads do not divide the " +
                               std::to_string(m.heads) + " attention heads");
  if (m.experts < 0 || m.shared_experts < 0 || m.expert_ffn < 0 || m.dense_layers < 0)
    r.fail(at(m.experts < 0 ? "experts" : m.shared_experts < 0 ? "shared_experts" : m.expert_ffn < 0 ? "expert_ffn" : "dense_layers"),
           prefix + ": expert counts and sizes must not be negative");
  if (m.experts > 0 && m.expert_ffn <= 0) r.fail(at("experts"), prefix + ".experts: an MoE layout needs expert_ffn (each expert's FFN width)");
  if (m.experts == 0 && (m.shared_experts > 0 || m.expert_ffn > 0))
    r.fail(at(m.shared_experts > 0 ? "shared_experts" : "expert_ffn"), prefix + ": shared_experts and expert_ffn need experts > 0");
  if (Status st = trainer::validate_shape(m); !st) r.fail(n, prefix + ": " + st.message());
  if (m.dense_layers > m.layers)
    r.fail(at("dense_layers"), prefix + ".dense_layers: " + std::to_string(m.dense_layers) + " is more than the " +
                                   std::to_string(m.layers) + " layers");
  if (const long double p = trainer::shape_params_bound(m); p > (long double)kMaxParams) {
    char count[64];
    std::snprintf(count, sizeof count, "%.3Lg", p);
    r.fail(n, prefix + ": about " + count + " parameters is above the limit of " + std::to_string(kMaxParams) +
                  " (2^44, ~17.6 T) that keeps every size the trainer derives from the shape within 64 bits");
  }
}

void read_scenario(const Reader& r, const YAML::Node& root, Scenario& s) {
  bool have_model = false, have_cluster = false, have_expect = false, have_fix = false, have_small = false;
  // Sections are read in this order whatever the file's (small: merges over expect: and fix:).
  const std::vector<std::string> order = {"scenario", "report", "model", "cluster", "train", "train_args",
                                          "deepspeed", "faults", "expect", "fix", "small"};
  std::map<std::string, YAML::Node> sections;
  r.each(root, "the scenario", order,
         [&](const std::string& key, const YAML::Node&, const YAML::Node& v) { sections[key] = v; });
  auto handle = [&](const std::string& key, const YAML::Node& v) {
           if (key == "scenario") {
             s.name = r.str(v, "scenario");
             for (char c : s.name)
               if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
                 r.fail(v, "scenario: '" + s.name + "': use letters, digits, '-', '_' and '.' (it names a directory)");
           } else if (key == "report") {
             r.each(v, "report", {"id", "sources", "seed", "title", "summary"}, [&](const std::string& k, const YAML::Node&, const YAML::Node& x) {
               if (k == "id") {
                 s.report_id = r.str(x, "report.id");
                 bool ok = !s.report_id.empty() && s.report_id.size() <= 40;
                 for (char c : s.report_id)
                   ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.');
                 if (!ok)
                   r.fail(x, "report.id: '" + s.report_id +
                                 "': a short name of the report (up to 40 letters, digits, '-', '_', '.'; R4, DS-2946)");
               }
               else if (k == "seed" || k == "sources") {
                 // seed: the older name of one source (the article's file); sources: one or a list
                 for (auto& src : r.strings(x, "report." + k)) s.report_sources.push_back(src);
               }
               else if (k == "title") s.report_title = r.str(x, "report.title");
               else s.report_summary = r.str(x, "report.summary");
             });
           } else if (key == "model") {
             have_model = true;
             std::map<std::string, int> lines;
             trainer::ModelShape& m = s.shape;
             // hf_config first (the user's own config.json, beside the scenario file), then keys over it.
             if (v.IsMap() && v["hf_config"]) {
               const YAML::Node x = v["hf_config"];
               const std::string rel = r.str(x, "model.hf_config");
               const std::filesystem::path file = std::filesystem::path(rel).is_absolute()
                                                      ? std::filesystem::path(rel)
                                                      : std::filesystem::path(r.path).parent_path() / rel;
               trainer::HfModel hf;
               if (Status st = trainer::read_hf_config(file.string(), &hf); !st) r.fail(x, "model.hf_config: " + st.message());
               m = hf.shape;
               s.hf_config = file.string();
               s.hf_family = hf.family;
               s.hf_params = hf.formula_params;
               s.checkpoint_dtype = hf.dtype;
               s.hf_attention = hf.attention;
               s.hf_attention_dropout = hf.attention_dropout;
               s.hf_notes = hf.notes;
               for (const auto& f : trainer::shape_fields()) lines[f.name] = line_of(x);
             }
             std::vector<std::string> keys = {"hf_config", "note"};
             for (const auto& f : trainer::shape_fields()) keys.push_back(f.name);
             r.each(v, "model", keys, [&](const std::string& k, const YAML::Node&, const YAML::Node& x) {
               if (k == "hf_config") return;
               lines[k] = line_of(x);
               const std::string w = "model." + k;
               if (k == "note") {
                 s.shape_note = r.str(x, w);
                 return;
               }
               for (const auto& f : trainer::shape_fields()) {
                 if (k != f.name) continue;
                 if (f.integer) m.*(f.integer) = r.integer(x, w);
                 else if (f.flag) m.*(f.flag) = r.boolean(x, w);
                 else m.*(f.text) = r.str(x, w);
               }
             });
             if (!lines.count("kv_heads")) m.kv_heads = m.heads;
             // (a width past its limit is refused by check_shape, naming the width, not an ffn that wrapped)
             if (!lines.count("ffn") && m.width > 0) m.ffn = m.width <= kMaxWidth ? 4 * m.width : m.width;
             s.shape_line = line_of(v);
             for (const char* k : {"width", "layers", "heads", "vocab", "context"})
               if (!lines.count(k))
                 r.fail(v, std::string("model: ") + k + " is missing (the real model's " + k +
                               "; or hf_config: config.json, the model's Hugging Face config)");
             check_shape(r, v, m, lines);
           } else if (key == "cluster") {
             have_cluster = true;
             std::map<std::string, int> lines;
             r.each(v, "cluster",
                    {"nodes", "gpus_per_node", "gpu", "gpu_memory", "host_memory", "memory_watchdog", "cuda_context",
                     "nccl_channels"},
                    [&](const std::string& k, const YAML::Node&, const YAML::Node& x) {
                      lines[k] = line_of(x);
                      const std::string w = "cluster." + k;
                      if (k == "cuda_context") {
                        s.cuda_context = r.str(x, w);
                        s.cuda_context_given = true;
                        if (std::string why; !trainer::cuda_context_bytes(s.cuda_context, &why)) r.fail(x, w + ": " + why);
                        return;
                      }
                      if (k == "nccl_channels") {
                        s.nccl_channels = r.integer(x, w);
                        s.nccl_channels_given = true;
                        if (s.nccl_channels < 0 || s.nccl_channels > trainer::kNcclMaxChannels)
                          r.fail(x, w + ": must lie in 0 .. 64 (NCCL's MAXCHANNELS)");
                        return;
                      }
                      if (k == "memory_watchdog") std::tie(s.watchdog, s.watchdog_kill_at) = read_watchdog(r, x, w);
                      else if (k == "nodes") s.nodes = r.integer(x, w);
                      else if (k == "gpus_per_node") s.gpus_per_node = r.integer(x, w);
                      else if (k == "gpu") s.gpu = r.str(x, w);
                      else if (k == "gpu_memory") s.gpu_memory = r.size(x, w);
                      else s.host_memory = r.size(x, w);
                      if ((k == "nodes" || k == "gpus_per_node") && (k == "nodes" ? s.nodes : s.gpus_per_node) < 1)
                        r.fail(x, w + ": must be at least 1");
                      if (k == "gpu_memory" && s.gpu_memory == 0) r.fail(x, w + ": a GPU has more than 0 bytes");
                    });
             if (!lines.count("gpu_memory")) r.fail(v, "cluster: gpu_memory is missing (79.32GiB for an 80 GB card)");
             if (lines.count("cuda_context") && trainer::cuda_context_bytes(s.cuda_context).value_or(0) >= s.gpu_memory)
               r.fail(lines["cuda_context"], "cluster.cuda_context: " + s.cuda_context + " does not fit the GPU of " +
                                                 format_bytes(double(s.gpu_memory)) + " (cluster.gpu_memory)");
           } else if (key == "train") {
             s.train = read_settings(r, v, "train");
           } else if (key == "train_args") {
             // The run's TrainingArguments by their HF names: they fill the config's "auto" values.
             s.train_args = read_deepspeed(r, v, "train_args");
             s.train_args_line = line_of(v);
             if (!s.train_args.is_object()) r.fail(v, "train_args: a mapping of TrainingArguments names to values");
             trainer::RunArgs probe;
             for (auto it = s.train_args.begin(); it != s.train_args.end(); ++it)
               if (Status st = trainer::set_hf_arg(it.key(), it.value(), "train_args", &probe); !st)
                 r.fail(v, st.message());
           } else if (key == "deepspeed") {
             s.deepspeed = read_deepspeed(r, v, "deepspeed");
             s.deepspeed_line = line_of(v);
           } else if (key == "faults") {
             s.faults = r.faults(v, "faults");
           } else if (key == "expect") {
             have_expect = true;
             s.expect = read_expect(r, v, "expect", nullptr);
           } else if (key == "fix") {
             have_fix = true;
             s.fix = read_fix(r, v, "fix", false);
           } else if (key == "small") {
             have_small = true;
             SmallVariant& sm = s.small;
             sm.line = line_of(v);
             bool have_world = false;
             r.each(v, "small",
                    {"description", "model", "world_size", "nodes", "gpu_memory", "host_memory", "train", "deepspeed",
                     "faults", "expect", "fix"},
                    [&](const std::string& k, const YAML::Node&, const YAML::Node& x) {
                      const std::string w = "small." + k;
                      if (k == "description") sm.description = r.str(x, w);
                      else if (k == "model" && x.IsMap()) {
                        // A GPT-2 layout of any size: real compute computes it.
                        sm.model = "custom";
                        std::map<std::string, int> lines;
                        trainer::ModelShape& m = sm.shape;
                        m.name = "GPT-2 (custom)";
                        r.each(x, w, {"name", "width", "layers", "heads", "vocab", "context"},
                               [&](const std::string& mk, const YAML::Node&, const YAML::Node& mv) {
                                 lines[mk] = line_of(mv);
                                 if (mk == "name") {
                                   m.name = r.str(mv, w + ".name");
                                   return;
                                 }
                                 const int64_t val = r.integer(mv, w + "." + mk);
                                 if (mk == "width") m.width = val;
                                 else if (mk == "layers") m.layers = val;
                                 else if (mk == "heads") m.heads = val;
                                 else if (mk == "vocab") m.vocab = val;
                                 else m.context = val;
                               });
                        for (const char* mk : {"width", "layers", "heads", "vocab", "context"})
                          if (!lines.count(mk)) r.fail(x, w + ": " + mk + " is missing");
                        m.kv_heads = m.heads;
                        m.ffn = m.width <= kMaxWidth ? 4 * m.width : m.width;  // a width past the limit: refused below
                        std::map<std::string, int> shape_lines;
                        for (auto& [mk, l] : lines) shape_lines[mk] = l;
                        shape_lines["kv_heads"] = shape_lines["heads"];
                        shape_lines["ffn"] = shape_lines["width"];
                        check_shape(r, x, m, shape_lines, w);
                        if (m.vocab < 256)
                          r.fail(lines["vocab"], w + ".vocab: the byte-level corpus needs at least 256 tokens");
                      } else if (k == "model") {
                        sm.model = r.str(x, w);
                        if (sm.model != "tiny" && sm.model != "124M" && sm.model != "350M" && sm.model != "774M" &&
                            sm.model != "1.5B")
                          r.fail(x, w + ": '" + sm.model + "' is not a GPT-2 preset (tiny, 124M, 350M, 774M, 1.5B) "
                                            "nor a GPT-2 shape {width, layers, heads, vocab, context}");
                      } else if (k == "world_size") {
                        have_world = true;
                        sm.world_size = r.integer(x, w);
                        if (sm.world_size < 1 || sm.world_size > 64)
                          r.fail(x, w + ": " + std::to_string(sm.world_size) + " rank threads: use 1 to 64");
                      } else if (k == "nodes") {
                        sm.nodes = r.integer(x, w);
                        if (sm.nodes < 1) r.fail(x, w + ": must be at least 1");
                      } else if (k == "gpu_memory") {
                        sm.gpu_memory = r.size(x, w);
                        if (sm.gpu_memory == 0) r.fail(x, w + ": a GPU has more than 0 bytes");
                      } else if (k == "host_memory") sm.host_memory = r.size(x, w);
                      else if (k == "train") sm.train = read_settings(r, x, w);
                      else if (k == "deepspeed") sm.deepspeed = read_deepspeed(r, x, w);
                      else if (k == "faults") sm.faults = r.faults(x, w);
                      else if (k == "expect") sm.expect = read_expect(r, x, w, &s.expect);
                      else if (k == "fix") sm.fix = read_fix(r, x, w, true);
                    });
             if (!have_world) r.fail(v, "small: world_size is missing (rank threads of the real-compute variant)");
             if (sm.world_size % sm.nodes != 0)
               r.fail(v, "small: world_size " + std::to_string(sm.world_size) + " is not a multiple of nodes " +
                             std::to_string(sm.nodes));
           }
  };
  for (const auto& key : order)
    if (auto it = sections.find(key); it != sections.end()) handle(key, it->second);
  auto need = [&](bool have, const char* what, const char* hint) {
    if (!have) r.fail(line_of(root), std::string(what) + " is missing: " + hint);
  };
  need(!s.name.empty(), "scenario", "a name (it names the keep directory, zt-repro-NAME)");
  need(!s.report_id.empty(), "report.id",
       "a short name of the bug report it replays (R4, DS-2946, my-oom: letters, digits, '-', '_', '.')");
  need(have_model, "model", "the real model's shape (width, layers, heads, ...)");
  need(have_cluster, "cluster", "nodes, gpus_per_node, gpu_memory, host_memory");
  need(have_expect, "expect", "the symptom the trace must show");
  need(have_fix, "fix", "the known fix (train/deepspeed changes, faults removed)");
  need(have_small, "small", "the real-compute variant that runs in seconds");
}

json merged(json base, const json& patch) {
  if (!patch.is_null() && !patch.empty()) base.merge_patch(patch);
  return base;
}

std::vector<std::string> apply_fix_faults(std::vector<std::string> faults, const FixSpec& f) {
  if (f.faults) return *f.faults;
  if (f.remove_faults.empty()) return faults;
  std::vector<std::string> kept;
  for (const std::string& text : faults) {
    // A spec string may hold several specs joined by ';': keep the ones not removed.
    std::vector<fail::Spec> specs;
    (void)fail::parse_specs(text, &specs);
    std::string out;
    for (const auto& sp : specs) {
      bool removed = false;
      for (const auto& name : f.remove_faults) removed = removed || sp.name == name;
      if (!removed) out += (out.empty() ? "" : ";") + sp.text;
    }
    if (!out.empty()) kept.push_back(out);
  }
  return kept;
}

Status resolve(const Scenario& s, Variant v, bool fix, std::optional<uint64_t> seed, trainer::TrainConfig* out,
               std::vector<std::string>* warnings) {
  Reader r{s.path};
  trainer::TrainConfig c;
  try {
    if (v == Variant::Full) {
      const FixSpec* f = fix ? &s.fix : nullptr;
      const int64_t nodes = f && f->nodes ? *f->nodes : s.nodes;
      const int64_t gpus = f && f->gpus_per_node ? *f->gpus_per_node : s.gpus_per_node;
      c.model = "custom";
      c.shape = s.shape;
      c.virtual_mode = true;
      c.world_size = nodes * gpus;
      c.ranks_per_node = gpus;
      c.device_memory = f && f->gpu_memory ? *f->gpu_memory : s.gpu_memory;
      c.host_memory = f && f->host_memory ? *f->host_memory : s.host_memory;
      c.cuda_context = s.cuda_context;
      c.nccl_channels = s.nccl_channels;
    } else {
      const FixSpec* f = fix && s.small.fix ? &*s.small.fix : nullptr;
      const int64_t world = f && f->world_size ? *f->world_size : s.small.world_size;
      const int64_t nodes = f && f->nodes ? *f->nodes : s.small.nodes;
      if (world % nodes != 0)
        r.fail(f ? f->line : s.small.line, "small" + std::string(f ? ".fix" : "") + ": world_size " + std::to_string(world) +
                                               " is not a multiple of nodes " + std::to_string(nodes));
      c.model = s.small.model;
      if (c.model == "custom") c.shape = s.small.shape;
      c.world_size = world;
      c.ranks_per_node = world / nodes;
      c.device_memory = f && f->gpu_memory ? *f->gpu_memory : s.small.gpu_memory;
      c.host_memory = f && f->host_memory ? *f->host_memory : s.small.host_memory;
    }
    // The full-size run's model is the HF config's: its attn_implementation first, a train: attention (below)
    // over it. (The small variant's model is another; it takes train: attention only.)
    if (v == Variant::Full && !s.hf_attention.empty()) c.attention = s.hf_attention;
    if (v == Variant::Full) c.attention_dropout = s.hf_attention_dropout;
    for (const auto& set : s.train) apply_setting(r, set, c);
    if (v == Variant::Small)
      for (const auto& set : s.small.train) apply_setting(r, set, c);
    if (fix) {
      for (const auto& set : s.fix.train) apply_setting(r, set, c);
      if (v == Variant::Small && s.small.fix)
        for (const auto& set : s.small.fix->train) apply_setting(r, set, c);
    }
  } catch (const BadScenario& e) {
    return Status::Error(e.message);
  }
  json ds = s.deepspeed;
  if (v == Variant::Small) ds = merged(ds, s.small.deepspeed);
  if (fix) {
    ds = merged(ds, s.fix.deepspeed);
    if (v == Variant::Small && s.small.fix) ds = merged(ds, s.small.fix->deepspeed);
  }
  if (!ds.empty()) {
    // The run's arguments, which fill the config's "auto" (and what its excerpt leaves out): the
    // train_args: block by HF names, then the train: settings the scenario gives.
    trainer::RunArgs args;
    args.fill_absent = true;
    const std::string where = s.path + ":" + std::to_string(s.train_args_line) + ": train_args";
    for (auto it = s.train_args.begin(); it != s.train_args.end(); ++it)
      if (Status st = trainer::set_hf_arg(it.key(), it.value(), where, &args); !st) return st;
    std::map<std::string, int> set_at;  // train: keys given, with their lines
    auto note_keys = [&](const std::vector<Setting>& list) {
      for (const auto& set : list) set_at[set.key] = set.line;
    };
    note_keys(s.train);
    if (v == Variant::Small) note_keys(s.small.train);
    if (fix) {
      note_keys(s.fix.train);
      if (v == Variant::Small && s.small.fix) note_keys(s.small.fix->train);
    }
    trainer::add_settings_as_args(c, [&](const std::string& key) -> std::optional<std::string> {
      if (!set_at.count(key)) return std::nullopt;
      return s.path + ":" + std::to_string(set_at[key]) + ": train." + key;
    }, &args);
    std::vector<std::string> w;
    const std::string origin = s.path + ":" + std::to_string(s.deepspeed_line) + ": deepspeed" +
                               std::string(v == Variant::Small ? " (small" : " (full size") + (fix ? ", fix)" : ")");
    if (Status st = trainer::load_deepspeed_config_text(ds.dump(-1, ' ', false, json::error_handler_t::replace), origin,
                                                        &c, &w, args);
        !st)
      return st;
    if (warnings) warnings->insert(warnings->end(), w.begin(), w.end());
  }
  // The node watchdog: the cluster's, unless the fix changes it.
  c.watchdog = s.watchdog;
  c.watchdog_kill_at = s.watchdog_kill_at;
  for (const FixSpec* f : {fix ? &s.fix : nullptr, fix && v == Variant::Small && s.small.fix ? &*s.small.fix : nullptr})
    if (f && f->watchdog) std::tie(c.watchdog, c.watchdog_kill_at) = *f->watchdog;
  // A model loaded from its checkpoint is in the checkpoint's dtype (model: {hf_config}'s torch_dtype).
  if (c.from_pretrained && c.load_dtype.empty()) c.load_dtype = s.checkpoint_dtype;
  std::vector<std::string> faults = s.faults;
  if (v == Variant::Small && s.small.faults) faults = *s.small.faults;
  if (fix) {
    faults = apply_fix_faults(faults, s.fix);
    if (v == Variant::Small && s.small.fix) faults = apply_fix_faults(faults, *s.small.fix);
  }
  c.faults = faults;
  if (seed) c.seed = *seed;
  c.config_file = s.path;
  c.quiet = true;
  if (Status st = trainer::validate(c); !st)
    return Status::Error(st.message() + " (the " + variant_name(v) + (fix ? " fix" : " bug") + " run)");
  if (v == Variant::Full) {
    // The shape's fields are bounded one by one; with the batch the run gives it, its activation
    // estimate must fit the trainer's 64-bit sizes too.
    const int64_t T = c.seq_len ? c.seq_len : c.shape.context;
    if (trainer::activation_bytes_bound(c.shape, c.micro_batch, T) > (long double)kMaxActivationBytes)
      return Status::Error(s.path + ":" + std::to_string(s.shape_line) + ": model: one micro-batch of " +
                           std::to_string(c.micro_batch) + " x " + std::to_string(T) +
                           " tokens keeps more than 2^60 bytes of activations at this shape (the limit that keeps the "
                           "trainer's 64-bit sizes exact); give train a smaller seq_len or micro_batch (the full-size " +
                           (fix ? std::string("fix") : std::string("bug")) + " run)");
  }
  *out = c;
  return Status::Ok();
}

Status load_once(const std::string& path, Scenario* out) {
  YAML::Node root;
  std::string text;
  if (Status s = read_text_file(path, "scenario file", &text); !s) return s;
  if (Status s = check_yaml_text(text, path); !s) return s;
  // A skeleton of zt repro init is refused while a value still says TODO (comments may).
  {
    int line = 0;
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      ++line;
      std::string l = text.substr(start, end - start);
      bool quoted_s = false, quoted_d = false;
      for (size_t i = 0; i < l.size(); ++i) {
        if (l[i] == '\'' && !quoted_d) quoted_s = !quoted_s;
        else if (l[i] == '"' && !quoted_s) quoted_d = !quoted_d;
        else if (l[i] == '#' && !quoted_s && !quoted_d && (i == 0 || l[i - 1] == ' ' || l[i - 1] == '\t')) {
          l.resize(i);
          break;
        }
      }
      if (l.find("TODO") != std::string::npos)
        return Status::Error(path + ":" + std::to_string(line) +
                             ": a TODO is left (zt repro init marks what only the report can say): fill it");
      start = end + 1;
    }
  }
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Status::Error(path + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) return Status::Error(path + ": a scenario is a mapping (scenario:, report:, model:, ...)");
  if (Status s = check_unique_keys(root, path); !s) return s;
  Scenario s;
  s.path = path;
  Reader r{path};
  try {
    read_scenario(r, root, s);
  } catch (const BadScenario& e) {
    return Status::Error(e.message);
  } catch (const YAML::Exception& e) {
    return Status::Error(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  *out = std::move(s);
  return Status::Ok();
}

}  // namespace

const char* variant_name(Variant v) { return v == Variant::Small ? "small" : "full-size"; }

Status load_scenario(const std::string& path, Scenario* out) {
  Scenario s;
  if (Status st = load_once(path, &s); !st) return st;
  // Every run this scenario can make must resolve: a bad value is refused before anything runs.
  for (Variant v : {Variant::Small, Variant::Full})
    for (bool fix : {false, true}) {
      trainer::TrainConfig c;
      if (Status st = resolve(s, v, fix, std::nullopt, &c, nullptr); !st) return st;
    }
  *out = std::move(s);
  return Status::Ok();
}

Status resolve_config(const Scenario& s, Variant v, bool fix, std::optional<uint64_t> seed, trainer::TrainConfig* out,
                      std::vector<std::string>* warnings) {
  return resolve(s, v, fix, seed, out, warnings);
}

Expectation expectation(const Scenario& s, Variant v) {
  if (v == Variant::Small && s.small.expect) return *s.small.expect;
  return s.expect;
}

FixSpec fix_of(const Scenario& s, Variant v) {
  FixSpec f = s.fix;
  if (v == Variant::Small && s.small.fix) {
    if (!s.small.fix->description.empty()) f.description = s.small.fix->description;
    if (!s.small.fix->quote.empty()) f.quote = s.small.fix->quote;
  }
  return f;
}

}  // namespace zt::repro
