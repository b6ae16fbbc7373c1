"""Writes the toy data of docs/tasks.md "Your own problem on a CPU": reverse a short word, spelled
with spaces (``reverse: s u n =`` -> `` n u s``). 2000 training rows, 200 held-out rows of other
words (the settings of config.yaml were chosen on the training rows alone: the first 1800 to train,
the last 200 to validate).

    python examples/reverse/make_data.py      # rewrites train.jsonl and test.jsonl beside it
"""

import json
import random
from pathlib import Path

LETTERS = "abcdefghijklmnop"
TRAIN, TEST = 2000, 200


def rows(words):
    for word in words:
        yield {"prompt": f"reverse: {' '.join(word)} =", "target": " " + " ".join(reversed(word))}


def main() -> None:
    rng = random.Random(0)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < TRAIN + TEST:
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 5)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    here = Path(__file__).parent
    for name, part in (("train.jsonl", words[:TRAIN]), ("test.jsonl", words[TRAIN:])):
        (here / name).write_text("".join(json.dumps(row) + "\n" for row in rows(part)))


if __name__ == "__main__":
    main()
