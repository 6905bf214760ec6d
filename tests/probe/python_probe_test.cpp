// Real Python programs under `zt probe` (Debian's python3, no GPU): epochs and steps from the
// zerotrace module, the leak check on them, an uncaught exception with PyTorch's text as an
// error row, a pyenv-style shim that execs, the bootstrap's chaining and framework hooks, the
// world size and the honest host figures. (NVTX ranges need a GPU here: the derivation from
// ranges is tested on hand-built traces in tests/db/derive_steps_test.cpp.)
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;
namespace fs = std::filesystem;

namespace {

const char* kPython = "/usr/bin/python3";

bool have_python() { return ::access(kPython, X_OK) == 0; }

void write(const std::string& path, const std::string& text, bool executable = false) {
  std::ofstream(path) << text;
  if (executable) ::chmod(path.c_str(), 0755);
}

RunResult run_zt(const std::vector<std::string>& args, const std::map<std::string, const char*>& env = {}) {
  std::vector<std::string> argv{ZT_EXE};
  argv.insert(argv.end(), args.begin(), args.end());
  std::map<std::string, const char*> e{{"LD_PRELOAD", nullptr}, {"OMP_WAIT_POLICY", "passive"}, {"PYTHONPATH", nullptr}};
  for (auto& [k, v] : env) e[k] = v;
  return run_program(argv, e);
}

// zt db info's stdout (run_program keeps stderr only).
std::string db_info(const std::string& trace) {
  return run_command(std::string(ZT_EXE) + " db info " + trace + " 2>&1").out;
}

// A training loop of `epochs` epochs of 4 steps marked with the zerotrace module; `leak` keeps
// 4 MiB more host memory each epoch (a bytearray appended to a list: malloc above the probe's
// 1 MiB threshold), else the 4 MiB of each epoch is freed at its end.
std::string loop_program(int epochs, bool leak) {
  return std::string(
             "import zerotrace\n"
             "kept = []\n"
             "print('recording', zerotrace.recording())\n"
             "for e in range(") +
         std::to_string(epochs) +
         "):\n"
         "    with zerotrace.epoch(e):\n"
         "        buf = bytearray(4 << 20)\n"
         "        for s in range(4):\n"
         "            with zerotrace.step(e * 4 + s):\n"
         "                with zerotrace.phase('forward'):\n"
         "                    x = sum(range(2000))\n"
         "        " +
         (leak ? "kept.append(buf)  # the leak: 4 MiB more every epoch\n" : "del buf\n");
}

}  // namespace

// zerotrace.epoch / zerotrace.step / zerotrace.phase in a CPU-only program: steps and epochs in
// the trace, counted by zt db info, with the steps inside their epochs.
TEST(ProbePython, TheZerotraceModuleGivesEpochsAndSteps) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  write(dir.file("loop.py"), loop_program(3, false));
  const std::string out = dir.file("loop.db");
  RunResult r = run_zt({"probe", "-o", out, "--", kPython, dir.file("loop.py")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("12 steps (from the zerotrace module), 3 epochs (from the zerotrace module)"), std::string::npos)
      << r.err;
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM marker WHERE kind = 0 AND t_end IS NOT NULL"), 12);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM marker WHERE kind = 2"), 3);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM marker_v WHERE kind = 'phase' AND name = 'forward'"), 12);
  auto placed = sql(out, "SELECT group_concat(step || '@' || epoch, ' ') FROM (SELECT * FROM marker WHERE kind = 0 "
                         "ORDER BY t_start)");
  ASSERT_FALSE(placed.empty());
  EXPECT_EQ(placed[0][0], "0@0 1@0 2@0 3@0 4@1 5@1 6@1 7@1 8@2 9@2 10@2 11@2");
  const std::string info = db_info(out);
  EXPECT_NE(info.find("steps: 12, epochs: 3"), std::string::npos) << info;
  // zt check's steps and budget read them as they read zt train's.
  auto steps = run_command(std::string(ZT_EXE) + " check " + out + " --steps 12 2>&1");
  EXPECT_EQ(steps.code, 0) << steps.out;
  EXPECT_EQ(run_command(std::string(ZT_EXE) + " check " + out + " --steps 13 2>&1").code, 1);
  EXPECT_EQ(run_command(std::string(ZT_EXE) + " check " + out + " --budget host=1GiB 2>&1").code, 0);
  // The Chrome export carries them too.
  RunResult ex = run_zt({"export", out, "--chrome", dir.file("loop.json")});
  ASSERT_EQ(ex.code, 0) << ex.err;
  EXPECT_NE(read_file(dir.file("loop.json")).find("\"step 11\""), std::string::npos);

  // Outside zt probe the module records nothing and costs nothing: the same program runs.
  auto plain = run_command("PYTHONPATH=" + std::string(ZT_SOURCE_DIR) + "/python " + kPython + " " +
                           dir.file("loop.py") + " 2>&1");
  EXPECT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out, "recording False\n");
}

// The leak check on a probed program: 4 MiB more host memory each epoch fails it (exit 1), the
// same loop without the leak passes.
TEST(ProbePython, ALoopThatKeeps4MiBAnEpochFailsTheLeakCheck) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  for (bool leak : {true, false}) {
    const std::string prog = dir.file(leak ? "leak.py" : "noleak.py");
    write(prog, loop_program(5, leak));
    const std::string out = dir.file(leak ? "leak.db" : "noleak.db");
    RunResult r = run_zt({"probe", "-o", out, "--", kPython, prog});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err.find("no steps or epochs found"), std::string::npos) << r.err;  // the module marked them
    auto check = run_command(std::string(ZT_EXE) + " check " + out + " --leaks 2>&1");
    if (leak) {
      EXPECT_EQ(check.code, 1) << check.out;
      EXPECT_NE(check.out.find("FAIL"), std::string::npos) << check.out;
      EXPECT_NE(check.out.find("pageable host memory: live bytes at epoch"), std::string::npos) << check.out;
      EXPECT_NE(check.out.find("grew 4.00 MiB per epoch"), std::string::npos) << check.out;
      // The kept 20 MiB is over a host budget of 16 MiB.
      EXPECT_EQ(run_command(std::string(ZT_EXE) + " check " + out + " --budget host=16MiB 2>&1").code, 1);
    } else {
      EXPECT_EQ(check.code, 0) << check.out;
      EXPECT_NE(check.out.find("PASS"), std::string::npos) << check.out;
    }
  }
}

// An uncaught exception with PyTorch's device-mismatch text in a plain Python program: an error
// row of kind device_mismatch with both devices, the exit code passed through, zt check failing
// the run with the user's own text.
TEST(ProbePython, AnUncaughtDeviceMismatchIsAnErrorRowWithBothDevices) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  const char* text = "Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cpu!";
  write(dir.file("fail.py"), std::string("import zerotrace\n"
                                         "def unscale_and_clip_grads():\n"
                                         "    raise RuntimeError('") +
                                 text +
                                 "')\n"
                                 "with zerotrace.epoch(0):\n"
                                 "    with zerotrace.step(0):\n"
                                 "        pass\n"
                                 "    with zerotrace.step(1):\n"
                                 "        unscale_and_clip_grads()\n");
  const std::string out = dir.file("fail.db");
  RunResult r = run_zt({"probe", "-o", out, "--", kPython, dir.file("fail.py")});
  EXPECT_EQ(r.code, 1) << r.err;  // Python's exit code for an uncaught exception, passed through
  EXPECT_NE(r.err.find("RuntimeError: Expected all tensors"), std::string::npos) << r.err;  // Python's own report
  auto rows = sql(out, "SELECT kind, message, tensors, site FROM error");
  ASSERT_EQ(rows.size(), 1u) << r.err;
  EXPECT_EQ(rows[0][0], "device_mismatch");
  EXPECT_EQ(rows[0][1], text);
  EXPECT_EQ(rows[0][2], "[\"@cuda:1\",\"@cpu\"]");
  EXPECT_EQ(rows[0][3], dir.file("fail.py") + ":3 in unscale_and_clip_grads");
  auto run = sql(out, "SELECT status, exit_code, exit_detail FROM run");
  ASSERT_EQ(run.size(), 1u);
  EXPECT_EQ(run[0][0], "2");  // failed
  EXPECT_EQ(run[0][1], "1");
  EXPECT_NE(run[0][2].find("uncaught RuntimeError at " + dir.file("fail.py") + ":3 in unscale_and_clip_grads"),
            std::string::npos)
      << run[0][2];
  EXPECT_NE(run[0][2].find("Traceback (most recent call last):"), std::string::npos) << run[0][2];
  auto check = run_command(std::string(ZT_EXE) + " check " + out + " 2>&1");
  EXPECT_EQ(check.code, 1) << check.out;
  EXPECT_NE(check.out.find(std::string("during step 1 in ") + dir.file("fail.py") +
                           ":3 in unscale_and_clip_grads: device_mismatch: " + text),
            std::string::npos)
      << check.out;

  // Any other exception: uncaught_exception with its type; SystemExit is an exit, not an error.
  write(dir.file("value.py"), "raise ValueError('bad learning rate')\n");
  RunResult v = run_zt({"probe", "-o", dir.file("value.db"), "--", kPython, dir.file("value.py")});
  EXPECT_EQ(v.code, 1) << v.err;
  auto vrows = sql(dir.file("value.db"), "SELECT kind, message FROM error");
  ASSERT_EQ(vrows.size(), 1u);
  EXPECT_EQ(vrows[0][0], "uncaught_exception");
  EXPECT_EQ(vrows[0][1], "ValueError: bad learning rate");
  write(dir.file("exit.py"), "import sys\nsys.exit(3)\n");
  RunResult x = run_zt({"probe", "-o", dir.file("exit.db"), "--", kPython, dir.file("exit.py")});
  EXPECT_EQ(x.code, 3) << x.err;
  EXPECT_EQ(sql_int(dir.file("exit.db"), "SELECT count(*) FROM error"), 0);
}

// A pyenv-style `python3` shim (a bash script that execs another script that execs the real
// python, forking a helper on the way) leaves its data at the path given to -o, not in
// NAME.pidN.db.
TEST(ProbePython, AShimThatExecsLeavesItsDataAtTheOutputPath) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  fs::create_directories(dir.file("shims"));
  write(dir.file("shims/pyenv-exec"), std::string("#!/bin/sh\nexec ") + kPython + " \"$@\"\n", true);
  write(dir.file("shims/python3"),
        "#!/usr/bin/env bash\nset -e\nprogram=\"$(basename \"$0\")\"\nexec \"" + dir.file("shims/pyenv-exec") +
            "\" \"$@\"\n",
        true);
  write(dir.file("loop.py"), loop_program(2, false));
  const std::string out = dir.file("shim.db");
  RunResult r = run_zt({"probe", "-o", out, "--", dir.file("shims/python3"), dir.file("loop.py")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("trace written to " + out), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("this run's data is in"), std::string::npos) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM marker WHERE kind = 0"), 8);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM marker WHERE kind = 2"), 2);
  auto cmd = sql(out, "SELECT command_line, exit_code FROM run");
  ASSERT_EQ(cmd.size(), 1u);
  EXPECT_EQ(cmd[0][0], dir.file("shims/python3") + " " + dir.file("loop.py"));  // the command as typed
  EXPECT_EQ(cmd[0][1], "0");
  for (auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find("shim.pid"), std::string::npos) << e.path();
}

// --step-range: a malformed regex is refused before the program starts; a name the trace does
// not have is said in the summary, and the next source gives the steps.
TEST(ProbePython, StepRangePatternsAreCheckedAndUnknownNamesSaid) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  const std::string marker = dir.file("ran");
  RunResult bad = run_zt({"probe", "-o", dir.file("bad.db"), "--step-range", "step (", "--", "/bin/touch", marker});
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err.rfind("zt: probe: --step-range 'step (': not a regular expression (", 0), 0u) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_EQ(run_zt({"probe", "--epoch-range", "[", "--", "/bin/true"}).code, 2);

  write(dir.file("loop.py"), loop_program(2, false));
  const std::string out = dir.file("named.db");
  RunResult r = run_zt({"probe", "-o", out, "--step-range", "train_step", "--", kPython, dir.file("loop.py")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--step-range 'train_step' matched no range in the trace (its most frequent: "
                       "'zerotrace::forward'"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("8 steps (from the zerotrace module)"), std::string::npos) << r.err;
  // A name it has: the module's phase ranges become the steps (the user's words come first).
  RunResult again = run_zt({"db", "steps", out, "--step-range", "zerotrace::forward"});
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM marker WHERE kind = 0"), 8);
  auto from = sql(out, "SELECT value FROM meta WHERE key = 'steps_from'");
  ASSERT_FALSE(from.empty());
  EXPECT_EQ(from[0][0], "--step-range 'zerotrace::forward'");
}

// The bootstrap chains to the program's own sitecustomize (the next one on sys.path, Debian's
// included), leaves sys.path as it was but for the zerotrace package, and changes no output.
TEST(ProbePython, TheBootstrapChainsToTheProgramsSitecustomize) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  fs::create_directories(dir.file("site"));
  write(dir.file("site/sitecustomize.py"), "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n");
  write(dir.file("show.py"),
        "import os, sys\n"
        "print('sitecustomize ran:', os.environ.get('USER_SITECUSTOMIZE_RAN'))\n"
        "print('module:', sys.modules['sitecustomize'].__file__)\n"
        "print('bootstrap on path:', any('zt_bootstrap' in p for p in sys.path))\n");
  const std::string site = dir.file("site");
  auto probed = run_command("cd " + dir.path() + " && PYTHONPATH=" + site + " " + ZT_EXE + " probe -o s.db -- " +
                            kPython + " show.py 2>/dev/null");
  auto plain = run_command("cd " + dir.path() + " && PYTHONPATH=" + site + " " + kPython + " show.py 2>/dev/null");
  EXPECT_EQ(probed.code, 0);
  EXPECT_EQ(probed.out, plain.out);
  EXPECT_NE(plain.out.find("sitecustomize ran: yes\nmodule: " + site + "/sitecustomize.py"), std::string::npos)
      << plain.out;
  EXPECT_NE(probed.out.find("bootstrap on path: False"), std::string::npos) << probed.out;
  // Without one of the user's: the system's (Debian's /usr/lib/python3.X/sitecustomize.py), as unprobed.
  auto probed_sys = run_command("cd " + dir.path() + " && " + ZT_EXE + " probe -o t.db -- " + kPython +
                                " show.py 2>/dev/null");
  auto plain_sys = run_command("cd " + dir.path() + " && env -u PYTHONPATH " + kPython + " show.py 2>/dev/null");
  EXPECT_EQ(probed_sys.out, plain_sys.out);
}

// The bootstrap's framework hooks, on stand-ins that have HF transformers' and Lightning's
// callback interfaces (the real frameworks are not installed here): epochs and steps from their
// callbacks, added to the program's Trainer without a line of it changed.
TEST(ProbePython, FrameworkTrainersGetEpochsAndStepsFromTheirCallbacks) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  fs::create_directories(dir.file("fw/transformers"));
  write(dir.file("fw/transformers/__init__.py"), "from .trainer import Trainer\n");
  write(dir.file("fw/transformers/trainer_callback.py"),
        "class TrainerCallback:\n"
        "    def on_epoch_begin(self, args, state, control, **kw): pass\n"
        "    def on_epoch_end(self, args, state, control, **kw): pass\n"
        "    def on_step_begin(self, args, state, control, **kw): pass\n"
        "    def on_step_end(self, args, state, control, **kw): pass\n"
        "    def on_train_end(self, args, state, control, **kw): pass\n"
        "class TrainerState:\n"
        "    epoch = 0.0\n"
        "    global_step = 0\n");
  // As transformers' Trainer drives its callbacks (CallbackHandler calls each event on each).
  write(dir.file("fw/transformers/trainer.py"),
        "from .trainer_callback import TrainerState\n"
        "class Trainer:\n"
        "    def __init__(self, epochs, steps):\n"
        "        self.epochs, self.steps, self.callbacks = epochs, steps, []\n"
        "    def add_callback(self, cb):\n"
        "        self.callbacks.append(cb)\n"
        "    def _event(self, name, state):\n"
        "        for cb in self.callbacks: getattr(cb, name)(None, state, None)\n"
        "    def train(self):\n"
        "        state = TrainerState()\n"
        "        for e in range(self.epochs):\n"
        "            self._event('on_epoch_begin', state)\n"
        "            for s in range(self.steps):\n"
        "                self._event('on_step_begin', state)\n"
        "                state.global_step += 1\n"
        "                state.epoch = e + (s + 1) / self.steps\n"
        "                self._event('on_step_end', state)\n"
        "            self._event('on_epoch_end', state)\n"
        "        self._event('on_train_end', state)\n");
  write(dir.file("hf.py"), "from transformers import Trainer\nTrainer(epochs=3, steps=5).train()\nprint('trained')\n");
  const std::string fw = dir.file("fw");
  RunResult r = run_zt({"probe", "-o", dir.file("hf.db"), "--", kPython, dir.file("hf.py")}, {{"PYTHONPATH", fw.c_str()}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("15 steps (from transformers.Trainer's callbacks), 3 epochs (from transformers.Trainer's "
                       "callbacks)"),
            std::string::npos)
      << r.err;
  auto steps = sql(dir.file("hf.db"), "SELECT group_concat(step || '@' || epoch, ' ') FROM (SELECT * FROM marker "
                                      "WHERE kind = 0 ORDER BY t_start)");
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0][0], "0@0 1@0 2@0 3@0 4@0 5@1 6@1 7@1 8@1 9@1 10@2 11@2 12@2 13@2 14@2");

  // Lightning's: a Trainer whose callbacks come in its constructor.
  fs::create_directories(dir.file("fw/lightning/pytorch/trainer"));
  fs::create_directories(dir.file("fw/lightning/pytorch/callbacks"));
  write(dir.file("fw/lightning/__init__.py"), "");
  write(dir.file("fw/lightning/pytorch/__init__.py"),
        "from .callbacks import Callback\nfrom .trainer.trainer import Trainer\n");
  write(dir.file("fw/lightning/pytorch/callbacks/__init__.py"),
        "class Callback:\n"
        "    def on_train_epoch_start(self, trainer, pl_module): pass\n"
        "    def on_train_epoch_end(self, trainer, pl_module): pass\n"
        "    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx): pass\n"
        "    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx): pass\n"
        "    def on_train_end(self, trainer, pl_module): pass\n");
  write(dir.file("fw/lightning/pytorch/trainer/__init__.py"), "");
  write(dir.file("fw/lightning/pytorch/trainer/trainer.py"),
        "class Trainer:\n"
        "    def __init__(self, *, max_epochs=1, callbacks=None):\n"
        "        self.max_epochs, self.callbacks = max_epochs, list(callbacks or [])\n"
        "        self.current_epoch, self.global_step = 0, 0\n"
        "    def fit(self, batches):\n"
        "        for e in range(self.max_epochs):\n"
        "            self.current_epoch = e\n"
        "            for cb in self.callbacks: cb.on_train_epoch_start(self, None)\n"
        "            for i in range(batches):\n"
        "                for cb in self.callbacks: cb.on_train_batch_start(self, None, None, i)\n"
        "                self.global_step += 1\n"
        "                for cb in self.callbacks: cb.on_train_batch_end(self, None, None, None, i)\n"
        "            for cb in self.callbacks: cb.on_train_epoch_end(self, None)\n"
        "        for cb in self.callbacks: cb.on_train_end(self, None)\n");
  write(dir.file("pl.py"), "import lightning.pytorch as pl\npl.Trainer(max_epochs=2).fit(3)\n");
  RunResult l = run_zt({"probe", "-o", dir.file("pl.db"), "--", kPython, dir.file("pl.py")}, {{"PYTHONPATH", fw.c_str()}});
  ASSERT_EQ(l.code, 0) << l.err;
  EXPECT_NE(l.err.find("6 steps (from Lightning's callbacks), 2 epochs (from Lightning's callbacks)"),
            std::string::npos)
      << l.err;
}

// Honest figures of a CPU-only Python run: CUDA tracing off is a note (no error), the world size
// is the launcher's, host memory is said in host words, and helper processes are not ranks.
TEST(ProbePython, HonestFiguresOfAProbedPythonRun) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  write(dir.file("helpers.py"),
        "import subprocess, sys\n"
        "for _ in range(3):\n"
        "    subprocess.run([sys.executable, '-c', 'x = bytearray(8 << 20)'], check=True)\n"
        "kept = bytearray(16 << 20)\n");
  const std::string out = dir.file("h.db");
  RunResult r = run_zt({"probe", "-o", out, "--", kPython, dir.file("helpers.py")},
                   {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("this run's data is in 4 traces"), std::string::npos) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT world_size FROM rank"), 4);  // the launcher's, not 4 process images
  EXPECT_EQ(sql_int(out, "SELECT local_rank FROM rank"), 1);
  const std::string info = db_info(out);
  EXPECT_NE(info.find("note: CUDA tracing was off"), std::string::npos) << info;
  EXPECT_NE(info.find("errors: none"), std::string::npos) << info;
  EXPECT_EQ(info.find("peak allocated 0 B"), std::string::npos) << info;
  EXPECT_NE(info.find("host memory of rank 1: resident set (RSS) peaked at "), std::string::npos) << info;
  EXPECT_NE(info.find("allocations of 1.00 MiB or more (malloc, mmap) peaked at "), std::string::npos) << info;
  // Merged: four process images, one rank (1, of a world of 4) and its three helpers (the
  // subprocesses inherited RANK=1; they are not ranks of the job).
  const size_t at = r.err.find("zt db merge ");
  ASSERT_NE(at, std::string::npos) << r.err;
  std::string merge = r.err.substr(at + 3, r.err.find('\n', at) - at - 3);
  auto m = run_command(std::string(ZT_EXE) + " " + merge + " 2>&1");
  ASSERT_EQ(m.code, 0) << m.out;
  const std::string merged = merge.substr(std::string("db merge ").size(), merge.find(' ', 9) - 9);
  const std::string minfo = db_info(merged);
  EXPECT_NE(minfo.find("ranks: 1 (world size 4); other processes: helper "), std::string::npos) << minfo;
  EXPECT_EQ(sql_int(merged, "SELECT count(*) FROM rank WHERE role = 2 AND job_rank = 1"), 3);
  EXPECT_EQ(sql_int(merged, "SELECT rank FROM rank WHERE role = 0"), 1);
  // Without launcher variables: one process is a world of 1, whatever it starts.
  RunResult one = run_zt({"probe", "-o", dir.file("one.db"), "--", kPython, dir.file("helpers.py")},
                     {{"RANK", nullptr}, {"WORLD_SIZE", nullptr}, {"LOCAL_RANK", nullptr}});
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(sql_int(dir.file("one.db"), "SELECT world_size FROM rank"), 1);
}

// Issue 40: the job's ranks, not the order processes started. A launcher without rank variables
// starts rank 1 first, then rank 0 (as torchrun sets their variables); rank 1 starts a helper
// that inherits them. In every run: each file is named by its rank in the summary, the merged
// trace's ranks are 0 and 1 with each rank's own allocations, the launcher and the helper are
// processes (not ranks), and the numbers are the same run after run.
TEST(ProbePython, TheJobsRanksInEveryRunAndAfterTheMerge) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  write(dir.file("launch.py"),
        "import os, subprocess, sys, time\n"
        "base = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}\n"
        "worker = ('import os, subprocess, sys\\n'\n"
        "          'r = int(os.environ[\"RANK\"])\\n'\n"
        "          'kept = bytearray((2 + r) << 20)\\n'  # rank 0 holds 2 MiB, rank 1 3 MiB\n"
        "          'if r == 1: subprocess.run([sys.executable, \"-c\", \"x = bytearray(5 << 20)\"], check=True)\\n')\n"
        "procs = []\n"
        "for r in (1, 0):\n"
        "    env = dict(base, RANK=str(r), WORLD_SIZE='2', LOCAL_RANK=str(r), LOCAL_WORLD_SIZE='2')\n"
        "    procs.append(subprocess.Popen([sys.executable, '-c', worker], env=env))\n"
        "    time.sleep(0.3)\n"
        "for p in procs:\n"
        "    assert p.wait() == 0\n");
  auto words = [](const std::string& line) {
    std::vector<std::string> w;
    std::istringstream in(line);
    for (std::string x; in >> x;) w.push_back(x);
    return w;
  };
  // A holds `bytes` (within 64 KiB) on key `rank` of `trace`.
  auto holds = [](const std::string& trace, int rank, int64_t bytes) {
    return sql_int(trace, "SELECT count(*) FROM allocation WHERE rank = " + std::to_string(rank) + " AND bytes BETWEEN " +
                              std::to_string(bytes) + " AND " + std::to_string(bytes + 65536)) > 0;
  };
  std::vector<std::string> tables, rank1_traces;
  for (const char* name : {"a", "b"}) {
    const std::string out = dir.file(std::string(name) + ".db");
    RunResult r = run_zt({"probe", "-o", out, "--", kPython, dir.file("launch.py")},
                         {{"RANK", nullptr}, {"WORLD_SIZE", nullptr}, {"LOCAL_RANK", nullptr}});
    ASSERT_EQ(r.code, 0) << r.err;
    // The summary names each file by its rank, the launcher and the helper by their pids.
    EXPECT_NE(r.err.find("launcher process "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(": trace written to " + out + ": "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("zt probe: rank 0, child process "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("zt probe: rank 1, child process "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(" of rank 1: trace "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("this run's data is in 4 traces"), std::string::npos) << r.err;
    // Each file already carries its key: the launcher's file is not rank 0.
    EXPECT_EQ(sql_int(out, "SELECT role FROM rank"), 1);
    EXPECT_EQ(sql_int(out, "SELECT rank FROM rank"), 2);

    const size_t at = r.err.find("zt db merge ");
    ASSERT_NE(at, std::string::npos) << r.err;
    const std::vector<std::string> merge = words(r.err.substr(at, r.err.find('\n', at) - at));
    ASSERT_EQ(merge.size(), 8u) << r.err;  // zt db merge OUT and four traces
    auto m = run_command(std::string(ZT_EXE) + " " + r.err.substr(at + 3, r.err.find('\n', at) - at - 3) + " 2>&1");
    ASSERT_EQ(m.code, 0) << m.out;
    const std::string merged = merge[3];
    tables.push_back(sql(merged, "SELECT group_concat(rank || ':' || role || ':' || coalesce(job_rank, '-') || ':' || "
                                 "world_size, ' ') FROM (SELECT * FROM rank ORDER BY rank)")[0][0]);
    // Ranks 0 and 1 of 2, then the launcher (key 2) and rank 1's helper (key 3).
    EXPECT_EQ(tables.back(), "0:0:0:2 1:0:1:2 2:1:-:1 3:2:1:2") << r.err;
    // Each rank's memory is its own: rank 1 held 3 MiB, rank 0 2 MiB, the helper 5 MiB.
    EXPECT_TRUE(holds(merged, 1, 3 << 20)) << merged;
    EXPECT_FALSE(holds(merged, 0, 3 << 20)) << merged;
    EXPECT_TRUE(holds(merged, 0, 2 << 20)) << merged;
    EXPECT_FALSE(holds(merged, 1, 2 << 20)) << merged;
    EXPECT_TRUE(holds(merged, 3, 5 << 20)) << merged;
    const std::string info = db_info(merged);
    EXPECT_NE(info.find("ranks: 2 (world size 2); other processes: launcher "), std::string::npos) << info;
    EXPECT_NE(info.find("helper "), std::string::npos) << info;
    // The per-process file of rank 1, for the merge below.
    for (size_t k = 4; k < merge.size(); ++k)
      if (sql_int(merge[k], "SELECT count(*) FROM rank WHERE rank = 1 AND role = 0") == 1) rank1_traces.push_back(merge[k]);
  }
  EXPECT_EQ(tables[0], tables[1]);
  // Two traces that both hold rank 1 (one from each run) are not one job: the merge says so.
  ASSERT_EQ(rank1_traces.size(), 2u);
  auto both = run_command(std::string(ZT_EXE) + " db merge " + dir.file("both.db") + " " + rank1_traces[0] + " " +
                          rank1_traces[1] + " 2>&1");
  EXPECT_EQ(both.code, 2) << both.out;
  EXPECT_NE(both.out.find("merge: rank 1 is in both " + rank1_traces[0] + " (pid "), std::string::npos) << both.out;
  EXPECT_FALSE(fs::exists(dir.file("both.db")));
}

// The communicator has the last word: children that no launcher variable names (as
// torch.multiprocessing.spawn starts them) become the ranks init_process_group gives them, and
// the parent that started them is the launcher. A stand-in torch.distributed (the zerotrace hook
// patches its init_process_group as it patches torch's).
TEST(ProbePython, TheCommunicatorsRankWithoutLauncherVariables) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  fs::create_directories(dir.file("fw/torch/distributed"));
  write(dir.file("fw/torch/__init__.py"), "");
  write(dir.file("fw/torch/distributed/__init__.py"),
        "_s = {}\n"
        "def init_process_group(backend=None, rank=-1, world_size=-1, **kw):\n"
        "    _s.update(rank=rank, world=world_size)\n"
        "def get_rank(): return _s['rank']\n"
        "def get_world_size(): return _s['world']\n");
  write(dir.file("spawn.py"),
        "import subprocess, sys, time\n"
        "worker = ('import sys, torch.distributed as dist\\n'\n"
        "          'r = int(sys.argv[1])\\n'\n"
        "          'dist.init_process_group(\"gloo\", rank=r, world_size=2)\\n'\n"
        "          'kept = bytearray((2 + r) << 20)\\n')\n"
        "procs = []\n"
        "for r in (1, 0):\n"
        "    procs.append(subprocess.Popen([sys.executable, '-c', worker, str(r)]))\n"
        "    time.sleep(0.3)\n"
        "for p in procs:\n"
        "    assert p.wait() == 0\n");
  const std::string fw = dir.file("fw");
  const std::string out = dir.file("s.db");
  RunResult r = run_zt({"probe", "-o", out, "--", kPython, dir.file("spawn.py")},
                       {{"PYTHONPATH", fw.c_str()}, {"RANK", nullptr}, {"WORLD_SIZE", nullptr}, {"LOCAL_RANK", nullptr}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("launcher process "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zt probe: rank 0, child process "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zt probe: rank 1, child process "), std::string::npos) << r.err;
  // Each child's file is its rank, with the communicator's world size.
  int found = 0;
  for (auto& e : fs::directory_iterator(dir.path())) {
    const std::string n = e.path().filename().string();
    if (n.rfind("s.pid", 0) != 0 || n.size() < 3 || n.substr(n.size() - 3) != ".db") continue;
    const int64_t k = sql_int(e.path().string(), "SELECT rank FROM rank WHERE role = 0 AND job_rank = rank AND world_size = 2");
    EXPECT_EQ(sql_int(e.path().string(), "SELECT count(*) FROM allocation WHERE rank = " + std::to_string(k) +
                                             " AND bytes BETWEEN " + std::to_string((2 + k) << 20) + " AND " +
                                             std::to_string(((2 + k) << 20) + 65536)),
              1)
        << n;
    ++found;
  }
  EXPECT_EQ(found, 2);
  EXPECT_EQ(sql_int(out, "SELECT role FROM rank"), 1);
}

// srun inside sbatch: the batch shell runs as task 0 (SLURM_PROCID=0), and srun's tasks, with the
// same variables, are started by slurmstepd, not by it. A stand-in: the root has task 0's
// variables and a double fork (so the root is no ancestor of theirs) starts tasks 1 and 0. The
// tasks are ranks 1 and 0; the root, whose claim they share but did not inherit from it, is the
// launcher. Nested: the same root's children with torchrun's RANK are torchrun's ranks (RANK
// comes first), and the root is their launcher.
TEST(ProbePython, SrunsBatchShellIsTheLauncherNotTaskZero) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  write(dir.file("srun.py"),
        "import os, subprocess, sys\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    if os.fork() == 0:\n"
        "        procs = []\n"
        "        for t in (1, 0):\n"
        "            env = dict(os.environ, SLURM_PROCID=str(t), SLURM_NTASKS='2', SLURM_LOCALID=str(t))\n"
        "            procs.append(subprocess.Popen([sys.executable, '-c', 'kept = bytearray((2 + %d) << 20)' % t], env=env))\n"
        "        for p in procs: p.wait()\n"
        "        os.write(w, b'x')\n"
        "        os._exit(0)\n"
        "    os._exit(0)\n"
        "os.close(w)\n"
        "os.read(r, 1)\n");
  const std::string out = dir.file("s.db");
  RunResult r = run_zt({"probe", "-o", out, "--", kPython, dir.file("srun.py")},
                       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"RANK", nullptr},
                        {"WORLD_SIZE", nullptr}, {"LOCAL_RANK", nullptr}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("launcher process "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zt probe: rank 0, child process "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zt probe: rank 1, child process "), std::string::npos) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT role FROM rank"), 1);

  write(dir.file("nested.py"),
        "import os, subprocess, sys\n"
        "procs = [subprocess.Popen([sys.executable, '-c', 'x = bytearray(3 << 20)'],\n"
        "                          env=dict(os.environ, RANK=str(t), WORLD_SIZE='2', LOCAL_RANK=str(t)))\n"
        "         for t in (1, 0)]\n"
        "for p in procs: p.wait()\n"
        "x = bytearray(2 << 20)\n");
  const std::string nested = dir.file("n.db");
  r = run_zt({"probe", "-o", nested, "--", kPython, dir.file("nested.py")},
             {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}, {"RANK", nullptr},
              {"WORLD_SIZE", nullptr}, {"LOCAL_RANK", nullptr}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sql_int(nested, "SELECT role FROM rank"), 1) << r.err;
  EXPECT_NE(r.err.find("launcher process "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zt probe: rank 1, child process "), std::string::npos) << r.err;
}

// Issue 40, forked workers: a job whose 2 workers are forked without exec (as a DataLoader's
// with num_workers > 0) and each keep 3 x 320 KiB more every epoch. Each worker's trace lies beside
// the parent's, as a worker process of rank 0; the merged trace keeps them so, and zt check
// --leaks fails naming the worker and the line that allocates; the clean twin passes.
// ZT_PROBE_FORKS=0 records no worker.
TEST(ProbePython, ALeakInForkedWorkersIsNamedWithTheWorkerAndTheLine) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  const std::string prog = dir.file("forked.py");
  write(prog,
        "import os, sys, time, zerotrace\n"
        "LEAK = sys.argv[1] == 'leak'\n"
        "def work(w):\n"
        "    kept = []\n"
        "    for e in range(5):\n"
        "        with zerotrace.epoch(e):\n"
        "            for s in range(3):\n"
        "                with zerotrace.step(e * 3 + s):\n"
        "                    buf = bytearray(320 << 10)\n"  // line 9: the worker's allocation
        "                    if LEAK:\n"
        "                        kept.append(buf)\n"
        "    os._exit(0)\n"
        "with zerotrace.epoch(0):  # the parent's own epochs: the first (warm-up) is the module's first use\n"
        "    pids = []\n"
        "for w in range(2):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        work(w)\n"
        "    pids.append(pid)\n"
        "for i, p in enumerate(pids):\n"
        "    with zerotrace.epoch(i + 1):\n"
        "        assert os.waitpid(p, 0)[1] == 0\n"
        "        time.sleep(0.15)  # longer than the RSS sampling period\n"
        "with zerotrace.epoch(3):\n"
        "    time.sleep(0.15)\n");
  for (bool leak : {true, false}) {
    const std::string sub = dir.file(leak ? "leak" : "clean");
    fs::create_directories(sub);
    const std::string out = sub + "/job.db";
    RunResult r = run_zt({"probe", "-o", out, "--host-threshold", "256KiB", "--", kPython, prog, leak ? "leak" : "clean"});
    ASSERT_EQ(r.code, 0) << r.err;
    std::vector<std::string> traces{out}, workers;
    for (auto& e : fs::directory_iterator(sub))
      if (e.path().filename().string().rfind("job.pid", 0) == 0 && e.path().extension() == ".db")
        workers.push_back(e.path().string());
    ASSERT_EQ(workers.size(), 2u) << r.err;
    for (const std::string& w : workers) {
      const int64_t pid = sql_int(w, "SELECT pid FROM run");
      EXPECT_NE(r.err.find("zt probe: worker process " + std::to_string(pid) + " of rank 0: trace " + w),
                std::string::npos)
          << r.err;
      EXPECT_EQ(sql_int(w, "SELECT role FROM rank"), 3);
      EXPECT_EQ(sql_int(w, "SELECT job_rank FROM rank"), 0);
      EXPECT_EQ(sql_int(w, "SELECT count(*) FROM marker WHERE kind = 2"), 5);  // its own epochs
      EXPECT_EQ(sql_int(w, "SELECT status FROM run"), 1) << "closed at os._exit";
      traces.push_back(w);
    }
    // The parent's trace has none of its workers' allocations.
    EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE requested_bytes = 327680"), 0);
    const std::string merged = sub + "/merged.db";
    std::string cmd = std::string(ZT_EXE) + " db merge " + merged;
    for (auto& t : traces) cmd += " " + t;
    auto m = run_command(cmd + " 2>&1");
    ASSERT_EQ(m.code, 0) << m.out;
    EXPECT_EQ(sql_int(merged, "SELECT count(*) FROM rank WHERE role = 3 AND job_rank = 0"), 2);
    EXPECT_EQ(sql_int(merged, "SELECT count(*) FROM rank WHERE role = 0"), 1);
    auto check = run_command(std::string(ZT_EXE) + " check " + merged + " --leaks 2>&1");
    if (leak) {
      EXPECT_EQ(check.code, 1) << check.out;
      for (const std::string& w : workers)
        EXPECT_NE(check.out.find("worker process " + std::to_string(sql_int(w, "SELECT pid FROM run")) + " of rank 0"),
                  std::string::npos)
            << check.out;
      EXPECT_NE(check.out.find("work (" + prog + ":9)"), std::string::npos) << check.out;
      // Every line names a worker by its pid, never by its key in the merged trace.
      EXPECT_EQ(check.out.find("rank 1"), std::string::npos) << check.out;
      EXPECT_EQ(check.out.find("rank 2"), std::string::npos) << check.out;
    } else {
      EXPECT_EQ(check.code, 0) << check.out;
    }
  }
  // Small allocations, sampled (the default threshold: none is recorded one by one): the workers'
  // 64 KiB buffers (48 x 64 KiB = 3 MiB more each epoch) still show as their leak, at the line.
  {
    const std::string small = dir.file("small.py");
    std::ifstream in(prog);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string from = "            for s in range(3):\n", to = "            for s in range(48):\n";
    ASSERT_NE(text.find(from), std::string::npos);
    text.replace(text.find(from), from.size(), to);
    text.replace(text.find("320 << 10"), 9, "64 << 10 ");
    text.replace(text.find("e * 3 + s"), 9, "e * 48 + s");
    write(small, text);
    const std::string sub = dir.file("small");
    fs::create_directories(sub);
    RunResult r = run_zt({"probe", "-o", sub + "/job.db", "--sample-interval", "64KiB", "--", kPython, small, "leak"});
    ASSERT_EQ(r.code, 0) << r.err;
    std::string cmd = std::string(ZT_EXE) + " db merge " + sub + "/merged.db " + sub + "/job.db";
    int workers = 0;
    for (auto& e : fs::directory_iterator(sub))
      if (e.path().filename().string().rfind("job.pid", 0) == 0 && e.path().extension() == ".db") {
        cmd += " " + e.path().string();
        ++workers;
        EXPECT_GT(sql_int(e.path().string(), "SELECT count(*) FROM allocation WHERE weight_bytes IS NOT NULL"), 0);
      }
    EXPECT_EQ(workers, 2) << r.err;
    ASSERT_EQ(run_command(cmd + " 2>&1").code, 0);
    auto check = run_command(std::string(ZT_EXE) + " check " + sub + "/merged.db --leaks 2>&1");
    EXPECT_EQ(check.code, 1) << check.out;
    EXPECT_NE(check.out.find("worker process "), std::string::npos) << check.out;
    EXPECT_NE(check.out.find("work (" + small + ":9)"), std::string::npos) << check.out;
  }
  // ZT_PROBE_FORKS=0: the workers record nothing.
  const std::string off = dir.file("off");
  fs::create_directories(off);
  RunResult r = run_zt({"probe", "-o", off + "/job.db", "--host-threshold", "256KiB", "--", kPython, prog, "leak"},
                       {{"ZT_PROBE_FORKS", "0"}});
  ASSERT_EQ(r.code, 0) << r.err;
  int files = 0;
  for (auto& e : fs::directory_iterator(off)) files += e.path().extension() == ".db";
  EXPECT_EQ(files, 1) << r.err;
}

// A multiprocessing.Pool with the fork start method (workers forked without exec, ended by the
// pool's terminate() at the end of its with-block) runs to completion under zt probe, with its
// answer, and its workers that allocated leave worker traces of rank 0. zt check's run check on
// the merged trace passes: a worker its pool ended by SIGTERM is said, not a failure.
TEST(ProbePython, AMultiprocessingPoolOfForkedWorkersRunsToCompletion) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  write(dir.file("pool.py"),
        "import multiprocessing as mp, sys\n"
        "def square(x):\n"
        "    b = bytearray(2 << 20)\n"
        "    return x * x\n"
        "if __name__ == '__main__':\n"
        "    mp.set_start_method('fork')\n"
        "    with mp.Pool(2) as pool:\n"
        "        print('sum', sum(pool.map(square, range(40))), file=sys.stderr)\n");
  const std::string out = dir.file("pool.db");
  RunResult r = run_zt({"probe", "-o", out, "--", kPython, dir.file("pool.py")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("sum 20540"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zt probe: worker process "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("not recording"), std::string::npos) << r.err;
  std::string cmd = std::string(ZT_EXE) + " db merge " + dir.file("merged.db") + " " + out;
  int workers = 0, terminated = 0;
  for (auto& e : fs::directory_iterator(dir.path()))
    if (e.path().filename().string().rfind("pool.pid", 0) == 0 && e.path().extension() == ".db") {
      cmd += " " + e.path().string();
      ++workers;
      terminated += sql_int(e.path().string(), "SELECT status FROM run") == 3;  // signal
      EXPECT_EQ(sql_int(e.path().string(), "SELECT role FROM rank"), 3);
    }
  ASSERT_GE(workers, 1);
  ASSERT_EQ(run_command(cmd + " 2>&1").code, 0);
  auto check = run_command(std::string(ZT_EXE) + " check " + dir.file("merged.db") + " --run 2>&1");
  EXPECT_EQ(check.code, 0) << check.out;
  EXPECT_NE(check.out.find("PASS run: all"), std::string::npos) << check.out;
  if (terminated > 0) EXPECT_NE(check.out.find("ended by SIGTERM"), std::string::npos) << check.out;
}

// Detail windows and the flight recorder on a real Python program: `--detail signal:2` and a
// SIGUSR1 the program sends itself after step 3 give steps 4 and 5 their detail; the SIGTERM it
// ends with (as a launcher's kill) writes the ring of its last 3 steps; the rest is aggregates.
TEST(ProbePython, ASignalWindowAndTheFlightRecorderOfAJobKilledBySigterm) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  write(dir.file("job.py"),
        "import os, signal, time, zerotrace\n"
        "for s in range(12):\n"
        "    with zerotrace.step(s):\n"
        "        buf = bytearray(2 << 20)  # a row of its own (over the 1 MiB threshold)\n"
        "        del buf\n"
        "        time.sleep(0.2)  # the writer sees each step's end: a window closes on it (edges are within a cycle)\n"
        "    if s == 3:\n"
        "        os.kill(os.getpid(), signal.SIGUSR1)\n"
        "        time.sleep(1)  # the writer sees it within a cycle (50 ms; more on a loaded machine)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(5)\n");
  const std::string out = dir.file("job.db");
  RunResult r = run_zt({"probe", "-o", out, "--detail", "signal:2", "--flight-recorder", "3", "--", kPython,
                        dir.file("job.py")});
  EXPECT_EQ(r.code, 143) << r.err;  // the program's own death, passed through
  const std::string info = db_info(out);
  EXPECT_NE(info.find("detail: 5 of 12 steps (steps 4-5, 9-11) in "), std::string::npos) << info;
  EXPECT_NE(info.find("the detail window signal (SIGUSR1) closed"), std::string::npos) << info;
  EXPECT_NE(info.find("flight recorder: the last 3 steps before the end (steps 9-11"), std::string::npos) << info;
  EXPECT_NE(info.find("written at the crash handler (killed by SIGTERM (signal 15))"), std::string::npos) << info;
  EXPECT_NE(info.find("note: SIGUSR1 "), std::string::npos) << info;
}

// A job without epochs recorded with detail windows (--detail every:10): the rows are whole only inside
// each window, so the leak check compares the windows' starts and ends. Before, it compared windows of
// steps from rows that stopped at the first window's end, and a job keeping 3 MiB every 5 steps passed.
TEST(ProbePython, ALeakBetweenDetailWindowsIsFoundAtTheWindows) {
  if (!have_python()) GTEST_SKIP() << kPython << " not found";
  TempDir dir;
  for (bool leak : {true, false}) {
    const std::string prog = dir.file(leak ? "leak.py" : "clean.py");
    write(prog, std::string("import zerotrace\n"
                            "kept = []\n"
                            "for s in range(40):\n"
                            "    with zerotrace.step(s):\n"
                            "        buf = bytearray(3 << 20)\n"
                            "        if s % 5 == 4:\n"
                            "            ") +
                    (leak ? "kept.append(buf)  # 3 MiB more every 5 steps\n" : "del buf\n"));
    const std::string out = dir.file(leak ? "leak.db" : "clean.db");
    RunResult r = run_zt({"probe", "-o", out, "--detail", "every:10", "--", kPython, prog});
    ASSERT_EQ(r.code, 0) << r.err;
    auto check = run_command(std::string(ZT_EXE) + " check " + out + " --leaks 2>&1");
    EXPECT_NE(check.out.find("stretches of detail"), std::string::npos) << check.out;
    if (leak) {
      EXPECT_EQ(check.code, 1) << check.out;
      // Compared at the windows' starts (steps 0, 10, 20, 30; the flight recorder's stretch of the last 20 steps
      // begins at step 20 too), and named at the line that keeps the memory.
      EXPECT_NE(check.out.find("pageable host memory: live bytes at window start grew"), std::string::npos) << check.out;
      EXPECT_NE(check.out.find("leak.py:5) +"), std::string::npos) << check.out;
    } else {
      EXPECT_EQ(check.code, 0) << check.out;
    }
  }
}
