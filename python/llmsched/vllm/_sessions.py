"""Streaming-input sessions (vLLM's resumable requests) on the plug-in's side.

The core decides: it queues an input added while the session runs, takes one up at the
session's stop or at once if the session waits for input, and ends the session. Here each
session's vLLM ``Request`` gets, when the core has taken an input up, what vLLM's
``_update_request_as_session`` writes into it beyond what the core serves (see
``_requests.py``): the prompt, the sampling parameters, the arrival time, the block hashes
past the kept tokens dropped.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import Request

import llmsched

__all__ = ["Sessions"]


class Sessions:
    """The live sessions' inputs the core has queued (their ``Request`` objects; None for
    the end of a session), and how many of its inputs each session's object has taken up."""

    def __init__(self, core: llmsched.Scheduler, hash_block_size: int, log_stats: bool) -> None:
        self._core = core
        self._hash_block_size = hash_block_size
        self._log_stats = log_stats
        self._queued: dict[str, deque[Request | None]] = {}
        self._taken: dict[str, int] = {}

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._queued

    def __bool__(self) -> bool:
        return bool(self._queued)

    def started(self, request: Request) -> None:
        """``request``, just added to the core, is a session."""
        self._queued[request.request_id] = deque()
        self._taken[request.request_id] = 0

    def add_input(self, session: Request, request: Request, arguments: dict[str, Any]) -> str:
        """Hand ``request``, an input under ``session``'s id, to the core (with the core's
        ``add_request`` ``arguments``); returns what the core did with it (``"queued"``,
        ``"taken_up"`` or ``"finished"``). Raises the core's error, changing nothing."""
        answer = self._core.add_request(
            request.request_id,
            request.prompt_token_ids,
            resumable=request.resumable,
            **arguments,
        )
        assert answer is not None, "an input of a live session"
        if answer == "queued":
            self._queued[request.request_id].append(request if request.resumable else None)
        elif answer == "taken_up":
            self._queued[request.request_id].appendleft(request)
            self.catch_up(session)
        return answer

    def catch_up(self, session: Request) -> None:
        """Give ``session``'s object the inputs the core has taken up since it last looked."""
        req_id = session.request_id
        taken = self._core.get_request(req_id).num_inputs_taken
        while self._taken[req_id] < taken:
            request = self._queued[req_id].popleft()
            assert request is not None, "the end of a session is never taken up"
            self._take_up(session, request)
            self._taken[req_id] += 1

    def forget(self, req_id: str) -> None:
        """The session finished."""
        if self._queued.pop(req_id, None) is not None:
            del self._taken[req_id]

    def _take_up(self, session: Request, request: Request) -> None:
        fields = session.__dict__
        state = self._core.get_request(session.request_id)
        # Every token but the input's is kept: their hashes stay, the later ones go.
        keep_end = state.num_prompt_tokens - len(request.prompt_token_ids)
        del fields["block_hashes"][keep_end // self._hash_block_size :]
        fields["prompt_token_ids"] = list(state.prompt_token_ids)
        fields["num_prompt_tokens"] = state.num_prompt_tokens
        fields["arrival_time"] = request.arrival_time
        fields["sampling_params"] = request.sampling_params
        fields["max_tokens"] = request.max_tokens
        if self._log_stats:
            session.record_event(EngineCoreEventType.QUEUED)
