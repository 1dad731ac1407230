"""Serving tools: `tfxl-export` (export_main) and `tfxl-generate` (generate_main).

What they run sits beside the model: loading (`tfxl.checkpoints.loading`), the models' SavedModel
signatures (`tfxl.models.signatures`, `tfxl.classification.signatures`, on the framework of
`tfxl.saved_model`) and generation (`tfxl.models.generation`).
This package imports them; none of them, and never the trainer, imports this package.
"""
