// The decoder's layers in one native call (CPU inference, fp32): for every layer the input
// norm, the q/k/v product, q/k head norms and rotary, the KV cache write, the cascade
// attention, the output product with the residual, the post-attention norm and the SwiGLU MLP.
// The products run over the weights genrec packed (the norms' weights folded in): oneDNN's
// (mkldnn::_linear_pointwise, without post-ops) or MKL's packed GEMM, as native_gemm picked;
// the rest are plain loops, so a forward costs one call instead of ~30 small operators per
// layer.
#include <torch/library.h>

#include "kernel_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>


namespace {

using genrec_kernels::beam_attention;
using genrec_kernels::for_rows;
using genrec_kernels::linear_packed;
using genrec_kernels::norm_rotary;
using genrec_kernels::sum_squares;
using genrec_kernels::Vec;
using OptList = c10::List<std::optional<at::Tensor>>;

// y += other (both [rows, n], contiguous)
void add_into(at::Tensor& y, const at::Tensor& other) {
  float* yd = y.data_ptr<float>();
  const float* od = other.data_ptr<float>();
  at::parallel_for(0, y.numel(), 16384, [&](int64_t a, int64_t b) {
    at::vec::map2([](Vec u, Vec v) { return u + v; }, yd + a, yd + a, od + a, b - a);
  });
}




// silu(gate) * up of gate_up [rows, 2 * inter] (gate columns, then up columns): [rows, inter]
at::Tensor swiglu(const at::Tensor& gate_up) {
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  at::Tensor out = at::empty({rows, inter}, gate_up.options());
  const float* g = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for_rows(rows, [&](int64_t t) {
    at::vec::map2([](Vec x, Vec y) { return x / (Vec(1.0f) + x.neg().exp_u20()) * y; },
                  o + t * inter, g + t * 2 * inter, g + t * 2 * inter + inter, inter);
  }, 8);  // ~1 us a row: a beam step's 32 rows are worth both threads
  return out;
}

const float* opt_data(const OptList& list, size_t i) {
  const std::optional<at::Tensor> t = list.get(i);
  return t.has_value() ? t->data_ptr<float>() : nullptr;
}

std::optional<at::Tensor> opt_at(const OptList& list, size_t i) { return list.get(i); }



}  // namespace

// x [T, hidden] (fp32, contiguous) through every layer and the final norm (weight
// ``final_norm``): [T, hidden], or [K, hidden] for the ``last_rows`` [K] alone.
//
// Per layer l: weights[l * 4 + i] for i = qkv, o, gate_up (gate and up concatenated), down
// (packed by genrec in either form, the norm weights folded into qkv and gate_up), biases the
// same (None: no bias); q_norm / k_norm [D] or None. Caches per layer: prefix
// [R, cap, Hkv, D], branch [NB, tail_cap, Hkv, D] (contiguous). Rotary: angle = position *
// inv_freq [D / 2], cos and sin times ``rope_factor``.
//
// A prompt forward (``width`` 0): ``positions`` [T]; the new keys / values of row t go to the
// flat prefix row write_rows[t]; attention by ``tasks`` as in cascade_attention (own keys in
// the prefix cache). The last layer with ``last_rows``: its keys and values for all rows
// (``last_qkv``: q weight, q bias, kv weight, kv bias), its queries and everything after for
// those rows only, attention by ``last_tasks`` over query rows 0..K-1.
// A beam step (``width`` > 0, one token per beam, beams request-major): beam b of request
// r = b / width sits at position prefix_len[r] + level - 1, writes tail slot level - 1 of its
// row and reads the slots j < level of rows ancestry[b, j] [NB, tail_cap].
//
// ``scale_free`` (head-normed q / k, no q/k/v bias): x goes unscaled into the q/k/v product,
// v is scaled by 1/rms(x) and the head norms take eps * (mean(x^2) + eps) per row.
at::Tensor decoder_layers(
    const at::Tensor& x_in, const std::optional<at::Tensor>& positions,
    const at::Tensor& inv_freq, double rope_factor, at::TensorList weights,
    const OptList& biases, const OptList& q_norm, const OptList& k_norm,
    const at::Tensor& final_norm, at::TensorList prefix_k, at::TensorList prefix_v,
    at::TensorList branch_k, at::TensorList branch_v, const std::optional<at::Tensor>& write_rows,
    const std::optional<at::Tensor>& tasks, const std::optional<at::Tensor>& last_rows,
    const std::optional<at::Tensor>& last_tasks, const OptList& last_qkv,
    const std::optional<at::Tensor>& prefix_len, const std::optional<at::Tensor>& ancestry,
    int64_t width, int64_t level, int64_t heads, int64_t kv_heads, double eps, double head_eps,
    bool scale_free, double scale) {
  const int64_t L = prefix_k.size(), T = x_in.size(0), hidden = x_in.size(1);
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.is_contiguous(), "x: fp32 [T, hidden]");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 4 * L &&
                  static_cast<int64_t>(biases.size()) == 4 * L,
              "weights / biases: 4 per layer");
  TORCH_CHECK(last_qkv.size() == 4, "last_qkv: q weight, q bias, kv weight, kv bias");
  const int64_t D = prefix_k[0].size(-1), qd = heads * D, kvd = kv_heads * D, half = D / 2;
  const int64_t cap = prefix_k[0].size(1);
  const bool beam = width > 0;
  TORCH_CHECK(inv_freq.scalar_type() == at::kFloat && inv_freq.is_contiguous() &&
                  inv_freq.numel() == half, "inv_freq: fp32 [head_dim / 2]");
  TORCH_CHECK(final_norm.scalar_type() == at::kFloat && final_norm.numel() == hidden,
              "final_norm: fp32 [hidden]");
  // per row: position, cache row written; a beam's tail slots (beam after beam)
  std::vector<int64_t> pos(T), wrow(T), slots;
  const int64_t* plen = nullptr;
  if (beam) {
    TORCH_CHECK(prefix_len.has_value() && ancestry.has_value() && T % width == 0 &&
                    !last_rows.has_value() && level >= 1, "a beam step: prefix_len, ancestry");
    const int64_t tail_cap = branch_k[0].size(1), R = T / width;
    TORCH_CHECK(prefix_len->scalar_type() == at::kLong && prefix_len->numel() == R &&
                    prefix_len->is_contiguous(), "prefix_len: int64 [R]");
    TORCH_CHECK(ancestry->scalar_type() == at::kLong && ancestry->is_contiguous() &&
                    ancestry->size(0) == T && ancestry->size(1) == tail_cap &&
                    level <= tail_cap && branch_k[0].size(0) == T,
                "ancestry: int64 [NB, tail_cap], level <= tail_cap");
    plen = prefix_len->data_ptr<int64_t>();
    const int64_t* anc = ancestry->data_ptr<int64_t>();
    slots.resize(T * level);
    for (int64_t b = 0; b < T; ++b) {
      TORCH_CHECK(plen[b / width] >= 0 && plen[b / width] <= cap, "prefix_len beyond the cache");
      pos[b] = plen[b / width] + level - 1;
      wrow[b] = b * tail_cap + level - 1;
      for (int64_t j = 0; j < level; ++j) {
        TORCH_CHECK(anc[b * tail_cap + j] >= 0 && anc[b * tail_cap + j] < T,
                    "ancestry row out of range");
        slots[b * level + j] = anc[b * tail_cap + j] * tail_cap + j;
      }
    }
  } else {
    TORCH_CHECK(positions.has_value() && write_rows.has_value() && tasks.has_value() &&
                    positions->numel() == T && write_rows->numel() == T &&
                    positions->scalar_type() == at::kLong &&
                    write_rows->scalar_type() == at::kLong,
                "a prompt forward: positions, write_rows int64 [T] and tasks");
    const at::Tensor p = positions->contiguous(), w = write_rows->contiguous();
    const int64_t cache_rows = prefix_k[0].numel() / kvd;
    for (int64_t t = 0; t < T; ++t) {
      pos[t] = p.data_ptr<int64_t>()[t];
      wrow[t] = w.data_ptr<int64_t>()[t];
      TORCH_CHECK(wrow[t] >= 0 && wrow[t] < cache_rows, "write row out of the cache");
    }
  }
  // rotary factors [T, D]: cos, and sin negated on the first half
  at::Tensor cos = at::empty({T, D}, x_in.options()), sin = at::empty({T, D}, x_in.options());
  {
    float *c = cos.data_ptr<float>(), *sn = sin.data_ptr<float>();
    const float* f = inv_freq.data_ptr<float>();
    const float factor = static_cast<float>(rope_factor);
    for_rows(T, [&](int64_t t) {
      float* ct = c + t * D;
      float* st = sn + t * D;
      const float p = static_cast<float>(pos[t]);
      for (int64_t j = 0; j < half; ++j) ct[j] = p * f[j];  // angles, then cos / sin of them
      at::vec::map([factor](Vec a) { return a.sin() * Vec(factor); }, st + half, ct, half);
      at::vec::map([factor](Vec a) { return a.cos() * Vec(factor); }, ct, ct, half);
      for (int64_t j = 0; j < half; ++j) {
        ct[half + j] = ct[j];
        st[j] = -st[half + j];
      }
    });
  }
  const float* cd = cos.data_ptr<float>();
  const float* sd = sin.data_ptr<float>();
  const float feps = static_cast<float>(eps), fheps = static_cast<float>(head_eps);
  std::vector<float> ms(T), r(T);
  at::Tensor x = x_in;
  for (int64_t l = 0; l < L; ++l) {
    const bool last = l == L - 1 && last_rows.has_value();
    const float* xd = x.data_ptr<float>();
    for_rows(T, [&](int64_t t) {
      ms[t] = sum_squares(xd + t * hidden, hidden) / hidden + feps;
      r[t] = 1.0f / std::sqrt(ms[t]);
    });
    at::Tensor xin = x;
    if (!scale_free) {
      xin = at::empty_like(x);
      float* dst = xin.data_ptr<float>();
      for_rows(T, [&](int64_t t) {
        const float rt = r[t];
        at::vec::map([rt](Vec v) { return v * Vec(rt); }, dst + t * hidden, xd + t * hidden,
                     hidden);
      });
    }
    // q [Tq, H * D] (row stride q_stride), k and v [T, Hkv * D] (row stride kv_stride)
    at::Tensor qkv, q_src, kv;
    const float *kd, *vd;
    int64_t kv_stride;
    if (!last) {
      qkv = linear_packed(xin, weights[l * 4], opt_at(biases, l * 4));
      q_src = qkv.narrow(1, 0, qd);
      kd = qkv.data_ptr<float>() + qd;
      kv_stride = qd + 2 * kvd;
    } else {
      kv = linear_packed(xin, *last_qkv.get(2), last_qkv.get(3));
      q_src = linear_packed(xin.index_select(0, *last_rows), *last_qkv.get(0),
                            last_qkv.get(1));
      kd = kv.data_ptr<float>();
      kv_stride = 2 * kvd;
    }
    vd = kd + kvd;
    const float* kn = opt_data(k_norm, l);
    float* ckd = (beam ? branch_k[l] : prefix_k[l]).data_ptr<float>();
    float* cvd = (beam ? branch_v[l] : prefix_v[l]).data_ptr<float>();
    for_rows(T, [&](int64_t t) {
      const int64_t row = wrow[t];
      const float* k = kd + t * kv_stride;
      const float* v = vd + t * kv_stride;
      const float vs = scale_free ? r[t] : 1.0f;
      const float he = scale_free ? fheps * ms[t] : fheps;
      for (int64_t h = 0; h < kv_heads; ++h) {
        const float rk = kn ? 1.0f / std::sqrt(sum_squares(k + h * D, D) / D + he) : 1.0f;
        norm_rotary(k + h * D, kn, rk, cd + t * D, sd + t * D, D, ckd + row * kvd + h * D);
      }
      at::vec::map([vs](Vec a) { return a * Vec(vs); }, cvd + row * kvd, v, kvd);
    });
    // attention over the prefix cache and the branch rows
    auto flat = [&](const at::Tensor& c) { return c.view({c.numel() / kvd, kv_heads, D}); };
    const at::Tensor bk = flat(branch_k[l]), bv = flat(branch_v[l]);
    const int64_t Tq = q_src.size(0);
    at::Tensor q = q_src.as_strided({Tq, heads, D}, {q_src.stride(0), D, 1});
    at::Tensor qc = cos, qs = sin;
    std::optional<at::Tensor> row_eps;
    const std::optional<at::Tensor> qn = opt_at(q_norm, l);
    if (last) {
      qc = cos.index_select(0, *last_rows);
      qs = sin.index_select(0, *last_rows);
    }
    if (qn.has_value() && scale_free) {
      at::Tensor e = at::empty({T}, x.options());
      float* ed = e.data_ptr<float>();
      for (int64_t t = 0; t < T; ++t) ed[t] = fheps * ms[t];
      row_eps = last ? e.index_select(0, *last_rows) : e;
    }
    at::Tensor att;
    if (beam) {  // each beam's tail read through its slots
      att = beam_attention(q, flat(prefix_k[l]), flat(prefix_v[l]), bk, bv, slots, plen, cap,
                           width, cd, sd,
                           qn.has_value() ? qn->data_ptr<float>() : nullptr,
                           row_eps.has_value() ? row_eps->data_ptr<float>() : nullptr,
                           fheps, static_cast<float>(scale));
    } else {
      att = cascade_attention(q, flat(prefix_k[l]), flat(prefix_v[l]), bk, bv,
                                       last ? *last_tasks : *tasks, scale, qc, qs, qn, row_eps,
                                       head_eps);
    }
    at::Tensor residual = last ? x.index_select(0, *last_rows) : x;
    at::Tensor x1 = linear_packed(att.view({Tq, qd}), weights[l * 4 + 1],
                                  opt_at(biases, l * 4 + 1));
    add_into(x1, residual);
    // post-attention norm (its weight folded into gate / up), SwiGLU, residual
    at::Tensor h = at::empty_like(x1);
    const float* x1d = x1.data_ptr<float>();
    float* hd = h.data_ptr<float>();
    for_rows(Tq, [&](int64_t t) {
      const float rt = 1.0f / std::sqrt(sum_squares(x1d + t * hidden, hidden) / hidden + feps);
      at::vec::map([rt](Vec v) { return v * Vec(rt); }, hd + t * hidden, x1d + t * hidden,
                   hidden);
    });
    // gate and up in one product, the SwiGLU in one loop (oneDNN's swish / binary post-ops
    // cost more than the products themselves at beam-step sizes; so do its residual adds)
    const at::Tensor inner =
        swiglu(linear_packed(h, weights[l * 4 + 2], opt_at(biases, l * 4 + 2)));
    x = linear_packed(inner, weights[l * 4 + 3], opt_at(biases, l * 4 + 3));
    add_into(x, x1);
  }
  // the final norm, in place
  const int64_t rows = x.size(0);
  float* xd = x.data_ptr<float>();
  const at::Tensor fw = final_norm.contiguous();
  const float* wd = fw.data_ptr<float>();
  for_rows(rows, [&](int64_t t) {
    const float rt = 1.0f / std::sqrt(sum_squares(xd + t * hidden, hidden) / hidden + feps);
    at::vec::map2([rt](Vec v, Vec w) { return v * Vec(rt) * w; }, xd + t * hidden,
                  xd + t * hidden, wd, hidden);
  });
  return x;
}

TORCH_LIBRARY_FRAGMENT(genrec_cpu, m) {
  m.def("decoder_layers(Tensor x, Tensor? positions, Tensor inv_freq, float rope_factor, "
        "Tensor[] weights, Tensor?[] biases, Tensor?[] q_norm, Tensor?[] k_norm, "
        "Tensor final_norm, Tensor[] prefix_k, Tensor[] prefix_v, Tensor[] branch_k, "
        "Tensor[] branch_v, Tensor? write_rows, Tensor? tasks, Tensor? last_rows, "
        "Tensor? last_tasks, Tensor?[] last_qkv, Tensor? prefix_len, Tensor? ancestry, "
        "int width, int level, int heads, int kv_heads, float eps, float head_eps, "
        "bool scale_free, float scale) -> Tensor");
}

// the packed weights are oneDNN tensors: the op serves both keys
TORCH_LIBRARY_IMPL(genrec_cpu, CPU, m) { m.impl("decoder_layers", &decoder_layers); }
TORCH_LIBRARY_IMPL(genrec_cpu, MkldnnCPU, m) { m.impl("decoder_layers", &decoder_layers); }
