// Fused paged block-sparse decode for the CPU (fp32): page selection and attention in one pass.
//
// One task per (sequence, KV head), spread over OpenMP threads. A task scores its sequence's
// candidate pages from the page summaries (Quest's bound, max over the GQA group, or the
// centroid), keeps the sink, the recent window and the top pages by score (the rule of
// selection.py), then attends the group's query heads to those pages' valid tokens read in
// place from the paged cache. The torch backend does the same in ~25 ops per layer that each
// write their result to memory (scores, a top-k, a compaction, a row index, a gather of the
// chosen K/V, SDPA); at 4K context x 8 sequences x a 512-token budget those cost ~4x this.
//
// Plain C ABI (called through ctypes, no torch headers: builds in ~2 s). The caller checks
// shapes, dtypes, contiguity and page ids (decode_cpu.py); nothing here validates.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace {

struct Args {
  const float* q;           // (B, H_q, D)
  const float* k_cache;     // (num_pages, PAGE, H_kv, D)
  const float* v_cache;     // (num_pages, PAGE, H_kv, D)
  const int32_t* page_table;  // (B, table_cols) physical page of each logical page
  int64_t table_cols;
  const int32_t* seq_lens;  // (B,) tokens cached, the current one included
  const int32_t* budgets;   // (B,) pages per (sequence, KV head); null: every page
  const float* score_a;     // (num_pages, H_kv, D) k_max (quest) or k_mean (centroid); null: dense
  const float* score_b;     // (num_pages, H_kv, D) k_min (quest); null: centroid
  int64_t batch, num_q_heads, num_kv_heads, head_dim, page_size, num_sink, num_recent;
  float scale;
  float* out;  // (B, H_q, D)
};

float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// Quest's upper bound on q.k over the page's keys: sum_d max(q_d * max_d, q_d * min_d).
float quest_bound(const float* __restrict q, const float* __restrict hi, const float* __restrict lo,
                  int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < n; ++d) acc += std::max(q[d] * hi[d], q[d] * lo[d]);
  return acc;
}

// The logical pages (b, h) attends to, ascending, into `pages`.
void select(const Args& a, int64_t b, int64_t h, std::vector<int32_t>& pages,
            std::vector<std::pair<float, int32_t>>& scored, std::vector<float>& q_mean) {
  const int64_t n = (a.seq_lens[b] + a.page_size - 1) / a.page_size;
  const int64_t budget = a.budgets ? a.budgets[b] : n;
  pages.clear();
  if (n <= budget || a.score_a == nullptr) {
    for (int32_t p = 0; p < n; ++p) pages.push_back(p);
    return;
  }
  const int64_t group = a.num_q_heads / a.num_kv_heads, dim = a.head_dim;
  const float* qg = a.q + (b * a.num_q_heads + h * group) * dim;  // (G, D)
  const int32_t* row = a.page_table + b * a.table_cols;
  const bool centroid = a.score_b == nullptr;
  if (centroid) {  // the group's mean query against the page centroid
    for (int64_t d = 0; d < dim; ++d) {
      float s = 0.f;
      for (int64_t g = 0; g < group; ++g) s += qg[g * dim + d];
      q_mean[d] = s / static_cast<float>(group);
    }
  }
  const int64_t first = a.num_sink, last = n - a.num_recent;  // candidates [first, last)
  scored.clear();
  for (int64_t p = first; p < last; ++p) {
    const int64_t off = (static_cast<int64_t>(row[p]) * a.num_kv_heads + h) * dim;
    float score;
    if (centroid) {
      score = dot(q_mean.data(), a.score_a + off, dim);
    } else {
      score = -std::numeric_limits<float>::infinity();
      for (int64_t g = 0; g < group; ++g)
        score = std::max(score, quest_bound(qg + g * dim, a.score_a + off, a.score_b + off, dim));
    }
    scored.emplace_back(score, static_cast<int32_t>(p));
  }
  const int64_t num_top =
      std::min<int64_t>(std::max<int64_t>(0, budget - a.num_sink - a.num_recent), scored.size());
  // Highest score first; equal scores: the earlier page (a deterministic order).
  std::partial_sort(scored.begin(), scored.begin() + num_top, scored.end(),
                    [](const auto& x, const auto& y) {
                      return x.first > y.first || (x.first == y.first && x.second < y.second);
                    });
  for (int32_t p = 0; p < std::min<int64_t>(a.num_sink, n); ++p) pages.push_back(p);
  for (int64_t i = 0; i < num_top; ++i) pages.push_back(scored[i].second);
  for (int64_t p = std::max(last, first); p < n; ++p) pages.push_back(static_cast<int32_t>(p));
  std::sort(pages.begin(), pages.end());
}

// Attention of (b, h)'s G query heads over `pages`: logits page by page, a two-pass softmax, then
// the weighted V rows page by page. kDim > 0 fixes the head dim at compile time, so that a head's
// output accumulates in registers; 0 takes it from `a` (any other head dim).
template <int kDim>
void attend(const Args& a, int64_t b, int64_t h, const std::vector<int32_t>& pages,
            std::vector<float>& logits, std::vector<float>& scratch) {
  const int64_t dim = kDim > 0 ? kDim : a.head_dim;
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  const int64_t len = a.seq_lens[b], page_size = a.page_size;
  const int64_t stride = a.num_kv_heads * dim;  // floats between consecutive tokens of a head
  const int32_t* row = a.page_table + b * a.table_cols;
  const float* qg = a.q + (b * a.num_q_heads + h * group) * dim;  // (G, D)
  const int64_t max_tokens = static_cast<int64_t>(pages.size()) * page_size;
  logits.resize(group * max_tokens);
  float* lg = logits.data();
  auto page_rows = [&](const float* cache, int32_t p) {
    return cache + (static_cast<int64_t>(row[p]) * page_size * a.num_kv_heads + h) * dim;
  };
  auto valid_tokens = [&](int32_t p) {
    return std::min<int64_t>(page_size, len - static_cast<int64_t>(p) * page_size);
  };

  int64_t count = 0;
  for (int32_t p : pages) {
    const int64_t valid = valid_tokens(p);
    const float* keys = page_rows(a.k_cache, p);
    for (int64_t g = 0; g < group; ++g) {
      const float* q = qg + g * dim;
      float* out = lg + g * max_tokens + count;
      for (int64_t t = 0; t < valid; ++t) out[t] = dot(q, keys + t * stride, dim) * a.scale;
    }
    count += valid;
  }
  for (int64_t g = 0; g < group; ++g) {
    float* l = lg + g * max_tokens;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < count; ++j) m = std::max(m, l[j]);
    float sum = 0.f;
    for (int64_t j = 0; j < count; ++j) {
      l[j] = std::exp(l[j] - m);
      sum += l[j];
    }
    const float inv = 1.f / sum;
    for (int64_t j = 0; j < count; ++j) l[j] *= inv;
  }
  float local[kDim > 0 ? kDim : 1];
  float* acc = kDim > 0 ? local : scratch.data();
  for (int64_t g = 0; g < group; ++g) {
    std::fill(acc, acc + dim, 0.f);
    const float* w = lg + g * max_tokens;
    count = 0;
    for (int32_t p : pages) {
      const int64_t valid = valid_tokens(p);
      const float* values = page_rows(a.v_cache, p);
      for (int64_t t = 0; t < valid; ++t) {
        const float* v = values + t * stride;
        const float wt = w[count + t];
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) acc[d] += wt * v[d];
      }
      count += valid;
    }
    std::copy(acc, acc + dim, a.out + (b * a.num_q_heads + h * group + g) * dim);
  }
}

}  // namespace

extern "C" void sparrow_sparse_decode(const float* q, const float* k_cache, const float* v_cache,
                                      const int32_t* page_table, int64_t table_cols,
                                      const int32_t* seq_lens, const int32_t* budgets,
                                      const float* score_a, const float* score_b, int64_t batch,
                                      int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                                      int64_t page_size, int64_t num_sink, int64_t num_recent,
                                      float scale, float* out, int num_threads) {
  const Args a{q,     k_cache,     v_cache,      page_table, table_cols,
               seq_lens, budgets,  score_a,      score_b,    batch,
               num_q_heads, num_kv_heads, head_dim, page_size, num_sink,
               num_recent, scale, out};
  const int64_t num_tasks = batch * num_kv_heads;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<int32_t> pages;
    std::vector<std::pair<float, int32_t>> scored;
    std::vector<float> logits, q_mean(head_dim), scratch(head_dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_tasks; ++task) {
      const int64_t b = task / num_kv_heads, h = task % num_kv_heads;
      select(a, b, h, pages, scored, q_mean);
      if (head_dim == 64) {
        attend<64>(a, b, h, pages, logits, scratch);
      } else if (head_dim == 128) {
        attend<128>(a, b, h, pages, logits, scratch);
      } else {
        attend<0>(a, b, h, pages, logits, scratch);
      }
    }
  }
}
