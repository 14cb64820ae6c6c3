"""Hints: the sessions and runs documents this owner last committed, sparing a write its finds.

Every write reads its session and its run, then replaces both on the revision it read. The owner
that applied a run's previous step holds both as that step committed them, so the next step may
start from them instead of two finds (five of a one-tool run's fifteen).

A hint is never trusted. Before a transaction commits, or its refusal is given, every document a
hint served is confirmed: by the operation's own replace of it (which matches only the revision
the hint holds) or else by reading it in the transaction's snapshot. One that moved (another
owner copy wrote it, a purge deleted it) fails the attempt as a write race; the transaction's
hints are dropped, and the operation is applied again on what the database holds. So no answer
rests on a hint: at worst a stale one costs an attempt.

Only write transactions use hints (never the reads applied outside one). What a transaction
wrote or read itself is its snapshot's, so the operations of one group (group commit) see the
documents the earlier ones wrote, unconfirmed by nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import bson

from quipu.services.storage_owner.mongo import Document, WriteRaceError

Key = tuple[str, str]
"""A document's collection and `_id`."""

MAX_HINT_BYTES = 64 * 1024
"""The largest document kept (a run holding a suspension checkpoint may be megabytes): the hints
of a full cache stay within a few tens of megabytes."""


def _version(document: Document | None) -> tuple[bool, object, bool]:
    """What a save changes: whether the document is there, its revision, whether it is a tombstone."""
    if document is None:
        return False, None, False
    return True, document.get("revision"), bool(document.get("tombstone"))


def same_version(one: Document | None, other: Document | None) -> bool:
    """Whether two reads of a document found the same version of it (every save bumps the revision;
    a purge replaces a session with its tombstone and deletes its runs)."""
    return _version(one) == _version(other)


def _newer(kept: Document, document: Document) -> bool:
    """Whether `document` may replace `kept` as a hint: a tombstone is final, revisions only grow."""
    if kept.get("tombstone"):
        return False
    if document.get("tombstone"):
        return True
    return bool(document.get("revision", 0) >= kept.get("revision", 0))


class DocumentHints:
    """The documents committed last by this process's transactions, at most `size` (least recent
    out), none over `MAX_HINT_BYTES`."""

    def __init__(self, size: int) -> None:
        self._size = max(1, size)
        self._documents: OrderedDict[Key, Document] = OrderedDict()

    def get(self, key: Key) -> Document | None:
        document = self._documents.get(key)
        if document is not None:
            self._documents.move_to_end(key)
        return document

    def keep(self, documents: Iterable[tuple[Key, Document | None]]) -> None:
        """Remember what a committed transaction wrote or read (a document it found gone is dropped)."""
        for key, document in documents:
            if document is None or len(bson.encode(document)) > MAX_HINT_BYTES:
                self._documents.pop(key, None)
                continue
            kept = self._documents.get(key)
            if kept is None or _newer(kept, document):
                self._documents[key] = document
                self._documents.move_to_end(key)
        while len(self._documents) > self._size:
            self._documents.popitem(last=False)

    def drop(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self._documents.pop(key, None)


class AttemptDocuments:
    """What one database transaction (one attempt, perhaps a group's) knows of sessions and runs:
    the documents it read or wrote (its snapshot's), and those hints served it, to confirm."""

    def __init__(self, hints: DocumentHints | None) -> None:
        self._hints = hints
        self._known: dict[Key, Document | None] = {}
        self._hinted: dict[Key, Document | None] = {}
        self.opened = 0
        """Operations of the attempt still open (a group's share it)."""
        self.committed = False

    def lookup(self, key: Key) -> tuple[bool, Document | None]:
        """(found, document): found when the snapshot's version is known or a hint stands for it."""
        if key in self._known:
            return True, self._known[key]
        if key in self._hinted:
            return True, self._hinted[key]
        hinted = self._hints.get(key) if self._hints is not None else None
        if hinted is None:
            return False, None
        self._hinted[key] = hinted
        return True, hinted

    def read(self, key: Key, document: Document | None) -> None:
        """`document` is what this transaction's snapshot holds at `key` (read, or written by it)."""
        self._known[key] = document
        self._hinted.pop(key, None)

    def guess_absent(self, key: Key) -> None:
        """Take `key` for absent unread (an operation that inserts it when it is: a start's run),
        confirmed as a hint is: by the operation's own insert, or else by a read."""
        self._hinted[key] = None

    def unconfirmed(self) -> list[tuple[Key, Document | None]]:
        """The hinted documents this transaction has neither written nor read itself."""
        return list(self._hinted.items())

    def confirm(self, key: Key, found: Document | None) -> None:
        """The snapshot's version of a hinted document: WriteRaceError unless it is the hint's."""
        if not same_version(self._hinted[key], found):
            raise WriteRaceError("a session or run changed since this owner last committed it")
        self.read(key, found)

    def gone(self, collection: str, field: str, value: object) -> None:
        """Documents of `collection` whose `field` is `value` were deleted by this transaction."""
        for key, document in [*self._known.items(), *self._hinted.items()]:
            if key[0] == collection and document is not None and document.get(field) == value:
                self.read(key, None)

    def settle(self) -> None:
        """The attempt ended: what it committed becomes the hints; else its documents are unhinted."""
        if self._hints is None:
            return
        if self.committed:
            self._hints.keep(self._known.items())
        else:
            self._hints.drop([*self._known, *self._hinted])
