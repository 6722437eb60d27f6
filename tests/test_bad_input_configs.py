"""The public API's configs refuse bad values at construction with one line (issue 29, item 1).

Before, strings where numbers belong raised a bare ``TypeError``; NaN, fractional counts, ``True`` as a
count, absurd sizes, negative costs, an unknown planner or watch, ``s3://`` without a bucket, a string
seed or flag and a list as a factory were accepted, and some trained with no error at all
(``planner='magic'``, ``watch='ibm'``, ``devices=True``). Each kind here is one case; all are
:class:`UserError` (one line, no traceback) before any actor starts. No Ray, no torch work.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import UserError
from orchestrator.elastic.job_config import AdaptConfig, InjectedNotice, RunConfig, ScalingConfig, SpotConfig, TrainConfig


def _model() -> list[torch.nn.Module]:
    return [torch.nn.Linear(2, 2)]


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(4, 2), torch.zeros(4, 2)


TRAIN = dict(model_factory=_model, loss_fn=torch.nn.functional.mse_loss,
             optimizer_factory=partial(torch.optim.SGD, lr=0.1), data_fn=_data)

CASES: list[tuple[str, Callable[[], Any], str]] = [
    # TrainConfig
    ("microbatches as a string", lambda: TrainConfig(**TRAIN, num_microbatches="8"), "num_microbatches must be an integer"),
    ("microbatches fractional", lambda: TrainConfig(**TRAIN, num_microbatches=2.5), "num_microbatches must be an integer"),
    ("microbatches True", lambda: TrainConfig(**TRAIN, num_microbatches=True), "num_microbatches must be an integer"),
    ("microbatches NaN", lambda: TrainConfig(**TRAIN, num_microbatches=math.nan), "num_microbatches must be an integer"),
    ("microbatches absurd", lambda: TrainConfig(**TRAIN, num_microbatches=10**9), "above the limit 4096"),
    ("microbatches zero", lambda: TrainConfig(**TRAIN, num_microbatches=0), "must be >= 1"),
    ("seed as a string", lambda: TrainConfig(**TRAIN, seed="7"), "seed must be an integer"),
    ("seed negative", lambda: TrainConfig(**TRAIN, seed=-1), "seed must be >= 0"),
    ("a list as a factory", lambda: TrainConfig(**dict(TRAIN, model_factory=[torch.nn.Linear(2, 2)])),
     "model_factory must be a function"),
    ("a string as data_fn", lambda: TrainConfig(**dict(TRAIN, data_fn="data.py")), "data_fn must be a function"),
    # ScalingConfig
    ("devices True", lambda: ScalingConfig(devices=True), "devices must be an integer"),
    ("devices a string", lambda: ScalingConfig(devices="4"), "devices must be an integer"),
    ("devices fractional", lambda: ScalingConfig(devices=2.5), "devices must be an integer"),
    ("devices absurd", lambda: ScalingConfig(devices=10**6), "the limit is 1024 devices"),
    ("unknown planner", lambda: ScalingConfig(planner="magic"), "unknown algorithm 'magic'"),
    ("misspelt planner", lambda: ScalingConfig(planner="pipedraem"), "did you mean 'pipedream'"),
    ("planner not a string", lambda: ScalingConfig(planner=3), "planner must be a string"),
    ("use_gpu a string", lambda: ScalingConfig(use_gpu="no"), "use_gpu must be True or False"),
    ("node_poll_s NaN", lambda: ScalingConfig(node_poll_s=math.nan), "node_poll_s must be finite"),
    ("plan a dict", lambda: ScalingConfig(plan={"stages": []}), "plan must be a Plan or None"),
    ("max_devices a string", lambda: ScalingConfig(max_devices="8"), "max_devices must be an integer"),
    # RunConfig
    ("s3 without bucket", lambda: RunConfig(storage="s3://"), "names no bucket"),
    ("gs without bucket", lambda: RunConfig(storage="gs:///run"), "names no bucket"),
    ("storage empty", lambda: RunConfig(storage=""), "storage must be a non-empty path"),
    ("storage a number", lambda: RunConfig(storage=3), "storage must be a non-empty path"),
    ("checkpoint_every a string", lambda: RunConfig(checkpoint_every="10"), r"checkpoint_every \(a number of steps or 'auto'\) must be an integer"),
    ("checkpoint_every fractional", lambda: RunConfig(checkpoint_every=2.5), r"checkpoint_every \(a number of steps or 'auto'\) must be an integer"),
    ("max_failures negative", lambda: RunConfig(max_failures=-1), "max_failures must be >= 0"),
    ("async flag a string", lambda: RunConfig(async_checkpoints="false"), "async_checkpoints must be True or False"),
    ("pipelined a number", lambda: RunConfig(pipelined=1), "pipelined must be True or False"),
    ("unknown scheme", lambda: RunConfig(storage="ftp://host/x"), "unknown storage scheme 'ftp'"),
    # AdaptConfig
    ("adapt enabled a string", lambda: AdaptConfig(enabled="yes"), "enabled must be True or False"),
    ("controller a dict", lambda: AdaptConfig(controller={}), "controller must be a ControllerConfig"),
    # InjectedNotice
    ("notice at NaN", lambda: InjectedNotice(math.nan), "at_step must be an integer"),
    ("notice step a string", lambda: InjectedNotice("5"), "at_step must be an integer"),
    ("notice seconds inf", lambda: InjectedNotice(5, math.inf), "seconds must be finite"),
    ("notice seconds negative", lambda: InjectedNotice(5, -1.0), "seconds must be > 0"),
    ("notice devices a list", lambda: InjectedNotice(5, 30.0, [1]), "devices must be a tuple"),
    ("notice device True", lambda: InjectedNotice(5, 30.0, (True,)), "device must be an integer"),
    # SpotConfig
    ("unknown watch", lambda: SpotConfig(watch="ibm"), "unknown watch 'ibm'"),
    ("misspelt watch", lambda: SpotConfig(watch="azrue"), "did you mean 'azure'"),
    ("negative checkpoint cost", lambda: SpotConfig(checkpoint_gb=-1.0), "checkpoint_gb must be >= 0"),
    ("horizon NaN", lambda: SpotConfig(horizon_scale=math.nan), "horizon_scale must be finite"),
    ("margin a string", lambda: SpotConfig(margin_s="5"), "margin_s must be a number"),
    ("price factor zero", lambda: SpotConfig(price_events=((3, 0.0),)), "price event factor must be > 0"),
    ("price event malformed", lambda: SpotConfig(price_events=(3,)), "each price event must be"),
    ("price events a list", lambda: SpotConfig(price_events=[(3, 2.0)]), "price_events must be a tuple"),
    ("notices not notices", lambda: SpotConfig(notices=(5,)), "notices must be a tuple of InjectedNotice"),
    ("evacuate_live a string", lambda: SpotConfig(evacuate_live="true"), "evacuate_live must be True or False"),
    ("max_price_age_s negative", lambda: SpotConfig(max_price_age_s=-1.0), "max_price_age_s"),
    ("resume unknown", lambda: RunConfig(resume="sometimes"), "resume="),
    ("snapshot_every a string", lambda: RunConfig(snapshot_every="1"), "snapshot_every"),
    ("catalog a number", lambda: SpotConfig(catalog=3), "catalog must be a non-empty path"),
]


@pytest.mark.parametrize("what,build,reason", CASES, ids=[c[0] for c in CASES])
def test_each_bad_value_is_one_line_at_construction(what: str, build: Callable[[], Any], reason: str) -> None:
    with pytest.raises(UserError, match=reason) as caught:
        build()
    assert "\n" not in str(caught.value)
    assert type(caught.value).__name__ in ("UserError",)


def test_good_values_still_construct() -> None:
    TrainConfig(**TRAIN, num_microbatches=8, seed=3)
    ScalingConfig(devices=4, planner="even", use_gpu=False, max_devices=6)
    RunConfig(storage="s3://bucket/run", checkpoint_every=0, max_failures=0)
    SpotConfig(watch="aws", price_events=((14, 3.0),), notices=(InjectedNotice(9, 120.0), InjectedNotice(20, 30.0, ())))
    AdaptConfig(enabled=False)


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from([("TrainConfig", "num_microbatches"), ("TrainConfig", "seed"), ("ScalingConfig", "devices"),
                              ("ScalingConfig", "node_poll_s"), ("RunConfig", "checkpoint_every"), ("RunConfig", "storage"),
                              ("RunConfig", "max_failures"), ("SpotConfig", "margin_s"), ("SpotConfig", "checkpoint_gb"),
                              ("SpotConfig", "watch"), ("SpotConfig", "price_events"), ("InjectedNotice", "at_step"),
                              ("InjectedNotice", "seconds")]),
       value=SCALARS)
def test_any_value_either_constructs_or_is_one_user_error(field: tuple[str, str], value: Any) -> None:
    """Whatever a user passes, the answer is a config or one UserError line: never a TypeError, never a traceback."""
    kind, name = field
    builders: dict[str, Callable[..., Any]] = {
        "TrainConfig": lambda **kw: TrainConfig(**TRAIN, **kw), "ScalingConfig": ScalingConfig, "RunConfig": RunConfig,
        "SpotConfig": SpotConfig, "InjectedNotice": lambda **kw: InjectedNotice(**{"at_step": 1, **kw})}
    try:
        built = builders[kind](**{name: value})
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    got = getattr(built, name)
    if isinstance(got, float):
        assert math.isfinite(got) and got >= 0
    if isinstance(got, int) and name != "seed":
        assert not isinstance(got, bool) and got >= 0
