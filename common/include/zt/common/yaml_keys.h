// common/include/zt/common/yaml_keys.h: a YAML file that gives a key twice is refused. yaml-cpp
// keeps both entries of such a mapping: a lookup finds the first and a loop sees both, so one of
// the user's two values was dropped without a word ("steps: 5 ... steps: 7").
//
// Owns: that one check, and the bounds of a YAML tree (depth, nodes with aliases expanded), for
// the files zerotrace reads as YAML (zt train --config, zt repro's scenarios): the first walk of
// a loaded file. Header-only; its includers link yaml-cpp. May call: yaml-cpp, status.h.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "zt/common/files.h"
#include "zt/common/status.h"

namespace zt {

// A YAML tree is walked within these bounds, before anything else reads it. yaml-cpp shares an
// alias's node instead of copying it, so `faults: &x [*x]` loads as a cycle and nine levels of
// ten-fold aliases (329 bytes) as a tree of a billion nodes: both load at once, and then overflow
// the stack of, or hang, whatever walks them. A config or scenario has a few hundred nodes.
inline constexpr int kMaxYamlDepth = 64;
inline constexpr int64_t kMaxYamlNodes = 100000;

namespace detail {
inline Status check_yaml_tree(const YAML::Node& node, const std::string& path,
                              const std::function<std::string(const std::string&)>& canonical, int depth,
                              int64_t* budget) {
  auto where = [&](const YAML::Node& n) {
    return path + (n.Mark().line >= 0 ? ":" + std::to_string(n.Mark().line + 1) : std::string());
  };
  if (--*budget < 0)
    return Status::Error(path + ": more than " + std::to_string(kMaxYamlNodes) +
                         " values once its aliases are expanded (aliases of aliases, an 'alias bomb'); refused");
  if (depth > kMaxYamlDepth)
    return Status::Error(where(node) + ": nested more than " + std::to_string(kMaxYamlDepth) +
                         " levels deep (an alias inside its own anchor, such as &x [*x], never ends); refused");
  if (node.IsMap()) {
    std::map<std::string, int> first_line;
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (it->first.IsScalar()) {
        const std::string key = canonical ? canonical(it->first.Scalar()) : it->first.Scalar();
        const int line = it->first.Mark().line + 1;
        auto [seen, fresh] = first_line.emplace(key, line);
        if (!fresh)
          return Status::Error(path + ":" + std::to_string(line) + ": '" + it->first.Scalar() +
                               "' is given twice (first at line " + std::to_string(seen->second) + "); keep one");
      } else {
        // A key that is a list or a mapping names no setting.
        return Status::Error(where(it->first) + ": a key must be a single word, not a " +
                             (it->first.IsMap() ? "mapping" : it->first.IsSequence() ? "list" : "null (empty)"));
      }
      if (Status s = check_yaml_tree(it->second, path, canonical, depth + 1, budget); !s) return s;
    }
  } else if (node.IsSequence()) {
    for (const YAML::Node& item : node)
      if (Status s = check_yaml_tree(item, path, canonical, depth + 1, budget); !s) return s;
  }
  return Status::Ok();
}
}  // namespace detail

// Before YAML::Load: the text is UTF-8 (yaml-cpp takes any bytes, and its strings go into JSON,
// which refuses what is not): "PATH:LINE: not UTF-8 text (byte 0xff)".
inline Status check_yaml_text(const std::string& text, const std::string& path) {
  const size_t at = utf8_invalid_at(text);
  if (at == std::string::npos) return Status::Ok();
  const long line = 1 + std::count(text.begin(), text.begin() + long(at), '\n');
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(text[at]));
  return Status::Error(path + ":" + std::to_string(line) + ": not UTF-8 text (byte " + byte + "); a YAML file is UTF-8");
}

// Every mapping in `node`, nested ones too: "PATH:LINE: 'K' is given twice (first at line L)";
// and the tree within kMaxYamlDepth and kMaxYamlNodes (an alias cycle or bomb is refused, naming
// the file). `canonical` maps a key to the setting it names (zt train's config reads micro-batch
// as micro_batch).
inline Status check_unique_keys(const YAML::Node& node, const std::string& path,
                                const std::function<std::string(const std::string&)>& canonical = nullptr) {
  int64_t budget = kMaxYamlNodes;
  return detail::check_yaml_tree(node, path, canonical, 0, &budget);
}

}  // namespace zt
