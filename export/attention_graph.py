"""The exported attention in the form ONNX Runtime's attention fuser recognises, whatever transformers wrote.

transformers 5 traces each layer's Q, K and V reshapes as (batch, tokens, -1, head size) and, by default, its SDPA
path as another subgraph; ORT's fuser reads the head count from the reshape's shape and gives up on -1, and does not
match the SDPA subgraph at all, so a v5 graph keeps neither the fused Attention nor EmbedLayerNormalization that
every speedup here rests on (a tiny BERT on 5.25: no Attention; eager attention and named heads: both fused, as
on 4.57). So the export traces the eager attention (`eager_attention`) and writes each layer's head count into its
reshapes (`name_heads`): the projection's width over the head size, read per layer from its weight, so layers with
pruned heads get their own counts. Graphs from transformers 4.x already name their heads; for them both steps
change nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from export.releases import transformers_5


@contextlib.contextmanager
def eager_attention(model) -> Iterator[None]:
    """`model` (and every config below it) on transformers' eager attention while inside; transformers 4.x as it
    is (its default graphs fuse)."""
    if not transformers_5():
        yield
        return
    configs = {id(m.config): m.config for m in model.modules() if hasattr(getattr(m, "config", None), "to_dict")}
    before = {key: config._attn_implementation for key, config in configs.items()}
    for config in configs.values():
        config._attn_implementation = "eager"
    try:
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = before[key]


def name_heads(path: str | Path) -> int:
    """Write the head count into every reshape of `path`'s graph whose shape is (batch, tokens, -1, head size), batch
    and tokens read at run time, and whose input is a projection with a known width (MatMul, then Add of its bias);
    returns how many were named. The graph computes the same values: -1 stood for exactly that count."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    initializers = {t.name: t for t in graph.initializer}

    def constant(name: str):
        node = producer.get(name)
        while node is not None and node.op_type == "Identity":
            name, node = node.input[0], producer.get(node.input[0])
        if node is not None and node.op_type == "Constant":
            return numpy_helper.to_array(node.attribute[0].t)
        return numpy_helper.to_array(initializers[name]) if name in initializers else None

    def width(name: str) -> int | None:
        node = producer.get(name)
        while node is not None and node.op_type in ("Add", "MatMul"):
            for value in map(constant, node.input):
                if value is not None and value.ndim >= 1:
                    return int(value.shape[-1])
            node = producer.get(node.input[0])
        return None

    named = 0
    for node in graph.node:
        shape = producer.get(node.input[1]) if node.op_type == "Reshape" else None
        if shape is None or shape.op_type != "Concat" or len(shape.input) != 4:
            continue
        if constant(shape.input[0]) is not None or constant(shape.input[1]) is not None:
            continue  # not (batch, tokens, ...): only there does -1 stand for the projection's width over the size
        heads, size = constant(shape.input[2]), constant(shape.input[3])
        if heads is None or size is None or heads.size != 1 or size.size != 1 or int(heads.item()) != -1:
            continue
        projected, size = width(node.input[0]), int(size.item())
        if not projected or projected % size:
            continue
        count = np.array([projected // size], dtype=np.int64)
        name = f"{node.name or node.output[0]}/heads"
        graph.initializer.append(numpy_helper.from_array(count, name))
        shape.input[2] = name
        named += 1
    if named:
        onnx.save(model, str(path))
    return named
