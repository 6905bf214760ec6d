// A PyTorch memory snapshot's pickle -> TorchModel, checked field by field (see torch_model.h).
// The format: torch/cuda/memory.py (_snapshot's docstring), torch/csrc/cuda/memory_snapshot.cpp
// (the C++ writer's keys), torch/cuda/_memory_viz.py (the reader, with the legacy `history` form).
#include "torch_model.h"

#include <bit>
#include <cmath>
#include <unordered_map>

#include "zt/db/pickle.h"

namespace zt::db::detail {

using pickle::Kind;
using pickle::Value;

std::string_view to_string(TorchAction a) {
  switch (a) {
    case TorchAction::Alloc: return "alloc";
    case TorchAction::FreeRequested: return "free_requested";
    case TorchAction::FreeCompleted: return "free_completed";
    case TorchAction::SegmentAlloc: return "segment_alloc";
    case TorchAction::SegmentFree: return "segment_free";
    case TorchAction::SegmentMap: return "segment_map";
    case TorchAction::SegmentUnmap: return "segment_unmap";
    case TorchAction::Oom: return "oom";
    case TorchAction::Snapshot: return "snapshot";
    case TorchAction::Other: return "other";
  }
  return "?";
}

int64_t TorchModel::max_device() const {
  int64_t d = int64_t(traces.size()) - 1;
  for (auto& s : segments) d = std::max(d, s.device);
  return d;
}

namespace {

// "an int", "a str", "None": what was found where something else belonged.
std::string a(const Value& v) {
  if (v.kind == Kind::None) return "None";
  const std::string k = v.kind_name();
  return (k[0] == 'i' ? "an " : "a ") + k;
}

// Devices a snapshot may name (torch.cuda.device_count() is far below it).
constexpr int64_t kMaxDevice = 4095;
constexpr int64_t kMaxTimeUs = int64_t(1) << 52;

class Parser {
 public:
  Parser(TorchModel* m, size_t file_bytes) : m_(*m), budget_(int64_t(file_bytes) + 1'000'000) {}

  Status run(const Value& root) {
    const Value* segments = nullptr;
    if (root.is_list()) {
      segments = &root;  // the legacy form: the segment list alone (memory_viz reads it too)
    } else if (root.is_dict()) {
      segments = root.get("segments");
      const Value* traces = root.get("device_traces");
      if (!segments && !traces) return bad("a dict without 'segments' or 'device_traces'");
      if (segments && !segments->is_list()) return bad("'segments' is " + a(*segments));
      if (traces && !parse_traces(*traces)) return error_;
      if (const Value* s = root.get("allocator_settings"); s && !parse_settings(*s)) return error_;
      if (const Value* z = root.get("zerotrace"); z && !parse_clock(*z)) return error_;
      if (m_.clock_unix_ns) {
        // The probe's clock pair maps Unix µs onto its CLOCK_MONOTONIC: an event before that
        // clock's zero (the machine's boot) cannot be one of the probed process's.
        for (size_t d = 0; d < m_.traces.size(); ++d)
          for (const auto& ev : m_.traces[d])
            if (const int64_t t = ev.time_us ? *ev.time_us * 1000 + (*m_.clock_monotonic_ns - *m_.clock_unix_ns) : 0;
                t < 0 || t > (int64_t(1) << 62))
              return bad("device_traces[" + std::to_string(d) + "] has an event at time_us " +
                         std::to_string(*ev.time_us) + ", outside the clock of its 'zerotrace' pair (0 .. 2^62 ns)");
      }
    } else {
      return bad("the pickle holds " + a(root) + ", not a dict");
    }
    if (segments)
      for (size_t i = 0; i < segments->items.size(); ++i)
        if (!spend() || !parse_segment(*segments->items[i], "segments[" + std::to_string(i) + "]")) return error_;
    return Status::Ok();
  }

 private:
  // The first problem found is the one reported.
  bool fail(const std::string& what) {
    if (error_.ok()) error_ = Status::Error("not a PyTorch memory snapshot: " + what);
    return false;
  }
  Status bad(const std::string& what) {
    fail(what);
    return error_;
  }
  // Every list item visited costs one unit; a genuine file spends at most one per byte.
  bool spend(int64_t n = 1) {
    budget_ -= n;
    if (budget_ >= 0) return true;
    return fail("its shared lists expand to far more entries than the file holds (a pickle built to exhaust readers)");
  }

  bool int_field(const Value& d, const char* key, const std::string& where, int64_t* out, bool required,
                 bool non_negative = true) {
    const Value* v = d.get(key);
    if (!v || v->kind == Kind::None) {
      if (required) return fail(where + " has no '" + key + "'");
      return true;
    }
    if (v->kind == Kind::Float && std::isfinite(v->real) && std::fabs(v->real) < 9.0e18) {
      *out = int64_t(v->real);
    } else if (!v->is_int()) {
      return fail(where + "." + key + " is " + a(*v) + ", not an int" +
                  (v->kind == Kind::BigInt ? " of 64 bits" : ""));
    } else {
      *out = v->integer;
    }
    if (non_negative && *out < 0) return fail(where + "." + key + " is negative (" + std::to_string(*out) + ")");
    return true;
  }

  bool str_field(const Value& d, const char* key, const std::string& where, std::string* out, bool required) {
    const Value* v = d.get(key);
    if (!v || v->kind == Kind::None) {
      if (required) return fail(where + " has no '" + key + "'");
      return true;
    }
    if (!v->is_str()) return fail(where + "." + key + " is " + a(*v) + ", not a str");
    *out = v->text;
    return true;
  }

  // A frames list, interned by identity: a snapshot shares one list among every entry of a stack.
  bool frames(const Value* list, const std::string& where, int32_t* out) {
    *out = -1;
    if (!list || list->kind == Kind::None) return true;
    if (!list->is_list()) return fail(where + ".frames is " + a(*list) + ", not a list");
    if (list->items.empty()) return true;
    if (auto it = stacks_.find(list); it != stacks_.end()) {
      *out = it->second;
      return true;
    }
    if (!spend(int64_t(list->items.size()))) return false;
    std::vector<TorchFrame> fs;
    fs.reserve(list->items.size());
    for (size_t i = 0; i < list->items.size(); ++i) {
      const Value& f = *list->items[i];
      const std::string w = where + ".frames[" + std::to_string(i) + "]";
      if (!f.is_dict()) return fail(w + " is " + a(f) + ", not a dict");
      TorchFrame fr;
      if (!str_field(f, "filename", w, &fr.filename, false) || !str_field(f, "name", w, &fr.name, false) ||
          !int_field(f, "line", w, &fr.line, false, false))
        return false;
      fs.push_back(std::move(fr));
    }
    *out = int32_t(m_.stacks.size());
    m_.stacks.push_back(std::move(fs));
    stacks_.emplace(list, *out);
    return true;
  }

  bool parse_traces(const Value& traces) {
    if (!traces.is_list()) return fail("'device_traces' is " + a(traces) + ", not a list");
    if (int64_t(traces.items.size()) > kMaxDevice + 1)
      return fail("'device_traces' names " + std::to_string(traces.items.size()) + " devices");
    m_.traces.resize(traces.items.size());
    for (size_t d = 0; d < traces.items.size(); ++d) {
      const Value& list = *traces.items[d];
      const std::string wd = "device_traces[" + std::to_string(d) + "]";
      if (list.kind == Kind::None) continue;
      if (!list.is_list()) return fail(wd + " is " + a(list) + ", not a list");
      if (!spend(int64_t(list.items.size()))) return false;
      auto& out = m_.traces[d];
      out.reserve(list.items.size());
      for (size_t i = 0; i < list.items.size(); ++i) {
        const Value& e = *list.items[i];
        const std::string w = wd + "[" + std::to_string(i) + "]";
        if (!e.is_dict()) return fail(w + " is " + a(e) + ", not a dict");
        std::string action;
        if (!str_field(e, "action", w, &action, true)) return false;
        TorchEvent ev;
        static const std::pair<const char*, TorchAction> kActions[] = {
            {"alloc", TorchAction::Alloc},
            {"free_requested", TorchAction::FreeRequested},
            {"free_completed", TorchAction::FreeCompleted},
            {"segment_alloc", TorchAction::SegmentAlloc},
            {"segment_free", TorchAction::SegmentFree},
            {"segment_map", TorchAction::SegmentMap},
            {"segment_unmap", TorchAction::SegmentUnmap},
            {"oom", TorchAction::Oom},
            {"snapshot", TorchAction::Snapshot},
        };
        for (auto& [name, a] : kActions)
          if (action == name) ev.action = a;
        const bool needs_addr = ev.action != TorchAction::Oom && ev.action != TorchAction::Snapshot &&
                                ev.action != TorchAction::Other;
        int64_t addr = 0;
        if (!int_field(e, "addr", w, &addr, needs_addr) || !int_field(e, "size", w, &ev.size, needs_addr) ||
            !int_field(e, "stream", w, &ev.stream, false, false) ||
            !int_field(e, "device_free", w, &ev.device_free, false))
          return false;
        ev.addr = uint64_t(addr);
        if (const Value* t = e.get("time_us"); t && t->kind != Kind::None) {
          int64_t us = 0;
          if (!int_field(e, "time_us", w, &us, true)) return false;
          // Unix µs (PyTorch's): 2^52 is the year 2112; times in ns must fit a trace (2^62).
          if (us > kMaxTimeUs)
            return fail(w + ".time_us is " + std::to_string(us) + "; a Unix time in µs is at most 2^52");
          ev.time_us = us;
        }
        if (!frames(e.get("frames"), w, &ev.stack)) return false;
        out.push_back(ev);
        ++m_.events;
      }
    }
    return true;
  }

  bool parse_segment(const Value& s, const std::string& w) {
    if (!s.is_dict()) return fail(w + " is " + a(s) + ", not a dict");
    TorchSegment seg;
    int64_t addr = 0;
    if (!int_field(s, "address", w, &addr, true) || !int_field(s, "total_size", w, &seg.total_size, true) ||
        !int_field(s, "device", w, &seg.device, false) || !int_field(s, "stream", w, &seg.stream, false, false))
      return false;
    if (seg.device > kMaxDevice) return fail(w + ".device is " + std::to_string(seg.device));
    seg.address = uint64_t(addr);
    std::string type;
    if (!str_field(s, "segment_type", w, &type, false)) return false;
    if (type == "small") seg.small = true;
    if (type == "large") seg.small = false;
    if (const Value* e = s.get("is_expandable"); e && e->is_int()) seg.expandable = e->integer != 0;
    if (!frames(s.get("frames"), w, &seg.stack)) return false;
    const Value* blocks = s.get("blocks");
    if (blocks && blocks->kind != Kind::None) {
      if (!blocks->is_list()) return fail(w + ".blocks is " + a(*blocks) + ", not a list");
      if (!spend(int64_t(blocks->items.size()))) return false;
      uint64_t next = seg.address;
      for (size_t i = 0; i < blocks->items.size(); ++i) {
        const Value& b = *blocks->items[i];
        const std::string wb = w + ".blocks[" + std::to_string(i) + "]";
        if (!b.is_dict()) return fail(wb + " is " + a(b) + ", not a dict");
        TorchBlock blk;
        int64_t baddr = int64_t(next);
        if (!int_field(b, "size", wb, &blk.size, true) || !int_field(b, "address", wb, &baddr, false)) return false;
        blk.address = uint64_t(baddr);
        blk.requested = blk.size;
        if (!int_field(b, "requested_size", wb, &blk.requested, false)) return false;
        std::string state;
        if (!str_field(b, "state", wb, &state, true)) return false;
        blk.state = state == "active_allocated" ? 1 : (state == "active_pending_free" || state == "active_awaiting_free") ? 2 : 0;
        const Value* fr = b.get("frames");
        if (const Value* h = b.get("history"); !fr && h && h->is_list() && !h->items.empty() && h->items[0]->is_dict()) {
          // The legacy form: the allocation's frames and real size in history[0].
          fr = h->items[0]->get("frames");
          if (!int_field(*h->items[0], "real_size", wb + ".history[0]", &blk.requested, false)) return false;
        }
        if (!frames(fr, wb, &blk.stack)) return false;
        next = blk.address + uint64_t(blk.size);
        seg.blocks.push_back(blk);
      }
    }
    m_.segments.push_back(std::move(seg));
    return true;
  }

  bool parse_settings(const Value& s) {
    if (!s.is_dict()) return true;  // informational; a strange one changes nothing
    if (const Value* v = s.get("max_split_size"); v && v->kind == Kind::Int && v->integer > 0 &&
                                                   v->integer < (int64_t(1) << 62))
      m_.max_split_size = v->integer;
    if (const Value* r = s.get("roundup_power2_divisions"); r && r->is_dict()) {
      // Keys "1", "2", "4", ... : one per power-of-two interval from 1 MiB, as the C++ writer keys them.
      for (auto& [k, v] : r->entries) {
        if (!k->is_str() || !v->is_int() || k->text.empty() || k->text.size() > 12) continue;
        int64_t key = 0;
        bool digits = true;
        for (char c : k->text) digits = digits && c >= '0' && c <= '9';
        if (!digits) continue;
        key = std::stoll(k->text);
        if (key <= 0 || !std::has_single_bit(uint64_t(key))) continue;
        const size_t idx = size_t(std::countr_zero(uint64_t(key)));
        if (idx > 63) continue;
        if (m_.roundup_divisions.size() <= idx) m_.roundup_divisions.resize(idx + 1, 0);
        m_.roundup_divisions[idx] = v->integer;
      }
    }
    return true;
  }

  bool parse_clock(const Value& z) {
    if (!z.is_dict()) return fail("'zerotrace' is " + a(z) + ", not a dict");
    int64_t unix_ns = -1, mono_ns = -1;
    if (!int_field(z, "unix_ns", "zerotrace", &unix_ns, false) ||
        !int_field(z, "monotonic_ns", "zerotrace", &mono_ns, false) ||
        !str_field(z, "run_id", "zerotrace", &m_.run_id, false) || !int_field(z, "pid", "zerotrace", &m_.pid, false) ||
        !str_field(z, "reason", "zerotrace", &m_.reason, false))
      return false;
    if (unix_ns > kMaxTimeUs * 1000 || mono_ns > kMaxTimeUs * 1000)
      return fail("'zerotrace' holds a clock past 2^52 µs (unix_ns " + std::to_string(unix_ns) + ", monotonic_ns " +
                  std::to_string(mono_ns) + ")");
    if (unix_ns >= 0 && mono_ns >= 0) {
      m_.clock_unix_ns = unix_ns;
      m_.clock_monotonic_ns = mono_ns;
    }
    return true;
  }

  TorchModel& m_;
  int64_t budget_;
  Status error_;
  std::unordered_map<const Value*, int32_t> stacks_;
};

}  // namespace

Status parse_snapshot(std::string_view bytes, TorchModel* out) {
  *out = TorchModel();
  pickle::Result r = pickle::parse(bytes);
  if (!r.ok()) return Status::Error("not a readable pickle: " + r.error);
  return Parser(out, bytes.size()).run(*r.value);
}

int64_t torch_round_size(const TorchModel& m, int64_t size) {
  if (size < kTorchMinBlockSize) return kTorchMinBlockSize;
  if (!m.roundup_divisions.empty()) {
    // roundup_power2_divisions: the interval of `size` from 1 MiB (clamped), its divisions.
    const int log_size = 63 - std::countl_zero(uint64_t(size));
    const int start = 20;  // log2(1 MiB)
    size_t idx = size_t(std::max(0, log_size - start));
    idx = std::min(idx, m.roundup_divisions.size() - 1);
    const int64_t divisions = m.roundup_divisions[idx];
    if (divisions > 1 && size > kTorchMinBlockSize * divisions) {
      if (std::has_single_bit(uint64_t(size))) return size;
      const uint64_t floor = std::bit_floor(uint64_t(size));
      const uint64_t division = floor >> (63 - std::countl_zero(uint64_t(divisions)));
      if (division == 0) return int64_t(floor << 1);
      const uint64_t rounded_floor = uint64_t(size) & ~(division - 1);
      return int64_t(rounded_floor == uint64_t(size) ? uint64_t(size) : rounded_floor + division);
    }
  }
  if (size > INT64_MAX - kTorchMinBlockSize) return size;
  return kTorchMinBlockSize * ((size + kTorchMinBlockSize - 1) / kTorchMinBlockSize);
}

bool torch_should_split(const TorchModel& m, int64_t block_size, int64_t size, bool expandable) {
  const int64_t remaining = block_size - size;
  if (size <= kTorchSmallSize || expandable) return remaining >= kTorchMinBlockSize;
  if (m.max_split_size && size >= *m.max_split_size) return false;
  return remaining > kTorchSmallSize;
}

}  // namespace zt::db::detail
