// samattn_attention_forward / _backward and their queries: argument checks
// and the parameters, normalized once (attention/attention_problem.h).
#include <cmath>
#include <cstdio>
#include <string>

#include "api/launch.h"
#include "api/ops.h"
#include "api/validate.h"
#include "attention/attention_problem.h"

namespace samattn {
namespace {

// One (batch, seq, head, dim) operand of an attention call, for validation.
struct AttentionOperand {
  const char* name;
  const void* ptr;
  int64_t batch_stride, seq_stride, head_stride;
  int64_t seqlen, heads;  // the extents it is read or written over
  bool key_side;          // K or V: not read when no sequence has keys
};

// Largest element offset of a (batch, seq, head, dim) operand plus one, in
// bytes; false when that overflows int64.
bool attention_extent_fits(int64_t batch, const AttentionOperand& x, int64_t headdim,
                           int64_t element_size) {
  int64_t by_batch = 0, by_seq = 0, by_head = 0, offset = 0, bytes = 0;
  return !__builtin_mul_overflow(batch - 1, x.batch_stride, &by_batch) &&
         !__builtin_mul_overflow(x.seqlen - 1, x.seq_stride, &by_seq) &&
         !__builtin_mul_overflow(x.heads - 1, x.head_stride, &by_head) &&
         !__builtin_add_overflow(by_batch, by_seq, &offset) &&
         !__builtin_add_overflow(offset, by_head, &offset) &&
         !__builtin_add_overflow(offset, headdim, &offset) &&
         !__builtin_mul_overflow(offset, element_size, &bytes);
}

// Whether a call uses the KV-cache fields (k and v are then caches; fp8
// k and v are always caches).
bool uses_cache(const samattn_attention_args& a) {
  return a.seqused_k != nullptr || a.leftpad_k != nullptr || a.kv_batch_idx != nullptr ||
         a.block_table != nullptr || a.k_new != nullptr || a.kv_fp8 != 0;
}
// Bytes of one element of k and v.
int64_t kv_element_size(const samattn_attention_args& a) {
  return a.kv_fp8 != 0 ? 1 : dtype_size(a.dtype);
}
bool any_cache_field(const samattn_attention_args& a) {
  return uses_cache(a) || a.v_new != nullptr || a.rotary_cos != nullptr ||
         a.rotary_sin != nullptr || a.num_splits != 0 || a.page_size != 0 ||
         a.block_table_width != 0 || a.seqlen_new != 0 || a.rotary_dim != 0;
}
// Rows one cache sequence may hold.
int64_t cache_capacity(const samattn_attention_args& a) {
  return a.block_table != nullptr ? a.block_table_width * a.page_size : a.seqlen_k;
}

// Any head dim up to 256 runs in the next instantiated one (32, 64, 96, 128,
// 192, 256). Rows move as 16-byte vectors where the head dim and every
// pointer and stride allow it, else element by element (vector_aligned).
constexpr int64_t kMaxAttentionHeadDim = 256;
constexpr int64_t kMaxGridYZ = 65535;

// Checks the FP8 KV-cache fields (kv_fp8 ... v_scale_value; no device
// access: the scales behind the pointers are the caller's to keep positive).
int check_fp8_cache(const Subject& s, const samattn_attention_args& a, bool backward) {
  if (a.kv_fp8_reserved != 0) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": kv_fp8_reserved must be 0");
  }
  if (a.kv_fp8 == 0) {
    if (a.k_scale_ptr != nullptr || a.v_scale_ptr != nullptr || a.kv_scale_head_stride != 0) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": k_scale_ptr, v_scale_ptr and kv_scale_head_stride belong to fp8 caches "
                      "(kv_fp8); leave them NULL / 0 with kv_fp8 = 0");
    }
    return SAMATTN_OK;
  }
  if (a.kv_fp8 != SAMATTN_F8_E4M3 && a.kv_fp8 != SAMATTN_F8_E5M2) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s +
                    ": kv_fp8 must be 0 (k and v hold dtype), SAMATTN_F8_E4M3 or "
                    "SAMATTN_F8_E5M2, got " +
                    to_text(a.kv_fp8));
  }
  if (backward) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": fp8 KV caches (kv_fp8) are forward-only; leave kv_fp8 0 in a backward call");
  }
  if (a.headdim % 16 != 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s +
                    ": fp8 KV caches need a head dim that is a multiple of 16 (the kernels move "
                    "16-byte vectors of 16 elements), got " +
                    to_text(a.headdim));
  }
  if (a.kv_scale_head_stride != 0 && a.kv_scale_head_stride != 1) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s +
                    ": kv_scale_head_stride must be 0 (one scale for every KV head) or 1 (one per "
                    "KV head), got " +
                    to_text(a.kv_scale_head_stride));
  }
  const struct {
    const char* name;
    const float* ptr;
    float value;
  } scales[] = {{"k", a.k_scale_ptr, a.k_scale_value}, {"v", a.v_scale_ptr, a.v_scale_value}};
  for (const auto& scale : scales) {
    if (!aligned(scale.ptr, 4)) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": " + scale.name + "_scale_ptr must be a 4-byte aligned fp32 array");
    }
    if (scale.ptr == nullptr && !(std::isfinite(scale.value) && scale.value > 0.0f)) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": " + scale.name + "_scale_value must be finite and > 0 (" + scale.name +
                      "_scale_ptr is NULL), got " + float_to_text(scale.value));
    }
  }
  return SAMATTN_OK;
}

// Checks the codes, sizes and scalars of a forward or backward call (no
// pointers, no device access).
int check_attention_sizes(Subject* subject, const samattn_attention_args& a, bool backward) {
  int status = check_struct_size(*subject, &a, "samattn_attention_args");
  if (status != SAMATTN_OK) return status;
  status = check_codes(subject, a.dtype, a.family, a.device);
  if (status != SAMATTN_OK) return status;
  if (a.dtype != SAMATTN_F16 && a.dtype != SAMATTN_BF16) {
    const Subject op{subject->op};
    return fail(SAMATTN_INVALID_ARGUMENT,
                op + ": dtype must be SAMATTN_F16 or SAMATTN_BF16, got " + dtype_name(a.dtype));
  }
  const Subject& s = *subject;
  const bool varlen = a.cu_seqlens_q != nullptr || a.cu_seqlens_k != nullptr;
  status = check_fp8_cache(s, a, backward);
  if (status != SAMATTN_OK) return status;

  if (a.batch < 0 || a.nheads < 0 || a.nheads_k < 0 || a.seqlen_q < 0 || a.seqlen_k < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": sizes must be >= 0, got batch=" + to_text(a.batch) +
                    " nheads=" + to_text(a.nheads) + " nheads_k=" + to_text(a.nheads_k) +
                    " seqlen_q=" + to_text(a.seqlen_q) + " seqlen_k=" + to_text(a.seqlen_k));
  }
  if (a.headdim < 1 || a.headdim > kMaxAttentionHeadDim) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": headdim must be in 1..256, got " + to_text(a.headdim));
  }
  if (a.nheads_k < 1 || a.nheads % a.nheads_k != 0) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": nheads (" + to_text(a.nheads) +
                                              ") must be a multiple of nheads_k (" +
                                              to_text(a.nheads_k) +
                                              " >= 1): each key/value head serves a group of query "
                                              "heads");
  }
  if (a.batch > kMaxGridYZ || a.nheads > kMaxGridYZ) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": batch (" + to_text(a.batch) + ") and nheads (" +
                                              to_text(a.nheads) + ") must be <= 65535");
  }
  if (a.seqlen_q > INT32_MAX || a.seqlen_k > INT32_MAX) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": seqlen_q and seqlen_k must be < 2^31, got " +
                                              to_text(a.seqlen_q) + " and " + to_text(a.seqlen_k));
  }
  if (a.causal != 0 && a.causal != 1) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": causal must be 0 or 1, got " + to_text(a.causal));
  }
  if (!std::isfinite(a.softmax_scale)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": softmax_scale must be finite, got " + float_to_text(a.softmax_scale));
  }
  if (!std::isfinite(a.softcap) || a.softcap < 0.0f) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": softcap must be finite and >= 0 (0 = off), got " + float_to_text(a.softcap));
  }
  if (a.workspace_bytes < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": workspace_bytes must be >= 0, got " + to_text(a.workspace_bytes));
  }
  if (varlen) {
    if (a.cu_seqlens_q == nullptr || a.cu_seqlens_k == nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s +
                      ": cu_seqlens_q and cu_seqlens_k must both be given (varlen) or both be "
                      "NULL (fixed length); got " +
                      (a.cu_seqlens_q == nullptr ? "cu_seqlens_q NULL" : "cu_seqlens_k NULL"));
    }
    if (!aligned(a.cu_seqlens_q, 4) || !aligned(a.cu_seqlens_k, 4)) {
      return fail(SAMATTN_INVALID_ARGUMENT, s + ": cu_seqlens_q and cu_seqlens_k must be "
                                                "4-byte aligned int32 arrays");
    }
    if (a.max_seqlen_q < 0 || a.max_seqlen_q > a.seqlen_q || a.max_seqlen_k < 0 ||
        a.max_seqlen_k > a.seqlen_k) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s +
                      ": varlen needs 0 <= max_seqlen_q <= seqlen_q (packed rows) and 0 <= "
                      "max_seqlen_k <= seqlen_k, got max_seqlen_q=" +
                      to_text(a.max_seqlen_q) + " seqlen_q=" + to_text(a.seqlen_q) +
                      " max_seqlen_k=" + to_text(a.max_seqlen_k) +
                      " seqlen_k=" + to_text(a.seqlen_k));
    }
  }
  if (!aligned(a.alibi_slopes, 4) || !aligned(a.sinks, 4) || !aligned(a.dsinks, 4)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": alibi_slopes, sinks and dsinks must be 4-byte aligned fp32 arrays");
  }
  if (a.alibi_slopes == nullptr ? a.alibi_batch_stride != 0
                                : a.alibi_batch_stride < 0 || (a.alibi_batch_stride > 0 &&
                                                               a.alibi_batch_stride < a.nheads)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": alibi_batch_stride must be 0 (one slope per head) or >= nheads (" +
                    to_text(a.nheads) +
                    ", slopes per batch entry), and 0 without alibi_slopes; got " +
                    to_text(a.alibi_batch_stride));
  }
  if (a.alibi_batch_stride > 0 && a.batch > 1 && a.alibi_batch_stride > INT64_MAX / 4 / a.batch) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": alibi_batch_stride x batch overflows a 64-bit byte offset");
  }
  if (a.attn_mask != nullptr) {
    const bool additive = a.mask_dtype == SAMATTN_F32;
    if (a.mask_dtype != SAMATTN_BOOL && !additive) {
      return fail(
          SAMATTN_INVALID_ARGUMENT,
          s + ": mask_dtype must be SAMATTN_BOOL or SAMATTN_F32, got " + to_text(a.mask_dtype));
    }
    if (varlen || uses_cache(a)) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": attn_mask is for fixed-length calls only (no cu_seqlens, no KV-cache "
                      "field)");
    }
    const int64_t element = additive ? 4 : 1;
    if (!aligned(a.attn_mask, static_cast<uintptr_t>(element)) || a.mask_reserved != 0) {
      return fail(SAMATTN_INVALID_ARGUMENT, s + ": attn_mask must be aligned to its " +
                                                to_text(element) +
                                                "-byte elements, and mask_reserved 0");
    }
    if (a.mask_batch_stride < 0 || a.mask_head_stride < 0 || a.mask_q_stride < 0) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": the attn_mask strides (batch, head, q) must be >= 0 (0 broadcasts)");
    }
    if (a.mask_k_stride != 1 && a.seqlen_k > 1) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": attn_mask must be contiguous along the keys (mask_k_stride 1), got " +
                      to_text(a.mask_k_stride));
    }
    // The largest offset read, in bytes, must fit int64.
    int64_t offset = 0, term = 0;
    const int64_t extents[] = {a.batch, a.nheads, a.seqlen_q, a.seqlen_k};
    const int64_t strides[] = {a.mask_batch_stride, a.mask_head_stride, a.mask_q_stride,
                               a.mask_k_stride};
    for (int i = 0; i < 4; ++i) {
      if (extents[i] > 0 && (__builtin_mul_overflow(extents[i] - 1, strides[i], &term) ||
                             __builtin_add_overflow(offset, term, &offset))) {
        return fail(SAMATTN_INVALID_ARGUMENT,
                    s + ": attn_mask sizes and strides overflow a 64-bit byte offset");
      }
    }
    if (__builtin_mul_overflow(offset + 1, element, &offset)) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": attn_mask sizes and strides overflow a 64-bit byte offset");
    }
    if (a.dmask != nullptr && (!backward || !additive || !aligned(a.dmask, 4))) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": dmask is the backward's gradient of an additive (SAMATTN_F32) "
                      "attn_mask, a 4-byte aligned fp32 array");
    }
  } else if (a.dmask != nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": dmask (the mask's gradient) needs attn_mask");
  }
  if (a.dsinks != nullptr && (!backward || a.sinks == nullptr)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + (backward ? ": dsinks (the sinks' gradient) needs sinks"
                              : ": dsinks is backward-only; leave it NULL in a forward call"));
  }
  if (!std::isfinite(a.dropout_p) || a.dropout_p < 0.0f || a.dropout_p >= 1.0f) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": dropout_p must be in [0, 1) (0 = off), got " + float_to_text(a.dropout_p));
  }
  if (a.dropout_reserved != 0) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": dropout_reserved must be 0");
  }
  if (a.dropout_p > 0.0f) {
    if (a.dropout_seed == nullptr || !aligned(a.dropout_seed, 8)) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": dropout_p > 0 needs dropout_seed, an 8-byte aligned device pointer to "
                      "the call's 64-bit seed");
    }
    if (any_cache_field(a)) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": dropout does not combine with the KV-cache fields (inference); leave "
                      "dropout_p 0");
    }
  }
  if (backward && any_cache_field(a)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": the KV-cache fields (seqused_k ... num_splits) are forward-only; leave "
                    "them 0 / NULL in a backward call");
  }
  if (backward && a.deterministic != 0 && a.deterministic != 1) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": deterministic must be 0 or 1, got " + to_text(a.deterministic));
  }
  return SAMATTN_OK;
}

// Checks the pointer and strides of one (batch, seq, head, dim) operand;
// `output`: written, so no two of its elements may share an address.
// `element`: its element size (0: dtype's).
int check_attention_operand(const Subject& s, AttentionOperand x, bool varlen,
                            const samattn_attention_args& a, bool output, int64_t element = 0) {
  // With varlen the batch stride is unused: the batch extent is one packed tensor.
  const int64_t batch_extent = varlen ? 1 : a.batch;
  if (varlen) x.batch_stride = 0;
  if (element == 0) element = dtype_size(a.dtype);
  if (x.ptr == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, s + ": " + x.name + " is NULL");
  if (!aligned(x.ptr, static_cast<uintptr_t>(element))) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": " + x.name + " must be aligned to its " +
                                              to_text(element) + "-byte elements");
  }
  if (any_negative(x.batch_stride, x.seq_stride, x.head_stride)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": " + x.name + " strides (batch, seq, head) " +
                    strides_text(x.batch_stride, x.seq_stride, x.head_stride) + " must be >= 0");
  }
  if (!attention_extent_fits(batch_extent, x, a.headdim, element)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": " + x.name + " sizes and strides overflow a 64-bit byte offset");
  }
  if (output && ((batch_extent > 1 && x.batch_stride == 0) || (x.seqlen > 1 && x.seq_stride == 0) ||
                 (x.heads > 1 && x.head_stride == 0))) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": " + x.name + " strides " +
                    strides_text(x.batch_stride, x.seq_stride, x.head_stride) +
                    " make elements of " + x.name + " overlap (a stride of 0 on a size > 1)");
  }
  return SAMATTN_OK;
}

// Checks lse, the (batch, head, seq) fp32 log-sum-exp (not NULL).
int check_attention_lse(const Subject& s, const samattn_attention_args& a, bool varlen) {
  const int64_t lse_batch = varlen ? 0 : a.lse_batch_stride;
  const AttentionOperand lse{"lse",      a.lse,    lse_batch, a.lse_seq_stride, a.lse_head_stride,
                             a.seqlen_q, a.nheads, false};
  if (!aligned(a.lse, 4)) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": lse must be 4-byte aligned (fp32)");
  }
  if (any_negative(lse_batch, a.lse_head_stride, a.lse_seq_stride)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": lse strides (batch, head, seq) " +
                    strides_text(a.lse_batch_stride, a.lse_head_stride, a.lse_seq_stride) +
                    " must be >= 0");
  }
  if ((!varlen && a.batch > 1 && lse_batch == 0) || (a.seqlen_q > 1 && a.lse_seq_stride == 0) ||
      (a.nheads > 1 && a.lse_head_stride == 0)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": lse strides (batch, head, seq) " +
                    strides_text(a.lse_batch_stride, a.lse_head_stride, a.lse_seq_stride) +
                    " make elements of lse overlap (a stride of 0 on a size > 1)");
  }
  // One fp32 per (batch, head, seq): the extent of a head dim of 1.
  if (!attention_extent_fits(varlen ? 1 : a.batch, lse, 0, 4)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": lse sizes and strides overflow a 64-bit byte offset");
  }
  return SAMATTN_OK;
}

// Checks the KV-cache fields of a forward (no device access): sizes, the
// pairing of fields, the new keys and values and the rotary tables. The int32
// arrays' values are the caller's to check (the kernels clamp them).
int check_attention_cache(const Subject& s, const samattn_attention_args& a) {
  if (a.num_splits < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": num_splits must be >= 0 (0 = heuristic), got " + to_text(a.num_splits));
  }
  if (!uses_cache(a)) {
    if (a.v_new != nullptr || a.rotary_cos != nullptr || a.rotary_sin != nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": v_new and the rotary tables need k_new (they apply to new keys)");
    }
    return SAMATTN_OK;
  }
  const bool varlen = a.cu_seqlens_q != nullptr;
  for (const int32_t* array : {a.seqused_k, a.leftpad_k, a.kv_batch_idx, a.block_table}) {
    if (!aligned(array, 4)) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": seqused_k, leftpad_k, kv_batch_idx and block_table must be 4-byte "
                      "aligned int32 arrays");
    }
  }
  if (varlen && (a.block_table == nullptr || a.seqused_k != nullptr || a.leftpad_k != nullptr ||
                 a.kv_batch_idx != nullptr || a.k_new != nullptr)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": with cu_seqlens (varlen) the only KV-cache field allowed is block_table "
                    "(paged prefill)");
  }
  if (a.kv_cache_batch < 1 || a.kv_cache_batch > INT32_MAX) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": kv_cache_batch (the caches' leading extent) must be in 1..2^31-1, got " +
                    to_text(a.kv_cache_batch));
  }
  if (a.block_table != nullptr) {
    if (a.leftpad_k != nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": leftpad_k does not combine with block_table (paged caches)");
    }
    if (a.page_size < 16 || a.page_size % 16 != 0) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": page_size must be a positive multiple of 16, got " + to_text(a.page_size));
    }
    if (a.block_table_width < 1 || a.block_table_batch_stride < a.block_table_width) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s +
                      ": block_table must be (batch, width >= 1) with a batch stride >= width, "
                      "got width " +
                      to_text(a.block_table_width) + " and batch stride " +
                      to_text(a.block_table_batch_stride));
    }
    if (a.block_table_width > INT32_MAX / a.page_size) {
      return fail(SAMATTN_INVALID_ARGUMENT, s + ": block_table_width x page_size must be < 2^31");
    }
  } else if (a.page_size != 0 || a.block_table_width != 0) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": page_size and block_table_width need block_table");
  }
  if (a.k_new != nullptr || a.v_new != nullptr) {
    if (a.k_new == nullptr || a.v_new == nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT, s + ": k_new and v_new go together");
    }
    if (a.seqused_k == nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": k_new needs seqused_k (the cache rows the new keys are written after)");
    }
    if (a.seqlen_new < 1 || a.seqlen_new > INT32_MAX) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": seqlen_new must be in 1..2^31-1 with k_new, got " + to_text(a.seqlen_new));
    }
  } else if (a.seqlen_new != 0) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": seqlen_new needs k_new and v_new");
  }
  if (a.rotary_cos != nullptr || a.rotary_sin != nullptr || a.rotary_dim != 0) {
    if (a.rotary_cos == nullptr || a.rotary_sin == nullptr || a.k_new == nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": rotary embedding needs rotary_cos, rotary_sin and k_new / v_new");
    }
    if (a.rotary_dim < 2 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.headdim) {
      return fail(SAMATTN_INVALID_ARGUMENT, s + ": rotary_dim must be even and in 2..headdim (" +
                                                to_text(a.headdim) + "), got " +
                                                to_text(a.rotary_dim));
    }
    if (a.rotary_seqlen < 1 || a.rotary_seqlen > INT32_MAX) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": rotary_seqlen must be >= 1, got " + to_text(a.rotary_seqlen));
    }
    const uintptr_t element = static_cast<uintptr_t>(dtype_size(a.dtype));
    if (!aligned(a.rotary_cos, element) || !aligned(a.rotary_sin, element)) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": rotary_cos and rotary_sin must be aligned to their elements");
    }
  }
  if (a.rotary_interleaved != 0 && a.rotary_interleaved != 1) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": rotary_interleaved must be 0 or 1, got " + to_text(a.rotary_interleaved));
  }
  return SAMATTN_OK;
}

// Checks a forward call's arguments (no device access). `empty`: there is no
// output element, so nothing to compute.
int check_attention_forward_args(Subject* subject, const samattn_attention_args& a, bool* empty) {
  *empty = false;
  int status = check_attention_sizes(subject, a, /*backward=*/false);
  if (status != SAMATTN_OK) return status;
  const Subject& s = *subject;
  const bool varlen = a.cu_seqlens_q != nullptr;
  // The longest sequence a CTA sees.
  const int64_t longest_q = varlen ? a.max_seqlen_q : a.seqlen_q;
  const int64_t longest_k = varlen ? a.max_seqlen_k : a.seqlen_k;
  status = check_attention_cache(s, a);
  if (status != SAMATTN_OK) return status;
  *empty = a.batch == 0 || a.nheads == 0 || longest_q == 0;
  if (*empty) return SAMATTN_OK;

  const bool cache = uses_cache(a);
  const bool keys = cache || longest_k > 0;  // K and V are read only when some sequence has keys
  const AttentionOperand operands[] = {
      {"q", a.q, a.q_batch_stride, a.q_seq_stride, a.q_head_stride, a.seqlen_q, a.nheads, false},
      {"k", a.k, a.k_batch_stride, a.k_seq_stride, a.k_head_stride, a.seqlen_k, a.nheads_k, true},
      {"v", a.v, a.v_batch_stride, a.v_seq_stride, a.v_head_stride, a.seqlen_k, a.nheads_k, true},
      {"o", a.o, a.o_batch_stride, a.o_seq_stride, a.o_head_stride, a.seqlen_q, a.nheads, false}};
  constexpr int kOutput = 3;  // o
  for (int i = 0; i < 4; ++i) {
    if (operands[i].key_side && !keys) continue;
    if (operands[i].key_side && cache) continue;  // checked as caches below
    status = check_attention_operand(s, operands[i], varlen, a, /*output=*/i == kOutput);
    if (status != SAMATTN_OK) return status;
  }
  if (cache) {
    // The caches: (kv_cache_batch, rows, nheads_k, headdim), rows = page_size when paged.
    samattn_attention_args extents = a;
    extents.batch = a.kv_cache_batch;
    const int64_t rows = a.block_table != nullptr ? a.page_size : a.seqlen_k;
    const AttentionOperand caches[] = {
        {"k", a.k, a.k_batch_stride, a.k_seq_stride, a.k_head_stride, rows, a.nheads_k, true},
        {"v", a.v, a.v_batch_stride, a.v_seq_stride, a.v_head_stride, rows, a.nheads_k, true}};
    for (const AttentionOperand& x : caches) {
      status = check_attention_operand(s, x, /*varlen=*/false, extents,
                                       /*output=*/a.k_new != nullptr, kv_element_size(a));
      if (status != SAMATTN_OK) return status;
      // fp8 caches are read in 16-byte vectors only (no element-wise path).
      if (a.kv_fp8 != 0 &&
          (reinterpret_cast<uintptr_t>(x.ptr) % 16 != 0 || x.batch_stride % 16 != 0 ||
           x.seq_stride % 16 != 0 || x.head_stride % 16 != 0)) {
        return fail(SAMATTN_INVALID_ARGUMENT,
                    s + ": the fp8 cache " + x.name +
                        " must be 16-byte aligned with strides (batch, seq, head) that are "
                        "multiples of 16 elements, got " +
                        strides_text(x.batch_stride, x.seq_stride, x.head_stride));
      }
    }
    if (a.k_new != nullptr) {
      const AttentionOperand news[] = {{"k_new", a.k_new, a.k_new_batch_stride, a.k_new_seq_stride,
                                        a.k_new_head_stride, a.seqlen_new, a.nheads_k, true},
                                       {"v_new", a.v_new, a.v_new_batch_stride, a.v_new_seq_stride,
                                        a.v_new_head_stride, a.seqlen_new, a.nheads_k, true}};
      for (const AttentionOperand& x : news) {
        status = check_attention_operand(s, x, /*varlen=*/false, a, /*output=*/false);
        if (status != SAMATTN_OK) return status;
      }
    }
  }
  if (a.workspace != nullptr && !aligned(a.workspace, 256)) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": workspace must be 256-byte aligned");
  }
  return a.lse != nullptr ? check_attention_lse(s, a, varlen) : SAMATTN_OK;
}

// Checks a backward call's arguments (no device access). `empty`: dq, dk and
// dv have no element, so nothing to compute.
int check_attention_backward_args(Subject* subject, const samattn_attention_args& a, bool* empty) {
  *empty = false;
  int status = check_attention_sizes(subject, a, /*backward=*/true);
  if (status != SAMATTN_OK) return status;
  const Subject& s = *subject;
  const bool varlen = a.cu_seqlens_q != nullptr;
  // Rows of the query-side (q, o, dout, dq) and key-side (k, v, dk, dv)
  // tensors: with none on one side, that side is neither read nor written.
  *empty = a.batch == 0 || a.nheads == 0 || (a.seqlen_q == 0 && a.seqlen_k == 0);
  if (*empty) return SAMATTN_OK;

  const AttentionOperand operands[] = {
      {"q", a.q, a.q_batch_stride, a.q_seq_stride, a.q_head_stride, a.seqlen_q, a.nheads, false},
      {"k", a.k, a.k_batch_stride, a.k_seq_stride, a.k_head_stride, a.seqlen_k, a.nheads_k, true},
      {"v", a.v, a.v_batch_stride, a.v_seq_stride, a.v_head_stride, a.seqlen_k, a.nheads_k, true},
      {"o", a.o, a.o_batch_stride, a.o_seq_stride, a.o_head_stride, a.seqlen_q, a.nheads, false},
      {"dout", a.dout, a.dout_batch_stride, a.dout_seq_stride, a.dout_head_stride, a.seqlen_q,
       a.nheads, false},
      {"dq", a.dq, a.dq_batch_stride, a.dq_seq_stride, a.dq_head_stride, a.seqlen_q, a.nheads,
       false},
      {"dk", a.dk, a.dk_batch_stride, a.dk_seq_stride, a.dk_head_stride, a.seqlen_k, a.nheads_k,
       true},
      {"dv", a.dv, a.dv_batch_stride, a.dv_seq_stride, a.dv_head_stride, a.seqlen_k, a.nheads_k,
       true}};
  constexpr int kFirstOutput = 5;  // dq, dk, dv
  const int count = static_cast<int>(sizeof(operands) / sizeof(operands[0]));
  for (int i = 0; i < count; ++i) {
    const AttentionOperand& x = operands[i];
    if (x.seqlen == 0) continue;
    status = check_attention_operand(s, x, varlen, a, /*output=*/i >= kFirstOutput);
    if (status != SAMATTN_OK) return status;
  }
  // An output sharing its address with another tensor would be read after
  // being written (or written twice).
  for (int i = kFirstOutput; i < count; ++i) {
    if (operands[i].seqlen == 0) continue;
    for (int j = 0; j < count; ++j) {
      if (j == i || operands[j].seqlen == 0 || operands[j].ptr != operands[i].ptr) continue;
      return fail(SAMATTN_INVALID_ARGUMENT, s + ": " + operands[i].name + " and " +
                                                operands[j].name +
                                                " are the same memory; dq, dk and dv must not "
                                                "overlap each other or any input");
    }
  }
  if (a.seqlen_q > 0) {
    if (a.lse == nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": lse is NULL; the backward needs the forward's log-sum-exp");
    }
    status = check_attention_lse(s, a, varlen);
    if (status != SAMATTN_OK) return status;
  }
  return SAMATTN_OK;
}

// The forward's parameters, normalized once: varlen maxima, GQA ratio,
// softcap and scale factors, the window (set_scores).
void fill_forward(const samattn_attention_args& a, int sm_count, int max_smem_per_block,
                  AttentionForwardProblem* p) {
  const bool varlen = a.cu_seqlens_q != nullptr;
  const int64_t no_batch = 0;  // varlen: one packed tensor
  auto view = [&](const void* ptr, int64_t batch, int64_t seq, int64_t head) {
    return SeqHeadView{ptr, varlen ? no_batch : batch, seq, head};
  };
  p->dtype = static_cast<DType>(a.dtype);
  p->batch = static_cast<int>(a.batch);
  p->nheads = static_cast<int>(a.nheads);
  p->nheads_k = static_cast<int>(a.nheads_k);
  p->kv_group = static_cast<int>(a.nheads / a.nheads_k);
  // Varlen: the kernels take the longest sequence (grid size, window bounds).
  p->seqlen_q = static_cast<int>(varlen ? a.max_seqlen_q : a.seqlen_q);
  p->seqlen_k = static_cast<int>(varlen ? a.max_seqlen_k : a.seqlen_k);
  p->headdim = static_cast<int>(a.headdim);
  p->q = view(a.q, a.q_batch_stride, a.q_seq_stride, a.q_head_stride);
  p->k = view(a.k, a.k_batch_stride, a.k_seq_stride, a.k_head_stride);
  p->v = view(a.v, a.v_batch_stride, a.v_seq_stride, a.v_head_stride);
  p->o = {a.o, varlen ? no_batch : a.o_batch_stride, a.o_seq_stride, a.o_head_stride};
  p->cu_seqlens_q = varlen ? a.cu_seqlens_q : nullptr;
  p->cu_seqlens_k = varlen ? a.cu_seqlens_k : nullptr;
  p->total_q = varlen ? a.seqlen_q : 0;
  p->total_k = varlen ? a.seqlen_k : 0;
  AttnMaskView mask{};
  if (a.attn_mask != nullptr) {
    mask = {a.attn_mask,         a.mask_dtype == SAMATTN_BOOL ? MaskKind::keep : MaskKind::add_f32,
            a.mask_batch_stride, a.mask_head_stride,
            a.mask_q_stride,     a.mask_k_stride};
  }
  const DropoutView dropout{a.dropout_p > 0.0f ? a.dropout_p : 0.0f,
                            a.dropout_p > 0.0f ? a.dropout_seed : nullptr};
  p->terms = {a.alibi_slopes, a.alibi_slopes != nullptr ? a.alibi_batch_stride : 0, a.sinks, mask,
              dropout};
  set_scores(*p, a.softmax_scale, a.softcap, a.causal != 0, a.window_left, a.window_right);
  p->lse = a.lse;
  p->lse_batch_stride = varlen ? no_batch : a.lse_batch_stride;
  p->lse_head_stride = a.lse_head_stride;
  p->lse_seq_stride = a.lse_seq_stride;
  p->stream = static_cast<cudaStream_t>(a.stream);
  p->sm_count = sm_count;
  p->max_smem_per_block = max_smem_per_block;
  p->workspace = a.workspace;
  p->workspace_bytes = a.workspace_bytes < 0 ? 0 : static_cast<size_t>(a.workspace_bytes);
  p->num_splits = static_cast<int>(a.num_splits);

  // The caches; a decode-shaped call without them reads k and v as a cache
  // of seqlen_k rows per sequence.
  KVCacheView& c = p->cache;
  c.enabled = uses_cache(a);
  c.kv_cache_batch = static_cast<int>(c.enabled ? a.kv_cache_batch : a.batch);
  c.capacity = static_cast<int>(c.enabled ? cache_capacity(a) : a.seqlen_k);
  if (!c.enabled) return;
  c.seqused_k = a.seqused_k;
  c.leftpad_k = a.leftpad_k;
  c.kv_batch_idx = a.kv_batch_idx;
  c.block_table = a.block_table;
  c.block_table_batch_stride = a.block_table_batch_stride;
  c.page_size = a.block_table != nullptr ? static_cast<int>(a.page_size) : 0;
  c.k_new = {a.k_new, a.k_new_batch_stride, a.k_new_seq_stride, a.k_new_head_stride};
  c.v_new = {a.v_new, a.v_new_batch_stride, a.v_new_seq_stride, a.v_new_head_stride};
  c.seqlen_new = static_cast<int>(a.seqlen_new);
  c.rotary_cos = a.rotary_cos;
  c.rotary_sin = a.rotary_sin;
  c.rotary_dim = static_cast<int>(a.rotary_dim);
  c.rotary_seqlen = static_cast<int>(a.rotary_seqlen);
  c.rotary_interleaved = a.rotary_interleaved != 0;
  c.rotary_q_per_row = a.causal != 0 || a.window_left >= 0 || a.window_right >= 0;
  c.fp8 = {static_cast<Fp8Kind>(a.kv_fp8), a.k_scale_ptr,   a.v_scale_ptr,
           a.kv_scale_head_stride,         a.k_scale_value, a.v_scale_value};
  // The batch stride steps over cache sequences or pages (with varlen too:
  // paged prefill); fixed-length windows are bounded by the capacity.
  p->k.batch_stride = a.k_batch_stride;
  p->v.batch_stride = a.v_batch_stride;
  if (!varlen) {
    p->seqlen_k = c.capacity;
    set_scores(*p, a.softmax_scale, a.softcap, a.causal != 0, a.window_left, a.window_right);
  }
}

// The backward's: the forward's plus the gradients and the workspace.
AttentionBackwardProblem backward_problem(const samattn_attention_args& a, int sm_count,
                                          int max_smem_per_block) {
  AttentionBackwardProblem p{};
  fill_forward(a, sm_count, max_smem_per_block, &p);
  const bool varlen = a.cu_seqlens_q != nullptr;
  const int64_t no_batch = 0;
  auto out = [&](void* ptr, int64_t batch, int64_t seq, int64_t head) {
    return SeqHeadOut{ptr, varlen ? no_batch : batch, seq, head};
  };
  p.dout = {a.dout, varlen ? no_batch : a.dout_batch_stride, a.dout_seq_stride, a.dout_head_stride};
  p.dq = out(a.dq, a.dq_batch_stride, a.dq_seq_stride, a.dq_head_stride);
  p.dk = out(a.dk, a.dk_batch_stride, a.dk_seq_stride, a.dk_head_stride);
  p.dv = out(a.dv, a.dv_batch_stride, a.dv_seq_stride, a.dv_head_stride);
  p.deterministic = a.deterministic != 0;
  p.dsinks = a.sinks != nullptr ? a.dsinks : nullptr;
  p.dmask = a.attn_mask != nullptr ? a.dmask : nullptr;
  p.workspace = a.workspace;
  p.workspace_bytes = a.workspace_bytes < 0 ? 0 : static_cast<size_t>(a.workspace_bytes);
  return p;
}

AttentionForwardProblem forward_problem(const samattn_attention_args& a, int sm_count,
                                        int max_smem_per_block) {
  AttentionForwardProblem p{};
  fill_forward(a, sm_count, max_smem_per_block, &p);
  return p;
}

// The family samattn_attention_plan reports for `problem`, and its window.
template <Op kOp>
int plan_with(const Subject& subject, const samattn_attention_args& a, const GpuSpec& gpu,
              const ProblemOf<kOp>& problem, int32_t* family, AttentionWindow* window) {
  const Kernels<kOp>* kernels = nullptr;
  const int status = choose_kernels<kOp>(subject, a.dtype, gpu, a.family, false, problem, &kernels);
  if (status != SAMATTN_OK) return status;
  *family = static_cast<int32_t>(kernels->family);
  *window = problem.window;
  return SAMATTN_OK;
}

}  // namespace

int attention_forward_op(const samattn_attention_args* args, int32_t* family_used) {
  Subject subject{"samattn attention_forward"};
  if (family_used != nullptr) *family_used = SAMATTN_FAMILY_AUTO;
  if (args == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, subject + ": args is NULL");
  const samattn_attention_args& a = *args;
  bool empty = false;
  const int status = check_attention_forward_args(&subject, a, &empty);
  if (status != SAMATTN_OK || empty) return status;
  const OpCall call{
      subject, a.dtype,     a.family,          a.device,
      false,   a.workspace, a.workspace_bytes, "samattn_attention_forward_workspace_size"};
  return run_op<Op::attention_forward>(
      call,
      [&](const DeviceInfo& device) {
        return forward_problem(a, device.sm_count, device.max_smem_per_block);
      },
      family_used);
}

int attention_backward_op(const samattn_attention_args* args, int32_t* family_used) {
  Subject subject{"samattn attention_backward"};
  if (family_used != nullptr) *family_used = SAMATTN_FAMILY_AUTO;
  if (args == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, subject + ": args is NULL");
  const samattn_attention_args& a = *args;
  bool empty = false;
  const int status = check_attention_backward_args(&subject, a, &empty);
  if (status != SAMATTN_OK || empty) return status;
  // Checked before the device is known against what the size query returns
  // (the most any family needs); the skeleton checks the chosen family's.
  const int64_t needed =
      registered_workspace_bytes<Op::attention_backward>(backward_problem(a, 0, 0));
  if (needed > 0 && (a.workspace == nullptr || a.workspace_bytes < needed)) {
    return fail(SAMATTN_NEEDS_WORKSPACE,
                subject + ": needs " + to_text(needed) + " bytes of workspace, got " +
                    to_text(a.workspace == nullptr ? 0 : a.workspace_bytes) +
                    " (ask samattn_attention_backward_workspace_size)");
  }
  if (needed > 0 && !aligned(a.workspace, 256)) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": workspace must be 256-byte aligned");
  }
  const OpCall call{
      subject, a.dtype,     a.family,          a.device,
      false,   a.workspace, a.workspace_bytes, "samattn_attention_backward_workspace_size"};
  return run_op<Op::attention_backward>(
      call,
      [&](const DeviceInfo& device) {
        return backward_problem(a, device.sm_count, device.max_smem_per_block);
      },
      family_used);
}

int attention_forward_workspace_size_op(const samattn_attention_args* args, int64_t* bytes) {
  Subject subject{"samattn attention_forward_workspace_size"};
  if (args == nullptr || bytes == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": args or bytes is NULL");
  }
  *bytes = 0;
  int status = check_attention_sizes(&subject, *args, /*backward=*/false);
  if (status != SAMATTN_OK) return status;
  status = check_attention_cache(subject, *args);
  if (status != SAMATTN_OK) return status;
  if (args->batch == 0 || args->nheads == 0 || args->seqlen_q == 0) return SAMATTN_OK;
  // The split count follows the device's SM count and the tile its shared
  // memory allows; how the splits combine, the family the call will run.
  const DeviceInfo* device = nullptr;
  status = device_info(args->device, subject, &device);
  if (status != SAMATTN_OK) return status;
  *bytes = chosen_workspace_bytes<Op::attention_forward>(
      subject, args->dtype, device->gpu, args->family,
      forward_problem(*args, device->sm_count, device->max_smem_per_block));
  return SAMATTN_OK;
}

int attention_backward_workspace_size_op(const samattn_attention_args* args, int64_t* bytes) {
  Subject subject{"samattn attention_backward_workspace_size"};
  if (args == nullptr || bytes == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": args or bytes is NULL");
  }
  *bytes = 0;
  const int status = check_attention_sizes(&subject, *args, /*backward=*/true);
  if (status != SAMATTN_OK) return status;
  if (args->batch == 0 || args->nheads == 0) return SAMATTN_OK;
  *bytes = registered_workspace_bytes<Op::attention_backward>(backward_problem(*args, 0, 0));
  return SAMATTN_OK;
}

int attention_plan_op(const samattn_attention_args* args, int32_t backward, int32_t cc_major,
                      int32_t cc_minor, int32_t smem_per_block, int32_t* family, char* text,
                      int32_t capacity) {
  Subject subject{backward != 0 ? "samattn attention_plan (backward)" : "samattn attention_plan"};
  if (args == nullptr || family == nullptr || text == nullptr || capacity < 1) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": args, family and text must be non-NULL, text_capacity >= 1");
  }
  if (smem_per_block < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": smem_per_block must be >= 0, got " + to_text(smem_per_block));
  }
  *family = SAMATTN_FAMILY_AUTO;
  text[0] = '\0';
  const int status = check_attention_sizes(&subject, *args, backward != 0);
  if (status != SAMATTN_OK) return status;
  GpuSpec gpu;
  gpu.cc_major = cc_major;
  gpu.cc_minor = cc_minor;
  // The parameters the launch would get; sm_count does not affect a plan.
  AttentionWindow window{};
  const int result =
      backward != 0
          ? plan_with<Op::attention_backward>(
                subject, *args, gpu, backward_problem(*args, 1, smem_per_block), family, &window)
          : plan_with<Op::attention_forward>(
                subject, *args, gpu, forward_problem(*args, 1, smem_per_block), family, &window);
  if (result != SAMATTN_OK) return result;
  std::snprintf(text, static_cast<size_t>(capacity), "window_left=%d window_right=%d", window.left,
                window.right);
  return SAMATTN_OK;
}

}  // namespace samattn
