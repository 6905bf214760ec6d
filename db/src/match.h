// db/src/match.h: one memory, two records (private to db/; TraceWriter::finish calls it).
//
// A trace can hold the same cudaMalloc / cudaHostAlloc twice: once from the trainer's own
// allocators (source api: a named segment, with the blocks carved from it) and once from CUPTI
// (source cupti: the driver's view, with the stack of the API call), when `zt train --cupti`
// records both into one trace. match_driver_records() pairs them so that nothing is counted
// twice and what CUPTI saw outside the trainer's allocators (NCCL's buffers, CUDA libraries'
// own memory, ...) stands out:
//  - PyTorch's segments (source torch: its caching allocator's own history, merged by zt probe)
//    pair with CUPTI's records exactly as the trainer's do; "api" below means either. Devices fold
//    only for the trainer's rows (PyTorch's rows are written on CUPTI's device rows already).
//  - Pairs: a CUPTI segment and an api segment of the same run (through `rank.run_id`), memory
//    kind, address and size, whose lifetimes overlap; one to one, each CUPTI row taking the api
//    row closest to it in allocation time. Unified virtual addressing makes an address unique
//    across a process's GPUs at any one time, so the device is not part of the key (and it
//    cannot be: the trainer labels a device by rank, CUPTI by GPU ordinal).
//  - The CUPTI row of a pair gets segment_id = the api row's id, and the api row's rank and
//    device (the trainer knows whose memory it is; CUPTI knows only the GPU). A segment row
//    with a segment_id is therefore "a second record of that segment": every sum of live
//    bytes skips it (kSecondRecordSql in zt/db/schema.h).
//  - CUPTI's device rows are the trainer's devices seen again: rows equal in (rank, kind,
//    ordinal, label) fold into the one holding api allocations (else the lowest id), and per
//    rank, one CUDA device with the trainer's allocations and one other CUDA device without any
//    fold into one (CUPTI names a GPU by its visible ordinal, the trainer by rank).
// Pairing runs only when the trace has CUPTI and api allocation rows. In any trace, a device row
// nothing refers to that equals another row is folded into it (nothing else changes).
// Idempotent: rows already paired, on either side, are left alone. A trace whose process was
// killed never reaches finish() and so keeps both records unpaired (summaries then count both).
#pragma once

#include <cstdint>

struct sqlite3;

namespace zt::db::detail {

struct MatchStats {
  int64_t cupti_segments = 0;  // CUPTI segment rows considered (unpaired before this call)
  int64_t api_segments = 0;    // api segment rows considered
  int64_t matched = 0;         // pairs made
  int64_t devices_merged = 0;  // duplicate device rows removed
};

// Throws SqlError. Call inside no transaction (it opens its own).
MatchStats match_driver_records(sqlite3* db);

}  // namespace zt::db::detail
