"""The image-prompt test's reward: it proves each completion's prompt's images reach the reward functions (their
paths, which it opens) and scores 1 per image of the completion's prompt, plus a hundredth per character written
(so the completions of a group differ in reward and the update is not zero)."""

from pathlib import Path

from PIL import Image


def images_seen(prompts, completions, images, **columns):
    assert len(images) == len(completions)
    for paths in images:
        for path in paths:
            assert Path(path).suffix == ".png", path
            with Image.open(path) as image:
                image.verify()
    texts = [completion[-1]["content"] for completion in completions]  # message prompts: assistant turns
    return [float(len(paths)) + 0.01 * len(text) for paths, text in zip(images, texts, strict=True)]
