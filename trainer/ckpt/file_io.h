// trainer/ckpt/file_io.h: the durable-file primitives of checkpoints (issue 5).
//
// Owns: the checksums a checkpoint names (xxh64, the default; fnv1a64, the first format's),
// the buffered writer that checksums every byte on the way and makes it durable (write,
// then fsync, then close: two separate steps, so a crash test can stop between them), the
// checksummed sequential reader, and the directory fsync / rename that publish a file.
// Every error throws CheckpointError naming the file.
// Called by: ckpt/checkpoint.cpp, ckpt/safetensors.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace zt::trainer::ckpt {

// A save or a load that failed part way; the message names the file and the cause.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ChecksumKind { Xxh64, Fnv1a64 };
const char* checksum_name(ChecksumKind k);  // "xxh64", "fnv1a64"
bool parse_checksum(std::string_view name, ChecksumKind* out);

// A streaming 64-bit checksum: XXH64 (seed 0; the reference algorithm of xxHash, ~10 GB/s)
// or FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3; ~0.5 GB/s).
class Checksum {
 public:
  explicit Checksum(ChecksumKind kind = ChecksumKind::Xxh64);
  void add(const void* data, size_t n);
  uint64_t value() const;  // of every byte added so far (does not end the stream)
  ChecksumKind kind() const { return kind_; }

 private:
  ChecksumKind kind_;
  uint64_t fnv_ = 0xcbf29ce484222325ull;
  uint64_t v_[4] = {};
  unsigned char mem_[32] = {};
  size_t mem_n_ = 0;
  uint64_t total_ = 0;
};
uint64_t checksum_of(ChecksumKind kind, const void* data, size_t n);

std::string hex64(uint64_t v);  // 16 lowercase hex digits
std::string errno_text();

// A file written in full through a 1 MiB buffer, checksummed on the way. flush() hands every
// byte to the kernel; sync_and_close() fsyncs and closes: the bytes are on disk when it
// returns. finish() is both. The destructor closes a file left unfinished (no fsync).
class FileWriter {
 public:
  explicit FileWriter(std::string path, ChecksumKind kind = ChecksumKind::Xxh64);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t n);
  template <typename T>
  void put(const T& v) {
    write(&v, sizeof v);
  }
  void flush();
  void sync_and_close();
  void finish() {
    flush();
    sync_and_close();
  }
  uint64_t checksum() const { return hash_.value(); }
  int64_t bytes() const { return int64_t(bytes_); }
  const std::string& path() const { return path_; }

 private:
  static constexpr size_t kBuffer = 1 << 20;
  void write_fully(const char* p, size_t n);
  std::string path_;
  int fd_ = -1;
  std::vector<char> buf_;
  Checksum hash_;
  size_t bytes_ = 0;
};

// A file read in order, checksummed on the way; running out of bytes is a clear error
// naming the file and the offset.
class FileReader {
 public:
  explicit FileReader(std::string path, ChecksumKind kind = ChecksumKind::Xxh64);
  void read(void* data, size_t n);
  template <typename T>
  T get() {
    T v;
    read(&v, sizeof v);
    return v;
  }
  uint64_t checksum() const { return hash_.value(); }
  void set_checksum(ChecksumKind kind);  // before the first read
  bool at_end();
  uint64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
  std::vector<char> buf_;
  Checksum hash_;
  uint64_t offset_ = 0;
};

// Size and checksum of a whole file; false when it cannot be opened.
bool hash_file(const std::string& path, ChecksumKind kind, int64_t* bytes, uint64_t* sum);
// Writes `content` to `path`, fsyncs and closes it.
void write_file_synced(const std::string& path, const std::string& content);
// A directory's entries (creations, renames) are durable once the directory is fsynced.
void fsync_dir(const std::string& path);
void rename_or_throw(const std::string& from, const std::string& to);

}  // namespace zt::trainer::ckpt
