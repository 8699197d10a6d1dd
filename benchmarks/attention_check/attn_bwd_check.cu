// Standalone checker of the sm80 attention backward (no torch): correctness
// against naive GPU references, a determinism check, then a timing table.
// Writes JSON to argv[1]. Built with -DSAMATTN_CHECK_SM90 it checks the sm90
// family's backward instead (its forward gives O and LSE); cases its plan
// declines are listed as such and skipped.
//   Per case the forward (ours) gives O and LSE; the backward's dq, dk, dv
//   are compared with an fp32 reference backward (ref32) and with the same
//   computation rounded to the input dtype like torch would (refT):
//   PASS when for each gradient max|ours - ref32| <= 2 * max|refT - ref32|
//   + 1e-5 and every element in range is written and finite. Deterministic
//   cases run twice and must be bit-identical.
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
#include "attention/flash_bwd_config.h"
#include "attention/sm90/flash_bwd_sm90_config.h"

#define CHECK_CUDA(call)                                                   \
  do {                                                                     \
    cudaError_t status_ = (call);                                          \
    if (status_ != cudaSuccess) {                                          \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(status_));                           \
      std::exit(2);                                                        \
    }                                                                      \
  } while (0)

using samattn::AttentionBackwardProblem;
using samattn::AttentionForwardProblem;
using samattn::DType;
using BwdFn = cudaError_t (*)(const AttentionBackwardProblem&);

#ifdef SAMATTN_CHECK_SM90
constexpr bool kCheckSm90 = true;
constexpr BwdFn kBackward = &samattn::attention_backward_sm90;
constexpr cudaError_t (*kForward)(const AttentionForwardProblem&) =
    &samattn::attention_forward_sm90;
// Alternative sm90 backward tiles (bf16), timed next to the table's choice;
// build.sh instantiates them (sm90_bwd_alt_configs).
template <int D, int BM, int BN, int S>
using BwdConfig = samattn::attention::FlashBwdSm90Config<DType::bf16, D, BM, BN, S>;
// nullptr where the build left the head dim out (build.sh's HEAD_DIMS), so
// that the link needs no kernel that no unit instantiated.
template <int D, int BM, int BN, int S>
constexpr BwdFn alt_run() {
  if constexpr (samattn::head_dim_built(D)) {
    return &samattn::attention::run_flash_bwd_sm90<BwdConfig<D, BM, BN, S>>;
  } else {
    return nullptr;
  }
}
template <int D, int BM, int BN, int S>
constexpr BwdFn kAltRun = alt_run<D, BM, BN, S>();
struct AltConfig {
  const char* name;
  int d;
  BwdFn run;
  int smem;
};
#define ALT(D, BM, BN, S, NAME) \
  {NAME, D, kAltRun<D, BM, BN, S>, BwdConfig<D, BM, BN, S>::kSmemBytes}
static const std::vector<AltConfig> kAltConfigs = {
    ALT(64, 64, 128, 2, "sm90 64x128"),         // a row of the table: dropout and masks at d = 64
    ALT(128, 64, 128, 2, "sm90 d128 2-stage"),  // 194 KB: the row before the third Q / dO buffer
};
#undef ALT
#else
constexpr bool kCheckSm90 = false;
constexpr BwdFn kBackward = &samattn::attention_backward_sm80;
constexpr cudaError_t (*kForward)(const AttentionForwardProblem&) =
    &samattn::attention_forward_sm80;
// Alternative backward tile configurations (bf16), checked on a few cases and
// timed next to the dispatch's choice. Each is instantiated by build.sh
// (bwd_alt_configs).
template <int D, int BM, int BN, int W, int S>
using BwdConfig = samattn::attention::FlashBwdConfig<DType::bf16, D, BM, BN, W, S,
                                                     samattn::attention::Family::sm80>;
template <int D, int BM, int BN, int W, int S>
constexpr BwdFn alt_run() {
  if constexpr (samattn::head_dim_built(D)) {
    return &samattn::attention::run_flash_bwd<BwdConfig<D, BM, BN, W, S>>;
  } else {
    return nullptr;
  }
}
template <int D, int BM, int BN, int W, int S>
constexpr BwdFn kAltRun = alt_run<D, BM, BN, W, S>();
struct AltConfig {
  const char* name;
  int d;
  BwdFn run;
  int smem;  // bytes; skipped on a GPU with less
};
#define ALT(D, BM, BN, W, S, NAME) \
  {NAME, D, kAltRun<D, BM, BN, W, S>, BwdConfig<D, BM, BN, W, S>::kSmemBytes}
static const std::vector<AltConfig> kAltConfigs = {
    ALT(64, 64, 128, 8, 1, "64x128 w8 1-stage"),
    ALT(128, 128, 64, 8, 2, "128x64 w8 2-stage"),
};
#undef ALT
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
// Tensors (b, s, h, d) by element strides, the dim stride 1; varlen: row
// cu[b] + i of a packed tensor. Gradients are written in fp32 at the same
// element offsets as the kernel's outputs.
struct RefArgs {
  const uint16_t *q, *k, *v, *dout;
  float *dq, *dk, *dv;  // fp32, the offsets of q / k / v
  float *lse, *dsum;    // (h, rows_q), written by the row kernel
  int64_t rows_q;
  int64_t q_b, q_s, q_h, k_b, k_s, k_h;  // q and dout share strides; k and v too
  const int32_t *cu_q, *cu_k;
  int sq, sk, d, h, kv_group;
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

__device__ float dot_row(const RefArgs& a, const float* row, const uint16_t* other) {
  float acc = 0.0f;
  for (int dd = 0; dd < a.d; ++dd) acc += row[dd] * load_elem(other, dd, a.bf16);
  return a.round ? round_to(acc, a.bf16) : acc;
}

// Scaled, capped score from the raw dot product; dtanh = d score / d (scale dot).
__device__ float score_of(const RefArgs& a, float dot, float* dtanh) {
  auto r = [&](float x) { return a.round ? round_to(x, a.bf16) : x; };
  float s = r(dot * a.scale);
  *dtanh = 1.0f;
  if (a.softcap > 0.0f) {
    const float t = r(tanhf(r(s / a.softcap)));
    *dtanh = 1.0f - t * t;
    s = r(t * a.softcap);
  }
  return s;
}

struct SeqInfo {
  int sq, sk;
  int64_t q0, k0;  // first row
};
__device__ SeqInfo seq_info(const RefArgs& a, int b) {
  SeqInfo s{a.sq, a.sk, int64_t(b) * a.sq, int64_t(b) * a.sk};
  if (a.cu_q) {
    s.q0 = a.cu_q[b];
    s.sq = a.cu_q[b + 1] - a.cu_q[b];
  }
  if (a.cu_k) {
    s.k0 = a.cu_k[b];
    s.sk = a.cu_k[b + 1] - a.cu_k[b];
  }
  return s;
}
__device__ int64_t q_offset(const RefArgs& a, const SeqInfo& s, int b, int h, int i) {
  return (a.cu_q ? s.q0 * a.q_s : b * a.q_b) + h * a.q_h + i * a.q_s;
}
__device__ int64_t k_offset(const RefArgs& a, const SeqInfo& s, int b, int h, int j) {
  return (a.cu_k ? s.k0 * a.k_s : b * a.k_b) + h * a.k_h + j * a.k_s;
}
__device__ void key_range(const RefArgs& a, const SeqInfo& s, int i, int& lo, int& hi) {
  const int diag = i + s.sk - s.sq;
  lo = a.left >= 0 ? max(0, diag - a.left) : 0;
  hi = a.right >= 0 ? min(s.sk, diag + a.right + 1) : s.sk;
}

constexpr int kChunk = 2048;

// One block per (query row, head, batch): LSE, O, D = dO . O, and dQ.
__global__ void ref_row_kernel(RefArgs a) {
  __shared__ float buf[kChunk];
  __shared__ float q_row[256], do_row[256];
  __shared__ float scratch[32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo s = seq_info(a, b);
  if (i >= s.sq) return;
  const int hk = h / a.kv_group;
  const int64_t qi = q_offset(a, s, b, h, i);
  for (int dd = threadIdx.x; dd < a.d; dd += blockDim.x) {
    q_row[dd] = load_elem(a.q, qi + dd, a.bf16);
    do_row[dd] = load_elem(a.dout, qi + dd, a.bf16);
  }
  __syncthreads();
  int lo, hi;
  key_range(a, s, i, lo, hi);
  float* lse_out = a.lse + h * a.rows_q + s.q0 + i;
  float* dsum_out = a.dsum + h * a.rows_q + s.q0 + i;
  float dt;
  float local = -INFINITY;
  for (int j = lo + threadIdx.x; j < hi; j += blockDim.x)
    local = fmaxf(local, score_of(a, dot_row(a, q_row, a.k + k_offset(a, s, b, hk, j)), &dt));
  const float m = block_reduce(local, true, scratch);
  if (m == -INFINITY) {
    for (int dd = threadIdx.x; dd < a.d; dd += blockDim.x) a.dq[qi + dd] = 0.0f;
    if (threadIdx.x == 0) *lse_out = INFINITY, *dsum_out = 0.0f;
    return;
  }
  local = 0.0f;
  for (int j = lo + threadIdx.x; j < hi; j += blockDim.x)
    local += expf(score_of(a, dot_row(a, q_row, a.k + k_offset(a, s, b, hk, j)), &dt) - m);
  const float l = block_reduce(local, false, scratch);
  const float lse = m + logf(l);
  auto prob = [&](int j, float* dtanh) {
    const float p =
        expf(score_of(a, dot_row(a, q_row, a.k + k_offset(a, s, b, hk, j)), dtanh) - lse);
    return a.round ? round_to(p, a.bf16) : p;
  };
  // O, then D.
  float acc[2] = {0.0f, 0.0f};  // head dims threadIdx.x and + 128
  for (int c0 = lo; c0 < hi; c0 += kChunk) {
    const int c1 = min(hi, c0 + kChunk);
    __syncthreads();
    for (int j = c0 + threadIdx.x; j < c1; j += blockDim.x) buf[j - c0] = prob(j, &dt);
    __syncthreads();
    for (int t = 0; t < 2; ++t) {
      const int dd = threadIdx.x + t * blockDim.x;
      if (dd >= a.d) continue;
      for (int j = c0; j < c1; ++j)
        acc[t] += buf[j - c0] * load_elem(a.v, k_offset(a, s, b, hk, j) + dd, a.bf16);
    }
  }
  float part = 0.0f;
  for (int t = 0; t < 2; ++t) {
    const int dd = threadIdx.x + t * blockDim.x;
    if (dd < a.d) part += do_row[dd] * (a.round ? round_to(acc[t], a.bf16) : acc[t]);
  }
  const float dsum = block_reduce(part, false, scratch);
  if (threadIdx.x == 0) *lse_out = lse, *dsum_out = dsum;
  // dQ = scale sum_j dS_ij k_j, dS = P (dP - D) dtanh.
  acc[0] = acc[1] = 0.0f;
  for (int c0 = lo; c0 < hi; c0 += kChunk) {
    const int c1 = min(hi, c0 + kChunk);
    __syncthreads();
    for (int j = c0 + threadIdx.x; j < c1; j += blockDim.x) {
      const float p = prob(j, &dt);
      const float dp = dot_row(a, do_row, a.v + k_offset(a, s, b, hk, j));
      float ds = p * (dp - dsum) * dt;
      buf[j - c0] = a.round ? round_to(ds, a.bf16) : ds;
    }
    __syncthreads();
    for (int t = 0; t < 2; ++t) {
      const int dd = threadIdx.x + t * blockDim.x;
      if (dd >= a.d) continue;
      for (int j = c0; j < c1; ++j)
        acc[t] += buf[j - c0] * load_elem(a.k, k_offset(a, s, b, hk, j) + dd, a.bf16);
    }
  }
  for (int t = 0; t < 2; ++t) {
    const int dd = threadIdx.x + t * blockDim.x;
    if (dd < a.d) a.dq[qi + dd] = a.round ? round_to(acc[t] * a.scale, a.bf16) : acc[t] * a.scale;
  }
}

// One block per (key row, kv head, batch): dK and dV summed over the
// group's query heads, from the row kernel's LSE and D.
__global__ void ref_key_kernel(RefArgs a) {
  __shared__ float p_buf[kChunk], ds_buf[kChunk];
  __shared__ int row_buf[kChunk];
  __shared__ float k_row[256], v_row[256];
  const int j = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const SeqInfo s = seq_info(a, b);
  if (j >= s.sk) return;
  const int64_t kj = k_offset(a, s, b, hk, j);
  for (int dd = threadIdx.x; dd < a.d; dd += blockDim.x) {
    k_row[dd] = load_elem(a.k, kj + dd, a.bf16);
    v_row[dd] = load_elem(a.v, kj + dd, a.bf16);
  }
  __syncthreads();
  float dk[2] = {0.0f, 0.0f}, dv[2] = {0.0f, 0.0f};
  // Rows attending key j: a query range, but a scan is simplest.
  for (int g = 0; g < a.kv_group; ++g) {
    const int h = hk * a.kv_group + g;
    for (int c0 = 0; c0 < s.sq; c0 += kChunk) {
      const int c1 = min(s.sq, c0 + kChunk);
      __syncthreads();
      for (int i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
        int lo, hi;
        key_range(a, s, i, lo, hi);
        float p = 0.0f, ds = 0.0f;
        if (lo <= j && j < hi) {
          const int64_t qi = q_offset(a, s, b, h, i);
          float dt;
          const float sc = score_of(a, dot_row(a, k_row, a.q + qi), &dt);
          p = expf(sc - a.lse[h * a.rows_q + s.q0 + i]);
          if (a.round) p = round_to(p, a.bf16);
          const float dp = dot_row(a, v_row, a.dout + qi);
          ds = p * (dp - a.dsum[h * a.rows_q + s.q0 + i]) * dt;
          if (a.round) ds = round_to(ds, a.bf16);
        }
        p_buf[i - c0] = p;
        ds_buf[i - c0] = ds;
        row_buf[i - c0] = i;
      }
      __syncthreads();
      for (int t = 0; t < 2; ++t) {
        const int dd = threadIdx.x + t * blockDim.x;
        if (dd >= a.d) continue;
        for (int i = c0; i < c1; ++i) {
          const float p = p_buf[i - c0], ds = ds_buf[i - c0];
          if (p == 0.0f && ds == 0.0f) continue;
          const int64_t qi = q_offset(a, s, b, h, row_buf[i - c0]);
          dv[t] += p * load_elem(a.dout, qi + dd, a.bf16);
          dk[t] += ds * load_elem(a.q, qi + dd, a.bf16);
        }
      }
    }
  }
  for (int t = 0; t < 2; ++t) {
    const int dd = threadIdx.x + t * blockDim.x;
    if (dd >= a.d) continue;
    a.dk[kj + dd] = a.round ? round_to(dk[t] * a.scale, a.bf16) : dk[t] * a.scale;
    a.dv[kj + dd] = a.round ? round_to(dv[t], a.bf16) : dv[t];
  }
}

// ------------------------------------------------------------------- cases
enum class Layout { bshd, bhsd, varlen };

struct Case {
  DType dtype;
  int d, batch, h, hk, sq, sk;
  bool causal;
  int left, right;
  float softcap;
  Layout layout;
  std::vector<int> lens_q, lens_k;  // varlen
  int smem_limit = 0;               // dispatch as on a GPU with this opt-in smem; 0: this GPU
  bool deterministic = false;       // run twice, bit-identical
  const AltConfig* alt = nullptr;   // run this configuration instead of the dispatch
};

static std::string describe(const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s d=%d b=%d h=%d/%d sq=%d sk=%d%s win=(%d,%d) cap=%g %s%s%s",
                c.dtype == DType::bf16 ? "bf16" : "f16", c.d, c.batch, c.h, c.hk, c.sq, c.sk,
                c.causal ? " causal" : "", c.left, c.right, c.softcap,
                c.layout == Layout::bshd   ? "bshd"
                : c.layout == Layout::bhsd ? "bhsd"
                                           : "varlen",
                c.smem_limit ? (c.smem_limit < 160 * 1024 ? " smem99K" : " smem163K") : "",
                c.deterministic ? " deterministic" : "");
  std::string name = buf;
  if (c.alt) name += std::string(" alt ") + c.alt->name;
  return name;
}

struct DeviceInfo {
  int sm_count, max_smem;
  std::string name;
};

struct Result {
  std::string name;
  double err[3], dtype_err[3];  // dq, dk, dv
  long bad;                     // unwritten / non-finite / non-deterministic elements
  bool pass;
  bool declined = false;  // SAMATTN_CHECK_SM90: the family's plan declined the case
};

// The documented window, for the reference (see attn_check.cu).
static void normalize_window(const Case& c, int, int& left, int& right) {
  left = c.left < 0 ? -1 : c.left;
  right = c.right < 0 ? -1 : c.right;
  if (c.causal) right = 0;
}

template <class T>
static T* device_alloc(int64_t count) {
  T* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<int64_t>(count, 1) * sizeof(T)));
  return p;
}

static float to_float(uint16_t bits, bool bf16) {
  if (bf16) {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half hv;
  std::memcpy(&hv, &bits, 2);
  return __half2float(hv);
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
  struct Strides {
    int64_t b, s, h;
  };
  auto make = [&](int heads, int seqlen) {
    if (c.layout == Layout::bhsd)
      return Strides{int64_t(heads) * seqlen * c.d, c.d, int64_t(seqlen) * c.d};
    if (varlen) return Strides{0, int64_t(heads) * c.d, c.d};
    return Strides{int64_t(seqlen) * heads * c.d, int64_t(heads) * c.d, c.d};
  };
  const Strides qs = make(c.h, sq), ks = make(c.hk, sk);
  const int64_t n_q = rows_q * c.h * c.d, n_k = rows_k * c.hk * c.d;
  const int64_t n_lse = int64_t(c.h) * rows_q;

  uint16_t* q = device_alloc<uint16_t>(n_q);
  uint16_t* k = device_alloc<uint16_t>(n_k);
  uint16_t* v = device_alloc<uint16_t>(n_k);
  uint16_t* o = device_alloc<uint16_t>(n_q);
  uint16_t* dout = device_alloc<uint16_t>(n_q);
  uint16_t* dq = device_alloc<uint16_t>(n_q);
  uint16_t* dk = device_alloc<uint16_t>(n_k);
  uint16_t* dv = device_alloc<uint16_t>(n_k);
  float* lse = device_alloc<float>(n_lse);
  float* ref_lse = device_alloc<float>(n_lse);
  float* ref_dsum = device_alloc<float>(n_lse);
  float* ref[2][3];  // [fp32 / dtype][dq, dk, dv]
  for (auto& r : ref) {
    r[0] = device_alloc<float>(n_q);
    r[1] = device_alloc<float>(n_k);
    r[2] = device_alloc<float>(n_k);
  }
  int32_t *d_cu_q = nullptr, *d_cu_k = nullptr;
  if (varlen) {
    d_cu_q = device_alloc<int32_t>(batch + 1);
    d_cu_k = device_alloc<int32_t>(batch + 1);
    CHECK_CUDA(cudaMemcpy(d_cu_q, cu_q.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_cu_k, cu_k.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  }
  static uint32_t seed = 1;
  if (n_q) fill_uniform<<<1024, 256>>>(q, n_q, seed++, bf16);
  if (n_k) fill_uniform<<<1024, 256>>>(k, n_k, seed++, bf16);
  if (n_k) fill_uniform<<<1024, 256>>>(v, n_k, seed++, bf16);
  if (n_q) fill_uniform<<<1024, 256>>>(dout, n_q, seed++, bf16);
  CHECK_CUDA(cudaGetLastError());

  // The forward (ours) gives O and LSE.
  AttentionForwardProblem f{};
  f.dtype = c.dtype;
  f.batch = batch;
  f.nheads = c.h;
  f.nheads_k = c.hk;
  f.seqlen_q = sq;
  f.seqlen_k = sk;
  f.headdim = c.d;
  f.q = {q, qs.b, qs.s, qs.h};
  f.k = {k, ks.b, ks.s, ks.h};
  f.v = {v, ks.b, ks.s, ks.h};
  f.kv_group = c.h / c.hk;
  f.o = {o, qs.b, qs.s, qs.h};
  f.cu_seqlens_q = d_cu_q;
  f.cu_seqlens_k = d_cu_k;
  f.total_q = rows_q;
  f.total_k = rows_k;
  samattn::set_scores(f, 1.0f / std::sqrt(float(c.d)), c.softcap, c.causal, c.left, c.right);
  f.lse = lse;
  if (varlen) {
    f.lse_batch_stride = 0, f.lse_head_stride = rows_q, f.lse_seq_stride = 1;
  } else {
    f.lse_batch_stride = int64_t(c.h) * sq, f.lse_head_stride = sq, f.lse_seq_stride = 1;
  }
  f.sm_count = dev.sm_count;
  f.max_smem_per_block = dev.max_smem;
  cudaError_t status = kForward(f);
  bool declined = kCheckSm90 && status == cudaErrorNotSupported;
  if (status != cudaSuccess && !declined) {
    std::fprintf(stderr, "forward failed: %s: %s\n", describe(c).c_str(),
                 cudaGetErrorString(status));
    std::exit(3);
  }

  AttentionBackwardProblem p{};
  static_cast<AttentionForwardProblem&>(p) = f;
  p.dout = {dout, qs.b, qs.s, qs.h};
  p.dq = {dq, qs.b, qs.s, qs.h};
  p.dk = {dk, ks.b, ks.s, ks.h};
  p.dv = {dv, ks.b, ks.s, ks.h};
  p.total_q = rows_q;
  p.total_k = rows_k;
  p.deterministic = c.deterministic;
  p.workspace_bytes = samattn::flash_bwd_workspace_bytes(p);
  CHECK_CUDA(cudaMalloc(&p.workspace, std::max<size_t>(p.workspace_bytes, 1)));
  p.sm_count = dev.sm_count;
  p.max_smem_per_block = c.smem_limit ? std::min(c.smem_limit, dev.max_smem) : dev.max_smem;

  std::vector<uint16_t> got[3], first[3];
  const int64_t counts[3] = {n_q, n_k, n_k};
  uint16_t* outs[3] = {dq, dk, dv};
  const int runs = c.deterministic ? 2 : 1;
  for (int run = 0; run < runs && !declined; ++run) {
    for (int t = 0; t < 3; ++t)
      CHECK_CUDA(cudaMemset(outs[t], 0xFF, std::max<int64_t>(counts[t], 1) * 2));
    // Poison the workspace too: the kernels must initialize what they read.
    CHECK_CUDA(cudaMemset(p.workspace, 0xFF, std::max<size_t>(p.workspace_bytes, 1)));
    status = c.alt ? c.alt->run(p) : kBackward(p);
    if (kCheckSm90 && status == cudaErrorNotSupported && !c.alt) {
      declined = true;
      break;
    }
    if (status != cudaSuccess) {
      std::fprintf(stderr, "backward failed: %s: %s\n", describe(c).c_str(),
                   cudaGetErrorString(status));
      std::exit(3);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    for (int t = 0; t < 3; ++t) {
      got[t].resize(counts[t]);
      CHECK_CUDA(cudaMemcpy(got[t].data(), outs[t], counts[t] * 2, cudaMemcpyDeviceToHost));
    }
    if (run == 0) {
      for (int t = 0; t < 3; ++t) first[t] = got[t];
    }
  }

  RefArgs a{};
  a.q = q, a.k = k, a.v = v, a.dout = dout;
  a.lse = ref_lse, a.dsum = ref_dsum, a.rows_q = rows_q;
  a.q_b = qs.b, a.q_s = qs.s, a.q_h = qs.h;
  a.k_b = ks.b, a.k_s = ks.s, a.k_h = ks.h;
  a.cu_q = d_cu_q, a.cu_k = d_cu_k;
  a.sq = sq, a.sk = sk, a.d = c.d, a.h = c.h, a.kv_group = c.h / c.hk;
  a.scale = f.softmax_scale;
  a.softcap = c.softcap;
  normalize_window(c, sk, a.left, a.right);
  a.bf16 = bf16;
  for (int pass = 0; pass < 2 && !declined; ++pass) {
    a.round = pass == 1;
    a.dq = ref[pass][0], a.dk = ref[pass][1], a.dv = ref[pass][2];
    if (sq > 0 && batch > 0) {
      ref_row_kernel<<<dim3(sq, c.h, batch), 128>>>(a);
      CHECK_CUDA(cudaGetLastError());
    }
    if (sk > 0 && batch > 0) {
      ref_key_kernel<<<dim3(sk, c.hk, batch), 128>>>(a);
      CHECK_CUDA(cudaGetLastError());
    }
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  Result res{describe(c), {0, 0, 0}, {0, 0, 0}, 0, true, declined};
  for (int t = 0; t < 3 && !declined; ++t) {
    std::vector<float> r32(counts[t]), rT(counts[t]);
    CHECK_CUDA(cudaMemcpy(r32.data(), ref[0][t], counts[t] * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(rT.data(), ref[1][t], counts[t] * 4, cudaMemcpyDeviceToHost));
    // Every element belongs to some in-range (row, head, dim): the tensors
    // are packed, so check them all.
    for (int64_t i = 0; i < counts[t]; ++i) {
      if (c.deterministic && got[t][i] != first[t][i]) ++res.bad;
      const float ours = to_float(got[t][i], bf16);
      if (!std::isfinite(ours)) {
        ++res.bad;
        continue;
      }
      res.err[t] = std::max(res.err[t], double(std::fabs(ours - r32[i])));
      res.dtype_err[t] = std::max(res.dtype_err[t], double(std::fabs(rT[i] - r32[i])));
    }
    res.pass &= res.err[t] <= 2.0 * res.dtype_err[t] + 1e-5;
  }
  res.pass &= res.bad == 0;

  void* buffers[] = {q,         k,         v,         o,        dout,      dq,         dk,
                     dv,        lse,       ref_lse,   ref_dsum, ref[0][0], ref[0][1],  ref[0][2],
                     ref[1][0], ref[1][1], ref[1][2], d_cu_q,   d_cu_k,    p.workspace};
  for (void* b : buffers) CHECK_CUDA(cudaFree(b));
  return res;
}

static std::vector<Case> make_cases(int max_smem) {
  std::vector<Case> cases;
  for (DType t : {DType::f16, DType::bf16}) {
    for (int d : {32, 64, 80, 96, 128, 192, 256}) {
      const bool full = d != 96 && d != 192;  // the two in-between dims: a few cases
      auto base = [&](int sq, int sk, bool causal) {
        Case c{t, d, 2, 4, 4, sq, sk, causal, -1, -1, 0.0f, Layout::bshd, {}, {}};
        return c;
      };
      const int seqs[][2] = {{1, 1}, {17, 17}, {113, 203}, {203, 113}, {1000, 1000}};
      for (auto& s : seqs) {
        for (bool causal : {false, true}) {
          if (full || s[0] == 113 || s[0] == 1000) cases.push_back(base(s[0], s[1], causal));
        }
      }
      // The 99 KB (8.6 / 8.9) and 163 KB (8.0) configurations on this GPU.
      for (int limit : {99 * 1024, 163 * 1024}) {
        for (bool causal : {false, true}) {
          Case c = base(203, 113, causal);
          c.smem_limit = limit;
          cases.push_back(c);
        }
      }
      if (!full) continue;
      // Sliding windows, also with seqlen_q != seqlen_k.
      Case c = base(1000, 1000, false);
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
      // torch SDPA's (b, h, s, d) layout.
      c = base(113, 203, true);
      c.layout = Layout::bhsd;
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
      // Varlen with several query and key tiles per sequence.
      c.lens_q = {700, 129, 1000};
      c.lens_k = {700, 300, 1000};
      cases.push_back(c);
      c.causal = false;
      c.h = c.hk = 4;
      cases.push_back(c);
      // Deterministic dQ accumulation: bit-identical twice.
      if (d == 64 || d == 128 || d == 256) {
        c = base(1000, 1000, true);
        c.h = 8, c.hk = 2;
        c.deterministic = true;
        cases.push_back(c);
        c = base(203, 113, false);
        c.left = 30, c.right = 10;
        c.deterministic = true;
        cases.push_back(c);
        c = base(0, 0, true);
        c.layout = Layout::varlen;
        c.lens_q = {0, 1, 17, 300};
        c.lens_k = {3, 0, 40, 250};
        c.deterministic = true;
        cases.push_back(c);
      }
      // The alternative configurations.
      if (t == DType::bf16) {
        for (const AltConfig& alt : kAltConfigs) {
          if (alt.d != d || alt.run == nullptr || alt.smem > max_smem) continue;
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
    }
  }
  return cases;
}

// ------------------------------------------------------------------ timing
struct Timing {
  int d, seqlen, batch, heads;
  bool causal, deterministic;
  double ms, tflops;
  std::string config;  // "dispatch" or an alternative's name
};

struct TimingBuffers {
  uint16_t *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float* lse;
  void* workspace;
  size_t workspace_bytes;
};

static Timing time_one(int d, int seqlen, bool causal, bool deterministic, const AltConfig* alt,
                       const DeviceInfo& dev, TimingBuffers& tb) {
  const int batch = 16384 / seqlen, heads = 2048 / d;
  const int64_t bs = int64_t(seqlen) * heads * d, ss = int64_t(heads) * d;
  AttentionForwardProblem f{};
  f.dtype = DType::bf16;
  f.batch = batch;
  f.nheads = f.nheads_k = heads;
  f.seqlen_q = f.seqlen_k = seqlen;
  f.headdim = d;
  f.q = {tb.q, bs, ss, d};
  f.k = {tb.k, bs, ss, d};
  f.v = {tb.v, bs, ss, d};
  f.o = {tb.o, bs, ss, d};
  f.kv_group = 1;
  samattn::set_scores(f, 1.0f / std::sqrt(float(d)), 0.0f, causal, -1, -1);
  f.lse = tb.lse;
  f.lse_batch_stride = int64_t(heads) * seqlen, f.lse_head_stride = seqlen, f.lse_seq_stride = 1;
  f.sm_count = dev.sm_count;
  f.max_smem_per_block = dev.max_smem;
  CHECK_CUDA(kForward(f));

  AttentionBackwardProblem p{};
  static_cast<AttentionForwardProblem&>(p) = f;
  p.dout = {tb.dout, bs, ss, d};
  p.dq = {tb.dq, bs, ss, d};
  p.dk = {tb.dk, bs, ss, d};
  p.dv = {tb.dv, bs, ss, d};
  p.deterministic = deterministic;
  p.workspace = tb.workspace;
  p.workspace_bytes = tb.workspace_bytes;
  if (samattn::flash_bwd_workspace_bytes(p) > tb.workspace_bytes) {
    std::fprintf(stderr, "timing workspace too small\n");
    std::exit(2);
  }
  p.sm_count = dev.sm_count;
  p.max_smem_per_block = dev.max_smem;
  auto run = [&]() { return alt ? alt->run(p) : kBackward(p); };
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int w = 0; w < 3; ++w) CHECK_CUDA(run());
  std::vector<float> ms(20);
  for (float& t : ms) {
    CHECK_CUDA(cudaEventRecord(start));
    CHECK_CUDA(run());
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
  }
  std::sort(ms.begin(), ms.end());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  const double med = 0.5 * (ms[9] + ms[10]);
  double flops = 2.5 * 4.0 * batch * heads * double(seqlen) * seqlen * d;
  if (causal) flops *= 0.5;
  return {d,
          seqlen,
          batch,
          heads,
          causal,
          deterministic,
          med,
          flops / (med * 1e-3) / 1e12,
          alt ? alt->name : "dispatch"};
}

// CHECK_DIMS=64,128 (the environment) times those head dims only: a checker
// built for a subset of them (build.sh's HEAD_DIMS).
static bool timed_head_dim(int d) {
  const char* dims = std::getenv("CHECK_DIMS");
  if (dims == nullptr || *dims == 0) return true;
  const std::string list = std::string(",") + dims + ",";
  return list.find("," + std::to_string(d) + ",") != std::string::npos;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s out.json [--no-timing | --time-only | --profile D SEQLEN CAUSAL "
                 "[ALT]]\n",
                 argv[0]);
    return 1;
  }
  const std::string mode = argc > 2 ? argv[2] : "";
  const bool timing = mode != "--no-timing";
  const bool check = mode != "--time-only" && mode != "--profile";
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

  bool all_pass = true;
  if (!kCheckSm90) {
    // Refused: unsupported head dims, a missing or short workspace.
    AttentionBackwardProblem p{};
    p.dtype = DType::f16;
    p.batch = p.nheads = p.nheads_k = 1;
    p.seqlen_q = p.seqlen_k = 16;
    p.max_smem_per_block = dev.max_smem;
    for (int d : {36, 264}) {
      p.headdim = d;
      const cudaError_t s = kBackward(p);
      std::printf("headdim %d refused: %s\n", d, s == cudaErrorNotSupported ? "yes" : "NO");
      all_pass &= s == cudaErrorNotSupported;
    }
    p.headdim = 64;
    const cudaError_t s = kBackward(p);
    std::printf("no workspace refused: %s\n", s == cudaErrorInvalidValue ? "yes" : "NO");
    all_pass &= s == cudaErrorInvalidValue;
  }

  std::vector<Result> results;
  for (const Case& c : check ? make_cases(dev.max_smem) : std::vector<Case>{}) {
    Result r = run_case(c, dev);
    if (r.declined) {
      std::printf("SKIP %-78s declined by the family's plan\n", r.name.c_str());
      continue;
    }
    std::printf("%-4s %-78s dq %.2e/%.2e dk %.2e/%.2e dv %.2e/%.2e bad %ld\n",
                r.pass ? "PASS" : "FAIL", r.name.c_str(), r.err[0], r.dtype_err[0], r.err[1],
                r.dtype_err[1], r.err[2], r.dtype_err[2], r.bad);
    std::fflush(stdout);
    all_pass &= r.pass;
    results.push_back(r);
  }

  std::vector<Timing> times;
  if (timing) {
    const int64_t n = 16384LL * 2048;
    TimingBuffers tb{};
    tb.q = device_alloc<uint16_t>(n);
    tb.k = device_alloc<uint16_t>(n);
    tb.v = device_alloc<uint16_t>(n);
    tb.o = device_alloc<uint16_t>(n);
    tb.dout = device_alloc<uint16_t>(n);
    tb.dq = device_alloc<uint16_t>(n);
    tb.dk = device_alloc<uint16_t>(n);
    tb.dv = device_alloc<uint16_t>(n);
    tb.lse = device_alloc<float>(16384LL * 64);
    // The largest workspace of the table: 3 fp32 copies of a tensor, D and
    // semaphores.
    tb.workspace_bytes = size_t(n) * 4 * 3 + 16384LL * 64 * 4 + (16384 / 16) * 64 * 4 + 4096;
    CHECK_CUDA(cudaMalloc(&tb.workspace, tb.workspace_bytes));
    fill_uniform<<<1024, 256>>>(tb.q, n, 101, true);
    fill_uniform<<<1024, 256>>>(tb.k, n, 102, true);
    fill_uniform<<<1024, 256>>>(tb.v, n, 103, true);
    fill_uniform<<<1024, 256>>>(tb.dout, n, 104, true);
    CHECK_CUDA(cudaGetLastError());
    std::printf("\nbf16 backward, batch*seqlen = 16k, heads*d = 2048, FLOPs = 2.5 x forward\n");
    std::printf("%5s %7s %6s %6s %7s %6s %10s %8s  %s\n", "d", "seqlen", "batch", "heads", "causal",
                "determ", "ms", "TFLOPS", "config");
    // --profile D SEQLEN CAUSAL [ALT NAME]: one configuration only (for ncu).
    const bool profile = mode == "--profile" && argc > 5;
    for (int d : {64, 128, 256}) {
      if (profile && d != std::atoi(argv[3])) continue;
      if (!timed_head_dim(d)) continue;
      std::vector<const AltConfig*> configs = {nullptr};
      for (const AltConfig& alt : kAltConfigs) {
        if (alt.d == d && alt.run != nullptr && alt.smem <= dev.max_smem) configs.push_back(&alt);
      }
      for (int s : {1024, 4096, 16384}) {
        if (profile && s != std::atoi(argv[4])) continue;
        for (bool causal : {false, true}) {
          if (profile && causal != (std::atoi(argv[5]) != 0)) continue;
          for (const AltConfig* alt : configs) {
            if (profile && (argc > 6 ? !alt || std::string(alt->name) != argv[6] : alt != nullptr))
              continue;
            for (bool det : {false, true}) {
              if (det && (alt || profile)) continue;  // deterministic: the dispatch only
              Timing t = time_one(d, s, causal, det, alt, dev, tb);
              std::printf("%5d %7d %6d %6d %7s %6s %10.3f %8.1f  %s\n", t.d, t.seqlen, t.batch,
                          t.heads, t.causal ? "yes" : "no", t.deterministic ? "yes" : "no", t.ms,
                          t.tflops, t.config.c_str());
              std::fflush(stdout);
              times.push_back(t);
            }
          }
        }
      }
    }
    void* buffers[] = {tb.q, tb.k, tb.v, tb.o, tb.dout, tb.dq, tb.dk, tb.dv, tb.lse, tb.workspace};
    for (void* b : buffers) CHECK_CUDA(cudaFree(b));
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
                 "    {\"name\": \"%s\", \"pass\": %s, \"err\": [%.4e, %.4e, %.4e], "
                 "\"dtype_err\": [%.4e, %.4e, %.4e], \"bad\": %ld}%s\n",
                 r.name.c_str(), r.pass ? "true" : "false", r.err[0], r.err[1], r.err[2],
                 r.dtype_err[0], r.dtype_err[1], r.dtype_err[2], r.bad,
                 i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "  ],\n  \"timing\": [\n");
  for (size_t i = 0; i < times.size(); ++i) {
    const Timing& t = times[i];
    std::fprintf(f,
                 "    {\"dtype\": \"bf16\", \"d\": %d, \"seqlen\": %d, \"batch\": %d, \"heads\": "
                 "%d, \"causal\": %s, \"deterministic\": %s, \"ms\": %.4f, \"tflops\": %.2f, "
                 "\"config\": \"%s\"}%s\n",
                 t.d, t.seqlen, t.batch, t.heads, t.causal ? "true" : "false",
                 t.deterministic ? "true" : "false", t.ms, t.tflops, t.config.c_str(),
                 i + 1 < times.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
  std::printf("\n%s\n", all_pass ? "ALL PASS" : "SOME CASES FAILED");
  return all_pass ? 0 : 1;
}
