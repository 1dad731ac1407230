"""Serving tools: `tfxl-export` (export_main) and `tfxl-generate` (generate_main).

What they run sits beside the model: loading (`tfxl.checkpoints.loading`), the SavedModel exports
(`tfxl.models.export`, `tfxl.classification.export`) and generation (`tfxl.models.generation`).
This package imports them; none of them, and never the trainer, imports this package.
"""
