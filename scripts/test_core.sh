#!/usr/bin/env bash
# The core package alone (`pip install .`: the linter, without torch or any extra) in a venv of its own: it installs
# from pyproject.toml at the lock's versions, has no torch, and its tests pass (the kb rules, lint/fix/migrate on the
# examples, the missing-extra messages, the lint configuration). scripts/test.sh runs it before the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
venv="${XLAPORT_CORE_VENV:-.venv-core}"
stamp="$venv/.xlaport-core"
want="$(cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  # the dependencies are current: only this checkout's code is installed again (a few seconds)
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall .
else
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  # -c: the core's dependencies at the versions verified together; pytest only to run the tests
  "$venv/bin/pip" install --quiet --disable-pip-version-check -c requirements.lock . pytest
  echo "$want" >"$stamp"
fi
rm -rf build  # setuptools' in-tree build folder
if "$venv/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"; then
  echo "error: $venv has torch: the core must install without it" >&2
  exit 1
fi
# pytest, not `python -m pytest`: the checkout's folders must not shadow the installed package
exec "$venv/bin/pytest" -q -p no:cacheprovider -m "not slow" \
  tests/test_core_install.py tests/test_lint_config.py tests/test_layers.py \
  tests/kb/test_kb_rules.py tests/kb/test_kb_engine.py tests/kb/test_kb_configs.py "$@"
