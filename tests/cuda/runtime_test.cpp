// zt_cuda on any machine (label unit): the availability check never crashes and explains a
// "no" (on a machine without a driver: the CUDA runtime's own words); CUDA calls without a GPU
// throw CudaError naming the call; argument checks come before any CUDA call.
#include <gtest/gtest.h>

#include <stdexcept>

#include "cuda/gemm.h"
#include "cuda/gemm_bf16.h"
#include "cuda/kernels.h"
#include "cuda/memory_sources.h"
#include "cuda/runtime.h"
#include "cuda/streams.h"

using namespace zt::cuda;
using zt::trainer::DType;

TEST(CudaRuntime, AvailabilityAnswersWithAReason) {
  std::string why = "unset";
  const bool ok = cuda_available(&why);
  EXPECT_EQ(cuda_available(), ok);  // cached, same answer
  EXPECT_EQ(versions().rfind("CUDA runtime 13.", 0), 0u) << versions();
  if (ok) {
    EXPECT_EQ(why, "");
    EXPECT_GT(device_count(), 0);
    EXPECT_NE(describe_device(0).find("compute capability"), std::string::npos);
  } else {
    EXPECT_EQ(device_count(), 0);
    // One of the reasons runtime.cu gives, never an empty one.
    const bool known = why.rfind("cudaGetDeviceCount: ", 0) == 0 || why.find("sees no device") != std::string::npos ||
                       why.find("compute capability") != std::string::npos ||
                       why.find("cannot run on GPU 0") != std::string::npos;
    EXPECT_TRUE(known) << why;
    std::cout << "[ info ] cuda_available() = false: " << why << "\n";
  }
}

TEST(CudaRuntime, WithoutAGpuCallsThrowCudaErrorNamingTheCall) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is here: this checks the path without one";
  try {
    DeviceBuffer b(1024);
    FAIL() << "cudaMalloc without a GPU";
  } catch (const CudaError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cudaMalloc: cudaError", 0), 0u) << e.what();
    EXPECT_NE(e.code(), cudaSuccess);
  }
  EXPECT_THROW(StreamSet s(0), CudaError);
  EXPECT_THROW(CudaDeviceSource src(0), CudaError);
  EXPECT_THROW(Blas blas(0), std::runtime_error);
  CudaPinnedSource pinned(1 << 20);
  EXPECT_THROW(pinned.allocate(4096), CudaError);  // not nullptr: "no room" is not what happened
  EXPECT_EQ(pinned.in_use(), 0u);
}

TEST(CudaRuntime, BadArgumentsAreRefusedBeforeAnyCudaCall) {
  // These hold without a GPU: the checks come first.
  EXPECT_THROW(gelu_forward(nullptr, nullptr, 10, DType::I32, nullptr), std::invalid_argument);
  EXPECT_THROW(cast(nullptr, DType::F32, nullptr, DType::I32, 10, nullptr), std::invalid_argument);
  EXPECT_THROW(scale_inplace(nullptr, DType::F32, -1, 1.0f, nullptr), std::invalid_argument);
  EXPECT_THROW(attention_forward(nullptr, nullptr, nullptr, 1, 4, 10, 3, DType::F32, nullptr), std::invalid_argument);
  EXPECT_THROW(attention_forward(nullptr, nullptr, nullptr, 1, 9000, 64, 1, DType::F32, nullptr), std::invalid_argument);
  EXPECT_THROW(layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 0, DType::BF16, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cross_entropy_forward_backward(nullptr, nullptr, nullptr, nullptr, 4, 10, 1.0f, DType::F16, nullptr),
               std::invalid_argument);
  try {
    attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 10, 3, DType::BF16, nullptr);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "attention_backward: C must be a multiple of H");
  }
  // Empty work launches nothing, so it succeeds anywhere.
  EXPECT_NO_THROW(gelu_forward(nullptr, nullptr, 0, DType::F32, nullptr));
  EXPECT_NO_THROW(layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, DType::F32, nullptr));
  EXPECT_NO_THROW(embedding_forward(nullptr, nullptr, nullptr, nullptr, 0, 4, 8, DType::BF16, nullptr));
}

// cuBLAS and cuBLASLt are loaded on first use, not linked (gemm.cpp, gemm_bf16.cpp): the toolkit
// this was built with has them, and every function the GEMMs call is found in them. A library that
// is not there is an error naming it and each place tried. No GPU needed.
TEST(CudaRuntime, CublasIsLoadedOnDemand) {
  std::string why;
  EXPECT_TRUE(zt::cuda::cublas_loadable(&why)) << why;
  EXPECT_TRUE(zt::cuda::cublaslt_loadable(&why)) << why;
  EXPECT_EQ(zt::cuda::open_cuda_library("libzt-no-such-library.so.1", "Nothing", &why), nullptr);
  EXPECT_EQ(why.rfind("Nothing could not be loaded: ", 0), 0u) << why;
  EXPECT_NE(why.find("libzt-no-such-library.so.1"), std::string::npos) << why;
  EXPECT_NE(why.find("; "), std::string::npos) << why;  // both places tried
}

// bf16 compute's cuBLASLt products (gemm_bf16.h) at GPT-2 350M's shapes (B*T = 8192, C = 1024) and
// the tiny preset's: cuBLASLt accepts every descriptor attribute, layout and preference they are
// given (its own checks of each one's type and size, on the host: no GPU needed). Whether it has an
// algorithm for them only a GPU says (the gpu tests print it).
TEST(CudaRuntime, Bf16ComputesCublasLtDescriptorsAreAccepted) {
  using zt::cuda::LtMatmul;
  alignas(256) static char mem[256 * 8];
  void* p[8];
  for (int i = 0; i < 8; ++i) p[i] = mem + 256 * i;  // stand-ins: only their alignment is looked at
  auto* f = static_cast<float*>(p[0]);
  for (int64_t C : {int64_t(1024), int64_t(64)}) {
    const int64_t N = C == 1024 ? 8192 : 111;
    SCOPED_TRACE("C = " + std::to_string(C));
    const size_t ws = size_t(32) << 20;
    EXPECT_NO_THROW(LtMatmul::check_descriptors(zt::cuda::bias_product(f, nullptr, p[1], p[2], f + 64, N, C, 3 * C), ws));
    EXPECT_NO_THROW(LtMatmul::check_descriptors(zt::cuda::bias_product(f, f + 128, p[1], p[2], f + 64, N, C, C), ws));
    EXPECT_NO_THROW(LtMatmul::check_descriptors(zt::cuda::gelu_product(p[3], p[4], p[1], p[2], p[5], N, C, 4 * C), ws));
    EXPECT_NO_THROW(LtMatmul::check_descriptors(zt::cuda::bias_product(f, f, p[1], p[2], f + 64, N, 4 * C, C), ws));
    EXPECT_NO_THROW(LtMatmul::check_descriptors(zt::cuda::dgelu_product(p[3], p[1], p[2], p[4], N, 4 * C, C), ws));
  }
  // The epilogues' own rules are ours, checked first: an aux matrix of leading dimension 12.
  EXPECT_THROW(LtMatmul::check_descriptors(zt::cuda::gelu_product(p[3], p[4], p[1], p[2], p[5], 2, 8, 12), 0),
               std::invalid_argument);
}

