// The host reference's task loop (src/parallel.h): every task runs once whatever the thread count,
// and a worker's exception reaches the caller after all threads joined (never std::terminate).
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "parallel.h"

namespace fa = flashattn;

TEST(ParallelTasks, EveryTaskRunsExactlyOnce) {
  for (int workers : {1, 2, 7, 64}) {
    std::vector<std::atomic<int>> hits(1000);
    fa::parallel_tasks(1000, workers, [] { return 0; }, [&](int64_t t, int) { ++hits[t]; });
    for (const auto& h : hits) ASSERT_EQ(h.load(), 1) << workers << " workers";
  }
}

TEST(ParallelTasks, AWorkerExceptionReachesTheCallerAfterEveryThreadJoined) {
  // Whether the other workers stop early is timing (trivial tasks may all be taken before the
  // exception lands); what must hold is that it reaches the caller and nothing terminates.
  for (int workers : {1, 8}) {
    EXPECT_THROW(fa::parallel_tasks(
                     10000, workers, [] { return 0; },
                     [&](int64_t t, int) {
                       if (t == 17) throw std::runtime_error("task 17 failed");
                     }),
                 std::runtime_error);
  }
}
