"""A model's optimizers as the converter carries them: one part for every model the Estimator
trains from `--optimizer`, two (`dnn`, `linear`) for a `tf.compat.v1.estimator` canned
model's twin, each as a config whose `--optimizer` is that part's; and the names the
Estimator gives their state.
"""

import dataclasses
from typing import Dict, Mapping, Optional

from launch.convert.kinds import AssignmentMap, ConversionError
from trainers import model as model_lib
from trainers.config import Config
from trainers.models import canned


def v1_parts(config: Config) -> Optional[Dict[str, Config]]:
  """For a `tf.compat.v1.estimator` canned model, each part's config as the single-optimizer
  path reads it (`--optimizer` the part's, at the v1 defaults), by part ("dnn", "linear");
  None for any other model. Its twin trains each part with the v1-exact Keras optimizer,
  whose slots are the CNN's."""
  canned_spec = model_lib.spec(config).canned
  if canned_spec is None or not canned_spec.v1:
    return None
  settings = config.canned_settings()
  return {part: dataclasses.replace(config, optimizer=settings[f"{part}_optimizer"])
          for part in ("dnn", "linear") if f"{part}_optimizer" in settings}


def parts(config: Config) -> Dict[str, Config]:
  """The model's optimizers, each as a config whose `--optimizer` is its: `v1_parts`, or
  {"": config} for a model of one optimizer the Estimator builds from --optimizer."""
  return v1_parts(config) or {"": config}


def part_of(model_parts: Mapping[str, Config], weight: str) -> str:
  """Which of `model_parts` updates the weight of this name."""
  return canned.part_of(weight) if len(model_parts) > 1 else next(iter(model_parts))


def optimizer_flag(part: str) -> str:
  """The flag that names `part`'s optimizer."""
  return f"--{part}_optimizer" if part else "--optimizer"


def is_tf2_canned(config: Config) -> bool:
  """Whether `config.model` is a TF2 canned model, which `launch.convert.canned` carries."""
  return bool(config.canned_settings()) and not v1_parts(config)


def single_or_v1(config: Config, assignment_map: Optional[AssignmentMap]) -> Config:
  """`config` as the single-optimizer path reads it: a one-part `tf.compat.v1.estimator`
  canned model's part's (`--optimizer` its), else `config` itself. Refuses a map for a TF2
  canned model (its names are the canned Estimator's), and two Adam parts (whose powers of
  beta v1 names apart only by the order it made them in)."""
  if is_tf2_canned(config):
    if assignment_map:
      raise ConversionError(f"--model={config.model} is a canned model: its checkpoint names "
                            "are the canned Estimator's own, so no --assignment_map applies.")
    return config
  model_parts = parts(config)
  if sum(part.optimizer == "adam" for part in model_parts.values()) > 1:
    raise ConversionError(f"--model={config.model} with Adam in both parts is not carried: "
                          "give one part another optimizer, or go on training with the "
                          "backend that wrote the run.")
  return next(iter(model_parts.values())) if len(model_parts) == 1 else config


def adam_part(config: Config) -> Config:
  """The part that trains with Adam (whose powers of beta `source.check_counters` reads), or
  any."""
  model_parts = list(parts(config).values())
  return next((part for part in model_parts if part.optimizer == "adam"), model_parts[0])


def v1_slot_name(config: Config, weight: str, slot: str) -> str:
  """A v1 slot's name as the Estimator of `config.model` names it under a strategy."""
  canned_spec = model_lib.spec(config).canned
  return f"{canned_spec.v1_scope if canned_spec else ''}{weight}/{slot}"


def v1_counter_name(config: Config, counter: str) -> str:
  """Adam's power of beta (`beta1_power`) as the Estimator of `config.model` names it."""
  scope = model_lib.spec(config).canned.v1_scope if v1_parts(config) else None
  return counter if scope is None else f"{scope}head/{scope}{counter}"
