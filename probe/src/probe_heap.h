// probe/src/probe_heap.h: the memory the probe keeps, apart from the program's heap.
//
// What the Recorder keeps for the whole run (interned names, stacks and frames, each thread's
// ring) is allocated here, from pages the probe maps itself (a raw mmap syscall, never the hooks),
// never from the program's malloc arenas. Kept there, each long-lived node landed between the
// program's blocks, above blocks it later freed: the heap's top could no longer be trimmed, and a
// probed HF Trainer job held 230 MiB more resident memory after 800 steps than unprobed (all of it
// free, returned by malloc_trim), which the leak check's RSS witness then reported as growth.
// Invariant: the resource is never destroyed (the Recorder may run inside atexit handlers).
#pragma once

#include <memory_resource>

namespace zt::probe {

// Thread-safe (a pool over mmap'd chunks behind one mutex); large blocks are mappings of their own.
std::pmr::memory_resource* probe_heap();

// Around fork (probe_main.cpp's handlers): the forking thread takes the heap's mutex, so that no other
// thread is inside the pool when the child is made (a child that inherited it held hung at its first
// interned name); parent and child let it go.
void probe_heap_lock_for_fork();
void probe_heap_unlock_after_fork();

}  // namespace zt::probe
