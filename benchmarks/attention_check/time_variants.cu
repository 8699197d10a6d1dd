// The timing program of time_variants.sh: run_flash_fwd / run_flash_bwd of the bf16 sm80
// configurations FWD64 ... BWD256 (macros from the generated configs.h) on the issue's
// grid (batch x seqlen = 16k tokens, heads x d = 2048), median of 15 runs with events;
// one JSON line per case with sum |x| of dq, dk, dv. Inputs are hashed values in [-1, 1).
// TV_HEADDIMS / TV_SEQLENS (comma lists, e.g. "64" and "512,1024,2048") narrow the grid.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "attention/attention_problem.h"
#include "attention/flash_bwd_config.h"
#include "attention/flash_fwd_config.h"
using namespace samattn;
using namespace samattn::attention;
#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      return 1;                                                        \
    }                                                                  \
  } while (0)
template <int D, int BM, int BN, int W, bool R, int S = 1>
using F = FlashFwdConfig<DType::bf16, D, BM, BN, W, R, Family::sm80, S>;
template <int D, int BM, int BN, int W, int S>
using B = FlashBwdConfig<DType::bf16, D, BM, BN, W, S, Family::sm80>;
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = __float2bfloat16((x & 0xFFFF) / 32768.0f - 1.0f);
  }
}
// sum |x| of a bf16 tensor, to compare variants' gradients (atomics add in any order, so
// equal to a few digits rather than bit for bit).
__global__ void abs_sum(const __nv_bfloat16* p, size_t n, double* out) {
  double acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    acc += fabs(double(__bfloat162float(p[i])));
  }
  atomicAdd(out, acc);
}
template <class Fn>
float median_ms(Fn fn) {
  fn();
  cudaDeviceSynchronize();
  std::vector<float> t;
  for (int i = 0; i < 15; ++i) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
// The comma-separated integers of environment variable `name`, or `fallback` if unset.
std::vector<int> env_list(const char* name, std::vector<int> fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == 0) return fallback;
  std::vector<int> values;
  for (char* end; *text; text = *end ? end + 1 : end) values.push_back(std::strtol(text, &end, 10));
  return values;
}
int main(int argc, char** argv) {
  const char* variant = argc > 1 ? argv[1] : "?";
  // --odd: head dim d - 1 in the same kernels, which moves rows element by element.
  const int odd = argc > 2 && std::strcmp(argv[2], "--odd") == 0 ? 1 : 0;
  int dev = 0, sms, smem;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  const size_t n = size_t(16384) * 2048;
  __nv_bfloat16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float* lse;
  for (auto** p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) CK(cudaMalloc(p, n * 2));
  CK(cudaMalloc(&lse, size_t(16384) * 32 * 4));
  unsigned seed = 1;
  for (auto* p : {q, k, v, dout}) fill<<<1024, 256>>>(p, n, seed++);
  void* ws = nullptr;
  size_t ws_bytes = 0;
  struct Case {
    int d;
    int seqlen;
    bool causal;
  };
  for (int d : env_list("TV_HEADDIMS", {64, 128, 256}))
    for (int s : env_list("TV_SEQLENS", {1024, 4096, 16384}))
      for (bool causal : {false, true}) {
        const int batch = 16384 / s, heads = 2048 / d;
        AttentionForwardProblem f{};
        f.dtype = DType::bf16;
        f.batch = batch;
        f.nheads = f.nheads_k = heads;
        f.seqlen_q = f.seqlen_k = s;
        f.headdim = d - odd;
        const int64_t sb = int64_t(s) * heads * d, ss = int64_t(heads) * d, sh = d;
        f.q = {q, sb, ss, sh};
        f.k = {k, sb, ss, sh};
        f.v = {v, sb, ss, sh};
        f.kv_group = 1;
        f.o = {o, sb, ss, sh};
        samattn::set_scores(f, 1.0f / sqrtf(float(d)), 0.0f, causal, -1, -1);
        f.lse = lse;
        f.lse_batch_stride = int64_t(heads) * s;
        f.lse_head_stride = s;
        f.lse_seq_stride = 1;
        f.sm_count = sms;
        f.max_smem_per_block = smem;
        cudaError_t (*fwd)(const AttentionForwardProblem&) = d == 64    ? run_flash_fwd<F<FWD64>>
                                                             : d == 128 ? run_flash_fwd<F<FWD128>>
                                                                        : run_flash_fwd<F<FWD256>>;
        cudaError_t (*bwd)(const AttentionBackwardProblem&) = d == 64    ? run_flash_bwd<B<BWD64>>
                                                              : d == 128 ? run_flash_bwd<B<BWD128>>
                                                                         : run_flash_bwd<B<BWD256>>;
        CK(fwd(f));
        AttentionBackwardProblem b{};
        static_cast<AttentionForwardProblem&>(b) = f;
        b.dout = {dout, sb, ss, sh};
        b.dq = {dq, sb, ss, sh};
        b.dk = {dk, sb, ss, sh};
        b.dv = {dv, sb, ss, sh};
        const size_t need = flash_bwd_workspace_bytes(b);
        if (need > ws_bytes) {
          if (ws) cudaFree(ws);
          CK(cudaMalloc(&ws, need));
          ws_bytes = need;
        }
        b.workspace = ws;
        b.workspace_bytes = need;
        const float fms = median_ms([&] { fwd(f); });
        const float bms = median_ms([&] { bwd(b); });
        CK(cudaGetLastError());
        double* sums;
        CK(cudaMalloc(&sums, 3 * sizeof(double)));
        CK(cudaMemset(sums, 0, 3 * sizeof(double)));
        CK(cudaMemset(dq, 0xff, n * 2));  // NaN: a gradient left unwritten shows
        CK(bwd(b));
        abs_sum<<<1024, 256>>>(dq, n, sums);
        abs_sum<<<1024, 256>>>(dk, n, sums + 1);
        abs_sum<<<1024, 256>>>(dv, n, sums + 2);
        double host_sums[3];
        CK(cudaMemcpy(host_sums, sums, sizeof(host_sums), cudaMemcpyDeviceToHost));
        cudaFree(sums);
        const double flop = 4.0 * batch * heads * double(s) * s * (d - odd) / (causal ? 2 : 1);
        printf(
            "{\"variant\":\"%s\",\"d\":%d,\"seqlen\":%d,\"causal\":%d,\"fwd_ms\":%.4f,\"bwd_ms\":%."
            "4f,\"fwd_tflops\":%.1f,\"bwd_tflops\":%.1f,\"abs_sums\":[%.6e,%.6e,%.6e]}\n",
            variant, d - odd, s, int(causal), fms, bms, flop / fms / 1e9, 2.5 * flop / bms / 1e9,
            host_sums[0], host_sums[1], host_sums[2]);
        fflush(stdout);
      }
  return 0;
}
