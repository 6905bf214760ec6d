// zt repro: the bug run, the fix run, and the verdict from their traces.
#include "zt/repro/runner.h"
#include "zero/optimizer_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "data/corpus.h"
#include "model/config.h"
#include "train/outside_memory.h"
#include "train/progress_filter.h"
#include "train/trainer.h"
#include "zt/db/trace_file.h"
#include "zt/common/units.h"
#include "zt/probe/recorder.h"

namespace zt::repro {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void remove_trace(const std::string& path) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(path + suffix, ec);
}

std::string describe_run(const trainer::TrainConfig& c) {
  std::ostringstream s;
  s << "ZeRO-" << c.zero.stage;
  if (c.zero.offload_optimizer) s << " + offload_optimizer";
  if (c.zero.offload_param) s << " + offload_param";
  s << ", " << c.precision << ", ";
  if (c.virtual_mode) {
    s << (c.shape.name.empty() ? "custom model" : c.shape.name) << " (virtual: sizes only) on " << c.world_size << " GPUs";
    if (c.ranks_per_node > 0) {
      const int64_t nodes = c.world_size / c.ranks_per_node;
      s << " (" << nodes << (nodes == 1 ? " node x " : " nodes x ") << c.ranks_per_node << ")";
    }
  } else {
    s << (c.model == "custom" ? c.shape.name : "GPT-2 " + c.model) << " on " << c.world_size << " simulated GPU" << (c.world_size > 1 ? "s" : "");
  }
  s << " of " << format_bytes(double(c.device_memory));
  if (c.host_memory) s << ", host " << format_bytes(double(c.host_memory)) << (c.ranks_per_node > 0 ? " per node" : "");
  if (const std::string o = trainer::describe_outside(c); !o.empty()) s << ", outside PyTorch's allocator " << o;
  s << ", micro-batch " << c.micro_batch << " x accumulation " << c.grad_accum;
  if (c.grad_clip > 0) s << ", clip " << c.grad_clip;
  if (c.steps) s << ", " << c.steps << " steps";
  else if (c.epochs) s << ", " << c.epochs << " epochs";
  if (c.save_every) s << ", checkpoint every " << c.save_every;
  if constexpr (requires { c.save_only_model; })
    if (c.save_only_model) s << " (save_only_model)";
  // The optimizer and the attention the memory model charged, when the run named them (issue 41).
  if (const trainer::OptimizerSpec o = trainer::optimizer_of(c); o.given)
    s << ", optimizer " << o.name << " (" << trainer::optimizer_library(o) << ")";
  if (c.attention != "materialized") s << ", attention " << c.attention;
  s << "; faults: ";
  if (c.faults.empty()) s << "none";
  for (size_t i = 0; i < c.faults.size(); ++i) s << (i ? "; " : "") << c.faults[i];
  return s.str();
}

Status run_one(const trainer::TrainConfig& cfg_in, const std::string& label, const Expectation& x,
               const JudgeContext& base_ctx, bool is_fix, const RunOptions& o, RunRecord* out) {
  trainer::TrainConfig cfg = cfg_in;
  out->label = label;
  out->trace = (fs::path(o.keep_dir) / (label + ".db")).string();
  if (cfg.save_every > 0) {
    cfg.checkpoint_dir = (fs::path(o.keep_dir) / ("ckpt-" + label)).string();
    std::error_code ec;
    fs::remove_all(cfg.checkpoint_dir, ec);
  }
  cfg.trace = out->trace;
  out->config = cfg;
  out->summary = describe_run(cfg);
  remove_trace(out->trace);

  std::ostream* p = o.progress;
  if (p) *p << label << " run: " << out->summary << "\n  trace: " << out->trace << "\n" << std::flush;
  probe::RecorderOptions ro;
  ro.path = out->trace;
  ro.command_line = o.command_line + " (" + label + " run)";
  ro.config_json = trainer::to_json(cfg);
  ro.seed = int64_t(cfg.seed);
  ro.crash_handlers = o.crash_handlers;
  std::unique_ptr<probe::Recorder> rec;
  if (Status s = probe::Recorder::open(ro, &rec); !s) return Status::Error(label + " run: " + s.message());

  trainer::ProgressFilter filter(p, o.max_step_lines);
  std::ostream filtered(&filter);
  trainer::TrainSummary sum;
  const auto t0 = std::chrono::steady_clock::now();
  out->status = trainer::train(cfg, rec.get(), p ? &filtered : nullptr, &sum);
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  filter.finish();
  Status closed = out->status ? rec->close(db::RunStatus::Ok, 0) : rec->close(db::RunStatus::Failed, 1, out->status.message());
  rec.reset();
  if (p) {
    if (out->status)
      *p << "  -> completed " << sum.steps << " steps in " << format_duration_ns(out->seconds * 1e9) << "\n";
    else
      *p << "  -> failed after " << format_duration_ns(out->seconds * 1e9) << ": " << out->status.message().substr(0, 240)
         << (out->status.message().size() > 240 ? "..." : "") << "\n";
    if (!closed) *p << "  (closing the trace: " << closed.message() << ")\n";
    p->flush();
  }
  JudgeContext ctx = base_ctx;
  ctx.grad_accum = cfg.grad_accum;
  ctx.faults = cfg.faults;
  ctx.train_status = out->status;
  ctx.unmodeled_keys = cfg.unmodeled_memory_keys;
  ctx.outside_allocator_bytes = int64_t(trainer::outside_allocator_bytes(cfg));
  Evidence ev = read_evidence(out->trace, x.error);
  out->judgement = is_fix ? judge_fix(x, ctx, std::move(ev)) : judge_bug(x, ctx, std::move(ev));
  return Status::Ok();
}

std::string mem(const std::optional<int64_t>& v) { return v ? format_bytes(double(*v)) : std::string("?"); }

// The report's words in quotation marks, once: a quote written with its own marks ("...", “...”)
// keeps them; one that holds a '"' of its own elsewhere is set in “” so the marks stay paired.
std::string quoted_once(std::string q) {
  auto trim = [](std::string& t) {
    const char* ws = " \t\n";
    t.erase(0, t.find_first_not_of(ws) == std::string::npos ? t.size() : t.find_first_not_of(ws));
    t.erase(t.find_last_not_of(ws) + 1);
  };
  trim(q);
  auto enclosed = [&](const std::string& open, const std::string& close) {
    return q.size() >= open.size() + close.size() && q.compare(0, open.size(), open) == 0 &&
           q.compare(q.size() - close.size(), close.size(), close) == 0;
  };
  if (enclosed("\"", "\"") && q.find('"', 1) == q.size() - 1) return q;
  if (enclosed("\u201c", "\u201d")) return q;
  if (q.find('"') != std::string::npos) return "\u201c" + q + "\u201d";
  return "\"" + q + "\"";
}

}  // namespace

int64_t full_data_steps(const trainer::TrainConfig& cfg, std::string* why) {
  if (cfg.epochs <= 0) {
    if (why) *why = "the run is not given in epochs";
    return -1;
  }
  if (cfg.virtual_mode) {
    if (cfg.data_samples <= 0) {
      if (why) *why = "virtual mode without data_samples";
      return -1;
    }
    const int64_t T = cfg.seq_len ? cfg.seq_len : cfg.shape.context;
    trainer::DataPlan plan = trainer::plan_samples(cfg.data_samples, T, cfg.micro_batch, cfg.grad_accum, cfg.world_size);
    if (!plan.error.empty()) {
      if (why) *why = plan.error;
      return -1;
    }
    return plan.steps_per_epoch * cfg.epochs;
  }
  trainer::Corpus corpus;
  if (Status s = trainer::load_corpus(cfg, &corpus); !s) {
    if (why) *why = s.message();
    return -1;
  }
  auto mc = model::preset(cfg.model);
  if (!mc) {
    if (why) *why = "model " + cfg.model + " is not a preset";
    return -1;
  }
  const int64_t T = cfg.seq_len ? cfg.seq_len : mc->context;
  trainer::DataPlan plan = trainer::plan_data(corpus, T, cfg.micro_batch, cfg.grad_accum, cfg.world_size);
  if (!plan.error.empty()) {
    if (why) *why = plan.error;
    return -1;
  }
  return plan.steps_per_epoch * cfg.epochs;
}

Status run_scenario(const Scenario& s, const RunOptions& o_in, ReproResult* out) {
  if (std::getenv("ZT_FAULTS"))
    return Status::Error("ZT_FAULTS is set in the environment: a scenario brings its own faults, and the fix run must "
                         "run without them. Unset ZT_FAULTS and run again.");
  RunOptions o = o_in;
  if (o.keep_dir.empty()) o.keep_dir = "zt-repro-" + s.name;
  std::error_code ec;
  fs::create_directories(o.keep_dir, ec);
  if (ec || !fs::is_directory(o.keep_dir))
    return Status::Error(o.keep_dir + ": cannot create the keep directory (" + ec.message() + ")");
  // Each run replaces its trace: refused before either run when something else has that name.
  for (const char* label : {"bug", "fix"})
    if (Status st = db::check_trace_destination((fs::path(o.keep_dir) / (std::string(label) + ".db")).string()); !st)
      return st;

  ReproResult& r = *out;
  r = ReproResult{};
  r.scenario = s.name;
  r.scenario_path = s.path;
  r.report_id = s.report_id;
  r.report_title = s.report_title;
  r.report_sources = s.report_sources;
  r.variant = o.variant;
  r.keep_dir = o.keep_dir;
  const FixSpec fix = fix_of(s, o.variant);
  r.fix_description = fix.description;
  r.fix_quote = fix.quote;
  Expectation x = expectation(s, o.variant);
  // The report's figures are about the report's model and cluster: the small variant is neither.
  if (o.variant == Variant::Small) x.figures.clear();

  trainer::TrainConfig bug_cfg, fix_cfg;
  std::vector<std::string> warnings;
  if (Status st = resolve_config(s, o.variant, false, o.seed, &bug_cfg, &warnings); !st) return st;
  if (Status st = resolve_config(s, o.variant, true, o.seed, &fix_cfg, nullptr); !st) return st;
  r.seed = bug_cfg.seed;
  if (o.progress) {
    *o.progress << "scenario " << s.name << " (" << s.path << "): report " << s.report_id;
    if (!s.report_sources.empty())
      *o.progress << " (from " << s.report_sources[0]
                  << (s.report_sources.size() > 1 ? " and " + std::to_string(s.report_sources.size() - 1) + " more" : "")
                  << ")";
    *o.progress << "\n  " << s.report_title << "\n";
    *o.progress << "variant: " << variant_name(o.variant);
    if (o.variant == Variant::Small) *o.progress << " (real compute; zt repro --virtual runs the full-size one)";
    if (o.variant == Variant::Full) {
      *o.progress << ": " << (s.shape.name.empty() ? "the real model" : s.shape.name) << " on " << s.nodes << " x "
                  << s.gpus_per_node << " " << (s.gpu.empty() ? "GPUs" : s.gpu);
      if (!s.shape_note.empty()) *o.progress << " (" << s.shape_note << ")";
    }
    *o.progress << "; seed " << r.seed << "\n";
    if (o.variant == Variant::Small && !s.small.description.empty()) *o.progress << "  " << s.small.description << "\n";
    for (auto& w : warnings) *o.progress << "  note: " << w << "\n";
    o.progress->flush();
  }

  JudgeContext ctx;
  if (x.steps_lost) {
    trainer::TrainConfig clean = bug_cfg;
    clean.faults.clear();
    std::string why;
    r.expected_steps = full_data_steps(clean, &why);
    ctx.expected_steps = r.expected_steps;
    if (o.progress) {
      if (r.expected_steps >= 0)
        *o.progress << "full data: " << clean.epochs << " epochs give " << r.expected_steps << " optimizer steps\n";
      else
        *o.progress << "full data: cannot tell the steps it gives (" << why << ")\n";
    }
  }
  if (Status st = run_one(bug_cfg, "bug", x, ctx, false, o, &r.bug); !st) return st;
  if (Status st = run_one(fix_cfg, "fix", x, ctx, true, o, &r.fix); !st) return st;
  r.reproduced = r.bug.judgement.outcome;
  r.cured = r.fix.judgement.outcome;
  r.verdict = verdict_word(r.bug.judgement);
  return Status::Ok();
}

void print_verdict(const ReproResult& r, std::ostream& out) {
  const Evidence& e = r.bug.judgement.evidence;
  out << "\nverdict: " << r.verdict;
  if (r.reproduced == Outcome::Valid)
    out << "; the fix " << (r.cured == Outcome::Valid ? "cures it" : r.cured == Outcome::Invalid ? "does NOT cure it" : "is inconclusive");
  std::string off;  // the report's figures the run missed: named in the verdict's own line
  for (const auto& f : r.bug.judgement.figures)
    if (f.outcome == Outcome::Invalid) {
      char pct[48];
      std::snprintf(pct, sizeof pct, " %+.1f%% (tolerance %.4g%%)", f.relative_error.value_or(0) * 100, f.tolerance * 100);
      off += (off.empty() ? "" : ", ") + f.name + pct;
    }
  if (!off.empty()) out << "; figure" << (off.find(',') == std::string::npos ? " " : "s ") << "off: " << off;
  for (const auto& f : r.bug.judgement.figures)
    if (!f.depends_on.empty()) out << "; " << f.name << " not judged";
  out << "  (" << variant_name(r.variant) << ", seed " << r.seed << ")\n";
  out << "  report    " << r.report_id << ": " << r.report_title << "\n";
  auto row = [&](const char* label, const std::string& text) { out << "  " << label << text << "\n"; };
  for (const auto& src : r.report_sources) row("from      ", src);
  if (r.bug.judgement.different_failure)
    row("mechanism ", "the run failed with the expected " + e.error_kind +
                          ", but not through the mechanism the scenario names (the mechanism checks below): "
                          "a different failure, not this report");
  if (!e.readable) {
    row("trace     ", e.read_error);
  } else if (e.has_error && e.before_first_step) {
    row("symptom   ", e.error_kind + (e.error_site.empty() ? "" : " at " + e.error_site) +
                          ", during setup before the first step (model states and activations being placed), rank " +
                          std::to_string(e.error_rank) + (e.world_size > 0 ? " of " + std::to_string(e.world_size) : ""));
    row("error     ", e.error_message.size() > 400 ? e.error_message.substr(0, 400) + "..." : e.error_message);
    if (!e.error_tensors.empty()) row("tensors   ", e.error_tensors[0]);
  } else if (e.has_error) {
    std::string where = "step " + (e.step ? std::to_string(*e.step) : std::string("?")) + " (epoch " +
                        (e.epoch ? std::to_string(*e.epoch) : std::string("?"));
    if (e.step_in_epoch) where += ", its step " + std::to_string(*e.step_in_epoch);
    if (e.micro_step) where += ", micro-step " + std::to_string(*e.micro_step);
    where += "), rank " + std::to_string(e.error_rank) + (e.world_size > 0 ? " of " + std::to_string(e.world_size) : "");
    row("symptom   ", e.error_kind + (e.error_site.empty() ? "" : " at " + e.error_site) + ", " + where);
    if (!e.phases.empty()) {
      std::string ph;
      for (size_t i = 0; i < e.phases.size(); ++i) ph += (i ? " > " : "") + e.phases[i];
      row("phases    ", ph);
    }
    row("error     ", e.error_message.size() > 400 ? e.error_message.substr(0, 400) + "..." : e.error_message);
    if (!e.error_tensors.empty()) {
      std::string t;
      for (size_t i = 0; i < e.error_tensors.size() && i < 8; ++i) t += (i ? ", " : "") + e.error_tensors[i];
      row("tensors   ", t);
    }
  } else {
    std::string s = "no error; " + std::to_string(e.steps_completed) + " optimizer steps completed";
    if (r.expected_steps >= 0) s += "; max_epochs over the full data gives " + std::to_string(r.expected_steps);
    row("symptom   ", s);
    if (e.documents || e.samples_per_epoch || e.steps_planned) {
      std::string d;
      if (e.documents && *e.documents > 0) d += std::to_string(*e.documents) + " documents";
      if (e.documents && *e.documents > 0 && e.documents_dropped)
        d += " (" + std::to_string(*e.documents_dropped) + " counted as dropped)";
      if (e.samples_per_epoch) d += (d.empty() ? "" : ", ") + std::to_string(*e.samples_per_epoch) + " samples per epoch";
      if (e.steps_per_epoch) d += ", " + std::to_string(*e.steps_per_epoch) + " steps per epoch";
      if (e.steps_planned) d += ", " + std::to_string(*e.steps_planned) + " steps planned";
      row("data      ", d);
    }
  }
  if (e.readable) {
    std::string m = e.device_label + ": " + mem(e.device_allocated) + " allocated, " + mem(e.device_reserved) +
                    " reserved of " + mem(e.device_capacity);
    if (e.host_live || e.host_pinned)
      m += "; host: " + mem(e.host_live) + " held" + (e.host_pinned ? " (" + mem(e.host_pinned) + " pinned)" : "") +
           (e.host_capacity ? " of " + mem(e.host_capacity) : "");
    row(e.has_error ? "memory    " : "memory    ", (e.has_error ? "" : "after the last step: ") + m);
    if (!e.largest_alive.empty()) {
      std::string a;
      for (size_t i = 0; i < e.largest_alive.size() && i < 4; ++i)
        a += (i ? ", " : "") + e.largest_alive[i].name + " " + format_bytes(double(e.largest_alive[i].bytes)) + " on " +
             e.largest_alive[i].device;
      row("alive     ", a);
    }
    if (e.fault_count == 0) {
      row("faults    ", "none fired");
    } else {
      std::string f;
      for (auto& [n, c] : e.faults_by_name) f += (f.empty() ? "" : ", ") + n + " x" + std::to_string(c);
      row("faults    ", f);
      for (size_t i = 0; i < e.faults.size() && i < 3; ++i) {
        const auto& fr = e.faults[i];
        row("          ", fr.name + " rank " + std::to_string(fr.rank) + (fr.step ? " step " + std::to_string(*fr.step) : "") +
                              ": " + (fr.details.empty() ? fr.trigger : fr.details));
      }
    }
  }
  for (auto& c : r.bug.judgement.checks)
    out << "  check     [" << outcome_name(c.outcome) << "] " << c.name << ": " << c.detail << "\n";
  for (auto& f : r.bug.judgement.figures)
    if (!f.depends_on.empty())
      out << "  not judged figure " << f.name << ": " << f.detail << "; it depends on " << f.depends_on << "\n";
  if (!r.fix_description.empty()) row("fix       ", r.fix_description);
  if (!r.fix_quote.empty()) row("report    ", quoted_once(r.fix_quote));
  out << "  fix run   " << cure_word(r.cured) << ": " << r.fix.summary << "\n";
  for (auto& c : r.fix.judgement.checks)
    out << "  check     [" << outcome_name(c.outcome) << "] " << c.name << ": " << c.detail << "\n";
  out << "  traces    " << r.bug.trace << " and " << r.fix.trace << "  (zt view " << r.bug.trace << " " << r.fix.trace << ")\n";
  out.flush();
}

json to_json(const ReproResult& r) {
  auto run = [](const RunRecord& x) {
    json cfg;
    try {
      cfg = json::parse(trainer::to_json(x.config));
    } catch (...) {
      cfg = nullptr;
    }
    return json{{"trace", x.trace},
                {"summary", x.summary},
                {"seconds", x.seconds},
                {"status", x.status ? "ok" : x.status.message()},
                {"config", cfg},
                {"judgement", to_json(x.judgement)}};
  };
  return {{"scenario", r.scenario},
          {"scenario_file", r.scenario_path},
          {"report", {{"id", r.report_id}, {"sources", r.report_sources}, {"title", r.report_title}}},
          {"variant", r.variant == Variant::Small ? "small" : "full"},
          {"seed", r.seed},
          {"verdict", r.verdict},
          {"reproduced", outcome_name(r.reproduced)},
          {"fix_verdict", cure_word(r.cured)},
          {"cured", r.cured == Outcome::Valid},
          {"exit_code", r.exit_code()},
          {"expected_steps", r.expected_steps >= 0 ? json(r.expected_steps) : json(nullptr)},
          {"fix", {{"description", r.fix_description}, {"quote", r.fix_quote}}},
          {"keep_dir", r.keep_dir},
          {"runs", {{"bug", run(r.bug)}, {"fix", run(r.fix)}}}};
}

Status write_json_atomic(const std::string& path, const json& j) {
  const std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Error(path + ": cannot write (" + std::string(std::strerror(errno)) + ")");
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status::Error(path + ": write failed (" + why + ")");
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return Status::Error(path + ": cannot flush to disk");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return Status::Error(path + ": cannot rename into place (" + why + ")");
  }
  return Status::Ok();
}

}  // namespace zt::repro
