// A Python exception's kind, devices and site (see zt/probe/python_error.h).
#include "zt/probe/python_error.h"

#include <regex>

namespace zt::probe {

namespace {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The innermost frame of a Python traceback: its last `File "x.py", line N, in f` line.
std::string innermost_frame(std::string_view report) {
  static const std::regex frame(R"re(^\s*File "(.*)", line ([0-9]+), in (.*)$)re");
  std::string site;
  size_t start = 0;
  while (start < report.size()) {
    size_t end = report.find('\n', start);
    if (end == std::string_view::npos) end = report.size();
    std::string line(report.substr(start, end - start));
    std::smatch m;
    if (std::regex_match(line, m, frame)) site = m.str(1) + ":" + m.str(2) + " in " + m.str(3);
    start = end + 1;
  }
  return site;
}

std::string first_line(std::string_view s) { return std::string(s.substr(0, s.find('\n'))); }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

PythonError classify_python_exception(std::string_view type, std::string_view text, std::string_view report) {
  PythonError e;
  e.site = innermost_frame(report);
  const std::string t(text);
  if (t.find("Expected all tensors to be on the same device") != std::string::npos ||
      t.rfind("Expected a cuda device, but got", 0) == 0) {
    e.kind = "device_mismatch";
    static const std::regex device(R"re(\b(cpu|cuda:[0-9]+|cuda|mps|xpu:[0-9]+|meta|hpu:[0-9]+)\b)re");
    for (auto it = std::sregex_iterator(t.begin(), t.end(), device); it != std::sregex_iterator(); ++it) {
      const std::string d = it->str(1);
      bool seen = false;
      for (auto& x : e.devices) seen = seen || x == d;
      if (!seen) e.devices.push_back(d);
    }
    if (!e.devices.empty()) {
      e.tensors = "[";
      for (size_t i = 0; i < e.devices.size(); ++i) e.tensors += (i ? "," : "") + json_string("@" + e.devices[i]);
      e.tensors += "]";
      e.device = e.devices.front();
    }
  } else if (ends_with(type, "OutOfMemoryError") || t.rfind("CUDA out of memory.", 0) == 0) {
    e.kind = "oom";
    static const std::regex gpu(R"re(GPU ([0-9]+) has a total capacity of)re");
    std::smatch m;
    if (std::regex_search(t, m, gpu)) {
      e.device = "cuda:" + m.str(1);
      e.devices.push_back(e.device);
    }
  } else if (t.find("Watchdog caught collective operation timeout") != std::string::npos) {
    e.kind = "watchdog_timeout";
  } else {
    e.kind = "uncaught_exception";
  }
  e.message = e.kind == "uncaught_exception" ? (t.empty() ? std::string(type) : std::string(type) + ": " + t) : t;
  e.exit_detail = "uncaught " + std::string(type) + (e.site.empty() ? "" : " at " + e.site) + ": " + first_line(text);
  if (!report.empty()) {
    e.exit_detail += "\n" + std::string(report);
    while (!e.exit_detail.empty() && e.exit_detail.back() == '\n') e.exit_detail.pop_back();
  }
  return e;
}

}  // namespace zt::probe
