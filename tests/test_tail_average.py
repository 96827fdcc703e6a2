"""Tail averaging: a phase with `average_steps` ends on the mean of its weights after each of its last steps, only a
stage's last phase averages, and a resumed phase ends on the same average (tests/test_checkpoints.py)."""

import torch

from pipeline.config.schema import TrainConfig


def test_the_loop_ends_on_the_mean_of_the_last_steps_weights(classifier_dirs):
    from pipeline.data.encoding import encode
    from pipeline.data.loaders import DataRef
    from pipeline.models.folders import load_tokenizer
    from pipeline.models.io import load_model
    from pipeline.train.loop import train

    data = DataRef("sst2", "sample", None, 64, 16).load()
    enc = encode(load_tokenizer(classifier_dirs["bert"]), data.train, 32)
    plain, averaged = load_model(classifier_dirs["bert"]), load_model(classifier_dirs["bert"])
    seen = []  # the plain run's weights after 3 and after 4 of its 5 steps

    def keep(step: int) -> None:
        if step >= 3:
            seen.append({k: v.clone() for k, v in plain.state_dict().items()})

    train(plain, enc, None, TrainConfig(max_steps=5, batch_size=8, lr=1e-3), before_step=keep)
    seen.append(plain.state_dict())
    train(averaged, enc, None, TrainConfig(max_steps=5, batch_size=8, lr=1e-3, average_steps=3))
    moved = 0
    for name, value in averaged.state_dict().items():
        mean = sum(s[name] for s in seen) / 3
        assert torch.allclose(value, mean, atol=1e-6), name
        moved += not torch.allclose(value, seen[-1][name], atol=1e-6)
    assert moved  # the average is not the last step's weights


def test_only_a_stages_last_phase_averages_and_off_keeps_cache_keys():
    cfg = TrainConfig(average_steps=100, fake_quant_steps=50)
    assert cfg.phase(300, 1e-4).average_steps == 0 and cfg.phase(300, 1e-4).fake_quant_steps == 0
    assert cfg.phase(300, 1e-4, last=True).average_steps == 100
    assert cfg.before_last_phase().model_dump() == TrainConfig().model_dump()  # nothing else changes
    assert "average_steps" not in TrainConfig().model_dump()
