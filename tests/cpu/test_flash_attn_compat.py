"""tests/flash_attn_compat without a GPU: the stand-in ``flash_attn`` package that runs
flash-attn's own test file against samattn (padding, rotary embedding, S_dmask in
flash-attn's format) and its runner, end to end on a small test file of the same shape.
"""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import samattn

COMPAT = Path(__file__).resolve().parents[1] / "flash_attn_compat"


@pytest.fixture
def shim(monkeypatch):
    """The stand-in package, imported from tests/flash_attn_compat and forgotten after the
    test (so that nothing else in the session sees a `flash_attn` module)."""
    monkeypatch.syspath_prepend(str(COMPAT))
    import flash_attn
    import flash_attn.bert_padding
    import flash_attn.flash_attn_interface
    import flash_attn.layers.rotary

    yield flash_attn
    for name in list(sys.modules):
        if name == "flash_attn" or name.startswith("flash_attn."):
            del sys.modules[name]


def test_exports_what_flash_attn_tests_import(shim):
    for name in (
        "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
        "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
        "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache",
    ):  # fmt: skip
        assert callable(getattr(shim, name)), name
    assert shim.flash_attn_with_kvcache is samattn.flash_attn_with_kvcache
    interface = shim.flash_attn_interface
    assert interface.USE_TRITON_ROCM is False
    assert interface._get_block_size_n("cuda", 64, True, False) > 2**20


def test_unpad_and_pad_are_inverse_and_differentiable(shim):
    from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input

    x = torch.randn(3, 7, 2, 4, requires_grad=True)
    mask = torch.arange(7) < torch.tensor([[7], [3], [5]])
    packed, indices, cu_seqlens, max_seqlen, used = unpad_input(x, mask)
    assert packed.shape == (15, 2, 4) and max_seqlen == 7
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 7, 10, 15]
    assert used.tolist() == [7, 3, 5]
    assert torch.equal(packed, index_first_axis(x.reshape(21, 2, 4), indices))
    assert torch.equal(packed, x[mask])
    padded = pad_input(packed, indices, 3, 7)
    assert torch.equal(padded[mask], x[mask]) and not padded[~mask].any()
    padded.sum().backward()
    assert torch.equal(x.grad, mask[..., None, None].float().expand_as(x))
    # An unused mask packs more tokens than it counts as used.
    extra = torch.zeros_like(mask)
    extra[1, 3] = True
    packed, _, cu_seqlens, _, used = unpad_input(x, mask, extra)
    assert packed.shape[0] == 16 and cu_seqlens.tolist() == [0, 7, 11, 16]
    assert used.tolist() == [7, 3, 5]


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_rotary_rotates_each_position_by_its_angle(shim, interleaved):
    from flash_attn.layers.rotary import apply_rotary_emb

    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 16, dtype=torch.float16)
    angle = torch.rand(9, 4) * 2 * math.pi
    cos, sin = angle.cos().half(), angle.sin().half()
    offsets = torch.tensor([2, 7], dtype=torch.int32)  # sequence 1 runs past cos's 9 rows
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    assert out.dtype == x.dtype and torch.equal(out[..., 8:], x[..., 8:])
    for b in range(2):
        for i in range(3):
            position = int(offsets[b]) + i
            row = x[b, i].float()
            if position >= 9:  # past the table: unrotated
                assert torch.equal(out[b, i], x[b, i])
                continue
            c, s = cos[position].float(), sin[position].float()
            first, second = (
                (row[:, 0:8:2], row[:, 1:8:2]) if interleaved else (row[:, :4], row[:, 4:8])
            )
            pair = (first * c - second * s, first * s + second * c)
            want = torch.stack(pair, -1).flatten(-2) if interleaved else torch.cat(pair, -1)
            torch.testing.assert_close(out[b, i, :, :8].float(), want, atol=2e-3, rtol=1e-3)
    assert torch.equal(apply_rotary_emb(x, cos, sin, seqlen_offsets=0), apply_rotary_emb(
        x, cos, sin, seqlen_offsets=torch.zeros(2, dtype=torch.int32)
    ))  # fmt: skip


def test_s_dmask_normalizes_back_to_the_probabilities(shim):
    """flash-attn's tests multiply S_dmask's key blocks by exp(m - lse) (m the largest score
    of the row from that block on); with one block that gives samattn's probabilities."""
    from flash_attn.flash_attn_interface import unnormalized_s_dmask

    torch.manual_seed(0)
    scores = torch.randn(2, 3, 5, 11) * 3
    scores[0, 0, 1] = -math.inf  # a query that sees no key
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    dropped = torch.rand(probs.shape) < 0.2
    s_dmask = torch.where(dropped, -probs, probs).half()
    unnormalized = unnormalized_s_dmask(s_dmask)
    assert unnormalized.dtype == torch.float32
    assert torch.equal(unnormalized.signbit(), s_dmask.signbit())  # the dropout mask
    assert not unnormalized[0, 0, 1].any()
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    row_max = scores.amax(dim=-1, keepdim=True)
    normalized = unnormalized.abs() * torch.exp(row_max - lse).nan_to_num(0.0)
    torch.testing.assert_close(normalized, probs, atol=1e-3, rtol=2e-3)


def test_functions_return_s_dmask_in_flash_attn_format(shim):
    def meta(*shape):
        return torch.empty(shape, dtype=torch.float16, device="meta")

    q, k, v = meta(2, 17, 4, 64), meta(2, 33, 2, 64), meta(2, 33, 2, 64)
    out, lse, s_dmask = shim.flash_attn_func(q, k, v, 0.17, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 17)
    assert s_dmask.shape == (2, 4, 17, 33) and s_dmask.dtype == torch.float32
    out, lse, s_dmask = shim.flash_attn_func(q, k, v, return_attn_probs=True)
    assert s_dmask is None  # no dropout: as samattn (and flash-attn's tests ignore it)
    assert shim.flash_attn_func(q, k, v).shape == q.shape


SMALL_TEST_FILE = """
import pytest
import torch
from flash_attn import flash_attn_func
from flash_attn.bert_padding import pad_input, unpad_input
from flash_attn.flash_attn_interface import _get_block_size_n, USE_TRITON_ROCM
from flash_attn.layers.rotary import apply_rotary_emb

is_sm90 = torch.cuda.get_device_capability("cuda") == (9, 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [32, 64, 128])
def test_flash_attn_output(d, dtype):
    from samattn import _family

    print(f"Output max diff: {d / 1000}")
    if d == 128 and _family.requested_family() == 80:
        assert d / 1000 <= 2 * 0.0039
    if d == 32:
        pytest.skip("d 32")


def test_flash_attn_bwd_overflow():
    from samattn import _family

    if _family.requested_family() == 75:
        raise RuntimeError("no backward kernel (the sm75 backward supports head dims up to 192)")


def test_flash_attn_generator_arg_must_be_none():
    raise AssertionError("an internals test: never run")
"""


@pytest.fixture
def run_small_file(tmp_path, monkeypatch):
    """runner.main on SMALL_TEST_FILE with these arguments (no GPU: a fake capability);
    its JSON summary."""
    monkeypatch.syspath_prepend(str(COMPAT))
    import run_flash_attn_tests as runner

    monkeypatch.delitem(sys.modules, "run_flash_attn_tests")
    test_file = tmp_path / "test_flash_attn.py"
    test_file.write_text(textwrap.dedent(SMALL_TEST_FILE))
    # The pytest process imports samattn from where this one does.
    package_root = str(Path(samattn.__file__).resolve().parents[1])
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.setenv("SAMATTN_FAMILY", "sm80")  # the runner forces families itself
    out = tmp_path / "summary.json"

    def run(*args: str) -> dict:
        assert runner.main([str(test_file), *args, "--fake-capability=9.0", f"--out={out}"]) == 0
        return json.loads(out.read_text())

    return run


def test_runner_runs_each_case_once_per_family(run_small_file):
    families = "auto,sm75,sm80"
    # Every head dim, whatever the installed build holds (CI builds two of them).
    summary = run_small_file(f"--families={families}", "--sample=5", "--seed=1", "--head-dims=all")
    assert summary["collected"] == 8 and summary["selected"] == 5
    assert summary["left_out"] == {"flash-attn extension internals": 1}
    assert sorted(summary["cases"]) == sorted(set(summary["cases"])) and len(summary["cases"]) == 5
    assert list(summary["families"]) == families.split(",")
    for family, result in summary["families"].items():
        t = result["totals"]
        left_out = sum(result["left_out"].values())
        assert t["passed"] + t["failed"] + t["skipped"] + left_out == 5, family
        assert result["not_run"] == 0
    sm75, sm80 = summary["families"]["sm75"], summary["families"]["sm80"]
    bf16_cases = sum("dtype1" in case for case in summary["cases"])
    expected = {"bfloat16 on sm75 (no bfloat16 attention kernels)": bf16_cases}
    if "test_flash_attn_bwd_overflow" in summary["cases"]:
        expected["sm75 backward above head dim 192 (Turing)"] = 1
    assert sm75["left_out"] == {reason: n for reason, n in expected.items() if n}
    assert summary["families"]["auto"]["totals"]["failed"] == 0
    failures = {f["case"]: f for f in sm80["failures"]}
    assert set(failures) == {
        c for c in summary["cases"] if c.startswith("test_flash_attn_output[128")
    }
    for failure in failures.values():
        assert failure["error"] == "AssertionError: assert (128 / 1000) <= (2 * 0.0039)"
        assert failure["printed"] == ["Output max diff: 0.128"]
    skipped = sum(c.startswith("test_flash_attn_output[32") for c in summary["cases"])
    assert sm80["skip_reasons"] == ({"d 32": skipped} if skipped else {})


def test_runner_leaves_out_head_dims_the_build_lacks(run_small_file):
    # d 32 runs in the d32 kernels, 64 in d64, 128 in d128: only 64 and 256 are "built".
    summary = run_small_file("--head-dims=64,256")
    assert summary["head_dims"] == [64, 256]
    assert summary["left_out"] == {
        "flash-attn extension internals": 1,
        "head dim 32 kernels not in this build": 2,
        "head dim 128 kernels not in this build": 2,
    }
    assert sorted(summary["cases"]) == [
        "test_flash_attn_bwd_overflow",  # no head dim parameter: kept
        "test_flash_attn_output[64-dtype0]",
        "test_flash_attn_output[64-dtype1]",
    ]
    assert summary["families"]["auto"]["totals"] == {"passed": 3, "failed": 0, "skipped": 0}


def test_runner_leaves_out_the_sm75_backward_limit(run_small_file):
    # The documented refusal of the sm75 family is left out, not counted as a failure.
    summary = run_small_file(
        "--families=sm75,sm80", "--functions=test_flash_attn_bwd_overflow", "--head-dims=all"
    )
    sm75, sm80 = summary["families"]["sm75"], summary["families"]["sm80"]
    assert sm75["left_out"] == {"sm75 backward above head dim 192 (Turing)": 1}
    assert sm75["totals"]["failed"] == 0 and sm80["totals"]["passed"] == 1


def test_runner_matches_the_librarys_sm75_refusal():
    # The runner recognizes the refusal by its text: the library must still write it.
    sys.path.insert(0, str(COMPAT))
    try:
        import run_flash_attn_tests as runner
    finally:
        sys.path.remove(str(COMPAT))
    dispatch = COMPAT.parents[1] / "cpp" / "src" / "attention" / "flash_fwd_dispatch.h"
    assert runner._SM75_BACKWARD_LIMIT in dispatch.read_text()


def test_runner_functions_all_collects_the_whole_file(run_small_file):
    summary = run_small_file("--functions=all", "--sample=0", "--head-dims=all")
    assert summary["collected"] == 8 and summary["selected"] == 7
