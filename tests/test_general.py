"""General students: the corpus reader and its refusals, the student cut from the teacher (every family), the
DirectMiniLM loss, the stage (cached, resumable after a kill) and `pipeline distill-general` end to end, its
student taken by `pipeline deploy --model`."""

import json
from pathlib import Path

import pytest
import torch

from pipeline import checkpoints, interrupts
from pipeline.compress.methods.distill.config import GeneralConfig, StudentShape
from pipeline.compress.methods.distill.general_student import build_general_student
from pipeline.compress.methods.distill.losses import DirectProjections, direct_loss
from pipeline.config.recipes import RECIPES_DIR, read_recipe
from pipeline.config.schema import parse
from pipeline.data.corpus import read_corpus
from pipeline.data.tasks import get_task
from pipeline.errors import PipelineError
from pipeline.models.io import load_base_model
from pipeline.stages import general
from pipeline.train.loop import num_steps
from tests.helpers import FAMILY_TYPES, LOOSE_GATES, quick_args, run_cli, tiny_family_model

SENTENCES = [
    "The film was a quiet delight from start to finish.",
    "A river runs through the old town, past the market and the church.",
    "He signed for the club in August and played every match that season.",
    "The school teaches children from the age of three to eighteen.",
] * 8


def corpus_dir(root: Path, lines=SENTENCES) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "a.txt").write_text("\n".join(lines[: len(lines) // 2]) + "\n\n")
    (root / "b.txt").write_text("\n".join(lines[len(lines) // 2 :]) + "\n")
    return root


def tiny_cfg(**changes) -> GeneralConfig:
    data = {
        "student": {"layers": 1, "hidden": 16},
        "relation_heads": 4,
        "max_length": 32,
        "train": {"max_steps": 6, "batch_size": 4, "lr": 1e-3},
        **changes,
    }
    return GeneralConfig.model_validate(data)


# -- the corpus ----------------------------------------------------------------------------------------------


def test_the_corpus_is_read_in_file_order_without_blank_lines(tmp_path):
    corpus = read_corpus(corpus_dir(tmp_path / "c"))
    assert corpus.texts == SENTENCES and corpus.files == ["a.txt", "b.txt"]
    assert len(read_corpus(tmp_path / "c", 5)) == 5
    assert read_corpus(tmp_path / "c", 5).fingerprint != corpus.fingerprint


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda p: None, "no such folder"),
        (lambda p: p.write_text("a line\n"), "a file, not a folder"),
        (lambda p: (p.mkdir(), (p / "notes.md").write_text("text\n")), "no .txt files"),
        (lambda p: (p.mkdir(), (p / "a.txt").write_text("\n  \n\n")), "hold no text"),
        (
            lambda p: (p.mkdir(), (p / "a.txt").write_bytes(b"fine\nalso fine\n\xff\xfe bad\n")),
            "a.txt, line 3: not UTF-8",
        ),
    ],
)
def test_a_bad_corpus_is_one_line(tmp_path, make, needle):
    make(tmp_path / "corpus")
    with pytest.raises(PipelineError, match=needle) as e:
        read_corpus(tmp_path / "corpus")
    assert "\n" not in str(e.value)


def test_an_over_long_line_becomes_several_texts_each_within_the_cap(tmp_path):
    from pipeline.data.corpus import MAX_LINE_CHARS

    prose = " ".join(SENTENCES)
    long = (prose * (3 * MAX_LINE_CHARS // len(prose) + 2))[: 3 * MAX_LINE_CHARS + 17]
    root = tmp_path / "c"
    root.mkdir()
    unspaced = "é" * (MAX_LINE_CHARS + 5)  # two-byte characters, no space to cut at: cut at the cap
    (root / "a.txt").write_text(f"short one\n{long}\n{unspaced}\nlast\n", encoding="utf-8")
    texts = read_corpus(root).texts
    assert texts[0] == "short one" and texts[-1] == "last"
    assert all(len(t) <= MAX_LINE_CHARS for t in texts)
    assert " ".join(texts[1:-3]) == " ".join(long.split()) and texts[-3:-1] == ["é" * MAX_LINE_CHARS, "é" * 5]


CHILD = """
import resource, sys
from transformers import AutoTokenizer
from pipeline.data.corpus import read_corpus
from pipeline.data.encoding import encode_corpus
tok = AutoTokenizer.from_pretrained(sys.argv[1])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
encoded = encode_corpus(tok, read_corpus(sys.argv[2]), 32)
print(len(encoded.features), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)
"""


def test_a_corpus_of_one_huge_line_is_read_in_bounded_memory(tmp_path):
    """One 10 MB line: tokenised whole it took 1.6 GB more (and one of 50 MB aborted the process in the tokenizer's
    allocation); read in pieces and tokenised a block at a time, under 300 MB more."""
    import subprocess
    import sys

    from tests.helpers import tiny_tokenizer

    tiny_tokenizer("bert").save_pretrained(tmp_path / "tok")
    prose = " ".join(SENTENCES) + " "
    size = 10_000_000
    (tmp_path / "c").mkdir()
    with (tmp_path / "c" / "one.txt").open("w") as f:
        for _ in range(size // len(prose)):
            f.write(prose)
        f.write("\n")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "tok"), str(tmp_path / "c")],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    texts, grew_mb = map(int, out.stdout.split())
    assert texts >= size // 10_000 and grew_mb < 300, (texts, grew_mb)


# -- the student ---------------------------------------------------------------------------------------------


def _batch():
    ids = torch.randint(5, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("family", FAMILY_TYPES)
def test_a_student_of_the_teachers_shape_cut_from_it_is_the_teacher(family):
    teacher = tiny_family_model(family, layers=4).base_model.eval()
    same, made = build_general_student(teacher, {"layers": 4, "hidden": 36, "heads": 3, "ffn": 40}, "teacher", 0)
    a, b = (m.eval()(**_batch(), output_hidden_states=True).hidden_states for m in (teacher, same))
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True))
    assert made["teacher_layers"] == [0, 1, 2, 3] and made["hidden_kept"] == list(range(36))


@pytest.mark.parametrize("family", [k for k in FAMILY_TYPES if k != "mpnet"])
def test_a_narrower_student_keeps_the_most_important_units(family):
    teacher = tiny_family_model(family, layers=4).base_model.eval()
    small, made = build_general_student(teacher, {"layers": 2, "hidden": 24, "heads": 2, "ffn": 20}, "teacher", 0)
    out = small.eval()(**_batch()).last_hidden_state
    assert out.shape == (2, 9, 24) and torch.isfinite(out).all()
    assert made["teacher_layers"] == [1, 3] and len(made["hidden_kept"]) == 24
    assert made["hidden_kept"] == sorted(made["hidden_kept"])
    # every kept dimension carries a teacher weight: the embedding column of a kept dimension is the teacher's
    emb = teacher.get_input_embeddings().weight
    if emb.shape[1] == 36:  # ELECTRA's embeddings have their own size
        assert torch.equal(small.get_input_embeddings().weight, emb[:, made["hidden_kept"]])


def test_mpnets_shared_position_bias_refuses_fewer_heads_from_the_teacher_in_one_line():
    teacher = tiny_family_model("mpnet", layers=4).base_model.eval()
    with pytest.raises(PipelineError, match="relative_attention_bias") as e:
        build_general_student(teacher, {"layers": 2, "hidden": 24, "heads": 2, "ffn": 20}, "teacher", 0)
    assert "\n" not in str(e.value)
    small, made = build_general_student(teacher, {"layers": 2, "hidden": 24, "heads": 2, "ffn": 20}, "random", 0)
    assert made["init"] == "random" and small.config.hidden_size == 24


def test_the_shape_defaults_follow_the_teacher():
    teacher = {"model_type": "bert", "num_hidden_layers": 6, "num_attention_heads": 12, "hidden_size": 384,
               "intermediate_size": 1536, "vocab_size": 100}  # fmt: skip
    assert StudentShape(layers=4, hidden=256).resolved(teacher) == {
        "layers": 4,
        "hidden": 256,
        "heads": 8,
        "ffn": 1024,
    }
    assert GeneralConfig(student={"layers": 4, "hidden": 256}).preflight(teacher)["heads"] == 8
    with pytest.raises(PipelineError, match="heads are kept whole"):
        GeneralConfig(student={"layers": 4, "hidden": 256, "heads": 4}).preflight(teacher)
    with pytest.raises(PipelineError, match="exceeds the teacher's 6"):
        GeneralConfig(student={"layers": 8}).preflight(teacher)
    with pytest.raises(
        PipelineError, match=r"relation heads 48 do not divide the Q/K/V widths 384 \(teacher\) and 256"
    ):
        GeneralConfig(student={"layers": 4, "hidden": 256}, relation_heads=48).preflight(teacher)
    with pytest.raises(ValueError, match="nothing to distil"):
        GeneralConfig(relation=0.0)
    with pytest.raises(ValueError, match=r"train\.layer_kd applies to task training"):  # it would be ignored
        GeneralConfig(train={"layer_kd": 1.0})


# -- DirectMiniLM --------------------------------------------------------------------------------------------


def test_direct_minilm_by_hand():
    torch.manual_seed(0)
    t = [torch.randn(2, 5, 8) for _ in range(3)]
    mask = torch.ones(2, 5, dtype=torch.long)
    same = DirectProjections(2, 8, 8)  # identity maps: a student equal to the teacher loses nothing
    assert direct_loss(t, [x.clone() for x in t], mask, same).item() == pytest.approx(0.0, abs=1e-12)
    s = [x + 1.0 for x in t]  # every coordinate off by one: MSE 1 for each of Q, K, V
    assert direct_loss(t, s, mask, same).item() == pytest.approx(3.0)
    mask[1, 3:] = 0  # padded tokens do not count, whatever they hold
    s[0][1, 3:] += 100.0
    assert direct_loss(t, s, mask, same).item() == pytest.approx(3.0)
    narrow = DirectProjections(2, 4, 8)  # a narrower student: learned (4/2 x 8/2) maps per type and head
    s_small = [torch.randn(2, 5, 4, requires_grad=True) for _ in range(3)]
    loss = direct_loss(t, s_small, mask, narrow)
    loss.backward()
    assert narrow.weight.shape == (3, 2, 2, 4) and s_small[0].grad is not None


# -- the stage, the command ----------------------------------------------------------------------------------


def test_the_stage_distils_caches_and_its_student_takes_a_task_head(base_dirs, tmp_path):
    cfg = tiny_cfg(hidden=1.0, direct=0.5)
    out = general.run(str(base_dirs["bert"]), str(corpus_dir(tmp_path / "c")), cfg, str(tmp_path / "cache"))
    assert not out["cached"] and out["shape"] == {"layers": 1, "hidden": 16, "heads": 1, "ffn": 32}
    assert out["training"]["steps"] == 6 and out["corpus"]["paragraphs"] == len(SENTENCES)
    card = (Path(out["path"]) / "README.md").read_text()
    assert "no task's data" in card and "DirectMiniLM x0.5" in card
    again = general.run(str(base_dirs["bert"]), str(tmp_path / "c"), cfg, str(tmp_path / "cache"))
    assert again["cached"] and again["path"] == out["path"]
    model = load_base_model(out["path"], get_task("sst2"))
    assert model.config.hidden_size == 16 and model.config.num_labels == 2


def test_a_killed_general_distillation_resumes_from_its_checkpoint(base_dirs, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(checkpoints.ENV, "2")
    calls = {"n": 0, "limit": 5}

    def check():
        calls["n"] += 1
        if calls["n"] > calls["limit"]:
            raise KeyboardInterrupt  # stands in for SIGKILL: nothing after the step runs

    monkeypatch.setattr(interrupts, "check", check)
    args = (str(base_dirs["bert"]), str(corpus_dir(tmp_path / "c")), tiny_cfg(), str(tmp_path / "cache"))
    with pytest.raises(KeyboardInterrupt):
        general.run(*args)
    calls["limit"] = float("inf")
    with caplog.at_level("INFO"):
        out = general.run(*args)
    assert "general distillation: resuming from the checkpoint at step 4" in caplog.text
    assert out["training"]["steps"] == 6 and len(out["training"]["history"]) == 6


def test_a_step_budget_cut_short_by_epochs_says_so(base_dirs, tmp_path, caplog):
    """`train.epochs` caps `train.max_steps` (32 paragraphs at batch 4, one pass: 8 steps, not 12), and the stage
    warns in one line rather than report a shorter distillation as the longer one asked for."""
    cfg = tiny_cfg(train={"max_steps": 12, "epochs": 1, "batch_size": 4, "lr": 1e-3})
    with caplog.at_level("WARNING"):
        out = general.run(str(base_dirs["bert"]), str(corpus_dir(tmp_path / "c")), cfg, str(tmp_path / "cache"))
    assert out["training"]["steps"] == 8
    assert "train.max_steps 12 is capped at 8 steps by train.epochs 1 (32 paragraphs at batch 4)" in caplog.text


def test_packaged_general_recipes_run_every_step_on_the_shipped_corpus():
    """Each packaged recipe's `train.epochs` lets its whole step budget run over the shipped corpus's 152,559
    paragraphs (the long recipe's first run stopped at 4,768 of 8,000); `gpu` is `long`'s losses, longer."""
    recipes = {p.stem: parse(GeneralConfig, read_recipe(p, "general"), "recipe")
               for p in (RECIPES_DIR / "general").glob("*.yaml")}  # fmt: skip
    assert sorted(recipes) == ["default", "gpu", "long"]
    long, gpu = recipes["long"], recipes["gpu"]
    assert num_steps(long.train, 152_559) == 8000  # the shipped corpus's paragraphs: the long recipe runs them all
    assert num_steps(gpu.train, 152_559) == 12000 and gpu.relation_heads == long.relation_heads
    for name, cfg in recipes.items():
        assert num_steps(cfg.train, 152_559) == cfg.train.max_steps, name


def test_distill_general_help_names_every_packaged_recipe():
    """The `--recipe` help lists the packaged names by hand: it must not fall behind the folder."""
    import typer

    from pipeline.cli import app

    command = typer.main.get_command(app).commands["distill-general"]
    text = next(p.help for p in command.params if p.name == "recipe")
    named = text.split("packaged one's name (")[1].split(")")[0].split(", ")
    assert sorted(named) == sorted(p.stem for p in (RECIPES_DIR / "general").glob("*.yaml"))


def test_distill_general_refuses_zero_steps_in_one_line(tmp_path):
    """`--steps 0` used to publish the student cut from the teacher, untrained, as a general student."""
    from typer.testing import CliRunner

    from pipeline.cli import app
    from tests.helpers import assert_one_line_error

    args = ["distill-general", "--corpus", str(corpus_dir(tmp_path / "c")), "--output", str(tmp_path / "s"),
            "--steps", "0", "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert_one_line_error(result, "train.max_steps must be at least 1 for general distillation, not 0")
    assert not (tmp_path / "s").exists() and not (tmp_path / "cache").exists()


@pytest.mark.e2e
def test_distill_general_then_deploy_on_its_student(base_dirs, tmp_path):
    import subprocess
    import sys

    corpus = corpus_dir(tmp_path / "c")
    student = tmp_path / "student"
    cmd = [sys.executable, "-m", "pipeline.cli", "distill-general", "--model", str(base_dirs["bert"]),
           "--corpus", str(corpus), "--output", str(student), "--layers", "1", "--hidden", "16", "--steps", "4",
           "--set", "relation_heads=4", "--set", "train.batch_size=4",
           "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert Path(done.stdout.strip().splitlines()[-1]) == student.resolve()
    assert json.loads((student / "stage.json").read_text())["shape"]["hidden"] == 16
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # the folder exists: one line, exit 2
    assert again.returncode == 2 and "already exists" in again.stderr.strip().splitlines()[-1]

    args, env = quick_args("distill", student, tmp_path, "--set", "config.student.layers=1",
                           "--set", "config.relation_heads=4", "--set", "config.transfer_steps=2",
                           *LOOSE_GATES)  # fmt: skip
    deployed = run_cli(args, env)
    assert deployed.returncode == 0, deployed.stderr[-3000:]
