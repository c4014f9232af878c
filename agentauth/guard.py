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

from agentauth.client import AsyncAuthzClient, AuthzClient, Decision
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
        """The decision for one call (blocking; needs an :class:`AuthzClient`). Never raises
        for the service's failures: they become decisions as ``on_error`` says."""
        if not isinstance(self.client, AuthzClient):
            raise TypeError("this guard has an AsyncAuthzClient: use 'await guard.check_async()'")
        try:
            return self.client.authorize(self.agent_id, tool_name, parameters)
        except (AuthzError, TypeError) as exc:
            return self._without_answer(exc)

    async def check_async(
        self, tool_name: str, parameters: Mapping[str, Any] | None = None
    ) -> Decision:
        """:meth:`check` for async code; with a blocking client it runs in a worker thread."""
        if not isinstance(self.client, AsyncAuthzClient):
            import anyio.to_thread  # httpx's own dependency: works under asyncio and trio

            return await anyio.to_thread.run_sync(self.check, tool_name, parameters)
        try:
            return await self.client.authorize(self.agent_id, tool_name, parameters)
        except (AuthzError, TypeError) as exc:
            return self._without_answer(exc)

    def _without_answer(self, exc: Exception) -> Decision:
        """The decision when the service gave none: ``on_error`` for an unusable answer, a
        denial for everything else."""
        error = exc if isinstance(exc, AuthzError) else _bad_parameters(exc)
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
        returns :func:`denied_result` and never reaches the handler."""
        if callable(name):
            return self._wrap(name, name.__name__)

        def decorator(handler: F) -> F:
            return self._wrap(handler, name if name is not None else handler.__name__)

        return decorator

    def _wrap(self, handler: F, tool_name: str) -> F:
        if not isinstance(tool_name, str) or not tool_name:
            raise TypeError("a tool name must be a non-empty string")
        signature = inspect.signature(handler)
        if inspect.iscoroutinefunction(handler):
            run: Callable[..., Awaitable[Any]] = handler

            @functools.wraps(handler)
            async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                parameters = call_arguments(signature, args, kwargs)
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
            decision = self.check(tool_name, call_arguments(signature, args, kwargs))
            if not decision.allowed:
                return denied_result(decision.reason)
            return handler(*args, **kwargs)

        return guarded  # type: ignore[return-value]

    def protect(self, server: Any) -> Any:
        """Guard every tool of an MCP server (the official SDK's FastMCP) by its name; returns
        the server. See :mod:`agentauth.mcp`."""
        from agentauth.mcp import protect

        return protect(server, self)


def call_arguments(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults applied; ``self``/``cls`` left out,
    ``**kwargs`` merged in, ``*args`` as a list. A call that does not fit the signature raises
    the TypeError the handler itself would."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    out: dict[str, Any] = {}
    for index, (name, value) in enumerate(bound.arguments.items()):
        kind = signature.parameters[name].kind
        if index == 0 and name in ("self", "cls"):
            continue
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            out[name] = list(value)
        else:
            out[name] = value
    return out


def _bad_parameters(exc: Exception) -> BadRequestError:
    return BadRequestError(
        f"the parameters cannot be sent for authorization: {exc}", code="INVALID_PARAMETERS"
    )
