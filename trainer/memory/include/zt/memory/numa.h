// zt/memory/numa.h: where host pages lie on a host of several NUMA nodes, and host memory
// mapped with its pages interleaved over them (numactl --interleave for one mapping).
//
// Why: the offload's CPU AdamW streams the fp32 master weights, both moments and the gradient
// partition through host memory, bound by the bandwidth it gets. Pinned memory from
// cudaHostAlloc (or any buffer first written by one thread) has its pages on the NUMA node of
// the thread that made it, so the AdamW threads of every other node read it across the
// socket link and the pass gets one node's memory bandwidth. Interleaved pages (round robin
// over the nodes the process may use) let every node's memory serve the pass.
//
// Owns: mappings made by map_pages() until unmap_pages(). Linux system calls only (mmap,
// mbind, get_mempolicy, move_pages), no libnuma. On a host of one NUMA node an interleaved
// mapping is an ordinary one with the interleave policy over that node: the same pages (and
// where the OS refuses the policy there, as a container's seccomp profile may, just an ordinary
// one). Interleaving goes by the page the mapping gets: 2 MiB where transparent huge pages are on.
// May call: nothing of zerotrace's. Called by: memory_source.cpp (HostBackedSource), the CUDA
// pinned source (mapped, then cudaHostRegister), bench_gpu_limits, tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zt::memory {

enum class PagePlacement : uint8_t {
  Local,       // the OS's default: the node of the thread that first writes a page (or that pins it)
  Interleave,  // round robin over numa_nodes(), page by page
};

// "local" / "interleave".
const char* placement_name(PagePlacement p);
// Parses placement_name()'s words; throws std::invalid_argument naming the accepted ones.
PagePlacement parse_placement(const std::string& s);

// The NUMA nodes this process may take memory from: the nodes with memory
// (/sys/devices/system/node/has_memory) that are in its Mems_allowed (/proc/self/status), read
// once. {0} when the host does not say (no NUMA support in the kernel).
const std::vector<int>& numa_nodes();
// "0", "0-1", "0,2-3".
std::string node_list_text(const std::vector<int>& nodes);

// Why the OS refuses the interleave policy (mbind's errno text; in a container, seccomp allows it
// only with CAP_SYS_NICE), or "" when it sets it. Asked once.
const std::string& interleave_refusal();
// Throws std::runtime_error when map_pages(., placement) would: Interleave on a host of several
// nodes whose OS refuses the policy. For a source's constructor, so that its allocate() never does.
void check_placement(PagePlacement placement);

// `bytes` (rounded up to whole pages) of anonymous private memory; with Interleave, its pages
// are bound to interleave over numa_nodes() before any is touched (the policy places each page
// when it is first faulted in, by whichever thread). nullptr when the OS has no memory to map.
// Throws std::runtime_error when the interleave policy cannot be set on a host of several nodes,
// naming the system call and errno's text (on one node the mapping is returned without it).
void* map_pages(size_t bytes, PagePlacement placement);
// Returns a mapping of map_pages() (the same `bytes`).
void unmap_pages(void* ptr, size_t bytes);

// The mapping's own policy at ptr (get_mempolicy MPOL_F_ADDR): Interleave for MPOL_INTERLEAVE,
// Local otherwise (also for a process run under numactl --interleave: that policy is the
// process's, not the mapping's). Throws std::runtime_error when the OS will not say.
PagePlacement placement_of(const void* ptr);
// Pages of [ptr, ptr + bytes) by the node they are on (move_pages, querying only); -1 counts the
// pages not faulted in yet, -2 those the OS could not place (another error). Looks at every page,
// so it is for tests and benchmarks. Throws std::runtime_error when the OS will not say.
std::map<int, int64_t> pages_by_node(const void* ptr, size_t bytes);

}  // namespace zt::memory
