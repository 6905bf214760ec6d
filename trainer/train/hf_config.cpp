// Hugging Face config.json files read into shapes, each family checked against its own formula.
#include "train/hf_config.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include "train/model_shape.h"
#include "zt/common/files.h"

namespace zt::trainer {

namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  std::string origin;
  std::string error;

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  // A whole number the file must give.
  bool need(const char* k, int64_t* out) {
    if (!has(k)) {
      error = origin + ": " + k + " is missing (the " + family() + " config gives it)";
      return false;
    }
    return integer(k, out);
  }
  // A whole number, or `fallback` when the file leaves it out (the configuration class's default).
  bool opt(const char* k, int64_t fallback, int64_t* out) {
    if (!has(k)) {
      *out = fallback;
      return true;
    }
    return integer(k, out);
  }
  // At most 2^40 (no config's field comes near): a sum or a double of two fields stays in int64.
  bool integer(const char* k, int64_t* out) {
    const json& v = j[k];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t(1) << 40)) {
      error = origin + ": " + k + " must be a whole number from 0 to 2^40, not " + v.dump();
      return false;
    }
    *out = v.get<int64_t>();
    return true;
  }
  // Before a family's formula (int64 products, a loop over the layers): the shape within the limits
  // every reader of shapes applies (model_shape.h), so nothing below overflows or runs for long.
  bool bounded(const ModelShape& s) {
    if (s.layers > kMaxShapeLayers || s.encoder_layers > kMaxShapeLayers) {
      error = origin + ": " + std::to_string(std::max(s.layers, s.encoder_layers)) + " layers is above the limit of " +
              std::to_string(kMaxShapeLayers);
      return false;
    }
    if (const long double p = shape_params_bound(s); p > (long double)kMaxShapeParams) {
      char count[64];
      std::snprintf(count, sizeof count, "%.3Lg", p);
      error = origin + ": about " + count + " parameters is above the limit of " + std::to_string(kMaxShapeParams) +
              " (2^44, ~17.6 T)";
      return false;
    }
    return true;
  }
  bool flag(const char* k, bool fallback, bool* out) {
    if (!has(k)) {
      *out = fallback;
      return true;
    }
    if (!j[k].is_boolean()) {
      error = origin + ": " + k + " must be true or false, not " + j[k].dump();
      return false;
    }
    *out = j[k].get<bool>();
    return true;
  }
  std::string text(const char* k, const std::string& fallback) const {
    return has(k) && j[k].is_string() ? j[k].get<std::string>() : fallback;
  }
  std::string family() const { return text("model_type", "?"); }
  // A key that changes the layout in a way zerotrace does not model: refused by name.
  bool refuse_if(bool cond, const std::string& what) {
    if (cond) error = origin + ": " + what + ": zerotrace does not model it (edit the shape by hand: model: {...})";
    return !cond;
  }
};

std::string dtype_of(const std::string& torch_dtype) {
  if (torch_dtype == "bfloat16") return "bf16";
  if (torch_dtype == "float16") return "fp16";
  if (torch_dtype == "float32") return "fp32";
  return "";
}

// The fields every family sets: width, blocks, heads (kv heads for GQA), vocabulary, context, tie.
void set_core(ModelShape& s, int64_t width, int64_t layers, int64_t heads, int64_t kv_heads, int64_t vocab,
              int64_t context, bool tied) {
  s.width = width;
  s.layers = layers;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.vocab = vocab;
  s.context = context;
  s.tied_embeddings = tied;
}

// ---- decoder-only families with Llama's layout (llama, mistral, mixtral, qwen2, qwen2_moe, qwen3,
// qwen3_moe): embeddings, blocks of attention (GQA) + RMS norms + a gated MLP or experts, a final norm.
Status llama_like(Reader& r, HfModel* out) {
  const std::string fam = r.family();
  ModelShape& s = out->shape;
  int64_t C, L, H, kv, F, V, ctx, hd;
  if (!r.need("hidden_size", &C) || !r.need("num_hidden_layers", &L) || !r.need("num_attention_heads", &H) ||
      !r.need("vocab_size", &V) || !r.opt("num_key_value_heads", H, &kv) || !r.opt("max_position_embeddings", 2048, &ctx) ||
      !r.opt("intermediate_size", 0, &F))
    return Status::Error(r.error);
  if (H == 0 || kv == 0) return Status::Error(r.origin + ": num_attention_heads and num_key_value_heads must be at least 1");
  if (!r.opt("head_dim", C / H, &hd)) return Status::Error(r.error);
  if (hd == 0) return Status::Error(r.origin + ": head_dim must be at least 1 (hidden_size / num_attention_heads by default)");
  bool tied = false, attention_bias = false, mlp_bias = false;
  if (!r.flag("tie_word_embeddings", false, &tied) || !r.flag("attention_bias", false, &attention_bias) ||
      !r.flag("mlp_bias", false, &mlp_bias))
    return Status::Error(r.error);
  const bool qwen2 = fam == "qwen2" || fam == "qwen2_moe";
  const bool qwen3 = fam == "qwen3" || fam == "qwen3_moe";
  if (!r.refuse_if(!qwen2 && attention_bias, "attention_bias true (biases on q, k, v and o)") ||
      !r.refuse_if(mlp_bias, "mlp_bias true (biases in the MLP)"))
    return Status::Error(r.error);
  set_core(s, C, L, H, kv, V, ctx, tied);
  s.head_dim = hd == C / H && C % H == 0 ? 0 : hd;
  s.ffn = F;
  s.gated_ffn = true;
  s.norm = "rms";
  s.qkv_bias = qwen2;  // Qwen2's q, k, v carry biases (o does not)
  s.qk_norm = qwen3;   // Qwen3's per-head RMS norms of q and k
  int64_t E = 0, Fe = 0, shared = 0, Fs = 0, step = 1;
  if (fam == "mixtral") {
    if (!r.need("num_local_experts", &E)) return Status::Error(r.error);
    Fe = F;  // each expert is a gated MLP of intermediate_size
  } else if (fam == "qwen2_moe" || fam == "qwen3_moe") {
    if (!r.need("num_experts", &E) || !r.need("moe_intermediate_size", &Fe) || !r.opt("decoder_sparse_step", 1, &step))
      return Status::Error(r.error);
    if (step == 0) return Status::Error(r.origin + ": decoder_sparse_step must be at least 1 (every step-th layer is sparse)");
    if (fam == "qwen2_moe" && (!r.opt("shared_expert_intermediate_size", 0, &Fs))) return Status::Error(r.error);
    shared = Fs > 0 ? 1 : 0;
    // mlp_only_layers: dense layers by index; only a prefix (0..k-1) maps onto dense_layers.
    if (r.has("mlp_only_layers")) {
      const json& m = r.j["mlp_only_layers"];
      if (!m.is_array()) return Status::Error(r.origin + ": mlp_only_layers must be a list of layer indices");
      for (size_t i = 0; i < m.size(); ++i)
        if (!m[i].is_number_integer() || m[i].get<int64_t>() != int64_t(i))
          return Status::Error(r.origin + ": mlp_only_layers " + m.dump() +
                               ": dense layers other than the first ones: zerotrace does not model it");
      s.dense_layers = int64_t(m.size());
    }
    if (step != 1 && s.dense_layers > 0)
      return Status::Error(r.origin + ": decoder_sparse_step " + std::to_string(step) +
                           " with mlp_only_layers: zerotrace does not model it");
    // Qwen's rule: layer i is sparse when (i + 1) % step == 0; for step 1 every layer. As
    // dense_layers + moe_every that is dense_layers = step - 1, every step-th after.
    if (step > 1) s.dense_layers = step - 1;
    s.moe_every = step;
  }
  if (E > 0) {
    s.experts = E;
    s.expert_ffn = Fe;
    s.shared_experts = shared;
    s.shared_expert_ffn = Fs > 0 && Fs != Fe ? Fs : 0;
    s.shared_expert_gate = fam == "qwen2_moe" && shared > 0;
    if (s.dense_layers > 0 && F <= 0)
      return Status::Error(r.origin + ": intermediate_size is missing (the dense layers' MLP width)");
    if (s.dense_layers == 0 && s.ffn <= 0) s.ffn = Fe;  // no dense layer uses it
  } else if (F <= 0) {
    return Status::Error(r.origin + ": intermediate_size is missing (the MLP's width)");
  }
  if (!r.bounded(s)) return Status::Error(r.error);
  // The family's formula, from the file's fields.
  const int64_t attn = C * H * hd + 2 * C * kv * hd + H * hd * C + (qwen2 ? H * hd + 2 * kv * hd : 0) + (qwen3 ? 2 * hd : 0);
  int64_t blocks = 0;
  for (int64_t l = 0; l < L; ++l) {
    const bool sparse = E > 0 && (fam == "mixtral" || (l >= s.dense_layers && (l + 1) % step == 0 &&
                                                      (step > 1 || l >= s.dense_layers)));
    const int64_t mlp = sparse ? E * 3 * C * Fe + C * E + (Fs > 0 ? 3 * C * Fs + C : 0) : 3 * C * F;
    blocks += attn + mlp + 2 * C;
  }
  out->formula_params = V * C * (tied ? 1 : 2) + blocks + C;
  return Status::Ok();
}

// ---- DeepSeek-V2/V3: MLA attention, the first layers dense, then routed + shared experts.
Status deepseek(Reader& r, HfModel* out) {
  ModelShape& s = out->shape;
  int64_t C, L, H, V, ctx, F, Fe, E, shared, dense, freq, qr, kvr, nope, rope, vh;
  if (!r.need("hidden_size", &C) || !r.need("num_hidden_layers", &L) || !r.need("num_attention_heads", &H) ||
      !r.need("vocab_size", &V) || !r.opt("max_position_embeddings", 2048, &ctx) || !r.need("intermediate_size", &F) ||
      !r.need("moe_intermediate_size", &Fe) || !r.need("n_routed_experts", &E) || !r.opt("n_shared_experts", 0, &shared) ||
      !r.opt("first_k_dense_replace", 0, &dense) || !r.opt("moe_layer_freq", 1, &freq) ||
      !r.opt("q_lora_rank", 0, &qr) || !r.need("kv_lora_rank", &kvr) || !r.need("qk_nope_head_dim", &nope) ||
      !r.need("qk_rope_head_dim", &rope) || !r.need("v_head_dim", &vh))
    return Status::Error(r.error);
  bool tied = false;
  if (!r.flag("tie_word_embeddings", false, &tied)) return Status::Error(r.error);
  if (H == 0 || freq == 0 || kvr == 0 || nope + rope == 0 || vh == 0)
    return Status::Error(r.origin + ": num_attention_heads, moe_layer_freq, kv_lora_rank, v_head_dim and " +
                         "qk_nope_head_dim + qk_rope_head_dim must be at least 1");
  if (!r.refuse_if(dense > L, "first_k_dense_replace above num_hidden_layers")) return Status::Error(r.error);
  // V3's router carries a score-correction bias per expert (topk_method noaux_tc).
  const bool correction = r.text("topk_method", "") == "noaux_tc";
  set_core(s, C, L, H, H, V, ctx, tied);
  s.norm = "rms";
  s.gated_ffn = true;
  s.ffn = F;
  s.experts = E;
  s.expert_ffn = Fe;
  s.shared_experts = shared;
  s.dense_layers = dense;
  s.moe_every = freq;
  s.router_bias = correction;
  s.q_lora_rank = qr;
  s.kv_lora_rank = kvr;
  s.qk_nope_head_dim = nope;
  s.qk_rope_head_dim = rope;
  s.v_head_dim = vh;
  if (r.has("num_nextn_predict_layers") && r.j["num_nextn_predict_layers"].is_number_integer() &&
      r.j["num_nextn_predict_layers"].get<int64_t>() > 0)
    out->notes.push_back(r.origin + ": num_nextn_predict_layers " + r.j["num_nextn_predict_layers"].dump() +
                         ": the multi-token-prediction layers are not part of the model transformers trains (not counted)");
  if (!r.bounded(s)) return Status::Error(r.error);
  const int64_t qk = nope + rope;
  const int64_t attn = (qr > 0 ? C * qr + qr + qr * H * qk : C * H * qk) + C * (kvr + rope) + kvr + kvr * H * (nope + vh) +
                       H * vh * C;
  int64_t blocks = 0;
  for (int64_t l = 0; l < L; ++l) {
    const bool sparse = l >= dense && (l - dense) % freq == 0;
    const int64_t mlp = sparse ? (E + shared) * 3 * C * Fe + C * E + (correction ? E : 0) : 3 * C * F;
    blocks += attn + mlp + 2 * C;
  }
  out->formula_params = V * C * (tied ? 1 : 2) + blocks + C;
  return Status::Ok();
}

// ---- GPT-2: learned positions, LayerNorms, biases everywhere, a tied LM head.
Status gpt2(Reader& r, HfModel* out) {
  ModelShape& s = out->shape;
  int64_t C, L, H, V, P, F;
  if (!r.need("n_embd", &C) || !r.need("n_layer", &L) || !r.need("n_head", &H) || !r.need("vocab_size", &V) ||
      !r.need("n_positions", &P))
    return Status::Error(r.error);
  if (r.has("n_inner")) {
    if (!r.integer("n_inner", &F)) return Status::Error(r.error);
  } else {
    F = 4 * C;
  }
  bool tied = true;
  if (!r.flag("tie_word_embeddings", true, &tied)) return Status::Error(r.error);
  set_core(s, C, L, H, H, V, P, tied);
  s.ffn = F;
  s.positions = P;
  s.norm = "layer";
  s.qkv_bias = true;
  s.out_bias = true;
  if (!r.bounded(s)) return Status::Error(r.error);
  const int64_t block = (3 * C * C + 3 * C) + (C * C + C) + 2 * (2 * C) + (C * F + F) + (F * C + C);
  out->formula_params = V * C * (tied ? 1 : 2) + P * C + L * block + 2 * C;
  return Status::Ok();
}

// ---- T5: an encoder and a decoder of RMS-normed blocks without biases, relative position buckets
// in each stack's first block, d_kv per head, relu or gated-gelu MLPs, one shared embedding.
Status t5(Reader& r, HfModel* out) {
  ModelShape& s = out->shape;
  int64_t C, dkv, F, L, Ld, H, V, buckets;
  if (!r.need("d_model", &C) || !r.need("d_kv", &dkv) || !r.need("d_ff", &F) || !r.need("num_layers", &L) ||
      !r.need("num_heads", &H) || !r.need("vocab_size", &V) || !r.opt("num_decoder_layers", L, &Ld) ||
      !r.opt("relative_attention_num_buckets", 32, &buckets))
    return Status::Error(r.error);
  if (dkv == 0) return Status::Error(r.origin + ": d_kv must be at least 1 (each head's size)");
  bool tied = true;
  if (!r.flag("tie_word_embeddings", true, &tied)) return Status::Error(r.error);
  const std::string proj = r.text("feed_forward_proj", "relu");
  const bool gated = proj.rfind("gated-", 0) == 0;
  // Relative positions have no limit; context 512 is T5's training length.
  set_core(s, C, Ld, H, H, V, 512, tied);
  s.encoder_layers = L;
  s.head_dim = dkv * H == C ? 0 : dkv;
  s.ffn = F;
  s.gated_ffn = gated;
  s.norm = "rms";
  s.final_norms = 2;
  s.relative_attention_buckets = buckets;
  out->notes.push_back(r.origin + ": T5 has no position limit (relative buckets); context 512, its training length");
  if (!r.bounded(s)) return Status::Error(r.error);
  const int64_t attn = 4 * C * H * dkv;
  const int64_t mlp = (gated ? 3 : 2) * C * F;
  const int64_t encoder = L * (attn + mlp + 2 * C) + (L > 0 ? buckets * H : 0) + C;
  const int64_t decoder = Ld * (2 * attn + mlp + 3 * C) + (Ld > 0 ? buckets * H : 0) + C;
  out->formula_params = V * C * (tied ? 1 : 2) + encoder + decoder;
  return Status::Ok();
}

// ---- BART: an encoder and a decoder of LayerNorm blocks with biases, learned positions (offset 2)
// and a LayerNorm after the embeddings in each stack, one shared embedding tied to the LM head.
Status bart(Reader& r, HfModel* out) {
  ModelShape& s = out->shape;
  int64_t C, Le, Ld, He, Hd, Fe, Fd, V, P;
  if (!r.need("d_model", &C) || !r.need("encoder_layers", &Le) || !r.need("decoder_layers", &Ld) ||
      !r.need("encoder_attention_heads", &He) || !r.opt("decoder_attention_heads", He, &Hd) ||
      !r.need("encoder_ffn_dim", &Fe) || !r.opt("decoder_ffn_dim", Fe, &Fd) || !r.need("vocab_size", &V) ||
      !r.need("max_position_embeddings", &P))
    return Status::Error(r.error);
  if (!r.refuse_if(He != Hd, "encoder_attention_heads and decoder_attention_heads differ") ||
      !r.refuse_if(Fe != Fd, "encoder_ffn_dim and decoder_ffn_dim differ"))
    return Status::Error(r.error);
  bool tied = true;
  if (!r.flag("tie_word_embeddings", true, &tied)) return Status::Error(r.error);
  set_core(s, C, Ld, He, He, V, P, tied);
  s.encoder_layers = Le;
  s.ffn = Fe;
  s.positions = 2 * (P + 2);  // BartLearnedPositionalEmbedding: max_position_embeddings + 2, per stack
  s.norm = "layer";
  s.qkv_bias = true;
  s.out_bias = true;
  s.final_norms = 0;
  s.embed_norm = true;
  if (!r.bounded(s)) return Status::Error(r.error);
  const int64_t attn = 4 * (C * C + C);
  const int64_t mlp = C * Fe + Fe + Fe * C + C;
  const int64_t encoder = (P + 2) * C + 2 * C + Le * (attn + mlp + 2 * (2 * C));
  const int64_t decoder = (P + 2) * C + 2 * C + Ld * (2 * attn + mlp + 3 * (2 * C));
  out->formula_params = V * C * (tied ? 1 : 2) + encoder + decoder;
  return Status::Ok();
}

const std::map<std::string, std::function<Status(Reader&, HfModel*)>>& families() {
  static const std::map<std::string, std::function<Status(Reader&, HfModel*)>> f = {
      {"gpt2", gpt2},          {"llama", llama_like},   {"mistral", llama_like},    {"mixtral", llama_like},
      {"qwen2", llama_like},   {"qwen2_moe", llama_like}, {"qwen3", llama_like},    {"qwen3_moe", llama_like},
      {"deepseek_v2", deepseek}, {"deepseek_v3", deepseek}, {"t5", t5},             {"bart", bart}};
  return f;
}

}  // namespace

std::string hf_families() {
  std::string out;
  for (const auto& [name, _] : families()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

Status hf_config_from_json(const json& j, const std::string& origin, HfModel* out) {
  if (!j.is_object()) return Status::Error(origin + ": a Hugging Face config is a JSON object");
  if (!j.contains("model_type") || !j["model_type"].is_string())
    return Status::Error(origin + ": model_type is missing (it names the family: " + hf_families() + ")");
  HfModel m;
  m.family = j["model_type"].get<std::string>();
  auto it = families().find(m.family);
  if (it == families().end())
    return Status::Error(origin + ": model_type '" + m.family + "' is not a family zerotrace reads (" + hf_families() +
                         "); write the shape by hand (model: {width, layers, heads, ...})");
  Reader r{j, origin, {}};
  if (Status s = it->second(r, &m); !s) return s;
  // The checkpoint's dtype: torch_dtype (transformers 4), dtype (transformers 5).
  m.dtype = dtype_of(r.text("torch_dtype", r.text("dtype", "")));
  // How attention runs, when the file says (attn_implementation; _attn_implementation as save_pretrained
  // writes it): eager, sdpa, flash_attention_2. Another value is refused: a run would be charged the wrong one.
  for (const char* k : {"attn_implementation", "_attn_implementation"}) {
    if (!j.contains(k) || j[k].is_null()) continue;
    const std::string a = j[k].is_string() ? j[k].get<std::string>() : std::string();
    if (a != "eager" && a != "sdpa" && a != "flash_attention_2")
      return Status::Error(origin + ": " + k + " " + (j[k].is_string() ? "'" + a + "'" : std::string("is not a string")) +
                           ": zerotrace models eager, sdpa and flash_attention_2");
    m.attention = a;
  }
  // The dropout on the attention probabilities in training, by the family's key.
  for (const char* k : {"attention_dropout", "attn_pdrop", "dropout_rate"}) {
    if (!j.contains(k) || j[k].is_null()) continue;
    if (!j[k].is_number() || !(j[k].get<double>() >= 0 && j[k].get<double>() < 1))
      return Status::Error(origin + ": " + k + " must be a number in [0, 1) (the attention's dropout probability)");
    if (std::string(k) == "dropout_rate" && m.family != "t5") continue;
    m.attention_dropout = j[k].get<double>();
    break;
  }
  if (m.shape.name.empty()) {
    const std::string arch = j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
                                     j["architectures"][0].is_string()
                                 ? j["architectures"][0].get<std::string>()
                                 : m.family;
    m.shape.name = arch;
  }
  if (Status s = validate_shape(m.shape); !s) return Status::Error(origin + ": " + s.message());
  // The module table against the family's own formula: one parameter off is a wrong replay.
  const int64_t counted = shape_params(m.shape, false);
  if (counted != m.formula_params)
    return Status::Error(origin + ": the shape read from this " + m.family + " config counts " + std::to_string(counted) +
                         " parameters, the family's formula " + std::to_string(m.formula_params) +
                         ": a key of this file changes the layout in a way zerotrace does not read");
  *out = std::move(m);
  return Status::Ok();
}

Status read_hf_config(const std::string& path, HfModel* out) {
  std::string text;
  if (Status s = read_text_file(path, "Hugging Face config", &text); !s) return s;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return Status::Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  return hf_config_from_json(j, path, out);
}

}  // namespace zt::trainer
