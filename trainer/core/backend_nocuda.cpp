// make_cuda_backend in a build without CUDA (ZT_CUDA=OFF or no toolkit): there is none.
#include "core/backend.h"

namespace zt::trainer {

std::unique_ptr<Backend> make_cuda_backend(int, std::string* why, CudaBackendOptions) {
  if (why) *why = "this build of zerotrace has no CUDA backend (configured with ZT_CUDA=OFF or without a CUDA toolkit)";
  return nullptr;
}

}  // namespace zt::trainer
