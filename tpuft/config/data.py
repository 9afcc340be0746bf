"""The recipe's ``data:`` section: data files (JSON lines, CSV, TSV, Parquet; local or ``gs://``), a
pretraining corpus, or a Hugging Face dataset, with the
fields, templates, transforms and the preprocess hook that turn a record into a source and a target.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tpuft.core.config_types import LaxPath, PathText, StrictModel
from tpuft.core.config_types import path_from_file as _from_file
from tpuft.core.templates import TemplateError, template_fields

TransformName = Literal["strip_diacritics", "lowercase", "nfc", "nfkc", "collapse_whitespace", "strip"]
"""Text transforms a recipe names (tpuft/data/text_transforms.py); seed 003's task is ``source_transforms:
[strip_diacritics]`` on the same field as the target."""


class HfDataset(StrictModel):
    """A Hugging Face dataset: a hub id (the workers must reach the hub), a local dataset folder, or a builder
    (``json``, ``csv``, ``parquet``, ``text``) over ``data_files`` that may be local or ``gs://``."""

    path: str = Field(
        description="Hub id (e.g. wmt16), a local folder, or a builder: json, csv, parquet, text."
    )
    name: str | None = Field(None, description="The dataset's configuration, e.g. ro-en.")
    split: str = Field("train", description="Split to train on.")
    eval_split: str | None = Field(
        None, description="Split to evaluate on (e.g. validation); none: no evaluation data."
    )
    test_split: str | None = Field(
        None,
        description="Split evaluated once at the end of training, on the best (keep_best) or last checkpoint "
        "(test_* metrics); none: no test evaluation.",
    )
    data_files: list[PathText] | dict[str, list[PathText]] = Field(
        default_factory=list,
        max_length=100_000,
        description="For a builder: files (or globs) of the train split, or {split: [files]}; local or gs://.",
    )
    streaming: bool = Field(
        True, description="Stream the data (never held whole in memory); false: download, map."
    )
    revision: str | None = Field(
        None, description="Hub revision (a tag, branch or commit) for reproducibility."
    )
    shuffle_buffer: int = Field(
        10_000, ge=0, le=10_000_000, description="Streaming shuffle buffer in examples (0: off)."
    )
    loader_workers: int = Field(
        1, ge=0, le=64, description="Data-loader processes per worker (0: in the trainer)."
    )

    @field_validator("path")
    @classmethod
    def _path_ok(cls, value: str, info: ValidationInfo) -> str:
        if not value.strip() or any(ord(c) < 32 for c in value):
            raise ValueError(f"expected a dataset id, folder or builder name (got {value!r})")
        if value.startswith((".", "/", "~")):
            path = Path(os.path.normpath(_from_file(value, info)))
            if (info.context or {}).get("check_files", True) and not path.is_dir():
                raise ValueError(f"dataset folder not found: {path}")
            return str(path)
        return value

    @field_validator("data_files")
    @classmethod
    def _files_ok(
        cls, value: list[str] | dict[str, list[str]], info: ValidationInfo
    ) -> list[str] | dict[str, list[str]]:
        def resolve(items: list[str]) -> list[str]:
            return [
                item if item.startswith("gs://") else str(Path(os.path.normpath(_from_file(item, info))))
                for item in items
            ]

        if isinstance(value, dict):
            return {split: resolve(items) for split, items in value.items()}
        return resolve(value)

    @model_validator(mode="after")
    def _splits_have_files(self) -> HfDataset:
        """A list of data_files is the train split's; with data_files given, load_dataset knows no other
        split."""
        if isinstance(self.data_files, list):
            for other in (self.eval_split, self.test_split):
                if self.data_files and other is not None and other != self.split:
                    raise ValueError(
                        f"data_files is a list, the files of split {self.split!r}: to evaluate on {other!r} "
                        f"give both, e.g. data_files: {{{self.split}: [...], {other}: [...]}}"
                    )
            return self
        for role, split in (
            ("split", self.split),
            ("eval_split", self.eval_split),
            ("test_split", self.test_split),
        ):
            if split is not None and split not in self.data_files:
                raise ValueError(
                    f"{role} {split!r} has no files in data_files (it names: "
                    f"{', '.join(self.data_files) or 'none'})"
                )
        return self


DataFormat = Literal["auto", "jsonl", "csv", "tsv", "parquet"]
DataFile = LaxPath | str
"""A local file (a Path once validated; relative to the recipe's folder) or a ``gs://`` URL (kept as text)."""


class DataConfig(StrictModel):
    train: DataFile | None = Field(
        None,
        description="Training examples: JSON lines (.jsonl, .json), CSV (.csv), TSV (.tsv) or Parquet "
        "(.parquet), "
        "text formats also .gz; local (relative paths are from the recipe's folder) or gs://bucket/path.",
    )
    format: DataFormat = Field(
        "auto",
        description="The format of data.train, data.eval and data.test: auto (by each file's suffix), jsonl, "
        "csv (a header row, RFC 4180 quoting), tsv (a header row, tab-separated, no quoting: GLUE's files) "
        "or parquet.",
    )
    corpus: list[PathText] = Field(
        default_factory=list,
        max_length=10_000,
        description="Plain text for pretraining (span corruption), one document a line: files or "
        "globs, local (relative to the recipe's folder) or gs://.",
    )
    eval: DataFile | None = Field(
        None, description="Held-out examples in the same format (for eval.* metrics)."
    )
    test: DataFile | None = Field(
        None,
        description="Test examples in the same format: evaluated once at the end of training, on the "
        "best (train.keep_best) or last checkpoint, by the run's backend on the slice; test_* "
        "metrics and the predictions in the run dir.",
    )
    source_field: str = Field(
        "source",
        description="Field (JSON key, CSV/TSV column, Parquet column) holding the input text (dots reach "
        "into objects).",
    )
    target_field: str = Field("target", description="Field holding the output text.")
    source_template: str | None = Field(
        None,
        description="Build the input from several fields, e.g. 'question: {question} context: {context}'.",
    )
    target_template: str | None = Field(
        None, description="Build the output from several fields, e.g. '{label}'."
    )
    prefix: str = Field(
        "",
        max_length=4096,
        description="Task prefix prepended to every input, e.g. 'translate English to German: '.",
    )
    max_source_length: int = Field(
        128, ge=1, le=65536, description="Inputs are truncated to this many tokens."
    )
    max_target_length: int = Field(
        32, ge=1, le=65536, description="Targets are truncated to this many tokens."
    )
    shuffle: bool = Field(True, description="Shuffle each worker's shard every epoch (seeded).")
    truncation: Literal["head", "tail", "head+tail"] = Field(
        "head",
        description="Which tokens of an input longer than max_source_length are kept: 'head' the first ones, "
        "'tail' "
        "the last ones, 'head+tail' the first and the last half (long questions whose end matters too).",
    )
    source_transforms: list[TransformName] = Field(
        default_factory=list,
        max_length=16,
        description="Named text transforms applied to the input, in order, e.g. [strip_diacritics] with "
        "source_field "
        "and target_field the same field: the task of restoring diacritics, with no code.",
    )
    target_transforms: list[TransformName] = Field(
        default_factory=list,
        max_length=16,
        description="Named text transforms applied to the output, in order.",
    )
    preprocess: str | None = Field(
        None,
        description="A hook for anything else: 'file.py:function' (relative to the recipe, shipped to "
        "the workers) or 'package.module:function' (installed in the worker venv). It gets each "
        "record (a dict) and returns the record to use, or None to drop it.",
    )
    hf: HfDataset | None = Field(
        None,
        description="A Hugging Face dataset instead of data.train/data.eval files: streamed, sharded over "
        "workers.",
    )
    label_field: str | None = Field(
        None,
        description="Classification: the JSON field holding each example's label (a name from labels, or its "
        "index).",
    )
    labels: list[str] = Field(
        default_factory=list,
        max_length=100_000,
        description="Classification: the label names, in class-id order.",
    )

    @field_validator("train", "eval", "test", mode="before")
    @classmethod
    def _text_or_path(cls, value: object) -> object:
        """One message for a value that is neither (not one per member of the union)."""
        if value is not None and not isinstance(value, (str, Path)):
            raise ValueError(f"expected a file path or a gs:// URL (got {type(value).__name__} {value!r})")
        return value

    @field_validator("train", "eval", "test")
    @classmethod
    def _exists(cls, value: Path | str | None, info: ValidationInfo) -> Path | str | None:
        """A local file must exist (``recipes validate`` and ``train`` read it); a ``gs://`` object is looked
        up when the data is checked, through the storage layer, not here (loading a recipe never reaches the
        network)."""
        if value is None:
            return None
        if isinstance(value, str) and value.startswith("gs://"):
            bucket, _, name = value[len("gs://") :].partition("/")
            if not bucket or not name or name.endswith("/"):
                raise ValueError(f"expected gs://bucket/path/file (got {value!r})")
            return value
        if isinstance(value, str) and (not value.strip() or any(ord(c) < 32 for c in value)):
            raise ValueError(f"expected a file path (got {value!r})")
        path = Path(os.path.normpath(_from_file(str(value), info)))
        if (info.context or {}).get("check_files", True):
            if not path.exists():
                from tpuft.core.data_fetch import fetch_command

                # data tpuft cannot ship: its folder has the script that fetches it
                command = fetch_command(path)
                raise ValueError(f"file not found: {path}" + (f"; fetch it: {command}" if command else ""))
            if not path.is_file():
                raise ValueError(f"{path} is not a regular file (a folder, device or FIFO)")
        return path

    @field_validator("corpus")
    @classmethod
    def _corpus_files(cls, value: list[str], info: ValidationInfo) -> list[str]:
        """Local globs are expanded now (sorted, so every worker sees the same list) and must match a file."""
        import glob

        files: list[str] = []
        for text in value:
            if text.startswith("gs://"):
                files.append(text)
                continue
            pattern = str(Path(os.path.normpath(_from_file(text, info))))
            found = (
                sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
                if glob.has_magic(pattern)
                else [pattern]
            )
            if (info.context or {}).get("check_files", True):
                if not found:
                    raise ValueError(f"{text!r} matches no file")
                for path in found:
                    if not os.path.isfile(path):
                        raise ValueError(f"file not found: {path}")
            files.extend(found)
        return files

    @field_validator("preprocess")
    @classmethod
    def _preprocess_ok(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        target, sep, function = value.rpartition(":")
        if not sep or not target or not function.isidentifier():
            raise ValueError(f"expected 'file.py:function' or 'package.module:function' (got {value!r})")
        if target.endswith(".py"):
            path = Path(os.path.normpath(_from_file(target, info)))
            if (info.context or {}).get("check_files", True) and not path.is_file():
                raise ValueError(f"file not found: {path}")
            return f"{path}:{function}"
        if not all(part.isidentifier() for part in target.split(".")):
            raise ValueError(f"{target!r} is neither a .py file nor a dotted module name")
        return value

    @model_validator(mode="after")
    def _one_dataset(self) -> DataConfig:
        if self.hf is not None and (self.train is not None or self.eval is not None or self.test is not None):
            raise ValueError("give data.hf or data.train/data.eval/data.test files, not both")
        return self

    @field_validator("labels")
    @classmethod
    def _labels_ok(cls, value: list[str]) -> list[str]:
        seen: set[str] = set()
        for name in value:
            if not name.strip():
                raise ValueError("a label name is empty")
            if name in seen:
                raise ValueError(f"label {name!r} is listed twice")
            seen.add(name)
        if len(value) == 1:
            raise ValueError("one label is no classification: list at least two")
        return value

    @field_validator("source_field", "target_field", "label_field")
    @classmethod
    def _field_name_ok(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value or any(part == "" for part in value.split(".")) or any(ord(c) < 32 for c in value):
            raise ValueError(f"expected a JSON field name, with dots to reach into objects (got {value!r})")
        return value

    @field_validator("source_template", "target_template")
    @classmethod
    def _template_ok(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            fields = template_fields(value)
        except TemplateError as exc:
            raise ValueError(f"{exc} (got {value!r})") from None
        if not fields:
            raise ValueError(
                f"the template names no field, so every example would be the same text (got {value!r})"
            )
        return value
