"""Serving: loading trained models, in-graph generation, SavedModel export for TF Serving.

This package sits beside the model and imports it; it never imports the trainer.
"""
