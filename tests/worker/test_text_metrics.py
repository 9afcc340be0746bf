"""tpuft's stdlib BLEU and ROUGE-L against the real sacreBLEU and rouge-score packages (test dependencies), on
generated sentence pairs with the cases that trip tokenizers: dropped and swapped words, empty sides, unicode,
punctuation, numbers with separators, HTML entities and newlines."""

from __future__ import annotations

import random

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from tpuft.scoring.text_metrics import corpus_bleu, rouge_l, rouge_l_pair, tokenize_13a

WORDS = (
    "the a cat dog sat on mat quick brown fox jumps over lazy And THE Cat dog's isn't "
    "Zürich naïve café straße Ελλάδα 東京 日本語 🙂 ØRESUND "
    "3.14 1,000 0.9 9,99 v.9 ,9 9- 10-20 2024-01-05 U.S.A. e.g. x+y a/b (note) [ref] {x} \"quoted\" 'single' "
    ". , ; : ! ? - -- ... & &amp; &quot; &lt; &gt; <skipped> @user #tag $5 50% ~ ` ^ _ | \\"
).split()


def sentence(rng: random.Random, lo: int = 0, hi: int = 18) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    text = " ".join(words)
    if rng.random() < 0.1:
        text = text.replace(" ", "", 1)  # glue two tokens
    if rng.random() < 0.05:
        text += rng.choice(["\n", "-\nation", "-\n", "  ", "\t"])
    if rng.random() < 0.05:
        text = "\n".join(text.split(" ", 1))
    return text


def perturb(rng: random.Random, reference: str) -> str:
    """A hypothesis near the reference: words dropped, swapped, replaced or added; sometimes empty or
    unrelated."""
    roll = rng.random()
    if roll < 0.05:
        return ""
    if roll < 0.1:
        return sentence(rng)
    if roll < 0.15:
        return reference
    words = reference.split(" ")
    for _ in range(rng.randint(0, 4)):
        op = rng.random()
        if op < 0.3 and words:
            words.pop(rng.randrange(len(words)))
        elif op < 0.6 and len(words) > 1:
            i, j = rng.randrange(len(words)), rng.randrange(len(words))
            words[i], words[j] = words[j], words[i]
        elif op < 0.8 and words:
            words[rng.randrange(len(words))] = rng.choice(WORDS)
        else:
            words.insert(rng.randint(0, len(words)), rng.choice(WORDS))
    return " ".join(words)


def pairs(seed: int, count: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    references = [sentence(rng) if rng.random() > 0.03 else "" for _ in range(count)]
    hypotheses = [perturb(rng, r) for r in references]
    return hypotheses, references


def sacre(hypotheses: list[str], references: list[str]) -> float:
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


SCORER = rouge_scorer.RougeScorer(["rougeL"])


def google_rouge(hypothesis: str, reference: str) -> float:
    return SCORER.score(reference, hypothesis)["rougeL"].fmeasure


def test_13a_tokens_are_sacrebleus() -> None:
    tokenizer = sacrebleu.BLEU().tokenizer
    hypotheses, references = pairs(1, 400)
    for text in hypotheses + references:
        assert tokenize_13a(text) == tokenizer(text.rstrip()).split(), repr(text)


@pytest.mark.parametrize("seed", range(12))
def test_corpus_bleu_matches_sacrebleu(seed: int) -> None:
    hypotheses, references = pairs(seed, 300 if seed == 0 else 40)
    assert corpus_bleu(hypotheses, references) == pytest.approx(sacre(hypotheses, references), abs=1e-6)


def test_bleu_of_single_segments_matches_sacrebleu() -> None:
    """One-segment corpora: short ones exercise the smoothing (orders with no match) and the brevity
    penalty."""
    hypotheses, references = pairs(99, 300)
    for hyp, ref in zip(hypotheses, references):
        if not hyp.strip() and not ref.strip():
            continue
        assert corpus_bleu([hyp], [ref]) == pytest.approx(sacre([hyp], [ref]), abs=1e-6), (hyp, ref)


def test_bleu_smoothing_and_brevity_cases() -> None:
    cases = [
        (["the cat"], ["the cat sat on the mat"]),  # short: brevity penalty, 3- and 4-grams absent
        (["the cat sat on the mat today and tomorrow"], ["the cat sat on the mat"]),  # long: no penalty
        (["cat the mat on sat the"], ["the cat sat on the mat"]),  # unigrams only: exp smoothing
        (["", "the cat sat on the mat"], ["a dog", "the cat sat on the mat"]),  # an empty hypothesis
        (["the cat sat on the mat", "a dog"], ["the cat sat on the mat", ""]),  # an empty reference
        (["Hello, world!"], ["hello , world !"]),  # case matters, punctuation is split off
        (["1,000.5 items - 10-20"], ["1,000.5 items - 10 - 20"]),
    ]
    for hypotheses, references in cases:
        assert corpus_bleu(hypotheses, references) == pytest.approx(sacre(hypotheses, references), abs=1e-6)


def test_bleu_known_values() -> None:
    text = ["the quick brown fox jumps over the lazy dog", "a b c d e f", "Zürich, 3.14 & café!"]
    assert corpus_bleu(text, text) == pytest.approx(100.0)
    assert corpus_bleu(["one two three four"], ["five six seven eight"]) == 0.0
    assert corpus_bleu([""], ["the cat"]) == 0.0
    assert corpus_bleu([], []) == 0.0
    assert 0.0 < corpus_bleu(["the cat sat on a mat"], ["the cat sat on the mat"]) < 100.0


@pytest.mark.parametrize("seed", range(4))
def test_rouge_l_matches_rouge_score(seed: int) -> None:
    hypotheses, references = pairs(100 + seed, 150)
    expected = [google_rouge(h, r) for h, r in zip(hypotheses, references)]
    for hyp, ref, want in zip(hypotheses, references, expected):
        assert rouge_l_pair(hyp, ref) == pytest.approx(want, abs=1e-9), (hyp, ref)
    assert rouge_l(hypotheses, references) == pytest.approx(100 * sum(expected) / len(expected), abs=1e-6)


def test_rouge_l_edge_cases_match_rouge_score() -> None:
    cases = [
        ("", "the cat"),
        ("the cat", ""),
        ("", ""),
        ("!!! ...", "the cat"),
        ("Ελλάδα 東京", "Ελλάδα 東京"),  # no a-z0-9 token on either side: 0, as rouge-score says
        ("The CAT sat.", "the cat, sat"),
        ("café naïve", "caf na ve"),
        ("cats running", "cat run"),
        ("a b c d e", "e d c b a"),
        ("x1 y2-z3", "x1 y2 z3"),
    ]
    for hyp, ref in cases:
        assert rouge_l_pair(hyp, ref) == pytest.approx(google_rouge(hyp, ref), abs=1e-12), (hyp, ref)


def test_rouge_l_known_values() -> None:
    text = ["the quick brown fox", "Jumps over, the lazy dog!", "a b c"]
    assert rouge_l(text, text) == pytest.approx(100.0)
    assert rouge_l(["one two"], ["three four"]) == 0.0
    assert rouge_l(["a b"], ["a c"]) == pytest.approx(50.0)
    assert rouge_l([], []) == 0.0


def test_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="one reference each"):
        corpus_bleu(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="one reference each"):
        rouge_l(["a"], [])
    with pytest.raises(TypeError):
        rouge_l("abc", "abc")


def test_statistics_of_shards_add_up() -> None:
    """What a sharded evaluation does: sum the per-replica statistics (as float64 tensors), then score
    once."""
    from tpuft.scoring.text_metrics import bleu_from_statistics, bleu_statistics, rouge_l_sum

    hypotheses, references = pairs(7, 90)
    shards = [(hypotheses[i::3], references[i::3]) for i in range(3)]
    summed = [float(sum(x)) for x in zip(*(bleu_statistics(h, r) for h, r in shards))]
    assert len(summed) == 10
    assert bleu_from_statistics(summed) == pytest.approx(sacre(hypotheses, references), abs=1e-6)
    assert bleu_from_statistics(summed) == corpus_bleu(hypotheses, references)
    rouge_total = sum(rouge_l_sum(h, r) for h, r in shards)
    assert 100 * rouge_total / len(hypotheses) == pytest.approx(rouge_l(hypotheses, references), abs=1e-9)
    with pytest.raises(ValueError, match="10 numbers"):
        bleu_from_statistics(summed[:-1])
