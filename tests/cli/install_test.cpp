// `cmake --install` of this build into a fresh prefix: the installed zt runs from there, its
// libraries load (the run paths of those outside the build tree, CUDA's, are kept), and it finds
// its probe library in lib/zerotrace, the scenarios in share/zerotrace/scenarios and the zerotrace
// Python package (with zt probe's bootstrap) in share/zerotrace/python.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "../test_util.h"

namespace fs = std::filesystem;

TEST(Install, InstalledZtRunsAndFindsItsProbeLibraryAndScenarios) {
  zt::test::TempDir dir;
  const std::string prefix = dir.file("prefix");
  const auto inst = zt::test::run_command(std::string(ZT_CMAKE_COMMAND) + " --install " + ZT_BUILD_DIR + " --prefix " +
                                          prefix + " 2>&1");
  ASSERT_EQ(inst.code, 0) << inst.out;
  const std::string zt = prefix + "/bin/zt";
  ASSERT_TRUE(fs::exists(zt)) << inst.out;
  std::string probe_lib;
  for (const auto& e : fs::recursive_directory_iterator(prefix))
    if (e.path().filename() == "libzt_probe.so") probe_lib = e.path().string();
  EXPECT_NE(probe_lib.find("/zerotrace/libzt_probe.so"), std::string::npos) << probe_lib;
  EXPECT_FALSE(fs::exists(prefix + "/bin/libzt_probe.so"));  // so the lookup below is the installed one
  EXPECT_TRUE(fs::exists(prefix + "/share/zerotrace/scenarios/r2-qwen72b-offload-device-mismatch.yaml"));

  for (const std::string& file : {zt, probe_lib}) {
    const auto ldd = zt::test::run_command("ldd " + file + " 2>&1");
    EXPECT_EQ(ldd.out.find("not found"), std::string::npos) << file << ":\n" << ldd.out;
  }
  // From another directory, without ZT_PROBE_LIBRARY: the probe library is found where it was installed.
  const auto probe = zt::test::run_command("cd " + dir.path() + " && env -u ZT_PROBE_LIBRARY " + zt +
                                           " probe -o p.db -- /bin/true 2>&1");
  EXPECT_EQ(probe.code, 0) << probe.out;
  EXPECT_NE(probe.out.find("trace written to " + dir.file("p.db")), std::string::npos) << probe.out;
  // The Python package, found where it was installed; a probed Python program imports it.
  EXPECT_TRUE(fs::exists(prefix + "/share/zerotrace/python/zt_bootstrap/sitecustomize.py"));
  const auto where = zt::test::run_command(zt + " probe --python-path 2>&1");
  EXPECT_EQ(where.code, 0) << where.out;
  EXPECT_EQ(where.out, fs::weakly_canonical(prefix + "/share/zerotrace/python").string() + "\n");
  if (::access("/usr/bin/python3", X_OK) == 0) {
    const auto py = zt::test::run_command("cd " + dir.path() + " && env -u ZT_PROBE_LIBRARY " + zt +
                                          " probe -o py.db -- /usr/bin/python3 -c 'import zerotrace; "
                                          "print(zerotrace.__file__, zerotrace.recording())' 2>/dev/null");
    EXPECT_EQ(py.code, 0) << py.out;
    EXPECT_EQ(py.out, fs::weakly_canonical(prefix + "/share/zerotrace/python/zerotrace/__init__.py").string() + " True\n");
  }
}
