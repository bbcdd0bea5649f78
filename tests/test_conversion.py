"""Token and array conversion at the boundary: every numpy layout gives exactly the values
numpy itself reads (``.tolist()``), or a clean error naming the field.

Each place the binding reads a numpy array is driven with arrays in odd layouts: a field
of a packed record (a byte stride that is no multiple of the item size, misaligned), an
offset read-only buffer (misaligned), strided and reversed views, the other byte order,
every integer width. The prompt, the stop token ids, the drafts (flat and by row) and a
runner's ``sampled_token_ids`` / ``num_sampled`` are each compared with ``tolist()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsched import (
    InvalidRequestError,
    LlmschedError,
    OutputMismatchError,
    Scheduler,
    SchedulerConfig,
)

INT32_MAX = 2**31 - 1
INTEGER_DTYPES = [
    f"{order}{code}" for order in "<>" for code in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8")
]


class Duck:
    """A runner output as any runner may send it (no ``ModelRunnerOutput`` conversion)."""

    def __init__(self, req_ids: Any, sampled_token_ids: Any, num_sampled: Any) -> None:
        self.req_ids = req_ids
        self.sampled_token_ids = sampled_token_ids
        self.num_sampled = num_sampled


def packed_field(values: list[int], dtype: str, pad: int) -> np.ndarray:
    """``values`` as the field of a packed record after ``pad`` bytes: byte stride
    ``pad + itemsize``, misaligned for ``pad`` not a multiple of the alignment."""
    record = np.zeros(len(values), dtype=np.dtype([("pad", f"V{pad}"), ("v", dtype)]))
    record["v"] = values
    return record["v"]


def offset_buffer(values: list[int], dtype: str, offset: int) -> np.ndarray:
    """``values`` read-only in a bytes buffer, ``offset`` bytes in (misaligned)."""
    data = bytes(offset) + np.array(values, dtype=dtype).tobytes()
    return np.frombuffer(data, dtype=dtype, count=len(values), offset=offset)


def strided(values: list[int], dtype: str, step: int) -> np.ndarray:
    base = np.zeros(len(values) * step, dtype=dtype)
    base[::step] = values
    return base[::step]


def reversed_view(values: list[int], dtype: str, step: int) -> np.ndarray:
    return strided(values[::-1], dtype, step)[::-1]


def packed_reversed(values: list[int], dtype: str, pad: int) -> np.ndarray:
    return packed_field(values[::-1], dtype, pad)[::-1]


LAYOUTS: dict[str, Callable[[list[int], str, int], np.ndarray]] = {
    "contiguous": lambda values, dtype, _: np.array(values, dtype=dtype),
    "packed-field": packed_field,
    "offset-buffer": offset_buffer,
    "strided": strided,
    "reversed": reversed_view,
    "packed-reversed": packed_reversed,
}


@st.composite
def arrays(draw: st.DrawFn, dtypes: list[str], low: int = 0) -> np.ndarray:
    """A 1-D array of one of ``dtypes`` in one of ``LAYOUTS``, holding values in
    ``[low, INT32_MAX]`` that fit its dtype."""
    dtype = draw(st.sampled_from(dtypes))
    info = np.iinfo(np.dtype(dtype))
    values = draw(
        st.lists(
            st.integers(max(low, int(info.min)), min(INT32_MAX, int(info.max))),
            min_size=1,
            max_size=24,
        )
    )
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    array = LAYOUTS[layout](values, dtype, draw(st.integers(1, 7)))
    assert array.tolist() == values, "the layout must hold the values it was given"
    return array


def sync_scheduler(**overrides: Any) -> Scheduler:
    fields: dict[str, Any] = {
        "max_model_len": 256,
        "block_size": 4,
        "num_gpu_blocks": 512,
        "max_num_batched_tokens": 512,
        "async_scheduling": False,
        "enable_prefix_caching": False,
        **overrides,
    }
    return Scheduler(SchedulerConfig(**fields))


def test_the_layouts_are_the_odd_ones_they_claim() -> None:
    """The generators really make misaligned, odd-stride, read-only and reversed arrays."""
    values = [100, 101, 102, 103]
    field = packed_field(values, "<i4", 2)
    assert field.strides == (6,) and not field.flags.aligned
    buffer = offset_buffer(values, "<i4", 1)
    assert not buffer.flags.aligned and not buffer.flags.writeable
    assert reversed_view(values, "<i4", 1).strides == (-4,)
    assert np.dtype(">i4").byteorder == ">"


@given(prompt=arrays(INTEGER_DTYPES), stop=arrays(INTEGER_DTYPES))
def test_prompt_and_stop_token_ids_in_any_layout_are_numpys_values(
    prompt: np.ndarray, stop: np.ndarray
) -> None:
    sched = sync_scheduler()
    sched.add_request("r", prompt, max_tokens=50, stop_token_ids=stop)
    assert sched.get_request("r").prompt_token_ids == prompt.tolist()
    so = sched.schedule()
    assert so.all_token_ids.tolist() == prompt.tolist()
    # The last stop token stops the request, and is its stop reason: the stop list too
    # holds numpy's values.
    last = int(stop.tolist()[-1])
    out = sched.update_from_output(
        so, Duck(list(so.req_ids), np.array([last], np.int32), np.array([1], np.int32))
    )
    assert out[0].finished and out[0].stop_reason == last


@given(tokens=arrays(["<i4", ">i4"]), data=st.data())
def test_runner_columns_in_any_int32_layout_are_numpys_values(
    tokens: np.ndarray, data: st.DataObject
) -> None:
    """``sampled_token_ids`` and ``num_sampled``: every int32 layout and byte order."""
    n = len(tokens)
    sched = sync_scheduler()
    for i in range(n):
        sched.add_request(f"r{i}", [1, 2, 3], max_tokens=5)
    so = sched.schedule()
    layout = data.draw(st.sampled_from(sorted(LAYOUTS)))
    counts = LAYOUTS[layout]([1] * n, data.draw(st.sampled_from(["<i4", ">i4"])), 3)
    out = sched.update_from_output(so, Duck(list(so.req_ids), tokens, counts))
    assert out.new_token_ids.tolist() == tokens.tolist()
    assert [o.new_token_ids for o in out] == [[t] for t in tokens.tolist()]
    assert [sched.get_request(f"r{i}").output_token_ids for i in range(n)] == [
        [t] for t in tokens.tolist()
    ]


DRAFT_DTYPES = ["<i4", ">i4", "<i8", ">i8", "<i2", ">u2"]


@given(drafts=arrays(DRAFT_DTYPES, low=-1), data=st.data())
def test_drafts_in_any_layout_are_numpys_values(drafts: np.ndarray, data: st.DataObject) -> None:
    """Flat drafts with counts, and drafts by row: the next step schedules exactly them."""
    k = 3
    n = (len(drafts) + k - 1) // k
    values = drafts.tolist()
    rows = [values[i * k : (i + 1) * k] for i in range(n)]
    sched = sync_scheduler(num_speculative_tokens=k)
    ids = [f"r{i}" for i in range(n)]
    for rid in ids:
        sched.add_request(rid, [1, 2, 3], max_tokens=50)
    so = sched.schedule()
    sched.update_from_output(
        so, Duck(list(so.req_ids), np.full(n, 9, np.int32), np.ones(n, np.int32))
    )
    if data.draw(st.booleans(), label="flat"):
        layout = data.draw(st.sampled_from(sorted(LAYOUTS)))
        counts = LAYOUTS[layout]([len(row) for row in rows], ">i8", 5)
        sched.update_draft_token_ids(ids, drafts, counts)
    else:
        # One row per request, each row a slice (a view) of the odd-layout array.
        sched.update_draft_token_ids(ids, [drafts[i * k : (i + 1) * k] for i in range(n)])
    so = sched.schedule()
    assert so.spec_token_ids.tolist() == values
    assert so.num_spec_tokens.tolist() == [len(row) for row in rows]


def test_uint64_tokens_past_int64_name_their_index() -> None:
    sched = sync_scheduler()
    prompt = packed_field([5, 2**63 + 7, 6], "<u8", 3)
    with pytest.raises(InvalidRequestError, match=r"prompt_token_ids\[1\]=9223372036854775815"):
        sched.add_request("r", prompt, max_tokens=1)
    with pytest.raises(InvalidRequestError, match=r"prompt_token_ids\[1\]=-1"):
        sched.add_request("r", reversed_view([1, -1, 2], ">i8", 2)[::-1], max_tokens=1)
    assert not sched.has_requests()


@pytest.mark.parametrize(
    "array",
    [np.array(5, np.int32), np.zeros((2, 3), np.int32), np.zeros((1, 3), ">i4")[:, ::-1]],
    ids=["0-d", "2-d", "2-d-reversed-big-endian"],
)
def test_arrays_that_are_not_1d_are_refused_naming_the_field(array: np.ndarray) -> None:
    sched = sync_scheduler(num_speculative_tokens=2)
    with pytest.raises(InvalidRequestError, match="prompt_token_ids"):
        sched.add_request("x", array, max_tokens=1)
    with pytest.raises(InvalidRequestError, match="stop_token_ids"):
        sched.add_request("x", [1], max_tokens=1, stop_token_ids=array)
    sched.add_request("r", [1, 2, 3], max_tokens=5)
    with pytest.raises(InvalidRequestError, match="draft_token_ids"):
        sched.update_draft_token_ids(["r"], array, [1])
    with pytest.raises(InvalidRequestError, match="num_draft_tokens"):
        sched.update_draft_token_ids(["r"], [1], array)
    so = sched.schedule()
    good = (np.array([7], np.int32), np.array([1], np.int32))
    for bad_output, field in [
        (Duck(list(so.req_ids), array, good[1]), "sampled_token_ids"),
        (Duck(list(so.req_ids), good[0], array), "num_sampled"),
    ]:
        with pytest.raises(OutputMismatchError, match=field):
            sched.update_from_output(so, bad_output)
    assert sched.update_from_output(so, Duck(list(so.req_ids), *good))[0].new_token_ids == [7]
    sched.check_invariants()


@pytest.mark.parametrize("dtype", ["<i8", "<u4", "<i2", ">i8", "<f4", "?"])
def test_runner_columns_of_another_dtype_are_refused_in_any_layout(dtype: str) -> None:
    """The runner's columns are int32 (any layout); another dtype is refused, never cast."""
    sched = sync_scheduler()
    sched.add_request("r", [1, 2, 3], max_tokens=5)
    so = sched.schedule()
    for column in (np.array([1], dtype), packed_field([1], dtype, 1)):
        with pytest.raises(OutputMismatchError, match=r"sampled_token_ids.*int32"):
            sched.update_from_output(so, Duck(["r"], column, np.array([1], np.int32)))
    with pytest.raises(LlmschedError):
        sched.update_from_output(so, Duck(["r"], np.array([1], np.int32), np.array([1], dtype)))
    assert sched.get_request("r").num_computed_tokens == 3
