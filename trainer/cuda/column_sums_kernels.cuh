// trainer/cuda/column_sums_kernels.cuh: the column sums of kernels.cu (bias gradients; LayerNorm's
// weight and bias gradients), in a header of their own so that tests/cuda_emulation/ compiles the
// same text on the CPU against an emulation of CUDA's threads and barriers and runs it without a
// GPU. The includer provides ld<T>(p, i) (an element loaded as fp32) first; everything here is in
// an unnamed namespace of the includer's.
//
// One block of kColThreads (1024) threads per kColWidth<T> adjacent columns: 32 bytes of a row,
// one memory sector (fp32: 8 columns, 16-bit types: 16). The threads are kColLanes<T> row lanes
// of those columns (thread t: column t % width, lane t / width), so each warp reads whole sectors
// of 4 (fp32) or 2 rows at once. Lane y sums rows y, y + lanes, y + 2 lanes, ... in order; the
// lanes' sums are then added by a fixed tree in shared memory (lane y + s into lane y for
// s = lanes / 2, ..., 1). The order depends on the shapes only, so the sums repeat bit for bit.
// (Blocks of 32 columns x 32 lanes, as before, gave width / 32 blocks: 24 at GPT-2 124M's 768
// columns on a GPU of 132 SMs; these give width / 8: 96.)
// 1D blocks (threadIdx.x only), which is all the emulation provides.

constexpr int kColThreads = 1024;
template <typename T>
constexpr int kColWidth = int(32 / sizeof(T));
template <typename T>
constexpr int kColLanes = kColThreads / kColWidth<T>;

// part[k][0][x] += part[k][y][x] over the lanes y by the fixed tree, for each of the K arrays.
// Every thread of the block calls it (it holds barriers); the caller's writes to part come first.
template <int K, int Lanes, int Width>
__device__ void sum_lanes(float (*part)[Lanes][Width], int y, int x) {
  for (int s = Lanes / 2; s > 0; s >>= 1) {
    __syncthreads();
    if (y < s)
      for (int k = 0; k < K; ++k) part[k][y][x] += part[k][y + s][x];
  }
  __syncthreads();
}

// sums[c] += sum over rows of in[r, c] (in: rows x cols, row-major).
template <typename T>
__global__ void __launch_bounds__(kColThreads) column_sums_kernel(float* sums, const T* in, int64_t rows, int64_t cols) {
  constexpr int W = kColWidth<T>, L = kColLanes<T>;
  __shared__ float part[1][L][W];
  const int x = int(threadIdx.x) % W, y = int(threadIdx.x) / W;
  const int64_t c = blockIdx.x * int64_t(W) + x;
  float acc = 0.0f;
  if (c < cols)
    for (int64_t r = y; r < rows; r += L) acc += ld(in, r * cols + c);
  part[0][y][x] = acc;
  sum_lanes<1, L, W>(part, y, x);
  if (y == 0 && c < cols) sums[c] += part[0][0][x];
}

// dw[c] += sum over rows n of (inp[n, c] - mean[n]) * rstd[n] * dout[n, c]; db[c] += sum of dout[n, c].
template <typename T>
__global__ void __launch_bounds__(kColThreads)
    layernorm_backward_params_kernel(float* dw, float* db, const T* dout, const T* inp, const float* mean,
                                     const float* rstd, int64_t N, int64_t C) {
  constexpr int W = kColWidth<T>, L = kColLanes<T>;
  __shared__ float part[2][L][W];  // [0]: dw, [1]: db
  const int x = int(threadIdx.x) % W, y = int(threadIdx.x) / W;
  const int64_t c = blockIdx.x * int64_t(W) + x;
  float aw = 0.0f, ab = 0.0f;
  if (c < C)
    for (int64_t n = y; n < N; n += L) {
      const float dy = ld(dout, n * C + c);
      aw += (ld(inp, n * C + c) - mean[n]) * rstd[n] * dy;
      ab += dy;
    }
  part[0][y][x] = aw;
  part[1][y][x] = ab;
  sum_lanes<2, L, W>(part, y, x);
  if (y == 0 && c < C) {
    dw[c] += part[0][0][x];
    db[c] += part[1][0][x];
  }
}

// Blocks for `cols` columns of T.
template <typename T>
unsigned column_blocks(int64_t cols) {
  return unsigned((cols + kColWidth<T> - 1) / kColWidth<T>);
}
