// The token index of a batch for a deterministic embedding backward without atomics: the
// distinct tokens in increasing order and, for each, the positions holding it in increasing
// order (CSR). A GPU kernel (kernels/embedding.cu) then sums each table row's gradients in
// position order, exactly as the CPU loop (cpu/embedding.cpp) does, so both give the same bits.
// Made on the host when the batch's tokens are uploaded.
#pragma once

#include <cstdint>
#include <vector>

namespace gnmr {

struct EmbeddingIndex {
  std::vector<int32_t> tokens;     // distinct tokens, increasing
  std::vector<int32_t> offsets;    // tokens.size() + 1: positions[offsets[u] .. offsets[u + 1])
  std::vector<int32_t> positions;  // n positions, grouped by token, increasing within a token
};

inline EmbeddingIndex make_embedding_index(const int32_t* tokens, int64_t n) {
  // Counting sort by token: stable, so positions stay increasing within a token.
  int32_t max_token = -1;
  for (int64_t i = 0; i < n; ++i) max_token = tokens[i] > max_token ? tokens[i] : max_token;
  std::vector<int32_t> count(size_t(max_token + 1), 0);
  for (int64_t i = 0; i < n; ++i) ++count[size_t(tokens[i])];
  EmbeddingIndex index;
  index.offsets.push_back(0);
  std::vector<int32_t> start(count.size(), 0);
  for (size_t t = 0; t < count.size(); ++t) {
    if (count[t] == 0) continue;
    start[t] = index.offsets.back();
    index.tokens.push_back(int32_t(t));
    index.offsets.push_back(index.offsets.back() + count[t]);
  }
  index.positions.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) index.positions[size_t(start[size_t(tokens[i])]++)] = int32_t(i);
  return index;
}

}  // namespace gnmr
