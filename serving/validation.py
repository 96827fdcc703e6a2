"""Request parsing: every malformed body becomes a `RequestError` with an HTTP status and a message naming it.

Pure functions over bytes and decoded JSON, so the HTTP layer stays thin and the fuzz tests can reach every
branch. Status codes: 400 for a body that is not UTF-8 JSON, 413 for a body, item count or text over a limit,
422 for JSON of the wrong shape or type, or of a shape meant for another kind of model.

What a request carries depends on the artifact's task kind: texts (or text pairs) to label, texts to find the
entities of, or questions with their contexts to answer (`Question`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from serving.binary import BinaryError, read_bytes_tensor
from serving.spans import MAX_ANSWER_LEN

FUNCTIONS = ("softmax", "sigmoid", "none")
INPUT_NAME, PAIR_INPUT_NAME = "text", "text_pair"
QUESTION_INPUTS = ("question", "context")
Text = str | tuple[str, str]  # one text, or (text, text_pair) for a sentence-pair model


class Kind(Protocol):
    """What request parsing asks of a task kind (`serving.kinds.ServedKind`)."""

    outputs: dict[str, str]

    def input_names(self, pair: bool) -> tuple[str, ...]: ...

    def model_name(self, pair: bool) -> str: ...

    def wanted_inputs(self, pair: bool) -> str: ...

    def predict_request(self, items: list, single: bool, params: dict, limits: Limits, pair: bool) -> Any: ...

    def infer_items(self, columns: list[list[str]], pair: bool) -> list: ...


@dataclass(frozen=True)
class Question:
    """One item of a question-answering request."""

    question: str
    context: str


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
    texts: list  # Text items, or Question items for a question-answering model
    single: bool
    top_k: int | None
    function: str
    max_answer_len: int = MAX_ANSWER_LEN


@dataclass(frozen=True)
class InferRequest:
    texts: list  # as PredictRequest's
    id: str | None
    outputs: tuple[str, ...]
    binary: frozenset[str] = field(default_factory=frozenset)  # outputs to send as binary data (the extension)


def type_name(value: Any) -> str:
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


def as_object(payload: Any, where: str) -> dict:
    if not isinstance(payload, dict):
        raise RequestError(422, f"{where} must be a JSON object, not {type_name(payload)}", "wrong_type")
    return payload


def unknown_keys(obj: dict, allowed: tuple[str, ...], where: str) -> None:
    extra = sorted(k for k in obj if k not in allowed)
    if extra:
        names = ", ".join(repr(k)[:40] for k in extra[:5]) + (", ..." if len(extra) > 5 else "")
        raise RequestError(
            422, f"unknown field(s) in {where}: {names}; allowed: {', '.join(allowed)}", "unknown_field"
        )


def check_count(items: list, where: str, limits: Limits) -> None:
    """At least one item, at most `max_items`."""
    if not items:
        raise RequestError(422, f"{where} is an empty list; send at least one text", "empty_inputs")
    if len(items) > limits.max_items:
        raise RequestError(
            413, f"{where} has {len(items)} texts; at most {limits.max_items} per request", "too_many_items"
        )


def check_text(text: Any, at: str, limits: Limits) -> str:
    """A string of at most `max_text_chars` characters that encodes as UTF-8."""
    if not isinstance(text, str):
        raise RequestError(422, f"{at} is {type_name(text)}; expected a string", "wrong_type")
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
    check_count(texts, where, limits)
    for i, text in enumerate(texts):
        check_text(text, f"{where}[{i}]", limits)
    return texts


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


PAIR_EXAMPLE = '{"text": "...", "text_pair": "..."}'


def _items(inputs: Any, pair: bool, kind: Kind) -> tuple[list, bool]:
    """(items, single) from `inputs`: a string or an object, or a list of them (not mixed)."""
    if isinstance(inputs, str | dict):
        return [inputs], True
    if not isinstance(inputs, list):
        wanted = kind.wanted_inputs(pair)
        raise RequestError(422, f"'inputs' must be {wanted}, not {type_name(inputs)}", "wrong_type")
    return inputs, False


def pair_items(items: list, where: str, pair: bool, single: bool = False) -> list[Text]:
    """Strings stay strings; `{"text": a, "text_pair": b}` becomes (a, b) (`{"text": a}` alone is the string a).
    A pair sent to a single-text model, or a string to a pair model, is refused naming what the model reads."""
    out: list[Text] = []
    for i, item in enumerate(items):
        at = where if single else f"{where}[{i}]"
        if isinstance(item, dict):
            unknown_keys(item, (INPUT_NAME, PAIR_INPUT_NAME), at)
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


def check_items(items: list[Text], where: str, limits: Limits) -> list[Text]:
    """`check_texts` for single texts and pairs: a pair is one item, and each of its texts is held to the limits."""
    check_count(items, where, limits)
    for i, item in enumerate(items):
        if isinstance(item, tuple):
            for j, text in enumerate(item):
                check_text(text, f"{where}[{i}][{j}]", limits)
        else:
            check_text(item, f"{where}[{i}]", limits)
    return items


QUESTION_EXAMPLE = '{"question": "...", "context": "..."}'


def parse_predict(payload: Any, limits: Limits, pair: bool, kind: Kind) -> PredictRequest:
    """`{"inputs": ..., "parameters": {...}}`, the Hugging Face inference formats, for a model of `kind` (its
    `serving.kinds` adapter). Sequence classification: `inputs` is a string or a list of strings (`{"text": ...,
    "text_pair": ...}` objects for a sentence-pair model, `pair`), parameters `top_k` (int or null) and
    `function_to_apply`. Token classification: a string or a list of strings, parameter `aggregation_strategy`
    ("simple", the only one served). Question answering: `{"question": ..., "context": ...}` or a list of them,
    parameters `top_k` and `max_answer_len`."""
    body = as_object(payload, "request body")
    unknown_keys(body, ("inputs", "parameters", "options"), "request body")
    if "inputs" not in body:
        raise RequestError(422, f"missing field 'inputs' ({kind.wanted_inputs(pair)})", "missing_field")
    params = as_object({} if body.get("parameters") is None else body["parameters"], "'parameters'")
    items, single = _items(body["inputs"], pair, kind)
    return kind.predict_request(items, single, params, limits, pair)


def positive(params: dict, name: str, default: int, nullable: bool = True, most: int | None = None) -> int | None:
    value = params.get(name, default)
    if (value is None and nullable) or (type(value) is int and 1 <= value <= (most or value)):
        return value
    wanted = "a positive integer" if most is None else f"an integer from 1 to {most}"
    wanted += " or null" if nullable else ""
    raise RequestError(422, f"'parameters.{name}' must be {wanted}, not {value!r}"[:300], "bad_parameter")


def question_items(items: list, where: str, limits: Limits, single: bool = False) -> list[Question]:
    """`{"question": q, "context": c}` objects as `Question`s: both non-blank strings within the limits."""
    check_count(items, where, limits)
    out = []
    for i, item in enumerate(items):
        at = where if single else f"{where}[{i}]"
        if not isinstance(item, dict):
            raise RequestError(
                422,
                f"{at} is {type_name(item)}, but this model answers questions: send {QUESTION_EXAMPLE}",
                "not_question",
            )
        unknown_keys(item, QUESTION_INPUTS, at)
        texts = []
        for name in QUESTION_INPUTS:
            if name not in item:
                raise RequestError(422, f"{at} has no {name!r}; a question is {QUESTION_EXAMPLE}", "missing_field")
            texts.append(nonblank(check_text(item[name], f"{at}.{name}", limits), f"{at}.{name}"))
        out.append(Question(*texts))
    return out


def nonblank(text: str, at: str) -> str:
    if not text.strip():
        raise RequestError(422, f"{at} is empty; a question and its context need text", "empty_text")
    return text


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


def parse_infer(payload: Any, limits: Limits, pair: bool, kind: Kind, binary: bytes | None = None) -> InferRequest:
    """An Open Inference Protocol v2 request: BYTES inputs of shape [N] or [N, 1], one per name the model of `kind`
    takes (its adapter's `input_names`: "text"; "text" and "text_pair" for a sentence-pair model; "question" and
    "context").

    `binary` is what followed the JSON header in a request of the binary tensor data extension (None: the body
    was JSON alone): an input whose parameters give `binary_data_size` takes that many bytes of it, in input
    order. Outputs asked for with `{"binary_data": true}` (or all, with the request's `binary_data_output`) are
    answered in binary too."""
    body = as_object(payload, "request body")
    unknown_keys(body, ("id", "parameters", "inputs", "outputs"), "request body")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError(422, f"'id' must be a string, not {type_name(request_id)}", "wrong_type")
    if request_id is not None and not _is_unicode(request_id):  # echoed in the response, which must encode
        raise RequestError(422, "'id' is not valid Unicode text (it contains a lone surrogate escape)", "bad_text")
    params = as_object({} if body.get("parameters") is None else body["parameters"], "'parameters'")
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise RequestError(422, "'parameters.binary_data_output' must be a boolean", "bad_parameter")
    names = kind.input_names(pair)
    wanted = " and ".join(repr(n) for n in names)
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != len(names):
        got = f"{len(inputs)} inputs" if isinstance(inputs, list) else type_name(inputs)
        raise RequestError(
            422,
            f"'inputs' must be a list of {len(names)} BYTES tensor(s) named {wanted} for this "
            f"{kind.model_name(pair)}, not {got}",
            "not_pair" if pair and isinstance(inputs, list) and len(inputs) == 1 else "wrong_type",
        )
    tensors, offset = {}, 0
    for i, tensor in enumerate(inputs):
        tensor = as_object(tensor, f"inputs[{i}]")
        name = tensor.get("name")
        if not isinstance(name, str) or name not in names:  # not a string: any JSON value, unhashable ones too
            reason = "not_single" if name == PAIR_INPUT_NAME else "unknown_input"
            raise RequestError(422, f"unknown input {name!r}; this model takes BYTES input(s) {wanted}"[:300], reason)
        if name in tensors:
            raise RequestError(422, f"input {name!r} is given twice; this model takes {wanted}", "unknown_input")
        tensors[name], offset = _bytes_tensor(tensor, i, limits, binary, offset)
    if binary is not None and offset != len(binary):
        raise RequestError(
            422, f"the binary data is {len(binary)} bytes but the inputs' binary_data_size add up to {offset}",
            "bad_binary",
        )  # fmt: skip
    columns = [tensors[n] for n in names]
    if any(len(c) != len(columns[0]) for c in columns):
        counts = " but ".join(f"{n!r} has {len(c)} elements" for n, c in zip(names, columns, strict=True))
        raise RequestError(422, f"{counts}; one of each per item", "bad_shape")
    texts = kind.infer_items(columns, pair)
    outputs, binary_outputs = _requested_outputs(body.get("outputs"), tuple(kind.outputs), binary_default)
    return InferRequest(texts, request_id, outputs, binary_outputs)


def _bytes_tensor(tensor: dict, i: int, limits: Limits, binary: bytes | None, offset: int) -> tuple[list[str], int]:
    """The strings of one BYTES input tensor of shape [N] or [N, 1], checked against the limits, and where the
    next input's binary data starts."""
    unknown_keys(tensor, ("name", "shape", "datatype", "data", "parameters"), f"inputs[{i}]")
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
    params = as_object({} if tensor.get("parameters") is None else tensor["parameters"], f"inputs[{i}].parameters")
    unknown_keys(params, ("binary_data_size",), f"inputs[{i}].parameters")  # no shared memory
    size = params.get("binary_data_size")
    if size is not None:
        texts, offset = _binary_texts(name, size, shape, binary, offset, tensor)
    else:
        data = tensor.get("data")
        if not isinstance(data, list):
            wrong = f"input {name!r} data must be a list of strings, not {type_name(data)}"
            raise RequestError(422, wrong, "wrong_type")
        texts = _flatten(data)
    if len(texts) != math.prod(shape):
        raise RequestError(
            422, f"input {name!r} has {len(texts)} elements but shape {shape} needs {math.prod(shape)}", "bad_shape"
        )
    return check_texts(texts, f"inputs[{i}].data", limits), offset


def _binary_texts(name: str, size: Any, shape: list, binary: bytes | None, offset: int, tensor: dict):
    if binary is None:
        raise RequestError(
            422, f"input {name!r} gives binary_data_size, but the request has no Inference-Header-Content-Length "
            "header (the length of its JSON part)", "bad_binary",
        )  # fmt: skip
    if type(size) is not int or size < 0 or offset + size > len(binary):
        raise RequestError(
            422, f"input {name!r} binary_data_size {size!r} does not fit the {len(binary) - offset} bytes left"[:300],
            "bad_binary",
        )  # fmt: skip
    if "data" in tensor:
        raise RequestError(422, f"input {name!r} has both 'data' and binary_data_size; send one", "bad_binary")
    try:
        texts = read_bytes_tensor(binary[offset : offset + size], math.prod(shape))
    except BinaryError as e:
        raise RequestError(422, f"input {name!r}: {e}", "bad_binary") from None
    return texts, offset + size


def _requested_outputs(
    outputs: Any, names: tuple[str, ...], binary_default: bool
) -> tuple[tuple[str, ...], frozenset[str]]:
    """The outputs asked for (all when none are named) and those to send as binary data."""
    if outputs is None:
        return names, frozenset(names if binary_default else ())
    if not isinstance(outputs, list) or not outputs:
        raise RequestError(422, "'outputs' must be a non-empty list of {\"name\": ...} objects", "wrong_type")
    wanted, binary = [], set()
    for i, o in enumerate(outputs):
        o = as_object(o, f"outputs[{i}]")
        unknown_keys(o, ("name", "parameters"), f"outputs[{i}]")
        name = o.get("name")
        if name not in names:
            raise RequestError(422, f"unknown output {name!r}; outputs are {', '.join(names)}"[:300], "unknown_output")
        params = as_object({} if o.get("parameters") is None else o["parameters"], f"outputs[{i}].parameters")
        unknown_keys(params, ("binary_data",), f"outputs[{i}].parameters")  # no classification extension
        flag = params.get("binary_data", binary_default)
        if not isinstance(flag, bool):
            raise RequestError(422, f"outputs[{i}].parameters.binary_data must be a boolean", "bad_parameter")
        wanted.append(name)
        if flag:
            binary.add(name)
    return tuple(dict.fromkeys(wanted)), frozenset(binary)
