// tests/trainer/engine_ranks.h: W rank threads, each with its own runtime (simulated GPU) and
// ZeRO engine, as the trainer builds them, running a test's function: for checks at the
// engine's level (a save right after construction, a model shape that is no preset).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "train/rank_runtime.h"
#include "train/train_config.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zt::test {

using RankFn = std::function<void(int rank, trainer::ZeroEngine&, trainer::Communicator&, trainer::RankRuntime&)>;

// Runs fn on cfg.world_size rank threads. A rank that throws aborts the group (the others'
// collectives then throw too); returns each rank's error text, empty where it succeeded.
inline std::vector<std::string> run_ranks(const trainer::TrainConfig& cfg, const model::Config& mc, int B, int T,
                                          const RankFn& fn) {
  const int W = int(cfg.world_size);
  trainer::InProcessGroup group(W);
  std::vector<std::string> errors(static_cast<size_t>(W));
  auto one = [&](int rank) {
    trainer::RuntimeOptions ro;
    ro.rank = rank;
    ro.world_size = W;
    ro.device_capacity = cfg.device_memory;
    ro.host_capacity = cfg.host_memory;
    trainer::RankRuntime rt(ro, nullptr);
    std::unique_ptr<trainer::Communicator> comm = group.communicator(rank, nullptr, rt.accelerator().trace_id());
    try {
      trainer::ZeroEngine engine(cfg, mc, B, T, rt, *comm);
      fn(rank, engine, *comm, rt);
    } catch (const std::exception& e) {
      errors[size_t(rank)] = e.what();
      comm->abort(e.what());
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r) threads.emplace_back(one, r);
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace zt::test
