// CPU emulation of the SIMT GEMM kernel, for checking it without a GPU.
//
// Runs the kernel body of gemm_simt_kernel.cuh, compiled as host C++, with one
// std::thread per CUDA thread of a block and a real barrier for
// __syncthreads. cp.async copies are either applied when issued ("early") or
// held back until the cp.async.wait that covers them ("late"), so that a
// missing wait or a stage overwritten while still read shows up as a wrong
// result. Every global access is checked against the buffers of the test
// (bounds, alignment of vector accesses, writes only to D); D is poisoned and
// its elements outside the view must stay poisoned.
//
// Build and run from the repository root with cpp/src/gemm/simt/emulation/run.sh.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/host_barrier.h"
#include "gemm/simt/gemm_simt_kernel.cuh"

namespace samattn::gemm::simt {
namespace emulation {

// ------------------------------------------------------------- global memory ----
struct Region {
  const char* begin;
  const char* end;
  bool writable;
};
std::vector<Region> g_regions;
std::atomic<int> g_access_errors{0};

void report_access_error(const char* what, const void* ptr, int bytes) {
  if (g_access_errors++ < 5) std::printf("    ACCESS ERROR: %s %p (%d bytes)\n", what, ptr, bytes);
}

const Region* find_region(const void* ptr, int bytes) {
  const char* p = static_cast<const char*>(ptr);
  for (const Region& r : g_regions) {
    if (p >= r.begin && p + bytes <= r.end) return &r;
  }
  return nullptr;
}

void check_global_access(const void* ptr, int bytes, bool write) {
  const Region* region = find_region(ptr, bytes);
  if (region == nullptr)
    return report_access_error(write ? "store out of bounds" : "load out of bounds", ptr, bytes);
  if (reinterpret_cast<uintptr_t>(ptr) % bytes != 0)
    return report_access_error("misaligned", ptr, bytes);
  if (write && !region->writable) report_access_error("store to an input", ptr, bytes);
}

// ---------------------------------------------------------- block threading ----
using Barrier = ::samattn::HostBarrier;

enum class CopyTiming { early, late };

struct PendingCopy {
  void* smem;
  unsigned char data[16];
  int bytes;
};

struct ThreadState {
  Barrier* barrier;
  CopyTiming timing;
  std::vector<PendingCopy> open_group;
  std::deque<std::vector<PendingCopy>> committed;
};
thread_local ThreadState* t_state = nullptr;

void block_sync() { t_state->barrier->arrive_and_wait(); }

void cp_async(void* smem, const void* gmem, int bytes, bool pred) {
  PendingCopy copy{smem, {}, bytes};
  if (pred) {
    check_global_access(gmem, bytes, false);
    if (find_region(gmem, bytes) != nullptr) std::memcpy(copy.data, gmem, bytes);
  } else if (find_region(gmem, 1) == nullptr) {
    report_access_error("zero-fill copy from an invalid address", gmem, bytes);
  }
  if (reinterpret_cast<uintptr_t>(smem) % bytes != 0)
    report_access_error("misaligned smem", smem, bytes);
  if (t_state->timing == CopyTiming::early) {
    std::memcpy(smem, copy.data, bytes);
  } else {
    t_state->open_group.push_back(copy);
  }
}

void cp_async_commit() {
  t_state->committed.push_back(std::move(t_state->open_group));
  t_state->open_group.clear();
}

void cp_async_wait(int pending_groups) {
  while (static_cast<int>(t_state->committed.size()) > pending_groups) {
    for (const PendingCopy& c : t_state->committed.front()) std::memcpy(c.smem, c.data, c.bytes);
    t_state->committed.pop_front();
  }
}

}  // namespace emulation

// --------------------------------------------------------------- the tests ----
namespace {

using emulation::CopyTiming;

const char* major_name(Major m) { return m == Major::K ? "K" : "MN"; }

// A strided batched matrix in a host buffer, registered as a global region.
template <class T>
struct Matrix {
  int64_t batch, rows, cols;
  int64_t batch_stride, row_stride, col_stride;
  int64_t offset;  // elements before element (0, 0, 0): alignment tests
  std::vector<T> storage;

  int64_t index(int64_t b, int64_t i, int64_t j) const {
    return offset + b * batch_stride + i * row_stride + j * col_stride;
  }
  T* data() { return storage.data() + offset; }
};

// Layouts a test can ask for.
enum class Layout { row_major, col_major, both_strided, row_major_padded };

template <class T>
Matrix<T> make_matrix(int64_t batch, int64_t rows, int64_t cols, Layout layout, bool broadcast,
                      int64_t offset, std::mt19937& rng, bool fill_nan = false) {
  Matrix<T> m{batch, rows, cols, 0, 0, 0, offset, {}};
  switch (layout) {
    case Layout::row_major:
      m.row_stride = cols;
      m.col_stride = 1;
      break;
    case Layout::row_major_padded:
      m.row_stride = cols + 4;
      m.col_stride = 1;
      break;
    case Layout::col_major:
      m.row_stride = 1;
      m.col_stride = rows;
      break;
    case Layout::both_strided:
      m.row_stride = 3 * cols + 1;
      m.col_stride = 3;
      break;
  }
  const int64_t span =
      rows == 0 || cols == 0 ? 0 : (rows - 1) * m.row_stride + (cols - 1) * m.col_stride + 1;
  m.batch_stride = broadcast ? 0 : span + (layout == Layout::row_major ? 0 : 8);
  const int64_t total = offset + (broadcast ? span : (batch - 1) * m.batch_stride + span) + 8;
  m.storage.resize(total);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& x : m.storage) x = T(fill_nan ? NAN : dist(rng));
  return m;
}

MatrixView view_of(const void* ptr, int64_t bs, int64_t rs, int64_t cs) {
  return MatrixView{ptr, bs, rs, cs};
}

struct Case {
  int64_t batch, m, n, k;
  Layout a_layout, b_layout, c_layout, d_layout;
  bool a_broadcast, b_broadcast, c_broadcast;
  float alpha, beta;
  int64_t a_offset = 0, b_offset = 0;
  int64_t max_grid_yz = 3;  // small, to exercise the y/z batch split
  // The epilogue: a bias per column, an activation, fp32 C and D.
  bool bias = false;
  Activation activation = Activation::none;
  bool out_f32 = false;
};

// The activations in double, from their definitions (gemm/epilogue.h computes them in
// float with the library's formulas).
double activate_reference(Activation activation, double x) {
  switch (activation) {
    case Activation::relu:
      return x < 0 ? 0 : x;
    case Activation::gelu:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::gelu_tanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::silu:
      return x / (1 + std::exp(-x));
    case Activation::none:
      break;
  }
  return x;
}

// C and D are of type Out: T, or float for a case with out_f32.
template <class Traits, class Out = typename Traits::Element>
bool run_case(const Case& tc, CopyTiming timing, std::mt19937& rng) {
  using T = typename Traits::Element;
  using Kernel = SimtGemmKernel<Traits>;
  Matrix<T> a = make_matrix<T>(tc.batch, tc.m, tc.k, tc.a_layout, tc.a_broadcast, tc.a_offset, rng);
  Matrix<T> b = make_matrix<T>(tc.batch, tc.k, tc.n, tc.b_layout, tc.b_broadcast, tc.b_offset, rng);
  Matrix<Out> c = make_matrix<Out>(tc.batch, tc.m, tc.n, tc.c_layout, tc.c_broadcast, 0, rng);
  Matrix<Out> d =
      make_matrix<Out>(tc.batch, tc.m, tc.n, tc.d_layout, false, 0, rng, /*fill_nan=*/true);
  Matrix<T> bias = make_matrix<T>(1, 1, tc.n, Layout::row_major, false, 0, rng);

  GemmProblem p{};
  p.dtype = Traits::kDType;
  p.batch = tc.batch;
  p.m = tc.m;
  p.n = tc.n;
  p.k = tc.k;
  p.a = view_of(a.data(), a.batch_stride, a.row_stride, a.col_stride);
  p.b = view_of(b.data(), b.batch_stride, b.row_stride, b.col_stride);
  p.c = view_of(tc.beta != 0.0f ? c.data() : nullptr, c.batch_stride, c.row_stride, c.col_stride);
  p.d = d.data();
  p.d_batch_stride = d.batch_stride;
  p.d_row_stride = d.row_stride;
  p.d_col_stride = d.col_stride;
  p.alpha = tc.alpha;
  p.beta = tc.beta;
  p.bias = tc.bias ? bias.data() : nullptr;
  p.activation = static_cast<int32_t>(tc.activation);
  p.out_f32 = tc.out_f32;

  SimtParams<T> params;
  SimtGrid grid;
  if (make_simt_params<Traits>(p, &params, &grid, tc.max_grid_yz) != cudaSuccess) {
    std::printf("    make_simt_params refused the case\n");
    return false;
  }

  emulation::g_regions = {
      {reinterpret_cast<const char*>(a.storage.data()),
       reinterpret_cast<const char*>(a.storage.data() + a.storage.size()), false},
      {reinterpret_cast<const char*>(b.storage.data()),
       reinterpret_cast<const char*>(b.storage.data() + b.storage.size()), false},
      {reinterpret_cast<const char*>(d.storage.data()),
       reinterpret_cast<const char*>(d.storage.data() + d.storage.size()), true},
  };
  if (tc.beta != 0.0f) {
    emulation::g_regions.push_back(
        {reinterpret_cast<const char*>(c.storage.data()),
         reinterpret_cast<const char*>(c.storage.data() + c.storage.size()), false});
  }
  if (tc.bias) {
    emulation::g_regions.push_back(
        {reinterpret_cast<const char*>(bias.storage.data()),
         reinterpret_cast<const char*>(bias.storage.data() + bias.storage.size()), false});
  }
  emulation::g_access_errors = 0;

  std::vector<float> smem(Kernel::kSmemBytes / sizeof(float));
  for (int z = 0; z < grid.batch_z; ++z) {
    for (int y = 0; y < grid.batch_y; ++y) {
      const uint32_t batch = y + uint32_t(z) * grid.batch_y;
      if (batch >= params.batch) continue;
      for (int x = 0; x < grid.tiles; ++x) {
        std::fill(smem.begin(), smem.end(), NAN);
        emulation::Barrier barrier(kThreads);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
          threads.emplace_back([&, t] {
            emulation::ThreadState state{&barrier, timing, {}, {}};
            emulation::t_state = &state;
            Kernel{}(params, smem.data(), t, x, batch);
            bool pending = !state.open_group.empty();
            for (auto& g : state.committed) pending |= !g.empty();
            if (pending)
              emulation::report_access_error("cp.async still pending at exit", nullptr, 0);
          });
        }
        for (auto& th : threads) th.join();
      }
    }
  }

  // Reference in double; tolerance from the magnitudes summed.
  const double unit = std::is_same_v<Out, float> ? 1.2e-7 : 4e-3;  // output rounding
  const double accumulation = (tc.k + 3) * 1.2e-7;                 // fp32 sums
  int bad = 0;
  std::vector<bool> in_view(d.storage.size(), false);
  for (int64_t bi = 0; bi < tc.batch; ++bi) {
    for (int64_t i = 0; i < tc.m; ++i) {
      for (int64_t j = 0; j < tc.n; ++j) {
        double sum = 0, magnitude = 0;
        for (int64_t kk = 0; kk < tc.k; ++kk) {
          const double x = static_cast<float>(a.storage[a.index(bi, i, kk)]);
          const double w = static_cast<float>(b.storage[b.index(bi, kk, j)]);
          sum += x * w;
          magnitude += std::fabs(x * w);
        }
        double expect = tc.alpha * sum;
        magnitude *= std::fabs(tc.alpha);
        if (tc.beta != 0.0f) {
          const double cv = static_cast<float>(c.storage[c.index(bi, i, j)]);
          expect += tc.beta * cv;
          magnitude += std::fabs(tc.beta * cv);
        }
        if (tc.bias) {
          const double bv = static_cast<float>(bias.storage[bias.index(0, 0, j)]);
          expect += bv;
          magnitude += std::fabs(bv);
        }
        // Each activation's slope is at most 1.13: the error bound carries over.
        expect = activate_reference(tc.activation, expect);
        const int64_t at = d.index(bi, i, j);
        in_view[at] = true;
        const double got = static_cast<float>(d.storage[at]);
        const double tol = accumulation * magnitude + unit * std::fabs(expect) + 1e-30;
        const double err = std::fabs(got - expect);
        if (!(err <= tol)) {
          if (bad++ < 3)
            std::printf("    D[%ld,%ld,%ld] = %g, expected %g\n", long(bi), long(i), long(j), got,
                        expect);
        }
      }
    }
  }
  for (size_t at = 0; at < d.storage.size(); ++at) {
    if (!in_view[at] && !std::isnan(static_cast<float>(d.storage[at]))) {
      if (bad++ < 3) std::printf("    stray write at D storage %zu\n", at);
    }
  }
  const bool ok = bad == 0 && emulation::g_access_errors == 0;
  if (!ok)
    std::printf("    %d wrong elements, %d access errors\n", bad,
                emulation::g_access_errors.load());
  return ok;
}

std::string describe(const Case& c) {
  static const char* names[] = {"row", "col", "strided", "row+pad"};
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "batch=%ld m=%ld n=%ld k=%ld A=%s%s B=%s%s C=%s%s D=%s alpha=%g beta=%g "
                "bias=%d activation=%d out_f32=%d",
                long(c.batch), long(c.m), long(c.n), long(c.k), names[int(c.a_layout)],
                c.a_broadcast ? "/bcast" : "", names[int(c.b_layout)],
                c.b_broadcast ? "/bcast" : "", names[int(c.c_layout)],
                c.c_broadcast ? "/bcast" : "", names[int(c.d_layout)], c.alpha, c.beta, int(c.bias),
                int(c.activation), int(c.out_f32));
  return buf;
}

// A row-major (m, k) operand is K-major for A; a row-major (k, n) B is N-major.
Layout layout_for_a(Major major) {
  return major == Major::K ? Layout::row_major_padded : Layout::col_major;
}
Layout layout_for_b(Major major) {
  return major == Major::K ? Layout::col_major : Layout::row_major_padded;
}

template <DType DT, Major A, Major B, bool Vectorized, Family F>
int run_config(std::mt19937& rng) {
  using Traits = SimtTraits<SimtGemm<DT, A, B, Vectorized, F>>;
  std::printf("%s %s %s A=%s B=%s\n", F == Family::sm80 ? "sm80" : "sm75",
              DT == DType::f32 ? "f32" : "bf16", Vectorized ? "vectorized" : "strided",
              major_name(A), major_name(B));
  std::vector<Case> cases;
  const Layout d_dense = Layout::row_major;
  if (Vectorized) {
    const Layout la = layout_for_a(A), lb = layout_for_b(B);
    // Sizes: multiples of 4 in the contiguous modes (m for MN-major A, n for
    // N-major B, k for K-major operands); other modes odd.
    auto fit = [](int64_t x, bool multiple_of_4) { return multiple_of_4 ? (x + 3) / 4 * 4 : x; };
    const bool m4 = A == Major::MN, n4 = B == Major::MN, k4 = A == Major::K || B == Major::K;
    for (auto [m, n, k] : {std::array<int64_t, 3>{1, 1, 1},
                           {127, 129, 36},
                           {130, 7, 17},
                           {256, 256, 70},
                           {260, 390, 24},
                           {5, 260, 3}}) {
      cases.push_back({1, fit(m, m4), fit(n, n4), fit(k, k4), la, lb, Layout::row_major, d_dense,
                       false, false, false, 1.0f, 0.0f});
    }
    cases.push_back({3, fit(65, m4), fit(131, n4), fit(13, k4), la, lb, Layout::row_major_padded,
                     d_dense, true, false, false, 1.5f, -0.5f});
    cases.push_back({2, fit(9, m4), fit(140, n4), fit(24, k4), la, lb, Layout::col_major,
                     Layout::col_major, false, true, true, -1.0f, 2.0f});
    cases.push_back({2, fit(33, m4), fit(33, n4), 0, la, lb, Layout::row_major, d_dense, false,
                     false, false, 1.0f, 0.5f});  // k = 0: D = beta C
    cases.push_back({1, fit(20, m4), fit(20, n4), 0, la, lb, Layout::row_major, d_dense, false,
                     false, false, 1.0f, 0.0f});  // k = 0, beta = 0: D = 0
  } else {
    const Layout layouts[] = {Layout::row_major, Layout::col_major, Layout::both_strided};
    int i = 0;
    for (Layout la : layouts) {
      for (Layout lb : layouts) {
        const int64_t m = 1 + (37 * i + 5) % 140, n = 1 + (53 * i + 11) % 150,
                      k = 1 + (29 * i) % 23;
        cases.push_back({1 + i % 2, m, n, k, la, lb, layouts[i % 3], layouts[(i + 1) % 3],
                         i % 3 == 0, i % 4 == 1, i % 5 == 2, 1.0f + i % 2,
                         i % 3 == 1 ? 0.0f : 0.75f, i % 2, (i + 1) % 3});
        ++i;
      }
    }
    cases.push_back({1, 129, 130, 20, Layout::row_major, Layout::row_major, Layout::row_major,
                     d_dense, false, false, false, 1.0f, 0.0f});
    cases.push_back({2, 70, 140, 75, Layout::col_major, Layout::both_strided, Layout::row_major,
                     Layout::both_strided, false, true, false, 0.5f, 1.0f, 1, 0});
    cases.push_back({5, 7, 9, 0, Layout::row_major, Layout::col_major, Layout::row_major, d_dense,
                     false, false, true, 1.0f, 1.0f});
  }
  // The epilogue: bias and each activation, and fp32 C and D (bf16 inputs), on sizes
  // with partial tiles and, for the vectorized kernels, 4-wide stores.
  const Activation activations[] = {Activation::relu, Activation::gelu, Activation::gelu_tanh,
                                    Activation::silu};
  for (int i = 0; i < 4; ++i) {
    Case c = cases[i % 2 == 0 ? 1 : cases.size() - 4];
    c.bias = true;
    c.activation = activations[i];
    c.out_f32 = DT == DType::bf16 && i >= 2;
    cases.push_back(c);
  }
  int failures = 0;
  for (const Case& c : cases) {
    for (CopyTiming timing : {CopyTiming::early, CopyTiming::late}) {
      if (F != Family::sm80 && timing == CopyTiming::late) continue;  // no cp.async
      const bool passed =
          c.out_f32 ? run_case<Traits, float>(c, timing, rng) : run_case<Traits>(c, timing, rng);
      if (!passed) {
        std::printf("  FAIL (%s copies): %s\n", timing == CopyTiming::early ? "early" : "late",
                    describe(c).c_str());
        ++failures;
      }
    }
  }
  return failures;
}

int check_rasterization() {
  int failures = 0;
  for (int tiles_m : {1, 3, 8, 9, 17}) {
    for (int tiles_n : {1, 2, 7, 33}) {
      std::vector<int> seen(tiles_m * tiles_n, 0);
      for (int block = 0; block < tiles_m * tiles_n; ++block) {
        const TileCoord t = rasterize(block, tiles_m, tiles_n);
        if (t.m < 0 || t.m >= tiles_m || t.n < 0 || t.n >= tiles_n) {
          ++failures;
        } else {
          ++seen[t.m * tiles_n + t.n];
        }
      }
      for (int s : seen) failures += s != 1;
    }
  }
  std::printf("rasterization: %s\n", failures ? "FAIL" : "ok");
  return failures;
}

int check_vectorized_precondition() {
  alignas(16) static float buffer[64];
  const int64_t f32 = 4, bf16 = 2;
  // (mn_stride, k_stride, batch_stride, mn_extent, k_extent)
  const SimtOperandLayout row_major_a{16, 1, 0, 8, 16};  // K-major
  const SimtOperandLayout col_major_a{1, 8, 0, 8, 16};   // M-major
  int failures = 0;
  failures += !simt_operand_vectorizable(buffer, f32, row_major_a, Major::K);
  failures += simt_operand_vectorizable(buffer, f32, row_major_a, Major::MN);
  failures += !simt_operand_vectorizable(buffer, f32, col_major_a, Major::MN);
  failures += simt_operand_vectorizable(buffer + 1, f32, col_major_a, Major::MN);   // misaligned
  failures += simt_operand_vectorizable(buffer, f32, {1, 8, 6, 8, 16}, Major::MN);  // batch 6
  failures += simt_operand_vectorizable(buffer, f32, {1, 8, 0, 6, 16}, Major::MN);  // m = 6
  // bf16 vectors are 8 bytes.
  failures +=
      !simt_operand_vectorizable(reinterpret_cast<char*>(buffer) + 8, bf16, col_major_a, Major::MN);
  std::printf("vectorized precondition: %s\n", failures ? "FAIL" : "ok");
  return failures;
}

}  // namespace
}  // namespace samattn::gemm::simt

int main() {
  using namespace samattn;
  using namespace samattn::gemm;
  using namespace samattn::gemm::simt;
  std::mt19937 rng(1234);
  int failures = check_rasterization() + check_vectorized_precondition();
  failures += run_config<DType::f32, Major::K, Major::MN, true, Family::sm80>(rng);
  failures += run_config<DType::f32, Major::K, Major::K, true, Family::sm80>(rng);
  failures += run_config<DType::f32, Major::MN, Major::K, true, Family::sm80>(rng);
  failures += run_config<DType::f32, Major::MN, Major::MN, true, Family::sm80>(rng);
  failures += run_config<DType::f32, Major::K, Major::K, false, Family::sm80>(rng);
  failures += run_config<DType::f32, Major::K, Major::MN, true, Family::sm75>(rng);
  failures += run_config<DType::f32, Major::K, Major::K, true, Family::sm75>(rng);
  failures += run_config<DType::f32, Major::MN, Major::K, true, Family::sm75>(rng);
  failures += run_config<DType::f32, Major::MN, Major::MN, true, Family::sm75>(rng);
  failures += run_config<DType::f32, Major::K, Major::K, false, Family::sm75>(rng);
  failures += run_config<DType::bf16, Major::K, Major::MN, true, Family::sm75>(rng);
  failures += run_config<DType::bf16, Major::K, Major::K, true, Family::sm75>(rng);
  failures += run_config<DType::bf16, Major::MN, Major::K, true, Family::sm75>(rng);
  failures += run_config<DType::bf16, Major::MN, Major::MN, true, Family::sm75>(rng);
  failures += run_config<DType::bf16, Major::K, Major::K, false, Family::sm75>(rng);
  std::printf(failures ? "FAILED: %d\n" : "all passed\n", failures);
  return failures ? 1 : 0;
}
