"""resolve_suggest: where in a package a (missing) name is defined at top level."""

from __future__ import annotations

from tests.resolver_lib import lib  # noqa: F401  (fixture)


def test_find_definitions_confirms_top_level_bindings_only(lib):
    r = lib({"p/__init__.py": "", "p/new/__init__.py": "", "p/new/home.py": "def moved(a): pass\n",
             "p/alias.py": "moved = None\n", "p/mention.py": "# moved is mentioned here\nx = 'moved'\n",
             "p/method.py": "class K:\n    def moved(self): pass\n",
             "p/imported.py": "from p.new.home import moved\n"})
    assert sorted(r.find_definitions("p", "moved")) == ["p.alias", "p.new.home"]
    assert r.find_definitions("p", "absent") == []
    assert r.find_definitions("nopackage", "moved") == []


def test_find_definitions_limit_bounds_the_files_parsed(lib):
    files = {"p/__init__.py": ""}
    files.update({f"p/m{i}.py": "def target(): pass\n" for i in range(5)})
    r = lib(files)
    assert len(r.find_definitions("p", "target")) == 5
    assert len(r.find_definitions("p", "target", limit=1)) == 2     # stops after the limit is exceeded
