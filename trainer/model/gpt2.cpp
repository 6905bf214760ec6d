// model/gpt2.cpp: the GPT-2 passes (see gpt2.h), composed from kernels.h.
#include "model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/flash_attention.h"
#include "model/kernels.h"

namespace zt::model {

namespace k = kernels;

// ---- init -----------------------------------------------------------------------------------------

namespace {

// Standard normals from mt19937_64's words by Box-Muller, written out because std::normal_distribution's
// algorithm is implementation-defined (libstdc++ and libc++ give different streams): the pair of
// words (a, b) gives r cos(theta) and then r sin(theta).
void normal_pair(uint64_t a, uint64_t b, double out[2]) {
  // u1 in (0, 1] so log(u1) is finite; 53 random bits each.
  const double u1 = 1.0 - (double)(a >> 11) * 0x1.0p-53;
  const double u2 = (double)(b >> 11) * 0x1.0p-53;
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * 3.14159265358979323846 * u2;
  out[0] = r * std::cos(theta);
  out[1] = r * std::sin(theta);
}

// std::mt19937_64's stream (the same words from the same seed: Matsumoto and Nishimura's MT19937-64),
// drawn in bulk: the twist of a whole state, then the tempering of it, in loops the compiler can
// vectorize. libstdc++'s engine took 4.7 ns a word here (2-core AMD EPYC, one call at a time), this
// one 1.6: the init's one sequential part, 1.56 G words at 1.5B.
class Mt19937x64 {
 public:
  explicit Mt19937x64(uint64_t seed) {
    s_[0] = seed;
    for (int k = 1; k < kN; ++k) s_[k] = 6364136223846793005ULL * (s_[k - 1] ^ (s_[k - 1] >> 62)) + uint64_t(k);
  }
  void fill(uint64_t* out, size_t n) {
    while (n) {
      if (next_ == kN) twist();
      const size_t take = std::min(n, size_t(kN - next_));
      for (size_t k = 0; k < take; ++k) out[k] = temper(s_[size_t(next_) + k]);
      next_ += int(take);
      out += take;
      n -= take;
    }
  }

 private:
  static constexpr int kN = 312, kM = 156;
  static uint64_t step(uint64_t a, uint64_t b, uint64_t c) {
    const uint64_t x = (a & 0xFFFFFFFF80000000ULL) | (b & 0x7FFFFFFFULL);
    return c ^ (x >> 1) ^ ((0 - (x & 1)) & 0xB5026F5AA96619E9ULL);
  }
  static uint64_t temper(uint64_t x) {
    x ^= (x >> 29) & 0x5555555555555555ULL;
    x ^= (x << 17) & 0x71D67FFFEDA60000ULL;
    x ^= (x << 37) & 0xFFF7EEE000000000ULL;
    return x ^ (x >> 43);
  }
  void twist() {
    int k = 0;
    for (; k < kN - kM; ++k) s_[k] = step(s_[k], s_[k + 1], s_[k + kM]);
    for (; k < kN - 1; ++k) s_[k] = step(s_[k], s_[k + 1], s_[k + kM - kN]);
    s_[kN - 1] = step(s_[kN - 1], s_[0], s_[kM - 1]);
    next_ = 0;
  }
  uint64_t s_[kN];
  int next_ = kN;  // the next state word to temper; kN: twist first
};

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// A tensor drawn from the stream: samples [first, first + n) of it, times std_dev, into w.
struct Drawn {
  int64_t first, n;
  float* w;
  double std_dev;
};

// Pairs [lo, hi) of the stream from their words (words[2 (k - base)], words[2 (k - base) + 1]),
// written where they belong: `si` starts at the tensor holding sample 2 lo.
void write_pairs(const std::vector<Drawn>& drawn, int64_t total, const uint64_t* words, int64_t base, int64_t lo,
                 int64_t hi) {
  size_t si = size_t(std::upper_bound(drawn.begin(), drawn.end(), 2 * lo,
                                      [](int64_t s, const Drawn& d) { return s < d.first; }) -
                     drawn.begin()) -
              1;
  for (int64_t k = lo; k < hi; ++k) {
    double z[2];
    normal_pair(words[2 * (k - base)], words[2 * (k - base) + 1], z);
    for (int h = 0; h < 2; ++h) {
      const int64_t s = 2 * k + h;
      if (s >= total) return;
      while (s >= drawn[si].first + drawn[si].n) ++si;
      drawn[si].w[s - drawn[si].first] = (float)(drawn[si].std_dev * z[h]);
    }
  }
}

}  // namespace

void init_params(const Config& config, uint64_t seed, float* params) {
  const std::vector<ParamSpec> table = param_table(config);
  // GPT-2 scales the two projections that write into the residual stream so that its variance
  // does not grow with depth (each block adds two of them).
  const double residual_std = 0.02 / std::sqrt(2.0 * (double)config.layers);
  // The drawn tensors take one stream of normals in the table's order, each the next numel of it
  // (a pair's second sample goes to the next tensor when one ends mid-pair): the values of one
  // draw after another, whatever the threads. The words come from the generator in order, a block
  // at a time (the next block's drawn on a thread of its own meanwhile); the transform, most of the
  // old single-threaded 17.5 ns a parameter measured here (about half a minute at 1.5B at that
  // rate), runs on OpenMP threads.
  std::vector<Drawn> drawn;
  int64_t total = 0;
  for (const ParamSpec& p : table) {
    float* w = params + p.offset;
    const bool layernorm = p.name.find("ln") != std::string::npos;  // ln1, ln2, final_ln
    if (ends_with(p.name, ".bias")) {
      std::fill(w, w + p.numel, 0.0f);
    } else if (layernorm) {
      std::fill(w, w + p.numel, 1.0f);
    } else if (p.numel > 0) {
      const bool residual = ends_with(p.name, "attn.proj.weight") || ends_with(p.name, "mlp.proj.weight");
      drawn.push_back({total, p.numel, w, residual ? residual_std : 0.02});
      total += p.numel;
    }
  }
  const int64_t pairs = (total + 1) / 2;
  constexpr int64_t kBlock = int64_t{1} << 20;  // pairs a block: 16 MiB of words
  constexpr int64_t kPiece = 4096;              // pairs a thread takes at a time
  Mt19937x64 rng(seed);
  auto draw = [&rng](std::vector<uint64_t>& words, int64_t n) {
    words.resize(size_t(2 * n));
    rng.fill(words.data(), words.size());
  };
  std::vector<uint64_t> words, next;
  words.reserve(size_t(2 * std::min(kBlock, pairs)));
  next.reserve(words.capacity());  // the drawer thread allocates nothing
  draw(words, std::min(kBlock, pairs));
  for (int64_t base = 0; base < pairs; base += kBlock) {
    const int64_t n = std::min(kBlock, pairs - base), n_next = std::min(kBlock, pairs - base - n);
    std::thread drawer;
    if (n_next > 0) drawer = std::thread([&] { draw(next, n_next); });
    const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(dynamic) if (pieces > 1)
    for (int64_t c = 0; c < pieces; ++c)
      write_pairs(drawn, total, words.data(), base, base + c * kPiece, base + std::min(n, (c + 1) * kPiece));
    if (drawer.joinable()) drawer.join();
    words.swap(next);
  }
}

Status check_tokens(const Config& config, const int32_t* tokens, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= config.vocab) {
      return Status::Error(std::string(what) + "[" + std::to_string(i) + "] = " +
                           std::to_string(tokens[i]) + " is outside the vocabulary 0.." +
                           std::to_string(config.vocab - 1) + "; check the tokenizer or data file");
    }
  }
  return Status::Ok();
}

// ---- workspace ------------------------------------------------------------------------------------

namespace {

// What one block keeps from its forward for its backward.
struct BlockCache {
  float* ln1;       // [N, C]
  float* ln1_mean;  // [N]
  float* ln1_rstd;  // [N]
  float* qkv;       // [N, 3C]
  float* att;       // [B, H, T, T] probabilities; with flash attention [B, H, T] log-sum-exps
  float* atty;      // [N, C] attention output before its projection
  float* res2;      // [N, C] x_in + attention branch
  float* ln2;       // [N, C]
  float* ln2_mean;  // [N]
  float* ln2_rstd;  // [N]
  float* fch;       // [N, 4C] MLP pre-activation
  float* fch_gelu;  // [N, 4C]
};

// Hands out sub-buffers of one allocation, each rounded to 16 floats (64 bytes) so every buffer
// starts on a cache line relative to the base.
class Carver {
 public:
  explicit Carver(bool measure) : measure_(measure) {}
  void set_base(float* base) { base_ = base; }
  float* take(int64_t n) {
    const int64_t rounded = (n + 15) / 16 * 16;
    float* p = measure_ ? nullptr : base_ + used_;
    used_ += rounded;
    return p;
  }
  int64_t used() const { return used_; }

 private:
  bool measure_;
  float* base_ = nullptr;
  int64_t used_ = 0;
};

}  // namespace

int64_t head_chunk_rows(const Config& c, int64_t N, int64_t asked, int64_t budget_bytes) {
  const int64_t budget_floats = budget_bytes / int64_t(sizeof(float));
  const int64_t rows = asked > 0 ? asked : budget_floats / c.vocab;
  return std::max<int64_t>(1, std::min<int64_t>(N, rows));
}

struct Workspace::Impl {
  Config config;
  int B = 0, T = 0;
  int64_t N = 0;
  bool checkpoint = false;
  Attention attention = Attention::Materialized;
  BlockOffsets block;
  EmbeddingOffsets emb;
  FinalOffsets fin;

  std::vector<float> kept_storage;     // block caches + residual streams
  std::vector<float> scratch_storage;  // reused by every pass
  std::vector<BlockCache> caches;      // L, or 1 shared when checkpointing
  std::vector<float*> residual;        // L + 1 of [N, C]
  float* grad_residual = nullptr;      // [N, C]

  // backward scratch, shared by all blocks
  float* dres2 = nullptr;        // [N, C]
  float* dfch = nullptr;         // [N, 4C]
  float* dln = nullptr;          // [N, C]
  float* datty = nullptr;        // [N, C]
  float* dqkv = nullptr;         // [N, 3C]
  float* att_scratch = nullptr;  // [B, H, T] (flash: rowsum(dout * out))

  // LM head
  float* lnf = nullptr;       // [N, C]
  float* lnf_mean = nullptr;  // [N]
  float* lnf_rstd = nullptr;  // [N]
  float* dlnf = nullptr;      // [N, C]
  float* logits = nullptr;    // [chunk_rows, V]
  float* row_loss = nullptr;  // [N]
  int64_t chunk_rows = 0;     // requested (0 = automatic) until carve(), then the actual count

  BlockCache& cache(int layer) { return checkpoint ? caches[0] : caches[(size_t)layer]; }

  // Lays every buffer out; with measure, only counts.
  void carve(Carver& kept, Carver& scratch) {
    const int64_t C = config.width, H = config.heads, L = config.layers;
    caches.assign(checkpoint ? 1 : (size_t)L, BlockCache{});
    for (BlockCache& c : caches) {
      c.ln1 = kept.take(N * C);
      c.ln1_mean = kept.take(N);
      c.ln1_rstd = kept.take(N);
      c.qkv = kept.take(N * 3 * C);
      c.att = kept.take((int64_t)B * H * T * (attention == Attention::Flash ? 1 : T));
      c.atty = kept.take(N * C);
      c.res2 = kept.take(N * C);
      c.ln2 = kept.take(N * C);
      c.ln2_mean = kept.take(N);
      c.ln2_rstd = kept.take(N);
      c.fch = kept.take(N * 4 * C);
      c.fch_gelu = kept.take(N * 4 * C);
    }
    residual.assign((size_t)L + 1, nullptr);
    for (float*& r : residual) r = kept.take(N * C);

    grad_residual = scratch.take(N * C);
    dres2 = scratch.take(N * C);
    dfch = scratch.take(N * 4 * C);
    dln = scratch.take(N * C);
    datty = scratch.take(N * C);
    dqkv = scratch.take(N * 3 * C);
    att_scratch = scratch.take((int64_t)B * H * T);
    lnf = scratch.take(N * C);
    lnf_mean = scratch.take(N);
    lnf_rstd = scratch.take(N);
    dlnf = scratch.take(N * C);
    chunk_rows = head_chunk_rows(config, N, chunk_rows);
    logits = scratch.take(chunk_rows * config.vocab);
    row_loss = scratch.take(N);
  }
};

Status Workspace::check(const Config& config, int B, int T) {
  if (Status s = validate(config); !s.ok()) return s;
  if (B < 1) return Status::Error("workspace: batch size B = " + std::to_string(B) + "; it must be at least 1");
  if (T < 1 || T > config.context) {
    return Status::Error("workspace: sequence length T = " + std::to_string(T) + " is outside 1.." +
                         std::to_string(config.context) + " (the model's context)");
  }
  // Every activation tensor must stay within cblas's int sizes (e.g. N x 4C, chunk x vocab).
  const int64_t N = (int64_t)B * T;
  if (N > std::numeric_limits<int>::max() / (4 * config.width)) {
    return Status::Error("workspace: B*T = " + std::to_string(N) + " tokens at width " +
                         std::to_string(config.width) + " exceeds 2^31-1 elements per activation; "
                         "use a smaller micro-batch");
  }
  return Status::Ok();
}

Workspace::Workspace(const Config& config, int B, int T, bool checkpoint_activations,
                     int64_t head_rows_per_chunk, Attention attention)
    : impl_(std::make_unique<Impl>()) {
  if (Status s = check(config, B, T); !s.ok()) throw std::invalid_argument(s.message());
  Impl& w = *impl_;
  w.config = config;
  w.B = B;
  w.T = T;
  w.N = (int64_t)B * T;
  w.checkpoint = checkpoint_activations;
  w.attention = attention;
  w.chunk_rows = head_rows_per_chunk;  // carve() turns the request into the actual row count
  w.block = block_offsets(config);
  w.emb = embedding_offsets(config);
  w.fin = final_offsets(config);
  Carver count_kept(true), count_scratch(true);
  w.carve(count_kept, count_scratch);
  w.kept_storage.assign((size_t)count_kept.used(), 0.0f);
  w.scratch_storage.assign((size_t)count_scratch.used(), 0.0f);
  Carver kept(false), scratch(false);
  kept.set_base(w.kept_storage.data());
  scratch.set_base(w.scratch_storage.data());
  w.carve(kept, scratch);
}

Workspace::~Workspace() = default;
const Config& Workspace::config() const { return impl_->config; }
int Workspace::B() const { return impl_->B; }
int Workspace::T() const { return impl_->T; }
bool Workspace::checkpointing() const { return impl_->checkpoint; }
Attention Workspace::attention() const { return impl_->attention; }

const char* attention_name(Attention a) { return a == Attention::Flash ? "flash" : "materialized"; }
bool parse_attention(const std::string& name, Attention* out) {
  // Hugging Face's attn_implementation names too: eager materializes the probabilities; sdpa (its flash or
  // memory-efficient kernel) and flash_attention_2 keep one log-sum-exp a row.
  if (name == "materialized" || name == "eager") *out = Attention::Materialized;
  else if (name == "flash" || name == "sdpa" || name == "flash_attention_2") *out = Attention::Flash;
  else return false;
  return true;
}
size_t Workspace::bytes_kept() const { return impl_->kept_storage.size() * sizeof(float); }
size_t Workspace::bytes_scratch() const { return impl_->scratch_storage.size() * sizeof(float); }
size_t Workspace::bytes() const { return bytes_kept() + bytes_scratch(); }
float* Workspace::residual(int i) { return impl_->residual.at((size_t)i); }
float* Workspace::grad_residual() { return impl_->grad_residual; }

// ---- embeddings -----------------------------------------------------------------------------------

void embed_forward(Workspace& ws, const float* emb_params, const int32_t* tokens, float* x_out) {
  Workspace::Impl& w = ws.impl();
  const int64_t C = w.config.width, T = w.T;
  const float* wte = emb_params + w.emb.wte;
  const float* wpe = emb_params + w.emb.wpe;
#pragma omp parallel for schedule(static) if(w.N * C >= k::kMinParallelElements)
  for (int64_t n = 0; n < w.N; n++) {
    const float* te = wte + (int64_t)tokens[n] * C;
    const float* pe = wpe + (n % T) * C;
    float* x = x_out + n * C;
    for (int64_t i = 0; i < C; i++) x[i] = te[i] + pe[i];
  }
}

void embed_backward(Workspace& ws, const int32_t* tokens, const float* dx, float* d_emb_params) {
  Workspace::Impl& w = ws.impl();
  const int64_t C = w.config.width, T = w.T, B = w.B;
  float* dwte = d_emb_params + w.emb.wte;
  float* dwpe = d_emb_params + w.emb.wpe;
  // The same token can appear at many positions: rather than atomics, each thread owns a range of
  // channels and walks the positions in order, so every d_wte element sums in a fixed order.
  constexpr int64_t kChunk = 16;
  const int64_t chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if(w.N * C >= k::kMinParallelElements)
  for (int64_t ch = 0; ch < chunks; ch++) {
    const int64_t c0 = ch * kChunk, c1 = std::min(C, c0 + kChunk);
    for (int64_t n = 0; n < w.N; n++) {
      float* row = dwte + (int64_t)tokens[n] * C;
      const float* g = dx + n * C;
      for (int64_t c = c0; c < c1; c++) row[c] += g[c];
    }
  }
#pragma omp parallel for schedule(static) if(w.N * C >= k::kMinParallelElements)
  for (int64_t t = 0; t < T; t++) {
    float* row = dwpe + t * C;
    for (int64_t b = 0; b < B; b++) {
      const float* g = dx + (b * T + t) * C;
      for (int64_t c = 0; c < C; c++) row[c] += g[c];
    }
  }
}

// ---- blocks ---------------------------------------------------------------------------------------

namespace {

// The block's forward into `c`. With x_out null it stops after the MLP's GELU: that is all the
// backward needs, which is what the checkpointing recompute uses.
void run_block_forward(Workspace::Impl& w, BlockCache& c, const float* p, const float* x_in,
                       float* x_out) {
  const BlockOffsets& o = w.block;
  const int64_t C = w.config.width, N = w.N;
  k::layernorm_forward(c.ln1, c.ln1_mean, c.ln1_rstd, x_in, p + o.ln1_w, p + o.ln1_b, N, C);
  k::matmul_forward(c.qkv, c.ln1, p + o.qkv_w, p + o.qkv_b, N, C, 3 * C);
  if (w.attention == Attention::Flash)
    flash_attention_forward(c.atty, c.att, c.qkv, w.B, w.T, C, w.config.heads);
  else
    k::attention_forward(c.atty, c.att, c.qkv, w.B, w.T, C, w.config.heads);
  std::memcpy(c.res2, x_in, sizeof(float) * N * C);  // the residual: res2 = x_in + proj(atty)
  k::matmul_forward(c.res2, c.atty, p + o.attn_proj_w, p + o.attn_proj_b, N, C, C, true);
  k::layernorm_forward(c.ln2, c.ln2_mean, c.ln2_rstd, c.res2, p + o.ln2_w, p + o.ln2_b, N, C);
  k::matmul_forward(c.fch, c.ln2, p + o.fc_w, p + o.fc_b, N, C, 4 * C);
  k::gelu_forward(c.fch_gelu, c.fch, N * 4 * C);
  if (x_out == nullptr) return;
  std::memcpy(x_out, c.res2, sizeof(float) * N * C);  // x_out = res2 + proj(gelu(fc))
  k::matmul_forward(x_out, c.fch_gelu, p + o.mlp_proj_w, p + o.mlp_proj_b, N, 4 * C, C, true);
}

}  // namespace

void block_forward(Workspace& ws, int layer, const float* block_params, const float* x_in,
                   float* x_out) {
  Workspace::Impl& w = ws.impl();
  run_block_forward(w, w.cache(layer), block_params, x_in, x_out);
}

void block_backward(Workspace& ws, int layer, const float* p, const float* x_in,
                    const float* dx_out, float* dx_in, float* dp) {
  Workspace::Impl& w = ws.impl();
  BlockCache& c = w.cache(layer);
  if (w.checkpoint) run_block_forward(w, c, p, x_in, nullptr);
  const BlockOffsets& o = w.block;
  const int64_t C = w.config.width, N = w.N;
  // dp null: a frozen block (no weight gradients; its input's gradient all the same).
  auto D = [dp](int64_t offset) { return dp ? dp + offset : nullptr; };

  // MLP projection (x_out = res2 + fch_gelu @ W^T + b). dx_out is read only here, so dx_in may
  // alias it: it is written last.
  k::matmul_backward(w.dfch, D(o.mlp_proj_w), D(o.mlp_proj_b), dx_out, c.fch_gelu,
                     p + o.mlp_proj_w, N, 4 * C, C);
  std::memcpy(w.dres2, dx_out, sizeof(float) * N * C);
  k::gelu_backward(w.dfch, c.fch, w.dfch, N * 4 * C);
  k::matmul_backward(w.dln, D(o.fc_w), D(o.fc_b), w.dfch, c.ln2, p + o.fc_w, N, C, 4 * C);
  k::layernorm_backward(w.dres2, D(o.ln2_w), D(o.ln2_b), w.dln, c.res2, p + o.ln2_w,
                        c.ln2_mean, c.ln2_rstd, N, C, /*accumulate_dinp=*/true);

  // Attention branch (res2 = x_in + atty @ W^T + b).
  k::matmul_backward(w.datty, D(o.attn_proj_w), D(o.attn_proj_b), w.dres2, c.atty,
                     p + o.attn_proj_w, N, C, C);
  if (w.attention == Attention::Flash)
    flash_attention_backward(w.dqkv, w.att_scratch, w.datty, c.qkv, c.atty, c.att, w.B, w.T, C, w.config.heads);
  else
    k::attention_backward(w.dqkv, w.att_scratch, w.datty, c.qkv, c.att, w.B, w.T, C, w.config.heads);
  k::matmul_backward(w.dln, D(o.qkv_w), D(o.qkv_b), w.dqkv, c.ln1, p + o.qkv_w, N, C, 3 * C);
  std::memcpy(dx_in, w.dres2, sizeof(float) * N * C);
  k::layernorm_backward(dx_in, D(o.ln1_w), D(o.ln1_b), w.dln, x_in, p + o.ln1_w, c.ln1_mean,
                        c.ln1_rstd, N, C, /*accumulate_dinp=*/true);
}

// ---- LM head --------------------------------------------------------------------------------------

namespace {

// Shared by the forward-only and forward+backward head. With backward, each logits chunk is
// turned into d(logits) in place and pushed through the tied GEMMs before the next chunk.
float run_head(Workspace::Impl& w, const float* fp, const float* wte, const float* x,
               const int32_t* targets, float* logits_out, bool backward, float* dx, float* dfp,
               float* dwte, float grad_scale) {
  const int64_t C = w.config.width, V = w.config.vocab, N = w.N;
  k::layernorm_forward(w.lnf, w.lnf_mean, w.lnf_rstd, x, fp + w.fin.ln_w, fp + w.fin.ln_b, N, C);
  const float dscale = grad_scale / (float)N;  // d(mean loss) / d(row loss), times the scale
  for (int64_t r0 = 0; r0 < N; r0 += w.chunk_rows) {
    const int64_t rows = std::min(w.chunk_rows, N - r0);
    float* lg = logits_out != nullptr ? logits_out + r0 * V : w.logits;
    k::matmul_forward(lg, w.lnf + r0 * C, wte, nullptr, rows, C, V);
    if (targets == nullptr) continue;
#pragma omp parallel for schedule(static) if(rows * V >= k::kMinParallelElements)
    for (int64_t r = 0; r < rows; r++) {
      float* row = lg + r * V;
      const int32_t target = targets[r0 + r];
      float maxv = -INFINITY;
      for (int64_t i = 0; i < V; i++) maxv = std::max(maxv, row[i]);
      const float target_logit = row[target];
      double sum = 0.0;
      if (!backward) {
        // Forward only: logits_out must come back intact, so nothing is written to the row.
        for (int64_t i = 0; i < V; i++) sum += std::exp(row[i] - maxv);
        w.row_loss[r0 + r] = (float)(std::log(sum) + maxv - target_logit);
        continue;
      }
      // In place, one exp per logit: row becomes exp(logit - max), then
      // d(loss)/d(logit_i) = softmax_i - [i == target], times dscale.
      for (int64_t i = 0; i < V; i++) {
        const float e = std::exp(row[i] - maxv);
        row[i] = e;
        sum += e;
      }
      w.row_loss[r0 + r] = (float)(std::log(sum) + maxv - target_logit);
      const float inv = (float)(1.0 / sum) * dscale;
      for (int64_t i = 0; i < V; i++) row[i] *= inv;
      row[target] -= dscale;
    }
    if (backward) {
      k::matmul_backward(w.dlnf + r0 * C, dwte, nullptr, lg, w.lnf + r0 * C, wte, rows, C, V);
    }
  }
  if (backward) {
    k::layernorm_backward(dx, dfp ? dfp + w.fin.ln_w : nullptr, dfp ? dfp + w.fin.ln_b : nullptr, w.dlnf, x,
                          fp + w.fin.ln_w,
                          w.lnf_mean, w.lnf_rstd, N, C, /*accumulate_dinp=*/false);
  }
  if (targets == nullptr) return std::numeric_limits<float>::quiet_NaN();
  double total = 0.0;  // in row order: deterministic
  for (int64_t n = 0; n < N; n++) total += w.row_loss[n];
  return (float)(total / (double)N);
}

}  // namespace

float head_forward(Workspace& ws, const float* final_params, const float* wte, const float* x,
                   const int32_t* targets, float* logits) {
  return run_head(ws.impl(), final_params, wte, x, targets, logits, false, nullptr, nullptr,
                  nullptr, 1.0f);
}

float head_forward_backward(Workspace& ws, const float* final_params, const float* wte,
                            const float* x, const int32_t* targets, float* dx,
                            float* d_final_params, float* d_wte, float grad_scale) {
  if (targets == nullptr) throw std::invalid_argument("head_forward_backward: targets are required");
  return run_head(ws.impl(), final_params, wte, x, targets, nullptr, true, dx, d_final_params,
                  d_wte, grad_scale);
}

// ---- whole model ----------------------------------------------------------------------------------

namespace {

struct ModuleOffsets {
  int64_t embeddings, final_ln;
  std::vector<int64_t> blocks;
};

ModuleOffsets module_offsets(const Config& config) {
  const std::vector<ModuleSpec> modules = module_table(config);
  ModuleOffsets m;
  m.embeddings = modules.front().offset;
  m.final_ln = modules.back().offset;
  for (size_t i = 1; i + 1 < modules.size(); i++) m.blocks.push_back(modules[i].offset);
  return m;
}

}  // namespace

float forward(Workspace& ws, const float* params, const int32_t* tokens, const int32_t* targets,
              float* logits) {
  Workspace::Impl& w = ws.impl();
  const ModuleOffsets m = module_offsets(w.config);
  const float* emb = params + m.embeddings;
  embed_forward(ws, emb, tokens, w.residual[0]);
  for (int l = 0; l < (int)w.config.layers; l++) {
    block_forward(ws, l, params + m.blocks[(size_t)l], w.residual[(size_t)l], w.residual[(size_t)l + 1]);
  }
  return head_forward(ws, params + m.final_ln, emb + w.emb.wte, w.residual.back(), targets, logits);
}

float forward_backward(Workspace& ws, const float* params, const int32_t* tokens,
                       const int32_t* targets, float* grads, float grad_scale) {
  Workspace::Impl& w = ws.impl();
  const ModuleOffsets m = module_offsets(w.config);
  const int L = (int)w.config.layers;
  const float* emb = params + m.embeddings;
  embed_forward(ws, emb, tokens, w.residual[0]);
  for (int l = 0; l < L; l++) {
    block_forward(ws, l, params + m.blocks[(size_t)l], w.residual[(size_t)l], w.residual[(size_t)l + 1]);
  }
  float* dx = w.grad_residual;  // one buffer, updated in place block by block
  const float loss = head_forward_backward(ws, params + m.final_ln, emb + w.emb.wte, w.residual.back(),
                                           targets, dx, grads + m.final_ln,
                                           grads + m.embeddings + w.emb.wte, grad_scale);
  for (int l = L - 1; l >= 0; l--) {
    block_backward(ws, l, params + m.blocks[(size_t)l], w.residual[(size_t)l], dx, dx,
                   grads + m.blocks[(size_t)l]);
  }
  embed_backward(ws, tokens, dx, grads + m.embeddings);
  return loss;
}

FlopCount flops(const Config& c, int B, int T) {
  const double N = (double)B * T, C = (double)c.width;
  FlopCount f;
  // per block: qkv 3C^2, proj C^2, fc 4C^2, mlp proj 4C^2 multiply-adds per token
  f.matmul = (double)c.layers * 2.0 * N * 12.0 * C * C + 2.0 * N * C * (double)c.vocab;
  // Q K^T and att V: per (b, h), sum over t of (t + 1) * hs multiply-adds each
  f.attention = (double)c.layers * (double)B * 2.0 * 2.0 * ((double)T * (T + 1) / 2.0) * C;
  return f;
}

}  // namespace zt::model
