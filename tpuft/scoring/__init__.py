"""The one scoring code of the test evaluation and ``tpuft predict``, on both sides: predictions files and
their summable statistics and scores (:mod:`tpuft.scoring.predictions`), on BLEU and ROUGE-L
(:mod:`tpuft.scoring.text_metrics`). The trainers score their test sets and eval decodes with it on the
workers; the join of a predict job's parts sums its statistics wherever the join runs, the controller
included. Stdlib only.
"""
