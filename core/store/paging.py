"""Offset pagination shared by every list: one page of rows plus the total across pages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    limit: int
    offset: int
    total: int

    def envelope(self, serialize: Callable[[T], Any]) -> dict[str, Any]:
        """The API's ``{data, pagination}`` envelope."""
        return {
            "data": [serialize(item) for item in self.items],
            "pagination": {
                "limit": self.limit,
                "offset": self.offset,
                "count": len(self.items),
                "total": self.total,
            },
        }


def paginate(session: Session, query: Select[T], limit: int, offset: int) -> Page[T]:
    """One page of ``query`` (which must carry a total order) and the count of all its rows."""
    total = session.scalar(select(func.count()).select_from(query.order_by(None).subquery()))
    items = list(session.scalars(query.limit(limit).offset(offset)))
    return Page(items, limit, offset, int(total or 0))
