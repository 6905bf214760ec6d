// A DeepSpeed config's text: comments, trailing commas, duplicate keys, depth (json_text.h).
#include "train/json_text.h"

#include <map>
#include <vector>

namespace zt::trainer {

namespace {

struct Frame {
  bool object = false;
  std::string name;                   // the key that holds this object ("" at the top)
  std::map<std::string, int> keys;    // key -> the line it was first given on
  bool expect_key = false;            // in an object: the next string is a key
};

std::string where(const std::vector<Frame>& stack) {
  std::string w;
  for (const Frame& f : stack)
    if (!f.name.empty()) w += (w.empty() ? "" : ".") + f.name;
  return w.empty() ? "the top level" : w;
}

}  // namespace

std::string quote_value(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() <= 80) return s;
  std::string n = std::to_string(s.size()), grouped;
  for (size_t i = 0; i < n.size(); ++i) {
    if (i && (n.size() - i) % 3 == 0) grouped += ',';
    grouped += n[i];
  }
  return s.substr(0, 60) + "... (" + grouped + " characters)";
}

Status parse_config_text(const std::string& text, const std::string& path, nlohmann::json* out) {
  std::string clean = text;
  std::vector<Frame> stack;
  int line = 1;
  long pending_comma = -1;  // a comma whose next token is not yet known
  std::string last_key;     // the last key read: the name of an object that opens next
  int last_key_line = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char ch = text[i];
    if (ch == '\n') {
      ++line;
      continue;
    }
    if (ch == ' ' || ch == '\t' || ch == '\r') continue;
    // Comments become spaces (newlines kept, so JSON's errors name the right line).
    if (ch == '#' || (ch == '/' && i + 1 < n && text[i + 1] == '/')) {
      while (i < n && text[i] != '\n') clean[i++] = ' ';
      --i;
      continue;
    }
    if (ch == '/' && i + 1 < n && text[i + 1] == '*') {
      const int start = line;
      size_t j = i;
      while (j + 1 < n && !(text[j] == '*' && text[j + 1] == '/')) {
        if (text[j] == '\n') ++line;
        else clean[j] = ' ';
        ++j;
      }
      if (j + 1 >= n) return Status::Error(path + ": line " + std::to_string(start) + ": a /* comment is never closed");
      clean[j] = clean[j + 1] = ' ';
      i = j + 1;
      continue;
    }
    // A token: a comma before } or ] is dropped, as hjson drops it.
    if (pending_comma >= 0) {
      if (ch == '}' || ch == ']') clean[pending_comma] = ' ';
      pending_comma = -1;
    }
    if (ch == '"') {
      const int at = line;
      size_t j = i + 1;
      std::string raw;
      while (j < n && text[j] != '"') {
        if (text[j] == '\\' && j + 1 < n) raw += text[j++];
        if (text[j] == '\n') ++line;
        raw += text[j++];
      }
      if (j >= n) return Status::Error(path + ": line " + std::to_string(at) + ": a string is never closed");
      if (!stack.empty() && stack.back().object && stack.back().expect_key) {
        Frame& f = stack.back();
        f.expect_key = false;
        auto [it, fresh] = f.keys.emplace(raw, at);
        if (!fresh)
          return Status::Error(path + ": lines " + std::to_string(it->second) + " and " + std::to_string(at) +
                               " both give \"" + raw + "\" in " + where(stack) +
                               ": DeepSpeed refuses a config with a key given twice (\"Duplicate keys in DeepSpeed "
                               "config\"); keep one");
        last_key = raw;
        last_key_line = at;
      }
      i = j;
      continue;
    }
    if (ch == '{' || ch == '[') {
      if (int(stack.size()) >= kMaxConfigDepth)
        return Status::Error(path + ": line " + std::to_string(line) + ": nested deeper than " +
                             std::to_string(kMaxConfigDepth) + " levels; no DeepSpeed config is");
      Frame f;
      f.object = ch == '{';
      f.expect_key = f.object;
      f.name = !stack.empty() && stack.back().object ? last_key : (stack.empty() ? "" : "[]");
      stack.push_back(std::move(f));
      continue;
    }
    if (ch == '}' || ch == ']') {
      if (!stack.empty()) stack.pop_back();
      continue;
    }
    if (ch == ',') {
      pending_comma = long(i);
      if (!stack.empty() && stack.back().object) stack.back().expect_key = true;
      continue;
    }
  }
  (void)last_key_line;
  try {
    *out = nlohmann::json::parse(clean);
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number out of range (1e400)
    return Status::Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  return Status::Ok();
}

}  // namespace zt::trainer
