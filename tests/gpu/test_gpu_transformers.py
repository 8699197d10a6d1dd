"""A tiny Llama (and a sliding-window Mistral) from transformers with samattn as its attention
(samattn.integrations.transformers), on the GPU with the real kernels, against the same model
with attn_implementation="sdpa". Skipped without transformers.

Tolerance: both bf16 runs are compared with an fp32 "eager" run of the same (bf16-rounded)
weights; samattn's error must be at most twice SDPA's, plus a floor of 1e-3 relative (below
bf16's unit roundoff, 2^-8) for quantities SDPA happens to get almost exactly. Everything but
the attention is the same bf16 computation in both runs, so an attention bug shows up as an
error well beyond SDPA's.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from samattn.integrations import transformers as integration  # noqa: E402

DEVICE = "cuda"
DTYPES = {"samattn": torch.bfloat16, "sdpa": torch.bfloat16, "eager": torch.float32}
FLOOR = 1e-3


def config(model_type: str, **extra):
    config_class = transformers.AutoConfig.for_model(model_type).__class__
    return config_class(
        num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, intermediate_size=256, max_position_embeddings=1024, **extra,
    )  # fmt: skip


def models(model_type: str, **extra) -> dict[str, torch.nn.Module]:
    """The same random weights as "samattn" and "sdpa" in bf16, and "eager" in fp32 (with
    the bf16-rounded weights)."""
    integration.register()
    torch.manual_seed(0)
    auto = transformers.AutoModelForCausalLM
    reference = auto.from_config(config(model_type, **extra), attn_implementation="eager")
    weights = {k: v.to(torch.bfloat16) for k, v in reference.state_dict().items()}
    out = {}
    for name, dtype in DTYPES.items():
        model = auto.from_config(config(model_type, **extra), attn_implementation=name)
        model.load_state_dict({k: v.to(dtype) for k, v in weights.items()})
        out[name] = model.to(device=DEVICE, dtype=dtype)
    assert out["samattn"].config._attn_implementation == "samattn"
    return out


def relative_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    reference = reference.double()
    return ((x.double() - reference).norm() / reference.norm().clamp_min(1e-30)).item()


def assert_within_twice_sdpa(ours, sdpa, reference, what: str) -> None:
    ours_error, sdpa_error = relative_error(ours, reference), relative_error(sdpa, reference)
    assert ours_error <= 2 * sdpa_error + FLOOR, (
        f"{what}: samattn's error {ours_error:.3g} vs fp32, SDPA's {sdpa_error:.3g}"
    )


@pytest.mark.parametrize(
    "model_type, extra, seqlen",
    [("llama", {}, 512), ("mistral", {"sliding_window": 64}, 300)],
    ids=["llama", "mistral-sliding-window"],
)
def test_logits(model_type, extra, seqlen):
    runs = models(model_type, **extra)
    ids = torch.randint(0, 256, (2, seqlen), device=DEVICE)
    with torch.no_grad():
        logits = {name: model(ids).logits.float() for name, model in runs.items()}
    assert torch.isfinite(logits["samattn"]).all()
    assert_within_twice_sdpa(logits["samattn"], logits["sdpa"], logits["eager"], "logits")


def test_logits_with_padding():
    runs = models("llama")
    ids = torch.randint(0, 256, (3, 256), device=DEVICE)
    mask = torch.ones(3, 256, dtype=torch.long, device=DEVICE)
    mask[0, :40] = 0
    mask[2, 200:] = 0
    with torch.no_grad():
        logits = {n: m(ids, attention_mask=mask).logits.float() for n, m in runs.items()}
    keep = mask.bool()
    ours, sdpa, eager = (logits[n][keep] for n in ("samattn", "sdpa", "eager"))
    assert_within_twice_sdpa(ours, sdpa, eager, "padded logits")


def test_training_step():
    """loss.backward() and one AdamW step: the loss, every parameter's gradient and every
    updated parameter within twice SDPA's error against the fp32 run."""
    runs = models("llama")
    ids = torch.randint(0, 256, (4, 256), device=DEVICE)
    losses, before = {}, {}
    for name, model in runs.items():
        model.train()
        before[name] = {k: p.detach().clone() for k, p in model.named_parameters()}
        loss = model(ids, labels=ids).loss
        loss.backward()
        losses[name] = loss.detach().float()
    assert_within_twice_sdpa(losses["samattn"], losses["sdpa"], losses["eager"], "loss")

    params = {name: dict(model.named_parameters()) for name, model in runs.items()}
    for key, reference in params["eager"].items():
        assert params["samattn"][key].grad is not None, f"{key}: no gradient"
        assert_within_twice_sdpa(
            params["samattn"][key].grad, params["sdpa"][key].grad, reference.grad, f"grad {key}"
        )

    for model in runs.values():
        torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    for key in params["eager"]:
        updates = {n: params[n][key].detach().float() - before[n][key].float() for n in runs}
        assert_within_twice_sdpa(
            updates["samattn"], updates["sdpa"], updates["eager"], f"update {key}"
        )
