"""The ``opd`` section and ``data_sources[*].teacher``: every rule of ``loongsage_distill.config``.

The section and the key are loongsage-distill's, added to the config by its step term ``opd``
(``loongsage.config.step_terms``). Each bad setting is refused at load with its key and what
was expected; a good one becomes the step term's ``DistillSpec`` holding the distiller,
teachers, methods and slot count.
"""

from __future__ import annotations

import pytest

from loongsage import catalogue, cli
from loongsage.config.compose import load_config
from loongsage.config.docs import documented_lines, plugin_refs
from loongsage.errors import ConfigError, UnknownPluginError
from loongsage.plugins import clear_cache

TEACHERS = ["opd.teachers.0.path=builtin:tiny", "opd.teachers.1.path=builtin:tiny"]


def mopd(*overrides):
    return load_config("tiny/mopd", [*TEACHERS, *overrides])


def distill_spec(*overrides):
    """The run's step term, which must be loongsage-distill's ``opd``, and its settings."""
    (term,) = mopd(*overrides).step_terms
    assert term.plugin.name == "opd" and term.plugin.distribution == "loongsage-distill"
    return term.settings


def refused(*overrides, recipe="tiny/mopd"):
    with pytest.raises(ConfigError) as info:
        load_config(recipe, [*(TEACHERS if recipe == "tiny/mopd" else []), *overrides])
    return info.value


def test_the_mopd_recipe_resolves_into_a_distill_spec():
    spec = distill_spec()
    assert spec.distiller == "multi_teacher"
    assert [(t.name, t.engine.name) for t in spec.teachers] == [("add_expert", "embedded_teacher"),
                                                                 ("sub_expert", "embedded_teacher")]
    assert spec.source_names == ("add", "sub") and spec.source_teachers == (0, 1)
    assert (spec.pg_method, spec.gkd_method.name, spec.gkd_ratio) == (None, "full_kl", 1.0)
    assert spec.slots == 1 and not spec.resident
    assert distill_spec("opd.teacher_slots=0").slots == 2 and distill_spec("opd.teacher_slots=0").resident
    assert load_config("tiny/grpo").step_terms == ()


def test_the_distillation_keys_are_described_by_their_own_fields_comments():
    """``config show --doc`` reads the ``opd`` section's and the ``teacher`` key's descriptions
    from loongsage-distill's dataclasses, not from the step term's one-line doc."""
    run = mopd()
    lines = list(documented_lines(run.cfg, plugin_refs(run)))
    assert "opd.pg_ratio: 0.0  # λ_pg: advantage A_t − λ_pg·sg(KL_t)" in lines
    assert ("data_sources.0.teacher: add_expert  # the opd.teachers name distilling into this source; "
            "null = none") in lines


@pytest.mark.parametrize("override, key, says", [
    ("data_sources.0.teacher=math_expert", "data_sources[0].teacher", "opd.teachers is empty"),
    ("opd.gkd_ratio=0.5", "opd.gkd_ratio", "has no effect without opd.teachers"),
    ("opd.teacher_slots=2", "opd.teacher_slots", "has no effect without opd.teachers"),
])
def test_distillation_settings_without_teachers_are_refused(override, key, says):
    error = refused(override, recipe="tiny/grpo")
    assert error.key == key and says in error.problem


@pytest.mark.parametrize("override, key, says", [
    ("data_sources.1.teacher=add_expertt", "data_sources[1].teacher", "did you mean 'add_expert'?"),
    ("data_sources.1.teacher=add_expert", "opd.teachers[1].name", "named by no data source"),
    ("opd.teachers.1.name=add_expert", "opd.teachers[1].name", "duplicate teacher name"),
    ("opd.gkd_ratio=0", "opd.gkd_ratio", "both opd.pg_ratio and opd.gkd_ratio are 0"),
    ("opd.gkd_ratio=1.5", "opd.gkd_ratio", "expected λ_gkd in [0, 1]"),
    ("opd.pg_ratio=-1", "opd.pg_ratio", "expected λ_pg >= 0"),
    ("opd.pg_ratio=0.5", "opd.pg_ratio", "opd.gkd_ratio=1 switches the RL loss off"),
    ("opd.gkd_kl_method=k1", "opd.gkd_kl_method", "cannot be used as a differentiable loss"),
    ("opd.teacher_slots=3", "opd.teacher_slots", "up to the 2 teacher(s)"),
    ("opd.teacher_slots=-1", "opd.teacher_slots", "up to the 2 teacher(s)"),
    ("opd.topk=0", "opd.topk", "expected >= 1"),
    ("opd.jsd_beta=1.0", "opd.jsd_beta", "expected β in (0, 1)"),
    ("opd.distiller=multi_teacherr", "opd.distiller", "did you mean 'multi_teacher'?"),
])
def test_bad_distillation_settings_are_refused_with_their_key(override, key, says):
    error = refused(override)
    assert error.key == key and says in error.problem, error.problem


def test_unknown_teacher_backend_names_the_key():
    with pytest.raises(UnknownPluginError, match=r"^opd.teachers\[0\].backend: unknown engine 'no_such'"):
        mopd("opd.teachers.0.backend=no_such")


@pytest.mark.parametrize("overrides, key, says", [
    (["opd.gkd_ratio=0.5", "opd.pg_ratio=1", "opd.pg_kl_method=topk_jsd"], "opd.pg_kl_method",
     "cannot be used as a detached per-token penalty"),
    (["opd.gkd_ratio=0.5", "opd.pg_ratio=1", "opd.pg_kl_method=k3"], "opd.pg_kl_method",
     "usable as a differentiable loss"),
])
def test_a_kl_method_must_declare_the_role_it_is_given(overrides, key, says):
    error = refused(*overrides)
    assert error.key == key and says in error.problem, error.problem


def test_a_source_without_teacher_cannot_train_on_the_distillation_loss_alone():
    error = refused("data_sources.1.teacher=null", "opd.teachers=[{name: add_expert, path: builtin:tiny}]")
    assert error.key == "data_sources[1].teacher" and "would train on nothing" in error.problem
    spec = distill_spec("data_sources.1.teacher=null", "opd.teachers=[{name: add_expert, path: builtin:tiny}]",
                        "opd.gkd_ratio=0.5")
    assert spec.source_teachers == (0, -1)


def test_mixed_objective_resolves_both_methods():
    spec = distill_spec("opd.gkd_ratio=0.25", "opd.pg_ratio=0.5", "opd.pg_kl_method=full_kl",
                        "opd.gkd_kl_method=topk_jsd")
    assert (spec.pg_ratio, spec.gkd_ratio, spec.pg_method.name, spec.gkd_method.name) == (
        0.5, 0.25, "full_kl", "topk_jsd")


def test_without_loongsage_distill_the_error_says_which_pip_install(monkeypatch, capsys):
    """loongsage-distill is installed here; the allow-list leaves it unloaded and the installed
    check is faked (uninstalling it would break the other tests). Without it the ``opd``
    section and the sources' ``teacher`` key are no keys of the config at all, and runs
    without distillation load as before."""
    monkeypatch.setenv("LOONGSAGE_LOAD_PLUGINS", "loongsage_agents,loongsage_algos")
    monkeypatch.setattr(catalogue, "is_installed", lambda distribution: distribution != "loongsage-distill")
    clear_cache()
    try:
        with pytest.raises(ConfigError) as err:
            mopd()
        assert cli.main(["config", "show", "--config-name", "tiny/mopd", *TEACHERS]) == 2
        grpo = load_config("tiny/grpo")
    finally:
        clear_cache()
    assert str(err.value).startswith("opd: unknown section: it belongs to step term 'opd'.")
    assert str(err.value).endswith("'opd' (step_term) comes with loongsage-distill, which is not "
                                   "installed; in a clone of LoongSage: make wheels && pip install "
                                   "dist/loongsage_distill-*.whl")
    assert capsys.readouterr().err.strip() == f"error: {err.value}"
    assert grpo.step_terms == () and "opd" not in grpo.cfg and "teacher" not in grpo.cfg.data_sources[0]
