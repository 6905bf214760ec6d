// PyTorch memory snapshots into traces: the replay of the allocator's history, `zt import` of a
// snapshot file and zt probe's merge of a probed program's own history. The rules are in
// zt/db/torch_snapshot.h; the parsing in torch_model.cpp; the export in torch_export.cpp.
#include "zt/db/torch_snapshot.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "new_trace.h"
#include "sqlite.h"
#include "torch_model.h"
#include "zt/common/files.h"
#include "zt/common/units.h"
#include "zt/db/trace_file.h"
#include "zt/db/trace_writer.h"
#include "zt/version.h"

namespace zt::db {
namespace {

using detail::TorchAction;
using detail::TorchEvent;
using detail::TorchFrame;
using detail::TorchModel;

bool has(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}
std::string basename(std::string_view path) {
  size_t p = path.rfind('/');
  return std::string(p == std::string_view::npos ? path : path.substr(p + 1));
}

// The innermost frame of the program's own code: a Python file outside torch's package and the
// standard library (site-packages, e.g. transformers, counts as the program's).
bool user_frame(const TorchFrame& f) {
  if (!ends_with(f.filename, ".py") || f.filename.empty() || f.filename[0] == '<') return false;
  if (has(f.filename, "/torch/")) return false;
  if (has(f.filename, "/lib/python3") && !has(f.filename, "-packages/")) return false;
  return true;
}

// The tensor's family, where the frames say it (innermost frame first): what the viewer colours
// by (viewer/model/families.h reads these words in the name).
const char* family(const std::vector<TorchFrame>& frames) {
  for (const TorchFrame& f : frames) {
    const std::string& p = f.filename;
    const std::string& n = f.name;
    if (has(p, "/torch/optim/") || has(p, "/deepspeed/ops/adam") || has(basename(p), "optimizer"))
      return "optimizer state";
    if (has(p, "/torch/autograd/") || (ends_with(p, "/torch/_tensor.py") && n == "backward")) return "gradient";
    if (has(p, "/torch/nn/parameter.py") || has(p, "/deepspeed/runtime/zero/partition_parameters.py") ||
        (ends_with(p, "/torch/nn/modules/module.py") &&
         (n == "_apply" || n == "to" || n == "cuda" || n == "convert" || n == "_load_from_state_dict" ||
          n == "load_state_dict" || n == "register_parameter")) ||
        (has(p, "/torch/nn/modules/") && (n == "__init__" || n == "reset_parameters")))
      return "parameter";
    if (has(p, "/torch/nn/modules/") || ends_with(p, "/torch/nn/functional.py")) return "activation";
  }
  return nullptr;
}

std::string block_label(const std::vector<TorchFrame>* frames) {
  if (!frames || frames->empty()) return "torch.block (no Python stack)";
  const TorchFrame* pick = nullptr;
  for (auto& f : *frames)
    if (user_frame(f)) {
      pick = &f;
      break;
    }
  if (!pick)
    for (auto& f : *frames)
      if (ends_with(f.filename, ".py")) {
        pick = &f;
        break;
      }
  if (!pick) pick = &frames->front();
  std::string name = basename(pick->filename) + ":" + std::to_string(pick->line) + " " + pick->name;
  if (const char* fam = family(*frames)) name += std::string(" (") + fam + ")";
  return name;
}

// A device the snapshot says anything about (device_traces has a list for every device).
bool device_used(const TorchModel& m, int64_t d) {
  return (size_t(d) < m.traces.size() && !m.traces[size_t(d)].empty()) ||
         std::any_of(m.segments.begin(), m.segments.end(), [&](auto& s) { return s.device == d; });
}

// Where the replay's rows go: a trace, or nowhere (check_torch_snapshot, the fuzzing entry).
class Sink {
 public:
  virtual ~Sink() = default;
  virtual int64_t add(AllocationRow r) = 0;  // returns the row's id
  virtual void freed(int64_t id, int64_t t) = 0;
  virtual void error(ErrorRow r) = 0;
  virtual int64_t name(const std::string& text) = 0;
  virtual int64_t stack(int32_t index) = 0;  // index into TorchModel::stacks; -1: none (0)
  virtual int64_t device(int64_t torch_index) = 0;
};

class NullSink : public Sink {
 public:
  int64_t add(AllocationRow) override { return ++ids_; }
  void freed(int64_t, int64_t) override {}
  void error(ErrorRow) override {}
  int64_t name(const std::string&) override { return 0; }
  int64_t stack(int32_t) override { return 0; }
  int64_t device(int64_t d) override { return d + 1; }

 private:
  int64_t ids_ = 0;
};

// Rows into a TraceWriter, with ids above the file's own and names interned against its strings.
class TraceSink : public Sink {
 public:
  TraceSink(TraceWriter& w, const TorchModel& m, std::function<int64_t(int64_t)> device_row)
      : w_(w), m_(m), device_row_(std::move(device_row)) {
    sqlite3* db = w.handle();
    next_alloc_ = detail::query_int(db, "SELECT coalesce(max(id), 0) + 1 FROM allocation", 1);
    next_error_ = detail::query_int(db, "SELECT coalesce(max(id), 0) + 1 FROM error", 1);
    next_string_ = detail::query_int(db, "SELECT coalesce(max(id), 0) + 1 FROM string", 1);
    next_frame_ = detail::query_int(db, "SELECT coalesce(max(id), 0) + 1 FROM frame", 1);
    next_stack_ = detail::query_int(db, "SELECT coalesce(max(id), 0) + 1 FROM stack", 1);
    detail::Stmt s(db, "SELECT id, text FROM string");
    while (s.step()) strings_.emplace(s.text(1), s.i64(0));
    stack_ids_.assign(m.stacks.size(), -1);
  }
  int64_t add(AllocationRow r) override {
    r.id = next_alloc_++;
    w_.insert(r);
    return r.id;
  }
  void freed(int64_t id, int64_t t) override { w_.set_allocation_freed(id, t); }
  void error(ErrorRow r) override {
    r.id = next_error_++;
    w_.insert(r);
  }
  int64_t name(const std::string& text) override {
    auto [it, fresh] = strings_.emplace(text, next_string_);
    if (fresh) w_.insert(StringRow{next_string_++, text});
    return it->second;
  }
  // A stack as the tree the schema keeps (stack rows point to their caller), outermost first.
  int64_t stack(int32_t index) override {
    if (index < 0 || size_t(index) >= stack_ids_.size()) return 0;
    if (stack_ids_[size_t(index)] >= 0) return stack_ids_[size_t(index)];
    const auto& frames = m_.stacks[size_t(index)];
    int64_t parent = 0;
    for (size_t k = frames.size(); k-- > 0;) {
      const TorchFrame& f = frames[k];
      auto fkey = std::make_tuple(f.filename, f.line, f.name);
      auto [fit, fresh] = frames_.emplace(fkey, next_frame_);
      if (fresh) {
        FrameRow fr;
        fr.id = next_frame_++;
        fr.ip = 0;  // a Python frame (db/SCHEMA.md): file and line, no instruction pointer
        fr.module = f.filename.empty() ? "??" : f.filename;
        fr.line = f.line;
        fr.symbol = f.name;
        w_.insert(fr);
      }
      auto [nit, nfresh] = nodes_.emplace(std::make_pair(parent, fit->second), next_stack_);
      if (nfresh) w_.insert(StackRow{next_stack_++, parent, fit->second});
      parent = nit->second;
    }
    stack_ids_[size_t(index)] = parent;
    return parent;
  }
  int64_t device(int64_t d) override { return device_row_(d); }

 private:
  TraceWriter& w_;
  const TorchModel& m_;
  std::function<int64_t(int64_t)> device_row_;
  int64_t next_alloc_ = 1, next_error_ = 1, next_string_ = 1, next_frame_ = 1, next_stack_ = 1;
  std::unordered_map<std::string, int64_t> strings_;
  std::map<std::tuple<std::string, int64_t, std::string>, int64_t> frames_;
  std::map<std::pair<int64_t, int64_t>, int64_t> nodes_;
  std::vector<int64_t> stack_ids_;
};

// Event times on the trace's clock. time_us -> time_us * 1000 + offset_ns; events without time_us
// are 1 µs apart by their index; a device without history sits at `snapshot_ns`.
struct Clock {
  int64_t offset_ns = 0;
  int64_t snapshot_ns = 0;
  int64_t ns(const TorchEvent& e, size_t index) const {
    return e.time_us ? *e.time_us * 1000 + offset_ns : int64_t(index) * 1000 + offset_ns;
  }
};

// Address ranges [start, end) of one device's mapped expandable memory.
class Ranges {
 public:
  void add(uint64_t a, uint64_t b) { r_[a] = b; }
  // The parts of [a, b) not in the set.
  std::vector<std::pair<uint64_t, uint64_t>> missing(uint64_t a, uint64_t b) const {
    std::vector<std::pair<uint64_t, uint64_t>> out;
    uint64_t at = a;
    auto it = r_.upper_bound(a);
    if (it != r_.begin()) --it;
    for (; it != r_.end() && it->first < b; ++it) {
      if (it->second <= at) continue;
      if (it->first > at) out.emplace_back(at, std::min(it->first, b));
      at = std::max(at, it->second);
      if (at >= b) break;
    }
    if (at < b) out.emplace_back(at, b);
    return out;
  }
  void remove(uint64_t a, uint64_t b) {
    std::vector<std::pair<uint64_t, uint64_t>> keep;
    for (auto it = r_.begin(); it != r_.end();) {
      if (it->second <= a || it->first >= b) {
        ++it;
        continue;
      }
      if (it->first < a) keep.emplace_back(it->first, a);
      if (it->second > b) keep.emplace_back(b, it->second);
      it = r_.erase(it);
    }
    for (auto& [x, y] : keep) r_[x] = y;
  }

 private:
  std::map<uint64_t, uint64_t> r_;
};

// The replay of one snapshot into rows (see zt/db/torch_snapshot.h for the rules).
class Replay {
 public:
  Replay(const TorchModel& m, Sink& sink, const Clock& clock, int64_t rank, TorchImportStats* st)
      : m_(m), sink_(sink), clock_(clock), rank_(rank), st_(*st) {}

  void run() {
    for (int64_t d = 0; d <= m_.max_device(); ++d)
      if (device_used(m_, d)) device(d);
  }
  int64_t t_first() const { return t_first_; }
  int64_t t_last() const { return t_last_; }
  const std::vector<std::string>& oom_messages() const { return ooms_; }

 private:
  struct Chunk {
    int64_t size = 0;
    uint8_t state = 0;  // 0 free, 1 allocated, 2 freed but not reusable yet (free_requested)
    uint64_t base = 0;  // the segment it belongs to (kExpandable for expandable segments' mappings)
  };
  static constexpr uint64_t kExpandable = ~uint64_t(0);
  struct LiveSeg {
    int64_t id = 0;
    int64_t size = 0;
    bool expandable = false;
    int64_t stream = 0;
    int32_t stack = -1;
  };
  struct LiveBlock {
    int64_t id = 0;
    int64_t size = 0;
    int64_t name = 0;
  };
  struct PreBlock {
    int64_t requested = 0;
    int64_t exact = -1;  // from the final segment list
    int64_t stream = 0;
    int32_t stack = -1;
    bool pending_at_start = false;  // freed before the history began, not yet reusable
  };
  struct PreSeg {
    uint64_t addr = 0;
    int64_t size = 0;
    int64_t stream = 0;
    int32_t stack = -1;
    bool expandable = false;
  };

  void touch(int64_t t) {
    t_first_ = std::min(t_first_, t);
    t_last_ = std::max(t_last_, t);
  }

  int64_t segment_name(bool expandable, int64_t size) {
    return sink_.name(expandable ? "torch.segment (expandable)"
                      : size == detail::kTorchSmallBuffer ? "torch.segment (small pool)"
                                                          : "torch.segment (large pool)");
  }

  int64_t block_name(int32_t stack) {
    auto [it, fresh] = names_.emplace(stack, 0);
    if (fresh)
      it->second = sink_.name(block_label(stack >= 0 && size_t(stack) < m_.stacks.size() ? &m_.stacks[size_t(stack)]
                                                                                          : nullptr));
    return it->second;
  }

  void open_segment(uint64_t addr, int64_t size, int64_t t, int64_t stream, int32_t stack, bool expandable) {
    AllocationRow r;
    r.rank = rank_;
    r.device_id = device_id_;
    r.memory_kind = MemoryKind::Device;
    r.level = AllocLevel::Segment;
    r.address = addr;
    r.bytes = r.requested_bytes = size;
    r.t_alloc = t;
    r.name_id = segment_name(expandable, size);
    r.stack_id = sink_.stack(stack);
    r.source = Source::Torch;
    r.stream = stream;
    segs_[addr] = LiveSeg{sink_.add(r), size, expandable, stream, stack};
    reserved_ += size;
    ++st_.segments;
    add_free(addr, size, expandable ? kExpandable : addr);
  }

  void close_segment(std::map<uint64_t, LiveSeg>::iterator it, int64_t t) {
    sink_.freed(it->second.id, t);
    reserved_ -= it->second.size;
    segs_.erase(it);
  }

  const LiveSeg* segment_at(uint64_t addr) const {
    auto it = segs_.upper_bound(addr);
    if (it == segs_.begin()) return nullptr;
    --it;
    return addr < it->first + uint64_t(it->second.size) ? &it->second : nullptr;
  }

  // --- the allocator's block layout, replayed to know each block's real size
  std::map<uint64_t, Chunk>::iterator chunk_at(uint64_t a) {
    auto it = chunks_.upper_bound(a);
    if (it == chunks_.begin()) return chunks_.end();
    --it;
    return a < it->first + uint64_t(it->second.size) ? it : chunks_.end();
  }
  // Splits the chunk containing x so that one starts at x.
  void split_at(uint64_t x) {
    auto it = chunk_at(x);
    if (it == chunks_.end() || it->first == x) return;
    Chunk tail = it->second;
    tail.size = int64_t(it->first + uint64_t(it->second.size) - x);
    it->second.size = int64_t(x - it->first);
    chunks_[x] = tail;
  }
  void merge_around(uint64_t a) {
    auto it = chunks_.find(a);
    if (it == chunks_.end() || it->second.state != 0) return;
    for (auto n = std::next(it); n != chunks_.end() && n->first == it->first + uint64_t(it->second.size) &&
                                 n->second.state == 0 && n->second.base == it->second.base;
         n = std::next(it)) {
      it->second.size += n->second.size;
      chunks_.erase(n);
    }
    if (it != chunks_.begin()) {
      auto p = std::prev(it);
      if (p->first + uint64_t(p->second.size) == it->first && p->second.state == 0 && p->second.base == it->second.base) {
        p->second.size += it->second.size;
        chunks_.erase(it);
      }
    }
  }
  void add_free(uint64_t a, int64_t size, uint64_t base) {
    remove_range(a, size);
    chunks_[a] = Chunk{size, 0, base};
    merge_around(a);
  }
  void remove_range(uint64_t a, int64_t size) {
    const uint64_t b = a + uint64_t(size);
    split_at(a);
    split_at(b);
    for (auto it = chunks_.lower_bound(a); it != chunks_.end() && it->first < b;) it = chunks_.erase(it);
  }
  // The block the allocator handed out at `a` for a request rounded to `rounded`: the whole free
  // block unless it was split. `exact` (the final segment list's size) wins when known.
  int64_t take(uint64_t a, int64_t rounded, int64_t exact, uint8_t state = 1) {
    auto it = chunk_at(a);
    if (it == chunks_.end() || it->second.state != 0) return exact >= 0 ? exact : rounded;  // layout unknown
    if (it->first < a) {
      split_at(a);
      it = chunks_.find(a);
    }
    const int64_t free = it->second.size;
    int64_t size = detail::torch_should_split(m_, free, rounded, it->second.base == kExpandable) ? rounded : free;
    if (exact >= 0) {
      if (exact != size) ++st_.size_mismatches;
      size = exact;
    }
    if (size < free) {
      split_at(a + uint64_t(size));
    } else if (size > free) {  // the history and the layout disagree: the block wins
      for (auto n = std::next(it); n != chunks_.end() && n->first < a + uint64_t(size);) n = chunks_.erase(n);
    }
    it = chunks_.find(a);
    it->second.size = size;
    it->second.state = state;
    return size;
  }

  void alloc_block(uint64_t a, int64_t size, int64_t requested, int64_t t, int64_t stream, int32_t stack) {
    if (auto old = blocks_.find(a); old != blocks_.end()) {  // a free the history lacks
      sink_.freed(old->second.id, t);
      allocated_ -= old->second.size;
      blocks_.erase(old);
    }
    AllocationRow r;
    r.rank = rank_;
    r.device_id = device_id_;
    r.memory_kind = MemoryKind::Device;
    r.level = AllocLevel::Block;
    r.address = a;
    r.bytes = size;
    r.requested_bytes = requested;
    r.t_alloc = t;
    r.name_id = block_name(stack);
    r.stack_id = sink_.stack(stack);
    r.source = Source::Torch;
    if (const LiveSeg* s = segment_at(a)) r.segment_id = s->id;
    r.stream = stream;
    blocks_[a] = LiveBlock{sink_.add(r), size, r.name_id};
    allocated_ += size;
    ++st_.blocks;
  }

  void end_block(uint64_t a, int64_t t) {
    auto it = blocks_.find(a);
    if (it == blocks_.end()) return;
    sink_.freed(it->second.id, t);
    allocated_ -= it->second.size;
    blocks_.erase(it);
  }

  void oom(const TorchEvent& e, int64_t t, int64_t d) {
    ++st_.ooms;
    std::vector<std::pair<int64_t, int64_t>> live;  // (size, name id)
    for (auto& [a, b] : blocks_) live.emplace_back(b.size, b.name);
    std::sort(live.begin(), live.end(), [](auto& x, auto& y) { return x.first > y.first; });
    std::string msg = "CUDA out of memory. Tried to allocate " + format_bytes(double(e.size)) + " (" +
                      std::to_string(e.size) + " bytes). GPU " + std::to_string(d) + " had " +
                      format_bytes(double(e.device_free)) + " (" + std::to_string(e.device_free) +
                      " bytes) free. Of the allocated memory " + format_bytes(double(allocated_)) +
                      " is allocated by PyTorch, and " + format_bytes(double(std::max<int64_t>(0, reserved_ - allocated_))) +
                      " is reserved by PyTorch but unallocated.";
    ErrorRow r;
    r.rank = rank_;
    r.t = t;
    r.kind = "oom";
    r.site = "torch.cuda caching allocator";
    r.message = msg;
    r.device_id = device_id_;
    std::string tensors = "[";
    for (size_t k = 0; k < live.size() && k < 5; ++k) {
      std::string n = names_text(live[k].second);
      std::string esc;
      for (char c : n) {
        if (c == '"' || c == '\\') esc += '\\';
        if (static_cast<unsigned char>(c) >= 0x20) esc += c;
      }
      tensors += (k ? ",\"" : "\"") + esc + "\"";
    }
    r.tensors = tensors + "]";
    sink_.error(r);
    ooms_.push_back(msg);
  }
  std::string names_text(int64_t name_id) const {
    for (auto& [stack, id] : names_)
      if (id == name_id)
        return block_label(stack >= 0 && size_t(stack) < m_.stacks.size() ? &m_.stacks[size_t(stack)] : nullptr);
    return "torch.block";
  }

  void device(int64_t d) {
    static const std::vector<TorchEvent> kNone;
    const auto& ev = size_t(d) < m_.traces.size() ? m_.traces[size_t(d)] : kNone;
    ++st_.devices;
    st_.events += int64_t(ev.size());
    if (!ev.empty()) st_.has_history = true;
    device_id_ = sink_.device(d);
    chunks_.clear(), segs_.clear(), blocks_.clear();
    allocated_ = reserved_ = 0;

    // Entries in their order, 1 ns apart at least: time_us has a microsecond's resolution, and an
    // allocation and the free of the same address in one microsecond must keep their order.
    std::vector<int64_t> t(ev.size());
    for (size_t i = 0; i < ev.size(); ++i) t[i] = i ? std::max(clock_.ns(ev[i], i), t[i - 1] + 1) : clock_.ns(ev[i], i);
    // What existed before the history is alive 1 ns before its first entry (when the history began
    // is not known; that it was there then is), or at 0 when that entry is the clock's first: a
    // trace's times are never negative (zt/db/trace_values.h).
    const int64_t t_begin = ev.empty() ? clock_.snapshot_ns : std::max<int64_t>(0, t[0] - 1);
    touch(t_begin);
    if (!ev.empty()) touch(t.back());

    // The final state of this device: its segments and the blocks alive in them.
    std::vector<const detail::TorchSegment*> final_segs;
    std::map<uint64_t, std::pair<const detail::TorchBlock*, const detail::TorchSegment*>> final_blocks;
    for (auto& s : m_.segments) {
      if (s.device != d) continue;
      final_segs.push_back(&s);
      for (auto& b : s.blocks)
        if (b.state != 0) final_blocks[b.address] = {&b, &s};
    }

    // Pass 1: what existed before the history's first entry, and which allocation of an address
    // is the one alive at the end (its size is in the final segment list).
    std::unordered_set<uint64_t> open, pending;
    std::unordered_map<uint64_t, size_t> last_alloc;
    std::map<uint64_t, PreBlock> pre_blocks;
    std::map<uint64_t, int64_t> open_segs;
    std::vector<PreSeg> pre_segs;
    Ranges mapped;
    for (size_t i = 0; i < ev.size(); ++i) {
      const TorchEvent& e = ev[i];
      switch (e.action) {
        case TorchAction::Alloc:
          open.insert(e.addr);
          pending.erase(e.addr);
          last_alloc[e.addr] = i;
          break;
        case TorchAction::FreeRequested:
          if (!open.count(e.addr) && !pending.count(e.addr) && !pre_blocks.count(e.addr))
            pre_blocks[e.addr] = PreBlock{e.size, -1, e.stream, e.stack, false};
          open.erase(e.addr);
          pending.insert(e.addr);
          break;
        case TorchAction::FreeCompleted:
          if (!open.count(e.addr) && !pending.count(e.addr) && !pre_blocks.count(e.addr))
            pre_blocks[e.addr] = PreBlock{e.size, -1, e.stream, e.stack, true};
          open.erase(e.addr);
          pending.erase(e.addr);
          break;
        case TorchAction::SegmentAlloc: open_segs[e.addr] = e.size; break;
        case TorchAction::SegmentFree:
          if (!open_segs.erase(e.addr)) pre_segs.push_back(PreSeg{e.addr, e.size, e.stream, e.stack, false});
          break;
        case TorchAction::SegmentMap: mapped.add(e.addr, e.addr + uint64_t(e.size)); break;
        case TorchAction::SegmentUnmap:
          for (auto [a, b] : mapped.missing(e.addr, e.addr + uint64_t(e.size)))
            pre_segs.push_back(PreSeg{a, int64_t(b - a), e.stream, e.stack, true});
          mapped.remove(e.addr, e.addr + uint64_t(e.size));
          break;
        default: break;
      }
    }
    for (const auto* s : final_segs) {
      if (!s->expandable) {
        if (!open_segs.count(s->address)) pre_segs.push_back(PreSeg{s->address, s->total_size, s->stream, s->stack, false});
      } else {
        for (auto [a, b] : mapped.missing(s->address, s->address + uint64_t(s->total_size)))
          pre_segs.push_back(PreSeg{a, int64_t(b - a), s->stream, s->stack, true});
      }
    }
    std::unordered_map<size_t, int64_t> survivor_size;  // event index -> the final list's size
    for (auto& [a, fb] : final_blocks) {
      const detail::TorchBlock& b = *fb.first;
      if (open.count(a)) survivor_size[last_alloc[a]] = b.size;
      else if (!(pending.count(a) && b.state == 2))
        pre_blocks[a] = PreBlock{b.requested, b.size, fb.second->stream, b.stack, b.state == 2};
    }

    // What was there before the history began, from its first moment.
    std::sort(pre_segs.begin(), pre_segs.end(), [](auto& x, auto& y) { return x.addr < y.addr; });
    for (auto& s : pre_segs) open_segment(s.addr, s.size, t_begin, s.stream, s.stack, s.expandable);
    for (auto& [a, p] : pre_blocks) {
      const int64_t size = take(a, detail::torch_round_size(m_, p.requested), p.exact, p.pending_at_start ? 2 : 1);
      if (!p.pending_at_start) alloc_block(a, size, p.requested, t_begin, p.stream, p.stack);
    }
    st_.before_history += int64_t(pre_segs.size() + pre_blocks.size());

    // Pass 2: the history.
    for (size_t i = 0; i < ev.size(); ++i) {
      const TorchEvent& e = ev[i];
      const int64_t ti = t[i];
      switch (e.action) {
        case TorchAction::SegmentAlloc: {
          if (auto it = segs_.find(e.addr); it != segs_.end()) close_segment(it, ti);
          open_segment(e.addr, e.size, ti, e.stream, e.stack, false);
          break;
        }
        case TorchAction::SegmentFree: {
          auto it = segs_.find(e.addr);
          int64_t size = e.size;
          if (it != segs_.end()) {
            size = std::max(size, it->second.size);
            close_segment(it, ti);
          }
          remove_range(e.addr, size);
          break;
        }
        case TorchAction::SegmentMap: open_segment(e.addr, e.size, ti, e.stream, e.stack, true); break;
        case TorchAction::SegmentUnmap: {
          const uint64_t a = e.addr, b = e.addr + uint64_t(e.size);
          std::vector<std::pair<uint64_t, LiveSeg>> cut;
          for (auto it = segs_.begin(); it != segs_.end(); ++it)
            if (it->second.expandable && it->first < b && it->first + uint64_t(it->second.size) > a)
              cut.emplace_back(it->first, it->second);
          for (auto& [start, s] : cut) {
            close_segment(segs_.find(start), ti);
            const uint64_t end = start + uint64_t(s.size);
            // The mapped parts left on either side go on as new rows from here.
            if (start < a) open_segment(start, int64_t(a - start), ti, s.stream, s.stack, true);
            if (end > b) open_segment(b, int64_t(end - b), ti, s.stream, s.stack, true);
          }
          remove_range(a, e.size);
          break;
        }
        case TorchAction::Alloc: {
          auto sv = survivor_size.find(i);
          const int64_t exact = sv == survivor_size.end() ? -1 : sv->second;
          const int64_t size = take(e.addr, detail::torch_round_size(m_, e.size), exact);
          alloc_block(e.addr, size, e.size, ti, e.stream, e.stack);
          break;
        }
        case TorchAction::FreeRequested: {
          end_block(e.addr, ti);
          if (auto c = chunks_.find(e.addr); c != chunks_.end() && c->second.state == 1) c->second.state = 2;
          break;
        }
        case TorchAction::FreeCompleted: {
          end_block(e.addr, ti);  // when the history has no free_requested for it (skip_actions)
          if (auto c = chunks_.find(e.addr); c != chunks_.end()) {
            c->second.state = 0;
            merge_around(e.addr);
          }
          break;
        }
        case TorchAction::Oom: oom(e, ti, d); break;
        default: break;
      }
    }
    st_.blocks_alive_at_end += int64_t(blocks_.size());
  }

  const TorchModel& m_;
  Sink& sink_;
  Clock clock_;
  int64_t rank_;
  TorchImportStats& st_;
  int64_t device_id_ = 0;
  std::map<uint64_t, Chunk> chunks_;
  std::map<uint64_t, LiveSeg> segs_;
  std::unordered_map<uint64_t, LiveBlock> blocks_;
  std::unordered_map<int32_t, int64_t> names_;
  int64_t allocated_ = 0, reserved_ = 0;
  int64_t t_first_ = INT64_MAX, t_last_ = INT64_MIN;
  std::vector<std::string> ooms_;
};

Status read_snapshot(const std::string& path, TorchModel* m) {
  std::string bytes;
  if (Status s = read_text_file(path, "snapshot file", &bytes); !s) return s;
  if (Status s = detail::parse_snapshot(bytes, m); !s) return Status::Error(path + ": " + s.message());
  return Status::Ok();
}

void remove_files(const std::string& path) { detail::remove_trace_and_journals(path); }

// The clock of an imported snapshot: the probe's when it carries zerotrace's pair, else its own
// from its first event (see zt/db/torch_snapshot.h). *wall_ns: Unix ns at trace time 0.
Clock import_clock(const TorchModel& m, int64_t* wall_at_zero_ns, std::string* clock_words) {
  Clock c;
  if (m.clock_unix_ns && m.clock_monotonic_ns) {
    c.offset_ns = *m.clock_monotonic_ns - *m.clock_unix_ns;
    c.snapshot_ns = *m.clock_monotonic_ns;
    *wall_at_zero_ns = -c.offset_ns;
    *clock_words = "CLOCK_MONOTONIC ns (the probed process's, from the snapshot's clock pair)";
    return c;
  }
  std::optional<int64_t> first, last;
  for (auto& trace : m.traces)
    for (auto& e : trace)
      if (e.time_us) {
        first = first ? std::min(*first, *e.time_us) : *e.time_us;
        last = last ? std::max(*last, *e.time_us) : *e.time_us;
      }
  if (first) {
    c.offset_ns = -*first * 1000;
    c.snapshot_ns = (*last - *first) * 1000;
    *wall_at_zero_ns = *first * 1000;
    *clock_words = "ns since the snapshot's first event (time_us)";
  } else {
    *wall_at_zero_ns = 0;
    *clock_words = "event order: the snapshot has no timestamps, its entries are 1 us apart";
    int64_t longest = 0;
    for (auto& trace : m.traces) longest = std::max(longest, int64_t(trace.size()));
    c.snapshot_ns = longest * 1000;
  }
  return c;
}

}  // namespace

Status check_torch_snapshot(std::string_view bytes) {
  TorchModel m;
  if (Status s = detail::parse_snapshot(bytes, &m); !s) return s;
  NullSink sink;
  TorchImportStats st;
  int64_t wall = 0;
  std::string words;
  Replay(m, sink, import_clock(m, &wall, &words), 0, &st).run();
  return Status::Ok();
}

Status import_torch_snapshot(const std::string& pickle_path, const std::string& trace_path, TorchImportStats* stats) {
  TorchImportStats local;
  TorchImportStats& st = stats ? *stats : local;
  st = TorchImportStats();
  TorchModel m;
  if (Status s = read_snapshot(pickle_path, &m); !s) return s;
  int64_t wall_at_zero = 0;
  std::string clock_words;
  const Clock clock = import_clock(m, &wall_at_zero, &clock_words);
  st.on_probe_clock = m.clock_unix_ns.has_value();
  return detail::write_new_trace(trace_path, "import", pickle_path, [&](TraceWriter& w) {
    RankRow rank;
    rank.pid = m.pid;
    w.insert(rank);
    std::unordered_map<int64_t, int64_t> devices;
    auto device_row = [&](int64_t d) {
      auto [it, fresh] = devices.emplace(d, d + 1);
      if (fresh) {
        DeviceRow dr;
        dr.id = d + 1;
        dr.kind = DeviceKind::Cuda;
        dr.ordinal = d;
        dr.label = "cuda:" + std::to_string(d);
        w.insert(dr);
      }
      return it->second;
    };
    TraceSink sink(w, m, device_row);
    Replay replay(m, sink, clock, 0, &st);
    replay.run();
    RunRow run;
    run.tool_version = ZT_VERSION;
    run.command_line = "zt import " + pickle_path;
    run.config_json = R"({"imported_from":"PyTorch memory snapshot"})";
    run.pid = m.pid;
    run.t_start = replay.t_first() == INT64_MAX ? clock.snapshot_ns : std::min(replay.t_first(), clock.snapshot_ns);
    run.t_end = std::max(replay.t_last() == INT64_MIN ? run.t_start : replay.t_last(), clock.snapshot_ns);
    run.wall_start_unix_ns = wall_at_zero + run.t_start;
    if (st.ooms) {
      run.status = RunStatus::Failed;
      run.exit_detail = "the snapshot records " + std::to_string(st.ooms) + " out-of-memory error" +
                        (st.ooms == 1 ? "" : "s") + ": " + replay.oom_messages().front();
    } else {
      run.status = RunStatus::Ok;
    }
    w.insert(run);
    w.set_meta("clock", clock_words);
    w.set_meta("imported_from", "PyTorch memory snapshot " + pickle_path);
  });
}

Status merge_torch_snapshot(const std::string& trace_path, const std::string& pickle_path, const std::string& run_id,
                            TorchImportStats* stats) {
  TorchImportStats local;
  TorchImportStats& st = stats ? *stats : local;
  st = TorchImportStats();
  TorchModel m;
  if (Status s = read_snapshot(pickle_path, &m); !s) return s;
  if (!run_id.empty() && m.run_id != run_id)
    return Status::Error(pickle_path + ": written by another run (run_id " + (m.run_id.empty() ? "none" : m.run_id) +
                         ", this run's is " + run_id + ")");
  if (Status s = validate_trace_file(trace_path); !s) return s;
  const std::string tmp = trace_path + ".torch-merging";
  remove_files(tmp);
  std::error_code ec;
  std::filesystem::copy_file(trace_path, tmp, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return Status::Error(trace_path + ": cannot copy the trace to add PyTorch's history: " + ec.message());
  std::unique_ptr<TraceWriter> w;
  if (Status s = TraceWriter::append(tmp, &w); !s) {
    remove_files(tmp);
    return Status::Error(trace_path + ": " + s.message());
  }
  Status result;
  try {
    sqlite3* db = w->handle();
    const int64_t rank = detail::query_int(db, "SELECT rank FROM rank ORDER BY rank LIMIT 1", 0);
    Clock clock;
    bool timed = false;
    for (auto& trace : m.traces)
      for (auto& e : trace) timed = timed || e.time_us.has_value();
    if (m.clock_unix_ns && m.clock_monotonic_ns) {
      clock.offset_ns = *m.clock_monotonic_ns - *m.clock_unix_ns;
      clock.snapshot_ns = *m.clock_monotonic_ns;
      st.on_probe_clock = true;
    } else {
      // The run row anchors the trace's clock to Unix time.
      detail::Stmt r(db, "SELECT t_start, wall_start_unix_ns, coalesce(t_end, t_start) FROM run ORDER BY id LIMIT 1");
      if (!r.step()) throw detail::SqlError(0, "the trace has no run row");
      clock.offset_ns = r.i64(0) - r.i64(1);
      clock.snapshot_ns = r.i64(2);
    }
    if (m.events > 0 && !timed)
      throw detail::SqlError(0, pickle_path + " has no timestamps (PyTorch before 2.1): it cannot be placed on "
                                              "the trace's clock; zt import reads it as a trace of its own");
    int64_t next_device = detail::query_int(db, "SELECT coalesce(max(id), 0) + 1 FROM device", 1);
    std::unordered_map<int64_t, int64_t> devices;
    auto device_row = [&](int64_t d) -> int64_t {
      if (auto it = devices.find(d); it != devices.end()) return it->second;
      // CUPTI's row for this CUDA ordinal (the process's own numbering, as torch's), else a new one.
      detail::Stmt q(w->handle(), "SELECT id FROM device WHERE kind = " + std::to_string(int(DeviceKind::Cuda)) +
                                      " AND ordinal = ?1 ORDER BY (rank = ?2) DESC, id LIMIT 1");
      q.bind(1, d).bind(2, rank);
      int64_t id = 0;
      if (q.step()) id = q.i64(0);
      if (!id) {
        DeviceRow dr;
        dr.id = id = next_device++;
        dr.rank = rank;
        dr.kind = DeviceKind::Cuda;
        dr.ordinal = d;
        dr.label = "cuda:" + std::to_string(d);
        w->insert(dr);
      }
      devices[d] = id;
      return id;
    };
    for (int64_t d = 0; d <= m.max_device(); ++d)
      if (device_used(m, d)) device_row(d);  // looked up before the transaction
    w->begin();
    TraceSink sink(*w, m, device_row);
    Replay replay(m, sink, clock, rank, &st);
    replay.run();
    w->commit();
    w->set_meta("torch_history", std::to_string(st.blocks) + " blocks and " + std::to_string(st.segments) +
                                     " segments from PyTorch's allocator history (" + pickle_path + ")");
    if (Status s = w->finish(); !s) throw detail::SqlError(0, s.message());
    st.cupti_paired = detail::query_int(
        w->handle(), ("SELECT count(*) FROM allocation WHERE source = " + std::to_string(int(Source::Cupti)) +
                      " AND level = 1 AND segment_id IN (SELECT id FROM allocation WHERE source = " +
                      std::to_string(int(Source::Torch)) + ")")
                         .c_str());
  } catch (const std::exception& e) {
    result = Status::Error(trace_path + ": adding PyTorch's allocator history failed: " + e.what());
  }
  w.reset();
  if (result.ok() && std::rename(tmp.c_str(), trace_path.c_str()) != 0)
    result = Status::Error(trace_path + ": cannot rename the extended trace into place: " + std::strerror(errno));
  if (!result.ok()) remove_files(tmp);
  return result;
}

}  // namespace zt::db
