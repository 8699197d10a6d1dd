// The ops behind the exported C functions (api/exports.cpp), one file each:
// api/gemm.cpp, api/softmax.cpp, api/attention.cpp.
#pragma once

#include <cstdint>

#include "samattn/samattn.h"

namespace samattn {

int gemm_op(const samattn_gemm_args* args, int32_t* family_used);
int gemm_workspace_size_op(const samattn_gemm_args* args, int64_t* bytes);
int gemm_plan_op(const samattn_gemm_args* args, int32_t cc_major, int32_t cc_minor,
                 int32_t sm_count, int32_t* family, char* text, int32_t capacity);
int softmax_op(const samattn_softmax_args* args, bool backward, int32_t* family_used);
int attention_forward_op(const samattn_attention_args* args, int32_t* family_used);
int attention_forward_workspace_size_op(const samattn_attention_args* args, int64_t* bytes);
int attention_backward_op(const samattn_attention_args* args, int32_t* family_used);
int attention_backward_workspace_size_op(const samattn_attention_args* args, int64_t* bytes);
int attention_plan_op(const samattn_attention_args* args, int32_t backward, int32_t cc_major,
                      int32_t cc_minor, int32_t smem_per_block, int32_t* family, char* text,
                      int32_t capacity);

}  // namespace samattn
