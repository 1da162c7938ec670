"""Hook specifications: one registration hook per plugin kind, made from ``kind_table``.

Every hook receives a ``register(name, obj, *, params=None, doc=None)`` callable and
returns nothing, so one plugin module can register zero, one or many entries of a kind.
``params`` is an optional dataclass type describing the entry's typed parameters; the
registry publishes it to Hydra's ConfigStore. ``doc`` defaults to the first line of
``obj.__doc__``. The contract each registered object must honour is documented once, in
``docs/plugins.md``. The hooks are made here from the table of kinds, one per entry, so a new
kind is one entry there: ``loongsage_register_agents(register)``, ... are module attributes.
"""

from typing import Callable

import pluggy

from loongsage.kind_table import KIND_TABLE, KindSpec

hookspec = pluggy.HookspecMarker("loongsage")
hookimpl = pluggy.HookimplMarker("loongsage")


def _hook(kind: KindSpec) -> Callable[..., None]:
    def spec(register):  # the body is pluggy's: a spec is only its name and signature
        pass

    spec.__name__ = spec.__qualname__ = kind.hook
    spec.__doc__ = kind.doc
    return hookspec(spec)


for _kind in KIND_TABLE:
    globals()[_kind.hook] = _hook(_kind)
