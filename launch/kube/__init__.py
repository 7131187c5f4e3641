"""Kubernetes: the Kubeflow `TFJob` manifests `python -m launch.tfjob` writes (no TensorFlow)."""
