// common/include/zt/common/yaml_keys.h: a YAML file that gives a key twice is refused. yaml-cpp
// keeps both entries of such a mapping: a lookup finds the first and a loop sees both, so one of
// the user's two values was dropped without a word ("steps: 5 ... steps: 7").
//
// Owns: that one check, for the files zerotrace reads as YAML (zt train --config, zt repro's
// scenarios). Header-only; its includers link yaml-cpp. May call: yaml-cpp, status.h.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <string>

#include "zt/common/status.h"

namespace zt {

// Every mapping in `node`, nested ones too: "PATH:LINE: 'K' is given twice (first at line L)".
// `canonical` maps a key to the setting it names (zt train's config reads micro-batch as micro_batch).
inline Status check_unique_keys(const YAML::Node& node, const std::string& path,
                                const std::function<std::string(const std::string&)>& canonical = nullptr) {
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
      }
      if (Status s = check_unique_keys(it->second, path, canonical); !s) return s;
    }
  } else if (node.IsSequence()) {
    for (const YAML::Node& item : node)
      if (Status s = check_unique_keys(item, path, canonical); !s) return s;
  }
  return Status::Ok();
}

}  // namespace zt
