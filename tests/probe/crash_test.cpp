// Post-mortem: a child really dies (abort, SIGSEGV, uncaught exception, SIGTERM, SIGKILL
// mid-write) and its trace still opens with everything it had committed.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "../test_util.h"
#include "zt/db/trace_reader.h"

extern char** environ;
using namespace zt::db;

namespace {

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  int64_t ready = -1;
};

Child spawn_child(const std::string& mode, const std::string& path) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::string exe = ZT_CRASH_CHILD;
  char* argv[] = {exe.data(), const_cast<char*>(mode.c_str()), const_cast<char*>(path.c_str()), nullptr};
  Child c;
  EXPECT_EQ(posix_spawn(&c.pid, exe.c_str(), &fa, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  c.out = fdopen(fds[0], "r");
  long long n = -1;
  if (fscanf(c.out, "ready %lld", &n) == 1) c.ready = n;
  return c;
}

int wait_child(Child& c) {
  int status = 0;
  waitpid(c.pid, &status, 0);
  fclose(c.out);
  return status;
}

struct Opened {
  RunRow run;
  int64_t allocations = 0, markers = 0;
  std::vector<ErrorRow> errors;
  std::string integrity;
};

Opened open_trace(const std::string& path) {
  Opened o;
  std::unique_ptr<TraceReader> r;
  zt::Status s = TraceReader::open(path, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return o;
  std::vector<RunRow> runs;
  EXPECT_TRUE(r->read(&runs).ok());
  EXPECT_EQ(runs.size(), 1u);
  if (!runs.empty()) o.run = runs[0];
  EXPECT_TRUE(r->row_count("allocation", &o.allocations).ok());
  EXPECT_TRUE(r->row_count("marker", &o.markers).ok());
  EXPECT_TRUE(r->read(&o.errors).ok());
  QueryResult q;
  EXPECT_TRUE(r->query("PRAGMA integrity_check", &q).ok());
  if (!q.rows.empty()) o.integrity = q.rows[0][0];
  return o;
}

}  // namespace

class Crash : public ::testing::Test {
 protected:
  zt::test::TempDir dir;
  std::string path = dir.file("crash.db");
};

TEST_F(Crash, AbortLeavesAReadableTraceMarkedWithTheSignal) {
  Child c = spawn_child("abort", path);
  ASSERT_EQ(c.ready, 1020);
  int status = wait_child(c);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGABRT);  // the signal still takes its course
  Opened t = open_trace(path);
  EXPECT_EQ(t.integrity, "ok");
  EXPECT_EQ(t.run.status, RunStatus::Signal);
  EXPECT_NE(t.run.exit_detail.find("SIGABRT"), std::string::npos) << t.run.exit_detail;
  EXPECT_TRUE(t.run.t_end.has_value());
  EXPECT_EQ(t.allocations, 1000);
  EXPECT_EQ(t.markers, 10);
}

TEST_F(Crash, SegfaultLeavesAReadableTrace) {
  Child c = spawn_child("segv", path);
  ASSERT_EQ(c.ready, 1020);
  int status = wait_child(c);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  Opened t = open_trace(path);
  EXPECT_EQ(t.integrity, "ok");
  EXPECT_EQ(t.run.status, RunStatus::Signal);
  EXPECT_NE(t.run.exit_detail.find("SIGSEGV"), std::string::npos) << t.run.exit_detail;
  EXPECT_EQ(t.allocations, 1000);
}

TEST_F(Crash, UncaughtExceptionIsRecordedAsAnError) {
  Child c = spawn_child("throw", path);
  ASSERT_EQ(c.ready, 1020);
  int status = wait_child(c);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGABRT);
  Opened t = open_trace(path);
  EXPECT_EQ(t.run.status, RunStatus::Terminated);
  ASSERT_EQ(t.errors.size(), 1u);
  EXPECT_EQ(t.errors[0].message,
            "terminate called after throwing an instance of 'std::runtime_error': boom: optimizer state on the wrong "
            "device");
  EXPECT_EQ(t.allocations, 1000);
}

TEST_F(Crash, SigbusLeavesAReadableTrace) {
  Child c = spawn_child("sigbus", path);
  ASSERT_EQ(c.ready, 1020);
  int status = wait_child(c);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGBUS);
  Opened t = open_trace(path);
  EXPECT_EQ(t.run.status, RunStatus::Signal);
  EXPECT_NE(t.run.exit_detail.find("SIGBUS"), std::string::npos) << t.run.exit_detail;
  EXPECT_EQ(t.allocations, 1000);
}

// SIGTERM and SIGINT arrive while the child is still writing.
class CrashWhileWriting : public Crash, public ::testing::WithParamInterface<int> {};

TEST_P(CrashWhileWriting, FlushesEverythingAndMarksTheRun) {
  int sig = GetParam();
  Child c = spawn_child(sig == SIGTERM ? "sigterm" : "sigint", path);
  ASSERT_EQ(c.ready, 1020);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(c.pid, sig);
  int status = wait_child(c);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), sig);
  Opened t = open_trace(path);
  EXPECT_EQ(t.integrity, "ok");
  EXPECT_EQ(t.run.status, RunStatus::Signal);
  EXPECT_NE(t.run.exit_detail.find(sig == SIGTERM ? "SIGTERM" : "SIGINT"), std::string::npos) << t.run.exit_detail;
  EXPECT_GT(t.allocations, 1000);  // it kept writing after "ready", and those rows are here
}

INSTANTIATE_TEST_SUITE_P(Signals, CrashWhileWriting, ::testing::Values(SIGTERM, SIGINT));

TEST_F(Crash, SigkillMidWriteKeepsEverythingCommitted) {
  Child c = spawn_child("sigkill", path);
  ASSERT_EQ(c.ready, 1020);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(c.pid, SIGKILL);
  int status = wait_child(c);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  Opened t = open_trace(path);
  EXPECT_EQ(t.integrity, "ok");
  EXPECT_EQ(t.run.status, RunStatus::Running);  // the end is unknown, and says so
  EXPECT_FALSE(t.run.t_end.has_value());
  // Everything up to "ready" was committed, and the commits every 20 ms carried on while
  // the child kept writing for 300 ms more.
  EXPECT_GT(t.allocations, 1000);
}

TEST_F(Crash, ExitWithoutCloseStillEndsTheRun) {
  Child c = spawn_child("exit", path);
  ASSERT_EQ(c.ready, 1020);
  int status = wait_child(c);
  ASSERT_TRUE(WIFEXITED(status));
  Opened t = open_trace(path);
  EXPECT_EQ(t.run.status, RunStatus::Ok);
  EXPECT_EQ(t.allocations, 1000);
}
