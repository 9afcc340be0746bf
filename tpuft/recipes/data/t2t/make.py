"""Make a small translation set in t2t-tuner's data format: English number words -> German number words.

Each line is ``{"translation": {"s": SOURCE, "t": TARGET}}`` (the format of seed 001's t2t-tuner, after
Hugging Face's run_translation.py), e.g. ``{"translation": {"s": "three hundred forty-one", "t":
"dreihunderteinundvierzig"}}``. German composes numbers differently (units before tens, one word), so a model
must reorder, not copy. Every number from 1 to 9999 appears once; 500 random ones are held out. Deterministic:
re-running writes the same files. Run: python tpuft/recipes/data/t2t/make.py
"""

import importlib.util
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("numbers_make", HERE.parent / "numbers" / "make.py")
assert _spec is not None and _spec.loader is not None
english = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(english)

ONES = (
    "null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn fünfzehn "
    "sechzehn siebzehn achtzehn neunzehn".split()
)
TENS = "_ _ zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split()


def german(n: int) -> str:
    if n < 20:
        return ONES[n]
    if n < 100:
        unit = "ein" if n % 10 == 1 else ONES[n % 10]
        return TENS[n // 10] if n % 10 == 0 else f"{unit}und{TENS[n // 10]}"
    if n < 1000:
        head = "ein" if n // 100 == 1 else ONES[n // 100]
        return f"{head}hundert" + ("" if n % 100 == 0 else german(n % 100))
    head = "ein" if n // 1000 == 1 else german(n // 1000)
    return f"{head}tausend" + ("" if n % 1000 == 0 else german(n % 1000))


def main() -> None:
    numbers = list(range(1, 10000))
    random.Random(1).shuffle(numbers)
    for name, chosen in {"eval": numbers[:500], "train": numbers[500:]}.items():
        with (HERE / f"{name}.jsonl").open("w", encoding="utf-8") as handle:
            for n in chosen:
                record = {"translation": {"s": english.words(n), "t": german(n)}}
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
