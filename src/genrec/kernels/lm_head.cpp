// Full-vocabulary log-probabilities of one range of tokens (a Semantic-ID level's codes) on
// the CPU (fp32): the LM head's packed row slices multiplied in turn, each tile reduced into a
// running maximum and sum of exponentials per row while the range's logits are copied out.
#include <torch/library.h>

#include "kernel_math.h"

#include <cmath>
#include <limits>
#include <vector>

using genrec_kernels::exp_shift;
using genrec_kernels::for_rows;
using genrec_kernels::linear_packed;

// hidden [N, H] fp32; slices: the head's rows in slices of ``slice_rows`` (the last may be
// shorter), each packed for oneDNN -> log p(token | row) for tokens offset .. offset+size-1:
// [N, size].
at::Tensor range_logprobs(const at::Tensor& hidden, at::TensorList slices, int64_t slice_rows,
                          int64_t offset, int64_t size) {
  TORCH_CHECK(hidden.scalar_type() == at::kFloat && hidden.dim() == 2 && hidden.is_contiguous(),
              "hidden: fp32 [N, H], contiguous");
  TORCH_CHECK(offset >= 0 && size > 0 && slice_rows > 0, "offset, size, slice_rows");
  const int64_t n = hidden.size(0);
  at::Tensor out = at::empty({n, size}, hidden.options());
  std::vector<float> top(n, -std::numeric_limits<float>::infinity()), total(n, 0.0f);
  float* od = out.data_ptr<float>();
  int64_t covered = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    at::Tensor tile = linear_packed(hidden, slices[i], std::nullopt);  // [N, V_i]
    const int64_t first = static_cast<int64_t>(i) * slice_rows, cols = tile.size(1);
    const int64_t a = std::max(offset, first), b = std::min(offset + size, first + cols);
    float* td = tile.data_ptr<float>();
    for_rows(n, [&](int64_t t) {
      float* row = td + t * cols;
      for (int64_t j = a; j < b; ++j) od[t * size + j - offset] = row[j - first];
      float m = 0.0f;
      const float s = exp_shift(row, cols, &m);  // sum of exp(row - m), m its maximum
      const float new_top = std::max(top[t], m);
      total[t] = total[t] * std::exp(top[t] - new_top) + s * std::exp(m - new_top);
      top[t] = new_top;
    }, 4);  // rows of a whole vocabulary: worth both threads from a few rows
    covered += std::max<int64_t>(0, b - a);
  }
  TORCH_CHECK(covered == size, "the token range lies outside the head's rows");
  for_rows(n, [&](int64_t t) {
    const float lse = std::log(total[t]) + top[t];
    for (int64_t j = 0; j < size; ++j) od[t * size + j] -= lse;
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(genrec_cpu, m) {
  m.def("range_logprobs(Tensor hidden, Tensor[] slices, int slice_rows, int offset, int size) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(genrec_cpu, CPU, m) { m.impl("range_logprobs", &range_logprobs); }
TORCH_LIBRARY_IMPL(genrec_cpu, MkldnnCPU, m) { m.impl("range_logprobs", &range_logprobs); }
