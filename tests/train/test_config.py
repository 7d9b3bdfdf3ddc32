import pytest

from rewardplane.core.errors import ConfigError
from rewardplane.train.config import TrainConfig, dump_yaml, from_dict, load_config
from rewardplane.train.sampler import PairSampler


def test_yaml_and_overrides_resolve(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("model: {tiny: tiny-llama}\noptim: {lr: 1.0e-3}\nrun: {max_steps: 5}\n")
    cfg = load_config(
        path, ["optim.lr=1e-4", "run.layout=right", "data.synth.train_rows=10", "loss.use_margin=false"]
    )
    assert cfg.optim.lr == 1e-4 and cfg.run.layout == "right" and cfg.run.max_steps == 5
    assert cfg.data.synth.train_rows == 10 and cfg.data.synth.eval_rows == 200
    assert cfg.loss.use_margin is False
    again = tmp_path / "resolved.yaml"
    again.write_text(dump_yaml(cfg))
    assert load_config(again) == cfg


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lrr=1", "unknown config key"),
        ("run.layout=diagonal", "is not one of"),
        ("run.max_steps=many", "expected int"),
        ("run.max_steps=true", "expected int"),
        ("optim.lr=fast", "expected float"),
        ("nonsense", "not key=value"),
    ],
)
def test_bad_overrides_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_unknown_top_level_section():
    with pytest.raises(ConfigError, match="unknown config key.*trainer"):
        from_dict(TrainConfig, {"trainer": {}})


def _sampler(world=1, accum=1, seed=0, n=40):
    tokens = [(i * 7) % 23 + 3 for i in range(n)]
    return PairSampler(tokens, global_batch_pairs=16, world_size=world, grad_accum=accum, seed=seed)


def test_sampler_is_deterministic_and_covers_each_pair_once_per_epoch():
    a, b = _sampler(), _sampler()
    steps = [a.next_step() for _ in range(a.steps_per_epoch)]
    assert steps == [b.next_step() for _ in range(b.steps_per_epoch)]
    seen = [i for plan in steps for rank in plan for mb in rank for i in mb]
    assert len(seen) == len(set(seen)) == 2 * 16  # 40 // 16 = 2 full steps; the remainder is dropped
    assert a.state.epoch == 1 and a.state.step_in_epoch == 0
    assert a.step_indices(1, 0) != a.step_indices(0, 0)
    assert _sampler(seed=1).step_indices(0, 0) != a.step_indices(0, 0)


def test_sampler_split_is_token_balanced_and_independent_of_layout():
    one = _sampler()
    four = _sampler(world=2, accum=2)
    assert one.step_indices(0, 0) == four.step_indices(0, 0)  # same pairs whatever the split
    plan = four.split(four.step_indices(0, 0))
    buckets = [mb for rank in plan for mb in rank]
    assert len(plan) == 2 and all(len(rank) == 2 for rank in plan) and all(buckets)
    loads = [sum(four.num_tokens[i] for i in mb) for mb in buckets]
    assert max(loads) - min(loads) <= max(four.num_tokens)
    assert sorted(i for mb in buckets for i in mb) == sorted(four.step_indices(0, 0))


def test_sampler_state_round_trips():
    a = _sampler()
    a.next_step()
    b = _sampler()
    b.load_state_dict(a.state_dict())
    assert a.next_step() == b.next_step()
