"""The command line as a trust boundary: ``run --allow-host/--max-response-bytes`` reach
``conductor.load``, and what the commands print (tables, failures, the JSON report, the verdict,
error messages, ``--verbose`` log lines) cannot carry a terminal escape sequence or a line break
from user data."""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from loguru import logger

from taskflow import FunctionNode, TaskContext, TaskScheduling, cli
from taskflow.cli import _format_failures, format_table
from taskflow.cli.terminal import json_terminal_safe, log_sink, terminal_safe

# an ANSI "clear screen", an OSC title change ended by BEL, a bare CSI (C1), a carriage return
# that would overwrite the line, a right-to-left override and a line break
HOSTILE = "\x1b[2J\x1b]0;pwned\x07 \x9b31m \rfake \u202eevil\nsecond line\x7f"
REF = "ref\x1b[31m\nx"
NAME = "wf\x1b[5m\r"


def printable(text: str, *, newlines: bool = False) -> bool:
    """Every character prints as itself (line breaks only where ``newlines`` allows them)."""
    return all(ch.isprintable() or (newlines and ch == "\n") for ch in text)


# -- the helpers ------------------------------------------------------------------------------


def test_terminal_safe_writes_controls_as_visible_escapes() -> None:
    out = terminal_safe(HOSTILE)
    assert printable(out)
    assert out.startswith("\\x1b[2J\\x1b]0;pwned\\x07 \\x9b31m \\rfake \\u202eevil\\nsecond")
    assert out.endswith("line\\x7f")
    assert terminal_safe("plain text, ünïcode and 価格") == "plain text, ünïcode and 価格"
    assert terminal_safe("a\nb\x1b", keep_newlines=True) == "a\nb\\x1b"
    assert terminal_safe("\U000e0001") == "\\U000e0001"  # a tag character (format, invisible)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8))
def test_json_terminal_safe_keeps_the_value_and_prints_only_printable_text(value: Any) -> None:
    raw = json.dumps(value, ensure_ascii=False, indent=2)
    safe = json_terminal_safe(raw)
    assert printable(safe, newlines=True)
    assert json.loads(safe) == value


# -- the demo's table and failure lines ---------------------------------------------------------


def _ok(ctx: TaskContext, param: object) -> str:
    return "ok"


def _fail(ctx: TaskContext, param: object) -> None:
    raise ValueError(HOSTILE)


class _RawRepr(Exception):
    """An exception whose repr puts the raw escape sequence on the screen."""

    def __repr__(self) -> str:
        return f"RawRepr({HOSTILE})"


def _fail_raw(ctx: TaskContext, param: object) -> None:
    raise _RawRepr("x") from _RawRepr("cause")


def test_the_table_and_failures_print_hostile_names_and_errors_as_text() -> None:
    a = FunctionNode(_ok, name=f"a{HOSTILE}")
    b = FunctionNode(_fail, name="b\x1b[8m")
    c = FunctionNode(_fail_raw, name="価格")  # wide characters keep the columns aligned
    a >> [b, c]
    with ThreadPoolExecutor(2, thread_name_prefix="t\x1b[41m\n") as pool:
        result = TaskScheduling.start(a, executor=pool, timeout=30)
    table = format_table(result)
    assert printable(table, newlines=True)
    lines = table.splitlines()
    assert len(lines) == 2 + 3  # header, rule, one line per node
    rule = lines[1]
    state_column = len(rule.split("  ")[0]) + 2
    for line in lines[2:]:
        name = next(n for n in ("a", "b", "価格") if line.startswith(n))
        prefix, rest = line.split("  ", 1)
        assert prefix.startswith(name)
        # the state starts in the same terminal column on every row
        assert cli._width(line[: line.index(rest.strip()[:4])]) == state_column, line
    assert "\\x1b[2J" in table and "t\\x1b[41m\\n" in table
    failures = _format_failures(result)
    assert printable(failures, newlines=True)
    assert len(failures.splitlines()) == 3  # b; c and its cause
    assert "\\x1b[2J" in failures and "\\u202eevil\\nsecond" in failures


def test_format_metrics_escapes_the_pool_name() -> None:
    from taskflow import ThreadPool

    pool = ThreadPool(1, thread_name_prefix="p")
    try:
        metrics = pool.metrics().model_copy(update={"pool_name": "pool\x1b[2J\n"})
    finally:
        pool.shutdown(wait=True)
    text = cli.format_metrics(metrics)
    assert printable(text, newlines=True) and "pool\\x1b[2J\\n after" in text


def test_log_lines_of_verbose_are_one_escaped_line_each() -> None:
    buf = io.StringIO()
    sink = logger.add(log_sink(buf), level="DEBUG")
    try:
        logger.bind(node=REF).debug("node {} failed: {}", REF, HOSTILE)
        try:
            raise ValueError(HOSTILE)
        except ValueError:
            logger.exception("boom")
    finally:
        logger.remove(sink)
    text = buf.getvalue()
    assert printable(text, newlines=True)
    first = text.splitlines()[0]
    assert "node ref\\x1b[31m\\nx failed: \\x1b[2J" in first and "node='ref\\x1b[31m\\nx'" in first
    assert "Traceback (most recent call last)" in text  # the traceback keeps its lines
    assert "ValueError: \\x1b[2J" in text


# -- graph and run -----------------------------------------------------------------------------


REGISTRY_MODULE = '''
HOSTILE = {hostile!r}


def echo(task_input):
    return {{"v": HOSTILE}}


def boom(task_input):
    raise ValueError(HOSTILE)


REGISTRY = {{"echo": echo, "boom": boom}}
'''


@pytest.fixture
def registry_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "trust_cli_registry.py").write_text(REGISTRY_MODULE.format(hostile=HOSTILE),
                                                    encoding="utf-8")
    monkeypatch.delitem(sys.modules, "trust_cli_registry", raising=False)
    yield tmp_path
    sys.modules.pop("trust_cli_registry", None)


def _write(folder: Path, definition: dict[str, Any], name: str = "wf.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(definition), encoding="utf-8")
    return path


def _simple(ref: str, name: str) -> dict[str, Any]:
    return {"name": name, "taskReferenceName": ref, "type": "SIMPLE", "inputParameters": {}}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str],
         monkeypatch: pytest.MonkeyPatch, argv0: str = "/usr/local/bin/taskflow") -> tuple[
             int, str, str]:
    monkeypatch.setattr(sys, "argv", [argv0, *argv])
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_run_prints_a_report_and_verdict_free_of_escape_sequences(
        registry_dir: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(registry_dir, {"name": NAME, "tasks": [
        _simple(REF, "echo"), _simple(f"{REF}2", "boom")]})
    status, out, err = _run(["run", str(path), "--registry", "trust_cli_registry",
                             "--import-file-dir", "--mermaid"], capsys, monkeypatch)
    assert status == 1
    assert printable(out, newlines=True) and printable(err, newlines=True)
    report, _, mermaid = out.partition("\n}\n")
    nodes = {n["name"]: n for n in json.loads(report + "\n}")["nodes"]}
    assert set(nodes) == {REF, f"{REF}2"}  # the values are intact, only written escaped
    assert HOSTILE in nodes[f"{REF}2"]["error"] and "pwned" in str(nodes[REF]["result"])
    assert mermaid.startswith("flowchart") or "flowchart" in mermaid
    assert err.count("\n") == 1 and err.startswith("wf\\x1b[5m\\r: FAILED in")


def test_errors_name_the_program_as_run_and_escape_the_culprit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    missing = str(tmp_path / "no\x1b[2Jsuch.json")
    status, _, err = _run(["graph", missing], capsys, monkeypatch)
    assert status == 2 and err.startswith("taskflow graph: error: no such file")
    assert printable(err, newlines=True) and "\\x1b[2J" in err and err.count("\n") == 1
    status, _, err = _run(["run", missing, "--registry", "x"], capsys, monkeypatch,
                          argv0="/work/taskflow/__main__.py")
    assert status == 2 and err.startswith("python -m taskflow run: error: no such file")


def test_graph_output_is_printable(registry_dir: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(registry_dir, {"name": NAME, "tasks": [_simple(REF, "echo")]})
    for fmt in ("mermaid", "dot"):
        status, out, _ = _run(["graph", str(path), "--format", fmt], capsys, monkeypatch)
        assert status == 0 and printable(out, newlines=True) and "\x1b" not in out


# -- --allow-host and --max-response-bytes ------------------------------------------------------

BODY = b'{"items": "' + b"x" * 1000 + b'"}'


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, name="trust-cli-http", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def _http(ref: str, uri: str) -> dict[str, Any]:
    return {"name": ref, "taskReferenceName": ref, "type": "HTTP",
            "inputParameters": {"http_request": {"uri": uri, "method": "GET"}}}


def _report(out: str) -> dict[str, Any]:
    return {n["name"]: n for n in json.loads(out)["nodes"]}


def test_allow_host_refuses_other_hosts_without_a_lookup(
        registry_dir: Path, server: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    lookups: list[Any] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        lookups.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    path = _write(registry_dir, {"name": "w", "tasks": [
        _http("local", f"http://{server}/x"), _http("steal", "http://metadata.invalid/creds")]})
    status, out, _ = _run(["run", str(path), "--registry", "trust_cli_registry",
                           "--import-file-dir", "--allow-host", "localhost",
                           "--allow-host", server], capsys, monkeypatch)
    nodes = _report(out)
    assert status == 1
    assert nodes["steal"]["state"] == "EXCEPTION"
    assert "'metadata.invalid:80' refused" in nodes["steal"]["error"]
    assert not any("invalid" in str(h) for h in lookups)
    assert nodes["local"]["state"] == "SUCCESS"  # an allowed host:port is reached


def test_max_response_bytes_caps_http_responses(
        registry_dir: Path, server: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(registry_dir, {"name": "w", "tasks": [_http("get", f"http://{server}/x")]})
    base = ["run", str(path), "--registry", "trust_cli_registry", "--import-file-dir",
            "--allow-host", server]
    status, out, _ = _run([*base, "--max-response-bytes", "100"], capsys, monkeypatch)
    assert status == 1 and "max_response_bytes=100" in _report(out)["get"]["error"]
    status, out, _ = _run([*base, "--max-response-bytes", str(len(BODY))], capsys, monkeypatch)
    assert status == 0 and _report(out)["get"]["state"] == "SUCCESS"
    status, out, _ = _run(base, capsys, monkeypatch)  # default: 10 MiB
    assert status == 0


@pytest.mark.parametrize("bad", [["--allow-host", "http://h/"], ["--allow-host", ""],
                                 ["--allow-host", "a\x1b[2J"], ["--max-response-bytes", "0"]])
def test_bad_limits_are_usage_errors(bad: list[str], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, {"name": "w", "tasks": []})
    with pytest.raises(SystemExit) as exc:
        _run(["run", str(path), "--registry", "x", *bad], capsys, monkeypatch)
    assert exc.value.code == 2
    assert "\x1b" not in capsys.readouterr().err


def test_host_limits_on_a_flow_spec_are_refused(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ntasks:\n  - name: a\n    callable: operator:add\n", encoding="utf-8")
    status, _, err = _run(["run", str(spec), "--allow-host", "127.0.0.1"], capsys, monkeypatch)
    assert status == 2 and "--allow-host and --max-response-bytes are for Conductor" in err


@pytest.mark.parametrize("content", [b"\x7fELF\x02\x01\x01\x00\xd0\xff garbage", b"[" * 50_000],
                         ids=["binary", "deep"])
def test_a_binary_or_deeply_nested_file_is_a_usage_error(
        content: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "definition.json"
    path.write_bytes(content)
    for argv in (["graph", str(path)], ["graph", str(path), "--kind", "conductor"],
                 ["run", str(path), "--registry", "x"]):
        status, _, err = _run(argv, capsys, monkeypatch)
        assert status == 2 and err.startswith(f"taskflow {argv[0]}: error: "), err


@pytest.mark.parametrize("text", ["@no\x00such", "[" * 50_000],
                         ids=["nul-in-path", "deep"])
def test_a_bad_input_is_a_usage_error(text: str, registry_dir: Path,
                                      capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(registry_dir, {"name": "w", "tasks": [_simple("a", "echo")]})
    status, _, err = _run(["run", str(path), "--registry", "trust_cli_registry",
                           "--import-file-dir", "--input", text], capsys, monkeypatch)
    assert status == 2 and "--input" in err and err.startswith("taskflow run: error: "), err
    assert printable(err, newlines=True)
