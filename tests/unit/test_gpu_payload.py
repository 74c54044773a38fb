"""The GPU payload builder (harness/gpu_payload.py) and the machine set-up it feeds
(gpu_machine.py).

Building the whole payload takes minutes (xz over 100 MiB, pip downloads), so these tests check
its parts on this venv's real files; the whole build is tests/slow/test_gpu_payload_build.py.
"""

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness import gpu_machine as machine
from harness import gpu_payload as payload

SITE = payload.site_packages()
STUB = "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub"


def relative_names(files):
    return {str(path.relative_to(SITE)) for path in files}


def test_server_files_hold_the_server_backend_one_stub_and_libraries():
    names = relative_names(payload.server_files(SITE, "3.12"))
    assert "pytriton/__init__.py" in names
    assert "pytriton/tritonserver/bin/tritonserver" in names
    assert "pytriton/tritonserver/backends/python/libtriton_python.so" in names
    assert STUB in names
    libraries = {Path(n).name for n in names if n.startswith("nvidia_pytriton.libs/")}
    assert any(n.startswith("libcudart-") for n in libraries)
    assert any(n.startswith("libb64-") for n in libraries)
    assert any(n.startswith("libtritonserver-") for n in libraries)


def test_server_files_leave_out_libpython_other_stubs_and_bytecode():
    names = relative_names(payload.server_files(SITE, "3.12"))
    assert not [n for n in names if Path(n).name.startswith("libpython")]
    assert not [n for n in names if "__pycache__" in n]
    stubs = {n.split("/")[3] for n in names if n.startswith(payload.STUBS)}
    assert stubs == {"3.12"}


def test_server_files_name_what_is_missing(tmp_path):
    with pytest.raises(payload.PayloadError, match="nvidia-pytriton"):
        payload.server_files(tmp_path, "3.12")


def test_server_archive_unpacks_into_a_site_packages_with_the_stub_executable(tmp_path):
    files = [SITE / "pytriton/__init__.py", SITE / STUB]
    archive = payload.write_server_archive(files, SITE, tmp_path / "server.tar.xz")
    site = tmp_path / "site"
    site.mkdir()
    present = site / machine.SERVER_MARKER
    present.parent.mkdir(parents=True)
    present.write_text("a server unpacked before")
    assert machine.unpack_server(archive, site) is False  # kept, not unpacked again
    present.unlink()
    assert machine.unpack_server(archive, site) is True
    for path in files:
        assert (site / path.relative_to(SITE)).read_bytes() == path.read_bytes()
    assert os.access(site / STUB, os.X_OK)


def test_wheel_pins_are_this_venvs_versions():
    pins = payload.wheel_pins()
    assert "dm-haiku==0.0.17" in pins
    assert [p.split("==")[0] for p in pins] == list(payload.MACHINE_LACKS)
    with pytest.raises(payload.PayloadError, match="not installed"):
        payload.wheel_pins(["surely-not-a-package-here"])


def test_download_asks_for_binary_wheels_of_the_machines_python(tmp_path):
    command = payload.download_command(["jmp==0.0.4"], tmp_path, "3.12")
    assert command[:4] == [sys.executable, "-m", "pip", "download"]
    for flag in ("--no-deps", "--only-binary=:all:", "--python-version"):
        assert flag in command
    assert command[command.index("--python-version") + 1] == "3.12"
    assert "manylinux_2_28_x86_64" in command and command[-1] == "jmp==0.0.4"


def test_size_check_fails_loudly_over_the_limit(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"\0" * 2**21)
    assert payload.check_size(tmp_path, limit_mib=3) == 2**21
    with pytest.raises(payload.PayloadError, match="over the 1 MiB limit"):
        payload.check_size(tmp_path, limit_mib=1)


def test_the_payload_limit_leaves_room_for_the_tracked_files(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "tracked.bin").write_bytes(b"\1" * 3 * 2**20)
    (tmp_path / "untracked.bin").write_bytes(b"\1" * 2**20)
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.bin"], check=True)
    assert payload.tracked_bytes(tmp_path) == 3 * 2**20
    assert payload.payload_limit_mib(64, tmp_path) == 64 - 3 - payload.MARGIN_MIB
    assert payload.payload_limit_mib(100, tmp_path) == 100 - 3 - payload.MARGIN_MIB
    assert 0 < payload.payload_limit_mib(64) < 64 - payload.MARGIN_MIB  # this checkout's


def test_size_check_without_a_limit_only_measures(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"\0" * 2**21)
    assert payload.check_size(tmp_path, limit_mib=None) == 2**21


def test_the_command_line_carries_more_wheels_and_a_limit_only_when_asked(tmp_path, monkeypatch):
    built = {}

    def fake_build(out, python_version, wheel_cache, limit_mib=None, **options):
        built.update(limit=limit_mib, **options)
        out.mkdir()
        return 0

    monkeypatch.setattr(payload, "build", fake_build)
    assert payload.main(["--out", str(tmp_path / "a")]) == 0
    assert built == {"limit": None, "also": [], "xz_preset": payload.XZ_PRESET, "xrex": None}
    argv = ["--out", str(tmp_path / "b"), "--also", "einops, toolz", "--tree-limit-mib", "64",
            "--xz-preset", "9", "--xrex", str(tmp_path / "x-algorithm" / "phoenix")]  # fmt: skip
    assert payload.main(argv) == 0
    assert built["also"] == ["einops", "toolz"] and built["xz_preset"] == 9
    assert built["limit"] == payload.payload_limit_mib(64)
    assert built["xrex"] == tmp_path / "x-algorithm" / "phoenix"


def test_machine_has_names_are_whole_distribution_names():
    # a wrapped line once split jax-cuda13-plugin into "jax-" and "cuda13-plugin"
    bad = [n for n in payload.MACHINE_HAS if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*[a-z0-9]", n)]
    assert bad == []
    assert {"jax-cuda13-plugin", "lightning-utilities", "mypy-extensions"} <= set(
        payload.MACHINE_HAS
    )


def test_perf_analyzer_wheel_is_taken_from_the_setup_cache(tmp_path):
    with pytest.raises(payload.PayloadError, match="make setup"):
        payload.copy_perf_analyzer_wheel(tmp_path, tmp_path / "out")


def test_the_carried_wheel_holds_perf_analyzer_alone_and_gives_it_back(tmp_path):
    """The wheel's duplicate perf_client and client library stay behind; the machine's set-up
    takes the same binary out of what is carried."""
    source = tmp_path / "cache"
    source.mkdir()
    with zipfile.ZipFile(source / "tritonclient-2.51.0-py3-none-manylinux1_x86_64.whl", "w") as w:
        w.writestr("tritonclient-2.51.0.data/data/bin/perf_analyzer", b"\x7fELF analyzer")
        w.writestr("tritonclient-2.51.0.data/data/bin/perf_client", b"\x7fELF analyzer")
        w.writestr("tritonclient-2.51.0.data/purelib/tritonclient/__init__.py", "")
    carried = payload.copy_perf_analyzer_wheel(source, tmp_path / "payload")
    assert zipfile.ZipFile(carried).namelist() == [
        "tritonclient-2.51.0.data/data/bin/perf_analyzer"
    ]
    binary = machine.install_perf_analyzer(carried.parent, tmp_path / "bin" / "perf_analyzer")
    assert binary.read_bytes() == b"\x7fELF analyzer" and os.access(binary, os.X_OK)


def test_machine_links_perf_analyzers_libraries_to_pytritons_copies(tmp_path):
    links = machine.link_bundled_libraries(SITE, tmp_path)
    assert sorted(link.name for link in links) == ["libb64.so.0d", "libcudart.so.12"]
    assert all(link.resolve().is_file() for link in links)


def test_machine_reads_distribution_names_from_wheel_files():
    wheel = Path("zope_event-6.2-py3-none-any.whl")
    assert machine.distribution_of(wheel) == ("zope-event", "6.2")
    assert machine.installed_version("dm-haiku") == "0.0.17"


def test_perf_analyzer_finds_the_libraries_a_gpu_machine_linked(tmp_path, monkeypatch):
    """Any caller of perf_analyzer (bench_serving too, not only measure.py) gets the links."""
    from harness import perf_analyzer

    monkeypatch.setenv("LD_LIBRARY_PATH", "/already/there")
    monkeypatch.setattr(perf_analyzer, "PERF_ANALYZER_LIBS", tmp_path / "perf_analyzer-libs")
    assert str(tmp_path) not in perf_analyzer.environment()["LD_LIBRARY_PATH"]  # none made
    (tmp_path / "perf_analyzer-libs").mkdir()
    folders = perf_analyzer.environment()["LD_LIBRARY_PATH"].split(os.pathsep)
    assert folders[0] == str(tmp_path / "perf_analyzer-libs") and folders[-1] == "/already/there"


STUB_DISTRIBUTIONS = (
    machine.STUB_IMPORT_CODE
    + """
import importlib.metadata, json
tops = {n.split(".")[0] for n in sys.modules} - set(sys.stdlib_module_names)
owners = importlib.metadata.packages_distributions()
print(json.dumps(sorted({d for t in tops for d in owners.get(t, [])})))
"""
)


def test_every_distribution_the_stubs_import_is_on_the_machine_or_in_the_payload():
    # The H200 call of 2026-11-27 lost its serving steps to hiredis, imported by the
    # user-state stubs and in neither list: every served model failed to load.
    done = subprocess.run(
        [sys.executable, "-c", STUB_DISTRIBUTIONS, *machine.STUB_IMPORTS],
        capture_output=True, text=True, check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    imported = {machine.normalized_name(d) for d in json.loads(done.stdout)}
    # phoenix-serve is the checkout (linked by the set-up); setuptools' import hook is this
    # venv's; CUDA's libraries come with the machine's JAX under other (cu13) names
    imported = {
        d
        for d in imported
        if d not in ("phoenix-serve", "setuptools") and not d.startswith("nvidia-")
    }
    assert imported, "the stubs import no third-party distribution: the probe is broken"
    available = {machine.normalized_name(d) for d in payload.MACHINE_HAS + payload.MACHINE_LACKS}
    assert sorted(imported - available) == []
    assert {"hiredis", "redis", "dm-haiku", "jax", "numpy"} <= imported


def test_set_up_names_a_module_the_stubs_cannot_import(monkeypatch):
    monkeypatch.setattr(machine, "STUB_IMPORTS", ("phoenix.stub.services", "no_such_pkg_x"))
    with pytest.raises(machine.SetupError, match="No module named 'no_such_pkg_x'.*MACHINE_LACKS"):
        machine.check_stub_imports()
    monkeypatch.undo()
    machine.check_stub_imports()  # this venv has everything
