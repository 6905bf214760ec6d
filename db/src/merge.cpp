// zt db merge: per-rank traces into one. Ids are renumbered by offsets, strings re-interned
// by text, timestamps copied as they are (each rank's CLOCK_MONOTONIC stays its own).
// Ranks keep their numbers (a probed file's rank its job rank); two inputs with the same rank are
// refused. The keys of launchers and helpers (rank rows that are not ranks: rank.role) are
// renumbered after every rank of the inputs, in input order, so they never collide (db/SCHEMA.md,
// "rank").
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "sqlite.h"
#include "zt/db/export.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_values.h"
#include "zt/db/trace_writer.h"

namespace zt::db {
using detail::exec;
using detail::SqlError;

namespace {
int64_t max_id(sqlite3* db, const char* table) {
  return detail::query_int(db, (std::string("SELECT coalesce(max(id), 0) FROM main.") + table).c_str());
}
}  // namespace

Status merge_traces(const std::string& out_path, const std::vector<std::string>& inputs, bool overwrite) {
  if (inputs.empty()) return Status::Error("merge: no input traces given");
  if (!overwrite && ::access(out_path.c_str(), F_OK) == 0)
    return Status::Error(out_path + ": already exists; pass --force to replace it");
  // Validate every input and its ranks before writing anything.
  std::set<std::string> seen;
  std::vector<std::vector<RankRow>> input_ranks;
  for (const auto& in : inputs) {
    if (in == out_path) return Status::Error(in + ": is both an input and the output of the merge");
    if (!seen.insert(in).second) return Status::Error(in + ": given twice");
    std::unique_ptr<TraceReader> r;
    if (Status s = TraceReader::open(in, &r); !s) return s;
    std::vector<RankRow> ranks;
    if (Status s = r->read(&ranks); !s) return s;
    input_ranks.push_back(std::move(ranks));
  }
  // The rank rows as they will be. A rank is its job rank where it has one (a probed file zt probe
  // did not number keeps its rows under key 0 and says its job rank); where some input names job
  // ranks, the first process of a probed run that named none (key 0, world size 1, no job rank) is
  // that run's launcher, as zt probe would have recorded it.
  bool named = false;
  for (auto& ranks : input_ranks)
    for (auto& rk : ranks) named = named || (rk.role == RankRole::Rank && rk.job_rank);
  std::map<int64_t, std::pair<std::string, RankRow>> rank_owner;
  int64_t first_process_key = 0;  // after every rank (and every world size) of the inputs
  std::vector<std::vector<RankRow>> output_ranks = input_ranks;  // new key, role, job rank; old key in input_ranks
  for (size_t i = 0; i < inputs.size(); ++i)
    for (auto& rk : output_ranks[i]) {
      if (rk.role != RankRole::Rank) continue;
      if (rk.job_rank) {
        rk.rank = *rk.job_rank;
      } else if (named && rk.rank == 0 && rk.world_size == 1) {
        rk.role = RankRole::Launcher;
        continue;
      }
      first_process_key = std::max({first_process_key, rk.rank + 1, rk.world_size});
      auto [it, fresh] = rank_owner.emplace(rk.rank, std::make_pair(inputs[i], rk));
      if (!fresh) {
        auto who = [](const RankRow& x) {
          return "pid " + std::to_string(x.pid) + (x.hostname.empty() ? "" : " on " + x.hostname);
        };
        return Status::Error("merge: rank " + std::to_string(rk.rank) + " is in both " + it->second.first + " (" +
                             who(it->second.second) + ") and " + inputs[i] + " (" + who(rk) +
                             "): a job has one process per rank, so these are not traces of one job (or one of them "
                             "was renumbered by hand); merge each job's traces apart");
      }
    }
  // Launchers and helpers: new keys, in input order.
  int64_t next_key = first_process_key;
  for (auto& ranks : output_ranks)
    for (auto& rk : ranks)
      if (rk.role != RankRole::Rank) rk.rank = next_key++;
  if (next_key - 1 > kMaxTraceRank)
    return Status::Error(out_path + ": the merged trace would have rank keys past " + std::to_string(kMaxTraceRank) +
                         "; nothing written");

  std::string tmp = out_path + ".merging";
  std::unique_ptr<TraceWriter> w;
  if (Status s = TraceWriter::create(tmp, &w); !s) return s;
  sqlite3* db = w->handle();
  std::string current;
  try {
    for (size_t input = 0; input < inputs.size(); ++input) {
      const std::string& in = inputs[input];
      current = in;
      exec(db, ("ATTACH DATABASE " + detail::sql_quote(in) + " AS src;").c_str());
      w->begin();
      const int64_t run_off = max_id(db, "run"), dev_off = max_id(db, "device"), frame_off = max_id(db, "frame"),
                    stack_off = max_id(db, "stack"), alloc_off = max_id(db, "allocation"),
                    marker_off = max_id(db, "marker");
      auto o = [](int64_t v) { return std::to_string(v); };
      // Python frames' lines: files written before the column existed have none.
      const bool src_lines =
          detail::query_int(db, "SELECT count(*) FROM pragma_table_info('frame', 'src') WHERE name = 'line'") > 0;
      // Sampled rows' weights: files written before the column have no sampled rows.
      const bool src_weights =
          detail::query_int(db, "SELECT count(*) FROM pragma_table_info('allocation', 'src') WHERE name = 'weight_bytes'") > 0;
      exec(db, "INSERT OR IGNORE INTO main.string(text) SELECT text FROM src.string ORDER BY id;");
      exec(db, "DROP TABLE IF EXISTS temp.smap;");
      exec(db, "CREATE TEMP TABLE smap(old INTEGER PRIMARY KEY, new INTEGER NOT NULL);");
      exec(db, "INSERT INTO temp.smap SELECT s.id, m.id FROM src.string s JOIN main.string m ON m.text = s.text;");
      const std::string S = "(SELECT new FROM temp.smap WHERE old = ";
      // Rank columns: every key as mapped above (a rank to its job rank, launchers and helpers after the ranks).
      exec(db, "DROP TABLE IF EXISTS temp.rmap;");
      exec(db, "CREATE TEMP TABLE rmap(old INTEGER PRIMARY KEY, new INTEGER NOT NULL, role INTEGER NOT NULL, "
               "job_rank INTEGER);");
      for (size_t k = 0; k < input_ranks[input].size(); ++k) {
        const RankRow& to = output_ranks[input][k];
        exec(db, ("INSERT INTO temp.rmap VALUES (" + o(input_ranks[input][k].rank) + ", " + o(to.rank) + ", " +
                  o(int64_t(to.role)) + ", " + (to.job_rank ? o(*to.job_rank) : std::string("NULL")) + ");")
                     .c_str());
      }
      const std::string R = "coalesce((SELECT new FROM temp.rmap WHERE old = rank), rank)";
      std::string sql =
          "INSERT INTO main.run SELECT id+" + o(run_off) +
          ", tool_version, command_line, config_json, seed, hostname, pid, t_start, t_end, wall_start_unix_ns, status,"
          " exit_code, exit_detail, coalesce(source_file, " + detail::sql_quote(in) + ") FROM src.run;"
          "INSERT INTO main.rank(rank,run_id,world_size,local_rank,hostname,pid,role,job_rank) SELECT m.new, r.run_id+" +
          o(run_off) + ", r.world_size, r.local_rank, r.hostname, r.pid, m.role, m.job_rank FROM src.rank r"
          " JOIN temp.rmap m ON m.old = r.rank;"
          "INSERT INTO main.device SELECT id+" + o(dev_off) + ", " + R + ", kind, ordinal, label, name, capacity_bytes, simulated FROM src.device;"
          "INSERT INTO main.frame(id,ip,module,module_offset,symbol,line) SELECT id+" + o(frame_off) +
          ", ip, module, module_offset, symbol, " + (src_lines ? "line" : "NULL") + " FROM src.frame;"
          "INSERT INTO main.stack SELECT id+" + o(stack_off) + ", parent_id+" + o(stack_off) + ", frame_id+" + o(frame_off) + " FROM src.stack;"
          "INSERT INTO main.allocation SELECT id+" + o(alloc_off) + ", " + R + ", device_id+" + o(dev_off) +
          ", memory_kind, level, address, bytes, requested_bytes, t_alloc, t_free, " + S + "name_id), stack_id+" +
          o(stack_off) + ", source, segment_id+" + o(alloc_off) + ", stream, " +
          (src_weights ? "weight_bytes" : "NULL") + " FROM src.allocation;"
          "INSERT INTO main.transfer(rank,kind,bytes,src_device_id,dst_device_id,pinned,t_start,t_end,stream,name_id,"
          "op_id,participants,correlation_id,source,stack_id) SELECT " + R + ", kind, bytes, src_device_id+" + o(dev_off) +
          ", dst_device_id+" + o(dev_off) + ", pinned, t_start, t_end, stream, " + S + "name_id), " + S +
          "op_id), participants, correlation_id, source, stack_id+" + o(stack_off) + " FROM src.transfer ORDER BY id;"
          "INSERT INTO main.kernel(rank,device_id,name_id,t_start,t_end,stream,correlation_id,grid,block,source)"
          " SELECT " + R + ", device_id+" + o(dev_off) + ", " + S + "name_id), t_start, t_end, stream, correlation_id, grid,"
          " block, source FROM src.kernel ORDER BY id;"
          "INSERT INTO main.placement(rank,t,tensor_id,device_id,why,bytes,allocation_id) SELECT " + R + ", t, " + S +
          "tensor_id), device_id+" + o(dev_off) + ", why, bytes, allocation_id+" + o(alloc_off) +
          " FROM src.placement ORDER BY id;"
          "INSERT INTO main.marker SELECT id+" + o(marker_off) + ", " + R + ", kind, " + S +
          "name_id), t_start, t_end, step, micro_step, epoch, value FROM src.marker;"
          "INSERT INTO main.counter(rank,device_id,name_id,t,value) SELECT " + R + ", device_id+" + o(dev_off) + ", " + S +
          "name_id), t, value FROM src.counter ORDER BY id;"
          "INSERT INTO main.fault(rank,t,name,trigger,step,details) SELECT " + R + ", t, name, trigger, step, details"
          " FROM src.fault ORDER BY id;"
          "INSERT INTO main.error(rank,t,step,kind,site,message,tensors,device_id) SELECT " + R + ", t, step, kind, site, message,"
          " tensors, device_id+" + o(dev_off) + " FROM src.error ORDER BY id;"
          "INSERT INTO main.dropped(rank,thread,t,events,reason) SELECT " + R + ", thread, t, events, reason"
          " FROM src.dropped ORDER BY id;";
      exec(db, sql.c_str());
      // The aggregates (version 3 on); an older input has none, its detail covering its run.
      if (detail::query_int(db, "SELECT count(*) FROM src.sqlite_schema WHERE type = 'table' AND name = 'detail_span'") > 0) {
        const std::string agg =
            "INSERT INTO main.step_memory(rank,device_id,step,epoch,t_start,t_end,allocated_bytes,reserved_bytes,"
            "peak_allocated_bytes,peak_reserved_bytes,host_rss_bytes) SELECT " + R + ", device_id+" + o(dev_off) +
            ", step, epoch, t_start, t_end, allocated_bytes, reserved_bytes, peak_allocated_bytes, peak_reserved_bytes,"
            " host_rss_bytes FROM src.step_memory ORDER BY id;"
            "INSERT INTO main.epoch_live(rank,epoch,at,t,device_id,memory_kind,level,name_id,stack_id,bytes,allocations,"
            "sampled,sampled_variance) SELECT " + R + ", epoch, at, t, device_id+" + o(dev_off) + ", memory_kind, level, " +
            S + "name_id), stack_id+" + o(stack_off) + ", bytes, allocations, sampled, sampled_variance"
            " FROM src.epoch_live ORDER BY id;"
            "INSERT INTO main.detail_span(rank,t_start,t_end,end_reason) SELECT " + R + ", t_start, t_end, end_reason"
            " FROM src.detail_span ORDER BY id;";
        exec(db, agg.c_str());
      }
      w->commit();
      if (Status s = w->status(); !s) throw SqlError(0, s.message());
      exec(db, "DETACH DATABASE src;");
    }
    w->begin();
    w->set_meta("merged_from", std::to_string(inputs.size()) + " traces");
    w->commit();
  } catch (const SqlError& e) {
    w.reset();
    for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((tmp + suffix).c_str());
    return Status::Error("merge: failed while copying " + current + ": " + e.what());
  }
  if (Status s = w->finish(); !s) {
    w.reset();
    ::unlink(tmp.c_str());
    return s;
  }
  w.reset();
  // Each input kept the rules; their union may not (device ids past 2^31 once offset, sums past
  // 2^62): the merged file is checked as a reader would before it replaces anything.
  {
    std::unique_ptr<TraceReader> check;
    if (Status s = TraceReader::open(tmp, &check); !s) {
      check.reset();
      ::unlink(tmp.c_str());
      std::string why = s.message();
      if (why.rfind(tmp + ": ", 0) == 0) why = why.substr(tmp.size() + 2);
      return Status::Error(out_path + ": the merged trace would break a rule of db/SCHEMA.md (" + why + "); nothing written");
    }
  }
  if (std::rename(tmp.c_str(), out_path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status::Error(out_path + ": cannot move the merged trace into place");
  }
  return Status::Ok();
}

}  // namespace zt::db
