// trainer/zero/ds_memory.h: what PyTorch and DeepSpeed keep in memory while they train a GPT-style
// model, term by term (issue 33), so that the simulated and the virtual GPU hold the bytes a real
// run would.
//
// Owns: the formulas, nothing else (no allocation; the engine allocates each term as a named tensor
// and frees it where autograd or DeepSpeed would). Facts from the sources, not measurements:
//  - Activations: what autograd saves for backward in a pre-LN block run in bf16/fp16 (dropout
//    off), tensor by tensor: LayerNorm's input, mean and rstd (fp32), each Linear's input, SDPA's
//    q, k, v (views of the fused qkv output), output and log-sum-exp (fp32) under flash attention;
//    under eager attention the q, k, v copies matmul makes, the softmax output [B, H, T, T] and the
//    causal mask, and the contiguous copy of the output; the MLP's fc output (GELU's input) and
//    GELU's output. With activation checkpointing (torch.utils.checkpoint, non-reentrant) a block
//    keeps its input only and recomputes the rest at its backward.
//  - The LM head: logits in the compute dtype, the loss's fp32 upcast (logits.float()), log_softmax's
//    fp32 output (saved); in backward the fp32 gradients of both and the gradient in the compute dtype.
//  - DeepSpeed ZeRO-3 (stage3.py, partition_parameters.py, partitioned_param_coordinator.py,
//    0.19): parameters partitioned per parameter (ceil(numel / W) each), those below
//    stage3_param_persistence_threshold kept whole on every rank; the contiguous ipg bucket of
//    reduce_bucket_size elements in the compute dtype, allocated once; each parameter's gradient
//    (autograd's, compute dtype) copied into it; when the next one would not fit, the bucket's
//    gradients are concatenated (torch.cat in reduce_scatter_coalesced) and reduce-scattered, and
//    under offload_optimizer each partition is copied to the host and back to the device
//    (grad_buffer.to(device), kept until partition_grads returns) and widened to fp32 for the host
//    fp32 gradient (one parameter at a time). In a world of one a fetch is a view of the partition
//    (NoGatherHandle), except the tied LM head's weight, gathered as an external parameter
//    (Init._all_gather allocates its buffer even there).
//  - Host (offload_optimizer, DeepSpeedCPUAdam): per sub-group of sub_group_size elements the fp32
//    master weights (pageable: a clone on the CPU) and Adam's two moments (pageable, made at the first
//    step), the fp32 gradient (pinned: the pinned allocator rounds it to a power of two); one pinned
//    buffer of every gradient partition in the accumulation dtype (grad_partitions_flat_buffer);
//    under offload_param one pinned buffer of the parameter partitions; each step a compute-dtype copy
//    of the master weights on its way to the device.
//  - DeepSpeed ZeRO stages 1-2 (DeepSpeedZeroOptimizer) and stage 0 in 16 bit (FP16_Optimizer): see
//    Ds12Gradients and ds0_* below (issue 41).
// Where our trainer differs (it computes in fp32 with bf16 storage, keeps fp32 gradient buckets per
// module), the engine charges these terms, not its own buffers, in virtual mode; see engine.h.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "train/train_config.h"

namespace zt::trainer {

// One tensor of the model's memory: its name in the trace, its dtype and element count.
struct MemoryTerm {
  std::string name;
  DType dtype = DType::BF16;
  int64_t numel = 0;
  int64_t bytes() const { return numel * int64_t(dtype_size(dtype)); }
};

// A step of a pass's memory: allocate the term, or free the tensor of that name.
struct MemoryOp {
  bool alloc = true;
  MemoryTerm term;
  int64_t stream = -1;  // the device's default stream; 1: DeepSpeed's reduce_and_partition_stream
  bool host = false;    // on the host instead of the device (pinned when `pinned`)
  bool pinned = false;
  // A release of a stand-in whose memory DeepSpeed frees as many small segments (one a parameter) that no
  // later tensor of the set-up fits in: the device's unsplit cached segments go back to the GPU after it, as
  // PyTorch's OOM retry (release_cached_blocks) returns them, instead of later tensors splitting one big one.
  bool return_cached = false;
};

// The model and batch the activation terms are for.
struct ActivationShape {
  int64_t B = 1, T = 1;
  int64_t width = 0, heads = 1, kv_heads = 1, ffn = 0, vocab = 0, layers = 0;
  bool gated_ffn = false;
  int64_t experts = 0, shared_experts = 0, expert_ffn = 0, dense_layers = 0;
  bool tied = true;
  bool learned_positions = true;
  DType dtype = DType::BF16;  // the compute dtype PyTorch would run in
  bool flash = true;          // SDPA (flash / memory-efficient) attention; false: eager (materialized)
  bool checkpointing = false;
  // The log-sum-exp's rows are padded to a multiple of this: 32 for SDPA's memory-efficient kernel, 1 for
  // FlashAttention-2 and SDPA's flash kernel (attention_lse_align).
  int64_t lse_align = 1;
  // Eager attention in training with attention dropout (the config's attention_dropout, attn_pdrop > 0):
  // torch's dropout keeps its bool mask and its output (what the matmul with v saves) beside the probabilities.
  bool attn_dropout = false;
};
// How the log-sum-exp the attention keeps for backward ([B, heads, T] fp32) is padded, by HF's
// attn_implementation: sdpa in fp32 runs PyTorch's memory-efficient kernel (the flash kernel takes fp16 and
// bf16 only), whose logsumexp is [B, heads, ceil(T / 32) x 32] (aten/src/ATen/native/transformers/cuda/
// attention.cu, _efficient_attention_forward: kAlignLSE = 32); flash_attention_2 (flash_attn's
// softmax_lse) and sdpa in 16 bit (_scaled_dot_product_flash_attention) keep [B, heads, T]. 1 otherwise.
int64_t attention_lse_align(const std::string& attention, DType dtype);
ActivationShape activation_shape(const ModelShape& s, bool learned_positions, int64_t B, int64_t T, DType dtype,
                                 bool flash, bool checkpointing);

// The FFN width a layer's tokens go through: the dense FFN, or in an MoE layer one routed expert
// per token plus the shared ones (the shape does not say the router's top-k).
int64_t layer_ffn(const ActivationShape& a, int64_t layer);

// What one block keeps for its backward, in the order the forward makes it, its output last (named
// for its consumer: "block4.input", or "final_ln.input" after the last block). Without activation
// checkpointing; the block's own input is not listed (the block before made it).
std::vector<MemoryTerm> block_saved(const ActivationShape& a, int64_t layer);

// The passes' memory as autograd allocates and frees it, in order.
//  embeddings forward: the token and position lookups, their sum ("block0.input").
//  block forward: the saved tensors (or, checkpointed, a scratch of the intermediates alive at once,
//    freed), and the output.
//  head: the final LayerNorm, logits, the loss's upcast and log_softmax; then the backward of the
//    loss down to the gradient of the final LayerNorm's output ("grad.hidden", kept through the
//    blocks' backward). The LM head's weight gradient is not listed (the engine's: a module gradient).
//  block backward: checkpointed, the recomputed saved tensors; the activation gradients alive at
//    the block's peak ("blockN.grad_scratch"); then everything the block kept is freed, its input too.
//  embeddings backward: frees grad.hidden.
std::vector<MemoryOp> embeddings_forward_ops(const ActivationShape& a);
std::vector<MemoryOp> block_forward_ops(const ActivationShape& a, int64_t layer);
std::vector<MemoryOp> head_ops(const ActivationShape& a);
std::vector<MemoryOp> block_backward_ops(const ActivationShape& a, int64_t layer);
std::vector<MemoryOp> embeddings_backward_ops(const ActivationShape& a);

// Replays ops from `start` bytes, each tensor rounded as the caching allocator rounds a request
// (512 B): the peak and the bytes at the end. For tests and estimates; throws std::logic_error on
// a free of a name not allocated.
struct OpsReplay {
  int64_t peak = 0, end = 0;
};
OpsReplay replay_ops(const std::vector<MemoryOp>& ops, int64_t start = 0);

// Every op of one micro-step's passes in the engine's order (forward, head, backward), for
// estimates: the activation peak of a micro-step, without model states or gradients.
std::vector<MemoryOp> micro_step_ops(const ActivationShape& a);
// An upper bound of the bytes any op list above allocates at once, in long double, so that a reader
// of shapes can refuse a batch whose int64 figures would wrap.
long double activation_bytes_bound(const ModelShape& s, int64_t B, int64_t T);

// Each module's parameters as DeepSpeed partitions them (nn.Parameters), in the engine's module
// order: a GPT-2 preset's from model::param_table, a shape's from model_shape.h's
// shape_module_parameters (the same table its modules are summed from: encoder-decoders, biases,
// q/k norms, MLA and experts as the shape says).
std::vector<std::vector<int64_t>> module_parameters(const model::Config* gpt2, const ModelShape& s,
                                                    bool learned_positions);
// DeepSpeed's partition of one parameter on each of W ranks: ceil(numel / W).
inline int64_t ds_partition_numel(int64_t numel, int64_t W) { return (numel + W - 1) / W; }
// The elements of a module's parameters kept whole on every rank at stage 3 (each below the
// persistence threshold).
int64_t persistent_numel(const std::vector<int64_t>& params, int64_t threshold);

// DeepSpeed's ipg bucket: parameters' gradients added one at a time; a parameter that would not fit
// (and the bucket not empty) flushes it first. flush() returns the ops of one flush (the concatenated
// gradients, the partitions' device copies under offload_optimizer and the fp32 temporary of the
// largest partition, all freed at the end), empty when the bucket is empty.
class IpgBucket {
 public:
  IpgBucket(int64_t capacity, int64_t world, DType dtype, bool offload_optimizer)
      : capacity_(capacity), W_(world), dtype_(dtype), offload_(offload_optimizer) {}
  // Whether adding a parameter of `numel` elements needs a flush first.
  bool needs_flush(int64_t numel) const { return elements_ > 0 && elements_ + numel > capacity_; }
  void add(int64_t numel) {
    elements_ += numel;
    params_.push_back(numel);
  }
  std::vector<MemoryOp> flush();
  int64_t elements() const { return elements_; }
  int64_t flushes() const { return flushes_; }

 private:
  int64_t capacity_, W_;
  DType dtype_;
  bool offload_;
  int64_t elements_ = 0, flushes_ = 0;
  std::vector<int64_t> params_;
};

// DeepSpeed's optimizer sub-groups at stage 3 (stage3.py's _create_fp16_sub_groups, the same rule from 0.5 to
// 0.19): consecutive trainable parameters, a group closed once this rank's partitions of them (partition_numel(),
// ceil(numel / W) each) hold sub_group_size elements or more. `numel`: each group's partition elements;
// `module_group`: for each module, the group its last parameter falls in (-1: a module without parameters,
// frozen ones passed as empty lists).
struct Ds3SubGroups {
  std::vector<int64_t> numel;
  std::vector<int> module_group;
  int64_t largest() const;
};
Ds3SubGroups ds3_sub_groups(const std::vector<std::vector<int64_t>>& modules, int64_t sub_group_size, int64_t W);
// The sizes of this rank's partition of each sub-group (ds3_sub_groups' numel).
std::vector<int64_t> ds_sub_group_partitions(const std::vector<std::vector<int64_t>>& modules, int64_t sub_group_size,
                                             int64_t W);
// What stage3.py allocates on the host for sub-group g (n partition elements) at set-up under offload_optimizer
// (device "cpu"), whole, as stand-ins: each list ends with its tensors freed, the engine's module tensors taking
// their bytes after (pageable; the 16-bit dtype `dtype`). So an OOM there asks for DeepSpeed's sizes.
//  - _create_fp32_partitions: fp16_partitioned_groups_flat[g].to(cpu).clone().float(): the 16-bit copy on the
//    host (two when the partition is on the device: .to() then .clone(); one under offload_param), then the
//    fp32 master (4n); the copies freed. Names: sub_group[g].fp16_copy, sub_group[g].fp32_partition.
std::vector<MemoryOp> ds3_master_setup_ops(int g, int64_t n, DType dtype, bool partition_on_device);
//  - initialize_optimizer_states: torch.zeros(n) (4n pageable, sub_group[g].grad_zeros) pinned into the fp32
//    gradient: made here, freed by ds3_grad_setup_done after the pinned copies (the engine's) are placed.
std::vector<MemoryOp> ds3_grad_setup_ops(int g, int64_t n);
std::vector<MemoryOp> ds3_grad_setup_done(int g);
//  - ... and (up to 0.13.1) _optimizer_step(g) on those zero gradients: DeepSpeedCPUAdam's exp_avg and exp_avg_sq
//    of the sub-group (4n each, pageable: sub_group[g].exp_avg, .exp_avg_sq), freed here.
std::vector<MemoryOp> ds3_moments_setup_ops(int g, int64_t n);

// The host memory of a ZeRO-3 rank with offload_optimizer, as DeepSpeed and DeepSpeedCPUAdam keep it.
struct HostTerms {
  int64_t master = 0;            // fp32 partitions, pageable: fp32_partitioned_groups_flat[i]
  int64_t moments = 0;           // Adam exp_avg + exp_avg_sq, pageable, from the first step
  int64_t grad_fp32 = 0;         // fp32_partitioned_groups_flat[i].grad, pinned (rounded: grad_fp32_pinned)
  int64_t grad_fp32_pinned = 0;
  int64_t grad_partitions = 0;   // grad_partitions_flat_buffer, accumulation dtype, pinned
  int64_t grad_partitions_pinned = 0;
  int64_t param_partitions = 0;  // offload_param: the parameter partitions, pinned
  int64_t param_partitions_pinned = 0;
  int64_t step_copy = 0;         // each step: the largest sub-group's master weights in the compute dtype, pageable
  int64_t model_on_host = 0;     // the user's model built in fp32 on the host before deepspeed.initialize
  // What stays from the first step on (the model on the host is gone by then).
  int64_t steady() const {
    return master + moments + grad_fp32_pinned + grad_partitions_pinned + param_partitions_pinned;
  }
};
HostTerms ds_host_terms(const std::vector<std::vector<int64_t>>& modules, int64_t W, DType dtype, bool offload_param,
                        int64_t sub_group_size);

}  // namespace zt::trainer

namespace zt::trainer {

// ---- DeepSpeed ZeRO stages 1 and 2 (DeepSpeedZeroOptimizer, runtime/zero/stage_1_and_2.py, v0.19.5), term
// by term as inject/repro/deepspeed-memory-terms.md reads them (its numbers in brackets). One param group
// (the optimizer in the DeepSpeed config: the HF Trainer passes its trainable parameters as one list):
// the trainable parameters flattened in module order into bit16_groups_flat, padded to a multiple of
// 2 x W elements, and split into W equal partitions. A rank's partition touches some parameters whole and
// at most two in part.
//  - Backward, stage 2 [9, 10, 11, 12]: each parameter's gradient (autograd's, the compute dtype) is copied
//    into the IPG buffer (ipg_buckets[<dtype>].buffer[0], reduce_bucket_size elements of the compute dtype;
//    a second, buffer[1], under overlap_comm), made at the backward's first gradient hook and freed by its
//    epilogue; when the next parameter would not fit, the bucket is flushed first: flattened
//    (allreduce_bucket.flat, the bucket's elements; none for a single tensor), all-reduced, and the slices of
//    this rank's partition copied into grads_in_partition (the whole numel of every parameter touching the
//    partition, the compute dtype), made at the first such copy and kept to the step. A parameter larger
//    than reduce_bucket_size is not copied: its own gradient waits for the next flush (extra_large_param).
//    With gradient accumulation each later micro-step makes a second grads_in_partition, added into the
//    first and freed by the epilogue.
//  - Backward, stage 1 [9, 10]: the gradients stay autograd's, accumulated over the window, and the IPG
//    buffers are made at the window's first hook; at the boundary (reduce_gradients) they go through the
//    bucket parameter by parameter as at stage 2, each freed once copied.
//  - Step, no offload [19, 20, 21, 22]: the overflow check (11 bytes an element of the largest slice) and
//    the norm's .double() (8 bytes), one slice at a time; then flat_grad_partition (the partition flattened,
//    the compute dtype), its fp32 copy single_partition_of_fp32_groups[0].grad, flat_grad_partition and
//    grads_in_partition freed; Adam; the fp32 gradient freed. FusedAdam's moments [23] are made at the first
//    step. The updated weights go back in place and are all-gathered into the flat buffer [26, 27]: no bytes.
//  - offload_optimizer [5, 8, 14, 15, 16, 17, 18]: the fp32 master and its fp32 gradient on the host, pinned
//    (pin_memory), for the whole run; a host copy of the 16-bit partition
//    (param_buffer_of_bit16_for_cpu_offload_groups[0], pinned) and temp_grad_buffer_for_cpu_offload (the
//    largest parameter, pinned); on the device temp_grad_buffer_for_gpu_offload (the largest parameter), no
//    grads_in_partition, and at the boundary per parameter of the partition the overflow check of its whole
//    gradient (11 bytes an element) and the .to(fp32) of its slice; at stage 2 with gradient accumulation,
//    accumulated_grads_in_cpu[i] (the whole parameter, pinned) from the first micro-step that is not a
//    boundary, kept. DeepSpeedCPUAdam's moments are pageable, made at the first step.

// DeepSpeed's flat param group and one rank's partition of it.
struct Ds12Partition {
  int64_t total = 0;          // Ψ: trainable elements
  int64_t padded = 0;         // Ψ rounded up to a multiple of 2 x W
  int64_t partition = 0;      // P = padded / W
  int64_t touching = 0;       // P̂: the whole numel of every parameter touching the partition
  int64_t largest = 0;        // L: the largest parameter
  int64_t largest_slice = 0;  // S: the largest part of one parameter inside the partition
  std::vector<int64_t> params;        // every parameter's numel, in flat (module) order
  std::vector<int64_t> in_partition;  // ... its elements inside this rank's partition (0: none)
  std::vector<int64_t> first_param;   // module m's first parameter in `params` (modules as given)
};
// `modules`: each module's trainable parameters (an empty list for a frozen module).
Ds12Partition ds12_partition(const std::vector<std::vector<int64_t>>& modules, int64_t W, int64_t rank);

struct Ds12Settings {
  int stage = 2;                      // 1 or 2
  int64_t world = 1, rank = 0;
  DType dtype = DType::BF16;          // the parameters' dtype: the IPG buffers', the 16-bit partitions'
  bool offload = false;               // offload_optimizer (cpu)
  int64_t grad_accum = 1;
  int64_t reduce_bucket_size = 500000000;
  bool overlap_comm = false;          // a second IPG buffer (the default at stages 1-2: off)
  bool contiguous_gradients = true;   // the IPG buffers at all (forced on by offload)
};

// A stage 1-2 rank's gradient memory through a step, as ops for the engine to charge (device tensors
// unless MemoryOp::host). Module indices are those of `modules`.
class Ds12Gradients {
 public:
  Ds12Gradients(const Ds12Settings& s, const std::vector<std::vector<int64_t>>& modules);
  const Ds12Partition& partition() const { return part_; }
  const Ds12Settings& settings() const { return s_; }
  int64_t ipg_buffers() const;  // how many IPG buffers a backward makes (0 without contiguous_gradients)
  std::string ipg_name(int i) const;  // "ipg_buckets[bf16].buffer[0]"
  // Micro-step `micro` of the window starts its backward.
  void begin_backward(int64_t micro);
  // Module m's parameters' gradients, made by its backward (`grad_name`: autograd's gradient of the module,
  // "block3.grad"). Stage 2: made, each copied into the bucket (flushing first when it would not fit), freed.
  // Stage 1: made in the window's first micro-step (accumulated in place after), kept to the boundary;
  // the buffers are set up.
  std::vector<MemoryOp> module_backward(int m, const std::string& grad_name);
  // Stage 1 at the boundary: module m's accumulated gradients through the bucket, freed once copied.
  std::vector<MemoryOp> reduce_module(int m, const std::string& grad_name);
  // independent_gradient_partition_epilogue: what is left in the bucket flushed, the buffers freed; stage 2
  // with accumulation: the micro-step's grads_in_partition added into the first and freed. Stage 1 calls it at
  // the boundary only.
  std::vector<MemoryOp> epilogue();
  // The optimizer step before Adam (no offload: the overflow check, the norm, the fp32 gradient partition
  // made, grads_in_partition freed) and after it (the fp32 gradient partition freed).
  std::vector<MemoryOp> step_before_adam() ;
  std::vector<MemoryOp> step_after_adam();
  // The buffers made once, at set-up (offload: the host copy of the 16-bit partition and
  // temp_grad_buffer_for_cpu_offload, pinned; temp_grad_buffer_for_gpu_offload on the device).
  std::vector<MemoryOp> setup_ops() const;
  // The elements of each flush (an all-reduce of that many compute-dtype elements) since the last call.
  std::vector<int64_t> take_flushes() { return std::exchange(flushes_, {}); }

 private:
  std::vector<MemoryOp> setup_buckets();
  std::vector<MemoryOp> add_param(int64_t i);
  std::vector<MemoryOp> flush();
  std::vector<MemoryOp> copy_in_partition(int64_t i);
  Ds12Settings s_;
  Ds12Partition part_;
  bool buffers_ = false;          // the IPG buffers are allocated
  int64_t micro_ = 0;
  bool boundary() const { return micro_ == s_.grad_accum - 1; }
  int64_t elements_ = 0;
  std::vector<int64_t> bucket_;   // parameters in the bucket
  int64_t extra_large_ = -1;      // a parameter larger than the bucket, waiting for the next flush
  std::string extra_large_name_;
  bool extra_large_live_ = false;  // ... its gradient charged apart (once its module's gradient is freed)
  void keep_extra_large(std::vector<MemoryOp>& ops);
  bool in_partition_ = false;     // grads_in_partition is allocated
  bool in_partition_next_ = false;  // ... and the micro-step's second one (stage 2, accumulation)
  std::vector<char> accumulated_in_cpu_;  // accumulated_grads_in_cpu[i] made
  std::vector<int64_t> flushes_;
};


// ---- DeepSpeed without ZeRO (stage 0) in 16 bit: FP16_Optimizer (runtime/fp16/fused_optimizer.py, also bf16 from
// v0.17.6) over FusedAdam, one param group of `params` (numel each, in the model's order), as
// inject/repro/deepspeed-memory-terms.md reads it (terms 3, 6, 9, 23, 28, 29, 31).
//  - Set-up: initialize_optimizer_states runs a step on zero fp32 gradients (fp32_groups_flat[0].grad, 4 bytes a
//    parameter, freed) so that the moments exist from the start.
//  - Backward: autograd's gradients in the compute dtype, the whole model, from the first backward to the step.
//  - At the boundary (the engine's allreduce_gradients -> allreduce_no_retain): the gradients in buckets of
//    MEMORY_OPT_ALLREDUCE_SIZE (5e8) elements, closed after the tensor that reaches it; each bucket flattened
//    (allreduce_bucket.flat) for its all-reduce, freed after.
//  - Step: the overflow check (x.float() of each gradient: 4 bytes an element of the largest); the fp32 copy of
//    every gradient (fp32_grads) and their concatenation fp32_groups_flat[0].grad, the list freed once
//    concatenated; after Adam the flat fp32 gradient freed (the 16-bit gradients by the engine's zero_grad).
std::vector<MemoryOp> ds0_init_ops(const std::vector<int64_t>& params);

// ---- Engine init: the flat buffers DeepSpeed makes whole, one tensor a param group (issue 41). Each list
// ends with every flat buffer freed: zt's engine keeps each module's parameters, master weights and moments
// as tensors of their own, placed right after, and these stand for DeepSpeed's views into the flat buffers
// (the same bytes). So the request, the bytes already allocated and the phase of an OOM at init are
// DeepSpeed's; the caching allocator then holds one freed flat block where DeepSpeed holds the per-parameter
// originals' blocks (the reserved bytes are the same). Run after every module's 16-bit parameters are placed
// and before any optimizer state.
//  - Stage 0, FP16_Optimizer.__init__ (runtime/fp16/fused_optimizer.py, v0.19.5 87-101, the same since 0.3):
//    fp16_groups_flat[0] = _flatten_dense_tensors([p.clone() for p in group]): every parameter cloned (the
//    compute dtype, alive together beside the originals), their concatenation, the clones dropped, the
//    originals replaced by views of the flat buffer; fp32_groups_flat[0] = fp16_groups_flat[0].clone().float()
//    (the 16-bit clone freed once converted); initialize_optimizer_states (123-133): a zero fp32 gradient of the
//    whole group and FusedAdam's step on it, which makes exp_avg and exp_avg_sq of the flat fp32 parameter
//    (fused_adam.py's zeros_like: 4 bytes an element each), the gradient freed after.
std::vector<MemoryOp> ds0_flat_init_ops(const std::vector<int64_t>& params, DType dtype);
//  - Stages 1-2, DeepSpeedZeroOptimizer.__init__ (runtime/zero/stage_1_and_2.py): bit16_groups_flat[0] is made
//    on the device only when the device has its bytes free (v0.19.5 395-400; before 0.19 always on the host,
//    the originals moved there first), so it never needs more than the parameters' own bytes: no op here.
//    The fp32 master partition single_partition_of_fp32_groups[0] = the rank's 16-bit partition .clone() then
//    .to(fp32) (v0.19.5 489-491; v0.12.6 372-375 `.to(device).clone().float()`): the clone (P elements of the
//    compute dtype, on the device) freed once converted; the fp32 partition (4·P) on the device, or on the host
//    under offload_optimizer (the engine's host masters). Then initialize_optimizer_states (v0.19.5 816-834,
//    called unconditionally at 657): a zero fp32 gradient partition torch.zeros(partition_size) on self.device
//    (4·P on the device without offload; the host's kept gradient under offload), freed at the end of init
//    without offload (`group.grad = None`). DeepSpeed up to 0.13.1 also ran optimizer.step() there (the moments
//    made at init); 0.13.2 and later make them at the first step, as zt does.
std::vector<MemoryOp> ds12_flat_init_ops(const Ds12Partition& part, DType dtype, bool offload);
//  - Legacy ZeRO-1 (FP16_DeepSpeedZeroOptimizer_Stage1, runtime/zero/stage1.py: stage 1 of DeepSpeed 0.3, and
//    of 0.4 and later with zero_optimization.legacy_stage1; read at v0.3.16): the group flattened with a zero
//    pad to count x sub x W elements (flatten_dense_tensors_sub_partition_aligned 529-576; max_elements_per_comm
//    5e8, or best_max_elems_per_comm's 277-302 choice), the rank's `count` sub-partitions of `sub` elements each
//    cloned and made fp32 one by one (204-212), then _initialize_optimizer_states (262-275): a zero fp32 gradient
//    of every sub-partition (torch.zeros(...).cuda()), all alive, and optimizer.step(), which makes the moments
//    of each sub-partition; the gradients freed. Kept after (the engine's module tensors stand for the rest):
//    the flat buffer's padding (16-bit) and the fp32 master's and moments' share of it (12 bytes an element).
struct Ds1LegacyLayout {
  int64_t comm = 0;     // max_elements_per_comm after best_max_elems_per_comm
  int64_t count = 0;    // sub-partitions a rank holds
  int64_t sub = 0;      // elements in each
  int64_t padded = 0;   // count x sub x W
};
Ds1LegacyLayout ds1_legacy_layout(int64_t total, int64_t W, int64_t max_elements_per_comm = 500000000);
std::vector<MemoryOp> ds1_legacy_init_ops(int64_t total, int64_t W, DType dtype);
std::vector<MemoryOp> ds0_allreduce_ops(const std::vector<int64_t>& params, DType dtype, int64_t bucket = 500000000);
std::vector<MemoryOp> ds0_step_before_adam(const std::vector<int64_t>& params, DType dtype);
std::vector<MemoryOp> ds0_step_after_adam();

}  // namespace zt::trainer
