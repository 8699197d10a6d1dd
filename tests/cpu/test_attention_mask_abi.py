"""The C ABI's attention-mask fields (ABI 6): what samattn_attention_forward and _backward
refuse before touching a device, and what they accept (those calls reach the device
check, which fails here: no GPU)."""

from __future__ import annotations

import pytest
from cpu_helpers import (
    FAKE,
    VARLEN,
    attention_args,
    backward_args,
    call_backward,
    call_forward,
    has_gpu,
)

from samattn import _lib

MASK = 0x70000  # never dereferenced; 16-byte aligned
# A (batch, heads, seqlen_q, seqlen_k) float mask with contiguous keys.
ADDITIVE = dict(
    attn_mask=MASK, mask_dtype=_lib.F32, mask_batch_stride=4 * 8 * 16, mask_head_stride=8 * 16,
    mask_q_stride=16, mask_k_stride=1,
)  # fmt: skip
KEEP = {**ADDITIVE, "mask_dtype": _lib.BOOL}

BAD_FORWARD = {
    "mask dtype f16": ({**ADDITIVE, "mask_dtype": _lib.F16}, "mask_dtype must be SAMATTN_BOOL or"),
    "mask dtype unknown": ({**ADDITIVE, "mask_dtype": 7}, "mask_dtype must be"),
    "mask with varlen": ({**ADDITIVE, **VARLEN}, "attn_mask is for fixed-length calls only"),
    "mask with a cache": ({**ADDITIVE, "seqused_k": FAKE, "kv_cache_batch": 2}, "fixed-length"),
    "float mask misaligned": ({**ADDITIVE, "attn_mask": MASK + 2}, "aligned to its 4-byte"),
    "reserved set": ({**KEEP, "mask_reserved": 1}, "mask_reserved 0"),
    "negative stride": ({**ADDITIVE, "mask_q_stride": -16}, "must be >= 0 (0 broadcasts)"),
    "keys not contiguous": ({**ADDITIVE, "mask_k_stride": 2}, "contiguous along the keys"),
    "overflow": ({**ADDITIVE, "mask_batch_stride": 2**62}, "overflow a 64-bit byte offset"),
    "dmask in a forward": ({**ADDITIVE, "dmask": MASK + 4096}, "dmask is the backward's"),
    "dmask without a mask": (dict(dmask=MASK), "dmask (the mask's gradient) needs attn_mask"),
}


@pytest.mark.parametrize("case", BAD_FORWARD)
def test_forward_refuses(case):
    changes, fragment = BAD_FORWARD[case]
    status, _, message = call_forward(attention_args(**changes))
    assert status == _lib.INVALID_ARGUMENT, message
    assert fragment in message, message


BAD_BACKWARD = {
    "dmask of a keep mask": ({**KEEP, "dmask": MASK + 4096}, "dmask is the backward's gradient"),
    "dmask misaligned": ({**ADDITIVE, "dmask": MASK + 4098}, "4-byte aligned fp32"),
    "dmask without a mask": (dict(dmask=MASK), "needs attn_mask"),
}


@pytest.mark.parametrize("case", BAD_BACKWARD)
def test_backward_refuses(case):
    changes, fragment = BAD_BACKWARD[case]
    status, _, message = call_backward(backward_args(**changes))
    assert status == _lib.INVALID_ARGUMENT, message
    assert fragment in message, message


# With a GPU these calls would launch kernels on the fake pointers.
@pytest.mark.skipif(has_gpu(), reason="checks the no-GPU path")
@pytest.mark.parametrize(
    "changes",
    [
        ADDITIVE,
        KEEP,
        # Broadcast over batch and heads, one key (any key stride).
        {**KEEP, "mask_batch_stride": 0, "mask_head_stride": 0, "seqlen_k": 1, "mask_k_stride": 5},
        {**ADDITIVE, "alibi_slopes": FAKE, "sinks": FAKE + 64, "causal": 1, "softcap": 30.0},
    ],
    ids=["additive", "keep", "broadcast, one key", "with ALiBi, sinks, causal, softcap"],
)
def test_valid_masks_reach_the_device(changes):
    status, _, message = call_forward(attention_args(**changes))
    assert status == _lib.CUDA_ERROR and "no CUDA device" in message, message
    status, _, message = call_backward(backward_args(**changes))
    assert status == _lib.CUDA_ERROR and "no CUDA device" in message, message


@pytest.mark.skipif(has_gpu(), reason="checks the no-GPU path")
def test_backward_accepts_dmask_of_an_additive_mask():
    status, _, message = call_backward(backward_args(**ADDITIVE, dmask=MASK + 4096))
    assert status == _lib.CUDA_ERROR and "no CUDA device" in message, message
