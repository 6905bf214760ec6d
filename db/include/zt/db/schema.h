// zt/db/schema.h: the event model, version 3. The one interface between modules.
//
// Every fact recorded by zerotrace is a row in one SQLite file. This header holds the
// codes stored in integer columns and the DDL; db/SCHEMA.md documents every column.
// Invariants:
//  - All times are nanoseconds of CLOCK_MONOTONIC on the recording host.
//  - A trace file carries PRAGMA application_id = kApplicationId and PRAGMA user_version =
//    kSchemaVersion; a reader takes kOldestReadableSchemaVersion..kSchemaVersion and refuses
//    anything else (an older zt so refuses a newer trace rather than misread it).
//  - Enum codes below are stable: a new kind gets a new code, old codes never change
//    meaning. Each enum also lives in a small table (enum_*) so SQL users can join names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zt::db {

// 1: the first. 2: counter.value may be NULL (a NaN, which SQLite cannot store; version 1 had
// NOT NULL and a NaN failed the write). Version 1 files read as version 2 ones. 3: aggregates
// (step_memory, epoch_live) and the spans that have full detail (detail_span): a trace whose
// detail stopped at a size cap has allocation rows only up to it, which an older reader would
// take for the whole run. Version 1 and 2 files read as traces with detail everywhere.
inline constexpr int kSchemaVersion = 3;
// The first version with the aggregate tables (step_memory, epoch_live, detail_span).
inline constexpr int kAggregatesSchemaVersion = 3;
inline constexpr int kOldestReadableSchemaVersion = 1;
inline bool schema_version_readable(int64_t v) { return v >= kOldestReadableSchemaVersion && v <= kSchemaVersion; }
// The refusal of a file written with another version: "PATH: written with trace schema version 3;
// this zt reads versions 1 to 2".
inline std::string schema_version_refusal(const std::string& path, int64_t v) {
  return path + ": written with trace schema version " + std::to_string(v) + "; this zt reads versions " +
         std::to_string(kOldestReadableSchemaVersion) + " to " + std::to_string(kSchemaVersion);
}
// "ZTRC" read as a big-endian integer: marks a file as a zerotrace trace.
inline constexpr int32_t kApplicationId = 0x5A545243;

// ModuleGlobal: a CUDA module's global variables (__device__ / __managed__: CUPTI's "device
// static" and "managed static" memory), set up by the driver as it loads a module (lazily, at a
// kernel's first launch: hundreds of 1-23 byte rows). Not the program's allocations: every
// count, sum and view leaves them out (kModuleGlobalSql) unless it asks for them.
enum class MemoryKind : uint8_t { Unknown = 0, Device = 1, PinnedHost = 2, PageableHost = 3, Managed = 4, ModuleGlobal = 5 };
inline constexpr const char* kModuleGlobalSql = "(memory_kind = 5)";
// Segment: memory obtained from the device or OS (cudaMalloc, cudaHostAlloc, mmap, malloc).
// Block: a piece an allocator carved out of a segment for one tensor.
enum class AllocLevel : uint8_t { Block = 0, Segment = 1 };
// Torch: PyTorch's caching allocator, from its own memory history (zt probe on a PyTorch program,
// zt import of a memory snapshot). Nsight Systems' CUPTI records import as Cupti.
enum class Source : uint8_t { Api = 0, Cupti = 1, HostHook = 2, Synthetic = 3, Torch = 4 };
// The allocators whose segments CUPTI's records of the same cudaMalloc pair with (db/src/match.h):
// the trainer's own (api) and PyTorch's (torch). SQL list for `source IN (...)`.
inline constexpr const char* kAllocatorSourcesSql = "0, 4";
inline bool is_allocator_source(Source s) { return s == Source::Api || s == Source::Torch; }
// An allocation row that is a second record of a segment recorded by another source (CUPTI's
// record of a cudaMalloc the trainer's allocator also recorded; the pairing is made when a
// trace is finished: db/src/match.h). Sums of live bytes skip these rows:
// `... WHERE NOT <kSecondRecordSql>`, or is_second_record() on a row already read.
inline constexpr const char* kSecondRecordSql = "(level = 1 AND segment_id IS NOT NULL)";
inline bool is_second_record(AllocLevel level, int64_t segment_id) {
  return level == AllocLevel::Segment && segment_id != 0;
}
// A sampled allocation row (allocation.weight_bytes set; SCHEMA.md, "Sampled rows"). Exact sums
// of live bytes (peaks, budgets) leave them out; estimates by site count them by their weight.
// Files written before the column have no sampled rows: TraceReader::sampled_sql() says "0".
inline constexpr const char* kSampledSql = "(weight_bytes IS NOT NULL)";
enum class TransferKind : uint8_t { H2D = 0, D2H = 1, D2D = 2, H2H = 3, P2P = 4, Collective = 5 };
enum class PlacementWhy : uint8_t { Created = 0, Moved = 1, Freed = 2 };
enum class MarkerKind : uint8_t { Step = 0, MicroStep = 1, Epoch = 2, Phase = 3, Range = 4 };
enum class DeviceKind : uint8_t { Cpu = 0, Cuda = 1, Sim = 2 };
enum class RunStatus : uint8_t { Running = 0, Ok = 1, Failed = 2, Signal = 3, Terminated = 4 };
// What a rank row stands for (rank.role). Rank: a rank of the job. Launcher: a process of the run
// that started ranks and is none itself (torchrun's agent, mpirun, srun, a shell). Helper: any
// other process of the run (a subprocess a rank or the launcher started, an image of a rank's
// process before it exec'd). A launcher's or helper's `rank` value is a key after the job's
// ranks, not a rank (db/SCHEMA.md).
// Worker: a process forked without exec by a process of the run (a DataLoader worker); its job rank
// is its parent's.
enum class RankRole : uint8_t { Rank = 0, Launcher = 1, Helper = 2, Worker = 3 };

std::string_view to_string(MemoryKind);
std::string_view to_string(AllocLevel);
std::string_view to_string(Source);
std::string_view to_string(TransferKind);
std::string_view to_string(PlacementWhy);
std::string_view to_string(MarkerKind);
std::string_view to_string(DeviceKind);
std::string_view to_string(RunStatus);
std::string_view to_string(RankRole);

std::optional<TransferKind> transfer_kind_from_string(std::string_view);
std::optional<MarkerKind> marker_kind_from_string(std::string_view);
std::optional<RunStatus> run_status_from_string(std::string_view);

// DDL that creates an empty version-1 trace: tables and enum tables. Indexes are separate
// (index_sql) because the writer builds them once at the end of a run: inserting into an
// indexed table costs several times more, and the hot path must not pay that.
const char* schema_sql();
const char* index_sql();
// The views (allocation_v, ...), part of schema_sql(). A reader defines them again as TEMP views
// from this text, so a query names ours whatever views the file itself carries.
const char* views_sql();
// The DDL of the aggregate tables alone (version 3: step_memory, epoch_live, detail_span).
const char* aggregate_tables_sql();

}  // namespace zt::db
