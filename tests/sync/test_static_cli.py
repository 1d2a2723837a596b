"""check-sync's command line: formats (text, json, github, sarif), selection, configuration, discovery, registry."""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest

from fuzz import cli as kvfuzz_cli
from fuzz.sync import cli as sync_cli
from fuzz.sync import static
from fuzz.sync.static import registry

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures", "sync")
BAD_ITEM = os.path.relpath(os.path.join(FIXTURES, "bad_item.py"))
MULTI = os.path.relpath(os.path.join(FIXTURES, "multi_ended"))


def run(argv, capsys) -> tuple[int, str, str]:
    rc = sync_cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------ the kvfuzz subcommand


def test_verbose_is_an_option_of_the_kvfuzz_subcommand(capsys):
    assert kvfuzz_cli.main(["check-sync", "-v", BAD_ITEM]) == 1
    out = capsys.readouterr().out
    assert "free path ItemPool.free: entry point" in out and f"{BAD_ITEM}:16:15: SYNC01 " in out


@pytest.mark.parametrize("argv,message", [
    (["--output-format", "xml"], "invalid choice: 'xml'"),
    (["--select", "SYNC9"], "--select: 'SYNC9' names no rule"),
    (["--ignore", "E501"], "--ignore: 'E501' names no rule"),
    (["--strict", "lazy"], "'lazy' is not an allowed-region kind"),
    (["--explain", "SYNC99"], "'SYNC99' names no rule"),
    (["--config", "/nonexistent/pyproject.toml"], "cannot read"),
])
def test_usage_errors_exit_2_with_a_message_and_no_traceback(argv, message, capsys):
    rc, out, err = run([*argv, BAD_ITEM], capsys)
    assert rc == 2 and message in err and "Traceback" not in err + out


# ------------------------------------------------------------------ selection


def test_select_and_ignore_take_codes_and_prefixes(capsys):
    def codes(*argv):
        rc, out, _ = run([*argv, MULTI], capsys)
        return rc, sorted(set(re.findall(r": (SYNC\d\d) ", out)))

    assert codes() == (1, ["SYNC05", "SYNC08"])
    assert codes("--select", "SYNC08") == (1, ["SYNC08"])
    assert codes("--select", "SYNC0", "--ignore", "SYNC05,sync08") == (0, [])
    assert codes("--ignore", "SYNC05", "--ignore", "SYNC08") == (0, [])
    assert codes("--select", "ALL", "--ignore", "SYNC1") == (1, ["SYNC05", "SYNC08"])


# ------------------------------------------------------------------ json


def test_json_output_carries_findings_chains_and_exemptions(capsys):
    rc, out, _ = run(["--output-format", "json", MULTI], capsys)
    doc = json.loads(out)
    assert rc == 1 and doc["summary"]["findings"] == len(doc["findings"]) == 4
    cross = next(f for f in doc["findings"] if f["path"].endswith("base_allocator.py"))
    assert cross["code"] == "SYNC08" and cross["name"] == "unique"
    assert cross["entry_point"] == "MultiEndedAllocator.free_group_end"
    assert [h["function"] for h in cross["chain"]] == [
        "MultiEndedAllocator.free_group_end", "BasePagedAllocator.free_group_end", "BasePagedAllocator._merge_group"]
    assert {a["exemption"]["kind"] for a in doc["allowed"]} == {"eager", "error-path", "cpu-only"}
    assert all(a["exemption"]["reason"] for a in doc["allowed"])
    files = {f["path"]: f for f in doc["files"]}
    alloc = files[os.path.join(MULTI, "multi_ended_allocator.py")]
    assert {"function": "MultiEndedAllocator.free", "why": "matches root pattern 'free'"} in alloc["entry_points"]
    assert "MultiEndedAllocator.merge_and_sort_free" in alloc["unreached"]
    assert doc["settings"]["roots"] == list(static.DEFAULT_ROOTS) and doc["errors"] == []


# ------------------------------------------------------------------ github


def test_github_format_prints_error_workflow_commands(capsys):
    rc, out, _ = run(["--output-format", "github", MULTI], capsys)
    errors = [line for line in out.splitlines() if line.startswith("::error ")]
    assert rc == 1 and len(errors) == 4
    for line in errors:
        m = re.fullmatch(r"::error file=([^,:]+),line=(\d+),col=(\d+)::(SYNC\d\d) (.+)", line)
        assert m and os.path.exists(m.group(1)) and "[free path: " in m.group(5), line
    assert out.splitlines()[-1].startswith("check-sync: 4 findings")


def test_github_format_escapes_properties_and_data(tmp_path, capsys):
    odd = tmp_path / "odd,name:dir"
    odd.mkdir()
    (odd / "pool.py").write_text("import torch\n\ndef free(pages: torch.Tensor):\n    return f'100% {pages}'\n")
    rc, out, _ = run(["--output-format", "github", str(odd / "pool.py")], capsys)
    (line,) = [line for line in out.splitlines() if line.startswith("::error")]
    assert rc == 1 and "odd%2Cname%3Adir" in line and "odd,name" not in line
    assert line.count("::") == 2  # no stray separator from the path or the message


def test_github_verbose_adds_notices_for_allowed_syncs(capsys):
    rc, out, _ = run(["--output-format", "github", "-v", MULTI], capsys)
    notices = [line for line in out.splitlines() if line.startswith("::notice ")]
    assert rc == 1 and notices and all("allowed SYNC" in n for n in notices)


# ------------------------------------------------------------------ SARIF 2.1.0

# The parts of the SARIF 2.1.0 schema (OASIS) that the log must satisfy: the required
# properties and enumerations of every object kvfuzz writes. A small subset validator
# follows, so the test needs no jsonschema package.
_MSG = {"type": "object", "anyOf": [{"required": ["text"]}, {"required": ["id"]}],
        "properties": {"text": {"type": "string"}}}
_MMS = {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}
_ARTIFACT = {"type": "object", "properties": {"uri": {"type": "string"}, "uriBaseId": {"type": "string"}}}
_REGION = {"type": "object", "anyOf": [{"required": ["startLine"]}, {"required": ["charOffset"]},
                                       {"required": ["byteOffset"]}],
           "properties": {"startLine": {"type": "integer", "minimum": 1},
                          "startColumn": {"type": "integer", "minimum": 1}}}
_PHYS = {"type": "object", "anyOf": [{"required": ["address"]}, {"required": ["artifactLocation"]}],
         "properties": {"artifactLocation": _ARTIFACT, "region": _REGION}}
_LOCATION = {"type": "object", "properties": {"physicalLocation": _PHYS, "message": _MSG}}
_RESULT = {
    "type": "object", "required": ["message"],
    "properties": {
        "ruleId": {"type": "string"}, "ruleIndex": {"type": "integer", "minimum": -1},
        "level": {"enum": ["none", "note", "warning", "error"]}, "message": _MSG,
        "locations": {"type": "array", "items": _LOCATION},
        "codeFlows": {"type": "array", "items": {
            "type": "object", "required": ["threadFlows"],
            "properties": {"message": _MSG, "threadFlows": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["locations"],
                "properties": {"locations": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "properties": {"location": _LOCATION}}}}}}}}},
        "suppressions": {"type": "array", "items": {
            "type": "object", "required": ["kind"], "properties": {"kind": {"enum": ["inSource", "external"]}}}},
    },
}
_RULE = {"type": "object", "required": ["id"],
         "properties": {"id": {"type": "string"}, "shortDescription": _MMS, "fullDescription": _MMS, "help": _MMS}}
SARIF_REQUIRED = {
    "type": "object", "required": ["version", "runs"],
    "properties": {
        "version": {"enum": ["2.1.0"]},
        "runs": {"type": "array", "items": {
            "type": "object", "required": ["tool"],
            "properties": {
                "tool": {"type": "object", "required": ["driver"], "properties": {"driver": {
                    "type": "object", "required": ["name"],
                    "properties": {"name": {"type": "string"}, "rules": {"type": "array", "items": _RULE}}}}},
                "results": {"type": "array", "items": _RESULT},
                "invocations": {"type": "array", "items": {
                    "type": "object", "required": ["executionSuccessful"],
                    "properties": {"executionSuccessful": {"type": "boolean"}}}},
                "columnKind": {"enum": ["utf16CodeUnits", "unicodeCodePoints"]},
                "originalUriBaseIds": {"type": "object", "additionalProperties": _ARTIFACT},
            }}},
    },
}
_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool}


def schema_errors(value, schema, where="$") -> list[str]:
    errs = []
    t = schema.get("type")
    if t and not (isinstance(value, _TYPES[t]) and not (t == "integer" and isinstance(value, bool))):
        return [f"{where}: expected {t}"]
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{where}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errs.append(f"{where}: {value} < {schema['minimum']}")
    if isinstance(value, dict):
        errs += [f"{where}: missing {k}" for k in schema.get("required", []) if k not in value]
        if "anyOf" in schema and not any(all(k in value for k in alt["required"]) for alt in schema["anyOf"]):
            errs.append(f"{where}: none of {schema['anyOf']}")
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                errs += schema_errors(value[k], sub, f"{where}.{k}")
        extra = schema.get("additionalProperties")
        if extra:
            errs += [e for k, v in value.items() if k not in schema.get("properties", {})
                     for e in schema_errors(v, extra, f"{where}.{k}")]
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errs.append(f"{where}: fewer than {schema['minItems']} items")
        for i, item in enumerate(value):
            errs += schema_errors(item, schema.get("items", {}), f"{where}[{i}]")
    return errs


def test_the_schema_subset_validator_rejects_what_it_must():
    good = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": [
        {"message": {"text": "m"}, "locations": [{"physicalLocation": {"artifactLocation": {"uri": "a.py"},
                                                                       "region": {"startLine": 1}}}]}]}]}
    assert schema_errors(good, SARIF_REQUIRED) == []
    for broken in ({"runs": []}, {"version": "2.0.0", "runs": []}, {"version": "2.1.0", "runs": [{}]},
                   {"version": "2.1.0", "runs": [{"tool": {"driver": {}}}]},
                   {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": [{"level": "error"}]}]},
                   {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": [
                       {"message": {"text": "m"}, "locations": [{"physicalLocation": {"region": {"startLine": 0}}}]}]}]}):
        assert schema_errors(broken, SARIF_REQUIRED), broken


def test_sarif_output_satisfies_the_schema_and_keeps_chains_and_suppressions(capsys):
    rc, out, _ = run(["--output-format", "sarif", MULTI], capsys)
    log = json.loads(out)
    assert rc == 1 and schema_errors(log, SARIF_REQUIRED) == []
    (sarif_run,) = log["runs"]
    rules = sarif_run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(registry.all_rules())
    results = sarif_run["results"]
    live = [r for r in results if "suppressions" not in r]
    assert len(live) == 4 and {r["ruleId"] for r in live} == {"SYNC05", "SYNC08"}
    srcroot = _base_dir(sarif_run)
    for r in results:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        loc = r["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
        assert os.path.exists(os.path.join(srcroot, loc["artifactLocation"]["uri"]))
    cross = next(r for r in live if "base_allocator" in r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"])
    hops = [h["location"]["message"]["text"] for h in cross["codeFlows"][0]["threadFlows"][0]["locations"]]
    assert hops[0] == "MultiEndedAllocator.free_group_end" and hops[-1] == "SYNC08"
    assert {r["suppressions"][0]["justification"].split(":")[0] for r in results if "suppressions" in r} == {
        "eager", "error-path", "cpu-only"}


def _base_dir(sarif_run: dict) -> str:
    from urllib.parse import unquote, urlparse

    base = sarif_run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
    assert base.startswith("file:///") and base.endswith("/")
    return unquote(urlparse(base).path)


def _artifacts(node):
    """Every artifactLocation in a SARIF log."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "artifactLocation":
                yield value
            else:
                yield from _artifacts(value)
    elif isinstance(node, list):
        for value in node:
            yield from _artifacts(value)


def _sarif_tree(tmp_path) -> str:
    pkg = tmp_path / "src" / "my pool"
    pkg.mkdir(parents=True)
    (pkg / "helpers.py").write_text("import torch\n\ndef count(pages: torch.Tensor):\n    return pages.max().item()\n")
    (pkg / "pool.py").write_text("import torch\nfrom helpers import count\n\n"
                                 "def free(pages: torch.Tensor):\n    return count(pages)\n")
    return str(pkg)


@pytest.mark.parametrize("how", ["absolute", "relative", "from-a-subdirectory"])
def test_sarif_uris_are_relative_to_the_source_root(tmp_path, monkeypatch, capsys, how):
    """Absolute or relative on the command line, from the checkout's top or below it: %SRCROOT%-relative URIs."""
    pkg = _sarif_tree(tmp_path)
    (tmp_path / ".git").mkdir()  # the top of a checkout
    if how == "from-a-subdirectory":
        monkeypatch.chdir(tmp_path / "src")
        arg = "my pool"
    else:
        monkeypatch.chdir(tmp_path)
        arg = pkg if how == "absolute" else os.path.join("src", "my pool")
    rc, out, _ = run(["--output-format", "sarif", arg], capsys)
    log = json.loads(out)
    assert rc == 1 and schema_errors(log, SARIF_REQUIRED) == []
    (sarif_run,) = log["runs"]
    assert os.path.samefile(_base_dir(sarif_run), tmp_path)
    locations = list(_artifacts(log))
    assert len(locations) == 4  # the result, and the three hops of its code flow (free, count, the finding)
    assert {(a["uri"], a["uriBaseId"]) for a in locations} == {
        ("src/my%20pool/helpers.py", "%SRCROOT%"), ("src/my%20pool/pool.py", "%SRCROOT%")}


def test_the_source_root_is_the_top_of_the_checkout_else_the_working_directory(tmp_path):
    pkg = _sarif_tree(tmp_path)
    if static.output.source_root(str(tmp_path)) != str(tmp_path):
        pytest.skip("the temporary directory is inside a git checkout")
    assert static.output.source_root(pkg) == pkg
    (tmp_path / ".git").write_text("gitdir: elsewhere\n")  # a worktree's .git is a file
    assert static.output.source_root(pkg) == str(tmp_path)


def test_a_sarif_artifact_outside_the_source_root_gets_an_absolute_uri(tmp_path, capsys):
    pkg = _sarif_tree(tmp_path)
    root = tmp_path / "elsewhere"
    root.mkdir()
    log = json.loads(static.output.render_sarif(static.check_paths([os.path.join(pkg, "pool.py")]), root=str(root)))
    for a in _artifacts(log):
        assert "uriBaseId" not in a and a["uri"].startswith("file:///") and a["uri"].endswith(".py")


def test_sarif_marks_a_pragma_as_an_in_source_suppression_and_reports_unreadable_files(tmp_path, capsys):
    ok = tmp_path / "pool.py"
    ok.write_text("import torch\n\ndef free(pages: torch.Tensor):\n    return pages.tolist()  # sync-ok: tracing\n")
    rc, out, _ = run(["--output-format", "sarif", str(ok), str(tmp_path / "missing.py")], capsys)
    log = json.loads(out)
    assert rc == 2 and schema_errors(log, SARIF_REQUIRED) == []
    (res,) = log["runs"][0]["results"]
    assert res["suppressions"] == [{"kind": "inSource", "justification": "pragma: `# sync-ok: tracing`"}]
    (inv,) = log["runs"][0]["invocations"]
    assert inv["executionSuccessful"] is False and "cannot read" in inv["toolExecutionNotifications"][0]["message"]["text"]


# ------------------------------------------------------------------ discovery


def _tree(tmp_path) -> str:
    bad = "import torch\n\ndef free(pages: torch.Tensor):\n    return pages.tolist()\n"
    for rel in ("src/pool.py", "src/tests/test_pool.py", "src/fixtures/fake.py", "src/conftest.py",
                "src/pool_test.py", "src/.hidden/x.py", "src/venv/pyvenv.cfg", "src/venv/lib.py", "src/legacy/old.py"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(bad if rel.endswith(".py") else "")
    return str(tmp_path / "src")


def test_tests_fixtures_and_environments_are_skipped_under_a_directory(tmp_path, capsys):
    src = _tree(tmp_path)
    rc, out, _ = run([src], capsys)
    assert rc == 1 and sorted(re.findall(r"^(\S+?):\d+:", out, re.M)) == [
        os.path.join(src, "legacy", "old.py"), os.path.join(src, "pool.py")]
    rc, out, _ = run(["--exclude", "legacy/*", src], capsys)
    assert re.findall(r"^(\S+?):\d+:", out, re.M) == [os.path.join(src, "pool.py")]
    rc, out, _ = run(["--include-tests", src], capsys)
    assert out.count(": SYNC02 ") == 6  # tests, fixtures, conftest, *_test, legacy, pool; never .hidden or venv
    rc, out, _ = run([os.path.join(src, "tests", "test_pool.py")], capsys)  # named explicitly: checked
    assert rc == 1 and out.count(": SYNC02 ") == 1
    rc, out, _ = run([os.path.join(src, "pool.py"), src], capsys)  # given twice: checked once
    assert out.count(": SYNC02 ") == 2 and " in 2 file(s)" in out


# ------------------------------------------------------------------ configuration


def _project(tmp_path, section: str) -> str:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n\n[tool.kvfuzz.check-sync]\n" + textwrap.dedent(section))
    pkg = tmp_path / "pool"
    pkg.mkdir()
    (pkg / "alloc.py").write_text(textwrap.dedent("""
        import torch

        class Pool:
            def release_req(self, pages: torch.Tensor):
                self.v2p.index_fill_(0, pages, -1)
                print(f"released {pages}")

            def free(self, pages: torch.Tensor):
                if pages.numel() > 4:
                    raise ValueError(pages.tolist())
    """))
    return str(pkg)


def test_pyproject_section_sets_entry_points_selection_strictness_and_paths(tmp_path, capsys, monkeypatch):
    pkg = _project(tmp_path, """
        paths = ["pool"]
        extend-roots = ["release_*"]
        strict = ["error-path"]
        ignore = ["SYNC19"]
    """)
    rc, out, _ = run([pkg], capsys)
    assert rc == 1 and re.findall(r": (SYNC\d\d) ", out) == ["SYNC02"]  # strict error path; SYNC19 ignored
    rc, out, _ = run(["--ignore", "SYNC02", "-v", pkg], capsys)
    assert rc == 0 and "free path Pool.release_req: entry point, matches root pattern 'release_*'" in out
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run([], capsys)  # no PATH: the configured paths
    assert rc == 1 and out.splitlines()[-1].startswith("check-sync: 1 finding in 1 file(s)")


def test_roots_in_the_config_replace_the_defaults_and_root_adds(tmp_path, capsys):
    pkg = _project(tmp_path, 'roots = ["release_req"]\noutput-format = "json"\n')
    rc, out, _ = run([pkg], capsys)
    doc = json.loads(out)
    assert doc["settings"]["roots"] == ["release_req"] and doc["settings"]["config"].endswith("pyproject.toml")
    assert [f["code"] for f in doc["findings"]] == ["SYNC19"]
    rc, out, _ = run(["--root", "free", "--output-format", "text", "-v", pkg], capsys)
    assert "free path Pool.free: entry point" in out


@pytest.mark.parametrize("section,message", [
    ("rootz = ['free']\n", "unknown key(s) rootz"),
    ("roots = 'free'\n", "roots must be a list of strings"),
    ("strict = ['sometimes']\n", "'sometimes' is not an allowed-region kind"),
    ("include-tests = 'yes'\n", "include-tests must be true or false"),
    ("output-format = 'xml'\n", "output-format must be one of"),
    ("roots = [\n", "not valid TOML"),
])
def test_a_bad_config_is_a_usage_error(tmp_path, capsys, section, message):
    pkg = _project(tmp_path, section)
    rc, out, err = run([pkg], capsys)
    assert rc == 2 and message in err and "Traceback" not in err


# ------------------------------------------------------------------ one rule registry


def _free_body(line: str) -> str:
    return ("import torch\n\nclass Pool:\n    def free(self, pages: torch.Tensor):\n"
            + textwrap.indent(line, " " * 8) + "\n")


@pytest.mark.parametrize("rule", list(registry.all_rules().values()), ids=lambda r: r.code)
def test_every_rule_example_is_reported_and_its_alternative_is_not(rule):
    plan = static.check_source(_free_body(rule.example), "m.py")
    assert rule.code in [f.code for f in plan.findings], rule.example
    if rule.instead:
        assert static.check_source(_free_body(rule.instead), "m.py").findings == [], rule.instead


def test_rules_are_records_with_unique_codes_and_names_in_one_family_each():
    rules = registry.all_rules()
    assert list(rules) == [f"SYNC{i:02d}" for i in range(21)]
    assert len({r.name for r in rules.values()}) == len(rules)
    assert sum(len(f.rules) for f in registry.families()) == len(rules)
    for r in rules.values():
        assert r.why and r.forms and re.fullmatch(r"[a-z0-9-]+", r.name)
        assert r.render("X") != r.message or "{form}" not in r.message


def test_the_docs_table_and_help_are_generated_from_the_registry(capsys):
    doc = open(os.path.join(REPO, "docs", "check-sync.md")).read()
    table = doc.split("<!-- rules:begin -->\n", 1)[1].split("\n<!-- rules:end -->", 1)[0]
    assert table == registry.markdown_table(), "regenerate with: kvfuzz check-sync --list-rules markdown"
    with pytest.raises(SystemExit):
        kvfuzz_cli.main(["check-sync", "--help"])
    help_text = capsys.readouterr().out
    for r in registry.all_rules().values():
        assert f"{r.code} {r.name}" in help_text
    assert sync_cli.main(["--list-rules", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["code"] for r in listed] == list(registry.all_rules())


def test_the_pre_commit_hook_runs_this_command(capsys):
    text = open(os.path.join(REPO, ".pre-commit-hooks.yaml")).read()
    fields = dict(re.findall(r"^\s*-?\s*(\w+): (.+)$", text, re.M))
    assert fields["id"] == "kvfuzz-check-sync" and fields["language"] == "system"
    assert fields["pass_filenames"] == "false" and fields["types"] == "[python]"
    command = fields["entry"].split()
    assert command[:2] == ["kvfuzz", "check-sync"]
    assert kvfuzz_cli.main(command[1:]) == 0  # with no path, in this repository: our allocator, clean
    assert capsys.readouterr().out.startswith("check-sync: 0 findings")


def test_a_walk_cut_short_says_so(monkeypatch, capsys):
    from fuzz.sync.static import reach

    monkeypatch.setattr(reach, "MAX_VISITS", 3)
    rc, out, _ = run([MULTI], capsys)
    assert out.splitlines()[-1].endswith("stopped after 3 function visits (some calls were not followed)")
    monkeypatch.undo()
    rc, out, _ = run([MULTI], capsys)
    assert "stopped after" not in out


def test_columns_count_characters_not_bytes():
    src = "import torch\n\ndef free(pages: torch.Tensor):\n    é = 'ü'; x = pages.tolist()\n"
    (f,) = static.check_source(src, "m.py").findings
    line = src.splitlines()[3]
    assert (f.line, f.col) == (4, line.index("pages") + 1) == (4, 18)  # UTF-8 byte offsets would say 20
