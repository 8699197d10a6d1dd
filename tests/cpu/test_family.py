"""samattn.use_family: validation, nesting, thread-locality; samattn.built_families."""

from __future__ import annotations

import ctypes
import threading

import pytest

import samattn
from samattn import _family, _lib


@pytest.mark.parametrize("name", ["sm70", "SM80", "auto", "", 80, "sm_80"])
def test_invalid_names(name):
    with pytest.raises(ValueError, match="unknown family") as raised:
        samattn.use_family(name)
    assert "'sm75', 'sm80', 'sm90' or None" in str(raised.value)


def test_nesting_restores_the_outer_choice():
    assert _family.requested_family() == _lib.FAMILY_AUTO
    with samattn.use_family("sm80"):
        assert _family.requested_family() == 80
        with samattn.use_family("sm75"):
            assert _family.requested_family() == 75
            with samattn.use_family(None):
                assert _family.requested_family() == _lib.FAMILY_AUTO
            assert _family.requested_family() == 75
        assert _family.requested_family() == 80
    assert _family.requested_family() == _lib.FAMILY_AUTO


def test_restores_on_exception():
    with pytest.raises(KeyError), samattn.use_family("sm90"):
        raise KeyError
    assert _family.requested_family() == _lib.FAMILY_AUTO


def test_one_object_can_be_entered_twice():
    force = samattn.use_family("sm75")
    with force, force:
        assert _family.requested_family() == 75
    assert _family.requested_family() == _lib.FAMILY_AUTO


def test_thread_local():
    seen: dict[str, int] = {}
    inside = threading.Event()
    checked = threading.Event()

    def other_thread() -> None:
        inside.wait()
        seen["other"] = _family.requested_family()
        with samattn.use_family("sm75"):
            seen["other forced"] = _family.requested_family()
            checked.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with samattn.use_family("sm80"):
        inside.set()
        checked.wait()
        seen["main"] = _family.requested_family()
    thread.join()
    assert seen == {"other": _lib.FAMILY_AUTO, "other forced": 75, "main": 80}


def test_built_families_match_the_library_mask():
    mask = _lib.lib().samattn_built_families()
    assert samattn.built_families() == [
        name for name, bit in (("sm75", 1), ("sm80", 2), ("sm90", 4)) if mask & bit
    ]


def test_last_family_starts_empty_in_a_new_thread():
    result = []
    thread = threading.Thread(target=lambda: result.append(_lib.last_family()))
    thread.start()
    thread.join()
    assert result == [None]


def test_last_family_is_the_threads_out_parameter():
    """Every op call writes the thread's family out-parameter; last_family reads it."""
    _lib.set_last_family(80)
    assert _lib.last_family() == "sm80"
    assert ctypes.cast(_lib.family_out(), ctypes.POINTER(ctypes.c_int32)).contents.value == 80
    _lib.set_last_family(_lib.FAMILY_AUTO)  # what the library writes when nothing ran
    assert _lib.last_family() is None


def test_a_backward_replays_its_forwards_family():
    """replays_family runs a backward with ctx.family forced (autograd runs it on a thread
    of its own), restores the thread's choice after it, even when it raises, and enters
    no context when the thread already requests that family."""
    seen = []

    @_family.replays_family
    def backward(ctx, grad):
        """The op's formula."""
        seen.append(_family.requested_family())
        if grad == "raise":
            raise RuntimeError("bad gradient")
        return grad

    class Ctx:
        family = 75

    assert backward(Ctx(), 1) == 1 and seen == [75]
    assert _family.requested_family() == _lib.FAMILY_AUTO
    with pytest.raises(RuntimeError, match="bad gradient"):
        backward(Ctx(), "raise")
    assert _family.requested_family() == _lib.FAMILY_AUTO
    with samattn.use_family("sm80"):
        Ctx.family = 80
        entered = []
        original = _family._forced_code.__enter__
        _family._forced_code.__enter__ = lambda self: entered.append(1) or original(self)
        try:
            assert backward(Ctx(), 2) == 2 and seen[-1] == 80 and not entered
            Ctx.family = _lib.FAMILY_AUTO  # a forward that forced nothing, here under sm80
            assert backward(Ctx(), 3) == 3 and seen[-1] == _lib.FAMILY_AUTO and entered
        finally:
            _family._forced_code.__enter__ = original
        assert _family.requested_family() == 80
    assert backward.__doc__ == "The op's formula."
