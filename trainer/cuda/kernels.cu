// trainer/cuda/kernels.cu: see kernels.h. Plain, readable kernels first: one block per row for
// the row reductions, one thread per element elsewhere, fixed-order reductions (warp shuffles in
// a fixed pattern, then warps in order) so results do not depend on scheduling. Not tuned:
// no vectorized loads, no tensor-core attention; the GEMMs (gemm.cpp) carry the FLOPs.
#include "cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/runtime.h"

namespace zt::cuda {

namespace {

// ---- storage types: load as fp32, store rounded to nearest even ----

template <typename T>
__device__ __forceinline__ float ld(const T* p, int64_t i);
template <>
__device__ __forceinline__ float ld<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ float ld<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
template <>
__device__ __forceinline__ float ld<__half>(const __half* p, int64_t i) {
  return __half2float(p[i]);
}

template <typename T>
__device__ __forceinline__ void st(T* p, int64_t i, float v);
template <>
__device__ __forceinline__ void st<float>(float* p, int64_t i, float v) {
  p[i] = v;
}
template <>
__device__ __forceinline__ void st<__nv_bfloat16>(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ void st<__half>(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}

// Calls f with a value of the storage type of `t`; int32 (or anything else) is refused.
template <typename F>
void dispatch(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(__nv_bfloat16{}); return;
    case DType::F16: f(__half{}); return;
    default: break;
  }
  throw std::invalid_argument(std::string(op) + ": dtype must be fp32, bf16 or fp16");
}

void require(bool ok, const char* op, const char* what) {
  if (!ok) throw std::invalid_argument(std::string(op) + ": " + what);
}

constexpr int kThreads = 256;

unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > (int64_t(1) << 20)) blocks = int64_t(1) << 20;  // grid-stride loops cover the rest
  return unsigned(blocks < 1 ? 1 : blocks);
}

// ---- fixed-order reductions (blockDim.x a multiple of 32, at most 1024) ----

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Every thread gets the block's sum. `scratch` holds 32 values; the leading __syncthreads makes
// back-to-back calls with the same scratch safe.
template <typename V>
__device__ V block_sum(V v, V* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : V(0);
  return warp_sum(v);
}
__device__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// ---- elementwise ----

template <typename S, typename D>
__global__ void cast_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st(dst, i, ld(src, i));
}

// cast_segments' table, by value (a kernel parameter): segment blockIdx.y, grid-stride over x.
struct SegmentTable {
  struct Entry {
    const float* src;
    void* dst;
    int64_t n;
    int dst_kind;  // 0 fp32, 1 bf16, 2 fp16
  } e[kMaxCastSegments];
};

__global__ void cast_segments_kernel(SegmentTable table) {
  const SegmentTable::Entry& seg = table.e[blockIdx.y];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < seg.n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = seg.src[i];
    if (seg.dst_kind == 0)
      static_cast<float*>(seg.dst)[i] = v;
    else if (seg.dst_kind == 1)
      st(static_cast<__nv_bfloat16*>(seg.dst), i, v);
    else
      st(static_cast<__half*>(seg.dst), i, v);
  }
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, float a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st(x, i, ld(x, i) * a);
}

template <typename T>
__global__ void squared_norm_partial_kernel(double* partials, const T* x, int64_t n) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = ld(x, i);
    acc += v * v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void squared_norm_final_kernel(double* out, const double* partials, int count, bool accumulate) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0.0;
  for (int i = 0; i < count; ++i) s += partials[i];  // block order: deterministic
  *out = accumulate ? *out + s : s;
}

#include "cuda/column_sums_kernels.cuh"  // column_sums_kernel, layernorm_backward_params_kernel

template <typename T>
__global__ void add_bias_rows_kernel(T* out, const T* bias, int64_t N, int64_t OC, bool accumulate) {
  const int64_t n = N * OC;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float b = ld(bias, i % OC);
    st(out, i, accumulate ? ld(out, i) + b : b);
  }
}

// ---- LayerNorm ----

constexpr float kLayerNormEps = 1e-5f;  // GPT-2's layer_norm_epsilon
constexpr int kRowThreads = 256;
constexpr int kCrossEntropyThreads = 1024;  // a row of V = 50257 logits: 50 elements per thread

template <typename T, typename TO = T>
__global__ void layernorm_forward_kernel(TO* out, float* mean, float* rstd, const T* inp, const T* w, const T* b,
                                         int C) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = inp + row * C;
  // Two passes, as the reference: the variance of centred values carries no cancellation error.
  float s = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) s += ld(x, i);
  const float m = block_sum(s, scratch) / float(C);
  float v = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const float d = ld(x, i) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(block_sum(v, scratch) / float(C) + kLayerNormEps);
  TO* y = out + row * C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) st(y, i, (ld(x, i) - m) * r * ld(w, i) + ld(b, i));
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

template <typename T>
__global__ void layernorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* w, const float* mean,
                                               const float* rstd, int C, bool accumulate) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float a = 0.0f, bb = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const float norm = (ld(x, i) - m) * r;
    const float dnorm = ld(w, i) * ld(dy, i);
    a += dnorm;
    bb += dnorm * norm;
  }
  a = block_sum(a, scratch) / float(C);
  bb = block_sum(bb, scratch) / float(C);
  T* dx = dinp + row * C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const float norm = (ld(x, i) - m) * r;
    const float g = (ld(w, i) * ld(dy, i) - a - norm * bb) * r;
    st(dx, i, accumulate ? ld(dx, i) + g : g);
  }
}

// ---- GELU (tanh approximation) ----

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = ld(inp, i);
    st(out, i, 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = ld(inp, i);
    const float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    st(dinp, i, local * ld(dout, i));
  }
}

// ---- attention ----

constexpr int kAttnThreads = 128;

// The causal softmax's middle, shared by both attentions' row kernels: row[t2] = exp(row[t2] - m)
// for t2 <= t, and 1 / their sum over the block (the row's max m taken by the caller).
__device__ float causal_softmax_exp(float* row, int t, float m, float* scratch) {
  float local_sum = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float e = expf(row[t2] - m);
    row[t2] = e;
    local_sum += e;
  }
  return 1.0f / block_sum(local_sum, scratch);
}

// One block per (query t, head h, batch b). Shared: the row's scores [T], then q [hs].
template <typename T>
__global__ void attention_forward_kernel(T* out, float* att, const T* qkv, int Tn, int C, int H, float scale) {
  extern __shared__ float shared[];
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hs = C / H, C3 = 3 * C;
  float* row = shared;
  float* q = shared + Tn;
  const T* base = qkv + int64_t(b) * Tn * C3;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) q[i] = ld(base, int64_t(t) * C3 + h * hs + i);
  __syncthreads();
  float local_max = -INFINITY;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const T* k = base + int64_t(t2) * C3 + C + h * hs;
    float s = 0.0f;
    for (int i = 0; i < hs; ++i) s += q[i] * ld(k, i);
    s *= scale;
    row[t2] = s;
    local_max = fmaxf(local_max, s);
  }
  const float inv = causal_softmax_exp(row, t, block_max(local_max, scratch), scratch);
  float* att_row = att + ((int64_t(b) * H + h) * Tn + t) * Tn;
  for (int t2 = threadIdx.x; t2 < Tn; t2 += blockDim.x) {
    const float p = t2 <= t ? row[t2] * inv : 0.0f;  // zeros above the diagonal, as the reference
    att_row[t2] = p;
    if (t2 <= t) row[t2] = p;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float y = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) y += row[t2] * ld(base, int64_t(t2) * C3 + 2 * C + h * hs + i);
    st(out, (int64_t(b) * Tn + t) * C + h * hs + i, y);
  }
}

// Backward, rows: for query t, datt[t2] = dy_t . v[t2]; g = att * (datt - sum att*datt) * scale
// (the softmax's input gradient, kept in `scratch` for the column kernel); dq[t] = sum g * k[t2].
template <typename T>
__global__ void attention_backward_rows_kernel(T* dqkv, float* scratch_g, const T* dout, const T* qkv,
                                               const float* att, int Tn, int C, int H, float scale) {
  extern __shared__ float shared[];
  __shared__ float red[32];
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hs = C / H, C3 = 3 * C;
  float* g = shared;        // [T]
  float* dy = shared + Tn;  // [hs]
  const T* base = qkv + int64_t(b) * Tn * C3;
  const int64_t bh = int64_t(b) * H + h;
  const float* att_row = att + (bh * Tn + t) * Tn;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) dy[i] = ld(dout, (int64_t(b) * Tn + t) * C + h * hs + i);
  __syncthreads();
  float local = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const T* v = base + int64_t(t2) * C3 + 2 * C + h * hs;
    float s = 0.0f;
    for (int i = 0; i < hs; ++i) s += dy[i] * ld(v, i);
    g[t2] = s;
    local += att_row[t2] * s;
  }
  const float dot = block_sum(local, red);
  float* g_row = scratch_g + (bh * Tn + t) * Tn;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    const float gi = att_row[t2] * (g[t2] - dot) * scale;
    g[t2] = gi;
    g_row[t2] = gi;
  }
  __syncthreads();
  T* dbase = dqkv + int64_t(b) * Tn * C3;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float dq = 0.0f;
    for (int t2 = 0; t2 <= t; ++t2) dq += g[t2] * ld(base, int64_t(t2) * C3 + C + h * hs + i);
    st(dbase, int64_t(t) * C3 + h * hs + i, dq);
  }
}

// Backward, columns: for key/value position t2, dv[t2] = sum over t >= t2 of att[t, t2] * dy_t and
// dk[t2] = sum over t >= t2 of g[t, t2] * q_t, t in increasing order as in the reference.
template <typename T>
__global__ void attention_backward_cols_kernel(T* dqkv, const float* scratch_g, const T* dout, const T* qkv,
                                               const float* att, int Tn, int C, int H) {
  const int t2 = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hs = C / H, C3 = 3 * C;
  const T* base = qkv + int64_t(b) * Tn * C3;
  T* dbase = dqkv + int64_t(b) * Tn * C3;
  const int64_t bh = int64_t(b) * H + h;
  for (int i = threadIdx.x; i < hs; i += blockDim.x) {
    float dv = 0.0f, dk = 0.0f;
    for (int t = t2; t < Tn; ++t) {
      const int64_t at = (bh * Tn + t) * Tn + t2;
      dv += att[at] * ld(dout, (int64_t(b) * Tn + t) * C + h * hs + i);
      dk += scratch_g[at] * ld(base, int64_t(t) * C3 + h * hs + i);
    }
    st(dbase, int64_t(t2) * C3 + C + h * hs + i, dk);
    st(dbase, int64_t(t2) * C3 + 2 * C + h * hs + i, dv);
  }
}

// The softmax halves of the GEMM attention (gemm.h attention_forward / attention_backward):
// one block per (query t, head h, batch b), over a row of att [B, H, T, T] in place.
// Forward: scaled scores in, probabilities out (zeros above the diagonal, as the reference keeps).
__global__ void causal_softmax_rows_kernel(float* att, int Tn, int H) {
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  float* row = att + ((int64_t(b) * H + h) * Tn + t) * Tn;
  float local_max = -INFINITY;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) local_max = fmaxf(local_max, row[t2]);
  const float inv = causal_softmax_exp(row, t, block_max(local_max, scratch), scratch);
  for (int t2 = threadIdx.x; t2 < Tn; t2 += blockDim.x) row[t2] = t2 <= t ? row[t2] * inv : 0.0f;
}

// Backward: datt = dy . v in `grad` (in place) becomes the scores' gradient
// g = att * (datt - sum att*datt) * scale, zero above the diagonal.
__global__ void causal_softmax_backward_rows_kernel(float* grad, const float* att, int Tn, int H, float scale) {
  __shared__ float scratch[32];
  const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t off = ((int64_t(b) * H + h) * Tn + t) * Tn;
  float* g = grad + off;
  const float* p = att + off;
  float local = 0.0f;
  for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) local += p[t2] * g[t2];
  const float dot = block_sum(local, scratch);
  for (int t2 = threadIdx.x; t2 < Tn; t2 += blockDim.x) g[t2] = t2 <= t ? p[t2] * (g[t2] - dot) * scale : 0.0f;
}

// ---- cross-entropy ----

template <typename T, typename TO = T>
__global__ void cross_entropy_kernel(float* losses, TO* dlogits, const T* logits, const int32_t* targets, int64_t V,
                                     int64_t stride, float dscale) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * stride;
  const int32_t target = targets[row];
  const float target_logit = ld(x, target);  // read before any write (dlogits may be logits)
  float local_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) local_max = fmaxf(local_max, ld(x, i));
  const float m = block_max(local_max, scratch);
  float local_sum = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) local_sum += expf(ld(x, i) - m);
  const float sum = block_sum(local_sum, scratch);  // its barriers order every read before the writes
  if (threadIdx.x == 0) losses[row] = logf(sum) + m - target_logit;
  if (dlogits == nullptr) return;
  const float inv = (1.0f / sum) * dscale;
  TO* d = dlogits + row * stride;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    float p = expf(ld(x, i) - m) * inv;
    if (i == target) p -= dscale;
    st(d, i, p);
  }
}

// ---- embeddings ----

template <typename T>
__global__ void embedding_forward_kernel(T* x, const int32_t* tokens, const T* wte, const T* wpe, int64_t N, int64_t T_,
                                         int64_t C) {
  const int64_t n_el = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_el; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    st(x, i, ld(wte, int64_t(tokens[n]) * C + c) + ld(wpe, (n % T_) * C + c));
  }
}

// dwpe[t, c] += dx[b, t, c] for b in order: the same additions, in the same order, as the reference.
template <typename T>
__global__ void embedding_backward_wpe_kernel(float* dwpe, const T* dx, int64_t B, int64_t T_, int64_t C) {
  const int64_t n_el = T_ * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_el; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i % C;
    float v = dwpe[i];
    for (int64_t b = 0; b < B; ++b) v += ld(dx, (b * T_ + t) * C + c);
    dwpe[i] = v;
  }
}

// Block (channel chunk, token group): a thread per channel walks every position in order and adds
// the positions whose token falls in its group; each dwte element has exactly one writer thread.
constexpr int kEmbedGroups = 32;
constexpr int kEmbedThreads = 128;

template <typename T>
__global__ void embedding_backward_wte_kernel(float* dwte, const int32_t* tokens, const T* dx, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int group = blockIdx.y;
  if (c >= C) return;
  for (int64_t n = 0; n < N; ++n) {
    const int32_t tok = tokens[n];
    if (tok % kEmbedGroups != group) continue;
    dwte[int64_t(tok) * C + c] += ld(dx, n * C + c);
  }
}

void check_attention_shape(const char* op, int64_t B, int64_t T, int64_t C, int64_t H) {
  require(B >= 0 && T >= 0 && C >= 0 && H >= 1, op, "B, T, C must be >= 0 and H >= 1");
  require(C % H == 0, op, "C must be a multiple of H");
  require(T <= kMaxAttnT, op, "T must be at most 8192");
  require(C / H <= kMaxHeadSize, op, "the head size C / H must be at most 1024");
  require(B <= kMaxGridY && H <= kMaxGridY, op, "B and H must be at most 65535 (grid dimensions)");
  require(3 * C <= INT32_MAX && T * 3 * C <= INT32_MAX, op, "a sequence of qkv must have fewer than 2^31 elements");
}

}  // namespace

// ---- host entry points ----

void cast(void* dst, DType dst_t, const void* src, DType src_t, int64_t n, cudaStream_t stream) {
  require(n >= 0, "cast", "n must be >= 0");
  if (n == 0) return;
  if (dst_t == src_t) {
    dispatch(src_t, "cast", [&](auto) {});  // refuses int32 like every other path
    if (dst != src)
      check(cudaMemcpyAsync(dst, src, size_t(n) * trainer::dtype_size(src_t), cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync (cast)");
    return;
  }
  dispatch(src_t, "cast", [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch(dst_t, "cast", [&](auto d_tag) {
      using D = decltype(d_tag);
      cast_kernel<S, D><<<grid_for(n), kThreads, 0, stream>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
    });
  });
  check_launch("cast_kernel");
}

void cast_segments(const CastSegment* segments, int count, cudaStream_t stream) {
  require(count >= 0 && count <= kMaxCastSegments, "cast_segments", "at most kMaxCastSegments segments");
  SegmentTable table{};
  int64_t longest = 0;
  for (int i = 0; i < count; ++i) {
    const CastSegment& s = segments[i];
    require(s.n >= 0, "cast_segments", "a segment's n must be >= 0");
    require(s.n == 0 || (s.src != nullptr && s.dst != nullptr), "cast_segments", "a segment's pointers are null");
    int kind = 0;
    dispatch(s.dst_t, "cast_segments", [&](auto tag) {
      using D = decltype(tag);
      kind = std::is_same_v<D, float> ? 0 : std::is_same_v<D, __nv_bfloat16> ? 1 : 2;
    });
    table.e[i] = {s.src, s.dst, s.n, kind};
    longest = std::max(longest, s.n);
  }
  if (count == 0 || longest == 0) return;
  constexpr unsigned kMaxBlocks = 2048;  // per segment; the grid-stride loop covers the rest
  const dim3 grid(std::min(grid_for(longest), kMaxBlocks), unsigned(count));
  cast_segments_kernel<<<grid, kThreads, 0, stream>>>(table);
  check_launch("cast_segments_kernel");
}

void scale_inplace(void* x, DType t, int64_t n, float a, cudaStream_t stream) {
  require(n >= 0, "scale_inplace", "n must be >= 0");
  if (n == 0) return;
  dispatch(t, "scale_inplace", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(x), n, a);
  });
  check_launch("scale_kernel");
}

void squared_norm(double* out, double* scratch, const void* x, DType t, int64_t n, cudaStream_t stream,
                  bool accumulate) {
  require(n >= 0, "squared_norm", "n must be >= 0");
  dispatch(t, "squared_norm", [&](auto tag) {
    using T = decltype(tag);
    squared_norm_partial_kernel<T><<<kSquaredNormBlocks, kThreads, 0, stream>>>(scratch, static_cast<const T*>(x), n);
  });
  check_launch("squared_norm_partial_kernel");
  squared_norm_final_kernel<<<1, 32, 0, stream>>>(out, scratch, kSquaredNormBlocks, accumulate);
  check_launch("squared_norm_final_kernel");
}

void column_sums_accumulate(float* sums, const void* in, int64_t rows, int64_t cols, DType t, cudaStream_t stream) {
  require(rows >= 0 && cols >= 0, "column_sums_accumulate", "rows and cols must be >= 0");
  if (rows == 0 || cols == 0) return;
  dispatch(t, "column_sums_accumulate", [&](auto tag) {
    using T = decltype(tag);
    column_sums_kernel<T><<<column_blocks<T>(cols), kColThreads, 0, stream>>>(sums, static_cast<const T*>(in), rows, cols);
  });
  check_launch("column_sums_kernel");
}

void add_bias_rows(void* out, const void* bias, int64_t N, int64_t OC, bool accumulate, DType t, cudaStream_t stream) {
  require(N >= 0 && OC >= 0, "add_bias_rows", "N and OC must be >= 0");
  if (N == 0 || OC == 0) return;
  dispatch(t, "add_bias_rows", [&](auto tag) {
    using T = decltype(tag);
    add_bias_rows_kernel<T><<<grid_for(N * OC), kThreads, 0, stream>>>(static_cast<T*>(out),
                                                                       static_cast<const T*>(bias), N, OC, accumulate);
  });
  check_launch("add_bias_rows_kernel");
}

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b, int64_t N,
                       int64_t C, DType t, cudaStream_t stream) {
  require(N >= 0 && C >= 1 && C <= INT32_MAX, "layernorm_forward", "N must be >= 0 and 1 <= C < 2^31");
  require(N <= INT32_MAX, "layernorm_forward", "N must be below 2^31 (one block per row)");
  if (N == 0) return;
  dispatch(t, "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_kernel<T><<<unsigned(N), kRowThreads, 0, stream>>>(
        static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp), static_cast<const T*>(w),
        static_cast<const T*>(b), int(C));
  });
  check_launch("layernorm_forward_kernel");
}

void layernorm_forward(void* out, DType out_t, float* mean, float* rstd, const void* inp, const void* w, const void* b,
                       int64_t N, int64_t C, DType t, cudaStream_t stream) {
  if (out_t == t) return layernorm_forward(out, mean, rstd, inp, w, b, N, C, t, stream);
  require(N >= 0 && C >= 1 && C <= INT32_MAX, "layernorm_forward", "N must be >= 0 and 1 <= C < 2^31");
  require(N <= INT32_MAX, "layernorm_forward", "N must be below 2^31 (one block per row)");
  if (N == 0) return;
  dispatch(t, "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch(out_t, "layernorm_forward", [&](auto out_tag) {
      using TO = decltype(out_tag);
      layernorm_forward_kernel<T, TO><<<unsigned(N), kRowThreads, 0, stream>>>(
          static_cast<TO*>(out), mean, rstd, static_cast<const T*>(inp), static_cast<const T*>(w),
          static_cast<const T*>(b), int(C));
    });
  });
  check_launch("layernorm_forward_kernel");
}

void layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const void* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C, bool accumulate_dinp, DType t,
                        cudaStream_t stream) {
  require(N >= 0 && C >= 1 && C <= INT32_MAX, "layernorm_backward", "N must be >= 0 and 1 <= C < 2^31");
  require(N <= INT32_MAX, "layernorm_backward", "N must be below 2^31 (one block per row)");
  if (N == 0) return;
  dispatch(t, "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    layernorm_backward_dinp_kernel<T><<<unsigned(N), kRowThreads, 0, stream>>>(
        static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), static_cast<const T*>(w), mean,
        rstd, int(C), accumulate_dinp);
    check_launch("layernorm_backward_dinp_kernel");
    layernorm_backward_params_kernel<T><<<column_blocks<T>(C), kColThreads, 0, stream>>>(
        dw, db, static_cast<const T*>(dout), static_cast<const T*>(inp), mean, rstd, N, C);
    check_launch("layernorm_backward_params_kernel");
  });
}

void gelu_forward(void* out, const void* inp, int64_t n, DType t, cudaStream_t stream) {
  require(n >= 0, "gelu_forward", "n must be >= 0");
  if (n == 0) return;
  dispatch(t, "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    gelu_forward_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(inp), n);
  });
  check_launch("gelu_forward_kernel");
}

void gelu_backward(void* dinp, const void* inp, const void* dout, int64_t n, DType t, cudaStream_t stream) {
  require(n >= 0, "gelu_backward", "n must be >= 0");
  if (n == 0) return;
  dispatch(t, "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(dinp), static_cast<const T*>(inp),
                                                                  static_cast<const T*>(dout), n);
  });
  check_launch("gelu_backward_kernel");
}

void attention_forward(void* out, float* att, const void* qkv, int64_t B, int64_t T, int64_t C, int64_t H, DType t,
                       cudaStream_t stream) {
  check_attention_shape("attention_forward", B, T, C, H);
  if (B == 0 || T == 0 || C == 0) return;
  const size_t shared = size_t(T + C / H) * sizeof(float);
  const float scale = 1.0f / std::sqrt(float(C / H));
  dispatch(t, "attention_forward", [&](auto tag) {
    using T_ = decltype(tag);
    attention_forward_kernel<T_><<<dim3(unsigned(T), unsigned(H), unsigned(B)), kAttnThreads, shared, stream>>>(
        static_cast<T_*>(out), att, static_cast<const T_*>(qkv), int(T), int(C), int(H), scale);
  });
  check_launch("attention_forward_kernel");
}

void attention_backward(void* dqkv, float* scratch, const void* dout, const void* qkv, const float* att, int64_t B,
                        int64_t T, int64_t C, int64_t H, DType t, cudaStream_t stream) {
  check_attention_shape("attention_backward", B, T, C, H);
  if (B == 0 || T == 0 || C == 0) return;
  const size_t shared = size_t(T + C / H) * sizeof(float);
  const float scale = 1.0f / std::sqrt(float(C / H));
  const dim3 grid{unsigned(T), unsigned(H), unsigned(B)};
  dispatch(t, "attention_backward", [&](auto tag) {
    using T_ = decltype(tag);
    attention_backward_rows_kernel<T_><<<grid, kAttnThreads, shared, stream>>>(
        static_cast<T_*>(dqkv), scratch, static_cast<const T_*>(dout), static_cast<const T_*>(qkv), att, int(T), int(C),
        int(H), scale);
    check_launch("attention_backward_rows_kernel");
    attention_backward_cols_kernel<T_><<<grid, 64, 0, stream>>>(static_cast<T_*>(dqkv), scratch,
                                                                static_cast<const T_*>(dout),
                                                                static_cast<const T_*>(qkv), att, int(T), int(C), int(H));
    check_launch("attention_backward_cols_kernel");
  });
}

void causal_softmax_rows(float* att, int64_t B, int64_t T, int64_t H, cudaStream_t stream) {
  check_attention_shape("causal_softmax_rows", B, T, H, H);
  if (B == 0 || T == 0) return;
  causal_softmax_rows_kernel<<<dim3(unsigned(T), unsigned(H), unsigned(B)), kAttnThreads, 0, stream>>>(att, int(T),
                                                                                                        int(H));
  check_launch("causal_softmax_rows_kernel");
}

void causal_softmax_backward_rows(float* grad, const float* att, int64_t B, int64_t T, int64_t H, float scale,
                                  cudaStream_t stream) {
  check_attention_shape("causal_softmax_backward_rows", B, T, H, H);
  if (B == 0 || T == 0) return;
  causal_softmax_backward_rows_kernel<<<dim3(unsigned(T), unsigned(H), unsigned(B)), kAttnThreads, 0, stream>>>(
      grad, att, int(T), int(H), scale);
  check_launch("causal_softmax_backward_rows_kernel");
}

void cross_entropy_forward(float* losses, const void* logits, const int32_t* targets, int64_t N, int64_t V, DType t,
                           cudaStream_t stream) {
  require(N >= 0 && V >= 1 && N <= INT32_MAX, "cross_entropy_forward", "N must be in [0, 2^31) and V >= 1");
  if (N == 0) return;
  dispatch(t, "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<unsigned(N), kCrossEntropyThreads, 0, stream>>>(
        losses, static_cast<T*>(nullptr), static_cast<const T*>(logits), targets, V, V, 0.0f);
  });
  check_launch("cross_entropy_kernel");
}

void cross_entropy_forward_backward(float* losses, void* dlogits, const void* logits, const int32_t* targets,
                                    int64_t N, int64_t V, float dscale, DType t, cudaStream_t stream, int64_t ld) {
  require(N >= 0 && V >= 1 && N <= INT32_MAX, "cross_entropy_forward_backward", "N must be in [0, 2^31) and V >= 1");
  require(dlogits != nullptr, "cross_entropy_forward_backward", "dlogits must not be null");
  if (ld == 0) ld = V;
  require(ld >= V, "cross_entropy_forward_backward", "the row stride ld must be >= V");
  if (N == 0) return;
  dispatch(t, "cross_entropy_forward_backward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<unsigned(N), kCrossEntropyThreads, 0, stream>>>(
        losses, static_cast<T*>(dlogits), static_cast<const T*>(logits), targets, V, ld, dscale);
  });
  check_launch("cross_entropy_kernel");
}

void cross_entropy_forward_backward(float* losses, void* dlogits, DType dlogits_t, const void* logits,
                                    const int32_t* targets, int64_t N, int64_t V, float dscale, DType t,
                                    cudaStream_t stream, int64_t ld) {
  if (dlogits_t == t) return cross_entropy_forward_backward(losses, dlogits, logits, targets, N, V, dscale, t, stream, ld);
  require(N >= 0 && V >= 1 && N <= INT32_MAX, "cross_entropy_forward_backward", "N must be in [0, 2^31) and V >= 1");
  require(dlogits != nullptr && dlogits != logits, "cross_entropy_forward_backward",
          "dlogits of another dtype must be a buffer of its own");
  if (ld == 0) ld = V;
  require(ld >= V, "cross_entropy_forward_backward", "the row stride ld must be >= V");
  if (N == 0) return;
  dispatch(t, "cross_entropy_forward_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch(dlogits_t, "cross_entropy_forward_backward", [&](auto out_tag) {
      using TO = decltype(out_tag);
      cross_entropy_kernel<T, TO><<<unsigned(N), kCrossEntropyThreads, 0, stream>>>(
          losses, static_cast<TO*>(dlogits), static_cast<const T*>(logits), targets, V, ld, dscale);
    });
  });
  check_launch("cross_entropy_kernel");
}

void embedding_forward(void* x, const int32_t* tokens, const void* wte, const void* wpe, int64_t B, int64_t T,
                       int64_t C, DType t, cudaStream_t stream) {
  require(B >= 0 && T >= 1 && C >= 0, "embedding_forward", "B, C must be >= 0 and T >= 1");
  if (B == 0 || C == 0) return;
  dispatch(t, "embedding_forward", [&](auto tag) {
    using T_ = decltype(tag);
    embedding_forward_kernel<T_><<<grid_for(B * T * C), kThreads, 0, stream>>>(
        static_cast<T_*>(x), tokens, static_cast<const T_*>(wte), static_cast<const T_*>(wpe), B * T, T, C);
  });
  check_launch("embedding_forward_kernel");
}

void embedding_backward(float* dwte, float* dwpe, const int32_t* tokens, const void* dx, int64_t B, int64_t T,
                        int64_t C, DType t, cudaStream_t stream) {
  require(B >= 0 && T >= 1 && C >= 0, "embedding_backward", "B, C must be >= 0 and T >= 1");
  if (B == 0 || C == 0) return;
  dispatch(t, "embedding_backward", [&](auto tag) {
    using T_ = decltype(tag);
    const dim3 grid(unsigned((C + kEmbedThreads - 1) / kEmbedThreads), kEmbedGroups);
    embedding_backward_wte_kernel<T_><<<grid, kEmbedThreads, 0, stream>>>(dwte, tokens, static_cast<const T_*>(dx),
                                                                          B * T, C);
    check_launch("embedding_backward_wte_kernel");
    embedding_backward_wpe_kernel<T_><<<grid_for(T * C), kThreads, 0, stream>>>(dwpe, static_cast<const T_*>(dx), B, T, C);
    check_launch("embedding_backward_wpe_kernel");
  });
}

// ---- AdamW and add_inplace: bit-identical twins of the CPU (see kernels.h) ----

namespace {

// core/dtype_bits.h's conversions (the CUDA intrinsics agree for numbers but canonicalize NaNs,
// and these must match the CPU's bits).
using trainer::bits::bf16_to_float;
using trainer::bits::float_to_bf16;
using trainer::bits::float_to_fp16;
using trainer::bits::fp16_to_float;

// Low: 0 none, 1 bf16, 2 fp16. One IEEE operation per step, in cpu_adam_kernel.h's order.
template <int Low>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, uint16_t* lo, int64_t n, AdamWConsts c) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    float pi = __fmul_rn(p[i], c.decay);                                                  // p * decay
    const float mi = __fadd_rn(__fmul_rn(m[i], c.beta1), __fmul_rn(gi, c.one_minus_beta1));  // m*b1 + g*(1-b1)
    const float vi =
        __fadd_rn(__fmul_rn(v[i], c.beta2), __fmul_rn(__fmul_rn(gi, gi), c.one_minus_beta2));  // v*b2 + g*g*(1-b2)
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bias_correction2_sqrt), c.eps);  // sqrt(v)/bc2 + eps
    pi = __fsub_rn(pi, __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));                      // p -= s * (m/denom)
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (Low == 1) lo[i] = float_to_bf16(pi);
    if constexpr (Low == 2) lo[i] = float_to_fp16(pi);
  }
}

__global__ void add_inplace_f32_kernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __fadd_rn(dst[i], src[i]);
}

template <bool Bf16>
__global__ void add_inplace_low_kernel(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (Bf16) {
      dst[i] = float_to_bf16(__fadd_rn(bf16_to_float(dst[i]), src[i]));
    } else {
      dst[i] = float_to_fp16(__fadd_rn(fp16_to_float(dst[i]), src[i]));
    }
  }
}

}  // namespace

void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, const AdamWConsts& c, void* low_out,
                DType low_t, cudaStream_t stream) {
  require(n >= 0, "adamw_step", "n must be >= 0");
  require(low_t == DType::F32 || low_t == DType::BF16 || low_t == DType::F16, "adamw_step",
          "the fused output's dtype must be fp32 (none), bf16 or fp16");
  require(low_t == DType::F32 || low_out != nullptr, "adamw_step", "a bf16/fp16 output was asked for but low_out is null");
  if (n == 0) return;
  uint16_t* lo = static_cast<uint16_t*>(low_out);
  switch (low_t) {
    case DType::BF16: adamw_kernel<1><<<grid_for(n), kThreads, 0, stream>>>(params, grads, m, v, lo, n, c); break;
    case DType::F16: adamw_kernel<2><<<grid_for(n), kThreads, 0, stream>>>(params, grads, m, v, lo, n, c); break;
    default: adamw_kernel<0><<<grid_for(n), kThreads, 0, stream>>>(params, grads, m, v, nullptr, n, c); break;
  }
  check_launch("adamw_kernel");
}

void add_inplace(void* dst, DType dst_t, const float* src, int64_t n, cudaStream_t stream) {
  require(n >= 0, "add_inplace", "n must be >= 0");
  require(dst_t == DType::F32 || dst_t == DType::BF16 || dst_t == DType::F16, "add_inplace",
          "dtype must be fp32, bf16 or fp16");
  if (n == 0) return;
  switch (dst_t) {
    case DType::BF16:
      add_inplace_low_kernel<true><<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint16_t*>(dst), src, n);
      break;
    case DType::F16:
      add_inplace_low_kernel<false><<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint16_t*>(dst), src, n);
      break;
    default: add_inplace_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<float*>(dst), src, n); break;
  }
  check_launch("add_inplace_kernel");
}

}  // namespace zt::cuda
