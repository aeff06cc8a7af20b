// Products with weights in MKL's packed-GEMM form (cblas_sgemm_pack / cblas_sgemm_compute,
// exported by the MKL that torch links): the weight is reordered once into MKL's internal
// layout, so a product of a few rows (a beam step's 32) skips the per-call copy of the weight
// that a plain GEMM makes. genrec keeps such a weight W [N, K] as a dense fp32 tensor
// [N, cols]: a header of kHeader floats (N, K: checked against every product's input), then
// MKL's buffer (64-byte aligned, as the tensor's storage is). MKL's buffer must not move, and
// a tensor's storage never does.
#include <torch/library.h>

#include "kernel_math.h"

#include <algorithm>
#include <cstring>

namespace {

// MKL's CBLAS enums
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
// the row count MKL is told when packing (its layout does not depend on it)
constexpr int kPackRows = 32;
constexpr int64_t kHeader = 16;  // floats before MKL's buffer: N, K, then unused

}  // namespace

extern "C" {
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest);
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc);
}

namespace genrec_kernels {

at::Tensor mkl_linear(const at::Tensor& x, const at::Tensor& w,
                      const std::optional<at::Tensor>& b) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "x: fp32 [M, K]");
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 2 && w.is_contiguous(),
              "w: an MKL-packed weight (genrec_cpu::mkl_pack)");
  const at::Tensor a = x.stride(1) == 1 ? x : x.contiguous();
  const int64_t m = a.size(0), n = w.size(0), k = a.size(1);
  const float* header = w.data_ptr<float>();
  TORCH_CHECK(w.numel() > kHeader && header[0] == static_cast<float>(n),
              "w: not an MKL-packed weight (genrec_cpu::mkl_pack)");
  TORCH_CHECK(header[1] == static_cast<float>(k), "w: packed for inputs of ",
              static_cast<int64_t>(header[1]), " columns, not ", k);
  at::Tensor y = at::empty({m, n}, a.options());
  if (m == 0) return y;
  float beta = 0.0f;
  if (b.has_value()) {  // C starts as the bias rows: C = x W^T + C
    TORCH_CHECK(b->scalar_type() == at::kFloat && b->numel() == n, "bias: fp32 [N]");
    const at::Tensor bc = b->contiguous();
    const float* bd = bc.data_ptr<float>();
    float* yd = y.data_ptr<float>();
    for (int64_t t = 0; t < m; ++t) std::memcpy(yd + t * n, bd, n * sizeof(float));
    beta = 1.0f;
  }
  cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, n, k, a.data_ptr<float>(),
                      a.stride(0), header + kHeader, n, beta, y.data_ptr<float>(), n);
  return y;
}

}  // namespace genrec_kernels

// W [N, K] fp32 -> MKL's packed form of W^T as a dense fp32 tensor [N, cols]
at::Tensor mkl_pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 2, "weight: fp32 [N, K]");
  const at::Tensor w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(n > 0 && k > 0, "weight: empty");
  TORCH_CHECK(n < (1 << 24) && k < (1 << 24), "weight: dimensions beyond 2^24");
  const int64_t floats =
      kHeader + (cblas_sgemm_pack_get_size(kBMatrix, kPackRows, n, k) + 3) / 4;
  at::Tensor out = at::empty({n, (floats + n - 1) / n}, w.options());
  float* header = out.data_ptr<float>();
  std::fill(header, header + kHeader, 0.0f);
  header[0] = static_cast<float>(n);
  header[1] = static_cast<float>(k);
  cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, kPackRows, n, k, 1.0f, w.data_ptr<float>(), k,
                   header + kHeader);
  return out;
}

// x [M, K] W^T + b with W packed by genrec in either form (oneDNN's or MKL's)
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias) {
  return genrec_kernels::linear_packed(x, weight, bias);
}

TORCH_LIBRARY_FRAGMENT(genrec_cpu, m) {
  m.def("mkl_pack(Tensor weight) -> Tensor");
  m.def("packed_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(genrec_cpu, CPU, m) {
  m.impl("mkl_pack", &mkl_pack);
  m.impl("packed_linear", &packed_linear);
}
TORCH_LIBRARY_IMPL(genrec_cpu, MkldnnCPU, m) { m.impl("packed_linear", &packed_linear); }
