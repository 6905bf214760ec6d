// One memory, two records: see match.h for the rules.
#include "match.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include "sqlite.h"
#include "zt/db/schema.h"

namespace zt::db::detail {
namespace {

struct Seg {
  int64_t id, rank, device, t_alloc, t_free;  // t_free: INT64_MAX while alive at the end
};

bool overlap(const Seg& a, const Seg& b) { return a.t_alloc <= b.t_free && b.t_alloc <= a.t_free; }

// Device rows equal in (rank, kind, ordinal, label): references move to the row that holds
// api allocations (else the lowest id); the others go.
int64_t merge_duplicate_devices(sqlite3* db) {
  std::vector<std::pair<int64_t, int64_t>> moves;  // (from, to)
  Stmt dup(db,
           "SELECT d.id, (SELECT k.id FROM device k WHERE k.rank = d.rank AND k.kind = d.kind AND"
           " k.ordinal IS d.ordinal AND k.label IS d.label ORDER BY EXISTS(SELECT 1 FROM allocation a WHERE"
           " a.device_id = k.id AND a.source = 0) DESC, k.id LIMIT 1) FROM device d");
  while (dup.step())
    if (dup.i64(0) != dup.i64(1)) moves.emplace_back(dup.i64(0), dup.i64(1));
  if (moves.empty()) return 0;
  const char* updates[] = {
      "UPDATE allocation SET device_id = ?2 WHERE device_id = ?1",
      "UPDATE transfer SET src_device_id = ?2 WHERE src_device_id = ?1",
      "UPDATE transfer SET dst_device_id = ?2 WHERE dst_device_id = ?1",
      "UPDATE kernel SET device_id = ?2 WHERE device_id = ?1",
      "UPDATE placement SET device_id = ?2 WHERE device_id = ?1",
      "UPDATE counter SET device_id = ?2 WHERE device_id = ?1",
      "UPDATE error SET device_id = ?2 WHERE device_id = ?1",
      "DELETE FROM device WHERE id = ?1 AND ?2 IS NOT NULL",
  };
  for (const char* sql : updates) {
    Stmt st(db, sql);
    for (auto [from, to] : moves) st.bind(1, from).bind(2, to).step_done();
  }
  return int64_t(moves.size());
}

}  // namespace

MatchStats match_driver_records(sqlite3* db) {
  MatchStats out;
  const std::string kinds = std::to_string(int(Source::Api)) + ", " + std::to_string(int(Source::Cupti));
  // Cheap test first: most traces have only one of the two sources (EXISTS stops at the first
  // row; a trace without CUPTI rows costs one scan of the allocation table, no sort).
  if (query_int(db, ("SELECT EXISTS(SELECT 1 FROM allocation WHERE source = " + std::to_string(int(Source::Cupti)) +
                     ") AND EXISTS(SELECT 1 FROM allocation WHERE source = " + std::to_string(int(Source::Api)) + ")")
                        .c_str()) == 0)
    return out;

  exec(db, "BEGIN");
  try {
    out.devices_merged = merge_duplicate_devices(db);
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
    exec(db, "ROLLBACK");
    throw;
  }
  return out;
}

}  // namespace zt::db::detail
