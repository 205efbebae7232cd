#!/usr/bin/env bash
# Compile-checks one source file with the exact flags of the cuda preset build (nvcc for .cu, g++
# for .cpp), and for .cu files also with hipcc for gfx90a when hipcc is installed. Object files go
# to a scratch dir; nothing is linked. Usage: tools/compile_one.sh src/backend/gpu/gpu_mla.cu [...]
set -euo pipefail
cd "$(dirname "$0")/.."
db=build/cuda/compile_commands.json
[ -f "$db" ] || { echo "configure first: cmake --preset cuda -DMLA_WERROR=ON"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for f in "$@"; do
  abs=$(realpath "$f")
  cmd=$(python3 - "$db" "$abs" "$out" <<'PY'
import json, sys, shlex
db, path, out = sys.argv[1:4]
for e in json.load(open(db)):
    if e["file"] == path:
        args = shlex.split(e["command"])
        i = args.index("-o"); args[i + 1] = out + "/obj.o"
        args = [a for a in args if a not in ("-MD",)]
        # drop dependency-file flags
        clean = []
        skip = False
        for a in args:
            if skip: skip = False; continue
            if a in ("-MT", "-MF"): skip = True; continue
            clean.append(a)
        print(e["directory"] + "\n" + shlex.join(clean)); break
PY
)
  if [ -z "$cmd" ]; then
    # A file created after configure: reconfigure once so the glob picks it up.
    cmake --preset cuda -DMLA_WERROR=ON >/dev/null
    echo "reconfigured; rerun for $f"; status=1; continue
  fi
  dir=$(echo "$cmd" | head -1); line=$(echo "$cmd" | tail -1)
  echo "== $f"
  (cd "$dir" && eval "$line") || status=1
  if [[ "$f" == *.cu ]] && command -v hipcc >/dev/null; then
    echo "== $f (hipcc gfx90a)"
    hipcc -x hip --offload-arch=gfx90a -std=c++20 -O2 -Wall -Werror -Isrc -c "$f" -o "$out/hip.o" || status=1
  fi
done
exit $status
