// The CUDA model passes (trainer/cuda/model_passes.h) against the CPU reference (model/gpt2.h's
// Workspace and per-module passes), pass by pass, on the tiny preset with random parameters, with
// and without checkpointing, with the LM head in one chunk and in several; the AdamW step
// (cuda/adamw.h) and add_inplace (cuda/kernels.h) bit for bit against optim::cpu_adamw_step and
// the engine's add_into. Label gpu: the tests that need a GPU skip, saying why, without one; the
// layout, the argument checks and the tolerances' own check run anywhere.
//
// Tolerances of the passes (fp32 on both sides; what differs is rounding, not math):
//  - cuBLAS and OpenBLAS sum each GEMM's products in different orders (blocking, split-K), the
//    CUDA LayerNorm/attention/cross-entropy kernels reduce in warp-shuffle order where the CPU
//    sums in index order (the loss's log-sum-exp in double), and expf/tanhf differ from glibc's
//    by an ulp or two. Each is a relative error of a few fp32 ulps (1.2e-7) per operation, and
//    two blocks, a LayerNorm backward and the tied LM head compound them to at most ~1e-5 of a
//    tensor's largest value. So activations and activation gradients are held to
//    |got - want| <= 1e-4 |want| + 1e-4 max|want| (cuda_test_util.h's fp32 tolerance), every
//    parameter gradient tensor to 1e-3 |want| + 1e-4 max|want| of that tensor (its elements are
//    sums over B*T rows that partly cancel, so a small element carries the absolute error of the
//    large terms it summed), and the mean loss to 1e-5 relative (it is a mean of B*T row losses
//    of about ln(256) = 5.5, each a log-sum-exp of logits whose errors are ~1e-7 absolute).
//  - ToleranceCoversRoundingLevelPerturbations checks on the CPU that these are wide enough:
//    parameters perturbed by one ulp (a stand-in for a different rounding in every operation)
//    move every output by well under a tenth of its tolerance. A wrong offset, a missing
//    accumulation or a chunking bug moves results by orders of magnitude more.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>

#include "core/dtype.h"
#include "cuda/adamw.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/model_passes.h"
#include "bf16_twin.h"
#include "cuda_test_util.h"
#include "model/gpt2.h"
#include "model/layout.h"
#include "optim/cpu_adam.h"

using namespace zt::cuda;
using namespace zt::cuda::test;
namespace model = zt::model;
namespace optim = zt::optim;

namespace {

constexpr Tolerance kActivationTol{1e-4, 1e-4};
constexpr Tolerance kGradTol{1e-3, 1e-4};
constexpr double kLossRtol = 1e-5;

// A micro-step's three tolerances: activations and activation gradients, each parameter gradient
// tensor, the mean loss (relative).
struct StepTolerances {
  Tolerance act, grad;
  double loss_rtol;
};
constexpr StepTolerances kFp32Step{kActivationTol, kGradTol, kLossRtol};

// bf16 compute (Compute::Bf16, zt train --matmul-dtype bf16) against the same fp32 reference on the
// same parameters (bf16 values, as --precision bf16 stores them), per element as cuda_test_util.h's
// close() checks it. Every GEMM input is rounded to bf16 (half an ulp: 2^-9 = 2e-3 relative) and the
// roundings of a block's GEMMs, a LayerNorm backward's cancellations and the tied LM head compound;
// fp32 accumulation keeps each product's error to its inputs' roundings. Measured on the CPU by
// Bf16ComputeRoundingsStayWithinAThirdOfTheTolerances (bf16_twin.h: exactly these roundings; tiny,
// B=3, T=37, two micro-steps): activations and activation gradients move by up to 5.0e-3 of their
// tensor's largest value (flash attention; 4.2e-3 materialized), parameter gradients by up to 8.4e-3,
// the mean loss by 1.1e-5 relative. Stated with three times that room (the GPU's own summation
// orders and its GELU epilogue take the rest; llm.c holds its bf16 logits to 1e-2 and gradients to
// 2e-2 the same way): activations and activation gradients 2e-2 |want| + 1.5e-2 max|want|, each
// parameter gradient tensor 5e-2 |want| + 3e-2 max|want|, the loss 1e-3 relative. A bias left out or
// a gradient overwritten instead of accumulated falls outside them (checked there too).
constexpr StepTolerances kBf16Step{{2e-2, 1.5e-2}, {5e-2, 3e-2}, 1e-3};

// The parameters as --precision bf16 hands them to the passes: bf16 values in fp32.
std::vector<float> bf16_valued(std::vector<float> p) { return rounded(p, DType::BF16); }

constexpr int kB = 3, kT = 37;  // N = 111 rows: odd, not a multiple of any chunk or warp

model::Config tiny() { return *model::preset("tiny"); }

struct Modules {
  int64_t emb = 0, fin = 0, wte = 0;
  std::vector<int64_t> blocks;
};
Modules modules_of(const model::Config& c) {
  const auto t = model::module_table(c);
  Modules m;
  m.emb = t.front().offset;
  m.fin = t.back().offset;
  for (size_t i = 1; i + 1 < t.size(); ++i) m.blocks.push_back(t[i].offset);
  m.wte = model::embedding_offsets(c).wte;
  return m;
}

// GPT-2's initialization plus noise, so biases are not zero and LayerNorm weights not one.
std::vector<float> random_params(const model::Config& c, uint64_t seed) {
  std::vector<float> p(size_t(model::num_params(c)));
  model::init_params(c, seed, p.data());
  const auto noise = normal(p.size(), seed + 1, 0.05f);
  for (size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
  return p;
}

std::vector<int32_t> random_tokens(size_t n, uint64_t seed, int64_t vocab) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(g);
  return v;
}

// The reference micro-step (gpt2.cpp's forward_backward, pass by pass), gradients accumulated
// into G.
StepOutputs cpu_step(model::Workspace& ws, const std::vector<float>& P, const std::vector<int32_t>& tokens,
                     const std::vector<int32_t>& targets, std::vector<float>& G, float grad_scale) {
  const model::Config& c = ws.config();
  const Modules m = modules_of(c);
  const int L = int(c.layers);
  const size_t NC = size_t(ws.B()) * size_t(ws.T()) * size_t(c.width);
  StepOutputs out;
  model::embed_forward(ws, P.data() + m.emb, tokens.data(), ws.residual(0));
  for (int l = 0; l < L; ++l) model::block_forward(ws, l, P.data() + m.blocks[l], ws.residual(l), ws.residual(l + 1));
  for (int i = 0; i <= L; ++i) out.residuals.emplace_back(ws.residual(i), ws.residual(i) + NC);
  float* dx = ws.grad_residual();
  out.loss = model::head_forward_backward(ws, P.data() + m.fin, P.data() + m.emb + m.wte, ws.residual(L),
                                          targets.data(), dx, G.data() + m.fin, G.data() + m.emb + m.wte, grad_scale);
  out.dx_head.assign(dx, dx + NC);
  for (int l = L - 1; l >= 0; --l) {
    model::block_backward(ws, l, P.data() + m.blocks[l], ws.residual(l), dx, dx, G.data() + m.blocks[l]);
    out.dx_blocks.emplace_back(dx, dx + NC);
  }
  model::embed_backward(ws, tokens.data(), dx, G.data() + m.emb);
  out.grads = G;
  return out;
}

std::vector<float> fetch(const float* device, size_t n) {
  std::vector<float> v(n);
  check(cudaMemcpy(v.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy (D2H)");
  return v;
}

// The same micro-step on the GPU (P, tokens, targets, G on the device). With `spare` (a device
// [N, C] buffer) the block backwards run out of place, ping-ponging between grad_residual() and
// spare; without it, in place as the reference does.
StepOutputs gpu_step(CudaModelPasses& ps, const float* P, const int32_t* tokens, const int32_t* targets, float* G,
                     size_t num_params, float grad_scale, float* spare) {
  const model::Config& c = ps.config();
  const Modules m = modules_of(c);
  const int L = int(c.layers);
  const size_t NC = size_t(ps.B()) * size_t(ps.T()) * size_t(c.width);
  StepOutputs out;
  ps.embed_forward(P + m.emb, tokens, ps.residual(0));
  for (int l = 0; l < L; ++l) ps.block_forward(l, P + m.blocks[l], ps.residual(l), ps.residual(l + 1));
  for (int i = 0; i <= L; ++i) out.residuals.push_back(fetch(ps.residual(i), NC));
  float* dx = ps.grad_residual();
  out.loss = ps.head_forward_backward(P + m.fin, P + m.emb + m.wte, ps.residual(L), targets, dx, G + m.fin,
                                      G + m.emb + m.wte, grad_scale);
  out.dx_head = fetch(dx, NC);
  for (int l = L - 1; l >= 0; --l) {
    float* dx_in = spare == nullptr ? dx : (dx == spare ? ps.grad_residual() : spare);
    ps.block_backward(l, P + m.blocks[l], ps.residual(l), dx, dx_in, G + m.blocks[l]);
    dx = dx_in;
    out.dx_blocks.push_back(fetch(dx, NC));
  }
  ps.embed_backward(tokens, dx, G + m.emb);
  out.grads = fetch(G, num_params);
  return out;
}

std::vector<float> slice(const std::vector<float>& v, int64_t offset, int64_t n) {
  return std::vector<float>(v.begin() + offset, v.begin() + offset + n);
}

// Every output of a micro-step within the tolerances above (divided by `margin`).
void expect_step_close(const StepOutputs& got, const StepOutputs& want, const model::Config& c,
                       const std::string& what, double margin = 1.0, const StepTolerances& tol = kFp32Step) {
  const Tolerance act{tol.act.rtol / margin, tol.act.atol / margin};
  const Tolerance grad{tol.grad.rtol / margin, tol.grad.atol / margin};
  ASSERT_EQ(got.residuals.size(), want.residuals.size());
  for (size_t i = 0; i < want.residuals.size(); ++i)
    EXPECT_TRUE(close(got.residuals[i], want.residuals[i], act, what + " residual(" + std::to_string(i) + ")"));
  EXPECT_NEAR(got.loss, want.loss, tol.loss_rtol / margin * std::fabs(want.loss)) << what << " loss";
  EXPECT_TRUE(close(got.dx_head, want.dx_head, act, what + " dx after the head"));
  ASSERT_EQ(got.dx_blocks.size(), want.dx_blocks.size());
  for (size_t i = 0; i < want.dx_blocks.size(); ++i) {
    const std::string layer = std::to_string(want.dx_blocks.size() - 1 - i);
    EXPECT_TRUE(close(got.dx_blocks[i], want.dx_blocks[i], act, what + " dx after block_backward(" + layer + ")"));
  }
  for (const model::ParamSpec& p : model::param_table(c))
    EXPECT_TRUE(close(slice(got.grads, p.offset, p.numel), slice(want.grads, p.offset, p.numel), grad,
                      what + " grad " + p.name));
}

// The largest |got - want| / max|want| of each output, for the record.
double worst_relative(const std::vector<float>& got, const std::vector<float>& want) {
  double max_want = 0, worst = 0;
  for (float w : want) max_want = std::max(max_want, double(std::fabs(w)));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])));
  return max_want > 0 ? worst / max_want : worst;
}

size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// `bytes` of device memory followed by a guard, all filled with 0xAB (synchronized: the passes run
// on a non-blocking stream); and how many of the guard's bytes are no longer 0xAB.
constexpr size_t kGuard = 64 * 1024;
DeviceBuffer guarded(size_t bytes) {
  DeviceBuffer mem(bytes + kGuard);
  check(cudaMemset(mem.get(), 0xAB, mem.bytes()), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return mem;
}
// Two micro-steps' batches (seeds 12-15) and the reference's outputs for them on parameters P, the
// second accumulating onto the first's gradients (grad_scale 0.5 each).
struct TwoSteps {
  std::vector<int32_t> tok0, tgt0, tok1, tgt1;
  StepOutputs want0, want1;
};
TwoSteps reference_two_steps(const model::Config& c, const std::vector<float>& P, bool ckpt, int64_t head_rows,
                             model::Attention attention) {
  const size_t N = size_t(kB) * kT;
  TwoSteps t{random_tokens(N, 12, c.vocab), random_tokens(N, 13, c.vocab), random_tokens(N, 14, c.vocab),
             random_tokens(N, 15, c.vocab), {}, {}};
  model::Workspace ws(c, kB, kT, ckpt, head_rows, attention);
  std::vector<float> G(P.size(), 0.0f);
  t.want0 = cpu_step(ws, P, t.tok0, t.tgt0, G, 0.5f);
  t.want1 = cpu_step(ws, P, t.tok1, t.tgt1, G, 0.5f);
  return t;
}

size_t guard_bytes_written(const DeviceBuffer& mem, size_t bytes) {
  std::vector<unsigned char> tail(kGuard);
  check(cudaMemcpy(tail.data(), static_cast<char*>(mem.get()) + bytes, kGuard, cudaMemcpyDeviceToHost), "cudaMemcpy");
  size_t written = 0;
  for (unsigned char b : tail) written += b != 0xAB;
  return written;
}

}  // namespace

// ---- runs anywhere ------------------------------------------------------------------------------

// bytes(): every buffer of the reference (with attention_backward's B*H*T*T scratch), each on a
// 256-byte boundary; L caches without checkpointing, one with; the logits chunk as asked (its rows
// V rounded up to 64 floats apart).
TEST(CudaModelPassesLayout, BytesCoverEveryBufferOn256ByteBoundaries) {
  const model::Config c = tiny();
  const int64_t C = c.width, H = c.heads, L = c.layers, V = c.vocab, N = int64_t(kB) * kT;
  const int64_t att = int64_t(kB) * H * kT * kT;
  auto f = [](int64_t floats) { return round256(size_t(floats) * 4); };
  // ln1, atty, res2, ln2; ln1/ln2 mean and rstd; qkv; att; fch, fch_gelu
  const size_t cache = 4 * f(N * C) + 4 * f(N) + f(N * 3 * C) + f(att) + 2 * f(N * 4 * C);
  const size_t residuals = size_t(L + 1) * f(N * C);
  const size_t scratch = f(N * C) /*grad_residual*/ + f(N * C) + f(N * 4 * C) + f(N * C) + f(N * C) + f(N * 3 * C) +
                         f(att) + f(N * C) + 2 * f(N) + f(N * C) + f(N) /*row losses*/ +
                         kCublasWorkspaceBytes /*cuBLAS's workspace, under the allocator*/;
  for (int64_t rows : {int64_t(0), int64_t(10)}) {
    // tiny: 256 MiB of logits is more than N rows; rows are V rounded up to 64 floats apart.
    const size_t logits = f((rows == 0 ? N : rows) * ((V + 63) / 64 * 64));
    EXPECT_EQ(CudaModelPasses::required_bytes(c, kB, kT, false, rows), size_t(L) * cache + residuals + scratch + logits);
    EXPECT_EQ(CudaModelPasses::required_bytes(c, kB, kT, true, rows), cache + residuals + scratch + logits);
  }
  const size_t b = CudaModelPasses::required_bytes(c, kB, kT, false);
  EXPECT_EQ(b % 256, 0u);
  // At least what the CPU reference allocates (it rounds to 64 bytes and its attention scratch is B*H*T).
  model::Workspace ws(c, kB, kT, false);
  EXPECT_GE(b, ws.bytes());
}

// Flash attention: both [B, H, T, T] buffers (each layer's probabilities, the backward's scratch)
// become one float per row; everything else stays as it was. A head size without a flash kernel
// is refused up front, saying so.
TEST(CudaModelPassesLayout, FlashAttentionKeepsOneValuePerRow) {
  const model::Config c = tiny();
  const int64_t H = c.heads, L = c.layers;
  auto f = [](int64_t floats) { return round256(size_t(floats) * 4); };
  const size_t saved = f(int64_t(kB) * H * kT * kT) - f(int64_t(kB) * H * kT);
  for (bool ckpt : {false, true}) {
    const size_t materialized = CudaModelPasses::required_bytes(c, kB, kT, ckpt, 0, model::Attention::Materialized);
    const size_t flash = CudaModelPasses::required_bytes(c, kB, kT, ckpt, 0, model::Attention::Flash);
    EXPECT_EQ(materialized - flash, size_t((ckpt ? 1 : L) + 1) * saved) << (ckpt ? "checkpointing" : "kept");
  }
  model::Config wide = c;  // head size 128
  wide.width = 256;
  wide.heads = 2;
  try {
    CudaModelPasses::required_bytes(wide, 1, 4, false, 0, model::Attention::Flash);
    ADD_FAILURE() << "a head size of 128 was accepted for flash attention";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("flash attention: head size C / H = 128"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(CudaModelPasses::required_bytes(wide, 1, 4, false));  // the cuBLAS attention takes it
}

// bf16 compute: ln1, ln2, the MLP's pre-activation and GELU output in bf16 instead of fp32; no fp32
// dfch, lnf or padded wte; its bf16 scratch (the GELU input's and a projection's gradient, the
// attention output, one block's bf16 weights, its biases, lnf, wte and the logits' gradient, rows
// V rounded up to 64 apart) on 256-byte boundaries like every other buffer. At 350M (B=8, T=1024)
// it needs less than fp32 compute: the four activations halve in every layer.
TEST(CudaModelPassesLayout, Bf16ComputeCarvesItsBuffersFromBytes) {
  const model::Config c = tiny();
  const int64_t C = c.width, H = c.heads, L = c.layers, V = c.vocab, N = int64_t(kB) * kT, ld = (V + 63) / 64 * 64;
  const int64_t att = int64_t(kB) * H * kT * kT;
  auto f = [](int64_t floats) { return round256(size_t(floats) * 4); };
  auto h = [](int64_t halves) { return round256(size_t(halves) * 2); };
  // ln1, ln2 (bf16); atty, res2; ln1/ln2 mean and rstd; qkv; att; fch, fch_gelu (bf16)
  const size_t cache = 2 * h(N * C) + 2 * f(N * C) + 4 * f(N) + f(N * 3 * C) + f(att) + 2 * h(N * 4 * C);
  const size_t residuals = size_t(L + 1) * f(N * C);
  // grad_residual, dres2, dln, datty, dqkv, att scratch, lnf mean/rstd, dlnf, row losses, cuBLAS's workspace
  const size_t scratch = 4 * f(N * C) + f(N * 3 * C) + f(att) + 2 * f(N) + f(N * C) + f(N) + kCublasWorkspaceBytes;
  // d16, g16, a16; the block's weights; its biases (three fp32, fc's bf16); lnf16; head_w16
  const size_t bf16 = h(N * 4 * C) + 2 * h(N * C) + h(3 * C * C) + h(C * C) + 2 * h(4 * C * C) + f(3 * C) + 2 * f(C) +
                      h(4 * C) + h(N * C) + h(ld * C);
  for (int64_t rows : {int64_t(0), int64_t(10)}) {
    const int64_t r = rows == 0 ? N : rows;
    const size_t logits = f(r * ld) + h(r * ld);  // fp32 logits, bf16 gradient
    for (bool ckpt : {false, true})
      EXPECT_EQ(CudaModelPasses::required_bytes(c, kB, kT, ckpt, rows, model::Attention::Materialized, Compute::Bf16),
                size_t(ckpt ? 1 : L) * cache + residuals + scratch + bf16 + logits)
          << (ckpt ? "checkpointing" : "kept") << ", head rows " << rows;
  }
  const model::Config m350 = *model::preset("350M");
  const size_t fp32 = CudaModelPasses::required_bytes(m350, 8, 1024, false, 0, model::Attention::Flash);
  const size_t b16 =
      CudaModelPasses::required_bytes(m350, 8, 1024, false, 0, model::Attention::Flash, Compute::Bf16);
  std::printf("350M, B=8, T=1024, flash: activations %.2f GiB with fp32 compute, %.2f GiB with bf16\n",
              double(fp32) / double(1 << 30), double(b16) / double(1 << 30));
  EXPECT_LT(b16, fp32);
  model::Config odd = c;  // the GELU epilogue's aux matrix needs 4C to be a multiple of 8
  odd.width = 66;
  odd.heads = 2;
  EXPECT_NO_THROW(CudaModelPasses::required_bytes(odd, 1, 4, false));
  odd.width = 63;
  odd.heads = 3;
  try {
    CudaModelPasses::required_bytes(odd, 1, 4, false, 0, model::Attention::Materialized, Compute::Bf16);
    ADD_FAILURE() << "an odd width was accepted for bf16 compute";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 compute needs an even width"), std::string::npos) << e.what();
  }
}

TEST(CudaModelPassesLayout, RefusesShapesThatCannotRun) {
  const model::Config c = tiny();
  EXPECT_THROW(CudaModelPasses::required_bytes(c, 0, kT, false), std::invalid_argument);
  EXPECT_THROW(CudaModelPasses::required_bytes(c, kB, 0, false), std::invalid_argument);
  EXPECT_THROW(CudaModelPasses::required_bytes(c, kB, int(c.context) + 1, false), std::invalid_argument);
  // The CUDA kernels' own limits, refused up front with the reason.
  auto message = [](const model::Config& cfg, int B, int T) -> std::string {
    try {
      CudaModelPasses::required_bytes(cfg, B, T, false);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no exception)";
  };
  model::Config wide_head = c;  // one head of 2048 channels: above the attention kernels' 1024
  wide_head.heads = 1;
  wide_head.width = 2048;
  EXPECT_NE(message(wide_head, 1, 4).find("head size 2048"), std::string::npos) << message(wide_head, 1, 4);
  model::Config long_ctx = c;
  long_ctx.context = 16384;
  EXPECT_NE(message(long_ctx, 1, 8193).find("8192"), std::string::npos) << message(long_ctx, 1, 8193);
  EXPECT_NO_THROW(CudaModelPasses::required_bytes(long_ctx, 1, 8192, true));
}

// The tolerances above are wide enough: one-ulp perturbations of every parameter (a stand-in for
// the GPU rounding each operation differently) move every output by under a tenth of them.
TEST(CudaModelPassesTolerance, ToleranceCoversRoundingLevelPerturbations) {
  const model::Config c = tiny();
  const auto P = random_params(c, 7);
  std::vector<float> Q = P;
  std::mt19937_64 g(8);
  for (float& x : Q) x = std::nextafter(x, (g() & 1) ? INFINITY : -INFINITY);
  const size_t N = size_t(kB) * kT;
  const auto tokens = random_tokens(N, 9, c.vocab), targets = random_tokens(N, 10, c.vocab);
  for (bool ckpt : {false, true}) {
    model::Workspace wa(c, kB, kT, ckpt), wb(c, kB, kT, ckpt);
    std::vector<float> ga(P.size(), 0.0f), gb(P.size(), 0.0f);
    const StepOutputs a = cpu_step(wa, P, tokens, targets, ga, 0.5f);
    const StepOutputs b = cpu_step(wb, Q, tokens, targets, gb, 0.5f);
    expect_step_close(b, a, c, std::string("1-ulp perturbation") + (ckpt ? " (checkpointing)" : ""), /*margin=*/10.0);
    double act = 0, grad = 0;
    for (size_t i = 0; i < a.residuals.size(); ++i) act = std::max(act, worst_relative(b.residuals[i], a.residuals[i]));
    for (size_t i = 0; i < a.dx_blocks.size(); ++i) act = std::max(act, worst_relative(b.dx_blocks[i], a.dx_blocks[i]));
    for (const model::ParamSpec& p : model::param_table(c))
      grad = std::max(grad, worst_relative(slice(b.grads, p.offset, p.numel), slice(a.grads, p.offset, p.numel)));
    std::printf("1-ulp perturbation%s: activations move by %.3g of max, gradients by %.3g of max, loss by %.3g relative\n",
                ckpt ? " (checkpointing)" : "", act, grad, std::fabs(double(b.loss) - a.loss) / std::fabs(a.loss));
  }
}

// bf16 compute's roundings, emulated on the CPU (bf16_twin.h), move two micro-steps (the second
// accumulating) by under a third of kBf16Step from the fp32 reference, with either attention: the
// measurement the GPU test's tolerances stand on (printed). And the tolerances still catch the bugs a
// fused epilogue could bring: a bias left out (one block's qkv bias, as if the epilogue had not
// applied it) or a gradient overwritten instead of accumulated both fall outside them.
TEST(CudaModelPassesTolerance, Bf16ComputeRoundingsStayWithinAThirdOfTheTolerances) {
  const model::Config c = tiny();
  const auto P = bf16_valued(random_params(c, 11));
  for (model::Attention attention : {model::Attention::Flash, model::Attention::Materialized}) {
    const char* name = model::attention_name(attention);
    const TwoSteps ref = reference_two_steps(c, P, false, 0, attention);
    std::vector<float> G16(P.size(), 0.0f);
    const StepOutputs got[2] = {bf16_twin_step(c, kB, kT, P, ref.tok0, ref.tgt0, G16, 0.5f, attention),
                                bf16_twin_step(c, kB, kT, P, ref.tok1, ref.tgt1, G16, 0.5f, attention)};
    const StepOutputs* want[2] = {&ref.want0, &ref.want1};
    for (int i = 0; i < 2; ++i) {
      const StepOutputs &o = got[i], &w = *want[i];
      expect_step_close(o, w, c, "bf16 roundings, micro-step " + std::to_string(i) + ", " + name, /*margin=*/3.0,
                        kBf16Step);
      double act = worst_relative(o.dx_head, w.dx_head), grad = 0;
      for (size_t l = 0; l < w.residuals.size(); ++l) act = std::max(act, worst_relative(o.residuals[l], w.residuals[l]));
      for (size_t l = 0; l < w.dx_blocks.size(); ++l) act = std::max(act, worst_relative(o.dx_blocks[l], w.dx_blocks[l]));
      for (const model::ParamSpec& p : model::param_table(c))
        grad = std::max(grad, worst_relative(slice(o.grads, p.offset, p.numel), slice(w.grads, p.offset, p.numel)));
      std::printf("bf16 compute's roundings, %s attention, micro-step %d: activations move by %.3g of max, "
                  "gradients by %.3g of max, loss by %.3g relative\n",
                  name, i, act, grad, std::fabs(double(o.loss) - w.loss) / std::fabs(w.loss));
    }
  }
  const TwoSteps ref = reference_two_steps(c, P, false, 0, model::Attention::Materialized);
  // A bias not applied: block 0's qkv bias left out of the forward.
  std::vector<float> no_bias = P;
  const int64_t qkv_b = model::module_table(c)[1].offset + model::block_offsets(c).qkv_b;
  std::fill(no_bias.begin() + qkv_b, no_bias.begin() + qkv_b + 3 * c.width, 0.0f);
  std::vector<float> Gb(P.size(), 0.0f);
  const StepOutputs biasless = bf16_twin_step(c, kB, kT, no_bias, ref.tok0, ref.tgt0, Gb, 0.5f);
  EXPECT_FALSE(close(biasless.residuals[1], ref.want0.residuals[1], kBf16Step.act, "without the qkv bias"));
  // A gradient overwritten: micro-step 1 from zero gradients against the accumulated reference.
  std::vector<float> Gz(P.size(), 0.0f);
  const StepOutputs fresh = bf16_twin_step(c, kB, kT, P, ref.tok1, ref.tgt1, Gz, 0.5f);
  size_t caught = 0;
  for (const model::ParamSpec& p : model::param_table(c))
    caught += !close(slice(fresh.grads, p.offset, p.numel), slice(ref.want1.grads, p.offset, p.numel), kBf16Step.grad,
                     p.name);
  EXPECT_EQ(caught, model::param_table(c).size()) << "tensors whose lost accumulation the tolerance missed";
}

TEST(CudaAdamWChecks, ArgumentsAreCheckedBeforeTheGpu) {
  optim::AdamParams hp;
  EXPECT_THROW(adamw_consts(hp, 0), std::invalid_argument);
  EXPECT_THROW(adamw_step(nullptr, nullptr, nullptr, nullptr, 4, hp, 0, nullptr, optim::LowDType::None, nullptr),
               std::invalid_argument);
  EXPECT_THROW(adamw_step(nullptr, nullptr, nullptr, nullptr, 4, hp, 1, nullptr, optim::LowDType::BF16, nullptr),
               std::invalid_argument);
  EXPECT_NO_THROW(adamw_step(nullptr, nullptr, nullptr, nullptr, 0, hp, 1, nullptr, optim::LowDType::None, nullptr));
  EXPECT_THROW(adamw_step(nullptr, nullptr, nullptr, nullptr, 4, adamw_consts(hp, 1), nullptr, DType::F16, nullptr),
               std::invalid_argument);
  EXPECT_THROW(adamw_step(nullptr, nullptr, nullptr, nullptr, 4, adamw_consts(hp, 1), nullptr, DType::I32, nullptr),
               std::invalid_argument);
  EXPECT_THROW(add_inplace(nullptr, DType::I32, nullptr, 4, nullptr), std::invalid_argument);
  EXPECT_THROW(add_inplace(nullptr, DType::F32, nullptr, -1, nullptr), std::invalid_argument);
}

// adamw_consts are cpu_adamw_step's constants: the kernel's operations replayed on the host with
// them (one IEEE operation per statement; x86-64 without -mfma has no FMA to contract into) give
// cpu_adamw_step's bits.
TEST(CudaAdamWChecks, ConstantsReproduceTheCpuStepOnTheHost) {
  const size_t n = 4099;
  const auto p0 = normal(n, 1), g = normal(n, 2, 0.01f), m0 = normal(n, 3, 1e-3f);
  std::vector<float> v0 = normal(n, 4, 1e-5f);
  for (float& x : v0) x = std::fabs(x);
  optim::AdamParams hp;
  hp.lr = 3e-4;
  hp.weight_decay = 0.1;
  hp.beta2 = 0.95;
  for (int64_t step : {int64_t(1), int64_t(10), int64_t(1000)}) {
    std::vector<float> p = p0, m = m0, v = v0;
    optim::cpu_adamw_step(p.data(), g.data(), m.data(), v.data(), int64_t(n), hp, step);
    const AdamWConsts c = adamw_consts(hp, step);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      volatile float pi = p0[i] * c.decay;
      volatile float a = m0[i] * c.beta1, b = g[i] * c.one_minus_beta1;
      volatile float mi = a + b;
      volatile float gg = g[i] * g[i];
      volatile float c1 = v0[i] * c.beta2, c2 = gg * c.one_minus_beta2;
      volatile float vi = c1 + c2;
      volatile float sq = std::sqrt(float(vi));
      volatile float q = sq / c.bias_correction2_sqrt;
      volatile float denom = q + c.eps;
      volatile float r = mi / denom;
      volatile float s = c.step_size * r;
      volatile float pn = pi - s;
      const float got[3] = {pn, mi, vi}, want[3] = {p[i], m[i], v[i]};
      if (std::memcmp(got, want, sizeof got) != 0) ++bad;
    }
    EXPECT_EQ(bad, 0u) << "step " << step;
  }
}

// ---- needs a GPU --------------------------------------------------------------------------------

namespace {

struct PassesCase {
  bool checkpointing;
  int64_t head_rows;  // 0: one chunk (tiny's automatic choice covers all N rows)
  int64_t vocab = 0;  // 0: tiny's 256; else one that is not a multiple of 64 (the head's padded GEMMs)
};

void PrintTo(const PassesCase& c, std::ostream* os) {
  *os << (c.checkpointing ? "checkpointing" : "kept") << ", head rows " << c.head_rows;
  if (c.vocab) *os << ", vocab " << c.vocab;
}

std::string case_name(const ::testing::TestParamInfo<PassesCase>& info) {
  return std::string(info.param.checkpointing ? "checkpointing" : "kept") +
         (info.param.head_rows ? "_head_chunks_of_" + std::to_string(info.param.head_rows) : "_head_one_chunk") +
         (info.param.vocab ? "_vocab_" + std::to_string(info.param.vocab) : "");
}

class CudaModelPassesParity : public ::testing::TestWithParam<PassesCase> {
 protected:
  void SetUp() override { ZT_REQUIRE_GPU(); }
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Cases, CudaModelPassesParity,
                         ::testing::Values(PassesCase{false, 0}, PassesCase{true, 0}, PassesCase{false, 10},
                                           PassesCase{true, 10}, PassesCase{false, 10, 251}, PassesCase{false, 0, 251}),
                         case_name);

// Two micro-steps (different batches, grad_scale 0.5 each) from zero gradients: the second
// accumulates onto the first. The first runs the block backwards in place (dx_in == dx_out), the
// second out of place. Every pass's output is compared with the reference's; the memory just past
// bytes() is never written; a second run repeats the first bit for bit.
TEST_P(CudaModelPassesParity, EveryPassMatchesTheCpuReference) {
  model::Config c = tiny();
  if (GetParam().vocab) c.vocab = GetParam().vocab;
  const bool ckpt = GetParam().checkpointing;
  const int64_t rows = GetParam().head_rows;
  const size_t N = size_t(kB) * kT, NC = N * size_t(c.width);
  const auto P = random_params(c, 11);
  const TwoSteps ref = reference_two_steps(c, P, ckpt, rows, model::Attention::Materialized);
  const auto &tok0 = ref.tok0, &tgt0 = ref.tgt0, &tok1 = ref.tok1, &tgt1 = ref.tgt1;
  const StepOutputs &want0 = ref.want0, &want1 = ref.want1;

  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  {
    Blas blas(0);
    CudaModelPasses ps(c, kB, kT, ckpt, stream, blas, rows);
    EXPECT_EQ(ps.bytes(), CudaModelPasses::required_bytes(c, kB, kT, ckpt, rows));
    EXPECT_EQ(ps.head_rows_per_chunk(), rows ? rows : int64_t(N));
    DeviceBuffer mem = guarded(ps.bytes());
    ps.bind(mem.get());

    DeviceBuffer dP = DeviceBuffer::from(P), dG = DeviceBuffer::from(std::vector<float>(P.size(), 0.0f));
    DeviceBuffer dtok0 = DeviceBuffer::from(tok0), dtgt0 = DeviceBuffer::from(tgt0);
    DeviceBuffer dtok1 = DeviceBuffer::from(tok1), dtgt1 = DeviceBuffer::from(tgt1);
    DeviceBuffer spare(NC * sizeof(float));
    const std::string tag = std::string(ckpt ? "checkpointing" : "kept") + " head rows " + std::to_string(rows);
    const StepOutputs got0 = gpu_step(ps, dP.as<float>(), dtok0.as<int32_t>(), dtgt0.as<int32_t>(), dG.as<float>(),
                                      P.size(), 0.5f, nullptr);
    expect_step_close(got0, want0, c, tag + " micro-step 0 (in place)");
    const StepOutputs got1 = gpu_step(ps, dP.as<float>(), dtok1.as<int32_t>(), dtgt1.as<int32_t>(), dG.as<float>(),
                                      P.size(), 0.5f, spare.as<float>());
    expect_step_close(got1, want1, c, tag + " micro-step 1 (accumulated, out of place)");

    EXPECT_EQ(guard_bytes_written(mem, ps.bytes()), 0u) << "the passes wrote past bytes()";

    // Deterministic: the same micro-step from the same gradients gives the same bits.
    DeviceBuffer dG2 = DeviceBuffer::from(std::vector<float>(P.size(), 0.0f));
    const StepOutputs again = gpu_step(ps, dP.as<float>(), dtok0.as<int32_t>(), dtgt0.as<int32_t>(), dG2.as<float>(),
                                       P.size(), 0.5f, nullptr);
    EXPECT_EQ(std::memcmp(&again.loss, &got0.loss, sizeof(float)), 0);
    EXPECT_TRUE(again.grads == got0.grads) << "gradients differ between two identical runs";
    EXPECT_TRUE(again.dx_blocks == got0.dx_blocks) << "activation gradients differ between two identical runs";
  }
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

// ---- bf16 compute on a GPU -------------------------------------------------------------------------

namespace {

struct Bf16Case {
  bool checkpointing;
  int64_t head_rows;  // 0: one chunk
  int64_t vocab;      // 0: tiny's 256; 251: the head's padded GEMMs
  bool fused;         // cuBLASLt's epilogues, or the unfused way (ZT_CUBLASLT_EPILOGUES=0)
  model::Attention attention;
};

std::string bf16_case_name(const ::testing::TestParamInfo<Bf16Case>& info) {
  const Bf16Case& c = info.param;
  return std::string(c.checkpointing ? "checkpointing" : "kept") +
         (c.head_rows ? "_head_chunks_of_" + std::to_string(c.head_rows) : "_head_one_chunk") +
         (c.vocab ? "_vocab_" + std::to_string(c.vocab) : "") + (c.fused ? "_fused" : "_unfused") +
         (c.attention == model::Attention::Flash ? "_flash" : "");
}

class CudaModelPassesBf16Parity : public ::testing::TestWithParam<Bf16Case> {
 protected:
  void SetUp() override { ZT_REQUIRE_GPU(); }
};

void print_routes(const CudaModelPasses& ps, const std::string& tag) {
  const LtMatmul::Routes* r = ps.epilogue_routes();
  if (r == nullptr) return;
  std::printf("%s: epilogues fused on cuBLASLt / unfused: bias %lld / %lld, gelu+bias %lld / %lld, dgelu %lld / %lld\n",
              tag.c_str(), (long long)r->fused[int(Epilogue::Bias)], (long long)r->unfused[int(Epilogue::Bias)],
              (long long)r->fused[int(Epilogue::GeluAuxBias)], (long long)r->unfused[int(Epilogue::GeluAuxBias)],
              (long long)r->fused[int(Epilogue::DGelu)], (long long)r->unfused[int(Epilogue::DGelu)]);
  if (!r->first_refusal.empty()) std::printf("%s: cuBLASLt refused %s\n", tag.c_str(), r->first_refusal.c_str());
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaModelPassesBf16Parity,
    ::testing::Values(Bf16Case{false, 0, 0, true, model::Attention::Materialized},
                      Bf16Case{true, 10, 0, true, model::Attention::Materialized},
                      Bf16Case{false, 10, 251, true, model::Attention::Materialized},
                      Bf16Case{false, 0, 0, false, model::Attention::Materialized},
                      Bf16Case{true, 10, 251, false, model::Attention::Materialized},
                      Bf16Case{false, 0, 0, true, model::Attention::Flash},
                      Bf16Case{true, 0, 0, true, model::Attention::Flash}),
    bf16_case_name);

// bf16 compute against the fp32 CPU reference on the same bf16-valued parameters, with kBf16Step's
// tolerances: two micro-steps (the second accumulating, out of place), nothing written past bytes(),
// every epilogue product gone the way asked, and (materialized attention: flash's dQ uses atomics)
// a repeated run bit for bit.
TEST_P(CudaModelPassesBf16Parity, EveryPassIsWithinTheBf16Tolerances) {
  const Bf16Case& k = GetParam();
  model::Config c = tiny();
  if (k.vocab) c.vocab = k.vocab;
  const size_t N = size_t(kB) * kT, NC = N * size_t(c.width);
  const auto P = bf16_valued(random_params(c, 11));
  const TwoSteps ref = reference_two_steps(c, P, k.checkpointing, k.head_rows, k.attention);
  const auto &tok0 = ref.tok0, &tgt0 = ref.tgt0, &tok1 = ref.tok1, &tgt1 = ref.tgt1;
  const StepOutputs &want0 = ref.want0, &want1 = ref.want1;

  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  {
    Blas blas(0);
    CudaModelPasses ps(c, kB, kT, k.checkpointing, stream, blas, k.head_rows, k.attention, Compute::Bf16);
    ps.set_fused_epilogues(k.fused);
    EXPECT_EQ(ps.bytes(),
              CudaModelPasses::required_bytes(c, kB, kT, k.checkpointing, k.head_rows, k.attention, Compute::Bf16));
    DeviceBuffer mem = guarded(ps.bytes());
    ps.bind(mem.get());
    DeviceBuffer dP = DeviceBuffer::from(P), dG = DeviceBuffer::from(std::vector<float>(P.size(), 0.0f));
    DeviceBuffer dtok0 = DeviceBuffer::from(tok0), dtgt0 = DeviceBuffer::from(tgt0);
    DeviceBuffer dtok1 = DeviceBuffer::from(tok1), dtgt1 = DeviceBuffer::from(tgt1);
    DeviceBuffer spare(NC * sizeof(float));
    const std::string tag = bf16_case_name({GetParam(), 0});
    const StepOutputs got0 = gpu_step(ps, dP.as<float>(), dtok0.as<int32_t>(), dtgt0.as<int32_t>(), dG.as<float>(),
                                      P.size(), 0.5f, nullptr);
    expect_step_close(got0, want0, c, tag + " micro-step 0 (in place)", 1.0, kBf16Step);
    const StepOutputs got1 = gpu_step(ps, dP.as<float>(), dtok1.as<int32_t>(), dtgt1.as<int32_t>(), dG.as<float>(),
                                      P.size(), 0.5f, spare.as<float>());
    expect_step_close(got1, want1, c, tag + " micro-step 1 (accumulated, out of place)", 1.0, kBf16Step);
    double act = 0, grad = 0;
    for (size_t i = 0; i < want1.dx_blocks.size(); ++i)
      act = std::max(act, worst_relative(got1.dx_blocks[i], want1.dx_blocks[i]));
    for (const model::ParamSpec& p : model::param_table(c))
      grad = std::max(grad, worst_relative(slice(got1.grads, p.offset, p.numel), slice(want1.grads, p.offset, p.numel)));
    std::printf("%s: micro-step 1 moves activation gradients by %.3g of max, gradients by %.3g, loss by %.3g relative\n",
                tag.c_str(), act, grad, std::fabs(double(got1.loss) - want1.loss) / std::fabs(want1.loss));
    print_routes(ps, tag);

    const LtMatmul::Routes& r = *ps.epilogue_routes();
    for (Epilogue e : {Epilogue::Bias, Epilogue::GeluAuxBias, Epilogue::DGelu}) {
      EXPECT_GT(r.fused[int(e)] + r.unfused[int(e)], 0) << epilogue_name(e);
      if (!k.fused) {
        EXPECT_EQ(r.fused[int(e)], 0) << epilogue_name(e);
      }
    }

    EXPECT_EQ(guard_bytes_written(mem, ps.bytes()), 0u) << "the passes wrote past bytes()";

    if (k.attention == model::Attention::Materialized) {
      DeviceBuffer dG2 = DeviceBuffer::from(std::vector<float>(P.size(), 0.0f));
      const StepOutputs again = gpu_step(ps, dP.as<float>(), dtok0.as<int32_t>(), dtgt0.as<int32_t>(),
                                         dG2.as<float>(), P.size(), 0.5f, nullptr);
      EXPECT_EQ(std::memcmp(&again.loss, &got0.loss, sizeof(float)), 0);
      EXPECT_TRUE(again.grads == got0.grads) << "gradients differ between two identical runs";
    }
  }
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

// bf16 compute leaves fp32 compute as it was: fp32 passes on a Blas, then bf16 passes on the same
// Blas and stream (its cuBLASLt handle, plans and workspace use), then the fp32 passes again (bound
// again: they give the Blas their workspace back) give the first run's bits.
TEST(CudaModelPasses, Bf16ComputeLeavesFp32ComputeBitForBit) {
  ZT_REQUIRE_GPU();
  const model::Config c = tiny();
  const size_t N = size_t(kB) * kT;
  const auto P = bf16_valued(random_params(c, 31));
  const auto tok = random_tokens(N, 32, c.vocab), tgt = random_tokens(N, 33, c.vocab);
  Blas blas(0);
  DeviceBuffer dP = DeviceBuffer::from(P), dtok = DeviceBuffer::from(tok), dtgt = DeviceBuffer::from(tgt);
  CudaModelPasses fp32(c, kB, kT, false, nullptr, blas);
  DeviceBuffer mem32(fp32.bytes());
  fp32.bind(mem32.get());
  auto run = [&](CudaModelPasses& ps) {
    DeviceBuffer g = DeviceBuffer::from(std::vector<float>(P.size(), 0.0f));
    return gpu_step(ps, dP.as<float>(), dtok.as<int32_t>(), dtgt.as<int32_t>(), g.as<float>(), P.size(), 1.0f, nullptr);
  };
  const StepOutputs before = run(fp32);
  {
    CudaModelPasses b16(c, kB, kT, false, nullptr, blas, 0, model::Attention::Materialized, Compute::Bf16);
    DeviceBuffer mem16(b16.bytes());
    b16.bind(mem16.get());
    const StepOutputs other = run(b16);
    EXPECT_FALSE(other.grads == before.grads) << "bf16 compute gave fp32's bits: did it run in bf16?";
  }
  fp32.bind(mem32.get());
  const StepOutputs after = run(fp32);
  EXPECT_EQ(std::memcmp(&after.loss, &before.loss, sizeof(float)), 0);
  EXPECT_TRUE(after.grads == before.grads);
  EXPECT_TRUE(after.residuals == before.residuals);
  EXPECT_EQ(fp32.epilogue_routes(), nullptr);
}

// Asynchronous mode: the same results when the passes only queue work on the stream.
TEST(CudaModelPasses, AsynchronousPassesGiveTheSameResults) {
  ZT_REQUIRE_GPU();
  const model::Config c = tiny();
  const size_t N = size_t(kB) * kT;
  const auto P = random_params(c, 21);
  const auto tok = random_tokens(N, 22, c.vocab), tgt = random_tokens(N, 23, c.vocab);
  Blas blas(0);
  CudaModelPasses ps(c, kB, kT, false, nullptr, blas);
  DeviceBuffer mem(ps.bytes());
  ps.bind(mem.get());
  DeviceBuffer dP = DeviceBuffer::from(P), dtok = DeviceBuffer::from(tok), dtgt = DeviceBuffer::from(tgt);
  DeviceBuffer g1 = DeviceBuffer::from(std::vector<float>(P.size(), 0.0f));
  DeviceBuffer g2 = DeviceBuffer::from(std::vector<float>(P.size(), 0.0f));
  const StepOutputs sync_run = gpu_step(ps, dP.as<float>(), dtok.as<int32_t>(), dtgt.as<int32_t>(), g1.as<float>(),
                                        P.size(), 1.0f, nullptr);
  ps.set_synchronous(false);
  const StepOutputs async_run = gpu_step(ps, dP.as<float>(), dtok.as<int32_t>(), dtgt.as<int32_t>(), g2.as<float>(),
                                         P.size(), 1.0f, nullptr);
  EXPECT_EQ(async_run.loss, sync_run.loss);
  EXPECT_TRUE(async_run.grads == sync_run.grads);
}

TEST(CudaModelPasses, PassesBeforeBindThrow) {
  ZT_REQUIRE_GPU();
  const model::Config c = tiny();
  Blas blas(0);
  CudaModelPasses ps(c, kB, kT, true, nullptr, blas);
  EXPECT_FALSE(ps.bound());
  EXPECT_THROW(ps.residual(0), std::logic_error);
  EXPECT_THROW(ps.grad_residual(), std::logic_error);
  EXPECT_THROW(ps.embed_forward(nullptr, nullptr, nullptr), std::logic_error);
  EXPECT_THROW(ps.block_forward(0, nullptr, nullptr, nullptr), std::logic_error);
  EXPECT_THROW(ps.head_forward_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1.0f),
               std::logic_error);
  EXPECT_THROW(ps.block_backward(0, nullptr, nullptr, nullptr, nullptr, nullptr), std::logic_error);
  EXPECT_THROW(ps.embed_backward(nullptr, nullptr, nullptr), std::logic_error);
  EXPECT_THROW(ps.bind(nullptr), std::invalid_argument);
  DeviceBuffer mem(ps.bytes() + 256);
  EXPECT_THROW(ps.bind(static_cast<char*>(mem.get()) + 4), std::invalid_argument);  // not 256-byte aligned
  ps.bind(mem.get());
  EXPECT_TRUE(ps.bound());
  EXPECT_NE(ps.residual(int(c.layers)), nullptr);
  EXPECT_THROW(ps.residual(int(c.layers) + 1), std::out_of_range);
}

// ---- AdamW and add_inplace: bit for bit ---------------------------------------------------------

namespace zt::optim {
// gtest prints the parameter with this ("bf16" rather than "1-byte object <01>").
inline void PrintTo(LowDType t, std::ostream* os) {
  *os << (t == LowDType::BF16 ? "bf16" : t == LowDType::F16 ? "fp16" : "none");
}
}  // namespace zt::optim

namespace {

bool same_float(float a, float b) { return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, 4) == 0; }
bool is_nan_bits(uint16_t h, DType t) {
  return t == DType::BF16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}
// Bit for bit, except that a NaN need only be a NaN (payload and sign may differ; kernels.h).
size_t count_float_mismatches(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!same_float(got[i], want[i]) && bad++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", want " << want[i];
  return bad;
}
size_t count_low_mismatches(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, DType t,
                            const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool same = is_nan_bits(want[i], t) ? is_nan_bits(got[i], t) : got[i] == want[i];
    if (!same && bad++ < 5) ADD_FAILURE() << what << " [" << i << "]: got 0x" << std::hex << got[i] << ", want 0x" << want[i] << std::dec;
  }
  return bad;
}

class CudaAdamW : public ::testing::TestWithParam<optim::LowDType> {
 protected:
  void SetUp() override { ZT_REQUIRE_GPU(); }
};

std::string low_name(const ::testing::TestParamInfo<optim::LowDType>& info) {
  switch (info.param) {
    case optim::LowDType::BF16: return "bf16_output";
    case optim::LowDType::F16: return "fp16_output";
    default: return "no_output";
  }
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Outputs, CudaAdamW,
                         ::testing::Values(optim::LowDType::None, optim::LowDType::BF16, optim::LowDType::F16),
                         low_name);

// Steps 1, 2, 3 and a late step with other hyperparameters, in sequence on the same state: p, m,
// v and the fused copy equal cpu_adamw_step's to the bit after every step. The state includes
// zeros, fp32 subnormals, huge and infinite gradients and a NaN, and parameters at fp16's edges.
TEST_P(CudaAdamW, BitIdenticalToCpuAdamW) {
  const optim::LowDType low = GetParam();
  const DType low_t = low == optim::LowDType::BF16 ? DType::BF16 : DType::F16;
  const size_t n = 300007;  // odd: the last block is partly idle
  std::vector<float> p = normal(n, 31), g = normal(n, 32, 0.01f), m = normal(n, 33, 1e-3f), v = normal(n, 34, 1e-5f);
  for (float& x : v) x = std::fabs(x);
  const float specials_g[] = {0.0f, -0.0f, 1e-40f, -1e-39f, 1e30f, -1e20f, std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), 1e-20f, 3.0f};
  for (size_t i = 0; i < std::size(specials_g); ++i) g[i] = specials_g[i];
  m[0] = v[0] = 0.0f;  // 0 / (0 + eps)
  const float specials_p[] = {65504.0f, 65519.0f, 65520.0f, -65536.0f, 6e-8f, 3e-8f, 1e-42f, -0.0f, 1e38f, 0.1f};
  for (size_t i = 0; i < std::size(specials_p); ++i) p[20 + i] = specials_p[i];
  for (size_t i = 40; i < 60; ++i) p[i] = 1.0f + float(i - 40) / 256.0f;  // bf16 ties and near-ties

  DeviceBuffer dp = DeviceBuffer::from(p), dg = DeviceBuffer::from(g), dm = DeviceBuffer::from(m),
               dv = DeviceBuffer::from(v), dlow(n * 2);
  struct Step {
    optim::AdamParams hp;
    int64_t step;
  };
  optim::AdamParams a;  // defaults, no decay
  optim::AdamParams b;
  b.lr = 6e-4;
  b.weight_decay = 0.1;
  b.beta2 = 0.95;
  optim::AdamParams c2;
  c2.lr = 1e-2;
  c2.eps = 1e-6;
  c2.beta1 = 0.8;
  c2.weight_decay = 0.01;
  for (const Step& s : {Step{a, 1}, Step{b, 2}, Step{b, 3}, Step{c2, 12345}}) {
    std::vector<uint16_t> want_low(n, 0);
    optim::cpu_adamw_step(p.data(), g.data(), m.data(), v.data(), int64_t(n), s.hp, s.step,
                          low == optim::LowDType::None ? nullptr : want_low.data(), low);
    adamw_step(dp.as<float>(), dg.as<float>(), dm.as<float>(), dv.as<float>(), int64_t(n), s.hp, s.step,
               low == optim::LowDType::None ? nullptr : dlow.get(), low, nullptr);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const std::string at = "step " + std::to_string(s.step);
    EXPECT_EQ(count_float_mismatches(dp.to_vector<float>(n), p, "params " + at), 0u);
    EXPECT_EQ(count_float_mismatches(dm.to_vector<float>(n), m, "m " + at), 0u);
    EXPECT_EQ(count_float_mismatches(dv.to_vector<float>(n), v, "v " + at), 0u);
    if (low != optim::LowDType::None) {
      EXPECT_EQ(count_low_mismatches(dlow.to_vector<uint16_t>(n), want_low, low_t, "fused output " + at), 0u);
    }
  }
}

class CudaAddInplace : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { ZT_REQUIRE_GPU(); }
};
INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAddInplace, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(name_of(info.param)); });

// The engine's add_into (zero/engine.cpp): dst = round(dst + src), bit for bit.
TEST_P(CudaAddInplace, MatchesTheEnginesAddIntoBitForBit) {
  const DType t = GetParam();
  const size_t n = 100003;
  std::vector<float> dst = rounded(normal(n, 41, 2.0f), t), src = normal(n, 42, 0.5f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[][2] = {{65504.0f, 16.0f},  {65504.0f, 15.0f}, {1.0f, 1.0f / 256},  {1.0f, 3.0f / 256},
                               {0.0f, 3e-6f},      {0.0f, 1e-8f},     {-0.0f, 0.0f},      {1.0f, nan},
                               {inf, -inf},        {3e38f, 3e38f},    {1e-40f, 1e-40f},   {-2.0f, 2.0f}};
  for (size_t i = 0; i < std::size(specials); ++i) {
    dst[i] = rounded({specials[i][0]}, t)[0];
    src[i] = specials[i][1];
  }
  // The reference: engine.cpp's add_into.
  std::vector<uint16_t> want16(n), got16(n);
  std::vector<float> want32 = dst;
  if (t == DType::F32) {
    for (size_t i = 0; i < n; ++i) want32[i] += src[i];
  } else {
    zt::trainer::from_float(t, dst.data(), want16.data(), n);
    const bool bf = t == DType::BF16;
    for (size_t i = 0; i < n; ++i) {
      const float x = (bf ? zt::trainer::bf16_to_float(want16[i]) : zt::trainer::fp16_to_float(want16[i])) + src[i];
      want16[i] = bf ? zt::trainer::float_to_bf16(x) : zt::trainer::float_to_fp16(x);
    }
  }
  DeviceBuffer ddst = upload(dst, t), dsrc = DeviceBuffer::from(src);
  add_inplace(ddst.get(), t, dsrc.as<float>(), int64_t(n), nullptr);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (t == DType::F32) {
    EXPECT_EQ(count_float_mismatches(ddst.to_vector<float>(n), want32, "add_inplace fp32"), 0u);
  } else {
    EXPECT_EQ(count_low_mismatches(ddst.to_vector<uint16_t>(n), want16, t, std::string("add_inplace ") + name_of(t)), 0u);
  }
}
