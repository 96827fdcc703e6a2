"""The stages of a deploy, one module each, in the order the flow runs them. Each module's `run` is a plain
function over paths that returns a small JSON-able report (package: the artifact's path), so a Prefect task wraps
it as it is (`flows/stage_tasks.py`) and the per-stage commands call it without Prefect.

| stage | module | what it does |
|---|---|---|
| data | `data` | load, validate and fingerprint the task's data; carve the validation split from train |
| teacher | `teacher` | the fine-tuned dense teacher (given, or fine-tuned and cached) |
| kd_teacher | `kd_teacher` | only with `--kd-model` (fine-tuned, cached, gated) or `--kd-teacher`: output KD's |
| plan | `plan` | only for a speed target: measure the latency table, pick the shape |
| compress | `compress` | each method of the chain on a copy of the teacher (cached, compacted in between) |
| compact | `compact` | remove the dead heads and neurons, proven exact |
| export | `export` | fused fp32 and int8 ONNX graphs of the compacted model and of the dense teacher |
| validate | `validate` | parity and accuracy gates on the validation split; dev reported |
| bench | `bench` | ONNX Runtime latency of dense and compressed graphs, interleaved |
| package | `package` | report, model card, manifest (and signature), published by one rename |

A stage with a flow of its own comes before any deploy: `general`, a general (task-agnostic) student distilled
from a pre-trained model on unlabelled text (`pipeline distill-general`, `flows/general.py`), which a deploy then
takes as its `--model`.
"""

STAGES = ("data", "teacher", "kd_teacher", "plan", "compress", "compact", "export", "validate", "bench", "package")
OWN_FLOW = ("general",)
