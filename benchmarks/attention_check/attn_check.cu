// Standalone checker of the sm80 attention forward (no torch): correctness
// against naive GPU references, then a timing table. Writes JSON to argv[1].
// Built with -DSAMATTN_CHECK_SM90 it checks the sm90 family instead; cases
// its plan declines (which sm80 runs in the library) are listed as SKIP.
//   PASS per case: max|ours - ref32| <= 2 * max|refT - ref32| + 1e-5, where
//   ref32 is an fp32 reference and refT the same computation rounded to the
//   input dtype like torch would; every output / LSE element in range is
//   written and finite (LSE +inf exactly where a row attends nothing).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/flash_fwd_config.h"
#include "attention/sm90/flash_fwd_sm90_config.h"

#define CHECK_CUDA(call)                                                   \
  do {                                                                     \
    cudaError_t status_ = (call);                                          \
    if (status_ != cudaSuccess) {                                          \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(status_));                           \
      std::exit(2);                                                        \
    }                                                                      \
  } while (0)

using samattn::AttentionForwardProblem;
using samattn::DType;
using RunFn = cudaError_t (*)(const AttentionForwardProblem&);

// Alternative tile configurations (bf16), checked on a few cases and timed
// next to the dispatch's choice so that the table can be tuned on the GPU.
// Each is instantiated by build.sh (alt_configs).
struct AltConfig {
  const char* name;
  int d;
  RunFn run;
};
#ifdef SAMATTN_CHECK_SM90
static cudaError_t forward(const AttentionForwardProblem& p) {
  return samattn::attention_forward_sm90(p);
}
// nullptr where the build left the head dim out (build.sh's HEAD_DIMS), so
// that the link needs no kernel that no unit instantiated.
template <int D, int BM, int BN, int S>
constexpr RunFn alt_run() {
  if constexpr (samattn::head_dim_built(D)) {
    return &samattn::attention::run_flash_fwd_sm90<
        samattn::attention::FlashFwdSm90Config<DType::bf16, D, BM, BN, S>>;
  } else {
    return nullptr;
  }
}
template <int D, int BM, int BN, int S>
constexpr RunFn kAltRun = alt_run<D, BM, BN, S>();
// Both d = 64 rows of the table (the dispatch picks by key-loop length), and
// one that is not.
static const AltConfig kAltConfigs[] = {
    {"192x128 s2", 64, kAltRun<64, 192, 128, 2>},
    {"128x128 s2", 64, kAltRun<64, 128, 128, 2>},
    {"128x192 s2", 64, kAltRun<64, 128, 192, 2>},
};
#else
static cudaError_t forward(const AttentionForwardProblem& p) {
  return samattn::attention_forward_sm80(p);
}
template <int D, int BM, int BN, int W, bool QR>
constexpr RunFn alt_run() {
  if constexpr (samattn::head_dim_built(D)) {
    return &samattn::attention::run_flash_fwd<samattn::attention::FlashFwdConfig<
        DType::bf16, D, BM, BN, W, QR, samattn::attention::Family::sm80>>;
  } else {
    return nullptr;
  }
}
template <int D, int BM, int BN, int W, bool QR>
constexpr RunFn kAltRun = alt_run<D, BM, BN, W, QR>();
static const AltConfig kAltConfigs[] = {
    {"128x128 w4 q-reg", 64, kAltRun<64, 128, 128, 4, true>},
    {"128x64 w4 q-smem", 64, kAltRun<64, 128, 64, 4, false>},
};
#endif

// ------------------------------------------------------------------ inputs
__global__ void fill_uniform(uint16_t* out, int64_t n, uint32_t seed, bool bf16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ (seed * 2246822519u) ^ uint32_t(i >> 32);
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    x *= 3266489917u;
    x ^= x >> 16;
    const float u = (x >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
    if (bf16) {
      __nv_bfloat16 b = __float2bfloat16(u);
      out[i] = *reinterpret_cast<uint16_t*>(&b);
    } else {
      __half h = __float2half(u);
      out[i] = *reinterpret_cast<uint16_t*>(&h);
    }
  }
}

__device__ inline float load_elem(const uint16_t* p, int64_t i, bool bf16) {
  uint16_t bits = p[i];
  return bf16 ? __bfloat162float(*reinterpret_cast<__nv_bfloat16*>(&bits))
              : __half2float(*reinterpret_cast<__half*>(&bits));
}
__device__ inline float round_to(float x, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16(x)) : __half2float(__float2half(x));
}

// --------------------------------------------------------------- reference
struct RefArgs {
  const uint16_t *q, *k, *v;
  float* out;  // same element offsets as the kernel's output
  float* lse;  // same offsets as the kernel's LSE
  int64_t q_b, q_s, q_h, k_b, k_s, k_h, v_b, v_s, v_h, o_b, o_s, o_h, l_b, l_s, l_h;
  const int32_t *cu_q, *cu_k;
  int sq, sk, d, kv_group;
  float scale, softcap;
  int left, right;  // normalized
  bool bf16, round;
};

__device__ float block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = is_max ? -INFINITY : 0.0f;
  for (int w = 0; w < blockDim.x / 32; ++w) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
  return v;
}

// One block per (row, head, batch), three passes over the keys (max, sum,
// then P V in chunks of probabilities staged in shared memory), so that any
// seqlen_k fits.
__device__ float ref_score(const RefArgs& a, const float* q_row, const uint16_t* k, int j) {
  float acc = 0.0f;
  for (int dd = 0; dd < a.d; ++dd) acc += q_row[dd] * load_elem(k, j * a.k_s + dd, a.bf16);
  if (a.round) acc = round_to(acc, a.bf16);
  float s = acc * a.scale;
  if (a.round) s = round_to(s, a.bf16);
  if (a.softcap > 0.0f) {
    s = s / a.softcap;
    if (a.round) s = round_to(s, a.bf16);
    s = tanhf(s);
    if (a.round) s = round_to(s, a.bf16);
    s = s * a.softcap;
    if (a.round) s = round_to(s, a.bf16);
  }
  return s;
}

__global__ void reference_kernel(RefArgs a) {
  constexpr int kChunk = 4096;
  __shared__ float probs[kChunk];
  __shared__ float q_row[256];
  __shared__ float scratch[32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int sq = a.sq, sk = a.sk;
  int64_t q0 = 0, k0 = 0;
  if (a.cu_q) {
    q0 = a.cu_q[b];
    sq = a.cu_q[b + 1] - a.cu_q[b];
  }
  if (a.cu_k) {
    k0 = a.cu_k[b];
    sk = a.cu_k[b + 1] - a.cu_k[b];
  }
  if (i >= sq) return;
  const int hk = h / a.kv_group;
  const uint16_t* q = a.q + (a.cu_q ? q0 * a.q_s : b * a.q_b) + h * a.q_h + i * a.q_s;
  const uint16_t* k = a.k + (a.cu_k ? k0 * a.k_s : b * a.k_b) + hk * a.k_h;
  const uint16_t* v = a.v + (a.cu_k ? k0 * a.v_s : b * a.v_b) + hk * a.v_h;
  float* out = a.out + (a.cu_q ? q0 * a.o_s : b * a.o_b) + h * a.o_h + i * a.o_s;
  float* lse = a.lse + (a.cu_q ? q0 * a.l_s : b * a.l_b) + h * a.l_h + i * a.l_s;
  for (int dd = threadIdx.x; dd < a.d; dd += blockDim.x) q_row[dd] = load_elem(q, dd, a.bf16);
  __syncthreads();
  const int diag = i + sk - sq;
  const int lo = a.left >= 0 ? max(0, diag - a.left) : 0;
  const int hi = a.right >= 0 ? min(sk, diag + a.right + 1) : sk;
  float local = -INFINITY;
  for (int j = lo + threadIdx.x; j < hi; j += blockDim.x)
    local = fmaxf(local, ref_score(a, q_row, k, j));
  const float m = block_reduce(local, true, scratch);
  if (m == -INFINITY) {
    for (int dd = threadIdx.x; dd < a.d; dd += blockDim.x) out[dd] = 0.0f;
    if (threadIdx.x == 0) *lse = INFINITY;
    return;
  }
  local = 0.0f;
  for (int j = lo + threadIdx.x; j < hi; j += blockDim.x)
    local += expf(ref_score(a, q_row, k, j) - m);
  const float l = block_reduce(local, false, scratch);
  if (threadIdx.x == 0) *lse = m + logf(l);
  const float inv = 1.0f / l;
  float acc[2] = {0.0f, 0.0f};  // head dims threadIdx.x and + 128
  for (int c0 = lo; c0 < hi; c0 += kChunk) {
    const int c1 = min(hi, c0 + kChunk);
    __syncthreads();
    for (int j = c0 + threadIdx.x; j < c1; j += blockDim.x) {
      float p = expf(ref_score(a, q_row, k, j) - m) * inv;
      probs[j - c0] = a.round ? round_to(p, a.bf16) : p;
    }
    __syncthreads();
    for (int t = 0; t < 2; ++t) {
      const int dd = threadIdx.x + t * blockDim.x;
      if (dd >= a.d) continue;
      for (int j = c0; j < c1; ++j) acc[t] += probs[j - c0] * load_elem(v, j * a.v_s + dd, a.bf16);
    }
  }
  for (int t = 0; t < 2; ++t) {
    const int dd = threadIdx.x + t * blockDim.x;
    if (dd < a.d) out[dd] = a.round ? round_to(acc[t], a.bf16) : acc[t];
  }
}

// ------------------------------------------------------------------- cases
enum class Layout { bshd, bhsd, bshd_padded, varlen };

struct Case {
  DType dtype;
  int d, batch, h, hk, sq, sk;
  bool causal;
  int left, right;
  float softcap;
  Layout layout;
  std::vector<int> lens_q, lens_k;  // varlen
  bool small_smem;                  // dispatch as on a 99 KB (8.6 / 8.9) GPU
  const AltConfig* alt = nullptr;   // run this configuration instead of the dispatch
};

static std::string describe(const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s d=%d b=%d h=%d/%d sq=%d sk=%d%s win=(%d,%d) cap=%g %s%s",
                c.dtype == DType::bf16 ? "bf16" : "f16", c.d, c.batch, c.h, c.hk, c.sq, c.sk,
                c.causal ? " causal" : "", c.left, c.right, c.softcap,
                c.layout == Layout::bshd          ? "bshd"
                : c.layout == Layout::bhsd        ? "bhsd"
                : c.layout == Layout::bshd_padded ? "bshd+pad"
                                                  : "varlen",
                c.small_smem ? " smem99K" : "");
  std::string name = buf;
  if (c.alt) name += std::string(" alt ") + c.alt->name;
  return name;
}

struct DeviceInfo {
  int sm_count, max_smem;
  std::string name;
};

struct Buffers {
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float *lse = nullptr, *ref32 = nullptr, *refT = nullptr, *lse32 = nullptr, *lseT = nullptr;
  int32_t *cu_q = nullptr, *cu_k = nullptr;
};

static void free_buffers(Buffers& buf) {
  for (void* ptr :
       {static_cast<void*>(buf.q), static_cast<void*>(buf.k), static_cast<void*>(buf.v),
        static_cast<void*>(buf.o), static_cast<void*>(buf.lse), static_cast<void*>(buf.ref32),
        static_cast<void*>(buf.refT), static_cast<void*>(buf.lse32), static_cast<void*>(buf.lseT),
        static_cast<void*>(buf.cu_q), static_cast<void*>(buf.cu_k)}) {
    CHECK_CUDA(cudaFree(ptr));
  }
}

struct Result {
  std::string name;
  double err, dtype_err, lse_err;
  long bad_written;
  bool pass;
  bool declined;  // SAMATTN_CHECK_SM90: the family's plan declined the case
};

// The documented window, for the reference: a negative bound is unbounded,
// causal is right = 0; no other rule (samattn follows flash_attn_func's
// documentation, not flash-attn's bound >= seqlen_k shortcut).
static void normalize_window(const Case& c, int, int& left, int& right) {
  left = c.left < 0 ? -1 : c.left;
  right = c.right < 0 ? -1 : c.right;
  if (c.causal) right = 0;
}

static Result run_case(const Case& c, const DeviceInfo& dev) {
  const bool bf16 = c.dtype == DType::bf16;
  const bool varlen = c.layout == Layout::varlen;
  const int batch = varlen ? int(c.lens_q.size()) : c.batch;
  std::vector<int32_t> cu_q(batch + 1, 0), cu_k(batch + 1, 0);
  int sq = c.sq, sk = c.sk;
  if (varlen) {
    sq = sk = 0;
    for (int b = 0; b < batch; ++b) {
      cu_q[b + 1] = cu_q[b] + c.lens_q[b];
      cu_k[b + 1] = cu_k[b] + c.lens_k[b];
      sq = std::max(sq, c.lens_q[b]);
      sk = std::max(sk, c.lens_k[b]);
    }
  }
  const int64_t rows_q = varlen ? cu_q[batch] : int64_t(batch) * sq;
  const int64_t rows_k = varlen ? cu_k[batch] : int64_t(batch) * sk;
  const int dpad = c.layout == Layout::bshd_padded ? c.d + 16 : c.d;  // head stride

  // Strides (elements). bshd: (b, s, h, d); bhsd: (b, h, s, d), torch SDPA's.
  struct Strides {
    int64_t b, s, h;
  };
  auto make = [&](int heads, int seqlen) {
    if (c.layout == Layout::bhsd)
      return Strides{int64_t(heads) * seqlen * c.d, c.d, int64_t(seqlen) * c.d};
    return Strides{int64_t(seqlen) * heads * dpad, int64_t(heads) * dpad, dpad};
  };
  const Strides sq_str = make(c.h, sq), sk_str = make(c.hk, sk);
  const int64_t n_q = varlen ? rows_q * c.h * dpad : batch * sq_str.b;
  const int64_t n_k = varlen ? rows_k * c.hk * dpad : batch * sk_str.b;
  const int64_t n_lse = int64_t(c.h) * rows_q;

  Buffers buf;
  CHECK_CUDA(cudaMalloc(&buf.q, std::max<int64_t>(n_q, 1) * 2));
  CHECK_CUDA(cudaMalloc(&buf.k, std::max<int64_t>(n_k, 1) * 2));
  CHECK_CUDA(cudaMalloc(&buf.v, std::max<int64_t>(n_k, 1) * 2));
  CHECK_CUDA(cudaMalloc(&buf.o, std::max<int64_t>(n_q, 1) * 2));
  CHECK_CUDA(cudaMalloc(&buf.ref32, std::max<int64_t>(n_q, 1) * 4));
  CHECK_CUDA(cudaMalloc(&buf.refT, std::max<int64_t>(n_q, 1) * 4));
  CHECK_CUDA(cudaMalloc(&buf.lse, std::max<int64_t>(n_lse, 1) * 4));
  CHECK_CUDA(cudaMalloc(&buf.lse32, std::max<int64_t>(n_lse, 1) * 4));
  CHECK_CUDA(cudaMalloc(&buf.lseT, std::max<int64_t>(n_lse, 1) * 4));
  if (varlen) {
    CHECK_CUDA(cudaMalloc(&buf.cu_q, (batch + 1) * 4));
    CHECK_CUDA(cudaMalloc(&buf.cu_k, (batch + 1) * 4));
    CHECK_CUDA(cudaMemcpy(buf.cu_q, cu_q.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(buf.cu_k, cu_k.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  }
  static uint32_t seed = 1;
  if (n_q) fill_uniform<<<1024, 256>>>(buf.q, n_q, seed++, bf16);
  if (n_k) fill_uniform<<<1024, 256>>>(buf.k, n_k, seed++, bf16);
  if (n_k) fill_uniform<<<1024, 256>>>(buf.v, n_k, seed++, bf16);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaMemset(buf.o, 0xFF, std::max<int64_t>(n_q, 1) * 2));  // NaN poison
  CHECK_CUDA(cudaMemset(buf.lse, 0xFF, std::max<int64_t>(n_lse, 1) * 4));

  AttentionForwardProblem p{};
  p.dtype = c.dtype;
  p.batch = batch;
  p.nheads = c.h;
  p.nheads_k = c.hk;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.headdim = c.d;
  p.q = {buf.q, varlen ? 0 : sq_str.b, varlen ? int64_t(c.h) * dpad : sq_str.s,
         varlen ? dpad : sq_str.h};
  p.k = {buf.k, varlen ? 0 : sk_str.b, varlen ? int64_t(c.hk) * dpad : sk_str.s,
         varlen ? dpad : sk_str.h};
  p.v = {buf.v, p.k.batch_stride, p.k.seq_stride, p.k.head_stride};
  p.kv_group = c.h / c.hk;
  p.o = {buf.o, p.q.batch_stride, p.q.seq_stride, p.q.head_stride};
  p.cu_seqlens_q = buf.cu_q;
  p.cu_seqlens_k = buf.cu_k;
  p.total_q = varlen ? rows_q : 0;
  p.total_k = varlen ? rows_k : 0;
  samattn::set_scores(p, 1.0f / std::sqrt(float(c.d)), c.softcap, c.causal, c.left, c.right);
  p.lse = buf.lse;
  if (varlen) {
    p.lse_batch_stride = 0;
    p.lse_head_stride = rows_q;
    p.lse_seq_stride = 1;
  } else {
    p.lse_batch_stride = int64_t(c.h) * sq;
    p.lse_head_stride = sq;
    p.lse_seq_stride = 1;
  }
  p.stream = nullptr;
  p.sm_count = dev.sm_count;
  p.max_smem_per_block = c.small_smem ? 99 * 1024 : dev.max_smem;
  const cudaError_t launch = c.alt ? c.alt->run(p) : forward(p);
#ifdef SAMATTN_CHECK_SM90
  if (launch == cudaErrorNotSupported) {
    free_buffers(buf);
    Result skipped{};
    skipped.name = describe(c) + " (declined: sm80 runs it)";
    skipped.pass = true;
    skipped.declined = true;
    return skipped;
  }
#endif
  if (launch != cudaSuccess) {
    std::fprintf(stderr, "launch failed: %s: %s\n", describe(c).c_str(),
                 cudaGetErrorString(launch));
    std::exit(3);
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  RefArgs a{};
  a.q = buf.q;
  a.k = buf.k;
  a.v = buf.v;
  a.q_b = p.q.batch_stride, a.q_s = p.q.seq_stride, a.q_h = p.q.head_stride;
  a.k_b = p.k.batch_stride, a.k_s = p.k.seq_stride, a.k_h = p.k.head_stride;
  a.v_b = p.v.batch_stride, a.v_s = p.v.seq_stride, a.v_h = p.v.head_stride;
  a.o_b = p.o.batch_stride, a.o_s = p.o.seq_stride, a.o_h = p.o.head_stride;
  a.l_b = p.lse_batch_stride, a.l_s = p.lse_seq_stride, a.l_h = p.lse_head_stride;
  a.cu_q = buf.cu_q;
  a.cu_k = buf.cu_k;
  a.sq = sq;
  a.sk = sk;
  a.d = c.d;
  a.kv_group = c.h / c.hk;
  a.scale = p.softmax_scale;
  a.softcap = c.softcap;
  normalize_window(c, sk, a.left, a.right);
  a.bf16 = bf16;
  if (sq > 0 && batch > 0) {
    for (int pass = 0; pass < 2; ++pass) {
      a.round = pass == 1;
      a.out = pass ? buf.refT : buf.ref32;
      a.lse = pass ? buf.lseT : buf.lse32;
      reference_kernel<<<dim3(sq, c.h, batch), 128>>>(a);
      CHECK_CUDA(cudaGetLastError());
    }
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  std::vector<uint16_t> o(n_q);
  std::vector<float> r32(n_q), rT(n_q), lse(n_lse), l32(n_lse);
  CHECK_CUDA(cudaMemcpy(o.data(), buf.o, n_q * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(r32.data(), buf.ref32, n_q * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(rT.data(), buf.refT, n_q * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse.data(), buf.lse, n_lse * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(l32.data(), buf.lse32, n_lse * 4, cudaMemcpyDeviceToHost));

  auto to_float = [&](uint16_t bits) {
    uint32_t u;
    if (bf16) {
      u = uint32_t(bits) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    __half hv;
    std::memcpy(&hv, &bits, 2);
    return __half2float(hv);
  };
  Result res{describe(c), 0.0, 0.0, 0.0, 0, true};
  for (int b = 0; b < batch; ++b) {
    const int len_q = varlen ? cu_q[b + 1] - cu_q[b] : sq;
    for (int i = 0; i < len_q; ++i) {
      for (int hh = 0; hh < c.h; ++hh) {
        const int64_t row = varlen
                                ? (cu_q[b] + i) * p.q.seq_stride + hh * p.q.head_stride
                                : b * p.q.batch_stride + i * p.q.seq_stride + hh * p.q.head_stride;
        for (int dd = 0; dd < c.d; ++dd) {
          const float ours = to_float(o[row + dd]);
          if (!std::isfinite(ours)) {
            ++res.bad_written;
            continue;
          }
          res.err = std::max(res.err, double(std::fabs(ours - r32[row + dd])));
          res.dtype_err = std::max(res.dtype_err, double(std::fabs(rT[row + dd] - r32[row + dd])));
        }
        const int64_t li = varlen ? hh * p.lse_head_stride + (cu_q[b] + i)
                                  : b * p.lse_batch_stride + hh * p.lse_head_stride + i;
        const float ref = l32[li], got = lse[li];
        if (std::isinf(ref) || std::isinf(got)) {
          if (!(std::isinf(ref) && std::isinf(got) && ref > 0 && got > 0)) ++res.bad_written;
        } else if (!std::isfinite(got)) {
          ++res.bad_written;
        } else {
          res.lse_err = std::max(res.lse_err, double(std::fabs(got - ref)));
        }
      }
    }
  }
  res.pass = res.bad_written == 0 && res.err <= 2.0 * res.dtype_err + 1e-5 && res.lse_err <= 2e-3;

  free_buffers(buf);
  return res;
}

static std::vector<Case> make_cases() {
  std::vector<Case> cases;
  const int dims[] = {32, 40, 64, 80, 96, 128, 192, 256};
  for (DType t : {DType::f16, DType::bf16}) {
    for (int d : dims) {
      auto base = [&](int sq, int sk, bool causal) {
        Case c{t, d, 2, 4, 4, sq, sk, causal, -1, -1, 0.0f, Layout::bshd, {}, {}, false};
        return c;
      };
      const int seqs[][2] = {{1, 1}, {17, 17}, {113, 203}, {203, 113}, {1000, 1000}};
      for (auto& s : seqs) {
        for (bool causal : {false, true}) cases.push_back(base(s[0], s[1], causal));
      }
      Case c = base(4099, 4099, false);
      c.batch = 1;
      c.h = c.hk = 2;
      cases.push_back(c);
      c.causal = true;
      cases.push_back(c);
      // Sliding windows, also with seqlen_q != seqlen_k.
      c = base(1000, 1000, false);
      c.left = 64, c.right = 32;
      cases.push_back(c);
      c = base(113, 203, false);
      c.left = 50, c.right = 0;
      cases.push_back(c);
      c = base(203, 113, true);
      c.left = 20;
      cases.push_back(c);
      // Softcap.
      c = base(113, 203, true);
      c.softcap = 30.0f;
      cases.push_back(c);
      c = base(1000, 1000, false);
      c.softcap = 5.0f;
      cases.push_back(c);
      // GQA 8:2 and MQA.
      c = base(203, 113, true);
      c.h = 8, c.hk = 2;
      cases.push_back(c);
      c = base(1000, 1000, false);
      c.h = 8, c.hk = 2;
      cases.push_back(c);
      c = base(113, 203, false);
      c.h = 4, c.hk = 1;
      cases.push_back(c);
      // Layouts: torch SDPA's (b, h, s, d) and padded head strides.
      c = base(113, 203, true);
      c.layout = Layout::bhsd;
      cases.push_back(c);
      c = base(203, 113, false);
      c.layout = Layout::bshd_padded;
      cases.push_back(c);
      // Varlen, including empty sequences and seqlen_k == 0 with seqlen_q > 0.
      c = base(0, 0, false);
      c.layout = Layout::varlen;
      c.lens_q = {0, 1, 17, 300};
      c.lens_k = {0, 1, 17, 300};
      cases.push_back(c);
      c.causal = true;
      cases.push_back(c);
      c.causal = false;
      c.lens_k = {3, 0, 40, 250};
      cases.push_back(c);
      c.causal = true;
      c.h = 8, c.hk = 2;
      cases.push_back(c);
      // Causal with enough query tiles for sm90's persistent grid over tile
      // pairs (8 x 16 heads x 8 tiles), also with no key for some rows
      // (seqlen_q > seqlen_k) and a right window without a left one.
      if (t == DType::bf16 && (d == 64 || d == 128 || d == 256)) {
        const int paired[][3] = {{1000, 1000, 0}, {1000, 1500, 0}, {1500, 1000, 0}, {999, 999, 7}};
        for (auto& s : paired) {
          c = base(s[0], s[1], true);
          c.batch = 8;
          c.h = 16, c.hk = s[2] == 7 ? 4 : 16;
          if (s[2] == 7) c.causal = false, c.right = 7;
          cases.push_back(c);
        }
      }
      // Long keys (the naive reference is slow: two head dims only).
      if (d == 64 || d == 128) {
        c = base(300, 131072, true);
        c.batch = 1;
        c.h = c.hk = 1;
        cases.push_back(c);
      }
      // The alternative configurations.
      if (t == DType::bf16) {
        for (const AltConfig& alt : kAltConfigs) {
          if (alt.d != d || alt.run == nullptr) continue;
          for (bool causal : {false, true}) {
            c = base(1000, 1000, causal);
            c.alt = &alt;
            cases.push_back(c);
          }
          c = base(113, 203, false);
          c.alt = &alt;
          cases.push_back(c);
        }
      }
      // The 99 KB configurations (8.6 / 8.9) on this GPU.
      for (bool causal : {false, true}) {
        c = base(1000, 1000, causal);
        c.small_smem = true;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// ------------------------------------------------------------------ timing
struct Timing {
  int d, seqlen, batch, heads;
  bool causal;
  double ms, tflops;
  std::string config;  // "dispatch" or an alternative's name
};

static Timing time_one(int d, int seqlen, bool causal, const AltConfig* alt, const DeviceInfo& dev,
                       uint16_t* q, uint16_t* k, uint16_t* v, uint16_t* o, float* lse) {
  auto run = [&](const AttentionForwardProblem& p) { return alt ? alt->run(p) : forward(p); };
  const int batch = 16384 / seqlen, heads = 2048 / d;
  AttentionForwardProblem p{};
  p.dtype = DType::bf16;
  p.batch = batch;
  p.nheads = p.nheads_k = heads;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.headdim = d;
  const int64_t bs = int64_t(seqlen) * heads * d, ss = int64_t(heads) * d;
  p.q = {q, bs, ss, d};
  p.k = {k, bs, ss, d};
  p.v = {v, bs, ss, d};
  p.kv_group = 1;
  p.o = {o, bs, ss, d};
  samattn::set_scores(p, 1.0f / std::sqrt(float(d)), 0.0f, causal, -1, -1);
  p.lse = lse;
  p.lse_batch_stride = int64_t(heads) * seqlen, p.lse_head_stride = seqlen, p.lse_seq_stride = 1;
  p.sm_count = dev.sm_count;
  p.max_smem_per_block = dev.max_smem;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int w = 0; w < 3; ++w) CHECK_CUDA(run(p));
  std::vector<float> ms(20);
  for (float& t : ms) {
    CHECK_CUDA(cudaEventRecord(start));
    CHECK_CUDA(run(p));
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
  }
  std::sort(ms.begin(), ms.end());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  const double med = 0.5 * (ms[9] + ms[10]);
  double flops = 4.0 * batch * heads * double(seqlen) * seqlen * d;
  if (causal) flops *= 0.5;
  return {d,
          seqlen,
          batch,
          heads,
          causal,
          med,
          flops / (med * 1e-3) / 1e12,
          alt ? alt->name : "dispatch"};
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s out.json [--no-timing]\n", argv[0]);
    return 1;
  }
  const bool timing = !(argc > 2 && std::string(argv[2]) == "--no-timing");
  DeviceInfo dev;
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  dev.name = prop.name;
  CHECK_CUDA(cudaDeviceGetAttribute(&dev.sm_count, cudaDevAttrMultiProcessorCount, device));
  CHECK_CUDA(
      cudaDeviceGetAttribute(&dev.max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  std::printf("device: %s, %d SMs, %d bytes smem opt-in\n", dev.name.c_str(), dev.sm_count,
              dev.max_smem);

  // Unsupported shapes are refused, not run.
  bool all_pass = true;
  {
    AttentionForwardProblem p{};
    p.dtype = DType::f16;
    p.batch = p.nheads = p.nheads_k = 1;
    p.max_smem_per_block = dev.max_smem;
    for (int d : {36, 264}) {
      p.headdim = d;
      const cudaError_t s = forward(p);
      std::printf("headdim %d refused: %s\n", d, s == cudaErrorNotSupported ? "yes" : "NO");
      all_pass &= s == cudaErrorNotSupported;
    }
  }

  std::vector<Result> results;
  for (const Case& c : make_cases()) {
    Result r = run_case(c, dev);
    std::printf("%-4s %-72s err %.3e dtype_err %.3e lse_err %.2e bad %ld\n",
                r.declined ? "SKIP"
                : r.pass   ? "PASS"
                           : "FAIL",
                r.name.c_str(), r.err, r.dtype_err, r.lse_err, r.bad_written);
    std::fflush(stdout);
    all_pass &= r.pass;
    results.push_back(r);
  }

  std::vector<Timing> times;
  if (timing) {
    const int64_t n = 16384LL * 2048;
    uint16_t *q, *k, *v, *o;
    float* lse;
    CHECK_CUDA(cudaMalloc(&q, n * 2));
    CHECK_CUDA(cudaMalloc(&k, n * 2));
    CHECK_CUDA(cudaMalloc(&v, n * 2));
    CHECK_CUDA(cudaMalloc(&o, n * 2));
    CHECK_CUDA(cudaMalloc(&lse, 16384LL * 64 * 4));
    fill_uniform<<<1024, 256>>>(q, n, 101, true);
    fill_uniform<<<1024, 256>>>(k, n, 102, true);
    fill_uniform<<<1024, 256>>>(v, n, 103, true);
    CHECK_CUDA(cudaGetLastError());
    std::printf("\nbf16 forward, batch*seqlen = 16k, heads*d = 2048\n");
    std::printf("%5s %7s %6s %6s %7s %10s %8s  %s\n", "d", "seqlen", "batch", "heads", "causal",
                "ms", "TFLOPS", "config");
    for (int d : {64, 128, 256}) {
      std::vector<const AltConfig*> configs = {nullptr};
      for (const AltConfig& alt : kAltConfigs) {
        if (alt.d == d && alt.run != nullptr) configs.push_back(&alt);
      }
      for (int s : {1024, 4096, 16384}) {
        for (bool causal : {false, true}) {
          for (const AltConfig* alt : configs) {
            Timing t = time_one(d, s, causal, alt, dev, q, k, v, o, lse);
            std::printf("%5d %7d %6d %6d %7s %10.3f %8.1f  %s\n", t.d, t.seqlen, t.batch, t.heads,
                        t.causal ? "yes" : "no", t.ms, t.tflops, t.config.c_str());
            times.push_back(t);
          }
        }
      }
    }
    CHECK_CUDA(cudaFree(q));
    CHECK_CUDA(cudaFree(k));
    CHECK_CUDA(cudaFree(v));
    CHECK_CUDA(cudaFree(o));
    CHECK_CUDA(cudaFree(lse));
  }

  FILE* f = std::fopen(argv[1], "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", argv[1]);
    return 1;
  }
  std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"all_pass\": %s,\n  \"cases\": [\n",
               dev.name.c_str(), all_pass ? "true" : "false");
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(f,
                 "    {\"name\": \"%s\", \"pass\": %s, \"err\": %.4e, \"dtype_err\": %.4e, "
                 "\"lse_err\": %.4e, \"bad\": %ld}%s\n",
                 r.name.c_str(), r.pass ? "true" : "false", r.err, r.dtype_err, r.lse_err,
                 r.bad_written, i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "  ],\n  \"timing\": [\n");
  for (size_t i = 0; i < times.size(); ++i) {
    const Timing& t = times[i];
    std::fprintf(f,
                 "    {\"dtype\": \"bf16\", \"d\": %d, \"seqlen\": %d, \"batch\": %d, \"heads\": "
                 "%d, \"causal\": %s, \"ms\": %.4f, \"tflops\": %.2f, \"config\": \"%s\"}%s\n",
                 t.d, t.seqlen, t.batch, t.heads, t.causal ? "true" : "false", t.ms, t.tflops,
                 t.config.c_str(), i + 1 < times.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
  std::printf("\n%s\n", all_pass ? "ALL PASS" : "SOME CASES FAILED");
  return all_pass ? 0 : 1;
}
