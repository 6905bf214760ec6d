// zt/memory/numa.h: the NUMA nodes the process may use, mappings whose pages interleave over
// them, and where pages lie; and HostBackedSource's interleaved regions. On a host of one node
// (CI) interleaving places every page on that node, which the tests check as far as one node
// allows; the round robin itself is checked only where the host shows several nodes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "zt/memory/memory_source.h"
#include "zt/memory/numa.h"

using namespace zt::memory;

namespace {

const size_t kPage = size_t(::sysconf(_SC_PAGESIZE));

// Where the OS refuses the NUMA system calls (a container's default seccomp profile without
// CAP_SYS_NICE), there is no policy to look at: the tests that look skip, saying so.
#define ZT_REQUIRE_NUMA_CALLS()                                                        \
  do {                                                                                 \
    if (!interleave_refusal().empty()) GTEST_SKIP() << "NUMA policy calls refused: " << interleave_refusal(); \
  } while (0)

int64_t total(const std::map<int, int64_t>& by_node) {
  int64_t n = 0;
  for (const auto& [node, pages] : by_node) n += pages;
  return n;
}

}  // namespace

TEST(Numa, PlacementNamesRoundTripAndABadOneIsRefused) {
  for (PagePlacement p : {PagePlacement::Local, PagePlacement::Interleave})
    EXPECT_EQ(parse_placement(placement_name(p)), p);
  try {
    parse_placement("spread");
    FAIL() << "expected a refusal";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "page placement 'spread': use local or interleave");
  }
}

TEST(Numa, NodeListsReadAsTheKernelWritesThem) {
  EXPECT_EQ(node_list_text({0}), "0");
  EXPECT_EQ(node_list_text({0, 1}), "0-1");
  EXPECT_EQ(node_list_text({0, 2, 3}), "0,2-3");
  EXPECT_EQ(node_list_text({1, 3, 5, 6, 7}), "1,3,5-7");
  EXPECT_EQ(node_list_text({}), "");
}

// Sorted, distinct, and each a node the host has (where sysfs says).
TEST(Numa, NodesAreTheHostsOwn) {
  const std::vector<int> nodes = numa_nodes();
  ASSERT_FALSE(nodes.empty());
  EXPECT_TRUE(std::is_sorted(nodes.begin(), nodes.end()));
  EXPECT_EQ(std::adjacent_find(nodes.begin(), nodes.end()), nodes.end());
  if (std::filesystem::exists("/sys/devices/system/node/node0")) {
    for (int n : nodes) EXPECT_TRUE(std::filesystem::exists("/sys/devices/system/node/node" + std::to_string(n))) << n;
  }
}

// An interleaved mapping carries the policy before any page is touched; once written, every page
// is resident on the process's nodes, and with several nodes spread over them round robin.
TEST(Numa, InterleavedPagesLieOnEveryNodeInTurn) {
  ZT_REQUIRE_NUMA_CALLS();
  const size_t bytes = 64 * kPage + 100;  // 65 pages
  void* p = map_pages(bytes, PagePlacement::Interleave);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(placement_of(p), PagePlacement::Interleave);
  EXPECT_EQ(pages_by_node(p, bytes), (std::map<int, int64_t>{{-1, 65}}));  // nothing faulted in yet
  std::memset(p, 0x5a, bytes);
  const std::map<int, int64_t> by_node = pages_by_node(p, bytes);
  EXPECT_EQ(total(by_node), 65);
  EXPECT_EQ(by_node.count(-1), 0u);
  const std::vector<int> nodes = numa_nodes();
  for (const auto& [node, pages] : by_node)
    EXPECT_NE(std::find(nodes.begin(), nodes.end(), node), nodes.end()) << "a page on node " << node;
  if (nodes.size() > 1) {
    EXPECT_EQ(by_node.size(), nodes.size());
    for (const auto& [node, pages] : by_node) EXPECT_GE(pages, 65 / int64_t(nodes.size())) << node;
  }
  unmap_pages(p, bytes);
}

// A local mapping has the default policy, and pages_by_node tells faulted pages from the rest.
TEST(Numa, LocalPagesAreFaultedInWhereWritten) {
  ZT_REQUIRE_NUMA_CALLS();
  const size_t bytes = 8 * kPage;
  auto* p = static_cast<char*>(map_pages(bytes, PagePlacement::Local));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(placement_of(p), PagePlacement::Local);
  p[3 * kPage] = 1;
  p[5 * kPage + 7] = 1;
  const std::map<int, int64_t> by_node = pages_by_node(p, bytes);
  EXPECT_EQ(by_node.at(-1), 6);
  EXPECT_EQ(total(by_node), 8);
  unmap_pages(p, bytes);
}

// HostBackedSource interleaved: each region its own interleaved mapping, counted and given back as
// an aligned_alloc region is; describe() says so; an alignment above the page is refused.
TEST(Numa, HostBackedSourceHandsOutInterleavedRegions) {
  ZT_REQUIRE_NUMA_CALLS();
  HostBackedSource src(1 << 20, 4096, PagePlacement::Interleave);
  EXPECT_EQ(src.placement(), PagePlacement::Interleave);
  EXPECT_NE(src.describe().find("pages interleaved over NUMA nodes " + node_list_text(numa_nodes())), std::string::npos)
      << src.describe();
  void* a = src.allocate(10000);
  void* b = src.allocate(4096);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(src.in_use(), size_t(12288 + 4096));
  EXPECT_EQ(placement_of(a), PagePlacement::Interleave);
  EXPECT_EQ(placement_of(b), PagePlacement::Interleave);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kPage, 0u);
  std::memset(a, 1, 10000);
  EXPECT_EQ(src.allocate(1 << 20), nullptr);  // past the capacity: no room, as before
  src.release(a, 10000);
  src.release(b, 4096);
  EXPECT_EQ(src.in_use(), 0u);

  HostBackedSource local(1 << 20);
  void* c = local.allocate(4096);
  EXPECT_EQ(placement_of(c), PagePlacement::Local);
  EXPECT_EQ(local.describe().find("interleaved"), std::string::npos);
  local.release(c, 4096);

  EXPECT_THROW(HostBackedSource(1 << 20, 2 * kPage, PagePlacement::Interleave), std::invalid_argument);
}
