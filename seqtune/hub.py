"""Hugging Face hub ids in model.path / tokenizer.path, resolved offline-first with huggingface_hub.

`model.path=Qwen/Qwen3-8B` (with `model.revision`) becomes the local snapshot directory of the hub cache
(HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub), as huggingface_hub lays it out
(models--org--name/refs/<revision>, snapshots/<sha>/, blobs/). The cache is asked first and only
(local_files_only) when HF_HUB_OFFLINE=1; otherwise a missing snapshot is downloaded: safetensors weights, the
JSON configs and tokenizer files only (never pickle weights, never code). Every refusal is a ModelLoadError (exit
2) before anything loads: not cached while offline (naming the cache and the `hf download` command), gated or
unauthorised (naming HF_TOKEN), unknown id or revision. The token is read by huggingface_hub from HF_TOKEN or its
own login file and never passes through seqtune's config, plan, log or outputs: config.yaml keeps the id.

Every process resolves the same way (the parent, then each rank from config.yaml), so ranks read the snapshot the
parent fetched, from the cache, without the network.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from seqtune.config.errors import ModelLoadError

# org/name as the hub spells ids (one slash, no leading ./ or /); a local path that exists always wins.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# What a checkpoint needs from a repository: weights as safetensors, configs, tokenizer and template files.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt", "*.tiktoken"]
TRUE = {"1", "ON", "YES", "TRUE"}


def is_hub_id(value: str | None) -> bool:
    return value is not None and HUB_ID.match(value) is not None and not Path(value).expanduser().exists()


def hub_cache() -> Path:
    """The hub cache huggingface_hub uses, from the environment as it reads it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


# The user's HF_HUB_OFFLINE as it was before seqtune's entry points set it to 1 for every other library.
USER_OFFLINE = "SEQTUNE_USER_HF_HUB_OFFLINE"


def offline() -> bool:
    """Whether the user forbids downloads (HF_HUB_OFFLINE=1 as they set it)."""
    value = os.environ[USER_OFFLINE] if USER_OFFLINE in os.environ else os.environ.get("HF_HUB_OFFLINE", "")
    return value.upper() in TRUE


def fetch_command(repo_id: str, revision: str | None, repo_type: str = "model") -> str:
    """The command that puts `repo_id` into the hub cache (huggingface_hub's CLI)."""
    command = f"hf download {repo_id}"
    if repo_type != "model":
        command += f" --repo-type {repo_type}"
    return command + (f" --revision {revision}" if revision else "")


def snapshot_origin(path: str | Path) -> tuple[str, str, str] | None:
    """(repo_id, repo_type, commit) when `path` is a snapshot directory of the hub cache
    (<cache>/models--org--name/snapshots/<commit>), else None: what `hf download` re-fetches it from."""
    parts = Path(path).expanduser().absolute().parts
    if len(parts) < 3 or parts[-2] != "snapshots":
        return None
    kind, _, name = parts[-3].partition("--")
    if kind not in ("models", "datasets", "spaces") or "--" not in name:
        return None
    return name.replace("--", "/", 1), kind[:-1], parts[-1]


def repair_command(path: str | Path, files: list[str]) -> str | None:
    """The `hf download` command that fetches `files` of the hub snapshot `path` again (None: not a snapshot).
    --force-download, because a damaged blob that still exists is otherwise kept."""
    origin = snapshot_origin(path)
    if origin is None:
        return None
    repo_id, repo_type, commit = origin
    return fetch_command(" ".join([repo_id, *files]), commit, repo_type) + " --force-download"


def resolve_snapshot(repo_id: str, *, revision: str | None, key: str, repo_type: str = "model") -> Path:
    """The local snapshot directory of `repo_id` at `revision` (None = main): from the cache, else downloaded
    unless HF_HUB_OFFLINE=1. Raises ModelLoadError naming `key` and the fix."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache()
    at = f"@{revision}" if revision else ""
    patterns = CHECKPOINT_FILES if repo_type == "model" else None
    try:
        return Path(
            snapshot_download(
                repo_id,
                repo_type=repo_type,
                revision=revision,
                cache_dir=cache,
                local_files_only=True,
                allow_patterns=patterns,
            )
        )
    except LocalEntryNotFoundError:
        if offline():
            raise ModelLoadError(
                f"{key}={repo_id}{at}: no such local directory, and as a hub id not in the hub cache {cache}"
                f"{_cached_revisions(cache, repo_id, revision, repo_type)}, and HF_HUB_OFFLINE=1 forbids downloading it.",
                key=key,
                fix=f"fetch it once online: `{fetch_command(repo_id, revision, repo_type)}` (HF_HUB_CACHE="
                f"{cache}), then rerun; or unset HF_HUB_OFFLINE",
            ) from None
    return _download(repo_id, revision=revision, cache=cache, key=key, repo_type=repo_type, patterns=patterns)


def _cached_revisions(cache: Path, repo_id: str, revision: str | None, repo_type: str) -> str:
    """What the cache holds of `repo_id` when it holds some of it: the refs/<revision> file that is missing (or
    the snapshot it names), and the revisions it does hold."""
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    if not repo.is_dir():
        return ""
    refs = repo / "refs"
    held = sorted(str(p.relative_to(refs)) for p in refs.rglob("*") if p.is_file()) if refs.is_dir() else []
    ref = refs / (revision or "main")
    if ref.is_file():
        commit = ref.read_text().strip()
        return f" ({ref} names commit {commit}, whose snapshot {repo / 'snapshots' / commit} is missing)"
    return f" ({ref} does not exist; the cache holds revision(s) {', '.join(held) or 'none'} of it)"


def _download(
    repo_id: str, *, revision: str | None, cache: Path, key: str, repo_type: str, patterns: list[str] | None
) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    at = f"@{revision}" if revision else ""
    command = fetch_command(repo_id, revision, repo_type)
    token_fix = (
        f"set HF_TOKEN to a token whose account accepted the {repo_type}'s terms (or run `hf auth login`), "
        f"then rerun; or fetch it yourself: `{command}`"
    )
    # seqtune's entry points set HF_HUB_OFFLINE=1 so that no library downloads on its own; this one download, of
    # what the user named while online, is allowed (huggingface_hub reads the flag from its constants module).
    saved, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, False
    try:
        return Path(
            snapshot_download(repo_id, repo_type=repo_type, revision=revision, cache_dir=cache, allow_patterns=patterns)
        )
    except GatedRepoError:
        raise ModelLoadError(
            f"{key}={repo_id}{at} is gated: this account (HF_TOKEN) may not download it.", key=key, fix=token_fix
        ) from None
    except RevisionNotFoundError:
        raise ModelLoadError(
            f"{key}={repo_id}: revision {revision!r} does not exist.",
            key="model.revision",
            fix="model.revision=null (main), or a branch, tag or commit of the repository",
        ) from None
    except RepositoryNotFoundError:
        raise ModelLoadError(
            f"{key}={repo_id}{at}: no such repository, or it is private and HF_TOKEN is not set "
            "to a token that may read it.",
            key=key,
            fix=token_fix,
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as err:  # no network, a proxy, a full disk: said, not a traceback
        raise ModelLoadError(
            f"{key}={repo_id}{at}: downloading into the hub cache {cache} failed "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}).",
            key=key,
            fix=f"fetch it with `{command}` where the hub is reachable, then rerun with HF_HUB_OFFLINE=1",
        ) from None
    finally:
        constants.HF_HUB_OFFLINE = saved


def resolve_hub_paths(cfg):
    """`cfg` (RootConfig) with hub ids in model.path / tokenizer.path replaced by their local snapshots."""
    model, tok = cfg.model, cfg.tokenizer
    if model.revision and not is_hub_id(model.path):
        from seqtune.config.errors import ConfigError

        raise ConfigError(
            f"model.revision={model.revision} but model.path={model.path} is not a hub id (org/name).",
            key="model.revision",
            fix="model.revision=null, or model.path=ORG/NAME",
        )
    if is_hub_id(tok.path):  # the model's own repository is read at the model's revision
        revision = model.revision if tok.path == model.path else None
        cfg.tokenizer = replace(tok, path=str(resolve_snapshot(tok.path, revision=revision, key="tokenizer.path")))
    if is_hub_id(model.path):
        cfg.model = replace(model, path=str(resolve_snapshot(model.path, revision=model.revision, key="model.path")))
    return cfg


# data.<split>=hf:org/name[:config][@split]: the hub split a seqtune split reads when @split is not given.
DEFAULT_SPLITS = {"data.train": "train", "data.val": "validation", "data.test": "test"}
HF_DATASET = re.compile(r"^hf:(?P<id>[^@:]+)(?P<rest>([@:][^@:]+)*)$")


def dataset_files(spec: str, key: str) -> list[Path]:
    """The data files of a hub dataset's split, `hf:org/name[:config][@split]` (either order), as `datasets`
    assigns them (the repository's README `configs:`, else its file-name conventions), from the snapshot in the
    hub cache (offline-first, as for models). seqtune reads them with its own readers (streamed in data.mode=stream),
    so a bad record's file:N is <cache>/datasets--org--name/snapshots/<sha>/<the split's file>:N."""
    from seqtune.config.errors import DataError

    match = HF_DATASET.match(spec)
    if match is None:
        raise DataError(
            f"{key}={spec} is not a hub dataset id.",
            key=key,
            fix=f"{key}=hf:ORG/NAME, with :CONFIG and/or @SPLIT (e.g. hf:org/name:default@train)",
        )
    parts = dict((part[0], part[1:]) for part in re.findall(r"[@:][^@:]+", match["rest"]))
    repo_id, config, split = match["id"], parts.get(":"), parts.get("@", DEFAULT_SPLITS.get(key.split("[")[0], "train"))
    snapshot = resolve_snapshot(repo_id, revision=None, key=key, repo_type="dataset")
    import datasets

    try:
        builder = datasets.load_dataset_builder(str(snapshot), name=config)
    except (ValueError, FileNotFoundError) as err:
        raise DataError(
            f"{key}={spec}: `datasets` finds no config {config!r} in {snapshot} ({err}).",
            key=key,
            fix=f"{key}=hf:{repo_id}:CONFIG with a config the dataset card names",
        ) from None
    files = {str(name): found for name, found in (builder.config.data_files or {}).items()}
    if split not in files:
        raise DataError(
            f"{key}={spec}: the dataset has no split {split!r} (it has {sorted(files)}).",
            key=key,
            fix=f"{key}=hf:{repo_id}{':' + config if config else ''}@SPLIT with one of {sorted(files)}",
        )
    return [Path(str(file)) for file in files[split]]


# The key that asks for a push, and the commands that log in and push a finished run again (one copy of each).
PUSH_KEY = "train.push_to_hub"
LOGIN_FIX = "run `hf auth login` (or set HF_TOKEN to a token with write access)"


def push_command(run_dir: Path | str, repo_id: str, *, private: bool = True) -> str:
    """The command that pushes a finished run's proven export later (seqtune.export's CLI)."""
    return f"python -m seqtune.export {run_dir} --push {repo_id}" + ("" if private else " --public")


def push_problems(repo_id: str, *, key: str = PUSH_KEY, off: str = f"{PUSH_KEY}=null") -> list[str]:
    """Why pushing to `repo_id` (asked by `key`; `off` is how to not ask) cannot work, found without the network
    (none: []): the id as huggingface_hub validates it (with a namespace: org/name), HF_HUB_OFFLINE=1, and no token
    (HF_TOKEN or `hf auth login`'s file; huggingface_hub reads it again at push time, so the value is never held
    or shown here)."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    problems: list[str] = []
    try:
        validate_repo_id(repo_id)
        if "/" not in repo_id:
            raise HFValidationError("a repository to push to is named with its owner")
    except HFValidationError as err:
        problems.append(f"{key}={repo_id} is not a Hub repository id ({err}). Fix: {key}=ORG/NAME")
    if offline():
        problems.append(
            f"{key}={repo_id} with HF_HUB_OFFLINE=1: the upload would be refused. Fix: unset HF_HUB_OFFLINE, or "
            f"{off} and push later where the Hub is reachable with `{push_command('RUN_DIR', repo_id)}`"
        )
    try:
        token = get_token()
    except Exception as err:  # noqa: BLE001  # an OIDC exchange HF_OIDC_RESOURCE asked for failed: said, not raised
        token, why = None, f" (huggingface_hub: {type(err).__name__})"
    else:
        why = ""
    if not token:
        problems.append(
            f"{key}={repo_id}, but no Hugging Face token is available{why}, so the upload would fail. "
            f"Fix: {LOGIN_FIX}, or {off}"
        )
    return problems
