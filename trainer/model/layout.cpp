// model/layout.cpp: the parameter table (see layout.h). The block's tensor list below is the single
// place a block's layout is written down.
#include "model/layout.h"

#include <cassert>
#include <stdexcept>

namespace zt::model {
namespace {

// One tensor of a block: our suffix, HF suffix, our shape in units of C (width), HF transposed?
struct BlockTensor {
  const char* ours;
  const char* hf;
  int64_t rows_per_c;  // rows = rows_per_c * C (0: a vector)
  int64_t cols_per_c;  // cols = cols_per_c * C
  bool transposed;     // HF Conv1D stores [in, out]
};

// In order. A weight of shape [out, in] maps to HF's Conv1D [in, out].
constexpr BlockTensor kBlockTensors[] = {
    {"ln1.weight", "ln_1.weight", 0, 1, false},
    {"ln1.bias", "ln_1.bias", 0, 1, false},
    {"attn.qkv.weight", "attn.c_attn.weight", 3, 1, true},
    {"attn.qkv.bias", "attn.c_attn.bias", 0, 3, false},
    {"attn.proj.weight", "attn.c_proj.weight", 1, 1, true},
    {"attn.proj.bias", "attn.c_proj.bias", 0, 1, false},
    {"ln2.weight", "ln_2.weight", 0, 1, false},
    {"ln2.bias", "ln_2.bias", 0, 1, false},
    {"mlp.fc.weight", "mlp.c_fc.weight", 4, 1, true},
    {"mlp.fc.bias", "mlp.c_fc.bias", 0, 4, false},
    {"mlp.proj.weight", "mlp.c_proj.weight", 1, 4, true},
    {"mlp.proj.bias", "mlp.c_proj.bias", 0, 1, false},
};

void require_valid(const Config& config) {
  const Status s = validate(config);
  if (!s.ok()) throw std::invalid_argument(s.message());
}

}  // namespace

std::vector<ParamSpec> param_table(const Config& config) {
  require_valid(config);
  const int64_t C = config.width;
  std::vector<ParamSpec> table;
  int64_t offset = 0;
  int64_t module_start = 0;
  int current_module = 0;
  auto add = [&](int module, std::string name, std::string hf_name, std::vector<int64_t> shape,
                 bool transposed) {
    if (module != current_module) {
      current_module = module;
      module_start = offset;
    }
    ParamSpec p;
    p.name = std::move(name);
    p.hf_name = std::move(hf_name);
    p.shape = shape;
    p.hf_shape = transposed ? std::vector<int64_t>(shape.rbegin(), shape.rend()) : shape;
    p.hf_transposed = transposed;
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.offset = offset;
    p.offset_in_module = offset - module_start;
    p.module = module;
    offset += p.numel;
    table.push_back(std::move(p));
  };

  add(0, "wte", "transformer.wte.weight", {config.vocab, C}, false);
  add(0, "wpe", "transformer.wpe.weight", {config.context, C}, false);
  for (int64_t l = 0; l < config.layers; l++) {
    const std::string ours = "block" + std::to_string(l) + ".";
    const std::string hf = "transformer.h." + std::to_string(l) + ".";
    for (const BlockTensor& t : kBlockTensors) {
      std::vector<int64_t> shape;
      if (t.rows_per_c == 0) {
        shape = {t.cols_per_c * C};
      } else {
        shape = {t.rows_per_c * C, t.cols_per_c * C};
      }
      add((int)l + 1, ours + t.ours, hf + t.hf, shape, t.transposed);
    }
  }
  const int final_module = (int)config.layers + 1;
  add(final_module, "final_ln.weight", "transformer.ln_f.weight", {C}, false);
  add(final_module, "final_ln.bias", "transformer.ln_f.bias", {C}, false);
  assert(offset == num_params(config));
  return table;
}

std::vector<ModuleSpec> module_table(const Config& config) {
  const std::vector<ParamSpec> params = param_table(config);
  std::vector<ModuleSpec> modules((size_t)config.layers + 2);
  for (size_t m = 0; m < modules.size(); m++) {
    modules[m].index = (int)m;
    if (m == 0) {
      modules[m].name = "embeddings";
    } else if (m == modules.size() - 1) {
      modules[m].name = "final_ln";
    } else {
      modules[m].name = "block" + std::to_string(m - 1);
    }
  }
  for (size_t i = 0; i < params.size(); i++) {
    ModuleSpec& m = modules[(size_t)params[i].module];
    if (m.num_params == 0) {
      m.offset = params[i].offset;
      m.first_param = (int)i;
    }
    m.num_params++;
    m.numel += params[i].numel;
  }
  return modules;
}

namespace {

// Offsets inside modules are read back from a one-layer table (every layer has the same block
// layout), so the table above stays the only place they are written.
struct OneLayer {
  std::vector<ParamSpec> params;
  std::vector<ModuleSpec> modules;
  explicit OneLayer(const Config& config) {
    Config one = config;
    one.layers = 1;
    params = param_table(one);
    modules = module_table(one);
  }
  int64_t offset_of(const std::string& name) const {
    for (const ParamSpec& p : params) {
      if (p.name == name) return p.offset_in_module;
    }
    throw std::logic_error("layout: no tensor named " + name);
  }
};

}  // namespace

BlockOffsets block_offsets(const Config& config) {
  const OneLayer t(config);
  auto at = [&](const char* suffix) { return t.offset_of(std::string("block0.") + suffix); };
  BlockOffsets o;
  o.ln1_w = at("ln1.weight");
  o.ln1_b = at("ln1.bias");
  o.qkv_w = at("attn.qkv.weight");
  o.qkv_b = at("attn.qkv.bias");
  o.attn_proj_w = at("attn.proj.weight");
  o.attn_proj_b = at("attn.proj.bias");
  o.ln2_w = at("ln2.weight");
  o.ln2_b = at("ln2.bias");
  o.fc_w = at("mlp.fc.weight");
  o.fc_b = at("mlp.fc.bias");
  o.mlp_proj_w = at("mlp.proj.weight");
  o.mlp_proj_b = at("mlp.proj.bias");
  o.numel = t.modules[1].numel;
  return o;
}

EmbeddingOffsets embedding_offsets(const Config& config) {
  const OneLayer t(config);
  return {t.offset_of("wte"), t.offset_of("wpe"), t.modules[0].numel};
}

FinalOffsets final_offsets(const Config& config) {
  const OneLayer t(config);
  return {t.offset_of("final_ln.weight"), t.offset_of("final_ln.bias"), t.modules[2].numel};
}

}  // namespace zt::model
