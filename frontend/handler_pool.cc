#include "frontend/handler_pool.h"

#include <utility>

namespace pswitch::frontend {

HandlerPool::HandlerPool(size_t threads, size_t max_queued) : max_queued_(max_queued) {
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

HandlerPool::~HandlerPool() { Stop(); }

bool HandlerPool::Push(std::function<void()> work, bool bounded) {
  absl::MutexLock lock(&mu_);
  if (stopped_ || (bounded && queue_.size() >= max_queued_)) return false;
  queue_.push_back(std::move(work));
  return true;
}

bool HandlerPool::TrySubmit(std::function<void()> work) { return Push(std::move(work), true); }
bool HandlerPool::Submit(std::function<void()> work) { return Push(std::move(work), false); }

void HandlerPool::Run() {
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &HandlerPool::HasWorkOrStopped));
      if (queue_.empty()) return;  // stopped and drained
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

void HandlerPool::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace pswitch::frontend
