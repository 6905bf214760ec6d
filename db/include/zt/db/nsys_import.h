// zt/db/nsys_import.h: Nsight Systems' SQLite export (`nsys export --type sqlite`) into a trace.
//
// What becomes what (table and column names as nsys writes them; a table or column a given nsys
// version lacks is left out, never guessed):
//  CUDA_GPU_MEMORY_USAGE_EVENTS   allocation rows (source cupti): an Allocation and the next
//                                 Deallocation of the same process and address make one row;
//                                 memory from a stream-ordered pool (localMemoryPoolAddress) is a
//                                 block, the rest segments; `name` (a variable's) names it.
//  CUPTI_ACTIVITY_KIND_MEMCPY     transfer rows (copyKind, srcKind/dstKind for pinned or pageable,
//                                 srcDeviceId/dstDeviceId for peer copies, streamId, correlationId).
//  CUPTI_ACTIVITY_KIND_MEMSET     kernel rows named "memset N B" (as zt probe writes them).
//  CUPTI_ACTIVITY_KIND_KERNEL     kernel rows (demangledName through StringIds, grid and block).
//  NVTX_EVENTS                    range markers: push/pop and start/end ranges, marks as instants
//                                 (text, else textId through StringIds).
//  TARGET_INFO_GPU                device names and memory; TARGET_INFO_SESSION_START_TIME (utcEpochNs)
//                                 anchors the run to Unix time; ANALYSIS_DETAILS its start and stop.
// Nsight renumbers CUPTI's enums (its memory kinds start at 0 = pageable): the file's own
// ENUM_CUDA_MEM_KIND, ENUM_CUDA_MEMCPY_OPER, ENUM_CUDA_DEV_MEM_EVENT_OPER and ENUM_NSYS_EVENT_TYPE
// tables are read by their symbol names, and their documented codes used where a table is missing.
// Each process (globalPid / globalTid: PID = (id >> 24) & 0xFFFFFF) is a rank, in PID order. Times
// stay nsys's nanoseconds.
#pragma once

#include <cstdint>
#include <string>

#include "zt/common/status.h"

namespace zt::db {

struct NsysImportStats {
  int64_t processes = 0, devices = 0;
  int64_t allocations = 0, frees_unmatched = 0;
  int64_t transfers = 0, kernels = 0, memsets = 0, ranges = 0, marks = 0;
};

// True when `path` is an SQLite file whose tables are an Nsight Systems export's. Never throws; a
// file that is not SQLite is false.
bool is_nsys_export(const std::string& path);

// The export at `nsys_path` -> a new trace at `trace_path` (beside it, renamed into place: a bad
// file leaves nothing). A file that is not an Nsight Systems export is refused, one line.
Status import_nsys_export(const std::string& nsys_path, const std::string& trace_path, NsysImportStats* stats = nullptr);

}  // namespace zt::db
