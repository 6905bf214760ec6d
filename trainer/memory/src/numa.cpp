// trainer/memory/src/numa.cpp: see zt/memory/numa.h.
#include "zt/memory/numa.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

namespace zt::memory {

namespace {

// The kernel's policy modes (linux/mempolicy.h), without the header.
constexpr int kMpolDefault = 0, kMpolInterleave = 3;
constexpr unsigned long kMpolFAddr = 1UL << 1;
constexpr int kModeMask = 0xff;  // the mode without MPOL_F_STATIC_NODES and the like

size_t page_size() {
  static const size_t p = [] {
    const long s = ::sysconf(_SC_PAGESIZE);
    return s > 0 ? size_t(s) : size_t(4096);
  }();
  return p;
}

size_t whole_pages(size_t bytes) {
  const size_t p = page_size();
  return ((bytes == 0 ? 1 : bytes) + p - 1) / p * p;
}

std::string errno_text(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

// A kernel node list ("0", "0-3", "0,2-3"); empty for empty or unreadable text.
std::set<int> parse_node_list(const std::string& text) {
  std::set<int> nodes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    item.erase(std::remove_if(item.begin(), item.end(), [](unsigned char c) { return std::isspace(c); }), item.end());
    if (item.empty()) continue;
    const size_t dash = item.find('-');
    try {
      const int lo = std::stoi(item.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(item.substr(dash + 1));
      for (int n = lo; n <= hi && n >= 0 && n < 4096; ++n) nodes.insert(n);
    } catch (const std::exception&) {
      return {};
    }
  }
  return nodes;
}

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

std::string mems_allowed_list() {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string key = "Mems_allowed_list:";
  while (std::getline(f, line))
    if (line.compare(0, key.size(), key) == 0) return line.substr(key.size());
  return {};
}

}  // namespace

const char* placement_name(PagePlacement p) { return p == PagePlacement::Interleave ? "interleave" : "local"; }

PagePlacement parse_placement(const std::string& s) {
  if (s == "local") return PagePlacement::Local;
  if (s == "interleave") return PagePlacement::Interleave;
  throw std::invalid_argument("page placement '" + s + "': use local or interleave");
}

const std::vector<int>& numa_nodes() {
  static const std::vector<int> nodes = [] {
    const std::set<int> with_memory = parse_node_list(read_first_line("/sys/devices/system/node/has_memory"));
    const std::set<int> allowed = parse_node_list(mems_allowed_list());
    std::vector<int> v;
    for (int n : with_memory)
      if (allowed.empty() || allowed.count(n)) v.push_back(n);
    if (v.empty()) v.push_back(0);
    return v;
  }();
  return nodes;
}

std::string node_list_text(const std::vector<int>& nodes) {
  std::string s;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(nodes[i]);
    if (j > i) s += "-" + std::to_string(nodes[j]);
    i = j + 1;
  }
  return s;
}

namespace {

// The interleave policy on [p, p + n): "" when set, else why not.
std::string interleave(void* p, size_t n) {
  static const std::vector<unsigned long> mask = [] {
    const std::vector<int>& nodes = numa_nodes();
    std::vector<unsigned long> m(size_t(*std::max_element(nodes.begin(), nodes.end())) / 64 + 1, 0);
    for (int node : nodes) m[size_t(node) / 64] |= 1UL << (node % 64);
    return m;
  }();
  // maxnode counts one past the mask's bits: the kernel reads maxnode - 1 of them.
  if (::syscall(SYS_mbind, p, n, kMpolInterleave, mask.data(), mask.size() * 64 + 1, 0) == 0) return {};
  const int err = errno;
  return errno_text("mbind(MPOL_INTERLEAVE)") +
         (err == EPERM ? " (a container's seccomp profile allows it only with CAP_SYS_NICE)" : "");
}

std::string cannot_interleave(const std::string& why) {
  return "cannot interleave host memory over NUMA nodes " + node_list_text(numa_nodes()) + ": " + why;
}

}  // namespace

const std::string& interleave_refusal() {
  static const std::string why = [] {
    void* p = map_pages(1, PagePlacement::Local);
    if (!p) return errno_text("mmap");
    std::string w = interleave(p, whole_pages(1));
    unmap_pages(p, 1);
    return w;
  }();
  return why;
}

void check_placement(PagePlacement placement) {
  if (placement == PagePlacement::Interleave && numa_nodes().size() > 1 && !interleave_refusal().empty())
    throw std::runtime_error(cannot_interleave(interleave_refusal()));
}

void* map_pages(size_t bytes, PagePlacement placement) {
  const size_t n = whole_pages(bytes);
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (placement == PagePlacement::Interleave) {
    // One node: refused or not, the pages are the same.
    if (std::string why = interleave(p, n); !why.empty() && numa_nodes().size() > 1) {
      ::munmap(p, n);
      throw std::runtime_error(cannot_interleave(why));
    }
  }
  return p;
}

void unmap_pages(void* ptr, size_t bytes) {
  if (ptr) ::munmap(ptr, whole_pages(bytes));
}

PagePlacement placement_of(const void* ptr) {
  int mode = kMpolDefault;
  if (::syscall(SYS_get_mempolicy, &mode, nullptr, 0UL, const_cast<void*>(ptr), kMpolFAddr) != 0)
    throw std::runtime_error(errno_text("get_mempolicy(MPOL_F_ADDR)"));
  return (mode & kModeMask) == kMpolInterleave ? PagePlacement::Interleave : PagePlacement::Local;
}

std::map<int, int64_t> pages_by_node(const void* ptr, size_t bytes) {
  std::map<int, int64_t> count;
  if (bytes == 0) return count;
  const size_t page = page_size();
  const uintptr_t first = reinterpret_cast<uintptr_t>(ptr) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(ptr) + bytes;
  constexpr size_t kBatch = 4096;
  std::vector<void*> pages;
  std::vector<int> status;
  for (uintptr_t a = first; a < end;) {
    pages.clear();
    for (; a < end && pages.size() < kBatch; a += page) pages.push_back(reinterpret_cast<void*>(a));
    status.assign(pages.size(), 0);
    // Nodes null: move_pages only reports where each page is.
    if (::syscall(SYS_move_pages, 0, pages.size(), pages.data(), nullptr, status.data(), 0) != 0)
      throw std::runtime_error(errno_text("move_pages"));
    for (int s : status) ++count[s >= 0 ? s : s == -ENOENT ? -1 : -2];
  }
  return count;
}

}  // namespace zt::memory
