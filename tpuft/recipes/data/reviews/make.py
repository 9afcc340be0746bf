"""Make the Keras classification quickstart's data: short product reviews labelled positive or negative.

A review is one clause about an invented product praising or faulting one aspect ("the battery was
excellent"), "not" flipping it ("the lens was not flimsy" is positive). So a classifier has to read a word in
its context, not just spot happy words, and a tiny encoder over bytes learns it within minutes on a CPU.
Deterministic: re-running writes the same files. Run: python tpuft/recipes/data/reviews/make.py

Three files from one stream of 6,000 reviews: train.jsonl (the first 5,000), test.jsonl (the next 500:
``data.test``, evaluated once at the end of training) and eval.jsonl (the last 500, the same file as before
there was a test split, byte for byte, so eval numbers measured before stay comparable). Until issue 27
train.jsonl held the first 5,500.
"""

import json
import random
from pathlib import Path

PRODUCTS = "phone|kettle|laptop|bicycle|blender|camera|backpack|lamp|tent|headset".split("|")
ASPECTS = "battery|screen|price|handle|lid|lens|zip|switch|strap|sound|build|delivery|manual|colour".split(
    "|"
)
GOOD = "excellent|great|superb|reliable|sturdy|lovely|fantastic|solid|perfect|pleasant".split("|")
BAD = "awful|terrible|flimsy|poor|broken|disappointing|cheap|noisy|useless|horrible".split("|")
CONTRAST = 0.0
"""Share of reviews with a second, deciding clause after "but". A 2-layer encoder over bytes, trained from
scratch for minutes, stays at chance with them (or with openers such as "honestly," in front): its loss sits
at ln 2. The quickstart's data leaves them out; raise it to make a harder set."""


def clause(rng: random.Random) -> tuple[str, int]:
    """One clause and its polarity (+1 / -1)."""
    good = rng.random() < 0.5
    negated = rng.random() < 0.3
    adjective = rng.choice(GOOD if good else BAD)
    polarity = (1 if good else -1) * (-1 if negated else 1)
    return f"the {rng.choice(ASPECTS)} was {'not ' if negated else ''}{adjective}", polarity


def review(rng: random.Random) -> dict[str, str]:
    text, polarity = clause(rng)
    if rng.random() < CONTRAST:  # the clause after "but" decides
        second, polarity = clause(rng)
        text = f"{text} but {second}"
    label = "positive" if polarity > 0 else "negative"
    return {"title": f"my new {rng.choice(PRODUCTS)}", "text": text + ".", "label": label}


def main() -> None:
    folder = Path(__file__).resolve().parent
    rng = random.Random(20261123)
    rows = [review(rng) for _ in range(6000)]
    for name, part in (
        ("train.jsonl", rows[:5000]),
        ("test.jsonl", rows[5000:5500]),
        ("eval.jsonl", rows[5500:]),
    ):
        with open(folder / name, "w", encoding="utf-8") as out:
            for row in part:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
