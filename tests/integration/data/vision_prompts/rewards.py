"""The image-prompt test's reward: it proves each completion's prompt's images reach the reward functions (their
paths, which it opens) and scores the number of images a completion's prompt had (1.0 for every prompt here)."""

from pathlib import Path


def images_seen(prompts, completions, images, **columns):
    assert len(images) == len(completions)
    for paths in images:
        for path in paths:
            assert Path(path).is_file() and path.endswith(".png"), path
    return [float(len(paths)) for paths in images]
