#!/usr/bin/env bash
# The static checks CI runs before the tests, and the pre-commit hooks run on every commit (.pre-commit-config.yaml):
# lint, format and types, with the settings in pyproject.toml ([tool.ruff], [tool.mypy]). Fails on the first finding.
# `ruff format .` and `ruff check --fix .` repair most findings.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m mypy
