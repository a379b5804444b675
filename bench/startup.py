"""Start-up cost: python bench/startup.py [--records 5000] [--repeats 5] [--tree DIR] [--baseline DIR] [--workdir DIR]

What a user waits for before anything useful happens, against the floor of doing the same tokenizing by hand:

- **plain tokenize script**: a fresh `python` that imports transformers, loads the same tokenizer (the real Llama 3
  one, `scripts/fetch_tokenizers.py --only llama3`) and encodes the same rendered texts (alpaca prompt + answer, as
  seqtune renders them; read from a JSON file written before the timing, so the script pays no parsing).
- **`python -m seqtune preflight.only=true`** on the same records (model=llama3_tiny tokenizer=llama3
  model.resize_embeddings=true), with a cold token cache (a new `data.cache_dir` each run) and cached (the cache of
  a previous run). Exit code 0 is required of every run.
- **the default run** (`python -m seqtune`, no arguments, in an empty directory): time until the end of its first
  training step, and its total. The first step is seen by running it under a pseudo-terminal, where the training
  bar redraws after every step: the first `train: ... 1/300` (or later count) marks it, with no change to seqtune.

Each round runs every command once, in order, and the rounds alternate them; the table has medians (min-max) over
the rounds. Every timed run takes `/tmp/seqtune-timing.lock` (flock) so timing runs of other people do not overlap.

Data: 5,000 generated Alpaca-shaped records (no copy of the Stanford Alpaca set is installable from a package
registry here): English words in sentences, lengths drawn to match Alpaca's (instruction ~13 words, an input on
40% of records, answers with a median of ~30 words and a long tail), every record distinct. `--data FILE` uses a
real alpaca JSONL instead.

`--tree DIR` times another source tree (e.g. an export of an older commit) instead of this one, and `--baseline DIR`
times a second tree in the same rounds. Such a tree is put first on PYTHONPATH and must import as `seqtune` with `seqtune.configs` and `seqtune.recipes` inside it (symlinks
`DIR/seqtune/configs -> ../configs`, `DIR/seqtune/recipes -> ../recipes` in an export); the script checks that.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import random
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import REPO, markdown_table, write_results

LOCK = "/tmp/seqtune-timing.lock"
SEQTUNE_ARGS = ["model=llama3_tiny", "tokenizer=llama3", "model.resize_embeddings=true"]

# Common English words: the generated text tokenizes at about the rate of English prose.
WORDS = (
    "the of and to a in is it you that he was for on are with as his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look "
    "more day could go come did number sound no most people my over know water than call first who may down "
    "side been now find any new work part take get place made live where after back little only round man year "
    "came show every good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air well also play "
    "small end put home read hand port large spell add even land here must big high such follow act why ask men "
    "change went light kind off need house picture try us again animal point mother world near build self earth "
    "father head stand own page should country found answer school grow study still learn plant cover food sun "
    "four between state keep eye never last let thought city tree cross farm hard start might story saw far sea "
    "draw left late run while press close night real life few north open seem together next white children begin"
).split()


def _sentence(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choices(WORDS, k=max(1, words)))
    return text[0].upper() + text[1:] + rng.choice(".....?!")


def _text(rng: random.Random, words: int) -> str:
    sentences, left = [], max(1, words)
    while left > 0:
        n = min(left, max(3, int(rng.gauss(14, 5))))
        sentences.append(_sentence(rng, n))
        left -= n
    return " ".join(sentences)


def alpaca_like_records(n: int, seed: int = 0) -> list[dict[str, str]]:
    """Alpaca's shape and lengths (instruction median ~12 words, input on 40%, answer median ~30 words with a
    long tail), every record distinct (preflight would drop copies, and the counts would not be n)."""
    rng = random.Random(seed)
    out: list[dict[str, str]] = []
    for _ in range(n):
        instruction = _text(rng, min(60, int(rng.lognormvariate(2.45, 0.45))))
        has_input = rng.random() < 0.4
        input_text = _text(rng, min(200, int(rng.lognormvariate(2.6, 0.8)))) if has_input else ""
        output = _text(rng, min(600, int(rng.lognormvariate(3.4, 0.9))))
        out.append({"instruction": instruction, "input": input_text, "output": output})
    return out


PLAIN_SCRIPT = """
import json, sys
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
texts = json.loads(open(sys.argv[2], encoding="utf-8").read())
encoded = tokenizer(texts)
print(sum(len(ids) for ids in encoded["input_ids"]), "tokens")
"""


def write_inputs(work: Path, records: int, data: Path | None) -> tuple[Path, Path]:
    """The alpaca JSONL (generated unless --data) and its rendered texts (what the plain script encodes)."""
    from seqtune.data.formats import LineParser, PromptCompletion

    if data is None:
        data = work / "alpaca.jsonl"
        with data.open("w", encoding="utf-8") as f:
            for record in alpaca_like_records(records):
                f.write(json.dumps(record) + "\n")
    parser = LineParser(fmt="alpaca", file=str(data))
    texts = []
    with data.open("rb") as f:
        for number, line in enumerate(f, 1):
            record = parser.parse(number, line)
            assert isinstance(record, PromptCompletion), f"{data}:{number} is not an alpaca record: {record}"
            texts.append(record.prompt + record.completion)
    rendered = work / "texts.json"
    rendered.write_text(json.dumps(texts), encoding="utf-8")
    return data, rendered


def tree_environ(tree: Path) -> dict[str, str]:
    """The environment that makes `python -m seqtune` import `tree`; refuses a tree that would not be the one run."""
    env = dict(os.environ)
    if tree != REPO:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    probe = "import seqtune, seqtune.configs, seqtune.recipes; print(seqtune.__file__, seqtune.configs.__path__[0], seqtune.recipes.__path__[0])"
    where = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True
    )
    paths = where.stdout.split()
    if (
        where.returncode != 0
        or len(paths) != 3
        or not all(Path(p).resolve().is_relative_to(tree.resolve()) for p in paths)
    ):
        sys.exit(
            f"{tree}: `python -m seqtune` would not run this tree ({where.stdout.strip() or where.stderr.strip()})"
        )
    return env


class TimingLock:
    """/tmp/seqtune-timing.lock held around each timed run (flock, as `flock LOCK cmd` takes it): the wait for it is
    not timed. Do not run this script under `flock` itself (the inner lock would wait for the outer one)."""

    def __enter__(self) -> TimingLock:
        import fcntl

        self.file = open(LOCK, "a")  # held until __exit__
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


def timed(command: list[str], *, env: dict[str, str], cwd: Path, log: Path) -> float:
    with TimingLock(), log.open("w") as out:
        began = time.perf_counter()
        code = subprocess.run(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
        seconds = time.perf_counter() - began
    if code != 0:
        sys.exit(f"{' '.join(command)} exited {code}: see {log}")
    return seconds


FIRST_STEP = re.compile(rb"train:[^\r\n|]*\|[^|]*\|\s*(\d+)/\d+")


def timed_default(*, env: dict[str, str], cwd: Path, log: Path) -> tuple[float, float]:
    """`python -m seqtune` under a pseudo-terminal: (seconds to the end of the first training step, total)."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    output, first = bytearray(), None
    with TimingLock():
        began = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "seqtune"], env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave
        )
        os.close(slave)
        while True:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    break
                output += chunk
                if first is None and any(int(n) >= 1 for n in FIRST_STEP.findall(chunk)):
                    first = time.perf_counter() - began
            elif child.poll() is not None:
                break
        code = child.wait()
        total = time.perf_counter() - began
    os.close(master)
    log.write_bytes(bytes(output))
    if code != 0 or first is None:
        sys.exit(f"python -m seqtune exited {code} (first step seen: {first is not None}): see {log}")
    return first, total


def median_cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5, help="rounds of plain / cold / cached")
    parser.add_argument("--default-repeats", type=int, default=3, help="rounds that also run the default (0: none)")
    parser.add_argument("--tree", type=Path, default=REPO, help="the seqtune source tree to time")
    parser.add_argument("--baseline", type=Path, default=None, help="a second tree, timed in the same rounds")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--data", type=Path, default=None, help="a real alpaca JSONL instead of generated records")
    parser.add_argument("--tokenizer", type=Path, default=None, help="default: the fetched llama3 tokenizer")
    args = parser.parse_args()
    cache_root = Path(os.environ.get("SEQTUNE_CACHE") or Path.home() / ".cache" / "seqtune").expanduser()
    tokenizer = args.tokenizer or cache_root / "tokenizers" / "llama3"
    if not (tokenizer / "tokenizer.json").exists():
        sys.exit(f"{tokenizer} has no tokenizer.json: run python scripts/fetch_tokenizers.py --only llama3")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="seqtune-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    trees = {"tree": args.tree.resolve()} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    envs = {label: tree_environ(tree) for label, tree in trees.items()}
    data, texts = write_inputs(work, args.records, args.data)
    plain_script = work / "plain_tokenize.py"
    plain_script.write_text(PLAIN_SCRIPT)

    def preflight(label: str, cache: Path, name: str) -> float:
        run_dir = work / "runs" / label / name
        shutil.rmtree(run_dir, ignore_errors=True)
        command = [sys.executable, "-m", "seqtune", "preflight.only=true", *SEQTUNE_ARGS, f"data.train={data}"]
        command += [f"data.cache_dir={cache}", f"hydra.run.dir={run_dir}"]
        return timed(command, env=envs[label], cwd=work, log=work / f"{label}-{name}.log")

    for label in trees:
        preflight(label, work / f"cache-warm-{label}", "warm")  # fills the token cache the cached runs read
    times: dict[str, list[float]] = {"plain": []}
    loads: list[float] = []

    def record(key: str, seconds: float) -> None:
        times.setdefault(key, []).append(seconds)
        print(f"{key}: {seconds:.2f} s", flush=True)

    def default_run(label: str) -> None:
        first, total = timed_default(env=envs[label], cwd=_empty(work / f"default-{label}"), log=work / f"{label}.log")
        record(f"{label}:first_step", first)
        record(f"{label}:default_total", total)

    for round_no in range(args.repeats):
        runs: list[Callable[[], None]] = [
            lambda: record(
                "plain",
                timed(
                    PLAIN + [str(plain_script), str(tokenizer), str(texts)],
                    env=envs["tree"],
                    cwd=work,
                    log=work / "plain.log",
                ),
            )
        ]
        for label in trees:
            cold = work / f"cache-cold-{label}-{round_no}"
            runs.append(lambda label=label, cold=cold: record(f"{label}:cold", preflight(label, cold, "cold")))
            runs.append(
                lambda label=label: record(f"{label}:cached", preflight(label, work / f"cache-warm-{label}", "cached"))
            )
            if round_no < args.default_repeats:
                runs.append(lambda label=label: default_run(label))
        shift = round_no % len(runs)
        for run in runs[shift:] + runs[:shift]:  # alternate which command goes first
            loads.append(os.getloadavg()[0])
            run()
        for label in trees:
            shutil.rmtree(work / f"cache-cold-{label}-{round_no}", ignore_errors=True)
    (work / "times.json").write_text(json.dumps({"times": times, "loads": loads}, indent=1))
    report(args, trees, data, times, loads)
    payload = {"trees": {k: str(v) for k, v in trees.items()}, "records": args.records, "data": str(data)}
    print(f"\nwrote {write_results('startup', {**payload, 'seconds': times, 'load_avg': loads})}")


PLAIN = [sys.executable]


def _empty(directory: Path) -> Path:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def report(
    args: argparse.Namespace, trees: dict[str, Path], data: Path, times: dict[str, list[float]], loads: list[float]
) -> None:
    plain = statistics.median(times["plain"])

    def ratio(key: str) -> str:
        return f"{statistics.median(times[key]) / plain:.2f}x"

    rows = [
        [
            "plain script: import transformers, AutoTokenizer.from_pretrained, tokenizer(texts)",
            "",
            median_cell(times["plain"]),
            "1.00x",
        ]
    ]
    for label, tree in trees.items():
        where = f"{label} ({tree})"
        rows += [
            [
                f"`python -m seqtune preflight.only=true {' '.join(SEQTUNE_ARGS)} data.train=...`, cold token cache",
                where,
                median_cell(times[f"{label}:cold"]),
                ratio(f"{label}:cold"),
            ],
            [
                "the same, cached (the token cache of an earlier run)",
                where,
                median_cell(times[f"{label}:cached"]),
                ratio(f"{label}:cached"),
            ],
        ]
        if f"{label}:first_step" in times:
            rows += [
                [
                    "`python -m seqtune` (the default run): end of its first training step",
                    where,
                    median_cell(times[f"{label}:first_step"]),
                    "-",
                ],
                [
                    "`python -m seqtune`: the whole run (300 steps, evals, export proof)",
                    where,
                    median_cell(times[f"{label}:default_total"]),
                    "-",
                ],
            ]
    print(
        f"\n{args.records:,} records of {data}; seconds, median (min-max) of {args.repeats} alternating rounds "
        f"({args.default_repeats} with the default run); 1-minute load average at each run's start: "
        f"{min(loads):.2f}-{max(loads):.2f} (median {statistics.median(loads):.2f})\n"
    )
    print(markdown_table(["command", "tree", "seconds", "vs plain"], rows))


if __name__ == "__main__":
    main()
