// trainer/cuda/model_passes.cpp: see model_passes.h. Each pass is gpt2.cpp's, line for line, with
// the CPU kernels replaced by their CUDA twins (kernels.h, gemm.h) in fp32 and memcpy by
// cudaMemcpyAsync on the passes' stream.
#include "cuda/model_passes.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda/flash_attention.h"
#include "cuda/kernels.h"
#include "cuda/runtime.h"
#include "model/gpt2.h"

namespace zt::cuda {

namespace {

constexpr DType F32 = DType::F32;
constexpr size_t kAlign = 256;  // every sub-buffer starts on a 256-byte boundary

// The CUDA kernels' own limits (kernels.cu check_attention_shape), checked up front so a shape
// that cannot run is refused when the passes are built, not in the middle of a step.
void check_shape(const model::Config& c, int B, int T, model::Attention attention) {
  if (Status s = model::Workspace::check(c, B, T); !s.ok()) throw std::invalid_argument(s.message());
  auto fail = [](const std::string& why) { throw std::invalid_argument("cuda model passes: " + why); };
  if (T > kMaxAttnT)
    fail("sequence length T = " + std::to_string(T) + " exceeds the attention kernels' " + std::to_string(kMaxAttnT));
  if (c.head_size() > kMaxHeadSize)
    fail("head size " + std::to_string(c.head_size()) + " exceeds the attention kernels' " +
         std::to_string(kMaxHeadSize));
  if (B > kMaxGridY || c.heads > kMaxGridY)
    fail("B and heads must be at most " + std::to_string(kMaxGridY) + " (CUDA grid dimensions)");
  if (attention == model::Attention::Flash)
    if (std::string why = flash_attention_unsupported(B, T, c.width, c.heads); !why.empty())
      fail("flash attention: " + why + " (--attention materialized runs any shape)");
}

// The LM head's logits chunk when not asked (model::head_chunk_rows' budget): about 256 MiB. The
// reference's 32 MiB gave 124M's head 50 chunks of 164 rows at B*T = 8192, and each chunk's dwte
// GEMM reads and writes the whole [V, C] fp32 gradient: 15 GB a step.
constexpr int64_t kLogitsChunkBytes = int64_t{256} << 20;

// The logits chunk's row stride: the vocab rounded up to 64 floats (GPT-2's 50257 is odd, and an
// odd stride sends cuBLAS to its unaligned kernels for all three of the head's GEMMs). An aligned
// stride was not enough for the two GEMMs whose M or K is the vocab: on the H100 they still ran
// sm80 align1 kernels (logits 871 µs, dlnf 783 µs a chunk at 124M; 2026-11-23). So those two run
// over the padded vocab, on a copy of wte with zero rows after it (Buffers::head_w): the padded
// logits columns are 0, the cross-entropy leaves them so, and they add nothing to dlnf.
int64_t logits_ld(const model::Config& c) { return (c.vocab + 63) / 64 * 64; }

class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  float* take(int64_t floats) {
    const size_t bytes = (size_t(floats) * sizeof(float) + kAlign - 1) / kAlign * kAlign;
    float* p = base_ != nullptr ? reinterpret_cast<float*>(base_ + used_) : nullptr;
    used_ += bytes;
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

void copy_d2d(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  check(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync (D2D)");
}

}  // namespace

size_t CudaModelPasses::carve(const model::Config& config, int B, int T, bool checkpointing, int64_t chunk_rows,
                              model::Attention attention, char* base, Buffers* out) {
  const int64_t C = config.width, H = config.heads, L = config.layers;
  const int64_t N = int64_t(B) * T;
  const int64_t att = int64_t(B) * H * T * (attention == model::Attention::Flash ? 1 : T);
  Carver k(base);
  Buffers b;
  b.caches.assign(checkpointing ? 1 : size_t(L), BlockCache{});
  for (BlockCache& c : b.caches) {
    c.ln1 = k.take(N * C);
    c.ln1_mean = k.take(N);
    c.ln1_rstd = k.take(N);
    c.qkv = k.take(N * 3 * C);
    c.att = k.take(att);
    c.atty = k.take(N * C);
    c.res2 = k.take(N * C);
    c.ln2 = k.take(N * C);
    c.ln2_mean = k.take(N);
    c.ln2_rstd = k.take(N);
    c.fch = k.take(N * 4 * C);
    c.fch_gelu = k.take(N * 4 * C);
  }
  b.residual.assign(size_t(L) + 1, nullptr);
  for (float*& r : b.residual) r = k.take(N * C);
  b.grad_residual = k.take(N * C);
  b.dres2 = k.take(N * C);
  b.dfch = k.take(N * 4 * C);
  b.dln = k.take(N * C);
  b.datty = k.take(N * C);
  b.dqkv = k.take(N * 3 * C);
  b.att_scratch = k.take(att);
  b.lnf = k.take(N * C);
  b.lnf_mean = k.take(N);
  b.lnf_rstd = k.take(N);
  b.dlnf = k.take(N * C);
  b.logits = k.take(chunk_rows * logits_ld(config));
  if (logits_ld(config) != config.vocab) b.head_w = k.take(logits_ld(config) * C);
  b.row_loss = k.take(N);
  b.blas_workspace = k.take(int64_t(kCublasWorkspaceBytes / sizeof(float)));
  if (out != nullptr) *out = std::move(b);
  return k.used();
}

size_t CudaModelPasses::required_bytes(const model::Config& config, int B, int T, bool checkpointing,
                                       int64_t head_rows_per_chunk, model::Attention attention) {
  check_shape(config, B, T, attention);
  const int64_t rows = model::head_chunk_rows(config, int64_t(B) * T, head_rows_per_chunk, kLogitsChunkBytes);
  return carve(config, B, T, checkpointing, rows, attention, nullptr, nullptr);
}

CudaModelPasses::CudaModelPasses(const model::Config& config, int B, int T, bool checkpointing, cudaStream_t stream,
                                 Blas& blas, int64_t head_rows_per_chunk, model::Attention attention)
    : config_(config),
      B_(B),
      T_(T),
      N_(int64_t(B) * T),
      checkpoint_(checkpointing),
      attention_(attention),
      stream_(stream),
      blas_(blas) {
  check_shape(config, B, T, attention);
  chunk_rows_ = model::head_chunk_rows(config, N_, head_rows_per_chunk, kLogitsChunkBytes);
  bytes_ = carve(config, B, T, checkpointing, chunk_rows_, attention, nullptr, nullptr);
  block_ = model::block_offsets(config);
  emb_ = model::embedding_offsets(config);
  fin_ = model::final_offsets(config);
  host_loss_.assign(size_t(N_), 0.0f);
}

CudaModelPasses::~CudaModelPasses() {
  if (base_ != nullptr) blas_.set_workspace(nullptr, 0);  // the memory goes back to the engine
}

void CudaModelPasses::bind(void* memory) {
  if (memory == nullptr) throw std::invalid_argument("CudaModelPasses::bind: null memory");
  if (reinterpret_cast<uintptr_t>(memory) % kAlign != 0)
    throw std::invalid_argument("CudaModelPasses::bind: the memory must be 256-byte aligned");
  base_ = static_cast<char*>(memory);
  carve(config_, B_, T_, checkpoint_, chunk_rows_, attention_, base_, &buf_);
  blas_.set_workspace(buf_.blas_workspace, kCublasWorkspaceBytes);
}

void CudaModelPasses::require_bound(const char* pass) const {
  if (base_ == nullptr)
    throw std::logic_error(std::string("CudaModelPasses::") + pass + ": called before bind() gave it its memory");
}

float* CudaModelPasses::residual(int i) {
  require_bound("residual");
  return buf_.residual.at(size_t(i));
}

float* CudaModelPasses::grad_residual() {
  require_bound("grad_residual");
  return buf_.grad_residual;
}

CudaModelPasses::BlockCache& CudaModelPasses::cache(int layer) {
  if (layer < 0 || layer >= config_.layers)
    throw std::out_of_range("CudaModelPasses: layer " + std::to_string(layer) + " is outside 0.." +
                            std::to_string(config_.layers - 1));
  return checkpoint_ ? buf_.caches[0] : buf_.caches[size_t(layer)];
}

void CudaModelPasses::finish() {
  if (synchronous_) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (model passes)");
}

// ---- embeddings -----------------------------------------------------------------------------------

void CudaModelPasses::embed_forward(const float* emb_params, const int32_t* tokens, float* x_out) {
  require_bound("embed_forward");
  DeviceGuard guard(blas_.device());
  embedding_forward(x_out, tokens, emb_params + emb_.wte, emb_params + emb_.wpe, B_, T_, config_.width, F32, stream_);
  finish();
}

void CudaModelPasses::embed_backward(const int32_t* tokens, const float* dx, float* d_emb_params) {
  require_bound("embed_backward");
  DeviceGuard guard(blas_.device());
  embedding_backward(d_emb_params + emb_.wte, d_emb_params + emb_.wpe, tokens, dx, B_, T_, config_.width, F32, stream_);
  finish();
}

// ---- blocks ---------------------------------------------------------------------------------------

// gpt2.cpp's run_block_forward: with x_out null it stops after the MLP's GELU (the recompute).
void CudaModelPasses::run_block_forward(BlockCache& c, const float* p, const float* x_in, float* x_out) {
  const model::BlockOffsets& o = block_;
  const int64_t C = config_.width, N = N_;
  layernorm_forward(c.ln1, c.ln1_mean, c.ln1_rstd, x_in, p + o.ln1_w, p + o.ln1_b, N, C, F32, stream_);
  matmul_forward(blas_, c.qkv, c.ln1, p + o.qkv_w, p + o.qkv_b, N, C, 3 * C, F32, stream_);
  if (attention_ == model::Attention::Flash)
    flash_attention_forward(c.atty, c.att, c.qkv, B_, T_, C, config_.heads, stream_);
  else
    attention_forward(blas_, c.atty, c.att, c.qkv, B_, T_, C, config_.heads, stream_);
  copy_d2d(c.res2, x_in, N * C, stream_);  // the residual: res2 = x_in + proj(atty)
  matmul_forward(blas_, c.res2, c.atty, p + o.attn_proj_w, p + o.attn_proj_b, N, C, C, F32, stream_, true);
  layernorm_forward(c.ln2, c.ln2_mean, c.ln2_rstd, c.res2, p + o.ln2_w, p + o.ln2_b, N, C, F32, stream_);
  matmul_forward(blas_, c.fch, c.ln2, p + o.fc_w, p + o.fc_b, N, C, 4 * C, F32, stream_);
  gelu_forward(c.fch_gelu, c.fch, N * 4 * C, F32, stream_);
  if (x_out == nullptr) return;
  copy_d2d(x_out, c.res2, N * C, stream_);  // x_out = res2 + proj(gelu(fc))
  matmul_forward(blas_, x_out, c.fch_gelu, p + o.mlp_proj_w, p + o.mlp_proj_b, N, 4 * C, C, F32, stream_, true);
}

void CudaModelPasses::block_forward(int layer, const float* block_params, const float* x_in, float* x_out) {
  require_bound("block_forward");
  DeviceGuard guard(blas_.device());
  run_block_forward(cache(layer), block_params, x_in, x_out);
  finish();
}

void CudaModelPasses::block_backward(int layer, const float* p, const float* x_in, const float* dx_out, float* dx_in,
                                     float* dp) {
  require_bound("block_backward");
  DeviceGuard guard(blas_.device());
  BlockCache& c = cache(layer);
  if (checkpoint_) run_block_forward(c, p, x_in, nullptr);
  const model::BlockOffsets& o = block_;
  const int64_t C = config_.width, N = N_, H = config_.heads;
  Buffers& w = buf_;

  // MLP projection (x_out = res2 + fch_gelu @ W^T + b). dx_out is read only here, so dx_in may
  // alias it: it is written last.
  matmul_backward(blas_, w.dfch, dp + o.mlp_proj_w, dp + o.mlp_proj_b, dx_out, c.fch_gelu, p + o.mlp_proj_w, N, 4 * C,
                  C, F32, stream_);
  copy_d2d(w.dres2, dx_out, N * C, stream_);
  gelu_backward(w.dfch, c.fch, w.dfch, N * 4 * C, F32, stream_);
  matmul_backward(blas_, w.dln, dp + o.fc_w, dp + o.fc_b, w.dfch, c.ln2, p + o.fc_w, N, C, 4 * C, F32, stream_);
  layernorm_backward(w.dres2, dp + o.ln2_w, dp + o.ln2_b, w.dln, c.res2, p + o.ln2_w, c.ln2_mean, c.ln2_rstd, N, C,
                     /*accumulate_dinp=*/true, F32, stream_);

  // Attention branch (res2 = x_in + atty @ W^T + b).
  matmul_backward(blas_, w.datty, dp + o.attn_proj_w, dp + o.attn_proj_b, w.dres2, c.atty, p + o.attn_proj_w, N, C, C,
                  F32, stream_);
  if (attention_ == model::Attention::Flash)
    flash_attention_backward(w.dqkv, w.att_scratch, w.datty, c.qkv, c.atty, c.att, B_, T_, C, H, stream_);
  else
    attention_backward(blas_, w.dqkv, w.att_scratch, w.datty, c.qkv, c.att, B_, T_, C, H, stream_);
  matmul_backward(blas_, w.dln, dp + o.qkv_w, dp + o.qkv_b, w.dqkv, c.ln1, p + o.qkv_w, N, C, 3 * C, F32, stream_);
  copy_d2d(dx_in, w.dres2, N * C, stream_);
  layernorm_backward(dx_in, dp + o.ln1_w, dp + o.ln1_b, w.dln, x_in, p + o.ln1_w, c.ln1_mean, c.ln1_rstd, N, C,
                     /*accumulate_dinp=*/true, F32, stream_);
  finish();
}

// ---- LM head --------------------------------------------------------------------------------------

// gpt2.cpp's run_head with backward: each logits chunk becomes d(logits) in place
// (cross_entropy_forward_backward) and goes through the tied GEMMs before the next chunk reuses
// the buffer (the stream orders them).
float CudaModelPasses::head_forward_backward(const float* fp, const float* wte, const float* x, const int32_t* targets,
                                             float* dx, float* dfp, float* dwte, float grad_scale) {
  require_bound("head_forward_backward");
  if (targets == nullptr) throw std::invalid_argument("head_forward_backward: targets are required");
  DeviceGuard guard(blas_.device());
  const int64_t C = config_.width, V = config_.vocab, N = N_;
  Buffers& w = buf_;
  layernorm_forward(w.lnf, w.lnf_mean, w.lnf_rstd, x, fp + fin_.ln_w, fp + fin_.ln_b, N, C, F32, stream_);
  const float dscale = grad_scale / (float)N;  // d(mean loss) / d(row loss), times the scale
  const int64_t ld = logits_ld(config_);
  const float* head_w = wte;  // [ld, C]: wte padded with zero rows, when the vocab needs it
  if (w.head_w != nullptr) {
    copy_d2d(w.head_w, wte, V * C, stream_);
    check(cudaMemsetAsync(w.head_w + V * C, 0, size_t((ld - V) * C) * sizeof(float), stream_), "cudaMemsetAsync");
    head_w = w.head_w;
  }
  const int64_t OC = w.head_w != nullptr ? ld : V;  // the logits GEMM's width, and dlnf's K
  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows_) {
    const int64_t rows = std::min(chunk_rows_, N - r0);
    matmul_forward(blas_, w.logits, w.lnf + r0 * C, head_w, nullptr, rows, C, OC, F32, stream_, false, ld);
    cross_entropy_forward_backward(w.row_loss + r0, w.logits, w.logits, targets + r0, rows, V, dscale, F32, stream_,
                                   ld);
    // dlnf over the padded vocab (its zero columns add nothing), dwte over the real one.
    matmul_backward(blas_, w.dlnf + r0 * C, nullptr, nullptr, w.logits, w.lnf + r0 * C, head_w, rows, C, OC, F32,
                    stream_, false, ld);
    matmul_backward(blas_, nullptr, dwte, nullptr, w.logits, w.lnf + r0 * C, wte, rows, C, V, F32, stream_, false, ld);
  }
  layernorm_backward(dx, dfp + fin_.ln_w, dfp + fin_.ln_b, w.dlnf, x, fp + fin_.ln_w, w.lnf_mean, w.lnf_rstd, N, C,
                     /*accumulate_dinp=*/false, F32, stream_);
  check(cudaMemcpyAsync(host_loss_.data(), w.row_loss, size_t(N) * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync (per-row losses)");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (head_forward_backward)");
  double total = 0.0;  // in row order, in double: gpt2.cpp's sum
  for (int64_t n = 0; n < N; n++) total += host_loss_[size_t(n)];
  return (float)(total / (double)N);
}

}  // namespace zt::cuda
