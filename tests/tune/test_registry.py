"""tune/registry.py: finding the built-in model families, plugin families, and families registered at run time.

Which modules an import loads is measured in fresh interpreters (``sys.modules`` after the import). The tests
that break or add a family work on an emptied registry and put it back afterwards.
"""

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import tune.models
from tests._helpers import BUILT_IN_FAMILIES
from tune import plugins, registry
from tune.registry import (
    ModelFamily,
    family_for_hf_model_type,
    get_model_family,
    list_model_families,
    register_model_family,
)

REPO = Path(__file__).resolve().parents[2]
GOOD_PLUGIN = REPO / "tests" / "assets" / "plugins" / "good"

PROBE = """
import json, sys
from tune.registry import SHARED_COMPONENT_PACKAGES
{code}
print(json.dumps({{
    "families": sorted({{m.split(".")[2] for m in sys.modules
                         if m.startswith("tune.models.") and not m.split(".")[2].startswith("_")}}
                       - SHARED_COMPONENT_PACKAGES),
    "torch": "torch" in sys.modules,
}}))
"""


def _loaded_after(code: str) -> dict:
    """Runs ``code`` in a fresh interpreter; which families (tune.models.<name>) it loaded, and whether torch."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(code=textwrap.dedent(code))],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_importing_one_family_loads_no_other():
    assert _loaded_after("import tune.models.llama2")["families"] == ["llama2"]
    assert _loaded_after("import tune.models.qwen3")["families"] == ["qwen3"]
    # a derived family loads the families whose public __init__ it uses, and nothing else
    assert _loaded_after("import tune.models.llama3_2")["families"] == ["llama2", "llama3", "llama3_2"]


def test_registry_and_models_package_load_no_family_until_asked():
    result = _loaded_after("import tune.registry, tune.models")
    assert result == {"families": [], "torch": False}
    code = """
        import tune.models
        assert callable(tune.models.from_hf) and callable(tune.models.to_hf_state_dict)
        assert tune.models.llama2.llama2_7b.__name__ == "llama2_7b"
        from tune.models import qwen2_5
        assert qwen2_5.qwen2_5_0_5b.__name__ == "qwen2_5_0_5b"
    """
    assert _loaded_after(code)["families"] == ["llama2", "qwen2_5"]


def test_lookup_by_a_family_name_imports_that_family_only():
    code = """
        from tune.registry import get_model_family
        assert get_model_family("LLAMA2").name == "llama2"
    """
    assert _loaded_after(code)["families"] == ["llama2"]
    # an alias is declared inside its family, so finding it imports them all
    code = """
        from tune.registry import get_model_family
        assert get_model_family("PHI3_MINI").name == "phi3"
    """
    assert _loaded_after(code)["families"] == BUILT_IN_FAMILIES


def test_models_package_lists_its_families_and_rejects_other_names():
    # besides the families: the Hugging Face conversions and the any-family scalar-head builders (reward models)
    helpers = {"from_hf", "to_hf_state_dict", "classifier_model", "init_classifier_head"}
    assert set(BUILT_IN_FAMILIES) | helpers == set(tune.models.__all__)
    assert sorted(list_model_families()) == BUILT_IN_FAMILIES
    with pytest.raises(AttributeError, match="has no attribute 'llama9'"):
        tune.models.llama9  # noqa: B018


@pytest.mark.parametrize("name", BUILT_IN_FAMILIES)
def test_each_family_declares_itself_with_builders_it_exports(name):
    package = getattr(tune.models, name)
    family = package.FAMILY
    assert isinstance(family, ModelFamily) and family.name == name
    assert get_model_family(name) is family
    assert family.builders, name
    for builder_name, builder in family.builders.items():
        # derived from the builder modules, every builder is also public API of the family
        assert builder_name in package.__all__ and getattr(package, builder_name) is builder


def test_builders_leave_out_what_a_family_imports():
    # llama3_3's sizes are built with llama3_1's component builder, which stays llama3_1's
    assert set(get_model_family("llama3_3").builders) == {"llama3_3_70b", "lora_llama3_3_70b", "qlora_llama3_3_70b"}
    for family in BUILT_IN_FAMILIES:
        assert not {"build_decoder", "lora_spec"} & set(get_model_family(family).builders)  # tune.models._common


@pytest.fixture
def empty_registry(monkeypatch):
    """The registry as in a fresh process (nothing registered, imported or failed), restored afterwards."""
    monkeypatch.setattr(registry, "_FAMILIES", {})
    monkeypatch.setattr(registry, "_ALIASES", {})
    monkeypatch.setattr(registry, "_imported", set())
    monkeypatch.setattr(registry, "_broken", {})
    monkeypatch.setattr(registry, "_builtins_loaded", False)
    monkeypatch.setattr(registry, "_plugins_loaded", True)  # no installed plugin may change what is listed
    return registry


def test_a_broken_family_warns_naming_itself_and_the_others_keep_working(empty_registry, monkeypatch):
    # `None` in sys.modules makes `import tune.models.gemma2` fail as a broken family would
    monkeypatch.setitem(sys.modules, "tune.models.gemma2", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert get_model_family("llama3_2").name == "llama3_2"  # imports llama3_2 only: nothing to warn about
        assert caught == []
        families = list_model_families()
        assert family_for_hf_model_type("qwen3").name == "qwen3"
        list_model_families()
    assert sorted(families) == [f for f in BUILT_IN_FAMILIES if f != "gemma2"]
    messages = [str(w.message) for w in caught]
    assert messages == [
        "tune model family 'gemma2' (tune.models.gemma2) failed to load and is ignored: ModuleNotFoundError: "
        "import of tune.models.gemma2 halted; None in sys.modules"
    ]
    with pytest.raises(ValueError, match=r"'gemma2' \(tune.models.gemma2\) failed to load: ModuleNotFoundError"):
        get_model_family("GEMMA2")


def test_looking_up_a_broken_family_names_its_error_and_imports_no_other(empty_registry, monkeypatch):
    monkeypatch.setitem(sys.modules, "tune.models.phi3", None)
    with pytest.warns(UserWarning, match=r"^tune model family 'phi3' \(tune.models.phi3\) failed to load"):
        with pytest.raises(ValueError, match=r"'phi3' \(tune.models.phi3\) failed to load: ModuleNotFoundError"):
            get_model_family("phi3")
    assert empty_registry._imported == {"phi3"} and empty_registry._FAMILIES == {}


@pytest.fixture
def extra_families(tmp_path, monkeypatch):
    """Three more subpackages of tune.models, found on a temporary path: a good family and two broken ones."""
    sources = {
        "toyfam": "from tune.registry import ModelFamily\n\n"
        "def toyfam_1b():\n    return 'model'\n\n"
        "FAMILY = ModelFamily(name='toyfam', builders={'toyfam_1b': toyfam_1b}, aliases=('toy',))\n",
        "crashfam": "raise RuntimeError('crashfam is broken on purpose')\n",
        "silentfam": "VALUE = 1  # declares no FAMILY\n",
    }
    for name, source in sources.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(source)
    monkeypatch.setattr(tune.models, "__path__", [*tune.models.__path__, str(tmp_path)])
    yield sorted(sources)
    for name in sources:
        sys.modules.pop(f"tune.models.{name}", None)
        vars(tune.models).pop(name, None)  # not getattr: tune.models.__getattr__ would import it again


def test_a_new_subpackage_is_a_family_without_being_listed_anywhere(empty_registry, extra_families):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert get_model_family("toyfam").builders["toyfam_1b"]() == "model"
        assert caught == []  # a lookup by name imports that family only
        families = list_model_families()
        assert get_model_family("TOY").name == "toyfam"
    assert set(families) == {*BUILT_IN_FAMILIES, "toyfam"}
    messages = sorted(str(w.message) for w in caught)
    assert messages == [
        "tune model family 'crashfam' (tune.models.crashfam) failed to load and is ignored: "
        "RuntimeError: crashfam is broken on purpose",
        "tune model family 'silentfam' (tune.models.silentfam) failed to load and is ignored: "
        "TypeError: tune.models.silentfam declares no `FAMILY = ModelFamily(...)`",
    ]


def test_a_family_registered_at_run_time_is_found_without_importing_any(empty_registry):
    mine = register_model_family(ModelFamily(name="My_Family", aliases=("mine",)))
    assert get_model_family("my_family") is mine and get_model_family("MINE") is mine
    assert empty_registry._imported == set()
    with pytest.raises(ValueError, match="already registered"):
        register_model_family(ModelFamily(name="my_family"))
    # registered before the built-in of that name is looked up, the user's family takes the name
    own_llama = register_model_family(ModelFamily(name="llama2"))
    assert get_model_family("llama2") is own_llama
    assert list_model_families()["llama2"] is own_llama


def test_unknown_name_lists_the_families(empty_registry):
    with pytest.raises(
        ValueError, match=r"Unknown model_type 'llama9'\. Registered model families: code_llama2, gemma, gemma2"
    ):
        get_model_family("llama9")


def test_plugin_family_is_found_after_the_built_in_ones(empty_registry, monkeypatch):
    monkeypatch.syspath_prepend(str(GOOD_PLUGIN))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    plugins._reset_for_tests()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # other fixture plugins may be broken on purpose
            family = get_model_family("DEMO_FAMILY")
            listed = list_model_families()
        assert family.name == "demo_family" and set(family.builders) == {"demo_tiny"}
        assert listed["demo_family"] is family and set(BUILT_IN_FAMILIES) < set(listed)
    finally:
        plugins._reset_for_tests()
        for name in [m for m in sys.modules if m.startswith("tune_demo_plugin")]:
            del sys.modules[name]
