"""Draft tokens handed to the scheduler (sync speculative decoding): validation, the flat form
a runner holds, and requests named by id object or by text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from llmsched import (
    InvalidRequestError,
    RequestStatus,
)

from conftest import add_requests, make_scheduler, one_token_each, spec_tokens


def test_draft_validation() -> None:
    sched = make_scheduler(num_speculative_tokens=2)
    add_requests(sched, 1)
    with pytest.raises(InvalidRequestError, match="draft_token_ids"):
        sched.update_draft_token_ids(["0"], [[1, 2, 3]])  # more than K
    with pytest.raises(InvalidRequestError, match="draft_token_ids"):
        sched.update_draft_token_ids(["0"], [[1, -5]])
    with pytest.raises(InvalidRequestError, match="appears twice"):
        sched.update_draft_token_ids(["0", "0"], [[1], [2]])
    sched.update_draft_token_ids(["gone"], [[1]])  # finished or unknown ids are ignored


FLAT_DRAFT_FORMS: dict[str, Callable[[list[int]], Any]] = {
    "int32": lambda tokens: np.array(tokens, dtype=np.int32),
    "int32-strided": lambda tokens: np.repeat(np.array(tokens, dtype=np.int32), 2)[::2],
    "int64": lambda tokens: np.array(tokens, dtype=np.int64),
    "list": list,
}


@pytest.mark.parametrize("form", FLAT_DRAFT_FORMS)
def test_flat_drafts_schedule_as_draft_lists_do(form: str) -> None:
    """``update_draft_token_ids(ids, flat, counts)`` gives each request the same drafts
    as the list of rows: rows of every length up to K, padding, unknown ids; the flat
    drafts an int32 array (taken as it is), a strided one, int64 or a list."""
    lists, flat = make_scheduler(num_speculative_tokens=3), make_scheduler(num_speculative_tokens=3)
    for sched in (lists, flat):
        add_requests(sched, 5, max_tokens=12)
    rng = np.random.default_rng(7)
    for _ in range(10):
        so_lists, so_flat = lists.schedule(), flat.schedule()
        assert spec_tokens(so_lists) == spec_tokens(so_flat)
        lists.update_from_output(so_lists, one_token_each(so_lists))
        flat.update_from_output(so_flat, one_token_each(so_flat))
        ids = [*so_lists.req_ids, "gone"]
        rows = [[int(t) for t in rng.integers(-1, 50, rng.integers(0, 4))] for _ in ids]
        lists.update_draft_token_ids(ids, rows)
        tokens = FLAT_DRAFT_FORMS[form]([t for row in rows for t in row])
        flat.update_draft_token_ids(ids, tokens, np.array([len(r) for r in rows], np.int32))
    assert any(spec_tokens(lists.schedule()).values())


def test_drafts_name_their_requests_in_any_sequence() -> None:
    """The step's own id list, a tuple or a generator of its ids, and a list mixing its
    objects with strings built anew give the same drafts; a duplicate object or a non-str
    in a list is named by position and changes nothing."""
    shapes = {
        "list": lambda ids: list(ids),
        "tuple": lambda ids: tuple(ids),
        "generator": lambda ids: (rid for rid in ids),
        "mixed": lambda ids: [rid if i % 2 else "".join(list(rid)) for i, rid in enumerate(ids)],
    }
    drafts = {}
    for shape, make in shapes.items():
        sched = make_scheduler(num_speculative_tokens=2)
        add_requests(sched, 4, max_tokens=12)
        so = sched.schedule()
        sched.update_from_output(so, one_token_each(so))
        ids = so.req_ids
        with pytest.raises(InvalidRequestError, match=r"req_ids\[2\].*appears twice"):
            sched.update_draft_token_ids([ids[0], ids[1], ids[0]], [[1], [2], [3]])
        with pytest.raises(InvalidRequestError, match=r"req_ids\[1\]: must be a str"):
            sched.update_draft_token_ids([ids[0], 7], [[1], [2]])
        sched.update_draft_token_ids(make(ids), [[10 + i, 20 + i] for i in range(len(ids))])
        drafts[shape] = spec_tokens(sched.schedule())
    assert drafts["list"] == {f"{i}": [10 + i, 20 + i] for i in range(4)}
    assert all(d == drafts["list"] for d in drafts.values()), drafts


def test_drafts_find_their_request_by_id_object_or_by_text() -> None:
    """The step's own id objects and equal strings built anew name the same request; a
    finished request's id object (still in a step's lists until reported) and a stale
    object of a finished id now reused are never given drafts of another request."""
    by_object = make_scheduler(num_speculative_tokens=2)
    by_text = make_scheduler(num_speculative_tokens=2)
    for sched in (by_object, by_text):
        add_requests(sched, 3, max_tokens=12)
    for _ in range(3):
        so_object, so_text = by_object.schedule(), by_text.schedule()
        assert spec_tokens(so_object) == spec_tokens(so_text)
        by_object.update_from_output(so_object, one_token_each(so_object))
        by_text.update_from_output(so_text, one_token_each(so_text))
        fresh = ["".join(list(rid)) for rid in so_text.req_ids]
        assert all(a == b and a is not b for a, b in zip(fresh, so_text.req_ids, strict=True))
        by_object.update_draft_token_ids(so_object.req_ids, [[5, 6]] * len(fresh))
        by_text.update_draft_token_ids(fresh, [[5, 6]] * len(fresh))
    drafts_object, drafts_text = spec_tokens(by_object.schedule()), spec_tokens(by_text.schedule())
    assert drafts_object == drafts_text == {rid: [5, 6] for rid in drafts_text}
    assert len(drafts_text) == 3

    sched = make_scheduler(num_speculative_tokens=2)
    add_requests(sched, 2, max_tokens=12)
    so = sched.schedule()
    sched.update_from_output(so, one_token_each(so))
    old = so.req_ids[0]
    sched.finish_requests(old, RequestStatus.FINISHED_ABORTED)
    sched.update_draft_token_ids([old], [[5, 6]])  # finished, not yet reported: ignored
    sched.add_request(old, [1, 2, 3], max_tokens=4)  # the same object names a new request
    sched.update_draft_token_ids([old], [[5, 6]])  # waiting: its drafts are dropped
    so = sched.schedule()
    assert old in so.finished_req_ids and old in so.req_ids
    assert old not in spec_tokens(so)
    sched.update_from_output(so, one_token_each(so))
    sched.update_draft_token_ids([old], [[8, 9]])
    assert spec_tokens(sched.schedule())[old] == [8, 9]
