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

#include "fuzz_input.h"

namespace zt::fuzz {

// The base trace's bytes (written on first use).
const std::string& base_trace();
// Writes the base trace edited as `in` says to `path`.
void write_mutated_trace(Input& in, const std::string& path);

}  // namespace zt::fuzz
