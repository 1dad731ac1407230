"""Training and evaluation of tfxl models, Orbit-style: a task (train/tasks/task.py: the language
model's, train/tasks/language_model.py; the classifier's, train/tasks/classification.py) run by the
one generic training run (train/loop/run.py) through its train step, evaluator and controller."""
