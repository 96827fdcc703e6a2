"""Request parsing: every malformed body becomes a `RequestError` with an HTTP status and a message naming it.

Pure functions over bytes and decoded JSON, so the HTTP layer stays thin and the fuzz tests can reach every
branch. Status codes: 400 for a body that is not UTF-8 JSON, 413 for a body, item count or text over a limit,
422 for JSON of the wrong shape or type.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

FUNCTIONS = ("softmax", "sigmoid", "none")
INPUT_NAME = "text"
OUTPUT_NAMES = ("label", "probabilities", "logits")


class RequestError(Exception):
    """A request the server refuses: `status` (4xx), a message for the client, a short reason for metrics."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    max_items: int = 64
    max_text_chars: int = 10_000


@dataclass(frozen=True)
class PredictRequest:
    texts: list[str]
    single: bool
    top_k: int | None
    function: str


@dataclass(frozen=True)
class InferRequest:
    texts: list[str]
    id: str | None
    outputs: tuple[str, ...]


def _type(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)


def decode_json(body: bytes) -> Any:
    """Strict UTF-8, then JSON (no NaN or Infinity).

    Raises:
        RequestError: 400 for an empty body, bytes that are not UTF-8, or malformed JSON.
    """
    if not body.strip():
        raise RequestError(400, "empty request body; expected a JSON object", "empty_body")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(
            400, f"request body is not valid UTF-8 (byte {body[e.start]:#04x} at offset {e.start})", "not_utf8"
        ) from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}", "bad_json") from None
    except RecursionError:
        raise RequestError(400, "malformed JSON: nested too deeply", "bad_json") from None
    except ValueError as e:  # an integer with more digits than Python converts, NaN/Infinity
        raise RequestError(400, f"malformed JSON: {e}", "bad_json") from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _object(payload: Any, where: str) -> dict:
    if not isinstance(payload, dict):
        raise RequestError(422, f"{where} must be a JSON object, not {_type(payload)}", "wrong_type")
    return payload


def _unknown_keys(obj: dict, allowed: tuple[str, ...], where: str) -> None:
    extra = sorted(k for k in obj if k not in allowed)
    if extra:
        names = ", ".join(repr(k)[:40] for k in extra[:5]) + (", ..." if len(extra) > 5 else "")
        raise RequestError(
            422, f"unknown field(s) in {where}: {names}; allowed: {', '.join(allowed)}", "unknown_field"
        )


def check_texts(texts: list, where: str, limits: Limits) -> list[str]:
    """Every item a string of at most `max_text_chars` characters, at most `max_items` items, at least one."""
    if not texts:
        raise RequestError(422, f"{where} is an empty list; send at least one text", "empty_inputs")
    if len(texts) > limits.max_items:
        raise RequestError(
            413, f"{where} has {len(texts)} texts; at most {limits.max_items} per request", "too_many_items"
        )
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise RequestError(422, f"{where}[{i}] is {_type(t)}; expected a string", "wrong_type")
        if len(t) > limits.max_text_chars:
            raise RequestError(
                413,
                f"{where}[{i}] has {len(t)} characters; at most {limits.max_text_chars} (texts "
                "within the limit are truncated to the model's max tokens)",
                "text_too_long",
            )
        if not _is_unicode(t):
            raise RequestError(
                422,
                f"{where}[{i}] is not valid Unicode text (it contains a lone surrogate escape such as \\ud800)",
                "bad_text",
            )
    return texts


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_predict(payload: Any, limits: Limits) -> PredictRequest:
    """`{"inputs": str | [str], "parameters": {"top_k": int | null, "function_to_apply": ...}}` (HF style)."""
    body = _object(payload, "request body")
    _unknown_keys(body, ("inputs", "parameters", "options"), "request body")
    if "inputs" not in body:
        raise RequestError(422, "missing field 'inputs' (a string or a list of strings)", "missing_field")
    inputs = body["inputs"]
    single = isinstance(inputs, str)
    if not single and not isinstance(inputs, list):
        raise RequestError(422, f"'inputs' must be a string or a list of strings, not {_type(inputs)}", "wrong_type")
    texts = check_texts([inputs] if single else inputs, "inputs", limits)
    params = _object({} if body.get("parameters") is None else body["parameters"], "'parameters'")
    _unknown_keys(params, ("top_k", "function_to_apply"), "'parameters'")
    top_k = params.get("top_k", 1)
    if top_k is not None and (type(top_k) is not int or top_k < 1):
        raise RequestError(
            422, f"'parameters.top_k' must be a positive integer or null, not {top_k!r}"[:300], "bad_parameter"
        )
    function = params.get("function_to_apply", "softmax")
    if function not in FUNCTIONS:
        raise RequestError(
            422,
            f"'parameters.function_to_apply' must be one of {', '.join(FUNCTIONS)}, not {function!r}"[:300],
            "bad_parameter",
        )
    return PredictRequest(texts, single, top_k, function)


def _flatten(data: list) -> list:
    out, stack = [], [iter(data)]
    while stack:  # iterative: a deeply nested `data` must not overflow the stack
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def parse_infer(payload: Any, limits: Limits) -> InferRequest:
    """An Open Inference Protocol v2 request with one BYTES input named "text" (shape [N] or [N, 1])."""
    body = _object(payload, "request body")
    _unknown_keys(body, ("id", "parameters", "inputs", "outputs"), "request body")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError(422, f"'id' must be a string, not {_type(request_id)}", "wrong_type")
    if request_id is not None and not _is_unicode(request_id):  # echoed in the response, which must encode
        raise RequestError(422, "'id' is not valid Unicode text (it contains a lone surrogate escape)", "bad_text")
    _object({} if body.get("parameters") is None else body["parameters"], "'parameters'")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1:
        got = f"{len(inputs)} inputs" if isinstance(inputs, list) else _type(inputs)
        raise RequestError(
            422,
            f"'inputs' must be a list of exactly one tensor (BYTES, named {INPUT_NAME!r}), not {got}",
            "wrong_type",
        )
    tensor = _object(inputs[0], "inputs[0]")
    _unknown_keys(tensor, ("name", "shape", "datatype", "data", "parameters"), "inputs[0]")
    if tensor.get("name") != INPUT_NAME:
        raise RequestError(
            422,
            f"unknown input {tensor.get('name')!r}; this model takes one BYTES input named {INPUT_NAME!r}"[:300],
            "unknown_input",
        )
    if tensor.get("datatype") != "BYTES":
        raise RequestError(
            422, f"input 'text' must have datatype 'BYTES', not {tensor.get('datatype')!r}"[:300], "wrong_datatype"
        )
    shape = tensor.get("shape")
    if (
        not isinstance(shape, list)
        or not shape
        or len(shape) > 2
        or any(type(d) is not int or d < 0 for d in shape)
        or (len(shape) == 2 and shape[1] != 1)
    ):
        raise RequestError(422, f"input 'text' must have shape [N] or [N, 1], not {shape!r}"[:300], "bad_shape")
    data = tensor.get("data")
    if not isinstance(data, list):
        raise RequestError(422, f"input 'text' data must be a list of strings, not {_type(data)}", "wrong_type")
    texts = _flatten(data)
    if len(texts) != math.prod(shape):
        raise RequestError(
            422, f"input 'text' has {len(texts)} elements but shape {shape} needs {math.prod(shape)}", "bad_shape"
        )
    check_texts(texts, "inputs[0].data", limits)
    return InferRequest(texts, request_id, _requested_outputs(body.get("outputs")))


def _requested_outputs(outputs: Any) -> tuple[str, ...]:
    if outputs is None:
        return OUTPUT_NAMES
    if not isinstance(outputs, list) or not outputs:
        raise RequestError(422, "'outputs' must be a non-empty list of {\"name\": ...} objects", "wrong_type")
    names = []
    for i, o in enumerate(outputs):
        name = _object(o, f"outputs[{i}]").get("name")
        if name not in OUTPUT_NAMES:
            raise RequestError(
                422, f"unknown output {name!r}; outputs are {', '.join(OUTPUT_NAMES)}"[:300], "unknown_output"
            )
        names.append(name)
    return tuple(dict.fromkeys(names))
