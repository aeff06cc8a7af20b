// One level's choice of a constrained beam search on the CPU: per request the ``width`` best
// (beam, code) pairs by score + log-probability among the allowed ones, in one pass over the
// candidates (a bounded heap), in place of ~10 tensor operations (mask, add, top-k, gathers).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

namespace {

// (score, flat index): better = higher score, then lower index (a fixed order for ties)
using Cand = std::pair<float, int64_t>;

bool better(const Cand& a, const Cand& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

// logp [R * B, K] fp32 (each beam's log-probabilities of the level's codes), scores [R, B]
// fp32 (each beam's score so far; -inf: a dead beam), edges: per catalog part [R, B, K] int64
// (the edge of each (beam, code), -1 where it leads to no returnable item). A pair is allowed
// where some part has an edge. Returns, with W = min(width, B * K): top scores [R, W] (best
// first; -inf past the allowed pairs), parent beam [R, W], code [R, W] (int64; 0 where
// -inf), then per part the chosen edges [R, W] (-1 where the score is -inf).
std::vector<at::Tensor> beam_select(const at::Tensor& logp, const at::Tensor& scores,
                                    at::TensorList edges, int64_t width) {
  TORCH_CHECK(logp.scalar_type() == at::kFloat && scores.scalar_type() == at::kFloat &&
                  logp.dim() == 2 && scores.dim() == 2, "logp [R * B, K], scores [R, B]: fp32");
  const int64_t R = scores.size(0), B = scores.size(1), K = logp.size(1);
  TORCH_CHECK(logp.size(0) == R * B, "logp: one row per beam");
  TORCH_CHECK(!edges.empty() && width >= 1, "edges: one per part; width >= 1");
  const at::Tensor lp = logp.contiguous(), sc = scores.contiguous();
  std::vector<at::Tensor> parts;
  std::vector<const int64_t*> ed;
  for (const at::Tensor& e : edges) {
    TORCH_CHECK(e.scalar_type() == at::kLong && e.numel() == R * B * K, "edges: int64 [R, B, K]");
    parts.push_back(e.contiguous());
    ed.push_back(parts.back().data_ptr<int64_t>());
  }
  const int64_t W = std::min(width, B * K);
  auto opts = scores.options();
  at::Tensor top = at::empty({R, W}, opts);
  at::Tensor parent = at::empty({R, W}, opts.dtype(at::kLong));
  at::Tensor code = at::empty({R, W}, opts.dtype(at::kLong));
  std::vector<at::Tensor> chosen;
  for (size_t p = 0; p < parts.size(); ++p) chosen.push_back(at::empty({R, W}, parent.options()));
  const float* lpd = lp.data_ptr<float>();
  const float* scd = sc.data_ptr<float>();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, R, 1, [&](int64_t first, int64_t end) {
    std::vector<Cand> heap;  // the W best so far; heap[0] the worst of them
    heap.reserve(W);
    for (int64_t r = first; r < end; ++r) {
      heap.clear();
      for (int64_t b = 0; b < B; ++b) {
        const float base = scd[r * B + b];
        if (base == neg_inf) continue;  // a dead beam has no continuation
        const float* row = lpd + (r * B + b) * K;
        const int64_t at0 = (r * B + b) * K;
        for (int64_t c = 0; c < K; ++c) {
          bool ok = false;
          for (const int64_t* e : ed) ok = ok || e[at0 + c] >= 0;
          if (!ok) continue;
          const Cand cand{base + row[c], b * K + c};
          if (cand.first == neg_inf) continue;
          if (static_cast<int64_t>(heap.size()) < W) {
            heap.push_back(cand);
            std::push_heap(heap.begin(), heap.end(), better);
          } else if (better(cand, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.back() = cand;
            std::push_heap(heap.begin(), heap.end(), better);
          }
        }
      }
      std::sort_heap(heap.begin(), heap.end(), better);  // best first
      float* t = top.data_ptr<float>() + r * W;
      int64_t* pa = parent.data_ptr<int64_t>() + r * W;
      int64_t* co = code.data_ptr<int64_t>() + r * W;
      const int64_t found = static_cast<int64_t>(heap.size());
      for (int64_t j = 0; j < W; ++j) {
        const bool live = j < found;
        const int64_t idx = live ? heap[j].second : 0;
        t[j] = live ? heap[j].first : neg_inf;
        pa[j] = idx / K;
        co[j] = idx % K;
        for (size_t p = 0; p < parts.size(); ++p) {
          chosen[p].data_ptr<int64_t>()[r * W + j] = live ? ed[p][r * B * K + idx] : -1;
        }
      }
    }
  });
  std::vector<at::Tensor> out{top, parent, code};
  out.insert(out.end(), chosen.begin(), chosen.end());
  return out;
}

TORCH_LIBRARY_FRAGMENT(genrec_cpu, m) {
  m.def("beam_select(Tensor logp, Tensor scores, Tensor[] edges, int width) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(genrec_cpu, CPU, m) { m.impl("beam_select", &beam_select); }
