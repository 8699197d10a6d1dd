// Host time of a kernel launch on this machine, and of each step of one sm90
// GEMM call (bf16 1024^3, row-major A and B: the 128x64 stream-K tile, no
// cluster), without Python or the C API: what an eager call cannot go below.
// The first lines of output are the launches; times are the best of 7 rounds
// of 2000 calls (the GPU drained between rounds), in microseconds.
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -Icpp/include -Icpp/src \
//     -I<cutlass>/include -gencode=arch=compute_90a,code=sm_90a \
//     -o launch_host_cost benchmarks/launch_host_cost.cu \
//     cpp/src/gemm/sm90/gemm_sm90_plan.cpp && ./launch_host_cost
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "gemm/sm90/gemm_sm90_launch.cuh"

using namespace samattn;
using namespace samattn::gemm;
using Streamk =
    Sm90Gemm<DType::bf16, Major::K, Major::MN, sm90::Tile::k128x64_streamk, sm90::Epilogue::plain>;
template cudaError_t samattn::gemm::run_sm90<Streamk>(const sm90::Plan&, const GemmProblem&);

__global__ void empty_kernel() {}
struct KilobyteParams {
  char bytes[1024];
};
__global__ void kilobyte_kernel(KilobyteParams) {}
struct TwoKilobyteParams {
  char bytes[2048];
};
__global__ void two_kilobyte_kernel(TwoKilobyteParams) {}
extern __shared__ char dynamic_smem[];
__global__ void smem_kernel() {
  if (threadIdx.x == 1024) dynamic_smem[0] = 0;  // never: keeps the buffer
}

template <class F>
double host_us(F&& call, int calls = 2000) {
  for (int i = 0; i < 50; ++i) call();
  cudaDeviceSynchronize();
  double best = 1e30;
  for (int round = 0; round < 7; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    const auto stop = std::chrono::steady_clock::now();
    cudaDeviceSynchronize();
    best = std::min(best, std::chrono::duration<double, std::micro>(stop - start).count() / calls);
  }
  return best;
}

int main() {
  cudaFree(nullptr);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);

  std::printf("launch <<<>>>, no parameters        %7.3f\n",
              host_us([&] { empty_kernel<<<1, 32, 0, stream>>>(); }));
  const KilobyteParams kilobyte{};
  std::printf("launch <<<>>>, 1 KB parameters      %7.3f\n",
              host_us([&] { kilobyte_kernel<<<132, 384, 0, stream>>>(kilobyte); }));
  const TwoKilobyteParams two_kilobytes{};
  std::printf("launch <<<>>>, 2 KB parameters      %7.3f\n",
              host_us([&] { two_kilobyte_kernel<<<132, 384, 0, stream>>>(two_kilobytes); }));
  const int big_smem = 200 * 1024;
  cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, big_smem);
  std::printf("launch <<<>>>, 200 KB shared memory %7.3f\n",
              host_us([&] { smem_kernel<<<132, 384, big_smem, stream>>>(); }));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(132);
  config.blockDim = dim3(384);
  config.stream = stream;
  std::printf("cudaLaunchKernelEx, 1 KB parameters %7.3f\n",
              host_us([&] { cudaLaunchKernelEx(&config, kilobyte_kernel, kilobyte); }));

  const int64_t n = 1024;
  void *a, *b, *d;
  cudaMalloc(&a, n * n * 2);
  cudaMalloc(&b, n * n * 2);
  cudaMalloc(&d, n * n * 2);
  GemmProblem p{};
  p.dtype = DType::bf16;
  p.batch = 1;
  p.m = p.n = p.k = n;
  p.a = MatrixView{a, 0, n, 1};
  p.b = MatrixView{b, 0, n, 1};
  p.d = d;
  p.d_row_stride = n;
  p.d_col_stride = 1;
  p.alpha = 1.f;
  p.sm_count = sms;
  p.stream = stream;
  const sm90::Plan plan = sm90::plan(p);
  if (!plan.eligible || plan.tile != sm90::Tile::k128x64_streamk || !plan.a.k_major ||
      plan.b.k_major) {
    std::printf("the plan is not the instantiated configuration\n");
    return 1;
  }
  using Kernel = sm90::Kernel<Streamk>::GemmKernel;
  const auto arguments = sm90::make_arguments<Streamk>(plan, p);
  std::printf("sm90 gemm bf16 1024^3 (%s, %zu-byte parameters):\n", sm90::tile_name(plan.tile),
              sizeof(typename Kernel::Params));
  std::printf("  plan                              %7.3f\n",
              host_us([&] { volatile auto tile = sm90::plan(p).tile; }));
  std::printf("  make_arguments                    %7.3f\n", host_us([&] {
                volatile auto m = sm90::make_arguments<Streamk>(plan, p).problem_shape;
              }));
  std::printf("  get_workspace_size                %7.3f\n",
              host_us([&] { volatile size_t bytes = Kernel::get_workspace_size(arguments); }));
  typename Kernel::Params params;
  std::printf("  to_underlying_arguments           %7.3f\n",
              host_us([&] { params = Kernel::to_underlying_arguments(arguments, nullptr); }));
  std::printf("  launch                            %7.3f\n",
              host_us([&] { sm90::launch<Kernel>(params, stream); }));
  std::printf("  run_sm90 (all of the above)       %7.3f\n",
              host_us([&] { run_sm90<Streamk>(sm90::plan(p), p); }));
  const cudaError_t status = cudaDeviceSynchronize();
  std::printf("status: %s\n", cudaGetErrorString(status));
  return status == cudaSuccess ? 0 : 1;
}
