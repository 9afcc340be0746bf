"""The training data as both sides read it: the controller's check before launch (``ops/preflight``,
``tpuft predict``'s input check) and every backend's trainer and predict engine on the workers. Files and
their formats (:mod:`tpuft.data.files`), records made examples (:mod:`tpuft.data.examples`), the recipe's text
transforms and preprocess hook (:mod:`tpuft.data.text_transforms`), and a predict input streamed through the
training data's fields (:mod:`tpuft.data.predict_input`).

Framework-free and stdlib (pyarrow for Parquet, transformers for a tokenizer, tpuft's storage for ``gs://``,
each imported when needed), so the controller reads data exactly as the workers will. The names of
:mod:`~tpuft.data.files` and :mod:`~tpuft.data.examples` are re-exported here: ``from tpuft.data import
Fields``.
"""

from __future__ import annotations

from tpuft.data.examples import (
    MAX_PROBLEMS,
    Example,
    Fields,
    FileCheck,
    batches,
    check_file,
    encode_texts,
    iter_shard,
    keep_tokens,
    load_shard,
    load_tokenizer,
    make_example,
    note_problem,
)
from tpuft.data.files import (
    BOM,
    FORMAT_NAMES,
    FORMATS,
    PARQUET_BATCH,
    DataError,
    Row,
    cache_folder,
    file_format,
    iter_records,
    json_kind,
    local_copy,
    parse_line,
    read_rows,
)

__all__ = [
    "BOM",
    "DataError",
    "Example",
    "FORMATS",
    "FORMAT_NAMES",
    "Fields",
    "FileCheck",
    "MAX_PROBLEMS",
    "PARQUET_BATCH",
    "Row",
    "batches",
    "cache_folder",
    "check_file",
    "encode_texts",
    "file_format",
    "iter_records",
    "iter_shard",
    "json_kind",
    "keep_tokens",
    "load_shard",
    "load_tokenizer",
    "local_copy",
    "make_example",
    "note_problem",
    "parse_line",
    "read_rows",
]
