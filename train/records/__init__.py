"""What a run leaves and shares: run.json, the model_dir lease, the train log, the stop agreement
(preemption)."""
