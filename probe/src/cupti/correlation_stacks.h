// probe/src/cupti/correlation_stacks.h: the stack taken at an API entry, kept until the
// activity record with the same correlation id is decoded.
//
// Writers: CUPTI callback threads (the application's threads, at cudaMalloc & co entry).
// Reader: the decoder thread, which takes each id at most once. Bounded: a call whose record
// never comes (a failed cudaMalloc, cudaFree(nullptr)) must not grow the table forever, so
// the oldest entries are forgotten beyond `capacity` (the record, if it ever comes, then has
// no stack: it is still written).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "zt/probe/recorder.h"

namespace zt::probe::cupti {

class CorrelationStacks {
 public:
  explicit CorrelationStacks(size_t capacity = 1 << 16) : capacity_(capacity) {}

  void put(uint32_t correlation_id, StackId stack) {
    if (stack == 0) return;
    std::lock_guard lock(mu_);
    map_[correlation_id] = stack;
    order_.push_back(correlation_id);
    while (order_.size() > capacity_) {
      map_.erase(order_.front());
      order_.pop_front();
    }
  }

  StackId take(uint32_t correlation_id) {
    std::lock_guard lock(mu_);
    auto it = map_.find(correlation_id);
    if (it == map_.end()) return 0;
    StackId s = it->second;
    map_.erase(it);
    return s;
  }

  size_t size() {
    std::lock_guard lock(mu_);
    return map_.size();
  }

 private:
  std::mutex mu_;
  size_t capacity_;
  std::unordered_map<uint32_t, StackId> map_;
  std::deque<uint32_t> order_;
};

}  // namespace zt::probe::cupti
