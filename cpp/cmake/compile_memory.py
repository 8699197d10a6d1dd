"""Compiler launcher that records how much memory each compile took.

    python compile_memory.py LOG COMMAND...

Runs COMMAND (ccache or the compiler) and appends "<peak KiB>\t<object>" to LOG. The peak
is getrusage(RUSAGE_CHILDREN).ru_maxrss: the largest resident set among COMMAND and every
process it waited for (nvcc's cicc and ptxas, the host compiler). A ccache hit records a
few MiB. ci/compile_jobs.py reads LOG to choose the number of parallel compile jobs.
"""

import resource
import subprocess
import sys

log, command = sys.argv[1], sys.argv[2:]
status = subprocess.call(command)
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
target = command[command.index("-o") + 1] if "-o" in command[:-1] else "?"
# One short line per write: appends from parallel compiles do not interleave.
with open(log, "a") as out:
    out.write(f"{peak_kib}\t{target}\n")
sys.exit(status)
