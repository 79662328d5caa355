"""A run whose node names, error messages, results and context hold markup, quotes and newlines,
and a checker that a page built from it carries them only as text."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Executor
from html.parser import HTMLParser

from taskflow import FlowResult, FunctionNode, TaskContext, TaskScheduling

SCRIPT = "<script>alert(1)</script>"
# a name that would break out of an attribute, a tag, a Mermaid/DOT label and a Prometheus label
NAME_A = f'a{SCRIPT}"q\'\nline2'
NAME_B = 'b<img src=x onerror="alert(2)">\\'
NAME_C = "c</svg></style>]]>--> %% |x|"
ERROR = f'upstream said {SCRIPT} "quoted" \'single\'\nsecond line <b onmouseover=alert(3)>'
RESULT_MARK = "<script>alert('result')</script>"
SECRET = "secret-token-4b1d"

# every tag the pages are allowed to contain; user data must never add one
PAGE_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "span", "b", "code",
    "div", "svg", "defs", "marker", "path", "a", "rect", "text", "line", "table", "thead",
    "tbody", "tr", "th", "td", "pre", "nav", "ul", "li", "details", "summary",
}


def _ok(ctx: TaskContext, param: object) -> dict[str, str]:
    return {"mark": RESULT_MARK}


def _fail(ctx: TaskContext, param: object) -> None:
    raise ValueError(ERROR)


def hostile_run(executor: Executor) -> FlowResult:
    """a -> b (ok, result with markup), a -> c (raises an error full of markup)."""
    a = FunctionNode(_ok, name=NAME_A)
    b = FunctionNode(_ok, name=NAME_B)
    c = FunctionNode(_fail, name=NAME_C)
    a >> [b, c]
    ctx = TaskContext()
    ctx["authorization"] = f"Bearer {SECRET}"
    return TaskScheduling.start(a, executor=executor, timeout=30, context=ctx)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.extend(attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> _Tags:
    parser = _Tags()
    parser.feed(page)
    parser.close()
    return parser


def assert_safe_page(page: str, shown: Iterable[str] = ()) -> None:
    """No tag or event attribute came from user data; ``shown`` strings appear as text."""
    parsed = parse(page)
    assert set(parsed.tags) <= PAGE_TAGS, set(parsed.tags) - PAGE_TAGS
    assert "script" not in parsed.tags and "img" not in parsed.tags
    assert not [k for k, _ in parsed.attrs if k.startswith("on")]
    for key, value in parsed.attrs:
        if key in ("href", "src") and value is not None:
            assert value.startswith(("#", "/", "?")), value
    assert "<script" not in page.lower()
    text = "".join(parsed.text)
    for s in shown:
        # text may be cut or have its newlines folded in charts; the table keeps it whole
        assert s in text, s
