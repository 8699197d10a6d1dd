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
# kernel per (dtype, operand layout, tile); two functions per tag, the launch
# and its workspace size. tf32 wgmma reads only K-major tiles, so tf32 has
# the K-major layout alone (other operands are staged K-major first), and no
# swap_ab tile. Exact fp32 stays on sm80's FMA kernel.
foreach(dtype f16 bf16 f32)
  if(dtype STREQUAL "f32")
    set(layouts "k,k")
    set(tiles k128x256_c2x1 k128x128_c1x2 k128x64_streamk)
  else()
    set(layouts "k,k" "k,mn" "mn,k" "mn,mn")
    set(tiles k128x256_c2x1 k128x128_c1x2 k128x64_streamk k128x64_swap_ab)
  endif()
  foreach(layout IN LISTS layouts)
    string(REPLACE "," ";" pair "${layout}")
    list(GET pair 0 a)
    list(GET pair 1 b)
    foreach(tile IN LISTS tiles)
      string(REGEX REPLACE "^k" "" tile_id "${tile}")
      set(cfg "samattn::gemm::Sm90Gemm<${_dtypes_cpp_${dtype}}, ${_major_${a}}, ${_major_${b}}, samattn::gemm::sm90::Tile::${tile}>")
      set(args "const samattn::gemm::sm90::Plan&, const samattn::GemmProblem&")
      samattn_instantiate(gemm sm90 "gemm_sm90_${dtype}_a${a}_b${b}_${tile_id}"
                          "gemm/sm90/gemm_sm90_launch.cuh"
                          "template cudaError_t samattn::gemm::run_sm90<${cfg}>(${args});\ntemplate size_t samattn::gemm::sm90_workspace_bytes<${cfg}>(${args});")
    endforeach()
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
# samattn_instantiate_attention(<fwd|bwd> <family> <dtypes> <configs>): one
# translation unit per (dtype, configuration) of a tile table. An entry is
# "head_dim,block_m,block_n,warps,last" (last: q_in_regs forward, q_stages
# backward), forward optionally ",kv_stages" (FlashFwdConfig's trailing
# argument, 1 if absent); head dims outside SAMATTN_ATTENTION_HEAD_DIMS are
# skipped.
function(samattn_instantiate_attention direction family dtypes configs)
  if(direction STREQUAL "fwd")
    set(config_type FlashFwdConfig)
    set(problem AttentionForwardProblem)
    set(tag q)
  else()
    set(config_type FlashBwdConfig)
    set(problem AttentionBackwardProblem)
    set(tag s)
  endif()
  foreach(dtype IN LISTS dtypes)
    foreach(config IN LISTS configs)
      string(REPLACE "," ";" fields "${config}")
      list(GET fields 0 head_dim)
      if(NOT head_dim IN_LIST SAMATTN_ATTENTION_HEAD_DIMS)
        continue()
      endif()
      list(GET fields 1 block_m)
      list(GET fields 2 block_n)
      list(GET fields 3 warps)
      list(GET fields 4 last)
      set(stages_arg "")
      set(stages_tag "")
      list(LENGTH fields field_count)
      if(field_count GREATER 5)
        list(GET fields 5 stages)
        set(stages_arg ", ${stages}")
        set(stages_tag "_kv${stages}")
      endif()
      set(cfg "samattn::attention::${config_type}<${_dtypes_cpp_${dtype}}, ${head_dim}, ${block_m}, ${block_n}, ${warps}, ${last}, samattn::attention::Family::${family}${stages_arg}>")
      samattn_instantiate(attention ${family}
                          "attention_${direction}_${family}_${dtype}_d${head_dim}_${block_m}x${block_n}_w${warps}_${tag}${last}${stages_tag}"
                          "attention/flash_${direction}_launch.cuh"
                          "template cudaError_t samattn::attention::run_flash_${direction}<${cfg}>(const samattn::${problem}&);")
    endforeach()
  endforeach()
endfunction()

# FlashAttention-2 forward, sm80 family: one translation unit per (dtype,
# FlashFwdConfig). Keep this list equal to the configurations Sm80FwdTiles and
# Sm80FwdShortKeyTiles name in cpp/src/attention/flash_fwd_config.h: a missing
# one fails the link (-z defs), an extra one is dead code;
# tests/cpu/test_attention_build.py compares the two. One entry:
# "head_dim,block_m,block_n,warps,q_in_regs[,kv_stages]".
set(SAMATTN_ATTENTION_FWD_SM80_CONFIGS
    "32,128,64,4,true"
    "64,128,64,4,true"
    "64,128,64,4,true,2"
    "96,128,64,4,false"
    "128,128,64,4,false"
    "192,64,64,4,false"
    "256,64,64,4,false")
samattn_instantiate_attention(fwd sm80 "f16;bf16" "${SAMATTN_ATTENTION_FWD_SM80_CONFIGS}")
samattn_family_sources(attention sm80 cpp/src/attention/sm80/flash_fwd_sm80.cu)

# FlashAttention-2 backward, sm80 family: one translation unit per (dtype,
# FlashBwdConfig). Keep this list equal to the configurations Sm80BwdTiles
# names in cpp/src/attention/flash_bwd_config.h (tests/cpu/test_attention_build.py
# compares the two). One entry: "head_dim,block_m,block_n,warps,q_stages".
set(SAMATTN_ATTENTION_BWD_SM80_CONFIGS
    "32,64,128,8,2"
    "32,128,128,8,2"
    "64,64,128,8,2"
    "64,128,128,8,2"
    "96,64,64,8,2"
    "96,64,128,8,2"
    "128,64,64,8,1"
    "128,64,128,8,2"
    "192,32,64,8,1"
    "192,64,64,8,2"
    "256,32,32,4,1"
    "256,64,64,8,1"
    "256,64,64,8,2")
samattn_instantiate_attention(bwd sm80 "f16;bf16" "${SAMATTN_ATTENTION_BWD_SM80_CONFIGS}")
samattn_family_sources(attention sm80 cpp/src/attention/sm80/flash_bwd_sm80.cu)

# ------------------------------------------------------ attention, sm75 ----
# FlashAttention-2 forward and backward, sm75 family (Turing: fp16 on mma.sync
# m16n8k8, synchronous loads; bf16 needs sm80). Keep these lists equal to the
# configurations Sm75FwdTiles / Sm75BwdTiles name in
# cpp/src/attention/sm75/flash_sm75_tiles.h (tests/cpu/test_attention_build.py
# compares them). Forward entry: "head_dim,block_m,block_n,warps,q_in_regs";
# backward entry: "head_dim,block_m,block_n,warps,q_stages".
set(SAMATTN_ATTENTION_FWD_SM75_CONFIGS
    "32,128,64,4,true"
    "64,128,64,4,true"
    "96,64,32,4,true"
    "128,64,32,4,true"
    "192,64,32,4,false"
    "256,64,32,4,false")
set(SAMATTN_ATTENTION_BWD_SM75_CONFIGS
    "32,64,128,8,1"
    "64,64,64,8,1"
    "96,32,64,4,1"
    "128,32,64,8,1"
    "192,32,32,4,1")
samattn_instantiate_attention(fwd sm75 f16 "${SAMATTN_ATTENTION_FWD_SM75_CONFIGS}")
samattn_instantiate_attention(bwd sm75 f16 "${SAMATTN_ATTENTION_BWD_SM75_CONFIGS}")
samattn_family_sources(attention sm75 cpp/src/attention/sm75/flash_fwd_sm75.cu
                       cpp/src/attention/sm75/flash_bwd_sm75.cu)
