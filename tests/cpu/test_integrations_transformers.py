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
                        softcap=0.0, deterministic=False, sinks=None, attn_mask=None):  # fmt: skip
    """flash_attn_func's contract on torch's math: (batch, seq, heads, d), GQA, bottom-right
    causal, (left, right) window, softcap, attention sinks (float32 (heads,)), an attn_mask
    (bool: True = attend, or additive; broadcastable to (batch, heads, sq, sk)). A row that
    sees no key gets zeros, as in samattn."""
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
    if sinks is None and attn_mask is None and not softcap:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2).repeat_interleave(group, 1),
            v.transpose(1, 2).repeat_interleave(group, 1),
            attn_mask=visible,
            scale=softmax_scale,
        )
        return out.transpose(1, 2)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    scores = (qt @ kt.transpose(-1, -2)).float() * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        scores = scores + attn_mask.float()
    elif attn_mask is not None:
        visible = visible & attn_mask
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        assert sinks.dtype == torch.float32 and sinks.shape == (q.shape[2],)
        sink = sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if sinks is not None:
        weights = weights[..., :-1]
    return (weights.to(vt.dtype) @ vt).transpose(1, 2)


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **options):
    assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32
    lengths_q = (cu_q[1:] - cu_q[:-1]).tolist()
    # The maxima bound the lengths (flash_attn_varlen_func's contract), exact or not.
    assert max(lengths_q) <= max_q and max((cu_k[1:] - cu_k[:-1]).tolist()) <= max_k
    assert cu_q[-1] == q.shape[0] and cu_k[-1] == k.shape[0]
    out = torch.full_like(q, float("nan"))
    for b in range(len(lengths_q)):
        rows_q, rows_k = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        out[rows_q] = reference_attention(
            q[None, rows_q], k[None, rows_k], v[None, rows_k], **options
        )[0]
    return out


def reference_kvcache(q, k_cache, v_cache, seqlen, leftpad, **options):
    """flash_attn_with_kvcache without appending: sequence b's keys are cache rows
    leftpad[b] to seqlen - 1."""
    out = torch.full_like(q, float("nan"))
    for b, first in enumerate(leftpad.tolist()):
        rows = slice(first, seqlen)
        out[b] = reference_attention(
            q[b : b + 1], k_cache[b : b + 1, rows], v_cache[b : b + 1, rows], **options
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

    def with_kvcache(q, k_cache, v_cache, cache_seqlens=None, cache_leftpad=None, **options):
        assert isinstance(cache_seqlens, int) and cache_leftpad.dtype == torch.int32
        log.append(("kvcache", cache_leftpad.tolist(), cache_seqlens, options))
        return reference_kvcache(q, k_cache, v_cache, cache_seqlens, cache_leftpad, **options)

    monkeypatch.setattr(samattn, "flash_attn_func", fixed)
    monkeypatch.setattr(samattn, "flash_attn_varlen_func", varlen)
    monkeypatch.setattr(samattn, "flash_attn_with_kvcache", with_kvcache)
    return log


def tiny_config(model_type="llama", **extra):
    config_class = transformers.AutoConfig.for_model(model_type).__class__
    return config_class(
        num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, intermediate_size=256, max_position_embeddings=256, **extra,
    )  # fmt: skip


def model_pair(model_type="llama", reference="sdpa", **extra):
    """The same random model with attn_implementation "samattn" and `reference` (one config
    object each: transformers writes the implementation into the config)."""
    integration.register()
    torch.manual_seed(0)
    model_class = transformers.AutoModelForCausalLM
    ours = model_class.from_config(tiny_config(model_type, **extra), attn_implementation="samattn")
    theirs = model_class.from_config(
        tiny_config(model_type, **extra), attn_implementation=reference
    )
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
        with integration.count_calls() as counts:
            got = ours.generate(ids, **options)
    assert torch.equal(got, expected)
    decode_steps = [call for call in calls if call[0] == "fixed" and call[1][1] == 1]
    assert decode_steps and all(call[2][1] > 1 for call in decode_steps)  # q 1 row, k all
    # One prefill and four decode steps, two layers each, all on flash_attn_func.
    assert counts == {"prefill:fixed": 2, "decode:fixed": 8}
    assert integration._counts is None  # counting stops with the block


def left_padded(batch_lengths, total, seed=0):
    """Token ids and the 2-D mask of a left-padded batch (pad id 0)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 256, (len(batch_lengths), total), generator=generator)
    mask = torch.zeros(len(batch_lengths), total, dtype=torch.long)
    for row, length in enumerate(batch_lengths):
        mask[row, total - length :] = 1
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("cache", [None, "static"], ids=["dynamic", "static"])
def test_padded_generation_runs_samattn_on_every_step(calls, cache):
    """A left-padded batch: the prefill goes to varlen, every decode step to
    flash_attn_with_kvcache on the caches in place (the padding skipped by cache_leftpad),
    nothing to torch; the tokens are sdpa's. A static cache's unused slots count as
    padding."""
    ours, theirs = model_pair()
    ids, mask = left_padded([5, 12, 9], 12)
    options = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    if cache:
        options["cache_implementation"] = cache
    with torch.no_grad():
        expected = theirs.generate(ids, attention_mask=mask, **options)
        with integration.count_calls() as counts:
            got = ours.generate(ids, attention_mask=mask, **options)
    assert torch.equal(got, expected)
    assert counts == {"prefill:varlen": 2, "decode:kvcache": 10}
    decode_calls = [call for call in calls if call[0] == "kvcache"]
    assert len(decode_calls) == 10
    # The last step: 12 + 5 tokens seen, each sequence's padding (12 - its length) skipped.
    assert decode_calls[-1][1:3] == ([7, 0, 3], 17)


def test_unpadded_generation_with_a_static_cache(calls):
    ours, theirs = model_pair()
    ids = torch.randint(1, 256, (1, 10))
    options = {"max_new_tokens": 4, "do_sample": False, "cache_implementation": "static"}
    with torch.no_grad():
        expected = theirs.generate(ids, **options)
        with integration.count_calls() as counts:
            got = ours.generate(ids, **options)
    assert torch.equal(got, expected)
    # The cache's unused slots are left out (varlen in the prefill, cache_seqlens in the
    # decode steps); once full (the last step) the mask is None and flash_attn_func runs.
    assert counts["prefill:varlen"] == 2 and counts["decode:kvcache"] > 0
    assert counts["decode:kvcache"] + counts["decode:fixed"] == 6
    assert counts["prefill:torch"] == counts["decode:torch"] == 0


def test_static_cache_forward_without_a_mask(calls):
    """No attention mask at all: the mask builder still marks the static cache's slots
    after the seen tokens as unused."""
    ours, _ = model_pair()
    ids = torch.randint(0, 256, (2, 7))
    cache = transformers.StaticCache(config=ours.config, max_cache_len=16)
    with torch.no_grad():
        expected = ours(ids).logits
        got = ours(ids, past_key_values=cache).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert calls[-1][:3] == ("varlen", [0, 7, 14], [0, 7, 14])


def test_mask_builder_without_a_mask():
    masking = transformers.masking_utils
    causal, bidirectional = masking.causal_mask_function, masking.bidirectional_mask_function
    sizes = {"batch_size": 2, "q_length": 3, "q_offset": 4, "device": torch.device("cpu")}
    # A static cache of 16 slots, 7 tokens seen: those 7 are kept.
    keep = integration.attention_mask(kv_length=16, mask_function=causal, **sizes)
    assert keep.dtype == torch.bool and keep.shape == (2, 7) and bool(keep.all())
    # A dynamic cache (keys = tokens seen), or cross-attention (bidirectional): None.
    assert integration.attention_mask(kv_length=7, mask_function=causal, **sizes) is None
    assert integration.attention_mask(kv_length=16, mask_function=bidirectional, **sizes) is None


def causal_padding_mask(mask_2d: torch.Tensor, q_len: int, additive: bool = False,
                        window: int | None = None) -> torch.Tensor:  # fmt: skip
    """The 4-D mask (batch, 1, q_len, kv_len) of key padding and bottom-right causality (and
    a sliding window of `window` keys), as code that builds its own masks makes it."""
    kv_len = mask_2d.shape[1]
    i = torch.arange(q_len)[:, None] + kv_len - q_len
    j = torch.arange(kv_len)[None, :]
    visible = j <= i
    if window is not None:
        visible &= j > i - window
    allowed = visible[None, None] & mask_2d.bool()[:, None, None, :]
    if not additive:
        return allowed
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


def computations(monkeypatch, cache) -> list:
    """A list that gets an entry each time the integration's per-forward `cache` computes."""
    log = []
    compute = cache._compute
    monkeypatch.setattr(cache, "_compute", lambda *a: log.append(a) or compute(*a))
    return log


@pytest.mark.parametrize("additive", [False, True], ids=["bool", "additive"])
def test_a_causal_padding_4d_mask_runs_samattn(calls, monkeypatch, additive):
    """A padded batch given as a 4-D mask that is only padding and causality: the varlen
    route, which reads no mask (the mask inspected once per forward, not per layer)."""
    ours, theirs = model_pair()
    ids, mask = left_padded([9, 16, 12], 16)
    mask_4d = causal_padding_mask(mask, 16, additive)
    inspected = computations(monkeypatch, integration._mask_4d)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        with integration.count_calls() as counts:
            got = ours(ids, attention_mask=mask_4d).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], expected[keep], rtol=1e-4, atol=1e-5)
    assert counts == {"prefill:varlen": 2}
    assert len(inspected) == 1
    assert calls[0][:3] == ("varlen", [0, 9, 25, 37], [0, 9, 25, 37])


def test_a_decode_step_with_a_4d_mask_runs_samattn(calls):
    """A decode step's 4-D mask (batch, 1, 1, kv_len): key padding only."""
    ours, theirs = model_pair()
    ids, mask = left_padded([6, 10], 10)
    step = torch.randint(1, 256, (2, 1))
    step_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
    positions = (step_mask.cumsum(-1) - 1)[:, -1:]
    logits, counts = {}, {}
    for name, model in (("ours", ours), ("theirs", theirs)):
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model(ids, attention_mask=mask, past_key_values=cache)
            mask_4d = causal_padding_mask(step_mask, 1) if name == "ours" else step_mask
            with integration.count_calls() as counts[name]:
                logits[name] = model(
                    step, attention_mask=mask_4d, past_key_values=cache, position_ids=positions
                ).logits
    torch.testing.assert_close(logits["ours"], logits["theirs"], rtol=1e-4, atol=1e-5)
    assert counts["ours"] == {"decode:kvcache": 2}
    assert calls[-1][:3] == ("kvcache", [4, 0], 11)


def test_a_sliding_window_4d_mask_runs_samattn(calls):
    ours, theirs = model_pair("mistral", sliding_window=6)
    ids = torch.randint(0, 256, (2, 20))
    mask_4d = causal_padding_mask(torch.ones(2, 20), 20, window=6)
    with torch.no_grad():
        expected = theirs(ids).logits
        with integration.count_calls() as counts:
            got = ours(ids, attention_mask=mask_4d).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert counts == {"prefill:fixed": 2}  # nothing padded: the layer's window


def random_4d_mask(batch, length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    mask_4d = torch.rand(batch, 1, length, length, generator=generator) < 0.5
    return mask_4d | torch.eye(length, dtype=torch.bool)  # every query sees a key


@pytest.mark.parametrize("additive", [False, True], ids=["bool", "additive"])
def test_a_custom_4d_mask_runs_samattn(calls, additive):
    ours, theirs = model_pair()
    ids = torch.randint(0, 256, (2, 12))
    mask_4d = random_4d_mask(2, 12)
    if additive:
        mask_4d = torch.zeros(mask_4d.shape).masked_fill(~mask_4d, torch.finfo(torch.float32).min)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask_4d).logits
        with integration.count_calls() as counts:
            got = ours(ids, attention_mask=mask_4d).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert counts == {"prefill:mask": 2}
    assert all(call[3]["attn_mask"] is mask_4d for call in calls)


def test_a_custom_4d_mask_in_training(calls):
    ours, theirs = model_pair()
    ids = torch.randint(0, 256, (2, 12))
    mask_4d = random_4d_mask(2, 12, seed=3)
    for model in (ours, theirs):
        model.train()
        model(ids, attention_mask=mask_4d, labels=ids).loss.backward()
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_sliding_window(calls):
    ours, theirs = model_pair("mistral", sliding_window=6)
    ids = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        expected = theirs(ids).logits
        got = ours(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert calls[0][3]["window_size"] == (5, 5) and calls[0][3]["causal"] is True


def training_step_gradients(ours, theirs):
    """(name, ours' gradient, theirs') of every parameter after one loss.backward() each."""
    ids = torch.randint(0, 256, (2, 16))
    for model in (ours, theirs):
        model.train()
        model(ids, labels=ids).loss.backward()
    pairs = zip(ours.named_parameters(), theirs.named_parameters())
    return [(name, a.grad, b.grad) for (name, a), (_, b) in pairs]


def test_training_step_gradients_match(calls):
    for name, ours, theirs in training_step_gradients(*model_pair()):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6, msg=name)


def test_dropout_reaches_the_kernels(calls, monkeypatch):
    # Training with attention_dropout passes it on as dropout_p; eval passes none.
    integration.register()
    seen = []
    real = samattn.flash_attn_func

    def spy(*args, **kwargs):
        seen.append(kwargs.get("dropout_p", 0.0))
        return real(*args, **{k: v for k, v in kwargs.items() if k != "dropout_p"})

    monkeypatch.setattr(samattn, "flash_attn_func", spy)
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config(attention_dropout=0.1), attn_implementation="samattn"
    )
    model.train()(torch.randint(0, 256, (1, 8)))
    assert seen and all(p == 0.1 for p in seen)
    seen.clear()
    model.eval()(torch.randint(0, 256, (1, 8)))
    assert seen and all(p == 0.0 for p in seen)


# ------------------------------------------------------------ attention sinks ----
GPT_OSS = dict(head_dim=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=6)


def gpt_oss_pair():
    """A tiny gpt-oss (attention sinks, alternating sliding and full layers) as "samattn"
    and "eager" (gpt-oss has no sdpa), with sinks large enough to matter."""
    ours, theirs = model_pair("gpt_oss", reference="eager", **GPT_OSS)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for model in (ours, theirs):
            for layer in model.model.layers:
                sinks = torch.randn(layer.self_attn.sinks.shape, generator=generator) * 2
                layer.self_attn.sinks.copy_(sinks)
            generator.manual_seed(1)
    return ours, theirs


def test_gpt_oss_sinks_reach_samattn(calls):
    ours, theirs = gpt_oss_pair()
    ids = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        expected = theirs(ids).logits
        with integration.count_calls() as counts:
            got = ours(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert counts == {"prefill:fixed": 2}
    for (_, _, _, options), layer in zip(calls, ours.model.layers):
        sinks = options["sinks"]
        assert sinks.dtype == torch.float32 and torch.equal(sinks, layer.self_attn.sinks)
    assert calls[0][3]["window_size"] == (5, 5) and "window_size" not in calls[1][3]


def test_gpt_oss_padding_and_generation_with_sinks(calls):
    ours, theirs = gpt_oss_pair()
    ids, mask = left_padded([5, 12, 9], 12)
    options = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        expected = theirs.generate(ids, attention_mask=mask, **options)
        with integration.count_calls() as counts:
            got = ours.generate(ids, attention_mask=mask, **options)
    assert torch.equal(got, expected)
    assert counts["prefill:torch"] == counts["decode:torch"] == 0
    assert all("sinks" in call[3] for call in calls)


def test_gpt_oss_training_step_gradients_match(calls):
    """The sinks' gradient (through the float32 cast) and every other one."""
    ours, theirs = gpt_oss_pair()
    for name, a, b in training_step_gradients(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    sinks = ours.model.layers[0].self_attn.sinks
    assert sinks.grad is not None and sinks.grad.abs().sum() > 0


def test_sinks_under_a_custom_4d_mask_run_in_samattn(calls):
    ours, theirs = gpt_oss_pair()
    ids = torch.randint(0, 256, (2, 12))
    mask_4d = random_4d_mask(2, 12)
    # Additive: gpt-oss's eager attention adds the mask to its scores.
    additive = torch.zeros(mask_4d.shape).masked_fill(~mask_4d, torch.finfo(torch.float32).min)
    with torch.no_grad(), integration.count_calls() as counts:
        expected = theirs(ids, attention_mask=additive).logits
        got = ours(ids, attention_mask=additive).logits
    assert counts == {"prefill:mask": 2}
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for (_, _, _, options), layer in zip(calls, ours.model.layers):
        assert options["attn_mask"] is additive and options["causal"] is False
        assert torch.equal(options["sinks"], layer.self_attn.sinks)


# -------------------------------------------------- a position bias (T5) ----
def t5_pair(reference="eager"):
    """A tiny T5 (a learned relative position bias, passed to the attention function as
    position_bias) as "samattn" and `reference`; no dropout (samattn has none)."""
    integration.register()
    config = dict(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                  relative_attention_num_buckets=8, dropout_rate=0.0, decoder_start_token_id=0,
                  pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model_class = transformers.T5ForConditionalGeneration
    ours = model_class._from_config(transformers.T5Config(**config), attn_implementation="samattn")
    theirs = model_class._from_config(
        transformers.T5Config(**config), attn_implementation=reference
    )
    theirs.load_state_dict(ours.state_dict())
    return ours.eval(), theirs.eval()


def t5_inputs():
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 64, (2, 9), generator=generator)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0  # right padding of the encoder's input
    targets = torch.randint(1, 64, (2, 5), generator=generator)
    return ids, mask, targets


def test_t5_position_bias_reaches_the_kernels(calls):
    ours, theirs = t5_pair()
    ids, mask, targets = t5_inputs()
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, labels=targets).logits
        with integration.count_calls() as counts:
            got = ours(input_ids=ids, attention_mask=mask, labels=targets).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    # Encoder, decoder self- and cross-attention: every call reads the bias as a mask.
    assert set(counts) <= {"prefill:mask", "decode:mask"} and sum(counts.values()) == 6
    assert all(call[3]["attn_mask"] is not None for call in calls)


def test_t5_training_step_trains_the_relative_bias(calls):
    ours, theirs = t5_pair()
    ids, mask, targets = t5_inputs()
    for model in (ours, theirs):
        model.train()
        model(input_ids=ids, attention_mask=mask, labels=targets).loss.backward()
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)
    bias = ours.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
    assert bias.grad is not None and bias.grad.abs().sum() > 0


def test_kernel_mask_folds_the_padding_into_the_bias():
    bias = torch.randn(1, 4, 3, 5, requires_grad=True)
    keep = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # (batch, seen): a static cache of 5
    mask = integration._kernel_mask(keep, bias, 5)
    assert mask.shape == (2, 4, 3, 5) and mask.requires_grad
    assert torch.isneginf(mask[0, :, :, 3:]).all() and torch.isneginf(mask[1, :, :, 4]).all()
    assert torch.equal(mask[1, :, :, :4], bias[0, :, :, :4].detach().expand(4, 3, 4))
    additive = torch.zeros(2, 1, 3, 5)
    assert integration._kernel_mask(additive, bias, 5).shape == (2, 4, 3, 5)
    assert integration._kernel_mask(None, bias, 5) is bias
    four_d = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    assert integration._kernel_mask(four_d, None, 5) is four_d


def decode_step(keep: torch.Tensor, head_dim: int = 16, requires_grad: bool = False):
    """One decode query per sequence over a (batch, kv_len) cache, as transformers passes
    them: (batch, heads, seq, head_dim) tensors; keep the (batch, kv_len) keep-mask."""
    batch, kv_len = keep.shape
    q = torch.randn(batch, 4, 1, head_dim, requires_grad=requires_grad)
    k, v = (torch.randn(batch, 2, kv_len, head_dim) for _ in range(2))
    layer = torch.nn.Module()
    layer.is_causal = True
    return layer, q, k, v


@pytest.mark.parametrize("case", ["left padding", "a hole", "grad", "head dim 12", "all padding"])
def test_padded_decode_route(calls, case):
    """A padded decode step reads the caches in place (flash_attn_with_kvcache) only when
    the padding is on the left, the step is inference, and the caches need no copy; else it
    gathers the kept rows (varlen). Both give the reference's output."""
    keep = torch.ones(3, 9, dtype=torch.bool)
    keep[0, :4] = False
    keep[2, :1] = False
    if case == "a hole":
        keep[1, 3] = False
    if case == "all padding":
        keep[1, :] = False
    layer, q, k, v = decode_step(
        keep, head_dim=12 if case == "head dim 12" else 16, requires_grad=case == "grad"
    )
    with integration.count_calls() as counts:
        out, _ = integration.attention_forward(layer, q, k, v, keep.clone())
    route = "kvcache" if case == "left padding" else "varlen"
    assert counts == {f"decode:{route}": 1}
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    for b in range(3):
        if not keep[b].any():
            continue
        rows = keep[b].nonzero().reshape(-1)
        expected = reference_attention(qt[b : b + 1], kt[b : b + 1, rows], vt[b : b + 1, rows])
        torch.testing.assert_close(out[b : b + 1], expected, rtol=1e-5, atol=1e-6)


def test_padding_is_found_once_per_forward(calls, monkeypatch):
    """The layers of one forward share the unpadding of the mask (its device-to-host copies
    and the value check of its cu_seqlens): computed once, not once per layer."""
    ours, theirs = model_pair()
    ids, mask = left_padded([9, 16, 12], 16)
    computed = computations(monkeypatch, integration._unpadding)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], expected[keep], rtol=1e-4, atol=1e-5)
    varlen = [call for call in calls if call[0] == "varlen"]
    assert len(varlen) == 2 and len(computed) == 1
