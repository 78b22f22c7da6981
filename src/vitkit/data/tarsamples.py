"""The samples of a tar shard: members grouped by key into (image, label), labels parsed as untrusted
input, and a damaged shard's message, named once per process.  The layout is vitkit.data.tarshards'.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import unicodedata
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

from vitkit.data.images import IMAGE_EXTENSIONS
from vitkit.data.readers import MAX_CLASSES
from vitkit.data.stream import Sample
from vitkit.data.tarformat import Member, TarFormatError, TarTruncatedError, read_member, tar_members

log = logging.getLogger("vitkit.data.tarshards")  # the shard reader's messages, wherever they are said
loading_log = logging.getLogger("vitkit.data.tarshards.loading")  # ... where every process reads the same shards
_loading: contextvars.ContextVar[bool] = contextvars.ContextVar("vitkit_shards_loading", default=False)

_IMAGE_EXTS = frozenset(ext.lstrip(".") for ext in IMAGE_EXTENSIONS)
CLASS_FILE = "classes.txt"  # beside wds: shards without an index naming the classes: one name a line
MAX_LABEL_BYTES = 1 << 16  # a label member larger than this is corrupt
_DIGITS = re.compile(rb"\s*[0-9]+\s*")  # what a .cls label member holds
_NUMBER = re.compile(r"[-+]?(0[xob][0-9a-f_]+|[0-9_]*\.?[0-9_]+(e[-+]?[0-9]+)?)", re.ASCII | re.IGNORECASE)  # no name
MAX_IMAGE_BYTES = 1 << 29  # an image member larger than this (512 MiB) is corrupt, and not read
_named: set[str] = set()  # shards already named in this process's log: a damaged shard is named once


def _split_name(name: str) -> tuple[str, str] | None:
    """ "dir/abc.input.jpg" -> ("dir/abc", "input.jpg"); a name without an extension is no sample member."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem:
        return None
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


MAX_NAME_CHARS = 1_000  # a class name: WordNet's longest glosses run to a few hundred characters
# All of them as config.json writes them (JSON, non-ASCII escaped: an emoji takes 12 bytes): a Hugging Face config
# holds them twice with their ids, and a config.json is read up to 64 MiB.
MAX_NAMES_BYTES = 8 << 20


def check_number_names(names: list[str], file: str) -> None:
    """A CLASS_FILE's names written in digits are their own line numbers from 0: a label "3" reads as class 3
    (line 4), so a line "3" elsewhere would give each such image another class's name, in silence."""
    for line, name in enumerate(names):
        if _DIGITS.fullmatch(name.encode()) and int(name) != line:
            raise ValueError(
                f"{file}: line {line + 1} (class {line}) is named {name!r}, a number other than its class: a label "
                f"{name!r} reads as class {int(name)}, so a class named by digits must be its own number (line i "
                'holding i); give the classes names with a letter ("class_3"), or order the lines so'
            )


def check_class_names(names: list[str], where: str, item: str) -> None:
    """Class names read from an untrusted file: none empty, none repeated, no control character but a tab;
    `item` is what an entry is called in the messages ("line", "class"), numbered from 1."""
    seen: set[str] = set()
    if len(json.dumps(names)) > MAX_NAMES_BYTES:  # they go into every checkpoint's config.json
        raise ValueError(
            f"{where}: the class names take more than {MAX_NAMES_BYTES:,} bytes in all as a checkpoint's "
            "config.json writes them"
        )
    for number, name in enumerate(names, 1):
        if not name:
            raise ValueError(f"{where}: {item} {number} is empty; a class name is needed for each class")
        if len(name) > MAX_NAME_CHARS:
            raise ValueError(
                f"{where}: {item} {number}'s name is {len(name):,} characters, more than a class name holds "
                f"({MAX_NAME_CHARS:,})"
            )
        if any(unicodedata.category(char) == "Cc" and char != "\t" for char in name):  # a tab: words.txt's
            raise ValueError(f"{where}: {item} {number}'s name holds a control character ({name[:80]!r})")
        if name in seen:
            raise ValueError(f"{where}: the class name {name[:80]!r} appears twice")
        seen.add(name)


class ClassNames(NamedTuple):
    """The classes through which a label that is a class name is read: the names of CLASS_FILE."""

    file: str  # the CLASS_FILE, for the messages
    index: dict[str, int]  # name -> class index (its line, from 0)


def _label_value(ext: str, data: bytes) -> int | str:
    """The class index, or the class name, a .cls (text) or .json label member holds; ValueError when it holds
    neither (a name holds a letter: "1_0", "+3" or an Arabic-Indic three is no index and no name)."""
    if len(data) > MAX_LABEL_BYTES:
        raise ValueError(f"{len(data):,} bytes, more than a label holds")
    if ext.rsplit(".", 1)[-1] == "cls":
        if not _DIGITS.fullmatch(data):  # int() also reads "1_0" as 10, and other scripts' digits
            name = data.decode("utf-8", "replace").strip()
            if _is_name(name):
                return class_name(name)
            what = "empty" if not name else f"{data[:20]!r}, not a class index (ASCII digits) nor a name (a letter)"
            raise ValueError(f"the label is {what}")
        value = int(data)
    else:
        try:
            record = json.loads(data)
        except RecursionError as error:  # nesting deeper than the parser's stack: not a label record
            raise ValueError("JSON nested too deeply") from error
        value = record.get("label", record.get("cls")) if isinstance(record, dict) else None
        if isinstance(value, str) and _is_name(value.strip()):
            return class_name(value)
        if isinstance(value, str) and _DIGITS.fullmatch(value.strip().encode()):
            value = int(value)  # "9", as a .cls holding 9 is read
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError('no "label" or "cls" field holding a class index or a class name')
    if not 0 <= value < MAX_CLASSES:
        raise ValueError(f"label {value} is outside 0..{MAX_CLASSES - 1}")
    return value


def label_member(members: list[tuple[str, Member]]) -> tuple[str, Member] | None:
    """The (extension, member) a sample's label is read from: its .cls, else its .json."""
    found = [(e, m) for e, m in members if e.rsplit(".", 1)[-1] in ("cls", "json")]
    return min(found, key=lambda em: em[0].rsplit(".", 1)[-1] != "cls", default=None)


def class_name(text: str) -> str:
    """A class name as every reader compares it (a label, a line of CLASS_FILE, an hf string): without the spaces
    around it, in Unicode's composed form (NFC), so a macOS folder's decomposed "é" is the same name."""
    return unicodedata.normalize("NFC", text.strip())


def _is_name(text: str) -> bool:
    """Whether a label's text is a class name: a letter in it, no number in another notation (0x1, 1e3), no
    control character or undecodable byte (read as U+FFFD), not longer than a name."""
    if len(text) > MAX_NAME_CHARS or "\ufffd" in text or not any(char.isalpha() for char in text):
        return False
    if _NUMBER.fullmatch(text):
        return False
    return not any(unicodedata.category(char) == "Cc" for char in text)


def _parse_label(ext: str, data: bytes, classes: ClassNames | None = None) -> int:
    """The class index of a .cls (text) or .json label member, a class name read through `classes`; ValueError
    when it holds none in 0..MAX_CLASSES-1, or a name that `classes` lacks."""
    value = _label_value(ext, data)
    if not isinstance(value, str):
        return value
    if classes is None:
        raise ValueError(
            f"{value[:80]!r} is a class name, not a class index (ASCII digits); a {CLASS_FILE} beside the shards, "
            "one class name a line, reads such names"
        )
    if value not in classes.index:
        raise ValueError(f"{value[:80]!r} is not a class named in {classes.file}")
    return classes.index[value]


def _assemble(
    key: str,
    members: list[tuple[str, Member]],
    handle: BinaryIO,
    labelled: bool = True,
    classes: ClassNames | None = None,
) -> Sample:
    """Image bytes and label of one group of members (or what is wrong with it), a class name read through
    `classes`; without `labelled`, no label member is read and every image is class 0."""
    image = next((m for ext, m in members if ext.rsplit(".", 1)[-1] in _IMAGE_EXTS), None)
    label = label_member(members)
    if image is not None and not labelled:
        if image.size > MAX_IMAGE_BYTES:
            return Sample(key, None, None, f"member {image.name!r} of {image.size:,} bytes is too large to be read")
        return Sample(key, read_member(handle, image), 0)
    if image is None or label is None:
        return Sample(key, None, None, f"no {'image' if image is None else 'label (.cls or .json)'} member")
    if label[1].size > MAX_LABEL_BYTES or image.size > MAX_IMAGE_BYTES:
        big = label[1] if label[1].size > MAX_LABEL_BYTES else image
        return Sample(key, None, None, f"member {big.name!r} of {big.size:,} bytes is too large to be read")
    try:
        value = _parse_label(label[0], read_member(handle, label[1]), classes)
    except TarFormatError:
        raise
    except (ValueError, UnicodeDecodeError) as error:
        return Sample(key, None, None, f"unreadable label .{label[0]} ({error})")
    return Sample(key, read_member(handle, image), value)


class ShardLayoutError(ValueError):
    """A shard whose samples' files are not next to each other: no sample of it can be read whole."""


def _groups(handle: BinaryIO) -> Iterator[tuple[str, list[tuple[str, Member]]]]:
    """(key, [(extension, member), ...]) for each run of consecutive regular files sharing a key; a
    ShardLayoutError where a key comes back after another's files (a sample's files apart)."""
    key, group, done = None, [], set()
    where = str(getattr(handle, "name", "the shard"))
    try:
        for member in tar_members(handle):
            parts = _split_name(member.name)
            if parts is None:
                continue
            if parts[0] != key and group:
                _name_images(where, key, group)
                yield key, group
                done.add(key)
                group = []
            if parts[0] in done:
                raise ShardLayoutError(
                    f"{where}: the files of sample {parts[0]!r} are not next to each other ({member.name} comes "
                    "after other samples' files): a webdataset shard keeps each sample's files together, as "
                    "`tar --sort=name` (GNU tar) or `vitkit shard` writes them; or its file names hold a dot "
                    "before the extension, where webdataset's key ends"
                )
            key = parts[0]
            group.append((parts[1], member))
    except TarFormatError:
        if group:  # the members before the damage still make a sample (or a visibly incomplete one)
            yield key, group
        raise
    if group:
        _name_images(where, key, group)
        yield key, group


def _name_images(where: str, key: str, group: list[tuple[str, Member]]) -> None:
    """Name once a process a sample of several images of one kind (cat.0.jpg, cat.1.jpg: a key with a dot), of
    which the first is read; an image and its mask (k.jpg, k.mask.png) are a sample as meant."""
    images = [ext for ext, _ in group if ext.rsplit(".", 1)[-1] in _IMAGE_EXTS]
    kinds = [ext.rsplit(".", 1)[-1] for ext in images]
    if len(set(kinds)) < len(kinds):
        _name_once(
            "several images in a sample",
            f"{where}: sample {key!r} holds {len(images)} images ({', '.join(images[:5])}), of which the first is "
            "read: webdataset's key ends at the first dot of a file name, so cat.0.jpg and cat.1.jpg are both "
            "sample 'cat' (name them cat_0.jpg, ...)",
        )


def damage_message(path: str, count: int, error: Exception) -> str:
    """What is wrong with a shard whose tar structure broke after `count` samples, and what to do."""
    if isinstance(error, TarTruncatedError):
        return (
            f"{path} is truncated after {count} samples ({error}); the samples after the cut are lost: "
            "copy or write the shard again"
        )
    return f"{path}: damaged after {count} samples ({error})"


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Shards read while the block runs are read by every process alike (a source's labels scanned, a split read
    into memory): their messages go to the loading logger, which under torchrun the main process alone gives."""
    token = _loading.set(True)
    try:
        yield
    finally:
        _loading.reset(token)


def _name_once(path: str, message: str, *, every_process: bool = False) -> None:
    """Log `message` about shard `path` the first time only (a damaged shard is read again every epoch), to the
    loading logger where every process meets it (`every_process`, or inside `loading()`)."""
    if path not in _named:
        _named.add(path)
        (loading_log if every_process or _loading.get() else log).warning("%s", message)
