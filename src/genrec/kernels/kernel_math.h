// Helpers shared by genrec's CPU kernels (fp32, vectorised with ATen's Vectorized).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

// the Fortran BLAS torch links (MKL)
extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*,
                       const float*, const float*, const int*, const float*, const int*,
                       const float*, float*, const int*);
extern "C" int MKL_Set_Num_Threads_Local(int);

namespace genrec_kernels {

using Vec = at::vec::Vectorized<float>;

// y = x W^T + b with W in MKL's packed-GEMM form (mkl_gemm.cpp)
at::Tensor mkl_linear(const at::Tensor& x, const at::Tensor& w,
                      const std::optional<at::Tensor>& b);

// y = x W^T + b for a weight genrec packed: an opaque oneDNN tensor (oneDNN's product), or a
// dense fp32 tensor in MKL's packed form (genrec.model.native_gemm picks per weight shape)
inline at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& w,
                                const std::optional<at::Tensor>& b) {
  if (!w.is_mkldnn()) return mkl_linear(x, w, b);
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, std::string_view,
                            c10::List<std::optional<at::Scalar>>,
                            std::optional<std::string_view>)>();
  return op.call(x, w, b, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

// Column-major C[m, n] = op(A) op(B) + beta C.
inline void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int im = m, in = n, ik = k, ia = lda, ib = ldb, ic = ldc;
  const float one = 1.0f;
  sgemm_(&ta, &tb, &im, &in, &ik, &one, a, &ia, b, &ib, &beta, c, &ic);
}

// row[0, n) = exp(row - max(row)) in place (n >= 1); returns their sum (a softmax's
// denominator) and, in ``top``, the maximum
inline float exp_shift(float* row, int64_t n, float* top_out = nullptr) {
  const float top = at::vec::reduce_all<float>(
      [](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, row, n);
  const Vec vtop(top);
  Vec vsum(0.0f);
  int64_t j = 0;
  for (; j + Vec::size() <= n; j += Vec::size()) {
    const Vec e = (Vec::loadu(row + j) - vtop).exp_u20();
    e.store(row + j);
    vsum = vsum + e;
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, vsum);
  for (; j < n; ++j) {
    row[j] = std::exp(row[j] - top);
    sum += row[j];
  }
  if (top_out != nullptr) *top_out = top;
  return sum;
}

inline float sum_squares(const float* x, int64_t n) {
  return at::vec::map_reduce_all<float>([](Vec v) { return v * v; },
                                        [](Vec a, Vec b) { return a + b; }, x, n);
}

// rows [0, n) in parallel chunks of at least ``grain`` rows (the loops are cheap per row)
template <typename F>
inline void for_rows(int64_t n, F&& body, int64_t grain = 32) {
  at::parallel_for(0, n, grain, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) body(t);
  });
}

// dst = rotary(src * r * w) (rotate-half; w may be null), cos / sin rows of [D] (sin negated
// on the first half, as the Python path's signed sine)
inline void norm_rotary(const float* src, const float* w, float r, const float* c,
                        const float* s, int64_t d, float* dst) {
  const int64_t half = d / 2;
  int64_t j = 0;
  if (half % Vec::size() == 0) {
    const Vec vr(r);
    for (; j < half; j += Vec::size()) {
      Vec lo = Vec::loadu(src + j), hi = Vec::loadu(src + half + j);
      if (w != nullptr) {
        lo = lo * Vec::loadu(w + j);
        hi = hi * Vec::loadu(w + half + j);
      }
      ((lo * Vec::loadu(c + j) + hi * Vec::loadu(s + j)) * vr).store(dst + j);
      ((hi * Vec::loadu(c + half + j) + lo * Vec::loadu(s + half + j)) * vr)
          .store(dst + half + j);
    }
  }
  for (; j < half; ++j) {
    const float lo = w != nullptr ? src[j] * w[j] : src[j];
    const float hi = w != nullptr ? src[j + half] * w[j + half] : src[j + half];
    dst[j] = (lo * c[j] + hi * s[j]) * r;
    dst[j + half] = (hi * c[j + half] + lo * s[j + half]) * r;
  }
}

// One beam step's attention (beam_attention.cpp).
at::Tensor beam_attention(const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv,
                          const at::Tensor& bk, const at::Tensor& bv,
                          const std::vector<int64_t>& slots, const int64_t* plen, int64_t cap,
                          int64_t width, const float* cd, const float* sd, const float* qn,
                          const float* row_eps, float eps, float scale);

}  // namespace genrec_kernels

// The cascade attention op (cascade_attention.cpp).
at::Tensor cascade_attention(const at::Tensor& q, const at::Tensor& shared_k,
                             const at::Tensor& shared_v, const at::Tensor& branch_k,
                             const at::Tensor& branch_v, const at::Tensor& tasks, double scale,
                             const std::optional<at::Tensor>& cos,
                             const std::optional<at::Tensor>& sin,
                             const std::optional<at::Tensor>& weight,
                             const std::optional<at::Tensor>& row_eps, double eps);
