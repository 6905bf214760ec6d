// The restricted pickle reader and the writer: see zt/db/pickle.h.
//
// Opcodes read (Python's names, pickletools): PROTO, FRAME, STOP, NONE, NEWTRUE, NEWFALSE, BININT,
// BININT1, BININT2, LONG1, LONG4, BINFLOAT, SHORT_BINUNICODE, BINUNICODE, BINUNICODE8,
// SHORT_BINBYTES, BINBYTES, BINBYTES8, EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE, MARK, LIST, DICT, TUPLE,
// TUPLE1, TUPLE2, TUPLE3, APPEND, APPENDS, SETITEM, SETITEMS, POP, POP_MARK, BINPUT, LONG_BINPUT,
// MEMOIZE, BINGET, LONG_BINGET. That is what Python's pickler (protocols 2 to 5) and PyTorch's C++
// pickler write for dicts, lists, tuples, strings, numbers, bools and None. Everything else is
// refused, naming the opcode: those that load or call code (GLOBAL, STACK_GLOBAL, REDUCE, BUILD,
// INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4, PERSID, BINPERSID), the types a snapshot never holds
// (sets, bytearrays, out-of-band buffers, Python 2 strings) and protocol 0's text opcodes.
#include "zt/db/pickle.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

namespace zt::db::pickle {

const Value* Value::get(std::string_view key) const {
  if (kind != Kind::Dict) return nullptr;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it)
    if (it->first->kind == Kind::Str && it->first->text == key) return it->second.get();
  return nullptr;
}

const char* Value::kind_name() const {
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::BigInt: return "int";
    case Kind::Float: return "float";
    case Kind::Str: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::List: return "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
  }
  return "?";
}

namespace {

using Mut = std::shared_ptr<Value>;

// Invalid UTF-8 (overlong forms, surrogates, truncated sequences) becomes U+FFFD, so every string
// in a trace is text that SQLite, JSON and the viewer take as it is.
std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += char(c);
      ++i;
      continue;
    }
    const int n = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    bool ok = n > 0 && i + size_t(n) < s.size();  // the continuation bytes i+1 .. i+n are there
    uint32_t cp = 0;
    if (ok) {
      cp = c & (n == 1 ? 0x1F : n == 2 ? 0x0F : 0x07);
      for (int k = 1; k <= n; ++k) {
        const auto d = static_cast<unsigned char>(s[i + size_t(k)]);
        if ((d & 0xC0) != 0x80) {
          ok = false;
          break;
        }
        cp = (cp << 6) | (d & 0x3F);
      }
    }
    if (ok) ok = !(n == 2 && cp < 0x800) && !(n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) &&
                 !(cp >= 0xD800 && cp <= 0xDFFF);
    if (ok) {
      out.append(s.substr(i, size_t(n) + 1));
      i += size_t(n) + 1;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

const char* refused_name(unsigned char op) {
  switch (op) {
    case 'c': return "GLOBAL";
    case 0x93: return "STACK_GLOBAL";
    case 'R': return "REDUCE";
    case 'b': return "BUILD";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    case 'U': return "SHORT_BINSTRING";
    case 'T': return "BINSTRING";
    case 'I': return "INT";
    case 'L': return "LONG";
    case 'F': return "FLOAT";
    case 'S': return "STRING";
    case 'V': return "UNICODE";
    case 'p': return "PUT";
    case 'g': return "GET";
    case '2': return "DUP";
    default: return nullptr;
  }
}

bool loads_code(unsigned char op) {
  return op == 'c' || op == 0x93 || op == 'R' || op == 'b' || op == 'i' || op == 'o' || op == 0x81 || op == 0x92 ||
         op == 0x82 || op == 0x83 || op == 0x84 || op == 'P' || op == 'Q';
}

class Reader {
 public:
  Reader(std::string_view bytes, const Limits& limits) : b_(bytes), limits_(limits) {}

  Result run() {
    Result r;
    Mut v = loop();
    r.offset = pos_;
    if (v) r.value = std::move(v);
    else r.error = error_;
    return r;
  }

 private:
  Mut loop() {
    while (true) {
      if (pos_ >= b_.size())
        return fail(b_.empty() ? "empty: not a pickle" : "the file ends before the pickle's STOP opcode: truncated");
      op_at_ = pos_;
      const auto op = static_cast<unsigned char>(b_[pos_++]);
      switch (op) {
        case 0x80: {  // PROTO
          uint64_t v;
          if (!read_uint(1, &v)) return nullptr;
          if (v < 2 || v > 5) return fail("pickle protocol " + std::to_string(v) + " (this reader takes 2 to 5)");
          break;
        }
        case 0x95: {  // FRAME: a length prefix for the next opcodes; nothing to do with it
          uint64_t v;
          if (!read_uint(8, &v)) return nullptr;
          break;
        }
        case '.': {  // STOP
          if (avail() < 1) return fail("STOP with nothing to return");
          return stack_.back();
        }
        case 'N': push(scalar(Kind::None)); break;
        case 0x88: push(boolean(true)); break;
        case 0x89: push(boolean(false)); break;
        case 'J': {
          uint64_t v;
          if (!read_uint(4, &v)) return nullptr;
          push(integer(int64_t(int32_t(uint32_t(v)))));
          break;
        }
        case 'K': {
          uint64_t v;
          if (!read_uint(1, &v)) return nullptr;
          push(integer(int64_t(v)));
          break;
        }
        case 'M': {
          uint64_t v;
          if (!read_uint(2, &v)) return nullptr;
          push(integer(int64_t(v)));
          break;
        }
        case 0x8a:    // LONG1
        case 0x8b: {  // LONG4
          uint64_t n;
          if (!read_uint(op == 0x8a ? 1 : 4, &n)) return nullptr;
          if (op == 0x8b && int32_t(uint32_t(n)) < 0) return fail("LONG4 with a negative length");
          if (n > 4096) return fail("an integer of " + std::to_string(n) + " bytes");
          if (!need(n)) return nullptr;
          push(long_int(b_.substr(pos_, n)));
          pos_ += n;
          break;
        }
        case 'G': {  // BINFLOAT, big-endian IEEE 754
          uint64_t bits = 0;
          if (!need(8)) return nullptr;
          for (int k = 0; k < 8; ++k) bits = (bits << 8) | static_cast<unsigned char>(b_[pos_ + size_t(k)]);
          pos_ += 8;
          double d;
          std::memcpy(&d, &bits, 8);
          Mut v = scalar(Kind::Float);
          v->real = d;
          push(v);
          break;
        }
        case 0x8c: case 'X': case 0x8d:   // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
        case 'C': case 'B': case 0x8e: {  // SHORT_BINBYTES, BINBYTES, BINBYTES8
          const bool text = op == 0x8c || op == 'X' || op == 0x8d;
          const int width = op == 0x8c || op == 'C' ? 1 : op == 'X' || op == 'B' ? 4 : 8;
          uint64_t n;
          if (!read_uint(width, &n)) return nullptr;
          if (!need(n)) return nullptr;
          Mut v = scalar(text ? Kind::Str : Kind::Bytes);
          v->text = text ? sanitize_utf8(b_.substr(pos_, n)) : std::string(b_.substr(pos_, n));
          pos_ += n;
          push(v);
          break;
        }
        case ']': push(container(Kind::List)); break;
        case '}': push(container(Kind::Dict)); break;
        case ')': push(container(Kind::Tuple)); break;
        case '(': marks_.push_back(stack_.size()); break;
        case 'l': case 't': case 'd': {  // LIST, TUPLE, DICT from the items since the mark
          std::vector<Mut> items;
          if (!pop_mark(&items)) return nullptr;
          Mut c = container(op == 'l' ? Kind::List : op == 't' ? Kind::Tuple : Kind::Dict);
          if (op == 'd') {
            if (!set_items(c, items)) return nullptr;
          } else {
            for (auto& it : items)
              if (!add_item(c, it)) return nullptr;
          }
          push(c);
          break;
        }
        case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
          const size_t n = size_t(op - 0x84);
          if (avail() < n) return fail("TUPLE" + std::to_string(n) + " needs " + std::to_string(n) + " values");
          Mut c = container(Kind::Tuple);
          std::vector<Mut> items(stack_.end() - long(n), stack_.end());
          stack_.resize(stack_.size() - n);
          for (auto& it : items)
            if (!add_item(c, it)) return nullptr;
          push(c);
          break;
        }
        case 'a': {  // APPEND
          if (avail() < 2) return fail("APPEND needs a list and a value");
          Mut item = stack_.back();
          stack_.pop_back();
          Mut& list = stack_.back();
          if (!mutable_target(list, Kind::List, "APPEND") || !add_item(list, item)) return nullptr;
          break;
        }
        case 'e': {  // APPENDS
          std::vector<Mut> items;
          if (!pop_mark(&items)) return nullptr;
          if (avail() < 1) return fail("APPENDS without a list below its mark");
          Mut& list = stack_.back();
          if (!mutable_target(list, Kind::List, "APPENDS")) return nullptr;
          for (auto& it : items)
            if (!add_item(list, it)) return nullptr;
          break;
        }
        case 's': {  // SETITEM
          if (avail() < 3) return fail("SETITEM needs a dict, a key and a value");
          std::vector<Mut> kv(stack_.end() - 2, stack_.end());
          stack_.resize(stack_.size() - 2);
          Mut& dict = stack_.back();
          if (!mutable_target(dict, Kind::Dict, "SETITEM") || !set_items(dict, kv)) return nullptr;
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<Mut> items;
          if (!pop_mark(&items)) return nullptr;
          if (avail() < 1) return fail("SETITEMS without a dict below its mark");
          Mut& dict = stack_.back();
          if (!mutable_target(dict, Kind::Dict, "SETITEMS") || !set_items(dict, items)) return nullptr;
          break;
        }
        case '0': {  // POP (a mark when the stack above it is empty, as Python does)
          if (avail() > 0) stack_.pop_back();
          else {
            std::vector<Mut> items;
            if (!pop_mark(&items)) return nullptr;
          }
          break;
        }
        case '1': {  // POP_MARK
          std::vector<Mut> items;
          if (!pop_mark(&items)) return nullptr;
          break;
        }
        case 'q': case 'r': {  // BINPUT, LONG_BINPUT
          uint64_t idx;
          if (!read_uint(op == 'q' ? 1 : 4, &idx)) return nullptr;
          if (avail() < 1) return fail("BINPUT with nothing to memoize");
          memo_[idx] = stack_.back();
          break;
        }
        case 0x94: {  // MEMOIZE
          if (avail() < 1) return fail("MEMOIZE with nothing to memoize");
          const uint64_t idx = memo_.size();
          memo_[idx] = stack_.back();
          break;
        }
        case 'h': case 'j': {  // BINGET, LONG_BINGET
          uint64_t idx;
          if (!read_uint(op == 'h' ? 1 : 4, &idx)) return nullptr;
          auto it = memo_.find(idx);
          if (it == memo_.end()) return fail("BINGET of memo entry " + std::to_string(idx) + ", which was never stored");
          frozen_.insert(it->second.get());  // shared from now on: never changed again
          push(it->second);
          break;
        }
        default: return refuse(op);
      }
    }
  }

  Mut refuse(unsigned char op) {
    const char* name = refused_name(op);
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", op);
    if (!name) return fail(std::string("unknown opcode ") + hex + ": not a pickle, or a damaged one");
    std::string what = std::string("opcode ") + name + " (" + hex + ")";
    if (loads_code(op)) {
      std::string target = code_target(op);
      return fail(what + (target.empty() ? " would load or call Python code" : " would import " + target) +
                  "; a memory snapshot holds only dicts, lists, strings and numbers, so this file is refused and "
                  "nothing in it was run");
    }
    return fail(what + ": a type or an encoding a memory snapshot never holds (this reader takes dict, list, "
                       "tuple, str, int, float, bool, None and bytes, pickle protocols 2 to 5)");
  }

  // What a GLOBAL or STACK_GLOBAL names, for the message ("os.system").
  std::string code_target(unsigned char op) {
    auto printable = [](std::string_view s) {
      std::string out;
      for (char c : s.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
      return out;
    };
    if (op == 'c') {
      size_t nl1 = b_.find('\n', pos_);
      if (nl1 == std::string_view::npos || nl1 - pos_ > 200) return "";
      size_t nl2 = b_.find('\n', nl1 + 1);
      if (nl2 == std::string_view::npos || nl2 - nl1 > 200) return "";
      return printable(b_.substr(pos_, nl1 - pos_)) + "." + printable(b_.substr(nl1 + 1, nl2 - nl1 - 1));
    }
    if (op == 0x93 && avail() >= 2 && stack_[stack_.size() - 2]->kind == Kind::Str && stack_.back()->kind == Kind::Str)
      return printable(stack_[stack_.size() - 2]->text) + "." + printable(stack_.back()->text);
    return "";
  }

  Mut fail(const std::string& msg) {
    if (error_.empty()) error_ = "byte " + std::to_string(op_at_) + ": " + msg;
    return nullptr;
  }

  bool need(uint64_t n) {
    if (n > b_.size() - pos_) {
      fail("the file ends inside an opcode's argument: truncated");
      return false;
    }
    return true;
  }

  bool read_uint(int width, uint64_t* v) {
    if (!need(uint64_t(width))) return false;
    uint64_t x = 0;
    for (int k = width - 1; k >= 0; --k) x = (x << 8) | static_cast<unsigned char>(b_[pos_ + size_t(k)]);
    pos_ += size_t(width);
    *v = x;
    return true;
  }

  size_t avail() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }

  void push(Mut v) { stack_.push_back(std::move(v)); }

  static Mut scalar(Kind k) {
    Mut v = std::make_shared<Value>();
    v->kind = k;
    return v;
  }
  static Mut boolean(bool b) {
    Mut v = scalar(Kind::Bool);
    v->integer = b ? 1 : 0;
    return v;
  }
  static Mut integer(int64_t i) {
    Mut v = scalar(Kind::Int);
    v->integer = i;
    return v;
  }
  static Mut container(Kind k) {
    Mut v = scalar(k);
    v->depth = 1;
    return v;
  }

  // Little-endian two's complement, as LONG1/LONG4 store it.
  static Mut long_int(std::string_view bytes) {
    const size_t n = bytes.size();
    if (n == 0) return integer(0);
    const bool negative = static_cast<unsigned char>(bytes[n - 1]) & 0x80;
    if (n <= 8) {
      uint64_t x = negative ? ~uint64_t(0) : 0;
      for (size_t k = 0; k < n; ++k) {
        x &= ~(uint64_t(0xff) << (8 * k));
        x |= uint64_t(static_cast<unsigned char>(bytes[k])) << (8 * k);
      }
      return integer(int64_t(x));
    }
    // Beyond 8 bytes it may still fit (a size_t such as SIZE_MAX is written in 9 bytes, its top
    // byte 0); either way the double is kept.
    double d = 0;
    for (size_t k = n; k-- > 0;) {
      auto byte = static_cast<unsigned char>(bytes[k]);
      d = d * 256.0 + double(negative ? uint8_t(~byte) : byte);
    }
    if (negative) d = -(d + 1.0);
    Mut v = scalar(Kind::BigInt);
    v->real = d;
    bool fits = true;
    for (size_t k = 8; k < n; ++k) fits = fits && static_cast<unsigned char>(bytes[k]) == (negative ? 0xff : 0x00);
    const bool top_ok = negative == bool(static_cast<unsigned char>(bytes[7]) & 0x80);
    if (fits && top_ok) return long_int(bytes.substr(0, 8));
    return v;
  }

  bool pop_mark(std::vector<Mut>* items) {
    if (marks_.empty()) {
      fail("an opcode wants a MARK and there is none");
      return false;
    }
    const size_t m = marks_.back();
    marks_.pop_back();
    items->assign(stack_.begin() + long(m), stack_.end());
    stack_.resize(m);
    return true;
  }

  static std::string a(const Value& v) {
    if (v.kind == Kind::None) return "None";
    const std::string k = v.kind_name();
    return (k[0] == 'i' ? "an " : "a ") + k;
  }

  bool mutable_target(const Mut& target, Kind want, const char* opname) {
    if (target->kind != want) {
      fail(std::string(opname) + " on " + a(*target) + " (it takes a " + (want == Kind::List ? "list" : "dict") + ")");
      return false;
    }
    if (frozen_.count(target.get())) {
      fail(std::string(opname) + " changes a " + target->kind_name() +
           " that is already shared (a list inside itself, or changed after use): not plain data");
      return false;
    }
    return true;
  }

  bool add_item(const Mut& c, const Mut& item) {
    frozen_.insert(item.get());
    const uint32_t d = std::max(c->depth, item->depth + 1);
    if (d > limits_.max_depth) {
      fail("containers nested more than " + std::to_string(limits_.max_depth) + " deep");
      return false;
    }
    c->depth = d;
    c->items.push_back(item);
    return true;
  }

  bool set_items(const Mut& dict, const std::vector<Mut>& kv) {
    if (kv.size() % 2) {
      fail("a dict's items come in key, value pairs; one value is missing");
      return false;
    }
    for (size_t k = 0; k < kv.size(); k += 2) {
      const Kind kk = kv[k]->kind;
      if (kk == Kind::List || kk == Kind::Dict) {
        fail("a dict key that is " + a(*kv[k]) + " (unhashable in Python)");
        return false;
      }
      frozen_.insert(kv[k].get());
      frozen_.insert(kv[k + 1].get());
      const uint32_t d = std::max({dict->depth, kv[k]->depth + 1, kv[k + 1]->depth + 1});
      if (d > limits_.max_depth) {
        fail("containers nested more than " + std::to_string(limits_.max_depth) + " deep");
        return false;
      }
      dict->depth = d;
      dict->entries.emplace_back(kv[k], kv[k + 1]);
    }
    return true;
  }

  std::string_view b_;
  Limits limits_;
  size_t pos_ = 0, op_at_ = 0;
  std::vector<Mut> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Mut> memo_;
  std::unordered_set<const Value*> frozen_;
  std::string error_;
};

void put_u32(std::string* out, uint32_t v) {
  for (int k = 0; k < 4; ++k) out->push_back(char((v >> (8 * k)) & 0xff));
}

}  // namespace

Result parse(std::string_view bytes, const Limits& limits) { return Reader(bytes, limits).run(); }

// Writer. Python's pickler batches 1000 items per APPENDS / SETITEMS; so do we.
constexpr uint32_t kBatch = 1000;

Writer::Writer(std::string* out) : out_(out) { out_->append("\x80\x02", 2); }

void Writer::value_written() {
  if (open_.empty() || open_.back().kind == 't') return;
  Open& o = open_.back();
  ++o.batch;
  if (o.batch >= (o.kind == 'd' ? 2 * kBatch : kBatch)) {
    out_->push_back(o.kind == 'd' ? 'u' : 'e');
    out_->push_back('(');
    o.batch = 0;
  }
}

void Writer::none() {
  out_->push_back('N');
  value_written();
}
void Writer::boolean(bool v) {
  out_->push_back(v ? char(0x88) : char(0x89));
  value_written();
}
void Writer::integer(int64_t v) {
  if (v >= 0 && v < 256) {
    out_->push_back('K');
    out_->push_back(char(v));
  } else if (v >= 0 && v < 65536) {
    out_->push_back('M');
    out_->push_back(char(v & 0xff));
    out_->push_back(char((v >> 8) & 0xff));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_->push_back('J');
    put_u32(out_, uint32_t(int32_t(v)));
  } else {
    // LONG1: the fewest bytes of two's complement that keep the sign, little-endian.
    std::string bytes;
    uint64_t x = uint64_t(v);
    for (int k = 0; k < 8; ++k) bytes.push_back(char((x >> (8 * k)) & 0xff));
    while (bytes.size() > 1) {
      const auto last = static_cast<unsigned char>(bytes.back());
      const auto prev = static_cast<unsigned char>(bytes[bytes.size() - 2]);
      if ((last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80))) bytes.pop_back();
      else break;
    }
    out_->push_back(char(0x8a));
    out_->push_back(char(bytes.size()));
    out_->append(bytes);
  }
  value_written();
}
void Writer::real(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  out_->push_back('G');
  for (int k = 7; k >= 0; --k) out_->push_back(char((bits >> (8 * k)) & 0xff));
  value_written();
}
void Writer::put_memo(uint32_t index) {
  if (index < 256) {
    out_->push_back('q');
    out_->push_back(char(index));
  } else {
    out_->push_back('r');
    put_u32(out_, index);
  }
}
void Writer::str(std::string_view v) {
  if (auto it = strings_.find(v); it != strings_.end()) {
    recall(it->second);
    return;
  }
  out_->push_back('X');
  put_u32(out_, uint32_t(v.size()));
  out_->append(v);
  const uint32_t index = next_memo_++;
  put_memo(index);
  strings_.emplace(std::string(v), index);
  value_written();
}
void Writer::recall(uint32_t index) {
  if (index < 256) {
    out_->push_back('h');
    out_->push_back(char(index));
  } else {
    out_->push_back('j');
    put_u32(out_, index);
  }
  value_written();
}
// An empty container, then MARK: its items follow, and APPENDS/SETITEMS adds them. A container is
// memoized (remember) between the two, where the stack's top is the container itself.
void Writer::begin_list() {
  out_->push_back(']');
  out_->push_back('(');
  open_.push_back({'l'});
}
void Writer::begin_dict() {
  out_->push_back('}');
  out_->push_back('(');
  open_.push_back({'d'});
}
void Writer::begin_tuple() {
  out_->push_back('(');
  open_.push_back({'t'});
}
uint32_t Writer::remember() {
  // The MARK just written sits above the container: memoize below it by popping the mark first.
  // Simpler and as valid: undo the MARK, memoize, mark again.
  out_->pop_back();
  const uint32_t index = next_memo_++;
  put_memo(index);
  out_->push_back('(');
  return index;
}
void Writer::end_list() {
  out_->push_back('e');
  open_.pop_back();
  value_written();
}
void Writer::end_dict() {
  out_->push_back('u');
  open_.pop_back();
  value_written();
}
void Writer::end_tuple() {
  out_->push_back('t');
  open_.pop_back();
  value_written();
}
void Writer::stop() { out_->push_back('.'); }

}  // namespace zt::db::pickle
