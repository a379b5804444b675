"""A run's proven export, uploaded to the Hugging Face Hub (`train.push_to_hub=ORG/NAME` at the end of a run, or
`python -m seqtune.export RUN_DIR --push ORG/NAME` later).

What goes up is what the run ships, at the repository's root so that `from_pretrained("ORG/NAME")` loads it:
merged/ when train.export_merged, else adapter/ (LoRA) or model/ (full fine-tune), plus every RUN_DIR/gguf/*.gguf
file, and the export's README.md card written for the repository (its loading lines name ORG/NAME; `base_model` is
model.path's hub id, or absent for a local base, which the Hub's metadata check refuses). Only after the export
proof passed (RUN_DIR/export.json says ok): a refused proof uploads nothing. huggingface_hub's HfApi creates the repository (private unless train.push_private=false;
an existing one keeps its visibility) and uploads the files in one upload_folder call; the token is the one
huggingface_hub reads itself (HF_TOKEN, else `hf auth login`'s file) and passes through no seqtune code, so it is
in no file of the run directory. A failed upload raises SeqtuneError (exit 1) naming the key and the command that
retries it; the run directory is left as it was (nothing is written into it).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from seqtune.config.errors import SeqtuneError
from seqtune.config.rundir import RUN_DIR_KEY
from seqtune.console import redact_uris
from seqtune.export.artifacts import GGUF_DIR
from seqtune.export.facts import CARD, card_text, data_files, ship_facts
from seqtune.export.proof import EXPORT_JSON, prove_exports
from seqtune.hub import LOGIN_FIX, PUSH_KEY, push_command
from seqtune.preflight.config_rules import load_checked

MERGED = "merged"


def pushed_files(run_dir: Path) -> tuple[Path, list[Path]]:
    """The export directory whose files go to the repository's root, and the GGUF files beside them."""
    cfg = load_checked(run_dir / "config.yaml")
    name = MERGED if cfg.train.export_merged else ("adapter" if cfg.lora.enabled else "model")
    return run_dir / name, sorted((run_dir / GGUF_DIR).glob("*.gguf"))


def require_proof(run_dir: Path, repo_id: str, key: str) -> None:
    """The export proof passed for this run directory (export.json ok), else SeqtuneError: nothing is uploaded."""
    path = run_dir / EXPORT_JSON
    report = json.loads(path.read_text()) if path.is_file() else None
    if not (report and report.get("ok") is True):
        said = "holds no export proof" if report is None else "records a failed export proof"
        raise SeqtuneError(
            f"{key}={repo_id}: {run_dir} {said} ({EXPORT_JSON}); nothing was uploaded.",
            key=key,
            fix=f"`python -m seqtune.export {run_dir}` names what fails; once it passes, "
            f"`{push_command(run_dir, repo_id)}`",
        )


def push_finished(run_dir: Path, repo_id: str, *, private: bool) -> str:
    """The end of a run: its proof ran on rank 0 at export (export.json), except a sharded run's, which runs here
    first (the ranks have exited, the weights are read from the run directory)."""
    if not (Path(run_dir) / EXPORT_JSON).is_file():
        prove_exports(Path(run_dir), key=RUN_DIR_KEY)
    return push_run(run_dir, repo_id, private=private)


def push_run(run_dir: Path, repo_id: str, *, private: bool, key: str = PUSH_KEY) -> str:
    """Upload the proven export of `run_dir` to `repo_id` (asked for by `key`); returns the commit's URL."""
    import httpx2  # huggingface_hub's HTTP client: its transport errors (no network, DNS, timeouts)
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    run_dir = Path(run_dir)
    require_proof(run_dir, repo_id, key)
    export, gguf = pushed_files(run_dir)
    retry = push_command(run_dir, repo_id, private=private)
    # seqtune's entry points set HF_HUB_OFFLINE=1 for every library; this upload, which the user asked for (and
    # preflight refused under their own HF_HUB_OFFLINE=1), is allowed, as seqtune.hub allows its one download.
    saved, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, False
    try:
        with tempfile.TemporaryDirectory(prefix="seqtune-push-") as staging:
            folder = _staged(Path(staging), export, gguf, repo_id)
            api = HfApi()
            url = api.create_repo(repo_id, private=private, exist_ok=True)
            with_gguf = f" and {len(gguf)} GGUF file(s)" if gguf else ""
            print(
                redact_uris(f"pushing {export.name}/{with_gguf} to {url} ({'private' if private else 'public'})"),
                flush=True,
            )
            commit = api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                commit_message=f"seqtune: {export.name}/ of {run_dir.name}",
            )
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        why = (
            f"the Hub refused the token (HTTP {status}): it is missing, expired, or may not write to {repo_id}"
            if status in (401, 403)
            else f"the Hub answered HTTP {status}: {_first_line(err)}"
        )
        fix = f"{LOGIN_FIX}, then `{retry}`" if status in (401, 403) else f"`{retry}`"
        raise _failed(key, repo_id, run_dir, why, fix) from None
    except (httpx2.HTTPError, OSError, ValueError) as err:  # no network, DNS, a proxy, a timeout, a full disk
        raise _failed(key, repo_id, run_dir, f"{type(err).__name__}: {_first_line(err)}", f"`{retry}`") from None
    finally:
        constants.HF_HUB_OFFLINE = saved
    pushed = redact_uris(str(commit.commit_url))  # HF_ENDPOINT may carry credentials
    print(f"pushed to the Hub: {pushed}", flush=True)
    return pushed


def _staged(staging: Path, export: Path, gguf: list[Path], repo_id: str) -> Path:
    """A folder of links: the export's files at the root, the GGUF files beside them (one commit, one layout,
    nothing written into the run directory), and the export's card as the repository's: loading from `repo_id`,
    with a `base_model` the Hub accepts (a hub id, else none: a local path there is refused with HTTP 400)."""
    from transformers import AutoTokenizer

    for source in [*sorted(p for p in export.rglob("*") if p.is_file() and p.name != CARD), *gguf]:
        link = staging / (source.relative_to(export) if source.is_relative_to(export) else Path(source.name))
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source.resolve())
    facts = ship_facts(AutoTokenizer.from_pretrained(export), export.parent)
    (staging / CARD).write_text(card_text(facts, export.name, files=data_files(facts), repo_id=repo_id))
    return staging


def _first_line(err: BaseException) -> str:
    return redact_uris(str(err).strip().splitlines()[0]) if str(err).strip() else type(err).__name__


def _failed(key: str, repo_id: str, run_dir: Path, why: str, fix: str) -> SeqtuneError:
    return SeqtuneError(
        f"{key}={repo_id}: the upload failed ({why}). The run directory {run_dir} is complete and proven; "
        "nothing in it was changed.",
        key=key,
        fix=f"push it again: {fix}",
    )
