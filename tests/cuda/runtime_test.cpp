// zt_cuda on any machine (label unit): the availability check never crashes and explains a
// "no" (on a machine without a driver: the CUDA runtime's own words); CUDA calls without a GPU
// throw CudaError naming the call; argument checks come before any CUDA call.
#include <gtest/gtest.h>

#include <stdexcept>

#include "cuda/gemm.h"
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

// cuBLAS is loaded on first use, not linked (gemm.cpp): the toolkit this was built with has it, and
// the five functions the GEMMs call are found in it. No GPU needed.
TEST(CudaRuntime, CublasIsLoadedOnDemand) {
  std::string why;
  EXPECT_TRUE(zt::cuda::cublas_loadable(&why)) << why;
}
