#include "tests/golden/golden_engine.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "kvstore/kv_cache_factory.h"
#include "model/llama/cpu_forward.h"
#include "model/cpu/thread_pool.h"
#include "model/llama/llama_model.h"
#include "model/status_macros.h"
#include "tensor-parallel/communicator.h"
#include "tensor-parallel/local_communicator.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<GoldenModel>> GoldenModel::Load(const std::string& path,
                                                               ActQuant act, ShardSpec shard) {
  std::unique_ptr<GoldenModel> m(new GoldenModel());
  LoadOptions lo;
  lo.activations = act;
  lo.shard = shard;
  SPECNODE_ASSIGN_OR_RETURN(m->model_, LlamaModel::Load(path, lo));
  return m;
}

GoldenModel::~GoldenModel() = default;

const Tokenizer& GoldenModel::tokenizer() const { return model_->tokenizer(); }

namespace {

KvOptions KvOptionsFor(const std::string& mode) {
  KvOptions o;
  o.mode = ParseKvMode(mode).value();
  return o;
}

// One shard (or the whole model): its forward pass and cache.
struct Part {
  std::unique_ptr<GoldenModel> model;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<CommunicatorReducer> reducer;
  std::unique_ptr<LlamaForward> forward;
  std::unique_ptr<KvCache> cache;
  std::vector<float> logits;
  absl::Status status;
};

class Engine final : public GoldenEngine {
 public:
  absl::Status Init(const std::string& path, ActQuant act, const std::string& mode, int tp) {
    if (tp > 1) {
      SPECNODE_ASSIGN_OR_RETURN(group_, LocalCommunicatorGroup::Create(tp, CommunicatorOptions{}));
    }
    for (int r = 0; r < tp; ++r) {
      auto p = std::make_unique<Part>();
      SPECNODE_ASSIGN_OR_RETURN(p->model, GoldenModel::Load(path, act, ShardSpec{r, tp}));
      const LlamaModel& m = p->model->model();
      p->pool = std::make_unique<ThreadPool>(tp == 1 ? 2 : 1);
      PartialSumReducer* reducer = nullptr;
      if (tp > 1) {
        p->reducer = std::make_unique<CommunicatorReducer>(group_->Rank(r));
        reducer = p->reducer.get();
      }
      p->forward = std::make_unique<CpuLlamaForward>(m.config(), m.weights(), p->pool.get(), reducer);
      SPECNODE_ASSIGN_OR_RETURN(
          p->cache, MakeKvCache(m.config(), m.weights().kv_heads_held(), KvOptionsFor(mode)));
      vocab_ = m.config().vocab_size;
      parts_.push_back(std::move(p));
    }
    return absl::OkStatus();
  }

  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) override {
    auto run = [&](Part& p) { p.status = p.forward->Forward(batch, p.cache.get(), &p.logits); };
    std::vector<std::thread> threads;
    for (size_t r = 1; r < parts_.size(); ++r) threads.emplace_back(run, std::ref(*parts_[r]));
    run(*parts_[0]);
    for (auto& t : threads) t.join();
    for (size_t r = 0; r < parts_.size(); ++r) {
      if (!parts_[r]->status.ok()) return parts_[r]->status;
      if (r > 0 && parts_[r]->logits != parts_[0]->logits) {
        return absl::InternalError(absl::StrCat("rank ", r, "'s logits differ from rank 0's"));
      }
    }
    *logits = parts_[0]->logits;
    return absl::OkStatus();
  }
  absl::Status Truncate(SeqId seq, int32_t n) override {
    for (auto& p : parts_) SPECNODE_RETURN_IF_ERROR(p->cache->Truncate(seq, n));
    return absl::OkStatus();
  }
  void Free(SeqId seq) override {
    for (auto& p : parts_) p->cache->Free(seq);
  }
  int32_t vocab() const override { return vocab_; }

 private:
  std::unique_ptr<LocalCommunicatorGroup> group_;
  std::vector<std::unique_ptr<Part>> parts_;
  int32_t vocab_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GoldenEngine>> GoldenEngine::Create(const std::string& path,
                                                                   ActQuant act,
                                                                   const std::string& kv_mode,
                                                                   int tp_size) {
  auto e = std::make_unique<Engine>();
  SPECNODE_RETURN_IF_ERROR(e->Init(path, act, kv_mode, tp_size));
  return std::unique_ptr<GoldenEngine>(std::move(e));
}

}  // namespace specnode
