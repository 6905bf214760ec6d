// trainer/cuda/model_passes.cpp: see model_passes.h. Each pass is gpt2.cpp's, line for line, with
// the CPU kernels replaced by their CUDA twins (kernels.h, gemm.h) in fp32 and memcpy by
// cudaMemcpyAsync on the passes' stream.
#include "cuda/model_passes.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda/flash_attention.h"
#include "cuda/gemm_bf16.h"
#include "cuda/kernels.h"
#include "cuda/runtime.h"
#include "model/gpt2.h"

namespace zt::cuda {

namespace {

constexpr DType F32 = DType::F32;
constexpr size_t kAlign = 256;  // every sub-buffer starts on a 256-byte boundary

// The CUDA kernels' own limits (kernels.cu check_attention_shape), checked up front so a shape
// that cannot run is refused when the passes are built, not in the middle of a step.
void check_shape(const model::Config& c, int B, int T, model::Attention attention, Compute compute) {
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
  // The GELU epilogue's aux matrix (the pre-activation, [N, 4C]) needs a leading dimension that is
  // a multiple of 8 (gemm_mapping.h): 4C is one when C is even.
  if (compute == Compute::Bf16 && c.width % 2 != 0)
    fail("bf16 compute needs an even width C (cuBLASLt's GELU epilogue); C = " + std::to_string(c.width));
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
  float* take(int64_t floats) { return static_cast<float*>(take_bytes(size_t(floats) * sizeof(float))); }
  void* take_bf16(int64_t n) { return take_bytes(size_t(n) * 2); }
  void* take_bytes(size_t n) {
    const size_t bytes = (n + kAlign - 1) / kAlign * kAlign;
    void* p = base_ != nullptr ? base_ + used_ : nullptr;
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
                              model::Attention attention, Compute compute, char* base, Buffers* out) {
  const int64_t C = config.width, H = config.heads, L = config.layers;
  const int64_t N = int64_t(B) * T;
  const int64_t att = int64_t(B) * H * T * (attention == model::Attention::Flash ? 1 : T);
  const bool bf16 = compute == Compute::Bf16;  // the four bf16 activations, and the bf16 scratch below
  Carver k(base);
  Buffers b;
  b.caches.assign(checkpointing ? 1 : size_t(L), BlockCache{});
  for (BlockCache& c : b.caches) {
    if (bf16) c.ln1_16 = k.take_bf16(N * C);
    else c.ln1 = k.take(N * C);
    c.ln1_mean = k.take(N);
    c.ln1_rstd = k.take(N);
    c.qkv = k.take(N * 3 * C);
    c.att = k.take(att);
    c.atty = k.take(N * C);
    c.res2 = k.take(N * C);
    if (bf16) c.ln2_16 = k.take_bf16(N * C);
    else c.ln2 = k.take(N * C);
    c.ln2_mean = k.take(N);
    c.ln2_rstd = k.take(N);
    if (bf16) {
      c.fch_16 = k.take_bf16(N * 4 * C);
      c.fch_gelu_16 = k.take_bf16(N * 4 * C);
    } else {
      c.fch = k.take(N * 4 * C);
      c.fch_gelu = k.take(N * 4 * C);
    }
  }
  b.residual.assign(size_t(L) + 1, nullptr);
  for (float*& r : b.residual) r = k.take(N * C);
  b.grad_residual = k.take(N * C);
  b.dres2 = k.take(N * C);
  if (!bf16) b.dfch = k.take(N * 4 * C);
  b.dln = k.take(N * C);
  b.datty = k.take(N * C);
  b.dqkv = k.take(N * 3 * C);
  b.att_scratch = k.take(att);
  if (!bf16) b.lnf = k.take(N * C);
  b.lnf_mean = k.take(N);
  b.lnf_rstd = k.take(N);
  b.dlnf = k.take(N * C);
  b.logits = k.take(chunk_rows * logits_ld(config));
  if (!bf16 && logits_ld(config) != config.vocab) b.head_w = k.take(logits_ld(config) * C);
  b.row_loss = k.take(N);
  b.blas_workspace = k.take(int64_t(kCublasWorkspaceBytes / sizeof(float)));
  if (bf16) {
    b.d16 = k.take_bf16(N * 4 * C);
    b.g16 = k.take_bf16(N * C);
    b.a16 = k.take_bf16(N * C);
    const int64_t w_numel[4] = {3 * C * C, C * C, 4 * C * C, 4 * C * C};  // qkv, attn proj, fc, mlp proj
    for (int i = 0; i < 4; ++i) b.w16[i] = k.take_bf16(w_numel[i]);
    const int64_t b_numel[3] = {3 * C, C, C};  // qkv, attn proj, mlp proj
    for (int i = 0; i < 3; ++i) b.b32[i] = k.take(b_numel[i]);
    b.fc_b16 = k.take_bf16(4 * C);
    b.lnf16 = k.take_bf16(N * C);
    b.head_w16 = k.take_bf16(logits_ld(config) * C);
    b.dlogits16 = k.take_bf16(chunk_rows * logits_ld(config));
  }
  if (out != nullptr) *out = std::move(b);
  return k.used();
}

size_t CudaModelPasses::required_bytes(const model::Config& config, int B, int T, bool checkpointing,
                                       int64_t head_rows_per_chunk, model::Attention attention, Compute compute) {
  check_shape(config, B, T, attention, compute);
  const int64_t rows = model::head_chunk_rows(config, int64_t(B) * T, head_rows_per_chunk, kLogitsChunkBytes);
  return carve(config, B, T, checkpointing, rows, attention, compute, nullptr, nullptr);
}

CudaModelPasses::CudaModelPasses(const model::Config& config, int B, int T, bool checkpointing, cudaStream_t stream,
                                 Blas& blas, int64_t head_rows_per_chunk, model::Attention attention, Compute compute)
    : config_(config),
      B_(B),
      T_(T),
      N_(int64_t(B) * T),
      checkpoint_(checkpointing),
      attention_(attention),
      compute_(compute),
      stream_(stream),
      blas_(blas) {
  check_shape(config, B, T, attention, compute);
  chunk_rows_ = model::head_chunk_rows(config, N_, head_rows_per_chunk, kLogitsChunkBytes);
  bytes_ = carve(config, B, T, checkpointing, chunk_rows_, attention, compute, nullptr, nullptr);
  if (compute == Compute::Bf16) lt_ = std::make_unique<LtMatmul>(blas);
  block_ = model::block_offsets(config);
  emb_ = model::embedding_offsets(config);
  fin_ = model::final_offsets(config);
  host_loss_.assign(size_t(N_), 0.0f);
}

CudaModelPasses::~CudaModelPasses() {
  if (base_ != nullptr) blas_.set_workspace(nullptr, 0);  // the memory goes back to the engine
  // bf16 compute: say so when cuBLASLt refused an epilogue (those products ran the unfused way).
  if (lt_ && lt_->fused() && !lt_->routes().first_refusal.empty()) {
    const LtMatmul::Routes& r = lt_->routes();
    int64_t fused = 0, unfused = 0;
    for (int e = 0; e < 4; ++e) fused += r.fused[e], unfused += r.unfused[e];
    std::fprintf(stderr, "zt: bf16 compute: %lld of %lld epilogue products ran unfused; cuBLASLt refused %s\n",
                 (long long)unfused, (long long)(fused + unfused), r.first_refusal.c_str());
  }
}

void CudaModelPasses::bind(void* memory) {
  if (memory == nullptr) throw std::invalid_argument("CudaModelPasses::bind: null memory");
  if (reinterpret_cast<uintptr_t>(memory) % kAlign != 0)
    throw std::invalid_argument("CudaModelPasses::bind: the memory must be 256-byte aligned");
  base_ = static_cast<char*>(memory);
  carve(config_, B_, T_, checkpoint_, chunk_rows_, attention_, compute_, base_, &buf_);
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
  if (compute_ == Compute::Bf16) {
    stage_block(block_params);
    run_block_forward_bf16(cache(layer), block_params, x_in, x_out);
  } else {
    run_block_forward(cache(layer), block_params, x_in, x_out);
  }
  finish();
}

void CudaModelPasses::block_backward(int layer, const float* p, const float* x_in, const float* dx_out, float* dx_in,
                                     float* dp) {
  require_bound("block_backward");
  DeviceGuard guard(blas_.device());
  BlockCache& c = cache(layer);
  if (compute_ == Compute::Bf16) {
    block_backward_bf16(c, p, x_in, dx_out, dx_in, dp);
    finish();
    return;
  }
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
  if (compute_ == Compute::Bf16) return head_forward_backward_bf16(fp, wte, x, targets, dx, dfp, dwte, grad_scale);
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
  return mean_loss();
}

float CudaModelPasses::mean_loss() {
  check(cudaMemcpyAsync(host_loss_.data(), buf_.row_loss, size_t(N_) * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync (per-row losses)");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (head_forward_backward)");
  double total = 0.0;  // in row order, in double: gpt2.cpp's sum
  for (int64_t n = 0; n < N_; n++) total += host_loss_[size_t(n)];
  return (float)(total / (double)N_);
}

// ---- bf16 compute (Compute::Bf16; model_passes.h) ------------------------------------------------
// The same passes as above, line for line where they can be, with the GEMMs of gemm_bf16.h: bf16
// inputs, fp32 accumulation, the bias / residual / GELU in the products' epilogues.

namespace {
constexpr DType BF16 = DType::BF16;
}  // namespace

// The block's four weights to bf16 and its biases to buffers on 256-byte boundaries (cuBLASLt's
// bias vectors), in one launch. The parameters come in fp32 (ModelPasses' contract); under
// --precision bf16 they are bf16 values widened, so the cast gives them back exactly.
void CudaModelPasses::stage_block(const float* p) {
  const model::BlockOffsets& o = block_;
  const int64_t C = config_.width;
  Buffers& w = buf_;
  const CastSegment segments[] = {
      {p + o.qkv_w, w.w16[0], 3 * C * C, BF16},      {p + o.attn_proj_w, w.w16[1], C * C, BF16},
      {p + o.fc_w, w.w16[2], 4 * C * C, BF16},       {p + o.mlp_proj_w, w.w16[3], 4 * C * C, BF16},
      {p + o.qkv_b, w.b32[0], 3 * C, F32},           {p + o.attn_proj_b, w.b32[1], C, F32},
      {p + o.mlp_proj_b, w.b32[2], C, F32},          {p + o.fc_b, w.fc_b16, 4 * C, BF16},
  };
  cast_segments(segments, int(std::size(segments)), stream_);
}

// run_block_forward's twin, on the staged weights: with x_out null it stops after the GELU.
void CudaModelPasses::run_block_forward_bf16(BlockCache& c, const float* p, const float* x_in, float* x_out) {
  const model::BlockOffsets& o = block_;
  const int64_t C = config_.width, N = N_;
  Buffers& w = buf_;
  LtMatmul& lt = *lt_;
  layernorm_forward(c.ln1_16, BF16, c.ln1_mean, c.ln1_rstd, x_in, p + o.ln1_w, p + o.ln1_b, N, C, F32, stream_);
  linear_forward_bf16(lt, c.qkv, nullptr, c.ln1_16, w.w16[0], w.b32[0], N, C, 3 * C, stream_);
  if (attention_ == model::Attention::Flash)
    flash_attention_forward(c.atty, c.att, c.qkv, B_, T_, C, config_.heads, stream_);
  else
    attention_forward(blas_, c.atty, c.att, c.qkv, B_, T_, C, config_.heads, stream_);
  cast(w.a16, BF16, c.atty, F32, N * C, stream_);
  // res2 = x_in + atty @ W^T + b: x_in is the product's C, res2 its D (no copy).
  linear_forward_bf16(lt, c.res2, x_in, w.a16, w.w16[1], w.b32[1], N, C, C, stream_);
  layernorm_forward(c.ln2_16, BF16, c.ln2_mean, c.ln2_rstd, c.res2, p + o.ln2_w, p + o.ln2_b, N, C, F32, stream_);
  linear_gelu_forward_bf16(lt, c.fch_gelu_16, c.fch_16, c.ln2_16, w.w16[2], w.fc_b16, N, C, 4 * C, stream_);
  if (x_out == nullptr) return;
  linear_forward_bf16(lt, x_out, c.res2, c.fch_gelu_16, w.w16[3], w.b32[2], N, 4 * C, C, stream_);
}

// block_backward's twin. The bias gradients are column sums of the fp32 output gradients where
// there is one (the projections', qkv's) and of the bf16 GELU-input gradient for fc's (the values
// its weight gradient multiplies), in kernels.h's fixed order. dx_out is read before dx_in is
// written (they may alias).
void CudaModelPasses::block_backward_bf16(BlockCache& c, const float* p, const float* x_in, const float* dx_out,
                                          float* dx_in, float* dp) {
  const model::BlockOffsets& o = block_;
  const int64_t C = config_.width, N = N_, H = config_.heads;
  Buffers& w = buf_;
  LtMatmul& lt = *lt_;
  stage_block(p);
  if (checkpoint_) run_block_forward_bf16(c, p, x_in, nullptr);

  // MLP projection (x_out = res2 + fch_gelu @ W^T + b).
  cast(w.g16, BF16, dx_out, F32, N * C, stream_);
  column_sums_accumulate(dp + o.mlp_proj_b, dx_out, N, C, F32, stream_);
  linear_dweight_bf16(blas_, dp + o.mlp_proj_w, w.g16, c.fch_gelu_16, N, 4 * C, C, stream_);
  linear_dinp_bf16(lt, w.d16, BF16, w.g16, w.w16[3], c.fch_16, N, 4 * C, C, stream_);  // through the GELU
  copy_d2d(w.dres2, dx_out, N * C, stream_);
  // fc (fch = ln2 @ W^T + b).
  column_sums_accumulate(dp + o.fc_b, w.d16, N, 4 * C, BF16, stream_);
  linear_dweight_bf16(blas_, dp + o.fc_w, w.d16, c.ln2_16, N, C, 4 * C, stream_);
  linear_dinp_bf16(lt, w.dln, F32, w.d16, w.w16[2], nullptr, N, C, 4 * C, stream_);
  layernorm_backward(w.dres2, dp + o.ln2_w, dp + o.ln2_b, w.dln, c.res2, p + o.ln2_w, c.ln2_mean, c.ln2_rstd, N, C,
                     /*accumulate_dinp=*/true, F32, stream_);

  // Attention branch (res2 = x_in + atty @ W^T + b).
  cast(w.g16, BF16, w.dres2, F32, N * C, stream_);
  column_sums_accumulate(dp + o.attn_proj_b, w.dres2, N, C, F32, stream_);
  cast(w.a16, BF16, c.atty, F32, N * C, stream_);
  linear_dweight_bf16(blas_, dp + o.attn_proj_w, w.g16, w.a16, N, C, C, stream_);
  linear_dinp_bf16(lt, w.datty, F32, w.g16, w.w16[1], nullptr, N, C, C, stream_);
  if (attention_ == model::Attention::Flash)
    flash_attention_backward(w.dqkv, w.att_scratch, w.datty, c.qkv, c.atty, c.att, B_, T_, C, H, stream_);
  else
    attention_backward(blas_, w.dqkv, w.att_scratch, w.datty, c.qkv, c.att, B_, T_, C, H, stream_);
  column_sums_accumulate(dp + o.qkv_b, w.dqkv, N, 3 * C, F32, stream_);
  cast(w.d16, BF16, w.dqkv, F32, N * 3 * C, stream_);
  linear_dweight_bf16(blas_, dp + o.qkv_w, w.d16, c.ln1_16, N, C, 3 * C, stream_);
  linear_dinp_bf16(lt, w.dln, F32, w.d16, w.w16[0], nullptr, N, C, 3 * C, stream_);
  copy_d2d(dx_in, w.dres2, N * C, stream_);
  layernorm_backward(dx_in, dp + o.ln1_w, dp + o.ln1_b, w.dln, x_in, p + o.ln1_w, c.ln1_mean, c.ln1_rstd, N, C,
                     /*accumulate_dinp=*/true, F32, stream_);
}

// head_forward_backward's twin: lnf and wte in bf16 for the three GEMMs, the logits and the loss
// in fp32, the logits' gradient written in bf16 by the cross-entropy (its padded columns zero).
float CudaModelPasses::head_forward_backward_bf16(const float* fp, const float* wte, const float* x,
                                                  const int32_t* targets, float* dx, float* dfp, float* dwte,
                                                  float grad_scale) {
  const int64_t C = config_.width, V = config_.vocab, N = N_;
  Buffers& w = buf_;
  layernorm_forward(w.lnf16, BF16, w.lnf_mean, w.lnf_rstd, x, fp + fin_.ln_w, fp + fin_.ln_b, N, C, F32, stream_);
  const float dscale = grad_scale / (float)N;
  const int64_t ld = logits_ld(config_);
  const CastSegment head{wte, w.head_w16, V * C, BF16};
  cast_segments(&head, 1, stream_);
  if (ld != V) {
    char* rows16 = static_cast<char*>(w.head_w16) + size_t(V * C) * 2;
    check(cudaMemsetAsync(rows16, 0, size_t((ld - V) * C) * 2, stream_), "cudaMemsetAsync (head_w16)");
    check(cudaMemset2DAsync(static_cast<char*>(w.dlogits16) + size_t(V) * 2, size_t(ld) * 2, 0, size_t(ld - V) * 2,
                            size_t(chunk_rows_), stream_),
          "cudaMemset2DAsync (dlogits16)");
  }
  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows_) {
    const int64_t rows = std::min(chunk_rows_, N - r0);
    const void* lnf = static_cast<const char*>(w.lnf16) + size_t(r0 * C) * 2;
    // logits [rows, ld] = lnf @ head_w^T over the padded vocab (its zero rows give zero columns).
    gemm_ex(blas_, linear_forward_gemm(rows, C, ld, ld), w.head_w16, lnf, BF16, 0.0f, w.logits, F32, stream_,
            "cublasGemmEx (bf16 logits)");
    cross_entropy_forward_backward(w.row_loss + r0, w.dlogits16, BF16, w.logits, targets + r0, rows, V, dscale, F32,
                                   stream_, ld);
    // dlnf over the padded vocab (its zero columns add nothing), dwte over the real one.
    gemm_ex(blas_, linear_dinp_gemm(rows, C, ld, ld), w.head_w16, w.dlogits16, BF16, 0.0f, w.dlnf + r0 * C, F32,
            stream_, "cublasGemmEx (bf16 dlnf)");
    linear_dweight_bf16(blas_, dwte, w.dlogits16, lnf, rows, C, V, stream_, ld);
  }
  layernorm_backward(dx, dfp + fin_.ln_w, dfp + fin_.ln_b, w.dlnf, x, fp + fin_.ln_w, w.lnf_mean, w.lnf_rstd, N, C,
                     /*accumulate_dinp=*/false, F32, stream_);
  return mean_loss();
}

}  // namespace zt::cuda
