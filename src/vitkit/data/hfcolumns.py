"""Which columns of a Hugging Face table are the images and the labels: by feature type (the `huggingface`
schema metadata that `datasets` writes, read as untrusted JSON), else by the columns' types and names; a
column named by `data.image_column` / `data.label_column` where there are several."""

from __future__ import annotations

import json
from typing import Any

from vitkit.data.images import NoLabelsError
from vitkit.data.imageset import NO_LABELS_HINT
from vitkit.data.tarsamples import check_class_names

IMAGE_NAMES = frozenset({"image", "img", "jpg", "jpeg", "png", "webp"})  # a plain binary column of these names
LABEL_NAMES = frozenset({"label", "labels", "class", "category"})  # a column of class-name strings, unchosen
IMAGE_HINT = (
    "vitkit reads an image column of PIL images or encoded image bytes (a datasets.Image() feature) and resizes and "
    "normalises the images itself: save the dataset from before the image processor's map, or make an image column "
    "from 0-255 pixel values: ds.map(lambda row: {'image': PIL.Image.fromarray(numpy.asarray(row['pixel_values'], "
    "numpy.uint8))}).cast_column('image', datasets.Image()) (transpose (C, H, W) values to (H, W, C) first)"
)


def choose_columns(
    arrow_schema: Any, image_column: str = "", label_column: str = "", where: str = "", labelled: bool = True
) -> tuple[str, str, list[str] | None]:
    """(image column, label column, ClassLabel names or None), by feature type unless named.  Read without
    labels (`labelled=False`), the label column is "": none is read, and every row is class 0."""
    import pyarrow as pa  # hf._pyarrow has said where it is missing

    features = _features(arrow_schema, where)
    names = list(arrow_schema.names)

    def kind(column: str) -> str:
        feature, field = features.get(column, {}), arrow_schema.field(column)
        if isinstance(feature, dict) and feature.get("_type") == "Image":
            return "Image"
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":  # metadata, untrusted: the type rules
            if not pa.types.is_integer(field.type):  # else another integer column would be taken for the labels
                raise ValueError(f"{where}: column {column!r} is declared a ClassLabel but holds {field.type} values")
            return "ClassLabel"
        if not features and pa.types.is_struct(field.type) and field.type.get_field_index("bytes") >= 0:
            return "Image"
        if (
            not features
            and column.lower() in IMAGE_NAMES
            and (pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type))
        ):
            return "Image"  # encoded image bytes as pandas or pyarrow write them, named as such
        if is_strings(arrow_schema, column):
            return "string"
        return "int" if pa.types.is_integer(field.type) else "tensor" if _tensor(field.type) else "other"

    kinds = {column: kind(column) for column in names}
    images = [c for c in names if kinds[c] == "Image"]
    _refuse_tensors(arrow_schema, kinds, image_column, images, where)
    image = _pick(image_column, images, "image", names, where)
    field = arrow_schema.field(image)
    if kinds[image] != "Image" and not (pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type)):
        what = "class labels" if kinds[image] in ("ClassLabel", "int") else f"{field.type} values"
        raise ValueError(f"{where}: image column {image!r} holds {what}, not images; image columns: {_listed(images)}")
    if not labelled:
        return image, "", None
    labels = _label_candidates(names, kinds)
    if not labels and not label_column:
        raise NoLabelsError(
            f"{where}: no label column (ClassLabel, integer, or class-name strings named label, labels, class or "
            f"category) among {', '.join(names)}; choose one with --label-column NAME, or train without labels: "
            f"{NO_LABELS_HINT}"
        )
    label = _pick(label_column, labels, "label", names, where)
    if kinds[label] not in ("ClassLabel", "int", "string"):
        raise ValueError(
            f"{where}: label column {label!r} holds {arrow_schema.field(label).type} values, not class ids or "
            f"class names; label columns: {_listed(labels)}"
        )
    class_names = features.get(label, {}).get("names") if kinds[label] == "ClassLabel" else None
    if class_names is not None and not (isinstance(class_names, list) and all(isinstance(n, str) for n in class_names)):
        raise ValueError(f"{where}: the ClassLabel names of {label!r} are not a list of strings ({class_names!r:.80})")
    if class_names is not None:
        check_class_names(class_names, f"{where}: the ClassLabel names of {label!r}", "class")
    return image, label, class_names


def _refuse_tensors(arrow_schema: Any, kinds: dict[str, str], image_column: str, images: list[str], where: str) -> None:
    """A ValueError where the image column, chosen or the only candidate, holds an image processor's pixel values:
    no --image-column can help, so it says what is read instead."""
    if image_column:
        tensors = [image_column] if kinds.get(image_column) == "tensor" else []
    else:
        tensors = [] if images else [column for column, kind in kinds.items() if kind == "tensor"]
    if tensors:
        raise ValueError(
            f"{where}: column {tensors[0]!r} holds preprocessed pixel tensors ({arrow_schema.field(tensors[0]).type}), "
            f"not images; {IMAGE_HINT}"
        )


def is_strings(arrow_schema: Any, column: str) -> bool:
    """Whether `column` holds strings (class names, where it is the label column: vitkit.data.hfnames)."""
    import pyarrow as pa

    kind = arrow_schema.field(column).type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _tensor(kind: Any) -> bool:
    """Whether an Arrow type is nested lists of numbers, two deep or more: pixel values (an image processor's
    `pixel_values`, a datasets.Array3D), not an image."""
    import pyarrow as pa

    depth = 0
    kind = kind.storage_type if isinstance(kind, pa.ExtensionType) else kind
    while pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        kind, depth = kind.value_type, depth + 1
    return depth >= 2 and (pa.types.is_floating(kind) or pa.types.is_integer(kind))


def _features(arrow_schema: Any, where: str) -> dict[str, Any]:
    """The `features` of a schema's Hugging Face metadata (untrusted: any JSON), or {} where it has none."""
    raw = (arrow_schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"{where}: its Hugging Face metadata is not valid JSON ({error})") from None
    info = meta.get("info") if isinstance(meta, dict) else None
    features = info.get("features", {}) if isinstance(info, dict) else {}
    if not isinstance(features, dict):
        raise ValueError(f"{where}: its Hugging Face metadata's features are not a mapping of columns")
    return features


def _listed(columns: list[str]) -> str:
    return ", ".join(columns) or "none"


def _label_candidates(names: list[str], kinds: dict[str, str]) -> list[str]:
    """The columns that may be the label: the ClassLabel ones, else the integer ones and the strings named as a
    label; of several, the one named as a label (`label` beside an `image_id`)."""
    labels = [c for c in names if kinds[c] == "ClassLabel"] or [
        c for c in names if kinds[c] == "int" or (kinds[c] == "string" and c.lower() in LABEL_NAMES)
    ]
    named = [c for c in labels if c.lower() in LABEL_NAMES]
    return named if len(labels) > 1 and len(named) == 1 else labels


def _pick(chosen: str, candidates: list[str], what: str, names: list[str], where: str) -> str:
    if chosen:
        if chosen not in names:
            raise ValueError(f"{where}: {what} column {chosen!r} is not a column; columns: {', '.join(names)}")
        return chosen
    if len(candidates) != 1:
        found = f"several ({', '.join(candidates)})" if candidates else "no"
        raise ValueError(
            f"{where}: {found} {what} columns among {', '.join(names)}; choose one with --{what}-column NAME"
        )
    return candidates[0]
