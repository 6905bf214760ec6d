#include "train/model_shape.h"

#include <cstdio>

#include "zt/common/units.h"

namespace zt::trainer {

ModelShape shape_of(const model::Config& c, const std::string& name) {
  ModelShape s;
  s.name = name;
  s.width = c.width;
  s.layers = c.layers;
  s.heads = c.heads;
  s.kv_heads = c.heads;
  s.ffn = 4 * c.width;
  s.vocab = c.vocab;
  s.context = c.context;
  return s;
}

Status validate_shape(const ModelShape& s) {
  const std::string who = "model shape" + (s.name.empty() ? std::string() : " '" + s.name + "'");
  auto pos = [&](const char* f, int64_t v) -> Status {
    if (v <= 0) return Status::Error(who + ": " + f + " must be positive (got " + std::to_string(v) + ")");
    if (v > (int64_t(1) << 31)) return Status::Error(who + ": " + f + " " + std::to_string(v) + " is implausibly large");
    return Status::Ok();
  };
  for (auto [f, v] : {std::pair<const char*, int64_t>{"width", s.width}, {"layers", s.layers}, {"heads", s.heads},
                      {"kv_heads", s.kv_heads}, {"vocab", s.vocab}, {"context", s.context}})
    if (Status st = pos(f, v); !st) return st;
  if (s.width % s.heads) return Status::Error(who + ": heads (" + std::to_string(s.heads) + ") must divide width (" + std::to_string(s.width) + ")");
  if (s.heads % s.kv_heads)
    return Status::Error(who + ": kv_heads (" + std::to_string(s.kv_heads) + ") must divide heads (" + std::to_string(s.heads) + ")");
  if (s.experts < 0 || s.shared_experts < 0 || s.dense_layers < 0 || s.ffn < 0 || s.expert_ffn < 0)
    return Status::Error(who + ": experts, shared_experts, dense_layers, ffn and expert_ffn must not be negative");
  if (s.experts > 0 && s.expert_ffn <= 0) return Status::Error(who + ": an MoE shape (experts > 0) needs expert_ffn");
  if ((s.experts == 0 || s.dense_layers > 0) && s.ffn <= 0) return Status::Error(who + ": ffn must be positive for dense layers");
  if (s.dense_layers > s.layers) return Status::Error(who + ": dense_layers exceeds layers");
  return Status::Ok();
}

namespace {
int64_t block_params(const ModelShape& s, int64_t layer) {
  const int64_t C = s.width, hd = s.width / s.heads;
  int64_t n = C * C + 2 * C * (s.kv_heads * hd) + C * C;  // q, k, v, o
  n += 2 * C;                                              // q/k/v biases are not counted; two norms' scales
  const int64_t mats = s.gated_ffn ? 3 : 2;
  if (s.experts > 0 && layer >= s.dense_layers)
    n += (s.experts + s.shared_experts) * mats * C * s.expert_ffn + C * s.experts;  // experts + router
  else
    n += mats * C * s.ffn;
  return n;
}
}  // namespace

std::vector<model::ModuleSpec> shape_modules(const ModelShape& s, bool learned_positions) {
  std::vector<model::ModuleSpec> out;
  int64_t offset = 0;
  auto add = [&](const std::string& name, int64_t numel) {
    model::ModuleSpec m;
    m.name = name;
    m.index = int(out.size());
    m.offset = offset;
    m.numel = numel;
    offset += numel;
    out.push_back(m);
  };
  add("embeddings", s.vocab * s.width + (learned_positions ? s.context * s.width : 0));
  for (int64_t l = 0; l < s.layers; ++l) add("block" + std::to_string(l), block_params(s, l));
  add("final_ln", 2 * s.width);
  if (!s.tied_embeddings) add("lm_head", s.vocab * s.width);
  return out;
}

int64_t shape_params(const ModelShape& s, bool learned_positions) {
  int64_t n = 0;
  for (const auto& m : shape_modules(s, learned_positions)) n += m.numel;
  return n;
}

std::string describe_shape(const ModelShape& s, bool learned_positions) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s: %s parameters, %lld layers, width %lld, %lld heads (%lld KV), %s %lld, vocab %lld",
                s.name.empty() ? "custom" : s.name.c_str(), format_count(double(shape_params(s, learned_positions))).c_str(),
                (long long)s.layers, (long long)s.width, (long long)s.heads, (long long)s.kv_heads,
                s.experts > 0 ? "expert FFN" : "FFN", (long long)(s.experts > 0 ? s.expert_ffn : s.ffn),
                (long long)s.vocab);
  std::string out = buf;
  if (s.experts > 0)
    out += ", " + std::to_string(s.experts) + " routed + " + std::to_string(s.shared_experts) + " shared experts";
  return out;
}

long double shape_params_bound(const ModelShape& m) {
  using L = long double;
  const L C = L(m.width), hd = m.heads > 0 ? L(m.width) / L(m.heads) : L(0), mats = m.gated_ffn ? 3 : 2;
  const L attention = 2 * C * C + 2 * C * L(m.kv_heads) * hd + 2 * C;
  const L dense = mats * C * L(m.ffn);
  const L moe = L(m.experts + m.shared_experts) * mats * C * L(m.expert_ffn) + C * L(m.experts);
  const L per_layer = attention + (dense > moe ? dense : moe);
  return L(m.vocab) * C * (m.tied_embeddings ? 1 : 2) + L(m.context) * C + L(m.layers) * per_layer + 2 * C;
}

}  // namespace zt::trainer
