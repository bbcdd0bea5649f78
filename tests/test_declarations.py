"""Concepts declared once, in the core: what Python writes out again is held equal to it."""

from __future__ import annotations

import inspect

import llmsched
from llmsched import ModelRunnerOutput, RequestOutput, RequestStatus, Scheduler, SchedulerConfig
from llmsched._core import REQUEST_STATUSES


def test_the_status_enum_is_the_cores() -> None:
    assert [(m.name, m.value) for m in RequestStatus] == [(n, v) for n, v, _ in REQUEST_STATUSES]
    for name, value, reason in REQUEST_STATUSES:
        assert RequestStatus[name].finish_reason == reason
        assert RequestStatus(value).is_finished == (value > RequestStatus.PREEMPTED)


def test_outputs_carry_the_cores_statuses_and_reasons() -> None:
    config = SchedulerConfig(
        max_model_len=64, block_size=4, num_gpu_blocks=64, async_scheduling=False
    )
    sched = Scheduler(config)
    sched.add_request("eos", [1, 2], max_tokens=8, eos_token_id=5)
    sched.add_request("len", [3], max_tokens=2)
    outputs: list[RequestOutput] = []
    while sched.has_unfinished_requests():
        so = sched.schedule()
        rows = [[5] if rid == "eos" else [9] for rid in so.req_ids]
        outputs.extend(sched.update_from_output(so, ModelRunnerOutput.from_lists(so.req_ids, rows)))
    last = {o.request_id: o for o in outputs}
    assert last["eos"].status is RequestStatus.FINISHED_STOPPED
    assert last["eos"].finish_reason == "stop" == RequestStatus.FINISHED_STOPPED.finish_reason
    assert last["len"].status is RequestStatus.FINISHED_LENGTH_CAPPED
    assert last["len"].finish_reason == "length"
    assert all(o.finish_reason is None for o in outputs if not o.finished)


def test_config_fields_are_one_declaration() -> None:
    """The keyword arguments, properties, ``to_dict`` and the signature's defaults are
    the core's one list of fields, in one order."""
    fields = list(SchedulerConfig().to_dict())
    signature = inspect.signature(SchedulerConfig)
    assert list(signature.parameters) == fields
    config = SchedulerConfig()
    for name, parameter in signature.parameters.items():
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        prop = getattr(SchedulerConfig, name)
        assert isinstance(prop.__doc__, str) and prop.__doc__.strip(), name
        resolved = getattr(config, name)
        assert parameter.default is None or parameter.default == resolved, name
    assert SchedulerConfig(**{name: getattr(config, name) for name in fields}) == config


def test_public_names() -> None:
    for name in llmsched.__all__:
        assert hasattr(llmsched, name), name
