// A reusable barrier for `count` host threads: the CPU emulations of GPU code
// (gemm/simt/emulation, gemm/emulation) run one host thread per CUDA thread
// and meet here where the GPU code synchronizes.
#pragma once

#include <condition_variable>
#include <mutex>

namespace samattn {

class HostBarrier {
 public:
  explicit HostBarrier(int count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const long generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_, arrived_ = 0;
  long generation_ = 0;
};

}  // namespace samattn
