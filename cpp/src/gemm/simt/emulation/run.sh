#!/usr/bin/env bash
# Builds and runs the CPU emulation of the SIMT GEMM kernel (no GPU needed).
# Usage, from the repository root: cpp/src/gemm/simt/emulation/run.sh
set -euo pipefail
cutlass=$(python -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
cuda=${CUDA_HOME:-/usr/local/cuda}
out=${TMPDIR:-/tmp}/samattn_simt_emulation
g++ -std=c++17 -O1 -pthread -Wno-deprecated-declarations -DSAMATTN_SIMT_EMULATION \
  -I cpp/src -I cpp/include -I "$cutlass" -I "$cuda/include" -I "$cuda/include/cccl" \
  cpp/src/gemm/simt/emulation/simt_emulation.cpp -o "$out"
"$out"
