// zt/db/pickle.h: Python's pickle format, restricted to plain data, read and written.
//
// Owns: a reader that accepts only what a PyTorch memory snapshot holds (dict, list, tuple, str,
// int, float, bool, None, bytes) and a writer of the same. A pickle is a program for a small stack
// machine; Python's own reader will import modules and call functions a file names (GLOBAL,
// STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, ...), so a snapshot from someone else could run
// code. This reader knows no such opcode: it refuses them (and every other opcode outside the
// list in pickle.cpp) with the byte offset, and never runs or imports anything.
// Invariants of a parsed Value tree:
//  - It is acyclic and at most Limits::max_depth containers deep: a container can only be changed
//    while it is being built (until it is put into another container or fetched from the memo),
//    so no file can make a list contain itself; destroying or walking a tree never recurses deeper.
//  - Sharing is kept as the file says (one frames list memoized and fetched a thousand times is one
//    Value), so a walker that follows every reference must bound its own work.
//  - Strings are valid UTF-8 (invalid sequences, e.g. lone surrogates, read as U+FFFD).
//  - Ints beyond int64 are kind BigInt with their value rounded to a double.
// parse() is the fuzzing entry point: any bytes give a Value or one line saying what is wrong, in
// time and memory linear in the input.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zt::db::pickle {

enum class Kind : uint8_t { None, Bool, Int, BigInt, Float, Str, Bytes, List, Tuple, Dict };

struct Value;
using ValuePtr = std::shared_ptr<const Value>;

struct Value {
  Kind kind = Kind::None;
  int64_t integer = 0;  // Int; Bool (0 or 1)
  double real = 0;      // Float; BigInt (rounded)
  std::string text;     // Str (UTF-8), Bytes
  std::vector<ValuePtr> items;                          // List, Tuple
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;  // Dict, in the file's order (a repeated key: the last wins)
  uint32_t depth = 0;  // containers nested below and including this one (0 for a scalar)

  bool is_int() const { return kind == Kind::Int || kind == Kind::Bool; }
  bool is_str() const { return kind == Kind::Str; }
  bool is_list() const { return kind == Kind::List || kind == Kind::Tuple; }
  bool is_dict() const { return kind == Kind::Dict; }
  // The value of str key `key` in a dict (the last one when repeated); null when absent or not a dict.
  const Value* get(std::string_view key) const;
  // "dict", "list", "str", ... for messages.
  const char* kind_name() const;
};

struct Limits {
  uint32_t max_depth = 64;  // containers inside containers (a snapshot needs 7)
};

struct Result {
  ValuePtr value;       // null when the bytes were refused
  std::string error;    // one line: "byte 812: opcode GLOBAL ('c') would import os.system ..."
  size_t offset = 0;    // where the reader stopped
  bool ok() const { return value != nullptr; }
};

// Reads one pickle from `bytes`. Bytes after the STOP opcode are ignored, as Python does.
Result parse(std::string_view bytes, const Limits& limits = {});

// Writes a pickle (protocol 2, the opcodes Python's pickle.load and PyTorch's memory_viz both
// read) into a string. Containers are opened and closed in order; inside a dict, calls alternate
// key, value. Strings are memoized (a repeated key or file name costs a few bytes); a container may
// be memoized with remember() right after it is opened and written again with recall().
class Writer {
 public:
  explicit Writer(std::string* out);
  void none();
  void boolean(bool v);
  void integer(int64_t v);
  void real(double v);
  void str(std::string_view v);
  void begin_list();
  void end_list();
  void begin_dict();
  void end_dict();
  void begin_tuple();
  void end_tuple();
  // The container just opened, memoized: its memo index, for recall().
  uint32_t remember();
  void recall(uint32_t memo_index);
  // Ends the pickle; nothing may be written after.
  void stop();

 private:
  void value_written();
  void put_memo(uint32_t index);
  std::string* out_;
  struct Open {
    char kind;          // 'l' list, 'd' dict, 't' tuple
    uint32_t batch = 0;  // items (dict: keys and values) since the last MARK
  };
  std::vector<Open> open_;
  uint32_t next_memo_ = 0;
  std::map<std::string, uint32_t, std::less<>> strings_;
};

}  // namespace zt::db::pickle
