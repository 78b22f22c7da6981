"""Mutators for checkpoint files: bytes, JSON values, safetensors headers, .npy headers in an .npz, torch zips.

Each takes the file's bytes and a `random.Random` and returns the mutated bytes.  The structured ones
keep the container valid where they can (offsets recomputed, zips rewritten) so that mutations reach
the checks behind the parsers: config fields, tensor names and shapes, size limits.
"""

from __future__ import annotations

import io
import json
import math
import random
import zipfile
from typing import Any

import numpy as np

INTS = [0, 1, -1, 2, 3, 7, 8, 16, 255, 1024, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 10**6, 3_000_000]
JSON_VALUES: list[Any] = [
    -3, -1, 0, 1, 2, 3, 4, 7, 16, 192, 1025, 10**6, 3_000_000, 2**31, 2**63, 10**30, 0.0, -0.0, 0.5, 1e-300, 1e308,
    float("nan"), float("inf"), float("-inf"), "", "192", "vit", "hybrid", "resnet", "token", "gap", "sincos_2d",
    "learned_2d", "relative", "per_layer", "exact", "x" * 10_000, None, True, False, [], {}, [1, 2, 3], {"a": 1},
    ["a"] * 3,
]  # fmt: skip
# JSON texts json.dumps does not write: deep nesting, a 5001-digit integer, a lone surrogate, an infinite literal
RAW_JSON = ["[" * 100_000 + "]" * 100_000, "1" + "0" * 5000, '"\\ud800"', "1e999", "-0"]
SAFETENSORS_DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "U8", "BOOL", "F8_E4M3", "X9", 3, None, ["F32"]]
NPY_DESCRS = ["<f2", "<f8", ">f4", "|u1", "|b1", "<i8", "<c8", "<U2", "|O", "|V4", "<M8[s]", [("a", "<f4")]]
TENSOR_NAMES = [  # names the readers' quirks and inference look for
    "blocks.7.attn.qkv.weight", "blocks.99999999999.norm1.weight", "fc_norm.weight", "reg_token",
    "pre_logits.fc.weight", "Transformer/encoderblock/LayerNorm_0/scale", "MAPHead_0/probe", "params/embedding/kernel",
    "vit.layers.0.attention.q_proj.weight", "conv_root/kernel", "block1/unit1/conv1/kernel", "state_dict",
]  # fmt: skip


def _position(rng: random.Random, size: int) -> int:
    # headers sit at the start: half the edits land in the first 512 bytes
    return rng.randrange(min(size, 512)) if rng.random() < 0.5 else rng.randrange(size)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Bit flips, truncation, random or interesting bytes written, inserted, deleted or duplicated."""
    if not data:
        return rng.randbytes(rng.randint(1, 64))
    out, i, n = bytearray(data), _position(rng, len(data)), rng.randint(1, 64)
    op = rng.randrange(7)
    if op == 0:
        for _ in range(rng.randint(1, 8)):
            j = _position(rng, len(out))
            out[j] ^= 1 << rng.randrange(8)
    elif op == 1:
        del out[rng.randrange(len(out)) :]
    elif op == 2:
        out[i : i + n] = rng.randbytes(n)
    elif op == 3:
        width = rng.choice((1, 2, 4, 8))
        out[i : i + width] = (rng.choice(INTS) % (1 << 8 * width)).to_bytes(width, "little")
    elif op == 4:
        out[i:i] = rng.randbytes(n)
    elif op == 5:
        del out[i : i + n]
    else:
        j = rng.randrange(len(out))
        out[i:i] = out[j : j + n]
    return bytes(out)


# ---- JSON -------------------------------------------------------------------------------------------------


def _slots(node: Any, prefer: str = "model") -> list[tuple[Any, Any]]:
    """(container, key) of every value in a JSON tree; those under `prefer` listed once more (they matter more)."""
    slots, stack = [], [(node, False)]
    while stack:
        current, preferred = stack.pop()
        listed = enumerate(current) if isinstance(current, list) else ()
        items = current.items() if isinstance(current, dict) else listed
        for key, value in items:
            inside = preferred or key == prefer
            slots.extend([(current, key)] * (2 if inside else 1))
            stack.append((value, inside))
    return slots


def mutate_json(data: bytes, rng: random.Random) -> bytes:
    """One value of a JSON document replaced, nudged, deleted or added; the text rewritten."""
    try:
        tree = json.loads(data)
    except ValueError:
        return mutate_bytes(data, rng)
    slots = _slots(tree)
    if not slots:
        return json.dumps(rng.choice(JSON_VALUES)).encode()
    container, key = rng.choice(slots)
    value, op, raw = container[key], rng.randrange(6), None
    if op <= 1:
        container[key] = rng.choice(JSON_VALUES)
    elif op == 2 and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        nudged = [value + 1, value - 1, -value, value * 1000, value / 3, int(value) if value else 1.5]
        container[key] = rng.choice(nudged)
    elif op == 3 and isinstance(container, dict):
        del container[key]
    elif op == 4 and isinstance(container, dict):
        container[rng.choice(["bogus", "family", "vit", "layers", "model_args", "id2label"])] = rng.choice(JSON_VALUES)
    else:
        raw, container[key] = rng.choice(RAW_JSON), "\u0000RAW\u0000"
    text = json.dumps(tree)
    return (text.replace('"\\u0000RAW\\u0000"', raw, 1) if raw else text).encode("utf-8", "surrogatepass")


# ---- safetensors ------------------------------------------------------------------------------------------


def _safetensors(entries: list[tuple[str, str, list[int], bytes]]) -> bytes:
    header, offset = {}, 0
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + b"".join(e[3] for e in entries)


def mutate_safetensors(data: bytes, rng: random.Random) -> bytes:
    """A header field edited (shape, dtype, offsets, name), or a tensor dropped, reshaped or added validly."""
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    header.pop("__metadata__", None)
    body = data[8 + length :]
    entries = [(k, v["dtype"], v["shape"], body[slice(*v["data_offsets"])]) for k, v in header.items()]
    entries.sort(key=lambda e: header[e[0]]["data_offsets"][0])
    i, op = rng.randrange(len(entries)), rng.randrange(8)
    name, dtype, shape, raw = entries[i]
    if op == 0:  # valid file, one tensor fewer
        del entries[i]
    elif op == 1:  # same bytes, another shape: flattened, split or transposed
        numel = math.prod(shape)
        entries[i] = (name, dtype, rng.choice([[numel], [1, numel], shape[::-1], [*shape, 1], shape[1:] or [1]]), raw)
    elif op == 2:
        entries.append((rng.choice(TENSOR_NAMES), "F32", [2, 2], bytes(16)))
    elif op == 3:
        entries[i] = (rng.choice(TENSOR_NAMES + [name + "x", "module." + name]), dtype, shape, raw)
    else:  # an edit of the header alone: the data no longer matches it
        text = _safetensors(entries)
        length = int.from_bytes(text[:8], "little")
        edited = json.loads(text[8 : 8 + length])
        field = edited[name]
        if op == 4:
            field["dtype"] = rng.choice(SAFETENSORS_DTYPES)
        elif op == 5:
            dims = list(field["shape"]) or [1]
            dims[rng.randrange(len(dims))] = rng.choice(INTS + [-5])
            field["shape"] = dims
        elif op == 6:
            field["data_offsets"][rng.randrange(2)] = rng.choice(INTS)
        else:
            edited["__metadata__"] = rng.choice(JSON_VALUES)
        new = json.dumps(edited).encode()
        return len(new).to_bytes(8, "little") + new + text[8 + length :]
    return _safetensors(entries)


# ---- zips: .npz and torch's .pth --------------------------------------------------------------------------


def _members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def _zip(members: list[tuple[str, bytes]], rng: random.Random) -> bytes:
    buffer = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if rng.random() < 0.1 else zipfile.ZIP_STORED
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, raw in members:
            archive.writestr(name, raw)
    return buffer.getvalue()


def _npy_edit(raw: bytes, rng: random.Random) -> bytes:
    """The .npy header's shape, dtype or order changed; the data kept, cut or padded to the new claim."""
    stream = io.BytesIO(raw)
    version = np.lib.format.read_magic(stream)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(stream)
    payload, numel = raw[stream.tell() :], math.prod(shape)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": fortran, "shape": tuple(shape)}
    choice = rng.randrange(4)
    if choice == 0:
        header["descr"] = rng.choice(NPY_DESCRS)
    elif choice == 1 and shape:
        dims = list(shape)
        dims[rng.randrange(len(dims))] = rng.choice([0, 1, 3, 10**6, 2**40])
        header["shape"] = tuple(dims)
    elif choice == 2:
        header["shape"] = rng.choice([(numel,), (1, numel), tuple(shape[::-1]), (), (numel, 1, 1, 1, 1)])
    else:
        header["fortran_order"] = not fortran
    out = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(out, header)
    except (ValueError, TypeError):
        return raw
    if rng.random() < 0.5:  # data fitted to the new claim (bounded: the fuzzer must not allocate either)
        want = min(math.prod(header["shape"]) * np.dtype(dtype).itemsize, len(payload) + 4096)
        payload = payload[:want].ljust(want, b"\0")
    return out.getvalue() + payload


def mutate_npz(data: bytes, rng: random.Random) -> bytes:
    """An .npy member's header edited, a member dropped, renamed or added, or its bytes damaged."""
    members = _members(data)
    i, op = rng.randrange(len(members)), rng.randrange(5)
    name, raw = members[i]
    if op == 0:
        members[i] = (name, _npy_edit(raw, rng))
    elif op == 1:
        del members[i]
    elif op == 2:
        names = [n + ".npy" for n in TENSOR_NAMES] + [name.removesuffix(".npy"), "opt/target/" + name]
        members[i] = (rng.choice(names), raw)
    elif op == 3:
        extra = io.BytesIO()
        np.save(extra, np.zeros(rng.choice([(3, 16), (5,), (2, 2, 2)]), np.float32))
        members.append((rng.choice(TENSOR_NAMES) + ".npy", extra.getvalue()))
    else:
        members[i] = (name, mutate_bytes(raw, rng))
    return _zip(members, rng)


def mutate_pth(data: bytes, rng: random.Random) -> bytes:
    """torch.save's zip: the pickle or a storage record damaged, a record dropped, or the zip rewritten."""
    members = _members(data)
    i = rng.randrange(len(members))
    name, raw = members[i]
    pickles = [j for j, (n, _) in enumerate(members) if n.endswith(".pkl")]
    op = rng.randrange(4)
    if op == 0 and pickles:
        j = rng.choice(pickles)
        members[j] = (members[j][0], mutate_bytes(members[j][1], rng))
    elif op == 1:
        members[i] = (name, mutate_bytes(raw, rng))
    elif op == 2:
        del members[i]
    else:
        members[i] = (name + rng.choice(["x", "/0", ""]), raw[: rng.randrange(len(raw) + 1)])
    return _zip(members, rng)
