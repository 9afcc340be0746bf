"""Make the span-corruption recipe's corpus: short plain-English "documents" about a small invented world.

Each line is one document of 2-6 sentences built from a small grammar (who did what, where, when, and counts
written as words), so the text has the regularities a denoising model picks up within minutes on a CPU: the
loss falls visibly. Deterministic: re-running writes the same file.
Run: python tpuft/recipes/data/corpus/make.py
"""

import random
from pathlib import Path

NAMES = "Ada Bruno Chiara Dmitri Elena Farid Greta Hiro Ines Jonas Kaia Luca Mara Nils Olga Pavel".split()
ANIMALS = "cat dog fox owl horse goat rabbit heron otter badger".split()
PLACES = (
    "the old mill|the harbour|the orchard|the library|the market square|the river bank|the hill farm".split(
        "|"
    )
)
TIMES = "at dawn|in the morning|at noon|in the afternoon|at dusk|late at night".split("|")
VERBS = "fed|painted|counted|followed|watched|carried|found|lost".split("|")
THINGS = "apples|lanterns|letters|baskets|stones|candles|maps|bells".split("|")
NUMBERS = "two three four five six seven eight nine ten eleven twelve".split()


def sentence(rng: random.Random) -> str:
    kind = rng.randrange(4)
    name = rng.choice(NAMES)
    if kind == 0:
        return (
            f"{name} {rng.choice(VERBS)} the {rng.choice(ANIMALS)} near {rng.choice(PLACES)} "
            f"{rng.choice(TIMES)}."
        )
    if kind == 1:
        return (
            f"{name} {rng.choice(VERBS)} {rng.choice(NUMBERS)} {rng.choice(THINGS)} at {rng.choice(PLACES)}."
        )
    if kind == 2:
        other = rng.choice([n for n in NAMES if n != name])
        return f"{name} and {other} walked to {rng.choice(PLACES)} {rng.choice(TIMES)}."
    return f"{rng.choice(TIMES).capitalize()}, the {rng.choice(ANIMALS)} slept in {rng.choice(PLACES)}."


def main() -> None:
    rng = random.Random(2026)
    lines = [" ".join(sentence(rng) for _ in range(rng.randint(2, 6))) for _ in range(3000)]
    (Path(__file__).resolve().parent / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
