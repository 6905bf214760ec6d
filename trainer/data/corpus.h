// trainer/data/corpus.h: the tokens a run trains on, and exact accounting of them.
//
// Owns: loading byte-level text files and pre-tokenized token files, the built-in
// deterministic synthetic corpus, and the plan that says how many samples an epoch has,
// how many optimizer steps that makes, and what is truncated or dropped on the way. The
// bug report R1 ("32 steps on a 50k-sample data set") is about numbers like these being
// silently wrong; here every one of them is computed in one place and printed.
//
// Token file format (little-endian): magic "ZTTOKENS" (8 bytes), version u32 = 1,
// token width u32 = 2 (uint16), vocab size u32, reserved u32, token count u64, then the tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zt/common/status.h"

namespace zt::trainer {

struct Corpus {
  std::string source;              // file path, or "synthetic(seed=N)"
  int64_t vocab = 256;             // byte-level unless a token file says otherwise
  std::vector<int32_t> tokens;     // documents concatenated
  int64_t documents = 0;           // documents kept
  int64_t truncated_documents = 0; // documents cut to max_doc_tokens
  int64_t truncated_tokens = 0;    // tokens lost to that cut
  int64_t dropped_documents = 0;   // empty documents
};

// Byte-level: every byte is a token. Documents are separated by a blank line; with
// max_doc_tokens > 0 each document is cut to that many tokens (and counted).
Status load_text_corpus(const std::string& path, int64_t max_doc_tokens, Corpus* out);
Status load_token_file(const std::string& path, Corpus* out);
Status write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab);
// A seeded text of short English-like sentences that a tiny model learns in a few hundred
// steps; about `bytes` long, split into documents of a few sentences.
Corpus synthetic_corpus(uint64_t seed, int64_t bytes);

struct DataPlan {
  int64_t tokens = 0;
  int64_t seq_len = 0;
  int64_t samples_per_epoch = 0;      // windows of seq_len+1 tokens, stride seq_len
  int64_t tail_tokens_dropped = 0;    // tokens after the last whole window
  int64_t micro_batch = 0, grad_accum = 0, data_parallel = 0;
  int64_t samples_per_step = 0;       // micro_batch * grad_accum * data_parallel
  int64_t steps_per_epoch = 0;
  int64_t samples_dropped_per_epoch = 0;  // the last partial global batch (drop_last)
  std::string error;                  // non-empty when no step can be formed
};
DataPlan plan_data(const Corpus& corpus, int64_t seq_len, int64_t micro_batch, int64_t grad_accum,
                   int64_t data_parallel);

// The same plan from a count of samples (virtual mode: a data set described, not read).
DataPlan plan_samples(int64_t samples, int64_t seq_len, int64_t micro_batch, int64_t grad_accum, int64_t data_parallel);

// Yields micro-batches: epoch by epoch, samples in a seeded order per epoch, each rank its
// own slice of each global batch. Position (epoch, step) is all the state it has, so a
// resumed run sees the same batches.
class DataLoader {
 public:
  DataLoader(const Corpus& corpus, const DataPlan& plan, uint64_t seed);
  // Fills tokens and targets (micro_batch x seq_len each) for one micro-step of one rank.
  void micro_batch(int64_t epoch, int64_t step_in_epoch, int64_t micro, int64_t rank, int32_t* tokens,
                   int32_t* targets);
  // An evaluation's micro-batch `index` of one rank: the corpus's samples in order (zerotrace has no
  // separate evaluation set), wrapping around; not counted as used for training.
  void eval_batch(int64_t index, int64_t rank, int32_t* tokens, int32_t* targets) const;
  // Virtual mode: a micro-batch counted as used, no tokens read.
  void account_micro_batch() { samples_used_ += plan_.micro_batch; }
  int64_t samples_used() const { return samples_used_; }

 private:
  const std::vector<int64_t>& order(int64_t epoch);
  const Corpus& corpus_;
  DataPlan plan_;
  uint64_t seed_;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
  int64_t samples_used_ = 0;
};

}  // namespace zt::trainer
