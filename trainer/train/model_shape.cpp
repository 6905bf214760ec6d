#include "train/model_shape.h"

#include <algorithm>
#include <cstdio>

#include "zt/common/units.h"

namespace zt::trainer {

const std::vector<ShapeField>& shape_fields() {
  using S = ModelShape;
  static const std::vector<ShapeField> fields = {
      {"name", nullptr, nullptr, &S::name},
      {"width", &S::width},
      {"layers", &S::layers},
      {"heads", &S::heads},
      {"kv_heads", &S::kv_heads},
      {"ffn", &S::ffn},
      {"gated_ffn", nullptr, &S::gated_ffn},
      {"vocab", &S::vocab},
      {"context", &S::context},
      {"tied_embeddings", nullptr, &S::tied_embeddings},
      {"experts", &S::experts},
      {"shared_experts", &S::shared_experts},
      {"expert_ffn", &S::expert_ffn},
      {"dense_layers", &S::dense_layers},
      {"head_dim", &S::head_dim},
      {"norm", nullptr, nullptr, &S::norm},
      {"qkv_bias", nullptr, &S::qkv_bias},
      {"out_bias", nullptr, &S::out_bias},
      {"qk_norm", nullptr, &S::qk_norm},
      {"positions", &S::positions},
      {"final_norms", &S::final_norms},
      {"embed_norm", nullptr, &S::embed_norm},
      {"shared_expert_ffn", &S::shared_expert_ffn},
      {"shared_expert_gate", nullptr, &S::shared_expert_gate},
      {"router_bias", nullptr, &S::router_bias},
      {"moe_every", &S::moe_every},
      {"q_lora_rank", &S::q_lora_rank},
      {"kv_lora_rank", &S::kv_lora_rank},
      {"qk_nope_head_dim", &S::qk_nope_head_dim},
      {"qk_rope_head_dim", &S::qk_rope_head_dim},
      {"v_head_dim", &S::v_head_dim},
      {"encoder_layers", &S::encoder_layers},
      {"relative_attention_buckets", &S::relative_attention_buckets},
      {"decoder_seq_len", &S::decoder_seq_len},
  };
  return fields;
}

std::string shape_field_list() {
  std::string out;
  for (const auto& f : shape_fields()) out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out;
}

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
  if (s.head_dim == 0 && s.kv_lora_rank == 0 && s.width % s.heads) return Status::Error(who + ": heads (" + std::to_string(s.heads) + ") must divide width (" + std::to_string(s.width) + ")");
  if (s.heads % s.kv_heads)
    return Status::Error(who + ": kv_heads (" + std::to_string(s.kv_heads) + ") must divide heads (" + std::to_string(s.heads) + ")");
  if (s.experts < 0 || s.shared_experts < 0 || s.dense_layers < 0 || s.ffn < 0 || s.expert_ffn < 0)
    return Status::Error(who + ": experts, shared_experts, dense_layers, ffn and expert_ffn must not be negative");
  if (s.experts > 0 && s.expert_ffn <= 0) return Status::Error(who + ": an MoE shape (experts > 0) needs expert_ffn");
  if ((s.experts == 0 || s.dense_layers > 0) && s.ffn <= 0) return Status::Error(who + ": ffn must be positive for dense layers");
  if (s.dense_layers > s.layers) return Status::Error(who + ": dense_layers exceeds layers");
  if (!s.norm.empty() && s.norm != "rms" && s.norm != "layer")
    return Status::Error(who + ": norm '" + s.norm + "': use rms (a weight per channel) or layer (weight and bias)");
  for (auto [f, v] : {std::pair<const char*, int64_t>{"head_dim", s.head_dim}, {"positions", s.positions},
                      {"final_norms", s.final_norms}, {"shared_expert_ffn", s.shared_expert_ffn},
                      {"q_lora_rank", s.q_lora_rank}, {"kv_lora_rank", s.kv_lora_rank},
                      {"qk_nope_head_dim", s.qk_nope_head_dim}, {"qk_rope_head_dim", s.qk_rope_head_dim},
                      {"v_head_dim", s.v_head_dim}, {"encoder_layers", s.encoder_layers},
                      {"relative_attention_buckets", s.relative_attention_buckets},
                      {"decoder_seq_len", s.decoder_seq_len}})
    if (v < 0) return Status::Error(who + ": " + f + " must not be negative (got " + std::to_string(v) + ")");
  if (s.moe_every < 1) return Status::Error(who + ": moe_every must be at least 1");
  if (s.kv_lora_rank > 0 && (s.qk_nope_head_dim + s.qk_rope_head_dim <= 0 || s.v_head_dim <= 0))
    return Status::Error(who + ": MLA (kv_lora_rank > 0) needs qk_nope_head_dim or qk_rope_head_dim, and v_head_dim");
  return Status::Ok();
}

namespace {
int64_t head_size(const ModelShape& s) { return s.head_dim > 0 ? s.head_dim : s.width / s.heads; }
// One norm's parameters: a weight per channel, and a bias for LayerNorm; the older count (no
// norm named) a weight per norm.
void norm_parameters(const ModelShape& s, int64_t channels, std::vector<int64_t>* out) {
  out->push_back(channels);
  if (s.norm == "layer") out->push_back(channels);
}
// Self- or cross-attention's projections (q, k, v, o, their biases, q/k norms), or MLA's.
void attention_parameters(const ModelShape& s, bool cross, std::vector<int64_t>* out) {
  const int64_t C = s.width, H = s.heads, hd = head_size(s);
  if (s.kv_lora_rank > 0) {
    const int64_t qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
    if (s.q_lora_rank > 0) {
      out->insert(out->end(), {C * s.q_lora_rank, s.q_lora_rank, s.q_lora_rank * H * qk});  // q_a, its norm, q_b
    } else {
      out->push_back(C * H * qk);
    }
    out->insert(out->end(), {C * (s.kv_lora_rank + s.qk_rope_head_dim), s.kv_lora_rank,  // kv_a, its norm
                             s.kv_lora_rank * H * (s.qk_nope_head_dim + s.v_head_dim), H * s.v_head_dim * C});
    return;
  }
  const int64_t kv = s.kv_heads * hd;
  out->push_back(C * H * hd);  // q
  if (s.qkv_bias) out->push_back(H * hd);
  out->push_back(C * kv);  // k
  if (s.qkv_bias) out->push_back(kv);
  out->push_back(C * kv);  // v
  if (s.qkv_bias) out->push_back(kv);
  out->push_back(H * hd * C);  // o
  if (s.out_bias) out->push_back(C);
  if (s.qk_norm && !cross) out->insert(out->end(), {hd, hd});
}
bool moe_layer(const ModelShape& s, int64_t layer) {
  return s.experts > 0 && layer >= s.dense_layers && (layer - s.dense_layers) % std::max<int64_t>(1, s.moe_every) == 0;
}
// A block's parameters in a pre-LN block's order. Decoder-only: layer in 0..layers-1.
// Encoder-decoder: encoder blocks first, then decoder blocks (their `layer` counted from the first
// decoder block), each with cross-attention and a third norm.
std::vector<int64_t> block_parameters(const ModelShape& s, int64_t layer, bool decoder_of_pair = false) {
  const int64_t C = s.width;
  std::vector<int64_t> v;
  norm_parameters(s, C, &v);
  attention_parameters(s, false, &v);
  if (s.relative_attention_buckets > 0 && layer == 0) v.push_back(s.relative_attention_buckets * s.heads);
  if (decoder_of_pair) {
    norm_parameters(s, C, &v);
    attention_parameters(s, true, &v);
  }
  norm_parameters(s, C, &v);
  const int64_t mats = s.gated_ffn ? 3 : 2;
  if (moe_layer(s, layer)) {
    const int64_t shared_ffn = s.shared_expert_ffn > 0 ? s.shared_expert_ffn : s.expert_ffn;
    for (int64_t e = 0; e < s.experts * mats; ++e) v.push_back(C * s.expert_ffn);
    for (int64_t e = 0; e < s.shared_experts * mats; ++e) v.push_back(C * shared_ffn);
    v.push_back(C * s.experts);  // router
    if (s.router_bias) v.push_back(s.experts);
    if (s.shared_expert_gate) v.push_back(C);
  } else {
    for (int64_t m = 0; m < mats; ++m) {
      v.push_back(C * s.ffn);
      if (s.out_bias) v.push_back(m + 1 < mats ? s.ffn : C);  // GPT-2, BART: the biases of c_fc and c_proj
    }
  }
  return v;
}
int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t n = 0;
  for (int64_t x : v) n += x;
  return n;
}
// Every linear of a block as (in, out), for LoRA's adapters (r x (in + out) each).
void block_linears(const ModelShape& s, int64_t layer, bool decoder_of_pair, const std::string& targets,
                   std::vector<std::pair<int64_t, int64_t>>* out) {
  const int64_t C = s.width, H = s.heads, hd = head_size(s);
  auto attention = [&]() {
    if (s.kv_lora_rank > 0) {
      const int64_t qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
      if (targets != "qv") {
        if (s.q_lora_rank > 0) {
          out->push_back({C, s.q_lora_rank});
          out->push_back({s.q_lora_rank, H * qk});
        } else {
          out->push_back({C, H * qk});
        }
        out->push_back({C, s.kv_lora_rank + s.qk_rope_head_dim});
        out->push_back({s.kv_lora_rank, H * (s.qk_nope_head_dim + s.v_head_dim)});
        out->push_back({H * s.v_head_dim, C});
      } else {  // MLA has no separate q and v: its query and key/value up-projections stand for them
        out->push_back({s.q_lora_rank > 0 ? s.q_lora_rank : C, H * qk});
        out->push_back({s.kv_lora_rank, H * (s.qk_nope_head_dim + s.v_head_dim)});
      }
      return;
    }
    out->push_back({C, H * hd});                                  // q
    if (targets != "qv") out->push_back({C, s.kv_heads * hd});    // k
    out->push_back({C, s.kv_heads * hd});                         // v
    if (targets != "qv") out->push_back({H * hd, C});             // o
  };
  attention();
  if (decoder_of_pair) attention();  // cross-attention
  if (targets != "all") return;
  const int64_t mats = s.gated_ffn ? 3 : 2;
  auto mlp = [&](int64_t ffn, int64_t copies) {
    for (int64_t e = 0; e < copies; ++e)
      for (int64_t m = 0; m < mats; ++m) out->push_back(m + 1 == mats ? std::pair<int64_t, int64_t>{ffn, C} : std::pair<int64_t, int64_t>{C, ffn});
  };
  if (moe_layer(s, layer)) {
    mlp(s.expert_ffn, s.experts);
    mlp(s.shared_expert_ffn > 0 ? s.shared_expert_ffn : s.expert_ffn, s.shared_experts);
    out->push_back({C, s.experts});  // the router is a linear layer too (PEFT's all-linear takes it)
  } else {
    mlp(s.ffn, 1);
  }
}
}  // namespace

int64_t shape_blocks(const ModelShape& s) { return s.layers + s.encoder_layers; }

std::vector<std::vector<int64_t>> shape_module_parameters(const ModelShape& s, bool learned_positions) {
  std::vector<std::vector<int64_t>> out;
  const int64_t C = s.width;
  out.push_back({s.vocab * C});
  if (learned_positions) out.back().push_back(s.context * C);
  if (s.positions > 0) out.back().push_back(s.positions * C);
  if (s.encoder_layers > 0) {
    for (int64_t l = 0; l < s.encoder_layers; ++l) out.push_back(block_parameters(s, l));
    for (int64_t l = 0; l < s.layers; ++l) out.push_back(block_parameters(s, l, true));
  } else {
    for (int64_t l = 0; l < s.layers; ++l) out.push_back(block_parameters(s, l));
  }
  std::vector<int64_t> final_norms;
  if (s.norm.empty()) {
    final_norms = {C, C};  // the older count: LayerNorm's weight and bias
  } else {
    const int64_t stacks = s.encoder_layers > 0 ? 2 : 1;
    for (int64_t k = 0; k < s.final_norms + (s.embed_norm ? stacks : 0); ++k) norm_parameters(s, C, &final_norms);
  }
  if (final_norms.empty()) final_norms = {1};  // a module of one element stands for none
  out.push_back(std::move(final_norms));
  if (!s.tied_embeddings) out.push_back({s.vocab * C});
  return out;
}

std::vector<model::ModuleSpec> shape_modules(const ModelShape& s, bool learned_positions) {
  const std::vector<std::vector<int64_t>> params = shape_module_parameters(s, learned_positions);
  std::vector<model::ModuleSpec> out;
  int64_t offset = 0;
  auto add = [&](const std::string& name) {
    model::ModuleSpec m;
    m.name = name;
    m.index = int(out.size());
    m.offset = offset;
    m.numel = sum_of(params[out.size()]);
    offset += m.numel;
    out.push_back(m);
  };
  add("embeddings");
  if (s.encoder_layers > 0) {
    for (int64_t l = 0; l < s.encoder_layers; ++l) add("encoder.block" + std::to_string(l));
    for (int64_t l = 0; l < s.layers; ++l) add("decoder.block" + std::to_string(l));
  } else {
    for (int64_t l = 0; l < s.layers; ++l) add("block" + std::to_string(l));
  }
  add("final_ln");
  if (!s.tied_embeddings) add("lm_head");
  return out;
}

std::vector<int64_t> lora_parameters(const ModelShape& s, int64_t block, int64_t rank, const std::string& targets) {
  std::vector<std::pair<int64_t, int64_t>> linears;
  const bool decoder_of_pair = s.encoder_layers > 0 && block >= s.encoder_layers;
  block_linears(s, decoder_of_pair ? block - s.encoder_layers : block, decoder_of_pair, targets, &linears);
  std::vector<int64_t> v;
  for (auto [in, out] : linears) v.insert(v.end(), {rank * in, out * rank});  // lora_A, lora_B
  return v;
}

int64_t lora_params(const ModelShape& s, int64_t block, int64_t rank, const std::string& targets) {
  return sum_of(lora_parameters(s, block, rank, targets));
}

int64_t shape_params(const ModelShape& s, bool learned_positions) {
  int64_t n = 0;
  for (const auto& m : shape_modules(s, learned_positions)) n += m.numel;
  return n;
}

int64_t activation_bytes(const ModelShape& s, int64_t B, int64_t T, bool checkpointing, bool flash_attention) {
  // Flash attention keeps no T x T term (one log-sum-exp per row, inside the first term's slack).
  const int64_t per_layer = T * B * s.width * 34 + (flash_attention ? 0 : 5 * s.heads * T * T * B);
  if (checkpointing) return s.layers * 2 * T * B * s.width + per_layer;
  return s.layers * per_layer;
}

int64_t encoder_decoder_activation_bytes(const ModelShape& s, int64_t B, int64_t Te, int64_t Td, bool checkpointing,
                                         bool flash) {
  const int64_t C = s.width, F = s.ffn, H = s.heads, A = H * head_size(s);
  const int64_t mlp = s.gated_ffn ? 6 : 4;
  // One layer's self-attention and MLP over T tokens.
  auto layer = [&](int64_t T) {
    return 18 * T * B * C + mlp * T * B * F + 8 * T * B * std::max<int64_t>(0, A - C) + (flash ? 0 : 5 * H * T * T * B);
  };
  // Cross-attention: queries and output over the decoder's tokens, keys and values over the encoder's.
  const int64_t cross = 4 * Td * B * A + 4 * Te * B * A + 4 * Td * B * C + (flash ? 0 : 5 * H * Td * Te * B);
  const int64_t enc = layer(Te), dec = layer(Td) + cross;
  const int64_t encoder_out = 2 * Te * B * C;
  if (checkpointing)
    return s.encoder_layers * 2 * Te * B * C + s.layers * 2 * Td * B * C + encoder_out + std::max(enc, dec);
  return s.encoder_layers * enc + s.layers * dec + encoder_out;
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
  if (s.encoder_layers > 0)
    out += "; encoder-decoder: " + std::to_string(s.encoder_layers) + " encoder + " + std::to_string(s.layers) +
           " decoder layers (with cross-attention)";
  if (s.kv_lora_rank > 0) out += "; MLA (kv_lora_rank " + std::to_string(s.kv_lora_rank) + ")";
  else if (s.head_dim > 0 && s.head_dim * s.heads != s.width) out += "; head size " + std::to_string(s.head_dim);
  return out;
}

long double shape_params_bound(const ModelShape& m) {
  using L = long double;
  const L C = L(m.width), H = L(m.heads), mats = m.gated_ffn ? 3 : 2;
  const L hd = m.head_dim > 0 ? L(m.head_dim) : m.heads > 0 ? L(m.width) / L(m.heads) : L(0);
  // Plain attention (with every bias and norm) and MLA, whichever is larger; twice for cross-attention.
  const L plain = 2 * C * H * hd + 2 * C * L(m.kv_heads) * hd + H * hd + 2 * L(m.kv_heads) * hd + C + 2 * hd;
  const L qk = L(m.qk_nope_head_dim) + L(m.qk_rope_head_dim);
  const L mla = C * L(m.q_lora_rank) + L(m.q_lora_rank) + (L(m.q_lora_rank) + C) * H * qk +
                C * (L(m.kv_lora_rank) + L(m.qk_rope_head_dim)) + L(m.kv_lora_rank) +
                L(m.kv_lora_rank) * H * (L(m.qk_nope_head_dim) + L(m.v_head_dim)) + H * L(m.v_head_dim) * C;
  const L attention = 2 * (plain > mla ? plain : mla) + L(m.relative_attention_buckets) * H;
  const L dense = mats * C * L(m.ffn) + mats * L(m.ffn) + C;
  const L shared_ffn = m.shared_expert_ffn > m.expert_ffn ? L(m.shared_expert_ffn) : L(m.expert_ffn);
  const L moe = L(m.experts + m.shared_experts) * mats * C * shared_ffn + C * L(m.experts) + C + L(m.experts);
  const L per_layer = attention + 6 * C + (dense > moe ? dense : moe);
  return L(m.vocab) * C * (m.tied_embeddings ? 1 : 2) + (L(m.context) + L(m.positions)) * C +
         (L(m.layers) + L(m.encoder_layers)) * per_layer + 8 * C;
}

}  // namespace zt::trainer
