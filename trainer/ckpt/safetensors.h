// trainer/ckpt/safetensors.h: the safetensors format, written and read (issue 5).
//
// Owns: our own writer and validating reader of Hugging Face's safetensors files, and the
// GPT-2 export layout: Hugging Face names and shapes from the model's one parameter table
// (model/layout.h; Conv1D weights stored [in, out], so they are transposed on the way), and
// the config.json that lets transformers' GPT2LMHeadModel load the file.
// Called by: ckpt/checkpoint.cpp (the consolidated weights of a save, `zt ckpt consolidate`),
// tests and the benchmark.
//
// File format (little-endian):
//   0      u64 N: the header's length in bytes
//   8      N bytes of JSON: {"NAME": {"dtype": "F32"|"BF16"|"F16", "shape": [d0, ...],
//                                     "data_offsets": [BEGIN, END]}, ...,
//                            "__metadata__": {"key": "value", ...}}   (optional, strings only)
//          padded with spaces to a multiple of 8 bytes, as the reference writer does
//   8 + N  the data: every tensor's bytes, row-major, at [BEGIN, END) of this section
// The reader refuses, naming the file: a file shorter than 8 bytes, N beyond the file or
// above 100 MiB, JSON that does not parse or is not an object, an entry without a known
// dtype, a shape of non-negative integers or two data offsets, offsets outside the data,
// tensors that overlap or leave gaps (sorted by BEGIN they must tile [0, data size)), a
// tensor whose byte size is not dtype size x the product of its shape, and metadata that is
// not an object of strings.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/file_io.h"
#include "core/dtype.h"
#include "model/config.h"
#include "zt/common/status.h"

namespace zt::trainer::ckpt {

const char* safetensors_dtype(DType t);                              // "F32", "BF16", "F16"
std::optional<DType> parse_safetensors_dtype(std::string_view name);  // F32, BF16, F16 only

struct SafeTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets, from the start of the data section
  int64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

// Writes a file in one pass: the header is made up front from every tensor's name, dtype and
// shape (their data offsets follow the order given), then the tensors' bytes are appended
// in that order, in as many pieces as the caller likes. finish() checks every declared byte
// came, then flushes; sync_and_close() makes it durable. Errors throw CheckpointError.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<SafeTensor> tensors, const std::map<std::string, std::string>& metadata);
  void write(const void* data, size_t n);
  void finish();          // all bytes given: flush to the kernel
  void sync_and_close();  // fsync and close
  int64_t bytes() const { return file_.bytes(); }
  uint64_t checksum() const { return file_.checksum(); }
  const std::vector<SafeTensor>& tensors() const { return tensors_; }

 private:
  FileWriter file_;
  std::vector<SafeTensor> tensors_;
  uint64_t data_bytes_ = 0, written_ = 0;
};

struct SafetensorsFile {
  std::string path;
  uint64_t header_bytes = 0;  // N
  uint64_t data_start = 0;    // 8 + N
  uint64_t file_bytes = 0;
  std::vector<SafeTensor> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  const SafeTensor* find(std::string_view name) const;
};

// Reads and validates the header (everything listed above). The message names the file.
Status read_safetensors(const std::string& path, SafetensorsFile* out);
// One tensor's raw bytes, or its values as fp32.
Status read_tensor_bytes(const SafetensorsFile& f, const SafeTensor& t, std::vector<char>* out);
Status read_tensor_f32(const SafetensorsFile& f, const std::string& name, std::vector<float>* out);

// ---- GPT-2 in Hugging Face's layout ----
// The export's tensors, in parameter-table order: Hugging Face names and shapes (the tied LM
// head is not stored, as save_pretrained leaves it out), in `dtype`.
std::vector<SafeTensor> gpt2_hf_tensors(const model::Config& mc, DType dtype);
// Appends one module's tensors to `w`: `module_values` is the module's flat parameters in our
// layout (numel of the module, in `dtype`), converted to Hugging Face's (Conv1D weights
// transposed). `module` indexes model::module_table(mc).
void write_gpt2_module(SafetensorsWriter& w, const model::Config& mc, int module, const void* module_values,
                       DType dtype);
// config.json for transformers' GPT2LMHeadModel (model_type gpt2, n_embd, n_layer, ...).
std::string gpt2_hf_config_json(const model::Config& mc, DType dtype);

}  // namespace zt::trainer::ckpt
