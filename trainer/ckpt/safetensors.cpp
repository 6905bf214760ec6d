#include "ckpt/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/layout.h"

namespace zt::trainer::ckpt {

using nlohmann::json;

namespace {
constexpr uint64_t kMaxHeader = 100ull << 20;  // the reference implementation's limit
}

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    default: return "?";
  }
}

std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  if (name == "F32") return DType::F32;
  if (name == "BF16") return DType::BF16;
  if (name == "F16") return DType::F16;
  return std::nullopt;
}

int64_t SafeTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafeTensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// ---------------------------------------------------------------- writer

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafeTensor> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : file_(std::move(path)), tensors_(std::move(tensors)) {
  json h = json::object();
  uint64_t off = 0;
  for (auto& t : tensors_) {
    if (t.name == "__metadata__" || h.contains(t.name))
      throw CheckpointError(file_.path() + ": tensor name '" + t.name + "' is reserved or used twice");
    t.begin = off;
    t.end = off + uint64_t(t.numel()) * dtype_size(t.dtype);
    off = t.end;
    h[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  data_bytes_ = off;
  std::string text = h.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t n = text.size();
  file_.put(n);
  file_.write(text.data(), text.size());
}

void SafetensorsWriter::write(const void* data, size_t n) {
  if (written_ + n > data_bytes_)
    throw CheckpointError(file_.path() + ": more tensor bytes than the header declares (" +
                          std::to_string(written_ + n) + " > " + std::to_string(data_bytes_) + ")");
  file_.write(data, n);
  written_ += n;
}

void SafetensorsWriter::finish() {
  if (written_ != data_bytes_)
    throw CheckpointError(file_.path() + ": " + std::to_string(written_) + " tensor bytes written of the " +
                          std::to_string(data_bytes_) + " the header declares");
  file_.flush();
}

void SafetensorsWriter::sync_and_close() { file_.sync_and_close(); }

// ---------------------------------------------------------------- reader

Status read_safetensors(const std::string& path, SafetensorsFile* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open (" + errno_text() + ")");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::Error(path + ": cannot stat (" + errno_text() + ")");
  const uint64_t size = uint64_t(st.st_size);
  if (size < 8)
    return Status::Error(path + ": " + std::to_string(size) +
                         " bytes: too short for a safetensors file (8-byte header length first; truncated?)");
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > kMaxHeader)
    return Status::Error(path + ": header length " + std::to_string(n) + " bytes is above the 100 MiB limit (not a safetensors file, or corrupted)");
  if (n > size - 8)
    return Status::Error(path + ": header length " + std::to_string(n) + " bytes runs past the end of the file (" +
                         std::to_string(size) + " bytes; truncated?)");
  if (n < 2) return Status::Error(path + ": header length " + std::to_string(n) + " bytes cannot hold a JSON object");
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  if (uint64_t(in.gcount()) != n) return Status::Error(path + ": cannot read the " + std::to_string(n) + "-byte header");
  json h = json::parse(text, nullptr, false);
  if (h.is_discarded()) return Status::Error(path + ": the header is not valid JSON (corrupted?)");
  if (!h.is_object()) return Status::Error(path + ": the header is not a JSON object");

  SafetensorsFile f;
  f.path = path;
  f.header_bytes = n;
  f.data_start = 8 + n;
  f.file_bytes = size;
  const uint64_t data = size - f.data_start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) return Status::Error(path + ": __metadata__ is not an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string())
          return Status::Error(path + ": __metadata__." + m.key() + " is not a string (metadata holds strings only)");
        f.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    if (!e.is_object()) return Status::Error(where + " is not an object {dtype, shape, data_offsets}");
    if (!e.contains("dtype") || !e["dtype"].is_string()) return Status::Error(where + " has no dtype");
    SafeTensor t;
    t.name = name;
    auto dt = parse_safetensors_dtype(e["dtype"].get<std::string>());
    if (!dt)
      return Status::Error(where + ": dtype '" + e["dtype"].get<std::string>() + "' is not supported (F32, BF16, F16)");
    t.dtype = *dt;
    if (!e.contains("shape") || !e["shape"].is_array()) return Status::Error(where + " has no shape array");
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return Status::Error(where + ": shape " + e["shape"].dump() + " is not a list of non-negative integers");
      t.shape.push_back(d.get<int64_t>());
    }
    const json& off = e.contains("data_offsets") ? e["data_offsets"] : json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return Status::Error(where + ": data_offsets must be [begin, end] (non-negative integers)");
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.begin > t.end) return Status::Error(where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] end before they begin");
    if (t.end > data)
      return Status::Error(where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                           "] run past the data section's " + std::to_string(data) + " bytes (truncated?)");
    uint64_t expect = dtype_size(t.dtype);
    bool overflow = false;
    for (int64_t d : t.shape) overflow = overflow || __builtin_mul_overflow(expect, uint64_t(d), &expect);
    if (overflow) expect = UINT64_MAX;
    if (expect != t.end - t.begin)
      return Status::Error(where + ": " + std::string(safetensors_dtype(t.dtype)) + " " + e["shape"].dump() + " needs " +
                           (expect == UINT64_MAX ? std::string("more") : std::to_string(expect)) + " bytes; its data_offsets hold " +
                           std::to_string(t.end - t.begin));
    f.tensors.push_back(std::move(t));
  }
  std::sort(f.tensors.begin(), f.tensors.end(), [](const SafeTensor& a, const SafeTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const auto& t : f.tensors) {
    if (t.begin < at)
      return Status::Error(path + ": tensor '" + t.name + "' at [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                           ") overlaps the tensor before it (which ends at " + std::to_string(at) + ")");
    if (t.begin > at)
      return Status::Error(path + ": a gap of " + std::to_string(t.begin - at) + " bytes before tensor '" + t.name +
                           "' (tensors must tile the data section)");
    at = t.end;
  }
  if (at != data)
    return Status::Error(path + ": the tensors cover " + std::to_string(at) + " bytes of a " + std::to_string(data) +
                         "-byte data section (trailing bytes: corrupted or not a safetensors file)");
  *out = std::move(f);
  return Status::Ok();
}

Status read_tensor_bytes(const SafetensorsFile& f, const SafeTensor& t, std::vector<char>* out) {
  std::ifstream in(f.path, std::ios::binary);
  if (!in) return Status::Error(f.path + ": cannot open (" + errno_text() + ")");
  out->resize(t.bytes());
  in.seekg(std::streamoff(f.data_start + t.begin));
  in.read(out->data(), std::streamsize(out->size()));
  if (uint64_t(in.gcount()) != t.bytes())
    return Status::Error(f.path + ": tensor '" + t.name + "' is cut short (the file changed or is truncated)");
  return Status::Ok();
}

Status read_tensor_f32(const SafetensorsFile& f, const std::string& name, std::vector<float>* out) {
  const SafeTensor* t = f.find(name);
  if (!t) return Status::Error(f.path + ": no tensor named '" + name + "'");
  std::vector<char> raw;
  if (Status s = read_tensor_bytes(f, *t, &raw); !s) return s;
  out->resize(size_t(t->numel()));
  to_float(t->dtype, raw.data(), out->data(), out->size());
  return Status::Ok();
}

// ---------------------------------------------------------------- GPT-2 in Hugging Face's layout

std::vector<SafeTensor> gpt2_hf_tensors(const model::Config& mc, DType dtype) {
  std::vector<SafeTensor> out;
  for (const auto& p : model::param_table(mc)) {
    SafeTensor t;
    t.name = p.hf_name;
    t.dtype = dtype;
    t.shape = p.hf_shape;
    out.push_back(std::move(t));
  }
  return out;
}

namespace {
// dst[c * rows + r] = src[r * cols + c], in tiles that stay in cache.
template <typename T>
void transpose(const T* src, T* dst, size_t rows, size_t cols) {
  constexpr size_t kTile = 32;
  for (size_t r0 = 0; r0 < rows; r0 += kTile) {
    const size_t r1 = std::min(rows, r0 + kTile);
    for (size_t c0 = 0; c0 < cols; c0 += kTile) {
      const size_t c1 = std::min(cols, c0 + kTile);
      for (size_t r = r0; r < r1; ++r)
        for (size_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
    }
  }
}
}  // namespace

void write_gpt2_module(SafetensorsWriter& w, const model::Config& mc, int module, const void* module_values, DType dtype) {
  static thread_local std::vector<char> tmp;
  const size_t es = dtype_size(dtype);
  const auto* base = static_cast<const char*>(module_values);
  for (const auto& p : model::param_table(mc)) {
    if (p.module != module) continue;
    const char* src = base + size_t(p.offset_in_module) * es;
    if (!p.hf_transposed) {
      w.write(src, size_t(p.numel) * es);
      continue;
    }
    // Ours [out, in] row-major; Hugging Face's Conv1D [in, out].
    const size_t rows = size_t(p.shape[0]), cols = size_t(p.shape[1]);
    tmp.resize(size_t(p.numel) * es);
    if (es == 2)
      transpose(reinterpret_cast<const uint16_t*>(src), reinterpret_cast<uint16_t*>(tmp.data()), rows, cols);
    else
      transpose(reinterpret_cast<const uint32_t*>(src), reinterpret_cast<uint32_t*>(tmp.data()), rows, cols);
    w.write(tmp.data(), tmp.size());
  }
}

std::string gpt2_hf_config_json(const model::Config& mc, DType dtype) {
  const char* torch_dtype = dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
  const int64_t eos = std::min<int64_t>(50256, mc.vocab - 1);
  json j = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", mc.vocab},
            {"n_positions", mc.context},
            {"n_ctx", mc.context},
            {"n_embd", mc.width},
            {"n_layer", mc.layers},
            {"n_head", mc.heads},
            {"n_inner", nullptr},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", 1e-5},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"initializer_range", 0.02},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", true},
            {"use_cache", true},
            {"bos_token_id", eos},
            {"eos_token_id", eos},
            {"torch_dtype", torch_dtype}};
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace zt::trainer::ckpt
