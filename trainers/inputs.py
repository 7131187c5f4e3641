"""The input both backends read, bound to a run's settings, and the seeds that make both
read the same batches in the same order."""

from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf

from data import mnist
from data.mnist import pipeline
from trainers import heads
from trainers import program
from trainers.config import MULTICLASS, Config
from trainers.models import canned

InputFn = Callable[[str, Optional[tf.distribute.InputContext]], tf.data.Dataset]


def reads_the_shared_pipeline(config: Config) -> bool:
  """Whether the run reads the shared MNIST input_fn (not its program's own)."""
  return not (config.estimator_program and
              program.load(config.estimator_program).input_fn is not None)


def default_input_fn(config: Config) -> InputFn:
  """The run's input: the input_fn of its --estimator_program if it has one, else the shared
  MNIST input_fn, bound to the config's batch sizes, data and seed, its labels the task's
  (trainers/heads.py), with each example's weight by its digit under a --weight_column,
  its features the tabular ones a canned model's columns read under --features=tabular."""
  if not reads_the_shared_pipeline(config):
    return program.load(config.estimator_program).input_fn

  head = heads.head(config)
  weights = config.example_weights()
  tabular = canned.parse_spec(config.canned_settings())

  def weight(image: tf.Tensor, digit: tf.Tensor) -> tf.Tensor:
    del image  # A digit's weight, --digit_weights.
    return tf.gather(tf.constant(weights, tf.float32), digit)

  def input_fn(mode: str, input_context: Optional[tf.distribute.InputContext] = None):
    batch = config.global_batch_size if mode == mnist.TRAIN else config.eval_batch_size
    return pipeline.input_fn(mode, input_context, global_batch_size=batch,
                             data_dir=config.data_dir, seed=config.seed,
                             record_dir=config.record_dir,
                             label=(None if head.kind == MULTICLASS and not head.vocabulary
                                    else head.label),
                             weight=weight if weights else None, tabular=tabular)

  return input_fn


def setup_determinism(config: Config) -> None:
  """Op determinism if asked; the global seed that, with the op seed, fixes the shuffle.

  The Estimator sets the same global seed in its graph through
  RunConfig(tf_random_seed), so both backends read the same batches.
  """
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  tf.random.set_seed(config.seed)


def check_fits(config: Config, model_inputs: Dict[str, Tuple[Optional[int], ...]],
               features: Any = None, what: str = "its input_fn") -> None:
  """Raises program.ProgramError unless the features of config.estimator_program's input_fn
  (or `features`, what `what` gives) fit a model with `model_inputs` (each input's name and
  shape, the batch first): one tensor for one input, or a dict with a key for each input's
  name, each of a shape the input takes. Builds the input in a graph of its own."""
  if features is None:
    own = config.estimator_program and program.load(config.estimator_program).input_fn
    if not own:
      return
    with tf.Graph().as_default():
      features = own(mnist.TRAIN, None).element_spec[0]
  given = ({k: tuple(v.shape.as_list()) for k, v in features.items()}
           if isinstance(features, dict) else tuple(features.shape.as_list()))
  if isinstance(given, dict):
    fits = set(given) == set(model_inputs) and all(
        _shape_fits(given[k], shape) for k, shape in model_inputs.items())
  else:
    fits = len(model_inputs) == 1 and _shape_fits(given, next(iter(model_inputs.values())))
  if not fits:
    raise program.ProgramError(
        f"--estimator_program={config.estimator_program}: {what} gives features "
        f"{given}, which --model={config.model} does not take: its inputs are "
        f"{model_inputs}. Give the port an input of each name and shape (a dict's keys are "
        f"the inputs' names), or wrap it in the program to give what the port takes.")


def _shape_fits(given: Tuple[Optional[int], ...], takes: Tuple[Optional[int], ...]) -> bool:
  """Whether a batch of shape `given` fits an input of shape `takes` (None: any)."""
  return len(given) == len(takes) and all(
      a is None or b is None or a == b for a, b in zip(given, takes))
