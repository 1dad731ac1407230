"""Training and evaluation of tfxl models, Orbit-style: a task (train/task.py: the language
model's, train/language_model.py; the classifier's, train/classification.py) run by the one
generic training run (train/run.py) through its train step, evaluator and controller."""
