// The safetensors writer and reader (trainer/ckpt/safetensors.h): a round trip, the same file
// read by a minimal parser written here from the format's description, every malformed file
// refused with a message naming it, and the GPT-2 export layout (Hugging Face names, Conv1D
// weights transposed, config.json).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "ckpt/safetensors.h"
#include "model/layout.h"

using namespace zt::trainer;
using namespace zt::trainer::ckpt;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// A file made by hand: the header text as given, then `data` bytes.
std::string handmade(const std::string& header, size_t data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data, '\x5a');
}

// What a minimal reader of the format sees, written from the description alone (no code of
// ours): u64 N, N bytes of JSON, then the data.
struct Parsed {
  uint64_t n = 0;
  json header;
  std::string data;
};
Parsed minimal_parse(const std::string& bytes) {
  Parsed p;
  EXPECT_GE(bytes.size(), 8u);
  for (int i = 7; i >= 0; --i) p.n = (p.n << 8) | uint8_t(bytes[size_t(i)]);  // little-endian by hand
  EXPECT_LE(8 + p.n, bytes.size());
  p.header = json::parse(bytes.substr(8, p.n));
  p.data = bytes.substr(8 + p.n);
  return p;
}

std::vector<SafeTensor> three_tensors() {
  return {{"a.weight", DType::F32, {2, 3}}, {"b", DType::BF16, {4}}, {"empty", DType::F16, {0, 5}}};
}

// Writes three_tensors() with known values; returns the path.
std::string write_sample(const zt::test::TempDir& tmp) {
  const std::string path = tmp.file("sample.safetensors");
  SafetensorsWriter w(path, three_tensors(), {{"format", "pt"}, {"note", "hello"}});
  const float a[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
  w.write(a, sizeof a);
  const uint16_t b[4] = {float_to_bf16(1.0f), float_to_bf16(-0.5f), float_to_bf16(2.0f), float_to_bf16(3.0f)};
  w.write(b, sizeof b);
  w.finish();
  w.sync_and_close();
  EXPECT_EQ(w.bytes(), int64_t(fs::file_size(path)));
  return path;
}

}  // namespace

TEST(Safetensors, OurWriterAndReaderRoundTrip) {
  zt::test::TempDir tmp;
  const std::string path = write_sample(tmp);
  SafetensorsFile f;
  zt::Status s = read_safetensors(path, &f);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.header_bytes % 8, 0u);  // padded: the data starts 8-byte aligned
  EXPECT_EQ(f.data_start, 8 + f.header_bytes);
  EXPECT_EQ(f.file_bytes, f.data_start + 6 * 4 + 4 * 2);
  const SafeTensor* a = f.find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::F32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->begin, 0u);
  EXPECT_EQ(a->end, 24u);
  std::vector<float> v;
  ASSERT_TRUE(read_tensor_f32(f, "a.weight", &v).ok());
  EXPECT_EQ(v, (std::vector<float>{1, -2, 3.5f, 0, 1e-3f, -7}));
  ASSERT_TRUE(read_tensor_f32(f, "b", &v).ok());
  EXPECT_EQ(v, (std::vector<float>{1.0f, -0.5f, 2.0f, 3.0f}));
  EXPECT_EQ(f.find("empty")->bytes(), 0u);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("note"), "hello");
  zt::Status missing = read_tensor_f32(f, "nope", &v);
  EXPECT_NE(missing.message().find(path + ": no tensor named 'nope'"), std::string::npos) << missing.message();
}

TEST(Safetensors, AMinimalIndependentParserReadsOurFile) {
  zt::test::TempDir tmp;
  const std::string bytes = slurp(write_sample(tmp));
  Parsed p = minimal_parse(bytes);
  EXPECT_EQ(p.n % 8, 0u);
  ASSERT_TRUE(p.header.is_object());
  EXPECT_EQ(p.header["__metadata__"]["format"], "pt");
  EXPECT_EQ(p.header["a.weight"]["dtype"], "F32");
  EXPECT_EQ(p.header["a.weight"]["shape"], json::array({2, 3}));
  EXPECT_EQ(p.header["b"]["dtype"], "BF16");
  EXPECT_EQ(p.header["b"]["data_offsets"], json::array({24, 32}));
  EXPECT_EQ(p.header["empty"]["dtype"], "F16");
  EXPECT_EQ(p.header["empty"]["shape"], json::array({0, 5}));
  EXPECT_EQ(p.data.size(), 32u);
  float a4;
  std::memcpy(&a4, p.data.data() + 4 * 4, 4);
  EXPECT_EQ(a4, 1e-3f);
  // bf16 is the top half of the fp32 bits: -0.5f is 0xbf000000, so 0xbf00 little-endian.
  EXPECT_EQ(uint8_t(p.data[24 + 2]), 0x00);
  EXPECT_EQ(uint8_t(p.data[24 + 3]), 0xbf);
}

// Every way a file can be wrong: refused, naming the file and the problem.
TEST(Safetensors, MalformedFilesAreRefusedNamingTheFile) {
  zt::test::TempDir tmp;
  const std::string good = slurp(write_sample(tmp));
  const std::string f32 = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;
  };
  std::string huge(8, '\0');
  const uint64_t big = 200ull << 20;
  std::memcpy(huge.data(), &big, 8);
  huge += "{}";
  std::string past(8, '\0');
  const uint64_t n = 1000;
  std::memcpy(past.data(), &n, 8);
  past += "{}";
  std::string corrupt = good;
  corrupt[9] = '\x01';  // inside the JSON text
  const std::vector<Case> cases = {
      {"4 bytes", "abcd", "too short for a safetensors file"},
      {"header length past the end", past, "runs past the end of the file"},
      {"header length above the limit", huge, "above the 100 MiB limit"},
      {"not JSON", handmade("{\"t\": [1,", 0), "not valid JSON"},
      {"a JSON array", handmade("[1, 2]", 0), "not a JSON object"},
      {"unknown dtype", handmade(R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8), "dtype 'I64' is not supported"},
      {"negative dimension", handmade(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative integers"},
      {"no offsets", handmade(R"({"t":{"dtype":"F32","shape":[2]}})", 8), "data_offsets must be [begin, end]"},
      {"offsets past the data", handmade("{" + f32 + "}", 4), "run past the data section"},
      {"size mismatch", handmade(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12 bytes"},
      {"overlap",
       handmade("{" + f32 + R"(,"u":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "overlaps the tensor before it"},
      {"gap", handmade(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "a gap of 4 bytes"},
      {"trailing bytes", handmade("{" + f32 + "}", 12), "trailing bytes"},
      {"metadata not strings", handmade(R"({"__metadata__":{"n":1}})", 0), "__metadata__.n is not a string"},
      {"truncated", good.substr(0, good.size() - 10), "run past the data section"},
      {"corrupted header byte", corrupt, "not valid JSON"},
  };
  for (const auto& c : cases) {
    const std::string path = tmp.file("bad.safetensors");
    spit(path, c.bytes);
    SafetensorsFile f;
    zt::Status s = read_safetensors(path, &f);
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_EQ(s.message().rfind(path + ": ", 0), 0u) << c.what << ": " << s.message();
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.what << ": " << s.message();
  }
  SafetensorsFile f;
  zt::Status s = read_safetensors(tmp.file("missing.safetensors"), &f);
  EXPECT_NE(s.message().find(tmp.file("missing.safetensors") + ": cannot open"), std::string::npos) << s.message();
}

TEST(Safetensors, TheWriterRefusesMoreOrFewerBytesThanDeclared) {
  zt::test::TempDir tmp;
  SafetensorsWriter w(tmp.file("w.safetensors"), {{"t", DType::F32, {2}}}, {});
  const float x[3] = {1, 2, 3};
  EXPECT_THROW(w.write(x, sizeof x), CheckpointError);
  w.write(x, 4);
  try {
    w.finish();
    FAIL() << "finish() accepted 4 of 8 bytes";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("4 tensor bytes written of the 8"), std::string::npos) << e.what();
  }
}

// Hugging Face's names and shapes, from the one parameter table; Conv1D weights transposed.
TEST(Safetensors, Gpt2LayoutUsesHuggingFaceNamesAndConv1dShapes) {
  const zt::model::Config mc = *zt::model::preset("tiny");
  const auto table = zt::model::param_table(mc);
  const auto tensors = gpt2_hf_tensors(mc, DType::BF16);
  ASSERT_EQ(tensors.size(), table.size());
  EXPECT_EQ(tensors.front().name, "transformer.wte.weight");
  EXPECT_EQ(tensors.back().name, "transformer.ln_f.bias");
  const SafeTensor* attn = nullptr;
  for (const auto& t : tensors)
    if (t.name == "transformer.h.1.attn.c_attn.weight") attn = &t;
  ASSERT_NE(attn, nullptr);
  EXPECT_EQ(attn->shape, (std::vector<int64_t>{64, 192}));  // [in, out]: Conv1D
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(tensors[i].name, table[i].hf_name);
    EXPECT_EQ(tensors[i].shape, table[i].hf_shape);
    EXPECT_EQ(tensors[i].dtype, DType::BF16);
  }

  // One block's values 0, 1, 2, ... in our layout come out transposed where HF stores [in, out].
  zt::test::TempDir tmp;
  const auto modules = zt::model::module_table(mc);
  const std::string path = tmp.file("m.safetensors");
  {
    std::vector<SafeTensor> only;
    for (const auto& p : table)
      if (p.module == 1) only.push_back({p.hf_name, DType::F32, p.hf_shape});
    SafetensorsWriter w(path, only, {});
    std::vector<float> v(size_t(modules[1].numel));
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
    write_gpt2_module(w, mc, 1, v.data(), DType::F32);
    w.finish();
    w.sync_and_close();
  }
  SafetensorsFile f;
  ASSERT_TRUE(read_safetensors(path, &f).ok());
  for (const auto& p : table) {
    if (p.module != 1) continue;
    std::vector<float> got;
    ASSERT_TRUE(read_tensor_f32(f, p.hf_name, &got).ok());
    ASSERT_EQ(int64_t(got.size()), p.numel);
    if (!p.hf_transposed) {
      EXPECT_EQ(got[0], float(p.offset_in_module));
      continue;
    }
    const int64_t rows = p.shape[0], cols = p.shape[1];  // ours [out, in]
    for (int64_t r : {int64_t(0), rows - 1})
      for (int64_t c : {int64_t(0), int64_t(1), cols - 1})
        EXPECT_EQ(got[size_t(c * rows + r)], float(p.offset_in_module + r * cols + c)) << p.hf_name;
  }

  const json cfg = json::parse(gpt2_hf_config_json(mc, DType::BF16));
  EXPECT_EQ(cfg["model_type"], "gpt2");
  EXPECT_EQ(cfg["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(cfg["n_embd"], 64);
  EXPECT_EQ(cfg["n_layer"], 2);
  EXPECT_EQ(cfg["n_head"], 4);
  EXPECT_EQ(cfg["n_positions"], 64);
  EXPECT_EQ(cfg["n_ctx"], 64);
  EXPECT_EQ(cfg["vocab_size"], 256);
  EXPECT_EQ(cfg["activation_function"], "gelu_new");
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
}

TEST(Safetensors, ChecksumsMatchTheReferenceAlgorithms) {
  // XXH64 of "" and "abc" (seed 0) and FNV-1a 64 of "a", from the algorithms' published vectors.
  EXPECT_EQ(checksum_of(ChecksumKind::Xxh64, "", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(checksum_of(ChecksumKind::Xxh64, "abc", 3), 0x44bc2cf5ad770999ull);
  EXPECT_EQ(checksum_of(ChecksumKind::Fnv1a64, "a", 1), 0xaf63dc4c8601ec8cull);
  // Streaming in uneven pieces gives the one-shot value.
  std::string s;
  for (int i = 0; i < 1000; ++i) s.push_back(char(i * 31 + 7));
  Checksum c;
  for (size_t at = 0, k = 1; at < s.size(); at += k, k = k % 37 + 3) c.add(s.data() + at, std::min(k, s.size() - at));
  EXPECT_EQ(c.value(), checksum_of(ChecksumKind::Xxh64, s.data(), s.size()));
}
