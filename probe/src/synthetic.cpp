#include "zt/probe/synthetic.h"

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace zt::probe {
namespace {

struct RankSim {
  Recorder& rec;
  const SyntheticOptions& opt;
  int rank;
  DeviceId gpu, host;
  int64_t t;
  std::mt19937_64 rng;
  int64_t events = 0;
  int64_t allocated = 0, reserved = 0, pinned = 0;
  NameId n_allocated = 0, n_reserved = 0, n_pinned = 0, n_loss = 0;

  int64_t jitter(int64_t ns) { return ns + static_cast<int64_t>(rng() % (ns / 8 + 1)); }

  AllocId alloc(DeviceId dev, MemoryKind kind, AllocLevel level, const std::string& name, int64_t bytes,
                AllocId segment = 0) {
    AllocEvent e;
    e.rank = rank;
    e.device = dev;
    e.memory_kind = kind;
    e.level = level;
    e.address = 0x7f0000000000ull + (static_cast<uint64_t>(rng()) & 0xffffffff000ull);
    e.bytes = bytes;
    e.name = rec.intern(name);
    e.source = Source::Synthetic;
    e.segment = segment;
    e.t = t;
    AllocId id = rec.alloc(e);
    rec.placement(rank, e.name, dev, PlacementWhy::Created, bytes, id, t);
    events += 2;
    if (kind == MemoryKind::Device) (level == AllocLevel::Block ? allocated : reserved) += bytes;
    if (kind == MemoryKind::PinnedHost && level == AllocLevel::Segment) pinned += bytes;
    return id;
  }
  void release(AllocId id, DeviceId dev, MemoryKind kind, AllocLevel level, const std::string& name, int64_t bytes) {
    rec.free(id, t);
    rec.placement(rank, rec.intern(name), dev, PlacementWhy::Freed, bytes, id, t);
    events += 2;
    if (kind == MemoryKind::Device) (level == AllocLevel::Block ? allocated : reserved) -= bytes;
    if (kind == MemoryKind::PinnedHost && level == AllocLevel::Segment) pinned -= bytes;
  }
  void counters() {
    rec.counter(rank, gpu, n_allocated, double(allocated), t);
    rec.counter(rank, gpu, n_reserved, double(reserved), t);
    rec.counter(rank, host, n_pinned, double(pinned), t);
    events += 3;
  }
  void copy(TransferKind kind, DeviceId src, DeviceId dst, int64_t bytes, const std::string& name, NameId op = 0) {
    TransferEvent x;
    x.rank = rank;
    x.kind = kind;
    x.bytes = bytes;
    x.src = src;
    x.dst = dst;
    x.pinned = kind == TransferKind::Collective ? -1 : 1;
    x.t_start = t;
    // Pinned PCIe at ~25 GB/s, NVLink collectives at ~150 GB/s.
    double gbps = kind == TransferKind::Collective ? 150.0 : 25.0;
    t += jitter(static_cast<int64_t>(double(bytes) / gbps) + 2000);
    x.t_end = t;
    x.name = rec.intern(name);
    x.op = op;
    x.participants = kind == TransferKind::Collective ? opt.ranks : 0;
    x.stream = kind == TransferKind::Collective ? 3 : (kind == TransferKind::H2D ? 1 : 2);
    rec.transfer(x);
    ++events;
  }
  MarkerId begin(MarkerKind kind, const std::string& name, int64_t step = -1, int64_t epoch = -1) {
    MarkerEvent m;
    m.rank = rank;
    m.kind = kind;
    m.name = rec.intern(name);
    m.step = step;
    m.epoch = epoch;
    m.t = t;
    ++events;
    return rec.marker_begin(m);
  }
  void end(MarkerId id) {
    rec.marker_end(id, INT64_MIN, t);
    ++events;
  }

  void run() {
    n_allocated = rec.intern("allocated");
    n_reserved = rec.intern("reserved");
    n_pinned = rec.intern("pinned");
    n_loss = rec.intern("loss");
    const int64_t shard = opt.layer_bytes / opt.ranks;
    NameId all_gather = rec.intern("all_gather"), reduce_scatter = rec.intern("reduce_scatter");
    // The caching allocator's first segment: everything below lives in it.
    AllocId segment = alloc(gpu, MemoryKind::Device, AllocLevel::Segment, "segment0",
                            opt.layer_bytes * 3 + opt.activation_bytes * opt.layers * 2);
    std::vector<AllocId> master(opt.layers);
    for (int l = 0; l < opt.layers; ++l)
      master[l] = alloc(host, MemoryKind::PinnedHost, AllocLevel::Segment, "block" + std::to_string(l) + ".master",
                        shard * 8);
    int64_t step = 0;
    std::vector<std::pair<AllocId, int64_t>> leaked;
    for (int epoch = 0; epoch < opt.epochs; ++epoch) {
      MarkerId em = begin(MarkerKind::Epoch, "epoch " + std::to_string(epoch), -1, epoch);
      for (int s = 0; s < opt.steps_per_epoch; ++s, ++step) {
        MarkerId sm = begin(MarkerKind::Step, "step " + std::to_string(step), step, epoch);
        MarkerId fw = begin(MarkerKind::Phase, "forward", step, epoch);
        std::vector<AllocId> acts;
        for (int l = 0; l < opt.layers; ++l) {
          std::string b = "block" + std::to_string(l);
          MarkerId fm = begin(MarkerKind::Phase, "fetch " + b, step, epoch);
          AllocId g = alloc(gpu, MemoryKind::Device, AllocLevel::Block, b + ".gathered", opt.layer_bytes, segment);
          copy(TransferKind::H2D, host, gpu, shard, b + ".shard");
          copy(TransferKind::Collective, gpu, gpu, opt.layer_bytes, b + ".gathered", all_gather);
          end(fm);
          acts.push_back(alloc(gpu, MemoryKind::Device, AllocLevel::Block, b + ".act", opt.activation_bytes, segment));
          t += jitter(3'000'000);
          release(g, gpu, MemoryKind::Device, AllocLevel::Block, b + ".gathered", opt.layer_bytes);
          counters();
        }
        end(fw);
        MarkerId bw = begin(MarkerKind::Phase, "backward", step, epoch);
        for (int l = opt.layers - 1; l >= 0; --l) {
          std::string b = "block" + std::to_string(l);
          AllocId g = alloc(gpu, MemoryKind::Device, AllocLevel::Block, b + ".gathered", opt.layer_bytes, segment);
          copy(TransferKind::Collective, gpu, gpu, opt.layer_bytes, b + ".gathered", all_gather);
          AllocId gr = alloc(gpu, MemoryKind::Device, AllocLevel::Block, b + ".grad", opt.layer_bytes, segment);
          t += jitter(6'000'000);
          copy(TransferKind::Collective, gpu, gpu, opt.layer_bytes, "grad.bucket" + std::to_string(l), reduce_scatter);
          copy(TransferKind::D2H, gpu, host, shard * 2, b + ".grad[shard]");
          release(gr, gpu, MemoryKind::Device, AllocLevel::Block, b + ".grad", opt.layer_bytes);
          release(g, gpu, MemoryKind::Device, AllocLevel::Block, b + ".gathered", opt.layer_bytes);
          release(acts[l], gpu, MemoryKind::Device, AllocLevel::Block, b + ".act", opt.activation_bytes);
          counters();
        }
        end(bw);
        MarkerId om = begin(MarkerKind::Phase, "optimizer", step, epoch);
        t += jitter(static_cast<int64_t>(double(shard * 8 * opt.layers) / 10.0));  // CPU Adam at ~10 GB/s
        for (int l = 0; l < opt.layers; ++l) copy(TransferKind::H2D, host, gpu, shard, "block" + std::to_string(l) + ".shard");
        end(om);
        rec.counter(rank, 0, n_loss, 4.0 * std::exp(-0.05 * double(step)) + 0.01 * double(rng() % 100) / 100.0, t);
        ++events;
        end(sm);
      }
      if (opt.leak_bytes_per_epoch > 0) {
        // The R1 pattern: offload buffers re-created at the epoch boundary, old ones kept.
        leaked.emplace_back(alloc(host, MemoryKind::PinnedHost, AllocLevel::Segment,
                                  "offload.buffer[epoch " + std::to_string(epoch) + "]", opt.leak_bytes_per_epoch),
                            opt.leak_bytes_per_epoch);
        counters();
      }
      end(em);
    }
    for (int l = 0; l < opt.layers; ++l)
      release(master[l], host, MemoryKind::PinnedHost, AllocLevel::Segment, "block" + std::to_string(l) + ".master",
              shard * 8);
    release(segment, gpu, MemoryKind::Device, AllocLevel::Segment, "segment0",
            opt.layer_bytes * 3 + opt.activation_bytes * opt.layers * 2);
    counters();
  }
};

}  // namespace

int64_t record_synthetic(Recorder& rec, const SyntheticOptions& opt) {
  std::vector<std::unique_ptr<RankSim>> sims;
  int64_t t0 = now_ns();
  for (int r = 0; r < opt.ranks; ++r) {
    rec.add_rank(r, opt.ranks, r);
    DeviceId gpu = rec.add_device(r, DeviceKind::Sim, r, "cuda:" + std::to_string(r), "simulated GPU (synthetic)",
                                  opt.device_capacity, true);
    DeviceId host = rec.add_device(r, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false);
    sims.push_back(std::unique_ptr<RankSim>(
        new RankSim{rec, opt, r, gpu, host, t0, std::mt19937_64(opt.seed * 7919 + r)}));
  }
  std::vector<std::thread> threads;
  for (auto& s : sims) threads.emplace_back([&s] { s->run(); });
  for (auto& t : threads) t.join();
  int64_t total = 0;
  for (auto& s : sims) total += s->events;
  return total;
}

}  // namespace zt::probe
