// Verdicts: Jepsen-style composition, the evidence read back from a hand-built trace, and the
// judgement of bug and fix runs.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "zt/probe/recorder.h"
#include "zt/repro/runner.h"
#include "zt/repro/verdict.h"

#include <sstream>

using namespace zt;
using repro::Outcome;

namespace {

constexpr int64_t MiB = 1 << 20;

// One rank's trace with a host OOM inside epoch 1, step 4 (the first of the epoch: 4 steps
// per epoch), micro-step 3, phase backward; rank 1 fails a little earlier (the primary error
// is still rank 0's: ranks are symmetric and race).
std::string build_trace(const test::TempDir& dir) {
  const std::string path = dir.file("t.db");
  probe::RecorderOptions o;
  o.path = path;
  o.crash_handlers = false;
  std::unique_ptr<probe::Recorder> rec;
  EXPECT_TRUE(probe::Recorder::open(o, &rec));
  rec->add_rank(0, 2);
  rec->add_rank(1, 2);
  auto gpu = rec->add_device(0, probe::DeviceKind::Sim, 0, "cuda:0", "simulated GPU", 1024 * MiB, true);
  auto cpu = rec->add_device(0, probe::DeviceKind::Cpu, 0, "cpu", "host", 4 * MiB, false);
  rec->counter(0, 0, rec->intern("data.steps_per_epoch"), 4, 1);
  rec->counter(0, 0, rec->intern("data.steps_planned"), 8, 1);
  auto marker = [&](probe::MarkerKind k, const char* name, int64_t step, int64_t micro, int64_t epoch, int64_t t0,
                    int64_t t1) {
    probe::MarkerEvent m;
    m.rank = 0;
    m.kind = k;
    m.name = rec->intern(name);
    m.step = step;
    m.micro_step = micro;
    m.epoch = epoch;
    m.t = t0;
    auto id = rec->marker_begin(m);
    if (t1 > 0) rec->marker_end(id, INT64_MIN, t1);
  };
  for (int s = 0; s < 4; ++s) marker(probe::MarkerKind::Step, "step", s, -1, 0, 10 + 10 * s, 15 + 10 * s);
  marker(probe::MarkerKind::Epoch, "epoch 1", -1, -1, 1, 100, 0);  // never ended: the run died in it
  marker(probe::MarkerKind::Step, "step 4", 4, -1, 1, 110, 0);
  marker(probe::MarkerKind::MicroStep, "micro-step 3", 4, 3, 1, 500, 0);
  marker(probe::MarkerKind::Phase, "backward", 4, 3, 1, 550, 0);
  marker(probe::MarkerKind::Phase, "forward", 4, 3, 1, 510, 540);  // ended before the error
  probe::AllocEvent a;
  a.rank = 0;
  a.device = gpu;
  a.bytes = 1 * MiB;
  a.name = rec->intern("activations");
  a.t = 120;
  rec->alloc(a);
  rec->counter(0, gpu, rec->intern("allocated"), double(1 * MiB), 130);
  rec->counter(0, gpu, rec->intern("reserved"), double(2 * MiB), 130);
  probe::AllocEvent seg;
  seg.rank = 0;
  seg.device = cpu;
  seg.memory_kind = probe::MemoryKind::PinnedHost;
  seg.level = probe::AllocLevel::Segment;
  seg.bytes = 3 * MiB;
  seg.name = rec->intern("adam.m[block0]");
  seg.t = 200;
  probe::AllocEvent blk = seg;
  blk.level = probe::AllocLevel::Block;
  blk.segment = rec->alloc(seg);
  rec->alloc(blk);
  rec->counter(0, cpu, rec->intern("pinned"), double(3 * MiB), 200);
  db::FaultRow f;
  f.rank = 0;
  f.t = 105;
  f.step = 4;
  f.name = "host.epoch_leak";
  f.trigger = "host.epoch_leak=return (call 1, rank 0, seed 1)";
  f.details = "return(pinned)";
  rec->fault(f);
  db::ErrorRow e;
  e.rank = 1;
  e.t = 590;
  e.kind = "host_oom";
  e.message = "Host out of memory (pinned): rank 1";
  rec->error(e);
  e.rank = 0;
  e.t = 600;
  e.message = "Host out of memory (pinned): tried to pin 1.00 MiB for 'fp32_partitioned_groups_flat[1].grad'";
  e.tensors = R"(["fp32_partitioned_groups_flat[1].grad"])";
  e.device_id = cpu;
  rec->error(e);
  EXPECT_TRUE(rec->close(db::RunStatus::Failed, 1, "host OOM"));
  return path;
}

repro::Expectation host_oom() {
  repro::Expectation x;
  x.error = "host_oom";
  x.message = R"(Host out of memory \(pinned\))";
  x.tensors = {R"(fp32_partitioned_groups_flat\[\d+\]\.grad)"};
  x.epoch = 1;
  x.step_in_epoch = 0;
  x.micro_step = -2;  // last
  x.phase = "backward";
  x.faults_fired = {"host.epoch_leak"};
  return x;
}

const repro::Check* find(const repro::RunJudgement& j, const std::string& name) {
  for (auto& c : j.checks)
    if (c.name == name) return &c;
  return nullptr;
}

}  // namespace

TEST(ReproVerdict, InvalidDominatesUnknownDominatesValid) {
  EXPECT_EQ(repro::compose({}), Outcome::Valid);
  EXPECT_EQ(repro::compose({Outcome::Valid, Outcome::Valid}), Outcome::Valid);
  EXPECT_EQ(repro::compose({Outcome::Valid, Outcome::Unknown}), Outcome::Unknown);
  EXPECT_EQ(repro::compose({Outcome::Unknown, Outcome::Invalid, Outcome::Valid}), Outcome::Invalid);
  EXPECT_EQ(repro::verdict_word(Outcome::Valid), "REPRODUCED");
  EXPECT_EQ(repro::verdict_word(Outcome::Invalid), "NOT REPRODUCED");
  EXPECT_EQ(repro::verdict_word(Outcome::Unknown), "INCONCLUSIVE");
  EXPECT_EQ(repro::cure_word(Outcome::Valid), "CURED");
}

TEST(ReproVerdict, EvidenceComesFromTheTrace) {
  test::TempDir dir;
  repro::Evidence e = repro::read_evidence(build_trace(dir), "host_oom");
  ASSERT_TRUE(e.readable) << e.read_error;
  EXPECT_EQ(e.run_status, "failed");
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.steps_completed, 4) << "step 4 never ended";
  EXPECT_EQ(e.error_count, 2);
  EXPECT_EQ(e.error_rank, 0) << "the lowest rank's error is the primary one";
  EXPECT_EQ(e.error_kind, "host_oom");
  EXPECT_EQ(e.error_tensors, std::vector<std::string>{"fp32_partitioned_groups_flat[1].grad"});
  EXPECT_EQ(e.error_device, "cpu");
  EXPECT_EQ(e.step, 4);
  EXPECT_EQ(e.epoch, 1);
  EXPECT_EQ(e.micro_step, 3);
  EXPECT_EQ(e.step_in_epoch, 0) << "step 4 - epoch 1 x 4 steps per epoch";
  EXPECT_EQ(e.phases, std::vector<std::string>{"backward"}) << "forward had ended";
  EXPECT_FALSE(e.before_first_step);
  EXPECT_EQ(e.device_label, "cuda:0");
  EXPECT_EQ(e.device_allocated, 1 * MiB);
  EXPECT_EQ(e.device_reserved, 2 * MiB);
  EXPECT_EQ(e.device_capacity, 1024 * MiB);
  EXPECT_EQ(e.host_live, 3 * MiB);
  EXPECT_EQ(e.host_pinned, 3 * MiB);
  EXPECT_EQ(e.host_capacity, 4 * MiB);
  ASSERT_GE(e.largest_alive.size(), 2u);
  EXPECT_EQ(e.largest_alive[0].name, "adam.m[block0]");
  EXPECT_EQ(e.largest_alive[0].kind, "pinned_host");
  ASSERT_EQ(e.faults.size(), 1u);
  EXPECT_EQ(e.faults[0].name, "host.epoch_leak");
  EXPECT_EQ(e.faults[0].step, 4);
  EXPECT_EQ(e.steps_planned, 8);
}

TEST(ReproVerdict, MatchingEvidenceReproduces) {
  test::TempDir dir;
  repro::Evidence e = repro::read_evidence(build_trace(dir), "host_oom");
  repro::JudgeContext ctx;
  ctx.grad_accum = 4;
  repro::RunJudgement j = repro::judge_bug(host_oom(), ctx, e);
  for (auto& c : j.checks) EXPECT_EQ(c.outcome, Outcome::Valid) << c.name << ": " << c.detail;
  EXPECT_EQ(j.outcome, Outcome::Valid);

  // The same trace against an expectation it does not meet.
  repro::Expectation x = host_oom();
  x.micro_step = 2;
  j = repro::judge_bug(x, ctx, e);
  EXPECT_EQ(j.outcome, Outcome::Invalid);
  ASSERT_NE(find(j, "when: micro_step"), nullptr);
  EXPECT_EQ(find(j, "when: micro_step")->detail, "expected 2, was 3");
  x = host_oom();
  x.error = "oom";
  j = repro::judge_bug(x, ctx, e);
  EXPECT_EQ(j.outcome, Outcome::Invalid);
  EXPECT_NE(j.checks[0].detail.find("failed with host_oom instead"), std::string::npos) << j.checks[0].detail;
  x = host_oom();
  x.faults_fired = {"zero.norm_on_device"};
  EXPECT_EQ(repro::judge_bug(x, ctx, e).outcome, Outcome::Invalid) << "the symptom without its mechanism";
}

TEST(ReproVerdict, WhatCannotBeToldIsInconclusive) {
  repro::JudgeContext ctx;
  repro::Evidence none = repro::read_evidence("/nonexistent/zt-trace.db", "oom");
  EXPECT_FALSE(none.readable);
  EXPECT_EQ(repro::judge_bug(host_oom(), ctx, none).outcome, Outcome::Unknown);
  EXPECT_EQ(repro::judge_fix(host_oom(), ctx, none).outcome, Outcome::Unknown);

  repro::Evidence e;
  e.readable = true;
  e.run_status = "running";  // killed: the end is unknown
  EXPECT_EQ(repro::judge_bug(host_oom(), ctx, e).outcome, Outcome::Unknown);

  // The run stopped cleanly before the epoch where the symptom is expected.
  e.run_status = "ok";
  e.steps_completed = 3;
  e.last_epoch = 0;
  EXPECT_EQ(repro::judge_bug(host_oom(), ctx, e).outcome, Outcome::Unknown);
  // It went past it without the symptom: not reproduced.
  e.last_epoch = 2;
  EXPECT_EQ(repro::judge_bug(host_oom(), ctx, e).outcome, Outcome::Invalid);

  // The right error, but no marker to tell the micro-step: unknown, unless it was before any step.
  e.has_error = true;
  e.error_kind = "host_oom";
  e.error_message = "Host out of memory (pinned): x";
  e.error_tensors = {"fp32_partitioned_groups_flat[0].grad"};
  e.faults_by_name = {{"host.epoch_leak", 1}};
  e.epoch = 1;
  e.step_in_epoch = 0;
  repro::Expectation x = host_oom();
  x.phase.clear();
  EXPECT_EQ(repro::judge_bug(x, ctx, e).outcome, Outcome::Unknown);
  // The run did not start at all: no verdict either way.
  repro::Evidence empty;
  empty.readable = true;
  empty.run_status = "failed";
  ctx.train_status = Status::Error("invalid configuration");
  EXPECT_EQ(repro::judge_bug(host_oom(), ctx, empty).outcome, Outcome::Unknown);
}

TEST(ReproVerdict, StepsLostAndFixRuns) {
  repro::Expectation lost;
  lost.steps_lost = true;
  repro::JudgeContext ctx;
  ctx.expected_steps = 160;
  repro::Evidence e;
  e.readable = true;
  e.run_status = "ok";
  e.steps_completed = 8;
  EXPECT_EQ(repro::judge_bug(lost, ctx, e).outcome, Outcome::Valid);
  EXPECT_EQ(repro::judge_fix(lost, ctx, e).outcome, Outcome::Invalid) << "8 of 160 is not cured";
  e.steps_completed = 160;
  EXPECT_EQ(repro::judge_bug(lost, ctx, e).outcome, Outcome::Invalid);
  EXPECT_EQ(repro::judge_fix(lost, ctx, e).outcome, Outcome::Valid);
  ctx.expected_steps = -1;
  EXPECT_EQ(repro::judge_bug(lost, ctx, e).outcome, Outcome::Unknown);

  // A fix run that dies of something else does not cure.
  repro::JudgeContext fctx;
  fctx.planned_steps = 4;
  repro::Evidence f;
  f.readable = true;
  f.run_status = "ok";
  f.steps_completed = 4;
  EXPECT_EQ(repro::judge_fix(host_oom(), fctx, f).outcome, Outcome::Valid);
  f.steps_completed = 3;
  EXPECT_EQ(repro::judge_fix(host_oom(), fctx, f).outcome, Outcome::Invalid);
  f.steps_completed = 4;
  f.error_count = 1;
  f.has_error = true;
  f.error_kind = "oom";
  EXPECT_EQ(repro::judge_fix(host_oom(), fctx, f).outcome, Outcome::Invalid);
}

// The verdict words by what failed (docs/scenarios.md): DIFFERENT FAILURE only when every failed
// check is a check of the mechanism; the right error at the wrong step is NOT REPRODUCED whether or
// not a mechanism check failed too.
TEST(ReproVerdict, VerdictWordsByWhatFailed) {
  test::TempDir dir;
  repro::Evidence e = repro::read_evidence(build_trace(dir), "host_oom");
  repro::JudgeContext ctx;
  ctx.grad_accum = 4;
  auto word = [&](const repro::Expectation& x) { return repro::verdict_word(repro::judge_bug(x, ctx, e)); };
  const repro::Expectation ok = host_oom();
  EXPECT_EQ(word(ok), "REPRODUCED");

  repro::Expectation wrong_step = ok;
  wrong_step.step = 5;  // it was step 4
  repro::Expectation wrong_mechanism = ok;
  wrong_mechanism.mechanism_phase = "optimizer";  // it was in backward
  repro::Expectation both = wrong_step;
  both.mechanism_phase = "optimizer";
  repro::Expectation fault_not_fired = ok;
  fault_not_fired.faults_fired = {"zero.norm_on_device"};  // a mechanism check too
  repro::Expectation step_and_fault = wrong_step;
  step_and_fault.faults_fired = {"zero.norm_on_device"};
  repro::Expectation message_and_mechanism = wrong_mechanism;
  message_and_mechanism.message = "CUDA out of memory";
  repro::Expectation kind_and_mechanism = wrong_mechanism;
  kind_and_mechanism.error = "oom";

  EXPECT_EQ(word(wrong_step), "NOT REPRODUCED");
  EXPECT_EQ(word(wrong_mechanism), "DIFFERENT FAILURE");
  EXPECT_EQ(word(fault_not_fired), "DIFFERENT FAILURE");
  EXPECT_EQ(word(both), "NOT REPRODUCED") << "the wrong step with a wrong mechanism (printed DIFFERENT FAILURE before)";
  EXPECT_EQ(word(step_and_fault), "NOT REPRODUCED");
  EXPECT_EQ(word(message_and_mechanism), "NOT REPRODUCED");
  EXPECT_EQ(word(kind_and_mechanism), "NOT REPRODUCED") << "another kind of error is never DIFFERENT FAILURE";
  repro::RunJudgement j = repro::judge_bug(both, ctx, e);
  EXPECT_EQ(j.outcome, Outcome::Invalid);
  EXPECT_FALSE(j.different_failure);
  ASSERT_NE(find(j, "when: step"), nullptr);
  EXPECT_EQ(find(j, "when: step")->outcome, Outcome::Invalid);
  ASSERT_NE(find(j, "mechanism: phase"), nullptr);
  EXPECT_EQ(find(j, "mechanism: phase")->outcome, Outcome::Invalid) << "still reported as a failed check";

  // A figure off its tolerance is not a mechanism check: NOT REPRODUCED, alone or with one.
  repro::Expectation figure_off = ok;
  figure_off.figures = {{"host_rss", 6 * MiB, "6MiB", 0.10, 0}};  // the trace holds 3 MiB on the host
  EXPECT_EQ(word(figure_off), "NOT REPRODUCED");
  figure_off.mechanism_phase = "optimizer";
  EXPECT_EQ(word(figure_off), "NOT REPRODUCED");
}

// expect.figures: each predicted from the trace (the error message, the counters at the error)
// against the report's, with the relative error; off by more than its tolerance fails.
TEST(ReproVerdict, FiguresPredictedAgainstReported) {
  test::TempDir dir;
  repro::Evidence e = repro::read_evidence(build_trace(dir), "host_oom");
  EXPECT_EQ(e.error_tried_bytes, 1 * MiB) << "the host allocator's 'tried to pin 1.00 MiB'";
  EXPECT_FALSE(e.error_free_bytes) << "a host message has no 'of which X is free'";
  EXPECT_EQ(repro::predicted_figure(e, "already_allocated"), 1 * MiB);
  EXPECT_EQ(repro::predicted_figure(e, "reserved"), 2 * MiB);
  EXPECT_EQ(repro::predicted_figure(e, "capacity"), 1024 * MiB);
  EXPECT_EQ(repro::predicted_figure(e, "host_rss"), 3 * MiB);

  repro::JudgeContext ctx;
  ctx.grad_accum = 4;
  repro::Expectation x = host_oom();
  x.figures = {{"tried_to_allocate", uint64_t(1.05 * MiB), "1.05MiB", 0.10, 0},
               {"reserved", 2 * MiB, "2MiB", 0.10, 0},
               {"capacity", 1100 * MiB, "1100MiB", 0.05, 0}};  // 1024 is -6.9%: outside 5%
  repro::RunJudgement j = repro::judge_bug(x, ctx, e);
  ASSERT_EQ(j.figures.size(), 3u);
  EXPECT_EQ(j.figures[0].outcome, Outcome::Valid);
  EXPECT_NEAR(*j.figures[0].relative_error, 1.0 / 1.05 - 1, 1e-5);
  EXPECT_EQ(j.figures[1].outcome, Outcome::Valid);
  EXPECT_DOUBLE_EQ(*j.figures[1].relative_error, 0.0);
  EXPECT_EQ(j.figures[2].outcome, Outcome::Invalid);
  EXPECT_EQ(j.outcome, Outcome::Invalid);
  EXPECT_EQ(repro::verdict_word(j), "NOT REPRODUCED");
  ASSERT_NE(find(j, "figure capacity"), nullptr);
  EXPECT_EQ(find(j, "figure capacity")->detail,
            "predicted 1.00 GiB, reported 1.07 GiB (1100MiB): -6.9%, outside its tolerance of 5.0%");
  EXPECT_EQ(find(j, "figure tried_to_allocate")->detail,
            "predicted 1.00 MiB, reported 1.05 MiB (1.05MiB): -4.8%, within its tolerance of 10.0%");
  auto json = repro::to_json(j);
  EXPECT_EQ(json["figures"][2]["figure"], "capacity");
  EXPECT_EQ(json["figures"][2]["predicted_bytes"], 1024 * MiB);
  EXPECT_EQ(json["figures"][2]["outcome"], "invalid");

  // A figure the trace cannot give is unknown: INCONCLUSIVE, never REPRODUCED.
  x.figures = {{"free", 1 * MiB, "1MiB", 0.10, 0}};
  j = repro::judge_bug(x, ctx, e);
  EXPECT_EQ(j.outcome, Outcome::Unknown);
  EXPECT_EQ(repro::verdict_word(j), "INCONCLUSIVE");
}

// PyTorch's OOM message, as the device allocator writes it: its figures read back exactly.
TEST(ReproVerdict, FiguresFromPyTorchsMessage) {
  test::TempDir dir;
  int n = 0;
  auto evidence = [&](const std::string& message) {
    const std::string path = dir.file("oom" + std::to_string(++n) + ".db");
    probe::RecorderOptions o;
    o.path = path;
    o.crash_handlers = false;
    std::unique_ptr<probe::Recorder> rec;
    EXPECT_TRUE(probe::Recorder::open(o, &rec));
    rec->add_rank(0, 1);
    auto gpu = rec->add_device(0, probe::DeviceKind::Sim, 0, "cuda:0", "simulated GPU", 1024 * MiB, true);
    db::ErrorRow err;
    err.rank = 0;
    err.t = 10;
    err.kind = "oom";
    err.message = message;
    err.device_id = gpu;
    rec->error(err);
    EXPECT_TRUE(rec->close(db::RunStatus::Failed, 1, "oom"));
    return repro::read_evidence(path, "oom");
  };
  repro::Evidence e = evidence(
      "CUDA out of memory. Tried to allocate 3.39 GiB. GPU 0 has a total capacity of 79.32 GiB of which 2.01 GiB is "
      "free. Including non-PyTorch memory, this process has 77.31 GiB memory in use. Of the allocated memory 73.29 GiB "
      "is allocated by PyTorch, and 1.60 GiB is reserved by PyTorch but unallocated.");
  EXPECT_EQ(e.error_tried_bytes, int64_t(3.39 * 1024 * MiB + 0.5));
  EXPECT_EQ(e.error_free_bytes, int64_t(2.01 * 1024 * MiB + 0.5));
  e = evidence("CUDA out of memory. Tried to allocate 512 bytes. GPU 0 has a total capacity of 1.00 GiB of which 0 bytes "
               "is free.");
  EXPECT_EQ(e.error_tried_bytes, 512);
  EXPECT_EQ(e.error_free_bytes, 0);
  e = evidence("CUDA out of memory.");
  EXPECT_FALSE(e.error_tried_bytes);
  EXPECT_FALSE(repro::predicted_figure(e, "free"));
}

// The free figure is capacity - reserved - the memory outside PyTorch's allocator: its check says over which band of
// that memory the report's free holds (the same error kept). A free figure marked depends_on is printed, not judged:
// it is no check, and the verdict rests on the rest.
TEST(ReproVerdict, FreeSaysItsBandOfOutsideMemoryAndDependsOnIsNotJudged) {
  test::TempDir dir;
  const std::string path = dir.file("oom.db");
  {
    probe::RecorderOptions o;
    o.path = path;
    o.crash_handlers = false;
    std::unique_ptr<probe::Recorder> rec;
    ASSERT_TRUE(probe::Recorder::open(o, &rec));
    rec->add_rank(0, 1);
    auto gpu = rec->add_device(0, probe::DeviceKind::Sim, 0, "cuda:0", "simulated GPU", 8192 * MiB, true);
    db::ErrorRow err;
    err.rank = 0;
    err.t = 10;
    err.kind = "oom";
    err.message = "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which "
                  "2.00 GiB is free.";
    err.device_id = gpu;
    rec->error(err);
    ASSERT_TRUE(rec->close(db::RunStatus::Failed, 1, "oom"));
  }
  const repro::Evidence e = repro::read_evidence(path, "oom");
  repro::Expectation x;
  x.error = "oom";
  x.figures = {{"free", uint64_t(2.2 * 1024 * 1024 * 1024 + 0.5), "2.2GiB", 0.10, 0}};
  repro::JudgeContext ctx;
  ctx.outside_allocator_bytes = 512 * MiB;
  repro::RunJudgement j = repro::judge_bug(x, ctx, e);
  ASSERT_EQ(j.figures.size(), 1u);
  EXPECT_EQ(j.figures[0].outcome, Outcome::Valid) << j.figures[0].detail;
  ASSERT_TRUE(j.figures[0].outside_band);
  // free(c) = 2.00 GiB - (c - 0.5 GiB) within 10% of 2.2 GiB: c from 0.08 GiB to 0.52 GiB.
  EXPECT_NEAR(double(j.figures[0].outside_band->first) / (1024.0 * MiB), 0.08, 1e-3);
  EXPECT_NEAR(double(j.figures[0].outside_band->second) / (1024.0 * MiB), 0.52, 1e-3);
  ASSERT_NE(find(j, "figure free"), nullptr);
  EXPECT_NE(find(j, "figure free")->detail.find("with 512.00 MiB outside PyTorch's allocator charged, it holds for "
                                                "81.92 MiB to 532.48 MiB there"),
            std::string::npos)
      << find(j, "figure free")->detail;
  // Reported 4 GiB: even with nothing outside, free (2.5 GiB) would be 1.1 GiB short of the tolerance's edge.
  x.figures[0].bytes = 4096 * MiB;
  j = repro::judge_bug(x, ctx, e);
  EXPECT_EQ(j.figures[0].outcome, Outcome::Invalid);
  EXPECT_EQ(repro::verdict_word(j), "NOT REPRODUCED");
  EXPECT_NE(find(j, "figure free")->detail.find("it holds for none"), std::string::npos) << find(j, "figure free")->detail;
  // Declared as depending on what no source gives: printed (detail, band) but not a check; the rest decides.
  x.figures[0].depends_on = "the CUDA context of the report's stack";
  j = repro::judge_bug(x, ctx, e);
  EXPECT_EQ(find(j, "figure free"), nullptr);
  EXPECT_EQ(j.figures[0].outcome, Outcome::Unknown);
  EXPECT_NE(j.figures[0].detail.find("outside its tolerance"), std::string::npos);
  EXPECT_EQ(repro::verdict_word(j), "REPRODUCED");
}

// The report's quote is printed in quotation marks once, whether or not it was written with its own.
TEST(ReproVerdict, FixQuotePrintedInOnePairOfMarks) {
  auto printed = [](const std::string& quote) {
    repro::ReproResult r;
    r.verdict = "REPRODUCED";
    r.fix_quote = quote;
    std::ostringstream out;
    repro::print_verdict(r, out);
    const std::string text = out.str();
    const size_t at = text.find("  report    ", text.find("report    ") + 1);
    return at == std::string::npos ? std::string() : text.substr(at + 12, text.find('\n', at) - at - 12);
  };
  EXPECT_EQ(printed("check versions"), "\"check versions\"");
  EXPECT_EQ(printed("\"check versions\""), "\"check versions\"") << "it printed \"\"check versions\"\"";
  EXPECT_EQ(printed("  \"check versions\" "), "\"check versions\"");
  EXPECT_EQ(printed("\"auto\" takes the value"), "\u201c\"auto\" takes the value\u201d");
  EXPECT_EQ(printed("\u201cuse max_epochs\u201d"), "\u201cuse max_epochs\u201d");
}

// Issue 41's corpus: many reports fail while the engine is built. An error before the first step is
// inside the phase "setup" as well as its markers' phases; one after it is not.
TEST(ReproVerdict, AnErrorBeforeTheFirstStepIsInSetup) {
  repro::JudgeContext ctx;
  repro::Evidence e;
  e.readable = true;
  e.run_status = "failed";
  e.has_error = true;
  e.error_kind = "oom";
  e.error_message = "CUDA out of memory. Tried to allocate 8.01 GiB.";
  e.before_first_step = true;
  repro::Expectation x;
  x.error = "oom";
  x.phase = "^setup$";
  repro::RunJudgement j = repro::judge_bug(x, ctx, e);
  ASSERT_NE(find(j, "when: phase"), nullptr);
  EXPECT_EQ(find(j, "when: phase")->outcome, Outcome::Valid) << find(j, "when: phase")->detail;
  EXPECT_EQ(find(j, "when: phase")->detail, "/^setup$/ inside 'setup'");
  EXPECT_EQ(j.outcome, Outcome::Valid);
  // The same error inside step 0's forward is not in setup.
  e.before_first_step = false;
  e.step = 0;
  e.phases = {"forward", "forward block9"};
  j = repro::judge_bug(x, ctx, e);
  EXPECT_EQ(find(j, "when: phase")->outcome, Outcome::Invalid);
  EXPECT_EQ(j.outcome, Outcome::Invalid);
}
