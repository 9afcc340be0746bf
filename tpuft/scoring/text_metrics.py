"""Corpus BLEU and ROUGE-L of greedy decodes against their references, for ``eval.metric: bleu | rouge_l``.

Stdlib only: it runs inside every backend's venv, none of which has sacreBLEU or rouge-score. Both functions
reproduce those packages' numbers (``tests/worker/test_text_metrics.py`` checks them against the real
packages):

- :func:`corpus_bleu` is ``sacrebleu.corpus_bleu(hypotheses, [references]).score``: the "13a" tokenizer
  (mteval-v13a, the WMT one), mixed case, n-grams up to 4, the corpus brevity penalty and the "exp" smoothing
  (sacreBLEU's defaults), one reference per hypothesis.
- :func:`rouge_l` is the mean over pairs of
  ``rouge_score.rouge_scorer.RougeScorer(["rougeL"]).score(reference, hypothesis)["rougeL"].fmeasure``: the
  default tokenizer (lowercase, every run of characters other than ``a-z0-9`` is a separator), no stemming.

Both are on a 0-100 scale. A sharded evaluation sums :func:`bleu_statistics` and :func:`rouge_l_sum` over its
replicas and scores once (:func:`bleu_from_statistics`; ROUGE-L: 100 * sum / pairs): corpus BLEU is not a
mean.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

MAX_ORDER = 4
"""BLEU's n-gram orders: 1 to 4."""

# sacreBLEU's TokenizerRegexp (the language-dependent part of 13a), pattern for pattern and in the same order.
_BLEU_RULES = (
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),  # punctuation and symbols
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),  # period and comma unless preceded by a digit
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),  # period and comma unless followed by a digit
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),  # dash when preceded by a digit
)

_NON_ALPHANUM = re.compile(r"[^a-z0-9]+")
_SPACES = re.compile(r"\s+")
_VALID_TOKEN = re.compile(r"^[a-z0-9]+$")


def tokenize_13a(line: str) -> list[str]:
    """sacreBLEU's "13a" tokenization of one segment (after its ``rstrip``), as a list of tokens."""
    line = line.rstrip()
    line = line.replace("<skipped>", "")
    line = line.replace("-\n", "")
    line = line.replace("\n", " ")
    if "&" in line:
        line = line.replace("&quot;", '"')
        line = line.replace("&amp;", "&")
        line = line.replace("&lt;", "<")
        line = line.replace("&gt;", ">")
    line = f" {line} "
    for pattern, replacement in _BLEU_RULES:
        line = pattern.sub(replacement, line)
    return line.split()


def _ngrams(tokens: list[str]) -> Counter[tuple[str, ...]]:
    return Counter(
        tuple(tokens[i : i + n]) for n in range(1, MAX_ORDER + 1) for i in range(len(tokens) - n + 1)
    )


def _log(value: float) -> float:
    """sacreBLEU's ``my_log``: log, floored for a zero precision."""
    return -9999999999 if value == 0.0 else math.log(value)


def bleu_statistics(hypotheses: Sequence[str], references: Sequence[str]) -> list[int]:
    """The corpus's sufficient statistics, sacreBLEU's layout summed over segments: ``[hypothesis length,
    reference length, matched 1- to 4-grams..., total 1- to 4-grams...]`` (10 numbers). Statistics of two
    corpora add up element-wise, so a sharded evaluation sums them over replicas and calls
    :func:`bleu_from_statistics` once."""
    _check(hypotheses, references)
    stats = [0] * (2 + 2 * MAX_ORDER)
    for hypothesis, reference in zip(hypotheses, references):
        hyp_tokens, ref_tokens = tokenize_13a(hypothesis), tokenize_13a(reference)
        stats[0] += len(hyp_tokens)
        stats[1] += len(ref_tokens)
        ref_ngrams = _ngrams(ref_tokens)
        for ngram, count in _ngrams(hyp_tokens).items():
            n = len(ngram) - 1
            stats[2 + MAX_ORDER + n] += count
            if ngram in ref_ngrams:
                stats[2 + n] += min(count, ref_ngrams[ngram])
    return stats


def bleu_from_statistics(stats: Sequence[float]) -> float:
    """BLEU, 0-100, from :func:`bleu_statistics` (or their sum over shards; floats are rounded back to
    counts): sacreBLEU's ``BLEU.compute_bleu`` with the "exp" smoothing and no effective order."""
    if len(stats) != 2 + 2 * MAX_ORDER:
        raise ValueError(f"BLEU statistics are {2 + 2 * MAX_ORDER} numbers, not {len(stats)}")
    sys_len, ref_len = round(stats[0]), round(stats[1])
    correct = [round(x) for x in stats[2 : 2 + MAX_ORDER]]
    total = [round(x) for x in stats[2 + MAX_ORDER :]]
    bp = 1.0
    if sys_len < ref_len:
        bp = math.exp(1 - ref_len / sys_len) if sys_len > 0 else 0.0
    if not any(correct):
        return 0.0
    precisions = [0.0] * MAX_ORDER
    smooth = 1.0
    for n in range(1, MAX_ORDER + 1):
        if total[n - 1] == 0:
            break
        if correct[n - 1] == 0:
            smooth *= 2
            precisions[n - 1] = 100.0 / (smooth * total[n - 1])
        else:
            precisions[n - 1] = 100.0 * correct[n - 1] / total[n - 1]
    return bp * math.exp(sum([_log(p) for p in precisions]) / MAX_ORDER)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU, 0-100, exactly as ``sacrebleu.corpus_bleu(hypotheses, [references]).score`` with its
    defaults (tokenizer 13a, case-sensitive, 4-grams, brevity penalty, "exp" smoothing); one reference per
    hypothesis. An empty corpus scores 0 (sacreBLEU raises)."""
    if not hypotheses and not references:
        return 0.0
    return bleu_from_statistics(bleu_statistics(hypotheses, references))


def tokenize_rouge(text: str) -> list[str]:
    """rouge-score's default tokenizer without stemming: lowercase, then runs of non-``[a-z0-9]`` separate
    tokens (so non-ASCII letters are dropped, as there)."""
    text = _NON_ALPHANUM.sub(" ", text.lower())
    return [token for token in _SPACES.split(text) if _VALID_TOKEN.match(token)]


def _lcs_length(a: list[str], b: list[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            current[j] = previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1])
        previous = current
    return previous[-1]


def rouge_l_pair(hypothesis: str, reference: str) -> float:
    """ROUGE-L F-measure of one pair, 0-1: ``RougeScorer(["rougeL"]).score(reference, hypothesis)["rougeL"]
    .fmeasure``; 0 when either side has no token."""
    target, prediction = tokenize_rouge(reference), tokenize_rouge(hypothesis)
    if not target or not prediction:
        return 0.0
    lcs = _lcs_length(target, prediction)
    precision, recall = lcs / len(prediction), lcs / len(target)
    if precision + recall > 0:
        return 2 * precision * recall / (precision + recall)
    return 0.0


def rouge_l_sum(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """The sum of the pairs' ROUGE-L F-measures (each 0-1): summed over shards and divided by the number of
    pairs (times 100), it is :func:`rouge_l` of the whole corpus."""
    _check(hypotheses, references)
    return sum(rouge_l_pair(h, r) for h, r in zip(hypotheses, references))


def rouge_l(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Mean ROUGE-L F-measure over the pairs, on a 0-100 scale (like :func:`corpus_bleu`; rouge-score's own
    numbers are 0-1, so this is 100 times their mean), with rouge-score's default tokenizer and no stemming.
    An empty corpus scores 0."""
    total = rouge_l_sum(hypotheses, references)
    return 100.0 * total / len(hypotheses) if hypotheses else 0.0


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references are sequences of strings, not strings")
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references: one reference each")
