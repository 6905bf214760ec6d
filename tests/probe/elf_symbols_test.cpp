// The symbolizer's parts (probe/src/elf_symbols.h): LoadedModules says what dladdr says of an
// address (its object, where that begins), and ElfSymbols names a library's exported function as
// the loader knows it, so that frames come out as they did when each was asked of dladdr.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <errno.h>  // program_invocation_name
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "elf_symbols.h"

using zt::probe::ElfSymbols;
using zt::probe::LoadedModules;

namespace {

__attribute__((noinline)) int own_function(int x) { return x * 3 + 1; }

// Code addresses in the program, in libc, in libstdc++ and libm, and a little way into each function.
std::vector<uint64_t> code_addresses() {
  std::vector<void*> fns = {reinterpret_cast<void*>(&own_function), reinterpret_cast<void*>(&::write),
                            reinterpret_cast<void*>(&std::qsort), reinterpret_cast<void*>(&::strtod),
                            reinterpret_cast<void*>(&dlopen), reinterpret_cast<void*>(&::abort)};
  void* cos_fn = dlsym(RTLD_DEFAULT, "cos");
  if (cos_fn) fns.push_back(cos_fn);
  void* terminate = dlsym(RTLD_DEFAULT, "_ZSt9terminatev");  // std::terminate, in libstdc++
  if (terminate) fns.push_back(terminate);
  std::vector<uint64_t> out;
  for (void* f : fns)
    for (uint64_t off : {0, 1, 7})
      if (f) out.push_back(reinterpret_cast<uint64_t>(f) + off);
  return out;
}

TEST(LoadedModules, AgreesWithDladdrOnObjectAndBase) {
  LoadedModules mods;
  mods.snapshot();
  ASSERT_GE(mods.size(), 3u);  // the program, libc, the loader at least
  for (uint64_t a : code_addresses()) {
    Dl_info info{};
    ASSERT_NE(dladdr(reinterpret_cast<void*>(a), &info), 0) << std::hex << a;
    const LoadedModules::Module* m = mods.find(a);
    ASSERT_NE(m, nullptr) << std::hex << a << " in " << info.dli_fname;
    // dladdr names the program argv[0]; the listing names it "".
    EXPECT_EQ(m->name.empty() ? std::string(program_invocation_name) : m->name, std::string(info.dli_fname));
    EXPECT_EQ(m->base, reinterpret_cast<uint64_t>(info.dli_fbase)) << info.dli_fname;
  }
}

TEST(LoadedModules, NoObjectForHeapOrUnmappedAddresses) {
  LoadedModules mods;
  mods.snapshot();
  void* heap = std::malloc(64);
  Dl_info info{};
  if (dladdr(heap, &info) == 0) {
    EXPECT_EQ(mods.find(reinterpret_cast<uint64_t>(heap)), nullptr);
  }
  std::free(heap);
  EXPECT_EQ(mods.find(0), nullptr);
  EXPECT_EQ(mods.find(8), nullptr);
  EXPECT_EQ(mods.find(~uint64_t(0)), nullptr);
}

// The name the file's table gives an exported function is one the loader puts at that address
// (libc has aliases at one address, malloc and __libc_malloc: either is the function).
TEST(ElfSymbols, NamesExportedFunctionsAsTheLoaderHasThem) {
  LoadedModules mods;
  mods.snapshot();
  int named = 0;
  for (uint64_t a : code_addresses()) {
    Dl_info info{};
    ASSERT_NE(dladdr(reinterpret_cast<void*>(a), &info), 0);
    if (!info.dli_sname) continue;  // own_function: not exported
    std::string path = info.dli_fname;
    ASSERT_EQ(path[0], '/') << path;
    ElfSymbols table;
    ASSERT_TRUE(table.load(path)) << path;
    const LoadedModules::Module* m = mods.find(a);
    ASSERT_NE(m, nullptr);
    const uint64_t rel = table.position_independent() ? a - m->base + table.first_load_address() : a;
    const char* name = table.find(rel);
    ASSERT_NE(name, nullptr) << path << " +" << std::hex << rel;
    // The program itself (under ASan its interceptors, malloc among them, live in the executable) is
    // dlopen(nullptr): the loader does not find the main program by its path.
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    const bool self = n > 0 && path == std::string(exe, size_t(n));
    void* handle = self ? dlopen(nullptr, RTLD_LAZY) : dlopen(path.c_str(), RTLD_NOLOAD | RTLD_LAZY);
    ASSERT_NE(handle, nullptr) << path;
    void* where = dlsym(handle, name);
    dlclose(handle);
    EXPECT_EQ(where, info.dli_saddr) << name << " vs dladdr's " << info.dli_sname << " in " << path;
    ++named;
  }
  EXPECT_GE(named, 4);
}

TEST(ElfSymbols, ProgramsOwnStaticFunctionFromItsSymtab) {
  LoadedModules mods;
  mods.snapshot();
  const uint64_t a = reinterpret_cast<uint64_t>(&own_function) + 1;
  const LoadedModules::Module* m = mods.find(a);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->name.empty()) << m->name;  // the program itself
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  exe[n] = 0;
  ElfSymbols table;
  ASSERT_TRUE(table.load(exe));
  const uint64_t rel = table.position_independent() ? a - m->base + table.first_load_address() : a;
  const char* name = table.find(rel);
  ASSERT_NE(name, nullptr);
  EXPECT_NE(std::strstr(name, "own_function"), nullptr) << name;
}

}  // namespace
