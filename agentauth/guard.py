"""The guard: authorization in front of a tool handler, in one line.

``Guard(client, agent_id)`` asks the service before every call (:meth:`Guard.check`), wraps
handlers (:meth:`Guard.tool`) and whole MCP servers (:meth:`Guard.protect`). What it does when
the service gives no usable answer is the one setting, ``on_error``:

- a network error, a time-out, a 5xx or an unreadable answer: denied with ``on_error="deny"``
  (the default), allowed with ``on_error="allow"``;
- a 401, 403 or other 4xx (a wrong or expired key, a malformed request) and a 429: always
  denied, whatever ``on_error`` says. A wrong key never fails open.

A handler runs only when the decision allows it: the service said ``allowed: true`` (a real
boolean), or the service was unreachable and ``on_error="allow"``.

Over 300 lines: checking, waiting for an approval and wrapping handlers share the one rule a
guard keeps (a handler runs only on an allow), sync and async alike.

A warn policy's warning in the service's answer (a policy being tried that would have decided
the call otherwise, decisions §10) is logged at WARNING on the ``agentauth`` logger, naming the
policy and its reason; the guard still follows the real decision.

A call the service escalates to a human (``outcome == "escalated"``, decisions §6) is denied, with
a reason that says approval is required and names the approval and its expiry. With
``wait_for_approval=SECONDS`` the guard waits instead: it polls the approval (after 0.5 s, then
twice as long each time, at most 5 s apart, never past the wait) until it is no longer pending,
then asks the service again, so the decision (and its audit entry) is the service's: the handler
runs only if that answer allows. Errors while polling do not end the wait (``on_error`` applies to
the authorize calls only); a wait that runs out denies as an escalation does, saying so.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar, overload

import anyio
import anyio.to_thread

from agentauth.answers import Approval, Decision
from agentauth.client import AsyncAuthzClient, AuthzClient, check_session_id
from agentauth.errors import AuthzError, BadRequestError, RateLimitError, ServiceUnavailableError

OnError = Literal["deny", "allow"]
F = TypeVar("F", bound=Callable[..., Any])
DENIED_PREFIX = "Authorization denied: "
#: waiting for an approval: the first look after this many seconds, then twice as long each
#: time, never more than MAX_POLL_SECONDS apart (and never past the wait)
FIRST_POLL_SECONDS = 0.5
MAX_POLL_SECONDS = 5.0
# the clock and the sleeps of the wait, looked up at each use (tests give a fake clock)
_clock: Callable[[], float] = time.monotonic
_sleep: Callable[[float], None] = time.sleep
_async_sleep: Callable[[float], Awaitable[None]] = anyio.sleep
#: where a warn policy's warnings go, at WARNING (decisions §10)
log = logging.getLogger("agentauth")


def denied_result(reason: str) -> dict[str, Any]:
    """What a guarded handler returns instead of running: an MCP-shaped error result."""
    return {"content": [{"type": "text", "text": DENIED_PREFIX + reason}], "isError": True}


class Guard:
    """Authorization for one agent's tools. ``client`` is an :class:`AuthzClient` or an
    :class:`AsyncAuthzClient`; sync handlers need the former, async ones take either.
    ``wait_for_approval``: seconds to wait for a human to decide an escalated call (None, the
    default: do not wait, deny at once). ``session_id``: the conversation or run every call
    belongs to, unless a call names its own (``check(..., session_id=...)``; the MCP adapters
    pass the transport's session): per-session rate limits and budgets count by it."""

    def __init__(
        self,
        client: AuthzClient | AsyncAuthzClient,
        agent_id: str,
        *,
        on_error: OnError = "deny",
        wait_for_approval: float | None = None,
        session_id: str | None = None,
    ) -> None:
        if on_error not in ("deny", "allow"):
            raise ValueError("on_error must be 'deny' or 'allow'")
        if wait_for_approval is not None and (
            not isinstance(wait_for_approval, int | float)
            or isinstance(wait_for_approval, bool)
            or not math.isfinite(wait_for_approval)
            or wait_for_approval <= 0
        ):
            raise ValueError(
                "wait_for_approval must be None or a positive, finite number of seconds"
            )
        if not isinstance(client, AuthzClient | AsyncAuthzClient):
            raise TypeError("client must be an AuthzClient or an AsyncAuthzClient")
        if not isinstance(agent_id, str) or not agent_id:
            raise TypeError("agent_id must be the agent's id, a non-empty string")
        self.client = client
        self.agent_id = agent_id
        self.session_id = check_session_id(session_id)
        self.on_error: OnError = on_error
        self.wait_for_approval: float | None = (
            None if wait_for_approval is None else float(wait_for_approval)
        )

    def __repr__(self) -> str:
        return (
            f"Guard({self.client!r}, agent_id={self.agent_id!r}, on_error={self.on_error!r}, "
            f"wait_for_approval={self.wait_for_approval!r}, session_id={self.session_id!r})"
        )

    # ------------------------------------------------------------------ checking one call

    def check(
        self,
        tool_name: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
    ) -> Decision:
        """The decision for one call (blocking; needs an :class:`AuthzClient`). Never raises:
        the service's failures become decisions as ``on_error`` says, anything else denies.
        An escalated call is waited for when ``wait_for_approval`` says so (blocking this
        thread); an escalated decision returned has the guard's reason (see the module).
        ``session_id``: this call's session, else the guard's."""
        client = self.client
        if not isinstance(client, AuthzClient):
            raise TypeError("this guard has an AsyncAuthzClient: use 'await guard.check_async()'")
        session = session_id if session_id is not None else self.session_id
        decision = self._ask(client, tool_name, parameters, session)
        if self.wait_for_approval is None or not _awaitable(decision):
            return _explained(decision)
        waiting = _Waiting(self.wait_for_approval)
        while decision.approval_id is not None and _awaitable(decision):
            state: str | _Lost = _PENDING
            while state == _PENDING:
                pause = waiting.next_pause()
                if pause is None:
                    return _explained(decision, waited=waiting.seconds)
                _sleep(pause)
                try:
                    found: Approval | Exception = client.approval(decision.approval_id)
                except Exception as exc:  # polling goes on until the wait is over
                    found = exc
                state = _state(found)
            if isinstance(state, _Lost):
                return _explained(decision, note=state.note)
            decision = self._ask(client, tool_name, parameters, session)
        return _explained(decision)

    async def check_async(
        self,
        tool_name: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
    ) -> Decision:
        """:meth:`check` for async code; with a blocking client it runs in a worker thread.
        Waiting for an approval sleeps with anyio (cancelling the task ends the wait)."""
        client = self.client
        if not isinstance(client, AsyncAuthzClient):
            check = functools.partial(self.check, session_id=session_id)
            return await anyio.to_thread.run_sync(check, tool_name, parameters)
        session = session_id if session_id is not None else self.session_id
        decision = await self._ask_async(client, tool_name, parameters, session)
        if self.wait_for_approval is None or not _awaitable(decision):
            return _explained(decision)
        waiting = _Waiting(self.wait_for_approval)
        while decision.approval_id is not None and _awaitable(decision):
            state: str | _Lost = _PENDING
            while state == _PENDING:
                pause = waiting.next_pause()
                if pause is None:
                    return _explained(decision, waited=waiting.seconds)
                await _async_sleep(pause)
                try:
                    found: Approval | Exception = await client.approval(decision.approval_id)
                except Exception as exc:  # as in check
                    found = exc
                state = _state(found)
            if isinstance(state, _Lost):
                return _explained(decision, note=state.note)
            decision = await self._ask_async(client, tool_name, parameters, session)
        return _explained(decision)

    def _ask(
        self,
        client: AuthzClient,
        tool_name: str,
        parameters: Mapping[str, Any] | None,
        session_id: str | None,
    ) -> Decision:
        try:
            decision = client.authorize(self.agent_id, tool_name, parameters, session_id=session_id)
        except Exception as exc:  # a guard answers; it never lets a call through
            failure = exc
        else:
            return _warned(decision, tool_name)
        return self._without_answer(failure)

    async def _ask_async(
        self,
        client: AsyncAuthzClient,
        tool_name: str,
        parameters: Mapping[str, Any] | None,
        session_id: str | None,
    ) -> Decision:
        try:
            decision = await client.authorize(
                self.agent_id, tool_name, parameters, session_id=session_id
            )
        except Exception as exc:  # as in _ask
            failure = exc
        else:
            return _warned(decision, tool_name)
        return self._without_answer(failure)

    def _without_answer(self, exc: Exception) -> Decision:
        """The decision when the service gave none: ``on_error`` for an unusable answer, a
        denial for everything else (a refused key, a bad request, a rate limit, a bug)."""
        if isinstance(exc, AuthzError):
            error = exc.with_traceback(None)  # keep no frames (nor the client in them) alive
        elif isinstance(exc, TypeError):
            error = _refused("INVALID_PARAMETERS", f"the parameters cannot be sent: {exc}")
        else:
            error = _refused("CHECK_FAILED", f"the check failed: {type(exc).__name__}: {exc}")
        if isinstance(error, ServiceUnavailableError):
            reason = f"authorization service unreachable: {error.message}"
            if self.on_error == "allow":
                reason += "; allowed because on_error is 'allow'"
                return Decision(True, "allowed", reason, error=error)
            return Decision(False, "denied", reason, error=error)
        if isinstance(error, RateLimitError):
            seconds = (
                None if error.retry_after_ms is None else math.ceil(error.retry_after_ms / 1000)
            )
            wait = f"retry in {seconds} s" if seconds is not None else "retry later"
            reason = f"the authorization service is rate limiting this key; {wait}"
            return Decision(False, "denied", reason, retry_after_seconds=seconds, error=error)
        reason = f"the authorization service refused the check ({error.code}): {error.message}"
        if error.status_code is None:  # refused here, before any request
            reason = f"the call cannot be checked ({error.code}): {error.message}"
        return Decision(False, "denied", reason, error=error)

    # ------------------------------------------------------------------ wrapping handlers

    @overload
    def tool(self, name: F) -> F: ...

    @overload
    def tool(self, name: str | None = None) -> Callable[[F], F]: ...

    def tool(self, name: str | Callable[..., Any] | None = None) -> Any:
        """Decorate a sync or async handler: ``@guard.tool()``, ``@guard.tool("calendar.create")``
        or bare ``@guard.tool``. The tool name defaults to the function's name; the parameters
        sent are the call's arguments by parameter name (defaults included). A denied call
        returns :func:`denied_result` and never reaches the handler (an escalated one, once
        waited for if ``wait_for_approval`` says so, as well). For MCP servers use
        :meth:`protect` instead: the SDK would check a denial against the tool's output type."""
        if callable(name):
            return self._wrap(name, None)

        def decorator(handler: F) -> F:
            return self._wrap(handler, name)

        return decorator

    def _wrap(self, handler: F, name: str | None) -> F:
        tool_name = name if name is not None else getattr(handler, "__name__", None)
        if not isinstance(tool_name, str) or not tool_name:
            raise TypeError("this handler has no __name__: give the tool a name, @guard.tool('x')")
        if isinstance(handler, staticmethod | classmethod):
            raise TypeError("put @guard.tool below @staticmethod / @classmethod, not above")
        if inspect.isgeneratorfunction(handler) or inspect.isasyncgenfunction(handler):
            raise TypeError(f"'{tool_name}' is a generator: guard a function that returns")
        signature = inspect.signature(handler)
        skip_first = _is_method(handler)
        if _is_async(handler):
            run: Callable[..., Awaitable[Any]] = handler

            @functools.wraps(handler)
            async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                parameters = call_arguments(signature, args, kwargs, skip_first=skip_first)
                if parameters is None:
                    return denied_result(_AMBIGUOUS)
                decision = await self.check_async(tool_name, parameters)
                if not decision.allowed:
                    return denied_result(decision.reason)
                return await run(*args, **kwargs)

            return guarded_async  # type: ignore[return-value]
        if not isinstance(self.client, AuthzClient):
            raise TypeError(
                f"'{tool_name}' is a sync handler: guard it with an AuthzClient, "
                "or make it async to use the AsyncAuthzClient"
            )

        @functools.wraps(handler)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            parameters = call_arguments(signature, args, kwargs, skip_first=skip_first)
            if parameters is None:
                return denied_result(_AMBIGUOUS)
            decision = self.check(tool_name, parameters)
            if not decision.allowed:
                return denied_result(decision.reason)
            return handler(*args, **kwargs)

        return guarded  # type: ignore[return-value]

    def protect(self, server: Any) -> Any:
        """Guard every tool of an MCP server by its name; returns the server. The adapter is
        chosen by the package the server's class comes from (:data:`ADAPTERS`): the guard
        itself knows none of them, and imports one only when a server of its kind is given."""
        # the first class of the server's lineage from a package with an adapter: a server
        # class of the application's own, derived from the SDK's, is the SDK's kind
        packages = [kind.__module__.partition(".")[0] for kind in type(server).__mro__]
        package = next((p for p in packages if p in ADAPTERS), packages[0])
        adapter = ADAPTERS.get(package)
        if adapter is None:
            known = ", ".join(sorted(ADAPTERS))
            raise TypeError(
                f"protect() takes an MCP server of a package it has an adapter for ({known}), "
                f"not {type(server).__name__} of {package!r}"
            )
        protect: Callable[[Any, Guard], Any] = importlib.import_module(adapter).protect
        return protect(server, self)


#: the adapter module for the servers of each package (``Guard.protect``)
ADAPTERS = {"mcp": "agentauth.mcp", "fastmcp": "agentauth.fastmcp"}


_AMBIGUOUS = (
    "the call's arguments cannot be checked: a **kwargs name repeats a parameter name, so the "
    "service would see a value the handler does not get"
)


def call_arguments(
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    skip_first: bool = False,
) -> dict[str, Any] | None:
    """The call's arguments by parameter name, defaults applied; a method's ``self``/``cls``
    left out (``skip_first``), ``**kwargs`` merged in, ``*args`` as a list. None when a
    ``**kwargs`` name repeats another parameter's (the check would see one value and the
    handler another). A call that does not fit the signature raises the TypeError the
    handler itself would."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for index, (name, value) in enumerate(bound.arguments.items()):
        kind = signature.parameters[name].kind
        if index == 0 and skip_first:
            continue
        if kind is inspect.Parameter.VAR_KEYWORD:
            extra = value
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            out[name] = list(value)
        else:
            out[name] = value
    if extra.keys() & signature.parameters.keys():
        return None
    return {**out, **extra}


def _is_method(handler: Callable[..., Any]) -> bool:
    """A function written in a class body whose first parameter is self or cls."""
    parts = getattr(handler, "__qualname__", "").split(".")
    if len(parts) < 2 or parts[-2] == "<locals>":
        return False
    first = next(iter(inspect.signature(handler).parameters), None)
    return first in ("self", "cls")


def _is_async(handler: Callable[..., Any]) -> bool:
    while isinstance(handler, functools.partial):
        handler = handler.func
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (an object with an async __call__)
    )


def _warned(decision: Decision, tool_name: str) -> Decision:
    """``decision``, its warnings logged (decisions §10): a ``warn`` policy would have decided
    this call otherwise. The real decision is followed all the same."""
    for warning in decision.warnings:
        log.warning(
            "warn policy %s would have %s the call to %s (the call was %s): %s",
            warning.policy_id,
            warning.result,
            tool_name,
            decision.outcome,
            warning.reason,
        )
    return decision


def _refused(code: str, message: str) -> BadRequestError:
    return BadRequestError(message, code=code)


# ------------------------------------------------------------------ waiting for an approval


class _Waiting:
    """One wait's clock: when it ends, and the pause before each look at the approval."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._deadline = _clock() + seconds
        self._delay = FIRST_POLL_SECONDS

    def next_pause(self) -> float | None:
        """Seconds to sleep before the next look; None once the wait is over."""
        remaining = self._deadline - _clock()
        if remaining <= 0:
            return None
        pause = min(self._delay, remaining)
        self._delay = min(self._delay * 2, MAX_POLL_SECONDS)
        return pause


@dataclasses.dataclass(frozen=True)
class _Lost:
    """The approval cannot be followed (the key may not read it, base_url is wrong, ...)."""

    note: str


_PENDING = "pending"  # look again
_DECIDED = "decided"  # ask the service again


def _state(found: Approval | Exception) -> str | _Lost:
    """What a look at the approval means for the wait. Not pending any more (or gone: the
    service will say why): ask again. An unusable answer, a rate limit or an error of any other
    kind: look again later. A refusal (401, 403, another 4xx): stop waiting."""
    if isinstance(found, Approval):
        return _PENDING if found.pending else _DECIDED
    if isinstance(found, BadRequestError) and found.status_code == 404:
        return _DECIDED
    if isinstance(found, AuthzError) and not isinstance(
        found, ServiceUnavailableError | RateLimitError
    ):
        return _Lost(f"the approval cannot be read ({found.code}): {found.message}")
    return _PENDING


def _awaitable(decision: Decision) -> bool:
    """An escalation from the service that names its approval: one a guard can wait for."""
    return (
        decision.outcome == "escalated"
        and decision.approval_id is not None
        and decision.error is None
    )


def _explained(
    decision: Decision, *, waited: float | None = None, note: str | None = None
) -> Decision:
    """The decision a guard returns: an escalation has a reason saying that approval is
    required, which approval, until when, how long the guard waited, and the service's reason."""
    if decision.outcome != "escalated" or decision.allowed:
        return decision
    text = "approval required"
    if decision.approval_id is not None:
        text += f": approval {decision.approval_id} is pending"
        if decision.approval_expires_at is not None:
            text += f" until {_instant(decision.approval_expires_at)}"
    if waited is not None:
        text += f"; not decided within the {waited:g} s waited"
    if note is not None:
        text += f" ({note})"
    return dataclasses.replace(decision, reason=f"{text}; {decision.reason}")


def _instant(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
