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
  served by ``samattn.flash_attn_varlen_func`` (one device-to-host copy of the longest length
  per layer), and the output re-padded with zeros at the padded query rows.
- Padding-free packed batches (batch 1, several sequences whose ``position_ids`` restart at
  0, or ``cu_seq_lens_q/k`` and ``max_length_q/k`` from ``DataCollatorWithFlattening``):
  varlen as well, so sequences do not attend to each other. Detecting restarts in
  ``position_ids`` costs one device-to-host copy per forward (shared by the layers).
- A 4-D mask made by the caller (a custom mask passed to the model): torch's
  ``scaled_dot_product_attention`` with that mask, with a one-time warning.
- ``dropout > 0`` (training with ``config.attention_dropout > 0``): NotImplementedError,
  as samattn has no attention dropout yet; set ``attention_dropout=0.0`` in the config.
  Attention sinks (``s_aux``) raise NotImplementedError too.

Attention weights are never returned (``output_attentions=True`` gives None, as with
flash attention).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
import torch.nn.functional as F

import samattn
from samattn._warnings import warn_once as _samattn_warn_once

NAME = "samattn"
MIN_TRANSFORMERS = (4, 56)

__all__ = ["MIN_TRANSFORMERS", "NAME", "attention_forward", "attention_mask", "register"]

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
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Tensor | None = None,
    **kwargs: Any,
) -> Tensor | None:
    """transformers' mask builder for samattn: None unless some key is padded, else the
    (batch, kv_length) boolean keep-mask (the flash-attention format). Causality and the
    sliding window are not in the mask: attention_forward gets them from the model."""
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]  # sliding-window caches keep the end
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask


# -------------------------------------------------------------- forward ----
def _warn_once(message: str) -> None:
    _samattn_warn_once(f"samattn attention for transformers: {message}", stacklevel=3)


class _PackingCache:
    """The sequence starts found in the last position_ids tensor: every layer of one forward
    gets the same tensor, so the device-to-host copy happens once per forward."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple = ()
        self._value: tuple[Tensor, int] | None = None

    def cu_seqlens(self, position_ids: Tensor) -> tuple[Tensor, int] | None:
        """(cu_seqlens int32, max_seqlen) if position_ids (1, total) restart at 0 inside,
        i.e. pack several sequences; None for one sequence."""
        with self._lock:
            ref, version = self._key or (None, None)
            if ref is not None and ref() is position_ids and version == position_ids._version:
                return self._value
        positions = position_ids.reshape(-1)
        total = positions.numel()
        starts = (positions == 0).nonzero().reshape(-1).to(torch.int32)
        if starts.numel() == 0 or starts[0].item() != 0:
            starts = torch.cat([starts.new_zeros(1), starts])
        if starts.numel() <= 1:
            value = None
        else:
            cu = torch.cat([starts, starts.new_full((1,), total)])
            value = (cu, int((cu[1:] - cu[:-1]).max().item()))
        with self._lock:
            self._key = (weakref.ref(position_ids), position_ids._version)
            self._value = value
        return value


_packing = _PackingCache()


def _unpad(x: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """x (batch, seq, heads, d) and keep (batch, seq) bool -> the kept rows packed as
    (total, heads, d), and their flat indices."""
    indices = keep.reshape(-1).nonzero().reshape(-1)
    return x.reshape(-1, *x.shape[2:]).index_select(0, indices), indices


def _cu_seqlens(keep: Tensor) -> tuple[Tensor, int]:
    lengths = keep.sum(-1, dtype=torch.int32)
    cu = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return cu, int(lengths.max().item())


def _check_supported(module: torch.nn.Module, dropout: float, kwargs: dict) -> None:
    if dropout > 0.0:
        raise NotImplementedError(
            f"samattn attention for transformers: attention dropout ({dropout}) is not "
            "implemented in samattn; set the model config's attention_dropout to 0.0 "
            f"(layer {type(module).__name__}) or use another attn_implementation"
        )
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError(
            "samattn attention for transformers: attention sinks (s_aux) are not implemented"
        )


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
        attention_mask: None, the (batch, kv_len) bool keep-mask of attention_mask(), or a
            4-D mask made by the caller (then torch's SDPA runs it, warning once).
        dropout: must be 0.0 (NotImplementedError otherwise).
        scaling: the softmax scale (default head_dim ** -0.5).
        sliding_window: each query sees the last sliding_window keys (itself included).
        softcap: > 0 caps scores at softcap * tanh(score / softcap).
        kwargs: position_ids, cu_seq_lens_q/k, max_length_q/k (padding-free batches),
            deterministic; others are ignored.

    Returns:
        (attn_output (batch, q_len, heads, head_dim), None).
    """
    _check_supported(module, dropout, kwargs)
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    options: dict[str, Any] = {"softmax_scale": scaling, "causal": causal}
    if sliding_window is not None and sliding_window > 0:
        options["window_size"] = (sliding_window - 1, sliding_window - 1)
    if softcap:
        options["softcap"] = float(softcap)
    if kwargs.get("deterministic") is not None:
        options["deterministic"] = bool(kwargs["deterministic"])
    batch, q_len = q.shape[0], q.shape[1]

    if attention_mask is not None and attention_mask.dim() == 4:
        return _custom_mask_attention(query, key, value, attention_mask, scaling, softcap), None
    if attention_mask is not None:  # (batch, kv_len) keep-mask: some keys are padding
        keep_k = attention_mask.to(torch.bool)
        keep_q = keep_k[:, -q_len:]
        q_packed, q_indices = _unpad(q, keep_q)
        k_packed, _ = _unpad(k, keep_k)
        v_packed, _ = _unpad(v, keep_k)
        cu_q, max_q = _cu_seqlens(keep_q)
        cu_k, max_k = _cu_seqlens(keep_k)
        out = samattn.flash_attn_varlen_func(
            q_packed, k_packed, v_packed, cu_q, cu_k, max_q, max_k, **options
        )
        padded = out.new_zeros(batch * q_len, *out.shape[1:]).index_copy(0, q_indices, out)
        return padded.view(batch, q_len, *out.shape[1:]), None

    packed = _packed_sequences(kwargs, batch, q_len, k.shape[1])
    if packed is not None:
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
    return samattn.flash_attn_func(q, k, v, **options), None


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
    found = _packing.cu_seqlens(position_ids)
    return None if found is None else (found, found)


def _custom_mask_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor,
    scaling: float | None,
    softcap: float | None,
) -> Tensor:
    """torch's SDPA under a caller-made 4-D mask (bool: True = attend, or additive)."""
    if softcap:
        raise NotImplementedError(
            "samattn attention for transformers: softcap with a custom 4-D attention mask"
        )
    _warn_once(
        "a custom 4-D attention mask runs torch.nn.functional.scaled_dot_product_attention "
        "(samattn's kernels take causal / sliding-window / padding masks only)"
    )
    group = query.shape[1] // key.shape[1]
    if group > 1:
        key = key.repeat_interleave(group, dim=1)
        value = value.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2)
