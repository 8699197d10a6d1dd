// Tensor-core GEMM for the sm75 and sm80 families, in CuTe.
//
//   D[l] = act(alpha * A[l] @ B[l] + beta * C[l] + bias)  A (M,K), B (K,N), C/D (M,N)
//
// One CTA computes a BM x BN tile of D. Its K loop runs a multistage shared-
// memory pipeline (cp.async on sm80, plain loads on sm75) feeding mma.sync
// through ldmatrix. Every global load is predicated on the problem bounds and
// out-of-range elements are zero-filled, so any M, N, K works and the K
// residue is exact. The epilogue (gemm/epilogue.h) applies alpha, beta,
// the bias and the activation in fp32 and stores with the problem's own
// strides, in the input type or fp32. With parallel split-K, each split
// (blockIdx.z) covers a range of K and stores fp32 partial sums instead
// (gemm/split_k_reduce.cuh adds them up). A list of independent GEMMs runs
// the same tile in gemm_tensor_core_list_kernel, each CTA on one GEMM's tile.
//
// Following CuTe's convention, B is handled as an (N,K) tensor, and the
// kernel is templated on a Traits type (see gemm_tensor_core_traits.cuh)
// that holds the tile shape, the MMA, and the copy atoms and layouts.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>
#include <type_traits>

#include "gemm/epilogue.h"
#include "gemm/group.h"

namespace samattn::gemm {

// Kernel arguments. Strides are in elements; B is described as (N,K).
struct TensorCoreParams {
  int m, n, k, batch;
  const void* a;
  int64_t a_m, a_k, a_batch;
  const void* b;
  int64_t b_n, b_k, b_batch;
  const void* c;  // nullptr when beta == 0
  int64_t c_m, c_n, c_batch;
  void* d;
  int64_t d_m, d_n, d_batch;
  float alpha, beta;
  const void* bias;   // n elements of the input type; nullptr = none
  bool bias_per_row;  // bias[row] rather than bias[col] (a transposed problem)
  Activation activation;
  bool out_f32;          // C and D are fp32 rather than the input type
  int tiles_m, tiles_n;  // CTA tiles per batch entry
  // Parallel split-K (gemm/split_k.h): blockIdx.z is the split, which runs
  // K range [z * k_per_split, +k_per_split) and writes its raw fp32 sums to
  // partial + z * partial_split_stride as row-major (batch, m, n) matrices.
  int splits;  // 1: no split, D is written here
  int k_per_split;
  float* partial;
  int64_t partial_split_stride;
  // Grouped GEMM (gemm/group.h): `batch` groups whose extents come from
  // group_offsets, `batch` cumulative ends read on the device. Rows: group g
  // owns rows [end[g-1], end[g]) of A, C and D (B advances by its batch
  // stride per group) and the rows after the last end are written as zeros;
  // blockIdx.x walks the groups' row tiles. K: group g reduces over
  // [end[g-1], end[g]) of K into its own D.
  const int32_t* group_offsets;  // nullptr: not grouped
  int group_mode;                // SAMATTN_GROUP_*
};

// What one CTA computes: a BM x BN tile of D over a range of K.
struct TileJob {
  int tile_m, tile_n;
  int batch;      // batch entry or group: operands advance by their batch strides
  int row_begin;  // first row of A, C and D this job's rows count from
  int m;          // rows from row_begin
  int k_begin, k_extent;
};

// One GEMM of a list (SAMATTN_GROUP_LIST) as the list kernel reads it: its
// operands, sizes and strides replace the launch's TensorCoreParams ones.
struct ListGemm {
  const void* a;
  const void* b;
  void* d;
  int64_t a_m, a_k, b_n, b_k, d_m, d_n;
  int m, n, k;
  int tiles_m, tiles_n;
  int first_cta;  // blockIdx.x of its first tile; its tiles follow
};

// The GEMMs of one list launch, passed by value: no device table to fill and
// nothing to copy, so a list launch is as capturable as any other. Together
// with TensorCoreParams it stays under the 4 KB of kernel parameters.
inline constexpr int kListLaunchGemms = 32;
struct ListChunk {
  int count;
  ListGemm gemms[kListLaunchGemms];
};

// Maps a linear CTA index to a (tile_m, tile_n) pair, walking groups of
// kGroupM tile rows column by column so that CTAs running together share
// A and B tiles in L2.
template <int kGroupM>
__device__ inline void swizzled_tile(int linear, int tiles_m, int tiles_n, int& tile_m,
                                     int& tile_n) {
  const int group_size = kGroupM * tiles_n;
  const int group = linear / group_size;
  const int first_m = group * kGroupM;
  const int rows = min(tiles_m - first_m, kGroupM);
  const int in_group = linear - group * group_size;
  tile_m = first_m + in_group % rows;
  tile_n = in_group / rows;
}

// Copies one (rows, BK) operand tile from global to shared memory.
// tG: (CPY, CPY_ROWS, CPY_K) source slice, tS: destination slice, tC: the
// coordinates of tG's elements, bound: (rows, K) extent of the operand.
template <class Traits, class TiledCopy, class TG, class TS, class TC, class Bound>
__device__ inline void load_operand_tile(TiledCopy const& tiled_copy, TG const& tG, TS&& tS,
                                         TC const& tC, Bound const& bound) {
  using namespace cute;
  if constexpr (Traits::kVectorized) {
    // The whole vector is in or out of bounds: the dispatch guarantees the
    // contiguous extent is a multiple of the vector width.
    CUTE_UNROLL
    for (int i = 0; i < size<1>(tS); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(tS); ++j) {
        const bool valid = elem_less(tC(0, i, j), bound);
        if constexpr (Traits::kAsyncCopy) {
          copy(tiled_copy.with(valid), tG(_, i, j), tS(_, i, j));
        } else {
          if (valid) {
            copy(tiled_copy, tG(_, i, j), tS(_, i, j));
          } else {
            clear(tS(_, i, j));
          }
        }
      }
    }
  } else {
    // Element-wise: any strides, any alignment.
    using Element = typename Traits::Element;
    CUTE_UNROLL
    for (int i = 0; i < size(tS); ++i) {
      tS(i) = elem_less(tC(i), bound) ? Element(tG(i)) : Element(0.0f);
    }
  }
}

// fp32 operands feed the tf32 MMA; without this the MMA truncates the low
// mantissa bits, which doubles the error. cvt.rna rounds to nearest.
template <class Fragment>
__device__ inline void round_to_tf32(Fragment&& fragment) {
  using Value = typename std::decay_t<Fragment>::value_type;
  if constexpr (std::is_same_v<Value, cute::tfloat32_t>) {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(fragment); ++i) {
      uint32_t rounded;
      asm("cvt.rna.tf32.f32 %0, %1;"
          : "=r"(rounded)
          : "f"(reinterpret_cast<float const&>(fragment(i))));
      fragment(i) = reinterpret_cast<Value const&>(rounded);
    }
  }
}

// v = act(scale * v) for the values of a fragment, the activation chosen
// once: one unrolled loop per activation.
template <class Values>
__device__ __forceinline__ void activate_in_place(Activation activation, float scale,
                                                  Values& values) {
  using namespace cute;
  auto each = [&](auto act) {
    CUTE_UNROLL
    for (int i = 0; i < size(values); ++i)
      values(i) = activate(decltype(act)::value, scale * values(i));
  };
  switch (activation) {
    case Activation::relu:
      each(std::integral_constant<Activation, Activation::relu>{});
      break;
    case Activation::gelu:
      each(std::integral_constant<Activation, Activation::gelu>{});
      break;
    case Activation::gelu_tanh:
      each(std::integral_constant<Activation, Activation::gelu_tanh>{});
      break;
    case Activation::silu:
      each(std::integral_constant<Activation, Activation::silu>{});
      break;
    case Activation::none:
      break;
  }
}

// Stores act(scale * v) for the values v of a tile's fragment with bounds
// checks (see store_tile), the activation a template argument.
template <Activation kActivation, class Out, class Coords, class Values>
__device__ __forceinline__ void store_scaled(Out* d, int64_t d_m, int64_t d_n, bool paired_d, int m,
                                             int n, float scale, Coords const& tCcD,
                                             Values const& values) {
  using namespace cute;
  using Pair = cute::array_aligned<Out, 2>;
  CUTE_UNROLL
  for (int i = 0; i < size(values); i += 2) {
    const int row = get<0>(tCcD(i));
    const int col = get<1>(tCcD(i));
    if (row >= m) continue;
    const float v0 = activate(kActivation, scale * values(i));
    const float v1 = activate(kActivation, scale * values(i + 1));
    if (paired_d && col + 1 < n) {
      Pair d_pair;
      d_pair[0] = static_cast<Out>(v0);
      d_pair[1] = static_cast<Out>(v1);
      *reinterpret_cast<Pair*>(d + row * d_m + col) = d_pair;
    } else {
      if (col < n) d[row * d_m + col * d_n] = static_cast<Out>(v0);
      if (col + 1 < n) d[row * d_m + (col + 1) * d_n] = static_cast<Out>(v1);
    }
  }
}

// D = act(alpha * accum + beta * C + bias) with bounds checks, D and C of
// type Out, the bias of type Bias (the input type); raw: D = accum (a
// split's partial sums, in fp32); terms = false: D = alpha * accum (no C,
// bias or activation; a compile-time false leaves their code out). `d` is
// this job's D (batch and rows applied) with its strides. Accumulator
// elements 2i and 2i+1 are adjacent columns of one row (the mma.sync C
// layout), so a row-major D takes them as one paired store. Forced inline: a
// call that is not inlined takes the accumulator by reference, which moves it
// from registers to the stack. The accumulator is overwritten.
//
// The activation is chosen once per tile (activate_in_place): a switch per
// element (activate() with a run-time activation) compiled to an indirect
// branch through a jump table of its own for each of a thread's 128
// accumulators (a constant-bank load and a BRX each, taken with or without
// an activation), and the sm80 GEMM fell to half its speed on the H100
// (issue 53).
template <class Out, class Bias, int BM, int BN, bool kActivationPass, class ThrMma, class Accum>
__device__ __forceinline__ void store_tile(TensorCoreParams const& p, TileJob const& job, Out* d,
                                           int64_t d_m, int64_t d_n, bool raw, bool terms,
                                           ThrMma const& thr_mma, Accum& accum) {
  using namespace cute;
  Tensor cD = make_identity_tensor(make_shape(job.m, p.n));
  Tensor gcD = local_tile(cD, Shape<Int<BM>, Int<BN>>{}, make_coord(job.tile_m, job.tile_n));
  Tensor tCcD = thr_mma.partition_C(gcD);
  const bool plain = raw || !terms;
  Out const* c = plain ? nullptr : static_cast<Out const*>(p.c);
  if (c != nullptr) c += job.batch * p.c_batch + job.row_begin * p.c_m;
  Bias const* bias = plain ? nullptr : static_cast<Bias const*>(p.bias);
  if (bias != nullptr && p.bias_per_row) bias += job.row_begin;
  const Activation activation = plain ? Activation::none : p.activation;
  const float alpha = raw ? 1.0f : p.alpha;
  const float beta = p.beta;
  using Pair = cute::array_aligned<Out, 2>;
  const bool paired_d =
      d_n == 1 && d_m % 2 == 0 && reinterpret_cast<uintptr_t>(d) % sizeof(Pair) == 0;
  const bool paired_c =
      p.c_n == 1 && p.c_m % 2 == 0 && reinterpret_cast<uintptr_t>(c) % sizeof(Pair) == 0;

  // alpha * accum + beta * C + bias in place, in this order (as the split
  // reduction adds them). Without C and bias, alpha is applied as D is
  // stored: one pass over the accumulator (two cost the element-wise unit
  // 28 more bytes of spills).
  float scale = alpha;
  if (c != nullptr || bias != nullptr) {
    scale = 1.0f;
    CUTE_UNROLL
    for (int i = 0; i < size(accum); i += 2) {
      const int row = get<0>(tCcD(i));
      const int col = get<1>(tCcD(i));
      accum(i) = alpha * accum(i);
      accum(i + 1) = alpha * accum(i + 1);
      if (row >= job.m) continue;
      if (c != nullptr) {
        if (paired_c && col + 1 < p.n) {
          Pair c_pair = *reinterpret_cast<Pair const*>(c + row * p.c_m + col);
          accum(i) += beta * static_cast<float>(c_pair[0]);
          accum(i + 1) += beta * static_cast<float>(c_pair[1]);
        } else {
          if (col < p.n) accum(i) += beta * static_cast<float>(c[row * p.c_m + col * p.c_n]);
          if (col + 1 < p.n) {
            accum(i + 1) += beta * static_cast<float>(c[row * p.c_m + (col + 1) * p.c_n]);
          }
        }
      }
      if (bias != nullptr) {
        if (col < p.n) accum(i) += static_cast<float>(bias[p.bias_per_row ? row : col]);
        if (col + 1 < p.n) accum(i + 1) += static_cast<float>(bias[p.bias_per_row ? row : col + 1]);
      }
    }
  }

  // The activation, its switch taken once per tile: in one more pass over the
  // accumulator, then one store loop for every activation (half the code and
  // compile time of a store loop per activation); the element-wise kernel,
  // which keeps more addressing state live, spilled 152 bytes with that pass
  // and applies the activation as it stores instead.
  if constexpr (kActivationPass) {
    if (activation != Activation::none) {
      activate_in_place(activation, scale, accum);
      scale = 1.0f;
    }
    store_scaled<Activation::none>(d, d_m, d_n, paired_d, job.m, p.n, scale, tCcD, accum);
  } else {
    auto store = [&](auto act) {
      store_scaled<decltype(act)::value>(d, d_m, d_n, paired_d, job.m, p.n, scale, tCcD, accum);
    };
    switch (activation) {
      case Activation::none:
        store(std::integral_constant<Activation, Activation::none>{});
        break;
      case Activation::relu:
        store(std::integral_constant<Activation, Activation::relu>{});
        break;
      case Activation::gelu:
        store(std::integral_constant<Activation, Activation::gelu>{});
        break;
      case Activation::gelu_tanh:
        store(std::integral_constant<Activation, Activation::gelu_tanh>{});
        break;
      case Activation::silu:
        store(std::integral_constant<Activation, Activation::silu>{});
        break;
    }
  }
}

// The job of this CTA; false for a grouped grid's CTA beyond the last tile.
// kGeneral = false: no groups and no split, all of K.
template <int BM, bool kGeneral>
__device__ inline bool find_job(TensorCoreParams const& p, TileJob& job) {
  job.row_begin = 0;
  job.m = p.m;
  if (!kGeneral || p.group_offsets == nullptr) {
    swizzled_tile<8>(blockIdx.x, p.tiles_m, p.tiles_n, job.tile_m, job.tile_n);
    job.batch = blockIdx.y;
    // All of K, or this split's range (never empty).
    job.k_begin = kGeneral ? blockIdx.z * p.k_per_split : 0;
    job.k_extent = kGeneral ? min(p.k_per_split, p.k - job.k_begin) : p.k;
    return true;
  }
  if (p.group_mode == group::kGroupK) {
    swizzled_tile<8>(blockIdx.x, p.tiles_m, p.tiles_n, job.tile_m, job.tile_n);
    job.batch = blockIdx.y;
    const group::Range range = group::range(p.group_offsets, job.batch, p.k);
    job.k_begin = range.begin;
    job.k_extent = range.end - range.begin;  // 0 for an empty group: D = epilogue(0)
    return true;
  }
  job.tile_n = blockIdx.y;
  job.k_begin = 0;
  job.k_extent = p.k;
  group::RowTile tile;
  if (!group::find_row_tile(p.group_offsets, p.batch, p.m, BM, blockIdx.x, &tile)) return false;
  // The rows after the last group's end (group `batch`) are zeros: no K.
  job.batch = min(tile.group, p.batch - 1);
  if (tile.group == p.batch) job.k_extent = 0;
  job.tile_m = tile.tile;
  job.row_begin = tile.rows.begin;
  job.m = tile.rows.end - tile.rows.begin;
  return true;
}

// One CTA's tile: the K loop and the epilogue. Forced inline into every
// kernel, so that the plain kernels read `p` from their parameters.
// kTerms = false: `p` has no C, bias, activation or split (the simple kernel,
// a list's GEMMs), and the epilogue is compiled without them.
template <class Traits, bool kTerms>
__device__ __forceinline__ void gemm_tile(TensorCoreParams const& p, TileJob const& job) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Output = typename Traits::Output;
  constexpr int BM = Traits::kBlockM;
  constexpr int BN = Traits::kBlockN;
  constexpr int BK = Traits::kBlockK;
  constexpr int kStages = Traits::kStages;
  const int tile_m = job.tile_m, tile_n = job.tile_n;

  // Global tensors of this job's rows and K range, (M,K) and (N,K), with the
  // operand's static unit stride where its layout has one.
  Tensor mA = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.a) + job.batch * p.a_batch +
                                        job.row_begin * p.a_m + job.k_begin * p.a_k),
                          make_shape(job.m, job.k_extent), Traits::stride_a(p.a_m, p.a_k));
  Tensor mB = make_tensor(
      make_gmem_ptr(static_cast<Element const*>(p.b) + job.batch * p.b_batch + job.k_begin * p.b_k),
      make_shape(p.n, job.k_extent), Traits::stride_b(p.b_n, p.b_k));
  Tensor cA = make_identity_tensor(shape(mA));
  Tensor cB = make_identity_tensor(shape(mB));

  auto tiler_a = make_shape(Int<BM>{}, Int<BK>{});
  auto tiler_b = make_shape(Int<BN>{}, Int<BK>{});
  Tensor gA = local_tile(mA, tiler_a, make_coord(tile_m, _));  // (BM,BK,k)
  Tensor gB = local_tile(mB, tiler_b, make_coord(tile_n, _));  // (BN,BK,k)
  Tensor gcA = local_tile(cA, tiler_a, make_coord(tile_m, _));
  Tensor gcB = local_tile(cB, tiler_b, make_coord(tile_n, _));

  extern __shared__ __align__(128) char shared_memory[];
  Element* smem_a = reinterpret_cast<Element*>(shared_memory);
  Element* smem_b = smem_a + cosize(typename Traits::SmemLayoutA{});
  Tensor sA = make_tensor(make_smem_ptr(smem_a), typename Traits::SmemLayoutA{});  // (BM,BK,P)
  Tensor sB = make_tensor(make_smem_ptr(smem_b), typename Traits::SmemLayoutB{});  // (BN,BK,P)

  // Global -> shared partitioning.
  typename Traits::GmemCopyA gmem_copy_a;
  typename Traits::GmemCopyB gmem_copy_b;
  auto thr_copy_a = gmem_copy_a.get_slice(threadIdx.x);
  auto thr_copy_b = gmem_copy_b.get_slice(threadIdx.x);
  Tensor tAgA = thr_copy_a.partition_S(gA);  // (CPY,CPY_M,CPY_K,k)
  Tensor tAcA = thr_copy_a.partition_S(gcA);
  Tensor tAsA = thr_copy_a.partition_D(sA);  // (CPY,CPY_M,CPY_K,P)
  Tensor tBgB = thr_copy_b.partition_S(gB);
  Tensor tBcB = thr_copy_b.partition_S(gcB);
  Tensor tBsB = thr_copy_b.partition_D(sB);
  auto bound_a = make_coord(job.m, job.k_extent);
  auto bound_b = make_coord(p.n, job.k_extent);

  // Prologue: fill all stages but one.
  const int k_tiles = (job.k_extent + BK - 1) / BK;
  int k_tile_next = 0;
  CUTE_UNROLL
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (k_tile_next < k_tiles) {
      load_operand_tile<Traits>(gmem_copy_a, tAgA(_, _, _, k_tile_next), tAsA(_, _, _, stage),
                                tAcA(_, _, _, k_tile_next), bound_a);
      load_operand_tile<Traits>(gmem_copy_b, tBgB(_, _, _, k_tile_next), tBsB(_, _, _, stage),
                                tBcB(_, _, _, k_tile_next), bound_b);
    }
    cp_async_fence();
    ++k_tile_next;
  }

  // MMA partitioning and the shared -> register copies (ldmatrix).
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_slice(threadIdx.x);
  Tensor tCrA = thr_mma.partition_fragment_A(sA(_, _, 0));  // (MMA,MMA_M,MMA_K)
  Tensor tCrB = thr_mma.partition_fragment_B(sB(_, _, 0));  // (MMA,MMA_N,MMA_K)
  Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<BM>, Int<BN>>{});
  clear(accum);

  auto smem_copy_a = make_tiled_copy_A(typename Traits::SmemCopyAtomA{}, tiled_mma);
  auto smem_thr_copy_a = smem_copy_a.get_slice(threadIdx.x);
  Tensor tXsA = smem_thr_copy_a.partition_S(sA);  // (CPY,MMA_M,MMA_K,P)
  Tensor tXrA = smem_thr_copy_a.retile_D(tCrA);
  auto smem_copy_b = make_tiled_copy_B(typename Traits::SmemCopyAtomB{}, tiled_mma);
  auto smem_thr_copy_b = smem_copy_b.get_slice(threadIdx.x);
  Tensor tXsB = smem_thr_copy_b.partition_S(sB);
  Tensor tXrB = smem_thr_copy_b.retile_D(tCrB);

  constexpr int kBlocks = size<2>(decltype(tCrA){});
  int read_stage = 0;
  int write_stage = kStages - 1;

  cp_async_wait<kStages - 2>();
  __syncthreads();
  copy(smem_copy_a, tXsA(_, _, 0, read_stage), tXrA(_, _, 0));
  copy(smem_copy_b, tXsB(_, _, 0, read_stage), tXrB(_, _, 0));
  round_to_tf32(tCrA(_, _, 0));
  round_to_tf32(tCrB(_, _, 0));

  // Main loop: while tile t is multiplied out of registers, tile t+1 moves
  // from shared memory to registers and tile t+kStages-1 from global to
  // shared memory.
  CUTE_NO_UNROLL
  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    CUTE_UNROLL
    for (int kb = 0; kb < kBlocks; ++kb) {
      if (kb == kBlocks - 1) {
        read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
        cp_async_wait<kStages - 2>();
        __syncthreads();
      }
      const int kb_next = (kb + 1) % kBlocks;
      copy(smem_copy_a, tXsA(_, _, kb_next, read_stage), tXrA(_, _, kb_next));
      copy(smem_copy_b, tXsB(_, _, kb_next, read_stage), tXrB(_, _, kb_next));
      round_to_tf32(tCrA(_, _, kb_next));
      round_to_tf32(tCrB(_, _, kb_next));
      if (kb == 0) {
        if (k_tile_next < k_tiles) {
          load_operand_tile<Traits>(gmem_copy_a, tAgA(_, _, _, k_tile_next),
                                    tAsA(_, _, _, write_stage), tAcA(_, _, _, k_tile_next),
                                    bound_a);
          load_operand_tile<Traits>(gmem_copy_b, tBgB(_, _, _, k_tile_next),
                                    tBsB(_, _, _, write_stage), tBcB(_, _, _, k_tile_next),
                                    bound_b);
        }
        cp_async_fence();
        ++k_tile_next;
        write_stage = write_stage == kStages - 1 ? 0 : write_stage + 1;
      }
      cute::gemm(tiled_mma, accum, tCrA(_, _, kb), tCrB(_, _, kb), accum);
    }
  }

  // A split stores its raw sums, (batch, m, n) row-major; the reduction
  // applies the epilogue.
  if (kTerms && p.splits > 1) {
    float* partial = p.partial + blockIdx.z * p.partial_split_stride +
                     static_cast<int64_t>(job.batch) * p.m * p.n;
    store_tile<float, Output, BM, BN, Traits::kVectorized>(p, job, partial, p.n, 1, true, false,
                                                           thr_mma, accum);
    return;
  }

  // Epilogue, in the input type or fp32 (tf32 already writes fp32).
  const int64_t d_offset = job.batch * p.d_batch + job.row_begin * p.d_m;
  if (std::is_same_v<Output, float> || p.out_f32) {
    float* d = static_cast<float*>(p.d) + d_offset;
    store_tile<float, Output, BM, BN, Traits::kVectorized>(p, job, d, p.d_m, p.d_n, false, kTerms,
                                                           thr_mma, accum);
  } else {
    Output* d = static_cast<Output*>(p.d) + d_offset;
    store_tile<Output, Output, BM, BN, Traits::kVectorized>(p, job, d, p.d_m, p.d_n, false, kTerms,
                                                            thr_mma, accum);
  }
}

// Two kernels per unit. kGeneral = false: D = alpha * A B, no C, bias,
// activation, split or groups (what most calls are). kGeneral = true: any of
// them. The general epilogue and the K ranges read from group_offsets take
// the kernel to the register cap, and ptxas then moves the K loop's counter
// and addressing off the uniform datapath and reloads pointers from the
// constant bank every K tile: 3 % at 8192^3 on the H100 (issue 53). Without
// them the loop is what it was before the epilogue grew (232 registers).
template <class Traits, bool kGeneral>
__global__ void __launch_bounds__(Traits::kThreads)
    gemm_tensor_core_kernel(TensorCoreParams const p) {
  TileJob job;
  if (!find_job<Traits::kBlockM, kGeneral>(p, job)) return;  // a grouped grid's spare CTA
  gemm_tile<Traits, kGeneral>(p, job);
}

// A list of independent GEMMs in one launch: blockIdx.x walks the GEMMs'
// tiles in order. `p` holds what the GEMMs share (alpha, the output type, no
// C, bias or split); the chunk is __grid_constant__ so that indexing it at
// run time reads the parameters in place instead of copying them per thread.
template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    gemm_tensor_core_list_kernel(TensorCoreParams const p,
                                 __grid_constant__ const ListChunk chunk) {
  const int cta = static_cast<int>(blockIdx.x);
  int i = 0;
  while (i + 1 < chunk.count && cta >= chunk.gemms[i + 1].first_cta) ++i;
  const ListGemm& g = chunk.gemms[i];
  TensorCoreParams q = p;
  q.a = g.a;
  q.a_m = g.a_m;
  q.a_k = g.a_k;
  q.b = g.b;
  q.b_n = g.b_n;
  q.b_k = g.b_k;
  q.d = g.d;
  q.d_m = g.d_m;
  q.d_n = g.d_n;
  q.m = g.m;
  q.n = g.n;
  q.k = g.k;
  q.tiles_m = g.tiles_m;
  q.tiles_n = g.tiles_n;
  TileJob job;
  swizzled_tile<8>(cta - g.first_cta, g.tiles_m, g.tiles_n, job.tile_m, job.tile_n);
  job.batch = 0;
  job.row_begin = 0;
  job.m = g.m;
  job.k_begin = 0;
  job.k_extent = g.k;  // 0: D = 0
  gemm_tile<Traits, /*kTerms=*/false>(q, job);
}

}  // namespace samattn::gemm
