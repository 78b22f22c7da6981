"""Representations of every image of a data split, saved for users' own downstream work.

`.npy`: FILE holds the float32 array (N, ...) and FILE's stem + ".labels.npy" the int64 labels, with
a ".json" sidecar (layer, class names, checkpoint), written last: without it the set is incomplete.
`.safetensors`: one file with tensors "embeddings" and "labels", the same facts in its metadata.  Every
file is written atomically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.torch import save_file
from torch import Tensor

from vitkit.atomic import atomic_write, atomic_write_text

SUFFIXES = (".npy", ".safetensors")


def _save_npy(path: Path, array: np.ndarray) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a handle, so numpy does not append ".npy" to the temporary name
            np.save(handle, array, allow_pickle=False)

    atomic_write(path, write)


def output_paths(path: str | Path) -> list[Path]:
    """Every file `save_embeddings` writes for `path`."""
    path = Path(path)
    if path.suffix == ".npy":
        stem = path.with_suffix("")
        return [path, Path(f"{stem}.labels.npy"), Path(f"{stem}.json")]
    if path.suffix == ".safetensors":
        return [path]
    raise ValueError(f"--out must end in {' or '.join(SUFFIXES)}, got {path.name!r}")


def save_embeddings(path: str | Path, embeddings: Tensor, labels: Tensor, meta: dict[str, Any]) -> list[Path]:
    """Write embeddings (N, ...) and labels (N,) as .npy (+ labels .npy + .json) or .safetensors."""
    paths = output_paths(path)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "shape": list(embeddings.shape)}
    if paths[0].suffix == ".safetensors":
        tensors = {"embeddings": embeddings.contiguous(), "labels": labels.long().contiguous()}
        text = {key: json.dumps(value) for key, value in meta.items()}
        atomic_write(paths[0], lambda tmp: save_file(tensors, str(tmp), metadata=text))
        return paths
    for stale in (paths[2], paths[1]):  # the sidecar first: a kill from here on leaves no complete-looking set
        stale.unlink(missing_ok=True)
    _save_npy(paths[0], embeddings.numpy())
    _save_npy(paths[1], labels.long().numpy())
    atomic_write_text(paths[2], json.dumps(meta, indent=1) + "\n")  # last: its presence says the set is whole
    return paths
