"""Benchmarks of samattn against torch, measured in the same run.

    python -m samattn.bench [--ops gemm,linear,split_k,grouped,softmax,attention,terms,dropout,
                             decode,decode_fp8,overhead]
                            [--families auto,sm90,sm80,sm75] [--quick] [--json PATH]
                            [--plot PATH] [--terms-features alibi,sinks,bool_mask,float_mask]
                            [--compare OLD.json [NEW.json] [--threshold PERCENT]
                             [--compare-by samattn|ratio] [--report-only]]

Each op of --ops is a routine, ``samattn/bench/routines/<op>.py``, whose docstring says what
it measures and against which torch op; its cases are data in ``samattn/bench/cases.py``
(``--quick``: a few of them). Every case runs for every family of --families: ``auto`` (the
library's choice for the GPU) and the forced ones; the default is ``auto`` and every family
built into the library that the GPU can run, so that a regression of any family shows.
A case that a family or the build cannot run (UnsupportedError, NotImplementedError) goes to
the JSON's ``skipped`` list with the library's message. ``ratio`` is samattn / torch: above
1 is faster (the overhead records: torch's host time / samattn's; decode_fp8: samattn on the
bf16 cache / samattn on the fp8 cache quantized from it).

Timing (``samattn/bench/timing.py``): CUDA events around every call, median of 20-200 calls
(about 0.2 s of GPU time per measurement, less with --quick) after a warm-up. Before the
timed calls the GPU is kept busy (torch.cuda._sleep) for as long as the CPU needs to queue
them all, so Python overhead between calls does not count: the numbers are GPU time. Inputs
are fresh random normal data; when one set of inputs fits in twice the L2 cache, several
sets are rotated so that every call reads from memory, not from L2.

Results go to benchmarks/results/<gpu>.json (relative to the current folder; --json DIR/
picks the folder), with the GPU, torch, CUDA and samattn versions and this command line;
--plot writes a PNG of the ratios (needs matplotlib). ``--compare OLD.json NEW.json``
(``samattn/bench/compare.py``) lists every record that moved by more than --threshold
percent (5) between two files of one GPU and exits with 1 when one got slower;
``--compare OLD.json`` alone runs the benchmark first and compares its file with OLD.
"""

from .cases import OPS
from .cli import FAMILIES, main, parse_args

__all__ = ["FAMILIES", "OPS", "main", "parse_args"]
