// trainer/cuda/model_passes.h: GPT-2's per-module passes on a GPU (trainer::ModelPasses), the CUDA
// twin of the CPU reference's Workspace and passes (model/gpt2.h).
//
// Semantics exactly model/gpt2.h's: parameter pointers point at one module's fp32 parameters
// (offsets of layout.h relative to the module), gradients are accumulated (+=), activation
// gradients overwritten, block_backward's dx_in may alias dx_out, and with checkpointing
// block_backward recomputes the block's forward from x_in into one shared cache. All fp32: the
// DType::F32 instances of kernels.h and gemm.h (cuBLAS, fp32 accumulation, no TF32). The same
// buffers as the reference, plus attention_backward's B*H*T*T scratch (kernels.h). With
// model::Attention::Flash the attention is flash_attention.h's (bf16 tensor cores, the
// workspace's Flash twin) and both T x T buffers shrink to one float per row. The LM head
// materializes logits head_rows_per_chunk() rows at a time, as the reference does, so B*T*vocab
// never has to fit at once; but its default chunk is about 256 MiB (the reference's: 32 MiB), and
// its rows are the vocab rounded up to 64 floats apart (aligned GEMMs).
//
// Memory: the passes allocate no device memory. bytes() (fixed by the constructor) is what they
// need: the residual streams, grad_residual, the per-layer block caches (one shared cache with
// checkpointing), the backward scratch, the LM head's buffers and logits chunk, the per-row
// losses and cuBLAS's workspace (kCublasWorkspaceBytes, given to the Blas by bind(), so it is
// counted by the caching allocator and under its cap like every other byte), each sub-buffer
// starting on a 256-byte boundary; bind() hands over one device allocation
// of that size (256-byte aligned) and the buffers are carved from it. The loss is read back into
// a host vector of B*T floats and averaged on the host in row order, in double, exactly as
// gpt2.cpp averages its per-row losses.
//
// Streams: every pass runs on `stream` on the Blas's device (a DeviceGuard per pass). Passes are
// synchronous for the caller by default (the stream is synchronized before a pass returns, the
// convention of trainer::DeviceOps); set_synchronous(false) leaves them queued on `stream` for a
// caller that orders its own work after them on that stream. head_forward_backward always
// synchronizes: it returns the loss.
// bf16 compute (Compute::Bf16, zt train --matmul-dtype bf16; the end of model_passes.cpp): the same
// passes with every GEMM on bf16 tensor cores (fp32 accumulation, gemm_bf16.h): the LayerNorm
// outputs, the MLP's pre-activation and GELU output are kept in bf16 (they only feed GEMMs and
// the GELU's derivative); the attention output and the activation gradients are cast to bf16
// where they feed a GEMM; each module's weights are staged once per pass into bf16 copies of our
// own (one kernel for the block; the passes get fp32 parameters, ModelPasses' contract);
// biases, the residual add and GELU ride in cuBLASLt epilogues. The residual stream, qkv, the
// attention, LayerNorm statistics and backward, the logits and the loss, and every parameter
// gradient stay fp32. Its buffers are carved from bytes() as every other.
// Not thread-safe: one pass at a time. May call: kernels.h, gemm.h, gemm_bf16.h, runtime.h,
// model/layout.h. Called by: the CUDA backend's model_passes().
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "cuda/gemm.h"
#include "cuda/gemm_bf16.h"
#include "model/config.h"
#include "model/gpt2.h"
#include "model/layout.h"

namespace zt::cuda {

// cuBLAS's workspace inside bytes(): NVIDIA's recommendation for Hopper (4 MiB for Ampere; the
// larger size serves both), as PyTorch sizes its own on sm_90.
inline constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

// What the passes' GEMMs take as inputs: fp32 (the default, the CPU reference's arithmetic up to
// summation order, or TF32 under the Blas's matmul precision) or bf16 (see above).
enum class Compute : uint8_t { Fp32, Bf16 };

class CudaModelPasses final : public trainer::ModelPasses {
 public:
  // Device bytes the passes need for (config, B, T, checkpointing), without constructing them
  // (no CUDA call). Throws std::invalid_argument when the shape cannot run: model::Workspace::check
  // fails, or a CUDA kernel's limit is exceeded (T > 8192, head size > 1024, B or heads > 65535).
  // head_rows_per_chunk: as model::Workspace's, but 0 means about 256 MiB of logits (always within 1..B*T).
  // attention: Materialized keeps [B, H, T, T] probabilities (cuBLAS, gemm.h); Flash keeps [B, H, T]
  // log-sum-exps (flash_attention.h) and is refused for a shape its kernels do not take.
  static size_t required_bytes(const model::Config& config, int B, int T, bool checkpointing,
                               int64_t head_rows_per_chunk = 0,
                               model::Attention attention = model::Attention::Materialized,
                               Compute compute = Compute::Fp32);

  // Throws as required_bytes does. Makes no CUDA call; `blas` (its handle and device) and `stream`
  // must outlive the passes.
  CudaModelPasses(const model::Config& config, int B, int T, bool checkpointing, cudaStream_t stream, Blas& blas,
                  int64_t head_rows_per_chunk = 0, model::Attention attention = model::Attention::Materialized,
                  Compute compute = Compute::Fp32);
  ~CudaModelPasses() override;
  CudaModelPasses(const CudaModelPasses&) = delete;
  CudaModelPasses& operator=(const CudaModelPasses&) = delete;

  size_t bytes() const override { return bytes_; }
  // `memory`: bytes() of device memory, 256-byte aligned (std::invalid_argument otherwise, and for
  // null). May be called again with another allocation (the buffers move there; nothing is kept).
  // Also gives the Blas its workspace inside `memory` (taken back by the destructor).
  void bind(void* memory) override;
  bool bound() const { return base_ != nullptr; }

  // Both throw std::logic_error before bind(); residual throws std::out_of_range outside 0..layers.
  float* residual(int i) override;
  float* grad_residual() override;

  // The passes of model/gpt2.h. Each throws std::logic_error before bind().
  void embed_forward(const float* emb_params, const int32_t* tokens, float* x_out) override;
  void block_forward(int layer, const float* block_params, const float* x_in, float* x_out) override;
  float head_forward_backward(const float* final_params, const float* wte, const float* x, const int32_t* targets,
                              float* dx, float* d_final_params, float* d_wte, float grad_scale) override;
  void block_backward(int layer, const float* block_params, const float* x_in, const float* dx_out, float* dx_in,
                      float* d_block_params) override;
  void embed_backward(const int32_t* tokens, const float* dx, float* d_emb_params) override;

  void set_synchronous(bool synchronous) { synchronous_ = synchronous; }
  bool synchronous() const { return synchronous_; }
  int64_t head_rows_per_chunk() const { return chunk_rows_; }
  const model::Config& config() const { return config_; }
  int B() const { return B_; }
  int T() const { return T_; }
  bool checkpointing() const { return checkpoint_; }
  model::Attention attention() const { return attention_; }
  Compute compute() const { return compute_; }
  // bf16 compute: how its epilogue products ran (fused on cuBLASLt or not), and the switch that
  // forces the unfused way (ZT_CUBLASLT_EPILOGUES=0 in the backend). Null / no effect in fp32.
  const LtMatmul::Routes* epilogue_routes() const { return lt_ ? &lt_->routes() : nullptr; }
  void set_fused_epilogues(bool fused) {
    if (lt_) lt_->set_fused(fused);
  }

 private:
  // What one block keeps from its forward for its backward (gpt2.cpp's BlockCache).
  struct BlockCache {
    float* ln1;       // [N, C]
    float* ln1_mean;  // [N]
    float* ln1_rstd;  // [N]
    float* qkv;       // [N, 3C]
    float* att;       // [B, H, T, T] probabilities; flash: [B, H, T] log-sum-exps
    float* atty;      // [N, C] attention output before its projection
    float* res2;      // [N, C] x_in + attention branch
    float* ln2;       // [N, C]
    float* ln2_mean;  // [N]
    float* ln2_rstd;  // [N]
    float* fch;       // [N, 4C] MLP pre-activation
    float* fch_gelu;  // [N, 4C]
    // bf16 compute keeps these four in bf16 instead (the float* above are then null, and these
    // null in fp32): ln1, ln2 [N, C], fch (the GELU epilogue's aux matrix), fch_gelu [N, 4C].
    void* ln1_16 = nullptr;
    void* ln2_16 = nullptr;
    void* fch_16 = nullptr;
    void* fch_gelu_16 = nullptr;
  };
  // Every buffer, carved from the bound allocation.
  struct Buffers {
    std::vector<BlockCache> caches;  // L, or 1 shared when checkpointing
    std::vector<float*> residual;    // L + 1 of [N, C]
    float* grad_residual = nullptr;  // [N, C]
    // backward scratch, shared by all blocks
    float* dres2 = nullptr;        // [N, C]
    float* dfch = nullptr;         // [N, 4C]
    float* dln = nullptr;          // [N, C]
    float* datty = nullptr;        // [N, C]
    float* dqkv = nullptr;         // [N, 3C]
    float* att_scratch = nullptr;  // [B, H, T, T] (attention_backward's softmax gradient); flash: [B, H, T] dsum
    // LM head
    float* lnf = nullptr;       // [N, C]
    float* lnf_mean = nullptr;  // [N]
    float* lnf_rstd = nullptr;  // [N]
    float* dlnf = nullptr;      // [N, C]
    float* logits = nullptr;    // [chunk_rows, V rounded up to 64] (the row stride: aligned GEMMs)
    float* head_w = nullptr;    // [V rounded up to 64, C]: wte, then zero rows (null when V is a multiple of 64)
    float* row_loss = nullptr;  // [N]
    void* blas_workspace = nullptr;  // kCublasWorkspaceBytes, handed to cuBLAS by bind()
    // bf16 compute only (null in fp32; there dfch, lnf and head_w are null instead).
    void* d16 = nullptr;        // [N, 4C] bf16: the GELU input's gradient, then qkv's
    void* g16 = nullptr;        // [N, C] bf16: a projection's output gradient
    void* a16 = nullptr;        // [N, C] bf16: the attention output, the attention projection's input
    void* w16[4] = {};          // bf16 weights of the block being run: qkv, attn proj, fc, mlp proj
    float* b32[3] = {};         // its fp32 biases on 256-byte boundaries: qkv, attn proj, mlp proj
    void* fc_b16 = nullptr;     // [4C] bf16: fc's bias (the GELU epilogue's, of its bf16 output's type)
    void* lnf16 = nullptr;      // [N, C] bf16
    void* head_w16 = nullptr;   // [V rounded up to 64, C] bf16: wte, then zero rows
    void* dlogits16 = nullptr;  // [chunk_rows, V rounded up to 64] bf16, zero past V
  };
  // Lays the buffers out from `base` (null: only counts) and returns the bytes they take.
  static size_t carve(const model::Config& config, int B, int T, bool checkpointing, int64_t chunk_rows,
                      model::Attention attention, Compute compute, char* base, Buffers* out);
  void require_bound(const char* pass) const;
  BlockCache& cache(int layer);
  void run_block_forward(BlockCache& c, const float* p, const float* x_in, float* x_out);
  void finish();  // synchronizes the stream when synchronous_
  // bf16 compute: the block's weights and biases into Buffers' w16/b32/fc_b16.
  void stage_block(const float* p);
  void run_block_forward_bf16(BlockCache& c, const float* p, const float* x_in, float* x_out);
  void block_backward_bf16(BlockCache& c, const float* p, const float* x_in, const float* dx_out, float* dx_in,
                           float* dp);
  float head_forward_backward_bf16(const float* fp, const float* wte, const float* x, const int32_t* targets,
                                   float* dx, float* dfp, float* dwte, float grad_scale);
  float mean_loss();  // reads the per-row losses back (synchronizing) and averages them as gpt2.cpp does

  model::Config config_;
  int B_ = 0, T_ = 0;
  int64_t N_ = 0;
  bool checkpoint_ = false;
  model::Attention attention_ = model::Attention::Materialized;
  Compute compute_ = Compute::Fp32;
  std::unique_ptr<LtMatmul> lt_;  // bf16 compute's cuBLASLt products (null in fp32)
  cudaStream_t stream_ = nullptr;
  Blas& blas_;
  int64_t chunk_rows_ = 0;
  size_t bytes_ = 0;
  bool synchronous_ = true;
  model::BlockOffsets block_{};
  model::EmbeddingOffsets emb_{};
  model::FinalOffsets fin_{};

  char* base_ = nullptr;  // the bound allocation
  Buffers buf_;
  std::vector<float> host_loss_;  // [N], the per-row losses read back
};

}  // namespace zt::cuda
