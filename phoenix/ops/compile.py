"""Build the compiled programs of every served model once, beside the artifacts.

    python -m phoenix.ops.compile --artifacts artifacts/demo [--device cpu|gpu]

Each served model is built as a Triton instance builds it (the deployment profile's generated
config: the same buckets, batch sizes and parameters) and warmed up in this one process: a
program already in the store is loaded, a missing one compiled and stored. Model instances then
only load (``phoenix.engine.programs``). ``make artifacts`` and ``make demo`` run it; run it
again after changing JAX, the model code or the profile, or on a new kind of machine (a store
compiled for another one is detected and rebuilt, never loaded).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from phoenix.util.command_line import command_name, command_parser

DEVICES = ("cpu", "gpu")


class CompileError(ValueError):
    """The programs could not be built (the compile step printed why)."""


def warn_if_no_gpu_jax(device: str) -> None:
    """JAX without its CUDA plugin silently runs on the CPU: say so up front (stderr)."""
    plugins = ("jax_cuda13_plugin", "jax_cuda12_plugin")
    if device == "gpu" and not any(importlib.util.find_spec(p) for p in plugins):
        print(
            "warning: --device gpu but jax's CUDA plugin is not installed; the models will run "
            "on the CPU. Install it with: make setup DEVICE=gpu (requirements-gpu.txt)",
            file=sys.stderr,
            flush=True,
        )


def service_settings(model: str, artifact_dir: Path, device: str, repository: Path | None = None):
    """The settings an instance of ``model`` starts with under the ``device`` profile, or as
    ``repository``'s config.pbtxt of it configures it (a benchmark's or a user's variant)."""
    from google.protobuf.json_format import MessageToDict

    from phoenix.ops.configs import ConfigError, model_config, read_config
    from phoenix.ops.profiles import profile
    from phoenix.schema.served import contract
    from phoenix.stub.services.common import ServiceSettings, config_parameters

    if repository is None:
        message = model_config(contract(model), profile(device))
    else:
        path = repository / model / "config.pbtxt"
        try:
            message = read_config(path)
        except OSError as error:
            raise CompileError(f"{path}: cannot be read ({error.strerror})") from None
        except ConfigError as error:
            raise CompileError(str(error)) from None
    config = MessageToDict(message, preserving_proto_field_name=True)
    max_batch_size = int(config.get("max_batch_size") or 1)
    return ServiceSettings.parsed(model, artifact_dir, max_batch_size, config_parameters(config))


def profile_digest(
    artifact_dir: Path, device: str, models: Sequence[str], repository: Path | None = None
) -> str:
    """What a complete build covers: each model's settings under the profile (or the
    repository's)."""
    settings = {m: service_settings(m, artifact_dir, device, repository) for m in models}
    text = json.dumps(
        {m: [s.max_batch_size, sorted(s.parameter_texts.items())] for m, s in settings.items()},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_programs(
    artifact_dir: Path, device: str, models: Sequence[str], store, repository: Path | None = None
) -> list[dict]:
    """Warm up each model's service against ``store``: one summary row per model."""
    from tqdm import tqdm

    from phoenix.stub.services.catalog import build_service

    rows = []
    with tqdm(desc="programs", unit=" program", file=sys.stderr) as bar:
        store.report = lambda how: bar.update()
        for model in models:
            bar.set_description(model)
            started, before = time.perf_counter(), dict(store.counts)
            build_service(service_settings(model, artifact_dir, device, repository)).warm_up()
            done = {how: store.counts[how] - before[how] for how in before}
            rows.append({"model": model, **done, "seconds": time.perf_counter() - started})
    store.report = None
    return rows


def ensure_programs(
    artifacts: Path,
    device: str,
    repository: Path | None = None,
    models: Sequence[str] | None = None,
) -> None:
    """Build what the store lacks before a server starts (a second or so when it is complete),
    in a process of its own: JAX is not loaded in the launcher. With ``repository``, the
    programs its configs ask for (of ``models``, or every served model it holds): one process
    compiles them, where each instance of each model would compile them all at once."""
    command = [sys.executable, "-m", "phoenix.ops.compile", "--artifacts", str(artifacts)]
    if repository is not None:
        command += ["--model-repository", str(repository)]
    if models is not None:
        command += ["--models", ",".join(models)]
    if subprocess.run([*command, "--device", device]).returncode != 0:
        raise CompileError(f"compiling the programs of {artifacts} failed (see above)")


def parse_args(argv: Sequence[str] | None):
    from phoenix.stub.services.catalog import SERVED_BY_SERVICES

    parser = command_parser(
        command_name("phoenix.ops.compile"),
        "Compile every served model's programs once into the store beside the artifacts "
        "(<artifacts>/compiled/, or $PHOENIX_PROGRAM_STORE); model instances then load them.",
    )
    add = parser.add_argument
    add("--artifacts", type=Path, default=Path("artifacts/demo"), help="artifacts (%(default)s)")
    add("--device", choices=DEVICES, default="cpu", help="profile and device (%(default)s)")
    parser.add_argument(
        "--models",
        default=",".join(SERVED_BY_SERVICES),
        help="comma-separated served models (%(default)s)",
    )
    add("--model-repository", type=Path, metavar="DIR",
        help="compile for the model configs of this repository (a variant phoenix-serve "
        "--model-repository serves, a benchmark's) instead of the --device profile's; "
        "--models defaults to the served models it holds")  # fmt: skip
    add("--force", action="store_true", help="load or compile every program, even if built")
    args = parser.parse_args(argv)
    if args.model_repository is not None:
        if not args.model_repository.is_dir():
            parser.error(f"--model-repository {args.model_repository}: not a folder")
        if args.models == parser.get_default("models"):  # not given: the repository's models
            held = [m for m in SERVED_BY_SERVICES
                    if (args.model_repository / m / "config.pbtxt").is_file()]  # fmt: skip
            args.models = ",".join(held)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(SERVED_BY_SERVICES))
    if unknown:
        parser.error(f"unknown models {unknown}; served models: {sorted(SERVED_BY_SERVICES)}")
    if not (args.artifacts / "config.json").is_file():
        parser.error(f"{args.artifacts} has no config.json (make artifacts?)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from phoenix.stub.triton_adapter import configure_jax_environment

    configure_jax_environment("GPU" if args.device == "gpu" else "CPU", "0")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import jax

    if args.device == "gpu" and jax.default_backend() == "cpu":  # the stubs will run so too
        print("warning: --device gpu, but JAX sees no GPU: compiling for the CPU", file=sys.stderr)
    from phoenix.engine.programs import STORE_ENV, ProgramStore

    started = time.perf_counter()
    artifacts = args.artifacts.resolve()
    store = ProgramStore.beside(artifacts)
    # A build makes every entry it finds, whatever $PHOENIX_PROGRAM_LOADING says: an entry XLA
    # refuses is compiled and stored again here, not on a request (the services share the store)
    store.first_use = False
    variant = "" if args.model_repository is None else "-" + hashlib.sha256(
        str(args.model_repository.resolve()).encode()).hexdigest()[:8]  # fmt: skip
    built = store.directory / f"built-{args.device}{variant}.json"  # the last complete build
    try:
        digest = profile_digest(artifacts, args.device, args.models, args.model_repository)
    except CompileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.force and built.is_file() and built.read_text() == digest:
        print(f"programs up to date in {store.directory}")
        return 0
    if not store.writable:  # compiling here would be lost: the instances compile for themselves
        print(f"warning: {store.directory} cannot be written; set ${STORE_ENV} to a writable "
              "directory so that the programs are built once", file=sys.stderr)  # fmt: skip
        return 0
    rows = build_programs(artifacts, args.device, args.models, store, args.model_repository)
    for row in rows:
        print(
            f"{row['model']:<16} {row['loaded']:>3} loaded  {row['compiled']:>3} compiled  "
            f"{row['seconds']:6.1f} s"
        )
    seconds = time.perf_counter() - started
    print(f"programs ready in {seconds:.1f} s, stored in {store.directory}")
    if store.writable:
        built.write_text(digest)
        for stale in store.stale_siblings():
            shutil.rmtree(stale, ignore_errors=True)
            print(f"removed {stale}: built for another JAX, model code or config")
    return 0


if __name__ == "__main__":
    sys.exit(main())
