#include "ckpt/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "ckpt/safetensors.h"
#include "model/layout.h"
#include "zt/common/files.h"
#include "zt/common/units.h"
#include "zt/fail/failpoint.h"

namespace zt::trainer::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kShardMagic[8] = {'Z', 'T', 'C', 'K', 'S', 'H', 'R', 'D'};
constexpr char kTrailerMagic[8] = {'Z', 'T', 'C', 'K', 'E', 'N', 'D', '\0'};
constexpr uint32_t kHeaderBytes = 128;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kFormatName = "zerotrace-checkpoint";

std::string shard_name(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "rank%05d.zts", rank);
  return b;
}

// "ck/" -> "ck", so paths in messages read "ck/step000004/...".
std::string without_trailing_slash(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// The step of a tag "step000123", or -1 when the name is not a tag.
int64_t step_of_tag(const std::string& name) {
  if (name.size() < 5 || name.compare(0, 4, "step") != 0) return -1;
  int64_t v = 0;
  for (size_t i = 4; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// The tag `latest` names, or "" with *problem saying why it names none ("is missing", "is a
// directory, not a file", "holds 'a\x00b...', which is not a checkpoint tag"). A tag is a plain
// name (letters, digits, '_', '-', '.'; not starting with '.'), so it never leads out of DIR or
// reaches the terminal as binary.
std::string read_latest(const std::string& dir, std::string* problem = nullptr) {
  const std::string path = dir + "/latest";
  auto none = [&](const std::string& why) {
    if (problem) *problem = path + " " + why;
    return std::string();
  };
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) return none("is missing");
  if (!fs::is_regular_file(st)) return none(fs::is_directory(st) ? "is a directory, not a file" : "is not a regular file");
  std::ifstream in(path, std::ios::binary);
  char buf[257];
  in.read(buf, sizeof buf);
  std::string tag(buf, size_t(in.gcount()));
  if (const size_t nl = tag.find('\n'); nl != std::string::npos) tag.resize(nl);
  while (!tag.empty() && (tag.back() == '\r' || tag.back() == ' ')) tag.pop_back();
  bool plain = !tag.empty() && tag.size() <= 255 && tag[0] != '.';
  for (char c : tag) plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.');
  if (!plain) return none(tag.empty() ? "is empty" : "holds '" + printable(tag, 40) + "', which is not a checkpoint tag");
  if (problem) problem->clear();
  return tag;
}

// Tags in DIR, newest first.
std::vector<std::string> list_tags(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (step_of_tag(n) >= 0 && e.is_directory(ec)) found.emplace_back(step_of_tag(n), n);
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

// ---------------------------------------------------------------- reading shards

struct ShardHeader {
  uint32_t version = 0, rank = 0, world = 0, stage = 0, modules = 0;
  Position pos;
  ZeroEngine::OptimizerScalars scalars;
  uint64_t seed = 0;
};

ShardHeader read_shard_header(FileReader& r) {
  const std::string& path = r.path();
  char header[kHeaderBytes];
  r.read(header, sizeof header);
  auto at = [&](size_t off, auto v) {
    std::memcpy(&v, header + off, sizeof v);
    return v;
  };
  if (std::memcmp(header, kShardMagic, 8) != 0) throw CheckpointError(path + ": not a zerotrace checkpoint shard (bad magic)");
  ShardHeader h;
  h.version = at(8, uint32_t());
  if (h.version != 1 && h.version != kFormatVersion)
    throw CheckpointError(path + ": shard format version " + std::to_string(h.version) + "; this build reads versions 1 and " +
                          std::to_string(kFormatVersion));
  if (at(12, uint32_t()) != kHeaderBytes) throw CheckpointError(path + ": unexpected header size");
  h.rank = at(16, uint32_t());
  h.world = at(20, uint32_t());
  h.stage = at(24, uint32_t());
  h.modules = at(28, uint32_t());
  h.pos = {at(32, int64_t()), at(40, int64_t()), at(48, int64_t())};
  h.scalars.adam_steps = at(56, int64_t());
  h.scalars.loss_scale = at(64, double());
  h.scalars.good_steps = at(72, int64_t());
  h.scalars.hysteresis_left = at(80, int64_t());
  h.seed = at(88, uint64_t());
  return h;
}

struct ModuleRecord {
  std::string name;
  int64_t numel = 0, padded = 0, shard = 0, opt_lo = 0, opt_n = 0;
};

ModuleRecord read_module_record(FileReader& r) {
  ModuleRecord m;
  const uint32_t len = r.get<uint32_t>();
  if (len > 4096) throw CheckpointError(r.path() + ": a module name of " + std::to_string(len) + " bytes (corrupted)");
  m.name.assign(len, '\0');
  r.read(m.name.data(), len);
  for (int64_t* d : {&m.numel, &m.padded, &m.shard, &m.opt_lo, &m.opt_n}) *d = r.get<int64_t>();
  if (m.numel < 0 || m.padded < m.numel || m.opt_lo < 0 || m.opt_n < 0 || m.opt_lo + m.opt_n > m.padded)
    throw CheckpointError(r.path() + ": module '" + m.name + "' has an impossible range (numel " + std::to_string(m.numel) +
                          ", padded " + std::to_string(m.padded) + ", optimizer [" + std::to_string(m.opt_lo) + ", +" +
                          std::to_string(m.opt_n) + ")): corrupted");
  return m;
}

// The trailer, read after the last module: the bytes read are the bytes written.
void check_trailer(FileReader& r) {
  const uint64_t computed = r.checksum();
  const uint64_t stored = r.get<uint64_t>();
  char magic[8];
  r.read(magic, 8);
  if (std::memcmp(magic, kTrailerMagic, 8) != 0 || stored != computed || !r.at_end())
    throw CheckpointError(r.path() + ": the trailer does not match the contents (corrupted; checksum " + hex64(computed) +
                          ", stored " + hex64(stored) + ")");
}

// Every shard of a checkpoint, read module by module in lockstep: to re-split the optimizer
// state for another world size, or to consolidate the master weights. Memory: one module.
class ShardSet {
 public:
  ShardSet(const std::string& path, const Manifest& man) {
    for (int r = 0; r < man.world_size; ++r) {
      readers_.push_back(std::make_unique<FileReader>(path + "/" + shard_name(r), man.checksum));
      const ShardHeader h = read_shard_header(*readers_.back());
      const std::string& p = readers_.back()->path();
      if (int(h.rank) != r || int(h.world) != man.world_size)
        throw CheckpointError(p + ": the header says rank " + std::to_string(h.rank) + " of " + std::to_string(h.world) +
                              "; the manifest lists it as rank " + std::to_string(r) + " of " + std::to_string(man.world_size));
      if (h.modules != man.modules.size())
        throw CheckpointError(p + ": " + std::to_string(h.modules) + " modules; the manifest lists " +
                              std::to_string(man.modules.size()));
      if (r == 0) {
        scalars = h.scalars;
        pos = h.pos;
      } else if (h.pos.global_step != pos.global_step) {
        throw CheckpointError(p + ": saved at step " + std::to_string(h.pos.global_step) + ", rank 0's shard at step " +
                              std::to_string(pos.global_step) + " (shards of different saves)");
      }
    }
  }

  // Reads the next module of every shard and copies the elements [lo, lo + n) of the module
  // (those below numel: padding stays as the caller left it) of master, m and v into out[0..2]
  // (indexed from lo; a null array is read past).
  void next_module(const std::string& name, int64_t numel, int64_t lo, int64_t n, float* const out[3]) {
    for (auto& r : readers_) {
      const ModuleRecord rec = read_module_record(*r);
      if (rec.name != name || rec.numel != numel)
        throw CheckpointError(r->path() + ": module '" + rec.name + "' with " + std::to_string(rec.numel) +
                              " parameters; this model has '" + name + "' with " + std::to_string(numel) +
                              " (a different model)");
      const int64_t a = std::max(rec.opt_lo, lo), b = std::min({rec.opt_lo + rec.opt_n, lo + n, numel});
      tmp_.resize(size_t(rec.opt_n));
      for (int k = 0; k < 3; ++k) {
        r->read(tmp_.data(), tmp_.size() * sizeof(float));
        if (out[k] && b > a) std::memcpy(out[k] + (a - lo), tmp_.data() + (a - rec.opt_lo), size_t(b - a) * sizeof(float));
      }
    }
  }
  void finish() {
    for (auto& r : readers_) check_trailer(*r);
  }

  ZeroEngine::OptimizerScalars scalars;
  Position pos;

 private:
  std::vector<std::unique_ptr<FileReader>> readers_;
  std::vector<float> tmp_;
};

// The save's temporary device memory, as a counter on the rank's device (0: no gather).
void record_peak(const ZeroEngine& engine, int rank, probe::Recorder* rec, int64_t bytes) {
  if (rec) rec->counter(rank, engine.accelerator_trace_id(), rec->intern("checkpoint.peak_temp_device_bytes"), double(bytes));
}

std::map<std::string, std::string> weights_metadata(const std::string& tag, int64_t global_step, const std::string& source) {
  return {{"format", "pt"}, {"producer", "zerotrace"}, {"checkpoint", tag}, {"global_step", std::to_string(global_step)},
          {"source", source}};
}

}  // namespace

int64_t Manifest::total_bytes() const {
  int64_t b = 0;
  for (const auto& f : files) b += f.bytes;
  for (const auto& f : model_files) b += f.bytes;
  return b;
}

std::string tag_for_step(int64_t global_step) {
  char b[32];
  std::snprintf(b, sizeof b, "step%06lld", static_cast<long long>(global_step));
  return b;
}

// ---------------------------------------------------------------- save

int64_t save(const std::string& dir_arg, const TrainConfig& cfg, const Position& pos, ZeroEngine& engine,
             Communicator& comm, const SaveOptions& options, SaveReport* report) {
  const std::string dir = without_trailing_slash(dir_arg);
  const std::string tag = tag_for_step(pos.global_step);
  const std::string tmp = dir + "/.tmp-" + tag, final_dir = dir + "/" + tag;
  const int rank = comm.rank(), W = comm.world_size();
  const fail::Context ctx{rank, options.step, -1, options.epoch, options.rec};
  // A delayed parameter update still in flight is applied first (every rank saves: it is
  // collective): the save holds the weights after the step it is named for, and the run goes
  // on from there as a run resumed from it would.
  engine.finish_update();
  // Every boundary between two writes (crash tests stop the process at the Nth).
  auto boundary = [&](const std::string& what) { ZT_FAIL_D("ckpt.between_writes", ctx, what); };

  SaveReport rep;
  rep.optimizer_state = !cfg.save_only_model;
  rep.weights = cfg.save_only_model || cfg.save_safetensors || cfg.zero.gather_16bit_weights_on_model_save;
  // save_only_model streams (the maintainers' advice in R4: no full gather).
  auto how = cfg.checkpoint_gather == "device" && !cfg.save_only_model ? ZeroEngine::WeightsGather::Device
                                                                       : ZeroEngine::WeightsGather::Streamed;
  // The fault is the full-state save's gather; save_only_model does not take that path (R4's cure).
  // Where no module is sharded (every one under the persistence threshold) there is no gather for
  // it to act on, and it is not evaluated (its row claimed a gather that never happened).
  if (rep.weights && !cfg.save_only_model && engine.has_sharded_modules() &&
      ZT_FAIL_D("ckpt.gather_on_device", ctx, "the consolidated weights gathered on the device all at once")) {
    how = ZeroEngine::WeightsGather::Device;
    rep.gather_forced_by_fault = true;
  }
  if (rep.weights) rep.gather = how == ZeroEngine::WeightsGather::Device ? "device" : "streamed";
  const DType dtype = engine.compute_dtype();

  // Virtual mode: the gathers and the staging happen (allocations and transfers, where R4
  // runs out of memory at full size); no byte exists to write.
  if (cfg.virtual_mode) {
    rep.files_written = false;
    if (rep.weights) {
      const ZeroEngine::GatherStats gs = engine.gather_weights(how, rank == 0, [](const ZeroEngine::ModuleLayout&, const void*) {});
      rep.peak_temp_device_bytes = gs.peak_temp_device_bytes;
      rep.gathered_modules = gs.gathered_modules;
    }
    if (rep.optimizer_state)
      engine.export_states([](const ZeroEngine::ModuleLayout&, const float*, const float*, const float*) {});
    record_peak(engine, rank, options.rec, rep.peak_temp_device_bytes);
    if (report) *report = rep;
    return 0;
  }

  const model::Config mc = engine.model_config();  // GPT-2's layout gives the Hugging Face names

  // 1. A fresh temporary directory (a stale one is what an interrupted save left).
  if (rank == 0) {
    std::error_code ec;
    const bool created = fs::create_directories(dir, ec);
    if (ec) throw CheckpointError("cannot create the checkpoint directory " + dir + ": " + ec.message());
    if (created) {  // DIR's own entry must survive a crash too
      fs::path p = fs::absolute(fs::path(dir)).lexically_normal();
      if (!p.has_filename()) p = p.parent_path();  // "ck/" names "ck"
      fsync_dir(p.parent_path().string());
    }
    fs::remove_all(tmp, ec);
    if (ec) throw CheckpointError("cannot remove the stale " + tmp + ": " + ec.message());
    if (!fs::create_directory(tmp, ec) || ec)
      throw CheckpointError("cannot create " + tmp + ": " + (ec ? ec.message() : "it exists"));
    boundary("after " + tmp + " created");
  }
  comm.barrier();

  int64_t written = 0;
  std::vector<Manifest::File> model_files;
  // 2. The consolidated weights: every rank gathers, rank 0 writes as the modules arrive.
  if (rep.weights) {
    std::unique_ptr<SafetensorsWriter> st;
    if (rank == 0)
      st = std::make_unique<SafetensorsWriter>(tmp + "/" + kWeightsFile, gpt2_hf_tensors(mc, dtype),
                                               weights_metadata(tag, pos.global_step, "compute-dtype weights"));
    const ZeroEngine::GatherStats gs =
        engine.gather_weights(how, rank == 0, [&](const ZeroEngine::ModuleLayout& l, const void* values) {
          write_gpt2_module(*st, mc, l.index, values, dtype);
        });
    rep.peak_temp_device_bytes = gs.peak_temp_device_bytes;
    rep.gathered_modules = gs.gathered_modules;
    if (rank == 0) {
      st->finish();
      boundary("after " + std::string(kWeightsFile) + " written");
      st->sync_and_close();
      boundary("after " + std::string(kWeightsFile) + " fsync");
      model_files.push_back({kWeightsFile, -1, st->bytes(), st->checksum()});
      rep.weights_bytes = st->bytes();
      FileWriter cw(tmp + "/" + kHfConfigFile);
      const std::string text = gpt2_hf_config_json(mc, dtype);
      cw.write(text.data(), text.size());
      cw.flush();
      boundary("after " + std::string(kHfConfigFile) + " written");
      cw.sync_and_close();
      boundary("after " + std::string(kHfConfigFile) + " fsync");
      model_files.push_back({kHfConfigFile, -1, cw.bytes(), cw.checksum()});
      for (const auto& f : model_files) written += f.bytes;
    }
  }

  // 3. This rank's shard.
  const std::vector<ZeroEngine::ModuleLayout> layout = engine.checkpoint_layout();
  struct Digest {
    int64_t bytes = 0;
    uint64_t sum = 0;
    int64_t torn = 0;  // ckpt.torn_write fired on this rank
  };
  Digest mine;
  if (rep.optimizer_state) {
    const std::string name = shard_name(rank);
    FileWriter w(tmp + "/" + name);
    const ZeroEngine::OptimizerScalars sc = engine.checkpoint_scalars();
    char header[kHeaderBytes] = {};
    auto at = [&](size_t off, const auto& v) { std::memcpy(header + off, &v, sizeof v); };
    std::memcpy(header, kShardMagic, 8);
    at(8, kFormatVersion);
    at(12, kHeaderBytes);
    at(16, uint32_t(rank));
    at(20, uint32_t(W));
    at(24, uint32_t(engine.settings().stage));
    at(28, uint32_t(layout.size()));
    at(32, pos.global_step);
    at(40, pos.epoch);
    at(48, pos.step_in_epoch);
    at(56, sc.adam_steps);
    at(64, sc.loss_scale);
    at(72, sc.good_steps);
    at(80, sc.hysteresis_left);
    at(88, uint64_t(cfg.seed));
    w.write(header, sizeof header);
    engine.export_states([&](const ZeroEngine::ModuleLayout& l, const float* master, const float* m, const float* v) {
      w.put(uint32_t(l.name.size()));
      w.write(l.name.data(), l.name.size());
      for (int64_t x : {l.numel, l.padded, l.shard, l.opt_lo, l.opt_n}) w.put(x);
      for (const float* a : {master, m, v}) w.write(a, size_t(l.opt_n) * sizeof(float));
    });
    const uint64_t body_hash = w.checksum();
    w.put(body_hash);
    w.write(kTrailerMagic, 8);
    w.flush();
    boundary("after " + name + " written");
    w.sync_and_close();
    boundary("after " + name + " fsync");
    mine.bytes = w.bytes();
    mine.sum = w.checksum();
    written += mine.bytes;
  }
  mine.torn = ZT_FAIL_D("ckpt.torn_write", ctx, "the save stops after the shards, before the manifest: " + tmp + " is left torn")
                  ? 1
                  : 0;
  std::vector<Digest> all(static_cast<size_t>(W));
  comm.all_gather(&mine, all.data(), sizeof(Digest), "checkpoint.digests");
  for (int r = 0; r < W; ++r)
    if (all[size_t(r)].torn)
      throw CheckpointError("checkpoint save interrupted (fault ckpt.torn_write) on rank " + std::to_string(r) +
                            ": stopped after the shards, before the manifest; " + tmp + " is left torn");

  // 4. Rank 0 commits: manifest last inside the directory, then the rename, then `latest`.
  if (rank == 0) {
    const char* sum_key = checksum_name(ChecksumKind::Xxh64);
    json j;
    j["format"] = kFormatName;
    j["version"] = kFormatVersion;
    j["tag"] = tag;
    j["checksum"] = sum_key;
    j["world_size"] = W;
    j["zero_stage"] = engine.settings().stage;
    j["global_step"] = pos.global_step;
    j["epoch"] = pos.epoch;
    j["step_in_epoch"] = pos.step_in_epoch;
    j["seed"] = cfg.seed;
    j["save_only_model"] = cfg.save_only_model;
    j["config"] = json::parse(to_json(cfg), nullptr, false);
    j["model_config"] = {{"vocab", mc.vocab}, {"context", mc.context}, {"layers", mc.layers}, {"heads", mc.heads},
                         {"width", mc.width}};
    json mods = json::array();
    for (const auto& l : layout)
      mods.push_back({{"index", l.index}, {"name", l.name}, {"numel", l.numel}, {"padded", l.padded}, {"shard", l.shard}});
    j["modules"] = mods;
    json files = json::array();
    if (rep.optimizer_state)
      for (int r = 0; r < W; ++r)
        files.push_back({{"name", shard_name(r)}, {"rank", r}, {"bytes", all[size_t(r)].bytes}, {sum_key, hex64(all[size_t(r)].sum)}});
    j["files"] = files;
    if (rep.weights) {
      json mf = json::array();
      for (const auto& f : model_files) mf.push_back({{"name", f.name}, {"bytes", f.bytes}, {sum_key, hex64(f.sum)}});
      j["model_files"] = mf;
      j["weights"] = {{"dtype", std::string(dtype_name(dtype))},
                      {"gather", rep.gather},
                      {"peak_temp_device_bytes", rep.peak_temp_device_bytes}};
    }
    const std::string text = j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
    {
      FileWriter mw(tmp + "/" + kManifest);
      mw.write(text.data(), text.size());
      mw.flush();
      boundary("after " + std::string(kManifest) + " written");
      mw.sync_and_close();
      boundary("after " + std::string(kManifest) + " fsync");
    }
    fsync_dir(tmp);
    boundary("after " + tmp + " fsync");
    written += int64_t(text.size());

    // Saving a tag that exists (a resumed run reaching it again): move the old one aside,
    // so the rename below lands on a free name, and remove it once the new one is durable.
    const std::string old_dir = dir + "/.old-" + tag;
    std::error_code ec;
    const bool replacing = fs::exists(final_dir, ec);
    if (replacing) {
      fs::remove_all(old_dir, ec);
      rename_or_throw(final_dir, old_dir);
      boundary("after " + final_dir + " moved aside to " + old_dir);
    }
    rename_or_throw(tmp, final_dir);
    boundary("after rename of " + tmp + " to " + final_dir);
    fsync_dir(dir);
    boundary("after " + dir + " fsync (the rename is durable)");
    if (replacing) {
      fs::remove_all(old_dir, ec);
      boundary("after " + old_dir + " removed");
    }

    const std::string pointer = tag + "\n";
    {
      FileWriter lw(dir + "/latest.tmp");
      lw.write(pointer.data(), pointer.size());
      lw.flush();
      boundary("after latest.tmp written");
      lw.sync_and_close();
      boundary("after latest.tmp fsync");
    }
    rename_or_throw(dir + "/latest.tmp", dir + "/latest");
    boundary("after rename of latest.tmp to latest");
    fsync_dir(dir);
    written += int64_t(pointer.size());
  }
  comm.barrier();  // nobody goes on (or starts the next save) before the commit is done
  rep.bytes = written;
  record_peak(engine, rank, options.rec, rep.peak_temp_device_bytes);
  if (report) *report = rep;
  return written;
}

// ---------------------------------------------------------------- verify and select

namespace {
// A manifest's numbers: a count (world size, batch, model dimensions) below 2^24, a size or step
// below 2^53.
constexpr int64_t kMaxManifestCount = int64_t(1) << 24;
constexpr int64_t kMaxManifestSize = int64_t(1) << 53;

struct BadField {
  std::string what;
};

// obj[key] as a whole number in [lo, hi], or BadField naming the key and the value.
int64_t manifest_int(const json& obj, const char* key, int64_t lo, int64_t hi, const std::string& where = "") {
  const json& v = obj.at(key);
  int64_t x = 0;
  bool ok = false;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    ok = u <= uint64_t(INT64_MAX) && int64_t(u) >= lo && int64_t(u) <= hi;
    x = ok ? int64_t(u) : 0;
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
    ok = x >= lo && x <= hi;
  } else if (v.is_number_float()) {
    // Compared as a double before any conversion (1e30 converted to an integer is undefined).
    const double d = v.get<double>();
    ok = d == std::floor(d) && d >= double(lo) && d <= double(hi);
    x = ok ? int64_t(d) : 0;
  }
  if (!ok)
    throw BadField{where + key + " " + v.dump() + " must be a whole number in " + std::to_string(lo) + " .. " +
                   std::to_string(hi)};
  return x;
}

// 16 hexadecimal digits, as hex64 writes them.
bool parse_hex64(const std::string& text, uint64_t* out) {
  if (text.size() != 16) return false;
  uint64_t v = 0;
  for (char c : text) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | uint64_t(d);
  }
  *out = v;
  return true;
}
}  // namespace

Status verify_checkpoint(const std::string& dir, const std::string& tag, Manifest* out) {
  const std::string path = without_trailing_slash(dir) + "/" + tag;
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    return Status::Error(path + (fs::exists(path, ec) ? ": not a directory (a checkpoint directory is expected)" : ": no such checkpoint directory"));
  const std::string mpath = path + "/" + kManifest;
  std::ifstream in(mpath);
  if (!in) return Status::Error(mpath + " is missing: the save did not finish (a partial checkpoint)");
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Error(mpath + ": not valid JSON (a torn or corrupted manifest)");
  Manifest m;
  try {
    if (j.value("format", "") != kFormatName) return Status::Error(mpath + ": not a zerotrace checkpoint manifest");
    // Every number in its range before it sizes or counts anything: a world_size of 1e30 read
    // as an int was -2147483648.
    m.version = uint32_t(manifest_int(j, "version", 0, UINT32_MAX));
    if (m.version != 1 && m.version != kFormatVersion)
      return Status::Error(mpath + ": checkpoint format version " + std::to_string(m.version) +
                           "; this build reads versions 1 and " + std::to_string(kFormatVersion));
    const std::string sum_key = j.value("checksum", "");
    if (!parse_checksum(sum_key, &m.checksum))
      return Status::Error(mpath + ": unknown checksum '" + printable(sum_key) + "' (this build knows xxh64 and fnv1a64)");
    m.tag = j.at("tag").get<std::string>();
    m.world_size = int(manifest_int(j, "world_size", 1, kMaxManifestCount));
    m.stage = int(manifest_int(j, "zero_stage", 0, 3));
    m.pos.global_step = manifest_int(j, "global_step", 0, kMaxManifestSize);
    m.pos.epoch = manifest_int(j, "epoch", 0, kMaxManifestSize);
    m.pos.step_in_epoch = manifest_int(j, "step_in_epoch", 0, kMaxManifestSize);
    const json& seed = j.at("seed");
    if (!(seed.is_number_unsigned() || (seed.is_number_integer() && seed.get<int64_t>() >= 0)))
      throw BadField{"seed " + seed.dump() + " must be a whole number of 0 or more"};
    m.seed = seed.get<uint64_t>();
    m.model_only = j.value("save_only_model", false);
    if (j.contains("config") && j["config"].is_object()) {
      const json& c = j["config"];
      m.model = c.value("model", "");
      if (c.contains("micro_batch")) m.micro_batch = manifest_int(c, "micro_batch", 0, kMaxManifestCount, "config.");
      if (c.contains("grad_accum")) m.grad_accum = manifest_int(c, "grad_accum", 0, kMaxManifestCount, "config.");
    }
    if (j.contains("model_config") && j["model_config"].is_object()) {
      const json& c = j["model_config"];
      auto dim = [&](const char* k) { return manifest_int(c, k, 1, kMaxManifestCount, "model_config."); };
      m.model_config = model::Config{dim("vocab"), dim("context"), dim("layers"), dim("heads"), dim("width")};
    }
    if (j.contains("modules")) {
      const json& modules = j.at("modules");
      if (!modules.is_array() || modules.size() > size_t(kMaxManifestCount))
        throw BadField{"modules must be a list (of at most " + std::to_string(kMaxManifestCount) + " modules)"};
      for (const auto& x : modules)
        m.modules.push_back({x.at("name").get<std::string>(), manifest_int(x, "numel", 0, kMaxManifestSize, "modules[]."),
                             manifest_int(x, "padded", 0, kMaxManifestSize, "modules[]."),
                             manifest_int(x, "shard", 0, kMaxManifestSize, "modules[].")});
    }
    auto file = [&](const json& f, int rank, const char* list) {
      Manifest::File file;
      file.name = f.at("name").get<std::string>();
      file.rank = rank;
      file.bytes = manifest_int(f, "bytes", 0, kMaxManifestSize, std::string(list) + "[].");
      const std::string sum = f.at(sum_key).get<std::string>();
      if (!parse_hex64(sum, &file.sum))
        throw BadField{std::string(list) + "[]." + sum_key + " '" + printable(sum) + "' for " + printable(file.name) +
                       " is not a checksum (16 hexadecimal digits)"};
      return file;
    };
    for (const auto& f : j.at("files"))
      m.files.push_back(file(f, int(manifest_int(f, "rank", 0, m.world_size - 1, "files[].")), "files"));
    if (j.contains("model_files"))
      for (const auto& f : j.at("model_files")) m.model_files.push_back(file(f, -1, "model_files"));
    if (j.contains("weights")) m.weights_dtype = j["weights"].value("dtype", "");
  } catch (const BadField& e) {
    return Status::Error(mpath + ": " + e.what);
  } catch (const std::exception& e) {
    return Status::Error(mpath + ": a field is missing or malformed (" + e.what() + ")");
  }
  if (m.tag != tag) return Status::Error(mpath + ": names tag '" + m.tag + "' but lives in " + path);
  const size_t shards = m.model_only ? 0 : size_t(m.world_size);
  if (m.files.size() != shards)
    return Status::Error(mpath + ": lists " + std::to_string(m.files.size()) + " shard files for world size " +
                         std::to_string(m.world_size) + (m.model_only ? " (a weights-only checkpoint has none)" : ""));
  if (m.model_only && m.model_files.empty())
    return Status::Error(mpath + ": a weights-only checkpoint (save_only_model) that lists no model files");
  std::vector<Manifest::File> all = m.files;
  all.insert(all.end(), m.model_files.begin(), m.model_files.end());
  for (const auto& f : all)
    if (f.name.find('/') != std::string::npos || f.name.empty() || f.name[0] == '.')
      return Status::Error(mpath + ": bad file name '" + f.name + "'");
  // Every file read and checksummed, several at once (as the ranks would each read their own).
  struct Hashed {
    bool found = false;
    int64_t bytes = 0;
    uint64_t sum = 0;
  };
  std::vector<Hashed> hashed(all.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < all.size();)
      hashed[i].found = hash_file(path + "/" + all[i].name, m.checksum, &hashed[i].bytes, &hashed[i].sum);
  };
  const size_t workers = std::min<size_t>(all.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (size_t t = 1; t < workers; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < all.size(); ++i) {
    const Manifest::File& f = all[i];
    const std::string fpath = path + "/" + f.name;
    const int64_t bytes = hashed[i].bytes;
    const uint64_t sum = hashed[i].sum;
    const std::string what = f.rank >= 0 ? "rank " + std::to_string(f.rank) + "'s shard" : "the consolidated weights";
    if (!hashed[i].found) return Status::Error(fpath + " is missing (" + what + ")");
    if (bytes != f.bytes)
      return Status::Error(fpath + " is " + std::to_string(bytes) + " bytes; the manifest says " + std::to_string(f.bytes) +
                           " (truncated or torn)");
    if (sum != f.sum)
      return Status::Error(fpath + ": checksum " + checksum_name(m.checksum) + " " + hex64(sum) +
                           " does not match the manifest's " + hex64(f.sum) + " (the file is corrupted)");
  }
  if (out) *out = std::move(m);
  return Status::Ok();
}

Status select_checkpoint(const std::string& dir_arg, Selected* out, bool need_optimizer_state) {
  const std::string dir = without_trailing_slash(dir_arg);
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::Error(dir + (fs::exists(dir, ec) ? ": not a directory (a checkpoint directory is expected)" : ": no such checkpoint directory"));
  std::vector<std::string> candidates;
  std::string latest_problem;
  const std::string latest = read_latest(dir, &latest_problem);
  if (!latest.empty()) candidates.push_back(latest);
  for (auto& t : list_tags(dir))
    if (t != latest) candidates.push_back(t);
  std::string notes;
  std::vector<std::string> refused;  // the error's parts, when none is complete
  if (latest.empty() && !candidates.empty()) notes += latest_problem + "; looking for the newest complete checkpoint\n";
  for (const auto& tag : candidates) {
    Manifest m;
    Status s = verify_checkpoint(dir, tag, &m);
    if (s && need_optimizer_state && m.model_only)
      s = Status::Error(dir + "/" + tag +
                        " holds only the model weights (saved with save_only_model: no optimizer state), so training "
                        "cannot resume from it; `zt ckpt consolidate` reads its weights");
    if (!s) {
      notes += "checkpoint " + dir + "/" + tag + (tag == latest ? " (latest)" : "") + " refused: " + s.message() + "\n";
      refused.push_back(tag + (tag == latest ? " (latest)" : "") + ": " + s.message());
      continue;
    }
    if (!notes.empty()) notes += "falling back to " + dir + "/" + tag + " (step " + std::to_string(m.pos.global_step) + ")\n";
    out->dir = dir;
    out->manifest = std::move(m);
    out->notes = notes;
    return Status::Ok();
  }
  if (candidates.empty()) return Status::Error(dir + ": no checkpoint to resume from");
  // One line, every refused checkpoint and why.
  std::string why;
  for (const auto& r : refused) why += (why.empty() ? "" : "; ") + r;
  return Status::Error(dir + ": no complete checkpoint to " + (need_optimizer_state ? "resume from" : "read") + " (" + why + ")");
}

// ---------------------------------------------------------------- load

Position load(const Selected& sel, int rank, ZeroEngine& engine) {
  const Manifest& man = sel.manifest;
  const std::string path = sel.dir + "/" + man.tag;
  if (man.model_only)
    throw CheckpointError(path + " holds only the model weights (save_only_model): training cannot resume from it");
  const std::vector<ZeroEngine::ModuleLayout> layout = engine.checkpoint_layout();
  const int W = layout.empty() || layout[0].shard == 0 ? 1 : int(layout[0].padded / layout[0].shard);
  if (!man.modules.empty()) {
    if (man.modules.size() != layout.size())
      throw CheckpointError(path + "/" + kManifest + ": " + std::to_string(man.modules.size()) +
                            " modules; this run's model has " + std::to_string(layout.size()) + " (a different model?)");
    for (size_t i = 0; i < layout.size(); ++i)
      if (man.modules[i].name != layout[i].name || man.modules[i].numel != layout[i].numel)
        throw CheckpointError(path + "/" + kManifest + ": module " + std::to_string(i) + " is '" + man.modules[i].name +
                              "' with " + std::to_string(man.modules[i].numel) + " parameters; this run has '" +
                              layout[i].name + "' with " + std::to_string(layout[i].numel) + " (a different model)");
  }
  const bool same_split = man.world_size == W && (man.stage == 0) == (engine.settings().stage == 0);

  if (!same_split) {
    // Consolidate, then split: every old shard, module by module; this rank keeps its range.
    if (man.modules.empty())
      throw CheckpointError(path + "/" + kManifest + ": lists no modules; cannot re-split it for another world size");
    ShardSet set(path, man);
    engine.import_states(set.scalars, [&](const ZeroEngine::ModuleLayout& l, float* master, float* m, float* v) {
      float* const out[3] = {master, m, v};
      for (float* a : out) std::fill(a, a + l.opt_n, 0.0f);  // the padding beyond numel
      set.next_module(l.name, l.numel, l.opt_lo, l.opt_n, out);
      if (size_t(l.index + 1) == layout.size()) set.finish();  // before anything collective happens
    });
    return set.pos;
  }

  FileReader r(path + "/" + shard_name(rank), man.checksum);
  const ShardHeader h = read_shard_header(r);
  if (int(h.rank) != rank || int(h.world) != man.world_size)
    throw CheckpointError(r.path() + ": the header says rank " + std::to_string(h.rank) + " of " + std::to_string(h.world) +
                          "; expected rank " + std::to_string(rank) + " of " + std::to_string(man.world_size));
  if (h.modules != layout.size())
    throw CheckpointError(r.path() + ": " + std::to_string(h.modules) + " modules; this run's model has " +
                          std::to_string(layout.size()) + " (a different model?)");
  engine.import_states(h.scalars, [&](const ZeroEngine::ModuleLayout& l, float* master, float* m, float* v) {
    const ModuleRecord rec = read_module_record(r);
    if (rec.name != l.name || rec.numel != l.numel || rec.padded != l.padded || rec.opt_lo != l.opt_lo || rec.opt_n != l.opt_n)
      throw CheckpointError(r.path() + ": module " + std::to_string(l.index) + " is '" + rec.name + "' with " +
                            std::to_string(rec.numel) + " parameters, optimizer range [" + std::to_string(rec.opt_lo) +
                            ", +" + std::to_string(rec.opt_n) + "); this run has '" + l.name + "' with " +
                            std::to_string(l.numel) + ", [" + std::to_string(l.opt_lo) + ", +" + std::to_string(l.opt_n) +
                            ") (a different model)");
    for (float* a : {master, m, v}) r.read(a, size_t(l.opt_n) * sizeof(float));
    if (size_t(l.index + 1) == layout.size()) check_trailer(r);  // before anything collective happens
  });
  return h.pos;
}

// ---------------------------------------------------------------- describe

Status describe_checkpoints(const std::string& dir_arg, std::string* text) {
  const std::string dir = without_trailing_slash(dir_arg);
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::Error(dir + (fs::exists(dir, ec) ? ": not a directory (a checkpoint directory is expected)" : ": no such checkpoint directory"));
  std::string latest_problem;
  const std::string latest = read_latest(dir, &latest_problem);
  std::ostringstream o;
  o << "checkpoints in " << dir << " (latest -> " << (latest.empty() ? "none" : latest) << ")\n";
  if (latest.empty() && fs::exists(fs::symlink_status(dir + "/latest", ec))) o << "  " << latest_problem << "\n";
  std::vector<std::string> tags = list_tags(dir);
  std::reverse(tags.begin(), tags.end());  // oldest first
  if (tags.empty()) o << "  (none)\n";
  bool latest_seen = false;
  for (const auto& tag : tags) {
    Manifest m;
    Status s = verify_checkpoint(dir, tag, &m);
    o << "  " << tag;
    if (s) {
      o << "  complete: step " << m.pos.global_step << ", next epoch " << m.pos.epoch << " step " << m.pos.step_in_epoch
        << ", world size " << m.world_size << ", ZeRO stage " << m.stage << ", ";
      if (m.model_only) o << "weights only (save_only_model: not resumable), ";
      else o << m.files.size() << " shards, ";
      for (const auto& f : m.model_files)
        if (f.name == kWeightsFile) o << f.name << " " << format_bytes(double(f.bytes)) << " (" << m.weights_dtype << "), ";
      o << format_bytes(double(m.total_bytes())) << " in all";
    } else {
      o << "  INCOMPLETE: " << s.message();
    }
    if (tag == latest) {
      o << "  <- latest";
      latest_seen = true;
    }
    o << "\n";
  }
  if (!latest.empty() && !latest_seen) o << "  latest names " << latest << ", which is not there\n";
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-", 0) == 0) o << "  " << n << "  an interrupted save (ignored; the next save of it removes it)\n";
  }
  *text = o.str();
  return Status::Ok();
}

// ---------------------------------------------------------------- consolidate

Status consolidate(const std::string& dir_arg, const std::string& tag, const std::string& out, DType dtype,
                   ConsolidateReport* report) {
  const std::string dir = without_trailing_slash(dir_arg);
  ConsolidateReport rep;
  Manifest man;
  if (tag.empty()) {
    Selected sel;
    if (Status s = select_checkpoint(dir, &sel, /*need_optimizer_state=*/false); !s) return s;
    man = sel.manifest;
    rep.notes = sel.notes;
  } else if (Status s = verify_checkpoint(dir, tag, &man); !s) {
    return s;
  }
  const std::string path = dir + "/" + man.tag;
  rep.checkpoint = path;
  const std::optional<model::Config> mc = man.model_config ? man.model_config : model::preset(man.model);
  if (!mc || !model::validate(*mc).ok())
    return Status::Error(path + "/" + kManifest + ": model '" + man.model +
                         "' has no GPT-2 layout recorded; only GPT-2 models have a Hugging Face layout to write");
  const std::vector<model::ModuleSpec> modules = model::module_table(*mc);
  // config.json goes beside the output: an output of that name would be replaced by it, and a
  // config.json that cannot be written (a directory) must fail the run before anything is renamed.
  fs::path parent = fs::path(out).parent_path();
  if (parent.empty()) parent = ".";
  const std::string config_path = (parent / kHfConfigFile).string();
  if (fs::path(out).filename() == kHfConfigFile)
    return Status::Error(out + ": that is where the Hugging Face " + kHfConfigFile +
                         " beside the weights goes; name the safetensors file otherwise (e.g. model.safetensors)");
  if (std::error_code ec; fs::is_directory(config_path, ec))
    return Status::Error(config_path + ": is a directory; the Hugging Face " + std::string(kHfConfigFile) +
                         " beside " + out + " cannot be written");
  const std::string part = out + ".tmp";
  const std::string config_part = config_path + ".tmp";
  struct RemoveUnlessDone {  // a failed consolidation leaves no partial file behind
    const std::string& path;
    bool done = false;
    ~RemoveUnlessDone() {
      std::error_code ec;
      if (!done) fs::remove(path, ec);
    }
  } cleanup{part}, cleanup_config{config_part};
  try {
    SafetensorsWriter w(part, gpt2_hf_tensors(*mc, dtype),
                        weights_metadata(man.tag, man.pos.global_step,
                                         man.model_only ? "model.safetensors" : "fp32 master weights"));
    std::vector<float> f32;
    std::vector<char> low;
    if (man.model_only) {
      // The weights as saved (the run's compute dtype), converted tensor by tensor.
      SafetensorsFile in;
      if (Status s = read_safetensors(path + "/" + kWeightsFile, &in); !s) return s;
      rep.source = std::string(kWeightsFile) + " (" + man.weights_dtype + ")";
      for (const SafeTensor& t : w.tensors()) {
        const SafeTensor* src = in.find(t.name);
        if (!src || src->shape != t.shape)
          return Status::Error(in.path + ": tensor '" + t.name + "' is missing or has another shape than GPT-2 " + man.model +
                               " needs");
        if (Status s = read_tensor_f32(in, t.name, &f32); !s) return s;
        low.resize(f32.size() * dtype_size(dtype));
        from_float(dtype, f32.data(), low.data(), f32.size());
        w.write(low.data(), low.size());
        rep.params += t.numel();
      }
    } else {
      if (man.modules.size() != modules.size())
        return Status::Error(path + "/" + kManifest + ": " + std::to_string(man.modules.size()) + " modules; GPT-2 " +
                             man.model + " has " + std::to_string(modules.size()));
      rep.source = "fp32 master weights of " + std::to_string(man.world_size) + " shard" + (man.world_size == 1 ? "" : "s");
      ShardSet set(path, man);
      for (const auto& spec : modules) {
        f32.assign(size_t(spec.numel), 0.0f);
        float* const outs[3] = {f32.data(), nullptr, nullptr};
        set.next_module(spec.name, spec.numel, 0, spec.numel, outs);
        low.resize(f32.size() * dtype_size(dtype));
        from_float(dtype, f32.data(), low.data(), f32.size());
        write_gpt2_module(w, *mc, spec.index, low.data(), dtype);
        rep.params += spec.numel;
      }
      set.finish();
    }
    w.finish();
    w.sync_and_close();
    rep.bytes = w.bytes();
    rep.tensors = int64_t(w.tensors().size());
    // Both files written in full before either replaces what was there.
    write_file_synced(config_part, gpt2_hf_config_json(*mc, dtype));
    rename_or_throw(part, out);
    cleanup.done = true;
    rename_or_throw(config_part, config_path);
    cleanup_config.done = true;
    fsync_dir(parent.string());
    rep.config_path = config_path;
  } catch (const CheckpointError& e) {
    return Status::Error(e.what());
  }
  if (report) *report = rep;
  return Status::Ok();
}

}  // namespace zt::trainer::ckpt
