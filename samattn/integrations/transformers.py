"""samattn as an attention implementation of Hugging Face transformers.

    import samattn.integrations.transformers

    samattn.integrations.transformers.register()  # once per process; returns "samattn"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        name, attn_implementation="samattn", dtype=torch.bfloat16, device_map="cuda"
    )

transformers is optional (not a dependency of samattn): ``register()`` raises ImportError
without it. Needs transformers >= 4.56 (the AttentionInterface / AttentionMaskInterface
registries with 4-D padding-free masks); tested with 5.17.

What runs (the model's q/k/v arrive as (batch, heads, seq, head_dim) views; samattn reads
their (batch, seq, heads, head_dim) transposes in place, no copies):

- No padding (the mask is None): ``samattn.flash_attn_func`` with the layer's causality
  (``module.is_causal``, or ``is_causal`` passed by the model), ``scaling``, the sliding
  window (flash-attn's ``(sliding_window - 1, sliding_window - 1)``, as transformers' own
  flash-attention integration), ``softcap`` and grouped-query attention natively (k/v with
  fewer heads).
- Padding: the mask samattn registers is the flash-attention style one (None when no token
  is padded, else the (batch, kv_len) boolean keep-mask), so a padded batch is unpadded and
  served by ``samattn.flash_attn_varlen_func`` (the padded lengths serve as the maxima, so
  no device-to-host copy of the longest length; finding the kept rows waits for the GPU
  once for the queries and once for the keys per forward, shared by the layers), and the
  output re-padded with zeros at the padded query rows.
- Padding-free packed batches (batch 1, several sequences whose ``position_ids`` restart at
  0, or ``cu_seq_lens_q/k`` and ``max_length_q/k`` from ``DataCollatorWithFlattening``):
  varlen as well, so sequences do not attend to each other. Detecting restarts in
  ``position_ids`` costs one device-to-host copy per forward (shared by the layers).
- ``model.generate()``: every prefill and every decode step runs samattn. With the default
  DynamicCache a decode step's query (one token, or a few) arrives with the whole cache as
  its keys: ``samattn.flash_attn_func`` with the bottom-right causal alignment (the library
  routes such decode shapes to its split-KV kernel), or for a left-padded batch (as
  generation wants) ``samattn.flash_attn_with_kvcache`` on the caches in place, each
  sequence's padding skipped through ``cache_leftpad`` (one device-to-host copy per step,
  shared by the layers, to find it). With a static cache (``cache_implementation="static"``)
  the mask covers the tokens seen so far and the cache's later, unused slots are left out
  through ``cache_seqlens``. A padded decode step that needs a gradient or dropout, whose
  padding is not only on the left, or whose caches the kernels cannot read in place (head
  dim not a multiple of 8) gathers the kept rows and runs ``flash_attn_varlen_func``.
- A 4-D mask (made by the caller, or by code that builds its own): when it is only key
  padding plus the causal mask (and the layer's sliding window), the same for every head,
  bool or additive, it is turned into the keep-mask above and runs as such (up to three
  device-to-host copies per forward, shared by the layers). Any other 4-D mask (custom or
  prefix masks), bool (True: attend) or additive, (batch or 1, heads or 1, q_len,
  kv_len): ``samattn.flash_attn_func(attn_mask=...)``, the kernels reading the mask. As in
  transformers' SDPA attention that mask alone decides what a query sees (the layer's
  causality and sliding window are not added to it); the kernels compute every (query,
  key) tile, so a causal mask given this way costs the work of a full square.
- A position bias (``position_bias``: T5's relative attention bias, and the other models
  that pass one to the attention function): added to the scores as an additive mask, the
  padding or 4-D mask folded in as transformers' SDPA attention folds it, with the
  layer's causality and window when no 4-D mask is given; its gradient flows back (the
  learned relative bias trains).
- ``count_calls()`` counts which of these routes each call took (prefill or decode step, and
  "fixed", "varlen", "kvcache", "packed" or "mask"), e.g. to check that no decode step took an
  unexpected route.
- Attention dropout (``config.attention_dropout`` in training): ``dropout_p`` on every
  route above, in samattn's kernels (docs/attention_dropout.md).
- Attention sinks: models whose attention layers have learnable sinks (gpt-oss, and the
  others that pass ``s_aux`` to the attention function) run them in samattn's kernels
  (``sinks=``, float32: a bf16 parameter is cast, and its gradient cast back by autograd),
  on every route above, a 4-D mask's included.
- ALiBi: transformers' ALiBi models (BLOOM, MPT, Falcon with ``alibi=True``) build the bias
  into their own attention code and never call the attention interface, so samattn cannot
  serve them through ``attn_implementation``; ``samattn.flash_attn_func(alibi_slopes=...)``
  serves code that calls flash-attn directly.

Attention weights are never returned (``output_attentions=True`` gives None, as with
flash attention).
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

import samattn
from samattn._checks import cache_layout_problem, needs_grad

NAME = "samattn"
MIN_TRANSFORMERS = (4, 56)

__all__ = [
    "MIN_TRANSFORMERS",
    "NAME",
    "attention_forward",
    "attention_mask",
    "count_calls",
    "register",
]

Tensor = torch.Tensor


def _version_tuple(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit()) or "0"
        numbers.append(int(digits))
    return tuple(numbers)


def register() -> str:
    """Registers samattn's attention (and its mask format) with transformers, so that
    ``attn_implementation="samattn"`` selects it. Idempotent; returns ``"samattn"``.

    Raises:
        ImportError: transformers is not installed, or older than MIN_TRANSFORMERS.
    """
    needed = ".".join(map(str, MIN_TRANSFORMERS))
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            f"samattn.integrations.transformers needs transformers >= {needed} "
            f"(pip install 'transformers>={needed}'); it is not installed"
        ) from error
    version = getattr(transformers, "__version__", "0")
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:
        raise ImportError(
            f"samattn.integrations.transformers needs transformers >= {needed}, found "
            f"{version} (no AttentionInterface / AttentionMaskInterface)"
        ) from error
    if _version_tuple(version) < MIN_TRANSFORMERS:
        raise ImportError(
            f"samattn.integrations.transformers needs transformers >= {needed}, found {version}"
        )
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, attention_mask)
    return NAME


# ------------------------------------------------------------------ mask ----
def attention_mask(
    batch_size: int,
    q_length: int | None = None,
    kv_length: int = 0,
    q_offset: int | Tensor = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Tensor | None = None,
    **kwargs: Any,
) -> Tensor | None:
    """transformers' mask builder for samattn: None unless some key is padded, else the
    (batch, seen tokens) boolean keep-mask (the flash-attention format). Causality and the
    sliding window are not in the mask: attention_forward gets them from the model.

    A static cache (kv_length, its size, beyond the q_offset + q_length tokens seen) under
    the plain causal mask function gets a mask of the seen tokens even without padding:
    attention_forward takes the cache's slots after them as padding."""
    if attention_mask is None:
        # Only a plain causal mask of a static cache; not, e.g., cross-attention, whose keys
        # outnumber the queries too.
        if mask_function is None or mask_function is not _causal_mask_function():
            return None
        seen = None if q_length is None else int(q_offset) + q_length
        device = kwargs.get("device")
        if seen is None or device is None or kv_offset != 0 or seen >= kv_length:
            return None
        return torch.ones(batch_size, seen, dtype=torch.bool, device=device)
    attention_mask = attention_mask[:, -kv_length:]  # sliding-window caches keep the end
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


def _causal_mask_function() -> Any:
    """transformers' plain causal mask function (None if it has none)."""
    masking_utils = sys.modules.get("transformers.masking_utils")
    return getattr(masking_utils, "causal_mask_function", None)


# -------------------------------------------------------------- forward ----
_counts: collections.Counter[str] | None = None


@contextlib.contextmanager
def count_calls() -> Iterator[collections.Counter[str]]:
    """Counts the routes attention_forward takes inside the block (a debugging and test
    hook; off otherwise, at the cost of one global read per call).

    Yields a collections.Counter keyed "PHASE:ROUTE": PHASE "prefill" (as many queries as
    tokens seen) or "decode" (the queries follow tokens in a KV cache); ROUTE "fixed"
    (samattn.flash_attn_func), "varlen" (padded, samattn.flash_attn_varlen_func), "kvcache"
    (a left-padded decode step, samattn.flash_attn_with_kvcache on the caches), "packed"
    (padding-free packed sequences, varlen) or "mask" (a 4-D mask or a position bias read
    by the kernels, samattn.flash_attn_func with attn_mask). Counts every thread's calls;
    blocks do not nest (the inner one counts alone).

        with samattn.integrations.transformers.count_calls() as counts:
            model.generate(ids, max_new_tokens=8)
        assert counts["decode:mask"] == 0 and counts["decode:fixed"] > 0
    """
    global _counts
    previous, _counts = _counts, collections.Counter()
    try:
        yield _counts
    finally:
        _counts = previous


def _count(phase: str, route: str) -> None:
    counts = _counts
    if counts is not None:
        counts[f"{phase}:{route}"] += 1


class _PerTensorCache:
    """compute(tensor, *args) for the last few tensors seen: every layer of one forward gets
    the same position_ids / mask tensor (or one of two, in models that alternate sliding and
    full layers), so the work (and its device-to-host copy) happens once per forward. Keyed
    by the tensor's identity and version, and by args."""

    def __init__(self, compute: Callable[..., Any], size: int = 4) -> None:
        self._compute = compute
        self._size = size
        self._lock = threading.Lock()
        self._entries: list[tuple[weakref.ref, int, tuple, Any]] = []

    def __call__(self, tensor: Tensor, *args: Any) -> Any:
        with self._lock:
            for ref, version, key_args, value in self._entries:
                if ref() is tensor and version == tensor._version and key_args == args:
                    return value
        value = self._compute(tensor, *args)
        with self._lock:
            entry = (weakref.ref(tensor), tensor._version, args, value)
            self._entries = [entry, *self._entries[: self._size - 1]]
        return value


def _packed_cu_seqlens(position_ids: Tensor) -> tuple[Tensor, int] | None:
    """(cu_seqlens int32, max_seqlen) if position_ids (1, total) restart at 0 inside, i.e.
    pack several sequences; None for one sequence."""
    positions = position_ids.reshape(-1)
    total = positions.numel()
    starts = (positions == 0).nonzero().reshape(-1).to(torch.int32)
    if starts.numel() == 0 or starts[0].item() != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    if starts.numel() <= 1:
        return None
    cu = torch.cat([starts, starts.new_full((1,), total)])
    return cu, int((cu[1:] - cu[:-1]).max().item())


_packing = _PerTensorCache(_packed_cu_seqlens)


def _keep_from_4d_mask(
    mask: Tensor, batch: int, q_len: int, kv_len: int, causal: bool, left: int
) -> tuple[bool, Tensor | None]:
    """Whether a 4-D mask (batch or 1, 1, q_len, kv_len), bool (True: attend) or additive (0
    or very negative), is only key padding plus, when causal, the bottom-right causal mask
    (and the sliding window of `left` keys, when >= 0), the same for every head: what the
    varlen route runs without reading a mask. Returns (True, the (batch, kv_len) keep-mask,
    or None when nothing is padded) if so, else (False, None). Up to three device-to-host
    copies, once per forward (shared by the layers)."""
    if mask.dim() != 4 or mask.shape[1] != 1 or tuple(mask.shape[-2:]) != (q_len, kv_len):
        return False, None
    if mask.shape[0] not in (1, batch):
        return False, None
    mask = mask[:, 0].expand(batch, q_len, kv_len)
    if mask.dtype == torch.bool:
        allowed = mask
    else:
        allowed = mask == 0
        blocked = mask <= torch.finfo(mask.dtype).min / 2
        if not bool((allowed | blocked).all()):  # an additive bias, not a mask
            return False, None
    # The keys some query sees. A key that no query sees (older than every query's window)
    # is dropped with the padding: a prefix, so the bottom-right alignment is kept.
    keep = allowed.any(dim=1)
    rows = torch.arange(q_len, device=mask.device)[:, None] + (kv_len - q_len)
    columns = torch.arange(kv_len, device=mask.device)[None, :]
    visible = torch.ones(q_len, kv_len, dtype=torch.bool, device=mask.device)
    if causal:
        visible &= columns <= rows
    if left >= 0:
        visible &= columns >= rows - left
    if not torch.equal(allowed, keep[:, None, :] & visible):
        return False, None
    return True, None if bool(keep.all()) else keep


_mask_4d = _PerTensorCache(_keep_from_4d_mask)


def _unpadding_of(keep: Tensor, q_len: int, kv_len: int) -> tuple[Tensor, ...]:
    """For a (batch, seen) keep-mask over keys (batch, kv_len) and the last q_len tokens as
    queries: the flat indices of the kept query rows and key rows, their cu_seqlens (int32,
    (batch + 1,)), and the seen length. A keep-mask shorter than the keys comes from a
    static cache, whose slots after the seen tokens are unused: they count as padding. Two
    device-to-host copies (finding the rows), once per forward: shared by the layers, which
    then also share one value check of the cu_seqlens."""
    keep = keep.to(torch.bool)
    keep_q = keep[:, -q_len:]
    seen = min(keep.shape[1], kv_len)
    if keep.shape[1] < kv_len:
        keep = F.pad(keep, (0, kv_len - keep.shape[1]), value=False)
    elif keep.shape[1] > kv_len:
        keep = keep[:, -kv_len:]
    q_indices = keep_q.reshape(-1).nonzero().reshape(-1)
    k_indices = keep.reshape(-1).nonzero().reshape(-1)
    return q_indices, k_indices, _cu_seqlens(keep_q), _cu_seqlens(keep), seen


_unpadding = _PerTensorCache(_unpadding_of)


def _rows(x: Tensor, indices: Tensor) -> Tensor:
    """The rows `indices` of x (batch, seq, heads, d) flattened to (batch * seq, heads, d)."""
    return x.reshape(-1, *x.shape[2:]).index_select(0, indices)


def _cu_seqlens(keep: Tensor) -> Tensor:
    """keep (batch, seq) bool -> cu_seqlens (batch + 1,) int32 of the kept rows."""
    return F.pad(keep.sum(-1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))


def _sinks(kwargs: dict) -> Tensor | None:
    """The layer's attention sinks (``s_aux``: one logit per query head, in the model's
    dtype) as samattn takes them, float32; differentiable (autograd casts the gradient
    back to the parameter's dtype)."""
    sinks = kwargs.get("s_aux")
    if sinks is None:
        return None
    sinks = sinks.reshape(-1)
    return sinks if sinks.dtype == torch.float32 else sinks.float()


def attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention function for ``attn_implementation="samattn"``.

    Args:
        module: the attention layer (its ``is_causal`` gives causality unless ``is_causal``
            is passed).
        query: (batch, heads, q_len, head_dim); key, value: (batch, kv_heads, kv_len,
            head_dim), heads a multiple of kv_heads; float16 or bfloat16 on CUDA.
        attention_mask: None, the (batch, seen tokens) bool keep-mask of attention_mask()
            (seen tokens <= kv_len: a static cache's unused slots follow), or a 4-D mask
            (bool or additive), read by the kernels as the only mask (as transformers'
            SDPA attention reads it).
        dropout: attention dropout (transformers passes the config's attention_dropout
            in training, 0 in eval), run in samattn's kernels on every route.
        scaling: the softmax scale (default head_dim ** -0.5).
        sliding_window: each query sees the last sliding_window keys (itself included).
        softcap: > 0 caps scores at softcap * tanh(score / softcap).
        kwargs: position_ids, cu_seq_lens_q/k, max_length_q/k (padding-free batches),
            deterministic, s_aux (attention sinks, (heads,): gpt-oss and others),
            position_bias (an additive bias, (batch or 1, heads, q_len, kv_len): T5 and
            others); others are ignored.

    Returns:
        (attn_output (batch, q_len, heads, head_dim), None).
    """
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    options: dict[str, Any] = {"softmax_scale": scaling, "causal": causal}
    if dropout:
        options["dropout_p"] = float(dropout)
    sinks = _sinks(kwargs)
    if sinks is not None:
        options["sinks"] = sinks
    if sliding_window is not None and sliding_window > 0:
        options["window_size"] = (sliding_window - 1, sliding_window - 1)
    if softcap:
        options["softcap"] = float(softcap)
    if kwargs.get("deterministic") is not None:
        options["deterministic"] = bool(kwargs["deterministic"])
    batch, q_len, kv_len = q.shape[0], q.shape[1], k.shape[1]
    # Decode: the queries follow tokens already in the cache. (A 2-D keep-mask covers the
    # tokens seen so far, which a static cache's keys outnumber.)
    seen = kv_len if attention_mask is None else min(attention_mask.shape[-1], kv_len)
    phase = "decode" if q_len < seen else "prefill"

    position_bias = kwargs.get("position_bias")
    if position_bias is None and attention_mask is not None and attention_mask.dim() == 4:
        # A 4-D mask that is only padding plus the causal mask and window takes the
        # varlen / fixed routes below, which skip masked tiles and read no mask.
        left = options.get("window_size", (-1, -1))[0]
        expressible, keep = _mask_4d(attention_mask, batch, q_len, kv_len, causal, left)
        if expressible:
            attention_mask = keep
    if position_bias is not None or (attention_mask is not None and attention_mask.dim() == 4):
        _count(phase, "mask")
        if attention_mask is not None and attention_mask.dim() == 4:
            # The mask holds the causality and the sliding window (transformers' SDPA
            # attention reads it alone too).
            options["causal"] = False
            options.pop("window_size", None)
        mask = _kernel_mask(attention_mask, position_bias, kv_len)
        return samattn.flash_attn_func(q, k, v, attn_mask=mask, **options), None
    if attention_mask is not None:  # (batch, seen tokens) keep-mask: some keys are padding
        if phase == "decode" and _cache_route_fits(q, k, v, options, sinks):
            leftpad = _left_padding(attention_mask, q_len, kv_len)
            if leftpad is not None:
                _count(phase, "kvcache")
                return _cache_attention(q, k, v, attention_mask, leftpad, options), None
        _count(phase, "varlen")
        return _padded_attention(q, k, v, attention_mask, options), None

    packed = _packed_sequences(kwargs, batch, q_len, kv_len)
    if packed is not None:
        _count(phase, "packed")
        (cu_q, max_q), (cu_k, max_k) = packed
        out = samattn.flash_attn_varlen_func(
            q.reshape(-1, *q.shape[2:]),
            k.reshape(-1, *k.shape[2:]),
            v.reshape(-1, *v.shape[2:]),
            cu_q,
            cu_k,
            max_q,
            max_k,
            **options,
        )
        return out.view(batch, q_len, *out.shape[1:]), None
    _count(phase, "fixed")
    return samattn.flash_attn_func(q, k, v, **options), None


def _kernel_mask(
    attention_mask: Tensor | None, position_bias: Tensor | None, kv_len: int
) -> Tensor:
    """The attn_mask samattn's kernels read for a 4-D mask and / or a position bias (T5's
    relative bias and other models' additive biases, (batch or 1, heads, q_len, kv_len)):
    the mask as it is (bool: True = attend; or additive), or the bias with the mask folded
    in as transformers' SDPA attention folds it (-inf where a bool or keep-mask masks, a
    float mask added). A (batch, seen tokens) keep-mask becomes (batch, 1, 1, kv_len), a
    static cache's slots after the seen tokens masked. The bias keeps its gradient."""
    mask = attention_mask
    if mask is not None and mask.dim() == 2:
        keep = mask.to(torch.bool)
        if keep.shape[1] < kv_len:
            keep = F.pad(keep, (0, kv_len - keep.shape[1]), value=False)
        mask = keep[:, None, None, -kv_len:]
    if position_bias is None:
        return mask
    if mask is None:
        return position_bias
    if mask.dtype == torch.bool:
        return torch.where(mask, position_bias, position_bias.new_tensor(float("-inf")))
    return position_bias + mask


def _padded_attention(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor, options: dict[str, Any]
) -> Tensor:
    """flash_attn_varlen_func on the kept rows: q (batch, q_len, heads, d), k, v (batch,
    kv_len, kv_heads, d), keep (batch, seen) with True for the tokens that are not padding.
    The queries are the last q_len seen tokens (the rows found once per forward:
    _unpadding_of). The maxima passed are the padded lengths (bounds, as the function
    allows: no device-to-host copy for them). Padded query rows of the output are zeros."""
    batch, q_len, kv_len = q.shape[0], q.shape[1], k.shape[1]
    q_indices, k_indices, cu_q, cu_k, seen = _unpadding(keep, q_len, kv_len)
    out = samattn.flash_attn_varlen_func(
        _rows(q, q_indices), _rows(k, k_indices), _rows(v, k_indices), cu_q, cu_k, q_len, seen,
        **options,
    )  # fmt: skip
    padded = out.new_zeros(batch * q_len, *out.shape[1:]).index_copy(0, q_indices, out)
    return padded.view(batch, q_len, *out.shape[1:])


def _left_padding_of(keep: Tensor, q_len: int, kv_len: int) -> Tensor | None:
    """The (batch,) int32 count of leading padded tokens when keep (batch, seen) is left
    padding only (each row False... True...) and every row keeps at least its q_len
    queries, else None. One device-to-host copy (once per forward: shared by the layers)."""
    keep = keep.to(torch.bool)
    if keep.shape[1] > kv_len:
        keep = keep[:, -kv_len:]
    seen = keep.shape[1]
    kept = keep.sum(-1, dtype=torch.int32)
    leftpad = seen - kept
    columns = torch.arange(seen, device=keep.device, dtype=torch.int32)
    left_only = (keep == (columns[None, :] >= leftpad[:, None])).all() & (kept >= q_len).all()
    return leftpad if bool(left_only) else None


_left_padding = _PerTensorCache(_left_padding_of)


def _cache_route_fits(
    q: Tensor, k: Tensor, v: Tensor, options: dict[str, Any], sinks: Tensor | None
) -> bool:
    """Whether a padded decode step can read the keys and values in place with
    flash_attn_with_kvcache: inference only (no dropout, nothing for autograd to record),
    and caches it reads without copying them (the library's cache layout rule, and 16-byte
    aligned)."""
    if options.get("dropout_p") or needs_grad(q, k, v, sinks):
        return False
    return all(
        cache_layout_problem(name, cache) is None and cache.data_ptr() % 16 == 0
        for name, cache in (("k", k), ("v", v))
    )


def _cache_attention(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor, leftpad: Tensor, options: dict[str, Any]
) -> Tensor:
    """A left-padded decode step on the caches in place: sequence b's keys are rows
    leftpad[b] to seen - 1 of k and v (batch, kv_len, kv_heads, d), seen the keep-mask's
    length (a static cache's later slots unused), with the queries (batch, q_len, heads, d)
    its last q_len tokens (bottom-right causal alignment, as on the varlen route). No rows
    are gathered: the varlen route would copy every layer's keys and values each step."""
    seen = min(keep.shape[1], k.shape[1])
    names = ("softmax_scale", "causal", "window_size", "softcap", "sinks")
    kwargs = {name: options[name] for name in names if name in options}
    return samattn.flash_attn_with_kvcache(
        q, k, v, cache_seqlens=seen, cache_leftpad=leftpad, **kwargs
    )


def _packed_sequences(
    kwargs: dict, batch: int, q_len: int, kv_len: int
) -> tuple[tuple[Tensor, int], tuple[Tensor, int]] | None:
    """((cu_seqlens_q, max_q), (cu_seqlens_k, max_k)) for a padding-free packed batch,
    else None."""
    names = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    if all(kwargs.get(name) is not None for name in names):
        cu_q, cu_k, max_q, max_k = (kwargs[name] for name in names)
        return (cu_q.to(torch.int32), int(max_q)), (cu_k.to(torch.int32), int(max_k))
    position_ids = kwargs.get("position_ids")
    if position_ids is None or batch != 1 or q_len != kv_len or position_ids.numel() != q_len:
        return None
    found = _packing(position_ids)
    return None if found is None else (found, found)
