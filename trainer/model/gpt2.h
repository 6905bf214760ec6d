// model/gpt2.h: the GPT-2 CPU reference model: fp32 forward and backward, per module and whole.
//
// Owns the math of GPT-2 (token + position embeddings, pre-LayerNorm blocks with causal
// self-attention and a tanh-GELU MLP, a final LayerNorm, an LM head tied to the token embedding,
// cross-entropy averaged over B*T) and the activation memory it needs (Workspace). It is the
// reference the fast paths are checked against, and is itself checked against PyTorch
// (tests/trainer/model/torch_parity_test.cpp, fixture tests/reference/gpt2_tiny.bin).
// Calls: OpenBLAS (cblas_sgemm) for every GEMM, OpenMP elsewhere. Called by: the trainer and the
// ZeRO engine, which fetch one module's parameters at a time (see layout.h for the modules).
//
// Conventions of every pass below:
//   - parameter pointers point at the start of ONE module's parameters, laid out as in
//     param_table() with offsets relative to the module (layout.h); the whole-model functions take
//     the whole flat buffer;
//   - gradient pointers are ACCUMULATED into (+=), so micro-steps sum; zero them yourself;
//   - activation gradients (dx) are overwritten (=), never accumulated;
//   - activations are [B, T, C] row-major, B and T fixed by the Workspace; tokens and targets are
//     int32 [B, T] in 0..vocab-1 (check_tokens; the passes do not re-check, a bad id reads out of
//     bounds);
//   - deterministic: no atomics, every reduction has a fixed order that does not depend on the
//     number of OpenMP threads, so the same inputs give bit-identical outputs run to run (with the
//     same OpenBLAS thread count: sgemm's own blocking depends on it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model/config.h"
#include "model/layout.h"

namespace zt::model {

// GPT-2's initialization, from a seeded std::mt19937_64 with our own Box-Muller so the values are
// the same on every platform: every weight matrix and both embeddings ~ N(0, 0.02), the two
// residual projections (attn.proj, mlp.proj) ~ N(0, 0.02 / sqrt(2 * layers)), biases 0,
// LayerNorm weights 1 and biases 0. `params` holds num_params(config) floats. Runs on the OpenMP
// threads and one thread of its own (the generator's words, drawn in order); the values do not
// depend on the thread count.
void init_params(const Config& config, uint64_t seed, float* params);

// Ok, or which token / target at which position is out of 0..vocab-1.
Status check_tokens(const Config& config, const int32_t* tokens, int64_t n, const char* what);

// Rows of logits the LM head materializes at a time: `asked` when > 0, else as many as fit in
// `budget_bytes` of fp32 logits (the Workspace's 32 MiB; the CUDA passes ask for more), always
// within 1..N.
int64_t head_chunk_rows(const Config& c, int64_t N, int64_t asked, int64_t budget_bytes = int64_t{32} << 20);

// How the passes compute causal self-attention. Materialized: the fp32 reference (kernels.h), which
// keeps the [B, H, T, T] probabilities for the backward. Flash: model/flash_attention.h, which keeps
// one log-sum-exp per row ([B, H, T]) and multiplies in bf16 (fp32 accumulation), as the CUDA
// flash kernels do; results agree with Materialized to bf16 accuracy, not bit for bit.
enum class Attention { Materialized, Flash };
const char* attention_name(Attention a);  // "materialized", "flash"
bool parse_attention(const std::string& name, Attention* out);

// All activation and scratch memory of the passes, allocated once in the constructor for
// micro-batches of exactly B sequences of T tokens (1 <= T <= context). With checkpointing, only the
// input of each block is kept (the residual streams below) and block_backward recomputes the
// block's forward into one shared cache; without it, each layer keeps its own cache.
// Not thread-safe: one pass at a time per Workspace.
class Workspace {
 public:
  // Ok, or why (config, B, T) cannot be run (invalid config, B < 1, T < 1, T > context).
  static Status check(const Config& config, int B, int T);
  // Throws std::invalid_argument with check()'s message when check() fails.
  // head_rows_per_chunk: rows of logits the LM head materializes at a time; 0 picks about 32 MiB
  // of logits (166 rows at vocab 50257), so B*T*vocab never has to fit at once.
  Workspace(const Config& config, int B, int T, bool checkpoint_activations,
            int64_t head_rows_per_chunk = 0, Attention attention = Attention::Materialized);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  const Config& config() const;
  int B() const;
  int T() const;
  bool checkpointing() const;
  Attention attention() const;

  // Bytes of everything this workspace allocated, and how they split: what is kept between a
  // forward and its backward (block caches + residual streams), what is reused by every pass
  // (backward scratch, the LM head's logits chunk).
  size_t bytes() const;
  size_t bytes_kept() const;
  size_t bytes_scratch() const;

  // The residual stream: residual(0) = embedding output, residual(l + 1) = output of block l,
  // for l in 0..layers-1; each [B, T, C]. The whole-model passes use them; the per-module caller
  // may too (they are the block inputs that checkpointing keeps).
  float* residual(int i);
  // A [B, T, C] buffer for activation gradients (the whole-model forward_backward runs its backward
  // in place in it); the per-module caller may use it the same way.
  float* grad_residual();

  // The buffers themselves; for gpt2.cpp only.
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- per-module passes ----------------------------------------------------------------------------

// x_out[b, t, :] = wte[tokens[b, t]] + wpe[t].
void embed_forward(Workspace& ws, const float* emb_params, const int32_t* tokens, float* x_out);

// One pre-LN transformer block: x_out = r + mlp(ln2(r)), r = x_in + attn(ln1(x_in)).
// Keeps what block_backward needs in layer `layer`'s cache (unless checkpointing).
// x_in and x_out must not overlap.
void block_forward(Workspace& ws, int layer, const float* block_params, const float* x_in,
                   float* x_out);

// Final LayerNorm, logits = ln_f(x) @ wte^T, mean cross-entropy over B*T.
// Returns the mean loss, or NaN when targets is null. If logits is not null it receives the
// [B, T, vocab] logits. wte is the token embedding (the embeddings module's first tensor).
float head_forward(Workspace& ws, const float* final_params, const float* wte, const float* x,
                   const int32_t* targets, float* logits);

// head_forward plus its backward: dx = d(loss)/dx (overwritten), d_final_params and d_wte
// accumulated. All gradients are of grad_scale * mean loss (1/micro-steps for averaging
// accumulated micro-steps, or a loss scale). Returns the unscaled mean loss.
float head_forward_backward(Workspace& ws, const float* final_params, const float* wte,
                            const float* x, const int32_t* targets, float* dx,
                            float* d_final_params, float* d_wte, float grad_scale = 1.0f);

// Backward of block `layer`: dx_in = d/dx_in (overwritten), d_block_params accumulated (null: a
// frozen block, no weight gradients; head_forward_backward takes null d_final_params or d_wte alike).
// x_in must be the input the block's forward saw. Without checkpointing, block_forward(layer)
// must have run on it since the last block_forward of that layer; with checkpointing the block's
// forward is recomputed from x_in here. dx_in may alias dx_out (in-place), neither may alias x_in.
void block_backward(Workspace& ws, int layer, const float* block_params, const float* x_in,
                    const float* dx_out, float* dx_in, float* d_block_params);

// Accumulates d_wte[tokens[b, t]] += dx[b, t] and d_wpe[t] += sum_b dx[b, t] into the embeddings
// module's gradient buffer.
void embed_backward(Workspace& ws, const int32_t* tokens, const float* dx, float* d_emb_params);

// ---- whole model, built from the passes above ------------------------------------------------------

// Mean loss (NaN when targets is null); logits [B, T, vocab] when not null.
float forward(Workspace& ws, const float* params, const int32_t* tokens, const int32_t* targets,
              float* logits = nullptr);

// Forward and backward; grads (num_params floats, same layout as params) accumulated with the
// gradient of grad_scale * mean loss. Returns the mean loss.
float forward_backward(Workspace& ws, const float* params, const int32_t* tokens,
                       const int32_t* targets, float* grads, float grad_scale = 1.0f);

// Floating-point operations of one forward over B x T tokens: the weight GEMMs (qkv, attention
// projection, MLP, LM head; 2*m*n*k each) and attention's two T x T products counted over the causal
// half only. The backward does two GEMMs per forward GEMM, so forward+backward = 3 x forward.
struct FlopCount {
  double matmul = 0;     // weight GEMMs of one forward
  double attention = 0;  // Q K^T and att V of one forward, causal half
  double forward() const { return matmul + attention; }
  double forward_backward() const { return 3 * forward(); }
};
FlopCount flops(const Config& config, int B, int T);

}  // namespace zt::model
