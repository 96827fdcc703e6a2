"""The general-student stage: task-agnostic distillation of a pre-trained encoder into a smaller one on unlabelled
text, once, for every task (`pipeline distill-general`).

The teacher is the pre-trained base model (never a task's fine-tuned one) and the data is the corpus only, so no
downstream task's data is seen; a student's quality is measured by fine-tuning it on a task (`pipeline deploy
--model STUDENT`). The student is cached like a teacher (keyed by the base model's files, the corpus lines used and
the config) and its training checkpoints every N steps, so a killed run resumes (`pipeline.checkpoints`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import yaml

from pipeline.cache import cached_stage, dir_digest
from pipeline.compress.methods.distill import derived as rules
from pipeline.compress.methods.distill.config import GeneralConfig
from pipeline.compress.methods.distill.general_student import build_general_student
from pipeline.compress.methods.distill.losses import DirectProjections, layer_mapping
from pipeline.compress.methods.distill.stage import distill_loss
from pipeline.data.corpus import read_corpus
from pipeline.data.encoding import encode_corpus
from pipeline.devices import resolve_device
from pipeline.models.families import arch_of
from pipeline.models.folders import check_model_dir, load_tokenizer
from pipeline.models.io import save_weights
from pipeline.models.layers import encoder_layers
from pipeline.report import derived_line
from pipeline.train.loop import num_steps, train
from pipeline.train.losses import HiddenProjections

log = logging.getLogger(__name__)

# Bump when a change alters what the stage produces, to invalidate its cache entries.
GENERAL_VERSION = "1"
CARD = "README.md"


def run(model_dir: str, corpus_dir: str, cfg: GeneralConfig, cache_dir: str) -> dict:
    """The general student of `model_dir` at `cfg`'s shape, distilled on the corpus (cached); returns its report."""
    config = check_model_dir(model_dir)
    shape = cfg.preflight(config)
    arch = arch_of(config)
    corpus = read_corpus(corpus_dir, cfg.corpus_lines)
    steps = num_steps(cfg.train, len(corpus))
    if steps < cfg.train.max_steps:  # a budget cut short in silence reads as a longer distillation than it was
        log.warning(
            "general distillation: train.max_steps %d is capped at %d steps by train.epochs %g (%d paragraphs at "
            "batch %d); raise train.epochs to run them all",
            cfg.train.max_steps, steps, cfg.train.epochs, len(corpus), cfg.train.batch_size,
        )  # fmt: skip
    derived = cfg.derived(config)  # the relation heads and teacher layer, from the shapes unless set
    cfg_used = cfg.model_copy(update={name: r.value for name, r in derived.items()})

    def build(out: Path) -> dict:
        from transformers import AutoModel

        tokenizer = load_tokenizer(model_dir)
        teacher = AutoModel.from_pretrained(model_dir).eval().requires_grad_(False)
        student, made = build_general_student(teacher, shape, cfg.init, cfg.train.seed)
        encoded = encode_corpus(tokenizer, corpus, cfg.max_length)
        device = resolve_device(cfg.train.device)
        projections = direct = None
        params = list(student.named_parameters())
        if cfg.hidden:
            mapping = layer_mapping(cfg.hidden_mapping, len(encoder_layers(teacher)), shape["layers"])
            projections = HiddenProjections(mapping, shape["hidden"], teacher.config.hidden_size).to(device)
            params += projections.named_parameters(prefix="proj")
        if cfg.direct:
            direct = DirectProjections(cfg_used.relation_heads, shape["hidden"], arch.heads * arch.head_dim).to(device)
            params += direct.named_parameters(prefix="direct")
        began = time.perf_counter()
        result = train(
            student,
            encoded,
            None,
            cfg.train,
            teacher=teacher,
            params=params,
            loss_fn=distill_loss(cfg_used, teacher, projections, task=False, direct=direct),
            desc="general distillation",
        )
        save_weights(student, out)
        tokenizer.save_pretrained(str(out))
        report = {
            "base_model": str(model_dir),
            "corpus": {"path": str(corpus_dir), "files": corpus.files, "paragraphs": len(corpus)},
            "shape": shape,
            "derived": rules.as_report(derived),
            "made": made,
            "config": cfg.model_dump(mode="json"),
            "training": result.report(),
            "seconds": round(time.perf_counter() - began, 1),
        }
        (out / CARD).write_text(model_card(report))
        return report

    key = dict(stage="general", v=GENERAL_VERSION, model=dir_digest(Path(model_dir)), corpus=corpus.fingerprint,
               cfg=cfg.model_dump())  # fmt: skip
    path, hit, report = cached_stage(cache_dir, "general", key, build, trains=True)
    log.info("general student: %s (%s)", path, "cached" if hit else "distilled now")
    return {"path": str(path), "cached": hit, **report}


def model_card(report: dict) -> str:
    """How the student was made and from what: what a user reusing it for a task needs to know."""
    cfg, shape, training, made = report["config"], report["shape"], report["training"], report["made"]
    losses = [
        name
        for name, on in (
            (f"MiniLMv2 relations {'/'.join(cfg['relation_pairs'])} x{cfg['relation']}", cfg["relation"]),
            (f"hidden states ({cfg['hidden_mapping']} mapping) x{cfg['hidden']}", cfg["hidden"]),
            (f"DirectMiniLM x{cfg['direct']}", cfg["direct"]),
        )
        if on
    ]
    meta = {"library_name": "transformers", "tags": ["general-distillation", "task-agnostic"]}
    return "\n".join(
        [
            "---",
            yaml.safe_dump(meta, sort_keys=False).strip(),
            "---",
            "# A general (task-agnostic) student",
            "",
            f"Distilled from `{report['base_model']}` on unlabelled text only ({report['corpus']['paragraphs']:,} "
            f"paragraphs of `{report['corpus']['path']}`, at most {cfg['max_length']} tokens each); no task's data.",
            "",
            f"- shape: {shape['layers']} layers x hidden {shape['hidden']}, {shape['heads']} heads, "
            f"FFN {shape['ffn']}",
            f"- initialised: {made['init']}"
            + (f" (teacher layers {made['teacher_layers']})" if made["init"] == "teacher" else ""),
            f"- losses: {'; '.join(losses)}; {derived_line(report['derived'])}",
            f"- training: {training['steps']} steps at batch {cfg['train']['batch_size']}, lr {cfg['train']['lr']}, "
            f"{training['seconds']} s; final loss {training['final_loss']}",
            "",
            "Fine-tune it for a task with `pipeline deploy --model THIS_FOLDER --method ... --task ...`.",
            "",
        ]
    )
