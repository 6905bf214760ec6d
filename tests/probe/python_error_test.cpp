// An uncaught Python exception as an error row (zt/probe/python_error.h): PyTorch's texts read
// as zt's own reproductions write them.
#include <gtest/gtest.h>

#include "zt/probe/python_error.h"

using zt::probe::classify_python_exception;

namespace {
const char* kReport =
    "Traceback (most recent call last):\n"
    "  File \"/work/train.py\", line 40, in <module>\n"
    "    main()\n"
    "  File \"/work/train.py\", line 31, in main\n"
    "    step(model, batch)\n"
    "  File \"/work/train.py\", line 12, in step\n"
    "    grad.mul_(scale)\n"
    "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cpu!\n";
}

TEST(PythonError, PyTorchsDeviceMismatchWithBothDevices) {
  const char* text = "Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cpu!";
  auto e = classify_python_exception("RuntimeError", text, kReport);
  EXPECT_EQ(e.kind, "device_mismatch");
  EXPECT_EQ(e.message, text);  // PyTorch's words, as zt's reproduction writes them
  EXPECT_EQ(e.site, "/work/train.py:12 in step");
  ASSERT_EQ(e.devices.size(), 2u);
  EXPECT_EQ(e.devices[0], "cuda:1");
  EXPECT_EQ(e.devices[1], "cpu");
  EXPECT_EQ(e.tensors, "[\"@cuda:1\",\"@cpu\"]");
  EXPECT_EQ(e.device, "cuda:1");
  // The exit detail: one line, then Python's own report.
  EXPECT_EQ(e.exit_detail.substr(0, e.exit_detail.find('\n')),
            std::string("uncaught RuntimeError at /work/train.py:12 in step: ") + text);
  EXPECT_NE(e.exit_detail.find("Traceback (most recent call last):\n  File \"/work/train.py\", line 40"),
            std::string::npos);

  // PyTorch's other wording of the same failure.
  auto other = classify_python_exception(
      "RuntimeError",
      "Expected all tensors to be on the same device, but got index is on cuda:0, different from other tensors on cpu "
      "(when checking argument in method wrapper_CUDA__index_select)",
      "");
  EXPECT_EQ(other.kind, "device_mismatch");
  EXPECT_EQ(other.tensors, "[\"@cuda:0\",\"@cpu\"]");
  EXPECT_EQ(other.site, "");
}

TEST(PythonError, PyTorchsOutOfMemoryWithItsFigures) {
  const std::string text =
      "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total capacity of 79.11 GiB of which 2.94 MiB is "
      "free. Including non-PyTorch memory, this process has 79.10 GiB memory in use. Of the allocated memory 77.81 GiB "
      "is allocated by PyTorch, and 821.31 MiB is reserved by PyTorch but unallocated.";
  for (const char* type : {"torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"}) {
    auto e = classify_python_exception(type, text, "");
    EXPECT_EQ(e.kind, "oom") << type;
    EXPECT_EQ(e.message, text);
    EXPECT_EQ(e.device, "cuda:3");
  }
  // The text alone (raised as a RuntimeError by older PyTorch) is read the same way.
  EXPECT_EQ(classify_python_exception("RuntimeError", text, "").kind, "oom");
}

TEST(PythonError, AnythingElseIsAnUncaughtExceptionWithItsType) {
  auto e = classify_python_exception("ValueError", "bad learning rate", kReport);
  EXPECT_EQ(e.kind, "uncaught_exception");
  EXPECT_EQ(e.message, "ValueError: bad learning rate");
  EXPECT_TRUE(e.tensors.empty());
  EXPECT_EQ(classify_python_exception("KeyboardInterrupt", "", "").message, "KeyboardInterrupt");
  EXPECT_EQ(classify_python_exception("torch.distributed.DistBackendError",
                                      "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
                                      "OpType=BROADCAST) ran for 600081 milliseconds before timing out.",
                                      "")
                .kind,
            "watchdog_timeout");
}
