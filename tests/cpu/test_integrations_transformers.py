"""samattn.integrations.transformers without a GPU: registration, and a tiny Llama whose
attention runs through the integration with samattn's kernels replaced by a torch
reference, so that what is checked is the translation of transformers' arguments (layout,
GQA, causality, scale, window, padding, packed sequences). Skipped without transformers."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import samattn  # noqa: E402
from samattn.integrations import transformers as integration  # noqa: E402


def reference_attention(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, deterministic=False):  # fmt: skip
    """flash_attn_func's contract on torch's math: (batch, seq, heads, d), GQA, bottom-right
    causal, (left, right) window."""
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    left, right = window_size
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if causal or right >= 0:
        visible &= j <= i + (0 if causal else right)
    if left >= 0:
        visible &= j >= i - left
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2).repeat_interleave(group, 1),
        v.transpose(1, 2).repeat_interleave(group, 1),
        attn_mask=visible,
        scale=softmax_scale,
    )
    return out.transpose(1, 2)


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **options):
    assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32
    lengths_q = (cu_q[1:] - cu_q[:-1]).tolist()
    assert max(lengths_q) == max_q and max((cu_k[1:] - cu_k[:-1]).tolist()) == max_k
    out = torch.full_like(q, float("nan"))
    for b in range(len(lengths_q)):
        rows_q, rows_k = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        out[rows_q] = reference_attention(
            q[None, rows_q], k[None, rows_k], v[None, rows_k], **options
        )[0]
    return out


@pytest.fixture
def calls(monkeypatch):
    """samattn's attention functions replaced by the references; the calls are recorded."""
    log = []

    def fixed(q, k, v, **options):
        log.append(("fixed", tuple(q.shape), tuple(k.shape), options))
        return reference_attention(q, k, v, **options)

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, **options):
        log.append(("varlen", cu_q.tolist(), cu_k.tolist(), options))
        return reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **options)

    monkeypatch.setattr(samattn, "flash_attn_func", fixed)
    monkeypatch.setattr(samattn, "flash_attn_varlen_func", varlen)
    return log


def tiny_config(model_type="llama", **extra):
    config_class = transformers.AutoConfig.for_model(model_type).__class__
    return config_class(
        num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, intermediate_size=256, max_position_embeddings=256, **extra,
    )  # fmt: skip


def model_pair(model_type="llama", **extra):
    """The same random model with attn_implementation "samattn" and "sdpa" (one config
    object each: transformers writes the implementation into the config)."""
    integration.register()
    torch.manual_seed(0)
    model_class = transformers.AutoModelForCausalLM
    ours = model_class.from_config(tiny_config(model_type, **extra), attn_implementation="samattn")
    theirs = model_class.from_config(tiny_config(model_type, **extra), attn_implementation="sdpa")
    theirs.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == "samattn"
    return ours.eval(), theirs.eval()


# ------------------------------------------------------------ register ----
def test_register_is_idempotent():
    assert integration.register() == "samattn"
    assert integration.register() == "samattn"
    functions = transformers.AttentionInterface._global_mapping
    masks = transformers.masking_utils.AttentionMaskInterface._global_mapping
    assert functions["samattn"] is integration.attention_forward
    assert masks["samattn"] is integration.attention_mask


def test_register_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    with pytest.raises(ImportError, match=r"needs transformers >= \d+\.\d+"):
        integration.register()


def test_register_with_an_old_transformers(monkeypatch):
    # The version register() reads is that of the module `import transformers` gives now,
    # which need not be the one imported at the top of this file: the first model built
    # imports transformers.processing_utils, which re-executes transformers/__init__.py
    # (direct_transformers_import) and so puts a new module object in sys.modules. Import
    # it first, so that this test sees the same whatever ran before it.
    importlib.import_module("transformers.processing_utils")
    monkeypatch.setattr(importlib.import_module("transformers"), "__version__", "4.40.0")
    with pytest.raises(ImportError, match=r"found 4\.40\.0"):
        integration.register()


# --------------------------------------------------------------- model ----
def test_logits_match_sdpa(calls):
    ours, theirs = model_pair()
    ids = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        expected = theirs(ids).logits
        got = ours(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert len(calls) == 2  # one per layer, all on the fixed-length path
    kind, q_shape, k_shape, options = calls[0]
    assert (kind, q_shape, k_shape) == ("fixed", (2, 24, 4, 32), (2, 24, 2, 32))  # GQA kept
    assert options["causal"] is True and "window_size" not in options
    assert options["softmax_scale"] == pytest.approx(32**-0.5)


def test_padding_runs_varlen(calls):
    ours, theirs = model_pair()
    ids = torch.randint(0, 256, (3, 16))
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[0, :5] = 0  # left padding
    mask[2, 12:] = 0  # right padding
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], expected[keep], rtol=1e-4, atol=1e-5)
    assert calls[0][:3] == ("varlen", [0, 11, 27, 39], [0, 11, 27, 39])


def test_packed_sequences_do_not_see_each_other(calls):
    ours, theirs = model_pair()
    ids = torch.randint(0, 256, (1, 20))
    position_ids = torch.tensor([[*range(7), *range(13)]])
    with torch.no_grad():
        got = ours(ids, position_ids=position_ids).logits
        expected = torch.cat([theirs(ids[:, :7]).logits, theirs(ids[:, 7:]).logits], dim=1)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert [call[:3] for call in calls] == [("varlen", [0, 7, 20], [0, 7, 20])] * 2


def test_generation_with_cache_matches_sdpa(calls):
    ours, theirs = model_pair()
    ids = torch.randint(0, 256, (2, 8))
    options = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        expected = theirs.generate(ids, **options)
        got = ours.generate(ids, **options)
    assert torch.equal(got, expected)
    decode_steps = [call for call in calls if call[0] == "fixed" and call[1][1] == 1]
    assert decode_steps and all(call[2][1] > 1 for call in decode_steps)  # q 1 row, k all


def test_sliding_window(calls):
    ours, theirs = model_pair("mistral", sliding_window=6)
    ids = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        expected = theirs(ids).logits
        got = ours(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert calls[0][3]["window_size"] == (5, 5) and calls[0][3]["causal"] is True


def test_training_step_gradients_match(calls):
    ours, theirs = model_pair()
    ours.train()
    theirs.train()
    ids = torch.randint(0, 256, (2, 16))
    for model in (ours, theirs):
        model(ids, labels=ids).loss.backward()
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_dropout_is_refused(calls):
    integration.register()
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config(attention_dropout=0.1), attn_implementation="samattn"
    ).train()
    with pytest.raises(NotImplementedError, match="attention_dropout"):
        model(torch.randint(0, 256, (1, 8)))
