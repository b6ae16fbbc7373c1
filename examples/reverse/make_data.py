"""Writes the toy data of docs/tasks.md "Your own problem on a CPU": reverse a short word, spelled
with spaces (``reverse: s u n =`` -> `` n u s``). 400 training rows, 100 held-out rows of other words.

    python examples/reverse/make_data.py      # rewrites train.jsonl and test.jsonl beside it
"""

import json
import random
from pathlib import Path

LETTERS = "abcdefghijklmnop"


def rows(words):
    for word in words:
        yield {"prompt": f"reverse: {' '.join(word)} =", "target": " " + " ".join(reversed(word))}


def main() -> None:
    rng = random.Random(0)
    words: list[str] = []
    while len(words) < 500:
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 5)))
        if word not in words:
            words.append(word)
    here = Path(__file__).parent
    for name, part in (("train.jsonl", words[:400]), ("test.jsonl", words[400:])):
        (here / name).write_text("".join(json.dumps(row) + "\n" for row in rows(part)))


if __name__ == "__main__":
    main()
