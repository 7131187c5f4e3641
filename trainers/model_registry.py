"""Which model `--model` names: a built-in spec, or a user's by `package.module:NAME`.

    python -m trainers.keras_main --model=cnn_bn
    python -m trainers.keras_main --model=my_team.models:SPEC --model_options=dropout=0

`check(name, options)` says, without importing TensorFlow or the model's module, what
is wrong with the flags (the launcher calls it before it starts any task); `load`
imports the spec, in the processes that train. Both raise `SpecError`, whose message
names the fix; binaries exit 2 with it.
"""

import dataclasses
import functools
import importlib
import importlib.util
from typing import Any, Dict, Mapping, Tuple, Type, TypeVar

DEFAULT = "cnn"
# Built-in specs, by name: where each lives.
BUILT_IN = {
    "cnn": "trainers.models.cnn:SPEC",
    "cnn_bn": "trainers.models.cnn_bn:SPEC",
    "dnn": "trainers.models.canned:DNN",
    "linear": "trainers.models.canned:LINEAR",
    "wide_deep": "trainers.models.canned:WIDE_DEEP",
    "dnn_v1": "trainers.models.canned:DNN_V1",
    "linear_v1": "trainers.models.canned:LINEAR_V1",
    "wide_deep_v1": "trainers.models.canned:WIDE_DEEP_V1",
}

T = TypeVar("T")


class SpecError(ValueError):
  """--model or --model_options names no usable model; the message says why and the fix."""


@dataclasses.dataclass(frozen=True)
class Named:
  """What a flag naming `package.module:NAME` finds, for its messages.

  Attributes:
    noun: what it is called in a message ("model").
    type_name: the type the object must have ("trainers.model.ModelSpec").
    define: how to make one ("ModelSpec(name=..., build=...)").
    fix: what the flag takes, for a malformed name.
    built_in: names the flag takes besides package.module:NAME, and where each lives.
  """

  noun: str
  type_name: str
  define: str
  fix: str
  built_in: Mapping[str, str] = dataclasses.field(default_factory=dict)


MODEL = Named(
    "model", "trainers.model.ModelSpec", "ModelSpec(name=..., build=...)",
    "--model takes a built-in name (" + ", ".join(BUILT_IN) + ") or package.module:NAME, "
    "a ModelSpec in a module on PYTHONPATH (docs/MIGRATION.md, \"Bring your model\")", BUILT_IN)


COLUMNS = Named(
    "feature columns", "list of tf.feature_column columns, a dict of such lists by canned "
    "part (linear, dnn), or a function returning either", "list(...)",
    "--feature_columns takes package.module:NAME, a list of tf.feature_column columns in a "
    "module on PYTHONPATH (docs/training.md, \"Feature columns\")")


def locate(name: str, named: Named = MODEL) -> Tuple[str, str]:
  """(module, attribute) of the object `name` names; SpecError for a malformed name."""
  path = named.built_in.get(name, name)
  module, sep, attribute = path.partition(":")
  if not sep or not module or not attribute.isidentifier():
    raise SpecError(f"unknown {named.noun} {name!r}: {named.fix}.")
  return module, attribute


def check(name: str, options: str, find: bool = True) -> None:
  """Raises SpecError if `name` is malformed, or names a module this Python cannot find
  (unless `find` is False: a TFJob's model is in its image), or `options` are malformed.

  Imports no TensorFlow (only the parent packages of a user's module).
  """
  parse_settings(options)
  find_module(name, MODEL, find)


# importlib's functions, called as C objects: the Estimator's model_fn builds the model under
# AutoGraph, which converts every Python function it calls and warns of each one it cannot
# read, as importlib's frozen ones ("AutoGraph could not transform <function find_spec>").
_find_spec = functools.lru_cache(maxsize=None)(importlib.util.find_spec)
_import_module = functools.lru_cache(maxsize=None)(importlib.import_module)


def find_module(name: str, named: Named, find: bool = True) -> None:
  """Raises SpecError if `name` is malformed, or (if `find`) names a module this Python
  cannot find. Imports only the parent packages of a user's module."""
  module, _ = locate(name, named)
  if not find:
    return
  try:
    found = _find_spec(module)
  except (ImportError, ValueError) as e:
    found, why = None, f": {e}"
  else:
    why = ""
  if found is None:
    raise SpecError(f"{named.noun} {name!r}: no module {module} on this Python's path{why}. "
                    f"Run from the directory that holds it, or add that directory to "
                    f"PYTHONPATH.")


def load(name: str, spec_type: Type[T], named: Named = MODEL) -> T:
  """Imports the object `name` names and checks it is a `spec_type`
  (trainers.model.ModelSpec, or what `named` says)."""
  module_name, attribute = locate(name, named)
  find_module(name, named)
  try:
    module = _import_module(module_name)
  except Exception as e:  # The user's module: any error it raises is theirs to fix.
    raise SpecError(f"{named.noun} {name!r}: importing {module_name} failed: "
                    f"{type(e).__name__}: {e}. Fix the module, then run again.") from e
  spec = getattr(module, attribute, None)
  if spec is None:
    raise SpecError(f"{named.noun} {name!r}: {module_name} has no {attribute}. Define "
                    f"{attribute} = {named.define.split('(')[0]}(...) there, or name the one "
                    f"it has.")
  if not isinstance(spec, spec_type):
    raise SpecError(f"{named.noun} {name!r}: {module_name}.{attribute} is a "
                    f"{type(spec).__name__}, not a {named.type_name}. Make it one: "
                    f"{named.define}.")
  return spec


def parse_settings(options: str, flag: str = "--model_options") -> Dict[str, float]:
  """NAME=NUMBER,... as {name: number}; SpecError naming `flag` if malformed."""
  parsed = {}
  for item in filter(None, (part.strip() for part in options.split(","))):
    key, sep, value = item.partition("=")
    try:
      parsed[key.strip()] = float(value)
    except ValueError:
      sep = ""
    if not sep or not key.strip():
      raise SpecError(f"{flag}={options!r}: {item!r} is not NAME=NUMBER; write "
                      f"them as dropout=0.25,width=64.")
  return parsed


def parse_options(options: str, known: Mapping[str, Any], model: str,
                  flag: str = "--model_options") -> Dict[str, float]:
  """`--model_options` (or `flag`) as {name: value}; SpecError naming an option `model`
  lacks.

  A value keeps the type of its default (an int option stays an int).
  """
  parsed = parse_settings(options, flag)
  for key, value in parsed.items():
    if key not in known:
      raise SpecError(f"{flag}: {model} has no option {key!r}; its options are "
                      f"{', '.join(f'{k}={v}' for k, v in known.items()) or 'none'}.")
    if isinstance(known[key], int) and not isinstance(known[key], bool):
      if value != int(value):
        raise SpecError(f"{flag}: {key} of {model} is a whole number, got {value}.")
      parsed[key] = int(value)
  return parsed
