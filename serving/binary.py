"""The Open Inference Protocol's binary tensor data extension, as Triton defines it and `tritonclient` speaks it.

A request (or response) body is a JSON header followed by raw tensor data; the `Inference-Header-Content-Length`
HTTP header gives the JSON part's length. A tensor sent that way names its byte count in its parameters
(`binary_data_size`) instead of carrying `data`, and the tensors' bytes follow one another in the order the
tensors are listed. Numbers are little-endian in row-major order; a BYTES tensor is each element's length as a
4-byte little-endian unsigned integer, then its bytes.
"""

from __future__ import annotations

import json
import struct

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"
NUMPY = {"FP32": "<f4", "INT64": "<i8"}  # the numeric datatypes the server answers with


class BinaryError(Exception):
    """Binary tensor data that does not hold what its header says."""


def read_bytes_tensor(data: bytes, count: int) -> list[str]:
    """The `count` UTF-8 strings of a serialised BYTES tensor that fills `data` exactly."""
    texts, at = [], 0
    for n in range(count):
        if at + 4 > len(data):
            raise BinaryError(f"its binary data ends inside element {n} of {count}")
        (size,) = struct.unpack_from("<I", data, at)
        if at + 4 + size > len(data):
            raise BinaryError(f"element {n} says {size} bytes, but {len(data) - at - 4} are left")
        try:
            texts.append(data[at + 4 : at + 4 + size].decode("utf-8"))
        except UnicodeDecodeError:
            raise BinaryError(f"element {n} is not valid UTF-8") from None
        at += 4 + size
    if at != len(data):
        raise BinaryError(f"{len(data) - at} bytes are left after its {count} elements")
    return texts


def tensor_bytes(datatype: str, values: list) -> bytes:
    """The binary form of a tensor's flat `values`."""
    if datatype == "BYTES":
        parts = [str(v).encode("utf-8") for v in values]
        return b"".join(struct.pack("<I", len(p)) + p for p in parts)
    return np.asarray(values, dtype=NUMPY[datatype]).tobytes()


def response_body(header: dict, binary: dict[str, bytes]) -> tuple[bytes, dict[str, str]]:
    """The body and extra HTTP headers of a response whose outputs named in `binary` (name: their bytes, in the
    order of `header["outputs"]`) travel as binary data; a plain JSON body when there are none."""
    body = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
    if not binary:
        return body, {}
    rest = b"".join(binary[o["name"]] for o in header["outputs"] if o["name"] in binary)
    return body + rest, {HEADER_LENGTH: str(len(body))}


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes | None]:
    """(JSON part, binary part or None) of a request body, by its `Inference-Header-Content-Length` header.

    Raises:
        BinaryError: the header is not a length within the body.
    """
    if header_length is None:
        return body, None
    if not header_length.isdigit() or int(header_length) > len(body):
        raise BinaryError(
            f"{HEADER_LENGTH} must be the byte length of the JSON part (at most the body's {len(body)}), "
            f"not {header_length[:40]!r}"
        )
    n = int(header_length)
    return body[:n], body[n:]
