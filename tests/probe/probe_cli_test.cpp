// `zt probe` as a user meets it: the trace, the exit code passed through, clear usage errors.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;

namespace {
RunResult zt_probe(const std::vector<std::string>& args) {
  std::vector<std::string> argv{ZT_EXE, "probe"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, {{"LD_PRELOAD", nullptr}, {"OMP_WAIT_POLICY", "passive"}});
}
}  // namespace

TEST(ProbeCommand, TrueIsRecordedAndCudaOffIsSaidOnce) {
  TempDir dir;
  std::string out = dir.file("true.db");
  RunResult r = zt_probe({"-o", out, "--", "/bin/true"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("trace written to " + out), std::string::npos) << r.err;
  // No GPU, or not a CUDA program: one line says so, and the trace says it too.
  size_t first = r.err.find("CUDA tracing was off");
  ASSERT_NE(first, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("CUDA tracing was off", first + 1), std::string::npos) << r.err;
  // No steps or epochs: the summary says how to mark them (issue 40), once.
  const std::string hint = "zt probe: no steps or epochs found; to mark them: the zerotrace module in Python (with "
                           "zerotrace.epoch(e): / with zerotrace.step(n):)";
  const size_t at = r.err.find(hint);
  EXPECT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(hint, at + 1), std::string::npos) << r.err;
  // A note of the run (in its config_json), not an error row: db info counts no error.
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM run, json_each(run.config_json, '$.notes') j WHERE j.value LIKE "
                         "'CUDA tracing was off: %'"),
            1);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM error"), 0);
  EXPECT_EQ(sql_int(out, "SELECT exit_code FROM run"), 0);
  EXPECT_EQ(sql_int(out, "SELECT status FROM run"), 1);
  auto cmd = sql(out, "SELECT command_line FROM run");
  ASSERT_FALSE(cmd.empty());
  EXPECT_EQ(cmd[0][0], "/bin/true");
}

TEST(ProbeCommand, ExitCodeIsPassedThroughAndWrittenToTheRun) {
  TempDir dir;
  std::string out = dir.file("fail.db");
  RunResult r = zt_probe({"-o", out, "--", "/bin/sh", "-c", "exit 3"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT exit_code FROM run"), 3);
  EXPECT_EQ(sql_int(out, "SELECT status FROM run"), 2);  // failed
  EXPECT_FALSE(std::filesystem::exists(out + "-wal"));
  EXPECT_EQ(zt_probe({"-o", dir.file("false.db"), "--", "false"}).code, 1);
}

TEST(ProbeCommand, KilledBySignalIs128PlusSignal) {
  TempDir dir;
  std::string out = dir.file("killed.db");
  RunResult r = zt_probe({"-o", out, "--", "/bin/sh", "-c", "kill -TERM $$"});
  EXPECT_EQ(r.code, 128 + 15) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT exit_code FROM run"), 143);
  EXPECT_EQ(sql_int(out, "SELECT status FROM run"), 3);  // signal
  // SIGINT is left at its default in a probed process (Python's KeyboardInterrupt needs that):
  // nothing in it writes the run's end, so zt probe does, from the last event.
  std::string sigint = dir.file("sigint.db");
  RunResult i = zt_probe({"-o", sigint, "--", "/bin/sh", "-c", "kill -INT $$"});
  EXPECT_EQ(i.code, 128 + 2) << i.err;
  EXPECT_EQ(sql_int(sigint, "SELECT status FROM run"), 3);
  EXPECT_EQ(sql_int(sigint, "SELECT t_end IS NOT NULL AND t_end >= t_start FROM run"), 1);
}

TEST(ProbeCommand, MissingCommandIsAUsageError) {
  TempDir dir;
  RunResult r = zt_probe({"-o", dir.file("x.db"), "--", "/no/such/program"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/no/such/program: command not found"), std::string::npos) << r.err;
  r = zt_probe({"-o", dir.file("x.db"), "--", "zt-no-such-command-anywhere"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("command not found"), std::string::npos) << r.err;
  r = zt_probe({"-o", dir.file("x.db")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no command given"), std::string::npos) << r.err;
  r = zt_probe({"-o", "/no/such/dir/x.db", "--", "/bin/true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  r = zt_probe({"--host-threshold", "lots", "--", "/bin/true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.db")));
}

TEST(ProbeCommand, RecordsAProgramsLeaksWithStacks) {
  TempDir dir;
  std::string out = dir.file("leak.db");
  RunResult r = zt_probe({"-o", out, "--host-threshold", "1MiB", "--", ZT_PROBE_WORKLOAD, "leak", "4",
                          std::to_string(2 << 20)});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(allocations_in(out, "zt_test_leak_buffers", "t_free IS NULL").size(), 4u);
  EXPECT_NE(r.err.find("5 live at exit"), std::string::npos) << r.err;  // 4 + the one before main

  std::string plain = dir.file("plain.db");
  r = zt_probe({"-o", plain, "--no-stacks", "--", ZT_PROBE_WORKLOAD, "leak", "4", std::to_string(2 << 20)});
  ASSERT_EQ(r.code, 0) << r.err;
  // (Rows recorded one by one: sampled ones, allocations under the threshold, are counted apart.)
  EXPECT_EQ(sql_int(plain, "SELECT count(*) FROM allocation WHERE t_free IS NULL AND weight_bytes IS NULL"), 5);
  EXPECT_EQ(sql_int(plain, "SELECT count(*) FROM allocation WHERE stack_id IS NOT NULL"), 0);
}

namespace {
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
// The words a POSIX shell reads from `line`, each as [word].
std::string shell_words(const std::string& line) {
  RunResult r = run_program({"/bin/sh", "-c", "set -- " + line + "; for a; do printf '[%s]' \"$a\" >&2; done"}, {});
  return r.err;
}
}  // namespace

// zt train --trace refuses to overwrite a file that is not a trace; so does zt probe, before the
// program runs (the library would refuse too, and the program would run unrecorded).
TEST(ProbeCommand, AnOutputThatIsNotATraceIsRefused) {
  TempDir dir;
  std::string notes = dir.file("notes.txt");
  std::ofstream(notes) << "my notes\n";
  RunResult r = zt_probe({"-o", notes, "--", "/bin/true"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(notes + ": exists and is not a zerotrace trace; refusing to overwrite it"), std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(file_bytes(notes), "my notes\n");
  RunResult d = zt_probe({"-o", dir.path(), "--", "/bin/true"});
  EXPECT_EQ(d.code, 2) << d.err;
  EXPECT_NE(d.err.find("is a directory"), std::string::npos) << d.err;

  // A trace there (and an empty file) may be replaced.
  std::string trace = dir.file("t.db");
  ASSERT_EQ(zt_probe({"-o", trace, "--", "/bin/true"}).code, 0);
  r = zt_probe({"-o", trace, "--", "/bin/sh", "-c", "exit 4"});
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_EQ(sql_int(trace, "SELECT exit_code FROM run"), 4);
  std::ofstream(dir.file("empty.db")).close();
  EXPECT_EQ(zt_probe({"-o", dir.file("empty.db"), "--", "/bin/true"}).code, 0);
}

// A program that cannot be executed ran nothing: an error as a shell's (126, or 127 for a missing
// file), no "trace written", and an older trace at -o neither reported as this run's nor touched.
TEST(ProbeCommand, AProgramThatCannotRunIsAnErrorAndTheOldTraceStays) {
  TempDir dir;
  std::string out = dir.file("p.db");
  ASSERT_EQ(zt_probe({"-o", out, "--", ZT_PROBE_WORKLOAD, "leak", "4", std::to_string(2 << 20)}).code, 0);
  const std::string before = file_bytes(out);
  ASSERT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE t_free IS NULL AND weight_bytes IS NULL"), 5);

  std::string garbage = dir.file("garbage");
  std::ofstream(garbage) << "not a program";
  ::chmod(garbage.c_str(), 0755);
  std::string no_interp = dir.file("script");
  std::ofstream(no_interp) << "#!/no/such/interpreter\n";
  ::chmod(no_interp.c_str(), 0755);
  struct Case {
    std::string program;
    int code;
    std::string why;
  };
  for (const Case& c : {Case{dir.path() + "/", 126, "is a directory"}, Case{garbage, 126, "Exec format error"},
                        Case{no_interp, 127, "No such file or directory"}}) {
    RunResult r = zt_probe({"-o", out, "--", c.program});
    EXPECT_EQ(r.code, c.code) << c.program << ": " << r.err;
    EXPECT_NE(r.err.find("cannot run " + c.program + ": " + c.why), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("trace written"), std::string::npos) << r.err;
    EXPECT_EQ(file_bytes(out), before) << c.program;
  }
}

// A program that execs (python through a wrapper, bash -c 'exec ...') or starts probed children
// leaves one trace per process image: the summary names each, says which image held the data, and
// gives the zt db merge command that joins them (their ranks are numbered apart for it).
TEST(ProbeCommand, ExecAndChildrenSayWhereTheDataWentAndMerge) {
  TempDir dir;
  std::string out = dir.file("e.db");
  RunResult r = zt_probe({"-o", out, "--", ZT_PROBE_WORKLOAD, "exec", ZT_PROBE_WORKLOAD, "3", std::to_string(2 << 20)});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("trace written to " + out + ": "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::string("(recorded until it exec'd ") + ZT_PROBE_WORKLOAD + ")"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("after exec, process "), std::string::npos) << r.err;
  const std::string merge_at = "one trace of the 2 finished ones: zt db merge ";
  size_t at = r.err.find(merge_at);
  ASSERT_NE(at, std::string::npos) << r.err;
  // The last line, and a command a shell can run as printed.
  std::string merge = r.err.substr(at + merge_at.size());
  ASSERT_FALSE(merge.empty());
  ASSERT_EQ(merge.back(), '\n');
  merge.pop_back();
  EXPECT_EQ(merge.find('\n'), std::string::npos) << r.err;
  RunResult m = run_program({"/bin/sh", "-c", std::string("'") + ZT_EXE + "' db merge " + merge + " >/dev/null"},
                            {{"LD_PRELOAD", nullptr}});
  ASSERT_EQ(m.code, 0) << merge << "\n" << m.err;
  std::string merged = dir.file("e.merged.db");
  EXPECT_EQ(sql_int(merged, "SELECT count(*) FROM rank"), 2);
  EXPECT_EQ(sql_int(merged, "SELECT count(*) FROM run"), 2);
  EXPECT_EQ(allocations_in(merged, "zt_test_leak_buffers", "t_free IS NULL").size(), 3u);
  // The exit code went to the last image of the program's pid.
  EXPECT_EQ(sql_int(merged, "SELECT count(*) FROM run WHERE exit_code = 0"), 1);

  // The image before the exec is a helper of the process's rank; the last image is the rank.
  EXPECT_NE(r.err.find("rank 0, after exec, process "), std::string::npos) << r.err;
  EXPECT_EQ(sql_int(merged, "SELECT count(*) FROM rank WHERE role = 0"), 1);
  EXPECT_EQ(sql_int(merged, "SELECT count(*) FROM rank WHERE role = 2"), 1);
  EXPECT_EQ(allocations_in(merged, "zt_test_leak_buffers", "t_free IS NULL AND rank = 0").size(), 3u);

  // Children: one trace each, named, and the same merge line. Without a launcher's variables the
  // shell (the root) is the run's one rank and its children are helper processes, named by pid.
  std::string f = dir.file("f.db");
  std::string w = ZT_PROBE_WORKLOAD;
  r = zt_probe({"-o", f, "--", "/bin/sh", "-c", w + " leak 2 2097152 & " + w + " leak 1 2097152; wait"});
  ASSERT_EQ(r.code, 0) << r.err;
  size_t children = 0;
  for (size_t p = r.err.find("helper process "); p != std::string::npos; p = r.err.find("helper process ", p + 1))
    ++children;
  EXPECT_EQ(children, 2u) << r.err;
  EXPECT_NE(r.err.find("zt probe: rank 0: trace written to " + f + ": "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("this run's data is in 3 traces"), std::string::npos) << r.err;
}

// The command line in the run row is quoted so that a shell reads back the same words: for the
// program as typed (ZT_PROBE_COMMAND) and for an exec'd image (read from /proc/self/cmdline).
TEST(ProbeCommand, CommandLinesAreQuotedAsAShellNeeds) {
  TempDir dir;
  std::string out = dir.file("q.db");
  RunResult r = zt_probe({"-o", out, "--", "/bin/sh", "-c", "exit 0", "it's", "a b", "", "$HOME", "x\"y\\z"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto cmd = sql(out, "SELECT command_line FROM run");
  ASSERT_FALSE(cmd.empty());
  EXPECT_EQ(shell_words(cmd[0][0]), "[/bin/sh][-c][exit 0][it's][a b][][$HOME][x\"y\\z]") << cmd[0][0];

  std::string odd_dir = dir.file("it's a dir");
  std::filesystem::create_directory(odd_dir);
  std::string wl = odd_dir + "/wl";
  std::filesystem::create_symlink(ZT_PROBE_WORKLOAD, wl);
  std::string e = dir.file("x.db");
  r = zt_probe({"-o", e, "--", wl, "exec", wl, "1", std::to_string(2 << 20)});
  ASSERT_EQ(r.code, 0) << r.err;
  std::string exec_trace;
  for (auto& entry : std::filesystem::directory_iterator(dir.path()))
    if (entry.path().filename().string().rfind("x.pid", 0) == 0) exec_trace = entry.path().string();
  ASSERT_FALSE(exec_trace.empty()) << r.err;
  cmd = sql(e, "SELECT command_line FROM run");
  ASSERT_FALSE(cmd.empty());
  EXPECT_EQ(shell_words(cmd[0][0]), "[" + wl + "][exec][" + wl + "][1][2097152]") << cmd[0][0];
  cmd = sql(exec_trace, "SELECT command_line FROM run");
  ASSERT_FALSE(cmd.empty());
  EXPECT_EQ(shell_words(cmd[0][0]), "[" + wl + "][leak][1][2097152]") << cmd[0][0];
}

// A process whose trace could not be opened still passes through the exec and _exit hooks: they
// must not touch the recorder it never had (this crashed with SIGSEGV), and it says why once.
TEST(ProbeCommand, AProcessThatCannotOpenItsTraceStillExecs) {
  TempDir dir;
  std::string notes = dir.file("notes.txt");
  std::ofstream(notes) << "my notes\n";
  RunResult r = run_program({"/bin/sh", "-c", "exec /bin/sh -c 'exit 5'"},
                            {{"LD_PRELOAD", probe_library().c_str()}, {"ZT_PROBE_OUTPUT", notes.c_str()},
                             {"ZT_PROBE_QUIET", "1"}});
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_NE(r.err.find("not recording this process: " + notes + ": exists and is not a zerotrace trace"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(file_bytes(notes), "my notes\n");
}
