// Fused paged block-sparse decode for the CPU (fp32): page selection and attention in one pass.
//
// Two OpenMP loops in one parallel region. (1) Page scores from the page summaries (Quest's
// bound, max over the GQA group, or the centroid), one task per (sequence, chunk of pages) over
// every KV head: a page's summary rows of all heads are contiguous, so a task streams through
// memory (a task per (sequence, head) reads 1 of every H_kv rows: scoring took ~1.7x as long).
// (2) One task per (sequence, KV head): keep the sink, the recent window and the top pages by
// score (the rule of selection.py), then attend the group's query heads to those pages' valid
// tokens, read in place from the paged cache. The torch backend does the same in ~25 ops per
// layer that each write their result to memory (scores, a top-k, a compaction, a row index, a
// gather of the chosen K/V, SDPA). At 4K context x 8 sequences x a 512-token budget, what this
// reads (summaries 3 MB, chosen K/V 6 MB per layer) takes about as long as the run itself
// (~1 ms on 2 cores): it is bound by memory bandwidth.
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

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// Quest's upper bound on q.k over the page's keys: sum_d max(q_d * max_d, q_d * min_d).
inline float quest_bound(const float* __restrict q, const float* __restrict hi,
                         const float* __restrict lo, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < n; ++d) acc += std::max(q[d] * hi[d], q[d] * lo[d]);
  return acc;
}

// Scores of sequence b's pages [begin, end) for every KV head, into scores (B, H_kv, max_pages).
// kDim > 0 fixes the head dim at compile time; 0 takes it from `a`.
template <int kDim>
void score_pages(const Args& a, int64_t b, int64_t begin, int64_t end, float* scores,
                 int64_t max_pages, std::vector<float>& q_mean) {
  const int64_t group = a.num_q_heads / a.num_kv_heads, dim = kDim > 0 ? kDim : a.head_dim;
  const int32_t* row = a.page_table + b * a.table_cols;
  const bool centroid = a.score_b == nullptr;
  for (int64_t h = 0; h < a.num_kv_heads && centroid; ++h) {
    const float* qg = a.q + (b * a.num_q_heads + h * group) * dim;
    for (int64_t d = 0; d < dim; ++d) {
      float s = 0.f;
      for (int64_t g = 0; g < group; ++g) s += qg[g * dim + d];
      q_mean[h * dim + d] = s / static_cast<float>(group);
    }
  }
  for (int64_t p = begin; p < end; ++p) {
    const int64_t base = static_cast<int64_t>(row[p]) * a.num_kv_heads * dim;
    for (int64_t h = 0; h < a.num_kv_heads; ++h) {
      const int64_t off = base + h * dim;
      const float* qg = a.q + (b * a.num_q_heads + h * group) * dim;
      float score;
      if (centroid) {
        score = dot(q_mean.data() + h * dim, a.score_a + off, dim);
      } else {
        score = -std::numeric_limits<float>::infinity();
        for (int64_t g = 0; g < group; ++g)
          score = std::max(score, quest_bound(qg + g * dim, a.score_a + off, a.score_b + off, dim));
      }
      scores[(b * a.num_kv_heads + h) * max_pages + p] = score;
    }
  }
}

// The logical pages (b, h) attends to, ascending, into `pages` (scores from score_pages).
void select(const Args& a, int64_t b, int64_t h, const float* scores, int64_t max_pages,
            std::vector<int32_t>& pages, std::vector<std::pair<float, int32_t>>& scored) {
  const int64_t n = (a.seq_lens[b] + a.page_size - 1) / a.page_size;
  const int64_t budget = a.budgets ? a.budgets[b] : n;
  pages.clear();
  if (n <= budget || a.score_a == nullptr) {
    for (int32_t p = 0; p < n; ++p) pages.push_back(p);
    return;
  }
  const int64_t first = a.num_sink, last = n - a.num_recent;  // candidates [first, last)
  const float* row_scores = scores + (b * a.num_kv_heads + h) * max_pages;
  scored.clear();
  for (int64_t p = first; p < last; ++p) scored.emplace_back(row_scores[p], int32_t(p));
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
  const Args a{q,       k_cache,     v_cache,      page_table, table_cols, seq_lens,
               budgets, score_a,     score_b,      batch,      num_q_heads, num_kv_heads,
               head_dim, page_size,  num_sink,     num_recent, scale,      out};
  const int64_t num_tasks = batch * num_kv_heads;
  // (1) scores of the sparse rows' candidate pages, in chunks of pages; (2) selection + attention.
  constexpr int64_t kChunk = 64;  // pages per scoring task: 8 sequences x 4K (258 pages) make 40 tasks
  int64_t max_pages = 0;
  for (int64_t b = 0; b < batch; ++b)
    max_pages = std::max<int64_t>(max_pages, (seq_lens[b] + page_size - 1) / page_size);
  const int64_t chunks = (max_pages + kChunk - 1) / kChunk;
  std::vector<float> scores(score_a ? batch * num_kv_heads * max_pages : 0);
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<int32_t> pages;
    std::vector<std::pair<float, int32_t>> scored;
    std::vector<float> logits, q_mean(num_kv_heads * head_dim), scratch(head_dim);
    if (score_a != nullptr) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < batch * chunks; ++task) {
        const int64_t b = task / chunks, c = task % chunks;
        const int64_t n = (seq_lens[b] + page_size - 1) / page_size;
        const int64_t budget = budgets ? budgets[b] : n;
        if (n <= budget) continue;  // attended densely: no scores needed
        const int64_t begin = std::max<int64_t>(c * kChunk, num_sink);
        const int64_t end = std::min<int64_t>((c + 1) * kChunk, n - num_recent);
        if (begin >= end) continue;
        if (head_dim == 64) {
          score_pages<64>(a, b, begin, end, scores.data(), max_pages, q_mean);
        } else {
          score_pages<0>(a, b, begin, end, scores.data(), max_pages, q_mean);
        }
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_tasks; ++task) {
      const int64_t b = task / num_kv_heads, h = task % num_kv_heads;
      select(a, b, h, scores.data(), max_pages, pages, scored);
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

// Multi-query dense decode: the verify pass of speculative decoding. Rows starts[s]..starts[s+1]-1
// of q are sequence s's query tokens (its last cached token and its drafts, whose K/V are already
// in the cache), row r attending to the sequence's tokens [0, lens[r]): causal among the new rows
// by their lengths. One task per (sequence, KV head) reads each key and value row once for all the
// sequence's R x G query heads, where R decode rows would read them R times; nothing is gathered.
namespace {

struct MultiQueryArgs {
  const float* q;             // (N, H_q, D)
  const float* k_cache;       // (num_pages, PAGE, H_kv, D)
  const float* v_cache;       // (num_pages, PAGE, H_kv, D)
  const int32_t* page_table;  // (S, table_cols)
  int64_t table_cols;
  const int32_t* starts;  // (S + 1,) first row of each sequence, then N
  const int32_t* lens;    // (N,) tokens row r attends to, its own included
  int64_t num_q_heads, num_kv_heads, head_dim, page_size;
  float scale;
  float* out;  // (N, H_q, D)
};

template <int kDim>
void attend_rows(const MultiQueryArgs& a, int64_t s, int64_t h, std::vector<float>& logits,
                 std::vector<float>& acc, std::vector<float>& tile) {
  const int64_t dim = kDim > 0 ? kDim : a.head_dim;
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  const int64_t first = a.starts[s], rows = a.starts[s + 1] - first;
  if (rows <= 0) return;
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) longest = std::max<int64_t>(longest, a.lens[first + r]);
  const int64_t num_queries = rows * group;  // query (r, g) at index r * group + g
  const int64_t stride = a.num_kv_heads * dim;  // floats between consecutive tokens of a head
  const int32_t* table = a.page_table + s * a.table_cols;
  logits.resize(num_queries * longest);
  acc.assign(num_queries * dim, 0.f);
  float* lg = logits.data();
  auto query = [&](int64_t r, int64_t g) {
    return a.q + ((first + r) * a.num_q_heads + h * group + g) * dim;
  };
  auto token_row = [&](const float* cache, int64_t t) {
    const int64_t page = table[t / a.page_size];
    return cache + ((page * a.page_size + t % a.page_size) * a.num_kv_heads + h) * dim;
  };
  // (1) logits, a tile of up to kTile consecutive tokens of one page at a time: the tile's keys
  // transposed once (D x kTile), so that each query's kTile logits accumulate in one vector with
  // no horizontal sum per logit (a dot product per (token, query) spent most of its time in
  // those sums: 15 queries per key made the pass 2.7 dense decode steps at 8K context).
  constexpr int64_t kTile = 16;
  float* kt = tile.data();  // (D, kTile)
  for (int64_t t0 = 0; t0 < longest;) {
    const int64_t n = std::min({kTile, a.page_size - t0 % a.page_size, longest - t0});
    const float* keys = token_row(a.k_cache, t0);  // the tile's rows: `stride` floats apart
    for (int64_t d = 0; d < dim; ++d) {
      for (int64_t t = 0; t < n; ++t) kt[d * kTile + t] = keys[t * stride + d];
      for (int64_t t = n; t < kTile; ++t) kt[d * kTile + t] = 0.f;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t visible = std::min<int64_t>(n, a.lens[first + r] - t0);
      if (visible <= 0) continue;
      for (int64_t g = 0; g < group; ++g) {
        const float* qv = query(r, g);
        float sums[kTile] = {};
        for (int64_t d = 0; d < dim; ++d) {
          const float qd = qv[d];
#pragma omp simd
          for (int64_t t = 0; t < kTile; ++t) sums[t] += qd * kt[d * kTile + t];
        }
        float* l = lg + (r * group + g) * longest + t0;
        for (int64_t t = 0; t < visible; ++t) l[t] = sums[t] * a.scale;
      }
    }
    t0 += n;
  }
  // (2) softmax of each query over its own tokens.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = a.lens[first + r];
    for (int64_t g = 0; g < group; ++g) {
      float* l = lg + (r * group + g) * longest;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < len; ++j) m = std::max(m, l[j]);
      float sum = 0.f;
      for (int64_t j = 0; j < len; ++j) {
        l[j] = std::exp(l[j] - m);
        sum += l[j];
      }
      const float inv = 1.f / sum;
      for (int64_t j = 0; j < len; ++j) l[j] *= inv;
    }
  }
  // (3) the weighted values, queries in blocks of kBlock whose accumulators stay in registers
  // while the value rows stream past (one pass over the values per block).
  if constexpr (kDim > 0) {
    constexpr int64_t kBlock = 4;
    for (int64_t i0 = 0; i0 < num_queries; i0 += kBlock) {
      const int64_t nb = std::min<int64_t>(kBlock, num_queries - i0);
      int64_t until = 0;  // tokens any query of the block sees
      for (int64_t i = i0; i < i0 + nb; ++i)
        until = std::max<int64_t>(until, a.lens[first + i / group]);
      float block[kBlock][kDim] = {};
      for (int64_t t = 0; t < until; ++t) {
        const float* v = token_row(a.v_cache, t);
        for (int64_t b = 0; b < kBlock; ++b) {
          const int64_t i = i0 + b;
          const float wt = b < nb && t < a.lens[first + i / group] ? lg[i * longest + t] : 0.f;
#pragma omp simd
          for (int64_t d = 0; d < kDim; ++d) block[b][d] += wt * v[d];
        }
      }
      for (int64_t b = 0; b < nb; ++b)
        std::copy(block[b], block[b] + kDim, acc.data() + (i0 + b) * kDim);
    }
  } else {
    for (int64_t t = 0; t < longest; ++t) {
      const float* v = token_row(a.v_cache, t);
      for (int64_t i = 0; i < num_queries; ++i) {
        if (t >= a.lens[first + i / group]) continue;
        const float wt = lg[i * longest + t];
        float* out = acc.data() + i * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) out[d] += wt * v[d];
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < group; ++g)
      std::copy(acc.data() + (r * group + g) * dim, acc.data() + (r * group + g + 1) * dim,
                a.out + ((first + r) * a.num_q_heads + h * group + g) * dim);
}

}  // namespace

extern "C" void sparrow_multi_query_decode(const float* q, const float* k_cache,
                                           const float* v_cache, const int32_t* page_table,
                                           int64_t table_cols, const int32_t* starts,
                                           const int32_t* lens, int64_t num_seqs,
                                           int64_t num_q_heads, int64_t num_kv_heads,
                                           int64_t head_dim, int64_t page_size, float scale,
                                           float* out, int num_threads) {
  const MultiQueryArgs a{q,           k_cache,      v_cache,  page_table, table_cols,
                         starts,      lens,         num_q_heads, num_kv_heads, head_dim,
                         page_size,   scale,        out};
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> logits, acc, tile(head_dim * 16);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_seqs * num_kv_heads; ++task) {
      const int64_t s = task / num_kv_heads, h = task % num_kv_heads;
      if (head_dim == 64) {
        attend_rows<64>(a, s, h, logits, acc, tile);
      } else if (head_dim == 128) {
        attend_rows<128>(a, s, h, logits, acc, tile);
      } else {
        attend_rows<0>(a, s, h, logits, acc, tile);
      }
    }
  }
}
