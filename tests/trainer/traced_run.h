// tests/trainer/traced_run.h: train with a trace, then open it. The boilerplate of the
// trainer's trace tests, in one place.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "train/trainer.h"
#include "zt/db/trace_reader.h"

namespace zt::test {

// The small run most trainer tests start from: GPT-2 tiny, 2 sequences of 32 tokens, seed 3.
inline trainer::TrainConfig tiny_run(int64_t steps) {
  trainer::TrainConfig c;
  c.model = "tiny";
  c.steps = steps;
  c.micro_batch = 2;
  c.seq_len = 32;
  c.seed = 3;
  return c;
}

// The loss of every step of a run without a trace (a test failure when it fails). `backend`: as
// trainer::train's (tests drive the GPU code path with their own).
inline std::vector<double> train_losses(const trainer::TrainConfig& cfg, trainer::Backend* backend = nullptr) {
  trainer::TrainSummary s;
  Status st = trainer::train(cfg, nullptr, nullptr, &s, backend);
  EXPECT_TRUE(st.ok()) << cfg.device << ": " << st.message();
  return s.losses;
}

// A run stopped after `stop` steps (cfg saves into its checkpoint_dir on the way), then resumed
// from its last save up to cfg.steps: the losses before the stop and those after the resume (a
// test failure when the resume fails or starts elsewhere than at `stop`).
struct StopAndResume {
  std::vector<double> before, after;
};
inline StopAndResume stop_and_resume(trainer::TrainConfig cfg, int64_t stop) {
  StopAndResume r;
  const int64_t total = cfg.steps;
  cfg.steps = stop;
  r.before = train_losses(cfg);
  cfg.steps = total;
  cfg.resume = true;
  trainer::TrainSummary s;
  Status st = trainer::train(cfg, nullptr, nullptr, &s);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(s.resumed_from_step, stop);
  r.after = s.losses;
  return r;
}

// Step by step, |got - want| <= rel * |want|.
inline void expect_losses_close(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * std::fabs(want[i])) << "step " << i;
}

// The first column of the first row of `sql` on a trace, as a number (-1 when there is no row or
// the value is NULL; a test failure when the query fails).
inline int64_t query_int(db::TraceReader& reader, const std::string& sql) {
  db::QueryResult q;
  EXPECT_TRUE(reader.query(sql, &q).ok()) << sql;
  return q.rows.empty() || q.rows[0][0].empty() ? -1 : std::stoll(q.rows[0][0]);
}

struct TracedRun {
  Status status;                              // what train() returned
  trainer::TrainSummary summary;
  std::unique_ptr<db::TraceReader> reader;    // null when the trace could not be opened
};

inline TracedRun train_traced(const trainer::TrainConfig& cfg, const std::string& path) {
  TracedRun run;
  probe::RecorderOptions o;
  o.path = path;
  o.crash_handlers = false;
  o.config_json = trainer::to_json(cfg);  // as zt train writes them (zt check's placement rules read it)
  o.seed = int64_t(cfg.seed);
  std::unique_ptr<probe::Recorder> rec;
  if (Status s = probe::Recorder::open(o, &rec); !s) {
    run.status = s;
    return run;
  }
  run.status = trainer::train(cfg, rec.get(), nullptr, &run.summary);
  Status closed = run.status ? rec->close() : rec->close(db::RunStatus::Failed, 1, run.status.message());
  if (!closed) {
    run.status = closed;
    return run;
  }
  (void)db::TraceReader::open(path, &run.reader);
  return run;
}

// The delayed update's write-back copies into device parameter shards in rank 0's trace (H2D into
// "<module>.shard" after the first AdamW began: with the shards on the device no other copy writes
// them but the set-up's), and how many began before the apply of their update: a module's k-th copy
// is update k's, applied by the k-th "apply delayed update" (a copy's row has its real times on the
// copy lane, so an apply's own copies may begin after its marker ends, never before it begins).
struct WriteBackCopies {
  int64_t total = -1, before_apply = -1;
};
inline WriteBackCopies write_back_copies(db::TraceReader& reader) {
  db::QueryResult q;
  const std::string sql =
      "WITH c AS (SELECT name, t_start, row_number() OVER (PARTITION BY name ORDER BY t_start) AS k FROM transfer_v "
      "WHERE rank = 0 AND kind = 'H2D' AND name LIKE '%.shard' AND t_start > (SELECT min(t_start) FROM marker_v WHERE "
      "rank = 0 AND name LIKE 'adamw %')), a AS (SELECT t_start, row_number() OVER (ORDER BY t_start) AS k FROM "
      "marker_v WHERE rank = 0 AND name LIKE 'apply delayed update%') SELECT count(*), coalesce(sum(c.t_start < "
      "a.t_start), 0) FROM c LEFT JOIN a USING (k)";
  WriteBackCopies w;
  EXPECT_TRUE(reader.query(sql, &q).ok()) << sql;
  if (q.rows.size() == 1) w = {std::stoll(q.rows[0][0]), std::stoll(q.rows[0][1])};
  return w;
}

}  // namespace zt::test
