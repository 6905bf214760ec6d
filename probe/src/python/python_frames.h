// probe/src/python/python_frames.h: the calling thread's Python frames, read from CPython's own
// structures when a stack is recorded, put into the native stack where the interpreter runs them.
//
// Owns: finding an interpreter in the process (its symbols through dlsym: the probe never links
// libpython, so one library serves every python3 from 3.9 to 3.13), the layout of its frames per
// version (probe/README.md says where the numbers come from), and a cache from code objects to
// the Recorder's interned functions. Called by: Recorder::capture_stack (the host hooks) and the
// CUPTI collector's API callback, both inside a ScopedGuard (what they allocate passes through).
//
// Promises, so that it can run inside malloc or a CUDA callback: no Python object is allocated,
// no Python code runs, no reference count changes, no lock of the interpreter is taken. It reads
// memory and calls the few C functions that only read (Py_IsInitialized, PyGILState_Check,
// PyGILState_GetThisThreadState, _PyThreadState_UncheckedGet, PyCode_Addr2Line and their like).
//
// Which frames: the thread's own. While it holds the GIL its frames are the interpreter's
// current ones. While it does not (PyTorch releases the GIL around every operator, so a
// cudaMalloc of its caching allocator runs without it) its frames are frozen where it released
// the GIL: only the thread itself pushes or pops them, and it is busy in the C call the stack is
// being recorded for. They are read then too (mode Own), except while the interpreter finalizes
// (it frees other threads' states); mode Gil reads them only under the GIL.
#pragma once

#include <cstdint>

namespace zt::probe {
class Recorder;
}

namespace zt::probe::python {

enum class Mode : uint8_t {
  Off,  // plain native stacks
  Gil,  // Python frames only while the thread holds the GIL
  Own,  // the thread's own frames, GIL held or released (the default)
};

// Once per process, before recording starts (the probe library's start). Finds the interpreter
// when the process already has one; a process that loads it later is looked at again when its
// list of loaded objects has grown. Never called in `zt` itself: there, Off.
void configure(Mode mode);
// In a child forked without exec that records again: this module's locks made anew (a thread of
// the parent may have held them). What was found about the interpreter stays true.
void child_after_fork();

// What configure() found, for the run row's config and for tests: "3.11 (/usr/bin/python3.11)",
// "no Python in this process", "Python 3.14: frames not read (layout unknown)", "off".
const char* describe();

// native: ips innermost first (n of them, as the unwinder gave them). Writes the stack to intern
// into out (at most cap entries, innermost first): the native ips, with each of the interpreter's
// eval-loop frames (_PyEval_EvalFrameDefault) replaced by the Python frames it runs (tokens of
// Recorder::python_frame_token), innermost first; the Python frames of eval-loop frames beyond the
// native stack's depth limit come after the last native frame. Returns the count. Without an
// interpreter, or without frames readable on this thread, out is a copy of native.
int interleave(Recorder& rec, const uint64_t* native, int n, uint64_t* out, int cap);

// The most Python frames one stack carries (the innermost are kept).
constexpr int kMaxPythonFrames = 128;

}  // namespace zt::probe::python
