#include "zero/engine.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "core/backend.h"
#include "optim/cpu_adam.h"
#include "train/model_shape.h"
#include "zt/fail/failpoint.h"

namespace zt::trainer {

struct ZeroEngine::Part {
  model::ModuleSpec spec;
  int64_t padded = 0, shard = 0, lo = 0;  // this rank's shard is [lo, lo + shard) of the padded module
  int64_t opt_lo = 0, opt_n = 0;          // the range this rank's optimizer owns
  bool persistent = false;                // stage 3 module kept whole on every rank
  bool sharded = false;                   // stage 3 and not persistent: parameters live as shards
  bool opt_host = false;                  // its optimizer state is offloaded (offload_optimizer, ratio)
  bool frozen = false;                    // no gradient, no optimizer state (finetuning lora or freeze)
  std::vector<float> init_master;         // set-up only: the optimizer range's initial values
  Tensor param;        // whole [padded], compute dtype, accelerator (when not sharded)
  Tensor param_shard;  // [shard], compute dtype: accelerator, or host with offload_param (when sharded)
  Tensor grad;         // compute dtype on the accelerator: [padded] at stages 0-1, [shard] at 2-3
  Tensor master, m, v; // fp32 [opt_n]: pinned host when opt_host, else accelerator
  // AdamW during backward: the second fp32 state its out-of-place pass writes (swapped with the
  // first when the update stands and the module is awaited).
  Tensor master_alt, m_alt, v_alt;
  // The gradient partition CPU AdamW reads, [opt_n] on the host with offload_optimizer
  // (persistent): fp32 (DeepSpeed's NAME.grad), or the compute dtype under grad_partition_dtype
  // compute (it stays as it lands from the device; AdamW widens it and applies the step's scale).
  Tensor part_grad;
  Tensor grad32_dev;   // fault zero.grad_partition_stays_on_device: the partition left on the device
  // Delayed parameter update: part_grad's second buffer (the background AdamW reads one while the
  // next step's partition lands in the other); the module's compute-dtype update on the host, two
  // buffers taken in turn (AdamW writes one while the other is still on its way up; the overlapped
  // update uses update[0] only); and that way up: the update's H2D copy into a device parameter
  // shard, which the next fetch waits for on the device (gather) while the host goes on.
  Tensor part_grad_spare;
  Tensor update[2];
  PendingCopy written;
  // The delayed update's early write-back (a device parameter shard, update buffers on the host):
  // the shard's second buffer, which takes the update's H2D copy (written_next) as soon as the
  // module's AdamW has run, while the step under way still reads `param_shard`; the two are
  // swapped when the update is applied.
  Tensor shard_next;
  PendingCopy written_next;
  bool next_filled = false;  // written_next holds this update's copy
  bool update_due = false;  // the overlapped update: this module's AdamW not yet awaited
  Tensor gathered, compute;  // live while fetched
  // Virtual stage 3 (DeepSpeed's layout): each parameter's own gather buffer after the first (which is
  // `gathered`), as fetch_sub_module's all-gather allocates one a parameter (param_buffer = torch.empty(
  // ceil(numel / W) x W)): an OOM there asks for one parameter, as DeepSpeed's does.
  std::vector<Tensor> gathered_more;
  void drop_gathered() {
    gathered.reset();
    gathered_more.clear();
  }
  Tensor staged;             // offload_param: the shard copied to the device ahead of its gather
  PendingCopy staging;       // ... that copy, while it is in flight
  size_t last_pos = 0;
  // The sum of squares of part_grad (widened), taken when the partition landed on the host during
  // backward (finish_offload), so the optimizer step need not read every partition again for the norm.
  double part_grad_sq = 0;
  bool part_grad_sq_ready = false;
};

namespace {

// DeepSpeed's name for a module's fp32 partition (its gradient is NAME.grad): the name users
// see in R2 and R5's tracebacks.
std::string partition_name(int64_t module) { return "fp32_partitioned_groups_flat[" + std::to_string(module) + "]"; }

// The gradient partition's name: DeepSpeed's NAME.grad in fp32; in the compute dtype (grad_partition_dtype
// compute) NAME.grad.bf16 / NAME.grad.fp16, so a trace says which.
std::string part_grad_name(int64_t module, DType dt) {
  return partition_name(module) + ".grad" + (dt == DType::F32 ? std::string() : "." + std::string(dtype_name(dt)));
}

// The sum of squares of a gradient partition, widened to fp32 where it is in bf16/fp16 (on the
// host, where such partitions live): the same sum, bit for bit, as of its fp32 copy.
double sum_squares_of(const Tensor& g) {
  if (g.dtype() == DType::F32) return g.device().ops().sum_squares(g.f32(), g.numel());
  if (!g.device().is_host())
    throw std::logic_error("sum_squares_of: a " + std::string(dtype_name(g.dtype())) + " gradient partition on " +
                           g.device().label());
  return widen_and_sum_squares(nullptr, g.raw(), g.dtype(), g.numel());
}

// The engine's element-wise work goes through the device's ops (core/backend.h): CPU loops on
// the host and the simulated GPU, kernels on a real GPU. Null storage (virtual mode): nothing.

// dst (a float dtype) += src (fp32, on dst's device), element by element, in fp32.
void add_into(Tensor& dst, int64_t dst_offset, const float* src, int64_t n) {
  if (!dst.raw() || !src) return;
  dst.device().ops().add(static_cast<char*>(dst.raw()) + size_t(dst_offset) * dtype_size(dst.dtype()), dst.dtype(), src, n);
}

// dst[dst_offset..] := src (fp32, on dst's device), converted to dst's dtype.
void set_from(Tensor& dst, int64_t dst_offset, const float* src, int64_t n) {
  if (!dst.raw() || !src) return;
  dst.device().ops().convert(static_cast<char*>(dst.raw()) + size_t(dst_offset) * dtype_size(dst.dtype()), dst.dtype(),
                             src, DType::F32, n);
}

// dst (fp32, on src's device) := src[src_offset..] converted.
void read_into(const Tensor& src, int64_t src_offset, float* dst, int64_t n) {
  if (!src.raw() || !dst) return;  // virtual mode: sizes only
  src.device().ops().convert(dst, DType::F32, static_cast<const char*>(src.raw()) + size_t(src_offset) * dtype_size(src.dtype()),
                             src.dtype(), n);
}

// dst[dst_offset..] := host fp32 values, converted to dst's dtype (one copy up on a GPU).
void upload(Tensor& dst, int64_t dst_offset, const float* host_src, int64_t n) {
  if (!dst.raw() || !host_src) return;
  DeviceOps& ops = dst.device().ops();
  char* d = static_cast<char*>(dst.raw()) + size_t(dst_offset) * dtype_size(dst.dtype());
  if (ops.host_addressable()) {
    host_ops().convert(d, dst.dtype(), host_src, DType::F32, n);
    return;
  }
  std::vector<char> tmp(size_t(n) * dtype_size(dst.dtype()));
  host_ops().convert(tmp.data(), dst.dtype(), host_src, DType::F32, n);
  ops.copy(d, tmp.data(), tmp.size());
}

void zero_tensor(Tensor& t) {
  if (t.defined() && t.raw()) t.device().ops().zero(t.raw(), t.bytes());
}

// A one-element fp32 tensor's value, written from the host (nothing in virtual mode).
void set_scalar(Tensor& t, float v) {
  if (t.raw()) t.device().ops().copy(t.raw(), &v, sizeof v);
}

// A one-element fp32 tensor's value, read back to the host.
float scalar_of(const Tensor& t) {
  float v = 0;
  t.device().ops().copy(&v, t.raw(), sizeof v);
  return v;
}

}  // namespace

ZeroEngine::ZeroEngine(const TrainConfig& cfg, const model::Config& mc, int B, int T, RankRuntime& rt,
                       Communicator& comm)
    : cfg_(cfg),
      z_(cfg.zero),
      mc_(mc),
      B_(B),
      T_(T),
      rt_(rt),
      comm_(comm),
      rec_(rt.recorder()),
      dtype_(*parse_dtype(cfg.precision)),
      W_(comm.world_size()),
      rank_(comm.rank()) {
  // "auto" as Hugging Face resolves it from the model's width.
  const int64_t C = mc.width;
  if (z_.reduce_bucket_size < 0) z_.reduce_bucket_size = C * C;
  if (z_.prefetch_bucket_size < 0) z_.prefetch_bucket_size = C * C * 9 / 10;
  if (z_.param_persistence_threshold < 0) z_.param_persistence_threshold = 10 * C;
  if (z_.offload_optimizer && z_.stage == 0)
    throw std::invalid_argument("offload_optimizer needs ZeRO stage 1, 2 or 3 (it offloads the optimizer partition)");
  if (z_.offload_param && z_.stage != 3)
    throw std::invalid_argument("offload_param needs ZeRO stage 3 (only stage 3 partitions parameters)");
  if (cfg.overlap_update && cfg.delayed_update >= 0)
    throw std::invalid_argument("overlap_update and delayed_update: give one");
  if (!(z_.offload_ratio >= 0 && z_.offload_ratio <= 1))
    throw std::invalid_argument("offload_ratio must lie in [0, 1]");
  if (z_.offload_ratio < 1 && !(z_.offload_optimizer && z_.stage == 3))
    throw std::invalid_argument("offload_ratio below 1 needs offload_optimizer and ZeRO stage 3");
  if (cfg.delayed_update >= 0 || cfg.overlap_update) {
    if (!z_.offload_optimizer)
      throw std::invalid_argument(std::string(cfg.overlap_update ? "overlap_update" : "delayed_update") +
                                  " runs CPU AdamW beside the next step: it needs offload_optimizer");
    // AdamW gets three quarters of the rank's OpenMP threads; the rank thread keeps its own team
    // for what it does meanwhile (on a GPU: queueing kernels and landing gradient partitions; on
    // the simulated GPU: the model's compute), so the two teams share the cores while they overlap.
    // Measured on an H100 host (16 threads, 124M, delayed update, flash attention, TF32; 2026-11-23):
    // 4, 8 and 12 AdamW threads gave 72.4, 72.3 and 71.3 ms a step, and 15 (all but one, the
    // earlier default) about 79 ms in steady state. ZT_ADAM_THREADS sets it.
    // While the rank thread only waits for the pass ("apply delayed update", "await update <module>"),
    // the modules still to do take all the rank's threads (ZT_ADAM_WAIT_THREADS sets it): at 1.5B the
    // rank waited 467 of a 666 ms step with three quarters of its cores at work.
    auto threads_from_env = [](const char* name, int fallback, const char* what) {
      const char* env = std::getenv(name);
      if (!env || !*env) return fallback;
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (*end || v < 1 || v > 4096)
        throw std::invalid_argument(std::string(name) + "='" + env + "': " + what + ", a count from 1 to 4096");
      return int(v);
    };
    const int adam_threads = threads_from_env("ZT_ADAM_THREADS", std::max(1, omp_get_max_threads() * 3 / 4),
                                              "the background AdamW's threads (delayed or overlapped update)");
    const int waited_threads =
        threads_from_env("ZT_ADAM_WAIT_THREADS", std::max(adam_threads, omp_get_max_threads()),
                         "the background AdamW's threads while the rank thread waits for it");
    // ZT_RANK_THREADS_BESIDE=N: the rank thread's own OpenMP team while the pass runs beside it (its
    // landing of each gradient partition: widening and sum of squares) takes N threads, so that the
    // two teams together fit the cores (16 + 12 threads on an H100 host's 16 otherwise); unset, the
    // rank keeps all its threads (an A/B knob for GPU hosts: bench/gpu_session).
    const int rank_beside = threads_from_env("ZT_RANK_THREADS_BESIDE", 0,
                                             "the rank thread's threads while the background AdamW runs beside it");
    // ZT_ADAM_NICE=N (1-19): the background AdamW's threads at niceness N, so that the rank thread (on a
    // GPU: the one queueing the device's work between landing partitions) wins a contended core; unset
    // or 0, as the rank's (an A/B knob for GPU hosts: bench/gpu_session).
    int adam_nice = 0;
    if (const char* env = std::getenv("ZT_ADAM_NICE"); env && *env) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (*end || v < 0 || v > 19)
        throw std::invalid_argument(std::string("ZT_ADAM_NICE='") + env + "': the background AdamW's niceness, 0 to 19");
      adam_nice = int(v);
    }
    background_ = std::make_unique<BackgroundThread>(adam_threads, waited_threads, rank_beside, adam_nice);
    // ZT_EARLY_WRITE_BACK=0: the delayed update's weights go up to device shards only once the whole
    // pass is applied (as before 2026-11-26), not module by module as its AdamW finishes.
    if (cfg.delayed_update >= 0) {
      const char* env = std::getenv("ZT_EARLY_WRITE_BACK");
      const std::string v = env ? env : "";
      if (!v.empty() && v != "0" && v != "1")
        throw std::invalid_argument("ZT_EARLY_WRITE_BACK='" + v + "': 1 (the default) or 0");
      early_write_back_ = v != "0";
    }
  }
  if (std::string p = grad_partition_dtype_problem(cfg); !p.empty()) throw std::invalid_argument(p);
  if (cfg.grad_partition_dtype == "compute") part_grad_dtype_ = dtype_;
  if (dtype_ == DType::F16) loss_scale_ = z_.static_loss_scale > 0 ? z_.static_loss_scale : std::pow(2.0, z_.initial_scale_power);
  hysteresis_left_ = z_.hysteresis;

  Device& accel = rt.accelerator();
  Device& host = rt.host();
  const bool pin = z_.pin_memory;
  // Virtual mode: the modules of any shape (a preset is GPT-2's shape), no initial values.
  const bool virt = cfg.virtual_mode;
  virt_ = virt;
  const bool custom = cfg.model == "custom";
  const ModelShape shape = custom ? cfg.shape : shape_of(mc, cfg.model);
  // A preset's own parameter table (biases included) in virtual mode too: DeepSpeed's partitions
  // count every parameter.
  modules_ = virt && custom ? shape_modules(shape, false) : model::module_table(mc);
  module_params_ = module_parameters(custom ? nullptr : &mc, shape, !custom);
  opt_ = optimizer_of(cfg);
  if (!adam_moments(opt_.impl) && !virt)  // validate() says so first; for callers that skip it
    throw std::invalid_argument("optimizer " + opt_.name + " (" + optimizer_library(opt_) +
                                ") is replayed for memory in virtual mode only");
  ds_layout_ = virt && z_.stage == 3;
  ds12_ = virt && (z_.stage == 1 || z_.stage == 2);
  ds0_ = virt && z_.stage == 0 && dtype_ != DType::F32;
  legacy_stage1_ = ds12_ && z_.stage == 1 && z_.legacy_stage1 && !z_.offload_optimizer && dtype_ != DType::F32;
  const int64_t blocks = int64_t(mc.layers);
  // What trains (cfg.finetuning): frozen modules keep parameters only. LoRA's adapters are modules
  // of their own after the model's ("block3.lora"), trained as any module (virtual mode: sizes).
  std::vector<char> frozen(modules_.size(), 0);
  if (cfg.finetuning == "lora") {
    std::fill(frozen.begin(), frozen.end(), 1);
    lora_of_.assign(size_t(blocks), -1);
    int64_t offset = modules_.back().offset + modules_.back().numel;
    for (int64_t b = 0; b < blocks; ++b) {
      model::ModuleSpec a;
      a.name = modules_[size_t(b) + 1].name + ".lora";
      a.index = int(modules_.size());
      a.offset = offset;
      module_params_.push_back(lora_parameters(shape, b, cfg.lora_rank, cfg.lora_targets));  // A and B of each linear
      for (int64_t n : module_params_.back()) a.numel += n;
      offset += a.numel;
      lora_of_[size_t(b)] = a.index;
      modules_.push_back(a);
      frozen.push_back(0);
    }
  } else if (cfg.finetuning == "freeze") {
    if (cfg.trainable_layers > blocks)
      throw std::invalid_argument("trainable_layers " + std::to_string(cfg.trainable_layers) + " is more than the model's " +
                                  std::to_string(blocks) + " blocks");
    for (size_t i = 0; i < modules_.size(); ++i)
      frozen[i] = !(int64_t(i) >= 1 + blocks - cfg.trainable_layers && int64_t(i) <= blocks);
  }
  if (module_params_.size() != modules_.size())
    throw std::logic_error("ZeroEngine: " + std::to_string(module_params_.size()) + " parameter tables for " +
                           std::to_string(modules_.size()) + " modules");
  // Left uninitialized: init_params writes every element, its threads touching the pages first.
  std::unique_ptr<float[]> init(virt ? nullptr : new float[size_t(model::num_params(mc))]);
  if (!virt) model::init_params(mc, cfg.seed, init.get());
  std::vector<float> padded_vals;
  // offload_optimizer.ratio (ZeRO-Offload++): module i is offloaded when i >= int((1 - ratio) * modules).
  const int64_t first_offloaded = first_offloaded_module(z_, int64_t(modules_.size()));
  // Model loading (from_pretrained): the checkpoint's weights in host memory, in its dtype. Without
  // zero.Init every rank holds the whole model at once (each module's part freed once its parameters
  // are placed, before any optimizer state: DeepSpeed builds those after partitioning); with it one
  // module at a time. Real runs take their weights from it (rounded through the checkpoint's dtype).
  const DType load_dt = *parse_dtype(cfg.load_dtype.empty() ? cfg.precision : cfg.load_dtype);
  std::vector<Tensor> loaded(modules_.size()), loaded_more(modules_.size());
  auto load_module = [&](size_t i) {
    const model::ModuleSpec& spec = modules_[i];
    loaded[i] = Tensor::empty("model.from_pretrained[" + spec.name + "]", {spec.numel}, load_dt, host);
    if (cfg.load_copies > 1)  // the checkpoint's state dict read beside the model built (cfg.load_copies)
      loaded_more[i] = Tensor::empty("model.from_pretrained[" + spec.name + "].state_dict",
                                     {spec.numel * (cfg.load_copies - 1)}, load_dt, host);
    if (!virt && spec.offset + spec.numel <= model::num_params(mc)) {  // LoRA adapters are not in the checkpoint
      host_ops().convert(loaded[i].raw(), load_dt, init.get() + spec.offset, DType::F32, spec.numel);
      host_ops().convert(init.get() + spec.offset, DType::F32, loaded[i].raw(), load_dt, spec.numel);
    }
  };
  auto host_held = [&]() {
    return int64_t(rt.pinned_allocator().stats().reserved_bytes + rt.pageable_allocator().stats().reserved_bytes);
  };
  auto note_load_peak = [&]() { load_.host_peak_bytes = std::max(load_.host_peak_bytes, host_held()); };
  if (cfg.from_pretrained) {
    load_.on = true;
    load_.zero_init = cfg.zero_init;
    for (size_t i = 0; i < modules_.size(); ++i)
      if (cfg.finetuning != "lora" || lora_of_.empty() || int(i) < lora_of_[0])
        load_.model_bytes += modules_[i].numel * int64_t(dtype_size(load_dt)) * cfg.load_copies;
  }
  if (cfg.from_pretrained && !cfg.zero_init) {
    probe::MarkerId ph = phase("model load (from_pretrained: the whole model on every rank)", -1);
    for (size_t i = 0; i < modules_.size(); ++i)
      if (cfg.finetuning != "lora" || lora_of_.empty() || int(i) < lora_of_[0]) load_module(i);
    note_load_peak();
    end(ph);
  }
  // A module's parameters (whole, or this rank's shard), from the initial values or the checkpoint.
  auto place_params = [&](Part& pt) {
    const model::ModuleSpec& spec = pt.spec;
    const size_t i = size_t(spec.index);
    probe::MarkerId ph = 0;
    if (cfg.from_pretrained && cfg.zero_init && (cfg.finetuning != "lora" || lora_of_.empty() || int(i) < lora_of_[0])) {
      ph = phase("model load (zero.Init: " + spec.name + ")", -1);
      load_module(i);
      note_load_peak();
    }
    // The module's initial values padded with zeros to a multiple of the world size: read where
    // they are when no padding is needed (at world size 1 a copy of the whole model, on one thread).
    const bool has_init = !virt && spec.offset + spec.numel <= model::num_params(mc);
    const float* vals = nullptr;
    if (has_init && pt.padded == spec.numel) {
      vals = init.get() + spec.offset;
    } else if (has_init) {
      padded_vals.assign(size_t(pt.padded), 0.0f);
      std::memcpy(padded_vals.data(), init.get() + spec.offset, size_t(spec.numel) * sizeof(float));
      vals = padded_vals.data();
    }
    auto vals_at = [vals](int64_t k) { return vals ? vals + k : nullptr; };
    const std::string& n = spec.name;
    if (pt.sharded) {
      Device& where = z_.offload_param ? host : accel;
      pt.param_shard = Tensor::empty(n + ".shard", {pt.shard}, dtype_, where, z_.offload_param && z_.param_pin_memory);
      upload(pt.param_shard, 0, vals_at(pt.lo), pt.shard);
    } else {
      pt.param = Tensor::empty(n + ".param", {pt.padded}, dtype_, accel);
      upload(pt.param, 0, vals_at(0), pt.padded);
    }
    note_load_peak();
    loaded[i].reset();  // partitioned: the loaded copy of this module is gone
    loaded_more[i].reset();
    if (ph) end(ph);
    if (pt.frozen) return;
    // The optimizer's range, with its initial fp32 master weights (kept for place_states).
    pt.opt_lo = z_.stage == 0 ? 0 : pt.lo;
    pt.opt_n = z_.stage == 0 ? pt.padded : pt.shard;
    if (vals) pt.init_master.assign(vals + pt.opt_lo, vals + pt.opt_lo + pt.opt_n);
  };
  // Its gradient and optimizer state (none when frozen): place_states, or in DeepSpeed's stage-3 order its
  // three parts (ds3_sub_groups_setup below): the fp32 master, the fp32 gradient, the moments.
  auto place_states_part = [&](Part& pt, bool master, bool grad, bool moments) {
    if (pt.frozen) return;
    const model::ModuleSpec& spec = pt.spec;
    const std::string& n = spec.name;
    // DeepSpeed's grad_partitions_flat_buffer (its slice of this module): under offload_optimizer
    // on the host, pinned, where the virtual model keeps it (ds_layout_); our compute keeps it on
    // the device and moves it to the host at the accumulation boundary.
    const bool grad_on_host = ds_layout_ && pt.opt_host;
    // DeepSpeed's stages 0-2 (ds12_, ds0_) hold no gradient between steps: autograd's, the IPG buffers
    // and grads_in_partition are made in backward (Ds12Gradients; stage 0: ds0_*).
    if (!ds12_ && !ds0_ && grad)
      pt.grad = z_.stage <= 1 ? Tensor::zeros(n + ".grad", {pt.padded}, dtype_, accel)
                              : Tensor::zeros(n + ".grad[shard]", {pt.shard}, dtype_, grad_on_host ? host : accel,
                                              grad_on_host && pin);
    Device& opt = pt.opt_host ? host : accel;
    // DeepSpeed pins only the fp32 gradient at stage 3; at stages 1-2 the fp32 master too
    // (single_partition_of_fp32_groups, pin_memory), not DeepSpeedCPUAdam's moments.
    const bool opt_pin = pt.opt_host && pin && !ds_layout_;
    const std::string group = partition_name(spec.index);
    if (master) {
      pt.master = Tensor::empty(group, {pt.opt_n}, DType::F32, opt, opt_pin);
      upload(pt.master, 0, pt.init_master.empty() ? nullptr : pt.init_master.data(), pt.opt_n);
      std::vector<float>().swap(pt.init_master);
    }
    if (moments && !ds12_ && adam_moments(opt_.impl)) {  // ds12_: made at the first step (ds12_moments)
      pt.m = Tensor::zeros("adam.m[" + n + "]", {pt.opt_n}, DType::F32, opt, opt_pin);
      pt.v = Tensor::zeros("adam.v[" + n + "]", {pt.opt_n}, DType::F32, opt, opt_pin);
    } else if (moments && !ds12_ && z_.stage == 3) {  // stage 0: once every module is placed (its flat group), below
      charge_optimizer_state(pt, pt.opt_host);
    }
    if (grad && pt.opt_host)
      pt.part_grad = Tensor::zeros(part_grad_name(spec.index, part_grad_dtype_), {pt.opt_n}, part_grad_dtype_, host,
                                   pt.opt_host && pin);
  };
  auto place_states = [&](Part& pt) { place_states_part(pt, true, true, true); };
  auto place_master = [&](Part& pt) { place_states_part(pt, true, false, false); };
  auto place_grad = [&](Part& pt) { place_states_part(pt, false, true, false); };
  auto place_moments = [&](Part& pt) { place_states_part(pt, false, false, true); };
  // DeepSpeed's stage-3 set-up order under offload_optimizer, sub-group by sub-group (below). Not with a
  // partial offload (offload_ratio < 1: the device sub-groups' set-up is not modeled) nor a delayed or overlapped
  // update.
  const bool ds3_sub_groups_setup = ds_layout_ && z_.offload_optimizer && first_offloaded == 0 &&
                                    cfg.delayed_update < 0 && !cfg.overlap_update;
  for (const auto& spec : modules_) {
    auto p = std::make_unique<Part>();
    p->spec = spec;
    p->padded = (spec.numel + W_ - 1) / W_ * W_;
    p->shard = p->padded / W_;
    p->lo = rank_ * p->shard;
    p->persistent = z_.stage == 3 && spec.numel < z_.param_persistence_threshold;
    p->sharded = z_.stage == 3 && !p->persistent;
    p->frozen = frozen[size_t(spec.index)] != 0;
    p->opt_host = !p->frozen && int64_t(parts_.size()) >= first_offloaded;
    // As before issue 30 when nothing is loaded: each module's parameters, then its states. DeepSpeed's
    // stages 0-2 (virtual) build the optimizer after every parameter is placed (flat_init below).
    if (!cfg.from_pretrained && !ds12_ && !ds0_ && !ds3_sub_groups_setup) {
      place_params(*p);
      place_states(*p);
    }
    parts_.push_back(std::move(p));
  }
  if (ds3_sub_groups_setup) {
    // DeepSpeed's stage 3 under offload_optimizer: zero.Init has partitioned every parameter before the optimizer
    // is built, and stage3.py makes its host memory a sub-group at a time (sub_group_size), whole: all fp32
    // masters first (_create_fp32_partitions), then initialize_optimizer_states' gradient buffer (the largest
    // sub-group's elements in fp32, for its duration) and each sub-group's zero fp32 gradient pinned; the moments.
    // Stand-ins for each (ds_memory.h ds3_*_setup_ops), the engine's module tensors placed after them with their
    // bytes, so that an OOM there asks for DeepSpeed's sizes.
    for (auto& p : parts_) place_params(*p);
    std::vector<std::vector<int64_t>> trainable(parts_.size());
    for (size_t i = 0; i < parts_.size(); ++i)
      if (!parts_[i]->frozen) trainable[i] = module_params_[i];
    const Ds3SubGroups sg = ds3_sub_groups(trainable, z_.sub_group_size, W_);
    probe::MarkerId ph = phase("optimizer init (DeepSpeed's sub-groups)", -1);
    auto in_group = [&](int g) {
      std::vector<Part*> v;
      for (size_t i = 0; i < parts_.size(); ++i)
        if (!parts_[i]->frozen && sg.module_group[i] == g) v.push_back(parts_[i].get());
      return v;
    };
    for (int g = 0; g < int(sg.numel.size()); ++g) {
      charge(ds3_master_setup_ops(g, sg.numel[size_t(g)], dtype_, !z_.offload_param));
      for (Part* p : in_group(g)) place_master(*p);
    }
    MemoryOp buffer{true, {"initialize_optimizer_states.gradient_buffer", DType::F32, sg.largest()}};
    buffer.host = true;
    if (sg.largest() > 0) charge({buffer});
    for (int g = 0; g < int(sg.numel.size()); ++g) {
      charge(ds3_grad_setup_ops(g, sg.numel[size_t(g)]));
      for (Part* p : in_group(g)) place_grad(*p);
      charge(ds3_grad_setup_done(g));
    }
    if (sg.largest() > 0) charge({MemoryOp{false, {buffer.term.name, DType::F32, 0}, -1, true}});
    // The moments a sub-group at a time, once the set-up's buffers are gone: DeepSpeed up to 0.13.1 made them in
    // initialize_optimizer_states' step (the gradient buffer still alive), 0.13.2 and later at the first step; zt
    // makes them at set-up either way, after the buffers (the later releases' peak).
    for (int g = 0; g < int(sg.numel.size()); ++g) {
      if (adam_moments(opt_.impl)) charge(ds3_moments_setup_ops(g, sg.numel[size_t(g)]));
      for (Part* p : in_group(g)) place_moments(*p);
    }
    end(ph);
  } else if (cfg.from_pretrained || ds12_ || ds0_) {
    // DeepSpeed partitions every parameter first, then builds the optimizer: the loaded model is
    // gone before the first optimizer state is allocated.
    for (auto& p : parts_) place_params(*p);
    // Stages 0-2 (virtual): the optimizer's flat buffers, whole, as DeepSpeed makes them at its init
    // (ds_memory.h's ds0_flat_init_ops, ds12_flat_init_ops); the module tensors placed next stand for them.
    if (ds12_ || ds0_) {
      std::vector<std::vector<int64_t>> trainable(parts_.size());
      std::vector<int64_t> flat;
      for (size_t i = 0; i < parts_.size(); ++i)
        if (!parts_[i]->frozen) {
          trainable[i] = module_params_[i];
          flat.insert(flat.end(), module_params_[i].begin(), module_params_[i].end());
        }
      probe::MarkerId ph = phase("optimizer init (DeepSpeed's flat buffers)", -1);
      if (ds0_) charge(ds0_flat_init_ops(flat, dtype_));
      if (legacy_stage1_) {
        int64_t total = 0;
        for (int64_t n : flat) total += n;
        charge(ds1_legacy_init_ops(total, W_, dtype_));
      } else if (ds12_) {
        charge(ds12_flat_init_ops(ds12_partition(trainable, W_, rank_), dtype_, z_.offload_optimizer));
      }
      end(ph);
    }
    for (auto& p : parts_) place_states(*p);
    if (legacy_stage1_) ds12_moments();  // stage1.py's set-up step made them
  }
  // Stage 0's optimizer state outside AdamW's family, made at set-up (initialize_optimizer_states' step) over
  // FP16_Optimizer's flat group (or the model's parameters in fp32).
  if (z_.stage == 0 && !adam_moments(opt_.impl))
    for (auto& p : parts_)
      if (!p->frozen) charge_optimizer_state(*p, p->opt_host);
  // Activations: a real GPU's passes get theirs as one tensor; elsewhere the device is charged what
  // PyTorch's autograd would keep, tensor by tensor, allocated and freed as the passes run (step()).
  // An encoder-decoder's (virtual shapes only) is one tensor of model_shape.h's estimate, charged
  // the same way: made as its forward starts, freed once its backward is done (never held through
  // an evaluation, an optimizer step or a save: issue 30's finding).
  act_ = activation_shape(shape, !custom, B, T, dtype_, attention_of(cfg) == model::Attention::Flash,
                          cfg.activation_checkpointing);
  act_.lse_align = attention_lse_align(cfg.attention, dtype_);
  act_.attn_dropout = cfg.attention_dropout > 0 && !act_.flash;  // SDPA and flash-attn draw it from a seed
  if (!virt) passes_ = rt.model_passes(mc, B, T, cfg.activation_checkpointing, attention_of(cfg));
  charge_terms_ = virt || passes_->owns_memory();
  if (virt && shape.encoder_layers > 0)
    pass_activations_ = (encoder_decoder_activation_bytes(shape, B, T, shape.decoder_seq_len > 0 ? shape.decoder_seq_len : T,
                                                          cfg.activation_checkpointing,
                                                          attention_of(cfg) == model::Attention::Flash) +
                         3) / 4;
  if (!charge_terms_) {
    activations_ = Tensor::empty("activations", {(int64_t(passes_->bytes()) + 3) / 4}, DType::F32, accel);
    passes_->bind(activations_.raw());
  }
  if (charge_terms_ && z_.stage == 3 && W_ > 1)
    for (auto& p : parts_) {
      // DeepSpeed keeps each parameter below the persistence threshold whole on every rank (ours
      // decides per module: a sharded module's small parameters are in its shards). LoRA's
      // adapters are such parameters (r x 4096 is below 10 x width), frozen ones too.
      const int64_t n =
          p->sharded ? persistent_numel(module_params_[size_t(p->spec.index)], z_.param_persistence_threshold) : 0;
      if (n > 0) persistent_.push_back(Tensor::empty(p->spec.name + ".persistent", {n}, dtype_, accel));
    }
  if (ds12_) {
    // DeepSpeedZeroOptimizer's one param group: the trainable modules' parameters (a frozen module's
    // are in no group).
    std::vector<std::vector<int64_t>> trainable(parts_.size());
    for (size_t i = 0; i < parts_.size(); ++i)
      if (!parts_[i]->frozen) trainable[i] = module_params_[i];
    Ds12Settings s;
    s.stage = z_.stage;
    s.world = W_;
    s.rank = rank_;
    s.dtype = dtype_;
    s.offload = z_.offload_optimizer;
    s.grad_accum = cfg.grad_accum;
    s.reduce_bucket_size = z_.reduce_bucket_size;
    s.overlap_comm = z_.overlap_comm;
    ds12_grads_ = std::make_unique<Ds12Gradients>(s, trainable);
    charge(ds12_grads_->setup_ops());
  }
  if (ds0_) {
    for (size_t i = 0; i < parts_.size(); ++i)
      if (!parts_[i]->frozen) ds0_params_.insert(ds0_params_.end(), module_params_[i].begin(), module_params_[i].end());
    // initialize_optimizer_states' step on zero fp32 gradients: charged with the flat buffers above.
  }
  if (ds_layout_) {
    // stage3.py's IPG bucket: reduce_bucket_size elements in the compute dtype, made once.
    ipg_buffer_ = Tensor::empty("ipg_bucket", {z_.reduce_bucket_size}, dtype_, accel);
    ipg_ = std::make_unique<IpgBucket>(z_.reduce_bucket_size, W_, dtype_, z_.offload_optimizer);
  }
  for (size_t i = 0; i < parts_.size(); ++i)
    if (parts_[i]->spec.name == "lm_head") head_ = int(i);
  // The background update's own buffers now, not at its first steps: made there, each took cached
  // pinned segments the gradient staging had used, and new ones were pinned inside steps 2-4
  // (cudaHostAlloc: on an H100 those steps ran at a third of the later speed; 2026-11-23).
  if (cfg.delayed_update >= 0 || cfg.overlap_update) {
    for (auto& p : parts_) {
      // Overlapped, a module AdamW writes in place (offload_param) has no buffer, unless it runs
      // during backward (never in place: the step may throw it away); delayed, none is in place.
      if (p->master.device().is_host() && dtype_ != DType::F32 &&
          !(cfg.overlap_update && !cfg.adam_in_backward && adam_in_place(*p, false)))
        for (int slot = 0; slot < (cfg.overlap_update ? 1 : 2); ++slot) p->update[slot] = update_buffer(*p);
      // AdamW during backward: the second fp32 state, made as the first (the same names: it is the
      // state, double-buffered).
      if (cfg.adam_in_backward && p->opt_host) {
        const bool opt_pin = z_.pin_memory;
        p->master_alt = Tensor::empty(p->master.name(), {p->opt_n}, DType::F32, host, opt_pin);
        p->m_alt = Tensor::empty("adam.m[" + p->spec.name + "]", {p->opt_n}, DType::F32, host, opt_pin);
        p->v_alt = Tensor::empty("adam.v[" + p->spec.name + "]", {p->opt_n}, DType::F32, host, opt_pin);
      }
      if (cfg.delayed_update >= 0 && p->part_grad.defined())
        p->part_grad_spare = Tensor::zeros(p->part_grad.name(), {p->opt_n}, part_grad_dtype_, host, pin);
      // The early write-back's second device shard: where the update's copy goes while the step
      // under way reads the shard (the same name: it is the shard, double-buffered).
      if (early_write_back_ && p->update[0].defined() && p->sharded && !p->param_shard.device().is_host())
        p->shard_next = Tensor::empty(p->param_shard.name(), {p->shard}, dtype_, accel);
    }
    early_write_back_ = std::any_of(parts_.begin(), parts_.end(), [](const auto& p) { return p->shard_next.defined(); });
  }
  if (cfg.adam_in_backward) {
    if (!cfg.overlap_update) throw std::invalid_argument("adam_in_backward needs overlap_update");
    if (z_.stage < 2) throw std::invalid_argument("adam_in_backward needs ZeRO stage 2 or 3");
    const size_t n = parts_.size();
    early_.jobs.resize(n);
    early_.landed.assign(n, 0);
    early_.taken.assign(n, 0);
    early_.done.assign(n, 0);
  }
  host_tokens_ = Tensor::empty("batch.tokens", {B, T}, DType::I32, host, true);
  host_targets_ = Tensor::empty("batch.targets", {B, T}, DType::I32, host, true);
}

// In-flight copies finish, and the device's queue drains, before any tensor of this engine is
// freed (a failed step leaves both behind).
ZeroEngine::~ZeroEngine() {
  if (early_.live) abort_early(true);  // a pass during backward waits for partitions that never come
  try {
    if (background_) background_->wait();  // its jobs read this engine's tensors
  } catch (...) {
    // the run reports the step that failed
  }
  try {
    for (auto& p : parts_) {
      p->staging.wait();
      p->written.wait();
      p->written_next.wait();
    }
    land_offloads(0);
    rt_.accelerator().ops().synchronize();
  } catch (const std::exception&) {
    // the device failed: the run reports that; nothing more to wait for
  }
}

probe::MarkerId ZeroEngine::phase(const std::string& name, int64_t step, int64_t micro) {
  if (!rec_) return 0;
  probe::MarkerEvent m;
  m.rank = rank_;
  m.kind = probe::MarkerKind::Phase;
  m.name = rec_->intern(name);
  m.step = step;
  m.micro_step = micro;
  return rec_->marker_begin(m);
}

void ZeroEngine::end(probe::MarkerId id) {
  if (rec_) rec_->marker_end(id);
}

int64_t ZeroEngine::model_state_bytes() const {
  int64_t b = 0;
  for (const auto& p : parts_)
    for (const Tensor* t : {&p->param, &p->param_shard, &p->shard_next, &p->grad, &p->master, &p->m, &p->v, &p->part_grad,
                            &p->part_grad_spare, &p->master_alt, &p->m_alt, &p->v_alt})
      if (t->defined()) b += int64_t(t->bytes());
  return b + opt_state_bytes_;
}

std::pair<int, int> ZeroEngine::offloaded_modules() const {
  const int n = int(std::count_if(parts_.begin(), parts_.end(), [](const auto& p) { return p->opt_host; }));
  return {n, int(parts_.size())};
}

std::pair<int64_t, int64_t> ZeroEngine::trainable_and_frozen() const {
  int64_t trained = 0, frozen = 0;
  for (const auto& p : parts_) (p->frozen ? frozen : trained) += p->spec.numel;
  return {trained, frozen};
}

// ---------------------------------------------------------------- evaluation

double ZeroEngine::evaluate(DataLoader& loader, int64_t global_step, int64_t epoch) {
  Device& accel = rt_.accelerator();
  Device& host = rt_.host();
  const int L = int(mc_.layers);
  const int fin = L + 1;
  const int64_t Be = cfg_.eval_batch > 0 ? cfg_.eval_batch : B_;
  const ModelShape shape = cfg_.model == "custom" ? cfg_.shape : shape_of(mc_, cfg_.model);
  // An encoder-decoder's logits are over its target tokens.
  const int64_t Tl = shape.encoder_layers > 0 && shape.decoder_seq_len > 0 ? shape.decoder_seq_len : T_;
  const int64_t V = mc_.vocab;
  const int64_t batches = (cfg_.eval_samples + Be * W_ - 1) / (Be * W_);
  const int64_t wte = virt_ ? 0 : model::embedding_offsets(mc_).wte;
  // Without gradients a layer's activations live only while it runs: one layer's worth (virtual
  // mode; a real run computes in the passes' own workspace).
  ModelShape one = shape;
  one.layers = 1;
  one.encoder_layers = 0;
  const int64_t act_bytes = virt_ ? activation_bytes(one, Be, std::max<int64_t>(T_, Tl), false, attention_of(cfg_) == model::Attention::Flash) : 0;
  fail::set_thread_position({rank_, global_step, -1, epoch, rec_});
  order_pos_ = 0;  // the forward's order: its prefetch serves the evaluation too
  probe::MarkerId ph = phase("evaluation", global_step);
  // Kept predictions, as transformers' evaluation loop keeps them: concatenated on the device batch by
  // batch (torch.cat: a new tensor of both while the old one is alive), moved to the host every
  // eval_accumulation_steps batches and concatenated there (numpy's concatenate: a new array each time).
  Tensor dev_preds, preds;
  // dst := a's values then b's (either may be undefined), a new tensor on `where`.
  auto concat = [&](const Tensor& a, const Tensor& b, const std::string& name, Device& where) {
    const int64_t n = (a.defined() ? a.numel() : 0) + (b.defined() ? b.numel() : 0);
    Tensor out = Tensor::empty(name, {n}, DType::F32, where);
    int64_t at = 0;
    for (const Tensor* t : {&a, &b}) {
      if (!t->defined()) continue;
      if (out.raw() && t->raw()) where.ops().copy(out.f32() + at, t->f32(), t->bytes());
      at += t->numel();
    }
    return out;
  };
  auto to_host = [&]() {
    if (!dev_preds.defined()) return;
    probe::MarkerId mv = phase("eval logits to the host", global_step);
    Tensor h = copy_to(dev_preds, host, false, "eval.preds.cpu");  // D2H (.cpu())
    dev_preds.reset();
    preds = concat(preds, h, "eval.preds", host);
    end(mv);
  };
  double loss_sum = 0;
  for (int64_t b = 0; b < batches; ++b) {
    probe::MarkerId bm = phase("eval batch " + std::to_string(b), global_step);
    Tensor tokens, targets;
    if (virt_) {
      tokens = Tensor::empty("eval.tokens", {Be, T_}, DType::I32, accel);
      targets = Tensor::empty("eval.targets", {Be, Tl}, DType::I32, accel);
    } else {
      loader.eval_batch(b, rank_, host_tokens_.data<int32_t>(), host_targets_.data<int32_t>());
      tokens = copy_to(host_tokens_, accel);
      targets = copy_to(host_targets_, accel);
    }
    Tensor acts = virt_ ? Tensor::empty("eval.activations", {(act_bytes + 3) / 4}, DType::F32, accel) : Tensor();
    const float* P = fetch(0, global_step);
    if (!virt_) passes_->embed_forward(P, tokens.data<int32_t>(), passes_->residual(0));
    release(0, global_step);
    for (int l = 0; l < L; ++l) {
      P = fetch(l + 1, global_step);
      const int adapter = lora_of_.empty() ? -1 : lora_of_[size_t(l)];
      if (adapter >= 0) fetch(adapter, global_step);
      if (!virt_) passes_->block_forward(l, P, passes_->residual(l), passes_->residual(l + 1));
      if (adapter >= 0) release(adapter, global_step);
      release(l + 1, global_step);
    }
    const float* Pf = fetch(fin, global_step);
    const float* Pe = fetch(0, global_step);
    if (head_ > 0) fetch(head_, global_step);
    // The logits in fp32 (transformers upcasts them for the loss and returns them so).
    Tensor logits = Tensor::empty("eval.logits", {Be, Tl, V}, DType::F32, accel);
    if (!virt_) loss_sum += passes_->head_forward(Pf, Pe + wte, passes_->residual(L), targets.data<int32_t>(), logits.f32());
    if (head_ > 0) release(head_, global_step);
    release(fin, global_step);
    release(0, global_step);
    acts.reset();
    if (cfg_.eval_keep_logits) {
      // compute_metrics needs them: gathered from every rank (accelerate's gather_for_metrics), kept.
      Tensor all = Tensor::empty("eval.logits.gathered", {W_ * Be * Tl * V}, DType::F32, accel);
      comm_.all_gather(logits.raw(), all.raw(), logits.bytes(), "eval.logits");
      logits.reset();
      Tensor grown = concat(dev_preds, all, "eval.preds.device", accel);
      dev_preds = std::move(grown);
      if (cfg_.eval_accumulation_steps > 0 && (b + 1) % cfg_.eval_accumulation_steps == 0) to_host();
    }
    end(bm);
  }
  // The metrics read everything at the end (the rest moved to the host first); then all is freed.
  if (cfg_.eval_keep_logits) {
    to_host();
    probe::MarkerId cm = phase("compute_metrics", global_step);
    end(cm);
  }
  dev_preds.reset();
  preds.reset();
  for (auto& p : parts_) {  // gathered for the evaluation, stale for the next step's order
    p->staging.wait();
    p->staged.reset();
    p->drop_gathered();
    p->compute.reset();
  }
  end(ph);
  double loss = virt_ ? std::nan("") : loss_sum / double(batches);
  if (!virt_) {
    comm_.all_reduce(&loss, 1, "eval_loss");
    loss /= double(W_);
  }
  return loss;
}

// ---------------------------------------------------------------- fetch and release

// The whole module on the device: its shard (copied host->device first under offload_param,
// perhaps ahead of time by the prefetch) all-gathered from every rank.
void ZeroEngine::gather(Part& p) {
  Device& accel = rt_.accelerator();
  await_update(p.spec.index);  // the overlapped update writes the shard first
  if (z_.offload_param) stage_shard(p);
  p.staging.wait();  // the H2D copy has landed before the all-gather reads it
  p.written.wait();  // ... and the delayed update's write-back into the shard
  const Tensor& src = p.staged.defined() ? p.staged : p.param_shard;
  if (W_ == 1 && !src.device().is_host()) {
    // A world of one: the shard on the device is the whole module, and DeepSpeed's fetch is a view
    // of it (NoGatherHandle: no all-gather, no buffer).
    p.gathered = src;
  } else if (ds_layout_ && charge_terms_) {
    // DeepSpeed gathers parameter by parameter (partition_parameters.py's all-gather of a sub-module's
    // parameters: one buffer of ceil(numel / W) x W elements each, the last padded); those below the
    // persistence threshold are whole on every rank already (NAME.persistent).
    const std::vector<int64_t>& params = module_params_[size_t(p.spec.index)];
    int64_t k = 0;
    for (int64_t n : params) {
      if (n < z_.param_persistence_threshold) continue;
      Tensor t = Tensor::empty(p.spec.name + ".gathered[" + std::to_string(k++) + "]", {ds_partition_numel(n, W_) * W_},
                               dtype_, accel);
      if (!p.gathered.defined()) p.gathered = std::move(t);
      else p.gathered_more.push_back(std::move(t));
    }
    if (!p.gathered.defined()) p.gathered = Tensor::empty(p.spec.name + ".gathered", {p.padded}, dtype_, accel);
    comm_.all_gather(src.raw(), nullptr, size_t(p.shard) * dtype_size(dtype_), p.spec.name + ".gathered");
  } else {
    p.gathered = Tensor::empty(p.spec.name + ".gathered", {p.padded}, dtype_, accel);
    comm_.all_gather(src.raw(), p.gathered.raw(), size_t(p.shard) * dtype_size(dtype_), p.spec.name + ".gathered");
  }
  p.staged.reset();
}

// offload_param: the module's host shard on its way to the device, on the H2D copy lane, so
// that it overlaps the compute queued after it (the prefetch stages the next modules' shards
// while the current one computes).
void ZeroEngine::stage_shard(Part& p) {
  if (p.staged.defined()) return;
  await_update(p.spec.index);  // the overlapped update's AdamW writes the host shard
  Device& accel = rt_.accelerator();
  p.staged = Tensor::empty(p.spec.name + ".shard", {p.shard}, dtype_, accel);
  if (rec_)
    rec_->placement(rank_, rec_->intern(p.staged.name()), accel.trace_id(), probe::PlacementWhy::Moved,
                    int64_t(p.staged.bytes()));
  p.staging = copy_into_async(p.staged, p.param_shard);  // H2D
}

// A gradient partition on its way to the host has landed, in fp32; its sum of squares (for the
// global norm) is taken now, while the device computes the rest of backward.
void ZeroEngine::finish_offload(Offload& o) {
  o.copy.wait();
  Tensor& g = o.part->part_grad;
  if (g.raw()) {
    std::optional<BackgroundThread::Beside> beside;  // the rank's width beside a background AdamW
    if (background_) beside.emplace(*background_);
    // Widened from the compute dtype and summed in one pass (the same sum as sum_squares); a
    // partition kept in the compute dtype is summed as it is.
    o.part->part_grad_sq = o.staging.defined()
                            ? widen_and_sum_squares(g.f32(), o.staging.raw(), o.staging.dtype(), g.numel())
                            : sum_squares_of(g);
    o.part->part_grad_sq_ready = true;
  }
  o.staging.reset();
  if (cfg_.adam_in_backward) early_landed(*o.part);
}

// The partitions already on their way to the host land, but `keep`: called while the device
// has a module's backward queued, so the host's widening and norm work overlaps it.
void ZeroEngine::land_offloads(size_t keep) {
  while (offloads_.size() > keep) {
    finish_offload(offloads_.front());
    offloads_.pop_front();
  }
}


const float* ZeroEngine::fetch(int mi, int64_t step) {
  Part& p = *parts_[size_t(mi)];
  await_update(mi);
  write_back_early();
  if (!order_known_) {
    order_.push_back(mi);
  } else {
    // Where we are in the recorded order; a module seen out of order is searched for.
    size_t pos = order_pos_;
    while (pos < order_.size() && order_[pos] != mi) ++pos;
    if (pos < order_.size()) order_pos_ = pos + 1;
    p.last_pos = pos;
  }
  // A prefetched module is gathered already; its fp32 upcast is made at first use.
  const bool needs_gather = p.sharded && !p.gathered.defined();
  const bool needs_upcast = dtype_ != DType::F32 && !p.compute.defined() && !cfg_.virtual_mode;
  if (needs_gather || needs_upcast) {
    probe::MarkerId ph = phase("fetch " + p.spec.name, step);
    if (needs_gather) gather(p);
    if (needs_upcast) {
      p.compute = Tensor::empty(p.spec.name + ".compute", {p.spec.numel}, DType::F32, rt_.accelerator());
      read_into(p.sharded ? p.gathered : p.param, 0, p.compute.f32(), p.spec.numel);
    }
    end(ph);
  }
  if (order_known_) prefetch_after(mi, step);
  if (cfg_.virtual_mode) return nullptr;  // no math
  if (dtype_ != DType::F32) return p.compute.f32();
  return p.sharded ? p.gathered.f32() : p.param.f32();
}

// From the second step on, the modules that follow in the recorded order are gathered ahead
// of use, up to the prefetch bucket and below the bound on live parameters.
void ZeroEngine::prefetch_after(int, int64_t step) {
  // Under offload_param the prefetch starts the shards' host->device copies (which overlap the
  // compute in between) and each module is all-gathered when it is fetched; otherwise it is
  // all-gathered now.
  int64_t live = 0;
  for (const auto& q : parts_)
    if (q->sharded && (q->gathered.defined() || q->staged.defined())) live += q->spec.numel;
  int64_t budget = z_.prefetch_bucket_size;
  for (size_t j = order_pos_; j < order_.size(); ++j) {
    Part& q = *parts_[size_t(order_[j])];
    if (!q.sharded || q.gathered.defined() || q.staged.defined()) continue;
    if (q.spec.numel > budget || live + q.spec.numel > z_.max_live_parameters) break;
    // The overlapped update: a prefetch does not block the rank thread on a module's AdamW (it
    // runs before the current module's compute is queued). Under offload_param it stages the
    // shards whose update has finished (a copy of this rank's own: timing may decide it); otherwise
    // it would all-gather, a collective every rank must issue alike, so it stops at the first
    // update due (the same on every rank), and that module is gathered when it is fetched.
    if (q.update_due && !(z_.offload_param && update_finished(q))) break;
    probe::MarkerId ph = phase("prefetch " + q.spec.name, step);
    if (z_.offload_param) stage_shard(q);
    else gather(q);
    end(ph);
    budget -= q.spec.numel;
    live += q.spec.numel;
  }
}

void ZeroEngine::release(int mi, int64_t step) {
  Part& p = *parts_[size_t(mi)];
  if (!p.sharded && !p.compute.defined()) return;
  if (order_known_) {
    // Kept when the module is used again within the reuse distance (parameters fetched between).
    int64_t distance = 0;
    for (size_t j = p.last_pos + 1; j < order_.size(); ++j) {
      if (order_[j] == mi) {
        if (distance <= z_.max_reuse_distance) return;
        break;
      }
      distance += parts_[size_t(order_[j])]->spec.numel;
    }
  }
  probe::MarkerId ph = phase("release " + p.spec.name, step);
  p.drop_gathered();
  p.compute.reset();
  end(ph);
}

// ---------------------------------------------------------------- gradients

void ZeroEngine::ds12_reduce_collectives() {
  // Each flush all-reduces the bucket (reduce_scatter with use_multi_rank_bucket_allreduce, the defaults):
  // recorded by its bytes in the compute dtype.
  const int64_t e = int64_t(dtype_size(dtype_));
  for (int64_t n : ds12_grads_->take_flushes())
    comm_.all_reduce(static_cast<float*>(nullptr), size_t((n * e + 3) / 4), 1.0f / float(W_),
                     ds12_grads_->ipg_name(0));
}

void ZeroEngine::charge(const std::vector<MemoryOp>& ops) {
  for (const MemoryOp& op : ops) {
    if (op.alloc) {
      if (charges_.count(op.term.name))
        throw std::logic_error("ZeroEngine: the memory term " + op.term.name + " is charged twice");
      charges_[op.term.name] = op.host ? Tensor::empty(op.term.name, {op.term.numel}, op.term.dtype, rt_.host(), op.pinned)
                                       : Tensor::empty_on_stream(op.term.name, {op.term.numel}, op.term.dtype,
                                                                 rt_.accelerator(), op.stream);
    } else {
      if (!charges_.erase(op.term.name))
        throw std::logic_error("ZeroEngine: the memory term " + op.term.name + " is freed but was never charged");
      if (op.return_cached && !op.host)
        if (memory::DeviceAllocator* a = rt_.device_allocator()) a->empty_cache();
    }
  }
}

void ZeroEngine::ds_module_gradient(int mi) {
  const Part& p = *parts_[size_t(mi)];
  const std::string name = p.spec.name + ".grad";
  if (!charges_.count(name)) charge(MemoryOp{true, {name, dtype_, p.spec.numel}});
  // Parameter by parameter into the bucket (the copy is the bucket's own memory), each gradient
  // freed once copied: DeepSpeed's __add_grad_to_ipg_bucket.
  for (int64_t n : module_params_[size_t(mi)]) {
    if (ipg_->needs_flush(n)) ds_flush_gradients();
    ipg_->add(n);
  }
  charge(MemoryOp{false, {name, dtype_, 0}});
}

void ZeroEngine::ds_flush_gradients() {
  if (ipg_) charge(ipg_->flush());
}

void ZeroEngine::reduce_module_grad(int mi, Tensor& bucket, int64_t step) {
  Part& p = *parts_[size_t(mi)];
  if (z_.stage >= 2) {
    probe::MarkerId ph = phase("reduce " + p.spec.name, step);
    // DeepSpeed's path (ds_layout_, virtual mode) made its own buffers: the collective is recorded.
    Tensor reduced;
    if (!ds_layout_) reduced = Tensor::empty("grad.reduced[" + p.spec.name + "]", {p.shard}, DType::F32, rt_.accelerator());
    comm_.reduce_scatter(bucket.defined() ? bucket.f32() : nullptr, reduced.defined() ? reduced.f32() : nullptr,
                         size_t(p.shard), 1.0f / float(W_), "grad.bucket" + std::to_string(mi));
    if (reduced.defined()) add_into(p.grad, 0, reduced.f32(), p.shard);
    end(ph);
    // At the accumulation boundary the module's gradient partition is final: under optimizer
    // offload it goes to the host now, during backward (DeepSpeed's partition_grads).
    if (p.opt_host && micro_ == cfg_.grad_accum - 1) offload_grad(mi, p.grad, step);
  } else {
    add_into(p.grad, 0, bucket.f32(), p.padded);  // reduced at the accumulation boundary
  }
  bucket.reset();
}

StepResult ZeroEngine::step(DataLoader& loader, int64_t epoch, int64_t step_in_epoch, int64_t global_step) {
  Device& accel = rt_.accelerator();
  const int L = int(mc_.layers);
  const int fin = L + 1;
  const int64_t wte = virt_ ? 0 : model::embedding_offsets(mc_).wte;
  const float grad_scale = float(loss_scale_ / double(cfg_.grad_accum));
  order_pos_ = 0;
  step_now_ = global_step;
  double loss_sum = 0;
  epoch_ = epoch;
  for (int64_t micro = 0; micro < cfg_.grad_accum; ++micro) {
    micro_ = micro;
    fail::set_thread_position({rank_, global_step, micro, epoch, rec_});
    probe::MarkerId mm = 0;
    if (rec_) {
      probe::MarkerEvent e;
      e.rank = rank_;
      e.kind = probe::MarkerKind::MicroStep;
      e.name = rec_->intern("micro-step " + std::to_string(micro));
      e.step = global_step;
      e.micro_step = micro;
      e.epoch = epoch;
      mm = rec_->marker_begin(e);
    }
    if (micro == cfg_.grad_accum - 1) boundary_faults(global_step);
    if (virt_)
      loader.account_micro_batch();
    else
      loader.micro_batch(epoch, step_in_epoch, micro, rank_, host_tokens_.data<int32_t>(), host_targets_.data<int32_t>());
    Tensor tokens = copy_to(host_tokens_, accel);
    Tensor targets = copy_to(host_targets_, accel);

    // Each module's own forward and backward are markers too ("forward block3"), inside the
    // micro-step's "forward" / "backward" phases, beside its fetch and release.
    auto module_phase = [&](const char* what, int mi) {
      return phase(std::string(what) + " " + parts_[size_t(mi)]->spec.name, global_step, micro);
    };
    // The device terms PyTorch's autograd keeps (ds_memory.h) are charged beside each pass where
    // the passes do not allocate them on the device themselves (charge_terms_); each module's
    // gradient is our fp32 bucket, or in virtual mode at stage 3 DeepSpeed's (ds_layout_).
    // A frozen module (finetuning lora or freeze) gets none either: the passes skip its weights'
    // gradients, and nothing is reduced (trains(mi) says which do).
    auto bucket_for = [&](int mi) {
      if (ds_layout_ || ds12_ || ds0_ || parts_[size_t(mi)]->frozen) return Tensor();
      return Tensor::zeros("grad.bucket" + std::to_string(mi), {parts_[size_t(mi)]->padded}, DType::F32, accel);
    };
    auto trains = [&](int mi) { return !parts_[size_t(mi)]->frozen; };
    auto grads_of = [](Tensor& t, int64_t offset = 0) { return t.defined() && t.raw() ? t.f32() + offset : nullptr; };
    // autograd's tensors one by one (ds_memory.h), or an encoder-decoder's estimate for the whole pass.
    const bool per_tensor = charge_terms_ && pass_activations_ == 0;
    if (ds12_) ds12_grads_->begin_backward(micro);
    // DeepSpeed's stages 1-2 (ds12_): module mi's gradients made by its backward and reduced through the
    // IPG buffers (stage 2), or kept to the boundary (stage 1).
    auto ds12_backward = [&](int mi) {
      if (ds12_ && trains(mi)) {
        charge(ds12_grads_->module_backward(mi, parts_[size_t(mi)]->spec.name + ".grad"));
        ds12_reduce_collectives();
        if (z_.stage == 2 && micro == cfg_.grad_accum - 1) ds12_transfer(mi, true);
      }
      // Stage 0 (ds0_): autograd's gradient, made by the window's first backward, accumulated after.
      if (ds0_ && trains(mi) && micro == 0)
        charge(MemoryOp{true, {parts_[size_t(mi)]->spec.name + ".grad", dtype_, parts_[size_t(mi)]->spec.numel}});
    };
    probe::MarkerId ph = phase("forward", global_step, micro);
    if (pass_activations_ > 0) charge(MemoryOp{true, {"activations", DType::F32, pass_activations_}});
    const float* P = fetch(0, global_step);
    probe::MarkerId mp = module_phase("forward", 0);
    if (!virt_) passes_->embed_forward(P, tokens.data<int32_t>(), passes_->residual(0));
    if (per_tensor) charge(embeddings_forward_ops(act_));
    end(mp);
    release(0, global_step);
    for (int l = 0; l < L; ++l) {
      P = fetch(l + 1, global_step);
      const int adapter = lora_of_.empty() ? -1 : lora_of_[size_t(l)];
      if (adapter >= 0) fetch(adapter, global_step);  // LoRA: the block's adapters with it (sizes only)
      mp = module_phase("forward", l + 1);
      if (!virt_) passes_->block_forward(l, P, passes_->residual(l), passes_->residual(l + 1));
      if (per_tensor) charge(block_forward_ops(act_, l));
      end(mp);
      if (adapter >= 0) release(adapter, global_step);
      release(l + 1, global_step);
    }
    end(ph);

    ph = phase("loss", global_step, micro);
    const float* Pf = fetch(fin, global_step);
    const float* Pe = fetch(0, global_step);
    // In a world of one DeepSpeed's fetches are views, but the tied LM head's weight, used outside
    // its module, is gathered as an external parameter into a buffer of its own (Init._all_gather).
    const bool wte_gathered = charge_terms_ && z_.stage == 3 && W_ == 1 && head_ == 0 && !z_.offload_param;
    if (wte_gathered) charge(MemoryOp{true, {"embeddings.wte.gathered", dtype_, act_.vocab * act_.width}});
    Tensor emb_bucket = bucket_for(0);
    Tensor fin_bucket = bucket_for(fin);
    float* dx = virt_ ? nullptr : passes_->grad_residual();
    if (!virt_)
      loss_sum += passes_->head_forward_backward(Pf, Pe + wte, passes_->residual(L), targets.data<int32_t>(), dx,
                                                 grads_of(fin_bucket), grads_of(emb_bucket, wte), grad_scale);
    if (per_tensor) charge(head_ops(act_));
    // The tied head's weight gradient waits in autograd's buffer for the embeddings' own (our
    // fp32 embeddings bucket holds it, elsewhere).
    // At stage 1 (ds12_) it is made once a window: later micro-steps accumulate into it.
    const bool head_grad =
        (ds_layout_ || (ds12_ && (z_.stage == 2 || micro == 0)) || (ds0_ && micro == 0)) && head_ == 0 && trains(0);
    if (head_grad) charge(MemoryOp{true, {"lm_head.weight.grad", dtype_, act_.vocab * act_.width}});
    if (wte_gathered) charge(MemoryOp{false, {"embeddings.wte.gathered", dtype_, 0}});
    release(fin, global_step);
    release(0, global_step);
    ds12_backward(fin);
    if (trains(fin) && !ds12_ && !ds0_) {
      if (ds_layout_) ds_module_gradient(fin);
      reduce_module_grad(fin, fin_bucket, global_step);
    }
    if (head_ > 0) {  // an untied LM head (virtual shapes): its own module
      fetch(head_, global_step);
      Tensor head_bucket = bucket_for(head_);
      release(head_, global_step);
      ds12_backward(head_);
      if (trains(head_) && !ds12_ && !ds0_) {
        if (ds_layout_) ds_module_gradient(head_);
        reduce_module_grad(head_, head_bucket, global_step);
      }
    }
    end(ph);

    ph = phase("backward", global_step, micro);
    for (int l = L - 1; l >= 0; --l) {
      P = fetch(l + 1, global_step);
      const int adapter = lora_of_.empty() ? -1 : lora_of_[size_t(l)];
      if (adapter >= 0) fetch(adapter, global_step);
      Tensor bucket = bucket_for(l + 1);
      mp = module_phase("backward", l + 1);
      if (!virt_) passes_->block_backward(l, P, passes_->residual(l), dx, dx, grads_of(bucket));
      if (ds_layout_ && trains(l + 1))
        charge(MemoryOp{true, {parts_[size_t(l) + 1]->spec.name + ".grad", dtype_, parts_[size_t(l) + 1]->spec.numel}});
      if (per_tensor) charge(block_backward_ops(act_, l));
      end(mp);
      // The earlier modules' gradient partitions land while this backward runs, but the newest:
      // its copy (queued after the last reduce) runs beside this backward and lands after the next.
      land_offloads(1);
      release(l + 1, global_step);
      ds12_backward(l + 1);
      if (trains(l + 1) && !ds12_ && !ds0_) {
        if (ds_layout_) ds_module_gradient(l + 1);
        reduce_module_grad(l + 1, bucket, global_step);
      }
      if (adapter >= 0) {
        Tensor adapter_bucket = bucket_for(adapter);
        release(adapter, global_step);
        ds12_backward(adapter);
        if (!ds12_ && !ds0_) {
          if (ds_layout_) ds_module_gradient(adapter);
          reduce_module_grad(adapter, adapter_bucket, global_step);
        }
      }
    }
    mp = module_phase("backward", 0);
    if (!virt_ && emb_bucket.defined()) passes_->embed_backward(tokens.data<int32_t>(), dx, emb_bucket.f32());
    if (ds_layout_ && trains(0)) {
      // The embeddings' gradient (dense), summed in place into the head's, which is then freed.
      charge(MemoryOp{true, {parts_[0]->spec.name + ".grad", dtype_, parts_[0]->spec.numel}});
      if (head_ == 0) charge(MemoryOp{false, {"lm_head.weight.grad", dtype_, 0}});
    }
    if (ds12_ && trains(0)) {
      // The same at stages 1-2: the embeddings' gradient made beside the head's, which is then freed,
      // before the hooks copy it into the IPG buffer.
      std::vector<MemoryOp> ops = ds12_grads_->module_backward(0, parts_[0]->spec.name + ".grad");
      if (head_grad) ops.insert(ops.begin() + (ops.empty() ? 0 : 1), MemoryOp{false, {"lm_head.weight.grad", dtype_, 0}});
      charge(ops);
      ds12_reduce_collectives();
      if (z_.stage == 2 && micro == cfg_.grad_accum - 1) ds12_transfer(0, true);
    }
    if (ds0_ && trains(0) && micro == 0) {
      charge(MemoryOp{true, {parts_[0]->spec.name + ".grad", dtype_, parts_[0]->spec.numel}});
      if (head_grad) charge(MemoryOp{false, {"lm_head.weight.grad", dtype_, 0}});
    }
    if (per_tensor) charge(embeddings_backward_ops(act_));
    if (pass_activations_ > 0) charge(MemoryOp{false, {"activations", DType::F32, 0}});
    end(mp);
    land_offloads(1);
    if (trains(0) && !ds12_ && !ds0_) {
      if (ds_layout_) ds_module_gradient(0);
      reduce_module_grad(0, emb_bucket, global_step);
    }
    // DeepSpeed's epilogue of every backward: what is left in the ipg bucket is reduced.
    if (ds_layout_) ds_flush_gradients();
    if (ds12_ && z_.stage == 2) {
      charge(ds12_grads_->epilogue());
      ds12_reduce_collectives();
    }
    if (ds12_ && z_.stage == 1 && micro == cfg_.grad_accum - 1) {
      // Stage 1 reduces at the boundary (the engine's allreduce_gradients -> reduce_gradients): every
      // accumulated gradient through the IPG buffers, parameter by parameter in the group's order.
      probe::MarkerId rg = phase("reduce_gradients", global_step, micro);
      for (size_t mi = 0; mi < parts_.size(); ++mi)
        if (trains(int(mi))) {
          charge(ds12_grads_->reduce_module(int(mi), parts_[mi]->spec.name + ".grad"));
          ds12_transfer(int(mi), true);
        }
      charge(ds12_grads_->epilogue());
      ds12_reduce_collectives();
      end(rg);
    }
    if (ds0_ && micro == cfg_.grad_accum - 1) {
      // Stage 0 all-reduces at the boundary (allreduce_gradients -> buffered_allreduce_fallback): buckets of
      // 5e8 elements, each flattened for its all-reduce.
      probe::MarkerId ar = phase("allreduce_gradients", global_step, micro);
      charge(ds0_allreduce_ops(ds0_params_, dtype_));
      for (auto& p : parts_)
        if (!p->frozen)
          comm_.all_reduce(static_cast<float*>(nullptr), size_t(p->padded), 1.0f / float(W_), "grad." + p->spec.name);
      end(ar);
    }
    end(ph);
    if (rec_) rec_->marker_end(mm);
  }
  // Gathered buffers are stale once the optimizer runs.
  for (auto& p : parts_) {
    p->staging.wait();
    p->staged.reset();
    p->drop_gathered();
    p->compute.reset();
  }
  order_known_ = true;
  micro_ = -1;
  fail::set_thread_position({rank_, global_step, -1, epoch, rec_});

  StepResult r = optimizer_step(global_step);
  double loss = loss_sum / double(cfg_.grad_accum);
  comm_.all_reduce(&loss, 1, "loss");
  r.loss = loss / double(W_);
  return r;
}

// ---------------------------------------------------------------- the optimizer step

// AdamW during backward: a step that throws stops the pass in flight first (its updates thrown away):
// the error is the step's.
StepResult ZeroEngine::optimizer_step(int64_t step) {
  try {
    return optimizer_step_body(step);
  } catch (...) {
    if (early_now() && !early_.committed) abort_early(true);
    throw;
  }
}

StepResult ZeroEngine::optimizer_step_body(int64_t step) {
  Device& accel = rt_.accelerator();
  Device& host = rt_.host();
  StepResult r;
  r.loss_scale = loss_scale_;
  probe::MarkerId ph = phase("optimizer", step);

  // 1. Each rank's fp32 gradient partition, averaged over ranks.
  std::vector<Tensor> g32(parts_.size());
  if (ds12_) {
    // DeepSpeed's stages 1-2: the overflow check and the norm over grads_in_partition, then the group's
    // fp32 gradient partition (single_partition_of_fp32_groups[0].grad), every module's share of it;
    // under offload_optimizer the host fp32 gradient, filled at the boundary.
    charge(ds12_grads_->step_before_adam());
    auto it = charges_.find("single_partition_of_fp32_groups[0].grad");
    for (size_t mi = 0; mi < parts_.size(); ++mi) {
      if (parts_[mi]->frozen) continue;
      g32[mi] = it != charges_.end() ? it->second : opt_grad_of(int(mi));
    }
  } else if (ds0_) {
    // DeepSpeed's stage 0: the overflow check, every gradient to fp32 and their concatenation.
    charge(ds0_step_before_adam(ds0_params_, dtype_));
    auto it = charges_.find("fp32_groups_flat[0].grad");
    for (size_t mi = 0; mi < parts_.size(); ++mi) {
      if (parts_[mi]->frozen) continue;
      g32[mi] = it != charges_.end() ? it->second : opt_grad_of(int(mi));
    }
  }
  for (size_t mi = 0; mi < parts_.size() && !ds12_ && !ds0_; ++mi) {
    Part& p = *parts_[mi];
    if (p.frozen) continue;  // no gradient, no optimizer state
    if (z_.stage <= 1) {
      Tensor full = Tensor::empty("grad.fp32[" + p.spec.name + "]", {p.padded}, DType::F32, accel);
      read_into(p.grad, 0, full.f32(), p.padded);
      if (z_.stage == 0) {
        comm_.all_reduce(full.f32(), size_t(p.padded), 1.0f / float(W_), "grad." + p.spec.name);
        g32[mi] = std::move(full);
      } else {
        Tensor part = Tensor::empty("grad.reduced[" + p.spec.name + "]", {p.shard}, DType::F32, accel);
        comm_.reduce_scatter(full.f32(), part.f32(), size_t(p.shard), 1.0f / float(W_), "grad." + p.spec.name);
        g32[mi] = std::move(part);
      }
      if (p.opt_host) {
        offload_grad(int(mi), g32[mi], step);  // D2H
        g32[mi] = opt_grad_of(int(mi));
      }
    } else if (p.opt_host) {
      g32[mi] = opt_grad_of(int(mi));  // moved to the host at the boundary (offload_grad)
    } else if (dtype_ == DType::F32) {
      g32[mi] = p.grad;
    } else {
      g32[mi] = Tensor::empty(partition_name(int64_t(mi)) + ".grad", {p.shard}, DType::F32, accel);
      read_into(p.grad, 0, g32[mi].f32(), p.shard);
    }
  }

  probe::MarkerId gl = phase("gradients landed", step);
  land_offloads(0);  // every partition has reached the host
  end(gl);
  if (early_now()) {
    // AdamW during backward: the pass takes the modules still to do in the forward's order now; one
    // that failed already ends the step with its error.
    std::lock_guard lock(update_mu_);
    early_.all_landed = true;
    update_cv_.notify_all();
  }

  // 2. The global norm. Each rank sums the squares of its own partition (at stage 0 every
  // rank holds all of it, so one rank's sum is the total), then the sums are all-reduced.
  probe::MarkerId gn = phase("global_grad_norm", step);
  double sq = 0;
  for (size_t mi = 0; mi < g32.size(); ++mi) {
    Part& p = *parts_[mi];
    const Tensor& g = g32[mi];
    if (!g.defined() || !g.raw()) continue;  // frozen (undefined), or virtual mode
    // Summed when it landed (finish_offload): the same function over the same values.
    sq += p.part_grad_sq_ready && g.raw() == p.part_grad.raw() ? p.part_grad_sq : sum_squares_of(g);
  }
  for (auto& p : parts_) p->part_grad_sq_ready = false;
  end(gn);
  if (z_.stage > 0) comm_.all_reduce(&sq, 1, "grad_norm");
  // Virtual mode has no gradients: the norm is the configured one.
  const double norm = virt_ ? cfg_.virtual_grad_norm : std::sqrt(sq) / loss_scale_;
  // Under optimizer offload the norm lives on the host (DeepSpeed >= 0.14.5 returns it with
  // .cpu()); otherwise on the device where the partitions are. The fault zero.norm_on_device
  // is DeepSpeed 0.14.1-0.14.2: torch.norm(torch.stack(norms)) over norms all-reduced on the
  // GPU, so the norm stays on the device even under offload.
  bool norm_on_host = z_.offload_optimizer;
  if (ZT_FAIL_D("zero.norm_on_device", fail::Context{},
                "global_grad_norm kept on " + accel.label() + (norm_on_host ? " beside host partitions" : "")) &&
      norm_on_host)
    norm_on_host = false;
  Tensor norm_t = Tensor::empty("global_grad_norm", {}, DType::F32, norm_on_host ? host : accel);
  set_scalar(norm_t, float(norm));
  r.grad_norm = norm;

  if (!std::isfinite(norm)) {
    // fp16 overflow: skip the update, lower the scale (after `hysteresis` overflows).
    r.skipped = true;
    if (hysteresis_left_ > 1) {
      --hysteresis_left_;
    } else {
      loss_scale_ = std::max(z_.min_loss_scale, loss_scale_ / 2);
      hysteresis_left_ = z_.hysteresis;
    }
    good_steps_ = 0;
    if (rec_) {
      probe::MarkerId s = phase("skipped step (gradient overflow)", step);
      end(s);
      rec_->counter(rank_, 0, rec_->intern("loss_scale"), loss_scale_);
    }
    for (auto& p : parts_) zero_tensor(p->grad);
    ds_step_done(g32, nullptr);
    if (early_now()) abort_early(false);  // AdamW during backward: this step's update is thrown away
    // A delayed update in flight is applied all the same: the next step is one update behind,
    // as every other step, not two.
    apply_update(step);
    end_boundary();
    end(ph);
    return r;
  }

  // 3. unscale_and_clip_grads: one combined scale for every partition. A partition the CPU AdamW
  // reads on the host (optimizer offload: fp32, or the compute dtype under grad_partition_dtype
  // compute) is scaled by that AdamW, which multiplies each element by the same fp32 factor
  // (grad_scale) in its own pass: bit for bit the in-place scaling, without a pass over every
  // partition of its own on the rank thread before the update. Elsewhere (the optimizer on the
  // device) the partition is scaled in place.
  std::vector<float> grad_scale(parts_.size(), 1.0f);
  auto scale_partition = [&](size_t mi, Tensor& g, float a) {
    const bool host_adam = g.device().is_host() && parts_[mi]->master.device().is_host();
    if (g.dtype() == DType::F32 && !host_adam) g.device().ops().scale(g.f32(), g.numel(), a);
    else grad_scale[mi] = a;
  };
  {
    probe::MarkerId uc = phase("unscale_and_clip_grads", step);
    double combined = loss_scale_;
    if (cfg_.grad_clip > 0) {
      const double clip = (norm + 1e-6) / cfg_.grad_clip;
      if (clip > 1) {
        combined = clip * loss_scale_;
        r.clipped = true;
      }
    }
    if (r.clipped) {
      // The clip coefficient comes from the norm tensor, so it lives where the norm lives: a 0-dim
      // tensor, as torch.norm's (on the host it is a CPU scalar, valid against any device).
      Tensor combined_scale = Tensor::empty("combined_scale", {}, DType::F32, norm_t.device());
      set_scalar(combined_scale, float(combined));
      // On the host the scale is a CPU scalar, valid against partitions anywhere (under a partial
      // offload some are on the accelerator). On the accelerator (the fault zero.norm_on_device:
      // R2, R5) it meets the host partitions, and the guard stops the in-place mul_ as PyTorch does.
      for (size_t mi = 0; mi < g32.size(); ++mi) {
        Tensor& g = g32[mi];
        if (parts_[mi]->frozen) continue;
        check_same_device("unscale_and_clip_grads", {&combined_scale, &g}, step);
        if (!g.raw() || !combined_scale.raw()) continue;  // virtual mode
        scale_partition(mi, g, 1.0f / scalar_of(combined_scale));
      }
    } else if (combined != 1.0) {
      const float inv = float(1.0 / combined);  // a host scalar: valid against any device
      for (size_t mi = 0; mi < g32.size(); ++mi)
        if (g32[mi].defined() && g32[mi].raw()) scale_partition(mi, g32[mi], inv);
    }
    end(uc);
  }
  // AdamW during backward: its factor was this step's unless it clips. Clipped, its updates are
  // thrown away and the overlapped update's pass below runs from the state it kept.
  if (early_now() && (r.clipped || early_.stopped)) abort_early(false);

  // 4. AdamW on each partition, where the optimizer state lives: the vectorized CPU Adam (bit-
  // identical to the reference). With the master weights on the host, the same pass writes
  // the updated weights in the compute dtype (DeepSpeed's fused copy), straight into host
  // parameter shards under offload_param.
  // The fault optim.device_only_kernels: an optimizer whose kernels take device tensors only
  // (bitsandbytes' paged/8-bit AdamW). It was constructed without complaint; its first step
  // meets the offloaded host partitions.
  if (ds12_) ds12_moments();  // inside the optimizer's first step
  if (ZT_FAIL_D("optim.device_only_kernels", fail::Context{},
                std::string("device-only optimizer kernels given partitions on ") +
                    (z_.offload_optimizer ? "the host" : accel.label())))
    for (size_t mi = 0; mi < parts_.size(); ++mi) {
      Part& p = *parts_[mi];
      if (p.frozen) continue;
      if (p.m.defined()) require_accelerator("optimizer.step", {&p.master, &g32[mi], &p.m, &p.v}, step);
      else require_accelerator("optimizer.step", {&p.master, &g32[mi]}, step);
    }
  ++adam_steps_;
  // The fused pass may write host parameter shards that H2D copies read earlier in the step.
  rt_.accelerator().ops().synchronize();
  // The update of the step before, when it was delayed, is applied before this one starts: its
  // AdamW has finished and its weights are written back before its buffers are used again. (A pass
  // during backward in flight now is this step's own.)
  if (!early_now()) apply_update(step);
  const bool delayed = cfg_.delayed_update >= 0 && step >= cfg_.delayed_update;
  const bool overlapped = cfg_.overlap_update;
  const optim::AdamParams hp{cfg_.lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay};
  std::vector<AdamJob> jobs;
  for (size_t mi = 0; mi < parts_.size(); ++mi) {
    Part& p = *parts_[mi];
    if (p.frozen) continue;  // (finetuning with frozen modules has neither the delayed nor the overlapped update)
    if (p.m.defined()) check_same_device("adamw_step", {&p.master, &g32[mi], &p.m, &p.v}, step);
    else check_same_device("adamw_step", {&p.master, &g32[mi]}, step);  // a state of another shape (charged)
    AdamJob j;
    j.mi = int(mi);
    j.grad = g32[mi];
    j.grad_scale = grad_scale[mi];
    if (p.master.device().is_host() && dtype_ != DType::F32) {
      j.low = dtype_ == DType::BF16 ? optim::LowDType::BF16 : optim::LowDType::F16;
      if (adam_in_place(p, delayed)) {
        j.low_out = p.param_shard.raw();
        j.in_place = true;
      } else {
        if (!delayed && !overlapped) {
          // DeepSpeed's layout makes the copy as the module's step runs (below), as stage3.py's .to()
          // of each sub-group's fp32 partition is made and dropped: not every module's at once.
          // DeepSpeed's stages 1-2 (ds12_) copy into their host 16-bit buffer, made at set-up.
          if (!ds_layout_ && !ds12_) j.fused = update_buffer(p);
        } else {
          // Delayed, the update has a buffer of its own, kept from step to step: the next step's
          // prefetch reads the host parameter shards while the background pass runs. Overlapped,
          // the write-back that reads it runs when the next step first uses the module (one buffer:
          // the last write-back out of it has landed before the pass starts, below). Both made
          // with the engine.
          j.fused = p.update[overlapped ? 0 : update_slot_];
        }
        j.low_out = j.fused.defined() ? j.fused.raw() : nullptr;
      }
    }
    jobs.push_back(std::move(j));
  }
  if (delayed || overlapped) {
    // A partial offload's modules with their optimizer state on the accelerator are updated there
    // now, on the rank thread, whatever the mode: their AdamW is a few kernels on the device's
    // queue, neither delayed nor run beside the next step. Only the host modules' pass goes to the
    // background thread. (Every module's gradient is zeroed below, after this.)
    for (const AdamJob& j : jobs) {
      if (parts_[size_t(j.mi)]->opt_host) continue;
      run_adam(j, hp, step, adam_steps_);
      write_back(j.mi, j.fused);
    }
  }
  if (overlapped && early_now()) {
    // AdamW during backward: the pass in flight is this step's update (nothing clipped, the norm
    // finite: its factor was the step's). It stands: the next step's first use of each module
    // awaits it there and swaps the module's two states (await_update).
    for (auto& p : parts_) zero_tensor(p->grad);
    std::lock_guard lock(update_mu_);
    early_.committed = true;
    pending_step_ = step;
  } else if (overlapped) {
    // The AdamW pass to the background thread, in the order the forward first uses the modules;
    // the next step's first use of each waits for it (await_update).
    for (auto& p : parts_) zero_tensor(p->grad);
    std::vector<char> seen(parts_.size(), 0);
    std::vector<int> order;
    for (int mi : order_)
      if (!seen[size_t(mi)]) seen[size_t(mi)] = 1, order.push_back(mi);
    for (size_t mi = 0; mi < parts_.size(); ++mi)
      if (!seen[mi]) order.push_back(int(mi));
    update_pos_.assign(parts_.size(), 0);
    pending_.clear();
    for (int mi : order) {
      if (!parts_[size_t(mi)]->opt_host) continue;  // updated above
      update_pos_[size_t(mi)] = pending_.size();
      pending_.push_back(std::move(jobs[size_t(mi)]));
      parts_[size_t(mi)]->update_due = true;
    }
    // The update buffers (and, under offload_param, the host shards AdamW writes in place) are
    // free again: the last write-backs out of them are ordered before the device's later work,
    // which the synchronization then waits for (an H2D copy's wait does not block the host).
    for (auto& p : parts_) p->written.wait();
    accel.ops().synchronize();
    pending_step_ = step;
    if (!pending_.empty()) submit_pass(hp, step);
  } else if (!delayed) {
    // Each module's Adam ("adamw X"), then its updated shard to the device: serially, since both
    // are bound by host memory bandwidth (measured on an H100 host: a copy running beside the next
    // module's Adam slowed both, and 124M's step went from 158 to 185 ms).
    // The optimizer's own temporaries (optimizer_memory.h) on the device, around the update of what one call
    // is handed: stage 3 one sub-group (here a module) at a time, stages 0-2 the whole partition at once.
    auto temporaries = [&](const std::vector<int64_t>& tensors, bool alloc) {
      if (!charge_terms_) return;
      for (const MemoryTerm& t : optimizer_step_temporaries(opt_, tensors, cfg_.weight_decay))
        charge(MemoryOp{alloc, alloc ? t : MemoryTerm{t.name, t.dtype, 0}});
    };
    const bool per_sub_group = z_.stage == 3;
    const std::vector<int64_t> whole = per_sub_group ? std::vector<int64_t>{} : optimizer_step_tensors();
    temporaries(whole, true);
    for (AdamJob& j : jobs) {
      const int64_t sub_group = parts_[size_t(j.mi)]->opt_n;
      if (per_sub_group && !parts_[size_t(j.mi)]->opt_host) temporaries({sub_group}, true);
      const bool transient = ds_layout_ && j.low != optim::LowDType::None && !j.in_place;
      if (transient) {
        j.fused = update_buffer(*parts_[size_t(j.mi)]);
        j.low_out = j.fused.raw();
      }
      run_adam(j, hp, step, adam_steps_);
      if (per_sub_group && !parts_[size_t(j.mi)]->opt_host) temporaries({sub_group}, false);
      if (!j.in_place) write_back(j.mi, j.fused);
      if (transient) j.fused.reset();
      zero_tensor(parts_[size_t(j.mi)]->grad);
    }
    temporaries(whole, false);
  } else {
    // The whole AdamW pass to the background thread; the next step's forward and backward run
    // meanwhile on the weights as they are, and its partitions land in the other buffers.
    for (auto& p : parts_) zero_tensor(p->grad);
    pending_.clear();
    for (AdamJob& j : jobs)
      if (parts_[size_t(j.mi)]->opt_host) pending_.push_back(std::move(j));
    pending_step_ = step;
    early_next_ = 0;
    if (!pending_.empty()) submit_pass(hp, step);
    // The next job writes the other buffers: these are read by this update's write-back, which
    // the apply before that job waits for (skipped steps in between or not).
    update_slot_ ^= 1;
    for (auto& p : parts_) {
      if (!p->part_grad.defined()) continue;
      std::swap(p->part_grad, p->part_grad_spare);  // the spare was made with the engine
      p->part_grad_sq_ready = false;
    }
  }
  ds_step_done(g32, &jobs);
  if (dtype_ == DType::F16 && z_.static_loss_scale <= 0 && ++good_steps_ % z_.loss_scale_window == 0) loss_scale_ *= 2;
  end_boundary();
  if (rec_) {
    rec_->counter(rank_, 0, rec_->intern("grad_norm"), norm);
    if (dtype_ == DType::F16) rec_->counter(rank_, 0, rec_->intern("loss_scale"), loss_scale_);
  }
  end(ph);
  return r;
}

void ZeroEngine::ds_step_done(std::vector<Tensor>& g32, std::vector<AdamJob>* jobs) {
  if (!ds12_ && !ds0_) return;
  g32.clear();
  if (jobs) jobs->clear();
  if (ds12_) charge(ds12_grads_->step_after_adam());
  if (ds0_) {
    charge(ds0_step_after_adam());
    for (auto& p : parts_)  // the engine's zero_grad: the 16-bit gradients freed
      if (!p->frozen) charge(MemoryOp{false, {p->spec.name + ".grad", dtype_, 0}});
  }
}

void ZeroEngine::ds12_transfer(int mi, bool d2h) {
  const Part& p = *parts_[size_t(mi)];
  if (!rec_ || !p.opt_host || !p.part_grad.defined()) return;
  probe::TransferEvent e;
  e.rank = rank_;
  e.kind = d2h ? probe::TransferKind::D2H : probe::TransferKind::H2D;
  e.bytes = d2h ? 4 * p.opt_n : p.opt_n * int64_t(dtype_size(dtype_));
  e.src = d2h ? rt_.accelerator().trace_id() : rt_.host().trace_id();
  e.dst = d2h ? rt_.host().trace_id() : rt_.accelerator().trace_id();
  e.pinned = z_.pin_memory ? 1 : 0;
  e.name = rec_->intern(d2h ? p.part_grad.name() : "param_buffer_of_bit16_for_cpu_offload_groups[0]");
  e.t_start = e.t_end = probe::now_ns();
  rec_->transfer(e);
}

void ZeroEngine::charge_optimizer_state(const Part& p, bool on_host) {
  // At stages 0-2 the module's part lies in one flat partition (what decides bitsandbytes' 8-bit state).
  const std::vector<int64_t> handed = z_.stage == 3 ? std::vector<int64_t>{p.opt_n} : optimizer_step_tensors();
  const int64_t tensor = handed.size() == 1 ? handed[0] : p.opt_n;
  for (const MemoryTerm& t : optimizer_state_terms(opt_, p.spec.name, p.opt_n, tensor)) {
    if (charges_.count(t.name)) return;  // made already (a resumed run, a later step)
    MemoryOp op{true, t};
    op.host = on_host;
    charge(op);
    opt_state_bytes_ += t.bytes();
  }
}

std::vector<int64_t> ZeroEngine::optimizer_step_tensors() const {
  // DeepSpeed hands its optimizer flat fp32 partitions: at stages 1-2 one a param group (one group here),
  // at stage 0 in 16 bit FP16_Optimizer's flat group; at stage 0 in fp32 the model's own parameters.
  std::vector<int64_t> t;
  const bool flat = z_.stage > 0 || dtype_ != DType::F32;
  int64_t sum = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (parts_[i]->frozen) continue;
    if (flat) sum += parts_[i]->opt_n;
    else t.insert(t.end(), module_params_[i].begin(), module_params_[i].end());
  }
  if (flat && sum > 0) t.push_back(sum);
  return t;
}

void ZeroEngine::ds12_moments() {
  Device& host = rt_.host();
  for (auto& p : parts_) {
    if (p->frozen) continue;
    if (!adam_moments(opt_.impl)) {  // bitsandbytes', Adafactor's, SGD's state: made at the first step too
      charge_optimizer_state(*p, p->opt_host);
      continue;
    }
    if (p->m.defined()) continue;
    // FusedAdam's zeros_like of the fp32 master on the device; DeepSpeedCPUAdam's on the host, pageable.
    Device& where = p->opt_host ? host : rt_.accelerator();
    p->m = Tensor::zeros("adam.m[" + p->spec.name + "]", {p->opt_n}, DType::F32, where, false);
    p->v = Tensor::zeros("adam.v[" + p->spec.name + "]", {p->opt_n}, DType::F32, where, false);
  }
}

// AdamW writes the compute-dtype weights straight into a sharded module's host shard (no update
// buffer), except under the delayed update, whose next step reads the shards meanwhile.
bool ZeroEngine::adam_in_place(const Part& p, bool delayed) const {
  return !delayed && p.sharded && p.param_shard.device().is_host();
}

Tensor ZeroEngine::update_buffer(const Part& p) const {
  // DeepSpeed's is a pageable copy (the fp32 partition's .to() the compute dtype on the way up).
  return Tensor::empty(p.spec.name + ".update", {p.opt_n}, dtype_, rt_.host(), z_.pin_memory && !ds_layout_);
}

// The AdamW pass over pending_ on the background thread, in its order, counting the modules done
// (or saying it failed) under update_mu_ for the rank thread's waits: the overlapped update's
// await_update, the delayed update's early write-back.
void ZeroEngine::submit_pass(const optim::AdamParams& hp, int64_t step) {
  {
    std::lock_guard lock(update_mu_);
    updates_done_ = 0;
    update_failed_ = false;
  }
  const int64_t adam_step = adam_steps_;
  background_->submit([this, hp, step, adam_step] {
    try {
      for (size_t k = 0; k < pending_.size(); ++k) {
        background_->refresh_width(int64_t(k));
        run_adam(pending_[k], hp, step, adam_step);
        std::lock_guard lock(update_mu_);
        updates_done_ = k + 1;
        update_cv_.notify_all();
      }
    } catch (...) {
      {
        std::lock_guard lock(update_mu_);
        update_failed_ = true;
      }
      update_cv_.notify_all();
      throw;  // kept by the background thread, thrown by the wait in await_update/apply_update
    }
  });
}

// The delayed update's early write-back: each module whose AdamW has run since the last call and
// that has a second device shard gets its H2D copy into it now, on the rank thread (which alone
// queues device work), so the weights go up while the pass and the step go on instead of all after
// the apply's wait. Local copies only: a whole module's write-back (an all-gather) is collective
// and stays in the apply, where every rank calls it. Called at each fetch and from the apply.
void ZeroEngine::write_back_early() {
  if (!early_write_back_ || !update_pending() || early_next_ >= pending_.size()) return;
  size_t done;
  {
    std::lock_guard lock(update_mu_);
    done = updates_done_;
  }
  for (; early_next_ < done; ++early_next_) {
    const AdamJob& j = pending_[early_next_];
    Part& p = *parts_[size_t(j.mi)];
    if (!p.shard_next.defined()) continue;  // made only where the job writes an update buffer (fused)
    // The copy starts after the device work queued so far, the last reads of the shard's old
    // contents (the step before's fetches) among them.
    p.written_next = copy_into_async(p.shard_next, j.fused);
    p.next_filled = true;
  }
}

// One module's AdamW where its optimizer state lives (the vectorized CPU Adam on the host,
// bit-identical to the reference), writing the compute-dtype weights too when asked (DeepSpeed's
// fused copy). On the background thread under the delayed update: it touches the module's
// master weights and moments, the gradient partition and the output named in the job only.
void ZeroEngine::run_adam(const AdamJob& j, const optim::AdamParams& hp, int64_t step, int64_t adam_step) {
  Part& p = *parts_[size_t(j.mi)];
  // A partial offload's modules updated on the accelerator are "device adamw <module>": the
  // reports' "adamw <module>" phases are then the CPU AdamW's alone (its time, its rate).
  probe::MarkerId am = phase((z_.offload_optimizer && !p.opt_host ? "device adamw " : "adamw ") + p.spec.name, step);
  // The step count the kernel is handed. The fault optim.cpu_adam_error hands this module's CPU AdamW
  // a count of 0 (an optimizer state whose step was lost: a stand-in for any failure inside the step),
  // and the kernel's own check refuses it, as it would a real one. (The epoch is left out of the fault's
  // context: the rank thread may be changing it meanwhile.)
  const bool cpu = p.master.device().is_host();
  int64_t kernel_step = adam_step;
  if (cpu && ZT_FAIL_D("optim.cpu_adam_error", (fail::Context{rank_, step, -1, -1, rec_}),
                       "CPU AdamW of " + p.spec.name + " handed step count 0"))
    kernel_step = 0;
  try {
    if (virt_) {
      (void)optim::adam_consts(hp, kernel_step);  // sizes only: the kernel's checks without its math
    } else if (j.to_alt) {
      // AdamW during backward: out of place into the second state (the same kernel as the in-place
      // branches below, cpu_adam.h: bit for bit their values).
      const optim::GradDType gt = j.grad.dtype() == DType::F32    ? optim::GradDType::F32
                                  : j.grad.dtype() == DType::BF16 ? optim::GradDType::BF16
                                                                  : optim::GradDType::F16;
      optim::cpu_adamw_step_grads_into(p.master.f32(), p.m.f32(), p.v.f32(), p.master_alt.f32(), p.m_alt.f32(),
                                       p.v_alt.f32(), j.grad.raw(), gt, j.grad_scale, p.opt_n, hp, kernel_step,
                                       j.low_out, j.low);
    } else if (j.grad.dtype() == DType::F32 && j.grad_scale == 1.0f) {
      p.master.device().ops().adamw(p.master.f32(), j.grad.f32(), p.m.f32(), p.v.f32(), p.opt_n, hp, kernel_step,
                                    j.low_out, j.low);
    } else {
      // A partition with a factor to apply (unscale-and-clip), or kept in the compute dtype: on the
      // host, as the optimizer state is (the device check before the step saw to that), widened
      // and scaled inside the CPU AdamW's pass.
      if (!p.master.device().is_host() || !j.grad.device().is_host())
        throw std::logic_error("ZeroEngine: a scaled or " + std::string(dtype_name(j.grad.dtype())) +
                               " gradient partition needs the optimizer and the partition on the host");
      const optim::GradDType gt = j.grad.dtype() == DType::F32    ? optim::GradDType::F32
                                  : j.grad.dtype() == DType::BF16 ? optim::GradDType::BF16
                                                                  : optim::GradDType::F16;
      optim::cpu_adamw_step_grads(p.master.f32(), j.grad.raw(), gt, j.grad_scale, p.m.f32(), p.v.f32(), p.opt_n, hp,
                                  kernel_step, j.low_out, j.low);
    }
  } catch (const std::invalid_argument& e) {
    end(am);
    if (!cpu) throw;
    // The CPU AdamW raised (on whichever thread runs it): an error row, as every failure the trace
    // explains has, then the run ends with it.
    const std::string message = "CPU AdamW of " + p.spec.name + " at step " + std::to_string(step) + " failed: " + e.what();
    if (rec_) {
      db::ErrorRow row;
      row.rank = rank_;
      row.step = step;
      row.kind = "cpu_adam_error";
      row.site = "adamw " + p.spec.name;
      row.message = message;
      rec_->error(row);
    }
    throw std::runtime_error(message);
  } catch (...) {
    end(am);
    throw;
  }
  end(am);
}

// The delayed update in flight, if any: its AdamW pass finished, then each module's updated
// weights written back where the parameters live (the all-gathers of whole modules included).
void ZeroEngine::apply_update(int64_t at_step) {
  if (!update_pending()) return;
  if (cfg_.overlap_update) {
    // Each module not yet used since: awaited and written back now (in the job's order; a pass during
    // backward's in the forward's).
    std::vector<int> due;
    if (early_.live) {
      due = early_.forward_order;
    } else {
      for (const AdamJob& j : pending_) due.push_back(j.mi);
    }
    for (int mi : due) await_update(mi);
    background_->wait();  // finished: every module's AdamW was awaited
    pending_.clear();
    early_.live = false;
    // Nothing of it is on its way up any more (ordered, then waited for: see optimizer_step).
    for (auto& p : parts_) p->written.wait();
    rt_.accelerator().ops().synchronize();
    return;
  }
  probe::MarkerId ph = phase("apply delayed update of step " + std::to_string(pending_step_), at_step);
  // The step's host->device copies read the host parameter shards the write-back overwrites, and
  // the write-backs of the update before read the update buffers the job after this one writes:
  // all of them finish first.
  for (auto& p : parts_) p->written.wait();
  rt_.accelerator().ops().synchronize();
  try {
    if (early_write_back_) {
      // Each module's weights go up as soon as its AdamW has run (most of them finish during this
      // wait when the pass is longer than the step beside it).
      BackgroundThread::Waiting waiting(*background_, INT64_MAX);
      for (;;) {
        write_back_early();
        if (early_next_ >= pending_.size()) break;  // every module's copy is on its way
        if (!wait_updates_past(early_next_)) break;  // the pass failed: the wait below throws its error
      }
    }
    background_->wait();  // only then is pending_ the rank thread's again: the job reads it
  } catch (...) {
    // An early copy that failed leaves the pass running: it reads pending_ until it ends.
    if (background_->pending()) {
      try {
        background_->wait();
      } catch (...) {
        // the copy's error is the one reported
      }
    }
    pending_.clear();
    for (auto& p : parts_) p->next_filled = false;  // a failed update is not swapped in, ever
    end(ph);
    throw;
  }
  const std::vector<AdamJob> jobs = std::move(pending_);
  pending_.clear();
  for (const AdamJob& j : jobs) {
    Part& p = *parts_[size_t(j.mi)];
    if (p.next_filled) {
      // Already on its way up into the second shard: that one is the shard from now on (the next
      // fetch waits on the device for the copy), and the old one takes the next update.
      std::swap(p.param_shard, p.shard_next);
      p.written = std::move(p.written_next);
      p.next_filled = false;
    } else if (!j.in_place) {
      write_back(j.mi, j.fused, true);
    }
  }
  end(ph);
}

void ZeroEngine::finish_update() { apply_update(pending_step_); }

bool ZeroEngine::wait_updates_past(size_t k) {
  std::unique_lock lock(update_mu_);
  update_cv_.wait(lock, [&] { return updates_done_ > k || update_failed_; });
  return updates_done_ > k;
}

bool ZeroEngine::update_finished(const Part& p) {
  if (!p.update_due) return true;
  std::lock_guard lock(update_mu_);
  if (early_.live) return early_.done[size_t(p.spec.index)] != 0;
  return updates_done_ > update_pos_[size_t(p.spec.index)];
}

void ZeroEngine::await_update(int mi) {
  Part& p = *parts_[size_t(mi)];
  if (!p.update_due) return;
  if (early_.live && !early_.committed)
    throw std::logic_error("ZeroEngine: module " + p.spec.name + " used before its AdamW during backward was decided");
  probe::MarkerId ph = phase("await update " + p.spec.name, step_now_);
  bool failed = false;
  if (early_.live) {
    // AdamW during backward: the pass takes the rest in the forward's order; while the rank thread
    // waits, the pieces under way take its threads too.
    BackgroundThread::Waiting waiting(*background_, INT64_MAX);
    std::unique_lock lock(update_mu_);
    update_cv_.wait(lock, [&] { return early_.done[size_t(mi)] || update_failed_; });
    failed = !early_.done[size_t(mi)];
  } else {
    const size_t k = update_pos_[size_t(mi)];
    // The pass may take the rank's threads for the modules up to this one (not those after it: the
    // rank thread computes again once this one is done).
    BackgroundThread::Waiting waiting(*background_, int64_t(k));
    failed = !wait_updates_past(k);  // this module's AdamW never ran (a later module's failure waits for its own)
  }
  if (failed) {
    // The job stopped at this or an earlier module's AdamW: its error, thrown by the wait; no
    // update is due now.
    for (auto& q : parts_) q->update_due = false;
    early_.live = false;
    try {
      background_->wait();
    } catch (...) {
      pending_.clear();
      end(ph);
      throw;
    }
    pending_.clear();
    end(ph);
    throw std::logic_error("ZeroEngine: the overlapped update failed without an error");
  }
  end(ph);
  // The write-back (a host copy, an H2D copy the gather waits for on the device, or the all-gather
  // of a whole module) is the ordinary update's, outside the wait's marker.
  p.update_due = false;
  if (early_.live) {
    // The updated state is the second one: it becomes the state (the first takes the next update).
    std::swap(p.master, p.master_alt);
    std::swap(p.m, p.m_alt);
    std::swap(p.v, p.v_alt);
    write_back(mi, early_.jobs[size_t(mi)].fused, true);
    return;
  }
  const AdamJob& j = pending_[update_pos_[size_t(mi)]];
  if (!j.in_place) write_back(mi, j.fused, true);
}

// AdamW during backward (engine.h): module p's gradient partition has landed on the host during
// backward. Its job (the partition, the factor the step has unless it clips, out of place into the
// second state, the compute-dtype update into update[0], never in place) joins the pass, which the
// first landing of the step starts on the background thread.
void ZeroEngine::early_landed(Part& p) {
  const size_t mi = size_t(p.spec.index);
  if (!p.opt_host) return;
  if (!early_now()) {
    // The step before's pass has no module left to await (the forward used every one): it ends now.
    // Its write-backs out of the update buffers have landed: each module's gather waited for its own
    // on the device before the backward whose partitions land here.
    apply_update(step_now_);
    std::fill(early_.landed.begin(), early_.landed.end(), 0);
    std::fill(early_.taken.begin(), early_.taken.end(), 0);
    std::fill(early_.done.begin(), early_.done.end(), 0);
    early_.queue.clear();
    early_.all_landed = early_.abort = early_.committed = early_.stopped = false;
    early_.sq = 0;
    early_.step = step_now_;
    // The factor the optimizer step gives a host partition unless it clips (unscale_and_clip_grads).
    early_.factor = loss_scale_ != 1.0 ? float(1.0 / loss_scale_) : 1.0f;
    early_.forward_order.clear();
    std::vector<char> seen(parts_.size(), 0);
    for (int m : order_)
      if (!seen[size_t(m)]) seen[size_t(m)] = 1, early_.forward_order.push_back(m);
    for (size_t m = 0; m < parts_.size(); ++m)
      if (!seen[m]) early_.forward_order.push_back(int(m));
    {
      std::lock_guard lock(update_mu_);
      updates_done_ = 0;
      update_failed_ = false;
    }
    early_.live = true;
    const optim::AdamParams hp{cfg_.lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay};
    const int64_t step = early_.step, adam_step = adam_steps_ + 1;
    background_->submit([this, hp, step, adam_step] {
      for (int64_t k = 0;; ++k) {
        int m = -1;
        {
          std::unique_lock lock(update_mu_);
          auto next = [&] {
            if (early_.all_landed) {
              for (int f : early_.forward_order)
                if (early_.landed[size_t(f)] && !early_.taken[size_t(f)]) return f;
              return -1;
            }
            while (!early_.queue.empty() && early_.taken[size_t(early_.queue.front())]) early_.queue.pop_front();
            return early_.queue.empty() ? -1 : early_.queue.front();
          };
          update_cv_.wait(lock, [&] { return early_.abort || early_.all_landed || next() >= 0; });
          if (early_.abort) return;
          m = next();
          if (m < 0) return;  // every partition landed and taken
          early_.taken[size_t(m)] = 1;
        }
        background_->refresh_width(k);
        try {
          run_adam(early_.jobs[size_t(m)], hp, step, adam_step);
        } catch (...) {
          {
            std::lock_guard lock(update_mu_);
            update_failed_ = true;
          }
          update_cv_.notify_all();
          throw;  // kept by the background thread, thrown by the wait in await_update/abort_early
        }
        std::lock_guard lock(update_mu_);
        early_.done[size_t(m)] = 1;
        ++updates_done_;
        update_cv_.notify_all();
      }
    });
  }
  AdamJob j;
  j.mi = int(mi);
  j.grad = p.part_grad;
  j.grad_scale = early_.factor;
  j.to_alt = true;
  if (dtype_ != DType::F32) {
    j.low = dtype_ == DType::BF16 ? optim::LowDType::BF16 : optim::LowDType::F16;
    j.fused = p.update[0];
    j.low_out = j.fused.raw();
  }
  p.update_due = true;
  // The partitions landed so far already make this rank's part of the global norm clip: the step
  // clips (the other ranks' parts only add to it), so the pass takes no more modules (a soft stop:
  // the optimizer step then throws it away as it does a clipped one, whatever the norm says).
  if (cfg_.grad_clip > 0 && p.part_grad_sq_ready) {
    early_.sq += p.part_grad_sq;
    if ((std::sqrt(early_.sq) / loss_scale_ + 1e-6) / cfg_.grad_clip > 1.0 + 1e-4) early_.stopped = true;
  }
  std::lock_guard lock(update_mu_);
  early_.jobs[mi] = std::move(j);
  early_.landed[mi] = 1;
  early_.queue.push_back(int(mi));
  if (early_.stopped) early_.abort = true;
  update_cv_.notify_all();
}

void ZeroEngine::abort_early(bool quiet) {
  {
    std::lock_guard lock(update_mu_);
    early_.abort = true;
  }
  update_cv_.notify_all();
  for (auto& p : parts_)
    if (p->opt_host) p->update_due = false;  // nothing of it is swapped in, ever
  early_.live = false;
  early_.committed = false;
  try {
    background_->wait();
  } catch (...) {
    if (!quiet) throw;
  }
}

void ZeroEngine::require_no_pending_update(const char* what) const {
  if (update_pending())
    throw std::logic_error(std::string("ZeroEngine::") + what + ": the " + (cfg_.overlap_update ? "overlapped" : "delayed") +
                           " update of step " +
                           std::to_string(pending_step_) + " is still in flight: call finish_update() first");
}

// ---------------------------------------------------------------- faults at the boundary

void ZeroEngine::on_epoch_boundary(int64_t epoch, int64_t global_step) {
  epoch_ = epoch;
  fail::set_thread_position({rank_, global_step, -1, epoch, rec_});
  // host.epoch_leak (R1): the offload buffers are to be re-created at the next accumulation
  // boundary, when the gradients are next offloaded, and the old ones are never released. Not where
  // a partial offload (offload_ratio 0) offloads no module: it would leak nothing.
  if (z_.offload_optimizer && offloaded_modules().first == 0) return;
  if (auto f = ZT_FAIL_D("host.epoch_leak", fail::Context{},
                         "offload buffers to be re-created at the next accumulation boundary, the old ones kept")) {
    const std::string v = f->arg.empty() ? "pinned" : f->arg;
    if (v != "pinned" && v != "pow2" && v != "fork")
      throw std::invalid_argument("fault host.epoch_leak: variant '" + v + "': use pinned, pow2 or fork");
    leak_pending_ = v;
  }
}

bool ZeroEngine::has_sharded_modules() const {
  for (const auto& p : parts_)
    if (p->sharded) return true;
  return false;
}

// At the start of the boundary micro-step (the last of the accumulation window).
void ZeroEngine::boundary_faults(int64_t step) {
  // Nothing offloaded (no offload_optimizer, or offload_ratio 0): neither fault has anything to act on.
  const auto [offloaded, modules] = offloaded_modules();
  if (offloaded == 0) return;
  if (auto f = ZT_FAIL_D("zero.grad_partition_stays_on_device", fail::Context{},
                         "an fp32 gradient partition left on " + rt_.accelerator().label())) {
    // The offloaded modules are the last ones (offload_ratio): by default the last of them.
    int64_t idx = int64_t(parts_.size()) - 1;
    if (!f->arg.empty()) {
      if (const std::string why = stays_on_device_module_problem(f->arg, z_, modules); !why.empty())
        throw std::invalid_argument("fault zero.grad_partition_stays_on_device: " + why);
      idx = std::strtoll(f->arg.c_str(), nullptr, 10);
    }
    stays_on_device_ = int(idx);
  }
  if (!leak_pending_.empty()) {
    leak_active_ = leak_pending_;
    leak_pending_.clear();
    if (leak_active_ == "pow2") {
      // The partitions re-created as one flat pinned buffer: the pinned cache rounds the
      // request up to a power of two and keeps it; the per-module buffers stay as they were.
      int64_t n = 0;
      for (const auto& p : parts_)
        if (p->opt_host) n += p->opt_n;
      leaked_.push_back(Tensor::empty("fp32_partitioned_groups_flat.grad (re-created at epoch " +
                                          std::to_string(epoch_) + ")",
                                      {n}, part_grad_dtype_, rt_.host(), true));
      fail::record("host.epoch_leak", fail::Context{rank_, -1, -1, epoch_, rec_}, "epoch boundary",
                   "re-created one flat pinned buffer of " + std::to_string(n * int64_t(dtype_size(part_grad_dtype_))) +
                       " bytes; the old ones kept");
    }
  }
}

void ZeroEngine::end_boundary() {
  for (auto& p : parts_) p->grad32_dev.reset();
  stays_on_device_ = -1;
  leak_active_.clear();
}

const Tensor& ZeroEngine::opt_grad_of(int mi) const {
  const Part& p = *parts_[size_t(mi)];
  return p.grad32_dev.defined() ? p.grad32_dev : p.part_grad;
}

void ZeroEngine::offload_grad(int mi, const Tensor& grad, int64_t step) {
  Part& p = *parts_[size_t(mi)];
  await_update(mi);  // the overlapped update's AdamW reads the partition this overwrites
  p.part_grad_sq_ready = false;  // summed again when this partition lands (finish_offload)
  Device& host = rt_.host();
  const std::string group = part_grad_name(p.spec.index, DType::F32);
  if (mi == stays_on_device_) {
    // zero.grad_partition_stays_on_device: this partition is made on the device and never
    // offloaded; the optimizer's ops then meet it beside host partitions.
    p.grad32_dev = Tensor::empty(group, {p.opt_n}, DType::F32, rt_.accelerator());
    if (p.grad32_dev.raw() && grad.raw()) read_into(grad, 0, p.grad32_dev.f32(), p.opt_n);
    return;
  }
  if (leak_active_ == "pinned") {
    // host.epoch_leak: a new pinned buffer for the partition; the old one stays allocated.
    leaked_.push_back(p.part_grad);
    p.part_grad = Tensor::empty(p.part_grad.name(), {p.opt_n}, part_grad_dtype_, host, z_.pin_memory);
  } else if (leak_active_ == "fork") {
    // host.epoch_leak(fork): data-loader workers forked at the epoch start share the parent's
    // heap copy-on-write; writing the partition now gives each worker its own copy.
    constexpr int kWorkers = 2;
    for (int w = 0; w < kWorkers; ++w)
      leaked_.push_back(Tensor::empty("dataloader.worker" + std::to_string(w) + " copy-on-write of " +
                                          p.part_grad.name(),
                                      {p.opt_n}, part_grad_dtype_, host, false));
  }
  if (!leak_active_.empty() || !grad.raw()) {
    copy_into(p.part_grad, grad);  // D2H, upcast to fp32 on the host (unless kept in the compute dtype)
    if (cfg_.adam_in_backward) early_landed(p);
    return;
  }
  // D2H on the copy lane, overlapping what follows (the rest of backward), in the compute dtype
  // (half the bytes of fp32 over the link for bf16/fp16) into a pinned staging buffer, widened
  // into the fp32 partition on the host once it has landed (land_offloads); straight into the
  // partition when it has the gradient's dtype (fp32, or grad_partition_dtype compute). Two in
  // flight at most (double buffering): the older one finishes before a third starts.
  land_offloads(1);
  Offload o;
  o.part = &p;
  if (grad.dtype() == p.part_grad.dtype()) {
    o.copy = copy_into_async(p.part_grad, grad);
  } else {
    o.staging = Tensor::empty("grad.from_device[" + p.spec.name + "]", {p.opt_n}, grad.dtype(), host, z_.pin_memory);
    o.copy = copy_into_async(o.staging, grad);
  }
  offloads_.push_back(std::move(o));
}

// The updated fp32 weights, in the compute dtype, back where the parameters live. `fused`,
// when defined, already holds them in the compute dtype on the host (from the Adam pass). With
// `async` (the delayed update, whose `fused` is a buffer of the engine's), a device parameter
// shard's copy goes up on the H2D lane while the host goes on; the next fetch of the module waits
// for it on the device.
void ZeroEngine::write_back(int mi, const Tensor& fused, bool async) {
  Part& p = *parts_[size_t(mi)];
  p.written.wait();  // a write-back still on its way into the shard lands before this one
  Device& accel = rt_.accelerator();
  Device& host = rt_.host();
  const bool master_on_host = p.master.device().is_host();
  auto host_low = [&]() {
    if (fused.defined()) return fused;
    Tensor low = Tensor::empty(p.spec.name + ".update", {p.shard}, dtype_, host, z_.pin_memory);
    set_from(low, 0, p.master.f32(), p.shard);
    return low;
  };
  auto updated_on_accel = [&]() {
    // Convert where the master lives; cross to the device with one copy when it is the host.
    if (master_on_host) return copy_to(host_low(), accel, false, p.spec.name + ".update");  // H2D
    Tensor low = Tensor::empty(p.spec.name + ".update", {p.shard}, dtype_, accel);
    set_from(low, 0, p.master.f32(), p.shard);
    return low;
  };
  if (p.sharded) {
    if (fused.defined() && p.param_shard.device().is_host()) {
      if (fused.raw()) host_ops().copy(p.param_shard.raw(), fused.raw(), fused.bytes());  // the delayed update's own buffer
    } else if (p.param_shard.device().is_host() == master_on_host) {
      set_from(p.param_shard, 0, p.master.f32(), p.shard);
    } else if (async && fused.defined()) {
      p.written = copy_into_async(p.param_shard, fused);  // H2D, waited for by gather()
    } else {
      // Converted where the master lives, then one copy across: up into a device shard, or down
      // into a host shard (offload_param) whose optimizer state is on the accelerator (offload_param
      // alone, or a partial offload).
      Tensor low = master_on_host ? host_low() : updated_on_accel();
      copy_into(p.param_shard, low);  // H2D or D2H
    }
  } else if (z_.stage == 0) {
    set_from(p.param, 0, p.master.f32(), p.padded);
  } else if (ds12_) {
    // DeepSpeed's stages 1-2: the fp32 partition copied in place into the 16-bit one (through the host
    // 16-bit buffer under offload), then all_gather_into_tensor into the flat buffer: no new memory.
    ds12_transfer(mi, false);
    comm_.all_gather(nullptr, nullptr, size_t(p.shard) * dtype_size(dtype_), p.spec.name + ".param");
  } else {
    Tensor upd = updated_on_accel();
    comm_.all_gather(upd.raw(), p.param.raw(), size_t(p.shard) * dtype_size(dtype_), p.spec.name + ".param");
  }
}

// ---------------------------------------------------------------- checkpoint state (issue 5)

std::vector<ZeroEngine::ModuleLayout> ZeroEngine::checkpoint_layout() const {
  std::vector<ModuleLayout> out;
  for (const auto& p : parts_)
    out.push_back({p->spec.index, p->spec.name, p->spec.numel, p->padded, p->shard, p->opt_lo, p->opt_n});
  return out;
}

ZeroEngine::OptimizerScalars ZeroEngine::checkpoint_scalars() const {
  return {adam_steps_, good_steps_, hysteresis_left_, loss_scale_};
}

void ZeroEngine::export_states(const StateVisitor& visit) {
  require_no_pending_update("export_states");
  const std::vector<ModuleLayout> layout = checkpoint_layout();
  Device& host = rt_.host();
  for (size_t mi = 0; mi < parts_.size(); ++mi) {
    Part& p = *parts_[mi];
    if (p.frozen) {  // no optimizer state (opt_n 0)
      visit(layout[mi], nullptr, nullptr, nullptr);
      continue;
    }
    if (!p.m.defined()) {  // DeepSpeed's stages 1-2 before the first step (ds12_): no moments yet
      visit(layout[mi], nullptr, nullptr, nullptr);
      continue;
    }
    if (p.master.device().is_host()) {
      visit(layout[mi], p.master.f32(), p.m.f32(), p.v.f32());
      continue;
    }
    // A real save copies device-resident optimizer state to the host first: one module at a time.
    Tensor master = copy_to(p.master, host), m = copy_to(p.m, host), v = copy_to(p.v, host);  // D2H
    visit(layout[mi], master.f32(), m.f32(), v.f32());
  }
}

void ZeroEngine::import_states(const OptimizerScalars& scalars, const StateFiller& fill) {
  require_no_pending_update("import_states");
  if (ds12_) ds12_moments();  // a resumed optimizer has its moments
  const std::vector<ModuleLayout> layout = checkpoint_layout();
  Device& host = rt_.host();
  for (size_t mi = 0; mi < parts_.size(); ++mi) {
    Part& p = *parts_[mi];
    if (p.frozen) continue;  // no optimizer state to restore
    if (p.master.device().is_host()) {
      fill(layout[mi], p.master.f32(), p.m.f32(), p.v.f32());
      continue;
    }
    const std::string& n = p.spec.name;
    Tensor master = Tensor::empty(p.master.name() + ".loaded", {p.opt_n}, DType::F32, host);
    Tensor m = Tensor::empty("adam.m[" + n + "].loaded", {p.opt_n}, DType::F32, host);
    Tensor v = Tensor::empty("adam.v[" + n + "].loaded", {p.opt_n}, DType::F32, host);
    fill(layout[mi], master.f32(), m.f32(), v.f32());
    copy_into(p.master, master);  // H2D
    copy_into(p.m, m);
    copy_into(p.v, v);
  }
  adam_steps_ = scalars.adam_steps;
  good_steps_ = scalars.good_steps;
  hysteresis_left_ = scalars.hysteresis_left;
  loss_scale_ = scalars.loss_scale;
  for (size_t mi = 0; mi < parts_.size(); ++mi) {
    if (parts_[mi]->frozen) continue;  // its weights are the loaded ones: nothing to rebuild
    zero_tensor(parts_[mi]->grad);
    write_back(int(mi), Tensor());  // collective at stages 1-3 (all-gather of the updated shard)
  }
}

ZeroEngine::GatherStats ZeroEngine::gather_weights(WeightsGather how, bool to_host, const WeightsVisitor& visit) {
  require_no_pending_update("gather_weights");
  for (auto& p : parts_) p->written.wait();  // the last update's write-backs, before the shards are read
  const std::vector<ModuleLayout> layout = checkpoint_layout();
  Device& accel = rt_.accelerator();
  Device& host = rt_.host();
  GatherStats st;
  int64_t live = 0;  // temporary device bytes alive now
  auto track = [&](int64_t delta) {
    live += delta;
    st.peak_temp_device_bytes = std::max(st.peak_temp_device_bytes, live);
  };
  // A sharded module, whole on this rank's device.
  auto gather_module = [&](Part& p) {
    const std::string& n = p.spec.name;
    Tensor staged;
    if (p.param_shard.device().is_host() && !accel.is_host()) {
      staged = copy_to(p.param_shard, accel, false, "save." + n + ".shard");  // H2D
      track(int64_t(staged.bytes()));
    }
    const Tensor& src = staged.defined() ? staged : p.param_shard;
    Tensor g = Tensor::empty("save.gathered[" + n + "]", {p.padded}, dtype_, accel);
    track(int64_t(g.bytes()));
    comm_.all_gather(src.raw(), g.raw(), size_t(p.shard) * dtype_size(dtype_), "save.gathered[" + n + "]");
    if (staged.defined()) {
      track(-int64_t(staged.bytes()));
      staged.reset();
    }
    ++st.gathered_modules;
    return g;
  };
  // Rank 0's host buffers, one per module size (the blocks share one), reused as the modules
  // pass: a copy of the whole model would be host memory the save does not need.
  std::map<int64_t, Tensor> host_bufs;
  auto deliver = [&](size_t mi, const Tensor& whole) {
    if (!to_host) return;
    Tensor& h = host_bufs[whole.numel()];
    if (!h.defined()) h = Tensor::empty("save.weights[" + std::to_string(whole.numel()) + "]", {whole.numel()}, dtype_, host);
    copy_into(h, whole);  // D2H
    visit(layout[mi], h.raw());
  };
  if (how == WeightsGather::Device) {
    std::vector<Tensor> gathered(parts_.size());
    for (size_t mi = 0; mi < parts_.size(); ++mi)
      if (parts_[mi]->sharded) gathered[mi] = gather_module(*parts_[mi]);
    for (size_t mi = 0; mi < parts_.size(); ++mi) deliver(mi, gathered[mi].defined() ? gathered[mi] : parts_[mi]->param);
  } else {
    for (size_t mi = 0; mi < parts_.size(); ++mi) {
      Part& p = *parts_[mi];
      if (!p.sharded) {
        deliver(mi, p.param);
        continue;
      }
      Tensor g = gather_module(p);
      deliver(mi, g);
      track(-int64_t(g.bytes()));
    }
  }
  return st;
}

}  // namespace zt::trainer
