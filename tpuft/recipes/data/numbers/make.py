"""Make the quickstart task: English number words -> digits, e.g. "four thousand two hundred seven" -> "4207".

Every number from 0 to 9999 appears once: 500 random ones are held out for eval (``eval.jsonl``, picked first,
so it is the file it was before there was a test split), 500 more for test (``test.jsonl``: ``data.test``,
evaluated once at the end of training on the checkpoint that eval picked), and the other 9,000 are
``train.jsonl``. A model that scores well on the held-out numbers has learned how the words compose, not
memorised them. Deterministic (one seeded shuffle): re-running writes the same files.
Run: python tpuft/recipes/data/numbers/make.py
"""

import json
import random
from pathlib import Path

ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def words(n: int) -> str:
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    if n < 1000:
        return ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + words(n % 100))
    return words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + words(n % 1000))


def main() -> None:
    here = Path(__file__).resolve().parent
    numbers = list(range(10000))
    random.Random(0).shuffle(numbers)
    splits = {"eval": numbers[:500], "test": numbers[500:1000], "train": numbers[1000:]}
    for name, chosen in splits.items():
        with (here / f"{name}.jsonl").open("w") as handle:
            for n in chosen:
                handle.write(json.dumps({"words": words(n), "digits": str(n)}) + "\n")


if __name__ == "__main__":
    main()
