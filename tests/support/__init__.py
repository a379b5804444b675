"""What tests share, imported as a library (`from tests.support.cli import run_cli`): the CLI runner, config
builders, tiny models and checkpoints, the fake hub. conftest.py files only declare fixtures, and no test module
imports another (tests/unit/test_test_layout.py checks both)."""
