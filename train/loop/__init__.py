"""The run loop and the steps: TrainingRun, the controller, each backend's step and evaluator, the
optimizer, the training memory holders."""
