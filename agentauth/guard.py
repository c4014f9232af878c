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
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypeVar, overload

import anyio.to_thread

from agentauth.answers import Decision
from agentauth.client import AsyncAuthzClient, AuthzClient
from agentauth.errors import AuthzError, BadRequestError, RateLimitError, ServiceUnavailableError

OnError = Literal["deny", "allow"]
F = TypeVar("F", bound=Callable[..., Any])
DENIED_PREFIX = "Authorization denied: "


def denied_result(reason: str) -> dict[str, Any]:
    """What a guarded handler returns instead of running: an MCP-shaped error result."""
    return {"content": [{"type": "text", "text": DENIED_PREFIX + reason}], "isError": True}


class Guard:
    """Authorization for one agent's tools. ``client`` is an :class:`AuthzClient` or an
    :class:`AsyncAuthzClient`; sync handlers need the former, async ones take either."""

    def __init__(
        self,
        client: AuthzClient | AsyncAuthzClient,
        agent_id: str,
        *,
        on_error: OnError = "deny",
    ) -> None:
        if on_error not in ("deny", "allow"):
            raise ValueError("on_error must be 'deny' or 'allow'")
        if not isinstance(client, AuthzClient | AsyncAuthzClient):
            raise TypeError("client must be an AuthzClient or an AsyncAuthzClient")
        if not isinstance(agent_id, str) or not agent_id:
            raise TypeError("agent_id must be the agent's id, a non-empty string")
        self.client = client
        self.agent_id = agent_id
        self.on_error: OnError = on_error

    def __repr__(self) -> str:
        return f"Guard({self.client!r}, agent_id={self.agent_id!r}, on_error={self.on_error!r})"

    # ------------------------------------------------------------------ checking one call

    def check(self, tool_name: str, parameters: Mapping[str, Any] | None = None) -> Decision:
        """The decision for one call (blocking; needs an :class:`AuthzClient`). Never raises:
        the service's failures become decisions as ``on_error`` says, anything else denies."""
        if not isinstance(self.client, AuthzClient):
            raise TypeError("this guard has an AsyncAuthzClient: use 'await guard.check_async()'")
        try:
            return self.client.authorize(self.agent_id, tool_name, parameters)
        except Exception as exc:  # a guard answers; it never lets a call through
            failure = exc
        return self._without_answer(failure)

    async def check_async(
        self, tool_name: str, parameters: Mapping[str, Any] | None = None
    ) -> Decision:
        """:meth:`check` for async code; with a blocking client it runs in a worker thread."""
        if not isinstance(self.client, AsyncAuthzClient):
            return await anyio.to_thread.run_sync(self.check, tool_name, parameters)
        try:
            return await self.client.authorize(self.agent_id, tool_name, parameters)
        except Exception as exc:  # as in check
            failure = exc
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
        returns :func:`denied_result` and never reaches the handler. For MCP servers use
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
        """Guard every tool of an MCP server (the official SDK's FastMCP) by its name; returns
        the server. See :mod:`agentauth.mcp`."""
        from agentauth.mcp import protect

        return protect(server, self)


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


def _refused(code: str, message: str) -> BadRequestError:
    return BadRequestError(message, code=code)
