// One memory, two records: see match.h for the rules.
#include "match.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "sqlite.h"
#include "zt/db/schema.h"

namespace zt::db::detail {
namespace {

struct Seg {
  int64_t id, rank, device, t_alloc, t_free;  // t_free: INT64_MAX while alive at the end
};

bool overlap(const Seg& a, const Seg& b) { return a.t_alloc <= b.t_free && b.t_alloc <= a.t_free; }

using Moves = std::vector<std::pair<int64_t, int64_t>>;  // device rows to fold: (from, to)

// Every reference to device `from` moves to `to`, and `from` goes.
void fold_devices(sqlite3* db, const Moves& moves) {
  const char* updates[] = {
      "UPDATE allocation SET device_id = ?2 WHERE device_id = ?1",
      "UPDATE transfer SET src_device_id = ?2 WHERE src_device_id = ?1",
      "UPDATE transfer SET dst_device_id = ?2 WHERE dst_device_id = ?1",
      "UPDATE kernel SET device_id = ?2 WHERE device_id = ?1",
      "UPDATE placement SET device_id = ?2 WHERE device_id = ?1",
      "UPDATE counter SET device_id = ?2 WHERE device_id = ?1",
      "UPDATE error SET device_id = ?2 WHERE device_id = ?1",
      // The aggregates (every file a TraceWriter finishes has their tables). Two records' rows of one
      // step then share the device: a step's row per record source, as the recorder kept them apart.
      "UPDATE step_memory SET device_id = ?2 WHERE device_id = ?1",
      "UPDATE epoch_live SET device_id = ?2 WHERE device_id = ?1",
      "DELETE FROM device WHERE id = ?1 AND ?2 IS NOT NULL",
  };
  for (const char* sql : updates) {
    Stmt st(db, sql);
    for (auto [from, to] : moves) st.bind(1, from).bind(2, to).step_done();
  }
}

bool referenced(sqlite3* db, int64_t device) {
  Stmt st(db,
          "SELECT EXISTS(SELECT 1 FROM allocation WHERE device_id = ?1) OR EXISTS(SELECT 1 FROM transfer WHERE"
          " src_device_id = ?1 OR dst_device_id = ?1) OR EXISTS(SELECT 1 FROM kernel WHERE device_id = ?1) OR"
          " EXISTS(SELECT 1 FROM placement WHERE device_id = ?1) OR EXISTS(SELECT 1 FROM counter WHERE device_id = ?1)"
          " OR EXISTS(SELECT 1 FROM error WHERE device_id = ?1) OR EXISTS(SELECT 1 FROM step_memory WHERE device_id = ?1)"
          " OR EXISTS(SELECT 1 FROM epoch_live WHERE device_id = ?1)");
  st.bind(1, device);
  return st.step() && st.i64(0) != 0;
}

// Device rows equal in (rank, kind, ordinal, label), as pairs (later id, an earlier twin).
std::vector<std::pair<int64_t, int64_t>> equal_devices(sqlite3* db) {
  std::vector<std::pair<int64_t, int64_t>> out;
  Stmt st(db,
          "SELECT d.id, min(k.id) FROM device d JOIN device k ON k.rank = d.rank AND k.kind = d.kind AND"
          " k.ordinal IS d.ordinal AND k.label IS d.label AND k.id < d.id GROUP BY d.id");
  while (st.step()) out.emplace_back(st.i64(0), st.i64(1));
  return out;
}

// Any trace: a device row that nothing refers to and that equals another row is folded into it
// (`zt train --cupti` adds the host device for CUPTI before it knows whether CUPTI starts).
int64_t fold_unused_duplicates(sqlite3* db, const std::vector<std::pair<int64_t, int64_t>>& equal) {
  Moves moves;
  for (auto [later, earlier] : equal) {
    if (!referenced(db, later)) moves.emplace_back(later, earlier);
    else if (!referenced(db, earlier)) moves.emplace_back(earlier, later);
  }
  fold_devices(db, moves);
  return int64_t(moves.size());
}

// A trace with both sources: CUPTI's device rows are the trainer's devices seen again.
//  - Equal rows (rank, kind, ordinal, label) fold into the one holding api allocations, else
//    the lowest id.
//  - Per rank, when exactly one CUDA device holds the trainer's allocations and exactly one other
//    CUDA device holds none (CUPTI's: it names the GPU by its visible ordinal, the trainer by
//    rank, so under a launcher "cuda:0" of rank 3 is the trainer's "cuda:3"), the second folds
//    into the first.
int64_t fold_cupti_devices(sqlite3* db) {
  const std::string api = std::to_string(int(Source::Api));
  auto holds_api = [&](int64_t device) {
    Stmt st(db, "SELECT EXISTS(SELECT 1 FROM allocation WHERE device_id = ?1 AND source = " + api + ")");
    st.bind(1, device);
    return st.step() && st.i64(0) != 0;
  };
  Moves moves;
  for (auto [later, earlier] : equal_devices(db)) {
    if (holds_api(later) && !holds_api(earlier)) moves.emplace_back(earlier, later);
    else moves.emplace_back(later, earlier);
  }
  // A chain (three equal rows) folds into one survivor.
  for (auto& [from, to] : moves)
    for (auto& [f2, t2] : moves)
      if (f2 == to) to = t2;
  fold_devices(db, moves);
  int64_t folded = int64_t(moves.size());
  Moves per_rank;
  std::map<int64_t, std::pair<std::vector<int64_t>, std::vector<int64_t>>> cuda;  // rank -> (with api, without)
  Stmt st(db, "SELECT id, rank FROM device WHERE kind = " + std::to_string(int(DeviceKind::Cuda)) + " ORDER BY id");
  while (st.step()) {
    auto& [with, without] = cuda[st.i64(1)];
    (holds_api(st.i64(0)) ? with : without).push_back(st.i64(0));
  }
  for (auto& [rank, groups] : cuda)
    if (groups.first.size() == 1 && groups.second.size() == 1) per_rank.emplace_back(groups.second[0], groups.first[0]);
  fold_devices(db, per_rank);
  return folded + int64_t(per_rank.size());
}

}  // namespace

MatchStats match_driver_records(sqlite3* db) {
  MatchStats out;
  const std::string kinds = std::string(kAllocatorSourcesSql) + ", " + std::to_string(int(Source::Cupti));
  // Cheap test first: most traces have only one of the two sources (EXISTS stops at the first
  // row; a trace without CUPTI rows costs one scan of the allocation table, no sort).
  const bool mixed =
      query_int(db, ("SELECT EXISTS(SELECT 1 FROM allocation WHERE source = " + std::to_string(int(Source::Cupti)) +
                     ") AND EXISTS(SELECT 1 FROM allocation WHERE source IN (" + kAllocatorSourcesSql + "))")
                        .c_str()) != 0;
  const auto equal = equal_devices(db);  // the device table is small
  if (!mixed && equal.empty()) return out;

  exec(db, "BEGIN");
  try {
    if (!mixed) {
      out.devices_merged = fold_unused_duplicates(db, equal);
      exec(db, "COMMIT");
      return out;
    }
    out.devices_merged = fold_cupti_devices(db);
    // api segments that already have their second record (a trace finished before: zt db merge).
    std::unordered_set<int64_t> twinned;
    Stmt done(db, "SELECT segment_id FROM allocation WHERE level = " + std::to_string(int(AllocLevel::Segment)) +
                      " AND segment_id IS NOT NULL");
    while (done.step()) twinned.insert(done.i64(0));
    // Key: (run, memory kind, address, bytes). Unpaired segments of both sources.
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t>;
    std::map<Key, std::vector<Seg>> api, cupti;
    Stmt rows(db,
              "SELECT a.source, coalesce(r.run_id, 0), a.memory_kind, a.address, a.bytes, a.id, a.rank, a.device_id,"
              " a.t_alloc, a.t_free FROM allocation a LEFT JOIN rank r ON r.rank = a.rank"
              " WHERE a.level = " + std::to_string(int(AllocLevel::Segment)) +
                  " AND a.segment_id IS NULL AND a.source IN (" + kinds + ")");
    while (rows.step()) {
      Seg s{rows.i64(5), rows.i64(6), rows.i64(7), rows.i64(8),
            rows.is_null(9) ? std::numeric_limits<int64_t>::max() : rows.i64(9)};
      Key k{rows.i64(1), rows.i64(2), rows.i64(3), rows.i64(4)};
      bool from_cupti = Source(rows.i64(0)) == Source::Cupti;
      if (!from_cupti && twinned.count(s.id)) continue;
      (from_cupti ? cupti : api)[k].push_back(s);
      ++(from_cupti ? out.cupti_segments : out.api_segments);
    }
    Stmt pair(db, "UPDATE allocation SET segment_id = ?1, rank = ?2, device_id = ?3 WHERE id = ?4");
    for (auto& [key, drivers] : cupti) {
      auto it = api.find(key);
      if (it == api.end()) continue;
      std::vector<Seg>& ours = it->second;
      std::vector<bool> taken(ours.size(), false);
      std::sort(drivers.begin(), drivers.end(), [](const Seg& a, const Seg& b) {
        return std::tie(a.t_alloc, a.id) < std::tie(b.t_alloc, b.id);
      });
      for (const Seg& c : drivers) {
        size_t best = ours.size();
        int64_t best_gap = std::numeric_limits<int64_t>::max();
        for (size_t j = 0; j < ours.size(); ++j) {
          if (taken[j] || !overlap(c, ours[j])) continue;
          int64_t gap = std::llabs(c.t_alloc - ours[j].t_alloc);
          if (gap < best_gap) best = j, best_gap = gap;
        }
        if (best == ours.size()) continue;
        taken[best] = true;
        pair.bind(1, ours[best].id).bind(2, ours[best].rank).bind(3, ours[best].device).bind(4, c.id).step_done();
        ++out.matched;
      }
    }
    exec(db, "COMMIT");
  } catch (...) {
    try {
      exec(db, "ROLLBACK");
    } catch (const SqlError&) {
      // SQLite already rolled back (an I/O error or a full disk): the first error is the story.
    }
    throw;
  }
  return out;
}

}  // namespace zt::db::detail
