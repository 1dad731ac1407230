"""The splits of a tfxl-prepare data directory as distributed datasets (one input pipeline per
host, `distribute_datasets_from_function`), and the shard checks done before the first step."""

import tensorflow as tf

from tfxl.data import pipeline
from tfxl.data.manifest import split_info
from tfxl.data.rechunk import rechunk


def with_static_segments(features, tgt_len):
    """The features with their segment axis stated: [b, T] (the shifted passes of the training
    input are concatenated slices, whose length the graph does not know). A step on a TPU, and
    one XLA computation anywhere, needs every input shape static."""
    return {key: tf.ensure_shape(value, value.shape[:1].concatenate([tgt_len]))
            if value.shape.rank == 2 else value for key, value in features.items()}


class DistributedData:
    def __init__(self, strategy, data_dir, manifest, seed=0):
        self.strategy, self.data_dir, self.manifest, self.seed = strategy, data_dir, manifest, seed
        self.tgt_len = manifest["tgt_len"]
        self._checked = set()  # splits whose every record check_splits has read once
        self._eval_datasets = {}  # (split, batch, tgt_len) -> a checked split's distributed input

    def dataset(self, split, batch, training, tgt_len=None, skip_batches=0):
        """`split` as a distributed dataset of global batch `batch`, re-cut to `tgt_len` tokens
        per segment; `skip_batches` global steps already consumed (the resume position)."""
        tgt_len = tgt_len or self.tgt_len
        # A split check_splits has read in full is not read again at every evaluation pass.
        verify_shards = split not in self._checked
        # The evaluation input of a checked split is the same at every pass (each iter() starts
        # it at its first batch): built once, its tf.data functions not traced at every pass.
        key = (split, batch, tgt_len)
        cached = not training and not skip_batches and not verify_shards
        if cached and key in self._eval_datasets:
            return self._eval_datasets[key]
        params = pipeline.InputParams(data_dir=self.data_dir, batch_size=batch,
                                      training=training, seed=self.seed,
                                      verify_shards=verify_shards)

        def dataset_fn(input_context):
            dataset = pipeline.input_fn(split, params, input_context)
            # A pipeline yields one per-replica batch per local replica and step.
            local_replicas = (input_context.num_replicas_in_sync
                              // input_context.num_input_pipelines)
            dataset = dataset.map(lambda features: with_static_segments(features, self.tgt_len))
            if tgt_len != self.tgt_len:
                dataset = rechunk(dataset, tgt_len, local_replicas)
            return dataset.skip(skip_batches * local_replicas) if skip_batches else dataset

        dataset = self.strategy.distribute_datasets_from_function(dataset_fn)
        if cached:
            self._eval_datasets[key] = dataset
        return dataset

    def eval_steps(self, split, batch, tgt_len):
        """Global steps that cover every token of `split` once at segments of `tgt_len`."""
        data_steps = pipeline.eval_steps(self.manifest, split, batch)
        return -(-data_steps * self.tgt_len // tgt_len)

    def check_splits(self, *splits):
        """Checks the shards of `splits` before the first step; a DataError names a bad one.

        Every shard must have its manifest byte size. Evaluation splits (small: megabytes) are
        also read once in full so every record's CRC is checked; the train split's records are
        checked by its input pipeline when it is built, still before the first step.
        """
        for split in splits:
            pipeline.verify_shards(self.data_dir, split_info(self.manifest, split)["streams"],
                                   crc=split != "train")
            if split != "train":
                self._checked.add(split)
