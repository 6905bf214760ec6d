// DeepSpeed configs resolved as DeepSpeed 0.19 and the HF integration resolve them (issue 42):
// the batch derivation, "auto" filled from the run's arguments or left a TODO, optimizer names,
// the blocks that refuse keys they do not have, hjson's comments, duplicate keys, depth.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "train/json_text.h"
#include "train/run_args.h"
#include "train/train_config.h"

using namespace zt;
using nlohmann::json;

namespace {

struct Resolved {
  Status status;
  trainer::TrainConfig cfg;
  std::vector<std::string> notes;
  std::string value(const std::string& key) const {
    for (const auto& r : cfg.ds_resolution)
      if (r.key == key) return r.value;
    return "(none)";
  }
  std::string source(const std::string& key) const {
    for (const auto& r : cfg.ds_resolution)
      if (r.key == key) return r.source;
    return "(none)";
  }
  bool noted(const std::string& text) const {
    for (auto& n : notes)
      if (n.find(text) != std::string::npos) return true;
    return false;
  }
};

Resolved resolve(const std::string& text, int64_t gpus = 8, const trainer::RunArgs& args = {}, bool todo = false) {
  Resolved r;
  r.cfg.world_size = gpus;
  r.status = trainer::load_deepspeed_config_text(text, "ds.json", &r.cfg, &r.notes, args, todo);
  return r;
}

trainer::RunArgs hf(const std::string& pairs) {
  trainer::RunArgs a;
  Status s = trainer::parse_hf_args(pairs, "--hf-args", &a);
  EXPECT_TRUE(s.ok()) << s.message();
  return a;
}

}  // namespace

// runtime/config.py _set_batch_related_parameters: any one or two of the three give the rest.
TEST(DeepSpeedResolve, TheBatchIsDerivedAsDeepSpeedDerivesIt) {
  struct Case {
    const char* config;
    const char *micro, *accum, *global;
  };
  const Case cases[] = {
      {R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})", "2", "4", "64"},
      {R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2})", "2", "4", "64"},
      {R"({"train_batch_size": 64, "gradient_accumulation_steps": 2})", "4", "2", "64"},
      {R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})", "2", "3", "48"},
      {R"({"train_batch_size": 64})", "8", "1", "64"},
      {R"({"train_micro_batch_size_per_gpu": 4})", "4", "1", "32"},
  };
  for (const Case& c : cases) {
    Resolved r = resolve(c.config);
    ASSERT_TRUE(r.status.ok()) << c.config << ": " << r.status.message();
    EXPECT_EQ(r.value("train_micro_batch_size_per_gpu"), c.micro) << c.config;
    EXPECT_EQ(r.value("gradient_accumulation_steps"), c.accum) << c.config;
    EXPECT_EQ(r.value("train_batch_size"), c.global) << c.config;
    EXPECT_EQ(r.cfg.micro_batch, std::stoll(c.micro));
    EXPECT_EQ(r.cfg.grad_accum, std::stoll(c.accum));
  }
  // A derived value says how it was derived.
  EXPECT_NE(resolve(R"({"train_batch_size": 64})").source("train_micro_batch_size_per_gpu").find("64 // 8 GPUs"),
            std::string::npos);
  // Sequence parallelism divides the world before the batch (DeepSpeedConfig.__init__).
  Resolved sp = resolve(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 4})");
  ASSERT_TRUE(sp.status.ok()) << sp.status.message();
  EXPECT_EQ(sp.value("gradient_accumulation_steps"), "8");
  // Integer division, as DeepSpeed's //: 100 // 8 = 12 micro-batch, then 12 x 8 != 100 is refused.
  Resolved odd = resolve(R"({"train_batch_size": 100})");
  EXPECT_NE(odd.status.message().find("train_batch_size 100 != train_micro_batch_size_per_gpu 12"), std::string::npos)
      << odd.status.message();
}

TEST(DeepSpeedResolve, WhatDeepSpeedRefusesIsRefused) {
  EXPECT_NE(resolve(R"({"gradient_accumulation_steps": 2})").status.message().find(
                "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"),
            std::string::npos);
  EXPECT_NE(resolve("{}").status.message().find("neither train_batch_size nor"), std::string::npos);
  EXPECT_NE(resolve(R"({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1})")
                .status.message()
                .find("train_batch_size 7 != train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 1 x 8 GPUs"),
            std::string::npos);
  EXPECT_NE(resolve(R"({"train_batch_size": 4})").status.message().find("not above 0"), std::string::npos);
  const std::string micro = R"("train_micro_batch_size_per_gpu": 1, )";
  // pydantic's extra="forbid" in zero_optimization, the offload blocks, fp16 and bf16.
  for (const char* extra : {R"("zero_optimization": {"stage": 2, "stage3_foo": 1})",
                            R"("zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin": true}})",
                            R"("fp16": {"enabled": true, "opt_level": "O2"})", R"("bf16": {"enabled": true, "x": 1})"}) {
    Resolved r = resolve("{" + micro + extra + "}");
    EXPECT_NE(r.status.message().find("Extra inputs are not permitted"), std::string::npos)
        << extra << ": " << r.status.message();
  }
  // offload_config.py's ratio check: a partial offload only at stage 3.
  Resolved ratio = resolve("{" + micro + R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})");
  EXPECT_NE(ratio.status.message().find("Partial offloading only supported for ZeRO Stage 3."), std::string::npos)
      << ratio.status.message();
  Resolved both = resolve("{" + micro + R"("bf16": {"enabled": true}, "fp16": {"enabled": true}})");
  EXPECT_NE(both.status.message().find("cannot be simultaneously enabled"), std::string::npos);
  Resolved opt = resolve("{" + micro + R"("optimizer": {"type": "AdamWeird"}})");
  EXPECT_NE(opt.status.message().find("AdamWeird is not a supported DeepSpeed Optimizer"), std::string::npos);
  // torch.optim's names are case-sensitive: "sgd" is not SGD.
  EXPECT_NE(resolve("{" + micro + R"("optimizer": {"type": "sgd"}})").status.message().find("sgd is not a supported"),
            std::string::npos);
  // engine.py's refusals of the optimizer it builds from the config.
  EXPECT_NE(resolve("{" + micro + R"("optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}})")
                .status.message()
                .find("'max_grad_norm' is not supported as an optimizer parameter"),
            std::string::npos);
  EXPECT_NE(resolve("{" + micro + R"("optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 1}})")
                .status.message()
                .find("1bit-Adam is not compatible with ZeRO"),
            std::string::npos);
  EXPECT_NE(resolve("{" + micro + R"("optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 2}})")
                .status.message()
                .find("You are using an untested ZeRO Optimizer"),
            std::string::npos);
  EXPECT_TRUE(resolve("{" + micro + R"("optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 2},
                       "zero_allow_untested_optimizer": true})")
                  .status.ok());
  // precision_config.py: the scale's counts are ints, enabled or not.
  EXPECT_NE(resolve("{" + micro + R"("fp16": {"enabled": false, "min_loss_scale": 1e-10}})").status.message().find(
                "Input should be a valid integer"),
            std::string::npos);
  // With the run's TrainingArguments (the HF Trainer), accelerate wants a zero_optimization block.
  trainer::RunArgs args;
  ASSERT_TRUE(trainer::parse_hf_args("defaults", "--hf-args", &args).ok());
  EXPECT_NE(resolve("{" + micro + "\"bf16\": {\"enabled\": true}}", 8, args).status.message().find(
                "Please specify the ZeRO optimization config"),
            std::string::npos);
  Resolved dev = resolve("{" + micro + R"("zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}})");
  EXPECT_NE(dev.status.message().find("DeepSpeed takes none, cpu or nvme"), std::string::npos);
}

// transformers' HfTrainerDeepSpeedConfig.trainer_config_process: each "auto" from one argument.
TEST(DeepSpeedResolve, AutoIsFilledFromTheRunsArgumentsOrIsATodo) {
  const std::string text = R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "sub_group_size": "auto"}})";
  // Nothing gives the run's arguments: refused, naming the keys and the argument to give.
  Resolved none = resolve(text);
  EXPECT_FALSE(none.status.ok());
  EXPECT_NE(none.status.message().find("train_micro_batch_size_per_gpu, gradient_accumulation_steps, train_batch_size, "
                                       "gradient_clipping, fp16.enabled, bf16.enabled are \"auto\""),
            std::string::npos)
      << none.status.message();
  EXPECT_NE(none.status.message().find("--hf-args per_device_train_batch_size=N"), std::string::npos);
  // zt repro init: each one a TODO, never a number nobody chose.
  Resolved todo = resolve(text, 8, {}, true);
  ASSERT_TRUE(todo.status.ok()) << todo.status.message();
  EXPECT_EQ(todo.value("train_micro_batch_size_per_gpu"), "TODO");
  EXPECT_EQ(todo.value("gradient_clipping"), "TODO");
  EXPECT_EQ(todo.value("bf16.enabled"), "TODO");
  EXPECT_EQ(todo.value("precision"), "(none)");
  // TrainingArguments' defaults: 8 a device, 1 step, clipping 1.0, fp32.
  Resolved defaults = resolve(text, 8, hf("defaults"));
  ASSERT_TRUE(defaults.status.ok()) << defaults.status.message();
  EXPECT_EQ(defaults.value("train_micro_batch_size_per_gpu"), "8");
  EXPECT_EQ(defaults.value("train_batch_size"), "64");
  EXPECT_EQ(defaults.value("gradient_clipping"), "1");
  EXPECT_EQ(defaults.cfg.precision, "fp32");
  EXPECT_NE(defaults.source("train_micro_batch_size_per_gpu").find("TrainingArguments' default"), std::string::npos);
  EXPECT_EQ(defaults.cfg.zero.reduce_bucket_size, -1);  // from the model's width, as HF fills it
  EXPECT_TRUE(defaults.noted("sub_group_size \"auto\": DeepSpeed drops it"));
  // Given arguments, named as their source.
  Resolved given = resolve(text, 4, hf("per_device_train_batch_size=2,gradient_accumulation_steps=8,bf16=true,max_grad_norm=0.5"));
  ASSERT_TRUE(given.status.ok()) << given.status.message();
  EXPECT_EQ(given.cfg.micro_batch, 2);
  EXPECT_EQ(given.cfg.grad_accum, 8);
  EXPECT_EQ(given.value("train_batch_size"), "64");
  EXPECT_EQ(given.cfg.precision, "bf16");
  EXPECT_DOUBLE_EQ(given.cfg.grad_clip, 0.5);
  EXPECT_NE(given.source("precision").find("bf16 true (--hf-args)"), std::string::npos) << given.source("precision");
  // A name the HF integration does not have is refused, not ignored.
  trainer::RunArgs bad;
  EXPECT_NE(trainer::parse_hf_args("per_device_batch=2", "--hf-args", &bad).message().find("not a TrainingArguments name"),
            std::string::npos);
  EXPECT_FALSE(trainer::parse_hf_args("per_device_train_batch_size=2.5", "--hf-args", &bad).ok());
  EXPECT_FALSE(trainer::parse_hf_args("bf16=2", "--hf-args", &bad).ok());
}

TEST(DeepSpeedResolve, DefaultsAreDeepSpeedsAndSayTheyAre) {
  Resolved r = resolve(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {}})");
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.cfg.precision, "fp32");  // a block without "enabled" is off
  EXPECT_EQ(r.value("gradient_clipping"), "1");  // GRADIENT_CLIPPING_DEFAULT since 0.19.3
  EXPECT_NE(r.source("gradient_clipping").find("DeepSpeed's default (1.0 since 0.19.3"), std::string::npos);
  EXPECT_EQ(r.value("zero_optimization.stage"), "0");
  EXPECT_EQ(r.value("optimizer"), "none in the config");
}

// engine.py: DeepSpeed's own optimizers in any case, any torch.optim class.
TEST(DeepSpeedResolve, EveryOptimizerDeepSpeedTakesIsAccepted) {
  const std::string micro = R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": ")";
  struct Case {
    const char* type;
    const char* name;
    bool modeled;
  };
  for (const Case& c : {Case{"AdamW", "adamw", true}, Case{"adam", "adam", true}, Case{"Lamb", "lamb", true},
                        Case{"OneBitAdam", "onebitadam", false}, Case{"ZeroOneAdam", "zerooneadam", false},
                        Case{"OneBitLamb", "onebitlamb", false}, Case{"SGD", "SGD", false}, Case{"Adagrad", "adagrad", false},
                        Case{"RMSprop", "RMSprop", false}}) {
    Resolved r = resolve(micro + c.type + "\"}}");
    ASSERT_TRUE(r.status.ok()) << c.type << ": " << r.status.message();
    EXPECT_EQ(r.cfg.optimizer_name, c.name);
    EXPECT_EQ(r.cfg.unmodeled_memory_keys.empty(), c.modeled) << c.type;
  }
}

TEST(DeepSpeedResolve, OffloadsTakeEffectWhereDeepSpeedAppliesThem) {
  Resolved z2 = resolve(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2,
    "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})");
  ASSERT_TRUE(z2.status.ok()) << z2.status.message();
  EXPECT_TRUE(z2.cfg.zero.offload_optimizer);
  EXPECT_FALSE(z2.cfg.zero.offload_param);  // stage 2 never reads offload_param
  EXPECT_TRUE(z2.noted("offload_param is ignored at stage 2"));
  Resolved nvme = resolve(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}, "offload_param": {"device": "nvme",
    "nvme_path": "/local_nvme", "buffer_count": 5}}, "aio": {"block_size": 1048576}})");
  ASSERT_TRUE(nvme.status.ok()) << nvme.status.message();
  EXPECT_EQ(nvme.value("zero_optimization.offload_param.device"), "nvme");
  EXPECT_EQ(nvme.cfg.unmodeled_memory_keys.size(), 2u);  // a verdict from it is INCONCLUSIVE
}

// DeepSpeed reads configs with hjson and refuses duplicate keys (config_utils.py).
TEST(DeepSpeedResolve, CommentsAreReadAndDuplicateKeysRefusedNamingBothLines) {
  Resolved c = resolve("{\n  // the batch\n  \"train_micro_batch_size_per_gpu\": 2, # two\n  /* stage\n 3 */\n"
                       "  \"zero_optimization\": {\"stage\": 3,},\n}\n");
  ASSERT_TRUE(c.status.ok()) << c.status.message();
  EXPECT_EQ(c.cfg.zero.stage, 3);
  Resolved dup = resolve("{\n\"train_micro_batch_size_per_gpu\": 2,\n\"zero_optimization\": {\"stage\": 2,\n"
                         "\"stage\": 3}\n}");
  EXPECT_NE(dup.status.message().find("ds.json: lines 3 and 4 both give \"stage\" in zero_optimization"),
            std::string::npos)
      << dup.status.message();
  // The same key in two objects is no duplicate; a URL's // in a string is no comment.
  Resolved two = resolve(R"({"train_micro_batch_size_per_gpu": 2, "a": {"stage": 1}, "b": {"stage": 1}, "c": [{"k": 1}, {"k": 2}],
    "tensorboard": {"output_path": "http://x//y#z"}})");
  EXPECT_TRUE(two.status.ok()) << two.status.message();
}

TEST(DeepSpeedResolve, DeepNestingAndHugeValuesGetOneShortLine) {
  Resolved deep = resolve(std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_NE(deep.status.message().find("nested deeper than 64 levels"), std::string::npos) << deep.status.message();
  Resolved huge = resolve(R"({"train_micro_batch_size_per_gpu": ")" + std::string(40000, 'x') + "\"}");
  EXPECT_FALSE(huge.status.ok());
  EXPECT_LT(huge.status.message().size(), 300u) << huge.status.message().size();
  EXPECT_NE(huge.status.message().find("(40,002 characters)"), std::string::npos) << huge.status.message();
}
