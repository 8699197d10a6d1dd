// How the sm90 family runs a GEMM: whether TMA can describe it, in which
// orientation, and which tile configuration. Host code only, with no CUDA
// and no CUTLASS in it, so that the C API can answer samattn_gemm_plan on a
// machine without a GPU and the CPU tests can cover every rule here.
#pragma once

#include <cstdint>
#include <string>

#include "common/problem.h"

namespace samattn::gemm::sm90 {

// Tile configurations of the sm90 GEMM. Each is one CUTLASS sm90 kernel
// (TMA + wgmma, warp-specialized, persistent grid); the K extent of a tile is
// 128 bytes of operand (64 elements of 16 bits, 32 of tf32), one swizzle atom.
enum class Tile : int32_t {
  // 128x256, cluster 2x1 (B multicast to both CTAs), cooperative: two
  // consumer warpgroups share each tile. Large problems.
  k128x256_c2x1 = 0,
  // 128x128, cluster 1x2 (A multicast), cooperative. More tiles: problems
  // that give the 128x256 tile less than a few waves.
  k128x128_c1x2 = 1,
  // 128x64, no cluster, stream-K: K is split across CTAs so that a few
  // output tiles still fill every SM.
  k128x64_streamk = 2,
  // Decode-like M <= 128 (16-bit): computed as D^T = B^T A^T, so the large N
  // runs along the 128-row tile side and M along the 64-wide one: for M <= 64
  // a quarter of the wasted MMA work of padding M to 128. D^T is column-major
  // in the kernel's view. Stream-K, no cluster.
  k128x64_swap_ab = 3,
};
constexpr int kTileCount = 4;
// (Measured and dropped: 128x128 "ping-pong" kernels, cluster 1x2 and 2x1,
// were 4-25% slower than 128x256 cooperative on every large shape on the
// H100; benchmarks/results/h100_sm90_gemm_tuning.json.)

// Fills problem->sm90_tile and sm90_swizzle from the environment, in one
// pass over it (getenv would scan it once per name).
void read_tuning_overrides(GemmProblem* problem);

// The epilogue of an sm90 instantiation. Plain GEMMs keep CUTLASS's
// alpha/beta epilogue: the fused one (a bias broadcast and a run-time
// activation in the visitor tree) measured 1-4% slower on short-K GEMMs.
enum class Epilogue : int32_t {
  plain = 0,      // alpha * acc + beta * C
  fused = 1,      // act(alpha * acc + beta * C + bias), C and D of the input type
  fused_f32 = 2,  // the same with fp32 C and D (16-bit inputs)
};

// Name of a tile ("128x256_c2x1"); nullptr for an unknown value.
const char* tile_name(Tile tile);
// The tile named `name`, or false.
bool parse_tile(const std::string& name, Tile* tile);

// One operand of the oriented problem: base pointer, leading dimension and
// batch stride in elements, and which mode is contiguous.
struct Operand {
  const void* ptr = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
  bool k_major = true;  // A: stride 1 along k (row-major); B: stride 1 along k (column-major)
};

// The problem as the sm90 kernels see it: (batch, m, n, k) with A (m, k) and
// B (k, n); D row-major, except for the swap_ab tile (column-major).
// `transposed` means it computes D^T = B^T A^T of the caller's problem.
//
// tf32 wgmma reads only K-major tiles, so an fp32 operand that is not
// K-major is first copied K-major into the workspace ("staged"); its Operand
// then describes that copy, whose address is known only at launch (ptr is
// nullptr until plan() is given the workspace).
struct Plan {
  bool eligible = false;
  std::string reason;  // why not, when !eligible (for messages and tests)
  bool transposed = false;
  Epilogue epilogue = Epilogue::plain;
  int64_t batch = 0, m = 0, n = 0, k = 0;
  Operand a, b, c, d;  // c.ptr == nullptr when beta == 0
  Tile tile = Tile::k128x256_c2x1;
  int swizzle = 1;  // raster swizzle of the persistent scheduler (1, 2, 4 or 8 tiles)
  // Split-K of the stream-K tiles (problem.split_k): 0 = the scheduler's
  // heuristic (stream-K when few output tiles), 1 = data-parallel, n >= 2 =
  // K split n ways, reduced serially in K order.
  int32_t splits = 0;
  // tf32 staging: the caller's operand as a (batch, rows, cols) view with a
  // unit stride along rows, copied to cols-contiguous rows of stride
  // staged.ld at workspace offset `offset`.
  struct Staging {
    bool active = false;
    const void* src = nullptr;
    int64_t rows = 0, cols = 0, src_col_stride = 0, src_batch_stride = 0;
    int64_t offset = 0, bytes = 0;
  } stage_a, stage_b;
  int64_t staging_bytes = 0;  // workspace bytes before the kernel's own workspace
};

// Whether the kernel's D is column-major (the swap_ab tile).
constexpr bool d_column_major(Tile tile) { return tile == Tile::k128x64_swap_ab; }

// Plans `problem` for a GPU with problem.sm_count multiprocessors; staged
// operands point into problem.workspace when it is set. Not eligible
// when TMA cannot describe an operand (unaligned base or leading dimension,
// no unit stride, a broadcast batch that cannot be folded) or the family has
// no kernel for it (exact fp32, k == 0); the API then runs the sm80 family.
// TMA also needs the contiguous extent of each operand to be a whole number
// of 16 bytes (CUTLASS checks this in can_implement; we check it first).
// A forced split (problem.split_k >= 2) runs on a stream-K tile; parallel
// split-K is declined (CUTLASS's sm90 kernels reduce serially).
// SAMATTN_SM90_GEMM_TILE / SAMATTN_SM90_GEMM_SWIZZLE in the environment
// override the tile and swizzle choice (for tuning; unknown values are
// ignored; a forced split still takes a stream-K tile).
Plan plan(const GemmProblem& problem);

// The heuristic alone, on the sizes oriented for a row-major D: which tile
// and swizzle.
Tile choose_tile(DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k, int sm_count);
int choose_swizzle(DType dtype, Tile tile, int64_t batch, int64_t m, int64_t n, int sm_count);

// Output tiles of a configuration for the oriented sizes.
int64_t tile_count(Tile tile, int64_t batch, int64_t m, int64_t n);

}  // namespace samattn::gemm::sm90
