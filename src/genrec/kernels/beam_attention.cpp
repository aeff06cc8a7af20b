// A beam step's attention on the CPU (fp32): every beam of a request reads the request's
// shared prefix keys and its own few tail keys (through the search's ancestry slots).
#include "kernel_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace genrec_kernels {
namespace {

// row[0, n) = softmax(row[0, n)) (n >= 1)
void softmax(float* row, int64_t n) {
  const float inv = 1.0f / exp_shift(row, n);
  at::vec::map([inv](Vec x) { return x * Vec(inv); }, row, row, n);
}

}  // namespace

// One beam step's attention: beam b (request r = b / width) attends to its request's prefix
// keys (``plen[r]`` of them from row r * ``cap``) and to its own ``own`` tail keys (rows
// slots[b * own + j] of bk / bv, in level order). Per (request, KV head) the queries of all
// its beams and grouped heads form one tile: one product against the shared prefix (the beams
// of a request share it), the few own keys as dot products, one softmax over both. q rows
// raw: head norm (``qn``, eps per row ``row_eps`` or ``eps``), rotary, softmax scale here.
at::Tensor beam_attention(const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv,
                          const at::Tensor& bk, const at::Tensor& bv,
                          const std::vector<int64_t>& slots, const int64_t* plen, int64_t cap,
                          int64_t width, const float* cd, const float* sd, const float* qn,
                          const float* row_eps, float eps, float scale) {
  const int64_t NB = q.size(0), H = q.size(1), D = q.size(2), Hkv = pk.size(1);
  const int64_t G = H / Hkv, R = NB / width, m = width * G, kvs = Hkv * D;
  const int64_t own = static_cast<int64_t>(slots.size()) / NB;
  const int64_t* sl = slots.data();
  int64_t max_p = 0;
  for (int64_t r = 0; r < R; ++r) max_p = std::max(max_p, plen[r]);
  const int64_t ld = max_p + own;
  auto out = at::empty({NB, H, D}, q.options());
  const float* qd = q.data_ptr<float>();
  const int64_t sq = q.stride(0);
  float* od = out.data_ptr<float>();
  const float *pkd = pk.data_ptr<float>(), *pvd = pv.data_ptr<float>();
  const float *bkd = bk.data_ptr<float>(), *bvd = bv.data_ptr<float>();
  auto body = [&](int64_t first, int64_t end) {
    std::vector<float> qt(m * D), s(m * ld), o(m * D);
    const int saved = MKL_Set_Num_Threads_Local(1);
    for (int64_t job = first; job < end; ++job) {
      const int64_t r = job / Hkv, g = job % Hkv;
      const int64_t pstart = r * cap, used = plen[r], cols = used + own;
      for (int64_t i = 0; i < width; ++i) {  // tile row i * G + h: beam r * width + i
        const int64_t b = r * width + i;
        for (int64_t h = 0; h < G; ++h) {
          const float* src = qd + b * sq + (g * G + h) * D;
          float rr = scale;
          if (qn != nullptr) {
            const float e = row_eps != nullptr ? row_eps[b] : eps;
            rr = scale / std::sqrt(sum_squares(src, D) / D + e);
          }
          norm_rotary(src, qn, rr, cd + b * D, sd + b * D, D, qt.data() + (i * G + h) * D);
        }
      }
      if (used > 0) {  // S[:, :used] = tile . prefix keys^T
        gemm('T', 'N', used, m, D, pkd + pstart * kvs + g * D, kvs, qt.data(), D, 0.0f,
             s.data(), ld);
      }
      for (int64_t row = 0; row < m; ++row) {
        const int64_t b = r * width + row / G;
        const float* qr = qt.data() + row * D;
        float* sr = s.data() + row * ld;
        for (int64_t j = 0; j < own; ++j) {
          const float* k = bkd + sl[b * own + j] * kvs + g * D;
          sr[used + j] = at::vec::map2_reduce_all<float>(
              [](Vec a, Vec c) { return a * c; }, [](Vec a, Vec c) { return a + c; }, qr, k, D);
        }
        softmax(sr, cols);
      }
      if (used > 0) {  // O = P[:, :used] . prefix values
        gemm('N', 'N', D, m, used, pvd + pstart * kvs + g * D, kvs, s.data(), ld, 0.0f,
             o.data(), D);
      } else {
        std::fill(o.begin(), o.end(), 0.0f);
      }
      for (int64_t row = 0; row < m; ++row) {
        const int64_t i = row / G, h = row % G, b = r * width + i;
        float* orow = o.data() + row * D;
        for (int64_t j = 0; j < own; ++j) {
          const float p = s[row * ld + used + j];
          const float* v = bvd + sl[b * own + j] * kvs + g * D;
          at::vec::map2([p](Vec a, Vec c) { return a + Vec(p) * c; }, orow, orow, v, D);
        }
        std::memcpy(od + (b * H + g * G + h) * D, orow, D * sizeof(float));
      }
    }
    MKL_Set_Num_Threads_Local(saved);
  };
  at::parallel_for(0, R * Hkv, 1, body);
  return out;
}

}  // namespace genrec_kernels
