"""Which model `--model` names: a built-in spec, or a user's by `package.module:NAME`.

    python -m trainers.keras_main --model=cnn_bn
    python -m trainers.keras_main --model=my_team.models:SPEC --model_options=dropout=0

`check(name, options)` says, without importing TensorFlow or the model's module, what
is wrong with the flags (the launcher calls it before it starts any task); `load`
imports the spec, in the processes that train. Both raise `SpecError`, whose message
names the fix; binaries exit 2 with it.
"""

import importlib
import importlib.util
from typing import Dict, Mapping, Tuple, Type, TypeVar

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
_FIX = ("--model takes a built-in name (" + ", ".join(BUILT_IN) + ") or package.module:NAME, "
        "a ModelSpec in a module on PYTHONPATH (docs/MIGRATION.md, \"Bring your model\")")

T = TypeVar("T")


class SpecError(ValueError):
  """--model or --model_options names no usable model; the message says why and the fix."""


def locate(name: str) -> Tuple[str, str]:
  """(module, attribute) of the spec `name` names; SpecError for a malformed name."""
  path = BUILT_IN.get(name, name)
  module, sep, attribute = path.partition(":")
  if not sep or not module or not attribute.isidentifier():
    raise SpecError(f"unknown model {name!r}: {_FIX}.")
  return module, attribute


def check(name: str, options: str, find: bool = True) -> None:
  """Raises SpecError if `name` is malformed, or names a module this Python cannot find
  (unless `find` is False: a TFJob's model is in its image), or `options` are malformed.

  Imports no TensorFlow (only the parent packages of a user's module).
  """
  module, _ = locate(name)
  _parse(options)
  if not find:
    return
  try:
    found = importlib.util.find_spec(module)
  except (ImportError, ValueError) as e:
    found, why = None, f": {e}"
  else:
    why = ""
  if found is None:
    raise SpecError(f"model {name!r}: no module {module} on this Python's path{why}. Run from "
                    f"the directory that holds it, or add that directory to PYTHONPATH.")


def load(name: str, spec_type: Type[T]) -> T:
  """Imports the spec `name` names and checks it is a `spec_type` (trainers.model.ModelSpec)."""
  module_name, attribute = locate(name)
  check(name, "")
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # The user's module: any error it raises is theirs to fix.
    raise SpecError(f"model {name!r}: importing {module_name} failed: "
                    f"{type(e).__name__}: {e}. Fix the module, then run again.") from e
  spec = getattr(module, attribute, None)
  if spec is None:
    raise SpecError(f"model {name!r}: {module_name} has no {attribute}. Define "
                    f"{attribute} = ModelSpec(...) there, or name the one it has.")
  if not isinstance(spec, spec_type):
    raise SpecError(f"model {name!r}: {module_name}.{attribute} is a {type(spec).__name__}, "
                    f"not a trainers.model.ModelSpec. Wrap the model's build function in "
                    f"ModelSpec(name=..., build=...).")
  return spec


def _parse(options: str) -> Dict[str, float]:
  parsed = {}
  for item in filter(None, (part.strip() for part in options.split(","))):
    key, sep, value = item.partition("=")
    try:
      parsed[key.strip()] = float(value)
    except ValueError:
      sep = ""
    if not sep or not key.strip():
      raise SpecError(f"--model_options={options!r}: {item!r} is not NAME=NUMBER; write "
                      f"them as dropout=0.25,width=64.")
  return parsed


def parse_options(options: str, known: Mapping[str, float], model: str) -> Dict[str, float]:
  """`--model_options` as {name: value}; SpecError naming an option `model` lacks.

  A value keeps the type of its default (an int option stays an int).
  """
  parsed = _parse(options)
  for key, value in parsed.items():
    if key not in known:
      raise SpecError(f"--model_options: model {model} has no option {key!r}; its options are "
                      f"{', '.join(f'{k}={v}' for k, v in known.items()) or 'none'}.")
    if isinstance(known[key], int) and not isinstance(known[key], bool):
      if value != int(value):
        raise SpecError(f"--model_options: {key} of model {model} is a whole number, got "
                        f"{value}.")
      parsed[key] = int(value)
  return parsed
