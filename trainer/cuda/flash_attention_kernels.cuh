// trainer/cuda/flash_attention_kernels.cuh: the device code of flash_attention.cu, in a header of
// its own so that tests/cuda_emulation/ can compile the same text on the CPU against an emulation
// of the CUDA features it uses (threads, barriers, shuffles, WMMA) and run it without a GPU.
// The includer provides them first, and <type_traits>: flash_attention.cu includes <cuda_bf16.h>
// and <mma.h>; both provide dynamic_shared(), the block's dynamic shared memory. Everything here
// is in an unnamed namespace of the includer's namespace.
//
// One block of 4 warps per (batch*head, tile of 64 rows). Each warp owns 16 rows of the tile for
// the products it starts (WMMA 16x16x16), and each thread owns one row r = tid / 2 of those 16
// and every other column from tid % 2 for the elementwise work, so the only block-wide barriers
// are around the tiles all warps read (K, V; in the backward also Q, dO, P, dS).
//  forward  (grid: B*H x query tiles, the longest rows first): per key tile, S = Q K^T, online
//           softmax of the row (max and sum over the two threads of a row by one shuffle), P in
//           bf16, O = O * alpha + P V with O in registers; at the end O / l and lse = m + log l.
//  backward (grid: B*H x key tiles): per query tile from the key tile on, S = Q K^T and
//           dP = dO V^T, then P = exp(S scale - lse) and dS = P (dP - dsum) in bf16; dV += P^T dO
//           and dK += dS^T Q stay in WMMA accumulators over the query tiles; dQ += scale dS K
//           goes to global memory with atomicAdd. dsum = rowsum(bf16(dO) * O) by a kernel before.
// The few elementwise products that feed a rounding to bf16 or the running sums are written as
// __fmul_rn / __fadd_rn, so nvcc cannot fuse them into FMAs the CPU twin does not have.
// Shared memory rows are padded (bf16: +8, fp32: +4 elements), which keeps every fragment
// pointer 32-byte aligned and spreads the elementwise accesses over the banks.

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kTile = 64;     // rows of a query or key tile (model::kFlashTile)
constexpr int kThreads = 128;  // 4 warps x 16 rows
constexpr int kPadB = 8;      // bf16 row padding: the WMMA ldm stays a multiple of 8
constexpr int kPadF = 4;      // fp32 row padding: a multiple of 4

template <int D>
struct alignas(32) ForwardShared {
  bf16 q[kTile][D + kPadB];
  bf16 kv[kTile][D + kPadB];  // the key tile, then the same tile's values
  float s[kTile][kTile + kPadF];  // scores, then P V (each warp its own 16 rows)
  bf16 p[kTile][kTile + kPadB];
};

template <int D>
struct alignas(32) BackwardShared {
  bf16 k[kTile][D + kPadB], v[kTile][D + kPadB], q[kTile][D + kPadB], g[kTile][D + kPadB];  // g: dO
  bf16 p[kTile][kTile + kPadB], ds[kTile][kTile + kPadB];
  float s[kTile][kTile + kPadF], dp[kTile][kTile + kPadF];  // S and dP; later dQ, dK, dV on the way out
  float lse[kTile], dsum[kTile];
};

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename Layout>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, Layout>;
template <typename Layout>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, Layout>;

// Rows row0.. of a tile from a [T, ld] fp32 matrix (its first D columns), rounded to bf16 (as
// __float2bfloat16_rn: to nearest even), zeros past T. Four columns a load: src and ld are
// multiples of 4 floats (16 bytes; the launchers check the pointers, C = H * D is a multiple of 16).
template <int D>
__device__ void load_tile(bf16 (*dst)[D + kPadB], const float* src, int64_t ld, int row0, int Tn) {
  constexpr int kQuads = D / 4;
  for (int i = threadIdx.x; i < kTile * kQuads; i += kThreads) {
    const int r = i / kQuads, d = (i % kQuads) * 4, t = row0 + r;
    const float4 v =
        t < Tn ? *reinterpret_cast<const float4*>(src + int64_t(t) * ld + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    dst[r][d] = __float2bfloat16_rn(v.x);
    dst[r][d + 1] = __float2bfloat16_rn(v.y);
    dst[r][d + 2] = __float2bfloat16_rn(v.z);
    dst[r][d + 3] = __float2bfloat16_rn(v.w);
  }
}

// Rows 16*warp.. of out (fp32 [kTile][kTile + kPadF]) = rows 16*warp.. of a (bf16, K columns,
// row stride lda) times b (K x N): stored row by row at b[k * ldb + n] (LayoutB row_major), or
// transposed, b[n * ldb + k] (col_major: a tile's K^T or V^T from its rows). Every product of the
// kernels whose result the warp reads back from shared memory: S = Q K^T, dP = dO V^T, P V, dS K.
template <int K, int N, typename LayoutB>
__device__ void warp_rows_product(float (*out)[kTile + kPadF], const bf16* a, int lda, const bf16* b, int ldb,
                                  int warp) {
  constexpr bool kTransposed = std::is_same_v<LayoutB, wmma::col_major>;
  Acc acc[N / 16];
#pragma unroll
  for (int n = 0; n < N / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
  for (int kk = 0; kk < K; kk += 16) {
    FragA<wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + 16 * warp * lda + kk, lda);
#pragma unroll
    for (int n = 0; n < N / 16; ++n) {
      FragB<LayoutB> fb;
      wmma::load_matrix_sync(fb, kTransposed ? b + 16 * n * ldb + kk : b + kk * ldb + 16 * n, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
#pragma unroll
  for (int n = 0; n < N / 16; ++n)
    wmma::store_matrix_sync(&out[16 * warp][16 * n], acc[n], kTile + kPadF, wmma::mem_row_major);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(float* out, float* lse, const float* qkv, int Tn, int C, int H, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  __shared__ ForwardShared<D> sm;
  const int bh = blockIdx.x, qt = int(gridDim.y) - 1 - int(blockIdx.y);  // the longest rows first
  const int b = bh / H, h = bh % H, C3 = 3 * C, q0 = qt * kTile;
  const float* base = qkv + int64_t(b) * Tn * C3 + int64_t(h) * D;
  const int warp = threadIdx.x >> 5, r = threadIdx.x >> 1, half = threadIdx.x & 1, t = q0 + r;
  load_tile<D>(sm.q, base, C3, q0, Tn);
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous values
    load_tile<D>(sm.kv, base + C, C3, k0, Tn);
    __syncthreads();
    warp_rows_product<D, kTile, wmma::col_major>(sm.s, &sm.q[0][0], D + kPadB, &sm.kv[0][0], D + kPadB,
                                                  warp);  // S = Q K^T, this warp's 16 rows
    __syncwarp();
    // Online softmax of row r: the two threads of the row meet by one shuffle (lanes 2r', 2r'+1).
    float mx = -INFINITY;
    for (int j = 0; j < kTile / 2; ++j) {
      const int c = 2 * j + half;
      if (k0 + c <= t) mx = fmaxf(mx, __fmul_rn(sm.s[r][c], scale));
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);  // finite: key 0 of the first tile is in every row
    float sum = 0.0f;
    for (int j = 0; j < kTile / 2; ++j) {
      const int c = 2 * j + half;
      const float e = k0 + c <= t ? expf(__fmul_rn(sm.s[r][c], scale) - m_new) : 0.0f;
      sum += e;
      sm.p[r][c] = __float2bfloat16_rn(e);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = __fadd_rn(__fmul_rn(l, alpha), sum);
    m = m_new;
    __syncthreads();  // every warp is done with the keys
    load_tile<D>(sm.kv, base + 2 * C, C3, k0, Tn);
    __syncthreads();
    warp_rows_product<kTile, D, wmma::row_major>(sm.s, &sm.p[0][0], kTile + kPadB, &sm.kv[0][0], D + kPadB,
                                                  warp);  // P V, this warp's 16 rows, into its rows of s
    __syncwarp();
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = __fadd_rn(__fmul_rn(o[i], alpha), sm.s[r][2 * i + half]);
  }
  if (t < Tn) {
    const float inv = 1.0f / l;
    float* y = out + (int64_t(b) * Tn + t) * C + int64_t(h) * D;
#pragma unroll
    for (int i = 0; i < D / 2; ++i) y[2 * i + half] = o[i] * inv;
    if (half == 0) lse[int64_t(bh) * Tn + t] = m + logf(l);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a GPU without bf16 tensor cores: fail loudly rather than leave out unwritten
#endif
}

// dsum[bh, t] = sum over the head's columns of bf16(dout) * out: one warp per row. dO is rounded
// as the backward's dP = dO V^T rounds it, so that dP - dsum is the difference of two sums of the
// same products where it should vanish (one key: P = 1, O = V, and the score gradient is zero;
// with fp32 dO here it came out as dO's rounding error, 1e-2 of dq on the H100).
__global__ void flash_dsum_kernel(float* dsum, const float* dout, const float* out, int Tn, int C, int H, int D,
                                  int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;  // the whole warp: `row` is the warp's
  const int64_t bh = row / Tn;
  const int t = int(row % Tn), b = int(bh / H), h = int(bh % H);
  const int64_t off = (int64_t(b) * Tn + t) * C + int64_t(h) * D;
  float acc = 0.0f;
  for (int d = lane; d < D; d += 32) acc += __bfloat162float(__float2bfloat16_rn(dout[off + d])) * out[off + d];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) dsum[row] = acc;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* dsum,
                          int Tn, int C, int H, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  BackwardShared<D>& sm = *reinterpret_cast<BackwardShared<D>*>(dynamic_shared());
  const int bh = blockIdx.x, kt = blockIdx.y, tiles = int(gridDim.y);  // key tile 0 has the most work: first
  const int b = bh / H, h = bh % H, C3 = 3 * C, k0 = kt * kTile;
  const float* base = qkv + int64_t(b) * Tn * C3 + int64_t(h) * D;
  const float* gbase = dout + int64_t(b) * Tn * C + int64_t(h) * D;
  float* dbase = dqkv + int64_t(b) * Tn * C3 + int64_t(h) * D;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = threadIdx.x >> 1, half = threadIdx.x & 1;
  load_tile<D>(sm.k, base + C, C3, k0, Tn);
  load_tile<D>(sm.v, base + 2 * C, C3, k0, Tn);
  Acc dk[D / 16], dv[D / 16];  // this warp's 16 key rows
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dk[n], 0.0f), wmma::fill_fragment(dv[n], 0.0f);
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // every warp is done with the previous query tile
    load_tile<D>(sm.q, base, C3, q0, Tn);
    load_tile<D>(sm.g, gbase, C, q0, Tn);
    for (int i = threadIdx.x; i < kTile; i += kThreads) {
      const int t = q0 + i;
      sm.lse[i] = t < Tn ? lse[int64_t(bh) * Tn + t] : 0.0f;
      sm.dsum[i] = t < Tn ? dsum[int64_t(bh) * Tn + t] : 0.0f;
    }
    __syncthreads();
    // S = Q K^T and dP = dO V^T, this warp's 16 query rows
    warp_rows_product<D, kTile, wmma::col_major>(sm.s, &sm.q[0][0], D + kPadB, &sm.k[0][0], D + kPadB, warp);
    warp_rows_product<D, kTile, wmma::col_major>(sm.dp, &sm.g[0][0], D + kPadB, &sm.v[0][0], D + kPadB, warp);
    __syncwarp();
    {  // P and dS of row r, in bf16
      const int t = q0 + r;
      const float L = sm.lse[r], Dr = sm.dsum[r];
      for (int j = 0; j < kTile / 2; ++j) {
        const int c = 2 * j + half;
        const float pr = k0 + c <= t && t < Tn ? expf(__fmul_rn(sm.s[r][c], scale) - L) : 0.0f;
        sm.p[r][c] = __float2bfloat16_rn(pr);
        sm.ds[r][c] = __float2bfloat16_rn(pr * (sm.dp[r][c] - Dr));
      }
    }
    __syncthreads();  // the next products read every query row of P and dS
    // dV += P^T dO and dK += dS^T Q over the tile's 64 query rows (P^T, dS^T: column-major loads).
#pragma unroll
    for (int kk = 0; kk < kTile; kk += 16) {
      FragA<wmma::col_major> ap, ads;
      wmma::load_matrix_sync(ap, &sm.p[kk][16 * warp], kTile + kPadB);
      wmma::load_matrix_sync(ads, &sm.ds[kk][16 * warp], kTile + kPadB);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        FragB<wmma::row_major> bg, bq;
        wmma::load_matrix_sync(bg, &sm.g[kk][16 * n], D + kPadB);
        wmma::load_matrix_sync(bq, &sm.q[kk][16 * n], D + kPadB);
        wmma::mma_sync(dv[n], ap, bg, dv[n]);
        wmma::mma_sync(dk[n], ads, bq, dk[n]);
      }
    }
    {  // dQ += scale * dS K, this warp's 16 query rows, through its rows of s. The warp's lanes take
       // consecutive elements of its rows, so each atomic instruction covers whole 128-byte lines of
       // a row (D >= 32: one row; D = 16: two), not one pair of floats in each of 16 rows.
      warp_rows_product<kTile, D, wmma::row_major>(sm.s, &sm.ds[0][0], kTile + kPadB, &sm.k[0][0], D + kPadB, warp);
      __syncwarp();
      for (int e = lane; e < 16 * D; e += 32) {
        const int row = 16 * warp + e / D, d = e % D, t = q0 + row;
        if (t < Tn) atomicAdd(dbase + int64_t(t) * C3 + d, scale * sm.s[row][d]);
      }
    }
  }
  // dK (scaled) and dV of this warp's key rows, through its own rows of s and dp.
  __syncwarp();
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::store_matrix_sync(&sm.s[16 * warp][16 * n], dk[n], kTile + kPadF, wmma::mem_row_major);
    wmma::store_matrix_sync(&sm.dp[16 * warp][16 * n], dv[n], kTile + kPadF, wmma::mem_row_major);
  }
  __syncwarp();
  for (int e = lane; e < 16 * D; e += 32) {  // consecutive elements of the warp's rows, as dQ's
    const int row = 16 * warp + e / D, d = e % D, key = k0 + row;
    if (key < Tn) {
      dbase[int64_t(key) * C3 + C + d] = scale * sm.s[row][d];
      dbase[int64_t(key) * C3 + 2 * C + d] = sm.dp[row][d];
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
