#include "corpus.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <random>

#include "zt/common/files.h"

namespace zt::trainer {

namespace {
constexpr char kMagic[8] = {'Z', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr uint32_t kVersion = 1;

void add_document(Corpus& c, const std::string& doc, int64_t max_doc_tokens) {
  if (doc.empty()) {
    ++c.dropped_documents;
    return;
  }
  int64_t n = static_cast<int64_t>(doc.size());
  if (max_doc_tokens > 0 && n > max_doc_tokens) {
    ++c.truncated_documents;
    c.truncated_tokens += n - max_doc_tokens;
    n = max_doc_tokens;
  }
  for (int64_t i = 0; i < n; ++i) c.tokens.push_back(static_cast<unsigned char>(doc[size_t(i)]));
  c.tokens.push_back('\n');  // the separator stays part of the text the model sees
  ++c.documents;
}
}  // namespace

Status load_text_corpus(const std::string& path, int64_t max_doc_tokens, Corpus* out) {
  std::string text;
  if (Status s = read_text_file(path, "data file", &text); !s) return s;
  if (text.empty()) return Status::Error(path + ": the data file is empty");
  if (text.find('\0') != std::string::npos)
    return Status::Error(path + ": contains NUL bytes: not a text file (a token file starts with ZTTOKENS)");
  // Windows line ends read as Unix ones: a blank line "\r\n\r\n" separates documents too (a CRLF
  // file was one document, cut whole by --max-doc-tokens).
  if (text.find('\r') != std::string::npos) {
    std::string lf;
    lf.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i)
      if (!(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) lf.push_back(text[i]);
    text.swap(lf);
  }
  Corpus c;
  c.source = path;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find("\n\n", start);
    if (end == std::string::npos) end = text.size();
    std::string doc = text.substr(start, end - start);
    while (!doc.empty() && doc.front() == '\n') doc.erase(doc.begin());
    // The file's last line end is not text of its last document (the separator follows every
    // document): "aa\n\nbb\n" holds the documents "aa" and "bb", as "aa\n\nbb" does.
    if (end == text.size())
      while (!doc.empty() && doc.back() == '\n') doc.pop_back();
    add_document(c, doc, max_doc_tokens);
    start = end + 2;
  }
  *out = std::move(c);
  return Status::Ok();
}

Status load_token_file(const std::string& path, Corpus* out) {
  if (Status s = check_input_file(path, "token file"); !s) return s;
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::Error(path + ": cannot open the token file: " + std::strerror(errno));
  char magic[8];
  uint32_t version = 0, width = 0, vocab = 0, reserved = 0;
  uint64_t count = 0;
  f.read(magic, 8);
  if (!f || std::memcmp(magic, kMagic, 8) != 0) return Status::Error(path + ": not a token file (no ZTTOKENS header)");
  f.read(reinterpret_cast<char*>(&version), 4);
  f.read(reinterpret_cast<char*>(&width), 4);
  f.read(reinterpret_cast<char*>(&vocab), 4);
  f.read(reinterpret_cast<char*>(&reserved), 4);
  f.read(reinterpret_cast<char*>(&count), 8);
  if (!f) return Status::Error(path + ": truncated token file header");
  if (version != kVersion)
    return Status::Error(path + ": token file version " + std::to_string(version) + "; this zt reads version 1");
  if (width != 2) return Status::Error(path + ": token width " + std::to_string(width) + " bytes; only 2 (uint16) is supported");
  if (vocab == 0 || vocab > 65536) return Status::Error(path + ": invalid vocab size " + std::to_string(vocab));
  // The header's count against the file's size, before allocating for it.
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  const uint64_t holds = !ec && size >= 32 ? (size - 32) / 2 : 0;
  if (count > holds)
    return Status::Error(path + ": truncated token file: header says " + std::to_string(count) + " tokens, file holds " +
                         std::to_string(holds));
  // More data than the header counts: a file written wrongly, or two concatenated; either way the
  // rest would be left out without a word.
  if (!ec && size != 32 + count * 2)
    return Status::Error(path + ": the header says " + std::to_string(count) + " tokens, but " +
                         std::to_string(size - 32) + " bytes follow it (" + std::to_string((size - 32) / 2) +
                         " tokens" + ((size - 32) % 2 ? " and an odd byte" : "") + ")");
  std::vector<uint16_t> raw(count);
  f.read(reinterpret_cast<char*>(raw.data()), std::streamsize(count * 2));
  if (static_cast<uint64_t>(f.gcount()) != count * 2)
    return Status::Error(path + ": truncated token file: header says " + std::to_string(count) + " tokens, file holds " +
                         std::to_string(f.gcount() / 2));
  Corpus c;
  c.source = path;
  c.vocab = vocab;
  c.tokens.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    if (raw[i] >= vocab)
      return Status::Error(path + ": token " + std::to_string(raw[i]) + " at position " + std::to_string(i) +
                           " is outside the vocab of " + std::to_string(vocab));
    c.tokens.push_back(raw[i]);
  }
  c.documents = 1;
  *out = std::move(c);
  return Status::Ok();
}

Status write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab) {
  std::string tmp = path + ".writing";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status::Error(path + ": cannot write here: " + std::strerror(errno));
    uint32_t version = kVersion, width = 2, v = static_cast<uint32_t>(vocab), reserved = 0;
    uint64_t count = tokens.size();
    f.write(kMagic, 8);
    f.write(reinterpret_cast<const char*>(&version), 4);
    f.write(reinterpret_cast<const char*>(&width), 4);
    f.write(reinterpret_cast<const char*>(&v), 4);
    f.write(reinterpret_cast<const char*>(&reserved), 4);
    f.write(reinterpret_cast<const char*>(&count), 8);
    for (int32_t t : tokens) {
      uint16_t u = static_cast<uint16_t>(t);
      f.write(reinterpret_cast<const char*>(&u), 2);
    }
    if (!f) return Status::Error(path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::Error(path + ": cannot move the file into place");
  return Status::Ok();
}

Corpus synthetic_corpus(uint64_t seed, int64_t bytes) {
  static const char* subjects[] = {"the cat", "a dog", "the bird", "my friend", "the old man", "a child", "the teacher"};
  static const char* verbs[] = {"sat on", "ran to", "looked at", "walked past", "jumped over", "found"};
  static const char* objects[] = {"the mat", "the park", "a tree", "the house", "the river", "a box", "the garden"};
  std::mt19937_64 rng(seed);
  Corpus c;
  c.source = "synthetic(seed=" + std::to_string(seed) + ")";
  while (static_cast<int64_t>(c.tokens.size()) < bytes) {
    std::string doc;
    int sentences = 2 + int(rng() % 3);
    for (int s = 0; s < sentences; ++s) {
      doc += subjects[rng() % 7];
      doc += ' ';
      doc += verbs[rng() % 6];
      doc += ' ';
      doc += objects[rng() % 7];
      doc += ". ";
    }
    add_document(c, doc, 0);
  }
  return c;
}

namespace {
// The plan once the number of samples per epoch is known.
DataPlan plan_for(int64_t tokens, int64_t samples, int64_t seq_len, int64_t micro_batch, int64_t grad_accum,
                  int64_t data_parallel, const std::string& what) {
  DataPlan p;
  p.tokens = tokens;
  p.seq_len = seq_len;
  p.micro_batch = micro_batch;
  p.grad_accum = grad_accum;
  p.data_parallel = data_parallel;
  p.samples_per_step = micro_batch * grad_accum * data_parallel;
  if (seq_len <= 0 || micro_batch <= 0 || grad_accum <= 0 || data_parallel <= 0) {
    p.error = "sequence length, micro-batch, accumulation and data-parallel width must all be at least 1";
    return p;
  }
  p.samples_per_epoch = samples;
  p.steps_per_epoch = p.samples_per_epoch / p.samples_per_step;
  p.samples_dropped_per_epoch = p.samples_per_epoch - p.steps_per_epoch * p.samples_per_step;
  if (p.steps_per_epoch == 0)
    p.error = what + " is smaller than one global batch (" + std::to_string(p.samples_per_step) +
              " samples = micro-batch " + std::to_string(micro_batch) + " x accumulation " +
              std::to_string(grad_accum) + " x data-parallel " + std::to_string(data_parallel) + ")";
  return p;
}
}  // namespace

DataPlan plan_data(const Corpus& corpus, int64_t seq_len, int64_t micro_batch, int64_t grad_accum,
                   int64_t data_parallel) {
  const int64_t tokens = static_cast<int64_t>(corpus.tokens.size());
  const int64_t samples = tokens > 1 && seq_len > 0 ? (tokens - 1) / seq_len : 0;
  DataPlan p = plan_for(tokens, samples, seq_len, micro_batch, grad_accum, data_parallel,
                        "the data (" + std::to_string(samples) + " samples of " + std::to_string(seq_len + 1) + " tokens)");
  if (seq_len > 0) p.tail_tokens_dropped = tokens > 1 ? tokens - 1 - samples * seq_len : tokens;
  return p;
}

DataPlan plan_samples(int64_t samples, int64_t seq_len, int64_t micro_batch, int64_t grad_accum, int64_t data_parallel) {
  // A corpus of exactly `samples` windows, without its tokens.
  return plan_for(samples * seq_len + 1, samples, seq_len, micro_batch, grad_accum, data_parallel,
                  "the data set (" + std::to_string(samples) + " samples)");
}

DataLoader::DataLoader(const Corpus& corpus, const DataPlan& plan, uint64_t seed)
    : corpus_(corpus), plan_(plan), seed_(seed) {}

const std::vector<int64_t>& DataLoader::order(int64_t epoch) {
  if (order_epoch_ != epoch) {
    order_.resize(size_t(plan_.samples_per_epoch));
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = int64_t(i);
    // Our own Fisher-Yates on mt19937_64: identical on every standard library.
    std::mt19937_64 rng(seed_ * 1000003ull + uint64_t(epoch));
    for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng() % i]);
    order_epoch_ = epoch;
  }
  return order_;
}

void DataLoader::micro_batch(int64_t epoch, int64_t step_in_epoch, int64_t micro, int64_t rank, int32_t* tokens,
                             int32_t* targets) {
  const auto& ord = order(epoch);
  const int64_t T = plan_.seq_len, B = plan_.micro_batch;
  // Global batch of a step: samples [step*S, (step+1)*S); rank r, micro m takes a slice of B.
  int64_t base = step_in_epoch * plan_.samples_per_step + (micro * plan_.data_parallel + rank) * B;
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = ord[size_t(base + b)] * T;
    for (int64_t t = 0; t < T; ++t) {
      tokens[b * T + t] = corpus_.tokens[size_t(start + t)];
      targets[b * T + t] = corpus_.tokens[size_t(start + t + 1)];
    }
  }
  samples_used_ += B;
}

void DataLoader::eval_batch(int64_t index, int64_t rank, int32_t* tokens, int32_t* targets) const {
  const int64_t T = plan_.seq_len, B = plan_.micro_batch, n = std::max<int64_t>(1, plan_.samples_per_epoch);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = ((index * plan_.data_parallel + rank) * B + b) % n * T;
    for (int64_t t = 0; t < T; ++t) {
      tokens[b * T + t] = corpus_.tokens[size_t(start + t)];
      targets[b * T + t] = corpus_.tokens[size_t(start + t + 1)];
    }
  }
}

}  // namespace zt::trainer
