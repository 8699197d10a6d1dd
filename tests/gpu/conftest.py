"""GPU test tier: skipped entirely when torch sees no CUDA device.

Every test that takes a `family` argument runs once per kernel family that is
compiled into the library and that this GPU can run (sm75 and sm80 on an
H100), forced with samattn.use_family.

Without a GPU the modules are still collected when they can be imported (so
CPU CI catches a broken test module), and every test is skipped; a module that
cannot be imported there (library not built) becomes one skipped placeholder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
# gpu_checks.py is imported by the test modules whatever pytest's import mode.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

HAS_CUDA = torch.cuda.is_available()
NO_CUDA_REASON = "no CUDA device: the GPU tier runs on a GPU machine (ci/gpu_session.sh)"

# Family ids used to collect the tests where no GPU can say which apply.
_FAMILIES_WITHOUT_GPU = ["sm75", "sm80"]


class _Placeholder(pytest.Item):
    def runtest(self) -> None:
        pytest.skip(self.reason)

    def reportinfo(self):
        return self.path, 0, self.name


class _GpuModule(pytest.Module):
    def collect(self):
        try:
            return super().collect()
        except Exception as error:
            if HAS_CUDA:
                raise
            # Without a GPU, e.g. samattn not importable: one skipped placeholder.
            item = _Placeholder.from_parent(self, name="module")
            item.reason = f"{NO_CUDA_REASON}; not importable here: {error}".splitlines()[0]
            return [item]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A test that reaches a head dim or an op group this build left out
    (SAMATTN_ATTENTION_HEAD_DIMS, SAMATTN_OPS: a subset build, e.g. one that fits a GPU
    session's time) is skipped with the library's reason instead of failing; a complete
    build never raises this."""
    try:
        return (yield)
    except Exception as error:
        left_out = ("which this build left out", "this library was built without the")
        # The library's message in the error or in one it caused (torch.compile wraps
        # it; the C API tests assert on the status with the message): only the library
        # writes these phrases.
        cause: BaseException | None = error
        for _ in range(8):
            if cause is None:
                break
            text = str(cause)
            if any(s in text for s in left_out):
                line = next(line for line in text.splitlines() if any(s in line for s in left_out))
                pytest.skip(line.strip())
            cause = cause.__cause__ or cause.__context__
        raise


def pytest_pycollect_makemodule(module_path, parent):
    return _GpuModule.from_parent(parent, path=module_path)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "family" not in metafunc.fixturenames:
        return
    if HAS_CUDA:
        from gpu_checks import runnable_families

        families = runnable_families()
    else:
        families = _FAMILIES_WITHOUT_GPU
    metafunc.parametrize("family", families)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason=NO_CUDA_REASON)
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.gpu)
            if not HAS_CUDA:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_matmul_precision():
    """Tests may change torch's fp32 matmul precision; put it back afterwards."""
    precision = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(precision)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
