#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zt/common/units.h"

namespace zt::trainer::ckpt {

static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian; add byte swaps");

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kShardMagic[8] = {'Z', 'T', 'C', 'K', 'S', 'H', 'R', 'D'};
constexpr char kTrailerMagic[8] = {'Z', 'T', 'C', 'K', 'E', 'N', 'D', '\0'};
constexpr uint32_t kHeaderBytes = 128;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kFormatName = "zerotrace-checkpoint";

struct Fnv1a64 {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    uint64_t x = h;
    for (size_t i = 0; i < n; ++i) x = (x ^ p[i]) * 0x100000001b3ull;
    h = x;
  }
};

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

std::string errno_text() { return std::strerror(errno); }

std::string shard_name(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "rank%05d.zts", rank);
  return b;
}

// A file written in full, checksummed on the way, fsynced before close. Errors throw,
// naming the file.
class Writer {
 public:
  explicit Writer(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw CheckpointError("cannot create " + path_ + ": " + errno_text());
    buf_.reserve(kBuffer);
  }
  ~Writer() {
    if (fd_ >= 0) ::close(fd_);
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void write(const void* data, size_t n) {
    hash_.add(data, n);
    bytes_ += n;
    const char* p = static_cast<const char*>(data);
    if (buf_.size() + n > kBuffer) flush();
    if (n >= kBuffer) {
      write_fully(p, n);
    } else {
      buf_.insert(buf_.end(), p, p + n);
    }
  }
  template <typename T>
  void put(const T& v) {
    write(&v, sizeof v);
  }
  uint64_t checksum() const { return hash_.h; }
  int64_t bytes() const { return int64_t(bytes_); }
  // Flushes, fsyncs and closes: the bytes are on disk when it returns.
  void finish() {
    flush();
    if (::fsync(fd_) != 0) throw CheckpointError("cannot fsync " + path_ + ": " + errno_text());
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw CheckpointError("cannot close " + path_ + ": " + errno_text());
  }

 private:
  static constexpr size_t kBuffer = 1 << 20;
  void flush() {
    write_fully(buf_.data(), buf_.size());
    buf_.clear();
  }
  void write_fully(const char* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw CheckpointError("cannot write " + path_ + ": " + errno_text());
      p += w;
      n -= size_t(w);
    }
  }
  std::string path_;
  int fd_ = -1;
  std::vector<char> buf_;
  Fnv1a64 hash_;
  size_t bytes_ = 0;
};

void write_file_synced(const std::string& path, const std::string& content) {
  Writer w(path);
  w.write(content.data(), content.size());
  w.finish();
}

// A directory's entries (creations, renames) are durable once the directory is fsynced.
void fsync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError("cannot open directory " + path + " to fsync it: " + errno_text());
  const int rc = ::fsync(fd);
  const std::string err = rc != 0 ? errno_text() : "";
  ::close(fd);
  if (rc != 0) throw CheckpointError("cannot fsync directory " + path + ": " + err);
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw CheckpointError("cannot rename " + from + " to " + to + ": " + errno_text());
}

// Reads a shard, checksumming every byte; running out of bytes is a clear error.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)), in_(path_, std::ios::binary) {
    if (!in_) throw CheckpointError("cannot open " + path_ + ": " + errno_text());
  }
  void read(void* data, size_t n) {
    in_.read(static_cast<char*>(data), std::streamsize(n));
    if (size_t(in_.gcount()) != n)
      throw CheckpointError(path_ + " is truncated: it ends at byte " + std::to_string(offset_ + size_t(in_.gcount())) +
                            " inside a record of " + std::to_string(n) + " bytes");
    hash_.add(data, n);
    offset_ += n;
  }
  template <typename T>
  T get() {
    T v;
    read(&v, sizeof v);
    return v;
  }
  uint64_t checksum() const { return hash_.h; }
  bool at_end() { return in_.peek() == std::char_traits<char>::eof(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
  Fnv1a64 hash_;
  size_t offset_ = 0;
};

bool hash_file(const std::string& path, int64_t* bytes, uint64_t* fnv) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  Fnv1a64 h;
  std::vector<char> buf(1 << 20);
  int64_t n = 0;
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    h.add(buf.data(), size_t(in.gcount()));
    n += in.gcount();
  }
  *bytes = n;
  *fnv = h.h;
  return true;
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

std::string read_latest(const std::string& dir) {
  std::ifstream in(dir + "/latest");
  std::string tag;
  if (in) std::getline(in, tag);
  while (!tag.empty() && (tag.back() == '\r' || tag.back() == ' ')) tag.pop_back();
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

}  // namespace

int64_t Manifest::total_bytes() const {
  int64_t b = 0;
  for (const auto& f : files) b += f.bytes;
  return b;
}

std::string tag_for_step(int64_t global_step) {
  char b[32];
  std::snprintf(b, sizeof b, "step%06lld", static_cast<long long>(global_step));
  return b;
}

// ---------------------------------------------------------------- save

int64_t save(const std::string& dir_arg, const TrainConfig& cfg, const Position& pos, ZeroEngine& engine,
             Communicator& comm) {
  const std::string dir = without_trailing_slash(dir_arg);
  const std::string tag = tag_for_step(pos.global_step);
  const std::string tmp = dir + "/.tmp-" + tag, final_dir = dir + "/" + tag;
  const int rank = comm.rank(), W = comm.world_size();

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
  }
  comm.barrier();

  // 2. This rank's shard.
  const std::string shard_path = tmp + "/" + shard_name(rank);
  Writer w(shard_path);
  const ZeroEngine::OptimizerScalars sc = engine.checkpoint_scalars();
  const std::vector<ZeroEngine::ModuleLayout> layout = engine.checkpoint_layout();
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
  w.finish();

  struct Digest {
    int64_t bytes;
    uint64_t fnv;
  };
  const Digest mine{w.bytes(), w.checksum()};
  std::vector<Digest> all(static_cast<size_t>(W));
  comm.all_gather(&mine, all.data(), sizeof(Digest), "checkpoint.digests");
  int64_t written = mine.bytes;

  // 3. Rank 0 commits: manifest last inside the directory, then the rename, then `latest`.
  if (rank == 0) {
    json j;
    j["format"] = kFormatName;
    j["version"] = kFormatVersion;
    j["tag"] = tag;
    j["checksum"] = "fnv1a64";
    j["world_size"] = W;
    j["zero_stage"] = engine.settings().stage;
    j["global_step"] = pos.global_step;
    j["epoch"] = pos.epoch;
    j["step_in_epoch"] = pos.step_in_epoch;
    j["seed"] = cfg.seed;
    j["config"] = json::parse(to_json(cfg), nullptr, false);
    json mods = json::array();
    for (const auto& l : layout)
      mods.push_back({{"index", l.index}, {"name", l.name}, {"numel", l.numel}, {"padded", l.padded}, {"shard", l.shard}});
    j["modules"] = mods;
    json files = json::array();
    for (int r = 0; r < W; ++r)
      files.push_back({{"name", shard_name(r)}, {"rank", r}, {"bytes", all[size_t(r)].bytes},
                       {"fnv1a64", hex64(all[size_t(r)].fnv)}});
    j["files"] = files;
    const std::string text = j.dump(2) + "\n";
    write_file_synced(tmp + "/" + kManifest, text);
    fsync_dir(tmp);
    written += int64_t(text.size());

    // Saving a tag that exists (a resumed run reaching it again): move the old one aside,
    // so the rename below lands on a free name, and remove it once the new one is durable.
    const std::string old_dir = dir + "/.old-" + tag;
    std::error_code ec;
    const bool replacing = fs::exists(final_dir, ec);
    if (replacing) {
      fs::remove_all(old_dir, ec);
      rename_or_throw(final_dir, old_dir);
    }
    rename_or_throw(tmp, final_dir);
    fsync_dir(dir);
    if (replacing) fs::remove_all(old_dir, ec);

    const std::string pointer = tag + "\n";
    write_file_synced(dir + "/latest.tmp", pointer);
    rename_or_throw(dir + "/latest.tmp", dir + "/latest");
    fsync_dir(dir);
    written += int64_t(pointer.size());
  }
  comm.barrier();  // nobody goes on (or starts the next save) before the commit is done
  return written;
}

// ---------------------------------------------------------------- verify and select

Status verify_checkpoint(const std::string& dir, const std::string& tag, Manifest* out) {
  const std::string path = without_trailing_slash(dir) + "/" + tag;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return Status::Error(path + ": no such checkpoint directory");
  const std::string mpath = path + "/" + kManifest;
  std::ifstream in(mpath);
  if (!in) return Status::Error(mpath + " is missing: the save did not finish (a partial checkpoint)");
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Error(mpath + ": not valid JSON (a torn or corrupted manifest)");
  Manifest m;
  try {
    if (j.value("format", "") != kFormatName) return Status::Error(mpath + ": not a zerotrace checkpoint manifest");
    const uint32_t version = j.at("version").get<uint32_t>();
    if (version != kFormatVersion)
      return Status::Error(mpath + ": checkpoint format version " + std::to_string(version) +
                           "; this build reads version " + std::to_string(kFormatVersion));
    if (j.value("checksum", "") != "fnv1a64")
      return Status::Error(mpath + ": unknown checksum '" + j.value("checksum", "") + "' (this build knows fnv1a64)");
    m.tag = j.at("tag").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    m.stage = j.at("zero_stage").get<int>();
    m.pos.global_step = j.at("global_step").get<int64_t>();
    m.pos.epoch = j.at("epoch").get<int64_t>();
    m.pos.step_in_epoch = j.at("step_in_epoch").get<int64_t>();
    m.seed = j.at("seed").get<uint64_t>();
    if (j.contains("config") && j["config"].is_object()) m.model = j["config"].value("model", "");
    for (const auto& f : j.at("files")) {
      Manifest::File file;
      file.name = f.at("name").get<std::string>();
      file.rank = f.at("rank").get<int>();
      file.bytes = f.at("bytes").get<int64_t>();
      file.fnv1a64 = std::stoull(f.at("fnv1a64").get<std::string>(), nullptr, 16);
      m.files.push_back(file);
    }
  } catch (const std::exception& e) {
    return Status::Error(mpath + ": a field is missing or malformed (" + e.what() + ")");
  }
  if (m.tag != tag) return Status::Error(mpath + ": names tag '" + m.tag + "' but lives in " + path);
  if (int(m.files.size()) != m.world_size)
    return Status::Error(mpath + ": lists " + std::to_string(m.files.size()) + " shard files for world size " +
                         std::to_string(m.world_size));
  for (const auto& f : m.files) {
    if (f.name.find('/') != std::string::npos || f.name.empty() || f.name[0] == '.')
      return Status::Error(mpath + ": bad file name '" + f.name + "'");
    const std::string fpath = path + "/" + f.name;
    int64_t bytes = 0;
    uint64_t fnv = 0;
    if (!hash_file(fpath, &bytes, &fnv)) return Status::Error(fpath + " is missing (rank " + std::to_string(f.rank) + "'s shard)");
    if (bytes != f.bytes)
      return Status::Error(fpath + " is " + std::to_string(bytes) + " bytes; the manifest says " +
                           std::to_string(f.bytes) + " (truncated or torn)");
    if (fnv != f.fnv1a64)
      return Status::Error(fpath + ": checksum fnv1a64 " + hex64(fnv) + " does not match the manifest's " +
                           hex64(f.fnv1a64) + " (the file is corrupted)");
  }
  if (out) *out = std::move(m);
  return Status::Ok();
}

Status select_checkpoint(const std::string& dir_arg, Selected* out) {
  const std::string dir = without_trailing_slash(dir_arg);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::Error(dir + ": no such checkpoint directory");
  std::vector<std::string> candidates;
  const std::string latest = read_latest(dir);
  if (!latest.empty()) candidates.push_back(latest);
  for (auto& t : list_tags(dir))
    if (t != latest) candidates.push_back(t);
  std::string notes;
  if (latest.empty() && !candidates.empty()) notes += dir + "/latest is missing; looking for the newest complete checkpoint\n";
  for (const auto& tag : candidates) {
    Manifest m;
    Status s = verify_checkpoint(dir, tag, &m);
    if (!s) {
      notes += "checkpoint " + dir + "/" + tag + (tag == latest ? " (latest)" : "") + " refused: " + s.message() + "\n";
      continue;
    }
    if (!notes.empty()) notes += "falling back to " + dir + "/" + tag + " (step " + std::to_string(m.pos.global_step) + ")\n";
    out->dir = dir;
    out->manifest = std::move(m);
    out->notes = notes;
    return Status::Ok();
  }
  if (candidates.empty()) return Status::Error(dir + ": no checkpoint to resume from");
  notes.pop_back();
  return Status::Error(dir + ": no complete checkpoint to resume from:\n" + notes);
}

// ---------------------------------------------------------------- load

Position load(const Selected& sel, int rank, ZeroEngine& engine) {
  const Manifest& man = sel.manifest;
  Reader r(sel.dir + "/" + man.tag + "/" + shard_name(rank));
  const std::string& path = r.path();
  char header[kHeaderBytes];
  r.read(header, sizeof header);
  auto at = [&](size_t off, auto v) {
    std::memcpy(&v, header + off, sizeof v);
    return v;
  };
  if (std::memcmp(header, kShardMagic, 8) != 0) throw CheckpointError(path + ": not a zerotrace checkpoint shard (bad magic)");
  if (at(8, uint32_t()) != kFormatVersion)
    throw CheckpointError(path + ": shard format version " + std::to_string(at(8, uint32_t())) +
                          "; this build reads version " + std::to_string(kFormatVersion));
  if (at(12, uint32_t()) != kHeaderBytes) throw CheckpointError(path + ": unexpected header size");
  if (int(at(16, uint32_t())) != rank || int(at(20, uint32_t())) != man.world_size)
    throw CheckpointError(path + ": the header says rank " + std::to_string(at(16, uint32_t())) + " of " +
                          std::to_string(at(20, uint32_t())) + "; expected rank " + std::to_string(rank) + " of " +
                          std::to_string(man.world_size));
  const std::vector<ZeroEngine::ModuleLayout> layout = engine.checkpoint_layout();
  if (at(28, uint32_t()) != layout.size())
    throw CheckpointError(path + ": " + std::to_string(at(28, uint32_t())) + " modules; this run's model has " +
                          std::to_string(layout.size()) + " (a different model?)");
  Position pos{at(32, int64_t()), at(40, int64_t()), at(48, int64_t())};
  ZeroEngine::OptimizerScalars sc;
  sc.adam_steps = at(56, int64_t());
  sc.loss_scale = at(64, double());
  sc.good_steps = at(72, int64_t());
  sc.hysteresis_left = at(80, int64_t());

  engine.import_states(sc, [&](const ZeroEngine::ModuleLayout& l, float* master, float* m, float* v) {
    const uint32_t len = r.get<uint32_t>();
    if (len > 4096) throw CheckpointError(path + ": a module name of " + std::to_string(len) + " bytes (corrupted)");
    std::string name(len, '\0');
    r.read(name.data(), len);
    int64_t dims[5];
    for (int64_t& d : dims) d = r.get<int64_t>();
    if (name != l.name || dims[0] != l.numel || dims[1] != l.padded || dims[3] != l.opt_lo || dims[4] != l.opt_n)
      throw CheckpointError(path + ": module " + std::to_string(l.index) + " is '" + name + "' with " +
                            std::to_string(dims[0]) + " parameters, optimizer range [" + std::to_string(dims[3]) +
                            ", +" + std::to_string(dims[4]) + "); this run has '" + l.name + "' with " +
                            std::to_string(l.numel) + ", [" + std::to_string(l.opt_lo) + ", +" +
                            std::to_string(l.opt_n) + ") (a different model, or ZeRO stage 0 against 1-3)");
    for (float* a : {master, m, v}) r.read(a, size_t(l.opt_n) * sizeof(float));
    if (size_t(l.index + 1) == layout.size()) {
      // The trailer, before anything collective happens: the bytes read are the bytes written.
      const uint64_t computed = r.checksum();
      const uint64_t stored = r.get<uint64_t>();
      char magic[8];
      r.read(magic, 8);
      if (std::memcmp(magic, kTrailerMagic, 8) != 0 || stored != computed || !r.at_end())
        throw CheckpointError(path + ": the trailer does not match the contents (corrupted; checksum " + hex64(computed) +
                              ", stored " + hex64(stored) + ")");
    }
  });
  return pos;
}

// ---------------------------------------------------------------- describe

Status describe_checkpoints(const std::string& dir_arg, std::string* text) {
  const std::string dir = without_trailing_slash(dir_arg);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::Error(dir + ": no such checkpoint directory");
  const std::string latest = read_latest(dir);
  std::ostringstream o;
  o << "checkpoints in " << dir << " (latest -> " << (latest.empty() ? "none" : latest) << ")\n";
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
        << ", world size " << m.world_size << ", ZeRO stage " << m.stage << ", " << m.files.size() << " shards, "
        << format_bytes(double(m.total_bytes()));
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

}  // namespace zt::trainer::ckpt
