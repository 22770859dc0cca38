#include "tensor-parallel/local_tp_target.h"

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "model/llama/cpu_forward.h"
#include "model/llama/dense_kv_cache.h"
#include "model/gguf/gguf_reader.h"
#include "model/status_macros.h"
#include "model/cpu/thread_pool.h"
#include "tensor-parallel/local_communicator.h"

namespace specnode {

struct LocalTpTarget::Rank {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<CommunicatorReducer> reducer;
  std::unique_ptr<LlamaForward> forward;
  std::unique_ptr<DenseKvCache> cache;
  std::vector<float> logits;
  absl::Status status;
};

// One persistent thread per rank 1..T-1; Run(fn) calls fn(r) on each of them and on the
// calling thread for rank 0, and returns when all are done.
class LocalTpTarget::Workers {
 public:
  explicit Workers(int n) : n_(n) {
    for (int r = 1; r < n; ++r) threads_.emplace_back([this, r] { Loop(r); });
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void Run(const std::function<void(int)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      pending_ = n_ - 1;
      ++generation_;
    }
    cv_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void Loop(int r) {
    int64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
      }
      (*fn)(r);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  const int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* fn_ = nullptr;
  int pending_ = 0;
  int64_t generation_ = 0;
  bool stop_ = false;
};

absl::StatusOr<std::unique_ptr<LocalTpTarget>> LocalTpTarget::Load(
    const std::string& path, const LocalTpTargetOptions& options) {
  const auto with_path = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  if (options.threads_per_rank < 1) {
    return absl::InvalidArgumentError("LocalTpTarget: threads_per_rank must be >= 1");
  }
  // Plan first, from metadata only, so a bad TP size fails before any weight is touched.
  auto file = GgufFile::Open(path);
  if (!file.ok()) return with_path(file.status());
  auto config = LlamaConfig::FromGguf(**file);
  if (!config.ok()) return with_path(config.status());
  auto plan = ShardPlan::ForFile(**file, *config, options.tp_size);
  if (!plan.ok()) return with_path(plan.status());
  file->reset();

  std::unique_ptr<LocalTpTarget> t(new LocalTpTarget(std::move(plan).value()));
  SPECNODE_ASSIGN_OR_RETURN(t->group_,
                            LocalCommunicatorGroup::Create(options.tp_size, options.comm));
  for (int r = 0; r < options.tp_size; ++r) {
    auto rank = std::make_unique<Rank>();
    LoadOptions lo;
    lo.shard = t->plan_.Spec(r);
    SPECNODE_ASSIGN_OR_RETURN(rank->model, LlamaModel::Load(path, lo));
    const LlamaConfig& c = rank->model->config();
    rank->pool = std::make_unique<ThreadPool>(options.threads_per_rank);
    PartialSumReducer* reducer = nullptr;
    if (options.tp_size > 1) {
      rank->reducer = std::make_unique<CommunicatorReducer>(t->group_->Rank(r));
      reducer = rank->reducer.get();
    }
    rank->forward =
        std::make_unique<CpuLlamaForward>(c, rank->model->weights(), rank->pool.get(), reducer);
    rank->cache = std::make_unique<DenseKvCache>(
        c.n_layers, rank->model->weights().n_kv_heads_local, c.head_dim,
        rank->model->weights().kv_heads_held().gqa_group, c.context_length, options.kv_tokens);
    t->ranks_.push_back(std::move(rank));
  }
  t->workers_ = std::make_unique<Workers>(options.tp_size);
  return t;
}

LocalTpTarget::LocalTpTarget(ShardPlan plan) : plan_(std::move(plan)) {}

LocalTpTarget::~LocalTpTarget() = default;

absl::Status LocalTpTarget::Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("LocalTpTarget is broken by an earlier failure: ", broken_.message()));
  }
  const std::function<void(int)> step = [&](int r) {
    Rank& rank = *ranks_[r];
    rank.status = rank.forward->Forward(batch, rank.cache.get(), &rank.logits);
  };
  workers_->Run(step);
  // Input errors (bad token, cache full) are detected identically on every rank before any
  // collective; anything else is a communicator failure and breaks the target.
  for (int r = 0; r < tp_size(); ++r) {
    const absl::Status& s = ranks_[r]->status;
    if (s.ok()) continue;
    if (s.code() != absl::StatusCode::kInvalidArgument &&
        s.code() != absl::StatusCode::kResourceExhausted) {
      broken_ = absl::Status(s.code(), absl::StrCat("tensor-parallel rank ", r, ": ", s.message()));
      return broken_;
    }
    return s;
  }
  *logits = ranks_[0]->logits;
  return absl::OkStatus();
}

absl::Status LocalTpTarget::Truncate(SeqId seq, int32_t n) {
  for (auto& rank : ranks_) SPECNODE_RETURN_IF_ERROR(rank->cache->Truncate(seq, n));
  return absl::OkStatus();
}

void LocalTpTarget::Free(SeqId seq) {
  for (auto& rank : ranks_) rank->cache->Free(seq);
}

int32_t LocalTpTarget::Length(SeqId seq) const { return ranks_[0]->cache->Length(seq); }

const LlamaModel& LocalTpTarget::model(int rank) const { return *ranks_[rank]->model; }

const std::vector<float>& LocalTpTarget::rank_logits(int rank) const {
  return ranks_[rank]->logits;
}

int64_t LocalTpTarget::bytes_sent() const {
  int64_t total = 0;
  for (int r = 0; r < tp_size(); ++r) total += group_->Rank(r)->bytes_sent();
  return total;
}

}  // namespace specnode
