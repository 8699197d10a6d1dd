"""The sm90 GEMM plan, through samattn_gemm_plan: which family runs a GEMM on an H100-like
GPU, whether TMA can describe it (else sm80 runs it), and the tile heuristic.

The plan is host code built into every library, and answers as a complete build would, so
these run on any build and need no GPU. Pointers are fake addresses, only checked for
alignment.
"""

from __future__ import annotations

import ctypes

import pytest

from samattn import _lib

H100 = ((9, 0), 132)
ALIGNED = 0x100000  # a 16-byte aligned fake address


def plan_for(
    m: int,
    n: int,
    k: int,
    *,
    batch: int = 1,
    dtype: int = _lib.BF16,
    allow_tf32: bool = True,
    a_layout: str = "row",
    b_layout: str = "row",
    d_layout: str = "row",
    lda: int | None = None,
    a_offset: int = 0,
    family: int = _lib.FAMILY_AUTO,
    gpu: tuple[tuple[int, int], int] = H100,
    **changes,
) -> tuple[str, str]:
    """(family, plan) of a contiguous batched D = A @ B with the given layouts."""

    def strides(rows: int, cols: int, layout: str, ld: int | None = None) -> tuple[int, int, int]:
        if layout == "row":
            ld = ld or cols
            return rows * ld, ld, 1
        ld = ld or rows
        return cols * ld, 1, ld

    args = _lib.GemmArgs(dtype=dtype, family=family, device=0, allow_tf32=int(allow_tf32))
    args.batch, args.m, args.n, args.k = batch, m, n, k
    args.a, args.b, args.d = ALIGNED + a_offset, ALIGNED, ALIGNED
    args.a_batch_stride, args.a_row_stride, args.a_col_stride = strides(m, k, a_layout, lda)
    args.b_batch_stride, args.b_row_stride, args.b_col_stride = strides(k, n, b_layout)
    args.d_batch_stride, args.d_row_stride, args.d_col_stride = strides(m, n, d_layout)
    args.alpha, args.beta = 1.0, 0.0
    for field, value in changes.items():
        setattr(args, field, value)
    return _lib.gemm_plan(args, *gpu)


def fields(plan: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in plan.split())


@pytest.fixture(autouse=True)
def _no_tuning_overrides(monkeypatch):
    for name in ("SAMATTN_SM90_GEMM_TILE", "SAMATTN_SM90_GEMM_SWIZZLE", "SAMATTN_FAMILY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("shape", "tile", "swizzle"),
    [
        # Enough 128x256 tiles for a wave of 132 SMs: the big tile.
        ((4096, 4096, 4096), "128x256_c2x1", "1"),
        ((8192, 8192, 8192), "128x256_c2x1", "1"),
        ((2048, 2048, 2048), "128x256_c2x1", "1"),
        ((16384, 14336, 4096), "128x256_c2x1", "4"),  # very wide N: bands of 4
        ((16384, 4096, 4096), "128x256_c2x1", "1"),
        # Too few big tiles, enough 128x128 ones.
        ((1536, 1536, 4096), "128x128_c1x2", "1"),
        # Few output tiles: stream-K fills the GPU.
        ((256, 4096, 4096), "128x64_streamk", "1"),
        ((1024, 1024, 1024), "128x64_streamk", "1"),
    ],
)
def test_tile_heuristic(shape, tile, swizzle):
    family, plan = plan_for(*shape)
    assert family == "sm90"
    assert fields(plan) == {"tile": tile, "swizzle": swizzle, "transposed": "0"}


def test_tf32_swizzles_in_bands_of_8():
    assert fields(plan_for(4096, 4096, 4096, dtype=_lib.F32)[1])["swizzle"] == "8"
    assert fields(plan_for(2048, 2048, 2048, dtype=_lib.F32)[1])["swizzle"] == "1"  # one wave


@pytest.mark.parametrize("m", [1, 16, 64, 128])
def test_decode_like_m_runs_transposed(m):
    """M <= 128: D^T = B^T A^T, N along the 128-row side of the tile (16-bit only)."""
    family, plan = plan_for(m, 8192, 8192)
    assert family == "sm90"
    assert fields(plan) == {"tile": "128x64_swap_ab", "swizzle": "1", "transposed": "1"}
    # tf32 has no swap_ab kernel: plain stream-K.
    assert fields(plan_for(m, 8192, 8192, dtype=_lib.F32)[1])["tile"] == "128x64_streamk"


def test_batched_counts_every_batch_tile():
    # 64 x 512^3: 8 tiles of 128x256 per matrix, 512 in all.
    family, plan = plan_for(512, 512, 512, batch=64)
    assert family == "sm90" and fields(plan)["tile"] == "128x256_c2x1"


def test_heuristic_follows_sm_count():
    # 128 tiles of 128x256 fill 132 SMs but not 264.
    assert fields(plan_for(2048, 2048, 2048)[1])["tile"] == "128x256_c2x1"
    assert fields(plan_for(2048, 2048, 2048, gpu=((9, 0), 264))[1])["tile"] == "128x128_c1x2"


@pytest.mark.parametrize("dtype", [_lib.F16, _lib.BF16])
@pytest.mark.parametrize("a_layout", ["row", "col"])
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_every_operand_layout_runs_on_sm90(dtype, a_layout, b_layout):
    family, plan = plan_for(1024, 2048, 512, dtype=dtype, a_layout=a_layout, b_layout=b_layout)
    assert family == "sm90", plan


@pytest.mark.parametrize("a_layout", ["row", "col"])
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_tf32_runs_every_layout_on_sm90(a_layout, b_layout):
    """tf32 operands that are not K-major are staged K-major in the workspace first."""
    family, _ = plan_for(
        4096, 4096, 4096, dtype=_lib.F32, a_layout=a_layout, b_layout=b_layout, allow_tf32=True
    )
    assert family == "sm90"


def test_tf32_staging_lifts_the_contiguous_extent_rule():
    # A column-major A with M = 1001: its copy is K-major, so only K must be a multiple of 4.
    assert plan_for(1001, 256, 256, dtype=_lib.F32, a_layout="col")[0] == "sm90"
    family, plan = plan_for(256, 256, 1001, dtype=_lib.F32, a_layout="col")
    assert family == "sm80" and "K extent 1001" in plan


def test_tf32_on_sm90_exact_fp32_on_sm80():
    # No exact-fp32 wgmma: selection goes straight to sm80's FMA kernel.
    assert plan_for(4096, 4096, 4096, dtype=_lib.F32, allow_tf32=False) == ("sm80", "")


def test_column_major_d_is_computed_transposed():
    family, plan = plan_for(4096, 1024, 512, d_layout="col")
    assert family == "sm90" and fields(plan)["transposed"] == "1"


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ({"lda": 4099}, "a's leading dimension"),  # 4099 * 2 bytes: not a multiple of 16
        ({"a_offset": 2}, "a is not 16-byte aligned"),
        ({"k": 4097, "lda": 4104}, "contiguous extent 4097"),  # TMA rows of whole 16 bytes
        ({"n": 4100}, "contiguous extent 4100"),
        ({"k": 0}, "k == 0"),
    ],
)
def test_what_tma_cannot_describe_runs_on_sm80(case, reason):
    shape = {"m": 4096, "n": 4096, "k": 4096}
    shape.update({key: case.pop(key) for key in ("m", "n", "k") if key in case})
    family, plan = plan_for(shape["m"], shape["n"], shape["k"], **case)
    assert family == "sm80"
    assert plan.startswith("sm90 cannot run it: ") and reason in plan, plan


def test_no_unit_stride_runs_on_sm80():
    family, plan = plan_for(256, 256, 256, a_col_stride=2, a_row_stride=512)
    assert family == "sm80" and "a has no unit stride" in plan


def test_shared_b_is_folded_into_m():
    # A linear layer: (batch, m, k) @ (k, n) is one (batch*m, k) @ (k, n) GEMM.
    family, plan = plan_for(16, 4096, 4096, batch=64, b_batch_stride=0)  # M = 1024
    assert family == "sm90" and fields(plan)["tile"] == "128x256_c2x1"


def test_shared_a_cannot_be_folded():
    family, plan = plan_for(512, 512, 512, batch=8, a_batch_stride=0)
    assert family == "sm80" and "broadcast over the batch" in plan


def test_c_must_match_d():
    c = {"c": ALIGNED, "beta": 1.0}
    family, _ = plan_for(1024, 1024, 1024, c_batch_stride=0, c_row_stride=1024, c_col_stride=1, **c)
    assert family == "sm90"
    # The swap_ab kernel's column-major D^T reads C transposed as well.
    family, plan = plan_for(
        16, 1024, 1024, c_batch_stride=0, c_row_stride=1024, c_col_stride=1, **c
    )
    assert family == "sm90" and "swap_ab" in plan
    family, plan = plan_for(
        1024, 1024, 1024, c_batch_stride=0, c_row_stride=1, c_col_stride=1024, **c
    )
    assert family == "sm80" and "c and d differ" in plan


def test_fp32_output_runs_a_k_major_a_on_sm90():
    # A linear layer: row-major x, weight.mT (column-major B). Decode-like M too (swap_ab).
    for m in (4096, 16):
        family, plan = plan_for(m, 4096, 4096, b_layout="col", output_fp32=1)
        assert family == "sm90", plan
    family, plan = plan_for(4096, 4096, 4096, output_fp32=1)  # row-major B: N-major
    assert family == "sm90", plan
    family, plan = plan_for(4096, 4096, 4096, a_layout="col", output_fp32=1)
    assert family == "sm80" and "fp32 output needs a row-major a" in plan
    # The output's alignment is counted in fp32 elements: 4 per 16 bytes.
    family, _ = plan_for(4096, 4100, 4096, b_layout="col", output_fp32=1)
    assert family == "sm90"


def test_bias_runs_along_the_callers_columns():
    bias = {"bias": ALIGNED}
    for m in (4096, 16):  # a row-major D, and swap_ab's D^T
        family, plan = plan_for(m, 1024, 1024, **bias)
        assert family == "sm90", plan
    family, plan = plan_for(4096, 1024, 1024, d_layout="col", **bias)
    assert family == "sm80" and "bias with a column-major d" in plan


def test_fused_epilogue_layouts():
    # x @ W (row-major B, N-major) and x @ W.T both take the fused epilogue on sm90 ...
    for b_layout in ("row", "col"):
        for m in (4096, 16):
            assert plan_for(m, 1024, 1024, b_layout=b_layout, activation=2)[0] == "sm90"
    # ... and so does a column-major A with a K-major B; not both N-major.
    assert plan_for(4096, 1024, 1024, a_layout="col", b_layout="col", activation=1)[0] == "sm90"
    family, plan = plan_for(4096, 1024, 1024, a_layout="col", activation=1)
    assert family == "sm80" and "column-major a and a row-major b" in plan
    # Without an epilogue every layout runs on sm90.
    assert plan_for(4096, 1024, 1024, a_layout="col")[0] == "sm90"


def test_older_gpus_and_forced_families_never_plan_sm90():
    assert plan_for(4096, 4096, 4096, gpu=((8, 0), 108)) == ("sm80", "")
    assert plan_for(4096, 4096, 4096, gpu=((8, 9), 128)) == ("sm80", "")
    assert plan_for(4096, 4096, 4096, family=_lib.FAMILY_CODES["sm80"]) == ("sm80", "")
    assert plan_for(4096, 4096, 4096, family=_lib.FAMILY_CODES["sm75"])[0] == "sm75"


def test_tuning_overrides(monkeypatch):
    monkeypatch.setenv("SAMATTN_SM90_GEMM_TILE", "128x64_streamk")
    monkeypatch.setenv("SAMATTN_SM90_GEMM_SWIZZLE", "2")
    assert fields(plan_for(4096, 4096, 4096)[1]) == {
        "tile": "128x64_streamk",
        "swizzle": "2",
        "transposed": "0",
    }
    monkeypatch.setenv("SAMATTN_SM90_GEMM_TILE", "no-such-tile")
    assert fields(plan_for(4096, 4096, 4096)[1])["tile"] == "128x256_c2x1"


@pytest.mark.parametrize(
    ("m", "n", "k", "split"),
    [
        # Long K, output tiles that leave SMs idle: parallel, ~4096 of K per range.
        (256, 256, 65536, "16 parallel"),
        (512, 512, 65536, "16 parallel"),
        (1024, 1024, 32768, "8 parallel"),
        (384, 1536, 49152, "8 parallel"),
        (256, 256, 16384, "4 parallel"),
        # Decode-like M with an N-major B: no fp32-output kernel for its transposed
        # batched GEMM, so the serial stream-K split: one wave at 2 splits of 32768.
        (64, 8192, 65536, "2 serial"),
        (256, 256, 12288, None),  # K below 16384, too short for two serial splits of 8192
        (4096, 4096, 65536, None),  # the output fills the GPU
    ],
)
def test_automatic_split_k_of_a_long_k(m, n, k, split):
    family, plan = plan_for(m, n, k)
    assert family == "sm90"
    if split is None:
        assert "split_k=" not in plan
    else:
        assert plan.endswith(f"split_k={split}"), plan
    # A forced split_k=1 is never split.
    assert "split_k=" not in plan_for(m, n, k, split_k=1)[1]


def test_automatic_parallel_split_falls_back_to_serial():
    # A column-major A has no fp32-output kernel: the serial rule (8 tiles of 128x64: 8
    # splits of 8192).
    assert plan_for(256, 256, 65536, a_layout="col")[1].endswith("split_k=8 serial")
    # Batched, or float32: serial too.
    assert plan_for(256, 256, 65536, batch=2)[1].endswith(" serial")
    assert plan_for(256, 256, 65536, dtype=_lib.F32)[1].endswith(" serial")


def test_bad_arguments_are_reported():
    with pytest.raises(ValueError, match="sm_count must be >= 1"):
        plan_for(16, 16, 16, gpu=((9, 0), 0))
    with pytest.raises(ValueError, match="sizes must be >= 0"):
        plan_for(-1, 16, 16)


# ---------------------------------------------------------------- split-K ----
SERIAL, PARALLEL = _lib.SPLIT_K_MODE_CODES["serial"], _lib.SPLIT_K_MODE_CODES["parallel"]


@pytest.mark.parametrize("mode", [0, SERIAL])
def test_forced_split_runs_serially_on_a_stream_k_tile(mode):
    # A large output would take the 128x256 tile; a split needs the stream-K scheduler.
    family, plan = plan_for(4096, 4096, 8192, split_k=4, split_k_mode=mode)
    assert family == "sm90"
    assert fields(plan.replace(" serial", ""))["tile"] == "128x64_streamk"
    assert plan.endswith("split_k=4 serial")


def test_forced_split_keeps_swap_ab_for_decode_shapes():
    family, plan = plan_for(16, 4096, 8192, split_k=8)
    assert (family, plan.split()[0]) == ("sm90", "tile=128x64_swap_ab")
    assert plan.endswith("split_k=8 serial")


def test_no_split_request_leaves_the_sm90_plan_alone():
    for split_k in (0, 1):
        plan = plan_for(4096, 4096, 4096, split_k=split_k)[1]
        assert fields(plan)["tile"] == "128x256_c2x1" and "split_k" not in plan


@pytest.mark.parametrize(
    ("k", "requested", "splits"), [(65536, 4, 4), (65536, 64, 64), (4096, 16, 16)]
)
def test_parallel_split_runs_on_sm90_as_a_batched_gemm(k, requested, splits):
    # K in equal ranges: a batched GEMM into fp32 partials (128x128 tiles for 32 splits of
    # a 256 x 256 output), then the reduction.
    family, plan = plan_for(256, 256, k, split_k=requested, split_k_mode=PARALLEL)
    assert family == "sm90", plan
    assert plan.endswith(f"split_k={splits} parallel")


@pytest.mark.parametrize(
    ("k", "requested", "splits"),
    [
        (1000, 4, 4),  # 16 granules of 64: 4 x 4, but 1000 is no multiple of 256
        (1000, 64, 16),  # only 16 granules of 64
        (200, 3, 2),  # 4 granules: ranges of 2 granules, 2 ranges
        (64, 8, 1),  # one granule: no split
    ],
)
def test_uneven_parallel_splits_run_on_sm80_in_whole_granules(k, requested, splits):
    family, plan = plan_for(256, 256, k, split_k=requested, split_k_mode=PARALLEL)
    assert family == "sm80"
    assert plan.startswith("sm90 cannot run it: parallel split-K")
    if splits >= 2:
        assert plan.endswith(f"split_k={splits} parallel")
    else:
        assert "split_k=" not in plan


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (dict(a_layout="col"), "fp32 output needs a row-major a"),
        (dict(batch=2), "batched GEMM runs on the sm80 family"),
        (dict(dtype=_lib.F32), "float32 runs on the sm80 family"),
        (dict(m=64), "fp32 output needs a row-major a"),  # swap_ab: B^T is its A
    ],
)
def test_what_sm90_splits_in_parallel_and_what_it_hands_to_sm80(changes, reason):
    m = changes.pop("m", 256)
    family, plan = plan_for(m, 256, 65536, split_k=8, split_k_mode=PARALLEL, **changes)
    assert family == "sm80" and reason in plan, plan
    # A decode-like M with a column-major B (a linear layer's weight.mT) stays on sm90.
    assert plan_for(64, 256, 65536, b_layout="col", split_k=8, split_k_mode=PARALLEL)[0] == "sm90"


def test_older_gpus_split_in_parallel():
    plan = plan_for(256, 256, 65536, split_k=8, gpu=((8, 0), 108))
    assert plan == ("sm80", "split_k=8 parallel")
    # Turing splits its fp16 tensor-core GEMMs.
    assert plan_for(256, 256, 65536, dtype=_lib.F16, split_k=8, gpu=((7, 5), 40)) == (
        "sm75",
        "split_k=8 parallel",
    )


@pytest.mark.parametrize(
    ("m", "n", "k", "gpu", "splits"),
    [
        (256, 256, 65536, ((8, 0), 108), 32),  # 4 tiles: ~2 CTAs per SM at 32 ranges
        (512, 512, 65536, ((8, 0), 108), 8),
        (256, 256, 4096, ((8, 0), 108), None),  # K below 8192
        (1024, 1024, 65536, ((8, 0), 108), None),  # 64 tiles: more than half the SMs
        (256, 256, 2048 * 3, ((8, 9), 128), None),
        (128, 128, 16384, ((8, 9), 128), 16),  # one tile: 16 ranges of 1024
    ],
)
def test_sm80_splits_a_long_k_automatically(m, n, k, gpu, splits):
    family, plan = plan_for(m, n, k, gpu=gpu)
    assert family == "sm80"
    assert plan == ("" if splits is None else f"split_k={splits} parallel")


def test_sm75_and_the_fma_units_do_not_split_automatically():
    # Turing splits only when asked (fp16 on its tensor cores).
    assert plan_for(256, 256, 65536, dtype=_lib.F16, gpu=((7, 5), 40)) == ("sm75", "")
    # Exact fp32 runs on the FMA units, grouped GEMMs have their own schedule.
    assert plan_for(256, 256, 65536, dtype=_lib.F32, allow_tf32=False, gpu=((8, 0), 108)) == (
        "sm80",
        "",
    )
    # sm80 forced on an H100 (132 SMs): 64 ranges of 1024.
    sm80 = _lib.FAMILY_CODES["sm80"]
    assert plan_for(256, 256, 65536, family=sm80)[1].endswith("split_k=64 parallel")


def test_splits_that_no_family_runs_are_refused():
    sm80 = _lib.FAMILY_CODES["sm80"]
    with pytest.raises(_lib.UnsupportedError, match="serial split-K runs on the sm90 family"):
        plan_for(256, 256, 65536, split_k=8, split_k_mode=SERIAL, family=sm80)
    # Exact fp32 runs on FMA units, which do not split.
    with pytest.raises(_lib.UnsupportedError, match="split_k runs on tensor cores"):
        plan_for(256, 256, 65536, dtype=_lib.F32, allow_tf32=False, split_k=8, family=sm80)
    # Turing's bf16 likewise.
    with pytest.raises(_lib.UnsupportedError, match="split_k runs on tensor cores"):
        plan_for(256, 256, 65536, split_k=8, family=_lib.FAMILY_CODES["sm75"])


def test_bad_split_arguments_are_reported():
    with pytest.raises(ValueError, match=r"split_k must be 0 \(automatic\) or 1..64, got 65"):
        plan_for(16, 16, 16, split_k=65)
    with pytest.raises(ValueError, match="split_k must be 0"):
        plan_for(16, 16, 16, split_k=-1)
    with pytest.raises(ValueError, match="unknown split_k_mode 3"):
        plan_for(16, 16, 16, split_k_mode=3)


# ---------------------------------------------------------------- grouped ----
def grouped_plan(mode: int, **changes) -> tuple[str, str]:
    """A mixture-of-experts GEMM (rows: x (4096, 512) against 8 experts' (512, 1024)) or
    its weight gradient (K: 8 experts' (512, 1024) over 4096 rows) with fake offsets."""
    if mode == _lib.GROUP_ROWS:
        fields_ = dict(a_batch_stride=0, d_batch_stride=0, b_batch_stride=512 * 1024)
        sizes = (4096, 1024, 512)
    else:
        fields_ = dict(
            a_batch_stride=0, b_batch_stride=0, a_layout="col", d_batch_stride=512 * 1024
        )
        sizes = (512, 1024, 4096)
    fields_.update(batch=8, group_offsets=ALIGNED, group_mode=mode)
    fields_.update(changes)
    m, n, k = (fields_.pop(name, size) for name, size in zip("mnk", sizes))
    return plan_for(m, n, k, **fields_)


def test_rows_grouped_gemms_run_on_the_sm90_grouped_kernel():
    for dtype in (_lib.BF16, _lib.F16):
        assert grouped_plan(_lib.GROUP_ROWS, dtype=dtype) == (
            "sm90",
            "tile=grouped_128x256_c1x2 raster=m",
        )
    # Both weight layouts: (experts, K, N), and w.mT of (experts, N, K).
    w_mt = dict(b_row_stride=1, b_col_stride=512)
    assert grouped_plan(_lib.GROUP_ROWS, **w_mt)[0] == "sm90"
    # A single row leaves x's layout open.
    single = grouped_plan(_lib.GROUP_ROWS, m=1, a_batch_stride=0, a_row_stride=1, a_col_stride=1)
    assert single[0] == "sm90"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (dict(dtype=_lib.F32), "grouped GEMMs in float32 run on the sm80 family"),
        (dict(n=1020, b_batch_stride=512 * 1020, d_row_stride=1020), "contiguous extent 1020"),
        (dict(k=500, a_row_stride=500, b_batch_stride=500 * 1024), "contiguous extent 500"),
        (dict(a_row_stride=1, a_col_stride=4096), "row-major a and d"),
        (dict(a=ALIGNED + 2), "a is not 16-byte aligned"),
        (dict(b_batch_stride=512 * 1024 + 4), "b's batch stride"),
    ],
)
def test_what_the_grouped_kernel_declines_runs_on_sm80(changes, reason):
    family, plan = grouped_plan(_lib.GROUP_ROWS, **changes)
    assert family == "sm80"
    assert plan.startswith("sm90 cannot run it: ") and reason in plan


@pytest.mark.parametrize(
    ("groups", "n", "k", "raster"),
    [(64, 1024, 4096, "n"), (8, 1024, 4096, "m"), (64, 4096, 1024, "m"), (64, 1024, 1024, "m")],
)
def test_grouped_raster_order(groups, n, k, raster):
    """Along N only for the narrow-N projection of many experts (measured)."""
    changes = dict(batch=groups, n=n, k=k, b_batch_stride=k * n, a_row_stride=k, d_row_stride=n)
    changes.update(b_row_stride=n)
    assert grouped_plan(_lib.GROUP_ROWS, **changes)[1].endswith(f"raster={raster}")


@pytest.mark.parametrize(
    ("groups", "cluster"), [(8, "c1x2"), (31, "c1x2"), (32, "c2x1"), (64, "c2x1")]
)
def test_grouped_cluster_shape(groups, cluster):
    """Clusters along M (sharing the expert's weight tile) from 32 experts on (measured);
    the weight gradient keeps 1x2 whatever the experts."""
    plan = grouped_plan(_lib.GROUP_ROWS, batch=groups)[1]
    assert plan.startswith(f"tile=grouped_128x256_{cluster} ")
    assert grouped_plan(_lib.GROUP_K, batch=groups)[1].startswith("tile=grouped_128x256_c1x2 ")


def test_weight_gradients_run_on_the_sm90_grouped_kernel():
    """x^T (unit stride along M) against a row-major dy, each expert's D row-major."""
    for dtype in (_lib.BF16, _lib.F16):
        assert grouped_plan(_lib.GROUP_K, dtype=dtype) == (
            "sm90",
            "tile=grouped_128x256_c1x2 raster=m",
        )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (dict(a_layout="row"), "a with its unit stride along m, b along n"),
        (dict(b_row_stride=1, b_col_stride=4096), "a with its unit stride along m, b along n"),
        (dict(m=500, a_col_stride=500, d_batch_stride=500 * 1024), "contiguous extent 500"),
        (dict(n=1020, b_row_stride=1020, d_row_stride=1020), "contiguous extent 1020"),
        (dict(d_batch_stride=512 * 1024 + 4), "d's batch stride"),
        (dict(k=0), "k == 0"),
    ],
)
def test_what_the_weight_gradient_kernel_declines_runs_on_sm80(changes, reason):
    family, plan = grouped_plan(_lib.GROUP_K, **changes)
    assert family == "sm80"
    assert plan.startswith("sm90 cannot run it: ") and reason in plan


@pytest.mark.parametrize("mode", [_lib.GROUP_ROWS, _lib.GROUP_K])
def test_grouped_gemms_before_hopper(mode):
    assert grouped_plan(mode, gpu=((8, 9), 128)) == ("sm80", "")
    turing = grouped_plan(mode, dtype=_lib.F16, gpu=((7, 5), 40))
    assert turing == ("sm75", "")


def test_grouped_gemms_need_tensor_cores():
    with pytest.raises(_lib.UnsupportedError, match="grouped GEMMs run on tensor cores"):
        grouped_plan(_lib.GROUP_ROWS, family=_lib.FAMILY_CODES["sm75"])  # bf16: FMA units
    with pytest.raises(_lib.UnsupportedError, match="grouped GEMMs run on tensor cores"):
        grouped_plan(
            _lib.GROUP_ROWS, dtype=_lib.F32, allow_tf32=False, family=_lib.FAMILY_CODES["sm80"]
        )


@pytest.mark.parametrize(
    ("mode", "changes", "text"),
    [
        (_lib.GROUP_ROWS, dict(group_offsets=0), "a grouped GEMM needs group_offsets"),
        (_lib.GROUP_ROWS, dict(group_offsets=ALIGNED + 2), "group_offsets is not aligned"),
        (_lib.GROUP_ROWS, dict(group_mode=4), "unknown group_mode 4"),
        (_lib.GROUP_ROWS, dict(group_list=ALIGNED), "group_list is set but group_mode is not"),
        (_lib.GROUP_ROWS, dict(group_reserved=1), "group_reserved must be 0"),
        (_lib.GROUP_ROWS, dict(batch=70000), r"1..65535 groups \(batch\), got 70000"),
        (_lib.GROUP_ROWS, dict(split_k=2), "does not split K"),
        (_lib.GROUP_ROWS, dict(a_batch_stride=4096 * 512), "shares a, c and d"),
        (_lib.GROUP_ROWS, dict(d_batch_stride=4096 * 1024), "shares a, c and d"),
        (_lib.GROUP_K, dict(b_batch_stride=4096 * 1024), "shares a and b"),
        (_lib.GROUP_NONE, dict(), "group_offsets is set but group_mode is SAMATTN_GROUP_NONE"),
    ],
)
def test_bad_group_arguments_are_reported(mode, changes, text):
    with pytest.raises(ValueError, match=text):
        grouped_plan(mode, **changes)


# ------------------------------------------------------------------ lists ----
def list_plan(entries: list[dict], dtype: int = _lib.BF16, gpu=H100, **changes) -> tuple[str, str]:
    """The plan of a GEMM list; each entry (m, n, k) row-major at fake aligned addresses
    unless it says otherwise."""
    array = (_lib.GemmListEntry * len(entries))()
    for slot, fields_ in zip(array, entries):
        m, n, k = fields_["m"], fields_["n"], fields_["k"]
        slot.m, slot.n, slot.k = m, n, k
        slot.a, slot.a_row_stride, slot.a_col_stride = ALIGNED, k, 1
        slot.b, slot.b_row_stride, slot.b_col_stride = ALIGNED, n, 1
        slot.d, slot.d_row_stride, slot.d_col_stride = ALIGNED, n, 1
        for name, value in fields_.items():
            setattr(slot, name, value)
    args = _lib.GemmArgs(dtype=dtype, family=changes.pop("family", _lib.FAMILY_AUTO), device=0)
    args.batch, args.alpha, args.group_mode = len(entries), 1.0, _lib.GROUP_LIST
    args.group_list = ctypes.cast(array, ctypes.c_void_p)
    for field, value in changes.items():
        setattr(args, field, value)
    return _lib.gemm_plan(args, *gpu)


def transposed_b(m: int, n: int, k: int) -> dict:
    """An entry whose b is the transposed view of an (n, k) row-major weight."""
    return dict(m=m, n=n, k=k, b_row_stride=1, b_col_stride=k)


def test_lists_run_on_the_sm90_grouped_kernel():
    rows = [dict(m=130, n=200, k=264), dict(m=1, n=8, k=16), dict(m=77, n=64, k=0)]
    assert list_plan(rows) == ("sm90", "tile=grouped_128x256_c1x2 raster=m")
    transposed = [transposed_b(130, 200, 264), transposed_b(5, 40, 1000), dict(m=0, n=3, k=5)]
    assert list_plan(transposed, dtype=_lib.F16)[0] == "sm90"


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        ([dict(m=64, n=64, k=64), transposed_b(64, 64, 64)], "group_list[1]: b is column-major"),
        ([dict(m=64, n=64, k=100)], "group_list[0]: a's contiguous extent 100"),
        ([dict(m=64, n=60, k=64)], "group_list[0]: d's contiguous extent 60"),
        ([dict(m=64, n=64, k=64, a=ALIGNED + 2)], "group_list[0]: a is not 16-byte aligned"),
        ([dict(m=64, n=64, k=64, a_row_stride=1, a_col_stride=64)], "a is not row-major"),
        ([dict(m=8, n=8, k=8, d_row_stride=1, d_col_stride=8)], "d is not row-major"),
    ],
)
def test_what_the_list_kernel_declines_runs_on_sm80(entries, reason):
    family, plan = list_plan(entries)
    assert family == "sm80"
    assert plan.startswith("sm90 cannot run it: ") and reason in plan


def test_lists_before_hopper_run_one_gemm_after_another():
    entries = [dict(m=64, n=64, k=64), transposed_b(3, 5, 7)]
    assert list_plan(entries, gpu=((8, 0), 108)) == ("sm80", "")
    # No tensor-core requirement: Turing's bf16 runs on its FMA kernels.
    assert list_plan(entries, gpu=((7, 5), 40)) == ("sm75", "")


@pytest.mark.parametrize(
    ("changes", "entry", "text"),
    [
        (dict(group_list=0), {}, "SAMATTN_GROUP_LIST needs group_list"),
        (dict(m=4), {}, "takes its GEMMs from group_list"),
        (dict(group_offsets=ALIGNED), {}, "takes its GEMMs from group_list"),
        (dict(beta=1.0), {}, "takes its GEMMs from group_list"),
        (dict(dtype=_lib.F32), {}, "a GEMM list takes float16 or bfloat16"),
        (dict(batch=0), {}, r"1..65535 GEMMs \(batch\), got 0"),
        ({}, dict(m=-1), r"group_list\[0\]: sizes must be in \[0, 2\^31\)"),
        ({}, dict(b_col_stride=-1), r"group_list\[0\]: strides must be >= 0"),
        ({}, dict(a=0), r"group_list\[0\]: a is NULL"),
        ({}, dict(d=ALIGNED + 1), r"group_list\[0\]: d is not aligned to its 2-byte elements"),
        ({}, dict(d_row_stride=0), r"group_list\[0\]: d's strides make its elements overlap"),
    ],
)
def test_bad_list_arguments_are_reported(changes, entry, text):
    with pytest.raises(ValueError, match=text):
        list_plan([{**dict(m=4, n=8, k=8), **entry}], **changes)


def test_a_list_that_writes_nothing_needs_no_pointers():
    assert list_plan([dict(m=0, n=8, k=8, a=0, b=0, d=0)])[0] == "sm90"
    assert list_plan([dict(m=8, n=8, k=0, a=0, b=0)])[0] == "sm90"  # zeros: D only
