"""TPU-Estimator-style training of tfxl models: input_fn (tfxl.data) + model_fn + host loops."""
