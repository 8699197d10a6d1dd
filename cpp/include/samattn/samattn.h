/*
 * samattn C ABI.
 *
 * One shared library, no libtorch, no Python C API (see docs/design.md section 1).
 * Every entry point takes a plain struct of pointers, sizes and element
 * strides, validates it, picks a kernel family for the device and launches on
 * the given stream. The library never allocates device memory.
 *
 * Every argument struct begins with its own size: set struct_size =
 * sizeof(the struct). Later versions add fields only at the end, so the
 * library accepts a larger struct whose unknown fields are zero, and refuses
 * a smaller one (a caller built for an older ABI) with
 * SAMATTN_INVALID_ARGUMENT.
 *
 * Errors: every function returns a status; on failure a message for the
 * calling thread is available from samattn_last_error().
 */
#ifndef SAMATTN_SAMATTN_H_
#define SAMATTN_SAMATTN_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SAMATTN_ABI_VERSION 6

/* Status codes. */
enum {
  SAMATTN_OK = 0,
  SAMATTN_INVALID_ARGUMENT = 1, /* the arguments break the op's contract */
  SAMATTN_UNSUPPORTED = 2,      /* valid, but this GPU / family / build cannot run it */
  SAMATTN_CUDA_ERROR = 3,       /* the CUDA runtime reported an error */
  SAMATTN_NEEDS_WORKSPACE = 4   /* the call needs more workspace than it was given (the
                                   message says how much; the op's *_workspace_size
                                   function tells it): nothing was launched */
};

/* Element types. */
enum {
  SAMATTN_F16 = 0,
  SAMATTN_BF16 = 1,
  SAMATTN_F32 = 2,
  SAMATTN_BOOL = 3,    /* masks only */
  SAMATTN_F8_E4M3 = 4, /* KV caches only (kv_fp8): float8_e4m3fn, largest finite 448 */
  SAMATTN_F8_E5M2 = 5  /* KV caches only (kv_fp8): float8_e5m2, largest finite 57344 */
};

/* Kernel families. AUTO = choose from the device (or SAMATTN_FAMILY). */
enum {
  SAMATTN_FAMILY_AUTO = 0,
  SAMATTN_FAMILY_SM75 = 75,
  SAMATTN_FAMILY_SM80 = 80,
  SAMATTN_FAMILY_SM90 = 90
};

/* GEMM epilogue activations, applied to the fp32 result. */
enum {
  SAMATTN_ACTIVATION_NONE = 0,
  SAMATTN_ACTIVATION_RELU = 1,      /* max(x, 0) */
  SAMATTN_ACTIVATION_GELU = 2,      /* x * Phi(x), with erf */
  SAMATTN_ACTIVATION_GELU_TANH = 3, /* GELU's tanh approximation */
  SAMATTN_ACTIVATION_SILU = 4       /* x * sigmoid(x) */
};

/* GEMM split-K reduction modes (samattn_gemm_args.split_k_mode). */
enum {
  SAMATTN_SPLIT_K_AUTO = 0,    /* the family's own: serial on sm90, parallel elsewhere */
  SAMATTN_SPLIT_K_SERIAL = 1,  /* the splits of a tile add up in K order, in one kernel */
  SAMATTN_SPLIT_K_PARALLEL = 2 /* each split writes fp32 partials; a second kernel sums them */
};

/* GEMM grouping (samattn_gemm_args.group_mode). */
enum {
  SAMATTN_GROUP_NONE = 0,
  SAMATTN_GROUP_ROWS = 1, /* group g owns rows [end[g-1], end[g]) of A, C and D */
  SAMATTN_GROUP_K = 2,    /* group g reduces over [end[g-1], end[g]) of K into D[g] */
  SAMATTN_GROUP_LIST = 3  /* `batch` independent GEMMs of any sizes (group_list) */
};

/* One GEMM of a SAMATTN_GROUP_LIST call: D = alpha * A @ B, A (m, k), B
 * (k, n), D (m, n), strides in elements as in samattn_gemm_args. */
typedef struct samattn_gemm_list_entry {
  int64_t m, n, k;
  const void* a;
  int64_t a_row_stride, a_col_stride;
  const void* b;
  int64_t b_row_stride, b_col_stride;
  void* d;
  int64_t d_row_stride, d_col_stride;
} samattn_gemm_list_entry;

/* Ops, for family selection queries. */
enum { SAMATTN_OP_GEMM = 0, SAMATTN_OP_SOFTMAX = 1, SAMATTN_OP_ATTENTION = 2 };

/*
 * D = alpha * A @ B + beta * C, batched.
 * Element (b, i, j) of a matrix X lives at X + b*X_batch_stride +
 * i*X_row_stride + j*X_col_stride (strides in elements, batch stride 0 =
 * broadcast). A is (m, k), B is (k, n), C and D are (m, n). A and B share
 * `dtype`; accumulation is fp32. C may be NULL only when beta == 0.
 *
 * Epilogue (appended to ABI 6: a library that predates it refuses a caller
 * that sets it), applied in fp32 before D is rounded:
 *   D = activation(alpha * A @ B + beta * C + bias)
 * bias: NULL, or n contiguous elements of `dtype`, one per column of D,
 * broadcast over rows and batch. activation: SAMATTN_ACTIVATION_*.
 * output_fp32 = 1 (f16 and bf16 only): C and D are fp32; otherwise they are
 * `dtype`.
 *
 * Split-K (appended to ABI 6 likewise): split_k = 0 lets the family choose
 * (the sm90 family's stream-K tiles split K when the output tiles cannot
 * fill the GPU; the others do not split); split_k = 1 never splits; n >= 2
 * splits K n ways (at most 64; fewer when K has fewer tiles). Both modes are
 * deterministic: the partial sums of a tile are added in K order, so a
 * fixed split gives bit-identical results. The sm90 family runs SERIAL (as
 * CUTLASS's stream-K scheduler does); the sm80 and sm75 families run
 * PARALLEL on their tensor-core kernels; a mode or path a family lacks is a
 * decline, which the sm90 family hands to sm80. Either needs a workspace
 * (samattn_gemm_workspace_size).
 *
 * Grouped GEMM (appended likewise; f16 / bf16 / tf32 tensor cores, sm80 and
 * sm75 families): group_offsets is a device array of `batch` int32
 * cumulative ends, read by the kernels (never by the host); group g spans
 * [end[g-1], end[g]) with end[-1] = 0.
 *   SAMATTN_GROUP_ROWS (mixture of experts): the spans are rows of A, C and
 *   D, and B advances by b_batch_stride per group; a, c and d batch strides
 *   must be 0. Rows after end[batch-1] are written as epilogue(0).
 *   SAMATTN_GROUP_K: the spans are ranges of K, shared by A and B (batch
 *   strides 0); D advances by d_batch_stride per group.
 * Ends outside [0, m] (rows) or [0, k] (K) are clamped and a decreasing end
 * gives an empty group: no access leaves the operands, but the result is
 * then undefined. split_k must be 0 or 1.
 *   SAMATTN_GROUP_LIST (appended likewise; f16 / bf16): `batch` independent
 *   GEMMs D_i = alpha * A_i @ B_i, each of its own sizes and strides, from
 *   the host array group_list (read during the call only); group_offsets is
 *   NULL, and m, n, k, a, b, c, d and their strides, beta, bias, activation,
 *   output_fp32 and split_k are 0. A GEMM with k = 0 writes zeros. The sm90
 *   family runs the list in one launch when every A is row-major, every B
 *   row-major or every B column-major, every D row-major, with K, N and the
 *   leading dimensions whole 16 bytes; the others run one GEMM after another.
 */
typedef struct samattn_gemm_args {
  int64_t struct_size; /* sizeof(samattn_gemm_args) of the caller's header */
  int32_t dtype;
  int32_t family;     /* SAMATTN_FAMILY_* */
  int32_t device;     /* CUDA ordinal that owns every pointer */
  int32_t allow_tf32; /* fp32 only: 1 = tf32 tensor cores, 0 = exact fp32 FMA */
  int64_t batch, m, n, k;
  const void* a;
  int64_t a_batch_stride, a_row_stride, a_col_stride;
  const void* b;
  int64_t b_batch_stride, b_row_stride, b_col_stride;
  const void* c;
  int64_t c_batch_stride, c_row_stride, c_col_stride;
  void* d;
  int64_t d_batch_stride, d_row_stride, d_col_stride;
  float alpha, beta;
  void* stream; /* cudaStream_t */
  void* workspace;
  int64_t workspace_bytes;
  const void* bias;     /* NULL = no bias */
  int32_t activation;   /* SAMATTN_ACTIVATION_* */
  int32_t output_fp32;  /* 1: C and D are fp32 (f16 / bf16 inputs) */
  int32_t split_k;      /* 0 = the family chooses, 1 = no split, 2..64 = K split this many ways */
  int32_t split_k_mode; /* SAMATTN_SPLIT_K_* */
  const int32_t* group_offsets; /* device, `batch` cumulative ends; NULL = not grouped */
  int32_t group_mode;           /* SAMATTN_GROUP_* */
  int32_t group_reserved;       /* 0 */
  const samattn_gemm_list_entry* group_list; /* host, `batch` entries; SAMATTN_GROUP_LIST only */
} samattn_gemm_args;

/*
 * Softmax over the middle mode of a contiguous (outer, dim, inner) view:
 * y[o, :, i] = softmax(x[o, :, i]). inner == 1 is the last-dim case.
 * Forward reads x and writes y; backward reads y and dy and writes
 * dx = y * (dy - sum(dy * y)).
 */
typedef struct samattn_softmax_args {
  int64_t struct_size; /* sizeof(samattn_softmax_args) of the caller's header */
  int32_t dtype;
  int32_t family;
  int32_t device;
  int32_t reserved;
  int64_t outer, dim, inner;
  const void* x;  /* forward: input;  backward: y (the forward output) */
  const void* dy; /* backward only, else NULL */
  void* out;      /* forward: y;      backward: dx */
  void* stream;
} samattn_softmax_args;

/*
 * Attention (FlashAttention-2 semantics), fp16 or bf16 with fp32 accumulation:
 *   O = softmax(softmax_scale * Q K^T + mask) V   per (batch, query head),
 * query head h reading key/value head h / (nheads / nheads_k) (GQA / MQA).
 *
 * Layout: element (b, s, h, d) of Q lives at
 *   q + b*q_batch_stride + s*q_seq_stride + h*q_head_stride + d
 * (the head-dim stride is 1; strides are in elements), likewise K, V, O and,
 * for the backward, dO, dQ, dK, dV. Pointers must be aligned to the 2-byte
 * elements and strides >= 0. The kernels move rows as 16-byte vectors when the
 * head dim and every pointer and stride are multiples of 8 elements (16
 * bytes), and element by element, several times slower, otherwise.
 *
 * Fixed length: cu_seqlens_q/k are NULL; Q is (batch, seqlen_q, nheads,
 * headdim), K and V (batch, seqlen_k, nheads_k, headdim); max_seqlen_* are
 * ignored.
 * Varlen: cu_seqlens_q/k are device int32 arrays of batch + 1 offsets,
 * non-decreasing from 0; sequence b holds rows [cu[b], cu[b+1]) of packed
 * tensors of seqlen_q (Q, O) and seqlen_k (K, V) rows (the batch strides are
 * unused); max_seqlen_q/k bound every sequence's length (they size the grid:
 * a longer sequence is computed only up to them). The library cannot read
 * device memory to check the offsets: the caller guarantees them.
 *
 * Masks, with sk and sq the sequence's lengths: key j is visible to query i
 * iff  i + sk - sq - window_left <= j <= i + sk - sq + window_right,
 * a negative window bound being unbounded; causal sets window_right = 0
 * (bottom-right aligned when sq != sk). softcap > 0 replaces each scaled
 * score s by softcap * tanh(s / softcap). A query that sees no key gets
 * O = 0 and LSE = +inf.
 *
 * lse (fp32, may be NULL): the natural-log sum of exp of each query's scaled
 * scores, element (b, h, s) at lse + b*lse_batch_stride + h*lse_head_stride +
 * s*lse_seq_stride; with varlen s is the packed row (batch stride unused).
 *
 * The dout/dq/dk/dv fields, `deterministic` and the workspace belong to the
 * backward (samattn_attention_forward ignores them): dq has Q's shape, dk and
 * dv K's (with GQA each sums its group of query heads), dout O's; all share
 * `dtype` and the layout rules above.
 */
typedef struct samattn_attention_args {
  int64_t struct_size; /* sizeof(samattn_attention_args) of the caller's header */
  int32_t dtype;       /* SAMATTN_F16 or SAMATTN_BF16 */
  int32_t family;
  int32_t device;
  int32_t causal; /* 0 or 1 */
  int64_t batch, nheads, nheads_k;
  int64_t seqlen_q, seqlen_k;  /* varlen: rows of the packed tensors */
  int64_t headdim;             /* 1..256 */
  const int32_t* cu_seqlens_q; /* varlen, else NULL (both or neither) */
  const int32_t* cu_seqlens_k;
  int64_t max_seqlen_q, max_seqlen_k; /* varlen only */
  const void* q;
  int64_t q_batch_stride, q_seq_stride, q_head_stride;
  const void* k;
  int64_t k_batch_stride, k_seq_stride, k_head_stride;
  const void* v;
  int64_t v_batch_stride, v_seq_stride, v_head_stride;
  void* o; /* forward: written; backward: read */
  int64_t o_batch_stride, o_seq_stride, o_head_stride;
  float* lse; /* forward: written if not NULL; backward: read */
  int64_t lse_batch_stride, lse_head_stride, lse_seq_stride;
  float softmax_scale;               /* usually 1 / sqrt(headdim) */
  float softcap;                     /* 0 = off */
  int32_t window_left, window_right; /* -1 = unbounded */
  /* Backward only. */
  const void* dout;
  int64_t dout_batch_stride, dout_seq_stride, dout_head_stride;
  void* dq;
  int64_t dq_batch_stride, dq_seq_stride, dq_head_stride;
  void* dk;
  int64_t dk_batch_stride, dk_seq_stride, dk_head_stride;
  void* dv;
  int64_t dv_batch_stride, dv_seq_stride, dv_head_stride;
  int32_t deterministic; /* 1 = bit-identical gradients run to run */
  int32_t reserved;
  void* stream; /* cudaStream_t */
  void* workspace;
  int64_t workspace_bytes;
  /*
   * Inference: a KV cache, forward only (ABI 5). All NULL / 0 = off. With any
   * of seqused_k, block_table, kv_batch_idx or k_new set, k and v are caches:
   *   not paged: (kv_cache_batch, seqlen_k, nheads_k, headdim) by the k/v strides;
   *   paged:     (kv_cache_batch pages, page_size, nheads_k, headdim), the
   *              k/v batch stride stepping over pages; sequence b's row j is
   *              row j % page_size of page block_table[b][j / page_size], and
   *              seqlen_k is ignored (a sequence holds up to
   *              block_table_width * page_size rows).
   * Sequence b attends cache rows [leftpad_k[b], seqused_k[b] + seqlen_new)
   * of cache sequence kv_batch_idx[b] (defaults: 0, the capacity or the
   * cu_seqlens_k length, b), seen as its keys 0, 1, ...; causal and window
   * are relative to that key count (bottom-right). With k_new / v_new
   * (batch, seqlen_new, nheads_k, headdim) their rows are first written into
   * the cache at rows seqused_k[b] + i (seqused_k required), after rotary
   * embedding when rotary_cos / rotary_sin are given: (rotary_seqlen,
   * rotary_dim / 2) contiguous, q's dtype, rotary_dim even and <= headdim;
   * new key i and, with causal or a window, query row i take position
   * seqused_k[b] + i (without: every query row takes seqused_k[b]); pairs
   * (2c, 2c + 1) when rotary_interleaved, else (c, c + rotary_dim / 2).
   * Values are not read on the host: the kernels clamp every row and page
   * index into the cache and never read or write outside it; the caller
   * checks them where it can (samattn checks them in eager mode).
   * varlen (cu_seqlens_*) combines only with block_table (paged prefill);
   * leftpad_k does not combine with block_table.
   * num_splits: key range split over this many CTAs per query tile, combined
   * by log-sum-exp (0: chosen from the problem and the SM count; 1: no split).
   * Problems that split (except where the sm90 family combines the splits in
   * a cluster), append or rotate need a workspace
   * (samattn_attention_forward_workspace_size).
   */
  const int32_t* seqused_k;    /* (batch,) cache rows in use before the append */
  const int32_t* leftpad_k;    /* (batch,) first cache row of each sequence */
  const int32_t* kv_batch_idx; /* (batch,) the cache sequence of each batch entry */
  const int32_t* block_table;  /* (batch, block_table_width) page indices */
  int64_t block_table_batch_stride, block_table_width;
  int64_t page_size;      /* paged: rows per page, a multiple of 16 */
  int64_t kv_cache_batch; /* leading extent of the caches: sequences, or pages when paged */
  const void* k_new;
  int64_t k_new_batch_stride, k_new_seq_stride, k_new_head_stride;
  const void* v_new;
  int64_t v_new_batch_stride, v_new_seq_stride, v_new_head_stride;
  int64_t seqlen_new;
  const void* rotary_cos;
  const void* rotary_sin;
  int64_t rotary_dim, rotary_seqlen;
  int32_t rotary_interleaved; /* 0 or 1 */
  int32_t num_splits;         /* 0 = heuristic, >= 1 forced */
  /*
   * Score terms (ABI 6), forward and backward, every mode above included;
   * NULL = off. fp32, 4-byte aligned.
   * alibi_slopes: the slope of batch entry b and query head h is
   *   alibi_slopes[b * alibi_batch_stride + h] (alibi_batch_stride 0: one
   *   slope per head); -slope * |i + seqlen_k - seqlen_q - j| is added to the
   *   scaled (and capped) score of query i and key j, with the lengths of
   *   that sequence (bottom-right, as causal).
   * sinks: (nheads,) one logit per query head that joins every row's softmax
   *   denominator, as a key whose value is zero: rows sum to less than one,
   *   lse includes it, and a row that attends no key gets output 0 and
   *   lse = sink.
   * dsinks: backward only, (nheads,), written with the gradient of the
   *   loss with respect to sinks, in a fixed order (NULL: not computed); left
   *   alone by a call with nothing to compute (batch or nheads 0, or neither
   *   query nor key rows), whose gradient is zero.
   */
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
  const float* sinks;
  float* dsinks;
  /*
   * attn_mask (ABI 6): a mask the kernels read, fixed length only (no
   * cu_seqlens, no KV-cache field). The value for batch entry b, query head
   * h, query i and key j is at attn_mask + b * mask_batch_stride +
   * h * mask_head_stride + i * mask_q_stride + j * mask_k_stride elements
   * (strides >= 0, 0 broadcasting; mask_k_stride 1: contiguous keys). mask_dtype: SAMATTN_BOOL (1
   * byte; 0 masks the key for that query) or SAMATTN_F32 (added to the scaled, capped, ALiBi-biased
   * score; -inf masks). A query that attends no key gets output 0 and lse +inf (or its sink). NULL:
   * no mask (the other mask fields are then ignored). dmask: backward only, with an additive mask:
   * fp32 (batch, nheads, seqlen_q, seqlen_k), contiguous, zeroed by the caller; receives the
   * gradient with respect to the mask of each (batch, head, query, key)
   * (summing it over broadcast dimensions is the caller's). NULL: not
   * computed.
   */
  const void* attn_mask;
  int32_t mask_dtype;
  int32_t mask_reserved; /* 0 */
  int64_t mask_batch_stride, mask_head_stride, mask_q_stride, mask_k_stride;
  float* dmask;
  /*
   * Dropout on the attention probabilities (appended to ABI 6: a library
   * without these fields refuses a call that sets them, by struct_size).
   * dropout_p in [0, 1), 0 = off; forward and backward, fixed length and
   * varlen, no KV-cache field. Probability (b, h, i, j) is kept iff its
   * random byte is at least t = min(255, round(dropout_p * 256)), and then
   * scaled by 1 / (1 - dropout_p) (float32, as flash-attn); the bytes come
   * from Philox4x32-7 keyed by the 64-bit value at dropout_seed (a device
   * pointer, read by the kernels: a CUDA graph replays whatever the caller
   * wrote there), so a backward given the forward's seed drops the same
   * probabilities. docs/attention_dropout.md gives the map from (b, h, i, j)
   * to the bytes.
   */
  float dropout_p;
  int32_t dropout_reserved; /* 0 */
  const uint64_t* dropout_seed;
  /*
   * FP8 KV caches (appended to ABI 6; a library without these fields refuses
   * a call that sets them, by struct_size). kv_fp8 0: k and v hold `dtype`.
   * SAMATTN_F8_E4M3 or SAMATTN_F8_E5M2: k and v are KV caches (one of the
   * cache fields above set) of 1-byte elements; a stored key element x
   * stands for x * k_scale of its KV head, a value element for x * v_scale,
   * with k_scale = k_scale_ptr[h * kv_scale_head_stride] (fp32 device
   * pointers, 4-byte aligned; stride 0: one scale for every head, 1: one per
   * KV head) or, where the pointer is NULL, k_scale_value (likewise v).
   * Scales are positive and finite (not checked: device values). k_new and
   * v_new keep `dtype`: each new element y is stored as the fp8 value nearest
   * y / scale, saturated to the format's largest finite value; a NaN stays
   * NaN. headdim a multiple of 16, every cache row 16-byte aligned. q and o
   * keep `dtype`; the forward only.
   */
  int32_t kv_fp8;
  int32_t kv_fp8_reserved; /* 0 */
  const float* k_scale_ptr;
  const float* v_scale_ptr;
  int64_t kv_scale_head_stride;
  float k_scale_value, v_scale_value;
} samattn_attention_args;

/* Ops. `family_used` (may be NULL) receives the family that ran. */
int samattn_gemm(const samattn_gemm_args* args, int32_t* family_used);
/* Device workspace samattn_gemm needs for these arguments (workspace fields ignored). */
int samattn_gemm_workspace_size(const samattn_gemm_args* args, int64_t* bytes);
int samattn_softmax_forward(const samattn_softmax_args* args, int32_t* family_used);
int samattn_softmax_backward(const samattn_softmax_args* args, int32_t* family_used);
/*
 * Repeated calls (appended to ABI 6). The op on a copy of `prepared` (an
 * earlier call's arguments, unchanged) with its data pointers, stream and
 * workspace replaced by the arguments here: the same checks and the same
 * result as filling a struct anew, for a caller that makes many calls of one
 * signature (an eager Python call passes a few integers instead of copying
 * and filling a struct). Softmax: x is the forward's input or the backward's
 * y, dy is NULL in the forward.
 */
int samattn_gemm_with_pointers(const samattn_gemm_args* prepared, const void* a, const void* b,
                               void* d, const void* bias, void* stream, void* workspace,
                               int64_t workspace_bytes, int32_t* family_used);
int samattn_softmax_forward_with_pointers(const samattn_softmax_args* prepared, const void* x,
                                          const void* dy, void* out, void* stream,
                                          int32_t* family_used);
int samattn_softmax_backward_with_pointers(const samattn_softmax_args* prepared, const void* x,
                                           const void* dy, void* out, void* stream,
                                           int32_t* family_used);
/*
 * Writes o (and lse when not NULL); with k_new / v_new also the caches.
 * Needs a workspace (SAMATTN_NEEDS_WORKSPACE otherwise, nothing launched)
 * when it splits the keys, appends or rotates: workspace_bytes >= what
 * samattn_attention_forward_workspace_size returns, 256-byte aligned.
 */
int samattn_attention_forward(const samattn_attention_args* args, int32_t* family_used);
/* Device workspace samattn_attention_forward needs for these arguments on
 * `args->device`, for the family the call will run (args->family or
 * SAMATTN_FAMILY as they are now; 0 for most calls, and for key splits the
 * sm90 family combines in a cluster; the pointers are not inspected). */
int samattn_attention_forward_workspace_size(const samattn_attention_args* args, int64_t* bytes);
/*
 * Gradients of samattn_attention_forward: reads q, k, v, o, lse (required:
 * the forward's) and dout; writes dq, dk, dv, which must not overlap each
 * other or any input. Every element of dq, dk and dv is written, except, with
 * varlen, rows of dq, dk and dv outside every sequence.
 * deterministic = 1 makes the result bit-identical run to run (dq is summed
 * in a fixed order; a little slower).
 * The workspace (workspace_bytes >= what samattn_attention_backward_workspace_size
 * returns, 256-byte aligned; NULL when that is 0) is scratch: the library
 * zeroes what it needs on the stream, so its contents on entry do not matter,
 * and it must stay untouched until the work on the stream is done. The
 * backward shares SAMATTN_OP_ATTENTION's family selection; the sm90 family
 * has no backward of its own and hands it to sm80, also when sm90 is forced
 * (family_used says which ran).
 */
int samattn_attention_backward(const samattn_attention_args* args, int32_t* family_used);
/* Device workspace samattn_attention_backward needs for these arguments
 * (the pointers and the workspace fields are not inspected). */
int samattn_attention_backward_workspace_size(const samattn_attention_args* args, int64_t* bytes);

/* Message for the last failure on this thread ("" if none). */
const char* samattn_last_error(void);

/* Library facts. */
const char* samattn_version(void);
int32_t samattn_abi_version(void);
/* Bit mask of families compiled in: 1 = sm75, 2 = sm80, 4 = sm90. */
int32_t samattn_built_families(void);
/* Bit mask of op groups compiled in: 1 << SAMATTN_OP_*. */
int32_t samattn_built_ops(void);

/*
 * Family selection as a pure function of the compute capability, so it can
 * be tested without a GPU. `requested` is SAMATTN_FAMILY_AUTO or a forced
 * family; `allow_tf32` matters for fp32 GEMM only. On success *family is the
 * family that would run, among the families this library holds, before
 * their plans see a problem (a plan may decline one: see samattn_gemm_plan
 * and samattn_attention_plan); otherwise the status says why and the last
 * error names the op, dtype, compute capability and what is supported.
 * SAMATTN_FAMILY in the environment is honoured when requested is AUTO.
 */
int samattn_select_family(int32_t op, int32_t dtype, int32_t cc_major, int32_t cc_minor,
                          int32_t requested, int32_t allow_tf32, int32_t* family);

/*
 * How samattn_gemm would run `args` on a GPU of compute capability
 * cc_major.cc_minor with sm_count multiprocessors, in a library built with
 * every family (whatever this one holds), without a GPU: the family
 * (after the sm90 family hands problems TMA cannot describe to sm80, also
 * when sm90 is forced) and a
 * description of the kernel configuration, NUL-terminated and truncated to
 * plan_capacity: "tile=128x256_c2x1 swizzle=4 transposed=0" for sm90, or
 * "sm90 cannot run it: <reason>" when it fell back, or "" otherwise. The
 * pointers in args are only inspected for alignment.
 */
int samattn_gemm_plan(const samattn_gemm_args* args, int32_t cc_major, int32_t cc_minor,
                      int32_t sm_count, int32_t* family, char* plan, int32_t plan_capacity);
/*
 * How samattn_attention_forward (backward = 0) or samattn_attention_backward
 * (backward = 1) would run `args` in this library on a GPU of compute
 * capability cc_major.cc_minor with smem_per_block bytes of opt-in shared
 * memory per block, without a GPU: *family is the family that would run (a
 * family whose plan declines the problem, e.g. a head dim left out of the
 * build or no tile that fits the shared memory, falls through to the next
 * one; a forced one only to its fallback: sm90 hands to sm80 the forward
 * problems it declines and every backward), and `text` (NUL-terminated,
 * truncated to text_capacity) the window the kernels would get after
 * normalization: "window_left=L window_right=R", -1 = unbounded. Sizes are
 * checked as the op checks them; pointers are not inspected. SAMATTN_FAMILY
 * is honoured.
 */
int samattn_attention_plan(const samattn_attention_args* args, int32_t backward, int32_t cc_major,
                           int32_t cc_minor, int32_t smem_per_block, int32_t* family, char* text,
                           int32_t text_capacity);
/* Device facts (name is NUL-terminated, truncated to name_capacity). */
int samattn_device_properties(int32_t device, char* name, int32_t name_capacity, int32_t* cc_major,
                              int32_t* cc_minor, int32_t* sm_count);
/* CUDA runtime compiled in and driver installed, as CUDA encodes them (12040 = 12.4). */
int samattn_cuda_versions(int32_t* runtime_version, int32_t* driver_version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SAMATTN_SAMATTN_H_ */
