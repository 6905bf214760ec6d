// A PyTorch loop on a GPU under `zt probe` (label gpu; skipped where python3 has no torch with
// CUDA): epochs and steps from NVTX ranges `epoch N` / `step N` (torch.cuda.nvtx, through CUPTI)
// and from the zerotrace module; a device tensor kept every epoch fails `zt check --leaks`, the
// same loop without it passes; PyTorch's own device-mismatch error is the trace's error row; a
// CUDA module's globals are kind module_global; an HF transformers.Trainer run (where transformers
// imports) gets its epochs and steps from the bootstrap's callback. About 30 s on an H100/H200
// (four python starts, each importing torch). ZT_TEST_PYTHON names the interpreter (default:
// python3 on PATH).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;

namespace {

std::string python() {
  const char* p = std::getenv("ZT_TEST_PYTHON");
  return p && *p ? p : "python3";
}

// Empty when python has torch and a usable GPU; else why not.
std::string why_no_torch_gpu() {
  auto r = run_command(python() +
                       " -c 'import sys\ntry:\n import torch\nexcept Exception as e:\n print(\"no torch:\", e); "
                       "sys.exit(3)\nsys.exit(0 if torch.cuda.is_available() else 4)' 2>&1");
  if (r.code == 0) return "";
  return r.code == 4 ? "torch has no usable GPU here" : "no torch for " + python() + ": " + r.out;
}

// 4 epochs of 3 steps of a small MLP with AdamW. marks: "nvtx" (torch.cuda.nvtx ranges) or
// "zerotrace" (the module); leak: a 16 MiB device tensor kept every epoch.
std::string loop(const std::string& marks, bool leak) {
  const bool nvtx = marks == "nvtx";
  std::string p =
      "import torch\n"
      "import zerotrace\n"
      "dev = 'cuda'\n"
      "model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).to(dev)\n"
      "opt = torch.optim.AdamW(model.parameters())\n"
      "kept = []\n"
      "for e in range(4):\n";
  p += nvtx ? "    torch.cuda.nvtx.range_push(f'epoch {e}')\n" : "    ep = zerotrace.epoch(e)\n";
  p += "    for s in range(3):\n";
  p += nvtx ? "        torch.cuda.nvtx.range_push(f'step {e * 3 + s}')\n" : "        st = zerotrace.step(e * 3 + s)\n";
  p += "        x = torch.randn(128, 512, device=dev)\n"
       "        loss = model(x).square().mean()\n"
       "        loss.backward()\n"
       "        opt.step()\n"
       "        opt.zero_grad()\n"
       "        torch.cuda.synchronize()\n";
  p += nvtx ? "        torch.cuda.nvtx.range_pop()\n" : "        st.end()\n";
  if (leak) p += "    kept.append(torch.empty(16 << 20, dtype=torch.uint8, device=dev))  # the leak\n";
  p += "    torch.cuda.synchronize()\n";
  p += nvtx ? "    torch.cuda.nvtx.range_pop()\n" : "    ep.end()\n";
  return p;
}

RunResult probe(const std::string& out, const std::vector<std::string>& cmd) {
  std::vector<std::string> argv{ZT_EXE, "probe", "-o", out, "--"};
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  return run_program(argv, {{"LD_PRELOAD", nullptr}});
}

std::vector<std::string> python_argv(const std::string& script) {
  // run_program execs argv[0] as a path: let the shell find python on PATH.
  return {"/bin/sh", "-c", "exec " + python() + " \"$0\"", script};
}

}  // namespace

TEST(ProbePythonGpu, NvtxEpochsAndStepsAndADeviceLeakFailsTheCheck) {
  if (std::string why = why_no_torch_gpu(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  std::ofstream(dir.file("leak.py")) << loop("nvtx", true);
  const std::string out = dir.file("leak.db");
  RunResult r = probe(out, python_argv(dir.file("leak.py")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("12 steps (from NVTX ranges 'step N'), 4 epochs (from NVTX ranges 'epoch N')"), std::string::npos)
      << r.err;
  const std::string info = run_command(std::string(ZT_EXE) + " db info " + out + " 2>&1").out;
  EXPECT_NE(info.find("steps: 12, epochs: 4"), std::string::npos) << info;
  // A CUDA module's globals: their own kind, a line of their own, none among the device's rows.
  EXPECT_GT(sql_int(out, "SELECT count(*) FROM allocation WHERE memory_kind = 5"), 0) << info;
  EXPECT_NE(info.find("module globals on rank 0 cuda:0"), std::string::npos) << info;
  std::printf("device allocations under 24 bytes still of kind device: %lld\n",
              (long long)sql_int(out, "SELECT count(*) FROM allocation WHERE memory_kind = 1 AND bytes < 24"));
  auto check = run_command(std::string(ZT_EXE) + " check " + out + " --leaks 2>&1");
  EXPECT_EQ(check.code, 1) << check.out;
  EXPECT_NE(check.out.find("cuda:0 device memory: live bytes at epoch"), std::string::npos) << check.out;
}

TEST(ProbePythonGpu, ZerotraceEpochsAndStepsAndNoLeakPasses) {
  if (std::string why = why_no_torch_gpu(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  std::ofstream(dir.file("ok.py")) << loop("zerotrace", false);
  const std::string out = dir.file("ok.db");
  RunResult r = probe(out, python_argv(dir.file("ok.py")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("12 steps (from the zerotrace module), 4 epochs (from the zerotrace module)"), std::string::npos)
      << r.err;
  auto check = run_command(std::string(ZT_EXE) + " check " + out + " --leaks 2>&1");
  EXPECT_EQ(check.code, 0) << check.out;
}

TEST(ProbePythonGpu, PyTorchsOwnDeviceMismatchIsTheErrorRow) {
  if (std::string why = why_no_torch_gpu(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  std::ofstream(dir.file("mismatch.py")) << "import torch\n"
                                            "a = torch.ones(4, device='cuda')\n"
                                            "b = torch.ones(4)\n"
                                            "print(a + b)\n";
  const std::string out = dir.file("mismatch.db");
  RunResult r = probe(out, python_argv(dir.file("mismatch.py")));
  EXPECT_EQ(r.code, 1) << r.err;
  auto rows = sql(out, "SELECT kind, tensors, message FROM error");
  ASSERT_EQ(rows.size(), 1u) << r.err;
  EXPECT_EQ(rows[0][0], "device_mismatch") << rows[0][2];
  // Both devices, in the order PyTorch's text names them.
  EXPECT_NE(rows[0][1].find("\"@cuda:0\""), std::string::npos) << rows[0][2];
  EXPECT_NE(rows[0][1].find("\"@cpu\""), std::string::npos) << rows[0][2];
}

// The real transformers.Trainer (the CI tests run on stand-ins of its callback interface): the
// bootstrap adds its callback, 2 epochs of 3 steps come from it.
TEST(ProbePythonGpu, TheHfTrainersEpochsAndStepsComeFromItsCallbacks) {
  if (std::string why = why_no_torch_gpu(); !why.empty()) GTEST_SKIP() << why;
  auto has = run_command(python() + " -c 'import transformers, accelerate' 2>&1");
  if (has.code != 0) GTEST_SKIP() << "transformers or accelerate does not import: " << has.out;
  TempDir dir;
  std::ofstream(dir.file("hf.py"))
      << "import sys, torch\n"
         "from transformers import Trainer, TrainingArguments\n"
         "class M(torch.nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n"
         "        self.l = torch.nn.Linear(8, 1)\n"
         "    def forward(self, x, labels):\n"
         "        return {'loss': torch.nn.functional.mse_loss(self.l(x).squeeze(-1), labels)}\n"
         "data = [{'x': torch.randn(8), 'labels': torch.randn(())} for _ in range(12)]\n"
         "args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=4, num_train_epochs=2,\n"
         "                         report_to=[], save_strategy='no', logging_strategy='no', disable_tqdm=True)\n"
         "Trainer(model=M(), args=args, train_dataset=data).train()\n";
  const std::string out = dir.file("hf.db");
  RunResult r = run_program({ZT_EXE, "probe", "-o", out, "--", "/bin/sh", "-c", "exec " + python() + " \"$0\" \"$1\"",
                             dir.file("hf.py"), dir.file("out")},
                            {{"LD_PRELOAD", nullptr}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("6 steps (from transformers.Trainer's callbacks), 2 epochs (from transformers.Trainer's "
                       "callbacks)"),
            std::string::npos)
      << r.err;
}
