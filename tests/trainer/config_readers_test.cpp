// Users' own files read as their tools read them (issue 30): DeepSpeed's config with every alias
// DeepSpeed accepts and each key's effect, and Hugging Face config.json files of the common families
// (written here from each family's documented fields) with their published parameter counts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "train/deepspeed_keys.h"
#include "train/hf_config.h"
#include "train/model_shape.h"
#include "train/train_config.h"
#include "zero/ds_memory.h"

using namespace zt;
using nlohmann::json;

namespace {

struct Loaded {
  Status status;
  trainer::TrainConfig cfg;
  std::vector<std::string> notes;
  bool noted(const std::string& text) const {
    for (auto& n : notes)
      if (n.find(text) != std::string::npos) return true;
    return false;
  }
};

Loaded load(json ds) {
  Loaded l;
  // DeepSpeed refuses a config without a batch key: these tests are about other keys.
  if (ds.is_object() && !ds.contains("train_batch_size") && !ds.contains("train_micro_batch_size_per_gpu"))
    ds["train_micro_batch_size_per_gpu"] = 1;
  l.status = trainer::load_deepspeed_config_text(ds.dump(), "ds.json", &l.cfg, &l.notes);
  return l;
}

trainer::HfModel hf(const json& j) {
  trainer::HfModel m;
  Status st = trainer::hf_config_from_json(j, "config.json", &m);
  EXPECT_TRUE(st) << st.message();
  // The parameters DeepSpeed partitions and buckets (the virtual engine's table) are the modules'
  // own, one list a module: the engine read past the table for an encoder-decoder's blocks before.
  const auto modules = trainer::shape_modules(m.shape, false);
  const auto params = trainer::module_parameters(nullptr, m.shape, false);
  EXPECT_EQ(params.size(), modules.size());
  for (size_t i = 0; i < std::min(params.size(), modules.size()); ++i) {
    int64_t sum = 0;
    for (int64_t n : params[i]) sum += n;
    EXPECT_EQ(sum, modules[i].numel) << modules[i].name;
  }
  return m;
}

}  // namespace

TEST(DeepSpeedKeys, EveryAliasMeansWhatItMeansToDeepSpeed) {
  // stage3_gather_fp16_weights_on_model_save: the older name of stage3_gather_16bit_weights_on_model_save.
  Loaded a = load({{"zero_optimization", {{"stage", 3}, {"stage3_gather_fp16_weights_on_model_save", true}}}});
  ASSERT_TRUE(a.status) << a.status.message();
  EXPECT_TRUE(a.cfg.zero.gather_16bit_weights_on_model_save);
  EXPECT_TRUE(a.noted("stage3_gather_fp16_weights_on_model_save is DeepSpeed's deprecated name"));
  // cpu_offload / cpu_offload_param: offloads to the CPU (pinned, DeepSpeed's default).
  Loaded b = load({{"zero_optimization", {{"stage", 3}, {"cpu_offload", true}, {"cpu_offload_param", true}}}});
  ASSERT_TRUE(b.status) << b.status.message();
  EXPECT_TRUE(b.cfg.zero.offload_optimizer);
  EXPECT_TRUE(b.cfg.zero.offload_param);
  EXPECT_TRUE(b.cfg.zero.pin_memory);
  Loaded off = load({{"zero_optimization", {{"stage", 2}, {"cpu_offload", false}}}});
  ASSERT_TRUE(off.status);
  EXPECT_FALSE(off.cfg.zero.offload_optimizer);
  // cpu_offload_params: DeepSpeed 0.3-0.6's name; those releases ignored offload_param beside it.
  Loaded p = load({{"zero_optimization",
                    {{"stage", 3}, {"cpu_offload_params", true}, {"offload_param", {{"device", "none"}}}}}});
  ASSERT_TRUE(p.status) << p.status.message();
  EXPECT_TRUE(p.cfg.zero.offload_param);
  EXPECT_TRUE(p.noted("cpu_offload_params: true is the name of DeepSpeed 0.3 to 0.6"));
  EXPECT_TRUE(p.noted("offload_param is ignored"));
  // An offload block without pin_memory: pinned (today's default); that it changed in 0.19.5 is for
  // the writer of a scenario (zt repro init), not a warning on every run.
  EXPECT_TRUE(p.cfg.zero.param_pin_memory);
  const auto version = trainer::deepspeed_version_notes(
      {{"zero_optimization", {{"stage", 3}, {"cpu_offload_params", true}, {"offload_optimizer", {{"device", "cpu"}, {"pin_memory", true}}}}}},
      "ds.json");
  // And gradient_clipping's default, 1.0 since 0.19.3 (0.0 before).
  ASSERT_EQ(version.size(), 2u);
  EXPECT_NE(version[0].find("gradient_clipping is not given: 1.0, as DeepSpeed 0.19.3"), std::string::npos) << version[0];
  EXPECT_NE(version[1].find("zero_optimization.offload_param.pin_memory is not given"), std::string::npos) << version[1];
  // cpu_offload_use_pin_memory: DeepSpeed warns and ignores it.
  Loaded c = load({{"zero_optimization",
                    {{"stage", 2}, {"cpu_offload", true}, {"cpu_offload_use_pin_memory", false}}}});
  ASSERT_TRUE(c.status);
  EXPECT_TRUE(c.cfg.zero.pin_memory);
  EXPECT_TRUE(c.noted("cpu_offload_use_pin_memory is deprecated and DeepSpeed ignores it"));
  // The zero_optimization field names without their stage3_ aliases.
  Loaded d = load({{"zero_optimization",
                    {{"stage", 3}, {"max_live_parameters", 12345}, {"max_reuse_distance", 678},
                     {"prefetch_bucket_size", 999}, {"param_persistence_threshold", 10},
                     {"gather_16bit_weights_on_model_save", true}}}});
  ASSERT_TRUE(d.status) << d.status.message();
  EXPECT_EQ(d.cfg.zero.max_live_parameters, 12345);
  EXPECT_EQ(d.cfg.zero.max_reuse_distance, 678);
  EXPECT_EQ(d.cfg.zero.prefetch_bucket_size, 999);
  EXPECT_EQ(d.cfg.zero.param_persistence_threshold, 10);
  EXPECT_TRUE(d.cfg.zero.gather_16bit_weights_on_model_save);
  // bfloat16: bf16's older name; ignored when bf16 is there too (DeepSpeed reads bf16 first).
  Loaded e = load({{"bfloat16", {{"enabled", true}}}});
  ASSERT_TRUE(e.status);
  EXPECT_EQ(e.cfg.precision, "bf16");
  Loaded f = load({{"bf16", {{"enabled", false}}}, {"bfloat16", {{"enabled", true}}}});
  ASSERT_TRUE(f.status);
  EXPECT_EQ(f.cfg.precision, "fp32");
  // zero_optimization: true, the deprecated boolean form: stage 1.
  Loaded g = load({{"zero_optimization", true}, {"allgather_size", 1000}});
  ASSERT_TRUE(g.status) << g.status.message();
  EXPECT_EQ(g.cfg.zero.stage, 1);
  // Every alias of the table is exercised above or refused with its replacement below.
  EXPECT_GE(trainer::deepspeed_aliases().size(), 14u);
}

TEST(DeepSpeedKeys, ADeprecatedKeyWithItsReplacementIsRefusedAsDeepSpeedRefusesIt) {
  Loaded a = load({{"zero_optimization",
                    {{"stage", 3},
                     {"stage3_gather_fp16_weights_on_model_save", true},
                     {"stage3_gather_16bit_weights_on_model_save", false}}}});
  EXPECT_FALSE(a.status);
  EXPECT_NE(a.status.message().find("Cannot provide deprecated parameter"), std::string::npos) << a.status.message();
  Loaded b = load({{"zero_optimization", {{"stage", 3}, {"cpu_offload", false}, {"offload_optimizer", {{"device", "cpu"}}}}}});
  EXPECT_FALSE(b.status);
  Loaded c = load({{"zero_optimization", {{"stage", 3}, {"max_live_parameters", 1}, {"stage3_max_live_parameters", 2}}}});
  EXPECT_FALSE(c.status);
  EXPECT_NE(c.status.message().find("are the same setting"), std::string::npos) << c.status.message();
  Loaded d = load({{"zero_optimization", {{"stage", 2}, {"cpu_offload", "yes"}}}});
  EXPECT_FALSE(d.status);
}

TEST(DeepSpeedKeys, KeysThatChangeMemoryUnmodeledAreNamedAndHarmlessOnesAreNot) {
  Loaded a = load({{"zero_optimization", {{"stage", 3}, {"zero_hpz_partition_size", 8}, {"zero_quantized_weights", true},
                                           {"overlap_comm", true}, {"contiguous_gradients", true}}},
                   {"scheduler", {{"type", "WarmupLR"}}},
                   {"activation_checkpointing", {{"partition_activations", true}}}});
  ASSERT_TRUE(a.status) << a.status.message();
  ASSERT_EQ(a.cfg.unmodeled_memory_keys.size(), 2u);
  EXPECT_NE(a.cfg.unmodeled_memory_keys[0].find("activation_checkpointing"), std::string::npos);
  EXPECT_NE(a.cfg.unmodeled_memory_keys[1].find("zero_optimization.zero_hpz_partition_size 8"), std::string::npos);
  EXPECT_TRUE(a.noted("scheduler is accepted; it changes no memory"));
  // At its default a memory key changes nothing; overlap_comm is read (a second IPG buffer at stages 1-2,
  // Ds12Settings::overlap_comm), so it is no unmodeled key at any stage.
  Loaded b = load({{"zero_optimization", {{"stage", 2}, {"zero_hpz_partition_size", 1}, {"overlap_comm", true}}}});
  ASSERT_TRUE(b.status);
  EXPECT_TRUE(b.cfg.unmodeled_memory_keys.empty());
  EXPECT_TRUE(b.cfg.zero.overlap_comm);
  Loaded b2 = load({{"zero_optimization", {{"stage", 2}}}});
  ASSERT_TRUE(b2.status);
  EXPECT_FALSE(b2.cfg.zero.overlap_comm) << "DeepSpeed's default at stages 1-2";
  Loaded b3 = load({{"zero_optimization", {{"stage", 2}, {"overlap_comm", "yes"}}}});
  EXPECT_FALSE(b3.status);
  // legacy_stage1 is read too (stage1.py's set-up at stage 1): off unless given.
  Loaded l = load({{"zero_optimization", {{"stage", 1}, {"legacy_stage1", true}}}});
  ASSERT_TRUE(l.status) << l.status.message();
  EXPECT_TRUE(l.cfg.zero.legacy_stage1);
  EXPECT_FALSE(b2.cfg.zero.legacy_stage1);
  // A key DeepSpeed does not read is named as such (and changes nothing).
  Loaded c = load({{"monitor_config", json::object()}});
  EXPECT_TRUE(c.noted("monitor_config is not a key DeepSpeed 0.19 reads; ignored, as DeepSpeed ignores it"));
  EXPECT_TRUE(c.cfg.unmodeled_memory_keys.empty());
}

TEST(DeepSpeedKeys, EachOffloadBlockPinsItsOwnBuffers) {
  Loaded a = load({{"zero_optimization",
                    {{"stage", 3},
                     {"offload_optimizer", {{"device", "cpu"}, {"pin_memory", false}}},
                     {"offload_param", {{"device", "cpu"}, {"pin_memory", true}}}}}});
  ASSERT_TRUE(a.status) << a.status.message();
  EXPECT_FALSE(a.cfg.zero.pin_memory);
  EXPECT_TRUE(a.cfg.zero.param_pin_memory);
}

// ---- Hugging Face configs: each family from its documented fields, against published counts.

TEST(HfConfig, Gpt2) {
  trainer::HfModel m = hf({{"model_type", "gpt2"}, {"n_embd", 768}, {"n_layer", 12}, {"n_head", 12}, {"vocab_size", 50257},
                           {"n_positions", 1024}});
  EXPECT_EQ(m.formula_params, 124439808);  // GPT-2 small
  EXPECT_EQ(trainer::shape_params(m.shape, false), 124439808);
  EXPECT_EQ(m.shape.ffn, 3072);
  EXPECT_TRUE(m.shape.tied_embeddings);
}

TEST(HfConfig, LlamaAndMistral) {
  trainer::HfModel llama = hf({{"model_type", "llama"}, {"hidden_size", 4096}, {"num_hidden_layers", 32},
                               {"num_attention_heads", 32}, {"intermediate_size", 11008}, {"vocab_size", 32000},
                               {"max_position_embeddings", 4096}, {"torch_dtype", "float16"}});
  EXPECT_EQ(trainer::shape_params(llama.shape, false), 6738415616);  // Llama-2-7B
  EXPECT_EQ(llama.dtype, "fp16");
  EXPECT_EQ(llama.shape.kv_heads, 32);
  trainer::HfModel mistral = hf({{"model_type", "mistral"}, {"hidden_size", 4096}, {"num_hidden_layers", 32},
                                 {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"intermediate_size", 14336},
                                 {"vocab_size", 32000}, {"max_position_embeddings", 32768}, {"torch_dtype", "bfloat16"}});
  EXPECT_EQ(trainer::shape_params(mistral.shape, false), 7241732096);  // Mistral-7B-v0.1
  EXPECT_EQ(mistral.shape.kv_heads, 8);
  EXPECT_EQ(mistral.dtype, "bf16");
}

TEST(HfConfig, MixtralAndQwenMoE) {
  trainer::HfModel mixtral = hf({{"model_type", "mixtral"}, {"hidden_size", 4096}, {"num_hidden_layers", 32},
                                 {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"intermediate_size", 14336},
                                 {"num_local_experts", 8}, {"num_experts_per_tok", 2}, {"vocab_size", 32000},
                                 {"max_position_embeddings", 32768}});
  EXPECT_EQ(trainer::shape_params(mixtral.shape, false), 46702792704);  // Mixtral-8x7B
  EXPECT_EQ(mixtral.shape.experts, 8);
  trainer::HfModel q15moe = hf({{"model_type", "qwen2_moe"}, {"hidden_size", 2048}, {"num_hidden_layers", 24},
                                {"num_attention_heads", 16}, {"num_key_value_heads", 16}, {"intermediate_size", 5632},
                                {"moe_intermediate_size", 1408}, {"shared_expert_intermediate_size", 5632},
                                {"num_experts", 60}, {"num_experts_per_tok", 4}, {"decoder_sparse_step", 1},
                                {"vocab_size", 151936}, {"max_position_embeddings", 8192}});
  EXPECT_EQ(trainer::shape_params(q15moe.shape, false), 14315784192);  // Qwen1.5-MoE-A2.7B: 14.3 B
  EXPECT_TRUE(q15moe.shape.shared_expert_gate);
  trainer::HfModel q3moe = hf({{"model_type", "qwen3_moe"}, {"hidden_size", 2048}, {"num_hidden_layers", 48},
                               {"num_attention_heads", 32}, {"num_key_value_heads", 4}, {"head_dim", 128},
                               {"intermediate_size", 6144}, {"moe_intermediate_size", 768}, {"num_experts", 128},
                               {"num_experts_per_tok", 8}, {"decoder_sparse_step", 1}, {"mlp_only_layers", json::array()},
                               {"vocab_size", 151936}, {"max_position_embeddings", 40960}});
  EXPECT_EQ(trainer::shape_params(q3moe.shape, false), 30532122624);  // Qwen3-30B-A3B
  EXPECT_EQ(q3moe.shape.head_dim, 128) << "head size 128 at width 2048 and 32 heads";
}

TEST(HfConfig, QwenDense) {
  trainer::HfModel q25 = hf({{"model_type", "qwen2"}, {"hidden_size", 3584}, {"num_hidden_layers", 28},
                             {"num_attention_heads", 28}, {"num_key_value_heads", 4}, {"intermediate_size", 18944},
                             {"vocab_size", 152064}, {"max_position_embeddings", 32768}, {"tie_word_embeddings", false}});
  EXPECT_EQ(trainer::shape_params(q25.shape, false), 7615616512);  // Qwen2.5-7B
  EXPECT_TRUE(q25.shape.qkv_bias);
  trainer::HfModel q3 = hf({{"model_type", "qwen3"}, {"hidden_size", 4096}, {"num_hidden_layers", 36},
                            {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"head_dim", 128},
                            {"intermediate_size", 12288}, {"vocab_size", 151936}, {"max_position_embeddings", 40960},
                            {"tie_word_embeddings", false}});
  EXPECT_EQ(trainer::shape_params(q3.shape, false), 8190735360);  // Qwen3-8B
  EXPECT_TRUE(q3.shape.qk_norm);
}

TEST(HfConfig, DeepSeekV2AndV3) {
  trainer::HfModel v3 = hf({{"model_type", "deepseek_v3"}, {"hidden_size", 7168}, {"num_hidden_layers", 61},
                            {"num_attention_heads", 128}, {"q_lora_rank", 1536}, {"kv_lora_rank", 512},
                            {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128},
                            {"intermediate_size", 18432}, {"moe_intermediate_size", 2048}, {"n_routed_experts", 256},
                            {"n_shared_experts", 1}, {"first_k_dense_replace", 3}, {"moe_layer_freq", 1},
                            {"topk_method", "noaux_tc"}, {"num_nextn_predict_layers", 1}, {"vocab_size", 129280},
                            {"max_position_embeddings", 163840}});
  EXPECT_EQ(trainer::shape_params(v3.shape, false), 671026419200);  // DeepSeek-V3: 671 B without its MTP layer
  EXPECT_FALSE(v3.notes.empty()) << "the multi-token-prediction layer is said, not counted";
  trainer::HfModel lite = hf({{"model_type", "deepseek_v2"}, {"hidden_size", 2048}, {"num_hidden_layers", 27},
                              {"num_attention_heads", 16}, {"q_lora_rank", nullptr}, {"kv_lora_rank", 512},
                              {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128},
                              {"intermediate_size", 10944}, {"moe_intermediate_size", 1408}, {"n_routed_experts", 64},
                              {"n_shared_experts", 2}, {"first_k_dense_replace", 1}, {"topk_method", "greedy"},
                              {"vocab_size", 102400}, {"max_position_embeddings", 163840}});
  EXPECT_EQ(trainer::shape_params(lite.shape, false), 15706484224);  // DeepSeek-V2-Lite: 15.7 B
}

TEST(HfConfig, T5AndBart) {
  trainer::HfModel t5 = hf({{"model_type", "t5"}, {"d_model", 1024}, {"d_kv", 128}, {"d_ff", 65536}, {"num_layers", 24},
                            {"num_heads", 128}, {"vocab_size", 32128}, {"feed_forward_proj", "relu"}});
  EXPECT_EQ(trainer::shape_params(t5.shape, false), 11307321344);  // t5-11b
  EXPECT_EQ(t5.shape.encoder_layers, 24);
  EXPECT_EQ(t5.shape.layers, 24);
  trainer::HfModel v11 = hf({{"model_type", "t5"}, {"d_model", 768}, {"d_kv", 64}, {"d_ff", 2048}, {"num_layers", 12},
                             {"num_heads", 12}, {"vocab_size", 32128}, {"feed_forward_proj", "gated-gelu"},
                             {"tie_word_embeddings", false}});
  EXPECT_EQ(v11.formula_params, trainer::shape_params(v11.shape, false));
  EXPECT_TRUE(v11.shape.gated_ffn);
  EXPECT_FALSE(v11.shape.tied_embeddings);
  trainer::HfModel bart = hf({{"model_type", "bart"}, {"d_model", 768}, {"encoder_layers", 6}, {"decoder_layers", 6},
                              {"encoder_attention_heads", 12}, {"decoder_attention_heads", 12}, {"encoder_ffn_dim", 3072},
                              {"decoder_ffn_dim", 3072}, {"vocab_size", 50265}, {"max_position_embeddings", 1024}});
  EXPECT_EQ(trainer::shape_params(bart.shape, false), 139420416);  // facebook/bart-base
}

TEST(HfConfig, WhatIsNotReadIsRefusedByName) {
  trainer::HfModel m;
  Status st = trainer::hf_config_from_json({{"model_type", "falcon"}}, "config.json", &m);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("model_type 'falcon' is not a family zerotrace reads"), std::string::npos) << st.message();
  st = trainer::hf_config_from_json({{"model_type", "llama"}, {"hidden_size", 4096}}, "config.json", &m);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("config.json: num_hidden_layers is missing"), std::string::npos) << st.message();
  st = trainer::hf_config_from_json({{"model_type", "llama"}, {"hidden_size", 64}, {"num_hidden_layers", 2},
                                     {"num_attention_heads", 4}, {"intermediate_size", 128}, {"vocab_size", 256},
                                     {"mlp_bias", true}},
                                    "config.json", &m);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("mlp_bias true"), std::string::npos) << st.message();
  st = trainer::hf_config_from_json({{"model_type", "qwen3_moe"}, {"hidden_size", 64}, {"num_hidden_layers", 4},
                                     {"num_attention_heads", 4}, {"moe_intermediate_size", 32}, {"num_experts", 4},
                                     {"intermediate_size", 128}, {"vocab_size", 256}, {"mlp_only_layers", {1, 3}}},
                                    "config.json", &m);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("mlp_only_layers [1,3]"), std::string::npos) << st.message();
  st = trainer::read_hf_config("/nonexistent/config.json", &m);
  EXPECT_FALSE(st);
}

// A file's sizes are untrusted: past the limits every reader of shapes applies, each family refuses
// the file in one line before its formula multiplies or loops over them (a trillion layers hung it).
TEST(HfConfig, SizesPastTheLimitsAreRefusedBeforeAnythingIsComputed) {
  const json huge_layers[] = {
      {{"model_type", "llama"}, {"hidden_size", 64}, {"num_hidden_layers", 999999999999}, {"num_attention_heads", 4},
       {"intermediate_size", 128}, {"vocab_size", 256}},
      {{"model_type", "deepseek_v3"}, {"hidden_size", 64}, {"num_hidden_layers", 999999999999}, {"num_attention_heads", 4},
       {"intermediate_size", 128}, {"moe_intermediate_size", 32}, {"n_routed_experts", 4}, {"vocab_size", 256},
       {"kv_lora_rank", 16}, {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 8}, {"v_head_dim", 8}},
      {{"model_type", "gpt2"}, {"n_embd", 64}, {"n_layer", 999999999999}, {"n_head", 4}, {"vocab_size", 256},
       {"n_positions", 64}},
      {{"model_type", "t5"}, {"d_model", 64}, {"d_ff", 128}, {"d_kv", 16}, {"num_layers", 999999999999}, {"num_heads", 4},
       {"vocab_size", 256}},
      {{"model_type", "bart"}, {"d_model", 64}, {"encoder_layers", 999999999999}, {"decoder_layers", 2},
       {"encoder_attention_heads", 4}, {"encoder_ffn_dim", 128}, {"vocab_size", 256}, {"max_position_embeddings", 64}}};
  for (const json& j : huge_layers) {
    SCOPED_TRACE(j["model_type"].get<std::string>());
    trainer::HfModel m;
    Status st = trainer::hf_config_from_json(j, "config.json", &m);
    EXPECT_FALSE(st);
    EXPECT_NE(st.message().find("layers is above the limit of 65536"), std::string::npos) << st.message();
  }
  // Parameters past 2^44 from sizes each in range; and a single field past 2^40.
  trainer::HfModel m;
  Status st = trainer::hf_config_from_json({{"model_type", "llama"}, {"hidden_size", 1 << 20}, {"num_hidden_layers", 60000},
                                            {"num_attention_heads", 8}, {"intermediate_size", 1 << 24}, {"vocab_size", 256}},
                                           "config.json", &m);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("parameters is above the limit of 17592186044416"), std::string::npos) << st.message();
  st = trainer::hf_config_from_json({{"model_type", "bart"}, {"d_model", 64}, {"encoder_layers", 2}, {"decoder_layers", 2},
                                     {"encoder_attention_heads", 4}, {"encoder_ffn_dim", 128}, {"vocab_size", 256},
                                     {"max_position_embeddings", int64_t(1) << 62}},
                                    "config.json", &m);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("max_position_embeddings must be a whole number from 0 to 2^40"), std::string::npos)
      << st.message();
  // Zeros that divide: Qwen-MoE's decoder_sparse_step (a division by zero), T5's d_kv.
  st = trainer::hf_config_from_json({{"model_type", "qwen2_moe"}, {"hidden_size", 64}, {"num_hidden_layers", 4},
                                     {"num_attention_heads", 4}, {"intermediate_size", 128}, {"vocab_size", 100},
                                     {"num_experts", 4}, {"moe_intermediate_size", 32}, {"decoder_sparse_step", 0}},
                                    "config.json", &m);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("decoder_sparse_step must be at least 1"), std::string::npos) << st.message();
  st = trainer::hf_config_from_json({{"model_type", "t5"}, {"d_model", 64}, {"d_ff", 128}, {"d_kv", 0}, {"num_layers", 2},
                                     {"num_heads", 4}, {"vocab_size", 256}},
                                    "config.json", &m);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("d_kv must be at least 1"), std::string::npos) << st.message();
}
