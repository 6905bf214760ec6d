// tests/fuzz/trace_mutator.h: hostile traces from a fuzzer's bytes. A small valid trace with
// rows in every table (two ranks, a GPU and the host each, steps, epochs, phases, every kind of
// transfer, kernels, counters, faults, errors, a stack) is written once; each input then edits
// a copy of it through SQL, value by value: a column of a row set to an integer (small, any,
// or one near a boundary: 2^31, 2^53, 2^62, INT64_MIN), a real, text, a blob or NULL; a row
// copied or deleted; a byte of the file flipped. So the readers meet the values a damaged or
// edited file can hold, in a file SQLite still opens.
#pragma once

#include <sqlite3.h>

#include <string>
#include <vector>

#include "fuzz_input.h"

namespace zt::fuzz {

struct Table {
  std::string name;
  std::vector<std::string> columns;
};

// The base trace's bytes (written on first use).
const std::string& base_trace();
// Writes the base trace edited as `in` says to `path`.
void write_mutated_trace(Input& in, const std::string& path);

// The same edits on any SQLite database (an Nsight Systems export, ...): `db_bytes`' tables
// `names` (all of them, by name, when empty) with their columns, then a copy of it edited at `path`.
std::vector<Table> tables_of(const std::string& db_bytes, std::vector<std::string> names = {});
void write_mutated_db(Input& in, const std::string& path, const std::string& base, const std::vector<Table>& tables);

}  // namespace zt::fuzz
