// Runs the softmax launch and kernel code (softmax_launch.cuh and
// softmax_kernel.cuh, copied by run.py with their few device-only lines
// swapped for shim.h's hooks) on the CPU, and checks every output element
// against an fp64 reference with torch semantics, that no byte around the
// output is written, and that every output element is. Not part of the
// library build; see run.py.
//
//   check_softmax <suite>   suite: rows long split mixed columns ramp random
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "softmax/softmax_launch.cuh"

// The CUDA runtime calls of the launch code.
static int g_smem_optin = 227 * 1024;
extern "C" {
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
// An ordinal past launch_setup.h's per-device cache, so that each case's
// g_smem_optin is queried afresh.
cudaError_t cudaGetDevice(int* device) {
  *device = samattn::kCachedDevices;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) {
  *value = g_smem_optin;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
}

using namespace samattn;
using softmax::Family;

struct Case {
  int64_t outer, dim, inner;
  int off_x = 0, off_dy = 0, off_out = 0;  // element offsets from a 256-byte boundary
  bool backward = false;
  bool specials = false;
  int sm_count = 132;
  int smem_optin = 227 * 1024;
  float ramp = 0;
};

template <class T>
double eps_of();
template <>
double eps_of<float>() {
  return 4e-6;
}
template <>
double eps_of<cute::half_t>() {
  return 1.0 / 1024;
}
template <>
double eps_of<cute::bfloat16_t>() {
  return 1.0 / 128;
}
template <class T>
double tiny_of();
template <>
double tiny_of<float>() {
  return 1e-30;
}
template <>
double tiny_of<cute::half_t>() {
  return 6e-8;
}
template <>
double tiny_of<cute::bfloat16_t>() {
  return 1e-30;
}

static const char* path_name(softmax::Path p) {
  switch (p) {
    case softmax::Path::registers:
      return "registers";
    case softmax::Path::two_pass:
      return "two_pass";
    case softmax::Path::split:
      return "split";
    case softmax::Path::columns:
      return "columns";
  }
  return "?";
}

template <DType D>
bool run_case(const Case& c, std::mt19937& rng) {
  using T = typename softmax::ElementOf<D>::type;
  const int64_t n = c.outer * c.dim * c.inner;
  const int64_t guard = 64;
  auto alloc = [&](int off) {
    const size_t bytes = (n + 2 * guard + 16) * sizeof(T);
    T* base = static_cast<T*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
    std::memset(base, 0x5A, bytes);
    return std::pair<T*, T*>(base, base + guard + off);
  };
  auto [xb, x] = alloc(c.off_x);
  auto [db, dy] = alloc(c.off_dy);
  auto [ob, out] = alloc(c.off_out);
  std::uniform_real_distribution<float> big(-8.f, 8.f), unit(0.f, 1.f), sym(-1.f, 1.f);
  for (int64_t e = 0; e < n; ++e) {
    x[e] = T(c.backward ? unit(rng) : big(rng));
    dy[e] = T(sym(rng));
  }
  if (c.ramp != 0) {  // slowly rising rows: the running max changes at every vector
    for (int64_t e = 0; e < n; ++e) x[e] = T(float(e % c.dim) * c.ramp);
  }
  // Special lines (line k is (o, i) = (k / inner, k % inner)). Forward: all
  // -inf; every other -inf; one +inf; one NaN; one finite value among -inf.
  // Backward: y = 0 where dy = +inf (NaN everywhere, as in torch).
  const float inf = INFINITY, nan = NAN;
  auto at = [&](int64_t o, int64_t d, int64_t i) { return (o * c.dim + d) * c.inner + i; };
  auto line = [&](int64_t k, int64_t d) { return at(k / c.inner, d, k % c.inner); };
  const int64_t lines = c.outer * c.inner;
  if (c.specials && lines >= 5) {
    if (!c.backward) {
      for (int64_t d = 0; d < c.dim; ++d) x[line(0, d)] = T(-inf);
      for (int64_t d = 0; d < c.dim; d += 2) x[line(1, d)] = T(-inf);
      x[line(2, c.dim / 2)] = T(inf);
      x[line(3, c.dim - 1)] = T(nan);
      for (int64_t d = 0; d < c.dim; ++d) x[line(4, d)] = T(d == c.dim - 1 ? 3.f : -inf);
    } else {
      x[line(1, c.dim / 2)] = T(0.f);
      dy[line(1, c.dim / 2)] = T(inf);
    }
  }
  SoftmaxProblem p{};
  p.dtype = D;
  p.outer = c.outer;
  p.dim = c.dim;
  p.inner = c.inner;
  p.x = x;
  p.dy = c.backward ? dy : nullptr;
  p.out = out;
  p.sm_count = c.sm_count;
  p.stream = nullptr;
  g_smem_optin = c.smem_optin;
  g_launches.clear();
  const cudaError_t status = c.backward ? softmax::run_backward<D, Family::sm80>(p)
                                        : softmax::run_forward<D, Family::sm80>(p);

  // The plan, for the log.
  softmax::PlanInput in{};
  in.elem_bytes = sizeof(T);
  in.backward = c.backward;
  in.outer = c.outer;
  in.dim = c.dim;
  in.inner = c.inner;
  in.residues[0] = (uintptr_t)x % 16;
  in.residues[1] = (uintptr_t)(c.backward ? (void*)dy : (void*)out) % 16;
  in.residues[2] = (uintptr_t)out % 16;
  in.operands = c.backward ? 3 : 2;
  in.sm_count = c.sm_count;
  in.smem_optin = 0;
  softmax::Plan plan = softmax::make_plan(in);
  if (plan.path == softmax::Path::two_pass) {
    in.smem_optin = c.smem_optin;
    plan = softmax::make_plan(in);
  }

  bool ok = status == cudaSuccess;
  int64_t bad = 0;
  double worst = 0;
  // Guards untouched.
  const unsigned char* ob_bytes = reinterpret_cast<const unsigned char*>(ob);
  const int64_t front = (guard + c.off_out) * sizeof(T), back_start = front + n * sizeof(T);
  const int64_t total = (n + 2 * guard + 16) * sizeof(T);
  for (int64_t b = 0; b < front; ++b)
    if (ob_bytes[b] != 0x5A) {
      ok = false;
      bad++;
    }
  for (int64_t b = back_start; b < total; ++b)
    if (ob_bytes[b] != 0x5A) {
      ok = false;
      bad++;
    }
  if (!ok) std::printf("  guard bytes touched: %lld\n", (long long)bad);
  // Values.
  std::vector<double> v(c.dim), w(c.dim);
  for (int64_t k = 0; k < lines; ++k) {
    const int64_t o = k / c.inner, i = k % c.inner;
    bool any_nan = false;
    double m = -INFINITY;
    for (int64_t d = 0; d < c.dim; ++d) {
      v[d] = double(float(x[at(o, d, i)]));
      w[d] = double(float(dy[at(o, d, i)]));
      if (std::isnan(v[d])) any_nan = true;
      m = std::max(m, v[d]);
    }
    double s = 0, s_abs = 0;
    if (!c.backward) {
      for (int64_t d = 0; d < c.dim; ++d) s += std::exp(v[d] - m);
    } else {
      for (int64_t d = 0; d < c.dim; ++d) s += v[d] * w[d], s_abs += std::fabs(v[d] * w[d]);
    }
    for (int64_t d = 0; d < c.dim; ++d) {
      double ref, scale;
      if (!c.backward) {
        ref = (any_nan || std::isnan(s)) ? NAN : std::exp(v[d] - m) / s;
        if (m == -INFINITY) ref = NAN;
        scale = std::fabs(ref);
      } else {
        ref = v[d] * (w[d] - s);
        scale = std::fabs(v[d]) * (std::fabs(w[d]) + std::fabs(s));
      }
      const T got_t = out[at(o, d, i)];
      uint16_t raw16;
      uint32_t raw32;
      if (sizeof(T) == 2)
        std::memcpy(&raw16, &got_t, 2);
      else
        std::memcpy(&raw32, &got_t, 4);
      const bool poison = sizeof(T) == 2 ? raw16 == 0x5A5A : raw32 == 0x5A5A5A5A;
      const double got = double(float(got_t));
      bool good;
      if (poison)
        good = false;
      else if (std::isnan(ref))
        good = std::isnan(got);
      else {
        // fp32 summation of sum(y*dy) loses ~1e-7 relative to sum(|y*dy|).
        const double conditioning = c.backward ? 1e-6 * std::fabs(v[d]) * s_abs : 0.0;
        good = !std::isnan(got) &&
               std::fabs(got - ref) <= eps_of<T>() * scale + conditioning + tiny_of<T>();
      }
      if (!good) {
        if (bad < 5)
          std::printf("  line %lld d %lld: got %.9g ref %.9g%s\n", (long long)k, (long long)d, got,
                      ref, poison ? " (unwritten)" : "");
        bad++;
        ok = false;
      } else if (!std::isnan(ref) && scale > 0) {
        worst = std::max(worst, std::fabs(got - ref) / scale);
      }
    }
  }
  std::printf(
      "%s %-4s %s outer %lld dim %lld inner %lld offs %d/%d/%d sm %d smem %dK -> %s vec %d tpr %d "
      "cta %d grid %lld splits %lld chunk %lld cache %lld launches %zu | worst rel %.2e\n",
      ok ? "ok  " : "FAIL",
      D == DType::f32   ? "f32"
      : D == DType::f16 ? "f16"
                        : "bf16",
      c.backward ? "bwd" : "fwd", (long long)c.outer, (long long)c.dim, (long long)c.inner, c.off_x,
      c.off_dy, c.off_out, c.sm_count, c.smem_optin / 1024, path_name(plan.path), plan.vec,
      plan.threads_per_row, plan.cta_threads, (long long)plan.grid, (long long)plan.splits,
      (long long)plan.chunk, (long long)plan.cache_vecs, g_launches.size(), worst);
  std::free(xb);
  std::free(db);
  std::free(ob);
  return ok;
}

bool run(DType d, const Case& c, std::mt19937& rng) {
  switch (d) {
    case DType::f32:
      return run_case<DType::f32>(c, rng);
    case DType::f16:
      return run_case<DType::f16>(c, rng);
    case DType::bf16:
      return run_case<DType::bf16>(c, rng);
  }
  return false;
}

int main(int argc, char** argv) {
  std::mt19937 rng(1234);
  const std::string suite = argc > 1 ? argv[1] : "quick";
  int failures = 0, total = 0;
  auto go = [&](DType d, Case c) {
    total++;
    if (!run(d, c, rng)) failures++;
  };
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  if (suite == "rows") {
    for (DType d : dtypes)
      for (bool bwd : {false, true})
        for (int64_t dim :
             {1, 2, 3, 7, 8, 9, 17, 31, 33, 64, 65, 100, 255, 256, 257, 1000, 1024, 1031, 4097})
          for (int off : {0, 3}) {
            Case c{5, dim, 1};
            c.off_x = off;
            c.off_dy = off;
            c.off_out = off;
            c.backward = bwd;
            c.specials = true;
            go(d, c);
          }
  } else if (suite == "long") {
    for (DType d : dtypes)
      for (bool bwd : {false, true})
        for (int64_t dim : {8192, 16383, 16384, 16385, 32767, 32768, 32769, 40000}) {
          Case c{3, dim, 1};
          c.off_x = c.off_dy = c.off_out = (dim % 2) ? 1 : 0;
          c.backward = bwd;
          c.specials = false;
          c.sm_count = 1;  // rows >= 2 * sm_count: whole rows
          go(d, c);
          c.smem_optin = 48 * 1024;  // row does not fit: read twice
          go(d, c);
          c.smem_optin = int(dim * (bwd ? 2 : 1) * (d == DType::f32 ? 4 : 2) * 0.7);  // part fits
          go(d, c);
        }
  } else if (suite == "split") {
    for (DType d : dtypes)
      for (bool bwd : {false, true})
        for (int64_t dim : {40000, 65537, 100003}) {
          Case c{1, dim, 1};
          c.off_x = c.off_dy = c.off_out = (dim % 2);
          c.backward = bwd;
          c.sm_count = 4;
          go(d, c);
          c.outer = 5;
          c.specials = true;
          go(d, c);
        }
  } else if (suite == "mixed") {
    for (DType d : dtypes)
      for (bool bwd : {false, true})
        for (int64_t dim : {1, 5, 100, 1000, 5000, 40000}) {
          Case c{5, dim, 1};
          c.off_x = 1;
          c.off_dy = 0;
          c.off_out = 2;
          c.backward = bwd;
          c.specials = true;
          c.sm_count = 2;
          go(d, c);
        }
  } else if (suite == "columns") {
    for (DType d : dtypes)
      for (bool bwd : {false, true})
        for (int64_t inner : {2, 5, 8, 16, 24, 100, 256})
          for (int64_t dim : {1, 3, 17, 300})
            for (int off : {0, 1}) {
              Case c{2, dim, inner};
              c.off_x = c.off_dy = c.off_out = off;
              c.backward = bwd;
              c.specials = true;
              go(d, c);
            }
  }
  if (suite == "ramp") {
    for (int64_t dim : {1000, 8192, 32768, 100000, 262144})
      for (float ramp : {1e-5f, 1e-4f, 1e-3f}) {
        Case c{2, dim, 1};
        c.ramp = ramp;
        c.sm_count = 1;
        go(DType::f32, c);
        c.smem_optin = 0;
        go(DType::f32, c);
      }
  }
  if (suite == "random") {
    std::uniform_int_distribution<int> pick(0, 1 << 30);
    for (int t = 0; t < 150; ++t) {
      const DType d = dtypes[pick(rng) % 3];
      Case c{1, 1, 1};
      const int kind = pick(rng) % 4;
      if (kind == 0) {  // short rows, many of them
        c.outer = 1 + pick(rng) % 300;
        c.dim = 1 + pick(rng) % 300;
      } else if (kind == 1) {  // medium rows
        c.outer = 1 + pick(rng) % 20;
        c.dim = 300 + pick(rng) % 20000;
      } else if (kind == 2) {  // long rows
        c.outer = 1 + pick(rng) % 6;
        c.dim = 16000 + pick(rng) % 120000;
        c.sm_count = 1 + pick(rng) % 4;
        c.smem_optin = (pick(rng) % 2) ? 227 * 1024 : 64 * 1024;
      } else {  // columns
        c.outer = 1 + pick(rng) % 4;
        c.dim = 1 + pick(rng) % 200;
        c.inner = 2 + pick(rng) % 100;
      }
      const int esz = d == DType::f32 ? 4 : 2;
      const int o = pick(rng) % (16 / esz);
      c.off_x = o;
      c.off_dy = (pick(rng) % 8 == 0) ? pick(rng) % (16 / esz) : o;
      c.off_out = (pick(rng) % 8 == 0) ? pick(rng) % (16 / esz) : o;
      c.backward = pick(rng) % 2;
      c.specials = pick(rng) % 2;
      go(d, c);
    }
  }
  std::printf("%s: %d / %d failed\n", suite.c_str(), failures, total);
  return failures != 0;
}
