// trainer/zero/engine.h: the ZeRO engine of one rank: stages 0-3, optimizer and parameter
// offload, mixed precision, gradient accumulation, the global norm and unscale-and-clip.
//
// Owns: the rank's model states as named tensors, partitioned per module (embeddings, each
// block, final LayerNorm): each module's flat parameters are padded to a multiple of the
// world size and split into equal shards. What each rank keeps, by stage (W ranks, P params,
// p = compute-dtype bytes):
//   stage 0  params P*p, grads P*p, fp32 master + Adam m + v 12P        (all replicated)
//   stage 1  params P*p, grads P*p, optimizer 12P/W                     (optimizer sharded)
//   stage 2  params P*p, grads P*p/W, optimizer 12P/W                   (+ gradients)
//   stage 3  params P*p/W, grads P*p/W, optimizer 12P/W                 (+ parameters)
// plus, when the compute dtype is not fp32, an fp32 gradient partition for the optimizer
// (on the host with offload_optimizer: DeepSpeed's fp32_partitioned_groups_flat[i].grad; kept in
// the compute dtype instead, NAME.grad.bf16, under cfg.grad_partition_dtype compute, where AdamW
// widens it and applies the unscale-and-clip factor in its own pass: the same arithmetic); the
// delayed update (below) keeps a second one (counted in model_state_bytes) and two compute-dtype
// update buffers per module on the host (2 x 2 bytes per parameter of the partition in bf16/fp16;
// not counted: staging, as the ordinary step's per-step update buffers are).
// Modules smaller than the persistence threshold keep whole parameters on every rank.
// A partial optimizer offload (offload_ratio < 1, stage 3: DeepSpeed's offload_optimizer.ratio,
// ZeRO-Offload++) keeps the optimizer state of the first int((1 - ratio) * modules) modules (its
// sub-groups are modules here) on the accelerator: their partitions stay there, the device AdamW
// updates them in the optimizer step on the rank thread ("device adamw <module>", never delayed or
// run beside the next step), and the clip scale, a 0-dim host tensor, serves them as a CPU scalar.
// The rest are offloaded as above.
//
// Stage 3 fetches a module before its forward or backward (host->device copy of the shard
// when offload_param, then all-gather; in a world of one the device shard is the module, used as
// it is, as DeepSpeed's fetch is a view there), and releases it after use unless it is reused
// within max_reuse_distance; the order of modules seen in the first step drives prefetching
// (up to the prefetch bucket, below max_live_parameters) from the second step on.
// Gradients are reduce-scattered per module (stages 2, 3) or at the accumulation boundary
// (all-reduce at stage 0, reduce-scatter at stage 1) and averaged over ranks.
// Transfers overlap compute on the accelerator's copy lanes (core/backend.h): under
// offload_param the prefetch starts the next modules' host->device shard copies while the
// current module computes (each is all-gathered when fetched), and under offload_optimizer each
// module's gradient partition goes to the host during the rest of backward (two in flight at
// most) and lands there (widened to fp32, its sum of squares taken for the global norm) while the
// module after next computes its backward (so each copy has a module's backward to run beside);
// the optimizer step waits for the last two. Its phases:
// "gradients landed", "global_grad_norm", "unscale_and_clip_grads", "adamw <module>" (each
// followed by that module's write-back). The trace's transfer rows carry the copies' real
// times, so the overlap shows against the compute markers.
//
// Delayed parameter update (cfg.delayed_update = N >= 0, ZeRO-Offload's DPU; offload_optimizer):
// from step N on (counted from 0), a step's "adamw <module>" phases run on a background thread (background.h)
// while the rank thread goes on with the next step's forward and backward, which use the
// weights as they were before that update. That next step's optimizer phase first applies it
// ("apply delayed update": waits for the AdamW pass, then writes every module's updated
// weights back), then starts its own. So step s+1's gradients are taken at the weights of
// step s-1's update: one update stale, as in the paper. The fp32 gradient partitions on the
// host are double-buffered (AdamW reads one while backward lands the next step's in the other),
// and the compute-dtype update of each module goes to a host buffer of its own, two taken in turn
// (the parameter shards on the host are read by the next step's prefetch meanwhile). Into
// device parameter shards the write-back is asynchronous and early: each module whose AdamW has
// run gets its H2D copy into a second device shard (shard_next: 2 bytes a parameter of the
// compute dtype more, counted in model_state_bytes) at the rank thread's next fetch, or during
// the apply's wait as the pass goes on, while the step under way still reads the shard; the apply
// swaps the two, and each module's next fetch waits for its copy on the device. A whole module's
// write-back (an all-gather: collective) stays in the apply. ZT_EARLY_WRITE_BACK=0 gives the
// earlier way: every copy into the shard itself, made by the apply after the whole pass, running
// while the next step starts. finish_update() applies
// an update still in flight: a checkpoint save and the end of a run call it, so a save is a
// sync point and a run resumed from it continues exactly as the run that saved it.
//
// The overlapped update (cfg.overlap_update; offload_optimizer) uses the same background thread
// and buffers, without the staleness: a step's AdamW pass runs module by module in the order the
// forward first uses them (the recorded fetch order), and the rank thread goes on with the next
// step; each module's first use there (its fetch, prefetch, host->device staging, or its next
// gradient partition landing) waits for that module's AdamW ("await update <module>"), then
// writes its weights back. The next forward thus computes on exactly the weights of the ordinary
// update, and the losses are the ordinary run's bit for bit; the AdamW of every module but the
// first runs under the forward of the modules before it. The gradient partitions need no second
// buffer: a module's next partition lands only after its update was awaited, and the compute-dtype
// update one buffer per module: the pass starts after the last write-back out of it has landed.
//
// AdamW during backward (cfg.adam_in_backward, with the overlapped update; stages 2-3): a module's
// gradient partition is final once it has landed on the host during backward, so its AdamW starts
// then, on the same background thread (early_landed), beside the rest of backward, while the step's
// global norm is not yet known. It applies the factor the step will have unless it clips (1 /
// loss_scale) and writes the updated master weights and moments out of place, into the module's
// second fp32 state (master_alt, m_alt, v_alt: 12 bytes a parameter of host memory, counted in
// model_state_bytes), its compute-dtype update into update[0]; the state it read stays as it was.
// Once every partition has landed, the pass takes the modules left in the forward's order. The
// optimizer step then decides: nothing clipped and the norm finite, the update stands, and each
// module's first use in the next step awaits its AdamW, swaps the two states and writes it back (the
// ordinary update, bit for bit: the same kernel on the same values, cpu_adam.h); clipped, the pass is
// stopped and thrown away, and the overlapped update's pass runs from the state kept (the AdamW of
// the modules done early ran twice: the cost of the steps that clip; the pass stops taking modules as
// soon as the partitions landed on this rank alone make the step clip); not finite, thrown away and
// the step skipped. A module's write-back out of update[0] has landed before its next partition does (its
// gather waited on the device for it, before the backward whose partition that is).
//
// Memory as PyTorch + DeepSpeed keep it (zero/ds_memory.h, issue 33): where the passes do not
// allocate their activations on the device themselves (virtual mode; the simulated GPU, whose CPU
// reference keeps its workspace on the host), the device is charged what autograd would keep, as
// named tensors made and freed with each pass (block3.mlp.act, lm_head.log_softmax, grad.hidden, ...),
// and at stage 3 with W > 1 the parameters below the persistence threshold whole (NAME.persistent).
// In virtual mode at stages 1-2 (and at stage 0 in bf16/fp16) it takes DeepSpeed's gradients and step
// term by term (ds_memory.h's Ds12Gradients and ds0_*: compute-dtype IPG buffers, grads_in_partition, the
// step's fp32 gradient partition; issue 41), not our fp32 buckets.
// In virtual mode at stage 3 the engine takes DeepSpeed's layout for the rest too: module gradients
// into the ipg bucket and its flushes instead of our fp32 buckets, the gradient partitions on the
// host under optimizer offload, the fp32 master weights and moments pageable. A real GPU's passes
// get one `activations` tensor they carve up; what our fp32 compute needs beside (fp32 upcasts of
// the gathered weights, fp32 gradient buckets) stays ours on the simulated and the real GPU.
//
// The global norm and unscale_and_clip_grads are an explicit step: the norm is a tensor on
// the host under offload_optimizer and on the device otherwise; when clipping is active the
// combined scale is a tensor on the norm's device, and every gradient partition passes the
// device guard before it is scaled: in place on the device; on the host (optimizer offload) by the
// CPU AdamW, which multiplies each element by the factor in its own pass (the same fp32 multiply,
// bit for bit, without a pass of its own over every partition: 18 ms a step at 124M on the
// simulated GPU here). That is where DeepSpeed 0.14.1-0.14.2 put a device scalar against host
// partitions (bug reports R2 and R5).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "data/corpus.h"
#include "model/gpt2.h"
#include "model/layout.h"
#include "train/rank_runtime.h"
#include "train/train_config.h"
#include "zero/background.h"
#include "zero/communicator.h"
#include "zero/ds_memory.h"
#include "zero/optimizer_memory.h"

namespace zt::trainer {

struct StepResult {
  double loss = 0;        // mean over micro-steps and ranks
  double grad_norm = 0;   // global, unscaled
  double loss_scale = 1;
  bool skipped = false;   // fp16 overflow: no update
  bool clipped = false;
};

class ZeroEngine {
 public:
  ZeroEngine(const TrainConfig& cfg, const model::Config& mc, int B, int T, RankRuntime& rt, Communicator& comm);
  ~ZeroEngine();

  // One optimizer step over cfg.grad_accum micro-batches of this rank.
  StepResult step(DataLoader& loader, int64_t epoch, int64_t step_in_epoch, int64_t global_step);

  const ZeroSettings& settings() const { return z_; }
  // The delayed (or overlapped) parameter update still in flight, if any: waited for (its error
  // thrown) and written back. Collective at stages 1-3 when an update is pending (the write-back all-gathers
  // whole modules): every rank calls it at the same point. export_states, import_states and
  // gather_weights below need none pending (they throw std::logic_error otherwise).
  void finish_update();
  bool update_pending() const { return background_ && background_->pending(); }
  // The epoch boundary: called by the run before the first step of each epoch after the
  // first. Where the fault host.epoch_leak (R1) re-creates the offload buffers.
  void on_epoch_boundary(int64_t epoch, int64_t global_step);
  // Bytes of model states (params, grads, optimizer) this rank holds, by the rule above.
  int64_t model_state_bytes() const;
  // How many modules have their optimizer state on the host (offload_optimizer, offload_ratio), of all.
  std::pair<int, int> offloaded_modules() const;
  // Model loading (cfg.from_pretrained): the checkpoint's bytes in its dtype, and the host memory
  // this rank held at most while it loaded (the model, and the shards placed meanwhile).
  struct LoadReport {
    bool on = false, zero_init = false;
    int64_t model_bytes = 0, host_peak_bytes = 0;
  };
  const LoadReport& load_report() const { return load_; }
  // Parameters that train and that are frozen (cfg.finetuning), over the modules.
  std::pair<int64_t, int64_t> trainable_and_frozen() const;
  // An evaluation (cfg.eval_steps): ceil(eval_samples / (eval_batch x world)) micro-batches, forward
  // only through the same fetch and release of the modules; each batch's activations and logits are
  // freed after it unless eval_keep_logits keeps the logits (gathered from every rank) on the device,
  // moved to the host every eval_accumulation_steps batches; all freed at its end. Collective.
  // Returns the mean loss (NaN in virtual mode).
  double evaluate(DataLoader& loader, int64_t global_step, int64_t epoch);

  struct Part;

  // ---- checkpoint state (issue 5; written and read by trainer/ckpt/) ----
  // What a rank must save to resume exactly: per module, the fp32 master weights and Adam
  // moments over its optimizer range [opt_lo, opt_lo + opt_n) of the module padded to
  // `padded`; and the optimizer's scalars. Gradients are zero between steps and the
  // compute-dtype parameters are rebuilt from the master weights, so neither is saved.
  struct ModuleLayout {
    int index = 0;
    std::string name;
    int64_t numel = 0, padded = 0, shard = 0, opt_lo = 0, opt_n = 0;
  };
  struct OptimizerScalars {
    int64_t adam_steps = 0, good_steps = 0, hysteresis_left = 0;
    double loss_scale = 1;
  };
  std::vector<ModuleLayout> checkpoint_layout() const;
  OptimizerScalars checkpoint_scalars() const;
  // Calls `visit` once per module, in order, with host-readable fp32 [opt_n] arrays (staged
  // device->host, as recorded transfers, when the optimizer state is on the accelerator).
  using StateVisitor = std::function<void(const ModuleLayout&, const float* master, const float* m, const float* v)>;
  void export_states(const StateVisitor& visit);
  // The reverse: `fill` writes each module's master, m, v into host [opt_n] buffers (it may
  // throw: nothing collective has happened yet), which are then copied where they live; then
  // the scalars are restored and the compute-dtype parameters rebuilt from the master
  // weights. Collective at stages 1-3: every rank calls it at the same point.
  using StateFiller = std::function<void(const ModuleLayout&, float* master, float* m, float* v)>;
  void import_states(const OptimizerScalars& scalars, const StateFiller& fill);
  // The consolidated compute-dtype weights of a save (DeepSpeed's
  // stage3_gather_16bit_weights_on_model_save, R4). Collective: every rank calls it. Each
  // sharded module is all-gathered into a temporary device buffer (after a host->device copy
  // of the shard under offload_param); a module already whole on the device needs none.
  //   Streamed: one module at a time: gathered, copied to the host, freed (temporary device
  //             memory at its peak: the largest module).
  //   Device:   every module stays on the device until all are gathered, then each is copied
  //             to the host (the whole model's bytes: where R4 ran out of memory).
  // With `to_host` (rank 0), `visit` gets each module's [numel] values in the compute dtype on
  // the host, in module order (null in virtual mode: sizes only); the other ranks take part in
  // the gathers only.
  enum class WeightsGather { Streamed, Device };
  using WeightsVisitor = std::function<void(const ModuleLayout&, const void* values)>;
  struct GatherStats {
    int64_t peak_temp_device_bytes = 0;  // temporary device bytes alive at once, at most
    int64_t gathered_modules = 0;        // modules that needed a gather
  };
  GatherStats gather_weights(WeightsGather how, bool to_host, const WeightsVisitor& visit);
  // Whether any module lives as shards (stage 3, above the persistence threshold): only those
  // need a gather at all.
  bool has_sharded_modules() const;
  DType compute_dtype() const { return dtype_; }
  const model::Config& model_config() const { return mc_; }
  probe::DeviceId accelerator_trace_id() const { return rt_.accelerator().trace_id(); }
  // ---- end checkpoint state ----

 private:
  void gather(Part& p);
  void stage_shard(Part& p);
  struct Offload {
    Part* part = nullptr;
    PendingCopy copy;  // D2H into part->part_grad, or into `staging` (compute dtype, pinned)
    Tensor staging;
  };
  void finish_offload(Offload& o);
  // Every partition on its way to the host lands, but the `keep` newest.
  void land_offloads(size_t keep);
  const float* fetch(int m, int64_t step);
  void release(int m, int64_t step);
  void prefetch_after(int m, int64_t step);
  void reduce_module_grad(int m, Tensor& bucket, int64_t step);
  // The fp32 gradient partition of module m to the host (optimizer offload), at the
  // accumulation boundary; where the faults zero.grad_partition_stays_on_device and
  // host.epoch_leak act.
  void offload_grad(int m, const Tensor& grad, int64_t step);
  const Tensor& opt_grad_of(int m) const;
  void boundary_faults(int64_t step);
  void end_boundary();
  void boundary_reduce(int64_t step);
  StepResult optimizer_step(int64_t step);
  void write_back(int m, const Tensor& fused, bool async = false);
  // One module's AdamW of one step, on the rank thread or the background thread.
  struct AdamJob {
    int mi = 0;
    Tensor grad;              // the gradient partition it reads: fp32, or the compute dtype on the host
    float grad_scale = 1.0f;  // ... which it multiplies by this first (unscale-and-clip), unless fp32
    Tensor fused;             // the compute-dtype update it writes, when not in place (or none)
    void* low_out = nullptr;  // fused's storage, or the host parameter shard itself
    optim::LowDType low = optim::LowDType::None;
    bool in_place = false;    // it writes the host parameter shard itself: no write-back
    bool to_alt = false;      // AdamW during backward: the updated state goes to master_alt, m_alt, v_alt
  };
  void run_adam(const AdamJob& j, const optim::AdamParams& hp, int64_t step, int64_t adam_step);
  // pending_'s AdamW pass to the background thread, counting the modules it has done.
  void submit_pass(const optim::AdamParams& hp, int64_t step);
  // The delayed update: the H2D copies of the modules whose AdamW has run since the last call.
  void write_back_early();
  void apply_update(int64_t at_step);
  // A module's buffer for AdamW's compute-dtype output (pinned as the settings say), and whether
  // its AdamW needs none (writes the host shard in place).
  Tensor update_buffer(const Part& p) const;
  bool adam_in_place(const Part& p, bool delayed) const;
  // The overlapped update: module m's AdamW awaited and its weights written back (no-op when
  // none is due).
  void await_update(int m);
  bool update_finished(const Part& p);  // its AdamW has run (or none is due)
  // Waits until the background pass has done more than `k` modules (true) or has failed (false).
  bool wait_updates_past(size_t k);
  void require_no_pending_update(const char* what) const;
  // AdamW during backward: module p's partition has landed (its job joins the pass, which starts with
  // the first); the pass told to stop and waited for, its updates thrown away (rethrows its error
  // unless `quiet`).
  void early_landed(Part& p);
  void abort_early(bool quiet);
  bool early_now() const { return early_.live && early_.step == step_now_; }  // this step's pass is in flight
  StepResult optimizer_step_body(int64_t step);
  probe::MarkerId phase(const std::string& name, int64_t step, int64_t micro = -1);
  void end(probe::MarkerId id);

  TrainConfig cfg_;
  ZeroSettings z_;
  model::Config mc_;
  int B_, T_;
  RankRuntime& rt_;
  Communicator& comm_;
  probe::Recorder* rec_;
  DType dtype_;
  DType part_grad_dtype_ = DType::F32;  // the host gradient partitions' (cfg.grad_partition_dtype)
  int W_, rank_;
  bool virt_ = false;  // virtual mode: sizes only (no data, no kernels, no Adam math)
  int head_ = 0;       // index of an untied LM head module (virtual shapes), 0: tied
  std::vector<int> lora_of_;  // block b's LoRA adapter module (finetuning lora), else empty
  LoadReport load_;
  std::vector<model::ModuleSpec> modules_;
  std::vector<std::unique_ptr<Part>> parts_;
  std::deque<Offload> offloads_;  // gradient partitions in flight to the host (at most two)
  std::unique_ptr<ModelPasses> passes_;  // the model's passes on the accelerator (null in virtual mode)
  // Their activation memory, from the device allocator, as one tensor the passes carve up (a real
  // GPU's passes); undefined where the device is charged term by term instead (charge_terms_).
  Tensor activations_;
  // The device memory of PyTorch + DeepSpeed, term by term (zero/ds_memory.h), where our compute
  // does not allocate it itself: in virtual mode, and on a simulated GPU whose passes keep their
  // activations on the host (the CPU reference). charge() allocates and frees the named tensors.
  bool charge_terms_ = false;
  // An encoder-decoder in virtual mode: its activations as one estimate (model_shape.h), fp32
  // elements, charged from its forward to the end of its backward; 0 where they are charged tensor
  // by tensor.
  int64_t pass_activations_ = 0;
  // Virtual mode at stage 3: DeepSpeed's layout. The gradients take its path (each module's
  // gradient in the compute dtype into the ipg bucket, its flushes) instead of our fp32 buckets; under
  // offload_optimizer the compute-dtype gradient partitions live on the host, pinned
  // (grad_partitions_flat_buffer), not on the device, and the fp32 master weights, Adam moments and
  // each step's compute-dtype update are pageable (a CPU clone, DeepSpeedCPUAdam's state, a .to()),
  // not pinned.
  bool ds_layout_ = false;
  // Virtual mode at stages 1-2: DeepSpeed's DeepSpeedZeroOptimizer term by term (ds_memory.h's
  // Ds12Gradients): no gradient of ours at set-up, autograd's gradients in the compute dtype through the
  // IPG buffers into grads_in_partition, the fp32 gradient partition made in the step
  // (single_partition_of_fp32_groups[0].grad), Adam's moments made at the first step; under
  // offload_optimizer the fp32 master pinned on the host and the moments pageable.
  bool ds12_ = false;
  std::unique_ptr<Ds12Gradients> ds12_grads_;
  void ds12_moments();  // Adam's moments, made at the first step (FusedAdam, DeepSpeedCPUAdam)
  // Virtual mode at stage 0 in bf16/fp16: DeepSpeed's FP16_Optimizer (ds_memory.h's ds0_*): autograd's
  // gradients from the first backward to the step, the boundary's all-reduce buckets, the step's fp32
  // gradients; not our buckets. ds0_params_: the trainable parameters in the model's order.
  bool ds0_ = false;
  bool legacy_stage1_ = false;  // stage 1 with zero_optimization.legacy_stage1 (virtual): stage1.py's set-up
  std::vector<int64_t> ds0_params_;
  // After the optimizer's step (ds12_, ds0_): the fp32 gradient partition (and at stage 0 the 16-bit
  // gradients, zero_grad) freed; `g32` and `jobs` held their last references.
  void ds_step_done(std::vector<Tensor>& g32, std::vector<AdamJob>* jobs);
  // ds12_ under offload_optimizer: module mi's copies across, as transfer rows (virtual mode: sizes only):
  // its fp32 gradient slices into the pinned host gradient at the boundary (D2H), its updated 16-bit
  // partition from the host buffer back into the flat parameters after the step (H2D).
  void ds12_transfer(int mi, bool d2h);
  void ds12_reduce_collectives();  // the IPG flushes' all-reduces since the last call, as collectives
  // The optimizer whose memory is charged (optimizer_memory.h): its state for each module (adam.m, adam.v
  // for AdamW's family; the others as charged terms, virtual mode only), and its step's temporaries on the
  // device around the update of the tensors it is handed (charge_terms_: virtual mode, the simulated GPU).
  OptimizerSpec opt_;
  int64_t opt_state_bytes_ = 0;  // the charged state of an optimizer outside AdamW's family
  void charge_optimizer_state(const Part& p, bool on_host);
  std::vector<int64_t> optimizer_step_tensors() const;  // what one call of the step is handed (stages 0-2)
  ActivationShape act_;
  std::map<std::string, Tensor> charges_;
  void charge(const std::vector<MemoryOp>& ops);
  void charge(const MemoryOp& op) { charge(std::vector<MemoryOp>{op}); }
  std::vector<std::vector<int64_t>> module_params_;  // each module's parameters (DeepSpeed's units)
  std::unique_ptr<IpgBucket> ipg_;
  Tensor ipg_buffer_;                 // DeepSpeed's contiguous ipg bucket (ds_layout_)
  std::vector<Tensor> persistent_;    // stage 3, W > 1: the parameters kept whole (below the threshold)
  // ds_layout_: module m's gradient (autograd's, the compute dtype) made and copied into the ipg
  // bucket, flushing it first whenever the next parameter would not fit.
  void ds_module_gradient(int m);
  void ds_flush_gradients();
  Tensor host_tokens_, host_targets_;
  // Fetch order recorded in the first step, and where the current step is in it.
  std::vector<int> order_;
  bool order_known_ = false;
  size_t order_pos_ = 0;
  // Fault state (inject/failpoint): see offload_grad() and on_epoch_boundary().
  int64_t epoch_ = 0, micro_ = -1;
  std::string leak_pending_;      // host.epoch_leak's variant, to act at the next boundary
  std::string leak_active_;       // ... acting at this boundary
  std::vector<Tensor> leaked_;    // buffers the leak keeps alive (never released)
  int stays_on_device_ = -1;      // module whose fp32 gradient partition stays on the device this step
  // Delayed parameter update: the background thread, the jobs it runs (owned here, read there
  // until waited for) and the step they belong to.
  std::unique_ptr<BackgroundThread> background_;
  std::vector<AdamJob> pending_;
  int64_t pending_step_ = -1;
  int update_slot_ = 0;  // which of each module's two update buffers the next job writes
  bool early_write_back_ = false;  // delayed: device shards get each module's update as its AdamW ends
  size_t early_next_ = 0;          // ... the first job in pending_ not yet looked at
  // The overlapped update (cfg_.overlap_update: the job in flight, if any, is one): pending_ is in
  // the order the job runs it; update_pos_[m] is module m's place there; the job counts the modules
  // it has finished (or says it failed) under update_mu_.
  int64_t step_now_ = -1;    // the step under way (for the await markers)
  std::vector<size_t> update_pos_;
  std::mutex update_mu_;
  std::condition_variable update_cv_;
  size_t updates_done_ = 0;
  bool update_failed_ = false;
  // AdamW during backward (cfg_.adam_in_backward): the pass in flight is an early one (per-module
  // done flags, out-of-place state) from its first landed partition until it is waited for; its
  // update stands once the optimizer step has said so (committed). The vectors are indexed by module
  // and, but for jobs written before a module is marked landed, guarded by update_mu_.
  struct EarlyPass {
    bool live = false, committed = false;
    int64_t step = -1;
    float factor = 1.0f;           // the scale its AdamW applies: the step's when nothing clips
    std::vector<AdamJob> jobs;
    std::vector<char> landed, taken, done;
    std::deque<int> queue;         // landed and not yet taken, in landing order
    std::vector<int> forward_order;  // the modules in the order the forward first uses them
    bool all_landed = false, abort = false;
    bool stopped = false;  // the partitions landed already make the step clip: no more modules taken
    double sq = 0;         // their sum of squares (this rank's part of the global norm's)
  } early_;
  double loss_scale_ = 1;
  int64_t good_steps_ = 0, hysteresis_left_ = 0, adam_steps_ = 0;
};

}  // namespace zt::trainer
