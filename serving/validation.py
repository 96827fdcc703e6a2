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
INPUT_NAME, PAIR_INPUT_NAME = "text", "text_pair"
OUTPUT_NAMES = ("label", "probabilities", "logits")
Text = str | tuple[str, str]  # one text, or (text, text_pair) for a sentence-pair model


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
    texts: list[Text]
    single: bool
    top_k: int | None
    function: str


@dataclass(frozen=True)
class InferRequest:
    texts: list[Text]
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


def _check_count(items: list, where: str, limits: Limits) -> None:
    """At least one item, at most `max_items`."""
    if not items:
        raise RequestError(422, f"{where} is an empty list; send at least one text", "empty_inputs")
    if len(items) > limits.max_items:
        raise RequestError(
            413, f"{where} has {len(items)} texts; at most {limits.max_items} per request", "too_many_items"
        )


def _check_text(text: Any, at: str, limits: Limits) -> str:
    """A string of at most `max_text_chars` characters that encodes as UTF-8."""
    if not isinstance(text, str):
        raise RequestError(422, f"{at} is {_type(text)}; expected a string", "wrong_type")
    if len(text) > limits.max_text_chars:
        raise RequestError(
            413,
            f"{at} has {len(text)} characters; at most {limits.max_text_chars} (texts "
            "within the limit are truncated to the model's max tokens)",
            "text_too_long",
        )
    if not _is_unicode(text):
        raise RequestError(
            422, f"{at} is not valid Unicode text (it contains a lone surrogate escape such as \\ud800)", "bad_text"
        )
    return text


def check_texts(texts: list, where: str, limits: Limits) -> list[str]:
    """Every item a string within the limits, at most `max_items` items, at least one."""
    _check_count(texts, where, limits)
    for i, text in enumerate(texts):
        _check_text(text, f"{where}[{i}]", limits)
    return texts


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


PAIR_EXAMPLE = '{"text": "...", "text_pair": "..."}'


def _wanted_inputs(pair: bool) -> str:
    return f"a pair object {PAIR_EXAMPLE} or a list of them" if pair else "a string or a list of strings"


def _items(inputs: Any, pair: bool) -> tuple[list, bool]:
    """(items, single) from `inputs`: a string or a pair object, or a list of them (not mixed)."""
    if isinstance(inputs, str | dict):
        return [inputs], True
    if not isinstance(inputs, list):
        raise RequestError(422, f"'inputs' must be {_wanted_inputs(pair)}, not {_type(inputs)}", "wrong_type")
    return inputs, False


def _pair_items(items: list, where: str, pair: bool, single: bool = False) -> list[Text]:
    """Strings stay strings; `{"text": a, "text_pair": b}` becomes (a, b) (`{"text": a}` alone is the string a).
    A pair sent to a single-text model, or a string to a pair model, is refused naming what the model reads."""
    out: list[Text] = []
    for i, item in enumerate(items):
        at = where if single else f"{where}[{i}]"
        if isinstance(item, dict):
            _unknown_keys(item, (INPUT_NAME, PAIR_INPUT_NAME), at)
            if INPUT_NAME not in item:
                raise RequestError(422, f"{at} has no 'text'; a pair is {PAIR_EXAMPLE}", "missing_field")
            item = (item[INPUT_NAME], item[PAIR_INPUT_NAME]) if PAIR_INPUT_NAME in item else item[INPUT_NAME]
        if isinstance(item, tuple) and not pair:
            raise RequestError(
                422, f"{at} is a text pair, but this model classifies single texts: send strings", "not_single"
            )
        if isinstance(item, str) and pair:
            raise RequestError(
                422,
                f"{at} is a single text, but this model classifies sentence pairs: send {PAIR_EXAMPLE}",
                "not_pair",
            )
        out.append(item)
    return out


def _check_items(items: list[Text], where: str, limits: Limits) -> list[Text]:
    """`check_texts` for single texts and pairs: a pair is one item, and each of its texts is held to the limits."""
    _check_count(items, where, limits)
    for i, item in enumerate(items):
        if isinstance(item, tuple):
            for j, text in enumerate(item):
                _check_text(text, f"{where}[{i}][{j}]", limits)
        else:
            _check_text(item, f"{where}[{i}]", limits)
    return items


def parse_predict(payload: Any, limits: Limits, pair: bool = False) -> PredictRequest:
    """`{"inputs": ..., "parameters": {"top_k": int | null, "function_to_apply": ...}}` (HF style). `inputs` is a
    string or a list of strings for a single-text model; `{"text": ..., "text_pair": ...}` or a list of such
    objects for a sentence-pair model (`pair`)."""
    body = _object(payload, "request body")
    _unknown_keys(body, ("inputs", "parameters", "options"), "request body")
    if "inputs" not in body:
        raise RequestError(422, f"missing field 'inputs' ({_wanted_inputs(pair)})", "missing_field")
    items, single = _items(body["inputs"], pair)
    texts = _check_items(_pair_items(items, "inputs", pair, single), "inputs", limits)
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


def parse_infer(payload: Any, limits: Limits, pair: bool = False) -> InferRequest:
    """An Open Inference Protocol v2 request: one BYTES input named "text" (shape [N] or [N, 1]), and for a
    sentence-pair model (`pair`) a second one named "text_pair" of the same shape."""
    body = _object(payload, "request body")
    _unknown_keys(body, ("id", "parameters", "inputs", "outputs"), "request body")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError(422, f"'id' must be a string, not {_type(request_id)}", "wrong_type")
    if request_id is not None and not _is_unicode(request_id):  # echoed in the response, which must encode
        raise RequestError(422, "'id' is not valid Unicode text (it contains a lone surrogate escape)", "bad_text")
    _object({} if body.get("parameters") is None else body["parameters"], "'parameters'")
    names = (INPUT_NAME, PAIR_INPUT_NAME) if pair else (INPUT_NAME,)
    wanted = " and ".join(repr(n) for n in names)
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != len(names):
        got = f"{len(inputs)} inputs" if isinstance(inputs, list) else _type(inputs)
        model = "sentence-pair model" if pair else "single-text model"
        raise RequestError(
            422,
            f"'inputs' must be a list of {len(names)} BYTES tensor(s) named {wanted} for this {model}, not {got}",
            "not_pair" if pair and isinstance(inputs, list) and len(inputs) == 1 else "wrong_type",
        )
    tensors = {}
    for i, tensor in enumerate(inputs):
        tensor = _object(tensor, f"inputs[{i}]")
        name = tensor.get("name")
        if not isinstance(name, str) or name not in names:  # not a string: any JSON value, unhashable ones too
            reason = "not_single" if name == PAIR_INPUT_NAME else "unknown_input"
            raise RequestError(422, f"unknown input {name!r}; this model takes BYTES input(s) {wanted}"[:300], reason)
        if name in tensors:
            raise RequestError(422, f"input {name!r} is given twice; this model takes {wanted}", "unknown_input")
        tensors[name] = _bytes_tensor(tensor, i, limits)
    texts = tensors[INPUT_NAME]
    if pair:
        second = tensors[PAIR_INPUT_NAME]
        if len(second) != len(texts):
            raise RequestError(
                422, f"'text' has {len(texts)} elements but 'text_pair' has {len(second)}; one per pair", "bad_shape"
            )
        texts = list(zip(texts, second, strict=True))
    return InferRequest(texts, request_id, _requested_outputs(body.get("outputs")))


def _bytes_tensor(tensor: dict, i: int, limits: Limits) -> list[str]:
    """The strings of one BYTES input tensor of shape [N] or [N, 1], checked against the limits."""
    _unknown_keys(tensor, ("name", "shape", "datatype", "data", "parameters"), f"inputs[{i}]")
    name = tensor["name"]
    if tensor.get("datatype") != "BYTES":
        raise RequestError(
            422, f"input {name!r} must have datatype 'BYTES', not {tensor.get('datatype')!r}"[:300], "wrong_datatype"
        )
    shape = tensor.get("shape")
    if (
        not isinstance(shape, list)
        or not shape
        or len(shape) > 2
        or any(type(d) is not int or d < 0 for d in shape)
        or (len(shape) == 2 and shape[1] != 1)
    ):
        raise RequestError(422, f"input {name!r} must have shape [N] or [N, 1], not {shape!r}"[:300], "bad_shape")
    data = tensor.get("data")
    if not isinstance(data, list):
        raise RequestError(422, f"input {name!r} data must be a list of strings, not {_type(data)}", "wrong_type")
    texts = _flatten(data)
    if len(texts) != math.prod(shape):
        raise RequestError(
            422, f"input {name!r} has {len(texts)} elements but shape {shape} needs {math.prod(shape)}", "bad_shape"
        )
    return check_texts(texts, f"inputs[{i}].data", limits)


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
