"""The examples and the demo CLI run and show what they claim to show."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from taskflow import ResultState, UpstreamFailedError
from taskflow.cli import main as cli_main
from taskflow.cli.demo import NODE_NAMES

ROOT = Path(__file__).resolve().parents[2]
SPEED_UP = re.compile(
    r"taskflow \d+\.\d ms, hand-written stages \d+\.\d ms: taskflow took \d+\.\d ms (less|more)"
)
CLI_TIMEOUT = 60.0  # seconds a CLI subprocess may take before the test gives up on it


@cache
def example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` once (the examples folder is not a package)."""
    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"examples_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "taskflow", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=ROOT,
        env=env,
        check=False,
    )


def cause_chain(exc: BaseException | None) -> list[BaseException]:
    chain = []
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__
    return chain


# -- examples -----------------------------------------------------------------------------------


def test_article_flow_runs_figure_7_in_dependency_order(capsys: pytest.CaptureFixture[str]) -> None:
    result = example("article_flow").main()

    assert result.ok
    assert set(result) == {"Node1", "Node2", "Node3", "Node4", "Node5"}
    wr = {name: node.work_result for name, node in result.items()}
    for father, son in [
        ("Node1", "Node2"),
        ("Node1", "Node3"),
        ("Node3", "Node4"),
        ("Node2", "Node5"),
        ("Node4", "Node5"),
    ]:
        assert wr[son].started_at >= wr[father].finished_at, f"{son} started before {father} ended"
    page = result.outputs["Node5"]
    assert page["rating"] == 4.8 and page["price"]["price"] == 79.0 and page["user"] == "u-7"
    assert 0 < page["budget_left_s"] <= 5.0
    out = capsys.readouterr().out
    assert out.count("on_success") == 5 and "on_fail" not in out


def test_product_detail_runs_both_sides_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    result = example("product_detail").main("sku-10086")

    assert result.ok
    page = result.outputs["aggregate"]
    assert page["price"] == 79.0 and page["stock"] == 42 and page["category"] == "keyboards"
    assert page["recommendations"] == ["keyboards/sku-10087", "keyboards/sku-10090"]
    # the item side did not wait for the product side, as the hand-written stages would
    assert result["category"].work_result.started_at < result["stock"].work_result.finished_at
    assert "product-detail page for sku-10086" in capsys.readouterr().out


def test_product_detail_graph_is_reused_across_requests(capsys: pytest.CaptureFixture[str]) -> None:
    first = example("product_detail").main("sku-10086")
    second = example("product_detail").main("sku-2")

    assert first.flow_id != second.flow_id
    assert first.outputs["aggregate"]["price"] == 79.0
    assert second.outputs["aggregate"]["price"] == 99.0
    assert second.outputs["aggregate"]["product_info"]["sku"] == "sku-2"


def test_ad_request_aggregates_the_four_enrichments(capsys: pytest.CaptureFixture[str]) -> None:
    ad = example("ad_request")
    result = ad.main()

    assert result.ok
    assert result.outputs["aggregate"] == {
        "request_id": "r-1001",
        "risk": 0.02,
        "bucket": "exp-B",
        "tokens": ["mechanical", "keyboard", "red", "switch"],
        "region": {"country": "CN", "city": "Beijing"},
        "interests": ["gamer", "keyboards", "night-owl"],
    }
    assert "request r-1001: ok=True" in capsys.readouterr().out


def test_ad_request_rejected_traffic_fails_the_enrichments_fast(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ad = example("ad_request")
    result = ad.main(ad.BOT_REQUEST)

    assert not result.ok
    rejection = result["anti_fraud"].work_result
    assert rejection.state is ResultState.EXCEPTION
    assert isinstance(rejection.exception, ad.FraudRejected)
    downstream = [
        "request_colouring",
        "search_tokenising",
        "ip_tokenising",
        "user_profile",
        "aggregate",
    ]
    assert set(result.failed) == {"anti_fraud", *downstream}
    for name in downstream:
        wr = result[name].work_result
        assert wr.state is ResultState.EXCEPTION, name
        assert wr.started_at is None and wr.attempts == 0, f"{name} ran"
        assert isinstance(wr.exception, UpstreamFailedError), name
        assert rejection.exception in cause_chain(wr.exception), name
    out = capsys.readouterr().out
    assert "request r-1002: ok=False" in out and "not run" in out


# -- the demo CLI ---------------------------------------------------------------------------------


def test_demo_prints_table_gantt_and_speed_up() -> None:
    proc = run_cli("demo", "--workers", "8", "--timeout", "2")

    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(
        r"^node\s+state\s+thread\s+queued ms\s+started ms\s+duration ms$", out, re.MULTILINE
    )
    for name in NODE_NAMES:
        assert re.search(rf"^{name}\s+SUCCESS\s+demo-\d+_\d+\s", out, re.MULTILINE), name
    assert "gantt" in out
    assert SPEED_UP.search(out), out
    assert "ThreadPool.metrics()" in out and "rejected 0" in out, "the demo shows the pool's metrics"
    assert proc.stderr == "", "the library logged without --verbose"


def test_demo_fail_shows_fail_fast_and_on_fail_hooks() -> None:
    proc = run_cli("demo", "--workers", "8", "--timeout", "2", "--fail", "price")

    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert re.search(r"^on_fail  price: EXCEPTION: DemoFailure", out, re.MULTILINE)
    fail_fast = r"^on_fail  aggregate: EXCEPTION: UpstreamFailedError.*cause: DemoFailure"
    assert re.search(fail_fast, out, re.MULTILINE)
    assert re.search(r"^price\s+EXCEPTION\s", out, re.MULTILINE)
    assert re.search(r"^aggregate\s+EXCEPTION\s+-\s", out, re.MULTILINE), "aggregate ran"
    assert re.search(r"^reviews\s+SUCCESS\s", out, re.MULTILINE)
    assert "failures:" in out and "gantt" in out
    assert not SPEED_UP.search(out)


def test_demo_json_prints_only_the_report() -> None:
    proc = run_cli("demo", "--json", "--timeout", "2", "--fail", "category")

    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    states = {node["name"]: node["state"] for node in report["nodes"]}
    assert states["category"] == "EXCEPTION" and states["product_info"] == "SUCCESS"
    assert "on_fail  category" in proc.stderr


def test_demo_help_lists_the_options() -> None:
    proc = run_cli("demo", "--help")

    assert proc.returncode == 0
    for option in ("--timeout", "--workers", "--fail", "--json", "--verbose"):
        assert option in proc.stdout


def test_demo_unknown_fail_node_exits_2_listing_the_nodes() -> None:
    proc = run_cli("demo", "--fail", "nope")

    assert proc.returncode == 2
    assert "'nope'" in proc.stderr
    for name in NODE_NAMES:
        assert name in proc.stderr
    assert proc.stdout == ""


def test_demo_runs_in_process_and_shuts_its_pool_down(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["demo", "--workers", "2", "--timeout", "2"]) == 0
    assert "gantt" in capsys.readouterr().out


def test_cli_without_command_prints_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main([]) == 2
    assert "demo" in capsys.readouterr().err


def test_demo_rejects_a_bad_worker_count(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["demo", "--workers", "0"])
    assert exit_info.value.code == 2
