# The image launch.tfjob's manifests run: this repository with the pinned TF 2.15.1
# stack (both backends). Build it from the repository root:
#   docker build -t REGISTRY/mnist:TAG . && docker push REGISTRY/mnist:TAG
FROM python:3.11-slim

WORKDIR /app
# Dependencies first: a code change rebuilds only the last layers.
COPY pyproject.toml README.md ./
RUN mkdir data trainers launch && pip install --no-cache-dir ".[tf215]" && pip uninstall -y mnist-dual-backend
COPY data data
COPY trainers trainers
COPY launch launch
RUN pip install --no-cache-dir --no-deps ".[tf215]"

# Not root: the pods write only to the mounted model_dir and their own temp dirs.
RUN useradd --create-home --uid 1000 trainer
USER trainer
ENV PYTHONUNBUFFERED=1
# The manifest gives the command (python -m trainers.keras_main or estimator_main). For
# SIGTERM the trainer needs no init: it sets its own handler (trainers/preemption.py),
# saves the step its cluster agrees on, and exits 143 within --grace_seconds, which the
# manifest's terminationGracePeriodSeconds covers. The manifest's shareProcessNamespace
# keeps it from being PID 1, which would ignore the start-up watchdog's SIGALRM.
CMD ["python", "-m", "trainers.keras_main", "--helpshort"]
