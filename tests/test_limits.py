"""Every figure with a physical range, every path and every file is checked before any work: one line, exit 2,
nothing trained or written."""

import json
from pathlib import Path

import pytest

from pipeline.errors import PipelineError
from pipeline.sweep import MAX_RUNS, load_sweep
from tests.helpers import assert_one_line_error, cli_deploy, write_tiny_model_dir

NOT_UTF8 = b"good line\n" + "café".encode("latin-1") + b"\n"


def deploy(*args):
    return cli_deploy("--method", "mlp_fusion", "--task", "sst2", "--output", "out", *args)


def nothing_written():
    assert not Path("out").exists() and not Path("cache").exists()


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("bench.batch_sizes=[0]", "bench.batch_sizes"),
        ("bench.batch_sizes=[-8]", "bench.batch_sizes"),
        ("bench.batch_sizes=[]", "bench.batch_sizes"),
        ("bench.seq_lens=[0]", "bench.seq_lens"),
        ("bench.seq_lens=[-1]", "bench.seq_lens"),
        ("bench.seq_lens=[]", "bench.seq_lens"),
        ("bench.seq_lens=[100000]", "bench.seq_lens[0]=100000 exceeds the model's 512 positions"),
        ("teacher.max_length=4096", "teacher.max_length=4096 exceeds the model's 512 positions"),
        ("config.train.max_length=1000", "config.train.max_length=1000 exceeds the model's 512 positions"),
        ("target.heads_grid=[0.0]", "target.heads_grid"),
        ("target.layers=[0]", "target.layers"),
    ],
)
def test_out_of_range_figures_fail_before_any_work(setting, needle):
    assert_one_line_error(deploy("--set", setting, "--set", "bench.max_runs=10"), needle)
    nothing_written()


def test_an_output_folder_that_cannot_be_written():
    assert_one_line_error(deploy("--output", "/sys/out"), "output folder /sys/out is not writable")
    Path("afile").write_text("")
    assert_one_line_error(deploy("--output", "afile/out"), "afile is a file, not a folder")


def test_a_cache_folder_that_is_a_file():
    Path("cachefile").write_text("")
    assert_one_line_error(deploy("--cache-dir", "cachefile"), "cache folder cachefile is a file, not a folder")
    assert not Path("out").exists()


def test_a_data_file_that_is_not_utf8():
    Path("data").mkdir()
    Path("data/train.tsv").write_bytes(b"sentence\tlabel\na fine film\t1\n" + "naïve\t0\n".encode("cp1252"))
    Path("data/dev.tsv").write_text("sentence\tlabel\ngood\t1\n")
    assert_one_line_error(deploy("--data-dir", "data"), "data/train.tsv:3: not UTF-8 text (byte 0xef at offset 31)")
    nothing_written()


def test_a_task_file_that_is_not_utf8():
    Path("task.yaml").write_bytes(b"name: t\n# " + "é".encode("latin-1") + b"\n")
    result = cli_deploy("--method", "mlp_fusion", "--task-file", "task.yaml", "--output", "out")
    assert_one_line_error(result, "task.yaml:2: not UTF-8 text")


def test_a_recipe_that_is_not_utf8():
    Path("recipe.yaml").write_bytes(b"method: mlp_fusion\n" + NOT_UTF8)
    assert_one_line_error(deploy("--recipe", "recipe.yaml"), "recipe.yaml:3: not UTF-8 text")


@pytest.mark.parametrize("option", ["--teacher", "--model"])
def test_a_pickle_only_model_folder_is_refused_unread(option, tmp_path):
    from tests.helpers import save_pickled, tiny_model, tiny_tokenizer

    folder = save_pickled(tiny_model("bert"), tmp_path / "pickled")
    tiny_tokenizer("bert").save_pretrained(folder)
    assert (folder / "pytorch_model.bin").is_file() and not (folder / "model.safetensors").exists()
    assert_one_line_error(deploy(option, str(folder)), "only pickle weights (pytorch_model.bin)")
    nothing_written()


def test_a_sweep_grid_too_large_to_run_is_refused_unexpanded(tmp_path):
    model = write_tiny_model_dir(tmp_path / "tiny", "bert", classifier=False)
    grid = {f"config.k{i}": list(range(10)) for i in range(7)}  # 10^7 runs
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(json.dumps({"task": "sst2", "model": str(model), "grid": {"method": ["smp"], "set": grid}}))
    with pytest.raises(PipelineError, match=f"expands to 10,000,000 runs; at most {MAX_RUNS:,}"):
        load_sweep(sweep, str(tmp_path / "out"))
