"""The built-in model specs (trainers/model_registry.py names them)."""
