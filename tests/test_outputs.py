"""What a step hands out: ``SchedulerOutput`` and ``RequestOutputs`` as objects.

Every column is a read-only int32 array (a caller cannot write into the scheduler's step
or into an output another reader shares), and ``RequestOutputs`` indexes like a Python
sequence.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmsched import RequestOutputs, Scheduler, SchedulerConfig, SchedulerOutput

SCHEDULER_OUTPUT_COLUMNS = (
    "num_scheduled_tokens",
    "num_computed_tokens",
    "num_spec_tokens",
    "spec_token_ids",
    "num_output_tokens",
    "num_block_ids",
    "block_ids",
    "num_all_token_ids",
    "all_token_ids",
)
REQUEST_OUTPUTS_COLUMNS = ("new_token_ids", "num_new_tokens", "statuses", "num_cached_blocks")


class Output:
    def __init__(self, so: SchedulerOutput, tokens: list[int]) -> None:
        self.req_ids = list(so.req_ids)
        self.sampled_token_ids = np.array(tokens, np.int32)
        self.num_sampled = np.ones(len(tokens), np.int32)


def a_step_and_its_outputs() -> tuple[SchedulerOutput, RequestOutputs]:
    """Three requests decode; "b" stops on its EOS (a finished output among them)."""
    sched = Scheduler(
        SchedulerConfig(async_scheduling=False, block_size=4, enable_prefix_caching=True)
    )
    for rid in "abc":
        sched.add_request(rid, list(range(1, 10)), max_tokens=5, eos_token_id=2)
    so = sched.schedule()
    outputs = sched.update_from_output(so, Output(so, [7, 2, 9]))
    assert [o.finished for o in outputs] == [False, True, False]
    return so, outputs


@pytest.mark.parametrize(
    "column",
    [("SchedulerOutput", name) for name in SCHEDULER_OUTPUT_COLUMNS]
    + [("RequestOutputs", name) for name in REQUEST_OUTPUTS_COLUMNS],
    ids=lambda c: f"{c[0]}.{c[1]}",
)
def test_every_column_is_a_read_only_int32_array(column: tuple[str, str]) -> None:
    so, outputs = a_step_and_its_outputs()
    owner = so if column[0] == "SchedulerOutput" else outputs
    array = getattr(owner, column[1])
    assert isinstance(array, np.ndarray) and array.dtype == np.int32 and array.ndim == 1
    assert not array.flags.writeable
    before = array.tolist()
    with pytest.raises(ValueError, match="read-only"):
        array[:] = 12345
    assert getattr(owner, column[1]).tolist() == before == array.tolist()


def test_request_outputs_index_like_a_sequence() -> None:
    _, outputs = a_step_and_its_outputs()
    n = len(outputs)
    elements = list(outputs)
    assert n == 3 and [o.request_id for o in elements] == ["a", "b", "c"]
    for i in range(-n, n):
        assert outputs[i] == elements[i]
    assert outputs[-1].request_id == "c" and outputs[-n].request_id == "a"
    for bad in (n, n + 1, -n - 1, 2**62, -(2**62)):
        with pytest.raises(IndexError):
            outputs[bad]
    with pytest.raises(IndexError):
        outputs[2**100]
    assert outputs[1:] == elements[1:] and outputs[::-1] == elements[::-1]
    with pytest.raises(TypeError):
        outputs["a"]  # type: ignore[call-overload]
