// zt check: runs the chosen checks on one trace, and writes their report as text and JUnit XML.
#include "zt/check/check.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "trace_data.h"

namespace zt::check {

const char* to_string(Outcome o) {
  switch (o) {
    case Outcome::Pass: return "PASS";
    case Outcome::Fail: return "FAIL";
    case Outcome::Skip: return "SKIP";
    case Outcome::CannotRun: return "CANNOT RUN";
  }
  return "?";
}

bool Report::failed() const { return count(Outcome::Fail) > 0 || count(Outcome::CannotRun) > 0; }

int Report::count(Outcome o) const {
  int n = 0;
  for (auto& c : checks) n += c.outcome == o;
  return n;
}

Status run_checks(const std::string& trace_path, const Options& options, Report* out) {
  *out = Report{};
  out->trace = trace_path;
  std::unique_ptr<detail::TraceData> d;
  if (Status s = detail::TraceData::load(trace_path, &d); !s) return s;
  const bool all = options.none_chosen();
  auto timed = [&](auto&& fn) -> Status {
    auto t0 = std::chrono::steady_clock::now();
    CheckResult r;
    Status s = fn(&r);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // A check the command line asked for that could not look does not pass.
    if (!all && r.outcome == Outcome::Skip) r.outcome = Outcome::CannotRun;
    if (s) out->checks.push_back(std::move(r));
    return s;
  };
  if (all || options.run)
    if (Status s = timed([&](CheckResult* r) { return detail::check_run(*d, r); }); !s) return s;
  if (all || options.leaks)
    if (Status s = timed([&](CheckResult* r) { return detail::check_leaks(*d, options, r); }); !s) return s;
  if (all || options.placement)
    if (Status s = timed([&](CheckResult* r) { return detail::check_placement(*d, options, r); }); !s) return s;
  if (options.budget)
    if (Status s = timed([&](CheckResult* r) { return detail::check_budget(*d, *options.budget, r); }); !s) return s;
  if (all || options.steps || options.expected_steps)
    if (Status s = timed([&](CheckResult* r) { return detail::check_steps(*d, options, r); }); !s) return s;
  return Status::Ok();
}

std::string format_text(const Report& report) {
  std::string out = "zt check " + report.trace + "\n";
  for (auto& c : report.checks) {
    out += std::string(to_string(c.outcome)) + " " + c.name + ": " + c.summary + "\n";
    // A line of several (a Python traceback in a run's end) keeps its indent on each.
    auto indented = [](const std::string& text, const char* indent) {
      std::string t;
      for (char ch : text) t += ch == '\n' ? std::string("\n") + indent : std::string(1, ch);
      return t;
    };
    for (auto& f : c.findings) out += "  - " + indented(f, "    ") + "\n";
    for (auto& x : c.context) out += "    " + indented(x, "    ") + "\n";
  }
  const int failed = report.count(Outcome::Fail), passed = report.count(Outcome::Pass),
            skipped = report.count(Outcome::Skip), cannot = report.count(Outcome::CannotRun);
  out += "zt check: ";
  auto names = [&](Outcome o) {
    std::string n;
    for (auto& c : report.checks)
      if (c.outcome == o) n += (n.empty() ? "" : ", ") + c.name;
    return n;
  };
  if (failed || cannot) {
    out += "FAILED (";
    if (failed) out += names(Outcome::Fail) + " failed, ";
    if (cannot) out += names(Outcome::CannotRun) + " could not run, ";
  } else {
    out += "ok (";
  }
  out += std::to_string(passed) + " passed";
  if (skipped) out += ", " + std::to_string(skipped) + " skipped";
  out += ")\n";
  return out;
}

namespace {

// XML 1.0 text: markup characters escaped, control characters it cannot carry replaced.
std::string xml(const std::string& s, bool attribute) {
  std::string o;
  o.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += attribute ? "&quot;" : "\""; break;
      case '\'': o += attribute ? "&apos;" : "'"; break;
      case '\n': o += attribute ? "&#10;" : "\n"; break;
      case '\t': o += attribute ? "&#9;" : "\t"; break;
      case '\r': o += attribute ? "&#13;" : "\r"; break;
      default: o += c < 0x20 ? '?' : char(c);
    }
  }
  return o;
}

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", s);
  return b;
}

}  // namespace

std::string junit_xml(const Report& report) {
  const int failures = report.count(Outcome::Fail), skipped = report.count(Outcome::Skip),
            errors = report.count(Outcome::CannotRun);
  double total = 0;
  for (auto& c : report.checks) total += c.seconds;
  const std::string counts = " tests=\"" + std::to_string(report.checks.size()) + "\" failures=\"" +
                             std::to_string(failures) + "\" errors=\"" + std::to_string(errors) + "\" skipped=\"" + std::to_string(skipped) +
                             "\" time=\"" + seconds(total) + "\"";
  std::string o = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<testsuites name=\"zt check\"" + counts + ">\n";
  o += "  <testsuite name=\"zt check\"" + counts + ">\n";
  o += "    <properties><property name=\"trace\" value=\"" + xml(report.trace, true) + "\"/></properties>\n";
  for (auto& c : report.checks) {
    o += "    <testcase classname=\"zt check\" name=\"" + xml(c.name, true) + "\" time=\"" + seconds(c.seconds) + "\"";
    if (c.outcome == Outcome::Pass) {
      o += ">\n      <system-out>" + xml(c.summary, false) + "</system-out>\n    </testcase>\n";
      continue;
    }
    o += ">\n";
    std::string body;
    for (auto& f : c.findings) body += f + "\n";
    for (auto& x : c.context) body += "  " + x + "\n";
    if (c.outcome == Outcome::Skip) {
      o += "      <skipped message=\"" + xml(c.summary, true) + "\"/>\n";
    } else if (c.outcome == Outcome::CannotRun) {
      // Named on the command line and could not look: an error of the test, not a skip.
      o += "      <error message=\"" + xml(c.summary, true) + "\" type=\"cannot run\">" + xml(body, false) +
           "</error>\n";
    } else {
      o += "      <failure message=\"" + xml(c.summary, true) + "\" type=\"" + xml(c.name, true) + "\">" +
           xml(body, false) + "</failure>\n";
    }
    o += "    </testcase>\n";
  }
  o += "  </testsuite>\n</testsuites>\n";
  return o;
}

std::string junit_xml_error(const std::string& trace_path, const std::string& message) {
  const std::string counts = " tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\" time=\"0.000\"";
  std::string o = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<testsuites name=\"zt check\"" + counts + ">\n";
  o += "  <testsuite name=\"zt check\"" + counts + ">\n";
  o += "    <properties><property name=\"trace\" value=\"" + xml(trace_path, true) + "\"/></properties>\n";
  o += "    <testcase classname=\"zt check\" name=\"trace\" time=\"0.000\">\n";
  o += "      <error message=\"" + xml(message, true) + "\" type=\"bad input\"/>\n";
  o += "    </testcase>\n  </testsuite>\n</testsuites>\n";
  return o;
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp-" + std::to_string(getpid());
  auto fail = [&](const char* what) {
    std::string msg = path + ": cannot write (" + what + ": " + std::strerror(errno) + ")";
    ::unlink(tmp.c_str());
    return Status::Error(msg);
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Error(path + ": cannot write (" + std::strerror(errno) + ")");
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return fail("write");
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return fail("fsync");
  }
  if (::close(fd) != 0) return fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename");
  return Status::Ok();
}

}  // namespace zt::check
