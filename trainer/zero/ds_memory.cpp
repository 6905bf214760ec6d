#include "zero/ds_memory.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "model/layout.h"
#include "train/model_shape.h"
#include "zt/memory/device_allocator.h"
#include "zt/memory/host_allocator.h"

namespace zt::trainer {

namespace {

MemoryOp alloc(std::string name, DType dt, int64_t numel) { return MemoryOp{true, MemoryTerm{std::move(name), dt, numel}}; }
MemoryOp release(std::string name) { return MemoryOp{false, MemoryTerm{std::move(name), DType::F32, 0}}; }

std::string block_name(int64_t l) { return "block" + std::to_string(l); }

// The name of block l's output: the next block's input, or the final LayerNorm's.
std::string output_name(const ActivationShape& a, int64_t l) {
  return l + 1 < a.layers ? block_name(l + 1) + ".input" : std::string("final_ln.input");
}

int64_t head_dim(const ActivationShape& a) { return a.width / a.heads; }
int64_t qkv_width(const ActivationShape& a) { return a.width + 2 * a.kv_heads * head_dim(a); }

// The attention's part of a block's forward (after ln_1, before the output projection): what it
// allocates and frees, the saved tensors left allocated. Flash: the fused qkv output (q, k, v are
// views of it, saved), the output (saved; its transpose back is a view, so it is also c_proj's
// input) and the fp32 log-sum-exp. Eager: matmul copies q and k^T (and v, repeated to every head
// under grouped KV) to contiguous batches it saves; scores, their scaled and masked versions are
// temporaries, the softmax output [B, H, T, T] and the causal mask (bool) are saved; the qkv output is
// freed once copied; y = probs @ v is a temporary, its contiguous copy is c_proj's input.
void attention_ops(const ActivationShape& a, const std::string& P, std::vector<MemoryOp>& ops) {
  const DType E = a.dtype;
  const int64_t N = a.B * a.T, C = a.width;
  ops.push_back(alloc(P + ".attn.qkv", E, N * qkv_width(a)));
  if (a.flash) {
    ops.push_back(alloc(P + ".attn.out", E, N * C));
    const int64_t rows = (a.T + a.lse_align - 1) / a.lse_align * a.lse_align;
    ops.push_back(alloc(P + ".attn.lse", DType::F32, a.B * a.heads * rows));
    return;
  }
  const int64_t scores = a.B * a.heads * a.T * a.T;
  ops.push_back(alloc(P + ".attn.q", E, N * C));
  ops.push_back(alloc(P + ".attn.k", E, N * C));
  ops.push_back(alloc(P + ".attn.scores", E, scores));
  ops.push_back(alloc(P + ".attn.scores_scaled", E, scores));
  ops.push_back(release(P + ".attn.scores"));
  ops.push_back(alloc(P + ".attn.mask", DType::I32, (a.T * a.T + 3) / 4));  // T x T bools
  ops.push_back(alloc(P + ".attn.scores_masked", E, scores));
  ops.push_back(release(P + ".attn.scores_scaled"));
  ops.push_back(alloc(P + ".attn.probs", E, scores));
  ops.push_back(release(P + ".attn.scores_masked"));
  if (a.attn_dropout) {
    // nn.functional.dropout(probs, p, training=True) (transformers' eager_attention_forward): native_dropout's
    // bool mask, saved for its backward, and its output, saved by the matmul with v; the probabilities stay
    // saved for the softmax's backward.
    ops.push_back(alloc(P + ".attn.dropout_mask", DType::I32, (scores + 3) / 4));  // B x H x T x T bools
    ops.push_back(alloc(P + ".attn.probs_dropped", E, scores));
  }
  ops.push_back(alloc(P + ".attn.v", E, N * C));
  ops.push_back(release(P + ".attn.qkv"));
  ops.push_back(alloc(P + ".attn.y", E, N * C));
  ops.push_back(alloc(P + ".attn.out", E, N * C));
  ops.push_back(release(P + ".attn.y"));
}

void layer_norm_ops(const ActivationShape& a, const std::string& P, std::vector<MemoryOp>& ops) {
  const int64_t N = a.B * a.T;
  ops.push_back(alloc(P + ".mean", DType::F32, N));
  ops.push_back(alloc(P + ".rstd", DType::F32, N));
  ops.push_back(alloc(P + ".out", a.dtype, N * a.width));
}

// The MLP's saved tensors: dense, fc's output (GELU's input) and GELU's output (c_proj's input);
// gated (SwiGLU), the gate and up projections, SiLU's output and the product (down's input).
void mlp_ops(const ActivationShape& a, const std::string& P, int64_t layer, std::vector<MemoryOp>& ops) {
  const int64_t N = a.B * a.T, F = layer_ffn(a, layer);
  if (a.gated_ffn) {
    ops.push_back(alloc(P + ".mlp.gate", a.dtype, N * F));
    ops.push_back(alloc(P + ".mlp.up", a.dtype, N * F));
    ops.push_back(alloc(P + ".mlp.act", a.dtype, N * F));
    ops.push_back(alloc(P + ".mlp.prod", a.dtype, N * F));
  } else {
    ops.push_back(alloc(P + ".mlp.fc", a.dtype, N * F));
    ops.push_back(alloc(P + ".mlp.act", a.dtype, N * F));
  }
}

// The full forward of block l with everything autograd saves left allocated (the projections'
// outputs are freed by the residual adds).
std::vector<MemoryOp> saving_forward(const ActivationShape& a, int64_t l) {
  const std::string P = block_name(l);
  const int64_t N = a.B * a.T, C = a.width;
  std::vector<MemoryOp> ops;
  layer_norm_ops(a, P + ".ln_1", ops);
  attention_ops(a, P, ops);
  ops.push_back(alloc(P + ".attn.proj", a.dtype, N * C));
  ops.push_back(alloc(P + ".residual", a.dtype, N * C));  // x + attn: ln_2's input
  ops.push_back(release(P + ".attn.proj"));
  layer_norm_ops(a, P + ".ln_2", ops);
  mlp_ops(a, P, l, ops);
  ops.push_back(alloc(P + ".mlp.proj", a.dtype, N * C));
  ops.push_back(alloc(output_name(a, l), a.dtype, N * C));
  ops.push_back(release(P + ".mlp.proj"));
  return ops;
}

// What is left allocated after `ops`, in allocation order.
std::vector<MemoryTerm> left_allocated(const std::vector<MemoryOp>& ops) {
  std::vector<MemoryTerm> live;
  for (const MemoryOp& op : ops) {
    if (op.alloc) {
      live.push_back(op.term);
    } else {
      auto it = std::find_if(live.begin(), live.end(), [&](const MemoryTerm& t) { return t.name == op.term.name; });
      if (it != live.end()) live.erase(it);
    }
  }
  return live;
}

int64_t rounded(int64_t bytes) { return int64_t(memory::round_request(size_t(bytes))); }

}  // namespace

ActivationShape activation_shape(const ModelShape& s, bool learned_positions, int64_t B, int64_t T, DType dtype,
                                 bool flash, bool checkpointing) {
  ActivationShape a;
  a.B = B;
  a.T = T;
  a.width = s.width;
  a.heads = s.heads;
  a.kv_heads = s.kv_heads > 0 ? s.kv_heads : s.heads;
  a.ffn = s.ffn;
  a.vocab = s.vocab;
  a.layers = s.layers;
  a.gated_ffn = s.gated_ffn;
  a.experts = s.experts;
  a.shared_experts = s.shared_experts;
  a.expert_ffn = s.expert_ffn;
  a.dense_layers = s.dense_layers;
  a.tied = s.tied_embeddings;
  a.learned_positions = learned_positions;
  a.dtype = dtype;
  a.flash = flash;
  a.checkpointing = checkpointing;
  return a;
}

int64_t attention_lse_align(const std::string& attention, DType dtype) {
  return attention == "sdpa" && dtype == DType::F32 ? 32 : 1;
}

int64_t layer_ffn(const ActivationShape& a, int64_t layer) {
  if (a.experts > 0 && layer >= a.dense_layers) return a.expert_ffn * (1 + a.shared_experts);
  return a.ffn;
}

std::vector<MemoryTerm> block_saved(const ActivationShape& a, int64_t layer) {
  return left_allocated(saving_forward(a, layer));
}

std::vector<MemoryOp> embeddings_forward_ops(const ActivationShape& a) {
  const int64_t N = a.B * a.T;
  std::vector<MemoryOp> ops;
  ops.push_back(alloc("embeddings.wte_out", a.dtype, N * a.width));
  if (a.learned_positions) ops.push_back(alloc("embeddings.wpe_out", a.dtype, a.T * a.width));
  ops.push_back(alloc(a.layers > 0 ? "block0.input" : "final_ln.input", a.dtype, N * a.width));
  ops.push_back(release("embeddings.wte_out"));
  if (a.learned_positions) ops.push_back(release("embeddings.wpe_out"));
  return ops;
}

std::vector<MemoryOp> block_forward_ops(const ActivationShape& a, int64_t l) {
  if (!a.checkpointing) return saving_forward(a, l);
  // Checkpointed (non-reentrant): the forward runs without saving; each intermediate is freed after
  // its last use. Alive at once at most: the attention's inputs and outputs, or the residual with
  // the MLP's intermediates (the larger of the two), as one scratch.
  const int64_t N = a.B * a.T, C = a.width, F = layer_ffn(a, l);
  const std::string P = block_name(l);
  int64_t attn = N * (C + qkv_width(a));  // ln_1's output and the qkv output
  if (a.flash) attn = std::max(attn, N * (qkv_width(a) + C));
  else attn = N * (qkv_width(a) + 2 * C) + 2 * a.B * a.heads * a.T * a.T;  // + q, k^T copies, two score buffers
  const int64_t mlp = N * (C + (a.gated_ffn ? 3 : 2) * F);  // residual + the MLP's two (three) widest
  std::vector<MemoryOp> ops;
  ops.push_back(alloc(P + ".forward_scratch", a.dtype, std::max(attn, mlp)));
  ops.push_back(release(P + ".forward_scratch"));
  ops.push_back(alloc(output_name(a, l), a.dtype, N * C));
  return ops;
}

std::vector<MemoryOp> head_ops(const ActivationShape& a) {
  const int64_t N = a.B * a.T, V = a.vocab, C = a.width;
  const bool upcast = a.dtype != DType::F32;
  std::vector<MemoryOp> ops;
  layer_norm_ops(a, "final_ln", ops);
  ops.push_back(alloc("lm_head.logits", a.dtype, N * V));
  // F.cross_entropy(logits.float(), ...): log_softmax keeps its fp32 output; the upcast is freed
  // when the loss returns, the logits when the model's forward does.
  if (upcast) ops.push_back(alloc("lm_head.logits_fp32", DType::F32, N * V));
  ops.push_back(alloc("lm_head.log_softmax", DType::F32, N * V));
  if (upcast) ops.push_back(release("lm_head.logits_fp32"));
  ops.push_back(release("lm_head.logits"));
  // Backward: nll_loss's gradient (zeros with one entry a row), log_softmax's, freeing the first and
  // the saved output; the cast back to the compute dtype; the head's matmul.
  ops.push_back(alloc("lm_head.grad_log_softmax", DType::F32, N * V));
  ops.push_back(alloc("lm_head.grad_logits_fp32", DType::F32, N * V));
  ops.push_back(release("lm_head.grad_log_softmax"));
  ops.push_back(release("lm_head.log_softmax"));
  if (upcast) {
    ops.push_back(alloc("lm_head.grad_logits", a.dtype, N * V));
    ops.push_back(release("lm_head.grad_logits_fp32"));
  }
  ops.push_back(alloc("grad.hidden", a.dtype, N * C));
  ops.push_back(release(upcast ? "lm_head.grad_logits" : "lm_head.grad_logits_fp32"));
  ops.push_back(release("final_ln.out"));
  ops.push_back(release("final_ln.mean"));
  ops.push_back(release("final_ln.rstd"));
  ops.push_back(release("final_ln.input"));
  return ops;
}

std::vector<MemoryOp> block_backward_ops(const ActivationShape& a, int64_t l) {
  const std::string P = block_name(l);
  const int64_t N = a.B * a.T;
  std::vector<MemoryOp> ops;
  std::vector<MemoryTerm> saved = block_saved(a, l);
  saved.pop_back();  // the output: the next block's input, freed by that block's backward
  if (a.checkpointing)  // the recomputation (it stops once the saved tensors are back: no output)
    for (const MemoryTerm& t : saved) ops.push_back(MemoryOp{true, t});
  // The activation gradients alive at once beyond the saved tensors: at GELU's (SiLU's) backward
  // the gradient of its output and of its input (the FFN's width each) while its output is freed;
  // under eager attention, at the softmax's backward, the gradients of the probabilities and scores.
  int64_t scratch = N * layer_ffn(a, l);
  if (!a.flash) scratch = std::max(scratch, a.B * a.heads * a.T * a.T);
  ops.push_back(alloc(P + ".grad_scratch", a.dtype, scratch));
  ops.push_back(release(P + ".grad_scratch"));
  for (const MemoryTerm& t : saved) ops.push_back(release(t.name));
  ops.push_back(release(P + ".input"));
  return ops;
}

std::vector<MemoryOp> embeddings_backward_ops(const ActivationShape& a) {
  std::vector<MemoryOp> ops;
  (void)a;
  ops.push_back(release("grad.hidden"));  // block0's backward freed its input, the embeddings' output
  return ops;
}

OpsReplay replay_ops(const std::vector<MemoryOp>& ops, int64_t start) {
  std::map<std::string, int64_t> live;
  OpsReplay r;
  int64_t cur = start;
  r.peak = start;
  for (const MemoryOp& op : ops) {
    if (op.alloc) {
      if (live.count(op.term.name)) throw std::logic_error("replay_ops: " + op.term.name + " allocated twice");
      const int64_t b = rounded(op.term.bytes());
      live[op.term.name] = b;
      cur += b;
      r.peak = std::max(r.peak, cur);
    } else {
      auto it = live.find(op.term.name);
      if (it == live.end()) throw std::logic_error("replay_ops: free of " + op.term.name + ", which is not allocated");
      cur -= it->second;
      live.erase(it);
    }
  }
  r.end = cur;
  return r;
}

std::vector<MemoryOp> micro_step_ops(const ActivationShape& a) {
  std::vector<MemoryOp> ops = embeddings_forward_ops(a);
  auto append = [&](const std::vector<MemoryOp>& more) { ops.insert(ops.end(), more.begin(), more.end()); };
  for (int64_t l = 0; l < a.layers; ++l) append(block_forward_ops(a, l));
  append(head_ops(a));
  for (int64_t l = a.layers - 1; l >= 0; --l) append(block_backward_ops(a, l));
  append(embeddings_backward_ops(a));
  return ops;
}

long double activation_bytes_bound(const ModelShape& m, int64_t B, int64_t T) {
  using L = long double;
  const L N = L(B) * L(T), C = L(m.width), scores = L(B) * L(m.heads) * L(T) * L(T);
  const L F = std::max(L(m.ffn), L(m.expert_ffn) * (1 + L(m.shared_experts)));
  const L qkv = C + 2 * L(m.kv_heads) * (m.heads > 0 ? C / L(m.heads) : C);
  // Per layer, in 4-byte elements (every dtype counted as fp32): the saved tensors, eager's
  // temporaries and a backward's scratch, all at once; Korthikanti's 34 bytes and 5 a s^2 b beside.
  const L per_layer = 4 * (N * (10 * C + qkv + 5 * F) + 4 * scores + L(T) * L(T)) + N * C * 34 + 5 * scores;
  const L head = 4 * N * L(m.vocab) * 6 + 4 * N * C * 4;
  if (m.encoder_layers <= 0) return (L(m.layers) + 1) * per_layer + head;
  // An encoder-decoder (model_shape.h's encoder_decoder_activation_bytes): the FFN and attention
  // widths, cross-attention over both lengths (its target length up to the largest a shape gives).
  const L Tm = m.decoder_seq_len > T ? L(m.decoder_seq_len) : L(T);
  const L A = L(m.heads) * (m.head_dim > 0 ? L(m.head_dim) : L(m.width) / L(m.heads));
  const L wide = Tm * L(B) * (26 * C + 6 * L(m.ffn) + 24 * A) + 10 * L(m.heads) * Tm * Tm * L(B);
  return (L(m.layers) + L(m.encoder_layers) + 2) * (per_layer + wide) + head;
}

std::vector<std::vector<int64_t>> module_parameters(const model::Config* gpt2, const ModelShape& s,
                                                    bool learned_positions) {
  std::vector<std::vector<int64_t>> out;
  if (gpt2) {
    const auto modules = model::module_table(*gpt2);
    const auto params = model::param_table(*gpt2);
    for (const auto& m : modules) {
      std::vector<int64_t> v;
      for (int i = 0; i < m.num_params; ++i) v.push_back(params[size_t(m.first_param + i)].numel);
      out.push_back(std::move(v));
    }
    return out;
  }
  return shape_module_parameters(s, learned_positions);
}

int64_t persistent_numel(const std::vector<int64_t>& params, int64_t threshold) {
  int64_t n = 0;
  for (int64_t p : params)
    if (p < threshold) n += p;
  return n;
}

std::vector<MemoryOp> IpgBucket::flush() {
  std::vector<MemoryOp> ops;
  if (elements_ == 0) return ops;
  ++flushes_;
  int64_t padded = 0, partitions = 0, largest = 0;
  for (int64_t n : params_) {
    const int64_t part = ds_partition_numel(n, W_);
    padded += part * W_;
    partitions += part;
    largest = std::max(largest, part);
  }
  // reduce_scatter_coalesced avoids the copy for a single tensor that needs no padding.
  const bool cat = !(params_.size() == 1 && params_[0] % W_ == 0);
  // On DeepSpeed's reduce_and_partition_stream (overlap_comm, stage 3's default): the caching
  // allocator keeps its blocks apart from the default stream's.
  const size_t first = ops.size();
  if (cat) ops.push_back(alloc("ipg.flat", dtype_, padded));
  if (offload_) {
    ops.push_back(alloc("ipg.partitions", dtype_, partitions));  // grad_buffer.to(device), kept until the end
    if (dtype_ != DType::F32) {
      ops.push_back(alloc("ipg.partition_fp32", DType::F32, largest));  // .to(fp32) for the host fp32 grad
      ops.push_back(release("ipg.partition_fp32"));
    }
    ops.push_back(release("ipg.partitions"));
  }
  if (cat) ops.push_back(release("ipg.flat"));
  for (size_t i = first; i < ops.size(); ++i) ops[i].stream = 1;
  elements_ = 0;
  params_.clear();
  return ops;
}

int64_t Ds3SubGroups::largest() const {
  int64_t m = 0;
  for (int64_t n : numel) m = std::max(m, n);
  return m;
}

Ds3SubGroups ds3_sub_groups(const std::vector<std::vector<int64_t>>& modules, int64_t sub_group_size, int64_t W) {
  Ds3SubGroups d;
  d.module_group.assign(modules.size(), -1);
  int64_t part = 0;
  bool open = false;
  for (size_t m = 0; m < modules.size(); ++m)
    for (int64_t p : modules[m]) {
      part += ds_partition_numel(p, W);
      open = true;
      d.module_group[m] = int(d.numel.size());
      if (part >= sub_group_size) {
        d.numel.push_back(part);
        part = 0;
        open = false;
      }
    }
  if (open) d.numel.push_back(part);
  return d;
}

std::vector<int64_t> ds_sub_group_partitions(const std::vector<std::vector<int64_t>>& modules, int64_t sub_group_size,
                                             int64_t W) {
  return ds3_sub_groups(modules, sub_group_size, W).numel;
}

namespace {
MemoryOp host_op(bool alloc, const std::string& name, DType dt, int64_t n) {
  MemoryOp op{alloc, {name, dt, alloc ? n : 0}};
  op.host = true;
  return op;
}
std::string sub_group_name(int g) { return "sub_group[" + std::to_string(g) + "]"; }
}  // namespace

std::vector<MemoryOp> ds3_master_setup_ops(int g, int64_t n, DType dtype, bool partition_on_device) {
  const std::string G = sub_group_name(g);
  std::vector<MemoryOp> ops;
  if (partition_on_device) ops.push_back(host_op(true, G + ".fp16_to_cpu", dtype, n));
  ops.push_back(host_op(true, G + ".fp16_copy", dtype, n));
  ops.push_back(host_op(true, G + ".fp32_partition", DType::F32, n));
  ops.push_back(host_op(false, G + ".fp16_copy", dtype, 0));
  if (partition_on_device) ops.push_back(host_op(false, G + ".fp16_to_cpu", dtype, 0));
  ops.push_back(host_op(false, G + ".fp32_partition", DType::F32, 0));
  return ops;
}

std::vector<MemoryOp> ds3_grad_setup_ops(int g, int64_t n) {
  return {host_op(true, sub_group_name(g) + ".grad_zeros", DType::F32, n)};
}

std::vector<MemoryOp> ds3_grad_setup_done(int g) {
  return {host_op(false, sub_group_name(g) + ".grad_zeros", DType::F32, 0)};
}

std::vector<MemoryOp> ds3_moments_setup_ops(int g, int64_t n) {
  const std::string G = sub_group_name(g);
  return {host_op(true, G + ".exp_avg", DType::F32, n), host_op(true, G + ".exp_avg_sq", DType::F32, n),
          host_op(false, G + ".exp_avg", DType::F32, 0), host_op(false, G + ".exp_avg_sq", DType::F32, 0)};
}

HostTerms ds_host_terms(const std::vector<std::vector<int64_t>>& modules, int64_t W, DType dtype, bool offload_param,
                        int64_t sub_group_size) {
  HostTerms h;
  const int64_t E = int64_t(dtype_size(dtype));
  int64_t total = 0, largest = 0, params = 0;
  for (int64_t g : ds_sub_group_partitions(modules, sub_group_size, W)) {
    total += g;
    largest = std::max(largest, g);
    h.grad_fp32_pinned += int64_t(memory::next_power_of_two(size_t(4 * g)));
  }
  for (const auto& m : modules)
    for (int64_t p : m) params += p;
  h.master = 4 * total;
  h.moments = 8 * total;
  h.grad_fp32 = 4 * total;
  h.grad_partitions = E * total;
  h.grad_partitions_pinned = int64_t(memory::next_power_of_two(size_t(h.grad_partitions)));
  if (offload_param) {
    h.param_partitions = E * total;
    h.param_partitions_pinned = int64_t(memory::next_power_of_two(size_t(h.param_partitions)));
  }
  h.step_copy = dtype == DType::F32 ? 0 : E * largest;
  h.model_on_host = 4 * params;
  return h;
}

// ---------------------------------------------------------------- ZeRO stages 1 and 2

Ds12Partition ds12_partition(const std::vector<std::vector<int64_t>>& modules, int64_t W, int64_t rank) {
  Ds12Partition d;
  for (const auto& m : modules) {
    d.first_param.push_back(int64_t(d.params.size()));
    for (int64_t n : m) {
      d.params.push_back(n);
      d.total += n;
      d.largest = std::max(d.largest, n);
    }
  }
  const int64_t align = 2 * W;  // nccl_start_alignment_factor x W (stage_1_and_2.py 389)
  d.padded = (d.total + align - 1) / align * align;
  d.partition = d.padded / W;
  const int64_t lo = rank * d.partition, hi = lo + d.partition;
  int64_t at = 0;
  for (int64_t n : d.params) {
    const int64_t in = std::max<int64_t>(0, std::min(hi, at + n) - std::max(lo, at));
    d.in_partition.push_back(in);
    if (in > 0) d.touching += n;
    d.largest_slice = std::max(d.largest_slice, in);
    at += n;
  }
  return d;
}

namespace {
MemoryOp host_alloc(std::string name, DType dt, int64_t numel, bool pinned) {
  MemoryOp op = alloc(std::move(name), dt, numel);
  op.host = true;
  op.pinned = pinned;
  return op;
}
// A temporary of `bytes` bytes (a mix of dtypes, as the overflow check's): int32 elements.
int64_t words(int64_t bytes) { return (bytes + 3) / 4; }
}  // namespace

Ds12Gradients::Ds12Gradients(const Ds12Settings& s, const std::vector<std::vector<int64_t>>& modules)
    : s_(s), part_(ds12_partition(modules, s.world, s.rank)) {
  if (s_.stage != 1 && s_.stage != 2) throw std::invalid_argument("Ds12Gradients: stage 1 or 2");
  if (s_.offload) s_.contiguous_gradients = true;  // stage_1_and_2.py 259
  accumulated_in_cpu_.assign(part_.params.size(), 0);
}

int64_t Ds12Gradients::ipg_buffers() const { return s_.contiguous_gradients ? (s_.overlap_comm ? 2 : 1) : 0; }

std::string Ds12Gradients::ipg_name(int i) const {
  return "ipg_buckets[" + std::string(dtype_name(s_.dtype)) + "].buffer[" + std::to_string(i) + "]";
}

void Ds12Gradients::begin_backward(int64_t micro) { micro_ = micro; }

std::vector<MemoryOp> Ds12Gradients::setup_ops() const {
  std::vector<MemoryOp> ops;
  if (!s_.offload) return ops;
  const bool pin = true;  // offload_optimizer.pin_memory, true by default from v0.19.5
  ops.push_back(host_alloc("param_buffer_of_bit16_for_cpu_offload_groups[0]", s_.dtype, part_.partition, pin));
  ops.push_back(host_alloc("temp_grad_buffer_for_cpu_offload", s_.dtype, part_.largest, pin));
  ops.push_back(alloc("temp_grad_buffer_for_gpu_offload", s_.dtype, part_.largest));
  return ops;
}

std::vector<MemoryOp> Ds12Gradients::setup_buckets() {
  std::vector<MemoryOp> ops;
  if (buffers_) return ops;
  buffers_ = true;
  for (int i = 0; i < int(ipg_buffers()); ++i) ops.push_back(alloc(ipg_name(i), s_.dtype, s_.reduce_bucket_size));
  return ops;
}

// copy_grads_in_partition for parameter i (after its bucket's reduction).
std::vector<MemoryOp> Ds12Gradients::copy_in_partition(int64_t i) {
  std::vector<MemoryOp> ops;
  const int64_t n = part_.params[size_t(i)], slice = part_.in_partition[size_t(i)];
  if (slice == 0) return ops;
  if (s_.offload) {
    if (boundary()) {
      // set_norm_for_param_grad_in_gpu: the slice's .double(); the overflow check of the whole gradient
      // (fp32 copy, isnan, isinf, their or, .float(): 11 bytes an element); the slice's .to(fp32) on its way
      // to the host fp32 gradient. One after the other, each freed.
      ops.push_back(alloc("grad.double", DType::F32, 2 * slice));
      ops.push_back(release("grad.double"));
      ops.push_back(alloc("_has_inf_or_nan", DType::I32, words(11 * n)));
      ops.push_back(release("_has_inf_or_nan"));
      if (s_.dtype != DType::F32) {
        ops.push_back(alloc("grad.to(fp32)", DType::F32, slice));
        ops.push_back(release("grad.to(fp32)"));
      }
    } else if (s_.stage == 2 && !accumulated_in_cpu_[size_t(i)]) {
      // async_accumulate_grad_in_cpu_via_gpu: a pinned host buffer of the whole parameter, kept.
      accumulated_in_cpu_[size_t(i)] = 1;
      ops.push_back(host_alloc("accumulated_grads_in_cpu[" + std::to_string(i) + "]", s_.dtype, n, true));
    }
    return ops;
  }
  // Stage 2 with accumulation: a later micro-step's copy goes into a new buffer while the accumulated one
  // lives (averaged_gradients keeps views of it).
  const bool next = s_.stage == 2 && micro_ > 0;
  bool& made = next ? in_partition_next_ : in_partition_;
  if (!made) {
    made = true;
    ops.push_back(alloc(next ? "grads_in_partition.next" : "grads_in_partition", s_.dtype, part_.touching));
  }
  return ops;
}

// reduce_ipg_grads: the bucket flattened and all-reduced, the partition's slices copied out.
std::vector<MemoryOp> Ds12Gradients::flush() {
  std::vector<MemoryOp> ops;
  if (!bucket_.empty()) {
    // allreduce_bucket's flatten: a copy, except of a single tensor (a view).
    if (bucket_.size() > 1) {
      ops.push_back(alloc("allreduce_bucket.flat", s_.dtype, elements_));
      ops.push_back(release("allreduce_bucket.flat"));
    }
    for (int64_t i : bucket_) {
      const auto more = copy_in_partition(i);
      ops.insert(ops.end(), more.begin(), more.end());
    }
  }
  if (!bucket_.empty()) flushes_.push_back(elements_);
  if (extra_large_ >= 0) {
    flushes_.push_back(part_.params[size_t(extra_large_)]);
    // Averaged in place (a single tensor: no copy), its slice copied out, then its own storage freed.
    const auto more = copy_in_partition(extra_large_);
    ops.insert(ops.end(), more.begin(), more.end());
    if (extra_large_live_) ops.push_back(release(extra_large_name_));
    extra_large_ = -1;
    extra_large_live_ = false;
  }
  bucket_.clear();
  elements_ = 0;
  return ops;
}

std::vector<MemoryOp> Ds12Gradients::add_param(int64_t i) {
  std::vector<MemoryOp> ops;
  const int64_t n = part_.params[size_t(i)];
  if (extra_large_ >= 0 || (elements_ > 0 && elements_ + n > s_.reduce_bucket_size)) ops = flush();
  if (!s_.contiguous_gradients || n > s_.reduce_bucket_size) {
    // Kept as autograd made it until the next flush (without contiguous_gradients every gradient is
    // flattened by the flush: counted as the flat copy, the gradients kept meanwhile are not modelled).
    if (n > s_.reduce_bucket_size) {
      // Its gradient is the module's until the module's hooks are done (keep_extra_large).
      extra_large_ = i;
      extra_large_name_ = "extra_large_param_to_reduce[" + std::to_string(i) + "].grad";
      return ops;
    }
  }
  bucket_.push_back(i);
  elements_ += n;
  return ops;
}

std::vector<MemoryOp> Ds12Gradients::module_backward(int m, const std::string& grad_name) {
  std::vector<MemoryOp> ops;
  const int64_t first = part_.first_param[size_t(m)];
  const int64_t last = size_t(m) + 1 < part_.first_param.size() ? part_.first_param[size_t(m) + 1]
                                                                : int64_t(part_.params.size());
  if (first == last) return ops;
  int64_t numel = 0;
  for (int64_t i = first; i < last; ++i) numel += part_.params[size_t(i)];
  if (s_.stage == 1) {
    if (micro_ == 0) ops.push_back(alloc(grad_name, s_.dtype, numel));  // accumulated in place after
    const auto b = setup_buckets();  // process_gradients runs setup_buckets at every hook
    ops.insert(ops.end(), b.begin(), b.end());
    return ops;
  }
  ops.push_back(alloc(grad_name, s_.dtype, numel));
  const auto b = setup_buckets();
  ops.insert(ops.end(), b.begin(), b.end());
  // The hooks run in backward order: a module's last parameter first.
  for (int64_t i = last - 1; i >= first; --i) {
    const auto more = add_param(i);
    ops.insert(ops.end(), more.begin(), more.end());
  }
  ops.push_back(release(grad_name));  // each parameter's own gradient dies once copied into the buffer
  keep_extra_large(ops);
  return ops;
}

void Ds12Gradients::keep_extra_large(std::vector<MemoryOp>& ops) {
  if (extra_large_ < 0 || extra_large_live_) return;
  extra_large_live_ = true;
  ops.push_back(alloc(extra_large_name_, s_.dtype, part_.params[size_t(extra_large_)]));
}

std::vector<MemoryOp> Ds12Gradients::reduce_module(int m, const std::string& grad_name) {
  std::vector<MemoryOp> ops;
  if (s_.stage != 1) return ops;
  const int64_t first = part_.first_param[size_t(m)];
  const int64_t last = size_t(m) + 1 < part_.first_param.size() ? part_.first_param[size_t(m) + 1]
                                                                : int64_t(part_.params.size());
  if (first == last) return ops;
  const auto b = setup_buckets();
  ops.insert(ops.end(), b.begin(), b.end());
  for (int64_t i = first; i < last; ++i) {
    const auto more = add_param(i);
    ops.insert(ops.end(), more.begin(), more.end());
  }
  ops.push_back(release(grad_name));
  keep_extra_large(ops);
  return ops;
}

std::vector<MemoryOp> Ds12Gradients::epilogue() {
  std::vector<MemoryOp> ops = flush();
  for (int i = 0; buffers_ && i < int(ipg_buffers()); ++i) ops.push_back(release(ipg_name(i)));
  buffers_ = false;
  if (in_partition_next_) {
    ops.push_back(release("grads_in_partition.next"));  // added into the accumulated partition
    in_partition_next_ = false;
  }
  return ops;
}

std::vector<MemoryOp> Ds12Gradients::step_before_adam() {
  std::vector<MemoryOp> ops;
  if (s_.offload) return ops;  // the gradient is on the host already; the norms were taken at the boundary
  const int64_t S = part_.largest_slice, P = part_.partition;
  // has_overflow_partitioned_grads_serial (fp16; bf16 with check_grad_overflow, the default).
  if (s_.dtype != DType::F32) {
    ops.push_back(alloc("_has_inf_or_nan", DType::I32, words(11 * S)));
    ops.push_back(release("_has_inf_or_nan"));
  }
  ops.push_back(alloc("grad.double", DType::F32, 2 * S));  // get_grad_norm_direct's g.data.double()
  ops.push_back(release("grad.double"));
  // A partition of a single tensor flattens to a view; in fp32 the .to(fp32) is the flat partition itself.
  const bool view = std::count_if(part_.in_partition.begin(), part_.in_partition.end(), [](int64_t n) { return n > 0; }) <= 1 ||
                    s_.dtype == DType::F32;
  if (!view) ops.push_back(alloc("flat_grad_partition", s_.dtype, P));
  ops.push_back(alloc("single_partition_of_fp32_groups[0].grad", DType::F32, P));
  if (!view) ops.push_back(release("flat_grad_partition"));
  if (in_partition_) ops.push_back(release("grads_in_partition"));  // after the last group's turn
  in_partition_ = false;
  return ops;
}

std::vector<MemoryOp> Ds12Gradients::step_after_adam() {
  std::vector<MemoryOp> ops;
  if (!s_.offload) ops.push_back(release("single_partition_of_fp32_groups[0].grad"));
  return ops;
}

// ---------------------------------------------------------------- stage 0 (FP16_Optimizer, fused)

std::vector<MemoryOp> ds0_init_ops(const std::vector<int64_t>& params) {
  int64_t total = 0;
  for (int64_t n : params) total += n;
  return {alloc("fp32_groups_flat[0].grad", DType::F32, total), release("fp32_groups_flat[0].grad")};
}

std::vector<MemoryOp> ds0_flat_init_ops(const std::vector<int64_t>& params, DType dtype) {
  std::vector<MemoryOp> ops;
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    ops.push_back(alloc("fp16_groups[0].clone[" + std::to_string(i) + "]", dtype, params[i]));
    total += params[i];
  }
  ops.push_back(alloc("fp16_groups_flat[0]", dtype, total));
  for (size_t i = 0; i < params.size(); ++i) ops.push_back(release("fp16_groups[0].clone[" + std::to_string(i) + "]"));
  // p.data = view of the flat buffer: the originals go; the engine's module parameters stand for the views.
  ops.push_back(release("fp16_groups_flat[0]"));
  ops.push_back(alloc("fp16_groups_flat[0].clone", dtype, total));
  ops.push_back(alloc("fp32_groups_flat[0]", DType::F32, total));
  ops.push_back(release("fp16_groups_flat[0].clone"));
  ops.push_back(alloc("fp32_groups_flat[0].grad", DType::F32, total));
  ops.push_back(alloc("fp32_groups_flat[0].exp_avg", DType::F32, total));
  ops.push_back(alloc("fp32_groups_flat[0].exp_avg_sq", DType::F32, total));
  ops.push_back(release("fp32_groups_flat[0].grad"));
  // The engine's per-module master weights and moments stand for these from here.
  ops.push_back(release("fp32_groups_flat[0].exp_avg_sq"));
  ops.push_back(release("fp32_groups_flat[0].exp_avg"));
  ops.push_back(release("fp32_groups_flat[0]"));
  return ops;
}

std::vector<MemoryOp> ds12_flat_init_ops(const Ds12Partition& part, DType dtype, bool offload) {
  std::vector<MemoryOp> ops;
  const int64_t P = part.partition;
  if (P == 0) return ops;
  // In fp32 .clone() still copies; .to(fp32) of an fp32 tensor is then the clone itself.
  ops.push_back(alloc("single_partition_of_fp32_groups[0].clone", dtype, P));
  if (offload) {
    ops.push_back(release("single_partition_of_fp32_groups[0].clone"));  // .to(cpu): the host masters
    return ops;
  }
  if (dtype != DType::F32) {
    ops.push_back(alloc("single_partition_of_fp32_groups[0]", DType::F32, P));
    ops.push_back(release("single_partition_of_fp32_groups[0].clone"));
  }
  const std::string master = dtype != DType::F32 ? "single_partition_of_fp32_groups[0]" : "single_partition_of_fp32_groups[0].clone";
  ops.push_back(alloc("single_partition_of_fp32_groups[0].grad", DType::F32, P));  // initialize_optimizer_states
  ops.push_back(release("single_partition_of_fp32_groups[0].grad"));
  ops.push_back(release(master));  // the engine's per-module masters stand for it from here
  return ops;
}

Ds1LegacyLayout ds1_legacy_layout(int64_t total, int64_t W, int64_t max_elements_per_comm) {
  Ds1LegacyLayout l;
  // best_max_elems_per_comm: one comm interval fewer when that pads less.
  const int64_t max_intervals = (total + max_elements_per_comm - 1) / max_elements_per_comm;
  const int64_t pad_max = max_elements_per_comm * max_intervals - total;
  const int64_t min_intervals = total / max_elements_per_comm;
  l.comm = max_elements_per_comm;
  if (min_intervals > 0) {
    const int64_t pad_min = (total + W * min_intervals - 1) / (W * min_intervals);
    if (pad_max > pad_min) l.comm = pad_min + max_elements_per_comm;
  }
  // flatten_dense_tensors_sub_partition_aligned
  const int64_t param_part = (total + W - 1) / W, comm_part = l.comm / W;
  if (param_part <= comm_part) {
    l.count = 1;
    l.sub = param_part;
  } else {
    l.count = (param_part + comm_part - 1) / comm_part;
    l.sub = comm_part;
  }
  l.padded = l.count * l.sub * W;
  return l;
}

std::vector<MemoryOp> ds1_legacy_init_ops(int64_t total, int64_t W, DType dtype) {
  std::vector<MemoryOp> ops;
  const Ds1LegacyLayout l = ds1_legacy_layout(total, W);
  const int64_t pad = l.padded - total;
  if (pad > 0) ops.push_back(alloc("fp16_groups_flat[0].pad_tensor", dtype, pad));
  ops.push_back(alloc("fp16_groups_flat[0]", dtype, l.padded));
  if (pad > 0) ops.push_back(release("fp16_groups_flat[0].pad_tensor"));
  // p.data = view of the flat buffer: the engine's module parameters stand for it, but for its padding. What
  // DeepSpeed frees here is the original parameters, a segment each (at most a few hundred MiB), which none of
  // the sub-partitions below fits in: their segments stay whole and PyTorch's OOM retry returns them
  // (the report's reserved equals its allocated). The stand-in's one segment goes back at once.
  MemoryOp flat = release("fp16_groups_flat[0]");
  flat.return_cached = true;
  ops.push_back(flat);
  if (pad > 0) ops.push_back(alloc("fp16_groups_flat[0].padding", dtype, pad));
  auto name = [](int64_t j) { return "local_sub_partitions_of_fp32_groups[0][" + std::to_string(j) + "]"; };
  for (int64_t j = 0; j < l.count; ++j) {
    ops.push_back(alloc(name(j) + ".clone", dtype, l.sub));
    ops.push_back(alloc(name(j), DType::F32, l.sub));
    ops.push_back(release(name(j) + ".clone"));
  }
  for (int64_t j = 0; j < l.count; ++j) ops.push_back(alloc(name(j) + ".grad", DType::F32, l.sub));
  for (int64_t j = 0; j < l.count; ++j) {
    ops.push_back(alloc(name(j) + ".exp_avg", DType::F32, l.sub));
    ops.push_back(alloc(name(j) + ".exp_avg_sq", DType::F32, l.sub));
  }
  for (int64_t j = 0; j < l.count; ++j) ops.push_back(release(name(j) + ".grad"));
  // The engine's module masters and moments (made at set-up for this optimizer) stand for these, but for the
  // rank's share of the padding: count x sub - ceil(total / W) elements, 12 bytes each.
  for (int64_t j = 0; j < l.count; ++j)
    for (const char* t : {".exp_avg_sq", ".exp_avg", ""}) ops.push_back(release(name(j) + t));
  const int64_t fp32_pad = l.count * l.sub - (total + W - 1) / W;
  if (fp32_pad > 0) ops.push_back(alloc("local_sub_partitions_of_fp32_groups[0].padding", DType::F32, 3 * fp32_pad));
  return ops;
}

std::vector<MemoryOp> ds0_allreduce_ops(const std::vector<int64_t>& params, DType dtype, int64_t bucket) {
  std::vector<MemoryOp> ops;
  int64_t in_bucket = 0, tensors = 0;
  auto flush = [&]() {
    // flatten of one tensor is a view
    if (tensors > 1) {
      ops.push_back(alloc("allreduce_bucket.flat", dtype, in_bucket));
      ops.push_back(release("allreduce_bucket.flat"));
    }
    in_bucket = tensors = 0;
  };
  for (int64_t n : params) {
    in_bucket += n;
    ++tensors;
    if (in_bucket >= bucket) flush();
  }
  flush();
  return ops;
}

std::vector<MemoryOp> ds0_step_before_adam(const std::vector<int64_t>& params, DType dtype) {
  std::vector<MemoryOp> ops;
  int64_t total = 0, largest = 0;
  for (int64_t n : params) {
    total += n;
    largest = std::max(largest, n);
  }
  if (dtype != DType::F32) {
    ops.push_back(alloc("_has_inf_or_nan", DType::F32, largest));  // CheckOverflow: x.float().sum()
    ops.push_back(release("_has_inf_or_nan"));
  }
  ops.push_back(alloc("fp32_grads", DType::F32, total));  // [p.grad.to(fp32) for p in group]
  ops.push_back(alloc("fp32_groups_flat[0].grad", DType::F32, total));
  ops.push_back(release("fp32_grads"));
  return ops;
}

std::vector<MemoryOp> ds0_step_after_adam() { return {release("fp32_groups_flat[0].grad")}; }

}  // namespace zt::trainer
