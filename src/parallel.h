// Task-parallel loops for the host reference code: tasks handed out from a shared counter, so a
// result never depends on which thread ran which task. Failures are contained: an exception in a
// worker stops the others and is rethrown on the calling thread after every worker has joined (a
// joinable thread is never destroyed, which would terminate the program), and a thread that
// cannot be started (a process or memory limit) leaves its share to the threads that did start,
// the calling thread included.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace flashattn {

// Threads for `tasks` tasks of `total_work` (multiply-adds, elements: a cost of about one each) in
// all: `requested` (0: every core), but no more than the tasks, and one per 2^18 of work, since
// starting a thread costs tens of microseconds (tiny problems run on the calling thread).
inline int parallel_workers(int requested, int64_t tasks, double total_work) {
  int n = requested > 0 ? requested : static_cast<int>(std::thread::hardware_concurrency());
  n = std::max(n, 1);
  constexpr double kMinWorkPerThread = 1 << 18;
  n = static_cast<int>(std::min<double>(n, std::max(1.0, total_work / kMinWorkPerThread)));
  return static_cast<int>(std::min<int64_t>(n, std::max<int64_t>(tasks, 1)));
}

// Runs body(t, state) for every t in [0, tasks) on up to `workers` threads (the calling thread is
// one of them); each thread makes its own state with make_state() first.
template <class MakeState, class Body>
void parallel_tasks(int64_t tasks, int workers, MakeState make_state, Body body) {
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    try {
      auto state = make_state();
      for (int64_t t = next++; t < tasks; t = next++) body(t, state);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      next = tasks;  // stop the other workers early
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads: the ones running (and this one) take the rest
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flashattn
