// Cascade attention on the CPU (fp32): each task is a run of query rows of one request that
// attends to a range of "shared" keys (its request's prefix, all visible) and to a range of
// "own" keys (its branch, or its own prefix rows) under a causal rule. Per task and KV head,
// the grouped query heads are stacked into one tile, so one pair of matrix products serves
// them all; the scores of a tile sit in one buffer and are normalised once (no log-sum-exp
// merge, no padded grids). Matrix products go through the BLAS that torch links (sgemm_).
#include <torch/library.h>

#include "kernel_math.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <vector>

namespace {

using genrec_kernels::exp_shift;
using genrec_kernels::gemm;
using genrec_kernels::norm_rotary;
using genrec_kernels::Vec;

// Task columns.
enum : int64_t { kQStart, kQLen, kSharedStart, kSharedLen, kOwnSource, kOwnStart, kOwnBefore,
                 kTaskCols };

}  // namespace

// q [Tq, H, D] (rows strided, heads and dims dense); shared_k/v, branch_k/v: [rows, Hkv, D]
// (rows strided). tasks [NT, 7] int64: q_start, q_len, shared_start, shared_len, own_source
// (0: branch_k/v, 1: shared_k/v), own_start, own_before. Query t of a task (row q_start + t)
// sees shared rows [shared_start, +shared_len) and own rows [own_start, +own_before + t + 1).
// Returns out [Tq, H, D]; rows no task covers are left uninitialised.
//
// With ``cos`` and ``sin`` (both [Tq, D]: cos, and sin negated on the first half), q is raw:
// each query head gets x * r * weight (r = 1/sqrt(mean(x^2) + eps), eps per row from
// ``row_eps`` [Tq] or ``eps``; only with ``weight`` [D]) and then the rotary embedding
// (rotate-half convention) as it is gathered.
at::Tensor cascade_attention(const at::Tensor& q, const at::Tensor& shared_k,
                             const at::Tensor& shared_v, const at::Tensor& branch_k,
                             const at::Tensor& branch_v, const at::Tensor& tasks, double scale,
                             const std::optional<at::Tensor>& cos,
                             const std::optional<at::Tensor>& sin,
                             const std::optional<at::Tensor>& weight,
                             const std::optional<at::Tensor>& row_eps, double eps) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.dim() == 3, "q: float32 [T, H, D]");
  const int64_t H = q.size(1), D = q.size(2), Hkv = shared_k.size(1);
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "query heads must be a multiple of key heads");
  const int64_t G = H / Hkv;
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == D, "q: heads and dims must be dense");
  for (const auto* t : {&shared_k, &shared_v, &branch_k, &branch_v}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 3 && t->size(1) == Hkv &&
                t->size(2) == D && t->stride(2) == 1 && t->stride(1) == D,
                "keys/values: float32 [rows, Hkv, D] with dense heads and dims");
  }
  auto task = tasks.contiguous();
  TORCH_CHECK(task.scalar_type() == at::kLong && task.dim() == 2 && task.size(1) == kTaskCols,
              "tasks: int64 [NT, 7]");
  const int64_t n_tasks = task.size(0);
  const int64_t* td = task.data_ptr<int64_t>();
  int64_t max_m = 1, max_n = 1;
  for (int64_t i = 0; i < n_tasks; ++i) {
    const int64_t* t = td + i * kTaskCols;
    max_m = std::max(max_m, G * t[kQLen]);
    max_n = std::max(max_n, t[kSharedLen] + t[kOwnBefore] + t[kQLen]);
  }
  auto out = at::empty({q.size(0), H, D}, q.options());
  const float* qd = q.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const int64_t sq = q.stride(0);
  const float fscale = static_cast<float>(scale);
  const bool rope = cos.has_value();
  TORCH_CHECK(rope == sin.has_value() && (rope || !weight.has_value()),
              "cos and sin come together; a head-norm weight needs them");
  TORCH_CHECK(D % 2 == 0 || !rope, "rotary needs an even head dim");
  const float *cd = nullptr, *sd = nullptr, *wd = nullptr, *ed = nullptr;
  if (rope) {
    for (const auto* t : {&*cos, &*sin}) {
      TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 &&
                  t->size(0) == q.size(0) && t->size(1) == D, "cos/sin: float32 [Tq, D]");
    }
    cd = cos->data_ptr<float>();
    sd = sin->data_ptr<float>();
  }
  if (weight.has_value()) {
    TORCH_CHECK(weight->scalar_type() == at::kFloat && weight->is_contiguous() &&
                weight->numel() == D, "weight: float32 [D]");
    wd = weight->data_ptr<float>();
  }
  if (row_eps.has_value()) {
    TORCH_CHECK(row_eps->scalar_type() == at::kFloat && row_eps->is_contiguous() &&
                row_eps->numel() == q.size(0), "row_eps: float32 [Tq]");
    ed = row_eps->data_ptr<float>();
  }
  const float feps = static_cast<float>(eps);
  // one query head of row ``row`` into ``dst``: (head norm, rotary,) times the softmax scale
  auto load_query = [&](const float* src, int64_t row, float* dst) {
    if (!rope) {
      at::vec::map([fscale](Vec x) { return x * Vec(fscale); }, dst, src, D);
      return;
    }
    float r = fscale;
    if (wd != nullptr) {
      const float ss = at::vec::map_reduce_all<float>(
          [](Vec x) { return x * x; }, [](Vec a, Vec b) { return a + b; }, src, D);
      r = fscale / std::sqrt(ss / D + (ed != nullptr ? ed[row] : feps));
    }
    norm_rotary(src, wd, r, cd + row * D, sd + row * D, D, dst);
  };
  const int64_t total = n_tasks * Hkv;
  std::atomic<int64_t> next{0};
  // one chunk per thread, tasks handed out dynamically (their costs differ)
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> qt(max_m * D), s(max_m * max_n), o(max_m * D), inv(max_m);
    const int saved = MKL_Set_Num_Threads_Local(1);
    for (int64_t job = next++; job < total; job = next++) {
      const int64_t* t = td + (job / Hkv) * kTaskCols;
      const int64_t g = job % Hkv, n = t[kQLen], m_rows = G * n;
      const int64_t sl = t[kSharedLen], ob = t[kOwnBefore], cols = sl + ob + n;
      const at::Tensor& ok = t[kOwnSource] ? shared_k : branch_k;
      const at::Tensor& ov = t[kOwnSource] ? shared_v : branch_v;
      const float* sk = shared_k.data_ptr<float>() + t[kSharedStart] * shared_k.stride(0) + g * D;
      const float* sv = shared_v.data_ptr<float>() + t[kSharedStart] * shared_v.stride(0) + g * D;
      const float* okd = ok.data_ptr<float>() + t[kOwnStart] * ok.stride(0) + g * D;
      const float* ovd = ov.data_ptr<float>() + t[kOwnStart] * ov.stride(0) + g * D;
      // tile row r = h * n + i: query head g * G + h of row q_start + i, pre-scaled
      for (int64_t h = 0; h < G; ++h) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t row = t[kQStart] + i;
          load_query(qd + row * sq + (g * G + h) * D, row, qt.data() + (h * n + i) * D);
        }
      }
      // scores S [m_rows, cols] (row-major, row stride max_n) = tile . keys^T
      if (sl > 0) {
        gemm('T', 'N', sl, m_rows, D, sk, shared_k.stride(0), qt.data(), D, 0.0f, s.data(),
             max_n);
      }
      gemm('T', 'N', ob + n, m_rows, D, okd, ok.stride(0), qt.data(), D, 0.0f, s.data() + sl,
           max_n);
      for (int64_t r = 0; r < m_rows; ++r) {
        const int64_t valid = sl + ob + r % n + 1;  // causal among the own keys
        float* row = s.data() + r * max_n;
        const float sum = exp_shift(row, valid);
        std::fill(row + valid, row + cols, 0.0f);
        inv[r] = 1.0f / sum;
      }
      // out tile [m_rows, D] = P . values
      if (sl > 0) {
        gemm('N', 'N', D, m_rows, sl, sv, shared_v.stride(0), s.data(), max_n, 0.0f, o.data(), D);
      }
      gemm('N', 'N', D, m_rows, ob + n, ovd, ov.stride(0), s.data() + sl, max_n,
           sl > 0 ? 1.0f : 0.0f, o.data(), D);
      for (int64_t h = 0; h < G; ++h) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t r = h * n + i;
          const float w = inv[r];
          at::vec::map([w](Vec x) { return x * Vec(w); },
                       od + ((t[kQStart] + i) * H + g * G + h) * D, o.data() + r * D, D);
        }
      }
    }
    MKL_Set_Num_Threads_Local(saved);
  });
  return out;
}

TORCH_LIBRARY(genrec_cpu, m) {
  m.def("cascade_attention(Tensor q, Tensor shared_k, Tensor shared_v, Tensor branch_k, "
        "Tensor branch_v, Tensor tasks, float scale, Tensor? cos=None, Tensor? sin=None, "
        "Tensor? weight=None, Tensor? row_eps=None, float eps=0.0) -> Tensor");
}

TORCH_LIBRARY_IMPL(genrec_cpu, CPU, m) { m.impl("cascade_attention", &cascade_attention); }
