"""How a public samattn function reaches its kernel: directly, or through torch.library.

The ``torch.library`` ops (``torch.ops.samattn.*``) are what ``torch.compile``, tensor
subclasses, dispatch modes and functorch transforms need; in plain eager mode they only
add host time (tens of microseconds per call, several times a small kernel). So a public
function picks one of three routes per call:

- ``DIRECT``: plain CUDA tensors, no gradient needed, nothing intercepting torch calls:
  the CUDA implementation (``samattn/_cuda.py``) runs at once.
- ``AUTOGRAD``: the same, but a gradient is needed: a ``torch.autograd.Function`` whose
  forward is that CUDA implementation and whose backward is the op's own formula.
- ``DISPATCH``: everything else (tracing, fake or meta or CPU tensors, subclasses, modes,
  profiling): ``torch.ops.samattn.*``, which has fake implementations and registered
  autograd.

Every route runs the same validation (``samattn/_checks.py``) once and the same kernels.
"""

from __future__ import annotations

import torch

DIRECT = 0
AUTOGRAD = 1
DISPATCH = 2

# Tensor types whose storage samattn may read directly: Parameter only overrides
# __torch_function__ with torch's own no-op implementation.
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)

_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._len_torch_function_stack
_functorch_active = torch._C._are_functorch_transforms_active
_grad_enabled = torch.is_grad_enabled
_profiler = torch.autograd.profiler


def route(*tensors: torch.Tensor | None) -> int:
    """The route for a call on these tensors (None entries are optional arguments)."""
    if (
        _is_compiling()
        or _dispatch_modes()
        or _function_modes()
        or _functorch_active()
        or _profiler._is_profiler_enabled
    ):
        return DISPATCH
    needs_grad = False
    for t in tensors:
        if t is None:
            continue
        # Anything but a CUDA tensor (a CPU or meta tensor, a non-tensor) takes the
        # dispatcher's route, where the public function validates it first.
        if type(t) not in _PLAIN_TYPES or not t.is_cuda:
            return DISPATCH
        needs_grad = needs_grad or t.requires_grad
    return AUTOGRAD if needs_grad and _grad_enabled() else DIRECT
