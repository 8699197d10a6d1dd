#!/usr/bin/env bash
# flash-attn's tests against samattn on a GPU machine, from the repository root:
#
#   tests/flash_attn_compat/device_run.sh build        # libsamattn into build-fa/ (ninja resumes)
#   tests/flash_attn_compat/device_run.sh run [ARGS]   # run_flash_attn_tests.py on .fa/test_flash_attn.py
#   tests/flash_attn_compat/device_run.sh all [ARGS]   # both
#
# Needs .fa/test_flash_attn.py (flash-attn's file, never committed) and, to build,
# .whl/nvidia_cutlass-*.whl (CUTLASS's headers; nothing is fetched). The build is the
# attention ops for archs 75;90a, which gives every family on an H100 (sm80 runs as
# sm_90 machine code), with every head dim unless FA_HEAD_DIMS says otherwise
# (e.g. FA_HEAD_DIMS="64;128;256": faster; the runner then leaves out the cases of the
# other head dims). ARGS go to the runner; the default writes $OUT/flash_attn_tests.json.
# The build log goes to $OUT/build.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${FA_BUILD_DIR:-build-fa}
out=${OUT:-.}

build() {
    local cutlass=/tmp/site/cutlass_library/source/include
    if [ ! -f "$cutlass/cute/tensor.hpp" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
            .whl/nvidia_cutlass-*.whl
    fi
    cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DSAMATTN_CUDA_ARCHS="${FA_ARCHS:-75;90a}" -DSAMATTN_OPS=attention \
        -DSAMATTN_ATTENTION_HEAD_DIMS="${FA_HEAD_DIMS:-32;64;96;128;192;256}" \
        -DSAMATTN_CUTLASS_INCLUDE_DIR="$cutlass" >"$out/build.log" 2>&1
    local started=$SECONDS
    ninja -C "$build_dir" >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
    echo "built $build_dir/libsamattn.so in $((SECONDS - started)) s"
}

run() {
    local args=("$@")
    if [ ${#args[@]} -eq 0 ]; then
        args=(--families auto,sm90,sm80,sm75 --sample 240 --seed 46 --max-seconds 480)
    fi
    SAMATTN_LIBRARY="$PWD/$build_dir/libsamattn.so" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
        PYTHONUNBUFFERED=1 python3 tests/flash_attn_compat/run_flash_attn_tests.py \
        .fa/test_flash_attn.py --out "$out/flash_attn_tests.json" "${args[@]}"
}

case "${1:-}" in
    build) build ;;
    run) shift; run "$@" ;;
    all) shift; build; run "$@" ;;
    *) echo "usage: $0 build | run [ARGS] | all [ARGS]" >&2; exit 2 ;;
esac
