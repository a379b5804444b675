"""push_run uploads nothing unless the run's export proof passed (RUN_DIR/export.json ok), and says how to get
there; the Hub is never contacted (every non-loopback connection fails the test)."""

from __future__ import annotations

import json

import pytest

from seqtune.config.errors import SeqtuneError
from seqtune.export.push import push_run
from tests.support.hub_cache import guard_sockets


@pytest.mark.parametrize(
    ("report", "said"), [(None, "holds no export proof"), ({"ok": False}, "records a failed export proof")]
)
def test_no_passed_proof_no_upload(tmp_path, monkeypatch, report, said):
    attempts = guard_sockets(monkeypatch)
    if report is not None:
        (tmp_path / "export.json").write_text(json.dumps(report))
    with pytest.raises(SeqtuneError, match=f"train.push_to_hub=org/name: {tmp_path} {said}") as raised:
        push_run(tmp_path, "org/name", private=True)
    assert raised.value.exit_code == 1 and "nothing was uploaded" in str(raised.value)
    assert f"`python -m seqtune.export {tmp_path} --push org/name`" in str(raised.value)
    assert attempts == []
