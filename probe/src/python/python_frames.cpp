// The calling thread's Python frames (see python_frames.h for what this promises).
//
// CPython 3.11 made the interpreter's frames internal (_PyInterpreterFrame): the public
// PyThreadState_GetFrame and PyFrame_GetBack create frame objects for them, which allocates
// (and in 3.11 may run the garbage collector, hence finalizers) — impossible inside malloc. So
// the frames are read from memory, with the offsets of each version below, as py-spy and austin
// do from outside the process; lines come from CPython's own PyCode_Addr2Line (it only reads the
// code's line table). Every code object read is checked to be one (its type is PyCode_Type)
// before anything in it is used, so a layout that does not fit stops the walk instead of
// producing names.
#include "python_frames.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "zt/probe/recorder.h"

namespace zt::probe::python {
namespace {

// Offsets in bytes, x86-64 and aarch64 alike (LP64), default builds (not free-threaded, not
// Py_TRACE_REFS). Printed with offsetof from each version's own headers (internal ones from
// 3.11: pycore_frame.h), see probe/README.md; the same within a minor version.
struct Layout {
  int minor;
  // Thread state -> innermost frame: 3.9/3.10 PyThreadState.frame; 3.11/3.12 .cframe, then
  // _PyCFrame.current_frame; 3.13 .current_frame.
  int ts_frame;
  int cframe_current;  // -1: ts_frame is the frame itself
  // Frames: PyFrameObject up to 3.10, _PyInterpreterFrame from 3.11.
  int f_back;      // f_back / previous
  int f_code;      // f_code / f_executable
  int f_instr;     // 3.11+: prev_instr / instr_ptr
  int f_owner;     // 3.11+
  int f_is_entry;  // 3.11: the frame its _PyEval_EvalFrameDefault call began with
  // Code objects: file, name (co_qualname from 3.11), first line, bytecode, first traceable unit.
  int co_filename, co_name, co_firstlineno, co_code_adaptive, co_firsttraceable;
  // str: sizeof(PyASCIIObject), sizeof(PyCompactUnicodeObject), its utf8_length and utf8.
  int ascii_size, compact_size, utf8_length, utf8;
};
constexpr Layout kLayouts[] = {
    {9, 24, -1, 24, 32, -1, -1, -1, 104, 112, 40, -1, -1, 48, 72, 48, 56},
    {10, 24, -1, 24, 32, -1, -1, -1, 104, 112, 40, -1, -1, 48, 72, 48, 56},
    {11, 56, 8, 48, 32, 56, 69, 68, 112, 128, 72, 184, 168, 48, 72, 48, 56},
    {12, 56, 0, 8, 0, 56, 70, -1, 112, 128, 68, 192, 176, 40, 56, 40, 48},
    {13, 72, -1, 8, 0, 56, 70, -1, 112, 128, 68, 200, 184, 40, 56, 40, 48},
};
constexpr char kOwnedByGenerator = 1;  // enum _frameowner, 3.11+
constexpr char kOwnedByCStack = 3;     // 3.12+: the entry frame each eval-loop call puts on the C stack
constexpr int kObType = 8;             // PyObject.ob_type
constexpr int kStrLength = 16, kStrState = 32;  // PyASCIIObject.length, .state
constexpr uint32_t kStrKindMask = 0x1c, kStrCompact = 0x20, kStrAscii = 0x40;

struct Interp {
  Layout L{};
  int (*is_initialized)() = nullptr;
  int (*gil_check)() = nullptr;
  void* (*this_thread_state)() = nullptr;   // PyGILState_GetThisThreadState
  void* (*current_state)() = nullptr;       // _PyThreadState_UncheckedGet / PyThreadState_GetUnchecked
  int (*is_finalizing)() = nullptr;         // _Py_IsFinalizing / Py_IsFinalizing
  int (*addr2line)(void*, int) = nullptr;   // PyCode_Addr2Line
  int (*frame_line)(void*) = nullptr;       // 3.9/3.10: PyFrame_GetLineNumber
  int (*iframe_line)(void*) = nullptr;      // 3.12+: PyUnstable_InterpreterFrame_GetLine
  const void* code_type = nullptr;
  const void* str_type = nullptr;
  uintptr_t eval_lo = 0, eval_hi = 0;  // _PyEval_EvalFrameDefault's code
};

Mode g_mode = Mode::Off;
Interp g_interp;
std::atomic<const Interp*> g_found{nullptr};
std::mutex g_resolve_mu;
unsigned long long g_adds_looked = 0;  // the loader's count of objects added when last looked
std::atomic<bool> g_gave_up{false};    // an interpreter we cannot read: not looked at again
char g_describe[256] = "off";

template <typename T>
T sym(const char* name) {
  return reinterpret_cast<T>(dlsym(RTLD_DEFAULT, name));
}

unsigned long long loader_adds() {
  unsigned long long adds = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        *static_cast<unsigned long long*>(out) = info->dlpi_adds;
        return 1;  // the first object is enough: every entry carries the same count
      },
      &adds);
  return adds;
}

// Looks for an interpreter in the process (under g_resolve_mu). True when one was found (usable
// or not: either way there is nothing more to look for).
bool resolve() {
  g_adds_looked = loader_adds();
  auto is_initialized = sym<int (*)()>("Py_IsInitialized");
  if (!is_initialized) {
    std::snprintf(g_describe, sizeof g_describe, "no Python in this process");
    return false;
  }
  Interp in;
  in.is_initialized = is_initialized;
  int minor = -1;
  const char* build = "";
  if (auto get_version = sym<const char* (*)()>("Py_GetVersion")) {
    // "3.11.2 (main, ...) [GCC ...]": a static buffer, filled without allocating.
    build = get_version();
    int major = 0;
    if (std::sscanf(build, "%d.%d", &major, &minor) != 2 || major != 3) minor = -1;
  }
  Dl_info where{};
  const char* module = dladdr(reinterpret_cast<void*>(is_initialized), &where) && where.dli_fname ? where.dli_fname : "?";
  const Layout* layout = nullptr;
  for (const Layout& l : kLayouts)
    if (l.minor == minor) layout = &l;
  if (!layout || std::strstr(build, "free-threading")) {
    std::snprintf(g_describe, sizeof g_describe, "Python 3.%d%s (%s): frames not read (layout unknown)", minor,
                  std::strstr(build, "free-threading") ? " free-threaded" : "", module);
    return true;
  }
  in.L = *layout;
  in.gil_check = sym<int (*)()>("PyGILState_Check");
  in.this_thread_state = sym<void* (*)()>("PyGILState_GetThisThreadState");
  in.current_state = sym<void* (*)()>(minor >= 13 ? "PyThreadState_GetUnchecked" : "_PyThreadState_UncheckedGet");
  in.is_finalizing = sym<int (*)()>(minor >= 13 ? "Py_IsFinalizing" : "_Py_IsFinalizing");
  in.addr2line = sym<int (*)(void*, int)>("PyCode_Addr2Line");
  in.frame_line = sym<int (*)(void*)>("PyFrame_GetLineNumber");
  in.iframe_line = sym<int (*)(void*)>("PyUnstable_InterpreterFrame_GetLine");
  in.code_type = sym<const void*>("PyCode_Type");
  in.str_type = sym<const void*>("PyUnicode_Type");
  void* eval = sym<void*>("_PyEval_EvalFrameDefault");
  void* eval_sym = nullptr;  // its ElfW(Sym), for the function's size
  Dl_info eval_info{};
  if (eval && dladdr1(eval, &eval_info, &eval_sym, RTLD_DL_SYMENT) && eval_sym) {
    in.eval_lo = reinterpret_cast<uintptr_t>(eval);
    in.eval_hi = in.eval_lo + static_cast<const ElfW(Sym)*>(eval_sym)->st_size;
  }
  if (!in.gil_check || !in.this_thread_state || !in.current_state || !in.is_finalizing || !in.addr2line ||
      !in.code_type || !in.str_type || (minor <= 10 && !in.frame_line)) {
    std::snprintf(g_describe, sizeof g_describe, "Python 3.%d (%s): frames not read (a C API function is missing)",
                  minor, module);
    return true;
  }
  std::snprintf(g_describe, sizeof g_describe, "Python 3.%d (%s)%s", minor, module,
                in.eval_hi ? "" : ", eval loop not found: Python frames after the native ones");
  g_interp = in;
  g_found.store(&g_interp, std::memory_order_release);
  return true;
}

const Interp* interp() {
  if (const Interp* in = g_found.load(std::memory_order_acquire)) return in;
  if (g_mode == Mode::Off || g_gave_up.load(std::memory_order_relaxed)) return nullptr;
  // No interpreter yet: look again only when the loader has added objects since (a program that
  // embeds Python and loads it later).
  if (loader_adds() == g_adds_looked) return nullptr;
  std::lock_guard lock(g_resolve_mu);
  if (loader_adds() != g_adds_looked && resolve() && !g_found.load()) g_gave_up = true;
  return g_found.load(std::memory_order_acquire);
}

// ---------------------------------------------------------------- reading memory
template <typename T>
inline T at(const void* base, int offset) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + offset, sizeof v);
  return v;
}
inline const void* ptr_at(const void* base, int offset) { return at<const void*>(base, offset); }
// A pointer worth following: aligned, above the first pages, inside a user address space. Every
// pointer read from the interpreter's memory is checked before it is followed, so that a layout
// that does not fit (a field holding a small integer or flags) ends the walk instead of the program.
inline bool plausible(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v >= 65536 && (v & 7) == 0 && v < (uintptr_t(1) << 56);
}

// UTF-8 of a str into buf (at most cap - 1 bytes, NUL-terminated); its length. Compact strings
// (every identifier and file name) are read in place; a str that is neither compact nor
// already encoded reads as "?" (encoding it would allocate).
size_t read_str(const Interp& in, const void* s, char* buf, size_t cap) {
  auto put = [&](const char* text, size_t n) {
    n = n < cap - 1 ? n : cap - 1;
    std::memcpy(buf, text, n);
    buf[n] = 0;
    return n;
  };
  if (!plausible(s) || ptr_at(s, kObType) != in.str_type) return put("?", 1);
  const uint32_t state = at<uint32_t>(s, kStrState);
  const int64_t length = at<int64_t>(s, kStrLength);
  if (length < 0) return put("?", 1);
  const bool compact = state & kStrCompact, ascii = state & kStrAscii;
  if (compact && ascii) return put(static_cast<const char*>(s) + in.L.ascii_size, size_t(length));
  const auto* utf8 = static_cast<const char*>(ptr_at(s, in.L.utf8));
  if (utf8 && plausible(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(utf8) & ~uintptr_t(7))))
    return put(utf8, size_t(at<int64_t>(s, in.L.utf8_length)));
  if (!compact) return put("?", 1);
  const int kind = int((state & kStrKindMask) >> 2);  // bytes per code point: 1, 2 or 4
  const char* data = static_cast<const char*>(s) + in.L.compact_size;
  size_t o = 0;
  for (int64_t i = 0; i < length; ++i) {
    uint32_t c = kind == 1 ? uint8_t(data[i]) : kind == 2 ? at<uint16_t>(data, int(i * 2)) : at<uint32_t>(data, int(i * 4));
    char u[4];
    size_t k;
    if (c < 0x80) u[0] = char(c), k = 1;
    else if (c < 0x800) u[0] = char(0xC0 | c >> 6), u[1] = char(0x80 | (c & 0x3F)), k = 2;
    else if (c < 0x10000) u[0] = char(0xE0 | c >> 12), u[1] = char(0x80 | ((c >> 6) & 0x3F)), u[2] = char(0x80 | (c & 0x3F)), k = 3;
    else u[0] = char(0xF0 | c >> 18), u[1] = char(0x80 | ((c >> 12) & 0x3F)), u[2] = char(0x80 | ((c >> 6) & 0x3F)), u[3] = char(0x80 | (c & 0x3F)), k = 4;
    if (o + k > cap - 1) break;
    std::memcpy(buf + o, u, k);
    o += k;
  }
  buf[o] = 0;
  return o;
}

// ---------------------------------------------------------------- the frames
// One Python frame, or (code null) the end of one eval-loop call's frames.
struct Item {
  const void* code;
  int line;
};
constexpr int kMaxItems = 2 * kMaxPythonFrames;
constexpr int kMaxWalk = 1 << 14;  // a chain longer than this is not a chain

// The thread state whose frames to read, or null.
const void* thread_state(const Interp& in) {
  if (!in.is_initialized()) return nullptr;
  void* own = in.this_thread_state();
  void* current = in.current_state();
  // Up to 3.11 the "current" thread state is the GIL holder's, from 3.12 the calling thread's
  // own while it holds its interpreter's GIL.
  const bool holds_gil = current && (in.L.minor >= 12 || current == own) && in.gil_check();
  if (holds_gil) return current;
  if (!own || g_mode != Mode::Own || in.is_finalizing()) return nullptr;
  return own;
}

// Fills items innermost first; returns their count.
int read_frames(const Interp& in, Item* items) {
  const void* ts = thread_state(in);
  if (!ts) return 0;
  const Layout& L = in.L;
  const void* f = ptr_at(ts, L.ts_frame);
  if (plausible(f) && L.cframe_current >= 0) f = ptr_at(f, L.cframe_current);
  int n = 0, frames = 0;
  for (int walked = 0; plausible(f) && walked < kMaxWalk && frames < kMaxPythonFrames && n < kMaxItems - 1;
       ++walked, f = ptr_at(f, L.f_back)) {
    if (L.minor <= 10) {
      // One eval-loop call per frame object.
      const void* code = ptr_at(f, L.f_code);
      if (!plausible(code) || ptr_at(code, kObType) != in.code_type) break;
      items[n++] = {code, in.frame_line(const_cast<void*>(f))};
      items[n++] = {nullptr, 0};
      ++frames;
      continue;
    }
    const char owner = at<char>(f, L.f_owner);
    if (owner == kOwnedByCStack && L.minor >= 12) {
      items[n++] = {nullptr, 0};
      continue;
    }
    const void* code = ptr_at(f, L.f_code);
    if (!plausible(code) || ptr_at(code, kObType) != in.code_type) break;
    // The instruction it runs, in bytes from the code's start; a frame not yet at its first
    // traceable instruction (still setting up, _PyFrame_IsIncomplete) is skipped, as CPython's
    // own tracebacks do.
    const char* first = static_cast<const char*>(code) + L.co_code_adaptive;
    const char* instr = static_cast<const char*>(ptr_at(f, L.f_instr));
    const bool incomplete = owner != kOwnedByGenerator && instr < first + 2 * at<int>(code, L.co_firsttraceable);
    if (!incomplete) {
      const int line = in.iframe_line ? in.iframe_line(const_cast<void*>(f))
                                      : in.addr2line(const_cast<void*>(code), int(instr - first));
      items[n++] = {code, line};
      ++frames;
    }
    if (L.minor == 11 && at<bool>(f, L.f_is_entry)) items[n++] = {nullptr, 0};
  }
  return n;
}

// Code objects -> the Recorder's function keys. Direct-mapped; an entry counts only while the
// code object at that address still has the same file, name and first line (a code object that
// died and whose address was reused by another is then read afresh, never taken for the old one).
struct CodeEntry {
  const void* code = nullptr;
  const void* file = nullptr;
  const void* name = nullptr;
  int first_line = 0;
  uint64_t key = 0;
};
constexpr size_t kCacheSlots = 4096;
CodeEntry g_cache[kCacheSlots];
const Recorder* g_cache_owner = nullptr;
std::mutex g_cache_mu;

uint64_t function_key(const Interp& in, Recorder& rec, const void* code) {
  const void* file = ptr_at(code, in.L.co_filename);
  const void* name = ptr_at(code, in.L.co_name);
  const int first_line = at<int>(code, in.L.co_firstlineno);
  CodeEntry& e = g_cache[(reinterpret_cast<uintptr_t>(code) >> 4) & (kCacheSlots - 1)];
  if (e.code == code && e.file == file && e.name == name && e.first_line == first_line) return e.key;
  char file_text[1024], name_text[256];
  const size_t nf = read_str(in, file, file_text, sizeof file_text);
  const size_t nn = read_str(in, name, name_text, sizeof name_text);
  e = {code, file, name, first_line, rec.python_function({file_text, nf}, {name_text, nn})};
  return e.key;
}

inline bool in_eval_loop(const Interp& in, uint64_t ip) {
  // A return address: the call is the instruction before it.
  return ip > in.eval_lo && ip <= in.eval_hi;
}

}  // namespace

void child_after_fork() {
  new (&g_resolve_mu) std::mutex();
  new (&g_cache_mu) std::mutex();
}

void configure(Mode mode) {
  std::lock_guard lock(g_resolve_mu);
  g_mode = mode;
  if (mode == Mode::Off) {
    g_found.store(nullptr);
    std::snprintf(g_describe, sizeof g_describe, "off");
    return;
  }
  if (resolve() && !g_found.load()) g_gave_up = true;
}

const char* describe() { return g_describe; }

int interleave(Recorder& rec, const uint64_t* native, int n, uint64_t* out, int cap) {
  if (n > cap) n = cap;
  const Interp* in = g_mode == Mode::Off ? nullptr : interp();
  Item items[kMaxItems];
  const int count = in ? read_frames(*in, items) : 0;
  bool any = false;
  for (int i = 0; i < count && !any; ++i) any = items[i].code != nullptr;
  if (!any) {
    std::memcpy(out, native, sizeof(uint64_t) * size_t(n));
    return n;
  }
  uint64_t tokens[kMaxItems];
  {
    std::lock_guard lock(g_cache_mu);
    if (g_cache_owner != &rec) {
      for (auto& e : g_cache) e = CodeEntry{};
      g_cache_owner = &rec;
    }
    for (int i = 0; i < count; ++i)
      tokens[i] = items[i].code ? Recorder::python_frame_token(function_key(*in, rec, items[i].code), items[i].line) : 0;
  }
  int o = 0, next = 0;
  auto emit_group = [&]() {
    int emitted = 0;
    for (; next < count && tokens[next] != 0; ++next)
      if (o < cap) out[o++] = tokens[next], ++emitted;
    if (next < count) ++next;  // the group's end
    return emitted;
  };
  for (int i = 0; i < n && o < cap; ++i) {
    if (next < count && in->eval_hi && in_eval_loop(*in, native[i])) {
      // Where the interpreter runs them; an eval-loop call with no frame to show stays native.
      if (emit_group() == 0 && o < cap) out[o++] = native[i];
    } else {
      out[o++] = native[i];
    }
  }
  while (next < count && o < cap) emit_group();  // beyond the native stack's depth
  return o;
}

}  // namespace zt::probe::python
