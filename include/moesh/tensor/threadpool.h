// ThreadPool: the one compute pool of a process (default: all cores).
//
// parallel_for splits [0, n) into contiguous chunks, one per thread, and runs them with the
// calling thread taking part. How the range is split never changes results: kernels give
// each output element to exactly one thread and never split a reduction (determinism contract).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moesh {

class ThreadPool {
 public:
  // n_threads <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // fn(begin, end, thread_index) over chunks of [0, n); blocks until all chunks are done.
  // Chunks are at least `grain` long (so tiny loops stay on one thread). Not reentrant:
  // calling parallel_for from inside fn runs the inner loop serially on the caller.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

  // fn(begin, end, thread_index) over [0, n) in pieces of at most `piece` items that the threads
  // take in turn from a shared counter until none are left. For loops whose items cost unequal
  // amounts (causal attention: token t reads t cells; experts with different token counts) or
  // when a vCPU may be preempted: a contiguous split would leave one thread with most of the
  // work. Same determinism rule: which thread runs an item must not change its result.
  void parallel_for_dynamic(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t piece = 1);

 private:
  void worker_loop(int index);

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int job_threads_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  bool busy_ = false;
};

}  // namespace moesh
