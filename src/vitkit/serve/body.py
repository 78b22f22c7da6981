"""Request bodies: read within a byte limit while they stream in, then split into uploaded images.

A body is one image (raw bytes, `Content-Type: image/*`) or a `multipart/form-data` form with one or
more `file` fields.  Everything that goes wrong here is an `HTTPError` with the status to answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request


class HTTPError(Exception):
    """An error answered as `{"error": message}` with `status` (and extra headers, e.g. Retry-After)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}

    def __reduce__(self):  # crosses from the model process with its status (pickle's default passes only args)
        return HTTPError, (self.status, self.message, self.headers)


@dataclass(frozen=True)
class Upload:
    """One image of a request: a name for error messages and the encoded bytes."""

    name: str
    data: bytes


class BodyBudget:
    """The bytes of request bodies held in memory at once, over all requests: without it, max_queue bodies of
    max_body_mb each (256 x 8 MiB by default) could be held together, and a flood of large uploads took the
    server process to 2 GB.  A request whose body would pass the budget gets 503 + Retry-After."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[Callable[[int], None]]:
        """A `take(n)` that reserves n more bytes for this request (or refuses); all are released at the end."""
        taken = 0

        def take(count: int) -> None:
            nonlocal taken
            if self.held + count > self.limit:
                raise HTTPError(
                    503,
                    f"server busy: {self.held:,} bytes of request bodies held in memory (limit "
                    f"{self.limit:,}, --max-bodies-mb); retry shortly",
                    {"Retry-After": "1"},
                )
            self.held, taken = self.held + count, taken + count

        try:
            yield take
        finally:
            self.held -= taken


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def check_content_type(request: Request) -> None:
    """415 unless the body is an image (image/*) or a multipart form, sent without a content coding (RFC 9110
    section 8.4: a coding the server does not apply is a 415)."""
    kind = media_type(request)
    send = "send one image with Content-Type image/* or a multipart/form-data form with 'file' fields"
    if not kind:
        raise HTTPError(415, f"no Content-Type: {send}")
    if not (kind.startswith("image/") or kind == "multipart/form-data"):
        raise HTTPError(415, f"unsupported content type {kind[:60]!r}: {send}")
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding != "identity":
        raise HTTPError(
            415, f"unsupported Content-Encoding {coding[:40]!r}: send the image's own bytes (PNG, JPEG, ...) uncoded"
        )


async def read_body(request: Request, limit: int, take: Callable[[int], None] = lambda count: None) -> bytes:
    """The whole body, refused with 413 as soon as it exceeds `limit` bytes: from Content-Length before
    reading anything, else while the chunks arrive (so an oversized body is never held in memory).  Its bytes
    are reserved with `take` (BodyBudget) chunk by chunk as they arrive, never from the declared length: headers
    that declare a body and send none hold nothing."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise HTTPError(400, f"invalid Content-Length {declared!r}")
        if int(declared) > limit:
            raise HTTPError(
                413, f"body of {int(declared):,} bytes exceeds the limit of {limit:,} bytes (--max-body-mb)"
            )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPError(413, f"body exceeds the limit of {limit:,} bytes (--max-body-mb)")
        take(len(chunk))
        chunks.append(chunk)
    if not size:
        raise HTTPError(400, "empty body: send an image (Content-Type image/*) or a multipart form with 'file' fields")
    return b"".join(chunks)


async def read_images(
    request: Request, limit: int, max_files: int, timeout_s: float, take: Callable[[int], None] = lambda count: None
) -> tuple[list[Upload], bool]:
    """(the images of the request, whether it was a multipart form); 408 when the body takes over `timeout_s`,
    400 (answered to nobody, but not an internal error) when the client leaves before the end of it."""
    check_content_type(request)
    try:
        async with asyncio.timeout(timeout_s):
            body = await read_body(request, limit, take)
    except TimeoutError as error:
        raise HTTPError(408, f"the request body did not arrive within {timeout_s:g} s") from error
    except ClientDisconnect as error:
        raise HTTPError(400, "the client disconnected before sending the whole body") from error
    if media_type(request) != "multipart/form-data":
        return [Upload("body", body)], False
    uploads = await _multipart(request, body, max_files)
    take(sum(len(upload.data) for upload in uploads))  # the parsed files: a second copy, held with the body
    return uploads, True


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _multipart(request: Request, body: bytes, max_files: int) -> list[Upload]:
    boundary = parse_options_header(request.headers.get("content-type", ""))[1].get(b"boundary", b"")
    closing = b"--" + boundary + b"--"  # on a line of its own: not a filename's or a field's text
    if boundary and not (body.startswith(closing) or b"\r\n" + closing in body):  # the parser reports ended parts
        raise HTTPError(400, "malformed multipart form: no closing boundary (its last part never ends)")
    parser = MultiPartParser(request.headers, _once(body), max_files=max_files, max_fields=max_files)
    try:
        form = await parser.parse()
    except MultiPartException as error:
        if error.message.startswith("Too many"):  # a valid form, beyond what one request may carry
            message = f"more than {max_files} parts in one form: send at most {max_files} a request ('file' fields)"
            raise HTTPError(413, message) from error
        raise HTTPError(400, f"malformed multipart form: {error.message}") from error
    try:
        fields = form.getlist("file")
        if not fields:
            raise HTTPError(400, f"the multipart form has no 'file' field (fields: {sorted(set(form.keys()))})")
        uploads = []
        for index, field in enumerate(fields):
            if not isinstance(field, UploadFile):
                raise HTTPError(400, f"'file' field {index + 1} is text, not a file upload")
            uploads.append(Upload(field.filename or f"file {index + 1}", await field.read()))
        return uploads
    finally:
        await form.close()
