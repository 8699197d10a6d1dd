// Host-only probe of the attention dispatch (test_attention_build.py): the
// family dispatch headers compiled with g++, run_flash_fwd / run_flash_bwd /
// run_flash_fwd_sm90 / run_flash_bwd_sm90 defined here to print the configuration they are asked
// to run instead of launching it. One line per (direction, family, dtype,
// head dim, shared memory, key loop; decode: one query over a KV cache, the
// kvcache kernel):
//   <fwd|bwd> <family> <dtype> <head dim> <smem bytes> <short|long|decode> <fields or none>
//
// The sm90 family picks its rows in its family translation unit
// (attention/sm90/flash_sm90.cu, host code that names its kernels through
// FlashFwdSm90Config / FlashBwdSm90Config tags only): the probe includes that file, and links
// common/registry.cpp for its registrations.
#include <cstdio>
#include <initializer_list>
#include <string_view>

#include "attention/flash_bwd_dispatch.h"
#include "attention/flash_fwd_dispatch.h"
#include "attention/sm90/flash_bwd_sm90_config.h"
#include "attention/sm90/flash_fwd_sm90_config.h"

namespace samattn::attention {

const char* probe_family_name(Family family) {
  return family == Family::sm75   ? "sm75"
         : family == Family::sm80 ? "sm80"
         : family == Family::sm90 ? "sm90"
                                  : "other";
}

template <class Config>
struct Fields;
// fp8-cache kernels (F8) are picked only by calls with fp8 caches, which the
// probe does not make; their rows are the kvcache rows.
template <DType T, int D, int BM, int BN, int W, bool QR, Family F, int S, bool C, bool F8>
struct Fields<FlashFwdConfig<T, D, BM, BN, W, QR, F, S, C, F8>> {
  static void print() {
    std::printf("%s %d,%d,%d,%d,%s,%d\n", probe_family_name(F), D, BM, BN, W, QR ? "true" : "false",
                S);
  }
};
template <DType T, int D, int BM, int BN, int W, int S, Family F>
struct Fields<FlashBwdConfig<T, D, BM, BN, W, S, F>> {
  static void print() { std::printf("%s %d,%d,%d,%d,%d\n", probe_family_name(F), D, BM, BN, W, S); }
};

template <class Config>
cudaError_t run_flash_fwd(const AttentionForwardProblem&) {
  Fields<Config>::print();
  return cudaSuccess;
}
template <class Config>
cudaError_t run_flash_bwd(const AttentionBackwardProblem&) {
  Fields<Config>::print();
  return cudaSuccess;
}
template <class Config>
cudaError_t run_flash_fwd_sm90(const AttentionForwardProblem&) {
  std::printf("sm90 %d,%d,%d,%d\n", Config::kHeadDim, Config::kBlockM, Config::kBlockN,
              Config::kStages);
  return cudaSuccess;
}
template <class Config>
cudaError_t run_flash_bwd_sm90(const AttentionBackwardProblem&) {
  std::printf("sm90 %d,%d,%d,%d\n", Config::kHeadDim, Config::kBlockM, Config::kBlockN,
              Config::kStages);
  return cudaSuccess;
}

}  // namespace samattn::attention

#include "attention/sm90/flash_sm90.cu"

namespace {

using samattn::DType;
using namespace samattn::attention;

constexpr int kSmem[] = {48 * 1024, 64 * 1024, 99 * 1024, 163 * 1024, 227 * 1024};
constexpr int kHeadDims[] = {8, 32, 33, 64, 80, 96, 128, 160, 192, 256, 257};

const char* dtype_name(DType dtype) { return dtype == DType::f16 ? "f16" : "bf16"; }

template <class Problem, class Run>
void probe(const char* direction, const char* family, DType dtype, Run run) {
  for (int head_dim : kHeadDims) {
    for (int smem : kSmem) {
      // "dropout": short keys with dropout, which rows without room for score
      // terms leave to the next row of their head dim.
      for (const char* keys : {"short", "long", "decode", "dropout"}) {
        const std::string_view kind = keys;
        const bool decode = kind == "decode", dropout = kind == "dropout";
        if (decode && direction[0] == 'b') continue;  // the kvcache kernel is forward-only
        Problem p{};
        p.dtype = dtype;
        p.headdim = head_dim;
        p.max_smem_per_block = smem;
        p.batch = p.nheads = p.nheads_k = p.kv_group = 1;
        p.seqlen_q = decode ? 1 : 512;
        p.seqlen_k = kind == "short" || dropout ? 512 : 4096;
        if (dropout) p.terms.dropout.p = 0.1f;
        p.window = {-1, -1};
        p.cache.enabled = decode;
        p.cache.capacity = p.seqlen_k;
        p.cache.kv_cache_batch = 1;
        std::printf("%s %s %s %d %d %s ", direction, family, dtype_name(dtype), head_dim, smem,
                    keys);
        std::fflush(stdout);
        if (run(p) != cudaSuccess) std::printf("none\n");
      }
    }
  }
}

template <DType T>
void probe_sm80() {
  probe<samattn::AttentionForwardProblem>("fwd", "sm80", T, run_flash_fwd_sm80_dtype<T>);
  probe<samattn::AttentionBackwardProblem>("bwd", "sm80", T, run_flash_bwd_sm80_dtype<T>);
}

}  // namespace

int main() {
  probe_sm80<DType::f16>();
  probe_sm80<DType::bf16>();
  probe<samattn::AttentionForwardProblem>("fwd", "sm75", DType::f16,
                                          run_flash_fwd_sm75_dtype<DType::f16>);
  probe<samattn::AttentionBackwardProblem>("bwd", "sm75", DType::f16,
                                           run_flash_bwd_sm75_dtype<DType::f16>);
  // sm90: the launch path, as for the others (the plans' declines are
  // tested through the registry); decode problems take its cache table.
  for (DType dtype : {DType::f16, DType::bf16}) {
    probe<samattn::AttentionForwardProblem>("fwd", "sm90", dtype, launch);
  }
  probe<samattn::AttentionBackwardProblem>("bwd", "sm90", DType::f16, launch_backward);
  probe<samattn::AttentionBackwardProblem>("bwd", "sm90", DType::bf16, launch_backward);
  return 0;
}
