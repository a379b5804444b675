"""Reward functions on an image-text run: `images` (TRL's keyword) is handed each completion's prompt's image paths,
in place of a data column of that name; the bundled image reward reads the colour off the image's pixels."""

from __future__ import annotations

from pathlib import Path

from seqtune.rollout.examples import image_colour, names_the_colour
from seqtune.rollout.rewards import Reward, call_reward, dry_call_problems

IMAGES = Path(__file__).resolve().parents[2] / "integration/data/vision_prompts/images"


def reward(fn) -> Reward:
    return Reward(key="rollout.rewards[0]", ref="test", name=fn.__name__, fn=fn, columns=())


def test_the_handed_images_replace_a_column_of_that_name():
    seen = {}

    def reads(prompts, completions, images, **columns):
        seen["images"] = images
        return [float(len(paths)) for paths in images]

    def by_kwargs(prompts, completions, colour, **kwargs):  # TRL's usual shape: **kwargs takes what is handed
        return [float(kwargs["images"] == paths and c == "red") for c in colour]

    paths = [[str(IMAGES / "red_circle_0.png")], []]
    columns = {"images": [["images/red_circle_0.png"], []], "colour": ["red", "none"]}
    handed = {"images": paths}
    assert call_reward(reward(reads), ["p", "q"], ["a", "b"], [[1], [2]], columns, handed=handed) == [1.0, 0.0]
    assert seen["images"] == paths  # the resolved paths, not the column as written
    assert call_reward(reward(by_kwargs), ["p", "q"], ["a", "b"], [[1], [2]], columns, handed=handed) == [1.0, 0.0]
    assert dry_call_problems([reward(reads)], [{"prompt": "p"}], {"images": [paths[0]]}) == []
    assert dry_call_problems([reward(reads)], [{"prompt": "p"}])  # not handed (a text-only run): named


def test_the_bundled_image_reward_reads_each_images_colour():
    files = sorted(IMAGES.glob("*.png"))
    assert [image_colour(str(f)) for f in files] == [f.name.split("_")[0] for f in files]
    red = [str(IMAGES / "red_circle_0.png")]
    out = names_the_colour(["p"] * 3, ["A red one", [{"role": "assistant", "content": "blue"}], "x"], [red, red, []])
    assert out == [1.0, 0.0, None]
