// trainer/train/train_config.h: everything a training run is told, from flags or a YAML file.
// Owns: the names, defaults and validation of `zt train`'s settings. A config file uses the
// flags' names (with '_' or '-'); an unknown key is an error naming the file and line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/gpt2.h"
#include "zt/common/status.h"

namespace zt::trainer {

// ZeRO settings, named as DeepSpeed's zero_optimization keys. -1 means "auto" (resolved from
// the model's width as Hugging Face does: reduce_bucket_size = width^2, prefetch bucket =
// 0.9 width^2, persistence threshold = 10 width).
struct ZeroSettings {
  int stage = 0;
  bool offload_optimizer = false;  // fp32 master weights, Adam moments and fp32 grads on the host
  bool offload_param = false;      // stage 3: parameter shards on the host
  bool pin_memory = true;          // offload_optimizer.pin_memory: the optimizer state's host buffers pinned
  bool param_pin_memory = true;    // offload_param.pin_memory: the parameter shards' host buffers pinned
  // offload_optimizer.ratio (DeepSpeed's ZeRO-Offload++ "Twin-Flow", stage 3 only): the fraction of
  // the modules whose optimizer state is offloaded. Modules are DeepSpeed's sub-groups here: module
  // i keeps its fp32 master weights and Adam moments on the accelerator, updated there by the
  // device AdamW, when i < int((1 - ratio) * modules), and the rest are offloaded as usual (the rule
  // of DeepSpeed's stage3.py in its SuperOffload-era releases; earlier ones offloaded the first
  // int(ratio * sub-groups) instead). 1.0: every module offloaded (the default); 0.0: none.
  double offload_ratio = 1.0;
  int64_t reduce_bucket_size = 500000000;
  // zero_optimization.overlap_comm at stages 1-2: a second IPG buffer of reduce_bucket_size elements in each
  // backward (stage_1_and_2.py setup_buckets). DeepSpeed's default there is false (zero/config.py
  // overlap_comm_valid: true only at stage 3, where zt's single IPG bucket is DeepSpeed's either way).
  bool overlap_comm = false;
  // zero_optimization.legacy_stage1 at stage 1: DeepSpeed's old stage1.py (stage 1 of every 0.3 release; opt-in
  // from 0.4), whose set-up makes the fp32 master in 5e8-element sub-partitions with their moments (virtual
  // mode: ds_memory.h's ds1_legacy_init_ops); the rest of the run is modeled as today's stage 1.
  bool legacy_stage1 = false;
  int64_t prefetch_bucket_size = 50000000;
  // zero_optimization.sub_group_size (stage 3): DeepSpeed's optimizer sub-groups, consecutive parameters closed
  // once their partitions hold this many elements (stage3.py _create_fp16_sub_groups; default 1e9). Virtual
  // mode charges each sub-group's fp32 master and moments whole at set-up (ds_memory.h ds3_sub_groups).
  int64_t sub_group_size = 1000000000;
  int64_t param_persistence_threshold = 100000;
  int64_t max_live_parameters = 1000000000;
  int64_t max_reuse_distance = 1000000000;
  bool gather_16bit_weights_on_model_save = false;
  // fp16 dynamic loss scaling (DeepSpeed's fp16 block)
  double initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  double min_loss_scale = 1;
  double static_loss_scale = 0;  // fp16.loss_scale: 0 = dynamic
};

// A transformer layout beyond GPT-2's presets, for the bug reports' real models (issue 9):
// used when `model` is "custom". Real compute needs a GPT-2 layout (kv_heads == heads,
// ffn == 4 width, no experts); any other shape runs in virtual mode only (sizes, no math).
struct ModelShape {
  std::string name;            // "Yi-34B", for messages and the trace
  int64_t width = 0, layers = 0, heads = 0, kv_heads = 0;
  int64_t ffn = 0;             // dense FFN width
  bool gated_ffn = false;      // SwiGLU (3 matrices) instead of GPT-2's 2
  int64_t vocab = 0, context = 0;
  bool tied_embeddings = true; // false: a separate LM head (vocab x width)
  int64_t experts = 0;         // routed experts per MoE layer (0: dense)
  int64_t shared_experts = 0;
  int64_t expert_ffn = 0;      // each expert's FFN width
  int64_t dense_layers = 0;    // the first N layers stay dense in an MoE model
  // The exact layouts of the common families (a Hugging Face config.json: train/hf_config.h). The
  // defaults keep the older meaning of a shape (RMS norms in the blocks, a final norm of 2 x width,
  // no biases, head size width / heads).
  int64_t head_dim = 0;          // attention head size (0: width / heads; Qwen3's 128 at width 2048)
  std::string norm;              // "" (the older count), "rms" (a weight per channel), "layer" (weight and bias)
  bool qkv_bias = false;         // q, k and v projections with biases (GPT-2, Qwen2, BART)
  bool out_bias = false;         // the attention output and the MLP's matrices with biases (GPT-2, BART)
  bool qk_norm = false;          // RMS norms of each head's q and k (Qwen3)
  int64_t positions = 0;         // rows of learned position embeddings, every stack's together (GPT-2, BART)
  int64_t final_norms = 1;       // norms after the last block (T5: the encoder's and the decoder's; BART: none)
  bool embed_norm = false;       // a norm after the embeddings in each stack (BART)
  int64_t shared_expert_ffn = 0; // a shared expert's FFN width where it differs from expert_ffn (Qwen2-MoE)
  bool shared_expert_gate = false;  // the shared expert's sigmoid gate, width x 1 (Qwen2-MoE)
  bool router_bias = false;      // the router's score-correction bias, one per expert (DeepSeek-V3)
  int64_t moe_every = 1;         // after the dense layers, every Nth layer is MoE (Qwen2-MoE's decoder_sparse_step)
  // MLA (DeepSeek-V2/V3): queries through a rank-q_lora_rank bottleneck (0: a plain projection),
  // keys and values compressed to kv_lora_rank (0: ordinary attention) plus a shared RoPE key.
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // Encoder-decoder (T5, BART): `encoder_layers` encoder blocks before the `layers` decoder blocks,
  // each decoder block with cross-attention over the encoder's output.
  int64_t encoder_layers = 0;
  int64_t relative_attention_buckets = 0;  // T5's position bias: buckets x heads in each stack's first block
  int64_t decoder_seq_len = 0;   // target tokens per sample of an encoder-decoder (0: seq_len)
};

struct TrainConfig {
  std::string device = "sim";   // sim | cpu | cuda
  std::string model = "tiny";   // tiny | 124M | 350M | 774M | 1.5B
  int64_t steps = 0;            // optimizer steps; 0 = use epochs
  int64_t epochs = 0;           // 0 with steps 0 = one epoch
  int64_t micro_batch = 4;
  int64_t grad_accum = 1;
  int64_t world_size = 1;
  int64_t seq_len = 0;          // 0 = the model's context
  uint64_t seed = 1;
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (storage; math is fp32)
  uint64_t device_memory = 80ull << 30;  // the simulated GPU's size; with cuda a cap (0: the GPU's own)
  uint64_t host_memory = 0;        // 0 = no cap
  // Device memory outside PyTorch's caching allocator, taken from the simulated GPU before the run
  // allocates anything (train/outside_memory.h, issue 41): the CUDA context (none, lazy, eager or a
  // size) and NCCL's buffers of nccl_channels ring channels when world_size > 1 (0: none). The OOM
  // message's "free" and "this process has X memory in use" count them; allocated and reserved do not.
  std::string cuda_context = "none";
  int64_t nccl_channels = 0;
  std::string data;                // text or token file; empty = the built-in synthetic corpus
  int64_t max_doc_tokens = 0;      // cut each document to this many tokens (0 = off)
  int64_t synthetic_bytes = 1 << 20;
  std::string trace;               // trace file to write; empty = no trace
  double lr = 3e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 0.0;          // 0 = off
  bool activation_checkpointing = false;
  // --device cuda: the fp32 GEMMs on the GPU's TF32 tensor cores (10-bit mantissa, fp32
  // accumulation), as torch.backends.cuda.matmul.allow_tf32; off: true fp32, the CPU's results.
  bool tf32 = false;
  // --device cuda: how the fp32 GEMMs run, as torch.set_float32_matmul_precision: highest (true
  // fp32, the default), high (TF32 tensor cores: what tf32 says) or medium (bf16 tensor cores:
  // inputs rounded to bf16 inside cuBLAS, fp32 accumulation and results).
  std::string matmul_precision = "highest";
  // --device cuda with precision bf16: what the model's GEMMs take as inputs. fp32 (default: the
  // fp32 activations of the CPU reference, the GEMMs in fp32 or TF32 as matmul_precision says) or
  // bf16 (bf16 activations and weights into bf16 tensor cores, fp32 accumulation, biases and GELU
  // fused into cuBLASLt epilogues; the residual stream, attention, LayerNorm statistics, the loss
  // and every gradient stay fp32: trainer/cuda/README.md). Changes the results within bf16's
  // tolerances; the CPU and the simulated GPU always compute in fp32. (Not "compute_dtype": the
  // engine and grad_partition_dtype call the storage precision that.)
  std::string matmul_dtype = "fp32";
  // ZeRO-Offload's delayed parameter update (DPU) after N ordinary steps (-1: off; needs
  // offload_optimizer): the first N steps update in order (the paper's warm-up), then step s's
  // CPU AdamW (s counted from 0: s >= N) runs on a background thread while step s+1's forward and
  // backward run on weights one update behind. A checkpoint save applies the update in flight
  // first (a sync point).
  int64_t delayed_update = -1;
  // The overlapped update (needs offload_optimizer; not with delayed_update): step s's CPU AdamW
  // runs on a background thread, module by module in the order the forward uses them, while step
  // s+1 starts; each module's first use in step s+1 waits for its own update. The same arithmetic
  // as the ordinary update, bit for bit: only the time it takes moves under the next forward.
  bool overlap_update = false;
  // AdamW during backward (with overlap_update; stages 2-3, where a module's gradient partition lands
  // on the host during backward): each module's CPU AdamW starts as soon as its partition has landed,
  // beside the rest of backward, writing its master weights and moments out of place (a second fp32
  // state, 12 bytes a parameter of host memory); the step's norm then says whether that update stands
  // (nothing clipped, the norm finite: the ordinary update's arithmetic, bit for bit) or is thrown
  // away (clipped: the overlapped update's pass from the state kept; not finite: the step skipped).
  bool adam_in_backward = false;
  // The dtype of the gradient partitions the CPU AdamW reads under offload_optimizer: fp32
  // (DeepSpeed's fp32_partitioned_groups_flat[i].grad: each partition lands in the compute dtype
  // and is widened into an fp32 buffer on the host) or compute (bf16/fp16, ZeRO stage 2-3: the
  // partition stays as it landed, half the host memory, and AdamW widens it, and applies the
  // unscale-and-clip factor, in its own pass: 30 bytes a parameter of the step's host work instead of
  // 36, and 8 more for the fp32 partitions whenever the factor is not 1: fp16, or clipping).
  // The same arithmetic, bit for bit. A trace names the partitions NAME.grad.bf16: the zt repro
  // scenarios that match fp32_partitioned_groups_flat[i].grad (R2, R5) are written for fp32.
  std::string grad_partition_dtype = "fp32";
  // Where the pinned host memory's pages lie on a host of several NUMA nodes (zt/memory/numa.h):
  // local (default: cudaHostAlloc's, on the node of the thread that pins them; the simulated
  // GPU's, where they are first written) or interleave (round robin over the nodes the process
  // may use, so that the offload's CPU AdamW gets every node's memory bandwidth; on a GPU each
  // region is mapped, then pinned with cudaHostRegister). One node: the same pages either way.
  std::string pinned_numa = "local";
  // How attention runs (model::Attention): materialized (the fp32 reference; on a GPU cuBLAS with
  // the [B, H, T, T] probabilities kept) or flash (FlashAttention-2: one log-sum-exp per row kept,
  // bf16 products with fp32 accumulation; on a GPU the tensor-core kernels of
  // cuda/flash_attention.h, head size 16, 32 or 64). Hugging Face's attn_implementation names too:
  // eager (materialized), sdpa and flash_attention_2 (flash); the memory model tells them apart
  // (ds_memory.h: SDPA in fp32 runs the memory-efficient kernel, whose log-sum-exp rows are padded to
  // 32; FlashAttention-2 refuses fp32).
  std::string attention = "materialized";
  // Dropout on the attention probabilities in training (a Hugging Face config's attention_dropout, GPT-2's
  // attn_pdrop, T5's dropout_rate): under eager attention its mask and output are kept for backward (virtual
  // mode only: the reference passes have no dropout). 0: none.
  double attention_dropout = 0.0;
  bool quiet = false;
  // Checkpoints (issue 5; trainer/ckpt/checkpoint.h). Flags and YAML keys of the same names.
  std::string checkpoint_dir;      // where checkpoints go (and are resumed from)
  int64_t save_every = 0;          // save after every N optimizer steps (0: never)
  bool resume = false;             // resume from checkpoint_dir's latest complete checkpoint
  std::string checkpoint_gather = "streamed";  // consolidated weights: streamed (a module at a time) | device (all at once)
  bool save_safetensors = false;   // also write the consolidated weights (model.safetensors) at each save
  bool save_only_model = false;    // write only the consolidated weights: no optimizer state (not resumable)
  ZeroSettings zero;
  // Fault injection (issue 9; inject/failpoint): specs as in ZT_FAULTS, one per entry (or
  // several joined by ';'), and the seed of their probability draws (0: the run's seed).
  std::vector<std::string> faults;
  uint64_t fault_seed = 0;
  int64_t comm_timeout_ms = 600000;  // a collective waiting longer ends the run (PyTorch's watchdog: 10 min)
  // Virtual mode (issue 9): the simulated GPUs and the host keep sizes only (no backing
  // memory, no math), so a model of any size replays for memory. Ranks are symmetric: one
  // representative rank (rank 0) runs and stands for all `world_size`; the trace says so.
  bool virtual_mode = false;
  // Virtual mode only (a real run replays every step whatever it says): a step that leaves memory as the step before it left it (the same bytes and
  // blocks on the device and the host, after the same number of allocations and frees) is a steady
  // state, and the rest of the epoch's steps are counted (markers, the data they use) without being
  // replayed: a sizes-only step from the same state does the same thing again. Never with faults
  // (their call counts and draws), evaluations, saves, the delayed or overlapped update, or fp16 (the
  // loss scale moves). For runs whose question is how many steps (R1's too few steps), not what a
  // step holds; the trace's `virtual.steps_fast_forwarded` counter says how many were.
  bool virtual_fast_forward = false;
  // Issue 30: what users' jobs do that a plain training run does not.
  // Model loading (Hugging Face's from_pretrained): every rank materializes the whole model in host
  // memory in the checkpoint's dtype (load_dtype; "" = precision), then partitions it; with zero_init
  // (DeepSpeed's zero.Init, accelerate's zero3_init_flag) each rank holds one module at a time and
  // keeps only its shards.
  bool from_pretrained = false;
  std::string load_dtype;
  // Copies of each weight a rank holds at its peak while loading: 1, or 2 where the model is built
  // first and the checkpoint's state dict read beside it (transformers without low_cpu_mem_usage).
  int64_t load_copies = 1;
  bool zero_init = false;
  // What trains: full (every parameter), lora (the model frozen, adapters of rank lora_rank on
  // lora_targets: qv, attention or all; sizes only, virtual mode), freeze (the model frozen but the
  // last trainable_layers blocks, LLaMA-Factory's freeze_trainable_layers). Frozen parameters have no
  // gradients and no optimizer state.
  std::string finetuning = "full";
  int64_t lora_rank = 8;
  std::string lora_targets = "all";
  int64_t trainable_layers = 2;
  // Evaluation (Hugging Face Trainer's): after every eval_steps optimizer steps, eval_samples samples
  // in micro-batches of eval_batch (0: micro_batch) per rank, forward only; with eval_keep_logits
  // (a compute_metrics) each batch's logits, gathered from every rank, are kept on the device, moved
  // to the host every eval_accumulation_steps batches (0: only at the end), and freed after it.
  int64_t eval_steps = 0;
  int64_t eval_samples = 0;
  int64_t eval_batch = 0;
  int64_t eval_accumulation_steps = 0;
  bool eval_keep_logits = false;
  // A node memory watchdog (Ray's memory monitor, Kubernetes' memory limit, systemd-oomd, Slurm's
  // cgroup): the job is killed when its node's host memory in use reaches watchdog_kill_at of
  // host_memory (0: none). watchdog names the tool, for its message.
  double watchdog_kill_at = 0;
  std::string watchdog;
  ModelShape shape;                // when model == "custom"
  int64_t data_samples = 0;        // virtual mode: samples in the data set (no corpus is read)
  int64_t ranks_per_node = 0;      // host memory is per node: host_memory / ranks_per_node per rank (0: 1 node)
  double virtual_grad_norm = 1.0;  // virtual mode: the gradient norm the optimizer step sees (no math)
  std::string ds_config;           // DeepSpeed JSON it came from, if any
  // DeepSpeed keys of that config that change memory in a way zerotrace does not model, each as
  // "zero_optimization.zero_hpz_partition_size 8 (what it does)" (train/deepspeed_keys.h): a zt repro
  // verdict from such a run is INCONCLUSIVE, naming them.
  std::vector<std::string> unmodeled_memory_keys;
  // Each value a DeepSpeed config resolved, and where it came from: the config, DeepSpeed's
  // default, the run's arguments, a derivation ("train_batch_size 64 / 8 GPUs"), or TODO.
  struct Resolved {
    std::string key, value, source;
  };
  std::vector<Resolved> ds_resolution;
  // The optimizer as DeepSpeed names it ("adamw", "lamb", "SGD"); "" when the config has no
  // optimizer block (the training script's own: the HF Trainer's AdamW by default).
  std::string optimizer_name;
  // The optimizer the run names (train.optimizer, --optimizer; zero/optimizer_memory.h): DeepSpeed's, the
  // HF Trainer's optim names, the libraries' classes. Given, it is the one the memory model charges, over
  // the DeepSpeed config's; "" = that config's, else the engine's AdamW (FusedAdam's state; DeepSpeedCPUAdam's
  // under offload_optimizer).
  std::string optimizer;
  std::string config_file;         // where it was loaded from, for messages
};

// Applies a DeepSpeed JSON config as it is: batch sizes and accumulation ("auto" resolved
// from the flags), gradient_clipping, bf16/fp16, the AdamW optimizer block and
// zero_optimization. Keys we do not implement are named in `warnings`, never ignored
// silently; invalid values are errors naming the file and key.
Status load_deepspeed_config(const std::string& path, TrainConfig* cfg, std::vector<std::string>* warnings);
// The same from JSON text (a scenario's inline `deepspeed:` block); `origin` names it in
// messages ("r2.yaml:31 (deepspeed)") and in cfg->ds_config.
Status load_deepspeed_config_text(const std::string& text, const std::string& origin, TrainConfig* cfg,
                                  std::vector<std::string>* warnings);
// The same with the run's arguments (train/run_args.h), which fill each "auto" as the HF
// integration fills it. With `allow_todo`, an "auto" that nothing fills is left as it was and
// listed in cfg->ds_resolution with the value "TODO" (zt repro init); otherwise it is refused,
// naming the key and the argument that would fill it.
struct RunArgs;
Status load_deepspeed_config_text(const std::string& text, const std::string& origin, TrainConfig* cfg,
                                  std::vector<std::string>* warnings, const RunArgs& args, bool allow_todo = false);
Status load_deepspeed_config(const std::string& path, TrainConfig* cfg, std::vector<std::string>* warnings,
                             const RunArgs& args, bool allow_todo = false);

// Reads a YAML mapping into `cfg` (keys as the flags: micro_batch or micro-batch). `keys`, when
// given, receives the settings the file set (normalized: micro_batch).
Status load_train_config(const std::string& path, TrainConfig* cfg, std::vector<std::string>* keys = nullptr);
// The same from the file's text (`path` names it in messages).
Status load_train_config_text(const std::string& text, const std::string& path, TrainConfig* cfg,
                              std::vector<std::string>* keys = nullptr);
// Checks ranges and combinations; the message names the setting and what to do.
Status validate(const TrainConfig& cfg);
// What is wrong with the settings of model loading, frozen parameters, evaluation and the memory
// watchdog against the rest, or "" (validate() asks it).
std::string job_settings_problem(const TrainConfig& cfg);
// What is wrong with cfg.grad_partition_dtype against the rest of the settings, or "" when nothing
// is: validate() and the ZeRO engine (for callers that skip validate) both ask it.
std::string grad_partition_dtype_problem(const TrainConfig& cfg);
// The matmul precision a validated config asks for: tf32 is high.
MatmulPrecision matmul_precision_of(const TrainConfig& cfg);
model::Attention attention_of(const TrainConfig& cfg);
// The resolved configuration as JSON (written into the trace's run row).
std::string to_json(const TrainConfig& cfg);
// The modules the ZeRO engine partitions (DeepSpeed's optimizer sub-groups here), from the tables
// the engine takes them from; -1 for an unknown model.
int64_t optimizer_modules(const TrainConfig& cfg);
// offload_optimizer.ratio's split: module i keeps its optimizer state on the accelerator when
// i < first_offloaded_module (int((1 - ratio) * modules); `modules` without offload_optimizer).
int64_t first_offloaded_module(const ZeroSettings& z, int64_t modules);
// What is wrong with ARG of zero.grad_partition_stays_on_device=return(ARG), a module index, or ""
// when it names a module whose partition is offloaded: the trainer's check before the run and the
// engine's when the fault fires (for callers that skip the trainer) both ask it.
std::string stays_on_device_module_problem(const std::string& arg, const ZeroSettings& z, int64_t modules);

}  // namespace zt::trainer
