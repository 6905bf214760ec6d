// zt db merge: per-rank traces into one. Ids are renumbered by offsets, strings re-interned
// by text, timestamps copied as they are (each rank's CLOCK_MONOTONIC stays its own).
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>

#include "sqlite.h"
#include "zt/db/export.h"
#include "zt/db/trace_reader.h"
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
  std::map<int64_t, std::string> rank_owner;
  std::set<std::string> seen;
  for (const auto& in : inputs) {
    if (in == out_path) return Status::Error(in + ": is both an input and the output of the merge");
    if (!seen.insert(in).second) return Status::Error(in + ": given twice");
    std::unique_ptr<TraceReader> r;
    if (Status s = TraceReader::open(in, &r); !s) return s;
    std::vector<RankRow> ranks;
    if (Status s = r->read(&ranks); !s) return s;
    for (auto& rk : ranks) {
      auto [it, fresh] = rank_owner.emplace(rk.rank, in);
      if (!fresh)
        return Status::Error("merge: rank " + std::to_string(rk.rank) + " appears in both " + it->second + " and " +
                             in + "; ranks must be kept apart");
    }
  }

  std::string tmp = out_path + ".merging";
  std::unique_ptr<TraceWriter> w;
  if (Status s = TraceWriter::create(tmp, &w); !s) return s;
  sqlite3* db = w->handle();
  std::string current;
  try {
    for (const auto& in : inputs) {
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
      std::string sql =
          "INSERT INTO main.run SELECT id+" + o(run_off) +
          ", tool_version, command_line, config_json, seed, hostname, pid, t_start, t_end, wall_start_unix_ns, status,"
          " exit_code, exit_detail, coalesce(source_file, " + detail::sql_quote(in) + ") FROM src.run;"
          "INSERT INTO main.rank SELECT rank, run_id+" + o(run_off) + ", world_size, local_rank, hostname, pid FROM src.rank;"
          "INSERT INTO main.device SELECT id+" + o(dev_off) + ", rank, kind, ordinal, label, name, capacity_bytes, simulated FROM src.device;"
          "INSERT INTO main.frame(id,ip,module,module_offset,symbol,line) SELECT id+" + o(frame_off) +
          ", ip, module, module_offset, symbol, " + (src_lines ? "line" : "NULL") + " FROM src.frame;"
          "INSERT INTO main.stack SELECT id+" + o(stack_off) + ", parent_id+" + o(stack_off) + ", frame_id+" + o(frame_off) + " FROM src.stack;"
          "INSERT INTO main.allocation SELECT id+" + o(alloc_off) + ", rank, device_id+" + o(dev_off) +
          ", memory_kind, level, address, bytes, requested_bytes, t_alloc, t_free, " + S + "name_id), stack_id+" +
          o(stack_off) + ", source, segment_id+" + o(alloc_off) + ", stream, " +
          (src_weights ? "weight_bytes" : "NULL") + " FROM src.allocation;"
          "INSERT INTO main.transfer(rank,kind,bytes,src_device_id,dst_device_id,pinned,t_start,t_end,stream,name_id,"
          "op_id,participants,correlation_id,source,stack_id) SELECT rank, kind, bytes, src_device_id+" + o(dev_off) +
          ", dst_device_id+" + o(dev_off) + ", pinned, t_start, t_end, stream, " + S + "name_id), " + S +
          "op_id), participants, correlation_id, source, stack_id+" + o(stack_off) + " FROM src.transfer ORDER BY id;"
          "INSERT INTO main.kernel(rank,device_id,name_id,t_start,t_end,stream,correlation_id,grid,block,source)"
          " SELECT rank, device_id+" + o(dev_off) + ", " + S + "name_id), t_start, t_end, stream, correlation_id, grid,"
          " block, source FROM src.kernel ORDER BY id;"
          "INSERT INTO main.placement(rank,t,tensor_id,device_id,why,bytes,allocation_id) SELECT rank, t, " + S +
          "tensor_id), device_id+" + o(dev_off) + ", why, bytes, allocation_id+" + o(alloc_off) +
          " FROM src.placement ORDER BY id;"
          "INSERT INTO main.marker SELECT id+" + o(marker_off) + ", rank, kind, " + S +
          "name_id), t_start, t_end, step, micro_step, epoch, value FROM src.marker;"
          "INSERT INTO main.counter(rank,device_id,name_id,t,value) SELECT rank, device_id+" + o(dev_off) + ", " + S +
          "name_id), t, value FROM src.counter ORDER BY id;"
          "INSERT INTO main.fault(rank,t,name,trigger,step,details) SELECT rank, t, name, trigger, step, details"
          " FROM src.fault ORDER BY id;"
          "INSERT INTO main.error(rank,t,step,kind,site,message,tensors,device_id) SELECT rank, t, step, kind, site, message,"
          " tensors, device_id+" + o(dev_off) + " FROM src.error ORDER BY id;"
          "INSERT INTO main.dropped(rank,thread,t,events,reason) SELECT rank, thread, t, events, reason"
          " FROM src.dropped ORDER BY id;";
      exec(db, sql.c_str());
      w->commit();
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
