"""Hugging Face label columns of class-name strings (a `Value("string")`, not a `ClassLabel`): the train split's
sorted unique strings are the classes, in that order, and every split's strings are read as their index.  A
string is read as its name: without the spaces around it, in Unicode's composed form (NFC), as a wds label and a
line of classes.txt are, so "cat " and a macOS folder's decomposed "é" are no classes of their own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vitkit.data.readers import MAX_CLASSES
from vitkit.data.tarsamples import check_class_names, class_name


def string_classes(values: np.ndarray, label: str, where: str) -> list[str]:
    """The classes of the train split's string labels `values` (None: unlabelled): its sorted unique strings, in
    numeric order where every one is a number written in digits ("2" before "10", as an index reads them)."""
    names = sorted({class_name(value) for value in values if value is not None})
    if names and names[0] == "":  # sorted: the empty name first
        row = next(i for i, value in enumerate(values) if value is not None and not class_name(value))
        raise ValueError(
            f"{where}: row {row} of the label column {label!r} is an empty string: give it its class name, or None "
            "to leave it unlabelled"
        )
    if names and all(name.isascii() and name.isdigit() for name in names):
        names.sort(key=int)
    if not names:
        raise ValueError(f"{where}: the label column {label!r} holds no class name")
    if len(names) > MAX_CLASSES:
        raise ValueError(
            f"{where}: the label column {label!r} holds {len(names):,} class names, more than {MAX_CLASSES:,}"
        )
    check_class_names(names, f"{where}: the label column {label!r}", "class")
    return names


def encode(values: np.ndarray, names: Sequence[str], where: str) -> np.ndarray:
    """int64 class index of each string label (-1 where a row has none); a ValueError naming the first row whose
    string is none of the train split's `names`."""
    index = {name: i for i, name in enumerate(names)}
    codes = np.array([-1 if value is None else index.get(class_name(value), -2) for value in values], dtype=np.int64)
    if (codes == -2).any():
        row = int(np.flatnonzero(codes == -2)[0])
        raise ValueError(
            f"{where}: row {row} is labelled {str(values[row])[:80]!r}, not one of the train split's {len(names)} "
            f"classes ({', '.join(names)[:200]}): the classes of a label column of strings are the train split's "
            "strings; fix that row's label, or drop it"
        )
    return codes


def indices(values: list[Any], names: Sequence[str]) -> list[int]:
    """The class index of each string label, -1 where a row has none or one of no class (read as corrupt)."""
    index = {name: i for i, name in enumerate(names)}
    return [index.get(class_name(value), -1) if isinstance(value, str) else -1 for value in values]
