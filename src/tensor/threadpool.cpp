// ThreadPool: persistent workers woken per parallel_for, caller takes part.
//
// Wake-up path: the caller bumps `generation_` under the mutex and notifies; a worker that has
// just finished a job spins for a short while on `generation_` before sleeping on the condition
// variable. Decode issues hundreds of small parallel_for calls per token separated by a few
// microseconds of serial work, and a futex sleep/wake costs tens of microseconds on a KVM guest,
// so the spin keeps workers hot between those calls while the sleep keeps an idle process at 0%.
// The spin length comes from MOESH_POOL_SPIN_US (default below; 0 disables it) so the bench can
// measure both.
//
// `generation_` and `pending_` are read outside the mutex while spinning, so every access to
// them goes through std::atomic_ref.
#include "moesh/tensor/threadpool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace moesh {
namespace {

// Set while a thread runs a chunk of any pool's job: a parallel_for issued from there runs
// serially on that thread (nested loops would otherwise deadlock waiting for busy workers).
thread_local bool tl_in_job = false;
thread_local int tl_thread_index = 0;

constexpr int64_t k_default_spin_us = 50;

int64_t spin_us() {
  static const int64_t v = [] {
    if (const char* env = std::getenv("MOESH_POOL_SPIN_US")) {
      char* end = nullptr;
      long long n = std::strtoll(env, &end, 10);
      if (end != env && n >= 0) return static_cast<int64_t>(n);
    }
    return k_default_spin_us;
  }();
  return v;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until pred() holds or the spin budget runs out; returns pred()'s last value.
template <typename Pred>
bool spin_until(Pred pred) {
  const int64_t budget = spin_us();
  if (budget <= 0) return pred();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(budget);
  for (;;) {
    // Check the clock only every 64 polls: reading it costs more than a poll. The yield lets a
    // thread that is runnable on this core (an oversubscribed machine) go first; on an idle
    // core it returns at once.
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::yield();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  n_threads_ = std::max(1, n_threads);
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  tl_thread_index = index;
  std::atomic_ref<uint64_t> gen(generation_);
  std::atomic_ref<int> pending(pending_);
  uint64_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return gen.load(std::memory_order_acquire) != seen; })) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || gen.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
    }
    seen = gen.load(std::memory_order_acquire);
    // job_* were written before the release store of generation_, so they are visible here, and
    // the caller does not touch them again until every worker (even one without a chunk) has
    // counted itself out of `pending_` below.
    if (index < job_threads_) {
      const int64_t base = job_chunk_;
      const int64_t rem = job_n_ - base * job_threads_;
      const int64_t begin = index * base + std::min<int64_t>(index, rem);
      const int64_t end = begin + base + (index < rem ? 1 : 0);
      tl_in_job = true;
      (*job_)(begin, end, index);
      tl_in_job = false;
    }
    if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Take the lock so the notify cannot fall between the caller's check and its wait;
      // notify_all because outside callers waiting for `busy_` share this condition variable.
      std::lock_guard<std::mutex> lock(mu_);
      cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = std::max<int64_t>(1, n / grain);
  const int n_chunks = static_cast<int>(std::min<int64_t>(n_threads_, max_chunks));
  if (n_chunks <= 1 || tl_in_job) {
    const bool was_in_job = tl_in_job;
    tl_in_job = true;
    fn(0, n, was_in_job ? tl_thread_index : 0);
    tl_in_job = was_in_job;
    return;
  }

  std::atomic_ref<uint64_t> gen(generation_);
  std::atomic_ref<int> pending(pending_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Two outside threads sharing one pool take turns rather than mixing their jobs.
    cv_done_.wait(lock, [&] { return !busy_; });
    busy_ = true;
    job_ = &fn;
    job_n_ = n;
    job_threads_ = n_chunks;
    job_chunk_ = n / n_chunks;
    pending.store(n_threads_ - 1, std::memory_order_relaxed);
    gen.store(gen.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  cv_start_.notify_all();

  // The caller is thread 0 and takes the first chunk (always base or base+1 long, begins at 0).
  const int64_t base = n / n_chunks;
  const int64_t rem = n - base * n_chunks;
  tl_in_job = true;
  fn(0, base + (rem > 0 ? 1 : 0), 0);
  tl_in_job = false;

  if (!spin_until([&] { return pending.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return pending.load(std::memory_order_acquire) == 0; });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    job_ = nullptr;
  }
  cv_done_.notify_all();
}

void ThreadPool::parallel_for_dynamic(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t piece) {
  if (n <= 0) return;
  piece = std::max<int64_t>(1, piece);
  const int64_t n_pieces = (n + piece - 1) / piece;
  if (n_threads_ <= 1 || n_pieces <= 1 || tl_in_job) {
    // One chunk, serial on the caller, still handed over piece by piece.
    parallel_for(
        n,
        [&](int64_t, int64_t, int thread) {
          for (int64_t b = 0; b < n; b += piece) fn(b, std::min(n, b + piece), thread);
        },
        n);
    return;
  }
  std::atomic<int64_t> next{0};
  parallel_for(std::min<int64_t>(n_threads_, n_pieces), [&](int64_t, int64_t, int thread) {
    for (;;) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n_pieces) return;
      fn(i * piece, std::min(n, (i + 1) * piece), thread);
    }
  });
}

}  // namespace moesh
