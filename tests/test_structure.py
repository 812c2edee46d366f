"""The package's shape: no import cycle, a fast --help that imports no torch, names the CLI spells equal to
the library's, and `python -m overlapdecode`."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import subprocess
import sys
import time

import overlapdecode

PKG_DIR = os.path.dirname(overlapdecode.__file__)


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages([PKG_DIR], "overlapdecode."))


def _resolve(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def import_graph(local: bool = False) -> dict[str, set[str]]:
    """module -> the package modules it imports at its top level; with `local`, also those imported inside
    functions (which run only when the function does: not edges of the import-time graph)."""
    mods = set(_modules()) | {"overlapdecode"}
    graph = {}
    for mod in mods:
        spec = importlib.util.find_spec(mod)
        is_pkg = spec.submodule_search_locations is not None
        with open(spec.origin) as f:
            tree = ast.parse(f.read())
        edges = set()
        for node in ast.walk(tree) if local else tree.body:
            if isinstance(node, ast.ImportFrom):
                target = _resolve(mod, is_pkg, node.level, node.module) if node.level else node.module
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    edges.add(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
        # importing a.b.c from outside the package a.b runs a.b's __init__ first: an edge to it too
        parents = {".".join(e.split(".")[:i]) for e in edges for i in range(2, e.count(".") + 1)}
        edges |= {p for p in parents if not mod.startswith(p + ".")}
        graph[mod] = {e for e in edges if e in mods and e != mod}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_every_module_imports_and_there_is_no_import_cycle():
    for mod in _modules():
        importlib.import_module(mod)
    graph = import_graph()
    assert (
        "overlapdecode.bench.report.results" in graph["overlapdecode.bench.report.report"]
    )  # the walk sees relative imports
    assert find_cycle(graph) is None, find_cycle(graph)


def test_no_cycle_even_through_function_local_imports():
    graph = import_graph(local=True)
    assert "overlapdecode.fused.model" in graph["overlapdecode.fused.path"]  # the walk sees imports in functions
    assert find_cycle(graph) is None, find_cycle(graph)


def test_no_library_module_imports_the_command_line():
    """The command line (cli/, __main__.py: argparse, one-line errors, exit codes) stands above the library and the
    bench: no other module imports one of its modules."""
    graph = import_graph(local=True)
    assert "overlapdecode.cli.args" in graph["overlapdecode.cli.commands"]  # the walk sees them
    cli = {m for m in graph if m == "overlapdecode.__main__" or m.split(".")[:2] == ["overlapdecode", "cli"]}
    assert "overlapdecode.cli.bench" in cli
    for mod, edges in sorted(graph.items()):
        if mod not in cli:
            assert not edges & cli, (mod, sorted(edges & cli))


def test_the_decoder_imports_no_fused_module():
    """The decode loop sees the fused path through its step objects only: decode.py and loop/ import nothing of
    fused/ but fused/path.py, which imports the rest of fused/ (Triton) when a fused call first runs."""
    graph = import_graph(local=True)
    loop = [m for m in graph if m.startswith("overlapdecode.loop")]
    for mod in ["overlapdecode.decode", *loop]:
        fused = {e for e in graph[mod] if e.split(".")[:2] == ["overlapdecode", "fused"]}
        assert fused <= {"overlapdecode.fused", "overlapdecode.fused.path"}, (mod, fused)
    assert "overlapdecode.fused.path" in graph["overlapdecode.decode"]
    top = import_graph()
    assert {e for e in top["overlapdecode.fused.path"] if e.startswith("overlapdecode.fused.")} == set()
    done = _run(
        "import sys, overlapdecode.decode; print(sorted(m for m in sys.modules if m.startswith('overlapdecode.fused.')))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['overlapdecode.fused.path']"


# The floors of the package, top down: a module imports only modules of its own folder or of a lower floor.
# __main__ > cli/ > bench/ > bench/report/ > __init__ (the public names) > decode.py and facts.py > plan.py and
# fused/ > loop/ > spec/ > hf/, models/ and fused/kernels/ > quant/ > the request (inputs, sampling, strategy) and
# tp/.
FLOORS = {
    "__main__": 11,
    "cli": 10,
    "bench": 9,
    "bench.report": 8,
    "__init__": 7,
    "decode": 6,
    "facts": 6,
    "plan": 5,
    "fused": 5,
    "loop": 4,
    "spec": 3,
    "hf": 2,
    "models": 2,
    "fused.kernels": 2,
    "quant": 1,
    "inputs": 0,
    "sampling": 0,
    "strategy": 0,
    "tp": 0,
}


def _room(module: str) -> str:
    parts = module.split(".")[1:] or ["__init__"]
    if parts[:2] in (["fused", "kernels"], ["bench", "report"]):
        return ".".join(parts[:2])
    return parts[0]


def test_every_import_goes_down_a_floor_or_stays_in_its_folder():
    graph = import_graph(local=True)
    assert {_room(m) for m in graph} == set(FLOORS)  # every folder and root module has its floor
    up = [
        (mod, e)
        for mod, edges in graph.items()
        for e in edges
        if _room(e) != _room(mod) and FLOORS[_room(e)] >= FLOORS[_room(mod)]
    ]
    assert up == [], up


def test_the_kernels_import_only_the_token_choice_from_above_them():
    """fused/kernels/ imports nothing of the loop, the fused path or the adapters: only sampling.py (the torch
    choice its greedy and sampled kernels are checked against) and quant/packed.py (the packed weights it reads)."""
    graph = import_graph(local=True)
    kernels = [m for m in graph if _room(m) == "fused.kernels"]
    assert len(kernels) > 5
    for mod in kernels:
        outside = {e for e in graph[mod] if _room(e) != "fused.kernels"}
        allowed = {"overlapdecode.sampling", "overlapdecode.quant", "overlapdecode.quant.packed", "overlapdecode.fused"}
        assert outside <= allowed, (mod, outside)


def test_the_package_root_holds_at_most_eight_modules():
    root = sorted(
        m for m in _modules() if m.count(".") == 1 and not importlib.util.find_spec(m).submodule_search_locations
    )
    assert len(root) <= 8, root


def test_every_module_says_why_it_exists_and_reads_in_one_go():
    """A docstring per module, and no file a reader cannot take in at one sitting: 500 lines at most, 700 for a
    kernel file (a kernel, its wrapper and its torch twin)."""
    for mod in [*_modules(), "overlapdecode"]:
        path = importlib.util.find_spec(mod).origin
        with open(path) as f:
            text = f.read()
        assert ast.get_docstring(ast.parse(text)), mod
        limit = 700 if _room(mod) == "fused.kernels" else 500
        assert text.count("\n") <= limit, (mod, text.count("\n"))


def test_no_test_module_imports_another():
    """Tests share code through tests/support/ only: a test module importing another runs that module's tests'
    imports and fixtures, and ties the two files' names together."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    names = {f[:-3] for _, _, files in os.walk(tests_dir) for f in files if f.endswith(".py")}
    found = []
    for folder, _, files in os.walk(tests_dir):
        for f in files:
            if not f.endswith(".py") or os.path.basename(folder) == "support":
                continue
            tree = ast.parse(open(os.path.join(folder, f)).read())
            for node in ast.walk(tree):
                mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                mods += [a.name for a in node.names] if isinstance(node, ast.Import) else []
                found += [(f, m) for m in mods if m.split(".")[0] in names - {"support"}]
    assert "helpers" in names and found == [], found


def test_no_two_test_modules_share_a_name():
    """The test folders are not packages, so pytest imports each test module by its file name alone: two of one
    name in two folders stop the run ("import file mismatch")."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    seen: dict[str, list[str]] = {}
    for folder, _, files in os.walk(tests_dir):
        for f in files:
            if f.startswith("test_") and f.endswith(".py"):
                seen.setdefault(f, []).append(os.path.relpath(folder, tests_dir))
    assert len(seen) > 50 and {f: d for f, d in seen.items() if len(d) > 1} == {}


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_worker_uses_the_public_api_only():
    with open(os.path.join(PKG_DIR, "bench", "worker.py")) as f:
        tree = ast.parse(f.read())
    internal = {
        (n.module, a.name)
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").startswith("overlapdecode.")
        for a in n.names
    }
    assert internal == set()  # od.decoder_for(model).clear() frees the kept caches between configurations


def test_cli_names_equal_the_librarys():
    from overlapdecode import PRESETS, VARIANTS
    from overlapdecode.bench.peers import PEERS
    from overlapdecode.bench.runner import ALLOCATORS
    from overlapdecode.bench.workloads import WORKLOADS
    from overlapdecode.cli import bench_flags
    from overlapdecode.cli.args import DTYPE_NAMES, LAGGED, PRESET_NAMES, VARIANT_NAMES
    from overlapdecode.models.loading import parse_dtype

    assert PRESET_NAMES == tuple(PRESETS) and VARIANT_NAMES == tuple(VARIANTS)
    assert set(LAGGED) == {n for n, s in {**PRESETS, **VARIANTS}.items() if s.stop_check in ("pingpong", "deferred")}
    assert all(parse_dtype(d) for d in DTYPE_NAMES)
    assert bench_flags.PEER_NAMES == tuple(PEERS) and bench_flags.ALLOCATOR_NAMES == tuple(ALLOCATORS)
    assert bench_flags.WORKLOAD_NAMES == tuple(WORKLOADS)


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_help_imports_no_torch():
    done = _run(
        "import sys, contextlib, io\n"
        "from overlapdecode.cli import main\n"
        "for argv in (['--help'], ['bench', '--help'], ['generate', '--help'], ['profile', '--help'],"
        " ['report', '--help']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_flag_says_what_it_does_and_its_default():
    from overlapdecode.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        help_text = p.format_help()
        for action in p._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, (name, action.dest)
            formatted = p.formatter_class(prog="x")._get_help_string(action) % dict(vars(action), prog="x")
            assert "default" in formatted or "required" in formatted, (name, action.option_strings, formatted)
        if name in ("generate", "bench", "profile"):
            assert "interleaved:2" in help_text and "nocheck" in help_text and "deferred" in help_text


def test_python_dash_m_is_the_command_and_help_is_fast():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "overlapdecode", "bench", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and "--strategies" in done.stdout
    assert time.perf_counter() - start < 3.0  # importing torch alone takes longer than this on the CI machine


def test_generate_has_one_signature_the_decoders():
    """od.generate's arguments are Decoder.generate's after the model (written once), shown by help() with
    their defaults; a wrong argument is a TypeError naming it before any work (the model is not looked at)."""
    import inspect
    import pydoc

    import overlapdecode as od

    ours = inspect.signature(od.generate).parameters
    theirs = inspect.signature(od.Decoder.generate).parameters
    assert list(ours)[0] == "model" and list(ours)[1:] == list(theirs)[1:]
    assert [(p.default, p.kind) for p in list(ours.values())[1:]] == [
        (p.default, p.kind) for p in list(theirs.values())[1:]
    ]
    shown = pydoc.render_doc(od.generate, renderer=pydoc.plaintext)
    assert "generate(model, input_ids, attention_mask=None, max_new_tokens: 'int' = 64, strategy='interleaved'" in shown
    for bad in (dict(bogus=1), dict(max_new_token=4)):
        try:
            od.generate("not a model", [[1, 2]], **bad)
        except TypeError as err:
            assert repr(next(iter(bad))) in str(err), err
        else:
            raise AssertionError(f"{bad} was accepted")
    try:
        od.generate("not a model")
    except TypeError as err:
        assert "'input_ids'" in str(err), err
    else:
        raise AssertionError("a call without input_ids was accepted")


def test_dir_of_the_package_lists_its_exports_not_its_helpers():
    """dir(overlapdecode) showed TYPE_CHECKING, annotations and importlib: the names its __init__ used."""
    names = dir(overlapdecode)
    public = [n for n in names if not n.startswith("_")]
    assert public == sorted(overlapdecode.__all__) and "__version__" in names, public
    assert not {"TYPE_CHECKING", "annotations", "importlib"} & set(names)
    for name in overlapdecode.__all__:  # every export still resolves on first use
        assert getattr(overlapdecode, name) is not None, name
    assert overlapdecode.models.loading.load_model is overlapdecode.load_model  # and a submodule by its name
