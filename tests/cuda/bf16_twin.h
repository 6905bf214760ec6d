// tests/cuda/bf16_twin.h: bf16 compute's roundings (trainer/cuda/model_passes.h, Compute::Bf16) on the
// CPU: one micro-step of GPT-2 composed from model/kernels.h's fp32 kernels, with each value
// rounded to bf16 exactly where the GPU passes store it in bf16 or cast it for a GEMM: the
// LayerNorm outputs, the attention output, the MLP's pre-activation (GELU taken of the unrounded
// sum, as the fused epilogue does) and GELU output, the output gradients of the four projections and
// of the LM head, the GELU input's gradient, the weights and wte. Everything else is fp32, as there.
// Either attention (the flash one is model/flash_attention.h, the GPU kernels' CPU twin). Not bit-exact with the GPU (summation orders, cuBLASLt's GELU, the
// unfused route's GELU of the rounded pre-activation): what it is for is measuring, on the CPU, how
// far these roundings move a step from the fp32 reference, so the GPU test's tolerances are
// stated from a measurement (model_passes_test.cpp's Bf16ComputeRoundingsStayWithinAThirdOfTheTolerances).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "model/flash_attention.h"
#include "model/gpt2.h"
#include "model/kernels.h"
#include "model/layout.h"

namespace zt::cuda::test {

inline float bf16_round(float x) { return trainer::bf16_to_float(trainer::float_to_bf16(x)); }
inline std::vector<float> bf16_rounded(const float* p, size_t n) {
  std::vector<float> v(p, p + n);
  for (float& x : v) x = bf16_round(x);
  return v;
}

// What one micro-step's passes produce, pass by pass.
struct StepOutputs {
  std::vector<std::vector<float>> residuals;  // L + 1, after the forward
  float loss = 0;
  std::vector<float> dx_head;                 // after head_forward_backward
  std::vector<std::vector<float>> dx_blocks;  // after block_backward of layers L-1, ..., 0
  std::vector<float> grads;                   // the whole gradient buffer after embed_backward
};

// One micro-step of bf16 compute on the CPU: parameters P (fp32; the passes see bf16 values
// widened under --precision bf16), gradients accumulated into G.
inline StepOutputs bf16_twin_step(const model::Config& c, int B, int T, const std::vector<float>& P,
                                  const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                                  std::vector<float>& G, float grad_scale,
                                  model::Attention attention = model::Attention::Materialized) {
  const bool flash = attention == model::Attention::Flash;
  namespace k = model::kernels;
  const int64_t C = c.width, H = c.heads, L = c.layers, V = c.vocab, N = int64_t(B) * T;
  const auto mods = model::module_table(c);
  const model::BlockOffsets o = model::block_offsets(c);
  const model::EmbeddingOffsets eo = model::embedding_offsets(c);
  const model::FinalOffsets fo = model::final_offsets(c);
  const size_t NC = size_t(N * C);
  auto rounded = [](std::vector<float> v) {
    for (float& x : v) x = bf16_round(x);
    return v;
  };
  struct Cache {
    std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };
  std::vector<Cache> caches(static_cast<size_t>(L));
  std::vector<std::vector<float>> x(size_t(L) + 1, std::vector<float>(NC));
  StepOutputs out;

  const float* emb = P.data() + mods.front().offset;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < C; ++i)
      x[0][size_t(n * C + i)] = emb[eo.wte + tokens[size_t(n)] * C + i] + emb[eo.wpe + (n % T) * C + i];

  for (int64_t l = 0; l < L; ++l) {
    const float* p = P.data() + mods[size_t(l) + 1].offset;
    Cache& k1 = caches[size_t(l)];
    const auto W = [&](int64_t off, int64_t n) { return bf16_rounded(p + off, size_t(n)); };
    k1.ln1.resize(NC), k1.ln1_mean.resize(size_t(N)), k1.ln1_rstd.resize(size_t(N));
    k::layernorm_forward(k1.ln1.data(), k1.ln1_mean.data(), k1.ln1_rstd.data(), x[size_t(l)].data(), p + o.ln1_w,
                         p + o.ln1_b, N, C);
    k1.ln1 = rounded(k1.ln1);
    k1.qkv.resize(NC * 3);
    k::matmul_forward(k1.qkv.data(), k1.ln1.data(), W(o.qkv_w, 3 * C * C).data(), p + o.qkv_b, N, C, 3 * C);
    k1.att.resize(size_t(B * H * T * (flash ? 1 : T))), k1.atty.resize(NC);
    if (flash)
      model::flash_attention_forward(k1.atty.data(), k1.att.data(), k1.qkv.data(), B, T, C, H);
    else
      k::attention_forward(k1.atty.data(), k1.att.data(), k1.qkv.data(), B, T, C, H);
    k1.res2 = x[size_t(l)];
    k::matmul_forward(k1.res2.data(), rounded(k1.atty).data(), W(o.attn_proj_w, C * C).data(), p + o.attn_proj_b, N,
                      C, C, /*accumulate=*/true);
    k1.ln2.resize(NC), k1.ln2_mean.resize(size_t(N)), k1.ln2_rstd.resize(size_t(N));
    k::layernorm_forward(k1.ln2.data(), k1.ln2_mean.data(), k1.ln2_rstd.data(), k1.res2.data(), p + o.ln2_w,
                         p + o.ln2_b, N, C);
    k1.ln2 = rounded(k1.ln2);
    std::vector<float> pre(NC * 4);
    k::matmul_forward(pre.data(), k1.ln2.data(), W(o.fc_w, 4 * C * C).data(), W(o.fc_b, 4 * C).data(), N, C, 4 * C);
    k1.fch_gelu.resize(NC * 4);
    k::gelu_forward(k1.fch_gelu.data(), pre.data(), int64_t(pre.size()));
    k1.fch_gelu = rounded(k1.fch_gelu);
    k1.fch = rounded(pre);
    x[size_t(l) + 1] = k1.res2;
    k::matmul_forward(x[size_t(l) + 1].data(), k1.fch_gelu.data(), W(o.mlp_proj_w, 4 * C * C).data(),
                      p + o.mlp_proj_b, N, 4 * C, C, /*accumulate=*/true);
  }
  out.residuals = x;

  // LM head.
  const float* fp = P.data() + mods.back().offset;
  float* dfp = G.data() + mods.back().offset;
  const std::vector<float> wte16 = bf16_rounded(emb + eo.wte, size_t(V * C));
  std::vector<float> lnf(NC), lnf_mean(static_cast<size_t>(N)), lnf_rstd(static_cast<size_t>(N));
  k::layernorm_forward(lnf.data(), lnf_mean.data(), lnf_rstd.data(), x[size_t(L)].data(), fp + fo.ln_w, fp + fo.ln_b, N,
                       C);
  lnf = rounded(lnf);
  std::vector<float> logits(size_t(N * V));
  k::matmul_forward(logits.data(), lnf.data(), wte16.data(), nullptr, N, C, V);
  const float dscale = grad_scale / float(N);
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    float* row = logits.data() + n * V;
    const int32_t target = targets[size_t(n)];
    float m = -INFINITY;
    for (int64_t i = 0; i < V; ++i) m = std::max(m, row[i]);
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(double(row[i]) - m);
    total += float(std::log(sum) + m - row[target]);
    for (int64_t i = 0; i < V; ++i) {
      float pi = float(std::exp(double(row[i]) - m) / sum) * dscale;
      if (i == target) pi -= dscale;
      row[i] = bf16_round(pi);
    }
  }
  out.loss = float(total / double(N));
  std::vector<float> dlnf(NC);
  float* gemb = G.data() + mods.front().offset;
  k::matmul_backward(dlnf.data(), gemb + eo.wte, nullptr, logits.data(), lnf.data(), wte16.data(), N, C, V);
  std::vector<float> dx(NC);
  k::layernorm_backward(dx.data(), dfp + fo.ln_w, dfp + fo.ln_b, dlnf.data(), x[size_t(L)].data(), fp + fo.ln_w,
                        lnf_mean.data(), lnf_rstd.data(), N, C, /*accumulate_dinp=*/false);
  out.dx_head = dx;

  for (int64_t l = L - 1; l >= 0; --l) {
    const float* p = P.data() + mods[size_t(l) + 1].offset;
    float* dp = G.data() + mods[size_t(l) + 1].offset;
    const Cache& k1 = caches[size_t(l)];
    const auto W = [&](int64_t off, int64_t n) { return bf16_rounded(p + off, size_t(n)); };
    // MLP projection.
    std::vector<float> g = rounded(dx);
    k::column_sums_accumulate(dp + o.mlp_proj_b, dx.data(), N, C);
    std::vector<float> dfch(NC * 4);
    k::matmul_backward(dfch.data(), dp + o.mlp_proj_w, nullptr, g.data(), k1.fch_gelu.data(),
                       W(o.mlp_proj_w, 4 * C * C).data(), N, 4 * C, C);
    k::gelu_backward(dfch.data(), k1.fch.data(), dfch.data(), int64_t(dfch.size()));
    dfch = rounded(dfch);
    std::vector<float> dres2 = dx;
    // fc.
    std::vector<float> dln(NC);
    k::matmul_backward(dln.data(), dp + o.fc_w, dp + o.fc_b, dfch.data(), k1.ln2.data(), W(o.fc_w, 4 * C * C).data(), N,
                       C, 4 * C);
    k::layernorm_backward(dres2.data(), dp + o.ln2_w, dp + o.ln2_b, dln.data(), k1.res2.data(), p + o.ln2_w,
                          k1.ln2_mean.data(), k1.ln2_rstd.data(), N, C, /*accumulate_dinp=*/true);
    // Attention projection.
    g = rounded(dres2);
    k::column_sums_accumulate(dp + o.attn_proj_b, dres2.data(), N, C);
    std::vector<float> datty(NC);
    k::matmul_backward(datty.data(), dp + o.attn_proj_w, nullptr, g.data(), rounded(k1.atty).data(),
                       W(o.attn_proj_w, C * C).data(), N, C, C);
    std::vector<float> dqkv(NC * 3), scratch(size_t(B * H * T));
    if (flash)
      model::flash_attention_backward(dqkv.data(), scratch.data(), datty.data(), k1.qkv.data(), k1.atty.data(),
                                      k1.att.data(), B, T, C, H);
    else
      k::attention_backward(dqkv.data(), scratch.data(), datty.data(), k1.qkv.data(), k1.att.data(), B, T, C, H);
    k::column_sums_accumulate(dp + o.qkv_b, dqkv.data(), N, 3 * C);
    dqkv = rounded(dqkv);
    k::matmul_backward(dln.data(), dp + o.qkv_w, nullptr, dqkv.data(), k1.ln1.data(), W(o.qkv_w, 3 * C * C).data(), N,
                       C, 3 * C);
    dx = dres2;
    k::layernorm_backward(dx.data(), dp + o.ln1_w, dp + o.ln1_b, dln.data(), x[size_t(l)].data(), p + o.ln1_w,
                          k1.ln1_mean.data(), k1.ln1_rstd.data(), N, C, /*accumulate_dinp=*/true);
    out.dx_blocks.push_back(dx);
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < C; ++i) {
      gemb[eo.wte + tokens[size_t(n)] * C + i] += dx[size_t(n * C + i)];
      gemb[eo.wpe + (n % T) * C + i] += dx[size_t(n * C + i)];
    }
  out.grads = G;
  return out;
}

}  // namespace zt::cuda::test
