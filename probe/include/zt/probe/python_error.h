// zt/probe/python_error.h: a Python program's uncaught exception as an `error` row, with
// PyTorch's texts read as zt's own reproductions write them, so that a user's failing run and
// `zt repro`'s reproduction compare row for row.
//
// Owns: the classification of an exception's type and text (plain code, unit-tested). The
// probe library calls it from zt_probe_python_exception, which the zerotrace package's
// bootstrap calls from sys.excepthook (python/zerotrace/hooks/exceptions.py).
//
// Kinds (the `error.kind` zt's trainer writes for the same failure):
//   device_mismatch  "Expected all tensors to be on the same device, but found at least two
//                    devices, cuda:1 and cpu!" (and PyTorch's other wordings of it: "... but got
//                    index is on cuda:0, different from other tensors on cpu"); `tensors` holds
//                    the devices named, in the text's order, as ["@cuda:1","@cpu"] (a tensor's
//                    entry is "name@device"; the program's text names no tensor).
//   oom              torch.OutOfMemoryError / torch.cuda.OutOfMemoryError, or PyTorch's "CUDA out
//                    of memory. Tried to allocate ..." text: the figures stay in the message,
//                    which is PyTorch's word for word; `device` is the GPU it names ("cuda:0").
//   watchdog_timeout "Watchdog caught collective operation timeout" (PyTorch's NCCL watchdog).
//   uncaught_exception  anything else; the message then starts with the type ("ValueError: ...").
// `site` is the innermost frame of the traceback ("loop.py:12 in step"); `message` is the
// exception's own text (for the kinds above exactly as PyTorch wrote it).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace zt::probe {

struct PythonError {
  std::string kind;
  std::string site;
  std::string message;
  std::vector<std::string> devices;  // device labels the text names ("cuda:1", "cpu")
  std::string tensors;               // JSON array for error.tensors, "" when none
  std::string device;                // the device the error belongs to, "" when unknown
  // One line, then the report as Python printed it: the run's exit detail.
  std::string exit_detail;
};

// type: the exception's type as Python prints it ("RuntimeError", "torch.OutOfMemoryError");
// text: str(exception); report: traceback.format_exception's text (traceback, chained
// exceptions, the final "Type: text" line); it may be empty.
PythonError classify_python_exception(std::string_view type, std::string_view text, std::string_view report);

}  // namespace zt::probe
