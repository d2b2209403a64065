#!/usr/bin/env bash
# Wheels the GPU check needs beyond what the device machine has (torch, transformers, accelerate, tokenizers):
# fetched here with `pip download --no-deps` into the git-ignored .gpu-wheels/, in parts of at most 60 MiB each
# (one call to the device machine carries at most 64 MiB), and installed there into .gpu-wheels/site.
#
#   scripts/gpu_wheels.sh fetch            # here: download and split into .gpu-wheels/part1, part2
#   scripts/gpu_wheels.sh install PART     # on the device machine, once per part: unpack into .gpu-wheels/site
#
# Measured sizes (cp312, manylinux x86_64): pyarrow 52.5 MiB, pandas 11.5 MiB, the rest 5.4 MiB: 69.4 MiB in all,
# over one call's 64 MiB, so they travel in two calls to a warm machine (part1: pyarrow; part2: the rest).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIR=.gpu-wheels
PART1=(pyarrow==26.0.1)
PART2=(trl==1.16.0 datasets==5.2.0 pandas==3.1.1 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 fsspec==2026.9.0
       pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5
       python_dateutil==2.9.0.post0 gguf==0.19.0)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

case "${1:-}" in
  fetch)
    for part in 1 2; do
      eval "pkgs=(\"\${PART${part}[@]}\")"
      mkdir -p "$DIR/part$part"
      "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 "${PLATFORMS[@]}" \
        -d "$DIR/part$part" "${pkgs[@]}"
      du -sh "$DIR/part$part"
    done ;;
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
  *) echo "usage: $0 fetch | install PART" >&2; exit 2 ;;
esac
