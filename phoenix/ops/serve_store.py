"""The user-state store of the serve command: its options, the store it uses for a run (the one
--redis names, else the one it starts: ``phoenix.user_state.embedded``), and what the banner and
``serving.json`` say of it (docs/user-state.md, "The store serve starts")."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.user_state.client import without_password
from phoenix.user_state.embedded import DEFAULT_FSYNC, FSYNC_POLICIES, StoreChoice, serve_store
from phoenix.util.command_line import port_number
from phoenix.util.processes import LOOPBACK

__all__ = ["StoreChoice"]

STORE_FOLDER = "user-state"  # the store's folder in --build-dir unless --store-dir names one
STORE_OPTIONS = ("--store-dir", "--store-port", "--store-fsync", "--ephemeral-store")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the store serve starts when no URL names one (STORE_OPTIONS)."""
    add = parser.add_argument
    folder = "the started store's folder, where its data outlives serve (default: BUILD_DIR/"
    folder += f"{STORE_FOLDER}); one serve at a time per folder"
    add("--store-dir", type=Path, metavar="DIR", help=folder)
    port = f"the started store's port on {LOOPBACK} (default: the port its folder's store had "
    port += "last, when free, else any free one)"
    add("--store-port", type=port_number, metavar="PORT", help=port)
    fsync = "when the started store's append-only file reaches the disk (appendfsync): "
    fsync += "; ".join(f"{name} ({what})" for name, what in FSYNC_POLICIES.items())
    fsync += f" (default: {DEFAULT_FSYNC}; docs/user-state.md has what each costs)"
    add("--store-fsync", choices=list(FSYNC_POLICIES), help=fsync)
    throwaway = "start an empty store without persistence instead, removed when serve stops "
    throwaway += "(the data of --store-dir is left alone)"
    add("--ephemeral-store", action="store_true", help=throwaway)


def check_store_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse's error (exit 2) for store options that contradict."""
    given = [
        option
        for option in STORE_OPTIONS
        if getattr(args, option[2:].replace("-", "_")) not in (None, False)
    ]
    if args.redis and given:
        parser.error(
            f"{', '.join(given)}: options of the store serve starts, and --redis (or "
            f"${USER_STATE_URL_ENV}) names another store: give one or the other"
        )
    if args.ephemeral_store and (args.store_dir or args.store_fsync):
        parser.error("--ephemeral-store keeps nothing: it takes no --store-dir or --store-fsync")


def store_line(store: StoreChoice) -> str:
    """What the banner says of the user-state store."""
    if store.named:
        return f"{without_password(store.url)}  (named by --redis or ${USER_STATE_URL_ENV})"
    if store.folder is None:
        return f"{store.url}  (throwaway: empty at the start, removed at the stop)"
    return f"{store.url}  (data in {store.folder}, appendfsync {store.appendfsync})"


@contextlib.contextmanager
def user_state_store(args: argparse.Namespace) -> Iterator[StoreChoice]:
    """The store named by --redis, or the one serve starts (said on stderr) for the block."""
    folder = None if args.ephemeral_store else (args.store_dir or args.build_dir / STORE_FOLDER)
    with serve_store(
        args.redis,
        folder,
        port=args.store_port or 0,
        appendfsync=args.store_fsync or DEFAULT_FSYNC,
        ephemeral_work_dir=args.build_dir,
        say=say,
    ) as store:
        say(f"user state: {store_line(store)}")
        yield store


def store_state(store: StoreChoice) -> dict:
    """serving.json's "user_state": the store's URL (a password left out: never written to
    a file), and its folder when serve started it."""
    url = without_password(store.url)
    return {
        "url": url,
        "password_left_out": url != store.url,
        "dir": str(store.folder) if store.folder else None,
        "appendfsync": store.appendfsync,
        "started_by_serve": not store.named,
    }
