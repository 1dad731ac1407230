"""The document classifier's task (tfxl-classify-train): training a `DocumentClassifier` under the
same `TrainingRun` as the language model (train/loop/run.py: host loops, controller, checkpoints,
lease, run record, train log, SIGTERM handling, strategies and optimizer), with what differs
between the two models here (`ClassificationTask`).

Shape glossary: B global batch (documents), b = B / R per replica (R replicas), L tokens per
document row (static: --max_tokens rounded up to T), T segment length, C classes.

* **Input.** The train split is one endless stream of documents, shuffled with the run's seed
  pass after pass (`classification_dataset(shuffle=True, repeat=True)`), cut into per-replica
  batches of b documents in replica order: step s's global batch is documents [s B, (s + 1) B)
  of that stream whatever the strategy, so one device and R replicas train on the same
  batches. The stream is a function of the seed alone, so its position is the step, as for
  the language model's streams: a resumed run rebuilds it and skips the step × B documents
  already used (before any is parsed). Every batch has the same static shape [b, L]: each
  document padded (or cut) to `max_tokens` (default the longest training document: every
  document whole), so one compiled step serves the whole run, on XLA and TPUs too.
* **Step.** Each step reads its documents from an empty memory (the classifier reads whole
  documents), so nothing is carried from step to step: the trainer keeps no memory and the
  checkpoint holds the model, the optimizer with its step, and the dropout seeds. The loss is
  the mean cross-entropy over the global batch's documents.
* **Evaluation** on the valid split is `tfxl.classification.evaluate_classifier` (every
  document once: loss, accuracy, macro-F1, confusion matrix), on the same static document
  length (the valid split's longest document, or --max_tokens).
"""

import os

import keras
import tensorflow as tf
from keras import ops

from tfxl.classification import ClassifierEvaluator, DocumentClassifier
from tfxl.classification.readings import LENGTHS, MEMORY
from tfxl.data.classification import classification_dataset, load_classification_manifest
from tfxl.data.manifest import split_info
from tfxl.data.pipeline import verify_shards
from tfxl.files import StagedDirectory
from tfxl.model_dir import (CLASSIFICATION, CLASSIFIER, ModelDir, check_data_fingerprint,
                            check_or_store_config)
from tfxl.train.tasks.task import Task

__all__ = ["ClassificationTask", "DocumentData"]

HEAD_SETTINGS = ("num_classes", "pooling", "grad_segments", "head_dropout")


class DocumentData:
    """A tfxl-prepare-classification data dir as the trainer reads it (`dataset`, as
    train/tasks/datasets.py's `DistributedData` for the language model) and as evaluation reads it.

    max_tokens: each document's first tokens read (None: whole documents); batches are padded
    to it (default the split's longest document), rounded up to `segment_len`.
    eval_max_tokens: the same for evaluation (None: as training reads, max_tokens or the train
    split's longest document; 0: whole documents), a bound on the tokens an evaluation inside a
    run reads of each document.
    """

    def __init__(self, strategy, data_dir, manifest, segment_len, seed=0, max_tokens=None,
                 eval_max_tokens=None):
        self.strategy, self.data_dir, self.manifest = strategy, data_dir, manifest
        self.segment_len, self.seed, self.max_tokens = segment_len, seed, max_tokens
        self.eval_max_tokens = eval_max_tokens

    def length(self, split):
        """The tokens each document of `split` is padded or cut to (before rounding up to T):
        never more than its longest document, since padding changes no logit (the reading's
        invariance) and a bound past every document would only allocate padding."""
        longest = split_info(self.manifest, split)["max_length"]
        if split == "train":
            bound = self.max_tokens
        elif self.eval_max_tokens == 0:
            return longest
        elif self.eval_max_tokens is not None:
            bound = self.eval_max_tokens
        elif self.max_tokens is not None:
            bound = self.max_tokens
        else:  # as training reads: the longest training document
            return self.length("train")
        return longest if bound is None else min(bound, longest)

    def check_splits(self, *splits):
        """Reads every record of `splits` once (sizes, CRCs, counts): a damaged shard is one
        DataError naming it before the first step, not an error inside one."""
        for split in splits:
            verify_shards(self.data_dir, split_info(self.manifest, split)["shards"],
                          records="documents")

    def _reader(self, split, batch, **options):
        return classification_dataset(
            self.data_dir, split, batch, self.segment_len, max_tokens=self.length(split),
            pad_to_max_tokens=True, verify=False, manifest=self.manifest, **options)

    def dataset(self, split, batch, training, skip_batches=0):
        """The training stream (module docstring) as a distributed dataset of global batch
        `batch`, `skip_batches` global steps already consumed."""
        assert split == "train" and training, "evaluation reads `evaluation_dataset`"
        return self.strategy.distribute_datasets_from_function(
            lambda input_context: self.replica_batches(input_context, batch, skip_batches))

    def replica_batches(self, input_context, batch, skip_batches=0):
        """One input pipeline's share of the training stream: the per-replica batches of its
        own replicas, in the order `distribute_datasets_from_function` hands them out (each of
        its replicas in turn, step after step)."""
        replicas = input_context.num_replicas_in_sync
        local = replicas // input_context.num_input_pipelines
        dataset = self._reader("train", input_context.get_per_replica_batch_size(batch),
                               shuffle=True, seed=self.seed, repeat=True, drop_remainder=True,
                               skip=skip_batches * batch)
        if input_context.num_input_pipelines == 1:
            return dataset
        # Several hosts: each reads the whole stream and keeps its own replicas' batches
        # (global replica r takes the r-th per-replica batch of every step).
        first = input_context.input_pipeline_id * local
        return dataset.enumerate().filter(
            lambda i, _: tf.logical_and(i % replicas >= first, i % replicas < first + local)
        ).map(lambda _, element: element)

    def evaluation_dataset(self, split, batch):
        """Every document of `split` once, in batches of at most `batch` (evaluate_classifier
        pads the last)."""
        return self._reader(split, batch)


def build_classifier(config, strategy, head, attention_cls=None):
    """The classifier of backbone `config` and `head` settings ({HEAD_SETTINGS}), its weights
    created under `strategy`."""
    with strategy.scope():
        return DocumentClassifier(config, attention_cls=attention_cls, **head)


def copy_backbone(language_model, classifier, source):
    """The language model's backbone weights into the classifier's; ValueError naming `source`
    and the first weights that differ when the flags' backbone is another."""
    theirs, ours = language_model.backbone.weights, classifier.backbone.weights
    differ = [f"{a.path} is {list(a.shape)} there, {list(b.shape)} here"
              for a, b in zip(theirs, ours) if tuple(a.shape) != tuple(b.shape)]
    if differ or len(theirs) != len(ours):
        raise ValueError(f"--init_checkpoint={source} does not fit the backbone the flags "
                         f"describe ({len(theirs)} weights there, {len(ours)} here"
                         + "".join(f"; {d}" for d in differ[:3]) + "); leave out the model "
                         "flags that change its shape")
    classifier.backbone.set_weights(language_model.backbone.get_weights())


def save_classifier(model, path):
    """`model` as a .keras file at `path` (local or gs://), whole or not at all."""
    # A .keras file is a zip archive Keras writes piece by piece: built on the local disk first.
    with StagedDirectory(path, "classifier", scratch="tfxl-classifier-") as staged:
        model.save(os.path.join(staged.path, CLASSIFIER))
        staged.publish_file(CLASSIFIER)


class ClassificationTask(Task):
    """Training a `DocumentClassifier` on a tfxl-prepare-classification data dir: no memory
    between steps, the mean cross-entropy over documents, every valid document evaluated.

    Args:
      config: the backbone's `TransfoXLConfig` (its tgt_len and mem_len are the classifier's
        segment and memory lengths); stored as config.json.
      data_dir: tfxl-prepare-classification's output.
      head: {num_classes, pooling, grad_segments, head_dropout} and optionally the classifier's
        reading and max_tokens (saved in classifier.keras); recorded in run.json with the
        run's settings (a resumed run with others is refused, as a changed learning rate is).
      max_tokens: see `DocumentData`.
      language_model: a `TransfoXLLM` whose backbone a new run starts from (ignored, with a
        note, when the model_dir has checkpoints); init_checkpoint: where it came from.
    """

    unit = "documents"
    run_kind = CLASSIFICATION

    def __init__(self, config, *, data_dir: str, head: dict, max_tokens: int | None = None,
                 language_model=None, init_checkpoint: str | None = None,
                 eval_max_tokens: int | None = None):
        super().__init__(config, data_dir=data_dir)
        self.head, self.max_tokens, self.eval_max_tokens = head, max_tokens, eval_max_tokens
        self.language_model, self.init_checkpoint = language_model, init_checkpoint

    def check_manifest(self, manifest):
        """Refuses data the model cannot read: token ids beyond its vocabulary, another number
        of labels than its classes."""
        if manifest["vocab_size"] > self.config.vocab_size:
            raise ValueError(f"--data_dir={self.data_dir} has token ids up to "
                             f"{manifest['vocab_size'] - 1}, the model a vocabulary of "
                             f"{self.config.vocab_size} (another tokenizer)")
        if self.head["num_classes"] != len(manifest["labels"]):
            raise ValueError(f"the model has {self.head['num_classes']} classes, --data_dir="
                             f"{self.data_dir} {len(manifest['labels'])} labels")

    def document_tokens(self, manifest):
        """L: the tokens each training document is padded or cut to, rounded up to tgt_len."""
        longest = split_info(manifest, "train")["max_length"]
        length = min(self.max_tokens or longest, longest)  # as DocumentData.length
        return -(-length // self.config.tgt_len) * self.config.tgt_len

    def load_data(self, strategy, *, model_dir, seed):
        manifest = load_classification_manifest(self.data_dir)
        self.check_manifest(manifest)
        check_data_fingerprint(model_dir, manifest, self.data_dir)
        return DocumentData(strategy, self.data_dir, manifest, self.config.tgt_len, seed,
                            self.max_tokens, self.eval_max_tokens)

    def recorded_settings(self, data):
        return {**{name: self.head[name] for name in HEAD_SETTINGS},
                "reading": self.head.get("reading", MEMORY), "max_tokens": self.max_tokens,
                "labels": list(data.manifest["labels"])}

    def build_model(self, strategy):
        attention_cls = (self.language_model.attention_cls if self.language_model is not None
                         else None)
        return build_classifier(self.config, strategy, self.head, attention_cls)

    def warm_start(self, model, data, *, model_dir, resuming, log):
        if self.language_model is None:
            return None
        if resuming:
            log(f"note: --init_checkpoint={self.init_checkpoint} is ignored: {model_dir} has "
                "checkpoints of its own and the run resumes from them")
            return None
        copy_backbone(self.language_model, model, self.init_checkpoint)
        log(f"warm start: backbone weights from {self.init_checkpoint} (head, optimizer and "
            "step start fresh)")
        return self.init_checkpoint

    def initial_memory(self, model, rows):
        return None  # every step reads its documents from an empty memory

    def batch_weight(self, batch):
        """This replica's documents."""
        features, _ = batch
        return ops.cast(ops.shape(features[LENGTHS])[0], "float32")

    def loss(self, model, batch, memory, global_weight):
        features, labels = batch
        logits = model(features, training=True)
        nll = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        return ops.sum(nll) / global_weight, None

    def check_data(self, data, *, global_batch, evaluates):
        data.check_splits("train", *(["valid"] if evaluates else []))

    def claim_model_dir(self, model_dir, data):
        check_or_store_config(model_dir, self.config, kind=self.run_kind)
        check_data_fingerprint(model_dir, data.manifest, data.data_dir, store=True)

    def build_evaluator(self, model, strategy, data, *, global_batch, steps_per_loop,
                        jit_compile):
        return ClassifierEvaluator(model, global_batch, strategy)

    def evaluate(self, evaluator, data, split="valid", *, max_batches=None, **settings):
        """`evaluate_classifier` over every document of `split` (max_batches ignored: always
        every document), its step traced at the first evaluation, then reused."""
        return evaluator(data.evaluation_dataset(split, evaluator.batch_size)).to_dict(
            data.manifest["labels"])

    def eval_scalars(self, data):
        return ("loss", "accuracy", "macro_f1")

    def units_per_step(self, global_batch):
        return global_batch

    def publish_results(self, model, model_dir, metrics):
        """The trained classifier as model_dir/classifier.keras (tfxl-classify-eval's --model),
        written before metrics.json says the run is finished."""
        path = ModelDir(model_dir).classifier
        save_classifier(model, path)
        metrics["classifier"] = path
