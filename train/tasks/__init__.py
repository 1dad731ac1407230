"""The tasks: the abstract Task, the language model's and the classifier's, the language model's
datasets."""
