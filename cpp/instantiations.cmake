# Every kernel instantiation of libsamattn, one per translation unit.
# A line is built only when its op group (SAMATTN_OPS) and family
# (SAMATTN_CUDA_ARCHS) are selected; see cpp/cmake/instantiate.cmake.

# ---------------------------------------------------------------- GEMM ----
set(_dtypes_cpp_f16 "samattn::DType::f16")
set(_dtypes_cpp_bf16 "samattn::DType::bf16")
set(_dtypes_cpp_f32 "samattn::DType::f32")
set(_major_k "samattn::gemm::Major::K")
set(_major_mn "samattn::gemm::Major::MN")

# _gemm(<kind> <family> <dtype> <vectorized> [layouts...]): kind is tensor_core
# or simt; layouts default to all four, written "a,b" with a, b in {k, mn}.
# Vectorized kernels come in the four operand layouts (A K- or M-major, B K-
# or N-major); the element-wise kernel accepts any strides, so one suffices.
function(_gemm kind family dtype vectorized)
  set(layouts "k,k" "k,mn" "mn,k" "mn,mn")
  if(ARGN)
    set(layouts ${ARGN})
  endif()
  if(kind STREQUAL "tensor_core")
    set(tag TensorCoreGemm)
    set(fn run_tensor_core)
    set(header "gemm/tensor_core/gemm_tensor_core_launch.cuh")
  else()
    set(tag SimtGemm)
    set(fn run_simt)
    set(header "gemm/simt/gemm_simt_launch.cuh")
  endif()
  if(vectorized)
    set(vec true)
  else()
    set(layouts "k,k")
    set(vec false)
  endif()
  foreach(layout IN LISTS layouts)
    string(REPLACE "," ";" pair "${layout}")
    list(GET pair 0 a)
    list(GET pair 1 b)
    if(vectorized)
      set(name "gemm_${family}_${kind}_${dtype}_a${a}_b${b}")
    else()
      set(name "gemm_${family}_${kind}_${dtype}_strided")
    endif()
    set(cfg "samattn::gemm::${tag}<${_dtypes_cpp_${dtype}}, ${_major_${a}}, ${_major_${b}}, ${vec}, samattn::gemm::Family::${family}>")
    samattn_instantiate(gemm ${family} ${name} "${header}"
                        "template cudaError_t samattn::gemm::${fn}<${cfg}>(const samattn::GemmProblem&);")
  endforeach()
endfunction()

# sm80: fp16, bf16 and tf32 on mma.sync m16n8k16/m16n8k8; exact fp32 on FMA.
foreach(dtype f16 bf16 f32)
  _gemm(tensor_core sm80 ${dtype} ON)
  _gemm(tensor_core sm80 ${dtype} OFF)
endforeach()
_gemm(simt sm80 f32 ON)
_gemm(simt sm80 f32 OFF)
samattn_family_sources(gemm sm80 cpp/src/gemm/sm80/gemm_sm80.cu)

# sm75: fp16 on mma.sync m16n8k8; bf16 and fp32 on FMA.
# (no N-major B kernel on sm75: see cpp/src/gemm/sm75/gemm_sm75.cu)
_gemm(tensor_core sm75 f16 ON "k,k" "mn,k")
_gemm(tensor_core sm75 f16 OFF)
foreach(dtype f32 bf16)
  _gemm(simt sm75 ${dtype} ON)
  _gemm(simt sm75 ${dtype} OFF)
endforeach()
samattn_family_sources(gemm sm75 cpp/src/gemm/sm75/gemm_sm75.cu)

# sm90: TMA + wgmma (CUTLASS 3 Hopper collectives), fp16, bf16 and tf32; one
# kernel per (dtype, operand layout, tile, epilogue); two functions per tag,
# the launch and its workspace size. tf32 wgmma reads only K-major tiles, so
# tf32 has the K-major layout alone (other operands are staged K-major
# first), and no swap_ab tile. Exact fp32 stays on sm80's FMA kernel.
# Epilogues (gemm_sm90_plan.h): plain in every layout; fused (bias and
# activation) where A or B is K-major; fused_f32 (fp32 C and D) with a
# K-major A (also the partial sums of sm90's parallel split-K); the plan hands
# the rest to sm80.
function(_sm90_gemm dtype epilogue tiles)
  set(args "const samattn::gemm::sm90::Plan&, const samattn::GemmProblem&")
  foreach(layout IN LISTS ARGN)
    string(REPLACE "," ";" pair "${layout}")
    list(GET pair 0 a)
    list(GET pair 1 b)
    foreach(tile IN LISTS tiles)
      string(REGEX REPLACE "^k" "" tile_id "${tile}")
      set(name "gemm_sm90_${dtype}_a${a}_b${b}_${tile_id}")
      if(NOT epilogue STREQUAL "plain")
        set(name "${name}_${epilogue}")
      endif()
      set(cfg "samattn::gemm::Sm90Gemm<${_dtypes_cpp_${dtype}}, ${_major_${a}}, ${_major_${b}}, samattn::gemm::sm90::Tile::${tile}, samattn::gemm::sm90::Epilogue::${epilogue}>")
      samattn_instantiate(gemm sm90 "${name}" "gemm/sm90/gemm_sm90_launch.cuh"
                          "template cudaError_t samattn::gemm::run_sm90<${cfg}>(${args});\ntemplate size_t samattn::gemm::sm90_workspace_bytes<${cfg}>(${args});")
    endforeach()
  endforeach()
endfunction()

set(_sm90_tiles k128x256_c2x1 k128x128_c1x2 k128x64_streamk k128x64_swap_ab)
set(_sm90_tf32_tiles k128x256_c2x1 k128x128_c1x2 k128x64_streamk)
foreach(dtype f16 bf16)
  _sm90_gemm(${dtype} plain "${_sm90_tiles}" "k,k" "k,mn" "mn,k" "mn,mn")
  _sm90_gemm(${dtype} fused "${_sm90_tiles}" "k,k" "k,mn" "mn,k")
  _sm90_gemm(${dtype} fused_f32 "${_sm90_tiles}" "k,k" "k,mn")
endforeach()
_sm90_gemm(f32 plain "${_sm90_tf32_tiles}" "k,k")
_sm90_gemm(f32 fused "${_sm90_tf32_tiles}" "k,k")
# The grouped GEMM (mixture of experts): one pointer-array kernel per 16-bit
# dtype, pair of operand layouts and cluster (grouped_sm90_plan.h). Rows form
# (forward, dx and lists): A K-major, B K-major (an (experts, N, K) weight) or
# MN ((experts, K, N)), clusters 1x2 and 2x1. K form (the weight gradient
# x^T dy): both MN, cluster 1x2.
set(_grouped_cluster_1x2 "samattn::gemm::sm90::GroupedCluster::k1x2")
set(_grouped_cluster_2x1 "samattn::gemm::sm90::GroupedCluster::k2x1")
foreach(dtype f16 bf16)
  foreach(variant "k,k,1x2" "k,mn,1x2" "k,k,2x1" "k,mn,2x1" "mn,mn,1x2")
    string(REPLACE "," ";" _variant "${variant}")
    list(GET _variant 0 a)
    list(GET _variant 1 b)
    list(GET _variant 2 cluster)
    set(cfg "samattn::gemm::Sm90Grouped<${_dtypes_cpp_${dtype}}, ${_major_${a}}, ${_major_${b}}, ${_grouped_cluster_${cluster}}>")
    set(args "const samattn::gemm::sm90::GroupedPlan&, const samattn::GemmProblem&")
    samattn_instantiate(gemm sm90 "grouped_gemm_sm90_${dtype}_a${a}_b${b}_c${cluster}" "gemm/sm90/grouped_sm90_launch.cuh"
                        "template cudaError_t samattn::gemm::run_sm90_grouped<${cfg}>(${args});\ntemplate size_t samattn::gemm::sm90_grouped_workspace_bytes<${cfg}>(${args});")
  endforeach()
endforeach()
samattn_family_sources(gemm sm90 cpp/src/gemm/sm90/gemm_sm90.cu)

# ------------------------------------------------------------- softmax ----
# One translation unit per (family, direction, dtype): each instantiates
# run_forward or run_backward, which holds every kernel configuration for that
# dtype (cpp/src/softmax/softmax_launch.cuh). Both families compile the same
# templates, told apart by their Family argument.
set(_softmax_dtype_f16 "samattn::DType::f16")
set(_softmax_dtype_bf16 "samattn::DType::bf16")
set(_softmax_dtype_f32 "samattn::DType::f32")
foreach(family sm80 sm75)
  foreach(direction forward backward)
    foreach(dtype f16 bf16 f32)
      samattn_instantiate(softmax ${family} softmax_${family}_${direction}_${dtype}
                          "softmax/softmax_launch.cuh"
                          "template cudaError_t samattn::softmax::run_${direction}<${_softmax_dtype_${dtype}}, samattn::softmax::Family::${family}>(const samattn::SoftmaxProblem&);")
    endforeach()
  endforeach()
  samattn_family_sources(softmax ${family} cpp/src/softmax/${family}/softmax_${family}.cu)
endforeach()

# ----------------------------------------------------------- attention ----
# The attention tiles are written once, as constexpr C++ tables in
# cpp/src/attention/<family>/flash_<family>_tiles.h, which the dispatch selects
# from. cpp/cmake/attention_tiles.py reads them at configure time and writes
# one samattn_instantiate_attention() call per (family, direction, dtype, row)
# (Python rather than a CMake regex: the same parser serves the standalone
# checkers' build.sh and tests/cpu/test_attention_build.py). Editing a table
# re-runs the configure.
find_package(Python COMPONENTS Interpreter REQUIRED)

# samattn_instantiate_attention(<family> <head_dim> <name> <header> <declaration>):
# head dims outside SAMATTN_ATTENTION_HEAD_DIMS are skipped (the dispatch skips
# their rows too).
function(samattn_instantiate_attention family head_dim name header declaration)
  if(head_dim IN_LIST SAMATTN_ATTENTION_HEAD_DIMS)
    samattn_instantiate(attention ${family} ${name} "${header}" "${declaration}")
  endif()
endfunction()

set(_attention_tiles_script "${CMAKE_CURRENT_SOURCE_DIR}/cpp/cmake/attention_tiles.py")
set(_attention_tiles_cmake "${SAMATTN_GENERATED_DIR}/attention_instantiations.cmake")
file(GLOB _attention_tile_tables CONFIGURE_DEPENDS
     "${CMAKE_CURRENT_SOURCE_DIR}/cpp/src/attention/sm*/flash_sm*_tiles.h")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             "${_attention_tiles_script}" ${_attention_tile_tables})
execute_process(COMMAND "${Python_EXECUTABLE}" "${_attention_tiles_script}" cmake
                        "${_attention_tiles_cmake}"
                RESULT_VARIABLE _attention_tiles_status ERROR_VARIABLE _attention_tiles_error)
if(NOT _attention_tiles_status EQUAL 0)
  message(FATAL_ERROR "cpp/cmake/attention_tiles.py: ${_attention_tiles_error}")
endif()
include("${_attention_tiles_cmake}")

# FlashAttention-2, sm80 family: fp16 and bf16 on mma.sync m16n8k16.
samattn_family_sources(attention sm80 cpp/src/attention/sm80/flash_fwd_sm80.cu)
samattn_family_sources(attention sm80 cpp/src/attention/sm80/flash_bwd_sm80.cu)

# FlashAttention-2, sm75 family (Turing: fp16 on mma.sync m16n8k8,
# synchronous loads; bf16 needs sm80).
samattn_family_sources(attention sm75 cpp/src/attention/sm75/flash_fwd_sm75.cu
                       cpp/src/attention/sm75/flash_bwd_sm75.cu)

# sm90 family (Hopper, sm_90a only), fp16 and bf16: the forward and the
# backward on wgmma + TMA with warp specialization (kSm90FwdTiles,
# kSm90BwdTiles), and sm80's kvcache kernel compiled for sm_90a with its key
# splits combined in a thread block cluster (kSm90FwdCacheTiles; its append
# kernels in kvcache_append_sm90.cu). One family TU registers both
# directions; what their plans decline runs sm80's kernels, also with sm90
# forced (90a always builds sm80).
samattn_family_sources(attention sm90 cpp/src/attention/sm90/flash_sm90.cu
                       cpp/src/attention/sm90/kvcache_append_sm90.cu)
