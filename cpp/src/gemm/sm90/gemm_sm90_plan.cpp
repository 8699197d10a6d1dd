// The sm90 GEMM plan: orientation, TMA eligibility, tf32 staging and the
// tile heuristic.
#include "gemm/sm90/gemm_sm90_plan.h"
#include "gemm/sm90/grouped_sm90_plan.h"
#include "gemm/sm90/split_sm90_plan.h"
#include "gemm/split_k.h"

#include <unistd.h>  // environ

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "samattn/samattn.h"

namespace samattn::gemm::sm90 {
namespace {

constexpr int64_t kTmaAlignmentBytes = 16;
constexpr int64_t kWorkspaceAlignment = 256;
constexpr int64_t kInt32Max = 2147483647;
// Decode-like problems up to this M run as D^T = B^T A^T (the swap_ab tile;
// measured on an H200 at N = K = 8192: 0.81-0.95 of cuBLAS against 0.49-0.90
// for stream-K on 128x64 tiles, M = 16..128).
constexpr int64_t kSwapAbMaxM = 128;

struct TileShape {
  int64_t m, n;
};

TileShape tile_shape(Tile tile) {
  switch (tile) {
    case Tile::k128x256_c2x1:
      return {128, 256};
    case Tile::k128x128_c1x2:
      return {128, 128};
    case Tile::k128x64_streamk:
    case Tile::k128x64_swap_ab:
      return {128, 64};
  }
  return {128, 128};
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

int64_t element_size(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

// A strided (rows, cols) view with a batch stride, in the caller's terms.
struct View {
  const void* ptr;
  int64_t rows, cols, row_stride, col_stride, batch_stride;
};

View transpose(const View& v) {
  return {v.ptr, v.cols, v.rows, v.col_stride, v.row_stride, v.batch_stride};
}

// Which mode of a view is contiguous; `prefer_cols` decides when a size-1
// mode leaves the choice open. False when neither has a unit stride.
bool contiguous_mode(const View& v, bool prefer_cols, bool* cols) {
  const bool cols_unit = v.col_stride == 1 || v.cols == 1;
  const bool rows_unit = v.row_stride == 1 || v.rows == 1;
  if (!cols_unit && !rows_unit) return false;
  *cols = (cols_unit && rows_unit) ? prefer_cols : cols_unit;
  return true;
}

// Fills `out` for an operand whose K mode is its columns (A) or rows (B; C
// and D have none: k_is_cols false, so that k_major means column-major), or
// says why TMA cannot load it. Where a size-1 mode leaves the choice open,
// `prefer_cols` picks: K-major for A and B (tf32 wgmma reads those tiles
// directly), D's layout for C and D.
bool make_operand(const View& v, bool k_is_cols, bool prefer_cols, int64_t batch, int64_t elem,
                  const char* name, Operand* out, std::string* reason) {
  const int64_t align = kTmaAlignmentBytes / elem;
  bool contiguous_cols = false;
  if (!contiguous_mode(v, prefer_cols, &contiguous_cols)) {
    *reason = std::string(name) + " has no unit stride";
    return false;
  }
  const int64_t extent = contiguous_cols ? v.cols : v.rows;  // the contiguous mode
  const int64_t others = contiguous_cols ? v.rows : v.cols;
  int64_t ld = contiguous_cols ? v.row_stride : v.col_stride;
  // With one row (column) the leading dimension is never stepped; give TMA a
  // valid one.
  if (others == 1) ld = round_up(extent, align);
  if (extent % align != 0) {
    *reason = std::string(name) + "'s contiguous extent " + std::to_string(extent) +
              " is not a multiple of " + std::to_string(align) + " elements (16 bytes)";
    return false;
  }
  if (ld % align != 0 || ld < extent) {
    *reason = std::string(name) + "'s leading dimension " + std::to_string(ld) +
              " is not a multiple of 16 bytes at least the row length";
    return false;
  }
  if (reinterpret_cast<uintptr_t>(v.ptr) % kTmaAlignmentBytes != 0) {
    *reason = std::string(name) + " is not 16-byte aligned";
    return false;
  }
  int64_t batch_stride = v.batch_stride;
  if (batch > 1) {
    if (batch_stride == 0) {
      *reason = std::string(name) + " is broadcast over the batch";
      return false;
    }
    if (batch_stride % align != 0) {
      *reason = std::string(name) + "'s batch stride is not a multiple of 16 bytes";
      return false;
    }
  } else {
    batch_stride = ld * others;
  }
  out->ptr = v.ptr;
  out->ld = ld;
  out->batch_stride = batch_stride;
  out->k_major = contiguous_cols == k_is_cols;
  return true;
}

// tf32: an operand with its unit stride along M (A) or N (B) is copied
// K-major into the workspace. `v` is the operand with K as its columns (A
// itself, or B transposed), unit stride along rows.
bool stage_operand(const View& v, int64_t batch, const char* name, Plan::Staging* staging,
                   Operand* out, int64_t* workspace_end, std::string* reason) {
  if (batch > 1 && v.batch_stride == 0) {
    *reason = std::string(name) + " is broadcast over the batch";
    return false;
  }
  const int64_t align = kTmaAlignmentBytes / 4;
  if (v.cols % align != 0) {  // TMA rows of whole 16 bytes (CUTLASS's can_implement)
    *reason = std::string(name) + "'s K extent " + std::to_string(v.cols) +
              " is not a multiple of 4 elements (16 bytes)";
    return false;
  }
  const int64_t ld = v.cols;
  staging->active = true;
  staging->src = v.ptr;
  staging->rows = v.rows;
  staging->cols = v.cols;
  staging->src_col_stride = v.col_stride;
  staging->src_batch_stride = v.batch_stride;
  staging->offset = *workspace_end;
  staging->bytes = round_up(batch * v.rows * ld * 4, kWorkspaceAlignment);
  *workspace_end += staging->bytes;
  out->ptr = nullptr;  // set when the workspace is known
  out->ld = ld;
  out->batch_stride = v.rows * ld;
  out->k_major = true;
  return true;
}

// Automatic split-K of a long K on the stream-K tiles: the most splits (a
// power of 2) that keep one wave of CTAs and at least kMinSplitK of K per
// split, so that the serial fixup of a tile's partial sums stays short next
// to its mainloop; 0 (CUTLASS's own stream-K heuristic) when that is below 2.
// Measured on the H100 at M = N = 256 and 512, K = 65536 (bf16, 128x64
// tiles): 8 and 4 splits were the fastest forced splits, 1.4x and 2.6x
// CUTLASS's heuristic (benchmarks/results/h100_gemm_modes.json).
constexpr int64_t kMinSplitK = 8192;
int32_t auto_splits(Tile tile, int64_t batch, int64_t m, int64_t n, int64_t k, int sm_count) {
  if (tile != Tile::k128x64_streamk && tile != Tile::k128x64_swap_ab) return 0;
  const int64_t tiles = tile_count(tile, batch, m, n);
  int32_t splits = 1;
  while (splits < 64 && tiles * splits * 2 <= sm_count && k / (splits * 2) >= kMinSplitK) {
    splits *= 2;
  }
  return splits >= 2 ? splits : 0;
}

int swizzle_override(const char* text, int fallback) {
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return (*end == '\0' && value > 0 && value <= 64) ? static_cast<int>(value) : fallback;
}

}  // namespace

void read_tuning_overrides(GemmProblem* problem) {
  constexpr char kPrefix[] = "SAMATTN_SM90_GEMM_";
  constexpr size_t kPrefixLength = sizeof kPrefix - 1;
  problem->sm90_tile = problem->sm90_swizzle = nullptr;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const char* text = *entry;
    if (text[0] != 'S' || std::strncmp(text, kPrefix, kPrefixLength) != 0) continue;
    const char* name = text + kPrefixLength;
    if (std::strncmp(name, "TILE=", 5) == 0) problem->sm90_tile = name + 5;
    if (std::strncmp(name, "SWIZZLE=", 8) == 0) problem->sm90_swizzle = name + 8;
  }
}

const char* tile_name(Tile tile) {
  switch (tile) {
    case Tile::k128x256_c2x1:
      return "128x256_c2x1";
    case Tile::k128x128_c1x2:
      return "128x128_c1x2";
    case Tile::k128x64_streamk:
      return "128x64_streamk";
    case Tile::k128x64_swap_ab:
      return "128x64_swap_ab";
  }
  return nullptr;
}

bool parse_tile(const std::string& name, Tile* tile) {
  for (int i = 0; i < kTileCount; ++i) {
    if (name == tile_name(static_cast<Tile>(i))) {
      *tile = static_cast<Tile>(i);
      return true;
    }
  }
  return false;
}

int64_t tile_count(Tile tile, int64_t batch, int64_t m, int64_t n) {
  const TileShape shape = tile_shape(tile);
  if (tile == Tile::k128x64_swap_ab) return batch * ceil_div(n, shape.m) * ceil_div(m, shape.n);
  return batch * ceil_div(m, shape.m) * ceil_div(n, shape.n);
}

// Decode-like 16-bit problems run transposed; otherwise the largest tile
// that still gives (nearly) a full wave of CTAs; below that, stream-K splits
// K so that every SM has work.
Tile choose_tile(DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k, int sm_count) {
  (void)k;
  if (dtype != DType::f32 && m <= kSwapAbMaxM) return Tile::k128x64_swap_ab;
  const int64_t full_wave = (static_cast<int64_t>(sm_count) * 9) / 10;
  if (tile_count(Tile::k128x256_c2x1, batch, m, n) >= full_wave) return Tile::k128x256_c2x1;
  if (tile_count(Tile::k128x128_c1x2, batch, m, n) >= full_wave) return Tile::k128x128_c1x2;
  return Tile::k128x64_streamk;
}

// Grouping tiles in swizzled bands keeps the operand tiles that consecutive
// CTAs share in L2; it only matters with several waves of tiles. Measured on
// the H100 (benchmarks/results/h100_sm90_gemm_tuning.json): 16-bit GEMMs gain
// from bands of 4 only when N is very wide (56 tiles of 256 at N = 14336:
// 0.87 -> 0.94 of cuBLAS at 16384 x 14336 x 4096) and lose a few percent
// elsewhere (16384 x 4096 x 4096); tf32, twice the bytes per tile, gains
// 3-6% from bands of 8.
int choose_swizzle(DType dtype, Tile tile, int64_t batch, int64_t m, int64_t n, int sm_count) {
  if (tile == Tile::k128x64_streamk || tile == Tile::k128x64_swap_ab) return 1;
  const TileShape shape = tile_shape(tile);
  const int64_t m_tiles = ceil_div(m, shape.m), n_tiles = ceil_div(n, shape.n);
  if (tile_count(tile, batch, m, n) <= sm_count || m_tiles < 8 || n_tiles < 8) return 1;
  if (dtype == DType::f32) return 8;
  return n_tiles >= 48 ? 4 : 1;
}

Plan plan(const GemmProblem& problem) {
  Plan out;
  const GemmProblem& p = problem;
  if (p.dtype == DType::f32 && !p.allow_tf32) {
    out.reason = "exact float32 runs on the FMA units (sm80 family)";
    return out;
  }
  if (p.k == 0) {
    out.reason = "k == 0";
    return out;
  }
  if (p.group_mode != SAMATTN_GROUP_NONE) {
    out.reason = "a grouped GEMM (plan_grouped plans those)";
    return out;
  }
  const bool forced_split = p.split_k >= 2;
  if (forced_split && p.split_k_mode == SAMATTN_SPLIT_K_PARALLEL) {
    out.reason = "parallel split-K (the sm90 kernels reduce splits serially)";
    return out;
  }
  if (p.m > kInt32Max || p.n > kInt32Max || p.k > kInt32Max || p.batch > kInt32Max) {
    out.reason = "a size is above 2^31 - 1";
    return out;
  }
  const int64_t elem = element_size(p.dtype);
  const bool tf32 = p.dtype == DType::f32;
  const bool with_c = p.c.ptr != nullptr;
  View a{p.a.ptr, p.m, p.k, p.a.row_stride, p.a.col_stride, p.a.batch_stride};
  View b{p.b.ptr, p.k, p.n, p.b.row_stride, p.b.col_stride, p.b.batch_stride};
  View c{p.c.ptr, p.m, p.n, p.c.row_stride, p.c.col_stride, p.c.batch_stride};
  View d{p.d, p.m, p.n, p.d_row_stride, p.d_col_stride, p.d_batch_stride};
  int64_t batch = p.batch;

  // A batch of row-major A against one shared B is one taller GEMM
  // (a linear layer): fold the batch into M so that TMA needs no stride 0.
  const auto stacks_rows = [](const View& v) {
    return v.col_stride == 1 && v.batch_stride == v.rows * v.row_stride;
  };
  if (batch > 1 && b.batch_stride == 0 && stacks_rows(a) && stacks_rows(d) &&
      (!with_c || stacks_rows(c)) && batch * p.m <= kInt32Max) {
    a.rows = c.rows = d.rows = batch * p.m;
    batch = 1;
  }

  // Orient the problem for a row-major D: a column-major D is D^T = B^T A^T.
  bool d_cols = false;
  if (!contiguous_mode(d, /*prefer_cols=*/true, &d_cols)) {
    out.reason = "d has no unit stride";
    return out;
  }
  out.transposed = !d_cols;
  const auto transpose_problem = [&] {
    const View a_t = transpose(b), b_t = transpose(a);
    a = a_t;
    b = b_t;
    c = transpose(c);
    d = transpose(d);
  };
  if (out.transposed) transpose_problem();

  out.tile = choose_tile(p.dtype, batch, a.rows, b.cols, a.cols, p.sm_count);
  Tile forced;
  if (p.sm90_tile != nullptr && parse_tile(p.sm90_tile, &forced)) out.tile = forced;
  if (tf32 && out.tile == Tile::k128x64_swap_ab) out.tile = Tile::k128x64_streamk;  // 16-bit only
  // Only the stream-K scheduler splits K.
  if (forced_split && out.tile != Tile::k128x64_swap_ab) out.tile = Tile::k128x64_streamk;
  out.splits =
      p.split_k == 0 ? auto_splits(out.tile, batch, a.rows, b.cols, a.cols, p.sm_count) : p.split_k;
  // The swap_ab kernel writes a column-major D: transpose once more.
  const bool d_col_major = d_column_major(out.tile);
  if (d_col_major) {
    transpose_problem();
    out.transposed = !out.transposed;
  }
  out.batch = batch;
  out.m = a.rows;
  out.n = b.cols;
  out.k = a.cols;

  // Messages name the caller's operands, which a transposition swapped.
  const char* a_name = out.transposed ? "b" : "a";
  const char* b_name = out.transposed ? "a" : "b";
  // A and B: TMA straight from the caller's memory, or (tf32, not K-major)
  // from a K-major copy in the workspace.
  int64_t workspace_end = 0;
  const auto place = [&](const View& v, bool k_is_cols, bool prefer_cols, const char* name,
                         Operand* operand, Plan::Staging* staging) {
    bool cols = false;
    if (!contiguous_mode(v, prefer_cols, &cols)) {
      out.reason = std::string(name) + " has no unit stride";
      return false;
    }
    if (tf32 && cols != k_is_cols) {
      return stage_operand(k_is_cols ? v : transpose(v), batch, name, staging, operand,
                           &workspace_end, &out.reason);
    }
    return make_operand(v, k_is_cols, prefer_cols, batch, elem, name, operand, &out.reason);
  };
  if (!place(a, /*k_is_cols=*/true, /*prefer_cols=*/true, a_name, &out.a, &out.stage_a) ||
      !place(b, /*k_is_cols=*/false, /*prefer_cols=*/false, b_name, &out.b, &out.stage_b)) {
    return out;
  }
  // Fused epilogues have instantiations for the layouts of a linear layer
  // (x @ W^T, and x @ W with W (in, out)): a K-major A or B (tf32 is always
  // staged K-major); with fp32 C and D, both K-major.
  const bool out_f32 = p.out_f32 && !tf32;
  if (out_f32) {
    out.epilogue = Epilogue::fused_f32;
  } else if (p.bias != nullptr || p.activation != 0) {
    out.epilogue = Epilogue::fused;
  }
  if (out.epilogue == Epilogue::fused_f32 && !out.a.k_major) {
    out.reason = "fp32 output needs a row-major a";
    return out;
  }
  if (out.epilogue == Epilogue::fused && !out.a.k_major && !out.b.k_major) {
    out.reason = "a bias or an activation with a column-major a and a row-major b";
    return out;
  }
  // The bias runs along the caller's columns: the kernel's columns when it
  // writes D row-major untransposed, its rows when swap_ab writes D^T.
  if (p.bias != nullptr && out.transposed != d_col_major) {
    out.reason = "a bias with a column-major d";
    return out;
  }
  const int64_t out_elem = out_f32 ? 4 : elem;
  if (!make_operand(d, /*k_is_cols=*/false, /*prefer_cols=*/!d_col_major, batch, out_elem, "d",
                    &out.d, &out.reason)) {
    return out;
  }
  if (out.d.k_major != d_col_major) {  // here "k-major" means column-major
    out.reason = "d's layout does not match the kernel's";
    return out;
  }
  if (with_c) {
    if (!make_operand(c, /*k_is_cols=*/false, /*prefer_cols=*/!d_col_major, batch, out_elem, "c",
                      &out.c, &out.reason)) {
      return out;
    }
    if (out.c.k_major != d_col_major) {
      out.reason = "c and d differ in which mode is contiguous";
      return out;
    }
  }
  out.staging_bytes = workspace_end;
  if (p.workspace != nullptr) {
    char* base = static_cast<char*>(p.workspace);
    if (out.stage_a.active) out.a.ptr = base + out.stage_a.offset;
    if (out.stage_b.active) out.b.ptr = base + out.stage_b.offset;
  }

  out.swizzle = choose_swizzle(p.dtype, out.tile, out.batch, out.m, out.n, p.sm_count);
  out.swizzle = swizzle_override(p.sm90_swizzle, out.swizzle);
  out.eligible = true;
  return out;
}

// Raster order of the grouped kernel: along N for the narrow-N ("down")
// projection of many experts, else along M. Measured on the H100 (bf16,
// hidden 4096, expert dim 14336, top-2 of 4096 / 16384 tokens, skewed loads;
// benchmarks/results/h100_grouped_tuning.json): along N ran 1.10x along M on
// 64 experts' down projections, 0.99x on 8 experts' and 0.80-0.96x on every
// up projection.
constexpr int64_t kRasterAlongNMinGroups = 32;
// Rows form: clusters along M (2x1, sharing the expert's weight tile) from
// this many groups. Measured against 1x2 (benchmarks/results/
// h100_grouped_cluster_tuning.json): 64 experts x 16384 tokens 0.98-1.18x
// (up to 1.18 where 1x2 trailed torch._grouped_mm), x 4096 tokens
// 0.97-1.04x; 8 experts 0.84-1.02x, so they keep 1x2.
constexpr int64_t kCluster2x1MinGroups = 32;

const char* grouped_tile_name(GroupedCluster cluster) {
  return cluster == GroupedCluster::k2x1 ? "grouped_128x256_c2x1" : "grouped_128x256_c1x2";
}

bool list_operands(const samattn_gemm_list_entry& e, DType dtype, bool b_k_major, ListOperands* out,
                   std::string* why) {
  const int64_t elem = element_size(dtype);
  std::string reason;
  const auto decline = [&](std::string text) {
    if (why != nullptr) *why = std::move(text);
    return false;
  };
  const View d{e.d, e.m, e.n, e.d_row_stride, e.d_col_stride, 0};
  if (!make_operand(d, /*k_is_cols=*/false, /*prefer_cols=*/true, 1, elem, "d", &out->d, &reason)) {
    return decline(std::move(reason));
  }
  if (out->d.k_major) return decline("d is not row-major");
  if (e.k == 0) return true;  // only D is written
  const View a{e.a, e.m, e.k, e.a_row_stride, e.a_col_stride, 0};
  const View b{e.b, e.k, e.n, e.b_row_stride, e.b_col_stride, 0};
  if (!make_operand(a, /*k_is_cols=*/true, /*prefer_cols=*/true, 1, elem, "a", &out->a, &reason) ||
      !make_operand(b, /*k_is_cols=*/false, /*prefer_cols=*/!b_k_major, 1, elem, "b", &out->b,
                    &reason)) {
    return decline(std::move(reason));
  }
  if (!out->a.k_major) return decline("a is not row-major");
  if (out->b.k_major != b_k_major) {
    return decline(std::string("b is ") + (b_k_major ? "row-major" : "column-major") +
                   " but the list's other bs are " + (b_k_major ? "column-major" : "row-major") +
                   " (the kernel reads every b of a list in one layout)");
  }
  return true;
}

namespace {

// A list: every GEMM that writes anything must fit the kernel, with its B
// in the layout of the first B that has only one (K-major if none).
GroupedPlan plan_list(const GemmProblem& p) {
  GroupedPlan out;
  out.list = true;
  out.b.k_major = true;
  for (int64_t i = 0; i < p.batch; ++i) {
    const samattn_gemm_list_entry& e = p.group_list[i];
    if (e.m == 0 || e.n == 0 || e.k == 0) continue;
    const bool k_major = e.b_row_stride == 1 || e.k == 1;
    const bool n_major = e.b_col_stride == 1 || e.n == 1;
    if (k_major != n_major) {
      out.b.k_major = k_major;
      break;
    }
  }
  for (int64_t i = 0; i < p.batch; ++i) {
    const samattn_gemm_list_entry& e = p.group_list[i];
    ListOperands operands;
    std::string why;
    if (e.m > 0 && e.n > 0 && !list_operands(e, p.dtype, out.b.k_major, &operands, &why)) {
      out.reason = "group_list[" + std::to_string(i) + "]: " + why;
      return out;
    }
  }
  out.groups = p.batch;
  out.eligible = true;
  return out;
}

}  // namespace

// Both forms need every group's operands to start on a 16-byte boundary, and
// a group starts at an arbitrary row (rows form) or K index (K form). So the
// operands the ends index are laid out with that index strided: rows form,
// A and D row-major (B per group in either layout); K form, A with its unit
// stride along M (x^T of a row-major x) and B along N (a row-major dy), D
// row-major per group.
GroupedPlan plan_grouped(const GemmProblem& p) {
  GroupedPlan out;
  const bool k_form = p.group_mode == SAMATTN_GROUP_K;
  if (p.group_mode == SAMATTN_GROUP_LIST) {
    if (p.dtype == DType::f32) {
      out.reason = "GEMM lists in float32 run on the sm80 family";
      return out;
    }
    return plan_list(p);
  }
  if (p.group_mode != SAMATTN_GROUP_ROWS && !k_form) {
    out.reason = "not a grouped GEMM";
    return out;
  }
  if (p.dtype == DType::f32) {
    out.reason = "grouped GEMMs in float32 run on the sm80 family";
    return out;
  }
  if (p.c.ptr != nullptr || p.bias != nullptr || p.activation != 0 || p.out_f32) {
    out.reason = "the grouped kernel has no C, bias, activation or fp32 output";
    return out;
  }
  if (p.split_k >= 2) {
    out.reason = "the grouped kernel does not split K";
    return out;
  }
  if (p.k == 0) {
    out.reason = "k == 0";
    return out;
  }
  if (p.m > kInt32Max || p.n > kInt32Max || p.k > kInt32Max) {
    out.reason = "a size is above 2^31 - 1";
    return out;
  }
  const int64_t elem = element_size(p.dtype);
  // Rows form: A and D shared, B per group. K form: A and B shared, D per group.
  const View a{p.a.ptr, p.m, p.k, p.a.row_stride, p.a.col_stride, 0};
  const View b{p.b.ptr, p.k, p.n, p.b.row_stride, p.b.col_stride, k_form ? 0 : p.b.batch_stride};
  const View d{p.d, p.m, p.n, p.d_row_stride, p.d_col_stride, k_form ? p.d_batch_stride : 0};
  if (!make_operand(a, /*k_is_cols=*/true, /*prefer_cols=*/!k_form, 1, elem, "a", &out.a,
                    &out.reason) ||
      !make_operand(b, /*k_is_cols=*/false, /*prefer_cols=*/k_form, k_form ? 1 : p.batch, elem, "b",
                    &out.b, &out.reason) ||
      !make_operand(d, /*k_is_cols=*/false, /*prefer_cols=*/true, k_form ? p.batch : 1, elem, "d",
                    &out.d, &out.reason)) {
    return out;
  }
  // (A single row or column leaves a layout open; make_operand took the
  // preferred one.)
  if (!k_form && (!out.a.k_major || out.d.k_major)) {
    out.reason = "the grouped kernel takes a row-major a and d";
    return out;
  }
  if (k_form && (out.a.k_major || out.b.k_major || out.d.k_major)) {
    out.reason =
        "the K-grouped kernel takes a with its unit stride along m, b along n and a row-major d";
    return out;
  }
  out.k_form = k_form;
  out.groups = p.batch;
  out.m = p.m;
  out.n = p.n;
  out.k = p.k;
  out.raster_along_n = !k_form && p.n < p.k && p.batch >= kRasterAlongNMinGroups;
  out.cluster =
      !k_form && p.batch >= kCluster2x1MinGroups ? GroupedCluster::k2x1 : GroupedCluster::k1x2;
  out.eligible = true;
  return out;
}

namespace {

// The split of `p` into `splits` K ranges (parallel_split).
ParallelSplitPlan plan_parallel_split(const GemmProblem& p, int32_t splits) {
  ParallelSplitPlan out;
  if (p.dtype == DType::f32) {
    out.reason = "parallel split-K in float32 runs on the sm80 family";
    return out;
  }
  if (p.batch != 1) {
    out.reason = "parallel split-K of a batched GEMM runs on the sm80 family";
    return out;
  }
  const SplitK cut = split_k_ranges(p.k, splits);
  if (cut.splits < 2 || p.k % cut.k_per_split != 0) {
    out.reason = "K " + std::to_string(p.k) + " is not " + std::to_string(splits) +
                 " ranges of one whole number of 64 elements";
    return out;
  }
  out.splits = cut.splits;
  out.k_per_split = cut.k_per_split;
  out.partial_bytes = round_up(int64_t{cut.splits} * p.m * p.n * 4, kWorkspaceAlignment);
  // Split s reads A's columns and B's rows [s * k_per_split, (s + 1) * k_per_split).
  GemmProblem& in = out.inner;
  in = p;
  in.batch = cut.splits;
  in.k = cut.k_per_split;
  in.a.batch_stride = cut.k_per_split * p.a.col_stride;
  in.b.batch_stride = cut.k_per_split * p.b.row_stride;
  in.c = MatrixView{};
  in.beta = 0.0f;
  in.alpha = 1.0f;
  in.bias = nullptr;
  in.bias_per_row = false;
  in.activation = 0;
  in.out_f32 = true;
  in.split_k = 1;
  in.split_k_mode = SAMATTN_SPLIT_K_AUTO;
  in.d = p.workspace;
  in.d_batch_stride = p.m * p.n;
  in.d_row_stride = p.n;
  in.d_col_stride = 1;
  in.workspace =
      p.workspace != nullptr ? static_cast<char*>(p.workspace) + out.partial_bytes : nullptr;
  in.workspace_bytes = std::max<int64_t>(p.workspace_bytes - out.partial_bytes, 0);
  // The partials' address is known only with the workspace; plan with a
  // stand-in aligned one until then.
  if (in.d == nullptr) in.d = reinterpret_cast<void*>(uintptr_t{256});
  out.inner_plan = plan(in);
  if (!out.inner_plan.eligible) {
    out.reason = "its batched GEMM: " + out.inner_plan.reason;
    return out;
  }
  out.eligible = true;
  return out;
}

// Automatic parallel split: about 4096 of K per range. Measured on the H100
// (bf16, forced 8, 16 and 32 ranges; benchmarks/results/h100_gemm_modes.json):
// the rule's count was the fastest parallel split at M x N x K = 256 x 256 x
// 65536 and 1024 x 1024 x 32768, within 4% and 8% of it at 512 x 512 x 65536
// and 384 x 1536 x 49152, and ran 1.07-1.35x the serial path's own choice in
// the same run (the serial split at 512 x 512 varied from 0.71 to 0.89 of
// cuBLAS between runs, the parallel one by 2%).
constexpr int64_t kAutoParallelMinK = 16384;
constexpr int64_t kAutoParallelKPerSplit = 4096;

}  // namespace

ParallelSplitPlan parallel_split(const GemmProblem& p) {
  if (p.group_mode != SAMATTN_GROUP_NONE) return {};
  if (p.split_k >= 2) {
    if (p.split_k_mode != SAMATTN_SPLIT_K_PARALLEL) return {};
    ParallelSplitPlan forced = plan_parallel_split(p, p.split_k);
    forced.applies = true;
    return forced;
  }
  if (p.split_k != 0 || p.dtype == DType::f32 || p.batch != 1 || p.k < kAutoParallelMinK) {
    return {};
  }
  if (ceil_div(p.m, 128) * ceil_div(p.n, 128) >= p.sm_count) return {};
  int32_t splits = 2;
  while (splits < kMaxSplitK && p.k / (int64_t{splits} * 2) >= kAutoParallelKPerSplit) splits *= 2;
  ParallelSplitPlan automatic = plan_parallel_split(p, splits);
  automatic.applies = automatic.eligible;
  return automatic;
}

}  // namespace samattn::gemm::sm90
