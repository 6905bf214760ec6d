// db/src/match.h: one memory, two records (private to db/; TraceWriter::finish calls it).
//
// A trace can hold the same cudaMalloc / cudaHostAlloc twice: once from the trainer's own
// allocators (source api: a named segment, with the blocks carved from it) and once from CUPTI
// (source cupti: the driver's view, with the stack of the API call), when `zt train --cupti`
// records both into one trace. match_driver_records() pairs them so that nothing is counted
// twice and what CUPTI saw outside the trainer's allocators (cuBLAS's workspace, NCCL's
// buffers, ...) stands out:
//  - Pairs: a CUPTI segment and an api segment of the same run (through `rank.run_id`), memory
//    kind, address and size, whose lifetimes overlap; one to one, each CUPTI row taking the api
//    row closest to it in allocation time. Unified virtual addressing makes an address unique
//    across a process's GPUs at any one time, so the device is not part of the key (and it
//    cannot be: the trainer labels a device by rank, CUPTI by GPU ordinal).
//  - The CUPTI row of a pair gets segment_id = the api row's id, and the api row's rank and
//    device (the trainer knows whose memory it is; CUPTI knows only the GPU). A segment row
//    with a segment_id is therefore "a second record of that segment": every sum of live
//    bytes skips it (kSecondRecordSql in zt/db/schema.h).
//  - Device rows equal in (rank, kind, ordinal, label) are one device (CUPTI adds "cuda:0"
//    for rank 0 beside the trainer's): every reference moves to the row that holds api
//    allocations (else the lowest id) and the others are deleted.
// Runs only when the trace has CUPTI and api allocation rows; never changes any other trace.
// Idempotent: rows already paired are left alone. A trace whose process was killed never
// reaches finish() and so keeps both records unpaired (summaries then count both).
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
