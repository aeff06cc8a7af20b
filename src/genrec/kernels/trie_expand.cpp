// The edges of trie nodes by code on the CPU: one pass over each node's CSR row (a Semantic-ID
// trie level too sparse for a dense table), in place of ~12 tensor operations, or a copy of
// each node's row of a dense level's table (in place of ~5).
#include <torch/library.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace {

template <typename P, typename C>
void expand_rows(const int64_t* nodes, int64_t n, const P* row_ptr, int64_t num_nodes,
                 const C* codes, int64_t num_edges, int64_t k, int64_t* out) {
  std::fill(out, out + n * k, -1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t node = nodes[i];
    if (node < 0) continue;  // no node: no edges
    TORCH_CHECK(node < num_nodes, "node id beyond the trie level");
    const int64_t first = row_ptr[node], end = row_ptr[node + 1];
    TORCH_CHECK(first >= 0 && first <= end && end <= num_edges, "corrupt trie row");
    for (int64_t e = first; e < end; ++e) {
      const int64_t code = codes[e];
      TORCH_CHECK(code >= 0 && code < k, "trie code beyond the codebook");
      out[i * k + code] = e;
    }
  }
}

template <typename P>
void dispatch_codes(const int64_t* nodes, int64_t n, const P* row_ptr, int64_t num_nodes,
                    const at::Tensor& codes, int64_t k, int64_t* out) {
  const int64_t m = codes.numel();
  if (codes.scalar_type() == at::kShort) {
    expand_rows(nodes, n, row_ptr, num_nodes, codes.data_ptr<int16_t>(), m, k, out);
  } else if (codes.scalar_type() == at::kInt) {
    expand_rows(nodes, n, row_ptr, num_nodes, codes.data_ptr<int32_t>(), m, k, out);
  } else {
    TORCH_CHECK(codes.scalar_type() == at::kLong, "codes: int16, int32 or int64");
    expand_rows(nodes, n, row_ptr, num_nodes, codes.data_ptr<int64_t>(), m, k, out);
  }
}

template <typename I>
void expand_table(const int64_t* nodes, int64_t n, const I* table, int64_t num_nodes, int64_t k,
                  int64_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t node = nodes[i];
    int64_t* row = out + i * k;
    if (node < 0) {  // no node: no edges
      std::fill(row, row + k, -1);
      continue;
    }
    TORCH_CHECK(node < num_nodes, "node id beyond the trie level");
    std::copy(table + node * k, table + (node + 1) * k, row);
  }
}

std::vector<int64_t> with_codes(const at::Tensor& nodes, int64_t k) {
  std::vector<int64_t> shape(nodes.sizes().begin(), nodes.sizes().end());
  shape.push_back(k);
  return shape;
}

}  // namespace

// nodes [...] int64 (negative: none) and a dense level's ``table`` [level nodes, k] (int32 /
// int64; -1 where a node has no such code) -> int64 [..., k]: the table's rows of the nodes.
at::Tensor trie_expand_dense(const at::Tensor& nodes, const at::Tensor& table) {
  TORCH_CHECK(nodes.scalar_type() == at::kLong, "nodes: int64");
  TORCH_CHECK(table.dim() == 2 && table.is_contiguous(), "table: contiguous [nodes, k]");
  const at::Tensor flat = nodes.contiguous();
  const int64_t k = table.size(1);
  at::Tensor out = at::empty(with_codes(nodes, k), nodes.options());
  if (table.scalar_type() == at::kInt) {
    expand_table(flat.data_ptr<int64_t>(), flat.numel(), table.data_ptr<int32_t>(),
                 table.size(0), k, out.data_ptr<int64_t>());
  } else {
    TORCH_CHECK(table.scalar_type() == at::kLong, "table: int32 or int64");
    expand_table(flat.data_ptr<int64_t>(), flat.numel(), table.data_ptr<int64_t>(),
                 table.size(0), k, out.data_ptr<int64_t>());
  }
  return out;
}

// nodes [...] int64 (negative: none), a level's CSR ``row_ptr`` [nodes + 1] (int32 / int64)
// and edge ``codes`` [edges] -> int64 [..., k]: the edge of each (node, code), -1 where none.
at::Tensor trie_expand(const at::Tensor& nodes, const at::Tensor& row_ptr,
                       const at::Tensor& codes, int64_t k) {
  TORCH_CHECK(nodes.scalar_type() == at::kLong, "nodes: int64");
  TORCH_CHECK(row_ptr.dim() == 1 && row_ptr.is_contiguous() && codes.is_contiguous(),
              "row_ptr, codes: contiguous");
  const at::Tensor flat = nodes.contiguous();
  at::Tensor out = at::empty(with_codes(nodes, k), nodes.options());
  const int64_t n = flat.numel(), num_nodes = row_ptr.numel() - 1;
  if (row_ptr.scalar_type() == at::kInt) {
    dispatch_codes(flat.data_ptr<int64_t>(), n, row_ptr.data_ptr<int32_t>(), num_nodes, codes,
                   k, out.data_ptr<int64_t>());
  } else {
    TORCH_CHECK(row_ptr.scalar_type() == at::kLong, "row_ptr: int32 or int64");
    dispatch_codes(flat.data_ptr<int64_t>(), n, row_ptr.data_ptr<int64_t>(), num_nodes, codes,
                   k, out.data_ptr<int64_t>());
  }
  return out;
}

TORCH_LIBRARY_FRAGMENT(genrec_cpu, m) {
  m.def("trie_expand(Tensor nodes, Tensor row_ptr, Tensor codes, int k) -> Tensor");
  m.def("trie_expand_dense(Tensor nodes, Tensor table) -> Tensor");
}

TORCH_LIBRARY_IMPL(genrec_cpu, CPU, m) {
  m.impl("trie_expand", &trie_expand);
  m.impl("trie_expand_dense", &trie_expand_dense);
}
