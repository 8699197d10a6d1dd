// FMA-unit (SIMT) GEMM in CuTe: D[b] = alpha * A[b] @ B[b] + beta * C[b] with
// fp32 FMA and fp32 accumulation, for fp32 and bf16 operands, then the
// bias and activation of gemm/epilogue.h.
//
// A block of 256 threads computes a 128 x 128 tile of D; each thread owns an
// 8 x 8 micro-tile (two 4-wide groups in m times two in n), so the inner loop
// reads its A and B fragments with four 128-bit shared loads per 64 FMAs.
// Operands are staged in shared memory as fp32 (k, mn) tiles, mn contiguous,
// 16 k deep, double-buffered, and move to registers double-buffered across
// the 16 k steps. Global -> shared, per operand:
//   sm80, MN-major or strided: cp.async straight into shared memory;
//   sm75, and K-major vectorized operands everywhere: through registers
//   (loaded ahead, transposed or converted on the store).
// One barrier per k tile.
//
// K residue: the first k tile starts at k = K - 16 * k_tiles <= 0 and is the
// only one whose k needs a predicate; its k < 0 elements load as zero. Rows
// and columns beyond M and N need no predicate in the main loop: their loads
// are clamped to the last row (column) and their outputs are never stored.
//
// This file is also plain host C++ (no CUDA syntax) so that the CPU emulator
// in emulation/ runs exactly this code; the __global__ wrapper and the launch
// are in gemm_simt_launch.cuh.
#pragma once

#include <cute/tensor.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "common/problem.h"
#include "gemm/epilogue.h"
#include "gemm/gemm_config.h"
#include "gemm/simt/gemm_simt_layout.h"
#include "gemm/simt/simt_device.cuh"

namespace samattn::gemm::simt {

// ------------------------------------------------------------------ tile ----
inline constexpr int kTileM = 128;
inline constexpr int kTileN = 128;
inline constexpr int kTileK = 16;
// Loaders move a tile as two slabs of 8 k, 4 elements per thread each.
inline constexpr int kSlabK = 8;
inline constexpr int kSlabs = kTileK / kSlabK;
inline constexpr int kThreads = 256;
// Two shared stages: the next tile is fetched while this one computes (16
// k steps, ~4000 cycles for two resident blocks: ample for global latency).
inline constexpr int kStages = 2;
inline constexpr int kVec = kSimtVectorWidth;
// Shared tiles are (k, mn) rows padded by 4 floats: the transposing stores of
// K-major operands then hit 32 distinct banks, and rows stay 16-byte aligned.
inline constexpr int kSmemPitch = kTileM + 4;
inline constexpr int kSmemStage = kTileK * kSmemPitch;  // floats per operand per stage
inline constexpr int kSmemSlab = kSlabK * kSmemPitch;
// Consecutive blocks walk down groups of this many tile rows, so that the
// blocks resident at once share A and B panels in L2.
inline constexpr int kRasterGroupM = 8;
static_assert(kTileM == kTileN, "one shared tile layout serves A and B");

// 4 elements, aligned for one vector access (16 bytes of fp32, 8 of bf16).
template <class T>
struct alignas(kVec * sizeof(T)) Vec4 {
  T v[kVec];
};

// ---------------------------------------------------------------- params ----
// One operand seen as (mn, k): A is (m, k), B is (n, k).
template <class T>
struct OperandArgs {
  const T* ptr;
  int64_t batch_stride, mn_stride, k_stride;
  int64_t mn_extent;
  bool walk_k;  // element-wise loads: a warp walks k (k has the smaller stride)
};

template <class T>
struct SimtParams {
  OperandArgs<T> a, b;
  const void* c;  // nullptr when beta == 0; C and D are T, or float when out_f32
  int64_t c_batch_stride, c_row_stride, c_col_stride;
  void* d;
  int64_t d_batch_stride, d_row_stride, d_col_stride;
  const T* bias;  // n elements; nullptr = none
  Activation activation;
  bool out_f32;
  int64_t m, n, batch;
  int tiles_m, tiles_n;
  int k_tiles;  // ceil(K / kTileK)
  int k_first;  // K - kTileK * k_tiles, in (-kTileK, 0]: where k tile 0 starts
  float alpha, beta;
  bool c_vectorized, d_vectorized;  // 4-wide epilogue access is legal (unit column stride, aligned)
};

// ------------------------------------------------------------- the FMA op ----
// UniversalFMA with an explicit round-to-nearest fma (see fma_rn).
struct ExactFma {
  using DRegisters = float[1];
  using ARegisters = float[1];
  using BRegisters = float[1];
  using CRegisters = float[1];
  CUTE_HOST_DEVICE static void fma(float& d, const float& a, const float& b, const float& c) {
    d = fma_rn(a, b, c);
  }
};

}  // namespace samattn::gemm::simt

template <>
struct cute::MMA_Traits<samattn::gemm::simt::ExactFma>
    : cute::MMA_Traits<cute::UniversalFMA<float, float, float, float>> {};

namespace samattn::gemm::simt {

// 256 threads as 16 x 16 over the 128 x 128 tile: warps 4 (m) x 2 (n), each
// warp 4 x 8 threads with its lanes interleaved in pairs of m (lane =
// tm % 2 + 2 tn + 16 (tm / 2)), as CUTLASS's SIMT sgemm does, so that a
// quarter warp reads 2 x 4 fragments. The permutations give thread (tm, tn)
// the rows 4 tm + {0..3} + {0, 16} (+ 32 per warp row) and the columns
// 4 tn + {0..3} + {0, 32} (+ 64 per warp column): 4 contiguous values per
// 128-bit shared load, distinct or identical 16-byte words within a warp (no
// bank conflicts), and 128-bit stores of D that cover whole sectors.
using SimtThreadLayout = cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_4>,
                                                  cute::Shape<cute::_8, cute::_2>, cute::_1>,
                                      cute::Stride<cute::Stride<cute::_1, cute::_16, cute::_32>,
                                                   cute::Stride<cute::_2, cute::_128>, cute::_0>>;
using SimtPermuteM = cute::Layout<cute::Shape<cute::_4, cute::_4, cute::_4, cute::_2>,
                                  cute::Stride<cute::_4, cute::_32, cute::_1, cute::_16>>;
using SimtPermuteN = cute::Layout<cute::Shape<cute::_8, cute::_2, cute::_4, cute::_2>,
                                  cute::Stride<cute::_4, cute::_64, cute::_1, cute::_32>>;

CUTE_HOST_DEVICE auto make_simt_tiled_mma() {
  return cute::make_tiled_mma(ExactFma{}, SimtThreadLayout{},
                              cute::Tile<SimtPermuteM, SimtPermuteN, cute::_1>{});
}

struct TileCoord {
  int m, n;
};

// Block index -> output tile, walking groups of kRasterGroupM tile rows.
CUTE_HOST_DEVICE TileCoord rasterize(int block, int tiles_m, int tiles_n) {
  const int64_t group_size = int64_t(kRasterGroupM) * tiles_n;
  const int group = static_cast<int>(block / group_size);
  const int in_group = static_cast<int>(block - group * group_size);
  const int first_m = group * kRasterGroupM;
  const int rows = tiles_m - first_m < kRasterGroupM ? tiles_m - first_m : kRasterGroupM;
  return {first_m + in_group % rows, in_group / rows};
}

// --------------------------------------------------------------- loaders ----
// A loader moves one operand's 128 x 16 (mn, k) tiles into shared memory,
// stored [k][mn] as fp32, as two 128 x 8 slabs of 4 elements per thread:
//   kAsync      cp.async (copy_async); else staged through registers (load,
//               then store: converts bf16 to fp32, transposes K-major data)
//   copy_async(stage, slab, first), load(slab, first), store(stage, slab)
//               one slab of the current k tile
//   advance()   move to the next k tile
// `first` marks k tile 0, whose k < 0 part is zero-filled. Rows (mn) beyond
// the matrix are clamped to its last row instead of predicated: they only
// feed outputs that are never stored, and the main loop stays free of
// predicates. Pointers may advance past the last k tile; nothing is read there.

// MN-major, vectorized: thread t moves the vector (mn 4 (t % 32) + {0..3}, k t / 32)
// of a slab; a warp reads 512 contiguous bytes and writes one shared row.
template <class T, bool Async>
class VectorMNLoader {
 public:
  static constexpr bool kAsync = Async;

  SAMATTN_SIMT_DEVICE VectorMNLoader(const OperandArgs<T>& op, uint32_t batch, int64_t mn0,
                                     int k_first, int thread) {
    const int mn = (thread % 32) * kVec;
    const int k = thread / 32;
    const int64_t row = mn0 + mn < op.mn_extent ? mn0 + mn : op.mn_extent - kVec;
    origin_ = op.ptr + int64_t(batch) * op.batch_stride;
    gmem_ = origin_ + row + (k_first + k) * op.k_stride;
    slab_step_ = kSlabK * op.k_stride;
    first_k_ = k_first + k;
    smem_offset_ = k * kSmemPitch + mn;
  }

  SAMATTN_SIMT_DEVICE void copy_async(float* stage, int slab, bool first_tile) {
    static_assert(std::is_same_v<T, float>, "cp.async copies fp32 tiles");
    const bool k_ok = !first_tile || first_k_ + slab * kSlabK >= 0;
    const T* src = k_ok ? gmem_ + slab * slab_step_ : origin_;
    cp_async_zfill<16>(stage + slab * kSmemSlab + smem_offset_, src, k_ok);
  }

  SAMATTN_SIMT_DEVICE void load(int slab, bool first_tile) {
    staged_ = Vec4<T>{};
    if (!first_tile || first_k_ + slab * kSlabK >= 0) {
      staged_ = load_global(reinterpret_cast<const Vec4<T>*>(gmem_ + slab * slab_step_));
    }
  }

  SAMATTN_SIMT_DEVICE void store(float* stage, int slab) const {
    Vec4<float> values;
    for (int e = 0; e < kVec; ++e) values.v[e] = static_cast<float>(staged_.v[e]);
    *reinterpret_cast<Vec4<float>*>(stage + slab * kSmemSlab + smem_offset_) = values;
  }

  SAMATTN_SIMT_DEVICE void advance() { gmem_ += kSlabs * slab_step_; }

 private:
  const T* origin_;  // element (0, 0) of this batch, for zero-fill copies
  const T* gmem_;
  int64_t slab_step_;
  int first_k_;  // k of this thread's element in slab 0 of tile 0
  int smem_offset_;
  Vec4<T> staged_;
};

// K-major, vectorized, through registers on every family (a 4-byte cp.async
// per element would cost 4x the instructions): thread t loads the vector
// (mn t / 2, k 4 (t % 2) + {0..3}) of a slab and transposes it with 4 shared
// stores.
template <class T>
class VectorKLoader {
 public:
  static constexpr bool kAsync = false;

  SAMATTN_SIMT_DEVICE VectorKLoader(const OperandArgs<T>& op, uint32_t batch, int64_t mn0,
                                    int k_first, int thread) {
    const int mn = thread / 2;
    const int k = (thread % 2) * kVec;
    const int64_t row = mn0 + mn < op.mn_extent ? mn0 + mn : op.mn_extent - 1;
    gmem_ = op.ptr + int64_t(batch) * op.batch_stride + row * op.mn_stride + (k_first + k);
    first_k_ = k_first + k;  // k_first % kVec == 0 as K % kVec == 0
    smem_offset_ = k * kSmemPitch + mn;
  }

  SAMATTN_SIMT_DEVICE void load(int slab, bool first_tile) {
    staged_ = Vec4<T>{};
    if (!first_tile || first_k_ + slab * kSlabK >= 0) {
      staged_ = load_global(reinterpret_cast<const Vec4<T>*>(gmem_ + slab * kSlabK));
    }
  }

  SAMATTN_SIMT_DEVICE void store(float* stage, int slab) const {
    for (int e = 0; e < kVec; ++e) {
      stage[slab * kSmemSlab + smem_offset_ + e * kSmemPitch] = static_cast<float>(staged_.v[e]);
    }
  }

  SAMATTN_SIMT_DEVICE void advance() { gmem_ += kTileK; }

 private:
  const T* gmem_;
  int first_k_;
  int smem_offset_;
  Vec4<T> staged_;
};

// Any strides, one element per access: thread t moves (mn + 32 i, k) of a
// slab for i < 4. A warp walks the mode with the smaller stride: k (4 mn x
// 8 k, one 32-byte sector per row) or mn (32 mn x 1 k). Each of the 4 rows
// keeps its own pointer, advanced slab by slab: recomputing row addresses
// from one pointer costs registers for their hoisted 64-bit offsets.
template <class T, bool Async>
class ElementwiseLoader {
 public:
  static constexpr bool kAsync = Async;
  static constexpr int kRows = 4;
  static constexpr int kRowStep = kThreads / kSlabK;  // mn between a thread's rows (walking k)

  SAMATTN_SIMT_DEVICE ElementwiseLoader(const OperandArgs<T>& op, uint32_t batch, int64_t mn0,
                                        int k_first, int thread)
      : op_(op) {
    const int mn = op.walk_k ? thread / kSlabK : thread % kRowStep;
    const int k = op.walk_k ? thread % kSlabK : thread / kRowStep;
    const T* origin = op.ptr + int64_t(batch) * op.batch_stride + (k_first + k) * op.k_stride;
    for (int i = 0; i < kRows; ++i) {
      const int64_t row = mn0 + mn + i * kRowStep;
      rows_[i] = origin + (row < op.mn_extent ? row : op.mn_extent - 1) * op.mn_stride;
    }
    first_k_ = k_first + k;
    smem_offset_ = k * kSmemPitch + mn;
  }

  // Predicated-off copies (k < 0) read nothing but still name a valid
  // address: the operand's first element, from the kernel parameters.
  SAMATTN_SIMT_DEVICE void copy_async(float* stage, int slab, bool first_tile) {
    static_assert(std::is_same_v<T, float>, "cp.async copies fp32 tiles");
    const bool k_ok = !first_tile || first_k_ + slab * kSlabK >= 0;
    for (int i = 0; i < kRows; ++i) {
      cp_async_zfill<4>(stage + slab * kSmemSlab + smem_offset_ + i * kRowStep,
                        k_ok ? rows_[i] : op_.ptr, k_ok);
      rows_[i] += kSlabK * op_.k_stride;
    }
  }

  SAMATTN_SIMT_DEVICE void load(int slab, bool first_tile) {
    const bool k_ok = !first_tile || first_k_ + slab * kSlabK >= 0;
    for (int i = 0; i < kRows; ++i) {
      staged_[i] = k_ok ? load_global(rows_[i]) : T(0.0f);
      rows_[i] += kSlabK * op_.k_stride;
    }
  }

  SAMATTN_SIMT_DEVICE void store(float* stage, int slab) const {
    for (int i = 0; i < kRows; ++i) {
      stage[slab * kSmemSlab + smem_offset_ + i * kRowStep] = static_cast<float>(staged_[i]);
    }
  }

  SAMATTN_SIMT_DEVICE void advance() {}  // the row pointers moved slab by slab

 private:
  const OperandArgs<T>& op_;  // strides stay in the kernel parameters, not registers
  const T* rows_[kRows];
  int first_k_;
  int smem_offset_;
  T staged_[kRows];
};

// ---------------------------------------------------------------- traits ----
template <class Config>
struct SimtTraits;

template <DType DT, Major A, Major B, bool Vectorized, Family F>
struct SimtTraits<SimtGemm<DT, A, B, Vectorized, F>> {
  static_assert(DT == DType::f32 || DT == DType::bf16, "the SIMT GEMM runs fp32 and bf16");
  using Element = std::conditional_t<DT == DType::f32, float, cute::bfloat16_t>;
  static constexpr DType kDType = DT;
  static constexpr Major kMajorA = A;
  static constexpr Major kMajorB = B;
  static constexpr bool kVectorized = Vectorized;
  static constexpr Family kFamily = F;
  static constexpr bool kCpAsync = F == Family::sm80;  // sm75 has no cp.async

  template <Major M>
  using Loader =
      std::conditional_t<!Vectorized, ElementwiseLoader<Element, kCpAsync>,
                         std::conditional_t<M == Major::MN, VectorMNLoader<Element, kCpAsync>,
                                            VectorKLoader<Element>>>;
  using LoaderA = Loader<A>;
  using LoaderB = Loader<B>;
  static constexpr bool kAnyAsync = LoaderA::kAsync || LoaderB::kAsync;
  static_assert(!kAnyAsync || DT == DType::f32, "cp.async cannot convert: sm80 SIMT is fp32 only");
};

// ---------------------------------------------------------------- kernel ----
template <class Traits>
struct SimtGemmKernel {
  using T = typename Traits::Element;
  using LoaderA = typename Traits::LoaderA;
  using LoaderB = typename Traits::LoaderB;
  static constexpr bool kAnyAsync = Traits::kAnyAsync;
  // Fragments of step k + 1 load during step k (register double buffering),
  // except in the element-wise kernels, whose loaders need those registers.
  static constexpr bool kPrefetchFragments = Traits::kVectorized;
  static constexpr int kSmemBytes = 2 * kStages * kSmemStage * int(sizeof(float));

  // One block: output tile `block` of matrix `batch` (< 2^32 by the grid
  // limits; 32 bits keep registers free). smem: kSmemBytes, 16-byte aligned.
  SAMATTN_SIMT_DEVICE void operator()(const SimtParams<T>& p, float* smem, int thread, int block,
                                      uint32_t batch) const {
    using namespace cute;
    const TileCoord tile = rasterize(block, p.tiles_m, p.tiles_n);

    // (mn, k, stage) -> float, mn contiguous; kTileM == kTileN.
    const auto smem_layout = make_layout(make_shape(Int<kTileM>{}, Int<kTileK>{}, Int<kStages>{}),
                                         make_stride(_1{}, Int<kSmemPitch>{}, Int<kSmemStage>{}));
    float* smem_a = smem;
    float* smem_b = smem + kStages * kSmemStage;
    Tensor sA = make_tensor(make_smem_ptr(smem_a), smem_layout);  // (BM, BK, STAGE)
    Tensor sB = make_tensor(make_smem_ptr(smem_b), smem_layout);  // (BN, BK, STAGE)

    const auto mma = make_simt_tiled_mma();
    const auto thr_mma = mma.get_slice(thread);
    Tensor tCsA = thr_mma.partition_A(sA);                    // (1, 8, BK, STAGE)
    Tensor tCsB = thr_mma.partition_B(sB);                    // (1, 8, BK, STAGE)
    Tensor tCrA = thr_mma.partition_fragment_A(sA(_, _, 0));  // (1, 8, BK)
    Tensor tCrB = thr_mma.partition_fragment_B(sB(_, _, 0));  // (1, 8, BK)
    Tensor cD = make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{}));
    Tensor tCcD = thr_mma.partition_C(cD);          // (1, 8, 8) -> (m, n) in the tile
    Tensor acc = thr_mma.partition_fragment_C(cD);  // (1, 8, 8) fp32
    clear(acc);

    LoaderA load_a(p.a, batch, int64_t(tile.m) * kTileM, p.k_first, thread);
    LoaderB load_b(p.b, batch, int64_t(tile.n) * kTileN, p.k_first, thread);
    mainloop(p.k_tiles, load_a, load_b, smem_a, smem_b, mma, tCsA, tCsB, tCrA, tCrB, acc);
    if (std::is_same_v<T, float> || !p.out_f32) {
      epilogue<T>(p, batch, tile, tCcD, acc);
    } else {
      epilogue<float>(p, batch, tile, tCcD, acc);
    }
  }

 private:
  // Per-operand steps; each is a no-op for loaders of the other kind. After
  // the last slab of a tile, the loader moves on to the next tile.
  template <class Loader>
  SAMATTN_SIMT_DEVICE static void fetch_async(Loader& loader, float* stage, int slab,
                                              bool first_tile) {
    if constexpr (Loader::kAsync) {
      loader.copy_async(stage, slab, first_tile);
      if (slab == kSlabs - 1) loader.advance();
    }
  }
  template <class Loader>
  SAMATTN_SIMT_DEVICE static void load_registers(Loader& loader, int slab, bool first_tile) {
    if constexpr (!Loader::kAsync) {
      loader.load(slab, first_tile);
      if (slab == kSlabs - 1) loader.advance();
    }
  }
  template <class Loader>
  SAMATTN_SIMT_DEVICE static void store_registers(const Loader& loader, float* stage, int slab) {
    if constexpr (!Loader::kAsync) loader.store(stage, slab);
  }

  // Double-buffered pipeline over k tiles; tile t is read from stage t % 2.
  // During tile t, tile t + 1 goes to the other stage (its readers passed the
  // barrier that ended tile t - 1); see the schedule in the loop. Loads are
  // unconditional (the compiler sinks a conditional load down to its store,
  // exposing its latency): the last tile, which fetches nothing, is peeled.
  template <class Mma, class SA, class SB, class RA, class RB, class Acc>
  SAMATTN_SIMT_DEVICE static void mainloop(int k_tiles, LoaderA& load_a, LoaderB& load_b,
                                           float* smem_a, float* smem_b, const Mma& mma,
                                           const SA& tCsA, const SB& tCsB, RA& tCrA, RB& tCrB,
                                           Acc& acc) {
    using namespace cute;
    if (k_tiles == 0) return;
    // Shared fragments -> registers: 128-bit loads of 4 contiguous m (n).
    auto load_fragments = [&](int stage, int kk) {
      copy(AutoVectorizingCopyWithAssumedAlignment<128>{}, tCsA(_, _, kk, stage), tCrA(_, _, kk));
      copy(AutoVectorizingCopyWithAssumedAlignment<128>{}, tCsB(_, _, kk, stage), tCrB(_, _, kk));
    };

    // Tile 0 into stage 0.
    for (int slab = 0; slab < kSlabs; ++slab) {
      fetch_async(load_a, smem_a, slab, /*first_tile=*/true);
      fetch_async(load_b, smem_b, slab, /*first_tile=*/true);
    }
    if constexpr (kAnyAsync) cp_async_commit();
    for (int slab = 0; slab < kSlabs; ++slab) {
      load_registers(load_a, slab, /*first_tile=*/true);
      load_registers(load_b, slab, /*first_tile=*/true);
      store_registers(load_a, smem_a, slab);
      store_registers(load_b, smem_b, slab);
    }
    if constexpr (kAnyAsync) cp_async_wait<0>();
    block_sync();

    int read_stage = 0;
    if constexpr (kPrefetchFragments) load_fragments(read_stage, 0);

    CUTE_NO_UNROLL
    for (int k_tile = 0; k_tile < k_tiles - 1; ++k_tile) {
      float* next_a = smem_a + (read_stage ^ 1) * kSmemStage;
      float* next_b = smem_b + (read_stage ^ 1) * kSmemStage;
      CUTE_UNROLL
      for (int kk = 0; kk < kTileK; ++kk) {
        if constexpr (!kPrefetchFragments) load_fragments(read_stage, kk);
        // Fetches of tile k_tile + 1, slab 0 at the start and slab 1 half
        // way: cp.async A at steps 0 and 8, B at 1 and 9 (spread out, their
        // address arithmetic does not pile up in registers); register-staged
        // slabs load at 0 and 8 and are stored at 8 and 15.
        if (kk == 0) {
          fetch_async(load_a, next_a, 0, /*first_tile=*/false);
          load_registers(load_a, 0, /*first_tile=*/false);
          load_registers(load_b, 0, /*first_tile=*/false);
        }
        if (kk == 1) fetch_async(load_b, next_b, 0, /*first_tile=*/false);
        if (kk == kSlabK) {
          fetch_async(load_a, next_a, 1, /*first_tile=*/false);
          store_registers(load_a, next_a, 0);
          store_registers(load_b, next_b, 0);
          load_registers(load_a, 1, /*first_tile=*/false);
          load_registers(load_b, 1, /*first_tile=*/false);
        }
        if (kk == kSlabK + 1) {
          fetch_async(load_b, next_b, 1, /*first_tile=*/false);
          if constexpr (kAnyAsync) cp_async_commit();
        }
        if (kk == kTileK - 1) {
          // The last step's fragments are in registers: hand over the next stage.
          store_registers(load_a, next_a, 1);
          store_registers(load_b, next_b, 1);
          if constexpr (kAnyAsync) cp_async_wait<0>();
          block_sync();
          read_stage ^= 1;
        }
        if constexpr (kPrefetchFragments) load_fragments(read_stage, (kk + 1) % kTileK);
        cute::gemm(mma, tCrA(_, _, kk), tCrB(_, _, kk), acc);
      }
    }

    CUTE_UNROLL
    for (int kk = 0; kk < kTileK; ++kk) {
      if constexpr (!kPrefetchFragments) load_fragments(read_stage, kk);
      if (kPrefetchFragments && kk + 1 < kTileK) load_fragments(read_stage, kk + 1);
      cute::gemm(mma, tCrA(_, _, kk), tCrB(_, _, kk), acc);
    }
  }

  // D = act(alpha * acc + beta * C + bias) for the in-bounds part of the
  // tile, C and D of type Out; C is not read when beta == 0. 4-wide accesses
  // where the parameters allow them.
  template <class Out, class Coords, class Acc>
  SAMATTN_SIMT_DEVICE static void epilogue(const SimtParams<T>& p, uint32_t batch, TileCoord tile,
                                           const Coords& tCcD, const Acc& acc) {
    using namespace cute;
    const int64_t m0 = int64_t(tile.m) * kTileM;
    const int64_t n0 = int64_t(tile.n) * kTileN;
    const int rows = static_cast<int>(p.m - m0 < kTileM ? p.m - m0 : kTileM);
    const int cols = static_cast<int>(p.n - n0 < kTileN ? p.n - n0 : kTileN);
    const bool read_c = p.beta != 0.0f;
    Out* d = static_cast<Out*>(p.d) + int64_t(batch) * p.d_batch_stride;
    const Out* c =
        read_c ? static_cast<const Out*>(p.c) + int64_t(batch) * p.c_batch_stride : nullptr;

    CUTE_UNROLL
    for (int i = 0; i < size<1>(acc); ++i) {
      const int row = get<0>(tCcD(0, i, 0));
      if (row >= rows) continue;
      Out* d_row = d + (m0 + row) * p.d_row_stride;
      const Out* c_row = read_c ? c + (m0 + row) * p.c_row_stride : nullptr;

      CUTE_UNROLL
      for (int g = 0; g < size<2>(acc) / kVec; ++g) {
        const int col = get<1>(tCcD(0, i, g * kVec));  // 4 contiguous columns from here
        const int64_t n = n0 + col;
        const bool whole = col + kVec <= cols;
        float out[kVec];
        for (int e = 0; e < kVec; ++e) out[e] = p.alpha * acc(0, i, g * kVec + e);

        if (read_c) {
          if (p.c_vectorized && whole) {
            const Vec4<Out> cv = load_global(reinterpret_cast<const Vec4<Out>*>(c_row + n));
            for (int e = 0; e < kVec; ++e) out[e] += p.beta * static_cast<float>(cv.v[e]);
          } else {
            for (int e = 0; e < kVec; ++e) {
              if (col + e < cols) {
                out[e] +=
                    p.beta * static_cast<float>(load_global(c_row + (n + e) * p.c_col_stride));
              }
            }
          }
        }

        if (p.bias != nullptr) {
          for (int e = 0; e < kVec; ++e) {
            if (col + e < cols) out[e] += static_cast<float>(load_global(p.bias + n + e));
          }
        }
        for (int e = 0; e < kVec; ++e) out[e] = activate(p.activation, out[e]);

        if (p.d_vectorized && whole) {
          Vec4<Out> dv;
          for (int e = 0; e < kVec; ++e) dv.v[e] = Out(out[e]);
          store_global(reinterpret_cast<Vec4<Out>*>(d_row + n), dv);
        } else {
          for (int e = 0; e < kVec; ++e) {
            if (col + e < cols) store_global(d_row + (n + e) * p.d_col_stride, Out(out[e]));
          }
        }
      }
    }
  }
};

// ------------------------------------------------------------ host setup ----
// Block (x, y, z) computes tile x of matrix y + z * gridDim.y: the batch
// spreads over y and z (up to 65535 each), so that no block loops.
struct SimtGrid {
  int tiles;  // gridDim.x; 0 = nothing to do
  int batch_y, batch_z;
};

inline constexpr int64_t kMaxGridYZ = 65535;

// Fills the kernel parameters from a validated problem. Returns
// cudaErrorInvalidValue if the problem breaks this instantiation's
// preconditions (dtype, vectorized layout, C missing, more than 2^31 - 1
// tiles or k tiles, batch above 65535^2).
template <class Traits>
inline cudaError_t make_simt_params(const GemmProblem& p, SimtParams<typename Traits::Element>* out,
                                    SimtGrid* grid, int64_t max_grid_yz = kMaxGridYZ) {
  using T = typename Traits::Element;
  *grid = {0, 0, 0};
  if (p.dtype != Traits::kDType || p.batch < 0 || p.m < 0 || p.n < 0 || p.k < 0) {
    return cudaErrorInvalidValue;
  }
  if (p.beta != 0.0f && p.c.ptr == nullptr) return cudaErrorInvalidValue;
  if (p.bias != nullptr && p.bias_per_row) return cudaErrorInvalidValue;  // never transposed
  if (p.batch == 0 || p.m == 0 || p.n == 0) return cudaSuccess;

  const int64_t element_bytes = sizeof(T);
  if constexpr (Traits::kVectorized) {
    if (!simt_operand_vectorizable(p.a.ptr, element_bytes, simt_layout_of_a(p), Traits::kMajorA) ||
        !simt_operand_vectorizable(p.b.ptr, element_bytes, simt_layout_of_b(p), Traits::kMajorB)) {
      return cudaErrorInvalidValue;
    }
  }
  const int64_t tiles_m = (p.m + kTileM - 1) / kTileM;
  const int64_t tiles_n = (p.n + kTileN - 1) / kTileN;
  const int64_t k_tiles = (p.k + kTileK - 1) / kTileK;
  const int64_t batch_y = p.batch < max_grid_yz ? p.batch : max_grid_yz;
  const int64_t batch_z = (p.batch + batch_y - 1) / batch_y;
  if (tiles_m * tiles_n > INT_MAX || k_tiles > INT_MAX || batch_z > max_grid_yz) {
    return cudaErrorInvalidValue;
  }

  auto abs64 = [](int64_t x) { return x < 0 ? -x : x; };
  auto operand = [&](const MatrixView& view, int64_t mn_stride, int64_t k_stride,
                     int64_t mn_extent) {
    return OperandArgs<T>{
        static_cast<const T*>(view.ptr),   view.batch_stride, mn_stride, k_stride, mn_extent,
        abs64(k_stride) < abs64(mn_stride)};
  };
  // 4-wide epilogue access: unit column stride, and every row start aligned.
  const int64_t output_bytes = p.out_f32 ? 4 : element_bytes;
  auto vectorizable = [&](const void* ptr, int64_t batch_stride, int64_t row_stride,
                          int64_t col_stride) {
    return ptr != nullptr && col_stride == 1 && row_stride % kVec == 0 &&
           batch_stride % kVec == 0 &&
           reinterpret_cast<uintptr_t>(ptr) % (kVec * output_bytes) == 0;
  };

  SimtParams<T>& s = *out;
  s.a = operand(p.a, p.a.row_stride, p.a.col_stride, p.m);
  s.b = operand(p.b, p.b.col_stride, p.b.row_stride, p.n);
  const bool read_c = p.beta != 0.0f;
  s.c = read_c ? p.c.ptr : nullptr;
  s.c_batch_stride = p.c.batch_stride;
  s.c_row_stride = p.c.row_stride;
  s.c_col_stride = p.c.col_stride;
  s.d = p.d;
  s.bias = static_cast<const T*>(p.bias);
  s.activation = static_cast<Activation>(p.activation);
  s.out_f32 = p.out_f32;
  s.d_batch_stride = p.d_batch_stride;
  s.d_row_stride = p.d_row_stride;
  s.d_col_stride = p.d_col_stride;
  s.m = p.m;
  s.n = p.n;
  s.batch = p.batch;
  s.tiles_m = static_cast<int>(tiles_m);
  s.tiles_n = static_cast<int>(tiles_n);
  s.k_tiles = static_cast<int>(k_tiles);
  s.k_first = static_cast<int>(p.k - k_tiles * kTileK);
  s.alpha = p.k == 0 ? 0.0f : p.alpha;  // k == 0: D = beta C even for an infinite alpha
  s.beta = p.beta;
  s.c_vectorized =
      read_c && vectorizable(p.c.ptr, p.c.batch_stride, p.c.row_stride, p.c.col_stride);
  s.d_vectorized = vectorizable(p.d, p.d_batch_stride, p.d_row_stride, p.d_col_stride);

  grid->tiles = static_cast<int>(tiles_m * tiles_n);
  grid->batch_y = static_cast<int>(batch_y);
  grid->batch_z = static_cast<int>(batch_z);
  return cudaSuccess;
}

}  // namespace samattn::gemm::simt
